"""One process of a multi-process run of calculator episodes; used by test_multihost.py.

  python tests/multihost_episodes.py OUT WORKDIR --devices 2 --process_id 0 --processes 2

configs/calculator.py:tiny from its learning test's committed warm start, 8 prompts × 8
episodes an iteration on a (data 2, fsdp 2) mesh over every process's devices, for
--iterations (with --refill_slots S: on pages, each turn's actions through S slots; with
--overlap_steps K too, no turns: segments of K steps, tools overlapped; --slow_ms M: process
1's tool steps take M ms more, so its answers come back after process 0's). Saves
OUT/process<id>.json: the RL lines' non-timing metrics (process 0's metrics.jsonl) and how
many calculator environments this process made (each process plays the episodes of its
own rows).
"""

import json
import pathlib
import time

import jax
import multihost_run
import runs
from jax.experimental import multihost_utils

from grpo_jax.envs import calculator
from grpo_jax.infra import config_lib
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main(argv=None):
  parser = multihost_run.process_parser()
  parser.add_argument("--refill_slots", type=int, default=0, help="on pages, through S slots")
  parser.add_argument("--overlap_steps", type=int, default=0, help="with slots: env.overlap_steps")
  parser.add_argument("--slow_ms", type=float, default=0, help="process 1's tool steps take this")
  args = parser.parse_args(argv)
  multihost_run.join(args)
  workdir = pathlib.Path(args.workdir)
  if jax.process_index() == 0 and not workdir.exists():
    runs._copy_warm_start(runs.WARM_STARTS / "calculator_tiny", workdir, fresh=True)
  multihost_utils.sync_global_devices("workdir ready")
  made = []
  real_init = calculator.Calculator.__init__

  def counted(self, **kwargs):
    made.append(1)
    real_init(self, **kwargs)

  calculator.Calculator.__init__ = counted
  if args.slow_ms and jax.process_index() == 1:  # Its answers come back later than 0's.
    real_step = calculator.Calculator.step
    calculator.Calculator.step = lambda self, a: (
      time.sleep(args.slow_ms / 1e3) or real_step(self, a)
    )
  c = config_lib.load(str(ROOT / "configs" / "calculator.py") + ":tiny")
  c.update(prompts_per_step=8, iterations=args.iterations, eval_every=args.iterations)
  c.update(eval_size=16, eval_samples=0, checkpoint_every=1, reward_workers=0)
  c.update(progress=False, tensorboard=False)
  c.mesh.update(data=2, fsdp=2, tensor=1)
  if args.refill_slots:
    c.sampler.update(kv_layout="paged", page_size=8, refill_slots=args.refill_slots)
  c.env.overlap_steps = args.overlap_steps
  summary = train.run(c, workdir, log=lambda _: None)
  lines = []
  if jax.process_index() == 0:
    lines = [runs.untimed(r) for r in runs.lines(workdir) if r["phase"] == "rl"]
  out = pathlib.Path(args.out) / f"process{jax.process_index()}.json"
  out.write_text(json.dumps({"lines": lines, "envs": len(made), "summary": {
    k: v for k, v in summary.items() if "seconds" not in k and isinstance(v, (int, float))
  }}))  # fmt: skip


if __name__ == "__main__":
  main()
