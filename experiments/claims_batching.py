"""Claims 5, 6, 7b, 9 and 9b: how a batch is split and its advantages formed (query-preserved
and reward-balanced mini-batches, the exchangeability breakers, the optimal baselines'
gradient variance, single-rollout training and the negative-token filter).
claims.py holds their rules and re-exports every name here as claims.<name>."""

from __future__ import annotations

import evidence
from claims_base import (
  LIGHT_DIAG,
  _bar,
  _fig,
  _final_acc,
  _late_mean,
  _measured,
  _paired,
  _per_seed,
  _ratios,
  _v,
)
from evidence import Arm, Outcome

# ----------------------------------------------------------------------------
# Arms.
# ----------------------------------------------------------------------------

MINIBATCHES = (("rl.num_minibatches", 4),)
GRPO_PLAIN = Arm("grpo_plain")
MB = {
  planner: Arm(
    f"mb_{planner}", overrides=(*MINIBATCHES, ("rl.planner", planner)), diagnostics=LIGHT_DIAG
  )
  for planner in ("random", "query_preserved", "reward_balanced")
}
_SHARED = (*MINIBATCHES, ("rl.aggregation", "group_token_mean"), ("rl.planner", "query_preserved"))
BREAKERS = {
  "shared": Arm("xb_shared", overrides=_SHARED, diagnostics=LIGHT_DIAG),
  "length_norm": Arm(
    "xb_length_norm",
    overrides=(*_SHARED, ("rl.aggregation", "seq_mean_token_mean")),
    diagnostics=LIGHT_DIAG,
  ),
  "asym_clip": Arm(
    "xb_asym_clip", overrides=(*_SHARED, ("rl.loss_hyper.eps_high", 0.28)), diagnostics=LIGHT_DIAG
  ),
  "split": Arm("xb_split", overrides=(*_SHARED, ("rl.planner", "random")), diagnostics=LIGHT_DIAG),
}
_G1 = (("sampler.group_size", 1), ("prompts_per_step", 128), ("rl.advantage", "batch_mean_std"))
_FILTER = ("rl.token_masks", ("negative_token_filter",))
SINGLE = {
  # The single-rollout remedy of configs/remedies.py: 'prob' and 'batch_shared'.
  "filter": Arm(
    "g1_filter_shared",
    overrides=(
      *_G1,
      _FILTER,
      ("rl.mask_options", {"negative_token_filter": {"criteria": ("prob", "batch_shared")}}),
    ),
  ),
  "filter_prob": Arm(
    "g1_filter",
    overrides=(
      *_G1,
      _FILTER,
      ("rl.mask_options", {"negative_token_filter": {"criteria": ("prob",)}}),
    ),
  ),
  "plain": Arm("g1_plain", overrides=_G1),
}


# ----------------------------------------------------------------------------
# 5. Query-preserved and reward-balanced mini-batching vs random splits.
# ----------------------------------------------------------------------------


def _drift_change(records):
  a = evidence.first(records, "drift/solution_logp_token")
  b = evidence.last(records, "drift/solution_logp_token")
  return None if a is None or b is None else b - a


def _arm_figs(runs, arms: dict) -> dict:
  figs = {}
  for name, arm in arms.items():
    figs[f"accuracy_{name}"] = _fig(
      f"final greedy accuracy, {name}", _per_seed(runs, arm, _final_acc)
    )
    figs[f"entropy_{name}"] = _fig(
      f"rollout entropy (last third), {name}", _per_seed(runs, arm, _late_mean("rollout_entropy"))
    )
    figs[f"drift_{name}"] = _fig(
      f"Δ reference-solution log p/token, {name}", _per_seed(runs, arm, _drift_change)
    )
    figs[f"residual_{name}"] = _fig(
      f"group residual ratio (clipped weights), {name}",
      _per_seed(runs, arm, lambda r: evidence.diag_mean(r, "cancel/clipped/group_residual_ratio")),
    )
    figs[f"tax_{name}"] = _fig(
      f"learning tax, {name}",
      _per_seed(runs, arm, lambda r: evidence.diag_mean(r, "tax/learning_tax")),
    )
  return figs


