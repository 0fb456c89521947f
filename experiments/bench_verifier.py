"""Math verifier backends against labelled answer pairs: agreement, false accepts, speed.

  python experiments/bench_verifier.py            # full set -> experiments/results/verifier/
  python experiments/bench_verifier.py --quick --out /tmp/verifier   # smoke run, 24 cases

Cases. ``tests/fixtures/verifier/cases.jsonl`` (its README says where each block comes
from): a gold answer, a prediction, a label (equivalent or not), a category and a source.
A prediction with ``"input": "completion"`` is passed as the model output, verbatim; one
with ``"input": "answer"`` (sources that compare two bare answers) is passed as
``\\boxed{prediction}``, the form the task's prompt asks for.

Path. Each backend scores the set the way the trainer does: ``math_verify.MathReward``
(the ``math`` task's reward) in a ``reward_pool.RewardPool`` with --workers processes and a
--timeout_s hard timeout per item. Reward 1.0 is an accept, 0.0 a reject, and an item the
pool reports as an error (``verdicts.Unscorable`` raised, an exception, a timeout) is
"unscorable": excluded from training, so it counts against agreement but as neither a
false accept nor a false reject.

  agreement = (N - false accepts - false rejects - unscorable) / N
  false accept (FA): label "not equivalent", accepted; FA rate = FA / negatives
  false reject (FR): label "equivalent", rejected;     FR rate = FR / positives

Time per case: ``MathReward.reward`` called inline in this process, case by case, after
one untimed warm-up pass over the set (imports and compiled regexes warm), with the caches
of parsed expressions (ours, math_verify's, sympy's) cleared before each call, so each
costs what a new training item costs; median and p95 over --repeats passes.

Writes verifier.md, verifier.json (every figure in the md) and verifier.png (agreement,
FA, FR and unscorable rates per backend; agreement per category) to --out; the last line
printed is the JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import pathlib
import platform
import sys
import time

import numpy as np

from grpo_jax.infra import logs
from grpo_jax.verifiers import math_verify, reward_pool, verdicts

ROOT = pathlib.Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "fixtures" / "verifier" / "cases.jsonl"
OUT = ROOT / "experiments" / "results" / "verifier"
HF_REPOS = ("huggingface/",)  # Math-Verify's own organisation (see the md).


def load_cases(path: pathlib.Path = CASES) -> list[dict]:
  return logs.read_jsonl(path)


def completion_of(case: dict) -> str:
  """The text the verifier reads: the prediction, boxed if it is a bare answer."""
  if case["input"] == "answer":
    return f"\\boxed{{{case['prediction']}}}"
  return case["prediction"]


def quick_subset(cases: list[dict], n: int = 24) -> list[dict]:
  """n cases, every category and both labels represented (deterministic)."""
  by_key = collections.defaultdict(list)
  for c in cases:
    by_key[(c["category"], c["label"])].append(c)
  picked, round_ = [], 0
  while len(picked) < n and any(len(v) > round_ for v in by_key.values()):
    for key in sorted(by_key, key=str):
      if round_ < len(by_key[key]) and len(picked) < n:
        picked.append(by_key[key][round_])
    round_ += 1
  return picked


def score_in_pool(backend: str, cases: list[dict], *, workers: int, timeout_s: float):
  """(outcome per case, pool wall seconds): "accept" | "reject" | "unscorable"."""
  task = math_verify.MathReward(backend=backend)
  golds = [c["gold"] for c in cases]
  completions = [completion_of(c) for c in cases]
  with reward_pool.RewardPool(task, workers=workers, timeout_s=timeout_s) as pool:
    pool.score(golds[:2], completions[:2])  # Workers import the backend before the clock.
    start = time.perf_counter()
    scores = pool.score(golds, completions)
    wall_s = time.perf_counter() - start
  outcomes = [
    "unscorable" if err else ("accept" if correct == 1.0 else "reject")
    for correct, err in zip(scores.correct_N, scores.error_N)
  ]
  return outcomes, wall_s, int(scores.timeouts)


def clear_parse_caches():
  """Forgets parsed expressions (ours, math_verify's and sympy's), so the next item costs
  what a new training item costs; compiled regexes and imports stay warm."""
  import sympy.core.cache
  from math_verify import parser

  math_verify._hf_parse.cache_clear()
  for fn in (parser.parse_latex_cached, parser.parse_expr_cached, parser.extract_latex):
    fn.cache_clear()
  sympy.core.cache.clear_cache()


def time_inline(backend: str, cases: list[dict], *, repeats: int) -> list[float]:
  """Seconds per case of MathReward.reward in this process, caches cleared before each."""
  task = math_verify.MathReward(backend=backend)

  def one(c):
    with contextlib.suppress(verdicts.Unscorable):
      task.reward(c["gold"], completion_of(c))

  for c in cases:  # Warm-up: imports and compiled regexes, not timed.
    one(c)
  times = []
  for _ in range(repeats):
    for c in cases:
      clear_parse_caches()
      start = time.perf_counter()
      one(c)
      times.append(time.perf_counter() - start)
  return times


def summarize(cases: list[dict], outcomes: list[str]) -> dict:
  n = len(cases)
  pos = sum(c["label"] for c in cases)
  neg = n - pos
  fa = sum(o == "accept" and not c["label"] for c, o in zip(cases, outcomes))
  fr = sum(o == "reject" and c["label"] for c, o in zip(cases, outcomes))
  uns = sum(o == "unscorable" for o in outcomes)
  return {
    "n": n,
    "positives": pos,
    "negatives": neg,
    "agree": n - fa - fr - uns,
    "agreement": (n - fa - fr - uns) / n if n else float("nan"),
    "false_accepts": fa,
    "false_rejects": fr,
    "unscorable": uns,
    "fa_rate": fa / neg if neg else 0.0,
    "fr_rate": fr / pos if pos else 0.0,
    "unscorable_rate": uns / n if n else 0.0,
  }


def breakdown(cases, outcomes, key) -> dict:
  groups = collections.defaultdict(list)
  for i, c in enumerate(cases):
    groups[key(c)].append(i)
  return {
    name: summarize([cases[i] for i in idx], [outcomes[i] for i in idx])
    for name, idx in sorted(groups.items())
  }


def run_backend(backend, cases, *, workers, timeout_s, repeats) -> dict:
  outcomes, wall_s, timeouts = score_in_pool(backend, cases, workers=workers, timeout_s=timeout_s)
  times = np.array(time_inline(backend, cases, repeats=repeats))
  figures = summarize(cases, outcomes)
  figures.update(
    timeouts=timeouts,
    pool_wall_s=wall_s,
    median_ms=float(np.median(times) * 1e3),
    p95_ms=float(np.percentile(times, 95) * 1e3),
    mean_ms=float(times.mean() * 1e3),
    max_ms=float(times.max() * 1e3),
    by_category=breakdown(cases, outcomes, lambda c: c["category"]),
    by_source=breakdown(cases, outcomes, lambda c: c["source"]["repo"]),
    by_box=breakdown(
      cases,
      outcomes,
      lambda c: "has \\boxed" if "\\boxed" in completion_of(c) else "no \\boxed",
    ),
    by_origin=breakdown(
      cases,
      outcomes,
      lambda c: (
        "Hugging Face repos" if c["source"]["repo"].startswith(HF_REPOS) else "other projects"
      ),
    ),
    disagreements=[
      {"id": c["id"], "label": c["label"], "outcome": o}
      for c, o in zip(cases, outcomes)
      if o == "unscorable" or (o == "accept") != c["label"]
    ],
  )
  return figures


CLAIM = (
  "The default backend, math_verify, agrees with the labelled pairs more often than the "
  "builtin one (the reason it is the default)."
)


def verdict(result: dict, cases: list[dict]) -> dict | None:
  """The claim's verdict from a paired comparison over the cases. The verifiers are
  deterministic (no seeds): the uncertainty is over which pairs were labelled, so the
  interval is over cases, d_i = 1[math_verify agrees] − 1[builtin agrees], mean ± t·sd/√n
  (95%). Supports if it lies above 0, contradicts if below, else inconclusive. None
  unless both backends ran."""
  if not {"math_verify", "builtin"} <= set(result["backends"]):
    return None
  import scipy.stats  # noqa: PLC0415

  agree = {
    b: np.array(
      [c["id"] not in {d["id"] for d in result["backends"][b]["disagreements"]} for c in cases],
      np.float64,
    )
    for b in ("math_verify", "builtin")
  }
  d = agree["math_verify"] - agree["builtin"]
  half = float(scipy.stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / np.sqrt(d.size))
  low, high = float(d.mean()) - half, float(d.mean()) + half
  word = "supports" if low > 0 else "contradicts" if high < 0 else "inconclusive"
  return {
    "claim": CLAIM,
    "agreement_gain": {"mean": float(d.mean()), "ci": [low, high], "n": int(d.size)},
    "verdict": word,
    "reason": (
      f"math_verify − builtin agreement over the {d.size} pairs: {d.mean():+.3f} "
      f"(95% CI [{low:+.3f}, {high:+.3f}], paired over cases)."
    ),
  }


def _pct(x: float) -> str:
  return f"{100 * x:.1f}%"


def _table(rows: dict, backends: list[str], label: str) -> list[str]:
  head = f"| {label} | N | " + " | ".join(f"{b}: agree / FA / FR / unsc." for b in backends)
  lines = [head + " |", "|" + "---|" * (2 + len(backends))]
  for name in rows[backends[0]]:
    cells = []
    for b in backends:
      f = rows[b][name]
      cells.append(
        f"{_pct(f['agreement'])} / {f['false_accepts']} / {f['false_rejects']} / {f['unscorable']}"
      )
    lines.append(f"| {name} | {rows[backends[0]][name]['n']} | " + " | ".join(cells) + " |")
  return lines


def write_markdown(result: dict, path: pathlib.Path):
  backends = list(result["backends"])
  b0 = result["backends"][backends[0]]
  lines = [
    "# Math verifier backends on labelled answer pairs",
    "",
    f"Regenerate: `{result['command']}` (docstring of `experiments/bench_verifier.py`).",
    "",
    f"Set: `{result['cases_file']}`, {b0['n']} cases ({b0['positives']} equivalent, "
    f"{b0['negatives']} not) from {len(b0['by_source'])} public repositories; "
    "`tests/fixtures/verifier/README.md` lists the sources and what was left out. "
    f"Path: `MathReward(backend=...)` in a `RewardPool` ({result['workers']} workers, "
    f"{result['timeout_s']} s timeout), as in training. Machine: {result['machine']}; "
    f"math-verify {result['versions']['math-verify']}, sympy {result['versions']['sympy']}.",
    "",
    *(
      [
        f"**Claim:** {result['claim']} **Verdict: {result['verdict']}.** {result['reason']} "
        "No seeds: the verifiers draw nothing at random.",
        "",
      ]
      if "verdict" in result
      else []
    ),
    "| backend | agreement | false accepts (rate) | false rejects (rate) | unscorable "
    "| timeouts | median ms/case | p95 ms/case | pool wall s |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for b in backends:
    f = result["backends"][b]
    lines.append(
      f"| `{b}` | {_pct(f['agreement'])} ({f['agree']}/{f['n']}) "
      f"| {f['false_accepts']} ({_pct(f['fa_rate'])} of {f['negatives']}) "
      f"| {f['false_rejects']} ({_pct(f['fr_rate'])} of {f['positives']}) "
      f"| {f['unscorable']} | {f['timeouts']} | {f['median_ms']:.3g} | {f['p95_ms']:.3g} "
      f"| {f['pool_wall_s']:.2f} |"
    )
  lines += [
    "",
    "Agreement counts an unscorable item as a disagreement; FA rate is over the "
    "non-equivalent pairs, FR rate over the equivalent ones. ms/case: `MathReward.reward` "
    f"inline, parse caches cleared before each call, {result['repeats']} pass(es).",
    "",
    "## By category",
    "",
    "Whether the text the verifier reads holds a `\\boxed{}` (the builtin backend reads "
    'only boxed, `####` and "answer is" answers):',
    "",
    *_table({b: result["backends"][b]["by_box"] for b in backends}, backends, "completion"),
    "",
    *_table({b: result["backends"][b]["by_category"] for b in backends}, backends, "category"),
    "",
    "## By source",
    "",
    "Most cases come from Hugging Face's test suites (Math-Verify and lighteval, whose "
    "authors wrote the `math_verify` backend and tuned it on these cases; TRL): the rows "
    "below split them from the other projects' cases, so that bias is visible.",
    "",
    *_table({b: result["backends"][b]["by_origin"] for b in backends}, backends, "origin"),
    "",
    *_table({b: result["backends"][b]["by_source"] for b in backends}, backends, "repository"),
    "",
    "## Disagreements",
    "",
  ]
  for b in backends:
    ids = [
      f"{d['id']} ({ {'accept': 'FA', 'reject': 'FR'}.get(d['outcome'], d['outcome']) })"
      for d in result["backends"][b]["disagreements"]
    ]
    lines.append(f"- `{b}` ({len(ids)}): " + ", ".join(ids))
  path.write_text("\n".join(lines) + "\n")


def write_plot(result: dict, path: pathlib.Path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  backends = list(result["backends"])
  metrics = [
    ("agreement", "agreement"),
    ("fa_rate", "false-accept rate"),
    ("fr_rate", "false-reject rate"),
    ("unscorable_rate", "unscorable"),
  ]
  fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1, 1.6]})
  width = 0.8 / len(backends)
  x = np.arange(len(metrics))
  for k, b in enumerate(backends):
    values = [result["backends"][b][m] for m, _ in metrics]
    bars = ax0.bar(x + k * width, values, width, label=b)
    ax0.bar_label(bars, labels=[f"{100 * v:.0f}" for v in values], fontsize=7)
  ax0.set_xticks(x + width * (len(backends) - 1) / 2, [name for _, name in metrics], fontsize=8)
  ax0.set_ylim(0, 1.08)
  ax0.set_ylabel("fraction")
  ax0.set_title(f"{result['backends'][backends[0]]['n']} labelled pairs")
  ax0.legend(fontsize=8)
  cats = list(result["backends"][backends[0]]["by_category"])
  xc = np.arange(len(cats))
  for k, b in enumerate(backends):
    values = [result["backends"][b]["by_category"][c]["agreement"] for c in cats]
    ax1.bar(xc + k * width, values, width, label=b)
  ax1.set_xticks(xc + width * (len(backends) - 1) / 2, cats, rotation=35, ha="right", fontsize=8)
  ax1.set_ylim(0, 1.05)
  ax1.set_title("agreement by category")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--cases", default=str(CASES))
  p.add_argument("--out", default=str(OUT))
  p.add_argument("--backends", default=",".join(math_verify.BACKENDS))
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--timeout_s", type=float, default=10.0, help="the trainer's reward_timeout_s")
  p.add_argument("--repeats", type=int, default=3, help="timed inline passes")
  p.add_argument("--quick", action="store_true", help="24 cases, 1 timed pass (smoke run)")
  args = p.parse_args(argv)
  cases = load_cases(pathlib.Path(args.cases))
  repeats = args.repeats
  if args.quick:
    cases, repeats = quick_subset(cases), 1
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  backends = args.backends.split(",")
  cases_file = pathlib.Path(args.cases)
  result = {
    "command": "python experiments/bench_verifier.py" + (" --quick" if args.quick else ""),
    "cases_file": str(
      cases_file.relative_to(ROOT) if cases_file.is_relative_to(ROOT) else cases_file
    ),
    "quick": args.quick,
    "workers": args.workers,
    "timeout_s": args.timeout_s,
    "repeats": repeats,
    "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
    f"Python {platform.python_version()}",
    "versions": {
      name: importlib.metadata.version(name)
      for name in ("math-verify", "latex2sympy2_extended", "sympy")
    },
    "backends": {
      b: run_backend(b, cases, workers=args.workers, timeout_s=args.timeout_s, repeats=repeats)
      for b in backends
    },
  }
  # Deterministic verifiers: no random draws, so no seeds (the interval is over cases).
  result["seeds"] = []
  result["seeds_note"] = "deterministic: no sampling; uncertainty is over the labelled cases"
  if (v := verdict(result, cases)) is not None:
    result.update(v)
  (out / "verifier.json").write_text(json.dumps(result, indent=1) + "\n")
  write_markdown(result, out / "verifier.md")
  write_plot(result, out / "verifier.png")
  summary = {
    b: {k: f[k] for k in ("agreement", "false_accepts", "false_rejects", "unscorable", "median_ms")}
    for b, f in result["backends"].items()
  }
  print(json.dumps(summary))
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
