"""The run's compiled functions: every `jax.jit` of the trainer, with its shardings.

    fns = steps.functions(setup)          # built once per config (cached), nothing compiles yet
    rollouts = fns.samplers.train(params, prompts, key, sampling_hyper)
    state, idx_EMb, metrics_S = fns.rl.update(state, batch, key, step_hyper)

This is the third of the three places where sharding is declared (logical names in
`model`, the rules table in `config.mesh`, and here, the in/out shardings of each jit):
params and optimizer state follow the rules table, batches (prompts, rollouts,
mini-batches) are split over data × fsdp × expert (a sampler's rows over `sequence` too,
`sharding.Layout.sampling`), hyperparameters and metrics are replicated.
Before anything is built, a config whose memory plan does not fit the device is refused
(`memory_advice.check`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import optax

from grpo_jax import envs, schema
from grpo_jax.envs import episodes
from grpo_jax.infra import registry
from grpo_jax.models import model, paged, refill, sampling, sharding
from grpo_jax.rl import learner, preparation, spec
from grpo_jax.rollouts import counterfactuals, partial
from grpo_jax.trainer import build, memory, memory_advice, warmstart


@dataclasses.dataclass(frozen=True)
class Samplers:
  """The jitted samplers, `(params, prompts, key, sampling_hyper) -> Rollouts`."""

  train: sharding.Jitted  # G rows per prompt (refill slots when sampler.refill_slots).
  greedy: sharding.Jitted  # One row per prompt, for greedy evaluation.
  eval: sharding.Jitted | None  # eval_samples rows per prompt, for pass@k (None when off).


@dataclasses.dataclass(frozen=True)
class RLSteps:
  """The RL half of an iteration, in the order the trainer calls them."""

  logprobs: sharding.Jitted  # preparation.rollout_logprobs: dispatched before rewards.
  finish: sharding.Jitted  # preparation.finish_prepare: advantages and masks.
  update: sharding.Jitted  # learner.update: plan + a scan of train steps.
  # preparation.teacher_logprobs, (teacher params, rollouts) -> log π_T [N, T]: config.teacher
  # (None without one); `with_teacher` folds it into `logprobs`.
  teacher: sharding.Jitted | None = None


@dataclasses.dataclass(frozen=True)
class WarmStart:
  """The supervised warm start (`warmstart`): its optimizer, state shardings and step."""

  optimizer: optax.GradientTransformation
  state_shardings: Any  # spec.TrainState with this optimizer.
  step: sharding.Jitted  # warmstart.sft_step: one cross-entropy step on solutions.


@dataclasses.dataclass(frozen=True)
class CounterfactualSteps:
  """IBPO's counterfactual rows (config.counterfactual.per_group > 0)."""

  plan: sharding.Jitted  # counterfactuals.plan: the slots' parents and cuts.
  generate: sharding.Jitted  # counterfactuals.generate: decodes the M rows.
  merge: sharding.Jitted  # counterfactuals.merge: the group-major batch and Provenance.
  samples: sharding.Jitted | None  # The samples' rows of a prepared batch (None: train all).


@dataclasses.dataclass(frozen=True)
class PartialRollouts:
  """The off-policy pipeline's partial rollouts (config.offpolicy.partial)."""

  cont: sharding.Jitted  # partial.continue_rows: one segment of every live row.
  empty: sharding.Jitted  # partial.empty_rollouts: the batch rows start from.


@dataclasses.dataclass(frozen=True)
class EpisodeRunners:
  """Multi-turn episode runners (config.env), `episodes.Runner` for each row count."""

  train: episodes.Runner  # The training group.
  greedy: episodes.Runner  # Greedy evaluation.
  eval: episodes.Runner | None  # pass@k evaluation (None when eval_samples = 0).


