"""What a hanging verifier costs: wall seconds per hang against timeout / workers.

  python experiments/bench_reward_hangs.py                    # 8 hangs in 64 items, 2 and 4 workers
  python experiments/bench_reward_hangs.py --hangs 16 --timeout 0.5

A `reward_pool.RewardPool` scores N items of which k never return (the task sleeps), with a
per-item timeout T and W workers. Each hang costs its worker T, then the worker is killed
and replaced; the other workers go on meanwhile. The ideal wall time is k·T/W (plus the
real scoring, ~0 here). The task's module imports jax and grpo_jax, as a reward that
imports the trainer's modules does: a replacement worker that imported it afresh would
pay seconds per hang. Figures: the median over --repeats calls of the wall seconds, the
seconds per hang, and the ratio to the ideal.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import hanging_task  # noqa: E402

from grpo_jax.verifiers import reward_pool  # noqa: E402


def measure(*, workers: int, items: int, hangs: int, timeout: float, repeats: int) -> dict:
  completions = ["hang" if i % (items // hangs) == 0 else "ok" for i in range(items)][:items]
  k = completions.count("hang")
  times = []
  with reward_pool.RewardPool(hanging_task.HangTask(), workers=workers, timeout_s=timeout) as pool:
    pool.score(["p"] * items, ["ok"] * items)  # Start the workers.
    for _ in range(repeats):
      t0 = time.perf_counter()
      scores = pool.score(["p"] * items, completions)
      times.append(time.perf_counter() - t0)
      assert scores.timeouts == k, scores.timeouts
  wall = statistics.median(times)
  ideal = k * timeout / workers
  return {
    "workers": workers,
    "items": items,
    "hangs": k,
    "timeout_s": timeout,
    "wall_s": round(wall, 3),
    "per_hang_s": round(wall / k, 3),
    "ideal_s": round(ideal, 3),
    "vs_ideal": round(wall / ideal, 2),
  }


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--items", type=int, default=64)
  parser.add_argument("--hangs", type=int, default=8)
  parser.add_argument("--timeout", type=float, default=0.3)
  parser.add_argument("--workers", default="2,4")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  rows = []
  for w in (int(x) for x in args.workers.split(",")):
    row = measure(
      workers=w, items=args.items, hangs=args.hangs, timeout=args.timeout, repeats=args.repeats
    )
    rows.append(row)
    print(
      f"{row['workers']} workers, {row['hangs']} hangs of {row['items']} items, timeout "
      f"{row['timeout_s']} s: {row['wall_s']:.2f} s ({row['per_hang_s']:.2f} s per hang; "
      f"ideal k*T/W = {row['ideal_s']:.2f} s, {row['vs_ideal']:.2f}x)"
    )
  result = {"rows": rows}
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
