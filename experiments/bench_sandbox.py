"""What the code sandbox costs: seconds per call, and items/s through the reward pool.

  python experiments/bench_sandbox.py                    # 200 calls per mode, 4 pool rounds
  python experiments/bench_sandbox.py --calls 50 --rounds 2

Per-call overhead: `sandbox.run` of a one-line function with one test, `--calls` times in
a row, with isolation "namespaces" and "none" (the median and the 10th/90th percentiles of
the wall seconds; the first call of each mode, which pays the probe, is left out).

Pool throughput: a `reward_pool.RewardPool` with `--workers` workers scores the shipped code
problems' reference solutions (`tasks.code`, 53 problems, every one a "pass") `--rounds`
times over; items/s is the median over rounds of items / wall seconds. Each item is one
sandbox run plus the pool's pickling and the code extraction.

Measure on a quiet machine: anything else running (a test suite, a helper) makes the
figures void. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from grpo_jax.tasks import code as code_task
from grpo_jax.verifiers import reward_pool, sandbox


def per_call(isolation: str, calls: int) -> dict:
  tests = [sandbox.parse_test("assert f(2) == 3")]
  code = "def f(x):\n  return x + 1\n"
  first = sandbox.run(code, tests, isolation=isolation)
  if first.verdict != "pass":
    raise RuntimeError(f"the benchmark's call failed with {isolation}: {first}")
  seconds = []
  for _ in range(calls):
    start = time.perf_counter()
    result = sandbox.run(code, tests, isolation=isolation)
    seconds.append(time.perf_counter() - start)
    assert result.verdict == "pass", result
  q10, q50, q90 = np.percentile(seconds, [10, 50, 90])
  return {
    "isolation": result.isolation,
    "median_ms": round(1e3 * q50, 2),
    "p10_ms": round(1e3 * q10, 2),
    "p90_ms": round(1e3 * q90, 2),
  }


def pool_throughput(*, workers: int, rounds: int, isolation: str) -> dict:
  task = code_task.CodeTask(isolation=isolation)
  problems = task.split_problems("train") + task.split_problems("test")
  examples = [task.example_of(p) for p in problems]
  prompts = [task.reward_input(e) for e in examples]
  completions = [e.reference for e in examples]
  rates = []
  with reward_pool.RewardPool(task, workers=workers, timeout_s=30.0) as pool:
    pool.score(prompts[:workers], completions[:workers])  # Warm: each worker's probe.
    for _ in range(rounds):
      start = time.perf_counter()
      scores = pool.score(prompts, completions)
      rates.append(len(prompts) / (time.perf_counter() - start))
      if scores.errors or scores.correct_N.min() < 1:
        raise RuntimeError(f"a reference solution did not pass: {scores.messages[:3]}")
  return {
    "workers": workers,
    "items": len(prompts),
    "items_per_s": round(statistics.median(rates), 1),
    "items_per_s_min": round(min(rates), 1),
    "items_per_s_max": round(max(rates), 1),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=200)
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--isolation", default="auto", help="for the pool")
  args = parser.parse_args()
  figures = {
    "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    "per_call": {mode: per_call(mode, args.calls) for mode in ("namespaces", "none")},
    "pool": pool_throughput(workers=args.workers, rounds=args.rounds, isolation=args.isolation),
  }
  for mode, fig in figures["per_call"].items():
    print(
      f"per call, {mode:10s}: {fig['median_ms']:.1f} ms median "
      f"({fig['p10_ms']:.1f}-{fig['p90_ms']:.1f} ms, 10th-90th percentile)"
    )
  pool = figures["pool"]
  print(
    f"pool, {pool['workers']} workers: {pool['items_per_s']:.1f} items/s "
    f"({pool['items_per_s_min']:.1f}-{pool['items_per_s_max']:.1f} over rounds)"
  )
  print(json.dumps(figures))


if __name__ == "__main__":
  main()
