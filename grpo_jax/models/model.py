"""Decoder-only transformer policy (Llama / Qwen2 / Qwen3 family) in Flax linen.

The policy is a pure function of a parameter pytree:

  params = model.init(cfg, key)
  logits_BTV, cache = model.apply(params, tokens_BT, positions_BT, cache, cfg=cfg)

The Flax module is an implementation detail; the params live outside it, unboxed.
Every parameter carries logical axis names (``model.logical_axes(cfg)``), which a
logical->mesh rules table turns into shardings.

Padding convention: ``positions_BT`` are position ids that count real tokens only
(0, 1, 2, ... skipping padding, see ``positions_from_mask``); a padding slot has
position ``-1``. A query at position p attends to keys at positions 0 <= q <= p,
so left-padded prompts, right-padded completions and KV-cached decoding all share
one masking rule and padding never changes a real token's logits. Positions increase
along T on real tokens: a call without a cache skips the keys after each query block
(``causal_blocks``).

Shape letters: B batch rows, T tokens of this call, S KV-cache slots, D d_model,
H query heads, K kv heads, R = H // K, E head_dim, F mlp width, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import config_lib
from grpo_jax.models import kernels, quant

Params = Any

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ROPE_SCALINGS = ("none", "linear", "llama3")
_REMAT_POLICIES = {
  "none": None,
  "full": jax.checkpoint_policies.nothing_saveable,
  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
# Logical names of activations; the sharding rules table maps them like params.
ACT_BTD = ("activation_batch", "activation_length", "activation_embed")
ACT_BTV = ("activation_batch", "activation_length", "activation_vocab")
CACHE_K = ("activation_batch", "activation_kv_heads", "activation_head_dim", "activation_cache")
CACHE_V = ("activation_batch", "activation_kv_heads", "activation_cache", "activation_head_dim")


LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
  """model.lora: low-rank adapters on the named projections (`lora`). rank 0: off.

  Each targeted projection y = x·W gets y = x·W + (alpha / rank)·(x·A)·B, A [in, r] random
  (normal, variance 1/in), B [r, out] zero, so a fresh adapter changes nothing."""

  rank: int = 0
  alpha: float = 16.0
  # Inverted dropout on each adapter's input while training, PEFT's
  # scale·B(A(dropout(x))): the RL update's and the warm start's differentiated forwards
  # only (`apply(dropout_key=...)`). Sampling, π_old, the reference and evaluation run
  # without it, so at the first step of an update the ratio π/π_old is 1 only in
  # expectation over the masks (exactly 1 while B = 0).
  dropout: float = 0.0
  targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
  # What the supervised warm start trains: "base" (the model's own weights, adapters
  # untouched at B = 0: a randomly initialised model is pretrained there, and RL then
  # adapts it), "adapters", or "auto": "base" for a random init, "adapters" for a
  # checkpoint (config.hf_dir), resolved by build.build.
  warm_start: str = "auto"
  # The frozen base's storage dtype: "" (model.param_dtype), "float32", "bfloat16" (half
  # the base's memory; each weight is cast back to the compute dtype inside its matmul) or
  # "int8" (Dense kernels int8 with a float32 scale per output channel, dequantized inside
  # their layer; embedding and norms bfloat16: `grpo_jax.models.quant`). The warm start of a
  # random init trains the base in param_dtype and stores it so after.
  base_dtype: str = ""
  # Whether the samplers fold every adapter into its kernel once per call, W + (alpha /
  # rank)·A·B (`sampler_view`), and decode with one matmul per projection instead of
  # three. Off by default: on a 2-core CPU it saves nothing measurable on SmolLM2-135M
  # (experiments/lora_sampling.py), it holds a merged copy of the base while sampling
  # (float32 for an int8 base), and in bfloat16 the merged kernel rounds differently from
  # the trainer's unmerged forward.
  merge_for_sampling: bool = False

  def __post_init__(self):
    if not isinstance(self.rank, int) or self.rank < 0:
      raise ValueError(f"model.lora.rank must be an int >= 0 (0: off), got {self.rank!r}.")
    if not (np.isfinite(self.alpha) and self.alpha > 0):
      raise ValueError(f"model.lora.alpha must be a positive number, got {self.alpha!r}.")
    if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
      raise ValueError(
        f"model.lora.dropout={self.dropout!r}; allowed: a number in [0, 1) (the probability "
        "that an element of an adapter's input is zeroed while training; 0: off)."
      )
    if self.warm_start not in ("auto", "base", "adapters"):
      raise ValueError(
        f"model.lora.warm_start={self.warm_start!r}; allowed: 'auto', 'base', 'adapters'."
      )
    if self.base_dtype not in ("", *quant.DTYPES, *quant.QUANTIZED):
      raise ValueError(
        f"model.lora.base_dtype={self.base_dtype!r}; allowed: '' (model.param_dtype), "
        "'float32', 'bfloat16', 'int8'."
      )
    if not isinstance(self.merge_for_sampling, bool):
      raise ValueError(
        f"model.lora.merge_for_sampling={self.merge_for_sampling!r}; allowed: True, False."
      )
    targets = tuple(self.targets)
    object.__setattr__(self, "targets", targets)
    unknown = sorted(set(targets) - set(LORA_TARGETS))
    if unknown or not targets:
      raise ValueError(
        f"model.lora.targets={list(targets)}: unknown {unknown}; allowed: a non-empty subset "
        f"of {list(LORA_TARGETS)} (the embedding table is not adapted)."
      )

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
  """Architecture of the policy. Validated on construction."""

  vocab_size: int
  d_model: int
  n_layers: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10_000.0
  # Rotary frequency scaling (``rope_inv_freq``): "none", "linear" (inv_freq / factor) or
  # "llama3" (Llama 3.1: low frequencies / factor, high kept, smooth in between).
  rope_scaling: str = "none"
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0  # llama3 only.
  rope_high_freq_factor: float = 4.0  # llama3 only.
  rope_original_max_len: int = 8192  # llama3 only: the pre-scaling context length.
  norm_eps: float = 1e-6
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k.
  attn_bias: bool = False  # Qwen2: biases on the q, k, v projections.
  tie_embeddings: bool = True
  # Ids >= vocab_limit get logit -1e9 (0: no limit): a table padded past the tokenizer's
  # size (Qwen) then never samples, nor puts probability on, ids that decode to nothing.
  vocab_limit: int = 0
  param_dtype: str = "float32"
  dtype: str = "float32"  # Compute dtype; logits are always float32.
  scan_layers: bool = False  # nn.scan over layers: compile time flat in depth.
  remat: str = "none"  # One of _REMAT_POLICIES, or "auto" (build.build resolves it).
  init_std: float = 0.02
  # Attention of the calls without a KV cache (training, log-probs, prefill): "xla" (every
  # backend), "splash" (a Pallas flash-attention kernel, TPU only) or "splash_interpret"
  # (that kernel interpreted, any backend: tests). Decoding is XLA always (`kernels`).
  attention_impl: str = "xla"
  lora: LoraConfig = LoraConfig()  # Low-rank adapters (`lora`); rank 0: full fine-tuning.

  def __post_init__(self):
    if not isinstance(self.lora, LoraConfig):
      object.__setattr__(
        self, "lora", config_lib.from_dict(LoraConfig, self.lora, where="model.lora")
      )
    if self.lora.enabled and "lm_head" in self.lora.targets and self.tie_embeddings:
      raise ValueError(
        "model.lora.targets has 'lm_head', but the LM head is the tied embedding table here "
        "(tie_embeddings=True), which is not adapted; drop 'lm_head'."
      )
    for name in (
      "vocab_size",
      "d_model",
      "n_layers",
      "n_heads",
      "n_kv_heads",
      "head_dim",
      "mlp_dim",
    ):
      value = getattr(self, name)
      if not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}.")
    if self.n_heads % self.n_kv_heads:
      raise ValueError(
        f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})."
      )
    if self.head_dim % 2:
      raise ValueError(
        f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}."
      )
    for name in ("param_dtype", "dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r}; allowed: {sorted(_DTYPES)}.")
    kernels.check_impl(self.attention_impl)
    if self.remat not in (*_REMAT_POLICIES, "auto"):
      raise ValueError(
        f"ModelConfig.remat={self.remat!r}; allowed: {sorted(_REMAT_POLICIES)} or 'auto' "
        "(the memory plan picks, when the config is built: `memory.resolve_auto`)."
      )
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if isinstance(value, float) and not np.isfinite(value):
        raise ValueError(f"ModelConfig.{f.name}={value}: must be a finite number.")
    if self.rope_theta <= 0 or self.norm_eps <= 0 or self.init_std <= 0:
      raise ValueError("ModelConfig.rope_theta, norm_eps and init_std must be positive.")
    if not 0 <= self.vocab_limit <= self.vocab_size:
      raise ValueError(
        f"ModelConfig.vocab_limit={self.vocab_limit} must be in [0, vocab_size={self.vocab_size}]."
      )
    if self.rope_scaling not in ROPE_SCALINGS:
      raise ValueError(
        f"ModelConfig.rope_scaling={self.rope_scaling!r}; allowed: {list(ROPE_SCALINGS)}."
      )
    if self.rope_factor <= 0 or self.rope_original_max_len <= 0:
      raise ValueError("ModelConfig.rope_factor and rope_original_max_len must be positive.")
    if self.rope_scaling == "llama3" and not (
      0 < self.rope_low_freq_factor < self.rope_high_freq_factor
    ):
      raise ValueError(
        "ModelConfig llama3 rope scaling needs 0 < rope_low_freq_factor < rope_high_freq_factor, "
        f"got {self.rope_low_freq_factor} and {self.rope_high_freq_factor}."
      )

  @classmethod
  def from_dict(cls, d) -> ModelConfig:
    """Builds a config from a dict or ConfigDict; unknown keys are an error."""
    return config_lib.from_dict(cls, d)

  @property
  def compute_dtype(self):
    return _DTYPES[self.dtype]

  @property
  def weight_dtype(self):
    return _DTYPES[self.param_dtype]


def tiny_config(vocab_size: int, **overrides) -> ModelConfig:
  """A ~100K-parameter Qwen3-shaped model for toy tasks and tests on CPU."""
  base = dict(
    vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
    mlp_dim=192, qk_norm=True,
  )  # fmt: skip
  return ModelConfig(**{**base, **overrides})


# ----------------------------------------------------------------------------
# Layers.
# ----------------------------------------------------------------------------


class _Named(nn.LogicallyPartitioned):
  """A param's logical axis names. Flax's DenseGeneral first creates its kernel flattened
  to 2-D and reshapes it after; the names constrain only the full-rank value (a rank-2
  constraint with 3 names would fail under a mesh)."""

  def unbox(self, apply_constraint=True):
    return super().unbox(apply_constraint and len(self.names) == self.value.ndim)


def _param_init(init, names):
  return lambda *args, **kwargs: _Named(init(*args, **kwargs), names)


class RMSNorm(nn.Module):
  """y = x / sqrt(mean(x^2) + eps) * w, normalised in float32 (as HF Llama/Qwen)."""

  eps: float
  dtype: Any
  param_dtype: Any
  axis_name: str = "embed"

  @nn.compact
  def __call__(self, x):
    scale = self.param(
      "scale",
      _param_init(nn.initializers.ones, (self.axis_name,)),
      (x.shape[-1],),
      self.param_dtype,
    )
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return y.astype(self.dtype) * scale.astype(self.dtype).reshape((1,) * (x.ndim - 1) + (-1,))


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Rotary inverse frequencies ω_i, i < E/2 (float64, static).

  ω_i = theta^(-2i/E), then by `rope_scaling`:
  - "linear": ω_i / factor.
  - "llama3" (Llama 3.1, as transformers' `_compute_llama3_parameters`): with wavelength
    λ_i = 2π/ω_i, N the original context, l / h the low / high frequency factors:
    ω_i / factor where λ_i > N/l; ω_i where λ_i < N/h; in between
    (1 - s)·ω_i/factor + s·ω_i with s = (N/λ_i - l) / (h - l).
  """
  E = cfg.head_dim
  inv = cfg.rope_theta ** (-np.arange(0, E, 2, dtype=np.float64) / E)
  if cfg.rope_scaling == "linear":
    return inv / cfg.rope_factor
  if cfg.rope_scaling == "llama3":
    n, lo, hi = cfg.rope_original_max_len, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    wavelen = 2 * np.pi / inv
    smooth = (n / wavelen - lo) / (hi - lo)
    mixed = (1 - smooth) * inv / cfg.rope_factor + smooth * inv
    return np.where(wavelen > n / lo, inv / cfg.rope_factor, np.where(wavelen < n / hi, inv, mixed))
  return inv


