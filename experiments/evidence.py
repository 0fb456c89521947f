"""The machinery of the seed claims (experiments/claims.py), shared by claims.py and the
reproduce.py command: arms and their runs, the statistics over seeds (95% Student-t
intervals, p-values, Holm's correction, power) and the readers of a run's records.

Statistics: each run gives one number per figure (a mean over its diagnostic iterations,
or a final value); a figure is the mean over seeds with a 95% Student-t confidence
interval (n − 1 degrees of freedom, scipy.stats.t).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pathlib
import time
from collections.abc import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------
# Arms and runs.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Arm:
  """One training configuration: configs/long_addition.py:tiny plus `overrides` (dotted
  config keys), with the diagnostics hook on when `diagnostics` holds its options."""

  name: str
  overrides: tuple[tuple[str, object], ...] = ()
  diagnostics: tuple[tuple[str, object], ...] = ()

  def key(self, *, iterations: int, quick: bool) -> str:
    model = [model_name()] if model_name() != "tiny" else []
    blob = json.dumps([self.overrides, self.diagnostics, iterations, quick, *model], default=str)
    return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"


# --model: every arm's policy and measurement at another size (an environment variable, so
# the measurement scripts' own configs follow). "full": long_addition:full's ~40M model.
MODEL_ENV = "GRPO_REPRO_MODEL"
MODELS = {
  "tiny": {},
  "full": dict(
    model=dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64, mlp_dim=1536),
    learning_rate=1e-5,
    warmstart_steps=1500,
    warmstart_lr=3e-4,
  ),
}


def model_name() -> str:
  import os  # noqa: PLC0415

  return os.environ.get(MODEL_ENV, "tiny")


def apply_model(c) -> None:
  """The --model size on a claim config (after --quick's shrinking: the quick schedule at
  that model); "tiny" leaves it as is."""
  spec = dict(MODELS[model_name()])
  if "model" in spec:
    c.model.update(spec.pop("model"))
  c.update(**spec)


def _set(c, dotted: str, value) -> None:
  *parents, leaf = dotted.split(".")
  for p in parents:
    c = c[p]
  c[leaf] = value


def arm_config(arm: Arm, *, seed: int, iterations: int, quick: bool):
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  c = config_lib.load(str(ROOT / "configs" / "long_addition.py") + (":quick" if quick else ":tiny"))
  c.update(seed=seed, iterations=iterations, eval_every=max(iterations // 3, 1))
  c.update(eval_samples=0, checkpoint_every=iterations, reward_workers=0, progress=False)
  if quick:
    c.task.kwargs = dict(min_digits=1, max_digits=2)
    c.sampler.update(max_new_tokens=26)  # "9+9+0=18;9+9+1=19;A:198." and EOS fit.
    c.update(prompts_per_step=8, warmstart_steps=60, warmstart_batch=32, eval_size=16)
    c.rl.format_weight = 0.5  # Rewards vary even when the small model solves nothing.
  apply_model(c)
  for k, v in arm.overrides:
    _set(c, k, v)
  if arm.diagnostics:
    c.diagnostics.update(every=max(iterations // 6, 1), probe_prompts=8)
    c.diagnostics.update(**dict(arm.diagnostics))
    if quick:
      c.diagnostics.update(probe_prompts=2, drift_references=8, max_tokens=32, project_dim=64)
      if c.diagnostics.value:
        c.diagnostics.update(value_tokens=4, value_samples=2)
  return c


def read_records(workdir: pathlib.Path) -> list[dict]:
  from grpo_jax.infra import logs  # noqa: PLC0415 -- as train below: --table needs no JAX.

  return logs.read_jsonl(workdir / "metrics.jsonl")


def run_seconds(arm: Arm, seed: int, *, root: pathlib.Path, iterations: int, quick: bool) -> float:
  """Wall seconds the (arm, seed) run took (its summary.json), cached or not."""
  workdir = root / arm.key(iterations=iterations, quick=quick) / f"seed{seed}"
  return float(json.loads((workdir / "summary.json").read_text())["wall_seconds"] or 0.0)


def run_arm(arm: Arm, seed: int, *, root: pathlib.Path, iterations: int, quick: bool) -> list:
  """metrics.jsonl records of (arm, seed); trains it unless a finished run is cached."""
  from grpo_jax.trainer import train  # noqa: PLC0415

  workdir = root / arm.key(iterations=iterations, quick=quick) / f"seed{seed}"
  summary = workdir / "summary.json"
  if summary.exists() and json.loads(summary.read_text())["iterations_done"] >= iterations:
    return read_records(workdir)
  config = arm_config(arm, seed=seed, iterations=iterations, quick=quick)
  workdir.mkdir(parents=True, exist_ok=True)
  t0 = time.perf_counter()
  with open(workdir / "run.log", "a") as log:
    train.run(config, workdir, log=lambda *a: print(*a, file=log, flush=True))
  print(f"  ran {arm.name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
  return read_records(workdir)


# ----------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------


def t_quantile(n: int) -> float:
  """The 0.975 quantile of Student's t with n − 1 degrees of freedom."""
  import scipy.stats  # noqa: PLC0415

  return float(scipy.stats.t.ppf(0.975, n - 1))


