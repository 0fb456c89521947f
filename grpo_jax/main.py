"""Command line: `grpo-jax --config=configs/arithmetic.py:tiny --workdir=/tmp/run`.

  grpo-jax --help                     the commands, the config syntax, the shipped configs
  grpo-jax config --config=configs/arithmetic.py:tiny --config.rl.preset=dapo

  grpo-jax plan --config=configs/arithmetic.py:full --devices=8 --device=tpu-v5e

  grpo-jax hf-check --hf_dir=/path/to/Qwen2.5-0.5B-Instruct

  grpo-jax eval --workdir=/tmp/run --benchmarks=arithmetic,long_addition,jsonl:b.jsonl --k=8

  grpo-jax rm-train --config=configs/reward_model.py:tiny --workdir=/tmp/grpo_rm

`plan` prints the per-device memory plan of a config (`memory`) for a device count and
says whether it fits a device (a name in `memory.DEVICE_MEMORY_GIB`, or GiB); with
`--compile` it also compiles the train step and sampler on this host's devices and prints
XLA's own figures next to the plan. Its last line is one JSON object.

`eval` scores the workdir's newest checkpoint (or config.hf_dir's weights) on
config.eval.benchmarks with greedy, avg@k, pass@k and maj@k and their intervals, and
writes workdir/eval/step_<step>/eval.json and eval.md (`evaluate`). Without --config it
runs on the config the run recorded (workdir/config.json); --benchmarks, --k, --size,
--step and --out set config.eval's keys.

`hf-check` imports a Hugging Face checkpoint directory, runs a forward on a few token
sequences (one left-padded) and prints the logits' summary; with torch and transformers
installed it runs the same batch through transformers and prints the max abs difference.
Its last line is one JSON object; it exits 1 when the difference exceeds `--tolerance`.

`rm-train` trains a Bradley–Terry reward model on config.reward_model.train_path's
preference pairs (`rm_train`); rerunning it resumes. Its last line is the
summary as one JSON object (held-out pair accuracy before and after). A run reads it back
with a config.rewards source of kind "reward_model" (`reward_sources`).

Overrides use ml-collections syntax, e.g. `--config.rl.advantage=rloo`; the config is
locked, so a misspelt key fails, in one line naming the closest keys (`cli`: argv, help,
presets by name). The same entry point is `train.run(config, workdir)` in a notebook.

Several hosts (a multi-host TPU VM slice, a Slurm or MPI job, or JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID set by hand): every host runs the same command;
`--distributed=auto` (the default) calls `jax.distributed.initialize` first when the
environment announces several processes (`distributed.initialize`).
"""

from __future__ import annotations

import contextlib
import json
import pathlib

import jax
from absl import app, flags, logging

from grpo_jax import build, cli, evaluate, memory, memory_advice, rm_train, steps, train
from grpo_jax.infra import checkpoint, collapse, config_lib, distributed, logs, tpu
from grpo_jax.models import gguf_import, hf, shapes
from grpo_jax.rewards import reward_model
from grpo_jax.rl import guards
from grpo_jax.verifiers import verdicts

_WORKDIR = flags.DEFINE_string("workdir", None, "Where metrics.jsonl and summary.json go.")
_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "auto",
  list(distributed.MODES),
  "jax.distributed.initialize: auto (when the environment announces several processes), on, off.",
)

