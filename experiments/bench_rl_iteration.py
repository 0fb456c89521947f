"""One GRPO iteration of the anchor workload, per phase, in float32 and bfloat16.

  python experiments/bench_rl_iteration.py                      # float32 and bfloat16
  python experiments/bench_rl_iteration.py --dtypes float32 --iterations 4
  python experiments/bench_rl_iteration.py --quick              # a small smoke run
  python experiments/bench_rl_iteration.py --dtypes bfloat16 --sampler_dtype float32
  python experiments/bench_rl_iteration.py --recompute experiments/results/cpu/2026-11-28_xeon_iteration.jsonl

The anchor workload of issue 20 (the Tunix comparison): the Qwen3-shaped model of
experiments/bench_sampler.py (8 layers, d_model 512, 8 heads / 4 KV, head_dim 64, SwiGLU
1536, vocab 32768, tied embeddings, random weights); 16 prompts × 64 random tokens, G = 8
(128 rollouts), 128 new tokens (EOS is an id the model never samples in practice, so every
row runs to 128), temperature 1; one update over the whole batch in micro-batches of 16
rollouts (rl.micro_batches 8); β = 0; AdamW at 1e-5; token_mean; π_old = the sampler's
log-probs (rl.recompute_old_logp False). Rewards are random 0/1 per row (host). The
functions are the trainer's own (`steps.functions`): sample, logprobs + finish (prepare),
update (the planner and the train steps as one jitted scan).

Per dtype (model.dtype = compute; params and Adam stay float32; logits and the loss are
float32 in every case) it runs --iterations iterations and reports the median over the
iterations after the first (which compiles) of:
  sample_s, prepare_s, update_s, iteration_s     wall seconds (outputs ready)
  sample_tokens_per_s                            generated tokens / sample_s
  update_tokens_per_s                            N·(P + T) positions / update_s
  decode_roofline_tokens_per_s                   rows × memory bandwidth (`flops.memory_bandwidth`)
                                                 / the bytes a decode step must read (every
                                                 weight once in the compute dtype, the filled
                                                 KV slots at the mean context); and
  decode_of_roofline                             sample_tokens_per_s / that roofline (an
                                                 accelerator's figure: on a CPU the x + 1
                                                 pass runs on one thread and understates
                                                 the bandwidth, so the ratio can pass 1)
  mfu_sample, mfu_update, mfu_iteration          model FLOPs (`model_flops`) / seconds / the
                                                 measured matmul peak of the same dtype
  model_flops                                    per phase, `flops.phase_flops`: the work the
                                                 algorithm needs, the LM head only at the
                                                 positions whose logits are used (once per
                                                 row per decode step, none at prefill; the
                                                 T completion slots of the update's P + T,
                                                 not the P prompt slots), sampling at its
                                                 decode contexts, the update's forward and
                                                 backward as 3 forwards. Every MFU uses it.
  xla_flops                                      per phase, XLA's own count of the compiled
                                                 program, for comparison only (no MFU uses
                                                 it): "cost_analysis" (`compiled.
                                                 cost_analysis()["flops"]`, every op, each
                                                 while-loop body counted once: one decode
                                                 step, one micro-batch of the update's scan),
                                                 "dots" (`infra.hlo.matmul_flops`: dots only,
                                                 a loop body times its trip count where that
                                                 is a constant, so the update's scan counts
                                                 every micro-batch; the decode loop, which
                                                 stops early at EOS, still counts once) and
                                                 "while_trips" (each loop's constant trip
                                                 count; null: data-dependent)
  sample_pad_frac                                share of decoded row-steps spent on rows
                                                 that had already ended
  update_pad_frac                                share of the update's [N, P + T] positions
                                                 that are padding
and prints one JSON line with every figure, the peaks and the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

ANCHOR = dict(
  d_model=512,
  n_layers=8,
  n_heads=8,
  n_kv_heads=4,
  head_dim=64,
  mlp_dim=1536,
  vocab_size=32768,
  qk_norm=True,
  tie_embeddings=True,
)


def make_config(dtype: str, *, quick: bool, sampler_dtype: str = ""):
  """The anchor workload's trainer config (module docstring); sampler_dtype: the
  sampler's compute dtype when it differs from the trainer's (sampler.dtype)."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":tiny")
  c.model.update(ANCHOR, dtype=dtype, param_dtype="float32")
  c.sampler.dtype = sampler_dtype
  P, T, B, G = 64, 128, 16, 8
  if quick:
    c.model.update(d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=32, mlp_dim=128)
    c.model.vocab_size = 4096
    P, T, B, G = 16, 16, 4, 4
  c.sampler.update(max_new_tokens=T, group_size=G, max_prompt_len=P, prompt_buckets=(P,))
  c.update(prompts_per_step=B, reward_workers=0, progress=False, tensorboard=False)
  c.update(learning_rate=1e-5, warmup_steps=0, weight_decay=0.0, grad_clip=0.0)
  c.rl.update(
    advantage="grpo",
    kl_coef=0.0,
    aggregation="token_mean",
    num_minibatches=1,
    micro_batches=max(B * G // 16, 1),
    recompute_old_logp=False,
  )
  return c


def random_prompts(setup, *, seed: int):
  from grpo_jax.models import sampling  # noqa: PLC0415

  B = setup.loop.prompts_per_step
  P = setup.sampler_cfg.max_prompt_len
  rng = np.random.default_rng(seed)
  tokens = rng.integers(10, setup.model_cfg.vocab_size, size=(B, P)).astype(np.int32)
  return sampling.Prompts(tokens_BP=jnp.asarray(tokens), mask_BP=jnp.ones((B, P), bool))


def iteration_flops(setup, *, P: int, T: int, N: int) -> dict:
  """Model FLOPs of one iteration (`flops.phase_flops`, the LM head only where logits are
  used): "sample", "logprobs" (none here: π_old is the sampler's, β = 0) and "update"."""
  from grpo_jax.infra import flops  # noqa: PLC0415

  rl_cfg = setup.rl_cfg
  return flops.phase_flops(
    setup.model_cfg,
    prompts=setup.loop.prompts_per_step,
    group_size=setup.sampler_cfg.group_size,
    prompt_len=P,
    new_tokens=T,
    rollout_rows=N,
    update_rows=setup.update_rows,
    forwards=(1 if rl_cfg.recompute_old_logp else 0) + (1 if rl_cfg.use_ref else 0),
    epochs=rl_cfg.ppo_epochs,
  )


def xla_flops(fns, setup, state, prompts, rollouts, key) -> dict:
  """XLA's own FLOP count of each phase's compiled program (module docstring,
  `xla_flops`): compiled again here, after the timed iterations, on the arguments of the
  last one."""
  from grpo_jax.infra import hlo  # noqa: PLC0415

  correct = np.zeros(setup.rollout_rows, np.float32)
  prep_hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  lp = fns.rl.logprobs(state.params, None, rollouts)
  batch = fns.rl.finish(lp, rollouts, correct, correct, prep_hyper)[0]
  lowered = {
    "sample": fns.samplers.train.lower(state.params, prompts, key, setup.sampling_hyper),
    "logprobs": fns.rl.logprobs.lower(state.params, None, rollouts),
    "update": fns.rl.update.lower(state, batch, key, setup.rl_cfg.step_hyper()),
  }
  out = {}
  for name, low in lowered.items():
    compiled = low.compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    text = compiled.as_text()
    out[name] = {
      "cost_analysis": float(cost.get("flops", 0.0)),
      "dots": float(hlo.matmul_flops(text)),
      "while_trips": hlo.while_loops(text),
    }
  return out


def timed_iteration(fns, setup, state, prompts, key, it: int) -> tuple:
  """Iteration `it` of the trainer's functions (sample; logprobs + finish; update) on
  random 0/1 rewards, each phase timed with its outputs ready: (state, seconds per
  phase, rollouts)."""
  N = setup.rollout_rows
  prep_hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  k = jax.random.fold_in(key, it + 1)
  t0 = time.perf_counter()
  rollouts = jax.block_until_ready(
    fns.samplers.train(state.params, prompts, k, setup.sampling_hyper)
  )
  t1 = time.perf_counter()
  correct = np.random.default_rng(it).integers(0, 2, N).astype(np.float32)
  lp = fns.rl.logprobs(state.params, None, rollouts)
  batch, _, _ = fns.rl.finish(lp, rollouts, correct, 0 * correct, prep_hyper)
  batch = jax.block_until_ready(batch)
  t2 = time.perf_counter()
  state, _, history = fns.rl.update(
    state, batch, jax.random.fold_in(k, 1), setup.rl_cfg.step_hyper()
  )
  jax.block_until_ready((state, history))
  t3 = time.perf_counter()
  times = {"sample_s": t1 - t0, "prepare_s": t2 - t1, "update_s": t3 - t2, "iteration_s": t3 - t0}
  return state, times, rollouts


def run_dtype(
  dtype: str, *, iterations: int, quick: bool, seed: int = 0, sampler_dtype: str = ""
) -> dict:
  from grpo_jax.infra import flops  # noqa: PLC0415
  from grpo_jax.rl import spec
  from grpo_jax.trainer import build, run_state, steps  # noqa: PLC0415

  setup = build.build(make_config(dtype, quick=quick, sampler_dtype=sampler_dtype))
  fns = steps.functions(setup)
  key = jax.random.key(seed)
  params = run_state.initial_params(setup, fns, jax.random.fold_in(key, 0))
  state = spec.init_state(params, fns.optimizer)
  prompts = random_prompts(setup, seed=seed)
  N, P = setup.rollout_rows, setup.sampler_cfg.max_prompt_len
  T = setup.sampler_cfg.max_new_tokens
  rows = []
  for it in range(iterations):
    state, times, rollouts = timed_iteration(fns, setup, state, prompts, key, it)
    mask = np.asarray(rollouts.mask_NT)
    steps_run = int(rollouts.num_steps)
    positions = np.asarray(rollouts.prompt_mask_NP).sum() + mask.sum()
    rows.append(
      {
        **times,
        "sample_pad_frac": 1.0 - mask.sum() / max(N * steps_run, 1),
        "update_pad_frac": 1.0 - positions / (N * (P + T)),
        "generated_tokens": float(mask.sum()),
      }
    )
  later = rows[1:] or rows
  med = {k: statistics.median(r[k] for r in later) for k in later[0]}
  # --quick (a smoke test of the figures): smaller GEMMs and a 32 MiB array; still this
  # machine's measured rates, but not the ones a benchmark should quote.
  peak = flops.matmul_peak(512 if quick else 0, dtype=jnp.dtype(dtype))
  fl = iteration_flops(setup, P=P, T=T, N=N)
  bandwidth = flops.memory_bandwidth(2**25 if quick else 0)
  step_bytes = decode_step_bytes(setup, state.params, P=P, T=T, N=N)
  med.update(
    model_flops=fl,
    xla_flops=xla_flops(fns, setup, state, prompts, rollouts, key),
    mfu_flops="model_flops",
    sample_tokens_per_s=med["generated_tokens"] / med["sample_s"],
    update_tokens_per_s=N * (P + T) / med["update_s"],
    matmul_peak_flops=peak,
    memory_bandwidth_bytes_per_s=bandwidth,
    decode_roofline_tokens_per_s=N * bandwidth / step_bytes,
    iterations=[round(r["iteration_s"], 3) for r in rows],
  )
  med["decode_of_roofline"] = med["sample_tokens_per_s"] / med["decode_roofline_tokens_per_s"]
  med.update(mfu_of(med, fl))
  return med


def decode_step_bytes(setup, params, *, P: int, T: int, N: int) -> float:
  """Bytes one decode step must read at least, at the mean context P + T/2: every weight
  once, in the compute dtype, and the filled key/value slots of every row and layer."""
  cfg = setup.model_cfg
  width = jnp.dtype(cfg.dtype).itemsize
  weights = sum(x.size for x in jax.tree.leaves(params)) * width
  kv = N * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * (P + T / 2) * width
  return weights + kv


def mfu_of(timed: dict, fl: dict) -> dict:
  """MFU per phase of one dtype's timed figures (seconds, matmul_peak_flops) under the
  per-phase FLOPs `fl`: the iteration counts every phase's FLOPs."""
  peak = timed["matmul_peak_flops"]
  return {
    "mfu_sample": fl["sample"] / timed["sample_s"] / peak,
    "mfu_update": fl["update"] / timed["update_s"] / peak,
    "mfu_iteration": sum(fl.values()) / timed["iteration_s"] / peak,
  }


def recompute(path: str) -> list[dict]:
  """The MFU of each committed anchor sitting in `path` (JSON lines, as in
  experiments/results/cpu/) from its own seconds and peaks under today's model FLOPs
  (`iteration_flops`): no new timing. One row per sitting and dtype, with the figures it
  recorded beside."""
  from grpo_jax.trainer import build  # noqa: PLC0415

  setup = build.build(make_config("float32", quick=False))
  P, T = setup.sampler_cfg.max_prompt_len, setup.sampler_cfg.max_new_tokens
  fl = iteration_flops(setup, P=P, T=T, N=setup.rollout_rows)
  rows = []
  for line in pathlib.Path(path).read_text().splitlines():
    record = json.loads(line)
    if not str(record["what"]).startswith("grpo_jax bench_rl_iteration.py"):
      continue
    for dtype in ("float32", "bfloat16"):
      timed = record["result"][dtype]
      recorded = {k: timed[k] for k in ("mfu_sample", "mfu_update", "mfu_iteration")}
      rows.append(
        {
          "sitting": record["sitting"],
          "commit": record["commit"],
          "dtype": dtype,
          "recorded": recorded,
          "recomputed": mfu_of(timed, fl),
        }
      )
  return rows


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--dtypes", default="float32,bfloat16")
  parser.add_argument("--iterations", type=int, default=4)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument(
    "--sampler_dtype", default="", help="the sampler's compute dtype ('': the trainer's)"
  )
  parser.add_argument(
    "--recompute",
    default="",
    help="a results file (JSON lines): print its sittings' MFU under today's FLOPs, no timing",
  )
  args = parser.parse_args(argv)
  if args.recompute:
    rows = recompute(args.recompute)
    print("\n".join(json.dumps(r) for r in rows))
    return {"recomputed": rows}
  out = {
    "device": jax.devices()[0].device_kind,
    "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    "workload": "anchor (issue 20)" if not args.quick else "quick",
  }
  for dtype in args.dtypes.split(","):
    out[dtype] = run_dtype(
      dtype, iterations=args.iterations, quick=args.quick, sampler_dtype=args.sampler_dtype
    )
    out[dtype]["sampler_dtype"] = args.sampler_dtype or dtype
    r = out[dtype]
    print(
      f"{dtype}: iteration {r['iteration_s']:.2f} s (sample {r['sample_s']:.2f}, prepare "
      f"{r['prepare_s']:.2f}, update {r['update_s']:.2f}); MFU (model FLOPs, the head "
      f"where logits are used) update {r['mfu_update']:.1%}, iteration {r['mfu_iteration']:.1%}",
      file=sys.stderr,
    )
  print(json.dumps(out))
  return out


if __name__ == "__main__":
  main()
