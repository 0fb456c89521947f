"""The default demo's result over seeds: what `grpo-jax-demo` (configs/arithmetic.py:tiny)
gives on this machine, as a range, not one run.

  python experiments/demo_seeds.py                        # seeds 0-4
  python experiments/demo_seeds.py --seeds 5 6 --out /tmp/demo

Each seed runs the demo's config in-process with `seed=s` (its own warm start, held-out
problems and rollouts): held-out greedy accuracy on its 128 problems after the warm start
and after the 300th iteration, with the 95% bootstrap intervals the run prints, and the
wall seconds. A description, not a claim: nothing is judged. The README's quickstart
states the range this gives (a CPU model other than the one measured moves the float
rounding, and with it the trajectory: the README lists the machines measured).

Writes <out>.json (every seed's figures, the machine, the date) and <out>.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import tempfile
import time

from grpo_jax.infra import config_lib
from grpo_jax.trainer import train

SEEDS = (0, 1, 2, 3, 4)
CONFIG = "configs/arithmetic.py:tiny"


def cpu_model() -> str:
  """The CPU's model name (/proc/cpuinfo), or the platform's processor string."""
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def write_record(out: pathlib.Path, record: dict, markdown) -> None:
  """out.json (the record) and out.md (`markdown(record)`), printed too."""
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
  out.with_suffix(".md").write_text(markdown(record))
  print(markdown(record))


def run_seed(seed: int, workdir: pathlib.Path) -> dict:
  c = config_lib.load(CONFIG)
  c.update(seed=seed, progress=False)
  t0 = time.perf_counter()
  s = train.run(c, workdir, log=lambda _: None)
  return {
    "seed": seed,
    "warmstart_accuracy": s["warmstart_accuracy"],
    "warmstart_accuracy_ci": s.get("warmstart_accuracy_ci"),
    "final_accuracy": s["final_accuracy"],
    "final_accuracy_ci": s.get("final_accuracy_ci"),
    "problems": s.get("final_problems"),
    "gain_points": round(100 * (s["final_accuracy"] - s["warmstart_accuracy"]), 1),
    "wall_s": round(time.perf_counter() - t0, 1),
  }


def summarise(rows: list[dict]) -> dict:
  pick = lambda k: [r[k] for r in rows]  # noqa: E731
  return {
    "warmstart_range": [min(pick("warmstart_accuracy")), max(pick("warmstart_accuracy"))],
    "final_range": [min(pick("final_accuracy")), max(pick("final_accuracy"))],
    "gain_range_points": [min(pick("gain_points")), max(pick("gain_points"))],
    "wall_range_s": [min(pick("wall_s")), max(pick("wall_s"))],
  }


def markdown(record: dict) -> str:
  lines = [
    f"# {record['config']} over seeds ({record['date']}, {record['cpu']}, float32)",
    "",
    "| seed | after warm start | after GRPO | gain (points) | wall (s) |",
    "|---|---|---|---|---|",
  ]
  for r in record["seeds"]:
    lines.append(
      f"| {r['seed']} | {100 * r['warmstart_accuracy']:.1f}% | {100 * r['final_accuracy']:.1f}% "
      f"| {r['gain_points']:+.1f} | {r['wall_s']:.0f} |"
    )
  s = record["summary"]
  lines += [
    "",
    f"Range: {100 * s['warmstart_range'][0]:.1f}-{100 * s['warmstart_range'][1]:.1f}% after the "
    f"warm start, {100 * s['final_range'][0]:.1f}-{100 * s['final_range'][1]:.1f}% after GRPO, "
    f"{s['gain_range_points'][0]:+.1f} to {s['gain_range_points'][1]:+.1f} points, "
    f"{s['wall_range_s'][0]:.0f}-{s['wall_range_s'][1]:.0f} s.",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
  p.add_argument("--out", default="", help="<out>.json and <out>.md ('': print only)")
  args = p.parse_args(argv)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:
      rows.append(run_seed(seed, pathlib.Path(tmp) / f"seed{seed}"))
      print(json.dumps(rows[-1]), flush=True)
  record = {
    "claim": None,  # A description: no rule was written before the runs, so none is judged.
    "verdict": "not judged",
    "config": CONFIG,
    "date": datetime.date.today().isoformat(),
    "cpu": cpu_model(),
    "seeds": rows,
    "summary": summarise(rows),
  }
  if args.out:
    pathlib.Path(args.out + ".json").write_text(json.dumps(record, indent=1) + "\n")
    pathlib.Path(args.out + ".md").write_text(markdown(record))
  print(markdown(record))
  return record


if __name__ == "__main__":
  main()
