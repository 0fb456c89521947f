"""Claims 1-4, 2b and 7: what the diagnostics of a GRPO run show (token flips, coupling
and its per-pair kernel, the template share of updates against positive-only training, the
MC value of boosted tokens) and the effective rank of a group's per-rollout gradients.
claims.py holds their rules and re-exports every name here as claims.<name>."""

from __future__ import annotations

import evidence
import numpy as np
from claims_base import FULL_DIAG, LIGHT_DIAG, _bar, _fig, _paired, _per_seed, _v
from evidence import Arm, Outcome

# ----------------------------------------------------------------------------
# Arms.
# ----------------------------------------------------------------------------

GRPO = Arm("grpo", diagnostics=FULL_DIAG)
POSITIVE_ONLY = Arm(
  "positive_only", overrides=(("rl.token_masks", ("positive_only",)),), diagnostics=LIGHT_DIAG
)
RANK_DIAG = (("rank", True), ("probe_prompts", 1))
RANK = {
  G: Arm(
    f"rank_g{G}",
    overrides=(("sampler.group_size", G), ("prompts_per_step", 128 // G)),
    diagnostics=RANK_DIAG,
  )
  for G in (2, 4, 8)
}


# ----------------------------------------------------------------------------
# 1. Token flipping.
# ----------------------------------------------------------------------------


def _boosted_share(pol: str):
  def fn(records):
    b = evidence.diag_mean(records, f"flip/{pol}/all/boosted")
    s = evidence.diag_mean(records, f"flip/{pol}/all/suppressed")
    return None if b is None or s is None or b + s == 0 else b / (b + s)

  return fn


def analyse_flips(runs) -> Outcome:
  pos, neg = (
    _per_seed(runs, GRPO, _boosted_share("pos")),
    _per_seed(runs, GRPO, _boosted_share("neg")),
  )
  figs = {
    "boosted_share_pos": _fig("boosted share of moved tokens, positive rollouts", pos),
    "boosted_share_neg": _fig("boosted share of moved tokens, negative rollouts", neg),
    "boosted_share_gap": _fig("gap (positive − negative)", _paired(pos, neg)),
  }
  for pol in ("pos", "neg"):
    for state in ("boosted", "suppressed"):
      key = f"flip/{pol}/all/{state}"
      figs[key] = _fig(
        f"{state} fraction, {pol}",
        _per_seed(runs, GRPO, lambda r, k=key: evidence.diag_mean(r, k)),
      )
  gap = evidence.within(figs["boosted_share_gap"], -0.15, 0.15)
  verdict = evidence.combine([gap])
  g = figs["boosted_share_gap"]
  reason = (
    f"Of the tokens whose log-prob moved by more than τ, {_v(figs['boosted_share_pos'], '.0%')} were "
    f"boosted in positive rollouts and {_v(figs['boosted_share_neg'], '.0%')} in negative ones "
    f"(gap {_v(g, '+.2f')}, CI [{_v(g, '+.2f', 0)}, {_v(g, '+.2f', 1)}])."
  )

  def plot(ax):
    _bar(ax, figs, ["boosted_share_pos", "boosted_share_neg", "boosted_share_gap"])

  return Outcome(figs, verdict, reason, "boosted_share_gap", plot)


# ----------------------------------------------------------------------------
# 2. Coupling.
# ----------------------------------------------------------------------------

LOW, HIGH = ("p0-0.1", "p0.1-0.5"), ("p0.9-1",)


def _bins_mean_k(records, kind, bins):
  keys = [f"coupling/{kind}/{a}/{b}/mean_k" for a in bins for b in bins]
  xs = [evidence.diag_mean(records, k) for k in keys]
  xs = [x for x in xs if x is not None]
  return float(np.mean(xs)) if xs else None


def _same_id_concentration(records):
  share = evidence.diag_mean(records, "coupling/same_id/abs_share")
  same = evidence.diag_mean(records, "coupling/same_id/pairs")
  diff = evidence.diag_mean(records, "coupling/diff_id/pairs")
  if None in (share, same, diff) or same == 0:
    return None
  return share / (same / (same + diff))


def _low_confidence_share(records):
  """Mean over diagnostic iterations of: the share of same-id coupling mass from pairs
  whose target and source both have π(y) < 0.5."""
  shares = []
  for r in records:
    total = r.get("coupling/same_id/abs_share")
    cells = [r.get(f"coupling/same_id/{a}/{b}/abs_share") for a in LOW for b in LOW]
    if not isinstance(total, int | float) or not np.isfinite(total) or total <= 0:
      continue
    low = sum(c for c in cells if isinstance(c, int | float) and np.isfinite(c))
    shares.append(low / total)
  return float(np.mean(shares)) if shares else None


def analyse_coupling(runs) -> Outcome:
  def get(k):
    return _per_seed(runs, GRPO, lambda r: evidence.diag_mean(r, k))

  fit, self_fit, self_share = (
    get("coupling/fit/corr"),
    get("coupling/self_fit/corr"),
    get("coupling/self_share"),
  )
  figs = {
    "coupling_share": _fig(
      "coupling share of first-order |Δ| (1 − self_share)",
      [None if x is None else 1 - x for x in self_share],
    ),
    "fit_corr": _fig("corr(first-order prediction, measured Δ)", fit),
    "fit_gain": _fig("corr gain of self+coupling over self alone", _paired(fit, self_fit)),
    "same_id_concentration": _fig(
      "same-id coupling mass ÷ same-id pair share", _per_seed(runs, GRPO, _same_id_concentration)
    ),
    "low_confidence_share": _fig(
      "share of same-id coupling mass with both π < 0.5",
      _per_seed(runs, GRPO, _low_confidence_share),
    ),
    "mean_k_same_low": _fig(
      "same-id mean K, both π < 0.5",
      _per_seed(runs, GRPO, lambda r: _bins_mean_k(r, "same_id", LOW)),
    ),
    "mean_k_same_high": _fig(
      "same-id mean K, both π ≥ 0.9",
      _per_seed(runs, GRPO, lambda r: _bins_mean_k(r, "same_id", HIGH)),
    ),
    "head_update_corr": _fig(
      "corr(actual LM-head change's effect, measured Δ)", get("coupling/head_update_fit/corr")
    ),
  }
  parts = {
    "coupling non-negligible (share > 0.1)": evidence.above(figs["coupling_share"], 0.1),
    "coupling improves the prediction (gain > 0)": evidence.above(figs["fit_gain"], 0.0),
    "concentrated on identical tokens (> 1)": evidence.above(figs["same_id_concentration"], 1.0),
    "mostly between low-confidence tokens (share > 0.5)": evidence.above(
      figs["low_confidence_share"], 0.5
    ),
  }
  verdict = evidence.combine(list(parts.values()))
  reason = "; ".join(f"{k}: {v}" for k, v in parts.items()) + "."

  def plot(ax):
    _bar(ax, figs, list(figs))

  return Outcome(figs, verdict, reason, "same_id_concentration", plot)


# ----------------------------------------------------------------------------
# 2b. The per-pair coupling kernel by confidence bin.
# ----------------------------------------------------------------------------


def _cells_mean_k(records, kind, targets, sources):
  """Mean over the (target bin, source bin) cells that hold pairs of their mean K_sn, each
  cell first averaged over the diagnostic iterations."""
  keys = [f"coupling/{kind}/{a}/{b}/mean_k" for a in targets for b in sources]
  xs = [evidence.diag_mean(records, k) for k in keys]
  xs = [x for x in xs if x is not None]
  return float(np.mean(xs)) if xs else None


def analyse_coupling_kernel(runs) -> Outcome:
  def k(kind, targets, sources):
    return _per_seed(runs, GRPO, lambda r: _cells_mean_k(r, kind, targets, sources))

  same_low, diff_low = k("same_id", LOW, LOW), k("diff_id", LOW, LOW)
  mixed = [
    None if a is None or b is None else (a + b) / 2
    for a, b in zip(k("same_id", LOW, HIGH), k("same_id", HIGH, LOW), strict=True)
  ]
  same_high = k("same_id", HIGH, HIGH)
  figs = {
    "k_same_low": _fig("same-id mean K, both π < 0.5", same_low),
    "k_diff_low": _fig("different-id mean K, both π < 0.5", diff_low),
    "k_same_mixed": _fig("same-id mean K, one π < 0.5 and one π ≥ 0.9", mixed),
    "k_same_high": _fig("same-id mean K, both π ≥ 0.9", same_high),
    "identity_gap": _fig(
      "same-id − different-id mean K, both π < 0.5", _paired(same_low, diff_low)
    ),
    "both_low_gap": _fig(
      "same-id mean K: both π < 0.5 − one of them ≥ 0.9", _paired(same_low, mixed)
    ),
    "low_high_gap": _fig("same-id mean K: both π < 0.5 − both ≥ 0.9", _paired(same_low, same_high)),
  }
  parts = {
    "identical ids": evidence.above(figs["identity_gap"], 0.0),
    "both low (vs one high)": evidence.above(figs["both_low_gap"], 0.0),
    "low (vs both high)": evidence.above(figs["low_high_gap"], 0.0),
  }
  verdict = evidence.combine(list(parts.values()))
  reason = (
    f"Per pair, the LM-head kernel of two low-confidence predictions of one id averages "
    f"{_v(figs['k_same_low'], '.3g')}, against {_v(figs['k_diff_low'], '.3g')} for different "
    f"ids, {_v(figs['k_same_mixed'], '.3g')} when one is confident and "
    f"{_v(figs['k_same_high'], '.3g')} when both are; CI of each gap above 0: "
    + ", ".join(f"{k_} {v}" for k_, v in parts.items())
    + "."
  )

  def plot(ax):
    _bar(ax, figs, ["identity_gap", "both_low_gap", "low_high_gap"])

  return Outcome(figs, verdict, reason, "identity_gap", plot)


# ----------------------------------------------------------------------------
# 3. Positive-only vs GRPO: template vs reasoning share of |Δ log p|.
# ----------------------------------------------------------------------------


def analyse_template_shift(runs) -> Outcome:
  key = "flip/all/template/abs_delta_share"
  g = _per_seed(runs, GRPO, lambda r: evidence.diag_mean(r, key))
  p = _per_seed(runs, POSITIVE_ONLY, lambda r: evidence.diag_mean(r, key))
  figs = {
    "template_share_grpo": _fig("template share of Σ|Δ log p|, GRPO", g),
    "template_share_positive_only": _fig("template share of Σ|Δ log p|, positive-only", p),
    "template_share_shift": _fig("shift (GRPO − positive-only)", _paired(g, p)),
  }
  verdict = evidence.combine([evidence.below(figs["template_share_shift"], 0.0)])
  s = figs["template_share_shift"]
  reason = (
    f"GRPO puts {_v(figs['template_share_grpo'], '.1%')} of |Δ log p| on template tokens, "
    f"positive-only training {_v(figs['template_share_positive_only'], '.1%')} (shift "
    f"{_v(s, '+.3f')}, CI [{_v(s, '+.3f', 0)}, {_v(s, '+.3f', 1)}])."
  )

  def plot(ax):
    _bar(ax, figs, list(figs))

  return Outcome(figs, verdict, reason, "template_share_shift", plot)


# ----------------------------------------------------------------------------
# 4. Boosted tokens have higher MC value, in both polarities.
# ----------------------------------------------------------------------------


def analyse_value(runs) -> Outcome:
  figs = {}
  for pol in ("pos", "neg"):
    for what in ("value_gap", "gain_gap"):
      key = f"value/{pol}/{what}"
      figs[f"{what}_{pol}"] = _fig(
        f"{'value' if what == 'value_gap' else 'gain'} boosted − suppressed, {pol}",
        _per_seed(runs, GRPO, lambda r, k=key: evidence.diag_mean(r, k)),
      )
  parts = [evidence.above(figs[f"value_gap_{pol}"], 0.0) for pol in ("pos", "neg")]
  verdict = evidence.combine(parts)
  reason = (
    f"MC value V(q, o_≤t) at boosted minus suppressed tokens: positive rollouts "
    f"{_v(figs['value_gap_pos'], '+.3f')}, negative {_v(figs['value_gap_neg'], '+.3f')} "
    f"(CI above 0: {parts[0]}, {parts[1]})."
  )

  def plot(ax):
    _bar(ax, figs, list(figs))

  return Outcome(figs, verdict, reason, "value_gap_neg", plot)


# ----------------------------------------------------------------------------
# 7. Effective rank ≈ 2 for G ∈ {2, 4, 8}; sparsity over training.
# ----------------------------------------------------------------------------

RANK_KEY = "rank/rollout_grads/last_block"


def _rank_mean(metric):
  def fn(records):
    def num(r, k):  # logs.py writes non-finite values as strings: not numbers here.
      x = r.get(k)
      return float(x) if isinstance(x, int | float) and np.isfinite(x) else None

    xs = [
      num(r, f"{RANK_KEY}/{metric}")
      for r in records
      if (num(r, f"{RANK_KEY}/fro") or 0.0) > 0 and num(r, f"{RANK_KEY}/{metric}") is not None
    ]
    return float(np.mean(xs)) if xs else None

  return fn


def analyse_rank(runs) -> Outcome:
  figs, parts = {}, []
  for G, arm in RANK.items():
    for metric in ("entropy_rank", "stable_rank", "energy_rank_90"):
      figs[f"{metric}_g{G}"] = _fig(f"{metric}, G = {G}", _per_seed(runs, arm, _rank_mean(metric)))
      if G > 2:  # With G = 2 rows the rank is at most 2 whatever happens.
        parts.append(evidence.within(figs[f"{metric}_g{G}"], 1.0, 3.0))
    figs[f"zero_var_slope_g{G}"] = _fig(
      f"slope of zero-variance group fraction per iteration, G = {G}",
      _per_seed(runs, arm, lambda r: evidence.slope(r, "zero_var_groups")),
    )
  verdict = evidence.combine(parts)
  reason = (
    "Per-rollout gradient matrix of one group's G rollouts (last block, projected): "
    + ", ".join(f"G={G} entropy rank {_v(figs[f'entropy_rank_g{G}'], '.2f')}" for G in RANK)
    + f"; every rank CI inside [1, 3] for G = 4, 8: {verdict == 'supports'}."
  )

  def plot(ax):
    _bar(
      ax,
      figs,
      [f"{m}_g{G}" for G in RANK for m in ("entropy_rank", "stable_rank", "energy_rank_90")],
    )

  return Outcome(figs, verdict, reason, "entropy_rank_g8", plot)