def rope(x_BTNE, positions_BT, *, inv_freq):
  """Rotary embedding, half-split ("rotate_half") layout as in HF Llama/Qwen.

  For pair (x_i, x_{i+E/2}) at position p: angle p·ω_i (``rope_inv_freq``), in float32.
  """
  inv_freq = jnp.asarray(inv_freq, jnp.float32)
  angle_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq[None, None, :]
  sin, cos = jnp.sin(angle_BTh)[:, :, None, :], jnp.cos(angle_BTh)[:, :, None, :]
  x1, x2 = jnp.split(x_BTNE.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x_BTNE.dtype)


# Decode-shaped attention on XLA:CPU: p·V as a multiply-reduce instead of a batched matmul
# when a (b, k) pair has at most this many query rows and the product [B, K, Q, S, E] has
# at most this many elements (``_pv_by_reduce``).
_PV_REDUCE_MAX_Q = 3
_PV_REDUCE_MAX_ELEMENTS = 2**25


def _pv_by_reduce(B, K, Q, S, E) -> bool:
  """Whether `_attend` computes p·V as sum_s(p_qs V_se) (a fused loop) on this backend.

  Measured on a 2-core Xeon (XLA:CPU with YNNPACK), 8 layers of decode attention:
  [256 rows, 4 kv heads, Q = 2, S = 191, E = 64] takes 38 ms as a multiply-reduce and
  53 ms as a batched matmul (1024 matmuls of [2, 191] x [191, 64]); Q = 3: 44 vs 58 ms.
  Past ~2^25 product elements the fused loop falls off a cliff (Q = 4 with 256 rows:
  157 vs 52 ms; 1024 rows with Q = 2: 376 vs 158 ms), hence the size bound. Both forms
  compute the same sum in float32; GPUs and TPUs always take the matmul.
  """
  return (
    jax.default_backend() == "cpu"
    and Q <= _PV_REDUCE_MAX_Q
    and B * K * Q * S * E <= _PV_REDUCE_MAX_ELEMENTS
  )


def _attend(q_BKQE, q_pos_BQ, keys_BKES, values_BKSE, key_pos_BS, *, dtype):
  """softmax(q k^T) v where key slot s is visible to query q iff 0 <= pos_s <= pos_q.

  Keys come transposed, [B, K, E, S], so that q k^T is a plain (NN) batched matmul: at
  decode shapes that is ~3x faster on XLA:CPU than contracting a [B, K, S, E] cache.
  At decode shapes on CPU, p·V is a multiply-reduce (``_pv_by_reduce``).

  A padding query (pos -1) sees nothing and gets 0. The mask is arithmetic because on
  XLA:CPU a select on a batched matmul's output is fused into it and loses the fast
  matmul path (5x slower):
    m = sg(max_s (s_qs v_qs - (1 - v_qs) BIG)),  e_qs = exp((s_qs - m) v_qs) v_qs,
    out = sum_s e_qs V_s / sum_s e_qs   (or 0 when nothing is visible).
  The softmax does not depend on the shift m, so its gradient through m is exactly 0 and
  m is a stop-gradient (sg): the backward has no argmax/select over [B, K, Q, S].
  """
  mm = _attention_matmul_dtype(keys_BKES, dtype)
  s_BKQS = _scores(q_BKQE, keys_BKES, mm)
  valid = _visible(q_pos_BQ[:, None, :, None], key_pos_BS[:, None, None, :])
  e_BKQS = _exp_shifted(s_BKQS, valid, _masked_max(s_BKQS, valid))
  return _normalised(
    _weighted_values(e_BKQS, values_BKSE, dtype, mm), e_BKQS.sum(-1, keepdims=True), dtype
  )


# Teacher-forced attention within one call runs by query blocks that skip the keys after
# them (`causal_blocks`): blocks of at least this many positions, and at most this many.
_CAUSAL_MIN_BLOCK = 64
_CAUSAL_MAX_BLOCKS = 4


