"""Supervised warm start: cross-entropy on the task's reference solutions, before RL.

    params = warmstart.run(setup, fns, params, log=print, preempted=flag)

A tiny model trained from scratch solves nothing, so GRPO would see only zero-variance
groups; `warmstart_steps` steps of cross-entropy on `warmstart_batch` reference
completions (+ EOS) per step give it a non-zero pass rate first. The loss is the mean over
target tokens; the optimizer is the RL one at `warmstart_lr` (`steps.optimizers`).

SIGTERM (a preemption notice) during the warm start saves its state (params, optimizer
state, step, and the run's wall seconds so far) to workdir/warmstart and raises
`Preempted`; rerunning continues from that step with the same data, so the result equals
an uninterrupted warm start, and the run's wall seconds go on from `seconds_before`. The
trainer deletes workdir/warmstart once checkpoint 0 (the warm-started policy) is on disk.
"""

from __future__ import annotations

import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import schema
from grpo_jax.infra import checkpoint, distributed, logs
from grpo_jax.models import logprobs, model
from grpo_jax.rl import guards, learner, spec
from grpo_jax.trainer import build, rollout

DIRECTORY = "warmstart"


class Preempted(RuntimeError):
  """SIGTERM arrived during the warm start; its state is saved at `step`, after
  `wall_seconds` of the run (every session so far)."""

  def __init__(self, message: str, *, step: int, wall_seconds: float):
    super().__init__(message)
    self.step = step
    self.wall_seconds = wall_seconds


def _checkpointer(workdir) -> checkpoint.Checkpointer:
  # Async: the manifest is then written before orbax commits the step (`checkpoint`).
  return checkpoint.Checkpointer(pathlib.Path(workdir) / DIRECTORY, keep=1, keep_best=False)


def seconds_before(workdir) -> float:
  """The run's wall seconds that the warm start's SIGTERM checkpoint recorded (0 without
  one, or when it cannot be read: `_resume` then says why)."""
  if workdir is None or not (pathlib.Path(workdir) / DIRECTORY).exists():
    return 0.0
  ckpt = _checkpointer(workdir)
  try:
    step = ckpt.latest_step()
    return 0.0 if step is None else float(ckpt.read_meta(step).get("wall_seconds", 0.0))
  except Exception:  # A damaged checkpoint is `_resume`'s to report.
    return 0.0
  finally:
    ckpt.close()


def _abstract_state(setup: build.Setup, fns):
  """Shapes, dtypes and shardings of the warm start's train state."""
  shapes = jax.eval_shape(
    lambda k: spec.init_state(
      stored(model.init(setup.model_cfg, k), setup.model_cfg, part(setup.model_cfg)),
      fns.warmstart.optimizer,
      part=part(setup.model_cfg),
    ),
    jax.random.key(0),
  )
  return jax.tree.map(
    lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
    shapes,
    fns.warmstart.state_shardings,
  )


def _resume(setup: build.Setup, fns, workdir, params, *, log) -> tuple[spec.TrainState, int]:
  """(state, steps done): the SIGTERM checkpoint's, else a fresh state at step 0."""
  state = spec.init_state(params, fns.warmstart.optimizer, part=part(setup.model_cfg))
  if workdir is None or not (pathlib.Path(workdir) / DIRECTORY).exists():
    return state, 0
  ckpt = _checkpointer(workdir)
  try:
    got = ckpt.restore_latest(like=_abstract_state(setup, fns), log=log)
  finally:
    ckpt.close()
  if got is None:
    return state, 0
  step, state = got.step, got.tree
  log(f"warm start: continuing from step {step} ({pathlib.Path(workdir) / DIRECTORY})")
  return state, step


def _save(workdir, state: spec.TrainState, step: int, *, wall_seconds: float) -> None:
  if workdir is None:
    return
  # Every process calls save (orbax writes each process's shards); only the primary deletes.
  ckpt = _checkpointer(workdir)
  try:
    ckpt.save(step, state, {"warmstart_step": step, "wall_seconds": wall_seconds})
  finally:
    ckpt.close()


def discard(workdir) -> None:
  """Deletes workdir/warmstart (superseded once checkpoint 0 exists)."""
  if distributed.is_primary():
    shutil.rmtree(pathlib.Path(workdir) / DIRECTORY, ignore_errors=True)


def part(model_cfg) -> str:
  """What the warm start trains (`model.split_trainable`): model.lora.warm_start with
  adapters (build.build resolves "auto"), else the whole model."""
  return model_cfg.lora.warm_start if model_cfg.lora.enabled else "adapters"


def stored(params, model_cfg, trains: str):
  """The params a warm start that trains `trains` (`part`) holds: with "adapters" the
  frozen base as stored (`model.cast_base`: model.lora.base_dtype), with "base" as made."""
  return model.cast_base(params, model_cfg) if trains == "adapters" else params


