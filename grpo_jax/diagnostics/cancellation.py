"""Cancellation residual per token id (arXiv 2604.13088; RESEARCH.md §1.2–1.3).

For a token id v, the net credit the update gives it (the coefficient of its LM-head row
gradient, up to the hidden-state factor) is

  r_v = Σ_i Σ_{t: o_{i,t} = v} w_{i,t}·A_{i,t}         (over the batch),
  r_{g,v} = the same sum over the rows of group g     (per group),

with w the aggregation weights (`aggregation.REGISTRY`) and A the token advantages, both
0 off the loss mask. With zero-sum group advantages and exchangeable weights (w not
depending on the rollout), a token occurring once in every rollout of a group cancels
exactly: r_{g,v} = w Σ_i A_i = 0. Length normalisation (seq_mean_token_mean, w = 1/L_i)
breaks that whenever lengths differ. The gross credit a_v = Σ |w·A| over v's occurrences
is what r_v would be without cancellation; residual_ratio = Σ_v |r_v| / Σ_v a_v is the
fraction of credit that survives cancellation.

Everything on device is a `segment_sum` over the (static) vocabulary size V, so it is
jittable. A per-group residual holds [G, V] floats (G defaults to B, the range of group
ids): size it for the probe batch, not for a 150K vocabulary times thousands of rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rl import aggregation


def coefficients(adv_BT, w_BT, mask_BT):
  """c_{i,t} = w_{i,t}·A_{i,t} on the mask, 0 elsewhere: each token's credit."""
  return jnp.where(mask_BT, w_BT * adv_BT, 0.0).astype(jnp.float32)


def aggregation_weights(name: str, mask_BT, group_ids_B, adv_BT, *, max_len: int | None = None):
  """w_BT of the registered aggregation mode `name` (aggregation.REGISTRY)."""
  return aggregation.REGISTRY.make(name)(mask_BT, group_ids_B, adv_BT, max_len=max_len)


def token_counts(tokens_BT, mask_BT, *, vocab_size: int):
  """count_V: occurrences of each id among the valid tokens. Jittable."""
  return jax.ops.segment_sum(
    mask_BT.astype(jnp.float32).reshape(-1), tokens_BT.reshape(-1), num_segments=vocab_size
  )


def token_residual(tokens_BT, w_BT, adv_BT, mask_BT, *, vocab_size: int):
  """{"residual": r_V, "gross": a_V = Σ|w·A|, "count": count_V} over the batch. Jittable."""
  c_N = coefficients(adv_BT, w_BT, mask_BT).reshape(-1)
  y_N = tokens_BT.reshape(-1)
  seg = lambda x_N: jax.ops.segment_sum(x_N, y_N, num_segments=vocab_size)
  return {
    "residual": seg(c_N),
    "gross": seg(jnp.abs(c_N)),
    "count": token_counts(tokens_BT, mask_BT, vocab_size=vocab_size),
  }


def group_token_residual(
  tokens_BT, w_BT, adv_BT, mask_BT, group_ids_B, *, vocab_size: int, num_groups: int | None = None
):
  """r_GV: r_{g,v} per group id g in [0, num_groups) (default B). Jittable."""
  B, T = tokens_BT.shape
  G = num_groups or B
  c_N = coefficients(adv_BT, w_BT, mask_BT).reshape(-1)
  g_BT = jnp.broadcast_to(group_ids_B[:, None], (B, T))
  idx_N = (g_BT * vocab_size + tokens_BT).reshape(-1)
  return jax.ops.segment_sum(c_N, idx_N, num_segments=G * vocab_size).reshape(G, vocab_size)


def frequency_bands(count_V, *, num_bands: int) -> np.ndarray:
  """band_V (host): ids present in the batch (count > 0), sorted by count descending (ties
  by id), split into `num_bands` near-equal consecutive chunks of ids: band 0 holds the
  most frequent ids. Absent ids get −1."""
  count_V = np.asarray(count_V)
  present = np.flatnonzero(count_V > 0)
  order = present[np.lexsort((present, -count_V[present]))]
  band_V = np.full(count_V.shape, -1, np.int64)
  for b, chunk in enumerate(np.array_split(order, num_bands)):
    band_V[chunk] = b
  return band_V


def _share(num, den):
  return float(num / den) if den > 0 else float("nan")


