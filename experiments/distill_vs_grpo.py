"""On-policy distillation against GRPO from the same start: samples to reach the teacher's
held-out accuracy (rl.advantage="distill", `advantages.distill`; `teacher`).

  python experiments/distill_vs_grpo.py                       # teacher seed 100, students seeds 0-4
  python experiments/distill_vs_grpo.py --seeds 7 --iterations 20 --out /tmp/d   # a smoke run

Design (pre-registered: this docstring and RULE were committed before any run of it):
- For each verdict seed s in 0-4, configs/arithmetic.py:tiny (a ~0.3M-parameter model, 1-2
  digit sums) with seed s: its supervised warm start W_s, then 300 iterations of 32 prompts
  × G = 8, held-out greedy accuracy on its 128 problems every 10 iterations:
    grpo     the config as it is (GRPO on the verifier's reward). This run is also the
             teacher: its iteration-300 checkpoint, and its accuracy there is the target a_s.
    distill  from the same W_s (the same seed: the same warm start and held-out problems),
             rl.advantage="distill" with base "none" (the teacher's per-token log-ratio
             alone, λ_T = 1, γ_T = 0) and config.teacher.path the grpo run's workdir; the
             learning rate, batch and every other key unchanged (nothing tuned).
- Samples to target: 256 × k (32 prompts × 8 rollouts per iteration) for the first
  evaluated iteration k > 0 with accuracy ≥ a_s (grpo reaches it by iteration 300 by
  construction); distill censored (never reached in 300 iterations) counts as more.

Rule: per seed, distill wins if its samples to target are strictly fewer than grpo's.
Supports if distill wins on all 5 seeds (one-sided sign test p = 1/32 = 0.031);
contradicts if it wins on at most 1; otherwise inconclusive, with the power of the 5-seed
rule at the observed win rate. The curves (accuracy against samples, per seed and the
mean) are reported, not judged.

Writes <out>.json (every run's curve, the machine, the date) and <out>.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import tempfile
import time

from demo_seeds import cpu_model, write_record

from grpo_jax.infra import config_lib, logs
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "distill" / "arithmetic_tiny"
CONFIG = "configs/arithmetic.py:tiny"
SEEDS = (0, 1, 2, 3, 4)
ITERATIONS = 300
EVAL_EVERY = 10
RULE = (
  "per seed s, the grpo run from warm start W_s is the teacher and its iteration-300 held-out "
  "greedy accuracy a_s the target; distill (base none, from W_s, teacher that run) wins if it "
  "first reaches a_s in strictly fewer samples than grpo first did (never: a loss); supports "
  "if it wins on all of seeds 0-4, contradicts if on at most 1, otherwise inconclusive."
)
ARMS = {
  "grpo": (),
  "distill": (("rl.advantage", "distill"), ("rl.advantage_options", {"base": "none"})),
}


def _config(seed: int, *, iterations: int, more=()):
  c = config_lib.load(str(ROOT / CONFIG))
  c.update(seed=seed, iterations=iterations, eval_every=EVAL_EVERY, progress=False)
  for key, value in more:
    node, *path = key.split(".")
    target = c
    for part in [node, *path][:-1]:
      target = target[part]
    target[key.split(".")[-1]] = value
  return c


def curve(workdir: pathlib.Path) -> list[tuple[int, float]]:
  """[(iteration, held-out greedy accuracy)] of a run, the warm start's (iteration 0) first."""
  records = logs.read_jsonl(workdir / "metrics.jsonl")
  return [
    (r["iteration"], r["eval/greedy_accuracy"]) for r in records if "eval/greedy_accuracy" in r
  ]


def run(seed: int, workdir: pathlib.Path, *, iterations: int, more=()) -> dict:
  t0 = time.perf_counter()
  train.run(_config(seed, iterations=iterations, more=more), workdir, log=lambda _: None)
  return {"seed": seed, "curve": curve(workdir), "wall_s": round(time.perf_counter() - t0, 1)}


def samples_to(points: list, target: float, *, rows: int) -> int | None:
  """rows × the first evaluated iteration (> 0) whose accuracy is ≥ target; None: never."""
  for it, acc in points:
    if it > 0 and acc >= target:
      return rows * it
  return None


def wins(distill: int | None, grpo: int | None) -> bool:
  """Whether distill reached the target in strictly fewer samples (None: censored)."""
  return distill is not None and (grpo is None or distill < grpo)


def verdict(n_wins: int, n: int) -> str:
  if n_wins == n:
    return "supports"
  if n_wins <= 1:
    return "contradicts"
  return "inconclusive"


