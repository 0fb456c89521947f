"""π_old's log-probs from the update's own forward (rl.old_logp_from "update") against a
forward of their own before rewards ("forward"): whole trainer iterations, same config.

  python experiments/bench_old_logp.py          # the benchmark, one JSON line last
  python experiments/bench_old_logp.py --quick  # a small smoke run (the tests)
  python experiments/bench_old_logp.py --out experiments/results/cpu/DATE_MACHINE_old_logp

With one optimizer step per update (rl.num_minibatches × rl.ppo_epochs = 1, the shipped
configs' plan), the update's forward runs at the params π_old's forward would, so
stop_gradient(log π_θ) is π_old exactly and that forward can be skipped: prepare keeps
only the advantages and masks. Each workload runs `train.run` of its config under both
sources, alternating (forward, update, forward, update, ... for --rounds rounds), from the
same seed; a figure is the median over every round's iterations after the first (which
compiles) of the record's time/prepare, time/update and time/iteration. The two runs'
losses are checked equal, iteration by iteration, before any time is reported.

Workloads (configs/): "demo", the default demo (arithmetic.py:tiny: 32 prompts × G 8,
16-token prompts, 8 new tokens); "bits", reasoning.py:bits (the same model and schedule,
88-token prompts); --quick runs "quick", arithmetic.py:quick's 1-layer model. Each
warm-starts for --warmstart_steps steps and evaluates 16 problems once, at the end
(neither is timed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import tempfile

import demo_seeds
import jax

from grpo_jax.infra import config_lib
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKLOADS = {
  "demo": ("arithmetic.py", "tiny"),
  "bits": ("reasoning.py", "bits"),
  "quick": ("arithmetic.py", "quick"),  # --quick: a 1-layer model, for the tests.
}
SOURCES = ("forward", "update")


def config(workload: str, *, source: str, iterations: int, warmstart_steps: int):
  """The workload's config with π_old from `source` and a short untimed warm start."""
  file, variant = WORKLOADS[workload]
  c = config_lib.load(
    f"{ROOT / 'configs' / file}:{variant}",
    iterations=iterations,
    warmstart_steps=warmstart_steps,
    eval_every=iterations,
    eval_size=16,
    eval_samples=0,
    checkpoint_every=iterations,
    reward_workers=0,
    progress=False,
    tensorboard=False,
  )
  c.rl.old_logp_from = source
  return c


def one_run(workload: str, *, source: str, iterations: int, warmstart_steps: int) -> list[dict]:
  """The RL records of one run (iterations 1..), in a fresh temporary workdir."""
  c = config(workload, source=source, iterations=iterations, warmstart_steps=warmstart_steps)
  with tempfile.TemporaryDirectory() as workdir:
    train.run(c, workdir, log=lambda _: None)
    lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [r for r in map(json.loads, lines) if r.get("phase") == "rl"]


def measure(workload: str, *, rounds: int, iterations: int, warmstart_steps: int) -> dict:
  """Median phase seconds per source and the iteration-time ratio forward / update."""
  times = {s: {"prepare": [], "update": [], "iteration": []} for s in SOURCES}
  worst = 0.0
  for _ in range(rounds):
    records = {
      s: one_run(workload, source=s, iterations=iterations, warmstart_steps=warmstart_steps)
      for s in SOURCES
    }
    for a, b in zip(records["forward"], records["update"], strict=True):
      worst = max(worst, abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-3))
    for s in SOURCES:
      for r in records[s][1:]:  # The first iteration compiles.
        for phase in times[s]:
          times[s][phase].append(r[f"time/{phase}"])
  if worst > 1e-3:
    raise AssertionError(f"{workload}: the two sources' losses differ by {worst:.2e} (relative).")
  out = {s: {f"{k}_s": statistics.median(v) for k, v in times[s].items()} for s in SOURCES}
  out["iteration_ratio"] = out["forward"]["iteration_s"] / out["update"]["iteration_s"]
  out["samples"] = len(times["update"]["iteration"])
  out["loss_max_rel_diff"] = worst
  return out


def markdown(record: dict) -> str:
  """The result as a table."""
  rows = [
    f"# π_old from the update's forward ({record['date']}, {record['cpu']}, "
    f"{record['dtype']}, jax {record['jax']})",
    "",
    "Median seconds per trainer iteration (after the first); forward: π_old by a forward "
    "of its own before rewards; update: from the update's forward.",
    "",
    "| workload | source | prepare | update | iteration | forward / update |",
    "|---|---|---|---|---|---|",
  ]
  for name, w in record["workloads"].items():
    for s in SOURCES:
      t = w[s]
      ratio = f"{w['iteration_ratio']:.2f}×" if s == "update" else ""
      rows.append(
        f"| {name} | {s} | {t['prepare_s']:.3f} | {t['update_s']:.3f} | "
        f"{t['iteration_s']:.3f} | {ratio} |"
      )
  return "\n".join(rows) + "\n"


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workloads", default="demo,bits")
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--iterations", type=int, default=12)
  parser.add_argument("--warmstart_steps", type=int, default=20)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--out", default="", help="writes OUT.json and OUT.md")
  args = parser.parse_args(argv)
  if args.quick:
    args.workloads, args.rounds, args.iterations, args.warmstart_steps = "quick", 1, 3, 2
  record = {
    "claim": None,  # A description of one sitting, not a pre-registered claim.
    "verdict": "not judged",
    "date": datetime.date.today().isoformat(),
    "cpu": demo_seeds.cpu_model(),
    "machine": platform.machine(),
    "devices": str(jax.devices()[0].device_kind),
    "jax": jax.__version__,
    "dtype": "float32",
    "rounds": args.rounds,
    "iterations": args.iterations,
    "seeds": [0],
    "workloads": {
      w: measure(
        w, rounds=args.rounds, iterations=args.iterations, warmstart_steps=args.warmstart_steps
      )
      for w in args.workloads.split(",")
    },
  }
  if args.out:
    pathlib.Path(args.out + ".json").write_text(json.dumps(record, indent=1) + "\n")
    pathlib.Path(args.out + ".md").write_text(markdown(record))
  print(json.dumps(record))
  return record


if __name__ == "__main__":
  main()
