"""Model FLOPs and the device's measured matmul peak, for MFU estimates.

Counts follow the PaLM appendix B convention (Chowdhery et al. 2022, "PaLM", App. B;
Kaplan et al. 2020 §2.1): only matmuls count, a multiply-add is 2 FLOPs, and a backward
pass costs twice the forward. Per token of a decoder with L layers, model width D,
H query heads and K KV heads of size E, MLP width F and vocabulary V:

    body params    P_body = L·(2·D·H·E + 2·D·K·E + 3·D·F)           (q,o; k,v; SwiGLU)
    head params    P_head = D·V                                     (LM head)
    forward        f(c) = 2·(P_body + P_head) + 4·L·H·E·c            (c = attended context)
    (a mixture of experts counts the k experts a token goes through, `body_matmul_params`;
    a sliding-window layer attends min(c, W) positions, `_attended`)
    train (fwd+bwd) 3·f(c)

One difference from pre-training MFU: the LM head counts only at the positions whose
logits the algorithm uses (`sequence_forward_flops(head_positions=...)`). Pre-training
uses every position's logits, so its convention puts the head at all of them
(head_positions = length). A GRPO iteration uses fewer:
  - sampling: the prefill's logits are never used (the last prompt token is fed as the
    first decode step), so the head runs once per row per decode step and never at
    prefill (`sampling_flops`);
  - the log-prob forwards and the update: the head runs at the T slots P-1 .. P+T-2 that
    predict completion tokens (`logprobs.completion_logits`, `logits_slice`), never at
    the prompt's (`phase_flops`).
The layer stack counts at every position a forward runs over, even where a position's
last-layer output feeds nothing: the final completion token in the update, and the last
layer's q, o, attention and MLP at prefill. XLA drops the prefill's, so there the count
runs about (P−1)·2·(2·D·H·E + 3·D·F) a prompt above what XLA computes: 0.4% of the anchor's
sampling.
A chunked head (rl.logit_chunk) recomputes its logits in the backward, and remat
recomputes the body. Neither recomputation is counted: these are model FLOPs, not
hardware FLOPs.

Embedding lookups, norms, RoPE and softmax are not counted (they are not matmuls).
MFU = counted FLOPs / wall time / peak, where the peak is the best float32 GEMM rate the
device shows in `matmul_peak` (or a configured value).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp


def body_matmul_params(cfg) -> int:
  """P_body = L·(2·D·H·E + 2·D·K·E + 3·D·F): matmul parameters of the layer stack that a
  token goes through. A mixture of experts (model.n_experts X, top k of width F_e): the
  MLP term is k·3·D·F_e + D·X (its k experts and the router), not the X experts held."""
  D, H, K, E, F, L = (
    cfg.d_model,
    cfg.n_heads,
    cfg.n_kv_heads,
    cfg.head_dim,
    cfg.mlp_dim,
    cfg.n_layers,
  )
  mlp = 3 * D * F
  if getattr(cfg, "n_experts", 0):
    mlp = cfg.experts_per_token * 3 * D * cfg.expert_mlp_dim + D * cfg.n_experts
  return L * (2 * D * H * E + 2 * D * K * E + mlp)


def _attended(cfg, context: float) -> float:
  """Σ over layers of the positions a query attends at context c: c on a full layer,
  min(c, W) on a sliding-window one (model.sliding_window W)."""
  sliding = getattr(cfg, "sliding_layers", (False,) * cfg.n_layers)
  return sum(min(context, cfg.sliding_window) if s else context for s in sliding)


def _attended_sequence(cfg, n: float) -> float:
  """Σ over layers of Σ_{t<n} (positions query t attends): n(n+1)/2 on a full layer;
  with a window W < n, W(W+1)/2 + (n − W)·W."""
  full = n * (n + 1) / 2
  sliding = getattr(cfg, "sliding_layers", (False,) * cfg.n_layers)
  W = getattr(cfg, "sliding_window", 0)
  windowed = full if not W or n <= W else W * (W + 1) / 2 + (n - W) * W
  return sum(windowed if s else full for s in sliding)


def head_matmul_params(cfg) -> int:
  """P_head = D·V: the LM head's matmul parameters (tied or not)."""
  return cfg.d_model * cfg.vocab_size


def matmul_params(cfg) -> int:
  """P_mm = P_body + P_head: parameters that take part in a matmul per token whose
  logits are computed."""
  return body_matmul_params(cfg) + head_matmul_params(cfg)


def forward_flops_per_token(cfg, *, context: float) -> float:
  """f(c) = 2·P_mm + 4·L·H·E·c: one token's forward with c attended positions, LM head
  included (a decode step)."""
  return 2.0 * matmul_params(cfg) + 4.0 * cfg.n_heads * cfg.head_dim * _attended(cfg, context)