@dataclasses.dataclass(frozen=True)
class Functions:
  """Everything a run compiles, in typed groups; an optional group is None when its
  feature is off."""

  layout: sharding.Layout  # The mesh and its rules.
  param_shardings: Any  # What loads fill.
  state_shardings: Any  # spec.TrainState with the RL optimizer.
  model_fn: Callable
  optimizer: optax.GradientTransformation
  samplers: Samplers
  rl: RLSteps
  warmstart: WarmStart
  counterfactual: CounterfactualSteps | None = None
  partial: PartialRollouts | None = None
  episodes: EpisodeRunners | None = None
  teacher_shardings: Any = None  # The teacher's params' (config.teacher), what its load fills.


# Loop fields the compiled functions depend on (with the model, sampler, RL and mesh).
_CACHE_FIELDS = (
  "prompts_per_step",
  "learning_rate",
  "warmup_steps",
  "weight_decay",
  "grad_clip",
  "warmstart_lr",
  "warmstart_batch",
  "eval_size",
  "eval_samples",
  "memory_limit_gib",  # The memory check runs when the functions are built.
)
_FUNCTIONS: dict[str, Functions] = {}  # Config repr -> functions (oldest first out).


def functions(setup: build.Setup) -> Functions:
  """The jitted pieces of a run; built once per (model, sampler, RL, optimizer, mesh), so a
  notebook that reruns a config does not recompile."""
  loop = setup.loop
  key = repr(
    (
      setup.model_cfg,
      setup.sampler_cfg,
      setup.rl_cfg,
      setup.mesh_cfg,
      setup.counterfactual,
      setup.steps,
      setup.offpolicy,
      setup.episodes and (setup.episodes, setup.spec.get("task")),  # The env and its tokenizer.
      setup.teacher_source and setup.teacher_source.model_cfg,
      jax.devices(),
      [getattr(loop, f) for f in _CACHE_FIELDS],
      registry.changes(),  # A variant registered or redefined since: traced afresh.
    )
  )
  if key not in _FUNCTIONS:
    check_memory(setup)  # Before anything compiles.
    if len(_FUNCTIONS) >= 4:
      _FUNCTIONS.pop(next(iter(_FUNCTIONS)))
    _FUNCTIONS[key] = _build(setup)
  return _FUNCTIONS[key]


def memory_limit(loop: schema.LoopConfig) -> float | None:
  """Bytes per device the plan must fit: loop.memory_limit_gib, else the device's own
  limit (jax's memory_stats: GPU, TPU), else None (CPU: no check)."""
  return memory.limit_bytes(loop.memory_limit_gib)


def check_memory(setup: build.Setup) -> None:
  """Refuses, before compiling, a config whose memory plan exceeds the device memory
  (`memory_advice.OutOfMemoryPlan`, with the plan and what to change)."""
  limit = memory_limit(setup.loop)
  if limit:
    plan = memory.plan_for(setup)
    memory_advice.check(plan, limit, setup.model_cfg, setup.rl_cfg)


def optimizers(loop: schema.LoopConfig):
  """(RL optimizer, warm-start optimizer): the same chain at their learning rates."""
  make = functools.partial(
    spec.make_optimizer,
    warmup_steps=loop.warmup_steps,
    weight_decay=loop.weight_decay,
    grad_clip=loop.grad_clip,
  )
  return make(lr=loop.learning_rate), make(lr=loop.warmstart_lr)


_ROLLOUT_FIELDS = [f.name for f in dataclasses.fields(sampling.Rollouts) if f.name != "num_steps"]


@dataclasses.dataclass(frozen=True)
class _Shardings:
  """The shardings every jit below takes: by the rules table, split rows, replicated."""

  layout: sharding.Layout
  params: Any
  state: Any  # spec.TrainState with the RL optimizer.
  sft_state: Any  # spec.TrainState with the warm-start optimizer.
  ref: Any  # The reference params (replicated None without a KL term).

  def rows(self, n: int):
    return self.layout.rows(n)

  @property
  def rep(self):
    return self.layout.replicated

  def rollouts(self, n: int) -> sampling.Rollouts:  # Rows split, the step count replicated.
    return sampling.Rollouts(**{f: self.rows(n) for f in _ROLLOUT_FIELDS}, num_steps=self.rep)


