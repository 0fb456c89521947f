"""The policy's Flax layers: RMSNorm, dense projections with logical names (and int8 or
adapted kernels), attention, the gated MLP (SwiGLU, GeGLU), the block, the embedding, the decoder stack
and the LM head. The params live outside (`model`); shape letters as in `model`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import attention, kernels, kv_cache, model_config, moe, quant

Params = Any


class _Named(nn.LogicallyPartitioned):
  """A param's logical axis names. Flax's DenseGeneral first creates its kernel flattened
  to 2-D and reshapes it after; the names constrain only the full-rank value (a rank-2
  constraint with 3 names would fail under a mesh)."""

  def unbox(self, apply_constraint=True):
    return super().unbox(apply_constraint and len(self.names) == self.value.ndim)


def _param_init(init, names):
  return lambda *args, **kwargs: _Named(init(*args, **kwargs), names)


class RMSNorm(nn.Module):
  """y = x / sqrt(mean(x^2) + eps) · w, normalised in float32 and rounded to the dtype
  before the scale (HF Llama/Qwen). offset 1 (Gemma): y · (1 + w) all in float32, then
  rounded (HF Gemma's order), w initialised 0."""

  eps: float
  dtype: Any
  param_dtype: Any
  axis_name: str = "embed"
  offset: float = 0.0

  @nn.compact
  def __call__(self, x):
    scale = self.param(
      "scale",
      _param_init(nn.initializers.constant(1.0 - self.offset), (self.axis_name,)),
      (x.shape[-1],),
      self.param_dtype,
    )
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    shape = (1,) * (x.ndim - 1) + (-1,)
    if self.offset:
      return (y * (self.offset + scale.astype(jnp.float32).reshape(shape))).astype(self.dtype)
    return y.astype(self.dtype) * scale.astype(self.dtype).reshape(shape)


def _norm(cfg: model_config.ModelConfig, **kwargs):
  """The model's RMSNorm (`norm_offset`, eps and dtypes from the config)."""
  return functools.partial(
    RMSNorm,
    eps=cfg.norm_eps,
    dtype=cfg.compute_dtype,
    param_dtype=cfg.weight_dtype,
    offset=cfg.norm_offset,
    **kwargs,
  )


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
  on XLA:CPU's fast path).

  Under context parallelism (`length_shards` > 1) it is a plain dot_general too: the
  flattened rows would join the batch split (data, fsdp) and the token split (sequence)
  in one dimension, and the partitioner then all-gathered each layer's activations and
  their gradients over `sequence` for the weight gradient (`configs/scale.py:tiny` on
  (data, fsdp, sequence, tensor) = (1, 2, 4, 1): 10.3 MB of update temporaries a device
  against 7.6 MB with the plain contraction, which sums partial weight gradients)."""
  (lc, rc), (lb, rb) = dimension_numbers
  n = len(lc)
  plain = (
    lb or rb or tuple(lc) != tuple(range(lhs.ndim - n, lhs.ndim)) or tuple(rc) != tuple(range(n))
  )
  plain = plain or length_shards() > 1
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


def _dense(cfg: model_config.ModelConfig, features, names, *, axis=-1, use_bias=False, name=None):
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

  cfg: model_config.ModelConfig
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


def _adapted(cfg: model_config.ModelConfig, name: str, x, y, *, in_names, out_names):
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
  attends over the buffers' first cache_pos_BS.shape[1] slots (all of them but in a
  chunked prefill's calls), or over the buffers and a prefix its group shares,
  prefix = ((keys [A, K, E, P], values [A, K, P, E]), positions [A, P]) (`_attend_shared`).
  A paged cache (index a `kv_cache.PageView`, cache_kv this layer's pools): it attends
  over the row's pages and the call's own new keys (`attention.attend_paged`), and returns
  them, keys [B, K, E, T] and values [B, K, T, E], for the sampler to commit
  (`PagedKVCache.commit`).

  A window ring (`ring=True`, `KVCache.rings`: index the call's ring slots [B, T]): the
  call's keys are written at their slots; one token a row then attends over the ring, a
  block over the ring as it was and its own keys (cache_pos_BS the positions of both).
  A paged cache's ring (`ring=True`, index a `kv_cache.PageView`, cache_pos_BS the ring's
  positions): it attends over the ring as it was and its own keys (`attention.attend_ring`)
  and returns them for the sampler to commit, as a paged layer does.

  layer = (window, inv_freq): this layer's window (a scalar, or None: no window term) and
  rotary inverse frequencies (None: `attention.rope_inv_freq(cfg)`), per layer
  (`attention.layer_windows`, `attention.layer_inv_freq`).
  """

  cfg: model_config.ModelConfig

  @nn.compact
  def __call__(
    self, x_BTD, positions_BT, cache_kv, cache_pos_BS, index, prefix=None, layer=None,
    ring=False,
  ):  # fmt: skip
    cfg = self.cfg
    window, inv_freq = (None, None) if layer is None else layer
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
      norm = _norm(cfg, axis_name="head_dim")
      q_BTHE = norm(name="q_norm")(q_BTHE)
      k_BTKE = norm(name="k_norm")(k_BTKE)
    if inv_freq is None:
      inv_freq = attention.rope_inv_freq(cfg)
    q_BTHE = attention.rope(q_BTHE, positions_BT, inv_freq=inv_freq)
    k_BTKE = attention.rope(k_BTKE, positions_BT, inv_freq=inv_freq)

    B, T = positions_BT.shape
    R = H // K
    # Query rows grouped per kv head: [B, K, Q = T*R, E], so every matmul below is a
    # canonical batched matmul over (b, k) with no transposes of the cache.
    scale = (cfg.query_pre_attn_scalar or E) ** -0.5
    q_BKQE = jnp.transpose((q_BTHE * scale).reshape(B, T, K, R, E), (0, 2, 1, 3, 4)).reshape(
      B, K, T * R, E
    )
    q_pos_BQ = jnp.repeat(positions_BT, R, axis=1)
    k_BKET, v_BKTE = jnp.transpose(k_BTKE, (0, 2, 3, 1)), jnp.swapaxes(v_BTKE, 1, 2)
    if cache_kv is None:
      keys = (k_BKET, v_BKTE, positions_BT)
      new_kv = (k_BTKE, v_BTKE)
      if length_shards() > 1 and T % length_shards() == 0:  # Context parallelism.
        q_BKQE, q_pos_BQ, keys = _split_queries_whole_keys(q_BKQE, q_pos_BQ, keys)
    else:
      new_kv, keys = kv_cache.write_and_read(
        cache_kv, k_BKET, v_BKTE, cache_pos_BS, index, ring=ring
      )
    # A Pallas kernel (`kernels`); init's dummy forward runs XLA (the params are the same).
    mask = dict(dtype=cfg.compute_dtype, window=window, softcap=cfg.attn_softcap)
    if cache_kv is None and cfg.attention_impl != "xla" and not self.is_initializing():
      out_BKQE = kernels.causal(
        q_BKQE, *keys, impl=cfg.attention_impl, dtype=cfg.compute_dtype,
        sliding=None if window is None else jnp.asarray(window) < model_config.FULL_WINDOW,
        sliding_window=cfg.sliding_window, softcap=cfg.attn_softcap,
      )  # fmt: skip
    elif cache_kv is None and length_shards() > 1 and T % length_shards() == 0:
      # Each device's queries over the row's keys (no causal blocks: a block of queries
      # is not a block of one device's, so slicing them would re-split the tokens), in
      # blocks of model.context_query_block tokens a device.
      parts, block = length_shards(), cfg.context_query_block * R
      if 0 < block < q_BKQE.shape[2] // parts:
        out_BKQE = attention.attend_query_blocks(
          q_BKQE, q_pos_BQ, *keys, parts=parts, block=block, split=_split_rows, **mask
        )
      else:
        out_BKQE = attention.attend(q_BKQE, q_pos_BQ, *keys, **mask)
    elif cache_kv is None:  # Teacher forcing or a prefill: causal within the call.
      out_BKQE = attention.attend_causal(
        q_BKQE, q_pos_BQ, *keys, query_block=cfg.context_query_block, **mask
      )
    elif keys is None and ring:  # A paged cache's window ring (`PagedKVCache.rings`).
      out_BKQE = attention.attend_ring(
        q_BKQE, q_pos_BQ, *cache_kv, cache_pos_BS, *new_kv, positions_BT, **mask
      )
    elif keys is None:  # A paged cache (`kv_cache.PageView`).
      out_BKQE = attention.attend_paged(
        q_BKQE, q_pos_BQ, *cache_kv, index.pos_PZ, index.table_NM, index.live, *new_kv,
        positions_BT, block=index.block, **mask,
      )  # fmt: skip
    elif prefix is None:
      out_BKQE = attention.attend(q_BKQE, q_pos_BQ, *keys, **mask)
    else:  # A group-shared prefix (`KVCache.share`): ((keys, values), positions).
      out_BKQE = attention.attend_shared(q_BKQE, q_pos_BQ, *keys, *prefix, **mask)
    out_BTKRE = jnp.transpose(out_BKQE.reshape(B, K, T, R, E), (0, 2, 1, 3, 4))
    out_BTHE = out_BTKRE.reshape(B, T, H, E)
    out_BTD = _dense(cfg, cfg.d_model, ("q_heads", "head_dim", "embed"), axis=(-2, -1), name="o")(
      out_BTHE
    )
    out_BTD = _adapted(
      cfg, "o", out_BTHE, out_BTD, in_names=("q_heads", "head_dim"), out_names=("embed",)
    )
    return out_BTD, new_kv


def _split_rows(x):
  """A block step's queries [B, K, Q, E] or their positions [B, Q], split by token over
  the devices of "activation_length" (`attention.attend_query_blocks`)."""
  if x.ndim == 2:
    return nn.with_logical_constraint(x, ("activation_batch", "activation_length"))
  names = ("activation_batch", "activation_kv_heads", "activation_length", "activation_head_dim")
  return nn.with_logical_constraint(x, names)


def _split_queries_whole_keys(q_BKQE, q_pos_BQ, keys):
  """Context parallelism (`sharding`'s `sequence` axis): the queries stay split by token
  over the devices of "activation_length" (rows t-major, so a device's T/c tokens are its
  T·R/c query rows), while the keys, values and their positions are constrained whole
  along T, which makes the partitioner all-gather them (and reduce-scatter their
  gradients in the backward). Masking is by position, so no device needs to know which
  tokens it holds."""
  q_names = ("activation_batch", "activation_kv_heads", "activation_length", "activation_head_dim")
  k_names = ("activation_batch", "activation_kv_heads", "activation_head_dim", None)
  v_names = ("activation_batch", "activation_kv_heads", None, "activation_head_dim")
  k_BKET, v_BKTE, pos_BT = keys
  q_BKQE = nn.with_logical_constraint(q_BKQE, q_names)
  q_pos_BQ = nn.with_logical_constraint(q_pos_BQ, ("activation_batch", "activation_length"))
  whole = (
    nn.with_logical_constraint(k_BKET, k_names),
    nn.with_logical_constraint(v_BKTE, v_names),
    nn.with_logical_constraint(pos_BT, ("activation_batch", None)),
  )
  return q_BKQE, q_pos_BQ, whole


_ACTIVATIONS = {"silu": nn.silu, "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}


class Mlp(nn.Module):
  """Gated MLP: down(act(gate(x)) * up(x)); act silu (SwiGLU) or tanh-approximated gelu
  (GeGLU, Gemma's gelu_pytorch_tanh), `model.activation`."""

  cfg: model_config.ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    proj = {}
    for name in ("gate", "up"):
      y = _dense(cfg, cfg.mlp_dim, ("embed", "mlp"), name=name)(x_BTD)
      proj[name] = _adapted(cfg, name, x_BTD, y, in_names=("embed",), out_names=("mlp",))
    h_BTF = constrain(
      _ACTIVATIONS[cfg.activation](proj["gate"]) * proj["up"],
      ("activation_batch", "activation_length", "activation_mlp"),
    )
    down_BTD = _dense(cfg, cfg.d_model, ("mlp", "embed"), name="down")(h_BTF)
    return _adapted(cfg, "down", h_BTF, down_BTD, in_names=("mlp",), out_names=("embed",))


class MoeMlp(nn.Module):
  """A mixture of gated MLPs (Qwen3-MoE's sparse block), every token through its top-k
  (`moe`): p = softmax(x·W_r); (w, e) = top_k(p, k), renormalised when
  model.expert_weights_normalized; y = Σ_j w_j · down_e_j(act(gate_e_j(x)) * up_e_j(x)),
  the experts' matmuls over the rows routed to each (`moe.experts`, model.moe_impl).
  Expert weights [X, D, F] / [X, F, D] carry the logical name "expert" (split over the
  mesh axes `expert` × `tensor` by the default rules table: expert parallelism). With the
  "intermediates" collection mutable it sows its real tokens' routing (valid_BT) for
  `moe.balance_loss`, and when it replays routes how many it replayed and how many its
  own top-k differs from (`moe.flip_counts`).

  Routing replay: routes_BTK (int, -1: the token routes itself) are experts recorded by
  another forward, used in place of this router's top-k (`moe.route`); with the "routes"
  collection mutable it sows its own choices e [B, T, k] ("experts", `moe.route_dtype`)."""

  cfg: model_config.ModelConfig

  @nn.compact
  def __call__(self, x_BTD, valid_BT=None, routes_BTK=None):
    cfg = self.cfg
    X, k, F, D = cfg.n_experts, cfg.experts_per_token, cfg.expert_mlp_dim, cfg.d_model
    router = _dense(cfg, X, ("embed", "expert_router"), name="router")
    init = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))
    weight = lambda name, shape, names: self.param(
      name, _param_init(init, names), shape, cfg.weight_dtype
    ).astype(cfg.compute_dtype)
    gate = weight("gate", (X, D, F), ("expert", "embed", "expert_mlp"))
    up = weight("up", (X, D, F), ("expert", "embed", "expert_mlp"))
    down = weight("down", (X, F, D), ("expert", "expert_mlp", "embed"))
    B, T, _ = x_BTD.shape
    x_ND = x_BTD.reshape(B * T, D)
    replay_NK = None if routes_BTK is None else routes_BTK.reshape(B * T, k)
    probs_NX, w_NK, e_NK = moe.route(
      router(x_ND), k=k, normalized=cfg.expert_weights_normalized, replay_NK=replay_NK
    )
    if self.is_mutable_collection("routes"):
      self.sow("routes", "experts", e_NK.reshape(B, T, k).astype(moe.route_dtype(X)))
    if valid_BT is not None and self.is_mutable_collection("intermediates"):
      v_N = valid_BT.reshape(-1).astype(jnp.float32)  # Router statistics of real tokens.
      chosen_NKX = jax.nn.one_hot(e_NK, X, dtype=jnp.float32)
      self.sow("intermediates", "routed_KX", jnp.einsum("n,nkx->kx", v_N, chosen_NKX))
      self.sow("intermediates", "probs_X", jnp.einsum("n,nx->x", v_N, probs_NX))
      self.sow("intermediates", "tokens", jnp.sum(v_N))
      if replay_NK is not None:  # Replayed routes that this router would not take.
        replayed_N, flipped_N = moe.route_flips(jax.lax.top_k(probs_NX, k)[1], replay_NK)
        self.sow("intermediates", "replayed", jnp.sum(v_N * replayed_N))
        self.sow("intermediates", "flipped", jnp.sum(v_N * flipped_N))
    # The init's dummy forward runs XLA (the params are the same).
    impl = "xla" if self.is_initializing() else cfg.moe_impl
    y_ND = moe.experts(
      x_ND, w_NK, e_NK, gate, up, down, act=_ACTIVATIONS[cfg.activation], impl=impl,
      dtype=cfg.compute_dtype,
    )  # fmt: skip
    return y_ND.reshape(B, T, D)