def causal_blocks(T: int) -> tuple[tuple[int, int], ...]:
  """The query blocks [a, b) of a call of T positions; block [a, b) attends keys [0, b).

  n = clip(T // 64, 1, 4) blocks of near-equal length, so the scores hold
  sum_blocks (b − a)·b of the T² entries: 5/8 of them at n = 4, 2/3 at n = 3. Measured
  on a 2-core Xeon (float32, [16 rows, 4 kv heads, 2 query rows per kv head, T = 192,
  head_dim 64], forward and backward of one layer's attention): 45.5 ms in one block,
  37.8 / 35.2 / 36.7 ms in 2 / 3 / 4 blocks, 41.2 ms in 8.
  """
  n = max(1, min(T // _CAUSAL_MIN_BLOCK, _CAUSAL_MAX_BLOCKS))
  edges = [round(i * T / n) for i in range(n + 1)]
  return tuple(zip(edges[:-1], edges[1:], strict=True))


def causal_score_entries(T: int) -> int:
  """Score entries per (row, query head) of a call of T positions: sum_blocks (b − a)·b."""
  return sum((b - a) * b for a, b in causal_blocks(T))


def _attend_causal(q_BKQE, q_pos_BQ, keys_BKET, values_BKTE, pos_BT, *, dtype):
  """`_attend` of a call over its own T keys, one query block at a time (`causal_blocks`).

  Query rows are t-major (row t·R + r), so block [a, b) is rows [a·R, b·R), and it attends
  keys [0, b) only. Exact when positions increase along T on real tokens, as
  `positions_from_mask` makes them (the model's padding convention): a key after a query
  then has a larger position or −1, so it is invisible to it, and the softmax over keys
  [0, b) is the softmax over all T (up to the order of the float32 sums).
  """
  T = pos_BT.shape[1]
  R = q_BKQE.shape[2] // T
  outs = [
    _attend(
      q_BKQE[:, :, a * R : b * R],
      q_pos_BQ[:, a * R : b * R],
      keys_BKET[..., :b],
      values_BKTE[:, :, :b],
      pos_BT[:, :b],
      dtype=dtype,
    )
    for a, b in causal_blocks(T)
  ]
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)


def _attend_shared(
  q_BKQE, q_pos_BQ, keys_BKES, values_BKSE, key_pos_BS, prefix_kv, prefix_pos_AS, *, dtype
):
  """`_attend` over each row's own slots and a prefix shared by its group (Hydragen,
  Juravsky et al. 2024): rows a·G .. a·G+G−1 (N = A·G rows) all attend to prefix a.

  prefix_kv = (keys [A, K, E, P], values [A, K, P, E]), positions prefix_pos_AS [A, P].
  The prefix's scores are one batched matmul per (a, k) with the G·Q query rows of the
  group stacked, so each prefix key and value is read once per group instead of once per
  row. One shift m = max(m_own, m_prefix) serves both parts, so
    out = (Σ_own e V + Σ_prefix e V) / (Σ_own e + Σ_prefix e)
  is the softmax over the union of the slots: `_attend` on the concatenated cache, up to
  the order of the float32 sums.
  """
  pk_AKEP, pv_AKPE = prefix_kv
  A, (N, K, Q, _) = pk_AKEP.shape[0], q_BKQE.shape
  G = N // A
  # Rows -> groups: [N, K, Q, ...] <-> [A, K, G·Q, ...] (row-major within a group).
  to_groups = lambda x: jnp.swapaxes(x.reshape(A, G, K, Q, -1), 1, 2).reshape(A, K, G * Q, -1)
  to_rows = lambda x: jnp.swapaxes(x.reshape(A, K, G, Q, -1), 1, 2).reshape(N, K, Q, -1)
  mm = _attention_matmul_dtype(keys_BKES, dtype)
  s_BKQS = _scores(q_BKQE, keys_BKES, mm)
  s_AKqP = _scores(to_groups(q_BKQE), pk_AKEP, mm)
  valid = _visible(q_pos_BQ[:, None, :, None], key_pos_BS[:, None, None, :])
  q_pos_Aq1 = q_pos_BQ.reshape(A, 1, G * Q, 1)
  valid_pre = _visible(q_pos_Aq1, prefix_pos_AS[:, None, None, :])
  m_BKQ1 = jnp.maximum(_masked_max(s_BKQS, valid), to_rows(_masked_max(s_AKqP, valid_pre)))
  e_BKQS = _exp_shifted(s_BKQS, valid, m_BKQ1)
  e_AKqP = _exp_shifted(s_AKqP, valid_pre, to_groups(m_BKQ1))
  out_BKQE = _weighted_values(e_BKQS, values_BKSE, dtype, mm) + to_rows(
    _weighted_values(e_AKqP, pv_AKPE, dtype, mm)
  )
  sum_BKQ1 = e_BKQS.sum(-1, keepdims=True) + to_rows(e_AKqP.sum(-1, keepdims=True))
  return _normalised(out_BKQE, sum_BKQ1, dtype)


def _attention_matmul_dtype(keys_BKES, dtype):
  """A float32 cache of a bfloat16 model (`cache_dtype`, XLA:CPU) holds bfloat16-rounded
  keys and values: both dots run in float32 on the same values (products of bfloat16
  values are exact in float32), with the exponentials rounded to `dtype` as the bfloat16
  p·V rounds them. Otherwise everything in `dtype`."""
  return jnp.float32 if keys_BKES.dtype == jnp.float32 else dtype


def _scores(q_BKQE, keys_BKES, mm):
  """q·k over the slots, [B, K, Q, S], accumulated in float32."""
  return jnp.einsum(
    "bkqe,bkes->bkqs", q_BKQE.astype(mm), keys_BKES.astype(mm), preferred_element_type=jnp.float32
  )


def _visible(q_pos, key_pos):
  """1.0 where a key slot is visible to a query (0 <= pos_key <= pos_query), else 0.0."""
  return ((key_pos >= 0) & (key_pos <= q_pos) & (q_pos >= 0)).astype(jnp.float32)


def _masked_max(s, valid):
  """sg(max over visible slots) (-1e30 where none is): the softmax's shift."""
  return jax.lax.stop_gradient(jnp.max(s * valid - (1.0 - valid) * 1e30, axis=-1, keepdims=True))


def _exp_shifted(s, valid, m):
  """exp(s − m) on visible slots, 0 elsewhere; (s − m)·v <= 0: no overflow."""
  return jnp.exp((s - m) * valid) * valid


def _weighted_values(e_BKQS, values_BKSE, dtype, mm):
  """Σ_s e_qs V_se in float32: a multiply-reduce at decode shapes on CPU
  (`_pv_by_reduce`), else a batched matmul; products of `dtype` values either way."""
  if _pv_by_reduce(*e_BKQS.shape, values_BKSE.shape[-1]):
    f32 = lambda x: x.astype(dtype).astype(jnp.float32)
    return jnp.sum(f32(e_BKQS)[..., None] * f32(values_BKSE)[:, :, None], axis=-2)
  return jnp.einsum(
    "bkqs,bkse->bkqe",
    e_BKQS.astype(dtype).astype(mm),
    values_BKSE.astype(mm),
    preferred_element_type=jnp.float32,
  )


def _normalised(out_BKQE, sum_BKQ1, dtype):
  """out / Σe. A padding query has Σe = 0 and out = 0; dividing by 1 there (not by a tiny
  floor, whose square underflows) keeps the gradient finite."""
  return (out_BKQE / (sum_BKQ1 + (sum_BKQ1 <= 0.0))).astype(dtype)


@jax.custom_vjp
def _matmul_f32_acc(x_MK, w_KF):
  """x·w of bfloat16 operands accumulated in float32, rounded to x's dtype. XLA:CPU runs
  bfloat16 GEMMs at about twice the float32 rate only when they accumulate and return
  float32 (measured: 985 vs 501 GFLOP/s at [4096, 512] x [512, 1536]; bfloat16 output:
  456), so the forward and the input gradient take that path. The weight gradient
  contracts the rows: as a plain [M, K]^T [M, F] dot XLA:CPU runs it in bfloat16 no faster
  than in float32 (258 against 265 GFLOP/s at M 3072, K 512, F 1536 on a 2-core Xeon with
  AMX; 266 against 433 on an AMD EPYC), but the same contraction over a leading unit batch
  axis too, [1, M, K] x [1, M, F] contracted over both, takes its fast path: 918 GFLOP/s
  there (830-940 over the model's shapes and M 2999-12288). The sum is the same products
  (bfloat16 products are exact in float32) in float32, in another order."""
  return jax.lax.dot(x_MK, w_KF, preferred_element_type=jnp.float32).astype(x_MK.dtype)


def _matmul_fwd(x_MK, w_KF):
  return _matmul_f32_acc(x_MK, w_KF), (x_MK, w_KF)


def _matmul_bwd(res, g_MF):
  x_MK, w_KF = res
  dx = jax.lax.dot_general(
    g_MF.astype(x_MK.dtype), w_KF, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )
  dw = jax.lax.dot_general(
    x_MK[None],
    g_MF.astype(x_MK.dtype)[None],
    (((0, 1), (0, 1)), ((), ())),
    preferred_element_type=jnp.float32,
  )
  return dx.astype(x_MK.dtype), dw.astype(w_KF.dtype)


_matmul_f32_acc.defvjp(_matmul_fwd, _matmul_bwd)


def _dot_general_rows(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
  """nn.DenseGeneral's dot_general: the contraction of lhs's trailing axes with rhs's
  leading axes (every Dense of the model) as one [rows, K] x [K, F] GEMM over lhs's leading
  axes flattened into rows; any other contraction is plain `lax.dot_general`.

  Flattening is for the weight gradient, Σ_rows x_rk·g_rf. Over a [B, T, K] input, autodiff
  contracts two row axes, and XLA:CPU's dot canonicalisation then makes a transposed
  [F, B·T] copy of the activation gradient, fused into its producer (silu's backward, the
  norms') and written at a fraction of memory bandwidth: 85 ms a copy for the anchor's
  [3072, 1536] MLP gradient, 22% of a float32 update (jax 0.10.2, 2-core Xeon). Over one
  row axis no copy is made; a two-layer SwiGLU stack's forward and backward runs 1.7x
  faster (0.41 against 0.70 s at 3072 rows, d 512, f 1536, float32).

  Operands both bfloat16 take `_matmul_f32_acc` (float32 accumulation, the weight gradient
  on XLA:CPU's fast path)."""
  (lc, rc), (lb, rb) = dimension_numbers
  n = len(lc)
  plain = (
    lb or rb or tuple(lc) != tuple(range(lhs.ndim - n, lhs.ndim)) or tuple(rc) != tuple(range(n))
  )
  if plain:
    return jax.lax.dot_general(
      lhs,
      rhs,
      dimension_numbers,
      precision=precision,
      preferred_element_type=preferred_element_type,
    )
  K = int(np.prod(lhs.shape[lhs.ndim - n :]))
  lhs_MK, rhs_KF = lhs.reshape(-1, K), rhs.reshape(K, -1)
  if lhs.dtype == jnp.bfloat16 and rhs.dtype == jnp.bfloat16:
    out_MF = _matmul_f32_acc(lhs_MK, rhs_KF)
  else:
    out_MF = jax.lax.dot_general(
      lhs_MK,
      rhs_KF,
      (((1,), (0,)), ((), ())),
      precision=precision,
      preferred_element_type=preferred_element_type,
    )
  return out_MF.reshape(*lhs.shape[: lhs.ndim - n], *rhs.shape[n:])


def _dense(cfg: ModelConfig, features, names, *, axis=-1, use_bias=False, name=None):
  """nn.DenseGeneral with logical names; over an int8 base (model.lora.base_dtype) its
  kernel is dequantized as the layer runs (`quant.dequantized`)."""
  n_out = 1 if isinstance(features, int) else len(features)
  dense = nn.DenseGeneral
  if cfg.lora.enabled and cfg.lora.base_dtype in quant.QUANTIZED:
    dense = nn.map_variables(
      dense, "params", trans_in_fn=quant.dequantized, mutable=False, init=True
    )
  return dense(
    features=features,
    axis=axis,
    use_bias=use_bias,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.weight_dtype,
    dot_general=_dot_general_rows,
    kernel_init=_param_init(nn.initializers.lecun_normal(), names),
    bias_init=_param_init(nn.initializers.zeros_init(), names[-n_out:]),
    name=name,
  )


class _Adapter(nn.Module):
  """The low-rank path of one projection, scale·(x·A)·B, its A [*in, r] and B [r, *out] in
  the "lora" collection (float32, trained; logical names: the base kernel's, with
  "lora_rank" between). Returns None where that collection has no adapter: the reference
  policy is the same call without it, the base weights alone. With model.lora.dropout = p
  and a "dropout" rng (a training forward), x is inverted-dropped first: each element kept
  with probability 1 − p and scaled by 1/(1 − p), so E[path] is the undropped path."""

  cfg: ModelConfig
  in_names: tuple[str, ...]
  out_shape: tuple[int, ...]
  out_names: tuple[str, ...]

  @nn.compact
  def __call__(self, x):
    if not (self.is_initializing() or self.has_variable("lora", "a")):
      return None
    r, n = self.cfg.lora.rank, len(self.in_names)
    in_shape = x.shape[x.ndim - n :]
    fan_in = int(np.prod(in_shape))

    def a_init():
      a = jax.random.normal(self.make_rng("params"), (*in_shape, r), jnp.float32)
      return _Named(a * fan_in**-0.5, (*self.in_names, "lora_rank"))

    def b_init():
      return _Named(jnp.zeros((r, *self.out_shape), jnp.float32), ("lora_rank", *self.out_names))

    a = self.variable("lora", "a", a_init).value
    b = self.variable("lora", "b", b_init).value
    dt = self.cfg.compute_dtype
    p = self.cfg.lora.dropout
    if p > 0 and self.has_rng("dropout"):
      keep = jax.random.bernoulli(self.make_rng("dropout"), 1.0 - p, x.shape)
      x = jnp.where(keep, x / (1.0 - p), 0.0).astype(x.dtype)
    xa = jnp.tensordot(
      x.astype(dt), a.astype(dt), axes=(tuple(range(x.ndim - n, x.ndim)), tuple(range(n)))
    )
    return (jnp.tensordot(xa, b.astype(dt), axes=1) * self.cfg.lora.scale).astype(dt)


def _adapted(cfg: ModelConfig, name: str, x, y, *, in_names, out_names):
  """y, plus the adapter of projection `name` on its input x when model.lora targets it."""
  if not (cfg.lora.enabled and name in cfg.lora.targets):
    return y
  delta = _Adapter(
    cfg, in_names, y.shape[y.ndim - len(out_names) :], out_names, name=f"{name}_lora"
  )(x)
  return y if delta is None else y + delta


class Attention(nn.Module):
  """Grouped-query attention.

  Without a cache it attends within the call and returns the call's keys/values.
  With one it writes them into this layer's buffers, keys [B, K, E, S] and values
  [B, K, S, E] (in place when the buffers are loop-carried, as in the sampler), and
  attends over the buffers alone, or over the buffers and a prefix its group shares,
  prefix = ((keys [A, K, E, P], values [A, K, P, E]), positions [A, P]) (`_attend_shared`).
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, cache_kv, cache_pos_BS, index, prefix=None):
    cfg = self.cfg
    H, K, E = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    projections = {}
    for name, heads, names in (("q", H, "q_heads"), ("k", K, "kv_heads"), ("v", K, "kv_heads")):
      y = _dense(cfg, (heads, E), ("embed", names, "head_dim"), use_bias=cfg.attn_bias, name=name)(
        x_BTD
      )
      projections[name] = _adapted(
        cfg, name, x_BTD, y, in_names=("embed",), out_names=(names, "head_dim")
      )
    q_BTHE, k_BTKE, v_BTKE = projections["q"], projections["k"], projections["v"]
    if cfg.qk_norm:
      norm = functools.partial(
        RMSNorm,
        eps=cfg.norm_eps,
        dtype=cfg.compute_dtype,
        param_dtype=cfg.weight_dtype,
        axis_name="head_dim",
      )
      q_BTHE = norm(name="q_norm")(q_BTHE)
      k_BTKE = norm(name="k_norm")(k_BTKE)
    inv_freq = rope_inv_freq(cfg)
    q_BTHE = rope(q_BTHE, positions_BT, inv_freq=inv_freq)
    k_BTKE = rope(k_BTKE, positions_BT, inv_freq=inv_freq)

    B, T = positions_BT.shape
    R = H // K
    # Query rows grouped per kv head: [B, K, Q = T*R, E], so every matmul below is a
    # canonical batched matmul over (b, k) with no transposes of the cache.
    q_BKQE = jnp.transpose((q_BTHE * E**-0.5).reshape(B, T, K, R, E), (0, 2, 1, 3, 4)).reshape(
      B, K, T * R, E
    )
    q_pos_BQ = jnp.repeat(positions_BT, R, axis=1)
    k_BKET, v_BKTE = jnp.transpose(k_BTKE, (0, 2, 3, 1)), jnp.swapaxes(v_BTKE, 1, 2)
    if cache_kv is None:
      keys = (k_BKET, v_BKTE, positions_BT)
      new_kv = (k_BTKE, v_BTKE)
    else:
      # Write this call's keys/values into the layer's buffers (in place), then attend
      # over the buffers alone: cache_pos_BS already holds this call's positions.
      write = lambda buf, new, at: jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), at)
      if jnp.ndim(index) == 1:  # One slot per row (the refill sampler's rows).
        new_kv = (
          jax.vmap(lambda b, n, i: write(b, n, (0, 0, i)))(cache_kv[0], k_BKET, index),
          jax.vmap(lambda b, n, i: write(b, n, (0, i, 0)))(cache_kv[1], v_BKTE, index),
        )
      else:
        new_kv = (
          write(cache_kv[0], k_BKET, (0, 0, 0, index)),
          write(cache_kv[1], v_BKTE, (0, 0, index, 0)),
        )
      keys = (*new_kv, cache_pos_BS)
    # A Pallas kernel (`kernels`); init's dummy forward runs XLA (the params are the same).
    if cache_kv is None and cfg.attention_impl != "xla" and not self.is_initializing():
      out_BKQE = kernels.causal(q_BKQE, *keys, impl=cfg.attention_impl, dtype=cfg.compute_dtype)
    elif cache_kv is None:  # Teacher forcing or a prefill: causal within the call.
      out_BKQE = _attend_causal(q_BKQE, q_pos_BQ, *keys, dtype=cfg.compute_dtype)
    elif prefix is None:
      out_BKQE = _attend(q_BKQE, q_pos_BQ, *keys, dtype=cfg.compute_dtype)
    else:  # A group-shared prefix (`KVCache.share`): ((keys, values), positions).
      out_BKQE = _attend_shared(q_BKQE, q_pos_BQ, *keys, *prefix, dtype=cfg.compute_dtype)
    out_BTKRE = jnp.transpose(out_BKQE.reshape(B, K, T, R, E), (0, 2, 1, 3, 4))
    out_BTHE = out_BTKRE.reshape(B, T, H, E)
    out_BTD = _dense(cfg, cfg.d_model, ("q_heads", "head_dim", "embed"), axis=(-2, -1), name="o")(
      out_BTHE
    )
    out_BTD = _adapted(
      cfg, "o", out_BTHE, out_BTD, in_names=("q_heads", "head_dim"), out_names=("embed",)
    )
    return out_BTD, new_kv


class Mlp(nn.Module):
  """SwiGLU: down(silu(gate(x)) * up(x))."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    proj = {}
    for name in ("gate", "up"):
      y = _dense(cfg, cfg.mlp_dim, ("embed", "mlp"), name=name)(x_BTD)
      proj[name] = _adapted(cfg, name, x_BTD, y, in_names=("embed",), out_names=("mlp",))
    h_BTF = nn.with_logical_constraint(
      nn.silu(proj["gate"]) * proj["up"],
      ("activation_batch", "activation_length", "activation_mlp"),
    )
    down_BTD = _dense(cfg, cfg.d_model, ("mlp", "embed"), name="down")(h_BTF)
    return _adapted(cfg, "down", h_BTF, down_BTD, in_names=("mlp",), out_names=("embed",))


class Block(nn.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x))."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, cache_kv, cache_pos_BS, index, prefix_kv, prefix_pos):
    cfg = self.cfg
    norm = functools.partial(
      RMSNorm, eps=cfg.norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.weight_dtype
    )
    attn = Attention(cfg, name="attn")
    prefix = None if prefix_kv is None else (prefix_kv, prefix_pos)
    attn_BTD, kv_new = attn(
      norm(name="attn_norm")(x_BTD), positions_BT, cache_kv, cache_pos_BS, index, prefix
    )
    x_BTD = x_BTD + attn_BTD
    x_BTD = x_BTD + Mlp(cfg, name="mlp")(norm(name="mlp_norm")(x_BTD))
    return nn.with_logical_constraint(x_BTD, ACT_BTD), kv_new


def _mesh_axes(name: str) -> tuple[str, ...]:
  """The mesh axes the logical rules in scope map `name` to (() outside them)."""
  axes = nn.logical_to_mesh_axes((name,))[0]
  return () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))