def _shardings(setup: build.Setup, layout: sharding.Layout, optimizer, sft_optimizer):
  mcfg = setup.model_cfg
  params = sharding.param_shardings(layout, mcfg, stored=True)
  state, sft_state = (
    sharding.tree_shardings(
      layout,
      lambda k, o=o, p=p: spec.init_state(
        warmstart.stored(model.init_boxed(mcfg, k), mcfg, p), o, part=p
      ),
      jax.random.key(0),
    )
    for o, p in ((optimizer, "adapters"), (sft_optimizer, warmstart.part(mcfg)))
  )
  ref = model.reference_part(params) if setup.rl_cfg.use_ref else layout.replicated
  return _Shardings(layout=layout, params=params, state=state, sft_state=sft_state, ref=ref)


def _on_sampling_layout(sh: _Shardings, prompts: int) -> _Shardings:
  """`sh` on the layout of a sampler of `prompts` prompts (`sharding.Layout.sampling`:
  with context parallelism its rows split over `sequence` as well); the
  params' and state's shardings are the same (the rules differ in activations only)."""
  layout = sh.layout.sampling(prompts)
  return sh if layout is sh.layout else dataclasses.replace(sh, layout=layout)


def _sampler_model(setup: build.Setup, model_fn, layout: sharding.Layout):
  """(model config, model_fn, view) the samplers run: the model's, in sampler.dtype when
  set; with adapters merged for sampling, the base model on `view(params)`
  (`model.sampler_view`; view None: the params as given); scanned layers unrolled when
  the mesh does not shard the weights over fsdp."""
  mcfg, view = model.sampler_view(setup.model_cfg, fsdp=layout.mesh.shape["fsdp"])
  dtype = setup.sampler_cfg.dtype
  if mcfg is not setup.model_cfg or (dtype and dtype != mcfg.dtype):
    mcfg = dataclasses.replace(mcfg, dtype=dtype or mcfg.dtype)
    model_fn = model.make_model_fn(mcfg)
  return mcfg, model_fn, view


def _init_cache(setup: build.Setup, mcfg: model.ModelConfig):
  """The samplers' `init_cache(batch, length)`: sliding-window layers in window-sized rings
  (`kv_cache.init_cache`), which the paged layout keeps as a ring per row (`paged.pool`)."""
  return functools.partial(model.init_cache, mcfg)


# The static sampler of each sampler.kv_layout (`sampling.KV_LAYOUTS`).
_STATIC_SAMPLERS = {"dense": sampling.sample, "paged": paged.sample}


def _sampler(
  setup: build.Setup,
  sh: _Shardings,
  model_fn,
  *,
  group: int,
  prompts: int,
  slots: int = 0,
  train: bool = False,
):
  """`sampling.sample` (or `paged.sample`, sampler.kv_layout) for `prompts` prompts ×
  `group` rows each; with `slots`, the slot-refill sampler (`refill.sample`); in sampler.dtype when it is set. Only the
  `train` sampler records routes (rl.routing_replay)."""
  sh = _on_sampling_layout(sh, math.gcd(prompts, slots) if slots else prompts)
  mcfg, model_fn, view = _sampler_model(setup, model_fn, sh.layout)
  scfg = setup.sampler_cfg
  kw = dict(
    model_fn=model_fn,
    init_cache=_init_cache(setup, mcfg),
    cfg=dataclasses.replace(scfg, group_size=group, record_routes=scfg.record_routes and train),
  )
  fn = (
    functools.partial(refill.sample, slots=slots, **kw)
    if slots
    else functools.partial(_STATIC_SAMPLERS[scfg.kv_layout], **kw)
  )
  return sharding.Jitted(
    sh.layout,
    sampling.viewed(fn, view),
    in_shardings=(sh.params, sh.rows(prompts), sh.rep, sh.rep),
    out_shardings=sh.rollouts(prompts * group),
  )