def analyse_minibatching(runs) -> Outcome:
  figs = _arm_figs(runs, MB)
  base = _per_seed(runs, MB["random"], _final_acc)
  parts = []
  for name in ("query_preserved", "reward_balanced"):
    d = _paired(_per_seed(runs, MB[name], _final_acc), base)
    figs[f"accuracy_gain_{name}"] = _fig(f"accuracy − random split, {name}", d)
    parts.append(evidence.above(figs[f"accuracy_gain_{name}"], 0.0))
  verdict = evidence.combine(parts)
  reason = (
    f"With 4 mini-batches per rollout batch, final accuracy minus the random split: "
    f"query-preserved {_v(figs['accuracy_gain_query_preserved'], '+.3f')}, reward-balanced "
    f"{_v(figs['accuracy_gain_reward_balanced'], '+.3f')} (CI above 0: {parts[0]}, {parts[1]})."
  )

  def plot(ax):
    _bar(
      ax,
      figs,
      [f"accuracy_{n}" for n in MB]
      + [f"accuracy_gain_{n}" for n in ("query_preserved", "reward_balanced")],
    )

  return Outcome(figs, verdict, reason, "accuracy_gain_query_preserved", plot)


# ----------------------------------------------------------------------------
# 6. Exchangeability breakers vs the group-shared normaliser.
# ----------------------------------------------------------------------------


def analyse_breakers(runs) -> Outcome:
  figs = _arm_figs(runs, BREAKERS)
  parts = {}
  base_tax = _per_seed(
    runs, BREAKERS["shared"], lambda r: evidence.diag_mean(r, "tax/learning_tax")
  )
  base_drift = _per_seed(runs, BREAKERS["shared"], _drift_change)
  for name in ("length_norm", "asym_clip", "split"):
    arm = BREAKERS[name]
    tax = _per_seed(runs, arm, lambda r: evidence.diag_mean(r, "tax/learning_tax"))
    figs[f"tax_excess_{name}"] = _fig(
      f"learning tax − shared normaliser, {name}", _paired(tax, base_tax)
    )
    figs[f"drift_excess_{name}"] = _fig(
      f"drift − shared normaliser, {name}", _paired(_per_seed(runs, arm, _drift_change), base_drift)
    )
    parts[name] = evidence.above(figs[f"tax_excess_{name}"], 0.0)
  verdict = evidence.combine(list(parts.values()))
  reason = (
    "Learning tax above the group-shared normaliser's (CI above 0): "
    + ", ".join(f"{k} {v} ({_v(figs[f'tax_excess_{k}'], '+.4f')})" for k, v in parts.items())
    + "."
  )

  def plot(ax):
    _bar(ax, figs, [f"tax_excess_{n}" for n in parts] + [f"drift_excess_{n}" for n in parts])

  return Outcome(figs, verdict, reason, "tax_excess_length_norm", plot)


# ----------------------------------------------------------------------------
# 7b. Baselines: gradient variance of the Weaver–Tao and per-token optimal baselines.
# ----------------------------------------------------------------------------


def measure_baselines(*, seeds, root, quick) -> list[dict]:
  """baseline_variance.measure per seed, cached."""
  return _measured("baseline_variance", "baselines", seeds=seeds, root=root, quick=quick, full={})


def analyse_baselines(per_seed: list[dict]) -> Outcome:
  def ratio(name, what):
    return _ratios(per_seed, name, "group_mean", what)

  figs = {
    "variance_ratio_weaver_tao": _fig(
      "gradient variance, Weaver–Tao ÷ group mean", ratio("weaver_tao", "variance")
    ),
    "variance_ratio_per_token": _fig(
      "gradient variance, per-token ÷ group mean", ratio("per_token", "variance")
    ),
    "signal_ratio_weaver_tao": _fig(
      "‖mean gradient‖², Weaver–Tao ÷ group mean", ratio("weaver_tao", "signal")
    ),
    "signal_ratio_per_token": _fig(
      "‖mean gradient‖², per-token ÷ group mean", ratio("per_token", "signal")
    ),
    "pass_rate": _fig("pass rate of the sampled groups", [r["pass_rate"] for r in per_seed]),
  }
  parts = [
    evidence.below(figs[k], 1.0) for k in ("variance_ratio_weaver_tao", "variance_ratio_per_token")
  ]
  verdict = evidence.combine(parts)
  reason = (
    f"On the same rollouts of the warm-started policy, the Weaver–Tao baseline leaves "
    f"{_v(figs['variance_ratio_weaver_tao'], '.2f')}× the group mean's gradient variance and "
    f"the per-token baseline {_v(figs['variance_ratio_per_token'], '.2f')}× (CI below 1: "
    f"{parts[0]}, {parts[1]})."
  )

  def plot(ax):
    _bar(ax, figs, list(figs)[:4])
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--")

  return Outcome(figs, verdict, reason, "variance_ratio_weaver_tao", plot)


