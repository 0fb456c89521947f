"""Ahead of time: compile a run's jitted functions for a TPU topology from this host.

    grpo-jax plan --config=configs/arithmetic.py:tiny --topology=v5e:2x2
    got = aot.plan(config, topology="v5e:2x4", num_slices=1)   # rows, table, run figures

No TPU is needed: with libtpu installed (`pip install -e ".[tpu]"`), jax describes a TPU
topology's chips on any host (`infra.tpu.load_topology`), and XLA compiles for them the
very functions a run would run (`steps.functions_on`: the config's own layouts, shardings
and donation over a mesh of the topology's abstract devices), from abstract arguments
(shapes, dtypes and shardings: nothing is allocated). What comes back is XLA's TPU
executable: its memory per device (`memory_analysis`), its FLOPs and bytes
(`cost_analysis`) and its collectives (`infra.tpu.report`). So whether a config fits a
chip, what it communicates and over which mesh axes, and a roofline time per phase are
known before anyone books one.

The functions compiled (`FUNCTIONS`): "sample" (the training sampler: prefill and decode,
`samplers.train`), "logprobs" (π_old and the reference's teacher-forced log-probs of the
rollouts, `rl.logprobs`) and "update" (the scan of train steps over one rollout batch,
`rl.update`). Each is compiled on its own; a run holds its train state (params and
optimizer state) and the reference throughout, so a function's peak per device is XLA's
figure for it plus the resident arrays it does not take as arguments (`resident`).

Several slices (`num_slices` > 1): the mesh is hybrid (`sharding.make_mesh`): data spans
the slices (DCN), fsdp and tensor stay within a slice (ICI); a config whose mesh.data is
not a multiple of the slices gets data × num_slices (said in the result).

The properties a TPU run relies on are checked on the compiled update (`check_update`):
the train state comes out sharded exactly as it went in (gradients and optimizer state
like the parameters, never replicated), the donated state aliases the output (no second
copy of it in HBM), and no host callback sits inside the step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax import build, memory, steps
from grpo_jax.infra import config_lib, flops, hlo, tpu
from grpo_jax.models import model, sharding

FUNCTIONS = ("sample", "logprobs", "update")


@dataclasses.dataclass(frozen=True)
class Target:
  """Where the run would go: the topology, its devices, chip and slices."""

  topology: str
  num_slices: int
  devices: tuple
  chip: tpu.Chip

  @classmethod
  def load(cls, topology: str, *, num_slices: int = 1) -> Target:
    if num_slices < 1:
      raise ValueError(f"--num_slices must be >= 1, got {num_slices}.")
    chip = tpu.chip_for(topology)
    devices = tuple(tpu.load_topology(topology, num_slices=num_slices))
    return cls(topology, num_slices, devices, chip)


def setup_for(config_dict, target: Target, *, model_source: str = ""):
  """The run's Setup for the target's devices (`build.plan_setup`: no tokenizer, no
  weights), with mesh.data raised to a multiple of the slices when it is not one."""
  c = config_lib.to_dict(config_dict)
  data = int(c.get("mesh", {}).get("data", 1))
  note = ""
  if target.num_slices > 1 and data % target.num_slices:
    c = {**c, "mesh": {**c["mesh"], "data": data * target.num_slices}}
    note = f"mesh.data {data} -> {data * target.num_slices} (data parallelism across slices)"
  c = ml_collections.ConfigDict(c)
  setup = build.plan_setup(c, n_devices=len(target.devices), model_source=model_source)
  return setup, note


def abstract_arguments(setup, fns) -> dict[str, tuple]:
  """Each function's arguments as shapes and dtypes (the shardings are the functions'
  own in_shardings): what `memory.measure` lowers, plus the log-prob forwards."""
  rl_cfg = setup.rl_cfg
  state, batch, key, prompts = memory.abstract_inputs(setup, fns)
  hyper = setup.sampling_hyper
  with fns.layout.context():
    rollouts = jax.eval_shape(fns.samplers.train.jitted, state.params, prompts, key, hyper)
  ref = model.reference_part(state.params) if rl_cfg.use_ref else None
  return {
    "sample": (fns.samplers.train, (state.params, prompts, key, hyper)),
    "logprobs": (fns.rl.logprobs, (state.params, ref, rollouts)),
    "update": (
      fns.rl.update,
      (state, batch, key, jax.eval_shape(rl_cfg.step_hyper)),
    ),
  }


def compile_function(jitted: sharding.Jitted, args: tuple):
  """XLA's executable of one of the run's functions for the arguments' target. It compiles
  past an out-of-memory (`tpu.COMPILE_PAST_OOM`: XLA would refuse, and the report says by
  how much it does not fit), and never into JAX's persistent cache (a compile-only client
  cannot load TPU executables back)."""
  with jitted.layout.context(), _no_persistent_cache():
    return jitted.jitted.lower(*args).compile(compiler_options=tpu.COMPILE_PAST_OOM)


@contextlib.contextmanager
def _no_persistent_cache():
  """No write to JAX's persistent cache (a process that already used it keeps reading
  it; a TPU program's key never matches a CPU program's, so reads miss)."""
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
  try:
    yield
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


def per_device_bytes(tree, shardings) -> int:
  """Bytes one device holds of `tree` (shapes) placed with `shardings` (a matching tree or
  one sharding for all): the largest shard, per leaf."""
  leaves = jax.tree.leaves(tree)
  shards = jax.tree.leaves(jax.tree.broadcast(shardings, tree)) if shardings else []
  total = 0
  for i, x in enumerate(leaves):
    shape = shards[i].shard_shape(x.shape) if shards else x.shape
    total += math.prod(shape) * jnp.dtype(x.dtype).itemsize
  return total


def resident(setup, fns, args: dict) -> dict[str, int]:
  """Per function: bytes per device the run holds during it that are not its arguments
  (the train state's optimizer part while sampling, the reference while updating...)."""
  state, _, _, _ = args["update"][1]
  ref = args["logprobs"][1][1]
  state_b = per_device_bytes(state, fns.state_shardings)
  params_b = per_device_bytes(state.params, fns.state_shardings.params)
  ref_b = per_device_bytes(ref, fns.rl.logprobs.in_shardings[1]) if ref is not None else 0
  if ref is not None and model.is_adapted(state.params):
    ref_b = 0  # The reference is the train state's own base (`model.reference_part`).
  return {
    "sample": state_b - params_b + ref_b,
    "logprobs": state_b - params_b,
    "update": ref_b,
  }


def model_roofline(setup, target: Target, *, params_bytes: int, kv_bytes: int) -> dict:
  """Seconds per phase of one iteration at the chip's peak: model FLOPs (`infra.flops`,
  every row decoding all T tokens) over every device's bf16 peak, or, for decoding, the
  bytes each step reads (the whole params, as a decode step reads every weight after
  fsdp's gather, plus the device's KV cache) over its HBM bandwidth, whichever is longer.
  XLA's own cost_analysis counts a while loop's body once (decode steps, the update's
  scan), so its figures are reported beside these, not used for time."""
  cfg, scfg, rl_cfg, loop = setup.model_cfg, setup.sampler_cfg, setup.rl_cfg, setup.loop
  P, T, n = max(scfg.prompt_buckets), scfg.max_new_tokens, len(target.devices)
  peak = n * tpu.per_device(target.chip).peak_bf16_flops
  bandwidth = tpu.per_device(target.chip).hbm_bytes_per_s
  sample = flops.sampling_flops(
    cfg, prompts=loop.prompts_per_step, group_size=scfg.group_size, prompt_len=P, new_tokens=T
  )
  seq = flops.sequence_forward_flops(cfg, length=P + T)
  forwards = (1 if rl_cfg.recompute_old_logp else 0) + (1 if rl_cfg.use_ref else 0)
  return {
    "sample": max(sample / peak, T * (params_bytes + kv_bytes) / bandwidth),
    "logprobs": forwards * setup.rollout_rows * seq / peak,
    "update": 3 * rl_cfg.ppo_epochs * setup.update_rows * seq / peak,
  }


def check_update(compiled, jitted: sharding.Jitted, state) -> list[str]:
  """What is wrong with a compiled update for a TPU run ([] when nothing): state out
  shardings that differ from its in shardings (gradients or optimizer state left
  replicated or resharded), donated state leaves not aliased to outputs, host callbacks."""
  problems = []
  state_in = jax.tree.leaves(compiled.input_shardings[0][0])
  state_out = jax.tree.leaves(compiled.output_shardings[0])
  shapes = jax.tree.leaves(state)
  moved = [
    (x, a, b)
    for x, a, b in zip(shapes, state_in, state_out)
    if not a.is_equivalent_to(b, len(x.shape))
  ]
  if moved:
    x, a, b = moved[0]
    problems.append(
      f"{len(moved)} of {len(shapes)} train state arrays come out sharded otherwise than "
      f"they go in (e.g. {x.shape}: in {a.spec}, out {b.spec})"
    )
  text = compiled.as_text()
  aliased = hlo.aliased_parameters(text)
  n_state = len(shapes)
  missing = [i for i in range(n_state) if i not in aliased and math.prod(shapes[i].shape) > 1]
  if missing:
    problems.append(f"{len(missing)} of {n_state} donated state arrays are not aliased")
  calls = hlo.host_callbacks(text)
  if calls:
    problems.append(f"host callbacks inside the step: {calls[:3]}")
  return problems


def plan(config_dict, *, topology: str, num_slices: int = 1, model_source: str = "") -> dict:
  """Compiles the run's functions for the topology: {"rows": reports per function,
  "table": the terminal table, "run": the iteration's figures, "problems": check_update's,
  "notes": [...]}."""
  target = Target.load(topology, num_slices=num_slices)
  setup, note = setup_for(config_dict, target, model_source=model_source)
  fns = steps.functions_on(setup, target.devices)
  args = abstract_arguments(setup, fns)
  extra = resident(setup, fns, args)
  mesh = fns.layout.mesh
  rows, problems = [], []
  for name in FUNCTIONS:
    jitted, a = args[name]
    compiled = compile_function(jitted, a)
    report = tpu.report(compiled, chip=target.chip, mesh=mesh)
    peak = report["total_bytes"] + extra[name]
    rows.append(
      {**report, "name": name, "resident_bytes": extra[name], "peak_bytes": peak,
       "fits": peak <= report["hbm_bytes"]}
    )  # fmt: skip
    if name == "update":
      problems = check_update(compiled, jitted, a[0])
  p = memory.plan_for(setup, n_devices=len(target.devices))
  state = args["update"][1][0]
  itemsize = jnp.dtype(setup.sampler_cfg.dtype or setup.model_cfg.dtype).itemsize
  full_params = sum(math.prod(x.shape) * itemsize for x in jax.tree.leaves(state.params))
  roofline = model_roofline(setup, target, params_bytes=full_params, kv_bytes=p.kv_cache)
  for r in rows:
    r["model_roofline_s"] = roofline[r["name"]]
  run = {
    "topology": topology,
    "num_slices": num_slices,
    "chip": target.chip.name,
    "devices": len(target.devices),
    "hosts": tpu.hosts(target.devices),
    "mesh": dict(mesh.shape),
    "fits": all(r["fits"] for r in rows),
    "peak_bytes": max(r["peak_bytes"] for r in rows),
    "plan_peak_bytes": p.peak,
    "roofline_s": roofline,
    "roofline_iteration_s": sum(roofline.values()),
  }
  notes = [note] if note else []
  return {"rows": rows, "table": tpu.format_table(rows), "run": run, "problems": problems,
          "notes": notes}  # fmt: skip
