"""configs/smollm2.py over several seeds: held-out greedy accuracy before and after GRPO.

  pip install -e ".[smollm]"
  nice -n 10 python experiments/smollm2_seeds.py                # cpu, seeds 0 1 2, in turn
  python experiments/smollm2_seeds.py --collect                 # only re-read the workdirs

Each seed runs `grpo-jax --config=configs/smollm2.py:<variant> --config.seed=s` in its own
process (workdir <root>/seed_s; a finished one is not rerun). Figures per seed, from its
summary.json and metrics.jsonl: greedy accuracy on its held-out problems at iteration 0 and
at the end (the same problems: `eval_size` draws of the test split for that seed), the
gain, wall seconds, the median seconds per iteration and tokens/s of the iterations after
the first (which compiles), the 1-minute load average at the start and end of the run
(the machine may be shared: a wall-clock figure is only comparable at the same load) and
the CPU seconds the run used (user + system, its reward workers included), which a shared
machine does not inflate: on an idle 2-core machine the wall time is about that / 2, and
the peak resident memory of its largest process (the trainer), against the config's
memory_limit_gib.

Writes <out>.json, <out>.md and <out>.png (accuracy against iteration, one line per seed);
default experiments/results/smollm2/<variant>_seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _load() -> float:
  return float(pathlib.Path("/proc/loadavg").read_text().split()[0])


# The acceptance rule of the cpu config, written before its runs. Wall time is judged on the
# table, by hand: only a run alone on its machine gives a wall time that means anything.
RULE = "every seed's held-out greedy accuracy rises by at least 10 points."
MIN_GAIN_POINTS = 10.0


def verdict(gains_points: np.ndarray) -> str:
  """supports: every seed gains >= MIN_GAIN_POINTS; contradicts: none does; else
  inconclusive."""
  hits = gains_points >= MIN_GAIN_POINTS
  return "supports" if hits.all() else "contradicts" if not hits.any() else "inconclusive"


def run_seed(variant: str, seed: int, workdir: pathlib.Path, extra: list[str]) -> dict:
  """Runs one seed unless its summary.json exists; returns the loads around the run."""
  if (workdir / "summary.json").exists():
    return (
      json.loads((workdir / "loads.json").read_text()) if (workdir / "loads.json").exists() else {}
    )
  loads = dict(load_start=_load(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
  cmd = [
    "grpo-jax",
    f"--config={ROOT / 'configs' / 'smollm2.py'}:{variant}",
    f"--workdir={workdir}",
    f"--config.seed={seed}",
    "--config.progress=False",
    *extra,
  ]
  print(" ".join(cmd), flush=True)
  proc = subprocess.Popen(cmd, cwd=ROOT)
  _, status, usage = os.wait4(proc.pid, 0)  # This run's own usage (its reward workers too).
  proc.returncode = os.waitstatus_to_exitcode(status)
  if proc.returncode:
    raise subprocess.CalledProcessError(proc.returncode, cmd)
  loads.update(
    load_end=_load(),
    cpu_seconds=round(usage.ru_utime + usage.ru_stime, 1),
    peak_rss_gib=round(usage.ru_maxrss / 2**20, 2),  # ru_maxrss: KiB, its largest process.
  )
  (workdir / "loads.json").write_text(json.dumps(loads))
  return loads


def seed_figures(workdir: pathlib.Path, loads: dict) -> dict:
  from grpo_jax.infra import logs

  summary = json.loads((workdir / "summary.json").read_text())
  records = logs.read_jsonl(workdir / "metrics.jsonl")
  rl = [r for r in records if r.get("phase") == "rl"]
  evals = [
    (r["iteration"], r["eval/greedy_accuracy"]) for r in records if "eval/greedy_accuracy" in r
  ]
  steady = rl[1:] or rl
  return dict(
    before=summary["warmstart_accuracy"],
    after=summary["final_accuracy"],
    gain=summary["final_accuracy"] - summary["warmstart_accuracy"],
    iterations=summary["iterations_done"],
    wall_seconds=summary["wall_seconds"],
    seconds_per_iteration=float(np.median([r["time/iteration"] for r in steady])),
    first_iteration_seconds=rl[0]["time/iteration"] if rl else None,
    tokens_per_s=float(np.median([r["tokens_per_s"] for r in steady])),
    train_reward_first=rl[0]["accuracy"] if rl else None,
    train_reward_last5=float(np.mean([r["accuracy"] for r in rl[-5:]])) if rl else None,
    evals=evals,
    **loads,
  )


def markdown(variant: str, out: dict) -> str:
  lines = [
    f"# configs/smollm2.py:{variant}: held-out greedy accuracy before and after GRPO",
    "",
    f"Machine: {out['machine']}. Command: `{out['command']}`.",
    "",
    "| seed | before | after | gain (points) | wall s | CPU s | s/iteration | tokens/s | peak "
    "RSS GiB | load start/end |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for s, r in out["seeds"].items():
    lines.append(
      f"| {s} | {100 * r['before']:.1f}% | {100 * r['after']:.1f}% | {100 * r['gain']:+.1f} | "
      f"{r['wall_seconds']:.0f} | {r.get('cpu_seconds', '?')} | {r['seconds_per_iteration']:.1f} | "
      f"{r['tokens_per_s']:.0f} | {r.get('peak_rss_gib', '?')} | "
      f"{r.get('load_start', '?')}/{r.get('load_end', '?')} |"
    )
  g = out["gain_points"]
  lines += [
    "",
    f"Gain: mean {g['mean']:+.1f} points, min {g['min']:+.1f}, max {g['max']:+.1f} over "
    f"{len(out['seeds'])} seeds.",
    "",
    f"**Rule (fixed before the runs):** {RULE} **Verdict: {out['verdict']}.**",
    "",
  ]
  return "\n".join(lines)


def plot(path: pathlib.Path, variant: str, seeds: dict) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 3.5))
  for s, r in seeds.items():
    it, acc = zip(*r["evals"])
    ax.plot(it, 100 * np.array(acc), "o-", label=f"seed {s}")
  ax.set(
    xlabel="GRPO iteration",
    ylabel="held-out greedy accuracy (%)",
    title=f"SmolLM2-135M-Instruct, configs/smollm2.py:{variant}",
  )
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--variant", default="cpu")
  parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
  parser.add_argument("--root", default="/tmp/smollm2_seeds")
  parser.add_argument("--out", default="")
  parser.add_argument("--collect", action="store_true", help="Only read existing workdirs.")
  args, extra = parser.parse_known_args(argv)
  root = pathlib.Path(args.root) / args.variant
  seeds = {}
  for s in args.seeds:
    workdir = root / f"seed_{s}"
    loads = {} if args.collect else run_seed(args.variant, s, workdir, extra)
    if args.collect and (workdir / "loads.json").exists():
      loads = json.loads((workdir / "loads.json").read_text())
    seeds[s] = seed_figures(workdir, loads)
  gains = 100 * np.array([r["gain"] for r in seeds.values()])
  out = dict(
    variant=args.variant,
    command=f"python experiments/smollm2_seeds.py --variant={args.variant} " + " ".join(extra),
    machine=f"{os.cpu_count()} CPUs (shared with other jobs: see the load averages)",
    seeds=seeds,
    gain_points=dict(mean=float(gains.mean()), min=float(gains.min()), max=float(gains.max())),
    rule=RULE,
    verdict=verdict(gains),
  )
  dest = pathlib.Path(args.out or ROOT / "experiments/results/smollm2" / f"{args.variant}_seeds")
  dest.parent.mkdir(parents=True, exist_ok=True)
  dest.with_suffix(".json").write_text(json.dumps(out, indent=2))
  dest.with_suffix(".md").write_text(markdown(args.variant, out))
  plot(dest.with_suffix(".png"), args.variant, seeds)
  print(markdown(args.variant, out))


if __name__ == "__main__":
  main()