_DEVICES = flags.DEFINE_integer("devices", None, "plan: device count (default: this host's).")
# eval: shorthands for config.eval.* (the flag wins over the config).
_EVAL_FLAGS = {
  "benchmarks": flags.DEFINE_string(
    "benchmarks", None, "eval: comma-separated benchmarks (config.eval.benchmarks)."
  ),
  "k": flags.DEFINE_integer("k", None, "eval: samples per problem (config.eval.k)."),
  "size": flags.DEFINE_integer("size", None, "eval: problems per benchmark (config.eval.size)."),
  "step": flags.DEFINE_integer(
    "step", None, "eval: the checkpoint, -1 the newest (config.eval.step)."
  ),
  "out": flags.DEFINE_string("out", None, "eval: the report's directory (config.eval.out)."),
}
_DEVICE = flags.DEFINE_string(
  "device", None, f"plan: device memory, one of {sorted(memory.DEVICE_MEMORY_GIB)} or GiB."
)
_COMPILE = flags.DEFINE_bool(
  "compile", False, "plan: also compile on this host's devices and print XLA's figures."
)
_TOPOLOGY = flags.DEFINE_string(
  "topology",
  None,
  "plan: compile the run's functions for a TPU topology from this host (e.g. v5e:2x4, "
  "v6e:2x4, v5p:2x2x1, v5e:4x8; needs libtpu: pip install -e '.[tpu]').",
)
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "plan --topology: TPU slices (multi-slice).")
_JSON = flags.DEFINE_string(
  "json", None, "plan --topology: also write the result to this JSON file."
)
_ADVICE = flags.DEFINE_bool(
  "advice",
  True,
  "plan --topology: when the config does not fit, find and compile the change that fits "
  "(--noadvice: report only).",
)
_MODEL = flags.DEFINE_string(
  "model",
  None,
  "plan: the model's shape from a config.json, a checkpoint directory, a GGUF file or a "
  f"built-in shape ({', '.join(shapes.CONFIGS)}); default: config.hf_dir's config.json.",
)


def plan(config_dict) -> dict:
  """`grpo-jax plan`: prints the memory plan, each line explained, and when it does not
  fit, the changes that lower its peak most first; returns its figures. With --topology:
  the run's functions compiled for that TPU topology (`aot`)."""
  if _TOPOLOGY.value:
    return plan_topology(config_dict)
  device = _device_bytes(_DEVICE.value)
  setup = build.plan_setup(config_dict, n_devices=_DEVICES.value, model_source=_MODEL.value or "")
  p = memory.plan_for(setup, n_devices=_DEVICES.value)
  why = memory_advice.explain(p, setup.model_cfg, setup.rl_cfg)
  print(memory_advice.describe(p, device_memory=device, name=_DEVICE.value or "", why=why))
  out = memory.as_dict(p)
  if device:
    out.update(device_memory=device, fits=memory.fits(p, device))
  if device and not out["fits"]:
    more = _plan_on_more_devices(setup, n_devices=_DEVICES.value or jax.device_count())
    tips = memory_advice.advice(
      p, setup.model_cfg, setup.rl_cfg, device_memory=device, more_devices=more
    )
    print("Change: (the change that lowers the peak most first)\n  - " + "\n  - ".join(tips))
  if _COMPILE.value:
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
  from grpo_jax import aot  # libtpu's topology loading stays out of every other command.

  try:
    got = aot.plan(
      config_dict,
      topology=_TOPOLOGY.value,
      num_slices=_NUM_SLICES.value,
      model_source=_MODEL.value or "",
      advice=_ADVICE.value,
    )
  except (tpu.TpuUnavailable, ValueError) as e:
    raise cli.UsageError(f"--topology={_TOPOLOGY.value}: {e}") from None
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
    f"{verdict}: peak {run['peak_bytes'] / 2**30:.2f} GiB per device (XLA; the memory plan "
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
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(out, f, indent=1)
    print(f"wrote {_JSON.value}")
  return out


def _plain_row(row: dict) -> dict:
  """A report row as JSON values (collectives as their summary)."""
  return {k: v for k, v in row.items() if isinstance(v, (int, float, str, bool, dict, list))}


def _device_bytes(device: str | None) -> float | None:
  try:
    return memory.device_bytes(device) if device else None
  except ValueError as e:
    raise cli.UsageError(f"--device={device}: {e}") from None


def _plan_on_more_devices(setup, *, n_devices: int):
  """The plan on twice the devices, when the mesh has a size that grows with them."""
  try:
    return memory.plan_for(setup, n_devices=2 * n_devices)
  except ValueError:  # Fixed mesh sizes, or a batch the larger mesh cannot split.
    return None


_HF_DIR = flags.DEFINE_string("hf_dir", None, "hf-check: a Hugging Face checkpoint directory.")
_TOLERANCE = flags.DEFINE_float(
  "tolerance", 1e-4, "hf-check: the largest max abs logit difference to transformers allowed."
)
_DTYPE = flags.DEFINE_enum(
  "dtype", "float32", ["float32", "bfloat16"], "hf-check: param and compute dtype."
)
_COMPARE = flags.DEFINE_bool(
  "compare", True, "hf-check: compare with transformers (--nocompare: the import alone)."
)