def _counterfactual_functions(setup: build.Setup, sh: _Shardings, model_fn):
  """IBPO's counterfactual rows: plan the slots, decode them, merge them into the batch."""
  cf, scfg = setup.counterfactual, setup.sampler_cfg
  if not cf.enabled:
    return None
  B, G = setup.loop.prompts_per_step, scfg.group_size
  N, M, rep = B * G, B * cf.per_group, sh.rep
  plan = functools.partial(counterfactuals.plan, cfg=cf, group_size=G, splitter=setup.steps)
  mcfg, model_fn, view = _sampler_model(setup, model_fn, sh.layout)
  generate = functools.partial(
    counterfactuals.generate,
    model_fn=model_fn,
    init_cache=_init_cache(setup, mcfg),
    sampler_cfg=scfg,
    cfg=cf,
  )
  generate = sampling.viewed(generate, view)
  merge = functools.partial(counterfactuals.merge, group_size=G, kind=cf.kind)
  gen = _on_sampling_layout(sh, B)  # The decode's rows: over `sequence` too.
  return CounterfactualSteps(
    plan=sharding.Jitted(
      sh.layout, plan, in_shardings=(rep, sh.rollouts(N), sh.rows(N)), out_shardings=rep
    ),
    generate=sharding.Jitted(
      gen.layout,
      generate,
      in_shardings=(gen.params, gen.rollouts(N), rep, gen.rows(M), rep, rep),
      out_shardings=(gen.rollouts(M), gen.rows(M)),
    ),
    merge=sharding.Jitted(
      sh.layout,
      merge,
      in_shardings=(sh.rollouts(N), sh.rollouts(M), sh.rows(M), rep),
      out_shardings=(sh.rollouts(setup.rollout_rows), sh.rows(setup.rollout_rows)),
    ),
    samples=sharding.Jitted(
      sh.layout,
      functools.partial(counterfactuals.sample_rows, group_size=G, per_group=cf.per_group),
      in_shardings=(sh.rows(setup.rollout_rows),),
      out_shardings=sh.rows(N),
    )
    if not cf.train
    else None,
  )


def _rl_functions(setup: build.Setup, sh: _Shardings, model_fn, optimizer) -> RLSteps:
  """The RL half: log-prob forwards, prepare, and the update phase."""
  rl_cfg, N, U = setup.rl_cfg, setup.rollout_rows, setup.update_rows
  rows, rep = sh.rows(N), sh.rep
  plan_fn = learner.make_plan_fn(rl_cfg, batch_size=U, group_size=setup.update_group)
  return RLSteps(
    logprobs=sharding.Jitted(
      sh.layout,
      functools.partial(preparation.rollout_logprobs, cfg=rl_cfg, model_fn=model_fn),
      in_shardings=(sh.params, sh.ref, sh.rollouts(N)),
      out_shardings=rows,
    ),
    finish=sharding.Jitted(
      sh.layout,
      functools.partial(
        preparation.finish_prepare,
        cfg=rl_cfg,
        cf_cfg=setup.counterfactual,
        splitter=setup.steps,
        group_size=setup.sampler_cfg.group_size,
      ),
      in_shardings=(rows, sh.rollouts(N), rows, rows, rep, rows, rows, rows),
      out_shardings=(rows, rows, rep),
    ),
    update=sharding.Jitted(
      sh.layout,
      functools.partial(
        learner.update,
        cfg=rl_cfg,
        model_fn=model_fn,
        optimizer=optimizer,
        plan_fn=plan_fn,
        row_multiple=sh.layout.batch_size_divisor,
      ),
      in_shardings=(sh.state, sh.rows(U), rep, rep),
      out_shardings=(sh.state, rep, rep),
      donate_argnums=(0,),
    ),
    teacher=_teacher_function(setup, sh),
  )


