"""Update-step throughput and MFU: one jitted `learner.train_step` of the Foundation-benchmark model.

  python experiments/bench_train_step.py                  # batch 8, seq 256 (64 + 192), fp32
  python experiments/bench_train_step.py --batch 16 --steps 5
  python experiments/bench_train_step.py --breakdown      # also time forward / loss+grad alone
  python experiments/bench_train_step.py --wait_idle 120  # on a shared host: wait for idle CPUs
  python experiments/bench_train_step.py --quick          # tiny smoke run

Model: the ~40M-parameter Qwen3-shaped config of experiments/bench_sampler.py (d_model 512,
8 layers, 8 heads, 4 KV heads, head_dim 64, SwiGLU 1536, vocab 32768, tied embeddings),
random weights. Step: `learner.make_train_step(RLConfig(), model_fn, optimizer)` -- GRPO
defaults (ppo_clip, token_mean, no KL, no entropy bonus, one micro-batch) and the
trainer's optimizer (clip_by_global_norm(1.0) + AdamW) -- on a mini-batch of --batch
rows of --prompt_len prompt tokens + (--seq_len - --prompt_len) completion tokens, every
token real (no padding), so every counted FLOP is a useful one. The update step is the
forward and backward through the policy on prompt+completion, the GRPO loss and the
AdamW update; the state is donated, as in training.

Model FLOPs per step (Kaplan et al. 2020 §2.1; PaLM, Chowdhery et al. 2022, App. B), with
B rows, S = P + T tokens per row, T completion tokens, L layers, D d_model, H/K query/KV
heads, E head_dim, F mlp width, V vocab:

  N_body  = L·(2·D·H·E + 2·D·K·E + 3·D·F)       matmul weights of the blocks (q,o,k,v,
                                                  gate,up,down); norms and embeddings excluded
  body    = 6 · N_body · B·S                      2 FLOPs/MAC forward, ×3 for forward+backward
  lm_head = 6 · D·V · B·T                         the tied LM-head matmul, counted only at the
                                                  T positions whose logits the loss uses
  attn    = 6 · L·H·E · B·S² · (1/2 causal)       q·kᵀ and p·v: 2·2·H·E·S per token forward
                                                  over the full S×S square (PaLM's 12·L·H·Q·T
                                                  per token incl. backward), halved because
                                                  only the causal half is needed
  model_flops = body + lm_head + attn

Not counted: the embedding lookup (a gather), norms, RoPE, softmax / log-softmax /
entropy, the loss and the optimizer update (all O(params) or O(B·S·V) elementwise), the
LM head at the P prompt positions (computed by the model, not used) and the masked upper
triangle of attention. `full_square_flops` (PaLM's uncausal attention, LM head at all S
positions) is reported as a separate field, not used for MFU.

MFU = model_flops / median step time / matmul peak, where the peak is the best GEMM FLOP/s
of a jitted --peak_n × --peak_n matmul in float32 and, with --dtype bfloat16, also in
bfloat16 (the higher of the two counts, so a slow bfloat16 GEMM cannot flatter a bfloat16
run), measured right before and right after the timed steps (the larger is used; both are
reported). `mfu` uses the median step; `mfu_best` the fastest step.

Noise: on a small shared host another process halves the step rate. For each timed step
the script reports the share of the CPUs other processes used during it (from /proc/stat
minus this process's CPU time); `step_time_quiet_s` / `mfu_quiet` are the median over the
steps where that share is < 5% (null if none: rerun). `--wait_idle S` waits up to S
seconds for idle CPUs before timing. The 1-minute load average includes this process.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
from bench_sampler import BENCH_MODEL  # noqa: E402

from grpo_jax.infra import flops as flops_lib  # noqa: E402
from grpo_jax.models import logprobs, model  # noqa: E402
from grpo_jax.rl import learner, spec  # noqa: E402


def model_flops(cfg: model.ModelConfig, *, batch: int, prompt_len: int, completion_len: int):
  """Model FLOPs of one update step (see the module docstring), by part."""
  D, H, K, E, F, V, L = (
    cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim, cfg.vocab_size, cfg.n_layers,
  )  # fmt: skip
  S, T = prompt_len + completion_len, completion_len
  n_body = L * (2 * D * H * E + 2 * D * K * E + 3 * D * F)
  parts = dict(
    body=6.0 * n_body * batch * S,
    lm_head=6.0 * D * V * batch * T,
    attn=6.0 * L * H * E * batch * S * S * 0.5,
  )
  parts["total"] = parts["body"] + parts["lm_head"] + parts["attn"]
  parts["full_square_flops"] = (
    parts["body"] + 6.0 * D * V * batch * S + 6.0 * L * H * E * batch * S * S
  )
  parts["n_body_params"] = n_body
  return parts


def load_avg() -> float:
  try:
    return os.getloadavg()[0]
  except OSError:
    return float("nan")


def _cpu_busy_s() -> float | None:
  """Seconds of CPU time all processes have used since boot (Linux /proc/stat), or None."""
  try:
    with open("/proc/stat") as f:
      fields = [float(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
  return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_idle(max_s: float, threshold: float = 0.9) -> float:
  """Waits up to max_s seconds for a 2 s window in which the CPUs are >= threshold idle.
  Returns the idle fraction of the last window (nan off Linux)."""
  end, idle = time.monotonic() + max_s, float("nan")
  while True:
    b, t = _cpu_busy_s(), time.monotonic()
    if b is None:
      return idle
    time.sleep(2.0)
    idle = 1.0 - (_cpu_busy_s() - b) / ((time.monotonic() - t) * os.cpu_count())
    if idle >= threshold or time.monotonic() >= end:
      return idle


def make_minibatch(cfg, params, model_fn, *, batch: int, prompt_len: int, completion_len: int):
  """A full (unpadded) GRPO mini-batch: groups of 4 rows, ±1 advantages, π_old = π_θ."""
  kp, kt, ka = jax.random.split(jax.random.key(1), 3)
  B, P, T = batch, prompt_len, completion_len
  prompt = jax.random.randint(kp, (B, P), 3, cfg.vocab_size)
  tokens = jax.random.randint(kt, (B, T), 3, cfg.vocab_size)
  pmask, mask = jnp.ones((B, P), bool), jnp.ones((B, T), bool)
  old_logp, _ = jax.jit(
    functools.partial(logprobs.completion_logprobs, model_fn=model_fn)
  )(params, prompt, pmask, tokens, mask)  # fmt: skip
  adv = jnp.where(jax.random.bernoulli(ka, 0.5, (B, 1)), 1.0, -1.0) * jnp.ones((B, T))
  return spec.RolloutBatch(
    prompt_tokens_NP=prompt,
    prompt_mask_NP=pmask,
    tokens_NT=tokens,
    mask_NT=mask,
    loss_mask_NT=mask,
    adv_NT=adv.astype(jnp.float32),
    old_logp_NT=old_logp,
    ref_logp_NT=jnp.zeros((B, T), jnp.float32),
    group_ids_N=jnp.arange(B, dtype=jnp.int32) // 4,
  )


def make_optimizer(lr: float = 1e-6):
  """The trainer's optimizer (`spec.make_optimizer`): global-norm clip + AdamW."""
  return spec.make_optimizer(lr=lr, weight_decay=0.01, grad_clip=1.0)


