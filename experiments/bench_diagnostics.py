"""Overhead of the token-credit diagnostics: trainer iteration time with diagnostics every
10 iterations vs off.

  python experiments/bench_diagnostics.py               # the ~40M model, 8 prompts × G = 8
  python experiments/bench_diagnostics.py --rank        # with the optional rank block on
  python experiments/bench_diagnostics.py --quick       # tiny smoke run

Workload: configs/arithmetic.py:full (3-digit addition and subtraction; the ~40M-parameter
Qwen3-shaped model: d_model 512, 8 layers, 8 heads, 4 KV heads, head_dim 64, SwiGLU 1536)
shrunk to a CPU-feasible batch: --prompts prompts × G = --group completions of up to 10
tokens, one mini-batch and one epoch per iteration, random init (no warm start: the
update's cost does not depend on the rewards), evaluation and checkpoints only at the
ends. Diagnostics: config.diagnostics defaults (probe of 4 groups, 256 coupling targets,
32 reference solutions; rank and value off unless --rank / --value) with every = --every.

Both arms run in this process, off first, then on (the second reuses the trainer's
compiled functions). Each runs every·(1 + --periods) + 1 iterations. The timed window is
iterations every+1 .. every·(1 + periods): it starts after the first diagnostic call (which
compiles the diagnostics) and ends before the last iteration (final evaluation and
checkpoint), so it holds `periods` diagnostic calls in `periods·every` iterations, the
steady-state duty cycle. An iteration's time is the wall time between consecutive
`train.run` on_iteration callbacks (everything the trainer does, diagnostics included).
Reported, per repeat and as the median over --repeats R (the arms alternate):

  ratio           mean iteration wall time on / off (the figure asked for; on a shared
                  host other processes move it by ±30% between runs)
  cpu_ratio       the same with this process's CPU time (less sensitive to other load)
  in_run_ratio    on-arm mean / mean of the on-arm's iterations without a diagnostics call
                  (same run, same background load: the duty-cycle cost alone)
  predicted_ratio 1 + diagnostics call seconds / (every × off-arm iteration)

and the seconds of a steady-state diagnostics call and of the first (compiling) one.

Measured on a shared 2-core CPU (8 prompts × G = 8, every 10, 3 repeats): off 2.59 s per
iteration, on 2.70 s: ratio 1.063 (+6.3%; process-CPU ratio 1.062, in-run 1.038); a
diagnostics call takes 1.3 s (8.2 s the first time, compiling). With --rank (one repeat):
ratio 1.12, a call 2.3 s. About 10 minutes for 3 repeats.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
import diagnose  # noqa: E402
import jax  # noqa: E402

from grpo_jax.infra import config_lib  # noqa: E402
from grpo_jax.trainer import train  # noqa: E402


def get_config(args):
  if args.quick:
    c = diagnose.get_config(iterations=1, every=1, quick=True)  # Its sizes: no recompile
    c.diagnostics.update(aggregations=(), rank=False, value=False)  # in the same process.
    c.warmstart_steps = 0
  else:
    c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":full")
    c.sampler.group_size = args.group
    c.update(prompts_per_step=args.prompts, warmstart_steps=0, eval_size=8, eval_samples=0)
  c.update(iterations=args.every * (1 + args.periods) + 1, reward_workers=0, progress=False)
  c.update(eval_every=10**6, checkpoint_every=10**6)
  c.diagnostics.update(rank=args.rank, value=args.value)
  return c


def run_arm(config, every: int) -> dict:
  """One training run: wall and process-CPU stamps at each iteration's end, and the
  diagnostics seconds of the iterations that ran them."""
  config.diagnostics.every = every
  wall, cpu, diag = {}, {}, {}

  def on_iteration(it, record):
    wall[it], cpu[it] = time.perf_counter(), time.process_time()
    if "time/diagnostics" in record:
      diag[it] = record["time/diagnostics"]

  with tempfile.TemporaryDirectory() as workdir:
    train.run(config, workdir, log=lambda *_: None, on_iteration=on_iteration)
  return {"wall": wall, "cpu": cpu, "diag": diag}


def window_times(stamps: dict, *, start: int, stop: int) -> list[float]:
  """Seconds of iterations start+1 .. stop (between consecutive callbacks)."""
  return [stamps[i] - stamps[i - 1] for i in range(start + 1, stop + 1)]


def arm_figures(r: dict, *, start: int, stop: int, every: int) -> dict:
  times = window_times(r["wall"], start=start, stop=stop)
  plain = [t for i, t in zip(range(start + 1, stop + 1), times) if i % every]
  steady = [s for it, s in r["diag"].items() if start < it <= stop]
  return {
    "mean_s": statistics.fmean(times),
    "median_s": statistics.median(times),
    "cpu_mean_s": statistics.fmean(window_times(r["cpu"], start=start, stop=stop)),
    "no_diag_mean_s": statistics.fmean(plain),  # Iterations without a diagnostics call.
    "diag_call_s": statistics.fmean(steady) if steady else 0.0,
    "first_diag_call_s": r["diag"].get(start, 0.0),
  }


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--every", type=int, default=10)
  parser.add_argument("--periods", type=int, default=2, help="diagnostic periods timed")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--rank", action="store_true", help="also the per-rollout gradient rank")
  parser.add_argument("--value", action="store_true", help="also the Monte-Carlo token value")
  parser.add_argument("--quick", action="store_true", help="tiny model, every 2")
  args = parser.parse_args(argv)
  if args.quick:
    args.every, args.periods = 2, 1
  config = get_config(args)
  start, stop = args.every, args.every * (1 + args.periods)
  t0 = time.perf_counter()
  reps = []
  for _ in range(args.repeats):
    rep = {}
    for name, every in (("off", 0), ("on", args.every)):
      r = run_arm(config, every)
      rep[name] = arm_figures(r, start=start, stop=stop, every=args.every)
      print(f"{name:>3}: mean iteration {rep[name]['mean_s']:.3f} s", flush=True)
    off, on = rep["off"], rep["on"]
    rep["ratio"] = on["mean_s"] / off["mean_s"]
    rep["cpu_ratio"] = on["cpu_mean_s"] / off["cpu_mean_s"]
    rep["in_run_ratio"] = on["mean_s"] / on["no_diag_mean_s"]
    rep["predicted_ratio"] = 1.0 + on["diag_call_s"] / (args.every * off["mean_s"])
    reps.append(rep)
  med = lambda f: statistics.median(f(r) for r in reps)  # noqa: E731
  cfg = config.model
  result = {
    "workload": {
      "model": {
        k: cfg[k] for k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim")
      },
      "vocab_size": "the task tokenizer's",
      "prompts_per_step": config.prompts_per_step,
      "group_size": config.sampler.group_size,
      "max_new_tokens": config.sampler.max_new_tokens,
      "every": args.every,
      "timed_iterations": stop - start,
      "diagnostic_calls_timed": args.periods,
      "rank": args.rank,
      "value": args.value,
      "repeats": args.repeats,
      "quick": args.quick,
      "devices": str(jax.devices()),
    },
    "off_iteration_s": med(lambda r: r["off"]["mean_s"]),
    "on_iteration_s": med(lambda r: r["on"]["mean_s"]),
    "ratio": med(lambda r: r["ratio"]),
    "cpu_ratio": med(lambda r: r["cpu_ratio"]),
    "in_run_ratio": med(lambda r: r["in_run_ratio"]),
    "predicted_ratio": med(lambda r: r["predicted_ratio"]),
    "diag_call_s": med(lambda r: r["on"]["diag_call_s"]),
    "diag_first_call_s": reps[0]["on"]["first_diag_call_s"],
    "repeats": reps,
    "load_avg": os.getloadavg(),
    "bench_seconds": time.perf_counter() - t0,
  }
  result["overhead_pct"] = 100.0 * (result["ratio"] - 1.0)
  print(
    f"off {result['off_iteration_s']:.3f} s/iteration, on {result['on_iteration_s']:.3f} "
    f"s/iteration (every {args.every}): ratio {result['ratio']:.3f} "
    f"({result['overhead_pct']:+.1f}%), process-CPU ratio {result['cpu_ratio']:.3f}, "
    f"in-run ratio {result['in_run_ratio']:.3f}, from the call time "
    f"{result['predicted_ratio']:.3f}; a diagnostics call takes {result['diag_call_s']:.2f} s "
    f"(first, compiling: {result['diag_first_call_s']:.1f} s)"
  )
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
