"""The static sampler with and without a shared prompt cache (`sampler.shared_prefix`).

  python experiments/bench_shared_prefix.py --dtype float32 --rounds 4
  python experiments/bench_shared_prefix.py --dtype bfloat16
  python experiments/bench_shared_prefix.py --quick          # a small smoke run

The anchor sampler of `bench_rl_iteration.py` (8 layers, d_model 512, 8 heads / 4 KV,
16 prompts × 64 tokens, G = 8, 128 new tokens, random weights). Both samplers are
compiled first; XLA's temporary memory of each (`memory_analysis().temp_size_in_bytes`)
is printed with its first call; then --rounds rounds call each once, interleaved, with
the same key in a round. The tokens of the two can differ in a long random-weight
rollout: a float32 sum in another order flips one sampled token and the rows diverge
from there (`tests/models/test_sampling.py` pins equality on the tiny model). The last line is
one JSON object; the README's figures are in experiments/results/cpu/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import time

import bench_rl_iteration
import jax
import jax.numpy as jnp

from grpo_jax.models import model, sampling
from grpo_jax.trainer import build


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--quick", action="store_true", help="a 2-layer model, for a smoke run")
  args = parser.parse_args(argv)
  setup = build.build(bench_rl_iteration.make_config(args.dtype, quick=args.quick))
  params = model.init(setup.model_cfg, jax.random.key(0))
  prompts = bench_rl_iteration.random_prompts(setup, seed=0)
  hyper = setup.sampling_hyper
  fns, first, temp = {}, {}, {}
  for shared in (False, True):
    scfg = dataclasses.replace(setup.sampler_cfg, shared_prefix=shared)
    fn = jax.jit(sampling.make_policy_sampler(setup.model_cfg, scfg))
    compiled = fn.lower(params, prompts, jax.random.key(1), hyper).compile()
    temp[shared] = compiled.memory_analysis().temp_size_in_bytes / 1e6
    t = time.perf_counter()
    jax.block_until_ready(fn(params, prompts, jax.random.key(1), hyper))
    first[shared] = time.perf_counter() - t
    fns[shared] = fn
    print(f"shared_prefix={shared}: temp {temp[shared]:.1f} MB, first call {first[shared]:.2f} s")
  times = {False: [], True: []}
  out = {}
  for r in range(args.rounds):
    for shared in (False, True):
      t = time.perf_counter()
      out[shared] = jax.block_until_ready(
        fns[shared](params, prompts, jax.random.key(2 + r), hyper)
      )
      times[shared].append(time.perf_counter() - t)
    print(f"round {r}: copied {times[False][-1]:.2f} s, shared {times[True][-1]:.2f} s", flush=True)
  result = {
    "bench": "shared_prefix_sampler_ab",
    "machine": f"{platform.processor() or platform.machine()}, {jax.default_backend()}",
    "jax": jax.__version__,
    "dtype": args.dtype,
    "quick": args.quick,
    "rows": int(out[True].tokens_NT.shape[0]),
    "prompt": int(prompts.tokens_BP.shape[1]),
    "new_tokens": int(out[True].tokens_NT.shape[1]),
    "same_tokens_last_round": bool(jnp.all(out[True].tokens_NT == out[False].tokens_NT)),
    "temp_MB": {"copied": temp[False], "shared": temp[True]},
    "first_call_s": {"copied": first[False], "shared": first[True]},
    "median_s": {
      "copied": statistics.median(times[False]),
      "shared": statistics.median(times[True]),
    },
    "times_s": {"copied": times[False], "shared": times[True]},
  }
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
