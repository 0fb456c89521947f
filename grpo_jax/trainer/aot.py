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
`rl.update`); with IBPO's counterfactual rows (config.counterfactual) also
"counterfactual" (their decode, `rollouts.counterfactuals.generate`); with multi-turn episodes
(config.env) the episode runner's pieces in place of "sample" (`compile_episodes`:
"episode_start", "episode_turn", "episode_append", chained as a run chains them); with a
reward model among config.rewards, its scorer ("reward_model:<name>",
`compile_reward_models`: its params stay in HBM the whole run); with a distillation teacher
(config.teacher) its teacher-forced log-probs of the rollouts ("teacher", `rl.teacher`:
its params stay in HBM the whole run too). Each is compiled on its
own; a run holds its train state (params and optimizer state) and the reference
throughout, so a function's peak per device is XLA's figure for it plus the resident arrays
it does not take as arguments (`resident`).

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
import functools
import hashlib
import json
import math

import jax
import jax.numpy as jnp
import ml_collections

from grpo_jax import config as grpo_config
from grpo_jax.envs import episode_refill
from grpo_jax.infra import config_lib, distributed, flops, hlo, tpu
from grpo_jax.models import model, sampling, sharding
from grpo_jax.trainer import abstract, build, memory, steps

FUNCTIONS = ("sample", "logprobs", "update")
LOGIT_CHUNK = 256  # `ladder`'s rl.logit_chunk (memory.AUTO_CANDIDATES' too).
PLAN_SLACK = 1.2  # `advise` compiles a rung whose memory plan is under 1.2 x HBM.


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
  state, batch, key, prompts = abstract.inputs(setup, fns)
  hyper = setup.sampling_hyper
  sampler = fns.samplers.train  # Traced in its own layout's context, as `Jitted` runs it.
  with sampler.layout.context():
    rollouts = jax.eval_shape(
      sampler.jitted, *sampler.place((state.params, prompts, key, hyper), abstract=True)
    )
  if fns.episodes is not None:  # Episodes train the model's own tokens only (action mask).
    actions = lambda x: jax.ShapeDtypeStruct(x.mask_NT.shape, jnp.bool_)  # noqa: E731
    rollouts = rollouts.replace(action_mask_NT=actions(rollouts))
    batch = batch.replace(action_mask_NT=actions(batch))
  ref = model.reference_part(state.params) if rl_cfg.use_ref else None
  out = (
    {}
    if fns.episodes is not None
    else {  # Episodes sample with their own pieces.
      "sample": (fns.samplers.train, (state.params, prompts, key, hyper))
    }
  )
  out |= {
    "logprobs": (fns.rl.logprobs, (state.params, ref, rollouts)),
    "update": (
      fns.rl.update,
      (state, batch, key, jax.eval_shape(rl_cfg.step_hyper)),
    ),
  }
  if fns.counterfactual is not None:
    out["counterfactual"] = _counterfactual_arguments(setup, fns, state, rollouts, key)
  if fns.rl.teacher is not None:
    tcfg = setup.teacher_source.model_cfg
    tparams = jax.eval_shape(lambda k: model.init(tcfg, k), jax.random.key(0))
    out["teacher"] = (fns.rl.teacher, (tparams, rollouts))
  return out


def _counterfactual_arguments(setup, fns, state, rollouts, key) -> tuple:
  """IBPO's counterfactual decode (`rollouts.counterfactuals.generate`: branch from the rollouts'
  cuts, or decode perturbed prompts) over its planned slots."""
  cf, N = setup.counterfactual, rollouts.tokens_NT.shape[0]
  M = setup.loop.prompts_per_step * cf.per_group
  correct_N = jax.ShapeDtypeStruct((N,), jnp.float32)
  plan = fns.counterfactual.plan
  with plan.layout.context():
    cf_plan = jax.eval_shape(plan.jitted, *plan.place((key, rollouts, correct_N), abstract=True))
  prompts = None
  if cf.perturbed:
    P = max(setup.sampler_cfg.prompt_buckets)
    prompts = sampling.Prompts(
      tokens_BP=jax.ShapeDtypeStruct((M, P), jnp.int32),
      mask_BP=jax.ShapeDtypeStruct((M, P), jnp.bool_),
    )
  hyper = setup.sampling_hyper
  return fns.counterfactual.generate, (state.params, rollouts, cf_plan, prompts, key, hyper)