class Block(nn.Module):
  """Pre-norm decoder block: x + attn(norm(x)), then x + mlp(norm(x)); with
  model.post_norms (Gemma 2/3) x + norm(attn(norm(x))), then x + norm(mlp(norm(x))).
  layer: this layer's (window, inv_freq), as `Attention` takes it, and its replayed
  routes [B, T, k] or None (`MoeMlp`)."""

  cfg: model_config.ModelConfig

  @nn.compact
  def __call__(
    self, x_BTD, positions_BT, cache_kv, cache_pos_BS, index, prefix_kv, prefix_pos, layer,
    ring=False,
  ):  # fmt: skip
    cfg = self.cfg
    norm = _norm(cfg)
    post = (lambda name, y: norm(name=name)(y)) if cfg.post_norms else (lambda name, y: y)
    attn = Attention(cfg, name="attn")
    prefix = None if prefix_kv is None else (prefix_kv, prefix_pos)
    window, inv_freq, routes_BTK = (None, None, None) if layer is None else layer
    attn_BTD, kv_new = attn(
      norm(name="attn_norm")(x_BTD),
      positions_BT, cache_kv, cache_pos_BS, index, prefix, (window, inv_freq), ring=ring,
    )  # fmt: skip
    x_BTD = x_BTD + post("attn_post_norm", attn_BTD)
    if cfg.n_experts:
      mlp = functools.partial(
        MoeMlp(cfg, name="mlp"), valid_BT=positions_BT >= 0, routes_BTK=routes_BTK
      )
    else:
      mlp = Mlp(cfg, name="mlp")
    x_BTD = x_BTD + post("mlp_post_norm", mlp(norm(name="mlp_norm")(x_BTD)))
    return constrain(x_BTD, model_config.ACT_BTD), kv_new