class _Embed(nn.Embed):
  """nn.Embed whose lookup reads the table where it lies: every device looks up every
  token of the batch in its own fsdp slice of the width D (the ids, a few KB, are
  gathered; the rows stay split over the batch axes fsdp does not use), and the output,
  cast to the compute dtype, is re-split by rows ([B, T, D]: an all-to-all). The
  lookup's gradient is then a scatter-add into each device's own slice, with nothing to
  reduce over fsdp. Read gathered over fsdp instead, the table (float32 [V, D]: 545 MB
  for Qwen2.5's 151,936 x 896) was all-gathered each train step and its gradient
  all-reduced each micro-batch (the update of configs/scale.py:0.5b on v5e:2x4:
  all-reduces of 8.7 GB an update, `tests/test_tpu_collectives.py`). The ids and the
  output carry explicit shardings, so XLA's partitioner never has to re-split a gather
  split on D by itself (its "involuntary full rematerialization")."""

  def __call__(self, inputs):
    if not nn.get_logical_axis_rules():  # No mesh rules: a plain lookup.
      return jnp.take(self.embedding, inputs, axis=0).astype(self.dtype)
    width = _mesh_axes("embed")
    rows = tuple(a for a in _mesh_axes("activation_batch") if a not in width)
    rules = (("rows", rows or None), ("width", width or None))
    ids = nn.with_logical_constraint(inputs, ("rows", *(None,) * (inputs.ndim - 1)), rules=rules)
    x = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
    return nn.with_logical_constraint(x, ("rows", *(None,) * (x.ndim - 2), "width"), rules=rules)