def summarize(values) -> dict:
  """{"per_seed", "mean", "ci": [low, high], "n"} with a 95% t interval over the seeds that
  gave a finite value. per_seed keeps one entry per seed, in seed order (None where the run
  gave none); with fewer than two values the interval is [None, None] (unbounded)."""
  per_seed = [float(x) if x is not None and math.isfinite(x) else None for x in values]
  v = np.asarray([x for x in per_seed if x is not None], np.float64)
  if v.size == 0:
    return {"per_seed": per_seed, "mean": None, "ci": [None, None], "n": 0}
  mean = float(v.mean())
  if v.size < 2:
    return {"per_seed": per_seed, "mean": mean, "ci": [None, None], "n": 1}
  half = t_quantile(v.size) * float(v.std(ddof=1)) / math.sqrt(v.size)
  return {"per_seed": per_seed, "mean": mean, "ci": [mean - half, mean + half], "n": int(v.size)}


def above(fig: dict, threshold: float) -> str:
  """ "yes" if the CI lies above threshold, "no" if below, else "unclear"."""
  low, high = fig["ci"]
  if low is None:  # Fewer than two seeds gave a value: no interval.
    return "unclear"
  if low > threshold:
    return "yes"
  if high < threshold:
    return "no"
  return "unclear"


def below(fig: dict, threshold: float) -> str:
  """ "yes" if the CI lies below threshold, "no" if above, else "unclear"."""
  return {"yes": "no", "no": "yes", "unclear": "unclear"}[above(fig, threshold)]


def within(fig: dict, low_bound: float, high_bound: float) -> str:
  """ "yes" if the CI lies inside [low_bound, high_bound], "no" if it lies wholly outside,
  else "unclear"."""
  low, high = fig["ci"]
  if low is None:
    return "unclear"
  if low_bound <= low and high <= high_bound:
    return "yes"
  if high < low_bound or low > high_bound:
    return "no"
  return "unclear"


def combine(parts: list[str]) -> str:
  """Verdict of a claim made of conditions: supports if every part holds ("yes"),
  contradicts if any fails outright ("no"), else inconclusive."""
  if parts and all(p == "yes" for p in parts):
    return "supports"
  if any(p == "no" for p in parts):
    return "contradicts"
  return "inconclusive"


def _t_test(fig: dict, threshold: float) -> tuple[float, float]:
  """(mean − threshold, two-sided p of a one-sample t test over the seeds' values): the
  test the 95% CI inverts (CI excludes the threshold ⇔ p < 0.05)."""
  import scipy.stats  # noqa: PLC0415

  v = np.asarray([x for x in fig["per_seed"] if x is not None], np.float64)
  d = float(v.mean()) - threshold if v.size else 0.0
  if v.size < 2:
    return d, 1.0
  sd = float(v.std(ddof=1))
  if sd == 0.0:
    return d, 0.0 if d != 0 else 1.0
  t = d / (sd / math.sqrt(v.size))
  return d, float(2 * scipy.stats.t.sf(abs(t), v.size - 1))


def part_p(fig: dict, relation: str, low: float, high: float | None = None) -> dict:
  """{"yes": p, "no": p}: the p-value with which the part holds ("yes") or fails outright
  ("no"), 1 where the data lean the other way; relation as claims.Test."""
  if relation == "within":
    d_lo, p_lo = _t_test(fig, low)
    d_hi, p_hi = _t_test(fig, high)
    yes = max(p_lo if d_lo > 0 else 1.0, p_hi if d_hi < 0 else 1.0)
    no = min(p_lo if d_lo < 0 else 1.0, p_hi if d_hi > 0 else 1.0)
    return {"yes": yes, "no": no}
  d, p = _t_test(fig, low)
  sign = 1.0 if relation == "above" else -1.0
  return {"yes": p if sign * d > 0 else 1.0, "no": p if sign * d < 0 else 1.0}


def claim_p(figures: dict, tests) -> dict:
  """{"supports": p, "contradicts": p} of a claim whose rule is `combine` over `tests`:
  supports needs every part (intersection-union: the largest p); contradicts any part
  (the smallest p times the number of parts, Bonferroni within the claim)."""
  ps = [part_p(figures[t.figure], t.relation, t.low, t.high) for t in tests]
  return {
    "supports": max(p["yes"] for p in ps),
    "contradicts": min(1.0, len(ps) * min(p["no"] for p in ps)),
  }