def _mesh_axes(name: str) -> tuple[str, ...]:
  """The mesh axes the logical rules in scope map `name` to (() outside them)."""
  axes = nn.logical_to_mesh_axes((name,))[0]
  return () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))


def length_shards() -> int:
  """How many devices split a row's tokens (context parallelism, mesh axis `sequence`):
  the size of the context mesh's axes that the rules in scope map "activation_length"
  to; 1 outside a mesh or without such a rule."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not nn.get_logical_axis_rules():
    return 1
  return math.prod(mesh.shape[a] for a in _mesh_axes("activation_length") if a in mesh.shape)


def constrain(x, names):
  """nn.with_logical_constraint, with "activation_length" left whole (None) where its
  devices do not divide the dimension: a decode step's T = 1, or a call the sampler makes
  with a cache. Context parallelism splits teacher-forced calls only (`sharding`)."""
  shards = length_shards()
  if shards > 1:
    names = tuple(
      None if n == "activation_length" and d % shards else n
      for n, d in zip(names, x.shape, strict=True)
    )
  return nn.with_logical_constraint(x, names)


class _Embed(nn.Embed):
  """nn.Embed whose lookup reads the table where it lies: every device looks up every
  token of the batch in its own fsdp slice of the width D (the ids, a few KB, are
  gathered; the rows stay split over the batch axes fsdp does not use), and the output,
  cast to the compute dtype, is re-split by rows ([B, T, D]: an all-to-all). The
  lookup's gradient is then a scatter-add into each device's own slice, with nothing to
  reduce over fsdp. Read gathered over fsdp instead, the table (float32 [V, D]: 545 MB
  for Qwen2.5's 151,936 x 896) was all-gathered each train step and its gradient
  all-reduced each micro-batch (the update of configs/scale.py:0.5b on v5e:2x4:
  all-reduces of 8.7 GB an update, `tests/infra/test_tpu_collectives.py`). The ids and the
  output carry explicit shardings, so XLA's partitioner never has to re-split a gather
  split on D by itself (its "involuntary full rematerialization")."""

  def __call__(self, inputs):
    if not nn.get_logical_axis_rules():  # No mesh rules: a plain lookup.
      return jnp.take(self.embedding, inputs, axis=0).astype(self.dtype)
    width = _mesh_axes("embed")
    rows = tuple(a for a in _mesh_axes("activation_batch") if a not in width)
    # Context parallelism: the tokens stay split over `sequence` throughout, so the
    # re-split to [B, T, D] moves the fsdp split from D to B alone (an all-to-all).
    split = inputs.ndim == 2 and inputs.shape[1] % length_shards() == 0
    length = _mesh_axes("activation_length") if split else ()
    rules = (("rows", rows or None), ("width", width or None), ("length", length or None))
    names = ("rows", "length", *(None,) * (inputs.ndim - 2))
    ids = nn.with_logical_constraint(inputs, names, rules=rules)
    x = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
    return nn.with_logical_constraint(x, (*names, "width"), rules=rules)


class Decoder(nn.Module):
  """Embeddings, the layer stack and the LM head. Returns float32 logits."""

  cfg: model_config.ModelConfig
  logits_slice: tuple[int, int] | None = None  # LM head only at positions [start, stop).
  head: bool = True  # False: return the final-normed hidden states (`head_logits` later).

  @nn.compact
  def __call__(
    self, tokens_BT, positions_BT, cache_kv, cache_pos_BS, index, prefix=None, routes=None,
    ring=None,
  ):  # fmt: skip
    """cache_kv None: returns this call's k/v [L,B,T,K,E]; else the updated buffers.
    prefix: (k, v) buffers per layer (stacked [L, ...] with scan_layers) and positions of
    a prefix shared by groups of rows (`KVCache.share`), or None. routes: replayed experts
    [L, B, T, k] of a mixture of experts (`MoeMlp`), or None. ring: the cache's
    window-sized rings (`KVCache.rings`), (which layers, this call's ring slots [B, T],
    the positions the ring layers attend over, the prefix's ring positions or None), or
    None: a ring layer writes at those slots and attends over those positions."""
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
    x_BTD = embed(tokens_BT)
    if cfg.embed_scale:  # Gemma: √d rounded to the compute dtype, as transformers does.
      x_BTD = x_BTD * jnp.asarray(cfg.d_model**0.5, cfg.compute_dtype)
    x_BTD = constrain(x_BTD, model_config.ACT_BTD)
    windows_L, inv_freq_LH = attention.layer_windows(cfg), attention.layer_inv_freq(cfg)

    block = Block
    if cfg.remat == "auto":
      raise ValueError("model.remat='auto' is resolved by build.build (memory.resolve_auto).")
    if cfg.remat != "none":
      block = nn.remat(
        block, prevent_cse=not cfg.scan_layers, policy=model_config.REMAT_POLICIES[cfg.remat]
      )
    if cfg.scan_layers:
      if ring is not None:
        raise ValueError("A cache with window rings is unstacked (`kv_cache.cache_rings`).")
      stack = nn.scan(
        block,
        variable_axes={"params": 0, "lora": 0, "intermediates": 0, "routes": 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast, 0, nn.broadcast, nn.broadcast, 0, nn.broadcast, 0),
        length=cfg.n_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      layer = (_const(windows_L), _const(inv_freq_LH), routes)
      x_BTD, kv_new = stack(cfg, name="layers")(
        x_BTD, positions_BT, cache_kv, cache_pos_BS, index, prefix_kv, prefix_pos, layer
      )
    else:
      new = []
      for i in range(cfg.n_layers):
        layer_kv = None if cache_kv is None else (cache_kv[0][i], cache_kv[1][i])
        layer_prefix = None if prefix_kv is None else (prefix_kv[0][i], prefix_kv[1][i])
        layer = tuple(None if a is None else a[i] for a in (windows_L, inv_freq_LH, routes))
        at = (cache_pos_BS, index, prefix_pos, False)
        if ring is not None and ring[0][i]:  # A window ring: its slots and positions.
          at = (ring[2], ring[1], ring[3], True)
        x_BTD, kv = block(cfg, name=f"layer_{i}")(
          x_BTD, positions_BT, layer_kv, at[0], at[1], layer_prefix, at[2], layer, at[3]
        )
        new.append(kv)
      # Fresh k/v are stacked [L, ...]; updated per-layer buffers stay separate.
      kv_new = (
        jax.tree.map(lambda *xs: jnp.stack(xs), *new) if cache_kv is None else tuple(zip(*new))
      )

    if self.logits_slice is not None:  # Re-split: the slice's tokens start at another offset.
      x_BTD = constrain(x_BTD[:, self.logits_slice[0] : self.logits_slice[1]], model_config.ACT_BTD)
    x_BTD = _norm(cfg)(name="final_norm")(x_BTD)
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


def _const(a):
  """A per-layer numpy constant as a jax array (nn.scan slices its leading axis), or None."""
  return None if a is None else jnp.asarray(a)


def _tied_logits(cfg: model_config.ModelConfig, x_BTD, table_VD):
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


def _finish_logits(cfg: model_config.ModelConfig, logits_BTV):
  """float32 logits, soft-capped c·tanh(z / c) with model.final_softcap c > 0 (Gemma 2),
  ids at or past vocab_limit pushed to -1e9."""
  logits_BTV = logits_BTV.astype(jnp.float32)
  if cfg.final_softcap:
    logits_BTV = cfg.final_softcap * jnp.tanh(logits_BTV / cfg.final_softcap)
  if 0 < cfg.vocab_limit < cfg.vocab_size:
    live_V = jnp.arange(cfg.vocab_size) < cfg.vocab_limit
    logits_BTV = jnp.where(live_V, logits_BTV, -1e9)
  return constrain(logits_BTV, model_config.ACT_BTV)


def head_logits(params: Params, x_BTD, *, cfg: model_config.ModelConfig, dropout_key=None):
  """The LM head alone: float32 logits [B, T, V] of final-normed hidden states (those of
  `apply(..., hidden_only=True)`), equal to what `apply` returns at those positions.
  Callers that never need all T positions' logits at once (`logprobs`, in chunks) use it.
  dropout_key: as `apply`'s (the head's adapter, when targeted)."""
  variables = variables_of(params, cfg)
  base = variables["params"]
  if cfg.tie_embeddings:
    return _finish_logits(cfg, _tied_logits(cfg, x_BTD, base["embed"]["embedding"]))
  head = _Head(cfg)
  head_vars = {"params": {"lm_head": base["lm_head"]}}
  if "lm_head_lora" in variables.get("lora", {}):
    head_vars["lora"] = {"lm_head_lora": variables["lora"]["lm_head_lora"]}
  return _finish_logits(cfg, head.apply(head_vars, x_BTD, rngs=_rngs(cfg, dropout_key)))


def _rngs(cfg: model_config.ModelConfig, dropout_key) -> dict:
  """Flax rngs of a forward: {"dropout": key} when it is a training forward (a key given)
  of a model whose adapters drop (model.lora.dropout > 0); else none, and the forward is
  deterministic (a key given to a model without adapter dropout changes nothing)."""
  if dropout_key is None or not (cfg.lora.enabled and cfg.lora.dropout > 0):
    return {}
  return {"dropout": dropout_key}


class _Head(nn.Module):
  """The untied LM head with its adapter (`head_logits`'s parameter paths: Decoder's)."""

  cfg: model_config.ModelConfig

  @nn.compact
  def __call__(self, x_BTD):
    cfg = self.cfg
    logits_BTV = _dense(cfg, cfg.vocab_size, ("embed", "vocab"), name="lm_head")(x_BTD)
    return _adapted(cfg, "lm_head", x_BTD, logits_BTV, in_names=("embed",), out_names=("vocab",))


def variables_of(params: Params, cfg: model_config.ModelConfig) -> dict:
  """Flax variables of a params tree: {"params": ...}, plus {"lora": ...} when the tree
  holds adapters ({"base": ..., "lora": ...}). {"base": ...} alone is the reference: the
  base model, adapters off."""
  if not cfg.lora.enabled:
    return {"params": params}
  variables = {"params": params["base"]}
  if params.get("lora") is not None:
    variables["lora"] = params["lora"]
  return variables


def _dummy_inputs():
  return jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32)


def init_boxed(cfg: model_config.ModelConfig, key: jax.Array) -> Params:
  """Params boxed in nn.LogicallyPartitioned (for sharded init from shapes). With
  model.lora: {"base": the model's weights, "lora": the adapters} (`lora`)."""
  variables = Decoder(cfg).init(key, *_dummy_inputs(), None, None, None)
  if cfg.lora.enabled:
    return {"base": variables["params"], "lora": variables["lora"]}
  return variables["params"]


def logical_axes(cfg: model_config.ModelConfig) -> Params:
  """Pytree (like params) of PartitionSpecs of logical axis names."""
  boxed = jax.eval_shape(functools.partial(init_boxed, cfg), jax.random.key(0))
  return nn.get_partition_spec(boxed)
