"""Routing replay and the sampler/trainer mismatch of a mixture-of-experts policy.

  python experiments/moe_replay.py            # the 5 verdict seeds -> results/moe/replay.json
  python experiments/moe_replay.py --seeds=0,1 --out=''   # development seeds, printed only

A mixture of experts adds a mismatch of its own to the sampler/trainer one
(`experiments/mismatch.py`): a token whose router scores are close can take other experts
in the sampler's forward than in the trainer's, and its log-prob then jumps. Routing
replay (rl.routing_replay) records the sampler's experts and makes the trainer's forward
use them (`moe.route`). Per seed, a Qwen3-MoE-shaped policy (4 layers, d 64, 16 experts,
top 4 of softmax, weights renormalised; random weights with the embeddings scaled ×4 so
the policy is peaked, as in mismatch.py) samples 16 random prompts of 16 tokens × G = 8,
64 new tokens, with its sampler in bfloat16 (and, as the control, in float32); the
float32 trainer's teacher-forced forward recomputes each sampled token's log-prob
(π_old), once routing itself and once replaying the sampler's routes. Figures per run:
k3 = mean (ρ − 1 − log ρ), ρ = π_old / μ, over the completion tokens (the trainer's
`offpolicy/mismatch_k3`), and route_flip_frac: the share of (token, layer) pairs whose
expert set in the sampler differs from the float32 forward's own.

CLAIM (pre-registered 2026-12-03, before any run of the verdict seeds 10-14; seeds 0-1 were
used to develop the script):
  With a bfloat16 sampler and a float32 trainer, replaying the sampler's routes lowers the
  sampler/trainer mismatch k3 of a mixture-of-experts policy.
  supports:    k3(replay) < k3(own routing) on all 5 verdict seeds, and the geometric mean
               of k3(replay) / k3(own routing) over them is at most 0.5;
  contradicts: k3(replay) >= k3(own routing) on 3 or more of the 5 seeds;
  inconclusive otherwise (the per-seed ratios are reported: with 5 seeds, a sign test
  cannot reject "no effect" at p < 0.05 with fewer than 5 of 5 in one direction).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import pathlib
import platform
import sys

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import logprobs, model, sampling
from grpo_jax.rl import importance

ROOT = pathlib.Path(__file__).resolve().parent.parent

VERDICT_SEEDS = (10, 11, 12, 13, 14)
SHAPE = dict(
  vocab_size=512, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128,
  n_experts=16, experts_per_token=4, expert_mlp_dim=32, expert_weights_normalized=True,
  dtype="float32", scan_layers=False,
)  # fmt: skip
B, G, P, T = 16, 8, 16, 64


def policy(seed: int):
  cfg = model.tiny_config(**SHAPE)
  params = model.init(cfg, jax.random.key(seed))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 4.0  # Peaked, as trained.
  return cfg, params


def sample(cfg, params, *, dtype: str, seed: int):
  scfg = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(1,), pad_id=0, group_size=G, record_routes=True,
    prompt_buckets=(P,), dtype=dtype,
  )  # fmt: skip
  rng = np.random.default_rng(seed)
  tokens = rng.integers(10, cfg.vocab_size, size=(B, P)).astype(np.int32)
  prompts = sampling.Prompts(tokens_BP=jnp.asarray(tokens), mask_BP=jnp.ones((B, P), bool))
  fn = sampling.make_policy_sampler(dataclasses.replace(cfg, dtype=dtype), scfg)
  return fn(params, prompts, jax.random.key(1000 + seed), sampling.sampling_params())


def figures(cfg, params, r) -> dict:
  model_fn = model.make_model_fn(cfg)
  lp = lambda routes: logprobs.completion_logprobs(  # noqa: E731
    params, r.prompt_tokens_NP, r.prompt_mask_NP, r.tokens_NT, r.mask_NT, model_fn=model_fn,
    routes=routes,
  )[0]  # fmt: skip
  ones = jnp.ones(r.mask_NT.shape, jnp.float32)
  k3 = lambda old: float(  # noqa: E731
    importance.mismatch_metrics(old, r.policy_logp_NT, r.mask_NT, ones, r.mask_NT)[
      "offpolicy/mismatch_k3"
    ]
  )
  tokens_NS = jnp.concatenate([r.prompt_tokens_NP, r.tokens_NT], 1)
  mask_NS = jnp.concatenate([r.prompt_mask_NP, r.mask_NT], 1)
  _, _, own = model.apply(
    params, tokens_NS, model.positions_from_mask(mask_NS), cfg=cfg, record_routes=True
  )
  recorded = jnp.concatenate([r.prompt_routes_NPLK, r.routes_NTLK], 1)
  seen = recorded[..., 0] >= 0
  differ = jnp.any(jnp.sort(own, -1) != jnp.sort(recorded, -1), axis=-1)
  return {
    "k3_own_routing": k3(lp(None)),
    "k3_replay": k3(lp(logprobs.replayed(r))),
    "route_flip_frac": float(jnp.sum(differ & seen) / jnp.sum(seen)),
    "tokens": int(jnp.sum(r.mask_NT)),
  }


def run_seed(seed: int) -> dict:
  cfg, params = policy(seed)
  out = {"seed": seed}
  for dtype in ("bfloat16", "float32"):
    out[dtype] = figures(cfg, params, sample(cfg, params, dtype=dtype, seed=seed))
    print(seed, dtype, out[dtype], file=sys.stderr)
  return out


def verdict(rows: list[dict]) -> dict:
  ratios = [r["bfloat16"]["k3_replay"] / r["bfloat16"]["k3_own_routing"] for r in rows]
  lower = sum(x < 1.0 for x in ratios)
  gmean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
  if lower == len(rows) and gmean <= 0.5:
    v = "supports"
  elif len(rows) - lower >= 3:
    v = "contradicts"
  else:
    v = "inconclusive"
  return {"ratios": ratios, "seeds_lower": lower, "geometric_mean_ratio": gmean, "verdict": v}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", default=",".join(map(str, VERDICT_SEEDS)))
  p.add_argument("--out", default=str(ROOT / "experiments/results/moe/replay.json"))
  args = p.parse_args(argv)
  seeds = tuple(int(s) for s in args.seeds.split(","))
  rows = [run_seed(s) for s in seeds]
  v = verdict(rows)
  claim = __doc__.split("CLAIM")[1].strip()
  out = {
    "date": datetime.date.today().isoformat(),
    "device": f"{jax.devices()[0].device_kind} ({platform.processor() or platform.machine()})",
    "jax": jax.__version__,
    "shape": SHAPE,
    "batch": dict(prompts=B, group=G, prompt_tokens=P, new_tokens=T),
    "seeds": list(seeds),
    "verdict_seeds": seeds == VERDICT_SEEDS,
    "claim": claim,
    "rows": rows,
    **v,
  }
  print(json.dumps(out))
  if args.out and seeds == VERDICT_SEEDS:
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
  return out


if __name__ == "__main__":
  main()