def sequence_forward_flops(cfg, *, length: int, head_positions: int) -> float:
  """A causal forward over n = `length` tokens with the LM head at h = `head_positions`:

    2·P_body·n + 2·P_head·h + 2·L·H·E·n·(n+1)      (Σ_t 4·L·H·E·(t+1) for the attention)

  h = n is the pre-training convention (every position's logits); a teacher-forced
  forward over [prompt ; completion] uses h = T (`logprobs.completion_logits`)."""
  n = float(length)
  attention = 4.0 * cfg.n_heads * cfg.head_dim * _attended_sequence(cfg, n)
  return (
    2.0 * body_matmul_params(cfg) * n + 2.0 * head_matmul_params(cfg) * head_positions + attention
  )


def sampling_flops(
  cfg, *, prompts: int, group_size: int, prompt_len: int, new_tokens: float
) -> float:
  """The sampler's (`sampling.prefill`, `sampling.decode`): B = `prompts`, N = B·G rows,
  P = `prompt_len`, n = `new_tokens` decode steps per row (every row runs every step):

    prefill  B · sequence_forward_flops(length=P−1, head_positions=0)
    decode   N · Σ_{k=0}^{n−1} f(P + k) = N·n·(2·P_mm + 4·L·H·E·(P + (n−1)/2))

  The prefill writes each prompt minus its last token into the cache, once per prompt,
  and its logits are never used (XLA drops that head). Decode step k feeds slot P−1+k
  and attends to P + k positions; its head gives the next token's distribution (step 0:
  the last prompt token's)."""
  P, n = prompt_len, float(new_tokens)
  prefill = prompts * sequence_forward_flops(cfg, length=P - 1, head_positions=0)
  decode = prompts * group_size * n * forward_flops_per_token(cfg, context=P + (n - 1) / 2)
  return prefill + decode


def phase_flops(
  cfg,
  *,
  prompts: int,
  group_size: int,
  prompt_len: int,
  new_tokens: int,
  rollout_rows: int,
  update_rows: int,
  forwards: int,
  epochs: int,
  decode_steps: float | None = None,
) -> dict:
  """Model FLOPs of one GRPO iteration's phases, the LM head only where logits are used:

    "sample"    sampling_flops(prompts, group_size, P, decode_steps)
    "logprobs"  forwards · rollout_rows · s        (π_old and reference forwards)
    "update"    3 · epochs · update_rows · s       (forward + backward)
    s = sequence_forward_flops(length=P+T, head_positions=T)

  P = `prompt_len`, T = `new_tokens` (the completion slots the teacher-forced forwards
  run over); `decode_steps` (default T): the decode steps the sampler ran. `forwards`:
  the log-prob forwards before the update (recomputed π_old, the reference)."""
  P, T = prompt_len, new_tokens
  seq = sequence_forward_flops(cfg, length=P + T, head_positions=T)
  sample = sampling_flops(
    cfg,
    prompts=prompts,
    group_size=group_size,
    prompt_len=P,
    new_tokens=T if decode_steps is None else decode_steps,
  )
  return {
    "sample": sample,
    "logprobs": forwards * rollout_rows * seq,
    "update": 3 * epochs * update_rows * seq,
  }


def run_phase_flops(
  setup, *, prompt_len: int, rollout_rows: int | None = None, decode_steps: float | None = None
) -> dict:
  """`phase_flops` of a run (a `build.Setup`): its model, prompts, G, T, update rows, PPO
  epochs, and one log-prob forward each for a π_old recomputed by its own forward
  (rl.old_logp_from "forward") and a reference.
  `rollout_rows` (default the Setup's) and `decode_steps` (default T): as the run had them."""
  scfg, rl_cfg = setup.sampler_cfg, setup.rl_cfg
  return phase_flops(
    setup.model_cfg,
    prompts=setup.loop.prompts_per_step,
    group_size=scfg.group_size,
    prompt_len=prompt_len,
    new_tokens=scfg.max_new_tokens,
    rollout_rows=setup.rollout_rows if rollout_rows is None else rollout_rows,
    update_rows=setup.update_rows,
    forwards=int(rl_cfg.forwards_old_logp) + int(rl_cfg.use_ref),
    epochs=rl_cfg.ppo_epochs,
    decode_steps=decode_steps,
  )


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


def run_peak() -> float:
  """`matmul_peak()` of the default backend, measured once per process: a training run's
  MFU denominator when loop.peak_flops is not set. A notebook or a test process that starts
  many runs pays the ~0.3 s of GEMMs (2 CPU cores; 11 1024² matmuls) once, and their MFU
  figures share one denominator."""
  return _backend_peak(jax.default_backend())


@functools.cache
def _backend_peak(backend: str) -> float:
  del backend  # The cache key: matmul_peak measures the default backend.
  return matmul_peak()
