"""LoRA against full fine-tuning on configs/arithmetic.py:tiny, the same budget, 3 seeds.

  python experiments/lora_vs_full.py                          # verdict seeds 0 1 2
  python experiments/lora_vs_full.py --seeds 10 --lora_lr 3e-3 --out /tmp/tune  # tuning

Per seed, two runs of the tiny arithmetic config, each from its own supervised warm start
(the same seed, data and steps: with adapters the warm start trains the base with B = 0,
so both arms start from the same weights; the table shows both warm-start accuracies),
then `--iterations` GRPO iterations:
  full: every weight trains (lr 1e-4, the config's);
  lora: adapters of rank `--rank` on q, k, v, o, gate, up, down train (`--lora_lr`), the
    base is frozen.
Figures per run: held-out greedy accuracy after the warm start and at the end (128
problems), the gain, the median seconds per RL iteration after the first (which compiles),
and the bytes of device arrays alive during iteration 2 (`jax.live_arrays`: params,
optimizer state, the reference when there is one, and whatever the step keeps) in a
second, 2-iteration run with a KL term (kl_coef 0.01, so the full arm holds a reference
copy and the LoRA arm's reference is its base).

The rule, fixed before the verdict runs (the adapter learning rate was chosen on seed 10,
which is not a verdict seed):
  RULE: "on every verdict seed, LoRA's held-out gain is at least half of full
  fine-tuning's gain, and the LoRA run holds fewer live bytes with a KL term".
Writes <out>.json and <out>.md (default experiments/results/lora/arithmetic_tiny).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import tempfile
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

from grpo_jax.infra import config_lib, logs  # noqa: E402
from grpo_jax.trainer import train  # noqa: E402

RULE = (
  "on every verdict seed, LoRA's held-out gain is at least half of full fine-tuning's gain, "
  "and the LoRA run holds fewer live bytes with a KL term"
)
VERDICT_SEEDS = (0, 1, 2)


def make_config(arm: str, *, seed: int, iterations: int, rank: int, lora_lr: float):
  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":tiny")
  c.update(seed=seed, iterations=iterations, eval_every=iterations, eval_size=128)
  c.update(eval_samples=0, checkpoint_every=iterations, reward_workers=0, progress=False)
  c.tensorboard = False
  if arm == "lora":
    c.model.lora.update(rank=rank, alpha=2.0 * rank)
    c.learning_rate = lora_lr
  return c


def live_bytes(arm: str, *, seed: int, rank: int, lora_lr: float) -> int:
  """Bytes of live device arrays during iteration 2 of a run with kl_coef = 0.01."""
  c = make_config(arm, seed=seed, iterations=2, rank=rank, lora_lr=lora_lr)
  c.update(warmstart_steps=10, eval_size=8)
  c.rl.kl_coef = 0.01
  seen = {}

  def measure(it, record):
    if it == 2:
      seen["bytes"] = sum(x.nbytes for x in jax.live_arrays())

  with tempfile.TemporaryDirectory() as d:
    train.run(c, d, log=lambda _: None, on_iteration=measure)
  return seen["bytes"]


def run_arm(arm: str, *, seed: int, iterations: int, rank: int, lora_lr: float) -> dict:
  c = make_config(arm, seed=seed, iterations=iterations, rank=rank, lora_lr=lora_lr)
  with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    summary = train.run(c, d, log=lambda _: None)
    wall = time.perf_counter() - t0
    records = logs.read_jsonl(pathlib.Path(d) / "metrics.jsonl")
  times = [r["time/iteration"] for r in records if r["phase"] == "rl"][1:]
  gain = summary["final_accuracy"] - summary["warmstart_accuracy"]
  return {
    "warmstart_accuracy": summary["warmstart_accuracy"],
    "final_accuracy": summary["final_accuracy"],
    "gain_points": 100 * gain,
    "s_per_iteration": float(np.median(times)),
    "wall_s": wall,
    "live_bytes_kl": live_bytes(arm, seed=seed, rank=rank, lora_lr=lora_lr),
  }


def verdict(rows: list[dict]) -> str:
  """supports: the rule holds on every seed; contradicts: on none; else inconclusive."""
  hits = [
    r["lora"]["gain_points"] >= 0.5 * r["full"]["gain_points"]
    and r["lora"]["live_bytes_kl"] < r["full"]["live_bytes_kl"]
    for r in rows
  ]
  return "supports" if all(hits) else "contradicts" if not any(hits) else "inconclusive"


def markdown(result: dict) -> str:
  lines = [
    f"# LoRA vs full fine-tuning, configs/arithmetic.py:tiny ({result['date']})",
    "",
    f"Machine: {result['machine']}, float32, nothing else running. {result['iterations']} "
    f"GRPO iterations after a 400-step warm start; LoRA rank {result['rank']}, alpha "
    f"{2 * result['rank']}, lr {result['lora_lr']:g} (full: 1e-4).",
    "",
    f"Rule (fixed before the runs): {result['rule']}. Verdict: **{result['verdict']}**.",
    "",
    "| seed | arm | warm start | final | gain (points) | s / iteration | live MB (KL on) |",
    "|---|---|---|---|---|---|---|",
  ]
  for row in result["rows"]:
    for arm in ("full", "lora"):
      r = row[arm]
      lines.append(
        f"| {row['seed']} | {arm} | {100 * r['warmstart_accuracy']:.1f}% | "
        f"{100 * r['final_accuracy']:.1f}% | {r['gain_points']:+.1f} | "
        f"{r['s_per_iteration']:.3f} | {r['live_bytes_kl'] / 2**20:.2f} |"
      )
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--seeds", default=",".join(map(str, VERDICT_SEEDS)))
  p.add_argument("--iterations", type=int, default=100)
  p.add_argument("--rank", type=int, default=8)
  p.add_argument("--lora_lr", type=float, default=1e-3)
  p.add_argument("--arms", default="full,lora")
  p.add_argument("--out", default=str(ROOT / "experiments/results/lora/arithmetic_tiny"))
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  rows = []
  for seed in seeds:
    row = {"seed": seed}
    for arm in args.arms.split(","):
      row[arm] = run_arm(
        arm, seed=seed, iterations=args.iterations, rank=args.rank, lora_lr=args.lora_lr
      )
      print(json.dumps({"seed": seed, "arm": arm, **row[arm]}), flush=True)
    rows.append(row)
  result = {
    "date": time.strftime("%Y-%m-%d"),
    "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, jax {jax.__version__}",
    "seeds": seeds,
    "iterations": args.iterations,
    "rank": args.rank,
    "lora_lr": args.lora_lr,
    "rule": RULE,
    "rows": rows,
  }
  full = all("full" in r and "lora" in r for r in rows)
  result["verdict"] = verdict(rows) if full and tuple(seeds) == VERDICT_SEEDS else "not judged"
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
  if full:
    out.with_suffix(".md").write_text(markdown(result))
  print(json.dumps({"verdict": result["verdict"]}))
  return result


if __name__ == "__main__":
  main()
