"""Host/device overlap of reward scoring: how much verifier time the trainer hides.

  python experiments/bench_overlap.py                          # arithmetic:tiny, 2 ms verifier
  python experiments/bench_overlap.py --verifier_ms 0 --workers 0   # the demo's own scoring
  python experiments/bench_overlap.py --config configs/countdown.py:tiny --prompts 32

One rollout batch of the config's trainer (`build.build`, `steps.functions`) is sampled
once. Then, --repeats times each, in alternation:

  sequential = wall(block(logprobs(params, ref, rollouts)); pool.score(...))
  overlapped = wall(lp = logprobs(...)  [async dispatch]; pool.score(...); block(lp))

`overlapped` is the order `rollout.collect` uses (dispatch the old/ref log-prob forwards,
then decode and score while the device computes). Alone, the forward takes `forward_s`
and scoring `score_s` (medians), so the most overlap can save is min(forward_s, score_s):

  hidden_s = sequential_s − overlapped_s,   hidden_frac = hidden_s / min(forward_s, score_s)

Verifier latency. Every reward call sleeps --verifier_ms first (`SlowTask`), standing in
for a verifier that waits on something else: a sandbox that runs generated code, a remote
judge, a sympy call in another process. On a CPU-only machine the "device" is the same two
cores as the host, so CPU-bound scoring cannot overlap the forward there; on a GPU or TPU
host it can. Scores go through `reward_pool.RewardPool` with --workers processes, as in training.

The last line printed is one JSON object with every figure.
"""

import argparse
import json
import statistics
import sys
import time

import jax
import numpy as np

from grpo_jax.infra import config_lib
from grpo_jax.models import model
from grpo_jax.trainer import build, rollout, steps
from grpo_jax.verifiers import reward_pool


class SlowTask:
  """A task whose reward and format checks each first sleep `ms / 2` milliseconds."""

  def __init__(self, task, ms: float):
    self.task, self.ms = task, ms

  def reward(self, prompt, completion):
    time.sleep(self.ms / 2000.0)
    return self.task.reward(prompt, completion)

  def format_reward(self, prompt, completion):
    time.sleep(self.ms / 2000.0)
    return self.task.format_reward(prompt, completion)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--config", default="configs/arithmetic.py:tiny")
  p.add_argument("--prompts", type=int, default=None, help="prompts per batch (config's if unset)")
  p.add_argument("--verifier_ms", type=float, default=2.0, help="sleep per scored item")
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--repeats", type=int, default=7)
  args = p.parse_args(argv)
  overrides = {"progress": False}
  if args.prompts:
    overrides["prompts_per_step"] = args.prompts
  c = config_lib.load(args.config, **overrides)
  c.rl.dynamic_sampling = False
  c.rl.old_logp_from = "forward"  # The forward whose overlap with scoring is timed.
  setup = build.build(c)
  fns = steps.functions(setup)
  params = model.init(setup.model_cfg, jax.random.key(0))
  drawn = rollout.draw(setup, fns, 0)
  rollouts = jax.block_until_ready(
    fns.samplers.train(params, drawn.prompts, jax.random.key(1), setup.sampling_hyper)
  )
  G = setup.sampler_cfg.group_size
  prompts_N = [drawn.examples[i // G].prompt for i in range(rollouts.tokens_NT.shape[0])]
  completions = [setup.tokenizer.decode(r) for r in np.asarray(rollouts.tokens_NT)]
  task = SlowTask(setup.task, args.verifier_ms)
  times = {k: [] for k in ("forward", "score", "sequential", "overlapped")}

  def timed(name, fn):
    t0 = time.perf_counter()
    fn()
    times[name].append(time.perf_counter() - t0)

  forward = lambda: jax.block_until_ready(fns.rl.logprobs(params, params, rollouts))

  def overlapped():
    lp = fns.rl.logprobs(params, params, rollouts)
    pool.score(prompts_N, completions)
    jax.block_until_ready(lp)

  with reward_pool.RewardPool(task, workers=args.workers, timeout_s=60.0) as pool:
    score = lambda: pool.score(prompts_N, completions)
    forward()  # Compile.
    score()  # Start the workers.
    for _ in range(args.repeats):
      timed("forward", forward)
      timed("score", score)
      timed("sequential", lambda: (forward(), score()))
      timed("overlapped", overlapped)
  med = {f"{k}_s": statistics.median(v) for k, v in times.items()}
  hidden = med["sequential_s"] - med["overlapped_s"]
  result = {
    "config": args.config,
    "rows": int(rollouts.tokens_NT.shape[0]),
    "verifier_ms": args.verifier_ms,
    "workers": args.workers,
    "backend": jax.default_backend(),
    **{k: round(v, 4) for k, v in med.items()},
    "hidden_s": round(hidden, 4),
    "hidden_frac": round(hidden / max(min(med["forward_s"], med["score_s"]), 1e-9), 3),
  }
  print(
    f"{result['rows']} rows on {result['backend']}: forward {med['forward_s'] * 1e3:.1f} ms, "
    f"scoring {med['score_s'] * 1e3:.1f} ms; sequential {med['sequential_s'] * 1e3:.1f} ms, "
    f"overlapped {med['overlapped_s'] * 1e3:.1f} ms (hides {hidden * 1e3:.1f} ms, "
    f"{result['hidden_frac']:.0%} of the smaller of the two)"
  )
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
