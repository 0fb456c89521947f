"""Sampler/trainer mismatch: how far the sampler's log-probs are from the trainer's.

  python experiments/mismatch.py                         # the anchor model, this device
  JAX_DEFAULT_MATMUL_PRECISION=highest python experiments/mismatch.py
  python experiments/mismatch.py --quick

One batch of the anchor workload (experiments/bench_rl_iteration.py: 16 prompts × G = 8,
128 new tokens, random weights scaled so the policy is peaked, as a trained one is) is
sampled, and the trainer's teacher-forced forward recomputes each sampled token's
log-prob under the same params (`rl.rollout_logprobs`). Per sampler compute dtype
(float32, bfloat16) with the trainer in float32, it prints the figures the trainer logs
every iteration (`importance.mismatch_metrics`): k3 = mean (ρ − 1 − log ρ), an estimate of
KL(μ ‖ π_old), and ρ's 1st/50th/99th percentiles, ρ = π_old / μ; plus max |log ρ|.

With identical numerics ρ = 1. A GPU computes float32 matmuls as TF32 by default
(jax_default_matmul_precision), so even a float32 sampler differs from the float32 trainer
(different kernels for decode and teacher forcing); a bfloat16 sampler differs more. The
last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

import bench_rl_iteration  # noqa: E402

from grpo_jax.rl import importance  # noqa: E402
from grpo_jax.trainer import (  # noqa: E402
  build,
  run_state,
  steps,  # noqa: E402
)


def measure(sampler_dtype: str, *, quick: bool) -> dict:
  c = bench_rl_iteration.make_config("float32", quick=quick)
  c.rl.recompute_old_logp = True
  c.rl.old_logp_from = "forward"  # π_old's own forward: what this measures against μ.
  c.sampler.dtype = sampler_dtype
  setup = build.build(c)
  fns = steps.functions(setup)
  params = run_state.initial_params(setup, fns, jax.random.key(0))
  # A peaked policy, as after training (random init is near uniform over 32K ids).
  params["embed"]["embedding"] = params["embed"]["embedding"] * 4.0
  prompts = bench_rl_iteration.random_prompts(setup, seed=0)
  rollouts = fns.samplers.train(params, prompts, jax.random.key(1), setup.sampling_hyper)
  lp = fns.rl.logprobs(params, None, rollouts)
  mask = rollouts.mask_NT
  ones = jnp.ones(mask.shape, jnp.float32)  # No correction: every weight 1, nothing dropped.
  m = importance.mismatch_metrics(lp.old_logp_NT, rollouts.policy_logp_NT, mask, ones, mask)
  d = importance.log_ratio(lp.old_logp_NT, rollouts.policy_logp_NT, mask)
  out = {k.split("/")[-1]: float(v) for k, v in m.items() if "is_" not in k}
  out["max_abs_log_ratio"] = float(jnp.max(jnp.abs(d)))
  out["mean_entropy"] = float(
    np.sum(np.asarray(lp.entropy_NT) * np.asarray(mask)) / max(int(np.sum(mask)), 1)
  )
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true")
  args = p.parse_args(argv)
  out = {
    "device": jax.devices()[0].device_kind,
    "matmul_precision": str(jax.config.jax_default_matmul_precision),
  }
  for dtype in ("float32", "bfloat16"):
    out[f"sampler_{dtype}"] = measure(dtype, quick=args.quick)
    print(dtype, out[f"sampler_{dtype}"], file=sys.stderr)
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