def residual_report(
  tokens_BT,
  w_BT,
  adv_BT,
  mask_BT,
  group_ids_B,
  *,
  vocab_size: int,
  top_k: int = 10,
  num_bands: int = 4,
  category_V=None,
  categories: Sequence[str] = ("reasoning", "template"),
  prefix: str = "cancel",
) -> dict[str, float]:
  """Flat metrics of the cancellation residual (host). Keys:

  {prefix}/net                 Σ_v r_v = Σ w·A
  {prefix}/abs_residual        Σ_v |r_v|        (batch level)
  {prefix}/gross               Σ_v a_v = Σ |w·A|
  {prefix}/residual_ratio      Σ_v |r_v| / Σ_v a_v
  {prefix}/group_abs_residual  Σ_g Σ_v |r_{g,v}|, and group_residual_ratio (÷ gross)
  {prefix}/top{j}/{id,residual,count}   the top_k ids by |r_v| (j = 0 is the largest)
  {prefix}/band{b}/{abs_residual_share,residual_ratio,num_ids,min_count,max_count}
      per frequency band (`frequency_bands`; band 0 = most frequent ids):
      Σ_band |r_v| / Σ_v |r_v| and Σ_band |r_v| / Σ_band a_v
  {prefix}/{category}/{abs_residual_share,residual_ratio}   with category_V (int or
      bool per id, e.g. `flips.template_mask` of the vocabulary)
  """
  dev = jax.device_get(
    residual_arrays(tokens_BT, w_BT, adv_BT, mask_BT, group_ids_B, vocab_size=vocab_size)
  )
  return residual_summary(
    dev,
    top_k=top_k,
    num_bands=num_bands,
    category_V=category_V,
    categories=categories,
    prefix=prefix,
  )


def residual_arrays(tokens_BT, w_BT, adv_BT, mask_BT, group_ids_B, *, vocab_size: int):
  """`token_residual`'s arrays and "group": `group_token_residual`. Jittable."""
  return {
    **token_residual(tokens_BT, w_BT, adv_BT, mask_BT, vocab_size=vocab_size),
    "group": group_token_residual(
      tokens_BT, w_BT, adv_BT, mask_BT, group_ids_B, vocab_size=vocab_size
    ),
  }


def residual_summary(
  dev: dict,
  *,
  top_k: int = 10,
  num_bands: int = 4,
  category_V=None,
  categories: Sequence[str] = ("reasoning", "template"),
  prefix: str = "cancel",
) -> dict[str, float]:
  """`residual_report`'s metrics from the host arrays of `residual_arrays`."""
  r_V, a_V, n_V = (np.asarray(dev[k], np.float64) for k in ("residual", "gross", "count"))
  abs_V = np.abs(r_V)
  total_abs, gross = abs_V.sum(), a_V.sum()
  group_abs = np.abs(np.asarray(dev["group"], np.float64)).sum()
  out = {
    f"{prefix}/net": r_V.sum(),
    f"{prefix}/abs_residual": total_abs,
    f"{prefix}/gross": gross,
    f"{prefix}/residual_ratio": _share(total_abs, gross),
    f"{prefix}/group_abs_residual": group_abs,
    f"{prefix}/group_residual_ratio": _share(group_abs, gross),
  }
  present = np.flatnonzero(n_V > 0)
  top = present[np.lexsort((present, -abs_V[present]))][:top_k]
  for j, v in enumerate(top):
    out[f"{prefix}/top{j}/id"] = int(v)
    out[f"{prefix}/top{j}/residual"] = r_V[v]
    out[f"{prefix}/top{j}/count"] = n_V[v]
  band_V = frequency_bands(n_V, num_bands=num_bands)
  for b in range(num_bands):
    in_b = band_V == b
    key = f"{prefix}/band{b}"
    out[f"{key}/abs_residual_share"] = _share(abs_V[in_b].sum(), total_abs)
    out[f"{key}/residual_ratio"] = _share(abs_V[in_b].sum(), a_V[in_b].sum())
    out[f"{key}/num_ids"] = int(in_b.sum())
    out[f"{key}/min_count"] = n_V[in_b].min() if in_b.any() else float("nan")
    out[f"{key}/max_count"] = n_V[in_b].max() if in_b.any() else float("nan")
  if category_V is not None:
    cat_V = np.asarray(category_V).astype(np.int64)
    for c, name in enumerate(categories):
      in_c = cat_V == c
      out[f"{prefix}/{name}/abs_residual_share"] = _share(abs_V[in_c].sum(), total_abs)
      out[f"{prefix}/{name}/residual_ratio"] = _share(abs_V[in_c].sum(), a_V[in_c].sum())
  return out


def compare_aggregations(
  names: Sequence[str],
  tokens_BT,
  adv_BT,
  mask_BT,
  group_ids_B,
  *,
  vocab_size: int,
  max_len: int | None = None,
  prefix: str = "cancel",
  **report_options,
) -> dict[str, dict[str, float]]:
  """{mode name: residual_report under that mode's weights} on one batch: one row of the
  table per aggregation mode, keys prefixed "{prefix}/{name}/" so the rows merge into one
  flat metrics dict (`{k: v for row in table.values() for k, v in row.items()}`)."""
  mask_BT = jnp.asarray(mask_BT)
  group_ids_B = jnp.asarray(group_ids_B, jnp.int32)
  adv_BT = jnp.asarray(adv_BT, jnp.float32)
  table = {}
  for name in names:
    w_BT = aggregation_weights(name, mask_BT, group_ids_B, adv_BT, max_len=max_len)
    table[name] = residual_report(
      tokens_BT,
      w_BT,
      adv_BT,
      mask_BT,
      group_ids_B,
      vocab_size=vocab_size,
      prefix=f"{prefix}/{name}",
      **report_options,
    )
  return table
