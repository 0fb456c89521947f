"""Episode throughput on the calculator environment: episodes/s, and the share of wall time
in the jitted turns (sampling and observation appends) vs the host's environment steps.

  python experiments/bench_episodes.py            # configs/calculator.py:tiny, warm-started
  python experiments/bench_episodes.py --quick    # small smoke run
  python experiments/bench_episodes.py --kv_layout=paged --refill_slots=64   # slot refill
  python experiments/bench_episodes.py --kv_layout=paged --refill_slots=64 --overlap_steps=8
  python experiments/bench_episodes.py --tool_ms=20 ...   # each tool step waits 20 ms first

Workload: the tiny calculator config's policy (~0.3M parameters) after `--warmstart`
supervised steps (so episodes take their real three turns: two tool calls and the
answer), `--prompts` train problems x G = `--group` episodes per batch, temperature 1,
`--repeats` batches after one warm-up batch (which compiles). Each batch runs
`episodes.Runner.run`: per turn one jitted decode loop, one device->host copy of the
token buffer, the host's env.step calls (decode, calculator, encode), one jitted append.
"sample" is the jitted pieces' wall time (dispatch to the fetched tokens), "env" the
host's; the rest of a batch's wall time (Python bookkeeping) is "other". With --tool_ms
each calculator step sleeps that long first: a stand-in for a tool that waits (a sandbox,
a server), which the step workers wait on at once. "row_steps" is
the token columns the jitted pieces computed per batch over N rows (`Rollouts.num_steps`:
decode steps of N rows, or of S refill slots counted S/N, plus the appends' columns).

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import statistics
import sys
import time

import jax
import numpy as np

from grpo_jax import envs
from grpo_jax.infra import config_lib
from grpo_jax.trainer import build, rollout, run_state, steps, warmstart

CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "calculator.py"


@contextlib.contextmanager
def _slow_tools(ms: float):
  """Within it, the calculator's step waits `ms` milliseconds before it computes
  (`--tool_ms`; 0: as it is); restored after (the smoke test runs in a test process)."""
  cls = envs.get("calculator")
  step = cls.step

  def slow(self, action):
    time.sleep(ms / 1e3)
    return step(self, action)

  if ms:
    cls.step = slow
  try:
    yield
  finally:
    cls.step = step


def _setup(args):
  c = config_lib.load(f"{CONFIG}:tiny", warmstart_steps=args.warmstart, progress=False)
  c.prompts_per_step, c.sampler.group_size = args.prompts, args.group
  c.sampler.update(kv_layout=args.kv_layout, refill_slots=args.refill_slots)
  c.env.overlap_steps = args.overlap_steps
  setup = build.build(c)
  fns = steps.functions(setup)
  params = run_state.initial_params(setup, fns, jax.random.key(0))
  if args.warmstart:
    params = warmstart.run(setup, fns, params, log=lambda _: None, preempted={"set": False})
  return setup, fns, params


def _batch(setup, fns, params, index: int, key):
  drawn = rollout.draw(setup, fns, index)
  B = setup.loop.prompts_per_step
  t0 = time.perf_counter()
  got = fns.episodes.train.run(
    params, drawn.prompts, [drawn.examples[b] for b in range(B)], key, setup.sampling_hyper
  )
  return got, time.perf_counter() - t0


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="4 prompts x G = 4, 2 batches, 20 SFT steps")
  p.add_argument("--prompts", type=int, default=32)
  p.add_argument("--group", type=int, default=8)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--warmstart", type=int, default=300)
  p.add_argument("--kv_layout", choices=("dense", "paged"), default="dense")
  p.add_argument("--refill_slots", type=int, default=0, help="S slots (paged only); 0: lockstep")
  p.add_argument("--overlap_steps", type=int, default=0, help="env.overlap_steps (with slots)")
  p.add_argument("--tool_ms", type=float, default=0.0, help="each tool step waits this long")
  args = p.parse_args(argv)
  if args.quick:
    args.prompts, args.group, args.repeats, args.warmstart = 4, 4, 2, 20
  with _slow_tools(args.tool_ms):
    return _bench(args)


def _bench(args) -> dict:
  setup, fns, params = _setup(args)
  N = args.prompts * args.group
  _, compile_s = _batch(setup, fns, params, 0, jax.random.key(0))  # Compiles.
  runs = []
  for r in range(args.repeats):
    got, wall = _batch(setup, fns, params, (r + 1) * args.prompts, jax.random.key(r + 1))
    steps_ = int(got.rollouts.num_steps)
    runs.append(
      dict(wall=wall, **got.seconds, **got.metrics(), accuracy=got.reward_N.mean(), steps=steps_)
    )
  wall = sum(x["wall"] for x in runs)
  share = lambda k: sum(x[k] for x in runs) / wall  # noqa: E731
  out = {
    "episodes": N,
    "batches": args.repeats,
    "episodes_per_s": N * args.repeats / wall,
    "median_batch_s": statistics.median(x["wall"] for x in runs),
    "sample_share": share("sample"),
    "env_share": share("env"),
    "other_share": 1.0 - share("sample") - share("env"),
    "env_ms_per_episode": 1e3 * sum(x["env"] for x in runs) / (N * args.repeats),
    "turns_mean": float(np.mean([x["episode/turns"] for x in runs])),
    "action_tokens_mean": float(np.mean([x["episode/action_tokens"] for x in runs])),
    "observation_tokens_mean": float(np.mean([x["episode/observation_tokens"] for x in runs])),
    "accuracy": float(np.mean([x["accuracy"] for x in runs])),
    "row_steps": float(np.mean([x["steps"] for x in runs])),
    "kv_layout": args.kv_layout,
    "refill_slots": args.refill_slots,
    "overlap_steps": args.overlap_steps,
    "tool_ms": args.tool_ms,
    "first_batch_s": compile_s,
    "warmstart_steps": args.warmstart,
    "device": jax.devices()[0].device_kind,
  }
  print(
    f"{N} episodes per batch ({args.prompts} prompts x G={args.group}), {args.repeats} batches: "
    f"{out['episodes_per_s']:.1f} episodes/s ({out['median_batch_s']:.2f} s per batch); "
    f"wall time: sampling {100 * out['sample_share']:.1f}%, environment steps "
    f"{100 * out['env_share']:.1f}%, other {100 * out['other_share']:.1f}%; "
    f"{out['turns_mean']:.2f} turns, {out['action_tokens_mean']:.1f} action + "
    f"{out['observation_tokens_mean']:.1f} observation tokens per episode; "
    f"{out['row_steps']:.1f} row-steps a batch; accuracy "
    f"{100 * out['accuracy']:.1f}% (first batch, compiling: {compile_s:.1f} s)"
  )
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main(sys.argv[1:])
