"""Kill/resume cycles: how many interrupted runs end with exactly the uninterrupted metrics.

  python experiments/reliability.py                 # 10 cycles of configs/arithmetic.py:tiny, reduced
  python experiments/reliability.py --cycles 30 --signal term
  python experiments/reliability.py --quick         # 2 cycles of a smaller run (CI smoke test)

One uninterrupted run of the command line gives the reference metrics.jsonl. Each cycle
then starts a fresh workdir and runs the same command, killing it (SIGKILL, or SIGTERM
with --signal term) at a uniformly random moment of a run's wall time (seeded), and reruns
it; a rerun may be killed again (--kills per cycle), and the last one runs to the end. A
cycle *matches* when its metrics.jsonl equals the reference line for line on every key
but the timing ones (time/*, tokens_per_s, perf/*). The kill moments land anywhere: in
the start-up, the warm start, an iteration, a checkpoint save.

Prints one line per cycle and, last, one JSON object: cycles, matched, kills, the kill
moments and where each landed (the iteration the killed session had logged).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "--config=configs/arithmetic.py:tiny"
REDUCED = [
  "--config.iterations=24", "--config.warmstart_steps=60", "--config.prompts_per_step=8",
  "--config.eval_every=8", "--config.eval_size=32", "--config.eval_samples=0",
  "--config.checkpoint_every=4", "--config.reward_workers=0", "--config.peak_flops=1e11",
  "--config.progress=False",
]  # fmt: skip
QUICK = [
  "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
  "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
  "--config.iterations=6", "--config.warmstart_steps=4", "--config.warmstart_batch=8",
  "--config.prompts_per_step=4", "--config.sampler.group_size=4", "--config.eval_every=2",
  "--config.eval_size=8", "--config.eval_samples=0", "--config.checkpoint_every=2",
  "--config.reward_workers=0", "--config.peak_flops=1e11", "--config.progress=False",
]  # fmt: skip
_TIMING = ("time/", "tokens_per_s", "perf/")


def _start(workdir: pathlib.Path, flags: list[str]) -> subprocess.Popen:
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)
  args = [sys.executable, "-m", "grpo_jax.main", CONFIG, f"--workdir={workdir}", *flags]
  return subprocess.Popen(
    args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
  )


def _finish(workdir: pathlib.Path, flags: list[str]) -> float:
  """Runs to the end; returns its wall seconds."""
  t0 = time.perf_counter()
  p = _start(workdir, flags)
  _, err = p.communicate()
  if p.returncode != 0:
    raise RuntimeError(f"run in {workdir} failed ({p.returncode}):\n{err[-3000:]}")
  return time.perf_counter() - t0


def _metrics(workdir: pathlib.Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  out = []
  for line in path.read_text().splitlines():
    with contextlib.suppress(json.JSONDecodeError):  # A line cut by the kill.
      out.append({k: v for k, v in json.loads(line).items() if not k.startswith(_TIMING)})
  return out


def _kill_at(workdir, flags, at_s: float, sig) -> dict:
  """Starts a run and sends `sig` after at_s seconds (if it is still running)."""
  p = _start(workdir, flags)
  try:
    p.wait(timeout=at_s)
    return {"at_s": round(at_s, 2), "landed": "after the end", "returncode": p.returncode}
  except subprocess.TimeoutExpired:
    p.send_signal(sig)
    p.communicate()
  logged = _metrics(workdir)
  where = f"iteration {logged[-1]['iteration']} logged" if logged else "before iteration 0"
  return {"at_s": round(at_s, 2), "landed": where, "returncode": p.returncode}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument("--cycles", type=int, default=10)
  parser.add_argument("--kills", type=int, default=2, help="kills per cycle before the last rerun")
  parser.add_argument("--signal", choices=("kill", "term"), default="kill")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  flags = QUICK if args.quick else REDUCED
  if args.quick:
    args.cycles, args.kills = min(args.cycles, 2), 1
  sig = signal.SIGKILL if args.signal == "kill" else signal.SIGTERM
  rng = random.Random(args.seed)
  root = pathlib.Path(tempfile.mkdtemp(prefix="grpo_jax_reliability_"))
  try:
    wall = _finish(root / "reference", flags)
    reference = _metrics(root / "reference")
    cycles = []
    for c in range(args.cycles):
      workdir = root / f"cycle{c}"
      kills = [
        _kill_at(workdir, flags, rng.uniform(0.05, 1.0) * wall, sig) for _ in range(args.kills)
      ]
      _finish(workdir, flags)
      matched = _metrics(workdir) == reference
      cycles.append({"kills": kills, "matched": matched})
      print(
        f"cycle {c}: kills at {[k['at_s'] for k in kills]} s ({[k['landed'] for k in kills]}): "
        f"{'matches' if matched else 'DIFFERS from'} the uninterrupted run",
        flush=True,
      )
  finally:
    shutil.rmtree(root, ignore_errors=True)
  result = {
    "config": [CONFIG, *flags],
    "signal": args.signal,
    "reference_wall_s": round(wall, 2),
    "cycles": len(cycles),
    "matched": sum(c["matched"] for c in cycles),
    "kills": sum(len(c["kills"]) for c in cycles),
    "per_cycle": cycles,
  }
  print(
    f"{result['matched']} of {result['cycles']} interrupted runs ({result['kills']} kills) "
    "match the uninterrupted run exactly"
  )
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
