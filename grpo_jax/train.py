"""The training loop: supervised warm start, then RL iterations, with held-out evaluation.

    summary = train.run(config, workdir)     # config: a ConfigDict like configs/arithmetic.py

Each RL iteration: draw B prompts from the task's train stream -> sample G rollouts each
(jitted) -> score rewards on the host -> `rl.prepare` (old log-probs, advantages, token
masks, jitted) -> plan mini-batches -> ppo_epochs × num_minibatches `rl.train_step`s ->
one JSONL line of metrics. Evaluation runs every `eval_every` iterations on the held-out
split: greedy accuracy.

Status: the first step of the trainer issue. Checkpointing and exact resume, dynamic
sampling (refused with an error for now), the reward worker pool with timeouts,
TensorBoard, pass@k and the non-finite-step guard are still to come (README, Training).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import config_lib, controllers, model, rl, sampling, tasks


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

  def __post_init__(self):
    for name in ("prompts_per_step", "iterations", "eval_every", "eval_size", "warmstart_batch"):
      if getattr(self, name) < 1:
        raise ValueError(f"config.{name} must be >= 1, got {getattr(self, name)}.")
    for name in ("learning_rate", "warmstart_lr"):
      if not getattr(self, name) > 0:
        raise ValueError(f"config.{name} must be > 0, got {getattr(self, name)}.")
    for name in ("warmup_steps", "weight_decay", "grad_clip", "warmstart_steps"):
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


_SECTIONS = ("task", "model", "sampler", "sampling", "rl")


def build(config) -> Setup:
  """Validates the ConfigDict and builds the typed pieces; errors name the bad key."""
  d = config_lib.to_dict(config)
  loop = config_lib.from_dict(
    LoopConfig, {k: v for k, v in d.items() if k not in _SECTIONS}, where="config"
  )
  task = tasks.get(d["task"]["name"], **d["task"].get("kwargs", {}))
  tok = task.tokenizer()
  model_cfg = model.ModelConfig.from_dict({**d["model"], "vocab_size": tok.vocab_size})
  sampler_cfg = config_lib.from_dict(
    sampling.SamplerConfig,
    {**d["sampler"], "eos_ids": tok.eos_ids, "pad_id": tok.pad_id},
    where="config.sampler",
  )
  rl_cfg = rl.RLConfig.from_dict(d["rl"], where="config.rl")
  if rl_cfg.dynamic_sampling:
    raise ValueError(
      "config.rl.dynamic_sampling=True is not implemented in the trainer yet; set it to False."
    )
  return Setup(
    loop=loop,
    task=task,
    tokenizer=tok,
    model_cfg=model_cfg,
    sampler_cfg=sampler_cfg,
    sampling_hyper=sampling.sampling_params(**d["sampling"]),
    rl_cfg=rl_cfg,
  )


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


def _sft_batch(setup: Setup, examples):
  """Prompts (left-padded bucket) and reference completions + EOS (right-padded to T)."""
  tok, T = setup.tokenizer, setup.sampler_cfg.max_new_tokens
  prompts = sampling.prepare_prompts(
    [tok.encode(e.prompt, add_bos=True) for e in examples], cfg=setup.sampler_cfg
  )
  targets = [tok.encode(e.reference, add_eos=True)[:T] for e in examples]
  tokens_NT = np.full((len(examples), T), tok.pad_id, np.int32)
  for i, t in enumerate(targets):
    tokens_NT[i, : len(t)] = t
  mask_NT = np.arange(T)[None, :] < np.array([len(t) for t in targets])[:, None]
  return prompts, tokens_NT, mask_NT


def make_sft_step(model_fn, optimizer):
  """jit: one cross-entropy step on reference completions (mean over target tokens)."""

  def loss_fn(params, prompts, tokens_NT, mask_NT):
    logp_NT, _ = sampling.completion_logprobs(
      params, prompts.tokens_BP, prompts.mask_BP, tokens_NT, mask_NT, model_fn=model_fn
    )
    return -jnp.sum(logp_NT) / jnp.maximum(jnp.sum(mask_NT), 1)

  @jax.jit
  def step(state: rl.TrainState, prompts, tokens_NT, mask_NT):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, prompts, tokens_NT, mask_NT)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return rl.TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss

  return step


# ----------------------------------------------------------------------------
# Evaluation.
# ----------------------------------------------------------------------------


def evaluate(setup: Setup, params, sample_fn, *, seed: int) -> dict:
  """Greedy accuracy and format rate on the first eval_size held-out problems."""
  task, tok = setup.task, setup.tokenizer
  examples = [task.example("test", i, seed=seed) for i in range(setup.loop.eval_size)]
  prompts = sampling.prepare_prompts(
    [tok.encode(e.prompt, add_bos=True) for e in examples], cfg=setup.sampler_cfg
  )
  greedy = sampling.sampling_params(greedy=True)
  rollouts = sample_fn(params, prompts, jax.random.key(0), greedy)
  G = setup.sampler_cfg.group_size
  rows = np.asarray(rollouts.tokens_NT)[::G]  # Greedy: the G rows of a group are equal.
  texts = [(e.prompt, tok.decode(r)) for e, r in zip(examples, rows)]
  return {
    "eval/greedy_accuracy": float(np.mean([task.reward(p, c) for p, c in texts])),
    "eval/format_rate": float(np.mean([task.format_reward(p, c) for p, c in texts])),
  }


# ----------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------


class MetricsWriter:
  """One JSON object per line in workdir/metrics.jsonl (host floats only)."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self._f = path.open("a")

  def write(self, record: dict):
    clean = {k: (float(v) if not isinstance(v, (str, int)) else v) for k, v in record.items()}
    self._f.write(json.dumps(clean) + "\n")
    self._f.flush()

  def close(self):
    self._f.close()


