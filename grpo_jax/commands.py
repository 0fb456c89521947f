"""The `grpo-jax` commands' bodies: train, config, plan (and plan --topology), eval,
hf-check and rm-train, run on the command line `cli.parse_flags` parsed (`main`, the entry
point, imports this module only then: it imports JAX and the trainer).

Flags are read from absl's FLAGS by name; `main` defines them. USER_ERRORS maps what a
user can fix to its exit status; `main._main` prints each as one line.
"""

from __future__ import annotations

import contextlib
import json
import pathlib

import jax
from absl import flags, logging

from grpo_jax import cli
from grpo_jax.infra import checkpoint, collapse, config_lib, distributed, logs, tpu
from grpo_jax.models import gguf_import, hf
from grpo_jax.rewards import reward_model
from grpo_jax.rl import guards
from grpo_jax.trainer import build, eval_command, memory, memory_advice, rm_train, steps, train
from grpo_jax.verifiers import verdicts

FLAGS = flags.FLAGS


def plan(config_dict) -> dict:
  """`grpo-jax plan`: prints the memory plan, each line explained, and when it does not
  fit, the changes that lower its peak most first; returns its figures. With --topology:
  the run's functions compiled for that TPU topology (`aot`)."""
  if FLAGS.topology:
    return plan_topology(config_dict)
  device = _device_bytes(FLAGS.device)
  setup = build.plan_setup(config_dict, n_devices=FLAGS.devices, model_source=FLAGS.model or "")
  platform = memory.device_platform(FLAGS.device) if FLAGS.device else None
  p = memory.plan_for(setup, n_devices=FLAGS.devices, platform=platform)
  why = memory_advice.explain(p, setup.model_cfg, setup.rl_cfg)
  print(memory_advice.describe(p, device_memory=device, name=FLAGS.device or "", why=why))
  out = memory.as_dict(p)
  if device:
    out.update(device_memory=device, fits=memory.fits(p, device))
  if device and not out["fits"]:
    more = _plan_on_more_devices(
      setup, n_devices=FLAGS.devices or jax.device_count(), platform=platform
    )
    tips = memory_advice.advice(
      p, setup.model_cfg, setup.rl_cfg, device_memory=device, more_devices=more
    )
    print("Change: (the change that lowers the peak most first)\n  - " + "\n  - ".join(tips))
  if FLAGS.compile:
    measured = memory.measure(setup, steps.functions(setup))
    print(
      f"XLA (compiled here): train step arguments {measured['train_step_arguments'] / 2**30:.3f}"
      f" GiB, temporaries {measured['train_step_temp'] / 2**30:.3f} GiB; sampler "
      f"temporaries {measured['sample_temp'] / 2**30:.3f} GiB"
    )
    out["xla"] = measured
  print(json.dumps(out))
  return out


def plan_topology(config_dict) -> dict:
  """`grpo-jax plan --topology=NAME`: per function and device, XLA's memory against the
  chip's HBM, FLOPs, bytes, collectives; the iteration's roofline; one JSON line."""
  from grpo_jax.trainer import aot  # libtpu's topology loading stays out of every other command.

  try:
    got = aot.plan(
      config_dict,
      topology=FLAGS.topology,
      num_slices=FLAGS.num_slices,
      model_source=FLAGS.model or "",
      advice=FLAGS.advice,
    )
  except (tpu.TpuUnavailable, ValueError) as e:
    raise cli.UsageError(f"--topology={FLAGS.topology}: {e}") from None
  run = got["run"]
  print(
    f"{run['topology']} x {run['num_slices']} slice(s): {run['devices']} {run['chip']} devices "
    f"on {run['hosts']} host(s), mesh {run['mesh']}"
  )
  for note in got["notes"]:
    print(f"note: {note}")
  print(got["table"])
  verdict = "fits" if run["fits"] else "does NOT fit"
  print(
    f"{verdict}: peak {'>= ' if run.get('peak_unknown') else ''}"
    f"{run['peak_bytes'] / 2**30:.2f} GiB per device (XLA; the memory plan "
    f"says {run['plan_peak_bytes'] / 2**30:.2f} GiB); model-FLOPs roofline "
    f"{run['roofline_iteration_s']:.3g} s per iteration ("
    + ", ".join(f"{k} {v:.3g} s" for k, v in run["roofline_s"].items())
    + ")"
  )
  for problem in got["problems"]:
    print(f"problem: {problem}")
  tip = got["advice"]
  if tip:
    print(f"advice: {tip['line']}")
    fitted = tip.pop("plan")
    if fitted:  # The advised config's own figures, as compiled.
      tip.update(run=fitted["run"], functions=[_plain_row(r) for r in fitted["rows"]])
  out = {
    "run": run,
    "functions": [_plain_row(r) for r in got["rows"]],
    "problems": got["problems"],
    "notes": got["notes"],
    "advice": tip,
  }
  print(json.dumps(out))
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(out, f, indent=1)
    print(f"wrote {FLAGS.json}")
  return out


def _plain_row(row: dict) -> dict:
  """A report row as JSON values (collectives as their summary)."""
  return {k: v for k, v in row.items() if isinstance(v, (int, float, str, bool, dict, list))}


def _device_bytes(device: str | None) -> float | None:
  try:
    return memory.device_bytes(device) if device else None
  except ValueError as e:
    raise cli.UsageError(f"--device={device}: {e}") from None


def _plan_on_more_devices(setup, *, n_devices: int, platform: str | None = None):
  """The plan on twice the devices, when the mesh has a size that grows with them."""
  try:
    return memory.plan_for(setup, n_devices=2 * n_devices, platform=platform)
  except ValueError:  # Fixed mesh sizes, or a batch the larger mesh cannot split.
    return None


def hf_check() -> dict:
  """`grpo-jax hf-check`: prints the check's figures; exits 1 past the tolerance."""
  if not FLAGS.hf_dir:
    raise cli.UsageError("hf-check needs --hf_dir=<a Hugging Face checkpoint directory or GGUF>.")
  out = hf.check(FLAGS.hf_dir, tolerance=FLAGS.tolerance, dtype=FLAGS.dtype, compare=FLAGS.compare)
  print(
    f"{out['arch']}: {out['params']:,} params imported in {out['import_seconds']:.2f} s; "
    f"logits mean {out['logits_mean']:.4f}, std {out['logits_std']:.4f}, "
    f"max |logit| {out['logits_absmax']:.4f}, last-token argmax {out['argmax_last']}"
  )
  if out["max_abs_diff"] is None and FLAGS.compare:  # Nothing compared: not a pass.
    out.update(ok=None, compared=False)
    print(json.dumps(out))
    raise cli.UsageError(
      "hf-check imported the checkpoint but compared nothing: transformers and torch are not "
      "installed (pip install -e '.[bench]'); --nocompare checks the import alone."
    )
  if out["max_abs_diff"] is None:
    print("--nocompare: the import and forward ran; no comparison with transformers.")
  else:
    verdict = "OK" if out["ok"] else "MISMATCH"
    print(
      f"transformers: max abs logit difference {out['max_abs_diff']:.3g} "
      f"(tolerance {out['tolerance']:g}), greedy ids differing at "
      f"{out['greedy_mismatches']} of {out['positions']} positions: {verdict}"
    )
  print(json.dumps(out))
  if not out["ok"]:
    raise SystemExit(1)
  return out