def sft_step(
  state: spec.TrainState,
  prompts,
  tokens_NT,
  mask_NT,
  *,
  model_fn,
  optimizer,
  part="adapters",
  dropout_seed: int = 0,
):
  """One cross-entropy step on reference completions: (state, {"loss", "nonfinite"}), with
  loss = −Σ m·log π(y) / Σ m over the batch's target tokens. A step whose loss, gradient or
  updated state is not finite is not applied (`learner.apply_if_finite`). Pure; `steps` jits it.
  The forward is a training one: adapter dropout (model.lora.dropout) draws its masks from
  fold_in(key(dropout_seed), state.step), so a resumed warm start draws the same ones."""

  trainable, join = model.split_trainable(state.params, part=part)
  dropout_key = jax.random.fold_in(jax.random.key(dropout_seed), state.step)

  def loss_fn(trainable):
    logp_NT, _ = logprobs.completion_logprobs(
      join(trainable),
      prompts.tokens_BP,
      prompts.mask_BP,
      tokens_NT,
      mask_NT,
      model_fn=model_fn,
      dropout_key=dropout_key,
    )
    return -jnp.sum(logp_NT) / jnp.maximum(jnp.sum(mask_NT), 1)

  loss, grads = jax.value_and_grad(loss_fn)(trainable)
  finite = jnp.isfinite(loss) & jnp.isfinite(optax.tree.norm(grads))
  state, applied = learner.apply_if_finite(state, grads, finite, optimizer, part=part)
  return state, {"loss": loss, "nonfinite": 1.0 - applied.astype(jnp.float32)}


def batch(setup: build.Setup, fns, examples):
  """Prompts (left-padded bucket) and reference completions + EOS (right-padded to T), as
  global arrays; this process encodes only its rows of `examples`."""
  tok, T, n = setup.tokenizer, setup.sampler_cfg.max_new_tokens, len(examples)
  rows = distributed.local_rows(fns.layout.rows(n), n)
  prompts = rollout.host_prompts(setup, fns, dict(enumerate(examples)), n)
  targets = [tok.encode(e.reference, add_eos=True)[:T] for e in examples[rows]]
  tokens_NT = np.full((len(targets), T), tok.pad_id, np.int32)
  for i, t in enumerate(targets):
    tokens_NT[i, : len(t)] = t
  mask_NT = np.arange(T)[None, :] < np.array([len(t) for t in targets])[:, None]
  return (prompts, *distributed.to_global((tokens_NT, mask_NT), fns.layout.rows(n), n))


# The bar shows the loss of a step this many steps back, read every this many steps: the
# device has long finished it, so reading it never makes the loop wait.
_LOSS_LAG = 16


def _lagged_loss(history: list, steps: int) -> dict:
  """{"loss": the loss of step (steps - _LOSS_LAG)}, read every _LOSS_LAG steps ({} else)."""
  if steps < _LOSS_LAG or steps % _LOSS_LAG:
    return {}
  return {"loss": float(history[-_LOSS_LAG]["loss"])}


def _progress(loop: schema.LoopConfig, done: int, *, log) -> logs.Progress:
  last = {}

  def fields(record):
    last.update(record)
    return {"loss": f"{last['loss']:.3f}"} if "loss" in last else {}

  return logs.Progress(
    total=loop.warmstart_steps,
    start=done,
    enabled=loop.progress and distributed.is_primary(),
    desc="warm start",
    unit="step",
    log=log,
    fields=fields,
  )


def run(setup: build.Setup, fns, params, *, log, preempted, workdir=None, wall_seconds=None):
  """`warmstart_steps` cross-entropy steps from `params` (or from workdir's SIGTERM
  checkpoint); returns the new params. Raises `Preempted` on SIGTERM (after saving the
  state, and `wall_seconds()`: the run's seconds so far, when `workdir` is given) and
  `guards.NonFiniteError` when max_nonfinite_steps consecutive steps were not applied."""
  loop = setup.loop
  state, done = _resume(setup, fns, workdir, params, log=log)
  stream = setup.task.examples("train", seed=loop.seed + 1)
  for _ in range(done * loop.warmstart_batch):  # The examples of the steps already done.
    next(stream)
  history = []
  progress = _progress(loop, done, log=log)
  try:
    for step in range(done, loop.warmstart_steps):
      if distributed.any_across(preempted["set"]):  # Every process stops at the same step.
        seconds = wall_seconds() if wall_seconds is not None else 0.0
        _save(workdir, state, step, wall_seconds=seconds)
        raise Preempted(
          f"SIGTERM during the warm start: its state at step {step} of {loop.warmstart_steps} is "
          f"saved; rerun the same command to continue from there.",
          step=step,
          wall_seconds=seconds,
        )
      examples = [next(stream) for _ in range(loop.warmstart_batch)]
      state, metrics = fns.warmstart.step(state, *batch(setup, fns, examples))
      history.append(metrics)
      progress.update(step + 1, _lagged_loss(history, step + 1 - done))
  finally:
    progress.close()
  history = jax.device_get(history)  # One transfer at the end: the loop never waits.
  skipped, _ = guards.count_nonfinite(
    [h["nonfinite"] > 0 for h in history], 0, limit=loop.max_nonfinite_steps, where="warm start"
  )
  loss = float(history[-1]["loss"]) if history else float("nan")
  log(f"warm start: {loop.warmstart_steps} steps ({skipped} skipped), final loss {loss:.3f}")
  return state.params