def _score(setup: Setup, examples, rollouts):
  tok, task, G = setup.tokenizer, setup.task, setup.sampler_cfg.group_size
  rows = np.asarray(rollouts.tokens_NT)
  texts = [(examples[i // G].prompt, tok.decode(r)) for i, r in enumerate(rows)]
  correct = np.array([task.reward(p, c) for p, c in texts], np.float32)
  fmt = np.array([task.format_reward(p, c) for p, c in texts], np.float32)
  return correct, fmt


def run(config, workdir: str | pathlib.Path, *, log=print) -> dict:
  """Warm start, then RL; writes metrics.jsonl and summary.json in workdir."""
  t_start = time.perf_counter()
  setup = build(config)
  loop, scfg, rl_cfg = setup.loop, setup.sampler_cfg, setup.rl_cfg
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  writer = MetricsWriter(workdir / "metrics.jsonl")
  B, G = loop.prompts_per_step, scfg.group_size
  N = B * G

  model_fn = model.make_model_fn(setup.model_cfg)
  sample_fn = sampling.make_policy_sampler(setup.model_cfg, scfg)
  key = jax.random.key(loop.seed)
  params = jax.jit(model.init, static_argnums=0)(setup.model_cfg, jax.random.fold_in(key, 0))

  # 1. Supervised warm start on reference solutions.
  if loop.warmstart_steps:
    sft_opt = _optimizer(loop, lr=loop.warmstart_lr)
    sft_step = make_sft_step(model_fn, sft_opt)
    state = rl.init_state(params, sft_opt)
    stream = setup.task.examples("train", seed=loop.seed + 1)
    for _ in range(loop.warmstart_steps):
      batch = _sft_batch(setup, [next(stream) for _ in range(loop.warmstart_batch)])
      state, loss = sft_step(state, *batch)
    params = state.params
    log(f"warm start: {loop.warmstart_steps} steps, final loss {float(loss):.3f}")
  warm = evaluate(setup, params, sample_fn, seed=loop.seed)
  log(f"warm-start accuracy {warm['eval/greedy_accuracy']:.3f}")
  writer.write({"iteration": 0, "phase": "warmstart", **warm})

  # 2. RL.
  optimizer = _optimizer(loop, lr=loop.learning_rate)
  state = rl.init_state(params, optimizer)
  ref_params = params if rl_cfg.use_ref else None
  prepare = rl.make_prepare(rl_cfg, model_fn)
  step_fn = rl.make_train_step(rl_cfg, model_fn, optimizer)
  plan_fn = rl.make_plan_fn(rl_cfg, batch_size=N, group_size=G)
  prep_hyper = rl_cfg.prepare_hyper(max_new_tokens=scfg.max_new_tokens)
  step_hyper = rl_cfg.step_hyper()
  controller = controllers.get(rl_cfg.controller, **config_lib.to_dict(rl_cfg.controller_options))
  ctrl_state = controllers.init_state()
  index = 0
  last_eval = warm
  for it in range(1, loop.iterations + 1):
    t0 = time.perf_counter()
    examples = [setup.task.example("train", index + i, seed=loop.seed) for i in range(B)]
    index += B
    prompts = sampling.prepare_prompts(
      [setup.tokenizer.encode(e.prompt, add_bos=True) for e in examples], cfg=scfg
    )
    it_key = jax.random.fold_in(key, it)
    rollouts = jax.block_until_ready(
      sample_fn(state.params, prompts, jax.random.fold_in(it_key, 0), setup.sampling_hyper)
    )
    t1 = time.perf_counter()
    correct, fmt = _score(setup, examples, rollouts)
    rl.validate_batch(
      rl_cfg, rewards_N=correct + fmt, group_ids_N=rollouts.group_ids_N, group_size=G
    )
    t2 = time.perf_counter()
    batch, rewards, stats = prepare(state.params, ref_params, rollouts, correct, fmt, prep_hyper)
    state, _, history = rl.update(
      state, batch, jax.random.fold_in(it_key, 1), step_hyper, plan_fn=plan_fn, step_fn=step_fn
    )
    # The controller moves the advantage hyperparameters (arrays: no recompile).
    adv_hyper, ctrl_state = controller(prep_hyper.adv, ctrl_state, stats)
    prep_hyper = prep_hyper.replace(adv=adv_hyper)
    jax.block_until_ready(state.params)
    t3 = time.perf_counter()
    record = {
      "iteration": it,
      "phase": "rl",
      "accuracy": float(correct.mean()),
      **{k: float(v) for k, v in stats.items()},
      **{k: float(v) for k, v in history[-1].items()},
      "time/sample": t1 - t0,
      "time/reward": t2 - t1,
      "time/update": t3 - t2,
      "tokens_per_s": float(np.asarray(rollouts.mask_NT).sum()) / (t1 - t0),
    }
    if it % loop.eval_every == 0 or it == loop.iterations:
      last_eval = evaluate(setup, state.params, sample_fn, seed=loop.seed)
      record.update(last_eval)
      log(
        f"iter {it:4d}  reward {correct.mean():.3f}  "
        f"eval acc {last_eval['eval/greedy_accuracy']:.3f}  loss {record['loss']:.4f}"
      )
    writer.write(record)
  writer.close()
  summary = {
    "warmstart_accuracy": warm["eval/greedy_accuracy"],
    "final_accuracy": last_eval["eval/greedy_accuracy"],
    "wall_seconds": time.perf_counter() - t_start,
    "metrics": str(workdir / "metrics.jsonl"),
  }
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary
