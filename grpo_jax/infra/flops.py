"""Model FLOPs and the device's measured matmul peak, for MFU estimates.

Counts follow the PaLM appendix B convention (Chowdhery et al. 2022, "PaLM", App. B;
Kaplan et al. 2020 §2.1): only matmuls count, a multiply-add is 2 FLOPs, and a backward
pass costs twice the forward. Per token of a decoder with L layers, model width D,
H query heads and K KV heads of size E, MLP width F and vocabulary V:

    matmul params  P_mm = L·(2·D·H·E + 2·D·K·E + 3·D·F) + D·V      (q,o; k,v; SwiGLU; LM head)
    forward        f(c) = 2·P_mm + 4·L·H·E·c                        (c = attended context)
    train (fwd+bwd) 3·f(c)

Embedding lookups, norms, RoPE and softmax are not counted (they are not matmuls).
MFU = counted FLOPs / wall time / peak, where the peak is the best float32 GEMM rate the
device shows in `matmul_peak` (or a configured value).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp


def matmul_params(cfg) -> int:
  """P_mm: parameters that take part in a matmul per token (LM head included)."""
  D, H, K, E, F, V, L = (
    cfg.d_model,
    cfg.n_heads,
    cfg.n_kv_heads,
    cfg.head_dim,
    cfg.mlp_dim,
    cfg.vocab_size,
    cfg.n_layers,
  )
  return L * (2 * D * H * E + 2 * D * K * E + 3 * D * F) + D * V


def forward_flops_per_token(cfg, *, context: float) -> float:
  """f(c) = 2·P_mm + 4·L·H·E·c: one token's forward with c attended positions."""
  return 2.0 * matmul_params(cfg) + 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * context


def sequence_forward_flops(cfg, *, length: int) -> float:
  """A causal forward over `length` tokens: Σ_t f(t+1) = 2·P_mm·n + 2·L·H·E·n·(n+1)."""
  n = float(length)
  return 2.0 * matmul_params(cfg) * n + 2.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * n * (
    n + 1
  )


def sampling_flops(
  cfg, *, prompts: int, group_size: int, prompt_len: int, new_tokens: float
) -> float:
  """One prefill per prompt, then `new_tokens` decode steps per row (mean, over all rows)
  attending to the prompt plus the tokens so far (mean context P + T/2)."""
  prefill = prompts * sequence_forward_flops(cfg, length=prompt_len)
  decode = (
    prompts
    * group_size
    * new_tokens
    * forward_flops_per_token(cfg, context=prompt_len + new_tokens / 2)
  )
  return prefill + decode


def memory_bandwidth(n_bytes: int = 0, repeats: int = 10) -> float:
  """Best memory bandwidth (bytes/s) over `repeats` jitted `x + 1` passes over a float32
  array of n_bytes (read once, written once; default 1 GiB on an accelerator, 256 MiB on
  a CPU): the roofline a decode step's weight and cache reads are held to."""
  if not n_bytes:
    n_bytes = 2**28 if jax.default_backend() == "cpu" else 2**30
  x = jnp.zeros((n_bytes // 4,), jnp.float32)
  add = jax.jit(lambda x: x + 1.0)
  add(x).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    add(x).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n_bytes / best


def matmul_peak(n: int = 0, repeats: int = 10, *, dtype=jnp.float32) -> float:
  """Best GEMM rate (FLOP/s) over `repeats` jitted n×n×n matmuls of `dtype` operands,
  accumulated in float32 (for bfloat16 the fastest form on XLA:CPU, about twice a
  bfloat16-output GEMM; the model's bfloat16 Dense layers use it). n defaults to 1024 on
  a CPU and 8192 on an accelerator (smaller GEMMs there measure launch overhead). On a
  GPU a float32 GEMM runs as TF32 unless jax_default_matmul_precision says otherwise."""
  n = n or (1024 if jax.default_backend() == "cpu" else 8192)
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), dtype)
  b = jax.random.normal(kb, (n, n), dtype)
  dot = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  dot(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    dot(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n**3 / best
