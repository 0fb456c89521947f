"""The training loop: supervised warm start, then RL iterations, evaluation, checkpoints.

    summary = train.run(config, workdir)     # config: a ConfigDict like configs/arithmetic.py

Each RL iteration: draw B prompts from the task's train stream -> sample G rollouts each
(jitted) -> dispatch the old/ref log-prob forwards (`rl.rollout_logprobs`) and, while the
device runs them, score rewards in a worker pool on the host (`rewards.RewardPool`:
timeouts and exceptions score 0 and count as `reward_errors`) -> with DAPO dynamic
sampling, repeat until B groups have varying rewards or `max_gen_batches` is reached
(`dynamic_sampling`; the forwards then run on the assembled batch) -> advantages and
token masks (`rl.finish_prepare`) -> plan mini-batches -> ppo_epochs × num_minibatches
`rl.train_step`s, during which the next prompts are drawn and encoded -> one line of
metrics (metrics.jsonl and TensorBoard under workdir/tb). Evaluation runs every
`eval_every` iterations on the held-out split: greedy accuracy, and unbiased pass@k /
mean@k from `eval_samples` samples. With `config.diagnostics.every = N`, token-credit
diagnostics (`diagnostics.hook`: flips, cancellation, coupling, drift) measure the update
of every N-th iteration and join its metrics line.

Checkpoints (`checkpoint.Checkpointer`, orbax, async) every `checkpoint_every` iterations,
at the end, and on SIGTERM hold the train state, reference params, RNG key, controller
state and hyperparameters, plus the data-stream position and loop counters. Rerunning
with the same workdir resumes from the latest one and reproduces the metrics an
uninterrupted run would have written (same machine and config).

A train step whose loss or gradient is not finite is skipped (`rl.train_step`); after
`max_nonfinite_steps` consecutive ones the run stops with `NonFiniteError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from grpo_jax import (
  checkpoint,
  config_lib,
  controllers,
  distributed,
  dynamic_sampling,
  evaluation,
  flops,
  hf,
  logs,
  memory,
  model,
  rewards,
  rl,
  sampling,
  sharding,
  tasks,
)
from grpo_jax.diagnostics import hook as diagnostics_hook


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig:
  """Loop sizes and the optimizer (validated once)."""

  seed: int = 0
  prompts_per_step: int = 16
  iterations: int = 50
  learning_rate: float = 1e-3
  warmup_steps: int = 0
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  warmstart_steps: int = 0
  warmstart_batch: int = 64
  warmstart_lr: float = 3e-3
  eval_every: int = 10
  eval_size: int = 128
  eval_samples: int = 0  # k samples per held-out problem for pass@k / mean@k (0: off).
  checkpoint_every: int = 50  # Iterations between checkpoints (also: end, SIGTERM).
  keep_checkpoints: int = 3  # The latest N are kept, plus the best by eval accuracy.
  max_nonfinite_steps: int = 5  # Consecutive skipped (non-finite) steps before stopping.
  reward_workers: int = 2  # Reward processes; 0 scores inline (no timeout).
  reward_timeout_s: float = 10.0  # Per call; a timeout scores 0 and counts as an error.
  peak_flops: float = 0.0  # Device peak FLOP/s for MFU; 0 measures a float32 matmul.
  # Per-device memory the plan must fit (`memory`), GiB; 0: the device's own limit where
  # jax reports one (GPU, TPU), no check where it does not (CPU).
  memory_limit_gib: float = 0.0
  # A Hugging Face checkpoint directory (config.json + safetensors): the policy's
  # architecture and initial weights come from it (`hf`); config.model then sets only
  # param_dtype, dtype, scan_layers and remat. "": random init from config.model.
  hf_dir: str = ""
  # Write the final policy as a Hugging Face checkpoint to workdir/hf (for transformers
  # or vLLM evaluation), with hf_dir's tokenizer files.
  export_hf: bool = False
  progress: bool = True  # Console progress line.
  tensorboard: bool = True  # Event files under workdir/tb.

  def __post_init__(self):
    object.__setattr__(self, "hf_dir", os.path.expanduser(self.hf_dir))
    for name in (
      "prompts_per_step",
      "iterations",
      "eval_every",
      "eval_size",
      "warmstart_batch",
      "checkpoint_every",
      "keep_checkpoints",
      "max_nonfinite_steps",
    ):
      if getattr(self, name) < 1:
        raise ValueError(f"config.{name} must be >= 1, got {getattr(self, name)}.")
    for name in ("learning_rate", "warmstart_lr", "reward_timeout_s"):
      if not getattr(self, name) > 0:
        raise ValueError(f"config.{name} must be > 0, got {getattr(self, name)}.")
    for name in (
      "warmup_steps",
      "weight_decay",
      "grad_clip",
      "warmstart_steps",
      "eval_samples",
      "reward_workers",
      "peak_flops",
      "memory_limit_gib",
    ):
      if getattr(self, name) < 0:
        raise ValueError(f"config.{name} must be >= 0, got {getattr(self, name)}.")


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from a config, once, at the edge (before anything compiles)."""

  loop: LoopConfig
  task: Any
  tokenizer: Any
  model_cfg: model.ModelConfig
  sampler_cfg: sampling.SamplerConfig
  sampling_hyper: sampling.SamplingParams
  rl_cfg: rl.RLConfig
  mesh_cfg: sharding.MeshConfig
  diagnostics: diagnostics_hook.DiagnosticsConfig = diagnostics_hook.DiagnosticsConfig()


_SECTIONS = ("task", "model", "sampler", "sampling", "rl", "mesh", "diagnostics")


def _validate_mesh(mesh_cfg: sharding.MeshConfig, loop, rl_cfg, group_size: int, n_devices):
  """Mesh sizes against the device count, and batch rows against data × fsdp."""
  data, fsdp, _ = mesh_cfg.shape(n_devices or jax.device_count())
  dp = data * fsdp
  n = loop.prompts_per_step * group_size
  rows = {
    "the rollout batch (prompts_per_step × group_size)": n,
    "a mini-batch (rollout batch / rl.num_minibatches)": n // rl_cfg.num_minibatches,
  }
  for what, r in rows.items():
    if r % dp:
      raise ValueError(
        f"config.mesh: {what} has {r} rows, not divisible by the data-parallel size "
        f"data × fsdp = {data} × {fsdp} = {dp}. Change prompts_per_step, group_size or "
        "rl.num_minibatches, or the mesh (e.g. put devices on `tensor`)."
      )


def build(config, *, n_devices: int | None = None) -> Setup:
  """Validates the ConfigDict and builds the typed pieces; errors name the bad key.
  `n_devices`: the device count the mesh is checked against (default: this job's)."""
  d = config_lib.to_dict(config)
  loop = config_lib.from_dict(
    LoopConfig, {k: v for k, v in d.items() if k not in _SECTIONS}, where="config"
  )
  task_kwargs = dict(d["task"].get("kwargs", {}))
  if loop.hf_dir and getattr(tasks.REGISTRY.get(d["task"]["name"]), "uses_hf_tokenizer", False):
    task_kwargs.setdefault("tokenizer_dir", loop.hf_dir)
  task = tasks.get(d["task"]["name"], **task_kwargs)
  tok = task.tokenizer()
  if loop.hf_dir:
    model_cfg = _hf_model_config(loop.hf_dir, d["model"], tok)
  else:
    vocab = d["model"].get("vocab_size", 0) or tok.vocab_size
    if vocab < tok.vocab_size:
      raise ValueError(
        f"config.model.vocab_size={vocab} is smaller than the tokenizer's {tok.vocab_size}; "
        "use 0 (the tokenizer's) or a larger size (e.g. a pretrained model's padded vocab)."
      )
    model_cfg = model.ModelConfig.from_dict({**d["model"], "vocab_size": vocab})
  sampler_cfg = config_lib.from_dict(
    sampling.SamplerConfig,
    {**d["sampler"], "eos_ids": tok.eos_ids, "pad_id": tok.pad_id},
    where="config.sampler",
  )
  rl_cfg = rl.RLConfig.from_dict(d["rl"], where="config.rl")
  mesh_cfg = sharding.MeshConfig.from_dict(d.get("mesh", {}))
  n = loop.prompts_per_step * sampler_cfg.group_size
  rl.validate_batch(
    rl_cfg,
    rewards_N=np.zeros(n, np.float32),
    group_ids_N=np.repeat(np.arange(loop.prompts_per_step), sampler_cfg.group_size),
    group_size=sampler_cfg.group_size,
  )
  _validate_mesh(mesh_cfg, loop, rl_cfg, sampler_cfg.group_size, n_devices)
  diagnostics = diagnostics_hook.DiagnosticsConfig.from_dict(
    d.get("diagnostics", {}), prompts_per_step=loop.prompts_per_step, model_cfg=model_cfg
  )
  return Setup(
    loop=loop,
    task=task,
    tokenizer=tok,
    model_cfg=model_cfg,
    sampler_cfg=sampler_cfg,
    sampling_hyper=sampling.sampling_params(**d["sampling"]),
    rl_cfg=rl_cfg,
    mesh_cfg=mesh_cfg,
    diagnostics=diagnostics,
  )


# What config.model may set when the architecture comes from a HF checkpoint.
HF_RUNTIME_KEYS = ("param_dtype", "dtype", "scan_layers", "remat")


def _hf_model_config(hf_dir: str, model_d: dict, tok) -> model.ModelConfig:
  """The checkpoint's architecture with config.model's runtime keys. An architecture key
  of config.model that differs from both its default and the checkpoint is an error
  (it would be silently ignored otherwise). A vocabulary padded past the tokenizer's
  size gets `vocab_limit` = the tokenizer's size."""
  base = hf.model_config(hf.read_config(hf_dir), where=f"{hf_dir}/config.json")
  default = config_lib.to_dict(default_config().model)
  for key, value in model_d.items():
    if key in HF_RUNTIME_KEYS or value == default.get(key) or value == getattr(base, key):
      continue
    raise ValueError(
      f"config.model.{key}={value!r} conflicts with {hf_dir}/config.json "
      f"({getattr(base, key)!r}): with config.hf_dir the architecture comes from the "
      f"checkpoint; config.model sets only {list(HF_RUNTIME_KEYS)}."
    )
  if tok.vocab_size > base.vocab_size:
    raise ValueError(
      f"The tokenizer has {tok.vocab_size} tokens but {hf_dir}/config.json has vocab_size "
      f"{base.vocab_size}: they do not belong together."
    )
  runtime = {k: model_d[k] for k in HF_RUNTIME_KEYS if k in model_d}
  limit = tok.vocab_size if tok.vocab_size < base.vocab_size else 0
  return dataclasses.replace(base, vocab_limit=limit, **runtime)


def _config_value(v):
  if isinstance(v, dict):
    return ml_collections.ConfigDict({k: _config_value(x) for k, x in v.items()})
  return v


def default_config() -> ml_collections.ConfigDict:
  """Every key a trainer config may set, with its default; configs/*.py start from it.

  Top level: the LoopConfig fields. Sections: task (name, kwargs), model (ModelConfig
  with vocab_size 0: the task's tokenizer's size; the defaults are
  `model.tiny_config`'s), sampler (SamplerConfig without eos_ids/pad_id), sampling
  (temperature, top_k, top_p, greedy), rl (every RLConfig field) and mesh (data, fsdp,
  tensor sizes and the logical->mesh rules table, `sharding.MeshConfig`) and diagnostics
  (`diagnostics.hook.DiagnosticsConfig`; every = 0: off). Because every key
  exists, command-line overrides such as `--config.rl.num_minibatches=4` work on the
  locked config, and a misspelt key fails.
  """
  c = ml_collections.ConfigDict(dataclasses.asdict(LoopConfig()))
  c.task = ml_collections.ConfigDict(dict(name="arithmetic", kwargs=ml_collections.ConfigDict()))
  tiny = dataclasses.asdict(model.tiny_config(vocab_size=2))
  tiny["vocab_size"] = 0
  c.model = ml_collections.ConfigDict(tiny)
  sampler = {
    f.name: f.default
    for f in dataclasses.fields(sampling.SamplerConfig)
    if f.name not in ("eos_ids", "pad_id")
  }
  sampler["max_new_tokens"] = 16
  c.sampler = ml_collections.ConfigDict(sampler)
  c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, greedy=False))
  c.rl = _config_value(dataclasses.asdict(rl.RLConfig()))
  mesh = sharding.MeshConfig()
  c.mesh = ml_collections.ConfigDict(
    dict(data=mesh.data, fsdp=mesh.fsdp, tensor=mesh.tensor, rules=_config_value(dict(mesh.rules)))
  )
  c.diagnostics = _config_value(dataclasses.asdict(diagnostics_hook.DiagnosticsConfig()))
  return c


def _optimizer(loop: LoopConfig, *, lr: float):
  """Global-norm clipping, then AdamW with an optional linear warmup."""
  schedule = optax.linear_schedule(0.0, lr, loop.warmup_steps) if loop.warmup_steps else lr
  return optax.chain(
    optax.clip_by_global_norm(loop.grad_clip) if loop.grad_clip > 0 else optax.identity(),
    optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=loop.weight_decay),
  )


# ----------------------------------------------------------------------------
# Supervised warm start.
# ----------------------------------------------------------------------------


def _sft_batch(setup: Setup, fns: Functions, examples):
  """Prompts (left-padded bucket) and reference completions + EOS (right-padded to T),
  as global arrays; this process encodes only its rows of `examples`."""
  tok, T, n = setup.tokenizer, setup.sampler_cfg.max_new_tokens, len(examples)
  rows = distributed.local_rows(fns.layout.rows(n), n)
  prompts = _host_prompts(setup, fns, dict(enumerate(examples)), n)
  targets = [tok.encode(e.reference, add_eos=True)[:T] for e in examples[rows]]
  tokens_NT = np.full((len(targets), T), tok.pad_id, np.int32)
  for i, t in enumerate(targets):
    tokens_NT[i, : len(t)] = t
  mask_NT = np.arange(T)[None, :] < np.array([len(t) for t in targets])[:, None]
  return (prompts, *distributed.to_global((tokens_NT, mask_NT), fns.layout.rows(n), n))


def make_sft_step(model_fn, optimizer):
  """One cross-entropy step on reference completions (mean over target tokens); pure, the
  trainer jits it with its shardings."""

  def loss_fn(params, prompts, tokens_NT, mask_NT):
    logp_NT, _ = sampling.completion_logprobs(
      params, prompts.tokens_BP, prompts.mask_BP, tokens_NT, mask_NT, model_fn=model_fn
    )
    return -jnp.sum(logp_NT) / jnp.maximum(jnp.sum(mask_NT), 1)

  def step(state: rl.TrainState, prompts, tokens_NT, mask_NT):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, prompts, tokens_NT, mask_NT)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return rl.TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss

  return step


# ----------------------------------------------------------------------------
# Compiled functions, cached per config (a notebook rerun does not recompile).
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Functions:
  layout: sharding.Layout  # The mesh and its rules.
  param_shardings: Any
  state_shardings: Any  # rl.TrainState with the RL optimizer.
  model_fn: Any
  optimizer: Any
  sft_optimizer: Any
  sample: Any  # G rows per prompt, training sampler.
  sample_greedy: Any  # One row per prompt, for greedy evaluation.
  sample_eval: Any  # eval_samples rows per prompt, for pass@k (None when off).
  sft_step: Any
  logprobs: Any  # rl.rollout_logprobs, jitted: dispatched before rewards are scored.
  finish: Any  # rl.finish_prepare, jitted: advantages and masks once rewards are in.
  train_step: Any
  plan: Any


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
)


def functions(setup: Setup) -> Functions:
  """The jitted pieces of a run; built once per (model, sampler, RL, optimizer, mesh)."""
  loop = setup.loop
  key = repr(
    (
      setup.model_cfg,
      setup.sampler_cfg,
      setup.rl_cfg,
      setup.mesh_cfg,
      jax.devices(),
      [getattr(loop, f) for f in _CACHE_FIELDS],
    )
  )
  if key not in _FUNCTIONS:
    check_memory(setup)  # Before anything compiles.
    if len(_FUNCTIONS) >= 4:
      _FUNCTIONS.pop(next(iter(_FUNCTIONS)))
    _FUNCTIONS[key] = _build_functions(setup)
  return _FUNCTIONS[key]


_FUNCTIONS: dict[str, Functions] = {}  # Config repr -> compiled functions (oldest first out).


def memory_limit(loop: LoopConfig) -> float | None:
  """Bytes per device the plan must fit: loop.memory_limit_gib, else the device's own
  limit (jax's memory_stats: GPU, TPU), else None (CPU: no check)."""
  if loop.memory_limit_gib:
    return loop.memory_limit_gib * memory.GIB
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit")


def check_memory(setup: Setup) -> None:
  """Refuses, before compiling, a config whose memory plan exceeds the device memory
  (`memory.OutOfMemoryPlan`, with the plan and what to change)."""
  limit = memory_limit(setup.loop)
  if limit:
    plan = memory.plan_for(setup)
    memory.check(plan, limit, setup.model_cfg, setup.rl_cfg)