def hf_check() -> dict:
  """`grpo-jax hf-check`: prints the check's figures; exits 1 past the tolerance."""
  if not _HF_DIR.value:
    raise cli.UsageError("hf-check needs --hf_dir=<a Hugging Face checkpoint directory or GGUF>.")
  out = hf.check(
    _HF_DIR.value, tolerance=_TOLERANCE.value, dtype=_DTYPE.value, compare=_COMPARE.value
  )
  print(
    f"{out['arch']}: {out['params']:,} params imported in {out['import_seconds']:.2f} s; "
    f"logits mean {out['logits_mean']:.4f}, std {out['logits_std']:.4f}, "
    f"max |logit| {out['logits_absmax']:.4f}, last-token argmax {out['argmax_last']}"
  )
  if out["max_abs_diff"] is None and _COMPARE.value:  # Nothing compared: not a pass.
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
      f"(tolerance {out['tolerance']:g}): {verdict}"
    )
  print(json.dumps(out))
  if not out["ok"]:
    raise SystemExit(1)
  return out


def main(inv: cli.Invocation):
  """`inv`: the command and its config, parsed by `cli.parse_flags`."""
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
    eval_command(inv)
    return
  if inv.command == "rm-train":
    if not _WORKDIR.value:
      raise cli.UsageError("--workdir is required for rm-train (its checkpoints go there).")
    print(json.dumps(rm_train.rm_train(inv.config, _WORKDIR.value)))
    return
  if not _WORKDIR.value:
    raise cli.UsageError("--workdir is required to train (where metrics and checkpoints go).")
  distributed.initialize(_DISTRIBUTED.value)  # Before anything touches a device.
  # Left in place when the run fails and the process ends with it (`run`, the command):
  # libraries' background threads (orbax's writes) go on reporting until the process exits,
  # and that belongs in the log, not after the error line (`logs.library_output` stays
  # redirected when it is dropped unexited). Called in-process (tests), it is handed back.
  library_output = contextlib.ExitStack()
  library_output.enter_context(_library_output(_WORKDIR.value))
  try:
    summary = train.run(inv.config, _WORKDIR.value)
  except BaseException:
    if not _PROCESS_ENDS_ON_ERROR:
      library_output.close()
    raise
  library_output.close()
  if distributed.is_primary():
    print(json.dumps(summary, indent=2))
    print(train.describe(summary))
  if summary["preempted"]:
    raise SystemExit(143)  # 128 + SIGTERM: a scheduler sees the job as interrupted.


def eval_command(inv: cli.Invocation) -> dict:
  """`grpo-jax eval`: the run's own config (workdir/config.json) unless --config is given,
  with --benchmarks/--k/--size/--step/--out over config.eval (`evaluate.run`)."""
  if not _WORKDIR.value:
    raise cli.UsageError("--workdir is required to eval (its checkpoint; the report goes there).")
  if inv.config is None:
    inv = cli.recorded(inv, _WORKDIR.value)
  given = {k: f.value for k, f in _EVAL_FLAGS.items() if f.value is not None}
  inv.config.eval.update(given)
  return evaluate.run(inv.config, _WORKDIR.value)


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
  evaluate.EvalError: 2,
  reward_model.PairsError: 2,
  checkpoint.CheckpointDamagedError: 1,
  checkpoint.NoValidCheckpointError: 1,
  checkpoint.CheckpointSaveError: 1,
  verdicts.RewardFailure: 1,
  guards.NonFiniteError: 1,
  collapse.CollapseError: 1,
}


def _main(argv):
  try:
    main(argv)
  except tuple(USER_ERRORS) as e:
    status = next(code for kind, code in USER_ERRORS.items() if isinstance(e, kind))
    cli.fail(e, status=status)
  except BrokenPipeError:  # `grpo-jax config ... | head`: the reader stopped reading.
    cli.silence_stdout()
    raise SystemExit(1) from None


# Set by `run` (the grpo-jax command): an error ends the process.
_PROCESS_ENDS_ON_ERROR = False


def run():
  global _PROCESS_ENDS_ON_ERROR
  _PROCESS_ENDS_ON_ERROR = True
  app.run(_main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
