"""Token-budget micro-batches against row micro-batches on skewed completion lengths.

  python experiments/token_budget.py            # 32 rows, 10% to 1,024 tokens (a minute)
  python experiments/token_budget.py --quick    # 16 rows to 64 tokens (the test)

Reasoning rollouts are skewed: most end early, a few run to the limit. Row micro-batches
(rl.micro_batches = K, with rl.length_buckets = k sorting the rows and cutting each
micro-batch to its bucket) run K micro-batches of N / K rows whatever their lengths;
token-budget micro-batches (rl.micro_batch_tokens = B) hold as many rows as fit B tokens
at their bucket (`learner.token_budget_rows`), so the short rows share a few large
micro-batches. B is set to the row micro-batch's tokens at full length, N / K · (P + T):
both hold at most that many tokens at once.

The batch: a small float32 model (2 layers, d 128), N rows of P prompt tokens; 90% of the
rows have completions of lengths uniform in [T/32, T/8], 10% run to T. Random advantages
and log-probs (the gradient's value does not change its cost). One jitted
`learner.accumulate_gradients` per arm, in one sitting on a quiet machine:

  - time: seconds a call over calls 2..4 (the first compiles), and the ratio;
  - memory: XLA's temporary bytes of each compiled call (`memory_analysis`);
  - equality: the gradients and loss sums of the two arms (rtol 1e-4);
  - the micro-batches each arm ran.

Writes experiments/results/long_rollouts/token_budget.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import paged_sampler

from grpo_jax.models import model
from grpo_jax.rl import aggregation, learner, spec

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "long_rollouts" / "token_budget.json"

# Written before the first full-size run (commit of this file), never changed after it.
CLAIM = (
  "On skewed completion lengths (90% of 32 rows in [T/32, T/8], 10% at T = 1,024), "
  "token-budget micro-batches holding the row micro-batch's full-length tokens run the "
  "update's gradient accumulation faster than 8 row micro-batches with the same 8 length "
  "buckets, at comparable memory and with the same gradient."
)
RULE = (
  "supports if time(token budget) / time(rows) <= 0.8, XLA temporaries(token budget) / "
  "temporaries(rows) <= 1.25 and every gradient leaf within rtol 1e-4 (atol 1e-6); "
  "contradicts if the time ratio is > 0.8 or the memory ratio > 1.25 (the gradients "
  "must agree in either case, else the record is void)."
)
SEEDS = {"lengths": 0, "params": 1, "batch": 2}


def _lengths(N: int, T: int) -> np.ndarray:
  """10% of rows (at least one) at T, the rest uniform in [T/32, T/8]."""
  rng = np.random.RandomState(SEEDS["lengths"])
  lengths_N = rng.randint(max(T // 32, 1), T // 8 + 1, size=N)
  lengths_N[rng.choice(N, size=max(1, N // 10), replace=False)] = T
  return lengths_N


def _batch(cfg, *, N: int, P: int, T: int, G: int = 4):
  """A RolloutBatch of N rows with the skewed lengths, random tokens and advantages."""
  rng = np.random.RandomState(SEEDS["batch"])
  mask_NT = jnp.asarray(np.arange(T)[None, :] < _lengths(N, T)[:, None])
  tok = lambda shape: jnp.asarray(rng.randint(1, cfg.vocab_size, size=shape), jnp.int32)
  adv_NT = jnp.asarray(rng.normal(size=(N, 1)), jnp.float32) * mask_NT
  logp_NT = jnp.asarray(-rng.exponential(size=(N, T)), jnp.float32) * mask_NT
  return spec.RolloutBatch(
    prompt_tokens_NP=tok((N, P)), prompt_mask_NP=jnp.ones((N, P), bool),
    tokens_NT=tok((N, T)) * mask_NT, mask_NT=mask_NT, loss_mask_NT=mask_NT, adv_NT=adv_NT,
    old_logp_NT=logp_NT, ref_logp_NT=logp_NT, group_ids_N=jnp.arange(N, dtype=jnp.int32) // G,
  )  # fmt: skip


def _arm(cfg, rl_cfg, params, batch):
  """(temp bytes, seconds of calls 2..4, (grads, sums)) of one arm's jitted
  `learner.accumulate_gradients` (`paged_sampler.measure`)."""
  w_NT = aggregation.REGISTRY.make(rl_cfg.aggregation)(
    batch.loss_mask_NT, batch.group_ids_N, batch.adv_NT
  )
  fn = functools.partial(
    learner.accumulate_gradients,
    cfg=rl_cfg,
    model_fn=model.make_model_fn(cfg),
    token_outputs=False,
  )
  temp, times, out = paged_sampler.measure(
    fn, (params, batch, w_NT, rl_cfg.step_hyper()), n_calls=4
  )
  return temp, times, out[:2]


def run(*, N: int, P: int, T: int, K: int, d_model: int) -> dict:
  cfg = model.tiny_config(
    512, d_model=d_model, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=d_model // 4,
    mlp_dim=4 * d_model,
  )  # fmt: skip
  params = model.init(cfg, jax.random.key(SEEDS["params"]))
  batch = _batch(cfg, N=N, P=P, T=T)
  rows_cfg = spec.RLConfig(micro_batches=K, length_buckets=K)
  budget = N // K * (P + T)
  tokens_cfg = dataclasses.replace(rows_cfg, micro_batches=1, micro_batch_tokens=budget)
  (t_rows, s_rows, (g_rows, sums_rows)), (t_tok, s_tok, (g_tok, sums_tok)) = (
    _arm(cfg, c, params, batch) for c in (rows_cfg, tokens_cfg)
  )
  worst = 0.0
  for a, b in zip(jax.tree.leaves(g_tok), jax.tree.leaves(g_rows), strict=True):
    a, b = np.asarray(a), np.asarray(b)
    worst = max(worst, float(np.max(np.abs(a - b) / (1e-6 + 1e-4 * np.abs(b)))))
  return {
    "shape": dict(N=N, P=P, T=T, K=K, d_model=d_model, budget_tokens=budget),
    "lengths": sorted(int(x) for x in _lengths(N, T)),
    "budget_rows": learner.token_budget_rows(tokens_cfg, P=P, T=T, N=N)[1],
    "micro_batches": {"rows": K, "tokens": int(sums_tok["micro_batches"])},
    "seconds": {"rows": s_rows, "tokens": s_tok},
    "time_ratio": float(np.mean(s_tok) / np.mean(s_rows)),
    "temp_bytes": {"rows": int(t_rows), "tokens": int(t_tok)},
    "memory_ratio": t_tok / t_rows,
    # max over leaves of |Δ| / (1e-6 + 1e-4 |g|): <= 1 means within rtol 1e-4, atol 1e-6.
    "grad_tolerance_used": worst,
    "loss": {"rows": float(sums_rows["loss"]), "tokens": float(sums_tok["loss"])},
  }


def verdict(record: dict) -> str:
  r = record["result"]
  if r["grad_tolerance_used"] > 1:
    return "void: the gradients differ"
  ok = r["time_ratio"] <= 0.8 and r["memory_ratio"] <= 1.25
  return "supports" if ok else "contradicts"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="16 rows to 64 tokens (the test)")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  if args.quick:
    shape = dict(N=16, P=8, T=64, K=4, d_model=32)
  else:
    shape = dict(N=32, P=64, T=1024, K=8, d_model=128)
  host = f"{jax.devices('cpu')[0].device_kind}, {jax.device_count()} device(s), float32"
  record = paged_sampler.record_header(CLAIM, RULE, SEEDS, host, run(**shape))
  record["verdict"] = verdict(record)
  out = pathlib.Path(args.out) if args.out else (None if args.quick else OUT)
  if out:
    out.write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps({k: v for k, v in record["result"].items() if k != "lengths"}))
  return record


if __name__ == "__main__":
  main()
