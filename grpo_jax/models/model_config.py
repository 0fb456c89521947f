"""The policy's architecture and adapters as validated dataclasses (`ModelConfig`,
`LoraConfig`), and the logical names of its activations and cache, which the sharding rules
table maps like the params' (`sharding`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import config_lib
from grpo_jax.models import kernels, moe, quant

Params = Any

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
ROPE_SCALINGS = ("none", "linear", "llama3")
ACTIVATIONS = ("silu", "gelu_tanh")  # The gated MLP's act(gate(x)) * up(x).
LAYER_TYPES = ("full_attention", "sliding_attention")  # transformers' names.
# A full-attention layer's window in a stack that also has sliding ones (per-layer windows
# are an array under nn.scan): larger than any sequence.
FULL_WINDOW = 2**30
REMAT_POLICIES = {
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
  remat: str = "none"  # One of REMAT_POLICIES, or "auto" (build.build resolves it).
  init_std: float = 0.02
  # Attention of the calls without a KV cache (training, log-probs, prefill): "xla" (every
  # backend), "splash" (a Pallas flash-attention kernel, TPU only) or "splash_interpret"
  # (that kernel interpreted, any backend: tests). Decoding is XLA always (`kernels`).
  attention_impl: str = "xla"
  # Teacher-forced attention (XLA path) attends at most this many query tokens at a time,
  # recomputed in the backward (`attention.attend_query_blocks`): under context parallelism
  # (mesh.sequence > 1) each device's tokens, scores [block, S] a head instead of
  # [S / sequence, S]; otherwise each causal block longer than twice it (rows past 8 of
  # it: `attention.attend_causal`), one step's scores live instead of every block's.
  # 0: all of them at once.
  context_query_block: int = 512
  # Gemma-style features (`families` says which family has which; the defaults are Llama's).
  activation: str = "silu"  # MLP gate activation: "silu" (SwiGLU), "gelu_tanh" (GeGLU).
  # RMSNorm y = x / rms(x) · (norm_offset + w), in float32 when the offset is 1 (Gemma,
  # whose scales are stored as w around 0 and initialised 0).
  norm_offset: float = 0.0
  post_norms: bool = False  # Gemma 2/3: also RMSNorm on attention's and the MLP's outputs.
  embed_scale: bool = False  # Gemma: embeddings times √d_model (rounded to the dtype).
  # Queries scaled by query_pre_attn_scalar^-1/2 (Gemma's); 0: head_dim^-1/2.
  query_pre_attn_scalar: float = 0.0
  attn_softcap: float = 0.0  # Scores c·tanh(s / c) before the mask (Gemma 2); 0: off.
  final_softcap: float = 0.0  # Logits c·tanh(z / c) (Gemma 2); 0: off.
  # Sliding-window attention: a query at position p sees keys at p − window < q <= p on
  # the layers `layer_types` marks "sliding_attention" (every layer when layer_types is
  # empty: Mistral). 0: no window anywhere.
  sliding_window: int = 0
  layer_types: tuple[str, ...] = ()  # One of LAYER_TYPES per layer, or () (see above).
  # Rope base of the sliding layers (Gemma 3: 10,000 while full layers use rope_theta and
  # rope_scaling); 0: every layer uses rope_theta and rope_scaling.
  rope_local_theta: float = 0.0
  # A mixture of experts in place of every layer's MLP (Qwen3-MoE; `layers.MoeMlp`):
  # n_experts gated MLPs of width expert_mlp_dim, each token routed to experts_per_token
  # of them by softmax(x·W_router), their weights renormalised to sum 1 when
  # expert_weights_normalized (norm_topk_prob). 0 experts: the dense MLP of mlp_dim.
  n_experts: int = 0
  experts_per_token: int = 0
  expert_mlp_dim: int = 0
  expert_weights_normalized: bool = False
  # The experts' grouped matmuls (`moe`): "xla" (jax.lax.ragged_dot, every backend),
  # "megablox" (a Pallas TPU kernel whose backward does not grow with n_experts, TPU only)
  # or "megablox_interpret" (that kernel interpreted, any backend: tests).
  moe_impl: str = "xla"
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
    if not isinstance(self.context_query_block, int) or self.context_query_block < 0:
      raise ValueError(
        f"ModelConfig.context_query_block={self.context_query_block!r}; allowed: an int >= 0 "
        "(query tokens teacher-forced attention attends at once; 0: all)."
      )
    moe.check_impl(self.moe_impl)
    self._check_gemma_features()
    self._check_experts()
    if self.remat not in (*REMAT_POLICIES, "auto"):
      raise ValueError(
        f"ModelConfig.remat={self.remat!r}; allowed: {sorted(REMAT_POLICIES)} or 'auto' "
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

  def _check_gemma_features(self) -> None:
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"ModelConfig.activation={self.activation!r}; allowed: {list(ACTIVATIONS)}.")
    if self.norm_offset not in (0.0, 1.0):
      raise ValueError(
        f"ModelConfig.norm_offset={self.norm_offset!r}; allowed: 0 (y·w, Llama, Qwen) or 1 "
        "(y·(1 + w), Gemma)."
      )
    for name in ("query_pre_attn_scalar", "attn_softcap", "final_softcap", "rope_local_theta"):
      if getattr(self, name) < 0:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)} must be >= 0 (0: off).")
    if not isinstance(self.sliding_window, int) or self.sliding_window < 0:
      raise ValueError(
        f"ModelConfig.sliding_window={self.sliding_window!r} must be an int >= 0 (0: none)."
      )
    types = tuple(self.layer_types)
    object.__setattr__(self, "layer_types", types)
    if types and (len(types) != self.n_layers or set(types) - set(LAYER_TYPES)):
      raise ValueError(
        f"ModelConfig.layer_types={list(types)}: needs one of {list(LAYER_TYPES)} per layer "
        f"({self.n_layers}), or () (every layer sliding when sliding_window > 0)."
      )
    if "sliding_attention" in types and not self.sliding_window:
      raise ValueError("ModelConfig.layer_types has sliding layers but sliding_window is 0.")

  def _check_experts(self) -> None:
    for name in ("n_experts", "experts_per_token", "expert_mlp_dim"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} must be an int >= 0.")
    if not self.n_experts:
      return
    if not (1 <= self.experts_per_token <= self.n_experts and self.expert_mlp_dim > 0):
      raise ValueError(
        f"ModelConfig with n_experts={self.n_experts} needs 1 <= experts_per_token "
        f"({self.experts_per_token}) <= n_experts and expert_mlp_dim > 0 "
        f"({self.expert_mlp_dim})."
      )
    adapted = sorted(set(self.lora.targets) & {"gate", "up", "down"}) if self.lora.enabled else []
    if adapted:
      raise ValueError(
        f"model.lora.targets has {adapted}, but the MLP is a mixture of experts "
        "(n_experts > 0), whose experts take no adapters yet; target q, k, v, o (lm_head)."
      )

  @property
  def sliding_layers(self) -> tuple[bool, ...]:
    """Whether each layer attends within `sliding_window` (False everywhere without one)."""
    if not self.sliding_window:
      return (False,) * self.n_layers
    if not self.layer_types:
      return (True,) * self.n_layers
    return tuple(t == "sliding_attention" for t in self.layer_types)

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
