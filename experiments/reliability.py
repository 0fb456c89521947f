"""Kill/resume cycles: how many interrupted runs end with exactly the uninterrupted metrics.

  python experiments/reliability.py                 # 10 cycles of configs/arithmetic.py:tiny, reduced
  python experiments/reliability.py --cycles 30 --signal term
  python experiments/reliability.py --quick         # 1 cycle of a smaller run, no warm-up (CI smoke test)

One uninterrupted run of the command line gives the reference metrics.jsonl (after a
first, untimed run, so that both are timed with JAX's compilation cache warm). Each cycle
then starts a fresh workdir and runs the same command, killing it (SIGKILL, or SIGTERM
with --signal term) at a uniformly random moment of the reference's wall time (seeded),
anchored on the run's own progress: a moment in the start-up and warm start is counted
from the process start, a moment in iteration k from when the run has logged iteration
k - 1 (so a rerun that resumed mid-way is killed at the same place); a rerun
may be killed again (--kills per cycle), and the last one runs to the end. A cycle
*matches* when its metrics.jsonl equals the reference line for line on every key but the
timing ones (time/*, tokens_per_s, perf/*). The kills land anywhere: in the start-up, the
warm start, an iteration, a checkpoint save.

Prints one line per cycle and, last, one JSON object: cycles, matched, kills, the kill
moments and where each landed (the iteration the killed session had logged).
"""

from __future__ import annotations

import argparse
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

from grpo_jax.infra import logs

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
  "--config.iterations=4", "--config.warmstart_steps=4", "--config.warmstart_batch=8",
  "--config.prompts_per_step=4", "--config.sampler.group_size=4", "--config.eval_every=2",
  "--config.eval_size=8", "--config.eval_samples=0", "--config.checkpoint_every=2",
  "--config.reward_workers=0", "--config.peak_flops=1e11", "--config.progress=False",
]  # fmt: skip
_TIMING = ("time/", "tokens_per_s", "perf/")


def _start(workdir: pathlib.Path, flags: list[str]) -> subprocess.Popen:
  """The command line in a process of its own; its stderr goes to <workdir>.stderr (a
  file: a pipe nobody reads while the run is polled could fill and stall it)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)
  args = [sys.executable, "-m", "grpo_jax.main", CONFIG, f"--workdir={workdir}", *flags]
  log = open(f"{workdir}.stderr", "a")  # noqa: SIM115 -- the child holds it; closed on exit.
  return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)


def _stderr(workdir: pathlib.Path) -> str:
  return pathlib.Path(f"{workdir}.stderr").read_text()[-3000:]


def _finish(workdir: pathlib.Path, flags: list[str]) -> float:
  """Runs to the end; returns its wall seconds."""
  t0 = time.perf_counter()
  p = _start(workdir, flags)
  if p.wait() != 0:
    raise RuntimeError(f"run in {workdir} failed ({p.returncode}):\n{_stderr(workdir)}")
  return time.perf_counter() - t0


def _metrics(workdir: pathlib.Path) -> list[dict]:
  """The run's records without timings (a last line cut by the kill is dropped)."""
  records = logs.read_jsonl(workdir / "metrics.jsonl")
  return [{k: v for k, v in r.items() if not k.startswith(_TIMING)} for r in records]


def _kill_at(workdir, flags, *, after: int, delay_s: float, startup_s: float, sig) -> dict:
  """Starts a run; once it has logged iteration `after` (after=-1: from the start, waiting
  up to startup_s), waits delay_s more and sends `sig` (if it is still running)."""
  p = _start(workdir, flags)
  t0 = time.perf_counter()
  while p.poll() is None:
    if after < 0:  # In the start-up or the warm start: a moment of its duration.
      if time.perf_counter() - t0 > delay_s:
        break
    else:
      logged = _metrics(workdir)
      if logged and logged[-1]["iteration"] >= after:
        time.sleep(delay_s)
        break
    time.sleep(0.02)
  if p.poll() is not None:
    return {"after": after, "landed": "after the end", "returncode": p.returncode}
  p.send_signal(sig)
  p.wait()
  logged = _metrics(workdir)
  where = f"iteration {logged[-1]['iteration']} logged" if logged else "before iteration 0"
  return {"after": after, "delay_s": round(delay_s, 3), "landed": where, "returncode": p.returncode}


def _reference(root: pathlib.Path, flags, *, warm: bool = True) -> tuple[list[dict], float, float]:
  """(metrics, seconds to iteration 0's line, mean seconds per iteration) of a warm run
  (after an untimed one; warm=False, --quick: the first run, its compiles in its start-up)."""
  if warm:
    _finish(root / "warm-up", flags)
  t0 = time.perf_counter()
  p = _start(root / "reference", flags)
  first = last = None
  seen = 0
  while p.poll() is None:
    if (n := len(_metrics(root / "reference"))) > seen:
      seen, last = n, time.perf_counter() - t0
      first = last if first is None else first
    time.sleep(0.02)
  if p.returncode != 0:
    raise RuntimeError(f"the reference run failed ({p.returncode}):\n{_stderr(root / 'reference')}")
  wall = time.perf_counter() - t0
  lines = _metrics(root / "reference")
  first = first if first is not None else wall / 2
  last = last if last is not None and len(lines) == seen else wall
  # Seconds an iteration: from the first line to the last, not to the process's exit (its
  # final save and teardown would stretch the iterations, and a kill meant for the last
  # one would land after the end).
  return lines, first, (last - first) / max(len(lines) - 1, 1)


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
  if args.quick:  # One kill and rerun (the kill/resume cases one by one: tests/test_faults.py).
    args.cycles, args.kills = min(args.cycles, 1), 1
  sig = signal.SIGKILL if args.signal == "kill" else signal.SIGTERM
  rng = random.Random(args.seed)
  root = pathlib.Path(tempfile.mkdtemp(prefix="grpo_jax_reliability_"))
  try:
    reference, startup_s, per_it_s = _reference(root, flags, warm=not args.quick)
    iterations = reference[-1]["iteration"]
    cycles = []
    for c in range(args.cycles):
      workdir = root / f"cycle{c}"
      kills = []
      for _ in range(args.kills):
        # A uniform moment of the reference's wall time, anchored on the run's own events:
        # the start-up and warm start (after = -1), or an iteration and a fraction of it.
        u = rng.uniform(0.0, startup_s + iterations * per_it_s)
        after = -1 if u < startup_s else min(int((u - startup_s) / per_it_s), iterations - 1)
        delay = u if after < 0 else u - startup_s - after * per_it_s
        kills.append(
          _kill_at(workdir, flags, after=after, delay_s=delay, startup_s=startup_s, sig=sig)
        )
      _finish(workdir, flags)
      matched = _metrics(workdir) == reference
      cycles.append({"kills": kills, "matched": matched})
      print(
        f"cycle {c}: {[k['landed'] for k in kills]}: "
        f"{'matches' if matched else 'DIFFERS from'} the uninterrupted run",
        flush=True,
      )
  finally:
    shutil.rmtree(root, ignore_errors=True)
  result = {
    "config": [CONFIG, *flags],
    "signal": args.signal,
    "reference_startup_s": round(startup_s, 2),
    "reference_s_per_iteration": round(per_it_s, 3),
    "cycles": len(cycles),
    "matched": sum(c["matched"] for c in cycles),
    "kills": sum(len(c["kills"]) for c in cycles),
    "kills_in_the_run": sum(k["landed"] != "after the end" for c in cycles for k in c["kills"]),
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