def holm(verdicts: dict, pvalues: dict, *, alpha: float = 0.05) -> dict:
  """{claim: verdict after Holm's step-down over the family}: a supports/contradicts stays
  only where its p (pvalues[claim][verdict]) is rejected at level alpha across all the
  claims' m hypotheses; else inconclusive. Inconclusive claims enter with their smaller p."""
  p = {
    k: pvalues[k][v] if v in pvalues[k] else min(pvalues[k].values()) for k, v in verdicts.items()
  }
  out, m, going = {}, len(p), True
  for rank, k in enumerate(sorted(p, key=p.get)):
    going = going and p[k] <= alpha / (m - rank)
    out[k] = verdicts[k] if going and verdicts[k] != "inconclusive" else "inconclusive"
  return out


def seeds_for_power(fig: dict, relation: str, low: float, high=None, *, power=0.8, cap=200):
  """Seeds at which the part's 95% CI would exclude its threshold (the nearer bound for
  "within") with probability `power`, if the seeds' mean and sd were the truth (a
  noncentral-t power calculation); None if the mean sits on it or past cap."""
  import scipy.stats  # noqa: PLC0415

  v = np.asarray([x for x in fig["per_seed"] if x is not None], np.float64)
  if v.size < 2:
    return None
  mean, sd = float(v.mean()), float(v.std(ddof=1))
  bounds = [low] if relation != "within" else [low, high]
  d = min(abs(mean - b) for b in bounds)
  if d == 0 or sd == 0:
    return None if d == 0 else int(v.size)
  for n in range(2, cap + 1):
    crit = scipy.stats.t.ppf(0.975, n - 1)
    nc = d / sd * math.sqrt(n)
    if scipy.stats.nct.sf(crit, n - 1, nc) + scipy.stats.nct.cdf(-crit, n - 1, nc) >= power:
      return n
  return None


def claim_seeds_for_power(figures: dict, tests) -> int | None:
  """Seeds for the rule to decide at its observed effects (80% power per part). A part
  leaning "no" can never hold, so then the rule decides when the first such part fails
  outright (the fewest seeds over them); else when every part holds (the most). None:
  more than 200 seeds."""
  yes, no = [], []
  for t in tests:
    n = seeds_for_power(figures[t.figure], t.relation, t.low, t.high)
    p = part_p(figures[t.figure], t.relation, t.low, t.high)
    (no if p["no"] < 1.0 else yes).append(n)
  if no:
    return min((n for n in no if n is not None), default=None)
  return None if any(n is None for n in yes) else max(yes)


def part_verdict(figures: dict, test) -> str:
  """ "yes", "no" or "unclear": one decisive part (claims.Test) of a rule."""
  fig = figures[test.figure]
  if test.relation == "within":
    return within(fig, test.low, test.high)
  return {"above": above, "below": below}[test.relation](fig, test.low)


def verdict_from_tests(figures: dict, tests) -> str:
  """The rule's verdict recomputed from its decisive parts (claims.Test)."""
  return combine([part_verdict(figures, t) for t in tests])


# ----------------------------------------------------------------------------
# Reading runs.
# ----------------------------------------------------------------------------


def diag_mean(records: list[dict], key: str) -> float | None:
  """Mean of `key` over the records that hold it (the diagnostic iterations)."""
  xs = [r[key] for r in records if isinstance(r.get(key), int | float) and math.isfinite(r[key])]
  return float(np.mean(xs)) if xs else None


def last(records: list[dict], key: str) -> float | None:
  xs = [r[key] for r in records if isinstance(r.get(key), int | float)]
  return float(xs[-1]) if xs else None


def first(records: list[dict], key: str) -> float | None:
  xs = [r[key] for r in records if isinstance(r.get(key), int | float)]
  return float(xs[0]) if xs else None


def series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
  pts = [(r["iteration"], r[key]) for r in records if isinstance(r.get(key), int | float)]
  return [p[0] for p in pts], [float(p[1]) for p in pts]


def slope(records: list[dict], key: str) -> float | None:
  """Least-squares slope of `key` per iteration over the RL iterations."""
  x, y = series([r for r in records if r.get("phase") != "warmstart"], key)
  if len(x) < 3:
    return None
  return float(np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)[0])


@dataclasses.dataclass
class Outcome:
  """What a claim's analysis returns: figures (name -> summarize() dict, with a "label"),
  the verdict and its reason, and a plot function (matplotlib axes -> None)."""

  figures: dict
  verdict: str
  reason: str
  headline: str  # The figure the table shows.
  plot: Callable | None = None