def _teacher_function(setup: build.Setup, sh: _Shardings) -> sharding.Jitted | None:
  """The teacher's teacher-forced log-probs of the rollouts (config.teacher), on its own
  params' shardings under the run's rules (sharded like the reference)."""
  if setup.teacher_source is None:
    return None
  tcfg, N = setup.teacher_source.model_cfg, setup.rollout_rows
  return sharding.Jitted(
    sh.layout,
    functools.partial(
      preparation.teacher_logprobs, cfg=setup.rl_cfg, model_fn=model.make_model_fn(tcfg)
    ),
    in_shardings=(sharding.param_shardings(sh.layout, tcfg), sh.rollouts(N)),
    out_shardings=sh.rows(N),
  )


def with_teacher(fns: Functions, teacher_params) -> Functions:
  """`fns` whose rl.logprobs also scores the rollouts under the teacher
  (`PolicyLogProbs.teacher_logp_NT`), so every caller (the synchronous loop, dynamic
  sampling, counterfactuals, the off-policy pipeline) hands it to the estimator; `fns`
  itself when the run has no teacher."""
  if fns.rl.teacher is None:
    return fns
  inner, teacher_fn = fns.rl.logprobs, fns.rl.teacher

  def logprobs(params, ref_params, rollouts):
    lp = inner(params, ref_params, rollouts)
    return lp.replace(teacher_logp_NT=teacher_fn(teacher_params, rollouts))

  return dataclasses.replace(fns, rl=dataclasses.replace(fns.rl, logprobs=logprobs))


def _layouts(setup: build.Setup, devices=None) -> tuple[sharding.Layout, sharding.Layout]:
  """(trainer layout, training sampler's layout): the same mesh over every device, or with
  offpolicy placement "split" the sampler's first `sampler_devices` devices (data-parallel
  over them) and the trainer's mesh over the rest. `devices`: this host's by default, or
  a TPU topology's abstract devices (`aot`: compiled, never run)."""
  op = setup.offpolicy
  devices = list(jax.devices() if devices is None else devices)
  if not (op.enabled and op.placement == "split"):
    layout = sharding.Layout.create(setup.mesh_cfg, devices)
    return layout, layout
  k = op.sampler_devices
  sampler_mesh = sharding.MeshConfig(data=k, fsdp=1, tensor=1, rules=setup.mesh_cfg.rules)
  return (
    sharding.Layout.create(setup.mesh_cfg, devices[k:]),
    sharding.Layout.create(sampler_mesh, devices[:k]),
  )


def _offpolicy_functions(setup: build.Setup, sh: _Shardings, model_fn):
  """Partial rollouts' segment decode and empty start batch, on the sampler's devices."""
  op, scfg = setup.offpolicy, setup.sampler_cfg
  if not (op.enabled and op.partial != "off"):
    return None
  B, G = setup.loop.prompts_per_step, scfg.group_size
  sh = _on_sampling_layout(sh, B)
  N, rep = B * G, sh.rep
  mcfg, model_fn, view = _sampler_model(setup, model_fn, sh.layout)
  cont = functools.partial(
    partial.continue_rows,
    model_fn=model_fn,
    init_cache=_init_cache(setup, mcfg),
    cfg=scfg,
  )
  cont = sampling.viewed(cont, view)
  empty = functools.partial(
    partial.empty_rollouts, group_size=G, max_new_tokens=scfg.max_new_tokens, pad_id=scfg.pad_id
  )
  return PartialRollouts(
    cont=sharding.Jitted(
      sh.layout,
      cont,
      in_shardings=(sh.params, sh.rollouts(N), sh.rows(N), rep, rep, rep),
      out_shardings=sh.rollouts(N),
    ),
    empty=sharding.Jitted(
      sh.layout, empty, in_shardings=(sh.rows(B),), out_shardings=sh.rollouts(N)
    ),
  )


