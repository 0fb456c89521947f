"""The trainer's wait on a turn of code-environment steps: one slow episode among plain ones,
the steps one by one (config.env.step_workers = 1) vs at once (step_workers > 1).

  python experiments/bench_env_steps.py                  # 32 episodes, workers 1, 4, 8
  python experiments/bench_env_steps.py --episodes 128 --workers 1 8 --repeats 1

Workload: `episodes.Runner.run` of the code environment (the "code" task's shipped "add"
problem, its character tokenizer, real sandbox runs) with a scripted model (no network:
the next token is read from a fixed script), one turn per episode: every action is a final
answer, judged in the sandbox. `--episodes` - 1 rows answer plainly (correct code, one
sandbox run of ~30 ms), one row answers correct but slow code (it sleeps `--slow-s`
seconds once, when it is defined, within the sandbox's timeout: "pass"). A batch of plain
rows only is the baseline: the slow episode's cost is what it adds to the turn, also in
plain episodes of the serial loop (the issue's unit: 142x). The figure is `Episodes.seconds["env"]`: the trainer's wall time
in the environment phase of the turn (decoding the actions, the env steps, waiting for
them); the median over `--repeats` batches, after one that compiles and probes the sandbox.

The machine's other load changes the figures (a sandbox run is a process start): they are
indicative. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import tasks
from grpo_jax.envs import code as code_env
from grpo_jax.envs import episodes
from grpo_jax.models import sampling
from grpo_jax.verifiers import sandbox

PLAIN = "```python\ndef add(a, b):\n  return a + b\n```"
SLOW = "```python\nimport time\n\ntime.sleep({s})\n\n\ndef add(a, b):\n  return a + b\n```"


@flax.struct.dataclass
class _NoCache:
  index: jax.Array

  def repeat(self, n):
    del n
    return self


def _scripted_fn(params, tokens_BT, positions_BT, cache, *, script_NL, vocab):
  """The token after position p of row i is script_NL[i, p + 1]."""
  del params, tokens_BT
  rows, L = positions_BT.shape[0], script_NL.shape[1]
  nxt = jnp.clip(positions_BT + 1, 0, L - 1)
  return 30.0 * jax.nn.one_hot(script_NL[jnp.arange(rows)[:, None], nxt], vocab), cache


def _runner(task, answers, *, workers: int, isolation: str):
  """A one-turn runner whose model writes answers[i] then EOS in row i."""
  tok = task.tokenizer()
  ids = [tok.encode(a) + [tok.eos_id] for a in answers]
  T = max(map(len, ids)) + 4
  script_NL = np.full((len(ids), 2 + T), tok.pad_id, np.int32)
  for i, row in enumerate(ids):
    script_NL[i, 2 : 2 + len(row)] = row
  scfg = sampling.SamplerConfig(
    max_new_tokens=T,
    eos_ids=tok.eos_ids,
    pad_id=tok.pad_id,
    group_size=1,
    max_prompt_len=8,
    prompt_buckets=(8,),
  )
  options = dict(isolation=isolation, timeout_s=5.0)
  runner = episodes.Runner(
    model_fn=functools.partial(
      _scripted_fn, script_NL=jnp.asarray(script_NL), vocab=tok.vocab_size
    ),
    init_cache=lambda b, s: _NoCache(index=jnp.zeros((), jnp.int32)),
    sampler_cfg=scfg,
    cfg=episodes.EpisodeConfig(
      name="code", kwargs=options, max_turns=1, turn_tokens=T, step_workers=workers
    ),
    tokenizer=tok,
    make_env=functools.partial(code_env.CodeRunner, tokenizer=tok, **options),
    env_cls=code_env.CodeRunner,
  )
  prompts = sampling.prepare_prompts([[tok.bos_id, tok.encode("\n")[0]]] * len(ids), cfg=scfg)
  return runner, prompts


def _env_seconds(task, answers, *, workers, isolation, repeats) -> float:
  """The median env-phase seconds of `repeats` batches (after one warm-up batch); every
  episode must pass."""
  runner, prompts = _runner(task, answers, workers=workers, isolation=isolation)
  example = task.example_of(next(p for p in task.split_problems("train") if p.id == "add"))
  seconds = []
  for r in range(repeats + 1):
    got = runner.run(
      {}, prompts, [example] * len(answers), jax.random.key(r), sampling.sampling_params()
    )
    if not (got.reward_N == 1.0).all():
      raise RuntimeError(f"the benchmark's answers must all pass: {got.labels}, {got.messages}")
    seconds.append(got.seconds["env"])
  return statistics.median(seconds[1:])


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--episodes", type=int, default=32, help="rows of the turn (N)")
  p.add_argument("--workers", type=int, nargs="+", default=[1, 4, 8])
  p.add_argument("--slow-s", type=float, default=1.0, help="the slow answer's sleep")
  p.add_argument("--repeats", type=int, default=3)
  args = p.parse_args(argv)
  isolation = "namespaces" if not sandbox.namespaces_unavailable() else "none"
  task = tasks.get("code", isolation=isolation)
  plain = [PLAIN] * args.episodes
  one_slow = [SLOW.format(s=args.slow_s)] + [PLAIN] * (args.episodes - 1)
  run = functools.partial(_env_seconds, task, isolation=isolation, repeats=args.repeats)
  rows = {}
  for w in args.workers:
    base, slow = run(plain, workers=w), run(one_slow, workers=w)
    rows[w] = dict(plain_s=base, one_slow_s=slow, slow_extra_s=slow - base)
  serial = rows.get(1)
  for r in rows.values():  # In plain episodes of the serial loop, the unit.
    r["slow_cost_x"] = r["slow_extra_s"] / (serial["plain_s"] / args.episodes) if serial else None
    r["speedup_vs_serial"] = serial["one_slow_s"] / r["one_slow_s"] if serial else None
  out = {
    "episodes": args.episodes,
    "slow_s": args.slow_s,
    "isolation": isolation,
    "repeats": args.repeats,
    "by_workers": {str(w): r for w, r in rows.items()},
  }
  for w, r in rows.items():
    versus = (
      f" ({r['slow_cost_x']:.0f}x a plain episode of the serial loop); the turn "
      f"{r['speedup_vs_serial']:.1f}x faster than serial"
    )
    print(
      f"step_workers={w}: a turn of {args.episodes} plain answers {r['plain_s']:.2f} s "
      f"({1e3 * r['plain_s'] / args.episodes:.0f} ms per episode), with one slow answer "
      f"({args.slow_s:g} s sleep) {r['one_slow_s']:.2f} s: the slow episode adds "
      f"{r['slow_extra_s']:.2f} s" + (versus if serial else "")
    )
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main(sys.argv[1:])
