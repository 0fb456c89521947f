"""What the claim families (experiments/claims_*.py) share: the diagnostic settings of their
arms, and the helpers of their analyses (a figure and its per-seed values, paired
differences, bar plots, final and late-run metrics, cached measurements, eval curves).
claims.py re-exports every name here as claims.<name>."""

from __future__ import annotations

import importlib
import time

import evidence
import numpy as np
from evidence import Arm, summarize

# Diagnostics: flips, cancellation, coupling, drift and tax; plus rank and MC value.
# 64 value tokens: with fewer, a probe often holds no boosted or no suppressed token of a
# polarity and the value gap has no value for that run.
FULL_DIAG = (("rank", True), ("value", True), ("value_tokens", 64), ("value_samples", 8))
LIGHT_DIAG = (("rank", False),)


def _v(fig: dict, spec: str, which: int | None = None) -> str:
  """A figure's mean (or CI end `which`) formatted, "n/a" when missing."""
  x = fig["mean"] if which is None else fig["ci"][which]
  return "n/a" if x is None else format(x, spec)


def _fig(label: str, values) -> dict:
  return {"label": label, **summarize(values)}


def _per_seed(runs, arm: Arm, fn) -> list:
  return [fn(records) for records in runs[arm.name]]


def _paired(a: list, b: list) -> list:
  return [None if x is None or y is None else x - y for x, y in zip(a, b)]


def _bar(ax, figures: dict, names: list[str]):
  """Means with 95% CI bars and the per-seed values as dots."""

  def end(fig, i):
    x = fig["ci"][i]
    return x if x is not None and np.isfinite(x) else (fig["mean"] or 0.0)

  means = [figures[n]["mean"] or 0.0 for n in names]
  err = [
    [m - end(figures[n], 0) for n, m in zip(names, means)],
    [end(figures[n], 1) - m for n, m in zip(names, means)],
  ]
  ax.bar(range(len(names)), means, yerr=err, capsize=4, color="tab:blue", alpha=0.7)
  for i, n in enumerate(names):
    ys = [y for y in figures[n]["per_seed"] if y is not None]
    ax.scatter([i] * len(ys), ys, color="k", s=12, zorder=3)
  ax.set_xticks(range(len(names)))
  ax.set_xticklabels([figures[n]["label"] for n in names], rotation=20, ha="right", fontsize=7)
  ax.axhline(0.0, color="grey", lw=0.5)


def _final_acc(records):
  return evidence.last(records, "eval/greedy_accuracy")


def _late_mean(key, frac=1 / 3):
  def fn(records):
    rl = [r for r in records if r.get("phase") == "rl" and isinstance(r.get(key), int | float)]
    rl = rl[int(len(rl) * (1 - frac)) :]
    return float(np.mean([r[key] for r in rl])) if rl else None

  return fn


def _measured(module: str, cache: str, *, seeds, root, quick, full: dict) -> list[dict]:
  """experiments/<module>.measure per seed (kwargs `full`, or 4 prompts × 4 groups with
  quick), cached as JSON under root/<cache>-quick|full/seed<s>.json, with its seconds."""
  import json  # noqa: PLC0415

  measure = importlib.import_module(module).measure
  out = []
  model = "" if evidence.model_name() == "tiny" else f"-{evidence.model_name()}"
  for s in seeds:
    path = root / f"{cache}-{'quick' if quick else 'full'}{model}" / f"seed{s}.json"
    if not path.exists():
      t0 = time.perf_counter()
      got = measure(s, quick=quick, **(dict(prompts=4, groups=4) if quick else full))
      got["seconds"] = time.perf_counter() - t0
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(got))
    out.append(json.loads(path.read_text()))
  return out


def _ratios(per_seed: list[dict], arm: str, base: str, what: str) -> list:
  """Per seed r[arm][what] / r[base][what] (None where the base is 0)."""
  return [None if r[base][what] == 0 else r[arm][what] / r[base][what] for r in per_seed]


def _eval_curve(records):
  pts = [
    (r["iteration"], r["eval/greedy_accuracy"]) for r in records if "eval/greedy_accuracy" in r
  ]
  return [p[0] for p in pts], [p[1] for p in pts]


def _rl_values(records, key) -> list:
  """`key`'s value at every RL iteration that logged it."""
  return [r[key] for r in records if r.get("phase") == "rl" and key in r]


def _mean_key(records, key):
  vals = _rl_values(records, key)
  return float(np.mean(vals)) if vals else None
