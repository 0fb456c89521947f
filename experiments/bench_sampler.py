"""Sampler throughput: grpo_jax's jitted KV-cache group sampler vs Hugging Face `generate`.

  python experiments/bench_sampler.py            # full workload (a few minutes on 2 CPU cores)
  python experiments/bench_sampler.py --quick    # small smoke run (a 2-layer model)

Model: a ~40M-parameter Qwen3-shaped config with random weights (d_model 512, 8 layers,
8 heads, 4 KV heads, head_dim 64, SwiGLU 1536, vocab 32768, tied embeddings), float32.
Workload: 32 prompts x 64 tokens, G = 1 and G = 8, 128 new tokens, temperature 1.0, no
early EOS. Tokens/s counts generated tokens (B*G*128) over the whole call, prefill
included; the median of --repeats runs after one warm-up. Our runs alternate with the
Hugging Face ones, so that a change in a shared machine's load biases neither side; the
ratio is median(HF seconds) / median(our seconds), and the range of the per-pair ratios
is printed too. Compile time is reported separately (AOT lower + compile).

When torch and transformers are installed (`pip install -e ".[bench]"`), the same config
and workload run through `Qwen3ForCausalLM.generate` (num_return_sequences=G, which
prefills each prompt G times) and the ratio is printed.

Fraction of peak = model FLOPs per generated token x tokens/s / measured matmul peak,
where FLOPs per token = 2 x (matmul params incl. the LM head: every decode step's logits
are used) + 4 x L x H x E x context, with the mean decode context P + (T - 1)/2 (step k
attends P + k positions, as `flops.sampling_flops` counts); the prefill is not counted.
The peak is the best of several float32 GEMMs.

Matmul floor: one decode step's weight matmuls alone (every layer's q, k, v, o, gate, up,
down and the LM head, on B*G rows, jitted; `matmul_floor_seconds`). No sampler can step
faster with the same GEMMs, so B*G / floor bounds tokens/s, and floor tokens/s over HF's
bounds the ratio any XLA sampler could reach on this machine.

Takes about 7 minutes on 2 CPU cores with the Hugging Face baseline (G = 8 dominates).

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import flops
from grpo_jax.models import model, refill, sampling

BENCH_MODEL = dict(
  vocab_size=32768, d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64, mlp_dim=1536,
  qk_norm=True, tie_embeddings=True, rope_theta=1e6,
)  # fmt: skip
# --quick: a smoke test of the script's figures (tests/experiments/test_experiments.py), not a benchmark.
QUICK_MODEL = dict(
  BENCH_MODEL, vocab_size=4096, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32,
  mlp_dim=384,
)  # fmt: skip


def time_calls(fn, repeats: int) -> list[float]:
  out = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t)
  return out


def grpo_jax_runner(cfg, params, prompts_BP, *, group_size, new_tokens):
  """(run, compile_s): run() samples once with a fresh key and blocks until done."""
  scfg = sampling.SamplerConfig(
    max_new_tokens=new_tokens,
    eos_ids=(-1,),
    pad_id=0,
    group_size=group_size,
    prompt_buckets=(prompts_BP.shape[1],),
  )
  prompts = sampling.prepare_prompts(prompts_BP.tolist(), cfg=scfg)
  hyper = sampling.sampling_params(temperature=1.0)
  fn = sampling.make_policy_sampler(cfg, scfg)
  t = time.perf_counter()
  compiled = fn.lower(params, prompts, jax.random.key(0), hyper).compile()
  compile_s = time.perf_counter() - t
  keys = iter(jax.random.split(jax.random.key(0), 10_000))  # A fresh key per run.
  run = lambda: jax.block_until_ready(compiled(params, prompts, next(keys), hyper))
  out = run()  # Warm-up.
  assert int(out.num_steps) == new_tokens and bool(jnp.all(out.mask_NT)), (
    "the workload must not stop early"
  )
  return run, compile_s


def matmul_floor_seconds(cfg, params, rows: int, repeats: int = 20) -> float:
  """Median seconds of one decode step's matmuls alone, for `rows` rows, jitted.

  The weight matmuls of every layer (q, k, v, o, gate, up, down) and the LM head, on
  the model's own weights, chained through the layers so that none is skipped; no
  attention, norms, cache writes or sampling. No decode step can be faster on this
  machine with XLA's GEMMs, so rows / floor is a ceiling on tokens/s.
  """

  def step(params, x_ND):
    for i in range(cfg.n_layers):
      attn, mlp = params[f"layer_{i}"]["attn"], params[f"layer_{i}"]["mlp"]
      # Kernels q, k, v [D, heads, E] and o [heads, E, D] as matrices.
      q, k, v = (x_ND @ attn[n]["kernel"].reshape(cfg.d_model, -1) for n in ("q", "k", "v"))
      x_ND = x_ND + q @ attn["o"]["kernel"].reshape(-1, cfg.d_model) + 1e-3 * (k.sum() + v.sum())
      h_NF = jax.nn.silu(x_ND @ mlp["gate"]["kernel"]) * (x_ND @ mlp["up"]["kernel"])
      x_ND = x_ND + h_NF @ mlp["down"]["kernel"]
    return x_ND @ params["embed"]["embedding"].T

  fn = jax.jit(step)
  x_ND = jax.random.normal(jax.random.key(2), (rows, cfg.d_model))
  jax.block_until_ready(fn(params, x_ND))
  return statistics.median(time_calls(lambda: jax.block_until_ready(fn(params, x_ND)), repeats))


def count_prefill_rows(cfg, params, prompts_BP, *, group_size):
  """Rows that go through prefill calls (T > 1), counted at run time."""
  rows = []
  model_fn = model.make_model_fn(cfg)

  def counting_fn(params, tokens_BT, positions_BT, cache):
    if tokens_BT.shape[1] > 1:
      jax.debug.callback(lambda t: rows.append(t.shape[0]), tokens_BT)
    return model_fn(params, tokens_BT, positions_BT, cache)

  scfg = sampling.SamplerConfig(max_new_tokens=2, eos_ids=(-1,), pad_id=0, group_size=group_size)
  fn = sampling.make_sample_fn(
    model_fn=counting_fn, init_cache=functools.partial(model.init_cache, cfg), cfg=scfg
  )
  jax.block_until_ready(
    fn(
      params,
      sampling.prepare_prompts(prompts_BP.tolist(), cfg=scfg),
      jax.random.key(0),
      sampling.sampling_params(),
    )
  )
  jax.effects_barrier()
  return sum(rows)


def hf_runner(cfg, prompts_BP, *, group_size, new_tokens):
  """run() for `generate` on the same config and workload, or None without torch."""
  try:
    import torch
    import transformers
  except ImportError:
    return None
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen3Config(
    vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.mlp_dim,
    num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
    head_dim=cfg.head_dim, tie_word_embeddings=True, rope_theta=cfg.rope_theta, max_position_embeddings=1024,
  )  # fmt: skip
  hf = transformers.Qwen3ForCausalLM(hf_cfg).eval().to(torch.float32)
  input_ids = torch.tensor(prompts_BP, dtype=torch.long)
  kwargs = dict(
    attention_mask=torch.ones_like(input_ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
    max_new_tokens=new_tokens, min_new_tokens=new_tokens, num_return_sequences=group_size,
    pad_token_id=0, eos_token_id=None,
  )  # fmt: skip

  def run():
    with torch.inference_mode():
      out = hf.generate(input_ids, **kwargs)
    assert out.shape == (prompts_BP.shape[0] * group_size, prompts_BP.shape[1] + new_tokens), (
      out.shape
    )

  run()  # Warm-up.
  return run


def skewed_lengths(n: int, new_tokens: int, *, seed: int = 0) -> np.ndarray:
  """Completion lengths of a long-tailed distribution: lognormal (σ = 1) with mean
  new_tokens / 4 before capping, rounded and clipped to [1, new_tokens]; fixed seed."""
  mu = np.log(new_tokens / 4) - 0.5
  x = np.random.default_rng(seed).lognormal(mu, 1.0, size=n)
  return np.clip(np.rint(x), 1, new_tokens).astype(np.int32)


def skewed(cfg, params, prompts_BP, *, group_size, new_tokens, slot_fractions, repeats):
  """Useful completion tokens/s of the static sampler and the slot-refill sampler on the
  skewed-length workload (each row stops at its drawn length: `limit_N`), timed in
  alternation; the ratio is refill ÷ static (medians)."""
  B, P = prompts_BP.shape
  N = B * group_size
  scfg = sampling.SamplerConfig(
    max_new_tokens=new_tokens, eos_ids=(-1,), pad_id=0, group_size=group_size, prompt_buckets=(P,)
  )
  prompts = sampling.prepare_prompts(prompts_BP.tolist(), cfg=scfg)
  hyper = sampling.sampling_params(temperature=1.0)
  limit = jnp.asarray(skewed_lengths(N, new_tokens))
  useful = int(limit.sum())
  runs = {"static": jax.jit(functools.partial(
    sampling.sample, model_fn=model.make_model_fn(cfg),
    init_cache=functools.partial(model.init_cache, cfg), cfg=scfg))}  # fmt: skip
  for frac in slot_fractions:
    slots = max(int(N * frac), 1)
    runs[f"refill_{slots}"] = refill.make_policy_sampler(cfg, scfg, slots=slots)
  keys = iter(jax.random.split(jax.random.key(5), 10_000))
  steps = {}
  for name, fn in runs.items():  # Warm-up (compiles), and the work each does.
    out = jax.block_until_ready(fn(params, prompts, next(keys), hyper, limit))
    assert int(out.mask_NT.sum()) == useful, (name, int(out.mask_NT.sum()), useful)
    steps[name] = int(out.num_steps)
  seconds = {name: [] for name in runs}
  for _ in range(repeats):
    for name, fn in runs.items():
      seconds[name] += time_calls(
        lambda fn=fn: jax.block_until_ready(fn(params, prompts, next(keys), hyper, limit)), 1
      )
  tps = {name: useful / statistics.median(v) for name, v in seconds.items()}
  best = max((n for n in runs if n != "static"), key=tps.get)
  return dict(
    rows=N,
    mean_length=float(limit.mean()),
    max_length=int(limit.max()),
    useful_tokens=useful,
    decode_steps=steps,
    useful_tokens_per_s=tps,
    seconds=seconds,
    best_refill=best,
    ratio_refill_vs_static=tps[best] / tps["static"],
  )


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny workload for a smoke test")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--groups", type=int, nargs="+", default=[1, 8])
  parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face baseline")
  parser.add_argument("--no-skewed", action="store_true", help="skip the skewed-length workload")
  parser.add_argument("--skewed-group", type=int, default=8)
  args = parser.parse_args(argv)

  B, P, T = (4, 16, 8) if args.quick else (32, 64, 128)
  cfg = model.ModelConfig(**(QUICK_MODEL if args.quick else BENCH_MODEL))
  params = jax.jit(functools.partial(model.init, cfg))(jax.random.key(0))
  prompts_BP = np.asarray(jax.random.randint(jax.random.key(1), (B, P), 3, cfg.vocab_size))
  peak = flops.matmul_peak(512 if args.quick else 2048)
  fpt = flops.forward_flops_per_token(cfg, context=P + (T - 1) / 2)
  result = dict(
    backend=jax.default_backend(),
    device=str(jax.devices()[0].device_kind),
    params=model.param_count(params),
    workload=dict(prompts=B, prompt_len=P, new_tokens=T, temperature=1.0),
    matmul_peak_gflops=peak / 1e9,
    flops_per_token=fpt,
  )
  print(
    f"model: {result['params'] / 1e6:.1f}M params; matmul peak {peak / 1e9:.0f} GFLOP/s",
    file=sys.stderr,
  )
  for G in args.groups:
    ours, compile_s = grpo_jax_runner(cfg, params, prompts_BP, group_size=G, new_tokens=T)
    hf = None if args.no_hf else hf_runner(cfg, prompts_BP, group_size=G, new_tokens=T)
    # Interleaved (ours, HF, ours, HF, ...): a change in the machine's load between the
    # two measurements biases neither side.
    ours_s, hf_s = [], []
    for _ in range(args.repeats):
      ours_s += time_calls(ours, 1)
      if hf is not None:
        hf_s += time_calls(hf, 1)
    n_tokens = B * G * T
    floor_s = matmul_floor_seconds(cfg, params, B * G)
    entry = dict(
      tokens_per_s=n_tokens / statistics.median(ours_s),
      compile_s=compile_s,
      fraction_of_peak=n_tokens / statistics.median(ours_s) * fpt / peak,
      prefill_rows=count_prefill_rows(cfg, params, prompts_BP, group_size=G),
      seconds=ours_s,
      ms_per_step=1e3 * statistics.median(ours_s) / T,  # The whole call (prefill included) / T.
      matmul_floor_ms=1e3 * floor_s,
      matmul_floor_tokens_per_s=B * G / floor_s,
    )
    print(f"G={G}: grpo_jax {entry['tokens_per_s']:.0f} tok/s (compile {entry['compile_s']:.1f}s, "
          f"{100 * entry['fraction_of_peak']:.1f}% of peak, prefill rows {entry['prefill_rows']} for {B} prompts)", file=sys.stderr)  # fmt: skip
    print(f"G={G}: {entry['ms_per_step']:.1f} ms per step (prefill included); its matmuls alone "
          f"{entry['matmul_floor_ms']:.1f} ms (at most {entry['matmul_floor_tokens_per_s']:.0f} tok/s)", file=sys.stderr)  # fmt: skip
    if hf is not None:
      entry["hf_tokens_per_s"] = n_tokens / statistics.median(hf_s)
      entry["hf_seconds"] = hf_s
      entry["ratio_vs_hf"] = statistics.median(hf_s) / statistics.median(ours_s)
      pair_ratios = [h / o for o, h in zip(ours_s, hf_s)]
      entry["ratio_vs_hf_pairs"] = [min(pair_ratios), max(pair_ratios)]
      entry["matmul_floor_ratio_vs_hf"] = (
        entry["matmul_floor_tokens_per_s"] / entry["hf_tokens_per_s"]
      )
      print(
        f"G={G}: HF generate {entry['hf_tokens_per_s']:.0f} tok/s -> ratio {entry['ratio_vs_hf']:.2f}x "
        f"(paired runs {min(pair_ratios):.2f}-{max(pair_ratios):.2f}x); the matmul floor "
        f"allows at most {entry['matmul_floor_ratio_vs_hf']:.2f}x",
        file=sys.stderr,
      )
    result[f"G{G}"] = entry
  if not args.no_skewed:
    sk = skewed(
      cfg,
      params,
      prompts_BP,
      group_size=args.skewed_group,
      new_tokens=T,
      # --quick: one refill sampler (a smoke test of the path, one compile, not three).
      slot_fractions=(0.25,) if args.quick else (0.125, 0.25, 0.5),
      repeats=max(args.repeats // 2, 1),
    )
    print(
      f"skewed lengths (mean {sk['mean_length']:.1f} of {T}): static "
      f"{sk['useful_tokens_per_s']['static']:.0f} useful tok/s, {sk['best_refill']} "
      f"{sk['useful_tokens_per_s'][sk['best_refill']]:.0f} -> {sk['ratio_refill_vs_static']:.2f}x",
      file=sys.stderr,
    )
    result["skewed"] = sk
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