def _build_functions(setup: Setup) -> Functions:
  """Every jitted function of a run, with explicit in/out shardings on the layout's mesh:
  params and optimizer state by the rules table, batches (prompts, rollouts,
  mini-batches) split over data × fsdp, hyperparameters and metrics replicated."""
  loop, scfg, rl_cfg, mcfg = setup.loop, setup.sampler_cfg, setup.rl_cfg, setup.model_cfg
  layout = sharding.Layout.create(setup.mesh_cfg)
  model_fn = model.make_model_fn(mcfg)
  optimizer = _optimizer(loop, lr=loop.learning_rate)
  sft_optimizer = _optimizer(loop, lr=loop.warmstart_lr)
  params_sh = sharding.param_shardings(layout, mcfg)
  state_sh, sft_state_sh = (
    sharding.tree_shardings(
      layout, lambda k, o=o: rl.init_state(model.init_boxed(mcfg, k), o), jax.random.key(0)
    )
    for o in (optimizer, sft_optimizer)
  )
  rep = layout.replicated
  rows = layout.rows
  ref_sh = params_sh if rl_cfg.use_ref else rep
  n_train = loop.prompts_per_step * scfg.group_size

  def sampler(g: int, prompts: int):
    fn = functools.partial(
      sampling.sample,
      model_fn=model_fn,
      init_cache=functools.partial(model.init_cache, mcfg),
      cfg=dataclasses.replace(scfg, group_size=g),
    )
    return sharding.Jitted(
      layout,
      fn,
      in_shardings=(params_sh, rows(prompts), rep, rep),
      out_shardings=rollout_sh(prompts * g),
    )

  def rollout_sh(n: int):  # Rows split, the step count replicated.
    return sampling.Rollouts(**{f: rows(n) for f in _ROLLOUT_FIELDS}, num_steps=rep)

  batch = rows(n_train)
  return Functions(
    layout=layout,
    param_shardings=params_sh,
    state_shardings=state_sh,
    model_fn=model_fn,
    optimizer=optimizer,
    sft_optimizer=sft_optimizer,
    sample=sampler(scfg.group_size, loop.prompts_per_step),
    sample_greedy=sampler(1, loop.eval_size),
    sample_eval=sampler(loop.eval_samples, loop.eval_size) if loop.eval_samples else None,
    sft_step=sharding.Jitted(
      layout,
      make_sft_step(model_fn, sft_optimizer),
      in_shardings=(sft_state_sh, *(rows(loop.warmstart_batch),) * 3),
      out_shardings=(sft_state_sh, rep),
      donate_argnums=(0,),
    ),
    logprobs=sharding.Jitted(
      layout,
      functools.partial(rl.rollout_logprobs, cfg=rl_cfg, model_fn=model_fn),
      in_shardings=(params_sh, ref_sh, rollout_sh(n_train)),
      out_shardings=batch,
    ),
    finish=sharding.Jitted(
      layout,
      functools.partial(rl.finish_prepare, cfg=rl_cfg),
      in_shardings=(batch, rollout_sh(n_train), batch, batch, rep),
      out_shardings=(batch, batch, rep),
    ),
    train_step=sharding.Jitted(
      layout,
      functools.partial(rl.train_step, cfg=rl_cfg, model_fn=model_fn, optimizer=optimizer),
      in_shardings=(state_sh, rows(n_train // rl_cfg.num_minibatches), rep),
      out_shardings=(state_sh, rep),
      donate_argnums=(0,),
    ),
    plan=rl.make_plan_fn(rl_cfg, batch_size=n_train, group_size=scfg.group_size),
  )


_ROLLOUT_FIELDS = [f.name for f in dataclasses.fields(sampling.Rollouts) if f.name != "num_steps"]


# ----------------------------------------------------------------------------
# Evaluation.
# ----------------------------------------------------------------------------


def _pass_ks(n: int) -> list[int]:
  """1, 2, 4, ... up to n, and n itself."""
  ks = [1 << i for i in range(n.bit_length()) if (1 << i) <= n]
  return ks + ([n] if ks[-1] != n else [])


def evaluate(setup: Setup, fns: Functions, pool, params, *, key) -> dict:
  """Held-out metrics on the first eval_size test problems, scored through `pool`.

  Greedy decoding gives eval/greedy_accuracy and eval/format_rate. With eval_samples = n
  > 0, n samples per problem (the training sampling params) give the unbiased pass@k for
  k = 1, 2, 4, ..., n (`evaluation.pass_at_k`) and mean@n (`evaluation.mean_at_k`).
  """
  task, loop = setup.task, setup.loop
  n, size = loop.eval_samples, loop.eval_size
  rows = set(_needed_rows(fns, size, 1)) | (set(_needed_rows(fns, size, n)) if n else set())
  examples = {i: task.example("test", i, seed=loop.seed) for i in sorted(rows)}
  prompts = _host_prompts(setup, fns, examples, size)
  greedy = fns.sample_greedy(params, prompts, key, sampling.sampling_params(greedy=True))
  if n:  # Dispatched now: the device samples while the host scores the greedy answers.
    rollouts = fns.sample_eval(params, prompts, key, setup.sampling_hyper)
  correct_N, format_N, errors, _ = _score(setup, fns, pool, examples, greedy.tokens_NT, group=1)
  out = {
    "eval/greedy_accuracy": float(correct_N.mean()),
    "eval/format_rate": float(format_N.mean()),
  }
  if n:
    correct_N, _, more_errors, _ = _score(setup, fns, pool, examples, rollouts.tokens_NT, group=n)
    correct_PK = correct_N.reshape(size, n)
    c_P = (correct_PK > 0).sum(axis=1)
    for k in _pass_ks(n):
      out[f"eval/pass@{k}"] = float(np.mean(evaluation.pass_at_k(n, c_P, k)))
    out[f"eval/mean@{n}"] = float(evaluation.mean_at_k(correct_PK))
    errors += more_errors
  out["eval/reward_errors"] = errors
  return out


# ----------------------------------------------------------------------------
# Run state: what a checkpoint holds.
# ----------------------------------------------------------------------------


class NonFiniteError(RuntimeError):
  """Too many consecutive train steps with a non-finite loss or gradient."""


def _initial_tree(setup: Setup, fns: Functions, params) -> dict:
  """The checkpointed pytree: train state, reference params, hyperparameters that
  controllers move, controller state and the RNG key."""
  rl_cfg = setup.rl_cfg
  return {
    "train": rl.init_state(params, fns.optimizer),
    # A copy: the train step donates the policy's buffers, the reference must outlive them.
    "ref_params": jax.tree.map(jnp.copy, params) if rl_cfg.use_ref else None,
    "prep_hyper": rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens),
    "controller": controllers.init_state(),
    "key": jax.random.key_data(jax.random.key(setup.loop.seed)),
  }


def _abstract_tree(setup: Setup, fns: Functions):
  """Shapes, dtypes and shardings of the checkpointed pytree, without computing it: the
  train state and reference params on their shardings, the rest replicated."""
  tree = jax.eval_shape(
    lambda k: _initial_tree(setup, fns, model.init(setup.model_cfg, k)), jax.random.key(0)
  )
  shardings = {
    **jax.tree.map(lambda _: fns.layout.replicated, tree),
    "train": fns.state_shardings,
    "ref_params": fns.param_shardings if setup.rl_cfg.use_ref else None,
  }
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def _initial_params(setup: Setup, fns: Functions, key):
  """The checkpoint's weights streamed onto their shardings (config.hf_dir), else a
  random init created in its shards."""
  if setup.loop.hf_dir:
    return hf.load_params(setup.loop.hf_dir, setup.model_cfg, shardings=fns.param_shardings)
  return sharding.init_params(fns.layout, setup.model_cfg, key)


def export_hf(setup: Setup, params, out_dir) -> pathlib.Path:
  """The policy as a Hugging Face checkpoint (config.json, safetensors, and hf_dir's
  tokenizer files when the run started from one). Every process calls it."""
  base = hf.read_config(setup.loop.hf_dir) if setup.loop.hf_dir else None
  arch = hf.arch_of(base) if base else hf.arch_for(setup.model_cfg)
  return hf.export(
    params,
    setup.model_cfg,
    out_dir,
    arch=arch,
    dtype=setup.model_cfg.param_dtype,
    base_config=base,
    tokenizer_dir=setup.loop.hf_dir or None,
  )


class Preempted(RuntimeError):
  """SIGTERM arrived before the first checkpoint (during the warm start)."""


def _warm_start(setup: Setup, fns: Functions, params, *, log, preempted):
  loop = setup.loop
  state = rl.init_state(params, fns.sft_optimizer)
  stream = setup.task.examples("train", seed=loop.seed + 1)
  loss = float("nan")
  for _ in range(loop.warmstart_steps):
    if preempted["set"]:
      raise Preempted(
        "SIGTERM during the warm start, before the first checkpoint; rerunning the same "
        "command starts the run again (the warm start is deterministic)."
      )
    batch = _sft_batch(setup, fns, [next(stream) for _ in range(loop.warmstart_batch)])
    state, loss = fns.sft_step(state, *batch)
  log(f"warm start: {loop.warmstart_steps} steps, final loss {float(loss):.3f}")
  return state.params


@contextlib.contextmanager
def _sigterm_flag():
  """Yields a dict whose "set" becomes True on SIGTERM (TPU VM preemption notice)."""
  flag = {"set": False}
  if threading.current_thread() is not threading.main_thread():
    yield flag  # Signal handlers can only be installed from the main thread.
    return

  def handler(signum, frame):
    del signum, frame
    flag["set"] = True

  previous = signal.signal(signal.SIGTERM, handler)
  try:
    yield flag
  finally:
    signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------
# One RL iteration's data: sample, score, (dynamic) select.
# ----------------------------------------------------------------------------


def _host_prompts(setup: Setup, fns: Functions, examples: dict, n: int) -> sampling.Prompts:
  """The n-row prompt batch as global arrays on the layout's row sharding; this process
  encodes only its own rows (`examples` maps row -> example), padded to the bucket of the
  longest prompt of every process."""
  tok, rows = setup.tokenizer, distributed.local_rows(fns.layout.rows(n), n)
  lists = [tok.encode(examples[i].prompt, add_bos=True) for i in range(rows.start, rows.stop)]
  longest = distributed.max_across(max(len(t) for t in lists))
  prompts = sampling.prepare_prompts(lists, cfg=setup.sampler_cfg, min_len=longest)
  return distributed.to_global(prompts, fns.layout.rows(n), n)


def _needed_rows(fns: Functions, n_prompts: int, group: int) -> range:
  """Prompt rows this process needs: those its devices hold, and the prompts of the
  n_prompts × group completion rows it decodes and scores."""
  p = distributed.local_rows(fns.layout.rows(n_prompts), n_prompts)
  c = distributed.local_rows(fns.layout.rows(n_prompts * group), n_prompts * group)
  return range(min(p.start, c.start // group), max(p.stop, -(-c.stop // group)))


def _draw(setup: Setup, fns: Functions, index: int):
  """Train examples index .. index + B - 1 (this process's rows of them, as {row: example})
  and the global left-padded prompt batch. The stream is the same whatever the number of
  processes: each reads its slice of it."""
  loop = setup.loop
  rows = _needed_rows(fns, loop.prompts_per_step, setup.sampler_cfg.group_size)
  examples = {i: setup.task.example("train", index + i, seed=loop.seed) for i in rows}
  return examples, _host_prompts(setup, fns, examples, loop.prompts_per_step)


def _score(setup: Setup, fns: Functions, pool, examples: dict, tokens_NT, *, group: int):
  """Decodes and scores this process's rows of the completions tokens_NT (n = prompts ×
  group rows, global), then all-gathers the scores: returns (correct_N, format_N,
  errors, timeouts), the same on every process."""
  tok, n = setup.tokenizer, tokens_NT.shape[0]
  rows = distributed.local_rows(tokens_NT.sharding, n)
  completions = [tok.decode(r) for r in distributed.fetch_local(tokens_NT)]
  scores = pool.score(
    [setup.task.reward_input(examples[i // group]) for i in range(rows.start, rows.stop)],
    completions,
  )
  gather = lambda x: distributed.gather_rows(x, tokens_NT.sharding, n)
  errors, timeouts = distributed.sum_across(np.array([scores.errors, scores.timeouts]))
  return gather(scores.correct_N), gather(scores.format_N), int(errors), int(timeouts)


def _collect(
  setup: Setup,
  fns: Functions,
  pool,
  params,
  ref_params,
  *,
  index: int,
  key,
  times: dict,
  prefetched=None,
):
  """Samples and scores generation batches; returns (rollouts, log-probs, correct_N,
  format_N, valid_N, new data index, metrics). Shapes are always B·G rows. `prefetched`
  is (index, examples, prompts) drawn while the previous update ran on the device.

  Host/device overlap: without dynamic sampling the old/ref log-prob forwards
  (`rl.rollout_logprobs`) are dispatched as soon as the rollouts exist, and run on the
  device while the host decodes and scores rewards. With dynamic sampling they run once
  the kept groups are assembled, so no forward is spent on dropped groups.
  """
  loop, scfg, rl_cfg = setup.loop, setup.sampler_cfg, setup.rl_cfg
  B, G = loop.prompts_per_step, scfg.group_size
  parts, corrects, formats, varying, n_varying, errors, timeouts = [], [], [], [], 0, 0, 0
  max_batches = rl_cfg.max_gen_batches if rl_cfg.dynamic_sampling else 1
  for g in range(max_batches):
    if prefetched is not None and prefetched[0] == index:
      _, examples, prompts = prefetched
    else:
      examples, prompts = _draw(setup, fns, index)
    index += B
    t0 = time.perf_counter()
    rollouts = jax.block_until_ready(
      fns.sample(params, prompts, jax.random.fold_in(key, g), setup.sampling_hyper)
    )
    t1 = time.perf_counter()
    if not rl_cfg.dynamic_sampling:
      logprobs = fns.logprobs(params, ref_params, rollouts)  # Async: overlaps the scoring.
    correct_N, format_N, n_errors, n_timeouts = _score(
      setup, fns, pool, examples, rollouts.tokens_NT, group=G
    )
    times["sample"] += t1 - t0
    times["reward"] += time.perf_counter() - t1
    parts.append(rollouts)
    corrects.append(correct_N)
    formats.append(format_N)
    errors += n_errors
    timeouts += n_timeouts
    varying.append(dynamic_sampling.varying_groups(correct_N, group_size=G))
    n_varying += int(varying[-1].sum())
    if n_varying >= B:
      break
  all_correct = np.concatenate(corrects)
  metrics = {
    "accuracy": float(all_correct.mean()),
    "reward_errors": errors,
    "reward_timeouts": timeouts,
  }
  if not rl_cfg.dynamic_sampling:
    ones = np.ones(B * G, bool)
    return parts[0], logprobs, corrects[0], formats[0], ones, index, metrics
  sel = dynamic_sampling.select(varying, num_groups=B)
  rollouts = dynamic_sampling.assemble(parts, sel, group_size=G, pad_id=scfg.pad_id)
  pick = functools.partial(dynamic_sampling.select_rows, sel=sel, group_size=G)
  metrics.update(
    {
      "dynamic/gen_batches": len(parts),
      "dynamic/dropped_groups": sel.dropped,
      "dynamic/fill_groups": sel.fill,
      "dynamic/surplus_groups": sel.surplus,
    }
  )
  valid_N = np.repeat(sel.valid_B, G)
  logprobs = fns.logprobs(params, ref_params, rollouts)
  return rollouts, logprobs, pick(corrects), pick(formats), valid_N, index, metrics


def _iteration_flops(setup: Setup, rollouts, *, gen_batches: int) -> float:
  """Model FLOPs of one iteration (`flops`): sampling, prepare's forwards, the updates."""
  cfg, scfg, rl_cfg = setup.model_cfg, setup.sampler_cfg, setup.rl_cfg
  N, P = rollouts.prompt_tokens_NP.shape
  T = scfg.max_new_tokens
  sample = gen_batches * flops.sampling_flops(
    cfg,
    prompts=setup.loop.prompts_per_step,
    group_size=scfg.group_size,
    prompt_len=P,
    new_tokens=float(rollouts.num_steps),
  )
  seq = N * flops.sequence_forward_flops(cfg, length=P + T)
  forwards = (1 if rl_cfg.recompute_old_logp else 0) + (1 if rl_cfg.use_ref else 0)
  return sample + forwards * seq + 3 * rl_cfg.ppo_epochs * seq


# ----------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------


def _count_nonfinite(flags, run: int, *, limit: int, iteration: int) -> tuple[int, int]:
  """(skipped steps in this iteration, consecutive run after it); raises at `limit`."""
  for f in flags:
    run = run + 1 if f else 0
    if run >= limit:
      raise NonFiniteError(
        f"{run} consecutive train steps had a non-finite loss or gradient (iteration "
        f"{iteration}); they were skipped, and the state is that of the last finite step. "
        "Lower learning_rate, check rewards and advantages for NaN/inf, or raise "
        "config.max_nonfinite_steps."
      )
  return int(sum(bool(f) for f in flags)), run


def run(config, workdir: str | pathlib.Path, *, log=print, on_iteration=None) -> dict:
  """Warm start (or resume), then RL; writes metrics.jsonl, tb/, checkpoints/ and
  summary.json in workdir. `on_iteration(iteration, record)` is called after each
  iteration's record is written (tests use it to interrupt a run)."""
  t_start = time.perf_counter()
  if not distributed.is_primary():  # One process speaks and writes logs for the job.
    log = lambda *_: None  # noqa: E731
  if "://" in str(workdir):  # pathlib would turn gs://b/x into a local gs:/b/x.
    raise ValueError(
      f"workdir {str(workdir)!r}: URL workdirs are not written natively (the logs use "
      "Python's open); mount the bucket (e.g. gcsfuse, README 'TPU VM slices') and pass the "
      "mounted path."
    )
  setup = build(config)
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  fns = functions(setup)
  ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=setup.loop.keep_checkpoints)
  pool = rewards.RewardPool(
    setup.task, workers=setup.loop.reward_workers, timeout_s=setup.loop.reward_timeout_s
  )
  with contextlib.ExitStack() as stack:  # Closed in reverse order, on errors too.
    stack.callback(ckpt.close)
    stack.callback(pool.close)
    preempted = stack.enter_context(_sigterm_flag())
    return _run(setup, fns, ckpt, pool, workdir, preempted, t_start, log, on_iteration, stack)


def _logger(workdir, loop: LoopConfig, *, resume_from=None):
  """metrics.jsonl + TensorBoard on the primary process; a no-op writer elsewhere."""
  if not distributed.is_primary():
    return logs.NullLogger()
  return logs.RunLogger(workdir, resume_from=resume_from, tensorboard_dir=loop.tensorboard)


def _run(setup, fns, ckpt, pool, workdir, preempted, t_start, log, on_iteration, stack) -> dict:
  loop, rl_cfg = setup.loop, setup.rl_cfg
  latest = ckpt.latest_step()
  if latest is None:
    key = jax.random.key(loop.seed)
    params = _initial_params(setup, fns, jax.random.fold_in(key, 0))
    if loop.warmstart_steps:
      params = _warm_start(setup, fns, params, log=log, preempted=preempted)
    tree = _initial_tree(setup, fns, params)
    tree = jax.device_put(tree, jax.tree.map(lambda x: x.sharding, _abstract_tree(setup, fns)))
    eval_key = jax.random.fold_in(key, 2**31 - 1)  # No iteration's key.
    warm = evaluate(setup, fns, pool, params, key=eval_key)
    meta = {
      "iteration": 0,
      "data_index": 0,
      "warmstart": warm,
      "last_eval": warm,
      "best_accuracy": warm["eval/greedy_accuracy"],
      "best_iteration": 0,
      "nonfinite_total": 0,
      "nonfinite_run": 0,
      "wall_seconds": 0.0,
    }
    writer = stack.enter_context(contextlib.closing(_logger(workdir, loop)))
    writer.write({"iteration": 0, "phase": "warmstart", **warm})
    ckpt.save(0, tree, meta, accuracy=warm["eval/greedy_accuracy"])
  else:
    tree, meta = ckpt.restore(latest, like=_abstract_tree(setup, fns))
    writer = stack.enter_context(contextlib.closing(_logger(workdir, loop, resume_from=latest)))
    log(f"resumed from {ckpt.directory / str(latest)} (iteration {meta['iteration']})")
  log(f"warm-start accuracy {meta['warmstart']['eval/greedy_accuracy']:.3f}")
  if distributed.is_primary():
    (workdir / "config.json").write_text(json.dumps(setup_dict(setup), indent=2, default=str))

  key = jax.random.wrap_key_data(tree["key"])
  state, ref_params = tree["train"], tree["ref_params"]
  prep_hyper, ctrl_state = tree["prep_hyper"], tree["controller"]
  # Token-credit diagnostics every config.diagnostics.every iterations (None: off).
  diag = diagnostics_hook.Hook.create(setup, workdir, tree=tree, resumed_from=latest, log=log)
  controller = controllers.get(rl_cfg.controller, **config_lib.to_dict(rl_cfg.controller_options))
  step_hyper = rl_cfg.step_hyper()
  peak = loop.peak_flops or flops.matmul_peak()
  progress = logs.Progress(
    total=loop.iterations,
    start=meta["iteration"],
    accuracy=meta["last_eval"]["eval/greedy_accuracy"],
    enabled=loop.progress and distributed.is_primary(),
    log=log,
  )

  wall_before = meta["wall_seconds"]  # Earlier sessions of this run.

  def save(it: int, accuracy=None):
    meta["wall_seconds"] = wall_before + time.perf_counter() - t_start
    tree = {
      "train": state,
      "ref_params": ref_params,
      "prep_hyper": prep_hyper,
      "controller": ctrl_state,
      "key": jax.random.key_data(key),
    }
    ckpt.save(it, tree, dict(meta, iteration=it), accuracy=accuracy)

  first = meta["iteration"] + 1
  prefetched = None
  for it in range(first, loop.iterations + 1):
    times = {"sample": 0.0, "reward": 0.0}
    t0 = time.perf_counter()
    it_key = jax.random.fold_in(key, it)
    data_start = meta["data_index"]
    rollouts, logprobs, correct, fmt, valid_N, meta["data_index"], data_metrics = _collect(
      setup,
      fns,
      pool,
      state.params,
      ref_params,
      index=meta["data_index"],
      key=jax.random.fold_in(it_key, 0),
      times=times,
      prefetched=prefetched,
    )
    t1 = time.perf_counter()
    rl.validate_batch(
      rl_cfg,
      rewards_N=correct + fmt,
      group_ids_N=distributed.host_value(rollouts.group_ids_N),
      group_size=setup.sampler_cfg.group_size,
    )
    batch, _, stats = fns.finish(logprobs, rollouts, correct, fmt, prep_hyper)
    if not valid_N.all():  # Dynamic-sampling fill groups: kept for shape, never trained on.
      batch = batch.replace(loss_mask_NT=batch.loss_mask_NT & jnp.asarray(valid_N)[:, None])
    snapshot = diag and diag.before_update(
      it, state.params, batch, data_range=range(data_start, meta["data_index"])
    )
    state, _, history = rl.update(
      state,
      batch,
      jax.random.fold_in(it_key, 1),
      step_hyper,
      plan_fn=fns.plan,
      step_fn=fns.train_step,
    )
    # The controller moves the advantage hyperparameters (arrays: no recompile).
    adv_hyper, ctrl_state = controller(prep_hyper.adv, ctrl_state, stats)
    prep_hyper = prep_hyper.replace(adv=adv_hyper)
    # Host/device overlap: the next prompts are drawn and encoded while the update runs.
    prefetched = (meta["data_index"], *_draw(setup, fns, meta["data_index"]))
    history = jax.device_get(history)  # Blocks until the update is done.
    t2 = time.perf_counter()
    skipped, meta["nonfinite_run"] = _count_nonfinite(
      [h["nonfinite"] > 0 for h in history],
      meta["nonfinite_run"],
      limit=loop.max_nonfinite_steps,
      iteration=it,
    )
    meta["nonfinite_total"] += skipped
    seconds = t2 - t0
    record = {
      "iteration": it,
      "phase": "rl",
      **data_metrics,
      **{k: float(v) for k, v in stats.items()},
      **{k: float(v) for k, v in history[-1].items()},
      "nonfinite_steps": skipped,
      "nonfinite_total": meta["nonfinite_total"],
      "time/sample": times["sample"],
      "time/reward": times["reward"],
      "time/update": t2 - t1,
      "time/iteration": seconds,
      "tokens_per_s": float(jnp.sum(rollouts.mask_NT)) / max(times["sample"], 1e-9),
      "perf/mfu": _iteration_flops(
        setup, rollouts, gen_batches=data_metrics.get("dynamic/gen_batches", 1)
      )
      / seconds
      / peak,
    }
    if diag:
      record.update(diag.after_update(snapshot, state.params, record))
    accuracy = None
    if it % loop.eval_every == 0 or it == loop.iterations:
      t3 = time.perf_counter()
      meta["last_eval"] = evaluate(
        setup, fns, pool, state.params, key=jax.random.fold_in(it_key, 2)
      )
      record.update(meta["last_eval"], **{"time/eval": time.perf_counter() - t3})
      accuracy = meta["last_eval"]["eval/greedy_accuracy"]
      if accuracy > meta["best_accuracy"]:
        meta["best_accuracy"], meta["best_iteration"] = accuracy, it
    writer.write(record)
    progress.update(it, record)
    if on_iteration is not None:
      on_iteration(it, record)
    if preempted["set"] or it % loop.checkpoint_every == 0 or it == loop.iterations:
      save(it, accuracy)
    if preempted["set"]:
      ckpt.wait()
      log(f"SIGTERM: checkpoint saved at iteration {it}; rerun the same command to resume.")
      break
  progress.close()
  writer.close()
  ckpt.wait()
  plot = workdir / "curves.svg"
  if distributed.is_primary():
    records = logs.read_jsonl(workdir / "metrics.jsonl")
    plot = logs.plot_svg(records, plot, title=f"{setup.task.name}: {rl_cfg.advantage}")
  last = meta["last_eval"]
  summary = {
    "warmstart_accuracy": meta["warmstart"]["eval/greedy_accuracy"],
    "final_accuracy": last["eval/greedy_accuracy"],
    "best_accuracy": meta["best_accuracy"],
    "best_iteration": meta["best_iteration"],
    "iterations_done": ckpt.latest_step() or 0,
    "preempted": preempted["set"],
    "wall_seconds": wall_before + time.perf_counter() - t_start,
    "session_seconds": time.perf_counter() - t_start,
    "workdir": str(workdir),
    "metrics": str(workdir / "metrics.jsonl"),
    "tensorboard": str(workdir / "tb"),
    "plot": str(plot),
    "checkpoints": str(ckpt.directory),
    **{k: v for k, v in last.items() if k.startswith("eval/pass@")},
  }
  if loop.export_hf and not preempted["set"]:
    summary["hf_export"] = str(export_hf(setup, state.params, workdir / "hf"))
  if distributed.is_primary():
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary


def setup_dict(setup: Setup) -> dict:
  """The validated config as plain data (written to workdir/config.json)."""
  return {
    "loop": dataclasses.asdict(setup.loop),
    "task": type(setup.task).__name__,
    "model": dataclasses.asdict(setup.model_cfg),
    "sampler": dataclasses.asdict(setup.sampler_cfg),
    "rl": dataclasses.asdict(setup.rl_cfg),
    "diagnostics": dataclasses.asdict(setup.diagnostics),
  }


def describe(summary: dict) -> str:
  """A short human summary of a run (what `grpo-jax` prints last)."""
  before, after = summary["warmstart_accuracy"], summary["final_accuracy"]
  state = "stopped by SIGTERM; rerun to resume" if summary["preempted"] else "done"
  return "\n".join(
    [
      f"{state}: {summary['iterations_done']} iterations in {summary['wall_seconds']:.0f} s.",
      f"held-out greedy accuracy: {100 * before:.1f}% after warm start -> {100 * after:.1f}% "
      f"({100 * (after - before):+.1f} points; best {100 * summary['best_accuracy']:.1f}% at "
      f"iteration {summary['best_iteration']}).",
      f"plot: {summary['plot']}",
      f"metrics: {summary['metrics']}  (definitions: grpo_jax.metrics.DEFINITIONS)",
      f"tensorboard: pip install tensorboard && tensorboard --logdir {summary['tensorboard']}",
    ]
  )