class Decoder(nn.Module):
  """Embeddings, the layer stack and the LM head. Returns float32 logits."""

  cfg: ModelConfig
  logits_slice: tuple[int, int] | None = None  # LM head only at positions [start, stop).
  head: bool = True  # False: return the final-normed hidden states (`head_logits` later).

  @nn.compact
  def __call__(self, tokens_BT, positions_BT, cache_kv, cache_pos_BS, index, prefix=None):
    """cache_kv None: returns this call's k/v [L,B,T,K,E]; else the updated buffers.
    prefix: (k, v) buffers per layer (stacked [L, ...] with scan_layers) and positions of
    a prefix shared by groups of rows (`KVCache.share`), or None."""
    prefix_kv, prefix_pos = (None, None) if prefix is None else prefix
    cfg = self.cfg
    embed = _Embed(
      cfg.vocab_size,
      cfg.d_model,
      dtype=cfg.compute_dtype,
      param_dtype=cfg.weight_dtype,
      embedding_init=_param_init(nn.initializers.normal(cfg.init_std), ("vocab", "embed")),
      name="embed",
    )
    x_BTD = nn.with_logical_constraint(embed(tokens_BT), ACT_BTD)

    block = Block
    if cfg.remat == "auto":
      raise ValueError("model.remat='auto' is resolved by build.build (memory.resolve_auto).")
    if cfg.remat != "none":
      block = nn.remat(block, prevent_cse=not cfg.scan_layers, policy=_REMAT_POLICIES[cfg.remat])
    if cfg.scan_layers:
      stack = nn.scan(
        block,
        variable_axes={"params": 0, "lora": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast, 0, nn.broadcast, nn.broadcast, 0, nn.broadcast),
        length=cfg.n_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      x_BTD, kv_new = stack(cfg, name="layers")(
        x_BTD, positions_BT, cache_kv, cache_pos_BS, index, prefix_kv, prefix_pos
      )
    else:
      new = []
      for i in range(cfg.n_layers):
        layer_kv = None if cache_kv is None else (cache_kv[0][i], cache_kv[1][i])
        layer_prefix = None if prefix_kv is None else (prefix_kv[0][i], prefix_kv[1][i])
        x_BTD, kv = block(cfg, name=f"layer_{i}")(
          x_BTD, positions_BT, layer_kv, cache_pos_BS, index, layer_prefix, prefix_pos
        )
        new.append(kv)
      # Fresh k/v are stacked [L, ...]; updated per-layer buffers stay separate.
      kv_new = (
        jax.tree.map(lambda *xs: jnp.stack(xs), *new) if cache_kv is None else tuple(zip(*new))
      )

    if self.logits_slice is not None:
      x_BTD = x_BTD[:, self.logits_slice[0] : self.logits_slice[1]]
    x_BTD = RMSNorm(cfg.norm_eps, cfg.compute_dtype, cfg.weight_dtype, name="final_norm")(x_BTD)
    if not self.head:
      return x_BTD, kv_new
    if cfg.tie_embeddings:
      logits_BTV = _tied_logits(cfg, x_BTD, embed.embedding)
    else:
      logits_BTV = _dense(cfg, cfg.vocab_size, ("embed", "vocab"), name="lm_head")(x_BTD)
      logits_BTV = _adapted(
        cfg, "lm_head", x_BTD, logits_BTV, in_names=("embed",), out_names=("vocab",)
      )
    return _finish_logits(cfg, logits_BTV), kv_new


def _tied_logits(cfg: ModelConfig, x_BTD, table_VD):
  """x·tableᵀ in float32, over the rows B·T flattened (`_dot_general_rows` says why: here
  it saves the transposed [V, B·T] copy of the logits gradient that the table's gradient
  would otherwise take, 105 ms of a float32 micro-batch of the anchor)."""
  B, T, D = x_BTD.shape
  x_ND, table_VD = x_BTD.reshape(B * T, D), table_VD.astype(cfg.compute_dtype)
  if x_ND.dtype == jnp.bfloat16:
    return _logits_bf16(x_ND, table_VD).reshape(B, T, -1)
  logits_NV = jnp.einsum("nd,vd->nv", x_ND, table_VD, preferred_element_type=jnp.float32)
  return logits_NV.reshape(B, T, -1)


@jax.custom_vjp
def _logits_bf16(x_ND, table_VD):
  """x·tableᵀ of bfloat16 operands, in float32 (the logits).

  The backward rounds the float32 logits gradient to bfloat16, as every bfloat16 Dense's
  backward does (`_matmul_f32_acc`), so that both of its products are bfloat16 GEMMs with
  float32 accumulation: dx = g·table, and the table's gradient gᵀ·x over the rows as a
  unit-batch contraction (XLA:CPU's fast path). Left to autodiff, the float32 gradient
  makes both float32 GEMMs, the largest two of a bfloat16 update. With this head (and
  `logprobs.token_stats`'s leaner backward) the anchor's bfloat16 update went from 22.0 to
  18.4 s (`bench_rl_iteration.py`, one sitting on a 2-core Xeon with AMX)."""
  return jax.lax.dot_general(
    x_ND, table_VD, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
  )


def _logits_bf16_fwd(x_ND, table_VD):
  return _logits_bf16(x_ND, table_VD), (x_ND, table_VD)


def _logits_bf16_bwd(res, g_NV):
  x_ND, table_VD = res
  g_NV = g_NV.astype(jnp.bfloat16)
  dx_ND = jax.lax.dot_general(
    g_NV, table_VD, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
  )
  # The table's gradient as [D, V] (x on the left, as a Dense's weight gradient), then
  # transposed: as gᵀ·x, XLA:CPU first wrote a transposed bfloat16 copy of the [N, V]
  # gradient (264 ms of a 2.3 s micro-batch of the anchor). The barrier keeps layout
  # assignment from moving the transpose into the dot, which XLA:CPU's DotThunk then
  # refuses ("Unsupported element type ... BF16 x BF16 = F32").
  dt_DV = jax.lax.dot_general(
    x_ND[None], g_NV[None], (((0, 1), (0, 1)), ((), ())), preferred_element_type=jnp.float32
  )
  dt_DV = jax.lax.optimization_barrier(dt_DV)
  return dx_ND.astype(x_ND.dtype), dt_DV.T.astype(table_VD.dtype)


_logits_bf16.defvjp(_logits_bf16_fwd, _logits_bf16_bwd)


def _finish_logits(cfg: ModelConfig, logits_BTV):
  """float32 logits, ids at or past vocab_limit pushed to -1e9."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  if 0 < cfg.vocab_limit < cfg.vocab_size:
    live_V = jnp.arange(cfg.vocab_size) < cfg.vocab_limit
    logits_BTV = jnp.where(live_V, logits_BTV, -1e9)
  return nn.with_logical_constraint(logits_BTV, ACT_BTV)


def head_logits(params: Params, x_BTD, *, cfg: ModelConfig, dropout_key=None):
  """The LM head alone: float32 logits [B, T, V] of final-normed hidden states (those of
  `apply(..., hidden_only=True)`), equal to what `apply` returns at those positions.
  Callers that never need all T positions' logits at once (`logprobs`, in chunks) use it.
  dropout_key: as `apply`'s (the head's adapter, when targeted)."""
  variables = _variables(params, cfg)
  base = variables["params"]
  if cfg.tie_embeddings:
    return _finish_logits(cfg, _tied_logits(cfg, x_BTD, base["embed"]["embedding"]))
  head = _Head(cfg)
  head_vars = {"params": {"lm_head": base["lm_head"]}}
  if "lm_head_lora" in variables.get("lora", {}):
    head_vars["lora"] = {"lm_head_lora": variables["lora"]["lm_head_lora"]}
  return _finish_logits(cfg, head.apply(head_vars, x_BTD, rngs=_rngs(cfg, dropout_key)))


def _rngs(cfg: ModelConfig, dropout_key) -> dict:
  """Flax rngs of a forward: {"dropout": key} when it is a training forward (a key given)
  of a model whose adapters drop (model.lora.dropout > 0); else none, and the forward is
  deterministic (a key given to a model without adapter dropout changes nothing)."""
  if dropout_key is None or not (cfg.lora.enabled and cfg.lora.dropout > 0):
    return {}
  return {"dropout": dropout_key}


class _Head(nn.Module):
  """The untied LM head with its adapter (`head_logits`'s parameter paths: Decoder's)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    logits_BTV = _dense(cfg, cfg.vocab_size, ("embed", "vocab"), name="lm_head")(x_BTD)
    return _adapted(cfg, "lm_head", x_BTD, logits_BTV, in_names=("embed",), out_names=("vocab",))