def _episode_runners(setup: build.Setup, model_fn, layout: sharding.Layout):
  """Multi-turn episode runners (config.env): the training group, greedy evaluation and
  pass@k evaluation (`episodes.Runner`: its jitted pieces are traced and run in the
  layout's context, the prompts on its rows), in sampler.dtype when it is set. Each runs
  on the sampling layout of its prompts (`Layout.sampling`: under context parallelism
  its rows split over `sequence` too, as the samplers'). A Setup without a tokenizer
  (`build.plan_setup`) gets runners that compile but cannot run."""
  cfg, loop, tok = setup.episodes, setup.loop, setup.tokenizer
  if cfg is None:
    return None
  env_cls = envs.get(cfg.name)
  mcfg, model_fn, view = _sampler_model(setup, model_fn, layout)
  make = functools.partial(
    episodes.Runner,
    model_fn=model_fn,
    view=view,
    init_cache=_init_cache(setup, mcfg),
    cfg=cfg,
    tokenizer=tok,
    make_env=functools.partial(env_cls, tokenizer=tok, **cfg.kwargs),
    env_cls=env_cls,
  )

  def runner(group: int, prompts: int) -> episodes.Runner:
    scfg = dataclasses.replace(setup.sampler_cfg, group_size=group)
    return make(sampler_cfg=scfg, layout=layout.sampling(prompts))

  return EpisodeRunners(
    train=runner(setup.sampler_cfg.group_size, loop.prompts_per_step),
    greedy=runner(1, loop.eval_size),
    eval=runner(loop.eval_samples, loop.eval_size) if loop.eval_samples else None,
  )


def functions_on(setup: build.Setup, devices) -> Functions:
  """The jitted pieces of a run over other devices than this host's (a TPU topology's
  abstract devices: `aot` lowers and compiles them, nothing runs); not cached."""
  return _build(setup, devices)


def _build(setup: build.Setup, devices=None) -> Functions:
  loop, scfg = setup.loop, setup.sampler_cfg
  layout, sampler_layout = _layouts(setup, devices)
  model_fn = model.make_model_fn(setup.model_cfg)
  optimizer, sft_optimizer = optimizers(loop)
  sh = _shardings(setup, layout, optimizer, sft_optimizer)
  sampler = functools.partial(_sampler, setup, sh, model_fn)
  sampler_sh = sh
  if sampler_layout is not layout:
    sampler_sh = _shardings(setup, sampler_layout, optimizer, sft_optimizer)
  train_sampler = functools.partial(_sampler, setup, sampler_sh, model_fn)
  return Functions(
    layout=layout,
    param_shardings=sharding.param_shardings(layout, setup.model_cfg),  # What loads fill.
    teacher_shardings=setup.teacher_source
    and sharding.param_shardings(layout, setup.teacher_source.model_cfg),
    state_shardings=sh.state,
    model_fn=model_fn,
    optimizer=optimizer,
    samplers=Samplers(
      train=train_sampler(
        group=scfg.group_size, prompts=loop.prompts_per_step, slots=scfg.refill_slots, train=True
      ),
      greedy=sampler(group=1, prompts=loop.eval_size),
      eval=sampler(group=loop.eval_samples, prompts=loop.eval_size) if loop.eval_samples else None,
    ),
    rl=_rl_functions(setup, sh, model_fn, optimizer),
    warmstart=WarmStart(
      optimizer=sft_optimizer,
      state_shardings=sh.sft_state,
      step=sharding.Jitted(
        layout,
        functools.partial(
          warmstart.sft_step,
          model_fn=model_fn,
          optimizer=sft_optimizer,
          part=warmstart.part(setup.model_cfg),
          dropout_seed=loop.seed,
        ),
        in_shardings=(sh.sft_state, *(sh.rows(loop.warmstart_batch),) * 3),
        out_shardings=(sh.sft_state, sh.rep),
        donate_argnums=(0,),
      ),
    ),
    counterfactual=_counterfactual_functions(setup, sh, model_fn),
    partial=_offpolicy_functions(setup, sampler_sh, model_fn),
    episodes=_episode_runners(setup, model_fn, layout),
  )
