"""Supervised warm start: cross-entropy on the task's reference solutions, before RL.

    params = warmstart.run(setup, fns, params, log=print, preempted=flag)

A tiny model trained from scratch solves nothing, so GRPO would see only zero-variance
groups; `warmstart_steps` steps of cross-entropy on `warmstart_batch` reference
completions (+ EOS) per step give it a non-zero pass rate first. The loss is the mean over
target tokens; the optimizer is the RL one at `warmstart_lr` (`steps.optimizers`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import config, distributed, logprobs, rl, rollout


class Preempted(RuntimeError):
  """SIGTERM arrived before the first checkpoint (during the warm start)."""


def sft_step(state: rl.TrainState, prompts, tokens_NT, mask_NT, *, model_fn, optimizer):
  """One cross-entropy step on reference completions: (state, loss), with loss =
  −Σ m·log π(y) / Σ m over the batch's target tokens. Pure; `steps` jits it."""

  def loss_fn(params):
    logp_NT, _ = logprobs.completion_logprobs(
      params, prompts.tokens_BP, prompts.mask_BP, tokens_NT, mask_NT, model_fn=model_fn
    )
    return -jnp.sum(logp_NT) / jnp.maximum(jnp.sum(mask_NT), 1)

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  return rl.TrainState(step=state.step + 1, params=params, opt_state=opt_state), loss


def batch(setup: config.Setup, fns, examples):
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


def run(setup: config.Setup, fns, params, *, log, preempted):
  """`warmstart_steps` cross-entropy steps from `params`; returns the new params."""
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
    examples = [next(stream) for _ in range(loop.warmstart_batch)]
    state, loss = fns.sft_step(state, *batch(setup, fns, examples))
  log(f"warm start: {loop.warmstart_steps} steps, final loss {float(loss):.3f}")
  return state.params
