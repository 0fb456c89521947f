"""Long-run monitors for the three failure modes of arXiv 2604.13088 (RESEARCH.md §1.1,
§1.3): solution-probability drift, entropy collapse, learning tax; plus KL to the initial
policy and the response-length trend.

Definitions (the paper gives none that we can see; these are ours, stated exactly):

* Solution-probability drift: the mean log-prob of a fixed set of correct reference
  solutions under the current params, per token (Σ_{i,t} m log π / Σ m) and per sequence
  ((1/B) Σ_i Σ_t m log π = mean log π(o_i | q_i)). Logged over training; falling values
  are drift away from known solutions.
* Entropy: mean over the valid tokens of a fixed probe batch of H(π_θ(·| q, o_<t)).
* KL to the initial policy: exact over the vocabulary at each probe context,
  KL_t = Σ_v π_θ(v|c_t)·(log π_θ(v|c_t) − log π_0(v|c_t)), averaged over valid tokens. The
  contexts c_t = (q, o_<t) are the probe batch's (sampled earlier, not from π_θ), so this is
  the exact KL at those contexts, not an estimate of the sequence-level KL under π_θ. A
  probe batch of B×T contexts costs two [B, T, V] forwards, cheap at probe sizes
  (`row_chunk` bounds memory). The k3 estimate at the probe tokens is reported beside it
  for comparison with the training-time KL (it is biased here: the tokens are not π_θ's).
* Learning tax: the share of the LM-head update's squared norm that lands on the
  output rows of weak-credit tokens,
      tax = Σ_{v ∈ W} ‖δW[:, v]‖² / ‖δW‖_F²,
  with δW [D, V] the update of the LM-head block (the SGD step `coupling.head_update`, or
  the measured change of the head between two checkpoints, any optimizer) and W the
  weak-credit ids (`weak_credit_ids`): ids frequent in the batch (count >= the
  `freq_quantile` quantile of the counts of the ids present) whose credit nearly cancels
  (|r_v| <= ε·a_v, r_v the cancellation residual and a_v its gross credit Σ|w·A|). Under
  perfect cancellation and exchangeability their rows would not need to move; the tax is
  the update spent there anyway (e.g. by the −π push-down every token applies to every
  row, or by non-cancelling weights).
* Response-length trend: the least-squares slope of length against iteration over the
  last `window` points (tokens per iteration).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import logprobs
from grpo_jax.rl import losses


def pad_references(
  prompts: Sequence[Sequence[int]],
  completions: Sequence[Sequence[int]],
  *,
  pad_id: int,
  prompt_len: int | None = None,
  completion_len: int | None = None,
):
  """(prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT) numpy: prompts left-padded,
  completions right-padded (the sampler's layout), to the longest or the given lengths."""
  if len(prompts) != len(completions) or not prompts:
    raise ValueError("pad_references needs as many (non-zero) prompts as completions.")
  P = prompt_len or max(len(p) for p in prompts)
  T = completion_len or max(len(c) for c in completions)
  if max(len(p) for p in prompts) > P or max(len(c) for c in completions) > T:
    raise ValueError(f"A reference exceeds prompt_len={P} or completion_len={T}.")
  pt = np.full((len(prompts), P), pad_id, np.int32)
  pm = np.zeros((len(prompts), P), bool)
  ct = np.full((len(prompts), T), pad_id, np.int32)
  cm = np.zeros((len(prompts), T), bool)
  for i, (p, c) in enumerate(zip(prompts, completions)):
    pt[i, P - len(p) :], pm[i, P - len(p) :] = p, True
    ct[i, : len(c)], cm[i, : len(c)] = c, True
  return pt, pm, ct, cm


def solution_drift(params, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, *, model_fn):
  """{"drift/solution_logp_token": Σ m log π / Σ m, "drift/solution_logp_seq": mean_i
  Σ_t m log π} of reference solutions under params. Jittable (model_fn static)."""
  logp_BT, _ = logprobs.completion_logprobs(
    params, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, model_fn=model_fn
  )
  m_BT = jnp.asarray(mask_BT, jnp.float32)
  return {
    "drift/solution_logp_token": jnp.sum(logp_BT * m_BT) / jnp.maximum(jnp.sum(m_BT), 1.0),
    "drift/solution_logp_seq": jnp.mean(jnp.sum(logp_BT * m_BT, axis=1)),
  }


def completion_logits(params, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, *, model_fn):
  """Float32 logits [B, T, V] at the positions that predict the completion tokens
  (`logprobs.completion_logits`)."""
  logits_BTV = logprobs.completion_logits(
    params, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, model_fn=model_fn
  )
  return logits_BTV.astype(jnp.float32)


def _token_stats(params, init_params, batch, *, model_fn):
  pt, pm, t, m = batch
  logp_BTV = jax.nn.log_softmax(completion_logits(params, pt, pm, t, m, model_fn=model_fn))
  logp0_BTV = jax.nn.log_softmax(completion_logits(init_params, pt, pm, t, m, model_fn=model_fn))
  p_BTV = jnp.exp(logp_BTV)
  ent_BT = -jnp.sum(p_BTV * logp_BTV, axis=-1)
  kl_BT = jnp.sum(p_BTV * (logp_BTV - logp0_BTV), axis=-1)
  pick = lambda x: jnp.take_along_axis(x, t[..., None], axis=-1)[..., 0]
  k3_BT = losses.k3(pick(logp_BTV), pick(logp0_BTV))
  return ent_BT, kl_BT, k3_BT


def policy_stats(
  params,
  init_params,
  prompt_tokens_BP,
  prompt_mask_BP,
  tokens_BT,
  mask_BT,
  *,
  model_fn: Callable,
  row_chunk: int | None = None,
):
  """{"drift/entropy", "drift/kl_init", "drift/kl_init_k3"}: mean entropy of π_θ, exact KL
  (π_θ ‖ π_0) and k3 at the probe tokens, over valid probe tokens (module docstring).
  row_chunk (dividing B) runs the forwards over that many rows at a time. Jittable."""
  batch = tuple(jnp.asarray(x) for x in (prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT))
  B = batch[0].shape[0]
  fn = lambda b: _token_stats(params, init_params, b, model_fn=model_fn)
  if row_chunk is None or row_chunk >= B:
    ent_BT, kl_BT, k3_BT = fn(batch)
  else:
    if B % row_chunk:
      raise ValueError(f"row_chunk={row_chunk} must divide the probe batch of {B} rows.")
    chunks = jax.tree.map(lambda x: x.reshape(B // row_chunk, row_chunk, *x.shape[1:]), batch)
    out = jax.lax.map(fn, chunks)
    ent_BT, kl_BT, k3_BT = (x.reshape(B, -1) for x in out)
  m_BT = batch[3].astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m_BT), 1.0)
  return {
    "drift/entropy": jnp.sum(ent_BT * m_BT) / n,
    "drift/kl_init": jnp.sum(kl_BT * m_BT) / n,
    "drift/kl_init_k3": jnp.sum(k3_BT * m_BT) / n,
  }


def length_trend(lengths: Sequence[float], *, window: int | None = None) -> float:
  """Least-squares slope of length vs index over the last `window` points (all when None);
  NaN with fewer than 2 points. Host."""
  y = np.asarray(lengths, np.float64)
  if window is not None:
    y = y[-window:]
  if y.size < 2:
    return float("nan")
  x = np.arange(y.size, dtype=np.float64)
  x -= x.mean()
  return float(np.sum(x * (y - y.mean())) / np.sum(x * x))


def weak_credit_ids(residual_V, gross_V, count_V, *, eps: float = 0.1, freq_quantile: float = 0.5):
  """weak_V: count_v > 0, count_v >= the freq_quantile quantile of the counts of present
  ids, and |r_v| <= ε·a_v (at least a 1 − ε fraction of v's gross credit cancels).
  Jittable."""
  present_V = count_V > 0
  threshold = jnp.nanquantile(jnp.where(present_V, count_V, jnp.nan), freq_quantile)
  return present_V & (count_V >= threshold) & (jnp.abs(residual_V) <= eps * gross_V)


def learning_tax(dW_DV, weak_V):
  """Σ_{v ∈ weak} ‖δW[:, v]‖² / ‖δW‖_F² (0 for a zero update). Jittable."""
  col_V = jnp.sum(jnp.asarray(dW_DV, jnp.float32) ** 2, axis=0)
  total = jnp.sum(col_V)
  return jnp.where(
    total > 0, jnp.sum(jnp.where(weak_V, col_V, 0.0)) / jnp.where(total > 0, total, 1.0), 0.0
  )
