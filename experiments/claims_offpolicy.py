"""Claims 11 and 11b: off-policy training, rollouts sampled by stale parameters and by a
bfloat16 sampler, with and without truncated importance sampling.
claims.py holds their rules and re-exports every name here as claims.<name>."""

from __future__ import annotations

import evidence
import numpy as np
from claims_base import _eval_curve, _fig, _final_acc, _mean_key, _paired, _per_seed, _v
from evidence import Arm, Outcome

# ----------------------------------------------------------------------------
# 11. Off-policy: stale rollouts and a bfloat16 sampler, with and without correction.
# ----------------------------------------------------------------------------

_EVERY10 = (("eval_every", 10),)
STALENESS = (0, 1, 2, 4)
CORRECTIONS = ("none", "tis_token")


def _op_arm(s: int, correction: str, *more) -> Arm:
  return Arm(
    f"op_s{s}_{correction}",
    overrides=(
      *_EVERY10,
      ("offpolicy.enabled", True),
      ("offpolicy.max_staleness", s),
      ("rl.is_correction", correction),
      *more,
    ),
  )


# s = 0 with a float32 sampler has no mismatch to correct: one arm.
OFFPOLICY = {
  (s, c): _op_arm(s, c) for s in STALENESS for c in CORRECTIONS if (s, c) != (0, "tis_token")
}
BF16_SAMPLER = {
  c: Arm(
    f"bf16s_{c}", overrides=(*_EVERY10, ("sampler.dtype", "bfloat16"), ("rl.is_correction", c))
  )
  for c in CORRECTIONS
}
BF16_BASE = OFFPOLICY[(0, "none")]  # Float32 sampler and trainer, the synchronous schedule.


def _curves(runs, arm: Arm):
  """(iterations, [seeds, evals] greedy accuracy) of an arm's runs."""
  curves = [_eval_curve(r) for r in runs[arm.name]]
  return curves[0][0], np.array([c[1] for c in curves])


def _plot_curves(ax, runs, arms: dict, title: str, gaps=()):
  """Mean greedy-accuracy curves of `arms` (label -> Arm); on a twin axis, the paired
  per-seed gaps (label, arm a, arm b) of a − b with their 95% CI bands."""
  for label, arm in arms.items():
    its, acc = _curves(runs, arm)
    ax.plot(its, acc.mean(axis=0), ls="--" if "none" in label else "-", label=label)
  ax.set_xlabel("iteration")
  ax.set_ylabel(f"greedy held-out accuracy (mean of {len(acc)} seeds)")
  ax.set_title(title, fontsize=8)
  handles = ax.get_legend_handles_labels()
  if gaps:
    twin = ax.twinx()
    for label, a, b in gaps:
      its, acc_a = _curves(runs, a)
      d = acc_a - _curves(runs, b)[1]
      mean = d.mean(axis=0)
      half = evidence.t_quantile(len(d)) * d.std(axis=0, ddof=1) / np.sqrt(len(d))
      line = twin.plot(its, mean, color="black", lw=1.2, ls=":", label=label)[0]
      twin.fill_between(its, mean - half, mean + half, color=line.get_color(), alpha=0.1)
    twin.axhline(0.0, color="grey", lw=0.6)
    twin.set_ylabel("paired gap (dotted, 95% CI)")
    more = twin.get_legend_handles_labels()
    handles = (handles[0] + more[0], handles[1] + more[1])
  ax.legend(*handles, fontsize=6, loc="lower right")