def compile_reward_models(setup, target: Target) -> dict:
  """Each reward model among config.rewards (kind "reward_model") as its source opens it
  (`reward_sources`): params fsdp over one process's devices (the first host's here) by
  the run's rules, `reward_model.score` over batch_size rows (rounded up to the devices)
  of max_len tokens, its architecture read from the path's record or config.json (no
  weights). Returns {"compiled": {"reward_model:<name>": compiled, or the error XLA
  raised}, "params_bytes": {name: bytes per device of its params, resident the whole
  run}, "problems": sources not compiled, "mesh": the reward models' mesh}."""
  from grpo_jax.rewards import reward_model  # noqa: PLC0415 -- when used.

  out, params_b, problems = {}, {}, []
  rules = {"rules": setup.mesh_cfg.rules} if setup.mesh_cfg.rules else {}
  local = [d for d in target.devices if d.process_index == 0]
  layout = sharding.Layout.create(sharding.MeshConfig(data=1, fsdp=-1, tensor=1, **rules), local)
  for spec in _reward_model_specs(setup):
    o = spec.options
    cfg, max_len = _reward_model_architecture(spec)
    if cfg is None:
      problems.append(f"reward model {spec.name!r} not compiled: {max_len}")
      continue
    shardings = reward_model.param_shardings(layout, cfg)
    like = jax.eval_shape(functools.partial(reward_model.init, cfg), jax.random.key(0))
    n = -(-o.batch_size // layout.batch_size_divisor) * layout.batch_size_divisor
    rows = layout.rows(n)
    tokens = jax.ShapeDtypeStruct((n, max_len), jnp.int32, sharding=rows)
    mask = jax.ShapeDtypeStruct((n, max_len), jnp.bool_, sharding=rows)
    params_b[spec.name] = per_device_bytes(like, shardings)
    fn = jax.jit(
      functools.partial(reward_model.score, cfg=cfg), in_shardings=(shardings, rows, rows)
    )
    try:
      out[f"reward_model:{spec.name}"] = compile_function(fn, (like, tokens, mask), layout=layout)
    except jax.errors.JaxRuntimeError as e:
      out[f"reward_model:{spec.name}"] = e
  return {"compiled": out, "params_bytes": params_b, "problems": problems, "mesh": layout.mesh}


def _reward_model_specs(setup) -> list:
  """config.rewards' sources of kind "reward_model" (`reward_sources.SourceSpec`)."""
  from grpo_jax.rewards import reward_sources  # noqa: PLC0415 -- when used.

  specs = reward_sources.specs_from_dict(setup.spec.get("rewards") or {})
  return [s for s in specs if s.kind == "reward_model"]


def _reward_model_architecture(spec) -> tuple:
  """(ModelConfig, max_len) of a reward model source (`reward_model.architecture`), or
  (None, why) when its path cannot be read on this host."""
  from grpo_jax.rewards import reward_model  # noqa: PLC0415 -- when used.

  try:
    return reward_model.architecture(spec.options.path, max_len=spec.options.max_len)
  except OSError as e:  # FileNotFoundError included: the path is on the TPU VM, not here.
    return None, f"{e} (plan on a host that has it)"
  except (ValueError, KeyError) as e:  # A record or config.json the loader cannot read.
    return None, f"{spec.options.path}: {type(e).__name__}: {e}"


def compile_function(jitted, args: tuple, *, layout: sharding.Layout | None = None):
  """XLA's executable of one of the run's functions (a `sharding.Jitted`, or a plain
  jax.jit traced in `layout`'s context) for the arguments' target. It compiles past an
  out-of-memory (`tpu.COMPILE_PAST_OOM`: XLA would refuse, and the report says by how much
  it does not fit), and never into JAX's persistent cache (a compile-only client cannot
  load TPU executables back)."""
  if isinstance(jitted, sharding.Jitted):  # Its arguments on its in_shardings, as it runs.
    layout, args, jitted = jitted.layout, jitted.place(args, abstract=True), jitted.jitted
  if layout is None:
    raise TypeError("compile_function: a plain jax.jit needs layout= (its mesh and rules).")
  with layout.context(), _no_persistent_cache():
    return jitted.lower(*args).compile(compiler_options=tpu.COMPILE_PAST_OOM)


def _placed(tree, shardings):
  """Shapes and dtypes of `tree` with `shardings` (a matching tree, or one for all)."""
  sd = lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)  # noqa: E731
  return jax.tree.map(sd, tree, jax.tree.broadcast(shardings, tree))