# ----------------------------------------------------------------------------
# KV cache.
# ----------------------------------------------------------------------------


@flax.struct.dataclass
class KVCache:
  """Keys/values (post-RoPE) of slots [0, index); slots are time-ordered.

  k holds one [B, K, E, S] array per layer (keys transposed, for a fast q k^T), v one
  [B, K, S, E] array per layer, so each layer's attention reads its own buffers
  (slicing a stacked [L, ...] array makes XLA copy the slice every step); with
  scan_layers each holds one stacked [L, ...] array, as lax.scan needs.
  pos_BS holds each slot's position id, -1 for empty or padding slots. `empty` is
  static: a fresh cache's first call (the prefill) skips attending to the cache,
  which is all padding, instead of computing (and XLA constant-folding) it.

  A shared cache (`share`) also holds a prefix of P slots per group of G consecutive
  rows, prefix_k / prefix_v / prefix_pos_AS over A = B / G groups, which every row of
  the group attends to before its own slots; its slots count in `length`, but `index`
  and pos_BS are the row's own.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  pos_BS: jax.Array
  index: jax.Array  # int32 scalar: the next slot to write; or [B]: one per row (decode).
  empty: bool = flax.struct.field(pytree_node=False, default=False)
  stacked: bool = flax.struct.field(pytree_node=False, default=False)
  prefix_k: tuple[jax.Array, ...] = ()
  prefix_v: tuple[jax.Array, ...] = ()
  prefix_pos_AS: jax.Array | None = None

  def repeat(self, n: int) -> KVCache:
    """Each row repeated n times, consecutively: row b -> rows b*n .. b*n+n-1."""
    if self.prefix_pos_AS is not None:
      raise ValueError("KVCache.repeat: this cache is already shared (`share`).")
    rep = functools.partial(jnp.repeat, repeats=n, axis=1 if self.stacked else 0)
    return self.replace(
      k=tuple(map(rep, self.k)),
      v=tuple(map(rep, self.v)),
      pos_BS=jnp.repeat(self.pos_BS, n, axis=0),
    ).constrain()

  def share(self, n: int, length: int) -> KVCache:
    """A cache of n rows per row of this one, for which this cache's slots are a shared
    prefix (rows b·n .. b·n+n−1 attend to row b's slots), followed by own empty slots up
    to `length` in all: what `repeat(n)` then `grow(length)` hold, without n copies of
    the prefix. Decoding reads each prefix slot once per group instead of once per row
    (`_attend_shared`)."""
    if self.prefix_pos_AS is not None:
      raise ValueError("KVCache.share: this cache is already shared.")
    own = length - self.length
    if own < 1:
      raise ValueError(
        f"KVCache.share(length={length}): needs more than the prefix's {self.length} slots."
      )
    # The own slots' zeros are computed from the prefix's last value, min(|v|, 0) (0 for
    # any finite value; XLA cannot fold it), so they exist only once the prefix is
    # written: zeros from a constant are allocated before the prefill, beside its
    # activations (a tiny sampler on a CPU: 8.3 MB of temporaries instead of 5.3 MB).
    zero = jnp.minimum(jnp.abs(self.v[-1][(-1,) * self.v[-1].ndim]), 0)
    b = 1 if self.stacked else 0  # The rows' axis.
    empty = lambda x, slot_axis: jnp.broadcast_to(
      zero,
      tuple(
        d * n if a == b else own if a == x.ndim + slot_axis else d for a, d in enumerate(x.shape)
      ),
    )
    return KVCache(
      k=tuple(empty(k, -1) for k in self.k),  # [..., E, S]
      v=tuple(empty(v, -2) for v in self.v),  # [..., S, E]
      pos_BS=jnp.full((self.pos_BS.shape[0] * n, own), -1, jnp.int32),
      index=jnp.zeros((), jnp.int32),
      stacked=self.stacked,
      prefix_k=self.k,
      prefix_v=self.v,
      prefix_pos_AS=self.pos_BS,
    ).constrain()

  @property
  def length(self) -> int:
    """The number of slots S (static), a shared prefix's included."""
    prefix = 0 if self.prefix_pos_AS is None else self.prefix_pos_AS.shape[-1]
    return prefix + self.pos_BS.shape[-1]

  def grow(self, length: int) -> KVCache:
    """The same cache with `length` slots: slots [S, length) appended empty (position -1,
    zero keys and values). A copy of the buffers, at their new size: the sampler's decode
    segments (`sampling.decode`) attend over a short cache while few slots are filled."""
    extra = length - self.length
    if extra < 0:
      raise ValueError(f"KVCache.grow({length}): the cache already has {self.length} slots.")
    if extra == 0:
      return self
    pad = lambda x, axis: jnp.pad(
      x, [(0, extra if a == x.ndim + axis else 0) for a in range(x.ndim)]
    )
    return self.replace(
      k=tuple(pad(k, -1) for k in self.k),  # [..., E, S]
      v=tuple(pad(v, -2) for v in self.v),  # [..., S, E]
      pos_BS=jnp.pad(self.pos_BS, ((0, 0), (0, extra)), constant_values=-1),
    ).constrain()

  def constrain(self) -> KVCache:
    """Sharding constraints from the logical names CACHE_K / CACHE_V (rows over the
    batch axes, kv heads over `tensor` by the default rules); no-op without rules."""
    lead = ("layers",) if self.stacked else ()
    c = lambda names: lambda x: nn.with_logical_constraint(x, (*lead, *names))
    pos = lambda x: nn.with_logical_constraint(x, ("activation_batch", "activation_cache"))
    return self.replace(
      k=tuple(map(c(CACHE_K), self.k)),
      v=tuple(map(c(CACHE_V), self.v)),
      pos_BS=pos(self.pos_BS),
      prefix_k=tuple(map(c(CACHE_K), self.prefix_k)),
      prefix_v=tuple(map(c(CACHE_V), self.prefix_v)),
      prefix_pos_AS=None if self.prefix_pos_AS is None else pos(self.prefix_pos_AS),
    )


def cache_dtype(cfg: ModelConfig):
  """The KV cache's dtype: the compute dtype, except a bfloat16 model on XLA:CPU, whose
  cache holds the same bfloat16-rounded keys and values in float32 (`_attend`). XLA:CPU
  runs a bfloat16 batched matmul on float32 copies of its operands, so a bfloat16 cache
  was converted at every decode step: the anchor model's sampler (8 layers, 128 rows,
  64 + 128 tokens; one sitting on a 2-core Intel Xeon with AMX) took 14.0 s a call in
  bfloat16 against 10.5 s in float32, and 7.4 s with the float32 cache. Decided by this
  host's backend, as `_pv_by_reduce` is (the memory plan, made for an accelerator, does
  not count it)."""
  if cfg.compute_dtype == jnp.bfloat16 and jax.default_backend() == "cpu":
    return jnp.float32
  return cfg.compute_dtype


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int) -> KVCache:
  """An empty cache of max_len slots: keys [B, K, E, S], values [B, K, S, E] per layer,
  in `cache_dtype`."""
  k_shape = (batch_size, cfg.n_kv_heads, cfg.head_dim, max_len)
  v_shape = (batch_size, cfg.n_kv_heads, max_len, cfg.head_dim)
  dtype = cache_dtype(cfg)
  if cfg.scan_layers:
    zeros = lambda shape: (jnp.zeros((cfg.n_layers, *shape), dtype),)
  else:
    zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.n_layers))
  return KVCache(
    k=zeros(k_shape),
    v=zeros(v_shape),
    pos_BS=jnp.full((batch_size, max_len), -1, jnp.int32),
    index=jnp.zeros((), jnp.int32),
    empty=True,
    stacked=cfg.scan_layers,
  ).constrain()


