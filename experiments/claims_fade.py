"""Claim 8: FADE against GRPO and static sign/difficulty variants (iterations to 90% of
GRPO's gain, pass@k).
claims.py holds its rule and re-exports every name here as claims.<name>."""

from __future__ import annotations

import evidence
import numpy as np
from claims_base import _bar, _fig, _late_mean, _paired, _per_seed, _v
from evidence import Arm, Outcome

# ----------------------------------------------------------------------------
# Arms.
# ----------------------------------------------------------------------------

_PASSK = (("eval_samples", 16), ("eval_every", 5))
FADE_ARMS = {
  "grpo": Arm("pk_grpo", overrides=_PASSK),
  "fade": Arm(
    "pk_fade",
    overrides=(*_PASSK, ("rl.advantage", "fade"), ("rl.controller", "fade_entropy")),
  ),
  "static_suppress": Arm(
    "pk_static_suppress",
    overrides=(*_PASSK, ("rl.advantage", "fade"), ("rl.advantage_hyper.lambda_f", 2.0)),
  ),
  "static_hard": Arm(
    "pk_static_hard",
    overrides=(*_PASSK, ("rl.advantage", "fade"), ("rl.advantage_hyper.focal_gamma", 1.0)),
  ),
}


# ----------------------------------------------------------------------------
# 8. FADE vs GRPO and static sign/difficulty variants.
# ----------------------------------------------------------------------------


def _rl_evals(records):
  """(iterations, greedy accuracies) of the RL evaluations (the warm start's excluded)."""
  return evidence.series(
    [r for r in records if r.get("phase") != "warmstart"], "eval/greedy_accuracy"
  )


def _steps_to_peak(records):
  x, y = _rl_evals(records)
  return float(x[int(np.argmax(y))]) if y else None


def _steps_to_target(records, target, *, censored):
  """First RL evaluation iteration with accuracy ≥ target; `censored` if never."""
  if target is None:
    return None
  x, y = _rl_evals(records)
  hits = [i for i, a in zip(x, y) if a >= target]
  return float(hits[0]) if hits else float(censored)


def _targets(runs):
  """Per seed: the warm-start accuracy + 90% of GRPO's gain to its peak (the bar every arm
  of that seed must reach; an arm that never learns never reaches it)."""
  out = []
  for records in runs[FADE_ARMS["grpo"].name]:
    warm = evidence.first(records, "eval/greedy_accuracy")
    _, y = _rl_evals(records)
    out.append(None if warm is None or not y else warm + 0.9 * (max(y) - warm))
  return out


def analyse_fade(runs) -> Outcome:
  figs = {}
  for name, arm in FADE_ARMS.items():
    figs[f"steps_to_peak_{name}"] = _fig(
      f"iteration of peak accuracy, {name}", _per_seed(runs, arm, _steps_to_peak)
    )
    figs[f"peak_{name}"] = _fig(
      f"peak greedy accuracy, {name}",
      _per_seed(
        runs, arm, lambda r: max(evidence.series(r, "eval/greedy_accuracy")[1] or [np.nan])
      ),
    )
    for k in (1, 4, 16):
      figs[f"pass@{k}_{name}"] = _fig(
        f"final pass@{k}, {name}",
        _per_seed(runs, arm, lambda r, k=k: evidence.last(r, f"eval/pass@{k}")),
      )
    figs[f"entropy_{name}"] = _fig(
      f"rollout entropy (last third), {name}", _per_seed(runs, arm, _late_mean("rollout_entropy"))
    )
  targets = _targets(runs)
  censored = max((r["iteration"] for r in runs[FADE_ARMS["grpo"].name][0]), default=0) + 5

  def to_target(name):
    return [
      _steps_to_target(records, t, censored=censored)
      for records, t in zip(runs[FADE_ARMS[name].name], targets)
    ]

  for name in FADE_ARMS:
    figs[f"steps_to_target_{name}"] = _fig(
      f"iterations to 90% of GRPO's gain, {name} ({censored} = never)", to_target(name)
    )
  statics = [to_target(n) for n in ("static_suppress", "static_hard")]
  best_static = [None if None in xs else min(xs) for xs in zip(*statics)]
  figs["peak_earlier"] = _fig(
    "iterations to 90% of GRPO's gain: FADE − earliest static variant",
    _paired(to_target("fade"), best_static),
  )
  figs["pass16_gain"] = _fig(
    "final pass@16: FADE − GRPO",
    _paired(
      *(
        _per_seed(runs, FADE_ARMS[n], lambda r: evidence.last(r, "eval/pass@16"))
        for n in ("fade", "grpo")
      )
    ),
  )
  earlier = evidence.below(figs["peak_earlier"], 0.0)
  not_worse = evidence.above(figs["pass16_gain"], -0.05)
  verdict = evidence.combine([earlier, not_worse])
  reason = (
    f"FADE reaches 90% of GRPO's gain {_v(figs['peak_earlier'], '+.1f')} iterations from the earliest static variant "
    f"(CI below 0: {earlier}); pass@16 vs GRPO {_v(figs['pass16_gain'], '+.3f')} (CI above −0.05: {not_worse})."
  )

  def plot(ax):
    _bar(ax, figs, [f"steps_to_target_{n}" for n in FADE_ARMS] + ["peak_earlier"])

  return Outcome(figs, verdict, reason, "peak_earlier", plot)