def sign_test_power(rate: float, n: int) -> float:
  """P(all n seeds win) when each wins with probability `rate`: the power of the rule's
  supporting outcome at that win rate."""
  return rate**n


def summarise(students: dict, *, rows: int) -> dict:
  per_seed = []
  for seed in sorted(students["grpo"]):
    g, d = students["grpo"][seed], students["distill"][seed]
    target = g["curve"][-1][1]
    sg, sd = samples_to(g["curve"], target, rows=rows), samples_to(d["curve"], target, rows=rows)
    per_seed.append(
      {
        "seed": seed,
        "start": [g["curve"][0][1], d["curve"][0][1]],
        "target": target,
        "grpo_samples": sg,
        "distill_samples": sd,
        "distill_wins": wins(sd, sg),
        "distill_final": d["curve"][-1][1],
        "distill_best": max(a for _, a in d["curve"]),
      }
    )
  n_wins = sum(r["distill_wins"] for r in per_seed)
  return {
    "per_seed": per_seed,
    "wins": n_wins,
    "verdict": verdict(n_wins, len(per_seed)),
    "power_at_observed_rate": sign_test_power(n_wins / len(per_seed), len(per_seed)),
  }


def _mean_curve(runs: dict) -> list[tuple[int, float]]:
  curves = [r["curve"] for r in runs.values()]
  its = [it for it, _ in curves[0]]
  return [(it, sum(c[i][1] for c in curves) / len(curves)) for i, it in enumerate(its)]


def markdown(record: dict) -> str:
  s, rows = record["summary"], record["rows_per_iteration"]
  fmt = lambda n: "not reached" if n is None else f"{n:,}"  # noqa: E731
  lines = [
    f"# On-policy distillation vs GRPO from the same start ({record['date']}, {record['cpu']}, "
    "float32)",
    "",
    f"Rule (pre-registered): {record['rule']}",
    "",
    f"{record['config']}, {record['iterations']} iterations per run; the target of seed s is "
    "its grpo run's (the teacher's) final held-out greedy accuracy.",
    "",
    "| seed | start (both arms) | target | grpo: samples to target | distill: samples to target "
    "| distill wins | distill final | distill best |",
    "|---|---|---|---|---|---|---|---|",
  ]
  pct = lambda x: f"{100 * x:.1f}%"  # noqa: E731
  for r in s["per_seed"]:
    lines.append(
      f"| {r['seed']} | {pct(r['start'][0])} | {pct(r['target'])} | {fmt(r['grpo_samples'])} | "
      f"{fmt(r['distill_samples'])} | {'yes' if r['distill_wins'] else 'no'} | "
      f"{pct(r['distill_final'])} | {pct(r['distill_best'])} |"
    )
  lines += [
    "",
    f"**Verdict: {s['verdict']}** (distill wins on {s['wins']} of {len(s['per_seed'])} seeds; "
    f"power of the 5-seed rule at that win rate: {s['power_at_observed_rate']:.2f}).",
    "",
    f"Mean held-out greedy accuracy against samples ({rows} per iteration):",
    "",
    "| samples | grpo | distill |",
    "|---|---|---|",
  ]
  for (it, g), (_, d) in zip(
    *(_mean_curve(record["students"][a]) for a in ("grpo", "distill")), strict=True
  ):
    lines.append(f"| {rows * it:,} | {100 * g:.1f}% | {100 * d:.1f}% |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
  p.add_argument("--iterations", type=int, default=ITERATIONS)
  p.add_argument("--out", default=str(OUT), help="<out>.json and <out>.md")
  args = p.parse_args(argv)
  base = _config(0, iterations=args.iterations)
  rows = base.prompts_per_step * base.sampler.group_size
  students = {arm: {} for arm in ARMS}
  with tempfile.TemporaryDirectory() as tmp:
    for seed in args.seeds:
      teacher_dir = pathlib.Path(tmp) / f"grpo{seed}"
      for arm, more in ARMS.items():
        more = (*more, ("teacher.path", str(teacher_dir))) if arm == "distill" else more
        got = run(seed, pathlib.Path(tmp) / f"{arm}{seed}", iterations=args.iterations, more=more)
        students[arm][seed] = got
        print(json.dumps({arm: got}), flush=True)
  record = {
    "rule": RULE,
    "config": CONFIG,
    "date": datetime.date.today().isoformat(),
    "cpu": cpu_model(),
    "iterations": args.iterations,
    "rows_per_iteration": rows,
    "students": students,
    "summary": summarise(students, rows=rows),
  }
  out = pathlib.Path(args.out)
  write_record(out, record, markdown)
  return record


if __name__ == "__main__":
  main()