def main(inv: cli.Invocation, *, process_ends_on_error: bool = False):
  """`inv`: the command and its config, parsed by `cli.parse_flags`. `process_ends_on_error`:
  the grpo-jax command, where an error ends the process (the library's output is left
  redirected to the log)."""
  logging.set_verbosity(logging.WARNING)  # Quiet JAX's backend probing.
  if inv.command == "hf-check":
    hf_check()
    return
  if inv.preset:
    print(cli.preset_note(inv))
  if inv.command == "config":
    built = cli.validate(inv.config)  # A refused config: its one error line, not the dump.
    print(cli.describe_config(inv))
    print(built)
    return
  if inv.command == "plan":
    plan(inv.config)
    return
  if inv.command == "eval":
    run_eval(inv)
    return
  if inv.command == "rm-train":
    if not FLAGS.workdir:
      raise cli.UsageError("--workdir is required for rm-train (its checkpoints go there).")
    print(json.dumps(rm_train.rm_train(inv.config, FLAGS.workdir)))
    return
  if not FLAGS.workdir:
    raise cli.UsageError("--workdir is required to train (where metrics and checkpoints go).")
  cli.import_run_variants(FLAGS.workdir)  # A resume finds the run's own variants.
  distributed.initialize(FLAGS.distributed)  # Before anything touches a device.
  # Left in place when the run fails and the process ends with it (`run`, the command):
  # libraries' background threads (orbax's writes) go on reporting until the process exits,
  # and that belongs in the log, not after the error line (`logs.library_output` stays
  # redirected when it is dropped unexited). Called in-process (tests), it is handed back.
  library_output = contextlib.ExitStack()
  library_output.enter_context(_library_output(FLAGS.workdir))
  try:
    summary = train.run(inv.config, FLAGS.workdir)
  except BaseException:
    if not process_ends_on_error:
      library_output.close()
    raise
  library_output.close()
  if distributed.is_primary():
    print(json.dumps(summary, indent=2))
    print(train.describe(summary))
  if summary["preempted"]:
    raise SystemExit(143)  # 128 + SIGTERM: a scheduler sees the job as interrupted.


def run_eval(inv: cli.Invocation) -> dict:
  """`grpo-jax eval`: the run's own config (workdir/config.json) unless --config is given,
  with --benchmarks/--k/--size/--step/--out over config.eval (`eval_command.run`)."""
  if not FLAGS.workdir:
    raise cli.UsageError("--workdir is required to eval (its checkpoint; the report goes there).")
  if inv.config is None:
    inv = cli.recorded(inv, FLAGS.workdir)
  else:  # The given --config may not register what the run used; the run says where.
    cli.import_run_variants(FLAGS.workdir)
  # Each config.eval key has its flag (`main`), which wins over the config.
  given = {k: FLAGS[k].value for k in inv.config.eval if FLAGS[k].value is not None}
  inv.config.eval.update(given)
  return eval_command.run(inv.config, FLAGS.workdir)


def _library_output(workdir: str):
  """Libraries' own tracebacks and log records go to workdir/grpo_jax.log (one file per
  process), the terminal keeps grpo_jax's lines (`logs.library_output`)."""
  if "://" in workdir:  # Refused by train.run; nothing local to write to.
    return contextlib.nullcontext()
  index = jax.process_index()
  name = logs.LIBRARY_LOG if index == 0 else f"grpo_jax.{index}.log"
  return logs.library_output(pathlib.Path(workdir) / name)


# What the user can fix, as opposed to a bug: one line on stderr and an exit status, no
# traceback. 2: the input (config, workdir, checkpoint or memory for this config); 1: the
# run stopped (rewards, non-finite steps, checkpoint writes).
USER_ERRORS = {
  config_lib.ConfigError: 2,
  cli.UsageError: 2,
  hf.CheckpointError: 2,
  gguf_import.GGUFError: 2,
  train.WorkdirError: 2,
  checkpoint.CheckpointMismatchError: 2,
  memory_advice.OutOfMemoryPlan: 2,
  eval_command.EvalError: 2,
  reward_model.PairsError: 2,
  checkpoint.CheckpointDamagedError: 1,
  checkpoint.NoValidCheckpointError: 1,
  checkpoint.CheckpointSaveError: 1,
  verdicts.RewardFailure: 1,
  guards.NonFiniteError: 1,
  collapse.CollapseError: 1,
}