def _outputs(compiled):
  """A compiled function's outputs as abstract arguments of the next, sharded as XLA
  chose."""
  return jax.tree.map(
    lambda o: jax.ShapeDtypeStruct(o.shape, o.dtype, sharding=o.sharding), compiled.out_info
  )


def compile_episodes(setup, fns, params, prompts, key) -> tuple[dict, int, list[str]]:
  """config.env's turn loop (the training group's `episodes.Runner`) compiled piece by
  piece, each on the state the one before returns, as a run chains them (its per-row
  arrays and cache split over the batch axes by the pieces' own constraints): the params'
  sampler view when the Runner has one (`model.sampler_view`: adapters merged, or scanned
  layers unrolled; not a row: its output stays in HBM through the loop), "episode_start"
  (the prompts' prefill, the cache repeated to G rows, or their pages), "episode_turn"
  (one action: up to turn_tokens decode steps) and "episode_append" (one block of
  observation_tokens per row after a turn, on pages too), and with env.overlap_steps
  "episode_segment" and "episode_append_rows" (`episode_refill`; S rows, the widest of the
  widths it runs at). Returns ({name:
  compiled, or the error XLA raised}, bytes per device of the view, problems: pieces not
  compiled)."""
  runner = fns.episodes.train
  layout = runner.layout or fns.layout  # The runner's own (`Layout.sampling` of its prompts).
  rep, O = layout.replicated, runner.cfg.observation_tokens  # noqa: E741
  params = _placed(params, fns.state_shardings.params)
  view_b, out = 0, {}
  try:
    if "view" in runner.pieces:
      view = compile_function(runner.pieces["view"], (params,), layout=layout)
      params = _outputs(view)
      view_b = per_device_bytes(params, view.output_shardings)
  except jax.errors.JaxRuntimeError as e:  # Reported as the prefill's: it needs the view.
    return {"episode_start": e}, 0, ["episode_turn, episode_append: not compiled (the "
                                     "sampler view of the params is not)"]  # fmt: skip
  B = prompts.tokens_BP.shape[0]
  N = B * runner.sampler_cfg.group_size
  host = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=rep)  # noqa: E731
  hyper = _placed(setup.sampling_hyper, rep)
  S = runner.sampler_cfg.refill_slots
  slots = lambda: episode_refill.Slots(host((S,), jnp.int32), host((S,), jnp.int32))  # noqa: E731
  arguments = {  # Each piece's arguments given the state the one before returned.
    "start": lambda _: (params, _placed(prompts, layout.rows(B)), _placed(key, rep)),
    "turn": lambda state: (params, state, hyper, host((N,), jnp.bool_)),
    "append": lambda state: (params, state, host((N, O), jnp.int32), host((N,), jnp.int32)),
    # env.overlap_steps: a segment of decode steps, then S episodes' observations.
    "segment": lambda state: (params, state, slots(), hyper, host((N,), jnp.bool_)),
    "append_rows": lambda state: (
      params, state, host((S,), jnp.int32), host((S, O), jnp.int32), host((S,), jnp.int32)
    ),
  }  # fmt: skip
  state, pieces = None, [p for p in arguments if p in runner.pieces]
  for k, piece in enumerate(pieces):
    name = f"episode_{piece}"
    try:
      out[name] = compile_function(runner.pieces[piece], arguments[piece](state), layout=layout)
    except jax.errors.JaxRuntimeError as e:
      out[name] = e
      later = [f"episode_{p}" for p in pieces[k + 1 :]]
      return out, view_b, [f"{', '.join(later)}: not compiled ({name} is not)"] if later else []
    state = _outputs(out[name])
    state = state[0] if piece == "segment" else state  # (state, slots, ready, acted).
  return out, view_b, []


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
  (the train state's optimizer part while sampling, the reference while updating...);
  also "params" and "ref", the policy's params and the reference alone."""
  state, _, _, _ = args["update"][1]
  ref = args["logprobs"][1][1]
  state_b = per_device_bytes(state, fns.state_shardings)
  params_b = per_device_bytes(state.params, fns.state_shardings.params)
  ref_b = per_device_bytes(ref, fns.rl.logprobs.in_shardings[1]) if ref is not None else 0
  if ref is not None and model.is_adapted(state.params):
    ref_b = 0  # The reference is the train state's own base (`model.reference_part`).
  out = {
    "params": params_b,
    "ref": ref_b,
    "sample": state_b - params_b + ref_b,
    "logprobs": state_b - params_b,
    "update": ref_b,
    "counterfactual": state_b - params_b + ref_b,  # Decodes, as the sampler does.
  }
  if "teacher" not in args:
    return out
  teacher_b = per_device_bytes(args["teacher"][1][0], fns.rl.teacher.in_shardings[0])
  out = {k: v if k in ("params", "ref") else v + teacher_b for k, v in out.items()}
  # While it scores, the train state (params and Adam) and the reference are held beside it.
  return out | {"teacher_params": teacher_b, "teacher": state_b + ref_b}


def model_roofline(setup, target: Target, *, params_bytes: int, kv_bytes: int) -> dict:
  """Seconds per phase of one iteration at the chip's peak: model FLOPs
  (`flops.run_phase_flops`: the LM head only where logits are used, every row decoding all
  T tokens) over every device's bf16 peak, or, for decoding, the bytes each step reads
  (the whole params, as a decode step reads every weight after fsdp's gather, plus the
  device's KV cache) over its HBM bandwidth, whichever is longer; with config.env the
  episode pieces' (`_episode_roofline`) in place of "sample", and each reward model's
  forward over the rollout rows. XLA's own cost_analysis counts a while loop's body once
  (decode steps, the update's scan), so its figures are reported beside these, not used
  for time."""
  scfg, loop = setup.sampler_cfg, setup.loop
  T, n = scfg.max_new_tokens, len(target.devices)
  peak = n * tpu.per_device(target.chip).peak_bf16_flops
  bandwidth = tpu.per_device(target.chip).hbm_bytes_per_s
  work = flops.run_phase_flops(setup, prompt_len=max(scfg.prompt_buckets))
  out = {
    "sample": max(work["sample"] / peak, T * (params_bytes + kv_bytes) / bandwidth),
    "logprobs": work["logprobs"] / peak,
    "update": work["update"] / peak,
  }
  if setup.counterfactual.enabled:  # M rows decode from their cuts: at most T steps each.
    M = loop.prompts_per_step * setup.counterfactual.per_group
    rows = loop.prompts_per_step * scfg.group_size
    out["counterfactual"] = out["sample"] * M / rows
  if setup.episodes is not None:
    out |= _episode_roofline(setup, peak=peak, bandwidth=bandwidth, params_bytes=params_bytes,
                             kv_bytes=kv_bytes)  # fmt: skip
  if setup.teacher_source is not None:  # One forward over every rollout row, head at T.
    tokens = max(scfg.prompt_buckets) + T
    one = flops.sequence_forward_flops(
      setup.teacher_source.model_cfg, length=tokens, head_positions=T
    )
    out["teacher"] = setup.rollout_rows * one / peak
  for spec in _reward_model_specs(setup):  # Every rollout row's max_len forward, no head.
    cfg, max_len = _reward_model_architecture(spec)
    if cfg is not None:
      work = setup.rollout_rows * flops.sequence_forward_flops(
        cfg, length=max_len, head_positions=0
      )
      out[f"reward_model:{spec.name}"] = work / peak
  return out


def _episode_roofline(setup, *, peak: float, bandwidth: float, params_bytes: int, kv_bytes: int):
  """config.env's pieces over one iteration at the chip's peak (`model_roofline`), each the
  total of its calls (a memory row is one call): the prefill of the B prompts; every
  turn's decode steps (max_turns × turn_tokens, at most T, every row), each reading the
  params and the cache; and max_turns appends of O tokens per row, each one call reading
  them once (on pages too: `paged.append_block`)."""
  cfg, scfg, ep = setup.model_cfg, setup.sampler_cfg, setup.episodes
  B, P, T = setup.loop.prompts_per_step, max(scfg.prompt_buckets), scfg.max_new_tokens
  N, steps = B * scfg.group_size, min(ep.max_turns * ep.turn_tokens, T)
  per_token = flops.forward_flops_per_token(cfg, context=P + T / 2)
  body = per_token - 2 * flops.head_matmul_params(cfg)  # An append's logits are not used.
  prefill = B * flops.sequence_forward_flops(cfg, length=P - 1, head_positions=0)
  return {
    "episode_start": prefill / peak,
    "episode_turn": max(
      N * steps * per_token / peak, steps * (params_bytes + kv_bytes) / bandwidth
    ),
    "episode_append": ep.max_turns
    * max(N * ep.observation_tokens * body / peak, (params_bytes + kv_bytes) / bandwidth),
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


def limit_bytes(setup, target: Target) -> int:
  """Bytes per device the run may use: the chip's HBM, or config.memory_limit_gib when it
  is set and smaller (room kept for something else, or a what-if)."""
  hbm = tpu.per_device(target.chip).hbm_bytes
  limit = setup.loop.memory_limit_gib * tpu.GiB
  return int(min(hbm, limit)) if limit else hbm


def compile_all(setup, target: Target) -> dict:
  """The run's functions compiled for the target: {"rows": a report per function (XLA's
  bytes plus the resident arrays: "peak_bytes", "fits"; a function XLA refuses to compile
  for one buffer over the whole HBM gets `tpu.refused`'s row, its need a lower bound, and
  one it rejects with no figure a row whose need is unknown),
  "problems": check_update's and the pieces not compiled, "fns", "args"}."""
  fns = steps.functions_on(setup, target.devices)
  args = abstract_arguments(setup, fns)
  got, problems = {}, []
  for name, (jitted, a) in args.items():
    try:
      got[name] = compile_function(jitted, a)
    except jax.errors.JaxRuntimeError as e:  # One buffer over the whole HBM: a row below.
      got[name] = e
    if name == "update" and not isinstance(got[name], Exception):
      problems += check_update(got[name], jitted, a[0])
  meshes = dict.fromkeys(got, fns.layout.mesh)
  extra = resident(setup, fns, args)
  if fns.episodes is not None:
    state, _, key, prompts = abstract.inputs(setup, fns)
    pieces, view_b, bad = compile_episodes(setup, fns, state.params, prompts, key)
    got |= pieces
    meshes |= dict.fromkeys(pieces, fns.layout.mesh)
    base = extra["sample"] + (extra["params"] if view_b else 0)  # The view: an argument.
    extra |= dict.fromkeys(pieces, base)
    problems += bad
  rms = compile_reward_models(setup, target)
  got |= rms["compiled"]
  meshes |= dict.fromkeys(rms["compiled"], rms["mesh"])
  problems += rms["problems"]
  held = sum(rms["params_bytes"].values())  # Every reward model's params, the whole run.
  for name, own in rms["params_bytes"].items():  # Scoring: the train state and reference
    extra[f"reward_model:{name}"] = extra["logprobs"] + extra["params"] + extra["ref"] - own
  extra = {name: extra.get(name, 0) + held for name in got}
  limit = limit_bytes(setup, target)
  rows = [_row(name, c, target=target, mesh=meshes[name], held=extra[name], limit=limit)
          for name, c in got.items()]  # fmt: skip
  return {"rows": rows, "problems": problems, "fns": fns, "args": args}


def _row(name: str, got, *, target: Target, mesh, held: int, limit: int) -> dict:
  """One function's report (`tpu.report`), or `tpu.refused`'s when XLA refused it for its
  memory (one buffer over the whole HBM) or rejected it with no figure ("Invalid TPU
  program": `need_unknown`, its peak then only `held`; any other error is raised again),
  with `held` resident bytes added to its peak."""
  if isinstance(got, Exception):
    report = tpu.refused(got, chip=target.chip, mesh=mesh)
    if report is None:
      raise got
    return {**report, "name": name, "resident_bytes": held, "limit_bytes": limit,
            "peak_bytes": report["total_bytes"] + held}  # fmt: skip
  report = tpu.report(got, chip=target.chip, mesh=mesh)
  peak = report["total_bytes"] + held
  return {**report, "name": name, "resident_bytes": held, "peak_bytes": peak,
          "limit_bytes": limit, "fits": peak <= limit}  # fmt: skip


def process_rows(fns, setup) -> tuple[dict, list[str]]:
  """How a multi-host launch feeds the compiled functions (`infra.distributed`): each
  process draws the prompts and scores the rollout rows its own devices hold, which must be
  one contiguous block per process (`distributed.local_rows`, else
  `make_array_from_process_local_data` cannot build the global batch). Returns ({"prompts":
  {process: [start, stop)}, "rollouts": ...}, problems)."""
  first = lambda sh: jax.tree.leaves(sh)[0]  # noqa: E731  (one sharding for every row array)
  batches = {
    "prompts": (first(fns.samplers.train.in_shardings[1]), setup.loop.prompts_per_step),
    "rollouts": (first(fns.rl.update.in_shardings[1]), setup.update_rows),
  }
  out, problems = {}, []
  for what, (sh, n) in batches.items():
    try:
      out[what] = {int(p): list(r) for p, r in sorted(distributed.row_ranges(sh, n).items())}
    except ValueError as e:
      problems.append(f"{what}: {e}")
  return out, problems


def fingerprint(config_dict) -> str:
  """A short hash of the keys of a config that differ from `config.default_config()`, with
  their values: a compile record names the config it compiled, so a config changed since
  is found (tests/trainer/test_aot.py). A key the defaults gain later, at a default that changes
  nothing, leaves every record's fingerprint as it was (the whole config was hashed until
  2026-12-03, and every new field meant recompiling every shipped config, 40 minutes here);
  a changed default is a code change, which the record's commit names."""
  got, base = (
    _flat(config_lib.to_dict(config_dict)),
    _flat(config_lib.to_dict(grpo_config.default_config())),
  )
  changed = {k: v for k, v in got.items() if k not in base or base[k] != v}
  text = json.dumps(changed, sort_keys=True, default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def _flat(tree: dict, prefix: str = "") -> dict:
  """{"rl.micro_batches": 4, ...}: a nested dict's leaves by dotted key (an empty dict is
  a leaf, so an empty `task.kwargs` differs from a filled one)."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) and v:
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def with_overrides(config_dict, overrides: dict):
  """A copy of the config with dotted keys set ({"rl.micro_batches": 8, ...})."""
  c = ml_collections.ConfigDict(config_lib.to_dict(config_dict))
  for dotted, value in overrides.items():
    *path, last = dotted.split(".")
    node = c
    for part in path:
      node = node[part]
    node[last] = value
  return c


def ladder(setup, target: Target) -> list[tuple[dict, str]]:
  """The changes tried when a config does not fit, each rung adding one to the rungs
  before it (cumulative), cheapest in speed first:
    1. model.remat="full" with scan_layers (the backward keeps one input a layer),
    2. rl.logprob_batches = num_minibatches × micro_batches (the π_old and reference
       forwards at the update's micro-batch rows),
    3. rl.logit_chunk=256 (the [rows, T, vocab] logits and their gradient never exist at
       once; the head is recomputed in the backward),
    4. rl.micro_batches doubled until one row per device per micro-batch (and the
       log-prob slices with them); with rl.micro_batch_tokens, the budget halved while it
       holds a full-length row per device,
    5. mesh.data=1, mesh.fsdp=-1 (state sharded, not replicated over data),
    6. mesh.tensor=2, 4, 8 within a slice (heads, MLP and vocabulary split; needs the query
       and KV heads divisible), fsdp over the rest.
  Changes of the algorithm or its numerics (kl_coef, bfloat16 params, fewer rows or
  tokens) are not tried: they are the user's choice (`memory_advice.advice` names them)."""
  cfg, rl_cfg, mesh = setup.model_cfg, setup.rl_cfg, setup.mesh_cfg
  rungs, now = [], {}

  def add(change: dict, text: str):
    now.update(change)
    rungs.append((dict(now), text))

  if cfg.remat != "full" or not cfg.scan_layers:
    add({"model.remat": "full", "model.scan_layers": True}, "full remat over scanned layers")
  per_slice = len(target.devices) // target.num_slices
  data = setup.mesh_cfg.data if setup.mesh_cfg.data > 0 else 1
  split = max(1, len(target.devices) // max(1, mesh.tensor))  # Rows split over data × fsdp.
  rows = setup.update_rows // rl_cfg.num_minibatches
  mb, lp = rl_cfg.micro_batches, rl_cfg.logprob_batches
  if rl_cfg.num_minibatches * mb > lp:  # The forwards at the update's micro-batch rows.
    lp = rl_cfg.num_minibatches * mb
    add({"rl.logprob_batches": lp}, f"the log-prob forwards in {lp} slices")
  scfg = setup.sampler_cfg
  T = scfg.max_new_tokens
  if T > LOGIT_CHUNK and not 0 < rl_cfg.logit_chunk <= LOGIT_CHUNK:
    add({"rl.logit_chunk": LOGIT_CHUNK}, f"the LM head {LOGIT_CHUNK} positions at a time")
  budget, row_tokens = rl_cfg.micro_batch_tokens, max(scfg.prompt_buckets) + T
  while budget and budget // 2 >= row_tokens * split:  # Token-budget micro-batches.
    budget //= 2
    add({"rl.micro_batch_tokens": budget}, f"micro-batches of {budget} tokens")
  while not budget and rows % (2 * mb) == 0 and (rows // (2 * mb)) % split == 0:
    mb *= 2
    lp = max(lp, rl_cfg.num_minibatches * mb)
    add({"rl.micro_batches": mb, "rl.logprob_batches": lp}, f"{mb} micro-batches")
  if data > target.num_slices:
    add({"mesh.data": target.num_slices, "mesh.fsdp": -1}, "fsdp instead of data parallelism")
  for t in (2, 4, 8):
    if t > mesh.tensor and not (cfg.n_kv_heads % t or cfg.n_heads % t or per_slice % t):
      add({"mesh.tensor": t, "mesh.fsdp": -1}, f"tensor parallelism {t}")
  return rungs


def planned_rungs(config_dict, setup, target: Target, *, model_source: str = ""):
  """Each rung of `ladder` for `config_dict` (`setup`: its own setup_for) with the rung's
  setup and the memory plan's peak a device, in order: (overrides, text, setup, plan
  peak bytes), lazily (a setup builds the abstract model)."""
  for overrides, text in ladder(setup, target):
    s, _ = setup_for(with_overrides(config_dict, overrides), target, model_source=model_source)
    yield overrides, text, s, memory.plan_for(s, n_devices=len(target.devices), platform="tpu").peak


def advise(config_dict, target: Target, *, model_source: str = "", max_compiles: int = 3):
  """The first rung of `ladder` that fits, checked by compiling it: {"overrides", "line"
  (the advice, as flags), "peak_bytes", "compiled": rungs compiled, "plan": the fitting
  rung's `figures`}, or "overrides" None when no rung fits. The memory plan
  (`memory.plan_for`, instant) skips rungs it says cannot fit, and a rung whose mesh jax
  cannot lay on the topology's torus (`mesh_utils.create_device_mesh` raises
  NotImplementedError) is skipped; at most `max_compiles` rungs are compiled (a 7B
  compile takes minutes)."""
  setup, _ = setup_for(config_dict, target, model_source=model_source)
  hbm = limit_bytes(setup, target)
  compiled = 0
  rungs = planned_rungs(config_dict, setup, target, model_source=model_source)
  for overrides, text, s, planned in rungs:
    if planned > PLAN_SLACK * hbm:
      continue  # The plan's figure is a guide (within ~20% of XLA's: experiments/results/tpu_aot).
    try:
      got = compile_all(s, target)
    except NotImplementedError:  # jax lays no device mesh of this shape on the torus.
      continue
    compiled += 1
    peak = max(r["peak_bytes"] for r in got["rows"])
    if all(r["fits"] for r in got["rows"]):
      flags = " ".join(f"--config.{k}={v}" for k, v in overrides.items())
      line = (
        f"fits with {text} and the rungs before it: {flags} (compiled: peak "
        f"{peak / tpu.GiB:.2f} of {hbm / tpu.GiB:.2f} GiB per device)"
      )
      return {"overrides": overrides, "line": line, "peak_bytes": peak, "compiled": compiled,
              "plan": figures(s, target, got)}  # fmt: skip
    if compiled >= max_compiles:
      break
  line = (
    f"no remat, micro-batch or mesh change fits {target.topology} x {target.num_slices} "
    f"({compiled} compiled): more chips, fewer rows or tokens, rl.kl_coef=0 or "
    "model.param_dtype='bfloat16' (`grpo-jax plan` without --topology prices each)"
  )
  return {"overrides": None, "line": line, "peak_bytes": None, "compiled": compiled, "plan": None}


def plan(
  config_dict, *, topology: str, num_slices: int = 1, model_source: str = "", advice: bool = True
) -> dict:
  """Compiles the run's functions for the topology: {"rows": reports per function,
  "table": the terminal table, "run": the iteration's figures, "problems": check_update's
  and process_rows', "notes": [...], "advice": `advise`'s when it does not fit (and
  `advice`), else None}."""
  target = Target.load(topology, num_slices=num_slices)
  setup, note = setup_for(config_dict, target, model_source=model_source)
  got = figures(setup, target, compile_all(setup, target))
  got["notes"] = [note] if note else []
  got["advice"] = None
  if advice and not got["run"]["fits"]:
    got["advice"] = advise(config_dict, target, model_source=model_source)
  return got


def figures(setup, target: Target, got: dict) -> dict:
  """`compile_all`'s rows with the run's figures: the model-FLOPs roofline per function,
  the memory plan's peak beside XLA's, the processes' rows, the terminal table."""
  rows, problems, args = got["rows"], got["problems"], got["args"]
  mesh = got["fns"].layout.mesh
  local, bad = process_rows(got["fns"], setup)
  p = memory.plan_for(setup, n_devices=len(target.devices), platform="tpu")
  state = args["update"][1][0]
  itemsize = jnp.dtype(setup.sampler_cfg.dtype or setup.model_cfg.dtype).itemsize
  full_params = sum(math.prod(x.shape) * itemsize for x in jax.tree.leaves(state.params))
  every = model_roofline(setup, target, params_bytes=full_params, kv_bytes=p.kv_cache)
  roofline = {r["name"]: every[r["name"]] for r in rows}  # The phases this run has.
  for r in rows:
    r["model_roofline_s"] = roofline[r["name"]]
  run = {
    "topology": target.topology,
    "num_slices": target.num_slices,
    "chip": target.chip.name,
    "devices": len(target.devices),
    "hosts": tpu.hosts(target.devices),
    "process_rows": local,
    "mesh": dict(mesh.shape),
    "fits": all(r["fits"] for r in rows),
    "peak_bytes": max(r["peak_bytes"] for r in rows),
    # A function the compiler refused with no figure: the peak above is a lower bound.
    "peak_unknown": any(r.get("need_unknown") for r in rows),
    "limit_bytes": limit_bytes(setup, target),
    "plan_peak_bytes": p.peak,
    "roofline_s": roofline,
    "roofline_iteration_s": sum(roofline.values()),
  }
  return {"rows": rows, "table": tpu.format_table(rows), "run": run,
          "problems": problems + bad}  # fmt: skip