# ----------------------------------------------------------------------------
# 9. Single-rollout training with negative-token filtering vs GRPO at G = 8.
# ----------------------------------------------------------------------------


def analyse_single(runs) -> Outcome:
  acc = {n: _per_seed(runs, a, _final_acc) for n, a in (("grpo_g8", GRPO_PLAIN), *SINGLE.items())}
  figs = {f"accuracy_{n}": _fig(f"final greedy accuracy, {n}", v) for n, v in acc.items()}
  figs["gap_filter"] = _fig(
    "G=1 filtered (prob + batch_shared) − GRPO G=8", _paired(acc["filter"], acc["grpo_g8"])
  )
  figs["gap_filter_prob"] = _fig(
    "G=1 filtered (prob only) − GRPO G=8", _paired(acc["filter_prob"], acc["grpo_g8"])
  )
  figs["gap_plain"] = _fig("G=1 unfiltered − GRPO G=8", _paired(acc["plain"], acc["grpo_g8"]))
  figs["filter_gain"] = _fig("G=1 filtered − unfiltered", _paired(acc["filter"], acc["plain"]))
  figs["masked_frac"] = _fig(
    "masked fraction of tokens (filter)",
    _per_seed(runs, SINGLE["filter"], _late_mean("masked_frac/negative_token_filter", frac=1.0)),
  )
  comparable = evidence.above(figs["gap_filter"], -0.05)
  verdict = evidence.combine([comparable])
  reason = (
    f"At 128 rollouts per iteration, G = 1 with the 'prob' + 'batch_shared' filter ends "
    f"{_v(figs['gap_filter'], '+.3f')} from GRPO G = 8 (CI above −0.05: {comparable}); "
    f"'prob' alone {_v(figs['gap_filter_prob'], '+.3f')}, no filter "
    f"{_v(figs['gap_plain'], '+.3f')}."
  )

  def plot(ax):
    _bar(ax, figs, list(figs)[:7])

  return Outcome(figs, verdict, reason, "gap_filter", plot)


# ----------------------------------------------------------------------------
# 9b. The negative-token filter, isolated: equal distinct prompts and rollouts.
# ----------------------------------------------------------------------------

_BATCH_LEVEL = (("rl.advantage", "batch_mean_std"),)
SINGLE_EQUAL = {
  # 16 prompts × 8 rollouts like GRPO's, advantages from the batch (the groups ignored).
  "plain": Arm("b8_plain", overrides=_BATCH_LEVEL),
  "filter": Arm(
    "b8_filter",
    overrides=(
      *_BATCH_LEVEL,
      _FILTER,
      ("rl.mask_options", {"negative_token_filter": {"criteria": ("prob", "batch_shared")}}),
    ),
  ),
}


def analyse_single_equal(runs) -> Outcome:
  arms = (("grpo_g8", GRPO_PLAIN), *SINGLE_EQUAL.items())
  acc = {n: _per_seed(runs, a, _final_acc) for n, a in arms}
  figs = {f"accuracy_{n}": _fig(f"final greedy accuracy, {n}", v) for n, v in acc.items()}
  figs["filter_gain"] = _fig(
    "batch-level filtered − unfiltered", _paired(acc["filter"], acc["plain"])
  )
  figs["gap_filter"] = _fig("batch-level filtered − GRPO", _paired(acc["filter"], acc["grpo_g8"]))
  figs["gap_plain"] = _fig("batch-level unfiltered − GRPO", _paired(acc["plain"], acc["grpo_g8"]))
  figs["masked_frac"] = _fig(
    "masked fraction of tokens (filter)",
    _per_seed(
      runs, SINGLE_EQUAL["filter"], _late_mean("masked_frac/negative_token_filter", frac=1.0)
    ),
  )
  gain = evidence.above(figs["filter_gain"], 0.0)
  comparable = evidence.above(figs["gap_filter"], -0.05)
  verdict = evidence.combine([gain, comparable])
  reason = (
    f"On the same 16 prompts × 8 rollouts per iteration, batch-level advantages with the "
    f"filter end {_v(figs['filter_gain'], '+.3f')} from the same without it (CI above 0: "
    f"{gain}) and {_v(figs['gap_filter'], '+.3f')} from GRPO (CI above −0.05: {comparable}); "
    f"without the filter {_v(figs['gap_plain'], '+.3f')} from GRPO."
  )

  def plot(ax):
    _bar(ax, figs, list(figs)[:6])

  return Outcome(figs, verdict, reason, "filter_gain", plot)