# ----------------------------------------------------------------------------
# The pure functional API.
# ----------------------------------------------------------------------------


def _dummy_inputs():
  return jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32)


def init_boxed(cfg: ModelConfig, key: jax.Array) -> Params:
  """Params boxed in nn.LogicallyPartitioned (for sharded init from shapes). With
  model.lora: {"base": the model's weights, "lora": the adapters} (`lora`)."""
  variables = Decoder(cfg).init(key, *_dummy_inputs(), None, None, None)
  if cfg.lora.enabled:
    return {"base": variables["params"], "lora": variables["lora"]}
  return variables["params"]


def split_trainable(params: Params, *, part: str = "adapters"):
  """(trainable, join): the part of a params tree the optimizer owns, and join(trainable)
  -> the whole tree. With adapters ({"base": ..., "lora": ...}) the adapters are trainable
  (part="adapters": the base is never differentiated nor in the optimizer state), or the
  base (part="base", the warm start of a randomly initialised model: adapters untouched).
  Without adapters, the whole tree."""
  if is_adapted(params):
    if part == "base":
      lora = params["lora"]
      return params["base"], lambda base: {"base": base, "lora": lora}
    base = params["base"]
    return params["lora"], lambda lora: {"base": base, "lora": lora}
  return params, lambda trainable: trainable


def is_adapted(tree) -> bool:
  """Whether a params-shaped tree holds adapters ({"base": ..., "lora": ...})."""
  return isinstance(tree, dict) and set(tree) == {"base", "lora"}


def reference_part(tree):
  """The part of a params-shaped tree (params, shardings, shapes) the reference policy
  reads: with adapters, {"base": ...} (adapters off); else the whole tree."""
  return {"base": tree["base"]} if is_adapted(tree) else tree


def reference(params: Params) -> Params:
  """The reference policy of a params tree: with adapters, the base with adapters off (the
  same arrays: no second copy of the weights); else a copy of the params (the trainer
  updates them in place)."""
  part = reference_part(params)
  return part if part is not params else jax.tree.map(jnp.copy, params)


def cast_base(tree, cfg: ModelConfig):
  """A params-shaped tree (arrays or jax.ShapeDtypeStructs, boxed or not) with the frozen
  base stored in model.lora.base_dtype (`quant.store`); adapters, integer leaves, a base
  already stored and trees without adapters unchanged."""
  if not (is_adapted(tree) and cfg.lora.enabled and cfg.lora.base_dtype):
    return tree
  return {"base": store_base(tree["base"], cfg), "lora": tree["lora"]}


def store_base(base, cfg: ModelConfig):
  """The base alone (`cast_base`'s "base"), e.g. a checkpoint's weights read again."""
  names = None
  if cfg.lora.base_dtype in quant.QUANTIZED and not _boxed(base):
    names = logical_axes(cfg)["base"]
  return quant.store(base, cfg.lora.base_dtype, names=names)


def _boxed(tree) -> bool:
  return any(
    isinstance(x, nn.LogicallyPartitioned)
    for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  )


def base_config(cfg: ModelConfig) -> ModelConfig:
  """The config of the base model alone (adapters off): what checkpoints hold."""
  return dataclasses.replace(cfg, lora=LoraConfig()) if cfg.lora.enabled else cfg


def merge_adapters(params: Params, cfg: ModelConfig) -> Params:
  """The base weights with each adapter folded in, W + (alpha/r)·A·B (the same policy
  without adapters: export it as a plain checkpoint). Params without adapters: as they
  are."""
  if not (cfg.lora.enabled and isinstance(params, dict) and set(params) == {"base", "lora"}):
    return params
  merged = jax.tree.map(lambda x: x, params["base"])  # A new dict structure.
  scale = cfg.lora.scale

  def fold(base_node, lora_node):
    for key, value in lora_node.items():
      if key.endswith("_lora"):  # The adapter of projection `name`, beside its kernel.
        name = key[: -len("_lora")]
        kernel = _fold(base_node[name]["kernel"], value["a"], value["b"], scale)
        base_node[name] = {**base_node[name], "kernel": kernel}
      else:
        fold(base_node[key], value)

  fold(merged, params["lora"])
  return quant.dequantized(merged)  # An int8 base's kernels without adapters, too.


