"""Coupling decomposition of Δlog π (arXiv 2605.08666, claims 2–3; RESEARCH.md §2.2).

One SGD step of size η on the loss L(θ) = −Σ_n c_n·log π_θ(y_n), with c_n = w_n·A_n (the
aggregation weight times the advantage, 0 off the loss mask; the on-policy policy-gradient
loss), moves every token's log-prob, to first order, by

  Δ_s ≈ ⟨∇log π(y_s), δθ⟩ = η Σ_n c_n K_{sn},   K_{sn} = ⟨∇_θ log π(y_s), ∇_θ log π(y_n)⟩
      = η c_s K_{ss}  (self term)  +  η Σ_{n≠s} c_n K_{sn}  (coupling terms).

This is the empirical-NTK "A·K·G" decomposition of Ren & Sutherland (arXiv 2407.10490),
restricted to a parameter block. For the LM-head block W [D, V] (logits z = h W, h the
final hidden state after the final norm, π = softmax(z)), ∇_W log π(y) = h (e_y − π)^T, so

  K_{sn} = ⟨e_{y_s} − π_s, e_{y_n} − π_n⟩ · ⟨h_s, h_n⟩
         = (1[y_s = y_n] − π_n(y_s) − π_s(y_n) + ⟨π_s, π_n⟩) · ⟨h_s, h_n⟩.

The first factor is ≈ 1 for the same token id predicted with low confidence at both
positions and ≈ 0 when either is confident or the ids differ: the paper's claim 3.

Tied embeddings: the output projection is the embedding E [V, D] (W = E^T), which is also
the input lookup. The "LM-head block" of a tied model is E *in its output use only*: the
same formula, with the input path held fixed. The autodiff gradient of the whole
embedding adds the input-lookup term, so it does not equal this block; with an untied
head (tie_embeddings=False) the block is the `lm_head` kernel and the two agree exactly.

h comes from the model itself: `lm_head_features` runs `layers.Decoder` with flax
`capture_intermediates` on the `final_norm` module, so the features are the ones the
logits were computed from (no re-implementation of the decoder).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import layers
from grpo_jax.models import model as model_lib

HI = jax.lax.Precision.HIGHEST
DEFAULT_CONF_EDGES = (0.0, 0.1, 0.5, 0.9, 1.0)
PAIR_KINDS = ("diff_id", "same_id")


# ----------------------------------------------------------------------------
# LM-head features.
# ----------------------------------------------------------------------------


def lm_head_weight(params, *, cfg: model_lib.ModelConfig):
  """W_DV, the output projection in float32: the lm_head kernel, or E^T when tied."""
  if cfg.tie_embeddings:
    return params["embed"]["embedding"].astype(jnp.float32).T
  return params["lm_head"]["kernel"].astype(jnp.float32)


def _is_final_norm(module, method_name):
  return module.name == "final_norm" and method_name == "__call__"


def lm_head_features(
  params, tokens_BS, positions_BS, *, cfg: model_lib.ModelConfig, logits_slice=None
):
  """(h_BTD, logits_BTV): the hidden state after the final norm, and the logits z = h W.

  Same arguments as `model.apply` without a cache; with `logits_slice=(start, stop)` only
  positions [start, stop) (T = stop − start). h is cast to float32. Jittable.
  """
  decoder = layers.Decoder(cfg, logits_slice=logits_slice)
  (logits_BTV, _), state = decoder.apply(
    {"params": params},
    tokens_BS,
    positions_BS,
    None,
    None,
    None,
    capture_intermediates=_is_final_norm,
    mutable=["intermediates"],
  )
  h_BTD = state["intermediates"]["final_norm"]["__call__"][0]
  return h_BTD.astype(jnp.float32), logits_BTV


def completion_features(
  params, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, *, cfg: model_lib.ModelConfig
):
  """(h_BTD, logits_BTV) at the T positions that predict the completion tokens o_{i,t}
  (the positions `logprobs.completion_logprobs` scores)."""
  P = prompt_tokens_BP.shape[1]
  tokens_BS = jnp.concatenate([prompt_tokens_BP, tokens_BT], axis=1)
  mask_BS = jnp.concatenate([prompt_mask_BP, mask_BT], axis=1)
  S = tokens_BS.shape[1]
  return lm_head_features(
    params,
    tokens_BS,
    model_lib.positions_from_mask(mask_BS),
    cfg=cfg,
    logits_slice=(P - 1, S - 1),
  )


def select_tokens(mask_BT, *, max_tokens: int, seed: int = 0):
  """(rows_S, cols_S, valid_S), S = max_tokens: a seeded uniform sample of valid positions
  without replacement, in row-major order, padded with (0, 0, False) when there are fewer.
  Fixed S keeps every jitted diagnostic at one shape. Host-side (numpy)."""
  rows, cols = np.nonzero(np.asarray(mask_BT))
  if len(rows) > max_tokens:
    keep = np.sort(np.random.default_rng(seed).choice(len(rows), max_tokens, replace=False))
    rows, cols = rows[keep], cols[keep]
  n = len(rows)
  pad = max_tokens - n
  valid = np.concatenate([np.ones(n, bool), np.zeros(pad, bool)])
  rows = np.concatenate([rows, np.zeros(pad, np.int64)]).astype(np.int32)
  cols = np.concatenate([cols, np.zeros(pad, np.int64)]).astype(np.int32)
  return rows, cols, valid


# ----------------------------------------------------------------------------
# Analytic LM-head kernel, update and first-order prediction.
# ----------------------------------------------------------------------------


def head_coupling(h_SD, probs_SV, y_S, h_ND, probs_NV, y_N):
  """K_SN = (1[y_s = y_n] − π_n(y_s) − π_s(y_n) + ⟨π_s, π_n⟩)·⟨h_s, h_n⟩. Jittable.

  The LM-head block of ⟨∇log π(y_s), ∇log π(y_n)⟩ (module docstring). Pass the same
  arrays twice for the square kernel of one token set.
  """
  same_SN = (y_S[:, None] == y_N[None, :]).astype(jnp.float32)
  pn_at_ys_SN = jnp.take(probs_NV, y_S, axis=1).T
  ps_at_yn_SN = jnp.take(probs_SV, y_N, axis=1)
  pp_SN = jnp.dot(probs_SV, probs_NV.T, precision=HI)
  hh_SN = jnp.dot(h_SD, h_ND.T, precision=HI)
  return (same_SN - pn_at_ys_SN - ps_at_yn_SN + pp_SN) * hh_SN


def head_update(h_ND, probs_NV, y_N, coef_N, *, lr):
  """δW_DV = −η ∇_W L = η Σ_n c_n h_n (e_{y_n} − π_n)^T: one SGD step of L = −Σ c log π on
  the LM-head block. Jittable."""
  hc_ND = h_ND * coef_N[:, None]
  onehot_DV = jax.ops.segment_sum(hc_ND, y_N, num_segments=probs_NV.shape[1]).T
  return lr * (onehot_DV - jnp.dot(hc_ND.T, probs_NV, precision=HI))


def delta_from_head_update(h_SD, probs_SV, y_S, dW_DV):
  """First-order Δlog π(y_s) from a change δW of the LM-head block (any optimizer):
  ⟨h_s (e_{y_s} − π_s)^T, δW⟩ = δz_s(y_s) − Σ_v π_s(v) δz_s(v), δz_s = h_s δW. Jittable."""
  dz_SV = jnp.dot(h_SD, dW_DV, precision=HI)
  picked_S = jnp.take_along_axis(dz_SV, y_S[:, None], axis=1)[:, 0]
  return picked_S - jnp.sum(probs_SV * dz_SV, axis=1)


def first_order_terms(K_SN, coef_N, is_self_SN, *, lr):
  """{"total": η Σ_n c_n K_sn, "self": η c_s K_ss, "coupling": total − self}, each [S]."""
  contrib_SN = lr * coef_N[None, :] * K_SN
  total_S = jnp.sum(contrib_SN, axis=1)
  self_S = jnp.sum(jnp.where(is_self_SN, contrib_SN, 0.0), axis=1)
  return {"total": total_S, "self": self_S, "coupling": total_S - self_S}


def confidence_bins(conf, *, edges: Sequence[float] = DEFAULT_CONF_EDGES):
  """Bin index in [0, len(edges) − 1) of π(y): bin b holds edges[b] <= π < edges[b + 1]
  (the last bin includes 1)."""
  inner = jnp.asarray(edges[1:-1], jnp.float32)
  return jnp.searchsorted(inner, conf, side="right").astype(jnp.int32)


def coupling_table(
  K_SN,
  coef_N,
  *,
  y_S,
  y_N,
  conf_S,
  conf_N,
  is_self_SN,
  valid_S,
  valid_N,
  lr,
  edges: Sequence[float] = DEFAULT_CONF_EDGES,
):
  """Coupling mass over non-self pairs (s, n) by (same id?, target bin, source bin).

  With C_sn = η c_n K_sn (source n's first-order effect on target s), returns arrays
  [2, nb, nb] indexed (diff_id = 0 / same_id = 1, bin of π_s(y_s), bin of π_n(y_n)):
  abs_mass Σ|C_sn|, sum_k Σ K_sn and pairs (counts). Jittable.
  """
  nb = len(edges) - 1
  pair_SN = valid_S[:, None] & valid_N[None, :] & ~is_self_SN
  same_SN = (y_S[:, None] == y_N[None, :]).astype(jnp.int32)
  bin_S, bin_N = confidence_bins(conf_S, edges=edges), confidence_bins(conf_N, edges=edges)
  idx_SN = same_SN * (nb * nb) + bin_S[:, None] * nb + bin_N[None, :]
  f = pair_SN.astype(jnp.float32)
  seg = lambda x_SN: jax.ops.segment_sum(
    (x_SN * f).reshape(-1), idx_SN.reshape(-1), num_segments=2 * nb * nb
  ).reshape(2, nb, nb)
  return {
    "abs_mass": seg(jnp.abs(lr * coef_N[None, :] * K_SN)),
    "sum_k": seg(K_SN),
    "pairs": seg(jnp.ones_like(K_SN)),
  }


def fit_stats(pred_S, measured_S, valid_S):
  """How well predicted Δ explains measured Δ over valid targets. Jittable.

  corr: Pearson correlation; slope, intercept: least squares measured ≈ slope·pred +
  intercept (1 and 0 for an exact first-order prediction); r2 = corr²; rel_err =
  ‖pred − measured‖₂ / ‖measured‖₂.
  """
  m = valid_S.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  mx, my = jnp.sum(m * pred_S) / n, jnp.sum(m * measured_S) / n
  dx, dy = (pred_S - mx) * m, (measured_S - my) * m
  vx, vy, cov = jnp.sum(dx * dx) / n, jnp.sum(dy * dy) / n, jnp.sum(dx * dy) / n
  corr = cov / jnp.sqrt(jnp.maximum(vx * vy, 1e-30))
  slope = cov / jnp.maximum(vx, 1e-30)
  rel = jnp.sqrt(
    jnp.sum(m * (pred_S - measured_S) ** 2) / jnp.maximum(jnp.sum(m * measured_S**2), 1e-30)
  )
  return {
    "corr": corr,
    "slope": slope,
    "intercept": my - slope * mx,
    "r2": corr * corr,
    "rel_err": rel,
  }


# ----------------------------------------------------------------------------
# The LM-head probe: features -> kernel -> first-order terms (one jittable function).
# ----------------------------------------------------------------------------


def lm_head_probe(
  params,
  prompt_tokens_BP,
  prompt_mask_BP,
  tokens_BT,
  mask_BT,
  coef_BT,
  rows_S,
  cols_S,
  *,
  cfg: model_lib.ModelConfig,
  lr,
  source_chunk: int | None = None,
):
  """Everything the coupling report needs, for targets (rows_S, cols_S) and all N = B·T
  sources (c = 0 off the mask). Jittable with cfg and source_chunk static.

  Only h [B, T, D] comes from the model (the decoder's own logits are unused and XLA drops
  them); π = softmax(h W) is recomputed in float32 from h and `lm_head_weight`, for the
  targets and then for `source_chunk` sources at a time (dividing N; None: all), so
  memory is S·N for K plus source_chunk·V, never N·V: a real vocabulary fits.

  Returns a dict of arrays: K_SN, is_self_SN, total_S / self_S / coupling_S (the
  first-order terms), h_SD, probs_SV, y_S, y_N, conf_S, conf_N (π(y)), valid_N, coef_N,
  and dW_DV (`head_update`: the SGD step on the head block).
  """
  B, T = tokens_BT.shape
  h_BTD, _ = completion_features(
    params, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, cfg=cfg
  )
  W_DV = lm_head_weight(params, cfg=cfg)
  N, D = B * T, h_BTD.shape[-1]
  h_ND, y_N, valid_N = h_BTD.reshape(N, D), tokens_BT.reshape(N), mask_BT.reshape(N)
  coef_N = jnp.where(valid_N, coef_BT.reshape(N), 0.0)
  idx_S = rows_S * T + cols_S
  h_SD, y_S = h_ND[idx_S], y_N[idx_S]
  probs_SV = jax.nn.softmax(jnp.dot(h_SD, W_DV, precision=HI), axis=-1)
  c = source_chunk or N
  if N % c:
    raise ValueError(f"source_chunk={source_chunk} must divide the B·T = {N} sources.")

  def body(dW_DV, chunk):
    h_cD, y_c, coef_c = chunk
    probs_cV = jax.nn.softmax(jnp.dot(h_cD, W_DV, precision=HI), axis=-1)
    K_Sc = head_coupling(h_SD, probs_SV, y_S, h_cD, probs_cV, y_c)
    conf_c = jnp.take_along_axis(probs_cV, y_c[:, None], axis=1)[:, 0]
    return dW_DV + head_update(h_cD, probs_cV, y_c, coef_c, lr=lr), (K_Sc, conf_c)

  chunks = (h_ND.reshape(N // c, c, D), y_N.reshape(N // c, c), coef_N.reshape(N // c, c))
  dW_DV, (K_CSc, conf_Cc) = jax.lax.scan(body, jnp.zeros_like(W_DV), chunks)
  K_SN = jnp.transpose(K_CSc, (1, 0, 2)).reshape(-1, N)
  is_self_SN = idx_S[:, None] == jnp.arange(N)[None, :]
  terms = first_order_terms(K_SN, coef_N, is_self_SN, lr=lr)
  conf_N = conf_Cc.reshape(N)
  return {
    "K_SN": K_SN,
    "is_self_SN": is_self_SN,
    "total_S": terms["total"],
    "self_S": terms["self"],
    "coupling_S": terms["coupling"],
    "h_SD": h_SD,
    "probs_SV": probs_SV,
    "y_S": y_S,
    "y_N": y_N,
    "conf_S": conf_N[idx_S],
    "conf_N": conf_N,
    "valid_N": valid_N,
    "coef_N": coef_N,
    "dW_DV": dW_DV,
  }


def _bin_label(lo, hi):
  return f"p{lo:g}-{hi:g}"


def coupling_report(
  probe: dict,
  measured_S,
  valid_S,
  *,
  lr,
  edges: Sequence[float] = DEFAULT_CONF_EDGES,
  prefix: str = "coupling",
) -> dict[str, float]:
  """Flat metrics from `lm_head_probe` output and the measured Δlog π of the targets.

  Keys (all over valid targets s and non-self sources n):
    {prefix}/fit/{corr,slope,intercept,r2,rel_err}   total first-order prediction vs measured
    {prefix}/self_fit/{...}                          the self term alone vs measured
    {prefix}/self_abs_mean, coupling_abs_mean        mean |self_s|, |coupling_s|
    {prefix}/self_share                              Σ|self| / (Σ|self| + Σ|coupling|)
    {prefix}/self_sign_agree                         frac. with sign(self_s) = sign(measured_s)
    {prefix}/{same_id,diff_id}/abs_share             Σ|C_sn| share of the pair kind
    {prefix}/{same_id,diff_id}/mean_k, pairs         mean K_sn and the pair count
    {prefix}/{kind}/{target bin}/{source bin}/{abs_share,mean_k}   by π(y) bins, e.g.
                                                     coupling/same_id/p0-0.1/p0-0.1/mean_k
  """
  valid_S = jnp.asarray(valid_S)
  measured_S = jnp.asarray(measured_S, jnp.float32)
  got = jax.device_get(coupling_arrays(probe, measured_S, valid_S, lr=lr, edges=edges))
  return coupling_summary(got, valid_S, measured_S, edges=edges, prefix=prefix)


def coupling_arrays(
  probe: dict, measured_S, valid_S, *, lr, edges: Sequence[float] = DEFAULT_CONF_EDGES
) -> dict:
  """The arrays `coupling_summary` reads: fit stats of the total and self terms, the
  `coupling_table`, and the self / coupling terms. Jittable (edges static)."""
  fit = fit_stats(probe["total_S"], measured_S, valid_S)
  self_fit = fit_stats(probe["self_S"], measured_S, valid_S)
  table = coupling_table(
    probe["K_SN"],
    probe["coef_N"],
    y_S=probe["y_S"],
    y_N=probe["y_N"],
    conf_S=probe["conf_S"],
    conf_N=probe["conf_N"],
    is_self_SN=probe["is_self_SN"],
    valid_S=valid_S,
    valid_N=probe["valid_N"],
    lr=lr,
    edges=edges,
  )
  return {
    "fit": fit,
    "self_fit": self_fit,
    "table": table,
    "self": probe["self_S"],
    "coupling": probe["coupling_S"],
  }


def coupling_summary(
  got: dict,
  valid_S,
  measured_S,
  *,
  edges: Sequence[float] = DEFAULT_CONF_EDGES,
  prefix: str = "coupling",
) -> dict[str, float]:
  """`coupling_report`'s metrics from the host arrays of `coupling_arrays`."""
  v = np.asarray(valid_S)
  out = {}
  for name in ("fit", "self_fit"):
    for k, x in got[name].items():
      out[f"{prefix}/{name}/{k}"] = float(x)
  self_abs, coup_abs = np.abs(got["self"][v]), np.abs(got["coupling"][v])
  meas = np.asarray(measured_S)[v]
  out[f"{prefix}/self_abs_mean"] = float(self_abs.mean()) if v.any() else float("nan")
  out[f"{prefix}/coupling_abs_mean"] = float(coup_abs.mean()) if v.any() else float("nan")
  denom = self_abs.sum() + coup_abs.sum()
  out[f"{prefix}/self_share"] = float(self_abs.sum() / denom) if denom > 0 else float("nan")
  agree = np.sign(got["self"][v]) == np.sign(meas)
  out[f"{prefix}/self_sign_agree"] = float(agree.mean()) if v.any() else float("nan")
  t = {k: np.asarray(x, np.float64) for k, x in got["table"].items()}
  total_abs = t["abs_mass"].sum()
  labels = [_bin_label(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
  nan = float("nan")
  for kind_i, kind in enumerate(PAIR_KINDS):
    mass, sk, pairs = t["abs_mass"][kind_i], t["sum_k"][kind_i], t["pairs"][kind_i]
    out[f"{prefix}/{kind}/abs_share"] = mass.sum() / total_abs if total_abs > 0 else nan
    out[f"{prefix}/{kind}/mean_k"] = sk.sum() / pairs.sum() if pairs.sum() else nan
    out[f"{prefix}/{kind}/pairs"] = pairs.sum()
    for a, la in enumerate(labels):
      for b, lb in enumerate(labels):
        key = f"{prefix}/{kind}/{la}/{lb}"
        out[f"{key}/abs_share"] = mass[a, b] / total_abs if total_abs > 0 else nan
        out[f"{key}/mean_k"] = sk[a, b] / pairs[a, b] if pairs[a, b] else nan
  return out
