"""Partial rollouts: rows decoded one segment at a time, each segment by the newest params
(config.offpolicy.partial; the schedule and its staleness rules are grpo_jax/rl/offpolicy.py's).

`empty_rollouts` is a batch's start (B·G rows with no completion token), `continue_rows`
decodes one segment of every live row under new params, from [prompt ; its tokens so far]
prefilled anew (a stale KV cache would mix two policies in one forward), `restart_rows`
empties the rows a "restart" policy discards, and `finished` says which rows are done.
Each token keeps the sampler log-prob of the params that produced it.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.models import sampling
from grpo_jax.rollouts import counterfactuals


def empty_rollouts(prompts: sampling.Prompts, *, group_size: int, max_new_tokens: int, pad_id):
  """Rollouts of B·G rows with no completion token yet (a partial batch's start)."""
  B = prompts.tokens_BP.shape[0]
  N, T = B * group_size, max_new_tokens
  state = sampling.DecodeState(
    step=jnp.zeros((), jnp.int32),
    cache=None,
    key=None,
    tok_N=None,
    pos_N=None,
    done_N=jnp.zeros((N,), jnp.bool_),
    tokens_NT=jnp.full((N, T), pad_id, jnp.int32),
    mask_NT=jnp.zeros((N, T), jnp.bool_),
    logp_NT=jnp.zeros((N, T), jnp.float32),
    policy_logp_NT=jnp.zeros((N, T), jnp.float32),
  )
  return sampling.to_rollouts(prompts, state, group_size=group_size)


def finished(rollouts: sampling.Rollouts) -> jax.Array:
  """finished_N: the row emitted EOS or filled its T slots."""
  return rollouts.eos_N | (rollouts.length_N >= rollouts.tokens_NT.shape[1])


def restart_rows(rollouts: sampling.Rollouts, reset_N, *, pad_id) -> sampling.Rollouts:
  """The rows reset_N emptied (their tokens discarded), the others unchanged."""
  keep_NT = ~reset_N[:, None]
  mask_NT = rollouts.mask_NT & keep_NT
  return rollouts.replace(
    tokens_NT=jnp.where(mask_NT, rollouts.tokens_NT, pad_id),
    mask_NT=mask_NT,
    logp_NT=jnp.where(mask_NT, rollouts.logp_NT, 0.0),
    policy_logp_NT=jnp.where(mask_NT, rollouts.policy_logp_NT, 0.0),
    eos_N=rollouts.eos_N & ~reset_N,
    truncated_N=rollouts.truncated_N | reset_N,
    length_N=jnp.sum(mask_NT, axis=1, dtype=jnp.int32),
  )


def continue_rows(
  params,
  rollouts: sampling.Rollouts,
  live_N,
  steps,
  key,
  hyper: sampling.SamplingParams,
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
) -> sampling.Rollouts:
  """Each live row decoded up to `steps` more tokens (at most T in all) under `params`,
  from [prompt ; its tokens so far] prefilled anew (`counterfactuals.prefix_prompts`);
  the new tokens carry these params' log-probs, the old ones keep theirs. Jittable."""
  T = rollouts.tokens_NT.shape[1]
  len_N = rollouts.length_N
  prompts = counterfactuals.prefix_prompts(
    rollouts.prompt_tokens_NP,
    rollouts.prompt_mask_NP,
    rollouts.tokens_NT,
    len_N,
    pad_id=cfg.pad_id,
  )
  limit_N = jnp.where(live_N, jnp.minimum(steps, T - len_N), 0)
  s = counterfactuals.sample_limited(
    params, prompts, limit_N, key, hyper, model_fn=model_fn, init_cache=init_cache, cfg=cfg
  )
  t_T = jnp.arange(T)
  src_NT = jnp.clip(t_T[None, :] - len_N[:, None], 0, T - 1)
  new_NT = (t_T[None, :] >= len_N[:, None]) & jnp.take_along_axis(s.mask_NT, src_NT, axis=1)

  def join(old, cont):
    return jnp.where(new_NT, jnp.take_along_axis(cont, src_NT, axis=1), old)

  mask_NT = rollouts.mask_NT | new_NT
  eos_N = rollouts.eos_N | sampling.ended_with_eos(s.tokens_NT, s.mask_NT, cfg.eos_ids)
  return rollouts.replace(
    tokens_NT=join(rollouts.tokens_NT, s.tokens_NT),
    mask_NT=mask_NT,
    logp_NT=join(rollouts.logp_NT, s.logp_NT),
    policy_logp_NT=join(rollouts.policy_logp_NT, s.policy_logp_NT),
    eos_N=eos_N,
    truncated_N=~eos_N,
    length_N=jnp.sum(mask_NT, axis=1, dtype=jnp.int32),
    num_steps=rollouts.num_steps + s.step,
  )
