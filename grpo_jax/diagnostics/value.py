"""Monte-Carlo token value (arXiv 2605.08666, evidence (b); RESEARCH.md §2.2).

For rollout i and position t, with prompt q_i and completion o_i:

  V(q, o_<t)  = P(correct | prefix q + o_<t), estimated by the mean reward of K sampled
                continuations of the prefix (the prefix *before* token t);
  V(q, o_<=t) = the same for the prefix that includes token t (the value *after* it).

A token's value is V(q, o_<=t), the success probability once it is emitted; its gain
(token advantage) is V(q, o_<=t) − V(q, o_<t). The paper's claim: tokens boosted by
critic-free RL have higher value than suppressed ones, whatever their rollout's polarity;
`value_by_flip` compares both quantities at boosted vs suppressed tokens split by
polarity.

Sampling runs through any `sample_fn(params, prompts, key) -> sampling.Rollouts` (e.g.
`functools.partial(sampling.make_policy_sampler(model_cfg, sampler_cfg), hyper=...)`,
positional: `lambda p, x, k: sampler(p, x, k, hyper)`) whose SamplerConfig has
group_size = K; prefixes are left-padded by `sampling.prepare_prompts` (its buckets and
max_prompt_len must hold prompt + completion prefixes). Rewards are host calls
`reward_fn(prompt_ids, completion_ids) -> float` on the full completion o_<t (+ o_t) +
continuation, so a task's own reward scores it after decoding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from grpo_jax.diagnostics import flips
from grpo_jax.models import sampling


def build_prefixes(
  prompt_tokens_BP, prompt_mask_BP, tokens_BT, rows_S, cols_S, *, include_token: bool
) -> list[tuple[list[int], list[int]]]:
  """[(prompt ids, completion prefix ids)] for positions (r_s, c_s): the completion prefix
  is o_{r,<c} (include_token False) or o_{r,<=c} (True). Host."""
  pt, pm, ct = (np.asarray(x) for x in (prompt_tokens_BP, prompt_mask_BP, tokens_BT))
  out = []
  for r, c in zip(np.asarray(rows_S), np.asarray(cols_S)):
    prompt = pt[r][pm[r]].tolist()
    out.append((prompt, ct[r, : int(c) + int(include_token)].tolist()))
  return out


def mc_values(
  sample_fn: Callable,
  params,
  prefixes: Sequence[tuple[Sequence[int], Sequence[int]]],
  key: jax.Array,
  *,
  reward_fn: Callable[[list[int], list[int]], float],
  sampler_cfg: sampling.SamplerConfig,
  batch_size: int = 16,
  max_completion_len: int | None = None,
):
  """(values_S, rewards_SK): V(prefix) = mean of K = sampler_cfg.group_size rewards.

  Each prefix (prompt, completion prefix) is sampled as the prompt `prompt + prefix`;
  reward_fn(prompt, prefix + continuation) scores each of its K continuations (the
  continuation's valid tokens, EOS included; cut to max_completion_len tokens of
  completion when given). Prefixes run `batch_size` at a time, the last batch padded by
  repeating its last prefix (one compile per prompt bucket); batch b uses
  jax.random.fold_in(key, b). Host loop around the jitted sampler.
  """
  if not prefixes:
    return np.zeros((0,)), np.zeros((0, sampler_cfg.group_size))
  K = sampler_cfg.group_size
  # One bucket for every batch (the longest prefix's), so the sampler compiles once.
  longest = max(len(p) + len(c) for p, c in prefixes)
  rewards = np.zeros((len(prefixes), K), np.float64)
  for b, start in enumerate(range(0, len(prefixes), batch_size)):
    chunk = list(prefixes[start : start + batch_size])
    n = len(chunk)
    chunk += [chunk[-1]] * (batch_size - n)
    prompts = sampling.prepare_prompts(
      [list(p) + list(c) for p, c in chunk], cfg=sampler_cfg, min_len=longest
    )
    r = jax.device_get(sample_fn(params, prompts, jax.random.fold_in(key, b)))
    tokens_NT, mask_NT = np.asarray(r.tokens_NT), np.asarray(r.mask_NT)
    for j in range(n):
      prompt, prefix = chunk[j]
      for k in range(K):
        row = j * K + k
        completion = list(prefix) + tokens_NT[row][mask_NT[row]].tolist()
        if max_completion_len is not None:
          completion = completion[:max_completion_len]
        rewards[start + j, k] = float(reward_fn(list(prompt), completion))
  return rewards.mean(axis=1), rewards


def token_values(
  sample_fn: Callable,
  params,
  prompt_tokens_BP,
  prompt_mask_BP,
  tokens_BT,
  rows_S,
  cols_S,
  key: jax.Array,
  **options,
) -> dict[str, np.ndarray]:
  """{"before": V(q, o_<t), "after": V(q, o_<=t), "gain": after − before} at positions
  (r_s, c_s), from one `mc_values` call over the 2S prefixes (options go to it)."""
  args = (prompt_tokens_BP, prompt_mask_BP, tokens_BT, rows_S, cols_S)
  before = build_prefixes(*args, include_token=False)
  after = build_prefixes(*args, include_token=True)
  values, _ = mc_values(sample_fn, params, before + after, key, **options)
  S = len(before)
  return {"before": values[:S], "after": values[S:], "gain": values[S:] - values[:S]}


def value_by_flip(
  value_S, gain_S, delta_S, adv_S, *, tau: float = 0.0, prefix: str = "value"
) -> dict[str, float]:
  """Mean token value and gain at boosted (Δ > τ) vs suppressed (Δ < −τ) tokens, by the
  polarity of each token's rollout (adv_S = ā of the row). Host. Keys:

    {prefix}/{pos,neg,all}/{boosted,suppressed,unchanged}/{value,gain,count}
    {prefix}/{pos,neg,all}/value_gap   mean value at boosted − at suppressed
    {prefix}/{pos,neg,all}/gain_gap    the same for the gain
  """
  value_S, gain_S, delta_S, adv_S = (
    np.asarray(x, np.float64) for x in (value_S, gain_S, delta_S, adv_S)
  )
  states = np.where(delta_S > tau, 0, np.where(delta_S < -tau, 1, 2))
  pol = np.asarray(flips.polarity_masks(np.asarray(adv_S)))
  out = {}
  nan = float("nan")
  for p, pname in enumerate(flips.POLARITIES):
    means = {}
    for s, sname in enumerate(flips.STATES):
      sel = pol[p] & (states == s)
      key = f"{prefix}/{pname}/{sname}"
      means[sname] = (value_S[sel].mean(), gain_S[sel].mean()) if sel.any() else (nan, nan)
      out[f"{key}/value"], out[f"{key}/gain"] = means[sname]
      out[f"{key}/count"] = int(sel.sum())
    out[f"{prefix}/{pname}/value_gap"] = means["boosted"][0] - means["suppressed"][0]
    out[f"{prefix}/{pname}/gain_gap"] = means["boosted"][1] - means["suppressed"][1]
  return out