def analyse_offpolicy_staleness(runs) -> Outcome:
  figs, final = {}, {}
  for (s, c), arm in OFFPOLICY.items():
    final[(s, c)] = _per_seed(runs, arm, _final_acc)
    figs[f"accuracy_s{s}_{c}"] = _fig(f"final greedy accuracy, staleness {s}, {c}", final[(s, c)])
    figs[f"k3_s{s}_{c}"] = _fig(
      f"sampler–trainer k3 (mean over iterations), staleness {s}, {c}",
      _per_seed(runs, arm, lambda r: _mean_key(r, "offpolicy/mismatch_k3")),
    )
  for s in STALENESS[1:]:
    figs[f"gain_s{s}"] = _fig(
      f"TIS − uncorrected, final accuracy, staleness {s}",
      _paired(final[(s, "tis_token")], final[(s, "none")]),
    )
    figs[f"cost_s{s}_none"] = _fig(
      f"uncorrected staleness {s} − synchronous, final accuracy",
      _paired(final[(s, "none")], final[(0, "none")]),
    )
  verdict = evidence.combine([evidence.above(figs["gain_s4"], 0.0)])
  reason = (
    f"Final greedy accuracy, synchronous {_v(figs['accuracy_s0_none'], '.3f')}; staleness 4 "
    f"uncorrected {_v(figs['accuracy_s4_none'], '.3f')}, with token TIS "
    f"{_v(figs['accuracy_s4_tis_token'], '.3f')} (TIS − uncorrected "
    f"{_v(figs['gain_s4'], '+.3f')}, CI [{_v(figs['gain_s4'], '+.3f', 0)}, "
    f"{_v(figs['gain_s4'], '+.3f', 1)}]). Staleness costs the uncorrected run "
    f"{_v(figs['cost_s1_none'], '+.3f')} / {_v(figs['cost_s2_none'], '+.3f')} / "
    f"{_v(figs['cost_s4_none'], '+.3f')} at s = 1 / 2 / 4; the measured mismatch k3 grows "
    f"{_v(figs['k3_s1_none'], '.1e')} → {_v(figs['k3_s4_none'], '.1e')}."
  )

  def plot(ax):
    arms = {f"s={s} {c}": arm for (s, c), arm in OFFPOLICY.items()}
    gap = ("s=4: TIS − uncorrected", OFFPOLICY[(4, "tis_token")], OFFPOLICY[(4, "none")])
    _plot_curves(
      ax, runs, arms, "staleness 0/1/2/4, uncorrected (dashed) vs token TIS", gaps=(gap,)
    )

  return Outcome(figs, verdict, reason, "gain_s4", plot)


def analyse_bf16_sampler(runs) -> Outcome:
  figs = {}
  base = _per_seed(runs, BF16_BASE, _final_acc)
  figs["accuracy_fp32"] = _fig("final greedy accuracy, float32 sampler", base)
  final = {}
  for c, arm in BF16_SAMPLER.items():
    final[c] = _per_seed(runs, arm, _final_acc)
    figs[f"accuracy_bf16_{c}"] = _fig(f"final greedy accuracy, bfloat16 sampler, {c}", final[c])
    figs[f"k3_bf16_{c}"] = _fig(
      f"sampler–trainer k3 (mean over iterations), bfloat16 sampler, {c}",
      _per_seed(runs, arm, lambda r: _mean_key(r, "offpolicy/mismatch_k3")),
    )
    figs[f"ratio_p99_bf16_{c}"] = _fig(
      f"99th percentile of π_old/μ (mean over iterations), {c}",
      _per_seed(runs, arm, lambda r: _mean_key(r, "offpolicy/ratio_p99")),
    )
  figs["k3_fp32"] = _fig(
    "sampler–trainer k3 (mean over iterations), float32 sampler",
    _per_seed(runs, BF16_BASE, lambda r: _mean_key(r, "offpolicy/mismatch_k3")),
  )
  figs["gain_tis"] = _fig(
    "bfloat16 sampler: TIS − uncorrected, final accuracy",
    _paired(final["tis_token"], final["none"]),
  )
  figs["cost_bf16"] = _fig(
    "bfloat16 sampler uncorrected − float32 sampler, final accuracy", _paired(final["none"], base)
  )
  verdict = evidence.combine([evidence.above(figs["gain_tis"], 0.0)])
  reason = (
    f"A bfloat16 sampler against the float32 trainer: k3 {_v(figs['k3_bf16_none'], '.1e')} "
    f"(float32 sampler {_v(figs['k3_fp32'], '.1e')}). Final greedy accuracy: float32 sampler "
    f"{_v(figs['accuracy_fp32'], '.3f')}, bfloat16 uncorrected "
    f"{_v(figs['accuracy_bf16_none'], '.3f')}, with token TIS "
    f"{_v(figs['accuracy_bf16_tis_token'], '.3f')} (TIS − uncorrected "
    f"{_v(figs['gain_tis'], '+.3f')}, CI [{_v(figs['gain_tis'], '+.3f', 0)}, "
    f"{_v(figs['gain_tis'], '+.3f', 1)}])."
  )

  def plot(ax):
    arms = {"fp32 sampler": BF16_BASE, **{f"bf16 sampler {c}": a for c, a in BF16_SAMPLER.items()}}
    gap = ("bf16: TIS − uncorrected", BF16_SAMPLER["tis_token"], BF16_SAMPLER["none"])
    _plot_curves(ax, runs, arms, "bfloat16 sampler, float32 trainer", gaps=(gap,))

  return Outcome(figs, verdict, reason, "gain_tis", plot)
