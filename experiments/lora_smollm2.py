"""LoRA against full fine-tuning on configs/smollm2.py:cpu: the verdict of the rule in
experiments/results/lora/smollm2_rule.md (written before the runs).

  nice -n 10 python experiments/smollm2_seeds.py --variant=cpu --seeds 0 1 2 \\
      --root /tmp/smollm2_lora --out experiments/results/lora/smollm2_lora_seeds \\
      --config.model.lora.rank=16 --config.learning_rate=<the lr chosen on seed 10>
  python experiments/lora_smollm2.py

Reads the LoRA seeds (`smollm2_seeds.py`'s <out>.json) and the full fine-tuning seeds
(experiments/results/smollm2/cpu_seeds.json), applies the rule seed by seed and writes
experiments/results/lora/smollm2_vs_full.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
RULE = (
  "on every verdict seed (0, 1, 2), LoRA's held-out greedy gain is at least half of the "
  "full arm's gain on that seed"
)
VERDICT_SEEDS = ("0", "1", "2")


def verdict(hits: list[bool]) -> str:
  return "supports" if all(hits) else "contradicts" if not any(hits) else "inconclusive"


def compare(lora: dict, full: dict) -> dict:
  rows, hits = [], []
  for seed in VERDICT_SEEDS:
    a, b = lora["seeds"][seed], full["seeds"][seed]
    hit = a["gain"] >= 0.5 * b["gain"]
    hits.append(hit)
    rows.append(
      {
        "seed": int(seed),
        "lora": {k: a[k] for k in ("before", "after", "gain", "evals", "seconds_per_iteration")},
        "full": {k: b[k] for k in ("before", "after", "gain", "evals", "seconds_per_iteration")},
        "holds": hit,
      }
    )
  return {
    "rule": RULE,
    "verdict": verdict(hits),
    "lora_command": lora["command"],
    "full_command": full["command"],
    "machine": lora["machine"],
    "rows": rows,
  }


def markdown(result: dict) -> str:
  lines = [
    "# LoRA (rank 16) vs full fine-tuning, configs/smollm2.py:cpu",
    "",
    f"Machine: {result['machine']}. LoRA: `{result['lora_command']}`. Full: "
    f"`{result['full_command']}` (committed earlier; experiments/results/smollm2/cpu_seeds.md).",
    "",
    f"Rule (experiments/results/lora/smollm2_rule.md, written before the runs): {result['rule']}. "
    f"Verdict: **{result['verdict']}**.",
    "",
    "| seed | arm | before | after | gain (points) | evals (iteration: accuracy) | s / iteration | holds |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for row in result["rows"]:
    for arm in ("full", "lora"):
      r = row[arm]
      evals = ", ".join(f"{i}: {100 * a:.1f}%" for i, a in r["evals"])
      holds = ("yes" if row["holds"] else "no") if arm == "lora" else ""
      lines.append(
        f"| {row['seed']} | {arm} | {100 * r['before']:.1f}% | {100 * r['after']:.1f}% | "
        f"{100 * r['gain']:+.1f} | {evals} | {r['seconds_per_iteration']:.1f} | {holds} |"
      )
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--lora", default=str(RESULTS / "lora" / "smollm2_lora_seeds.json"))
  p.add_argument("--full", default=str(RESULTS / "smollm2" / "cpu_seeds.json"))
  p.add_argument("--out", default=str(RESULTS / "lora" / "smollm2_vs_full"))
  args = p.parse_args(argv)
  result = compare(
    json.loads(pathlib.Path(args.lora).read_text()), json.loads(pathlib.Path(args.full).read_text())
  )
  pathlib.Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
  pathlib.Path(args.out + ".md").write_text(markdown(result))
  print(markdown(result))
  return result


if __name__ == "__main__":
  main()