def time_fn(fn, steps: int) -> list[float]:
  out = []
  for _ in range(steps):
    t = time.perf_counter()
    fn()
    out.append(time.perf_counter() - t)
  return out


def time_steps(fn, steps: int) -> tuple[list[float], list[float]]:
  """Wall seconds of each call, and the CPU share other processes took during it: (CPU
  time of all processes - this process's) / (wall x cores); nan where it cannot be read."""
  times, other = [], []
  for _ in range(steps):
    b, own, t = _cpu_busy_s(), time.process_time(), time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    own, b2 = time.process_time() - own, _cpu_busy_s()
    times.append(wall)
    other.append(float("nan") if b is None else max(0.0, (b2 - b - own) / (wall * os.cpu_count())))
  return times, other


def breakdown(cfg, params, mb, rl_cfg, model_fn, hyper, steps):
  """Median seconds of the forward alone (log-probs + stats) and of loss + gradient."""
  fwd = jax.jit(
    lambda p: logprobs.completion_logprobs(
      p, mb.prompt_tokens_NP, mb.prompt_mask_NP, mb.tokens_NT, mb.mask_NT,
      model_fn=model_fn, with_stats=True,
    )
  )  # fmt: skip
  w = mb.loss_mask_NT / jnp.sum(mb.loss_mask_NT)

  def loss(p):
    total, _ = learner.token_terms(p, mb, hyper, cfg=rl_cfg, model_fn=model_fn)
    return jnp.sum(w * total)

  grad = jax.jit(jax.grad(loss))
  out = {}
  for name, f in (("forward_s", fwd), ("loss_and_grad_s", grad)):
    call = functools.partial(lambda g: jax.block_until_ready(g(params)), f)
    call()
    out[name] = statistics.median(time_fn(call, steps))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch", type=int, default=8, help="mini-batch rows")
  parser.add_argument("--seq_len", type=int, default=256, help="prompt + completion tokens")
  parser.add_argument("--prompt_len", type=int, default=64)
  parser.add_argument("--steps", type=int, default=5, help="timed steps (after 1 warm-up)")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--remat", default="none", choices=["none", "full", "dots"])
  parser.add_argument("--scan", action="store_true", help="scan_layers=True")
  parser.add_argument("--micro_batches", type=int, default=1)
  parser.add_argument("--peak_n", type=int, default=2048, help="side of the peak GEMM")
  parser.add_argument("--breakdown", action="store_true", help="also time fwd / loss+grad alone")
  parser.add_argument("--wait_idle", type=float, default=0.0,
                      help="wait up to this many seconds for idle CPUs before timing")  # fmt: skip
  parser.add_argument("--quick", action="store_true", help="tiny workload for a smoke test")
  args = parser.parse_args(argv)

  overrides = dict(dtype=args.dtype, remat=args.remat, scan_layers=args.scan)
  if args.quick:
    overrides.update(d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=32, mlp_dim=384,
                     vocab_size=4096)  # fmt: skip
    args.batch, args.seq_len, args.prompt_len, args.steps, args.peak_n = 2, 32, 8, 2, 512
  P, T = args.prompt_len, args.seq_len - args.prompt_len
  if T < 1 or P < 1:
    raise SystemExit(f"--prompt_len must be in [1, --seq_len); got {P} of {args.seq_len}.")
  cfg = model.ModelConfig(**{**BENCH_MODEL, **overrides})
  model_fn = model.make_model_fn(cfg)
  params = jax.jit(functools.partial(model.init, cfg))(jax.random.key(0))
  n_params = model.param_count(params)
  rl_cfg = spec.RLConfig(micro_batches=args.micro_batches)
  hyper = rl_cfg.step_hyper()
  optimizer = make_optimizer()
  mb = make_minibatch(cfg, params, model_fn, batch=args.batch, prompt_len=P, completion_len=T)
  flops = model_flops(cfg, batch=args.batch, prompt_len=P, completion_len=T)

  step = learner.make_train_step(rl_cfg, model_fn, optimizer)
  state = spec.init_state(params, optimizer)
  t = time.perf_counter()
  compiled = step.lower(state, mb, hyper).compile()
  compile_s = time.perf_counter() - t
  extra = {}
  if args.breakdown:
    extra = breakdown(cfg, state.params, mb, rl_cfg, model_fn, hyper, max(2, args.steps // 2))

  holder = [state]

  def run():
    holder[0], metrics = compiled(holder[0], mb, hyper)
    jax.block_until_ready((holder[0], metrics))

  run()  # Warm-up (the first call also allocates the donated buffers).
  idle = wait_idle(args.wait_idle) if args.wait_idle > 0 else float("nan")
  load_before = load_avg()
  # The peak is the best of float32 and the compute dtype (never the lower of the two).
  peak_dtypes = sorted({"float32", jnp.dtype(cfg.compute_dtype).name})
  peak_of = lambda: max(flops_lib.matmul_peak(args.peak_n, dtype=jnp.dtype(d)) for d in peak_dtypes)
  peak_before = peak_of()
  times, other = time_steps(run, args.steps)
  peak_after = peak_of()
  load_after = load_avg()
  peak = max(peak_before, peak_after)
  step_s = statistics.median(times)
  quiet = [t for t, o in zip(times, other) if o < 0.05]
  quiet_s = statistics.median(quiet) if quiet else float("nan")
  tokens = args.batch * args.seq_len
  result = dict(
    step_time_s=step_s,
    step_times_s=times,
    tokens_per_s=tokens / step_s,
    model_flops_per_step=flops["total"],
    model_flops_parts=dict(body=flops["body"], lm_head=flops["lm_head"], attn=flops["attn"]),
    full_square_flops_per_step=flops["full_square_flops"],
    achieved_flops=flops["total"] / step_s,
    peak_flops=peak,
    peak_flops_before=peak_before,
    peak_flops_after=peak_after,
    peak_dtypes=peak_dtypes,
    mfu=flops["total"] / step_s / peak,
    step_time_min_s=min(times),
    mfu_best=flops["total"] / min(times) / peak,
    other_cpu_frac=other,
    quiet_steps=len(quiet),
    step_time_quiet_s=quiet_s,
    mfu_quiet=flops["total"] / quiet_s / peak if quiet else float("nan"),
    idle_before=idle,
    compile_s=compile_s,
    load_avg_1m=[load_before, load_after],
    backend=jax.default_backend(),
    device=str(jax.devices()[0].device_kind),
    cpu_count=os.cpu_count(),
    params=n_params,
    body_matmul_params=flops["n_body_params"],
    config=dict(
      batch=args.batch,
      seq_len=args.seq_len,
      prompt_len=P,
      completion_len=T,
      dtype=args.dtype,
      remat=args.remat,
      scan_layers=args.scan,
      micro_batches=args.micro_batches,
      steps=args.steps,
      peak_n=args.peak_n,
      quick=args.quick,
    ),
    **extra,
  )
  f = lambda x: f"{x / 1e9:,.1f}"
  rows = [
    ("model", f"{n_params / 1e6:.1f}M params ({flops['n_body_params'] / 1e6:.1f}M block matmul)"),
    ("workload", f"batch {args.batch} x ({P} prompt + {T} completion) = {tokens} tokens, "
                 f"{args.dtype}, remat={args.remat}, scan={args.scan}, micro={args.micro_batches}"),
    ("compile", f"{compile_s:.1f} s"),
    ("step time (median)", f"{step_s:.3f} s  (all: {', '.join(f'{x:.3f}' for x in times)})"),
    ("tokens/s", f"{tokens / step_s:,.0f}"),
    ("model GFLOP/step", f"{f(flops['total'])}  (body {f(flops['body'])}, lm_head "
                         f"{f(flops['lm_head'])}, attn {f(flops['attn'])})"),
    ("achieved GFLOP/s", f(flops["total"] / step_s)),
    ("matmul peak GFLOP/s", f"{f(peak)} (best of {'/'.join(peak_dtypes)}; before {f(peak_before)}, after {f(peak_after)})"),
    ("MFU (median step)", f"{100 * result['mfu']:.1f}%  (best step {100 * result['mfu_best']:.1f}%)"),
    ("other processes' CPU", ", ".join(f"{100 * o:.0f}%" for o in other) + "  per step"),
    ("quiet steps (<5%)", f"{len(quiet)}: median {quiet_s:.3f} s, MFU "
                          f"{100 * result['mfu_quiet']:.1f}%" if quiet else "none: distrust this run"),
    ("load avg (1m)", f"{load_before:.2f} -> {load_after:.2f} on {os.cpu_count()} CPUs"),
  ]  # fmt: skip
  for k in ("forward_s", "loss_and_grad_s"):
    if k in extra:
      rows.append((k.replace("_s", " (s)"), f"{extra[k]:.3f}"))
  width = max(len(k) for k, _ in rows)
  for k, v in rows:
    print(f"{k:<{width}}  {v}", file=sys.stderr)

  # NaN (no quiet step, no /proc/stat) is not JSON: null.
  def clean(x):
    if isinstance(x, dict):
      return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
      return [clean(v) for v in x]
    return None if isinstance(x, float) and x != x else x

  print(json.dumps(clean(result)))


if __name__ == "__main__":
  main()
