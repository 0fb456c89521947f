"""Benchmark figures over problems, each with a 95% bootstrap interval, for an eval report.

    figs = eval_figures.figures(greedy_P=..., correct_PK=..., answers_PK=..., format_P=...,
                              scorable_P=..., scorable_PK=...)
    print(eval_figures.table({"arithmetic": figs}))

Notation: P problems; greedy_P the greedy completion's correctness; correct_PK the
correctness of k sampled completions per problem; answers_PK their extracted answers
(`Task.extract_answer`, None where a completion states none).

Figures (all means over problems of a per-problem value, so one interval method fits all):
  greedy       greedy_P                                 (the trainer's eval/greedy_accuracy)
  avg@k        (1/k) Σ_j c_pj                           (mean@k; `heldout.mean_at_k`)
  pass@k'      1 − C(n−c, k')/C(n, k'), k' = 1, 2, 4, …, k  (unbiased; `heldout.pass_at_k`)
  maj@k        c_p at the majority answer of the k samples (below)
  format_rate  the greedy completion follows the answer template
  unscorable   the share of greedy / sampled rows whose reward could not be computed
               (kept apart: an unscorable row counts as wrong in every figure above)

maj@k: the most frequent extracted answer among the k samples (None answers do not vote);
a tie goes to the answer that appears first in sample order, so the result is a function
of the samples alone. The majority answer's correctness is that of its first sample (the
verifier is assumed to judge an answer, not its wording; where it does not, this is the
first such sample's verdict). A problem whose samples state no answer counts as wrong.
Reported only for tasks that extract answers.

Intervals: `heldout.interval`, a percentile bootstrap over problems, 2000 resamples
from a fixed seed (0), so a report is reproducible; [low, high] of the resampled means at
2.5% and 97.5%. With one problem the interval is the point.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np

from grpo_jax.trainer import heldout


def majority(answers: Sequence[str | None]) -> int | None:
  """Index (in `answers`) of the first sample holding the majority answer; None when no
  sample states an answer. Ties: the answer seen first wins."""
  counts = collections.Counter(a for a in answers if a is not None)
  if not counts:
    return None
  top = max(counts.values())
  return next(i for i, a in enumerate(answers) if a is not None and counts[a] == top)


def maj_at_k(correct_PK, answers_PK) -> np.ndarray:
  """Per problem: the correctness of the majority answer of its K samples (`majority`),
  0 where no sample states an answer. [P] float64."""
  correct_PK = np.asarray(correct_PK, np.float64)
  out = np.zeros(correct_PK.shape[0])
  for p, answers in enumerate(answers_PK):
    i = majority(answers)
    out[p] = 0.0 if i is None else correct_PK[p, i]
  return out


def _figure(values_P) -> dict:
  mean, ci = heldout.interval(values_P)
  return {"value": mean, "ci": ci}


def figures(
  *,
  greedy_P,
  format_P,
  scorable_P,
  correct_PK=None,
  answers_PK=None,
  scorable_PK=None,
) -> dict[str, dict]:
  """{name: {"value", "ci": [low, high]}} of the module docstring's figures (sampled ones
  only with correct_PK; maj@k only with answers_PK)."""
  out = {
    "greedy": _figure(greedy_P),
    "format_rate": _figure(format_P),
    "unscorable_greedy": _figure(~np.asarray(scorable_P, bool)),
  }
  if correct_PK is None:
    return out
  correct_PK = np.asarray(correct_PK, np.float64)
  P, k = correct_PK.shape
  out[f"avg@{k}"] = _figure(correct_PK.mean(axis=1))
  c_P = (correct_PK > 0).sum(axis=1)
  for kk in heldout.pass_ks(k):
    out[f"pass@{kk}"] = _figure(heldout.pass_at_k(k, c_P, kk))
  if answers_PK is not None:
    out[f"maj@{k}"] = _figure(maj_at_k(correct_PK, answers_PK))
  if scorable_PK is not None:
    out["unscorable_sampled"] = _figure((~np.asarray(scorable_PK, bool)).mean(axis=1))
  return out


def _cell(fig: dict) -> str:
  low, high = fig["ci"]
  return f"{100 * fig['value']:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def table(by_benchmark: dict[str, dict[str, dict]]) -> str:
  """A markdown table: one row per benchmark, one column per figure (percent, with the 95%
  interval); "-" where a benchmark lacks a figure."""
  names: list[str] = []
  for figs in by_benchmark.values():
    names += [n for n in figs if n not in names]
  lines = ["| benchmark | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
  for bench, figs in by_benchmark.items():
    cells = [_cell(figs[n]) if n in figs else "-" for n in names]
    lines.append(f"| {bench} | " + " | ".join(cells) + " |")
  return "\n".join(lines)