def sampler_view(
  cfg: ModelConfig, *, fsdp: int = 1
) -> tuple[ModelConfig, Callable[[Params], Params] | None]:
  """(config, view) of the model the samplers run: `view(params)` is what that config's
  model reads (None: the params as given).

  - With model.lora.merge_for_sampling, the base model on `merge_adapters(params)`: the
    fold, (L·)r·in·out multiply-adds per projection, runs once per sampler call inside
    its jit, and each decode step then does one matmul per projection instead of
    x·W + (x·A)·B. The policy is the same up to float rounding (W + s·A·B rounded once
    to the kernel's dtype: in float32 the same tokens, in bfloat16 the trajectories part
    where a rounding tips a draw); the sampler's log-probs already differ from the
    trainer's by op order.
  - With scanned layers (model.scan_layers) and no fsdp sharding (fsdp == 1), the
    unrolled model on `unstack_layers(params)`: every layer keeps its own cache buffers,
    which the decode loop updates in place. A layer scan reads the stacked [L, ...] cache
    and writes a new one at every decode step (plus one layer's slices and weights), so
    each step moves the whole cache several times: on an H200 a Qwen2.5-0.5B-shaped
    decode step of 256 rows took 18 ms scanned against a ~2 ms roofline, and on a 2-core
    CPU an 8-layer model decoded 3.6x faster unrolled. The slices are one copy of the
    weights, made once per sampler call. Over fsdp the unrolled loop would gather the
    whole model onto every device (`memory`), so sharded weights stay scanned.
  The model otherwise: as it is, and None."""
  view = None
  if cfg.lora.enabled and cfg.lora.merge_for_sampling:
    view = functools.partial(merge_adapters, cfg=cfg)
    cfg = base_config(cfg)
  if cfg.scan_layers and fsdp == 1:
    unstack = functools.partial(unstack_layers, n_layers=cfg.n_layers)
    view = unstack if view is None else functools.partial(_then, first=view, second=unstack)
    cfg = dataclasses.replace(cfg, scan_layers=False, remat="none")
  return cfg, view


def _then(params: Params, *, first: Callable, second: Callable) -> Params:
  return second(first(params))


def unstack_layers(params: Params, *, n_layers: int) -> Params:
  """A scanned model's params as the unrolled model reads them: in every collection of
  the tree (params; base and adapters), {"layers": leaves [L, ...]} becomes {"layer_0":
  leaves [...], ..., "layer_{L-1}": ...}; everything else as it is."""
  if not isinstance(params, dict):
    return params
  out = {}
  for name, sub in params.items():
    if name == "layers":
      out.update({f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], sub) for i in range(n_layers)})
    else:
      out[name] = unstack_layers(sub, n_layers=n_layers)
  return out


def _fold(kernel, a, b, scale):
  """kernel [(L,) *in, *out] + scale·A [(L,) *in, r] · B [(L,) r, *out], in float32 (an
  int8 kernel: dequantized first, merged in float32)."""
  kernel = quant.dequantized(kernel)
  stacked = kernel.ndim == (a.ndim - 1) + (b.ndim - 1) - 1  # Both carry a layer axis.
  if stacked:
    delta = jax.vmap(lambda a1, b1: jnp.tensordot(a1, b1, axes=1))(a, b)
  else:
    delta = jnp.tensordot(a, b, axes=1)
  return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)


def _variables(params: Params, cfg: ModelConfig) -> dict:
  """Flax variables of a params tree: {"params": ...}, plus {"lora": ...} when the tree
  holds adapters ({"base": ..., "lora": ...}). {"base": ...} alone is the reference: the
  base model, adapters off."""
  if not cfg.lora.enabled:
    return {"params": params}
  variables = {"params": params["base"]}
  if params.get("lora") is not None:
    variables["lora"] = params["lora"]
  return variables


def init(cfg: ModelConfig, key: jax.Array) -> Params:
  """Unboxed parameter pytree, compiled once per config (op by op, Flax's init of the tiny
  model dispatches hundreds of small programs: 6.7 s on a 2-core CPU, against 3.2 s for
  the compiled init, its compile included)."""
  return _init(cfg, key)


@functools.partial(jax.jit, static_argnums=0)
def _init(cfg: ModelConfig, key: jax.Array) -> Params:
  return nn.unbox(init_boxed(cfg, key))


def logical_axes(cfg: ModelConfig) -> Params:
  """Pytree (like params) of PartitionSpecs of logical axis names."""
  boxed = jax.eval_shape(functools.partial(init_boxed, cfg), jax.random.key(0))
  return nn.get_partition_spec(boxed)


def param_count(params: Params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))


def apply(
  params: Params,
  tokens_BT,
  positions_BT,
  cache: KVCache | None = None,
  *,
  cfg: ModelConfig,
  logits_slice: tuple[int, int] | None = None,
  hidden_only: bool = False,
  head_only: bool = False,
  dropout_key: jax.Array | None = None,
):
  """Forward pass. Returns (float32 logits [B,T,V], cache with this call's tokens appended).

  Without a cache this is a full (teacher-forced) forward, and the returned cache is None.
  `logits_slice=(start, stop)` (static) applies the final norm and LM head only at
  positions [start, stop): logits are [B, stop - start, V], and neither the forward nor
  the backward touches the others (teacher forcing needs the completion positions only).
  `hidden_only=True` (no cache) returns the final-normed hidden states [B, T', D] in place
  of the logits; `head_only=True` takes those hidden states as `tokens_BT` and returns
  their logits (`head_logits`): the two halves of a forward whose LM head runs in chunks.
  `dropout_key` makes it a training forward: with model.lora.dropout > 0 each adapter's
  input is dropped (`_Adapter`); without a key (sampling, π_old, the reference) it is not.
  """
  if head_only:
    return head_logits(params, tokens_BT, cfg=cfg, dropout_key=dropout_key), None
  decoder = Decoder(cfg, logits_slice=logits_slice, head=not hidden_only)
  if hidden_only and cache is not None:
    raise ValueError("model.apply(hidden_only=True) is a teacher-forced forward: no cache.")
  variables = _variables(params, cfg)
  rngs = _rngs(cfg, dropout_key)
  if cache is None:
    logits_BTV, _ = decoder.apply(variables, tokens_BT, positions_BT, None, None, None, rngs=rngs)
    return logits_BTV, None
  if rngs:
    raise ValueError("model.apply(dropout_key=...) is a training forward: no cache.")
  i = cache.index
  if jnp.ndim(i) == 1:  # A write slot per row (decode only).
    pos_BS = jax.vmap(lambda p, n, j: jax.lax.dynamic_update_slice(p, n, (j,)))(
      cache.pos_BS, positions_BT.astype(jnp.int32), i
    )
  else:
    pos_BS = jax.lax.dynamic_update_slice(cache.pos_BS, positions_BT.astype(jnp.int32), (0, i))
  if cache.empty:  # Prefill: attend within the call, then write its k/v [L,B,T,K,E] once.
    logits_BTV, (k_LBTKE, v_LBTKE) = decoder.apply(
      variables, tokens_BT, positions_BT, None, None, None
    )

    def write(bufs, new_L, at):
      if cache.stacked:
        return (jax.lax.dynamic_update_slice(bufs[0], new_L.astype(bufs[0].dtype), (0, *at)),)
      return tuple(
        jax.lax.dynamic_update_slice(b, n.astype(b.dtype), at) for b, n in zip(bufs, new_L)
      )

    k = write(cache.k, jnp.transpose(k_LBTKE, (0, 1, 3, 4, 2)), (0, 0, 0, i))
    v = write(cache.v, jnp.swapaxes(v_LBTKE, 2, 3), (0, 0, i, 0))
  else:  # Decode: every layer writes into its own buffer in place, then attends over it.
    kv = (cache.k[0], cache.v[0]) if cache.stacked else (cache.k, cache.v)
    prefix = None
    if cache.prefix_pos_AS is not None:
      pkv = (cache.prefix_k, cache.prefix_v)
      prefix = (tuple(x[0] for x in pkv) if cache.stacked else pkv, cache.prefix_pos_AS)
    logits_BTV, (k, v) = decoder.apply(variables, tokens_BT, positions_BT, kv, pos_BS, i, prefix)
    k, v = ((k,), (v,)) if cache.stacked else (tuple(k), tuple(v))
  cache = cache.replace(k=k, v=v, pos_BS=pos_BS, index=i + tokens_BT.shape[1], empty=False)
  return logits_BTV, cache


def make_model_fn(cfg: ModelConfig):
  """(params, tokens, positions, cache) -> (logits, cache), the sampler's model protocol."""
  return functools.partial(apply, cfg=cfg)


def positions_from_mask(mask_BT):
  """Position ids that skip padding: cumsum(mask) - 1 on real tokens, -1 on padding."""
  mask_BT = mask_BT.astype(jnp.int32)
  return jnp.where(mask_BT > 0, jnp.cumsum(mask_BT, axis=-1) - 1, -1).astype(jnp.int32)
