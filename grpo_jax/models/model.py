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

The model is split by idea, one module each: `model_config` (ModelConfig, LoraConfig and
the activations' logical names), `attention` (rotary embeddings and the masked attention
math), `layers` (the Flax layers, the decoder and the LM head), `kv_cache` (the sampler's
cache), `adapters` (views of a params tree: trainable part, reference, stored base,
merged adapters, the samplers' view) and this one, the functional API. This module also
names the types and views its API takes and returns (`model.ModelConfig`,
`model.KVCache`, `model.sampler_view`...), so a caller imports `model` alone.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models import adapters, kv_cache, layers, model_config, moe

Params = Any

# The types and views of the API (see the module docstring).
ModelConfig = model_config.ModelConfig
LoraConfig = model_config.LoraConfig
tiny_config = model_config.tiny_config
KVCache = kv_cache.KVCache
PagedKVCache = kv_cache.PagedKVCache
init_cache = kv_cache.init_cache
cache_rings = kv_cache.cache_rings
cache_dtype = kv_cache.cache_dtype
init_boxed = layers.init_boxed
logical_axes = layers.logical_axes
head_logits = layers.head_logits
length_shards = layers.length_shards
constrain = layers.constrain
ACT_BTD = model_config.ACT_BTD
split_trainable = adapters.split_trainable
is_adapted = adapters.is_adapted
reference_part = adapters.reference_part
reference = adapters.reference
cast_base = adapters.cast_base
store_base = adapters.store_base
base_config = adapters.base_config
merge_adapters = adapters.merge_adapters
sampler_view = adapters.sampler_view


def init(cfg: model_config.ModelConfig, key: jax.Array) -> Params:
  """Unboxed parameter pytree, compiled once per config (op by op, Flax's init of the tiny
  model dispatches hundreds of small programs: 6.7 s on a 2-core CPU, against 3.2 s for
  the compiled init, its compile included)."""
  return _init(cfg, key)


@functools.partial(jax.jit, static_argnums=0)
def _init(cfg: model_config.ModelConfig, key: jax.Array) -> Params:
  return nn.unbox(init_boxed(cfg, key))


def param_count(params: Params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))


def apply(
  params: Params,
  tokens_BT,
  positions_BT,
  cache: kv_cache.KVCache | None = None,
  *,
  cfg: model_config.ModelConfig,
  logits_slice: tuple[int, int] | None = None,
  hidden_only: bool = False,
  head_only: bool = False,
  dropout_key: jax.Array | None = None,
  router_stats: bool = False,
  routes=None,
  record_routes: bool = False,
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
  `router_stats=True` (a teacher-forced forward of a mixture of experts) returns
  (logits, {"moe_balance": the load-balancing loss of this call's real tokens}) in place
  of (logits, None) (`moe.balance_loss`); with `routes` too, the dict also holds
  "routes_replayed" and "routes_flipped" (`moe.flip_counts`).

  Routing replay (a mixture of experts): `routes` [B, T, L, k] (int, -1: the token routes
  itself) are the experts each token took in another forward (the sampler's), used in
  place of this forward's top-k (`moe.route`). `record_routes=True` returns a third
  value, the experts this forward chose [B, T, L, k] (`moe.route_dtype`).
  """
  if record_routes or routes is not None:
    _check_routes(cfg, tokens_BT, routes, record=record_routes, router_stats=router_stats,
                  head_only=head_only)  # fmt: skip
  sown = {} if record_routes else None
  out = _apply(params, tokens_BT, positions_BT, cache, cfg=cfg, logits_slice=logits_slice,
               hidden_only=hidden_only, head_only=head_only, dropout_key=dropout_key,
               router_stats=router_stats, routes=routes, sown=sown)  # fmt: skip
  if not record_routes:
    return out
  tree = sown["routes"]  # Stacked [L, ...] by nn.scan, or one per layer module.
  if cfg.scan_layers:
    (routes_LBTK,) = jax.tree.leaves(tree)
  else:
    routes_LBTK = jnp.stack([tree[f"layer_{i}"]["mlp"]["experts"][0] for i in range(cfg.n_layers)])
  return (*out, jnp.moveaxis(routes_LBTK, 0, 2))


def _apply(params, tokens_BT, positions_BT, cache, *, cfg, logits_slice, hidden_only,
           head_only, dropout_key, router_stats, routes, sown):  # fmt: skip
  if head_only:
    return layers.head_logits(params, tokens_BT, cfg=cfg, dropout_key=dropout_key), None
  decoder = layers.Decoder(cfg, logits_slice=logits_slice, head=not hidden_only)
  if hidden_only and cache is not None:
    raise ValueError("model.apply(hidden_only=True) is a teacher-forced forward: no cache.")
  variables = layers.variables_of(params, cfg)
  rngs = layers._rngs(cfg, dropout_key)
  decoder = functools.partial(_decode, decoder, sown=sown)
  if routes is not None:  # [B, T, L, k] -> [L, B, T, k], scanned over the layers.
    decoder = functools.partial(decoder, routes=jnp.moveaxis(routes, 2, 0))
  if cache is None and router_stats:
    (logits_BTV, _), state = decoder(
      variables, tokens_BT, positions_BT, None, None, None, rngs=rngs, mutable=["intermediates"]
    )
    balance = moe.balance_loss(
      state["intermediates"], n_experts=cfg.n_experts, stacked=cfg.scan_layers
    )
    stats = {"moe_balance": balance}
    if routes is not None:
      stats |= moe.flip_counts(state["intermediates"], stacked=cfg.scan_layers)
    return logits_BTV, stats
  if router_stats:
    raise ValueError("model.apply(router_stats=True) is a teacher-forced forward: no cache.")
  if cache is None:
    logits_BTV, _ = decoder(variables, tokens_BT, positions_BT, None, None, None, rngs=rngs)
    return logits_BTV, None
  if rngs:
    raise ValueError("model.apply(dropout_key=...) is a training forward: no cache.")
  if isinstance(cache, kv_cache.PagedKVCache):
    return _apply_paged(decoder, variables, tokens_BT, positions_BT, cache)
  i = cache.index
  ring, ring_pos_BR = _ring_call(cache, positions_BT)
  if jnp.ndim(i) == 1:  # A write slot per row (decode only).
    pos_BS = jax.vmap(lambda p, n, j: jax.lax.dynamic_update_slice(p, n, (j,)))(
      cache.pos_BS, positions_BT.astype(jnp.int32), i
    )
  else:
    pos_BS = jax.lax.dynamic_update_slice(cache.pos_BS, positions_BT.astype(jnp.int32), (0, i))
  if cache.empty:  # Prefill: attend within the call, then write its k/v [L,B,T,K,E] once.
    logits_BTV, (k_LBTKE, v_LBTKE) = decoder(variables, tokens_BT, positions_BT, None, None, None)

    def write(bufs, new_L, at, slot_axis):
      if cache.stacked:
        return (jax.lax.dynamic_update_slice(bufs[0], new_L.astype(bufs[0].dtype), (0, *at)),)
      rings = cache.rings or (False,) * len(bufs)
      return tuple(
        kv_cache.write_ring(b, n, ring[1], slot_axis=slot_axis)
        if r
        else jax.lax.dynamic_update_slice(b, n.astype(b.dtype), at)
        for b, n, r in zip(bufs, new_L, rings)
      )

    k = write(cache.k, jnp.transpose(k_LBTKE, (0, 1, 3, 4, 2)), (0, 0, 0, i), -1)
    v = write(cache.v, jnp.swapaxes(v_LBTKE, 2, 3), (0, 0, i, 0), -2)
  else:  # Decode: every layer writes into its own buffer in place, then attends over it.
    kv = (cache.k[0], cache.v[0]) if cache.stacked else (cache.k, cache.v)
    prefix = None
    if cache.prefix_pos_AS is not None:
      pkv = (cache.prefix_k, cache.prefix_v)
      prefix = (tuple(x[0] for x in pkv) if cache.stacked else pkv, cache.prefix_pos_AS)
    seen_BS = pos_BS[:, : cache.visible] if cache.visible else pos_BS  # `KVCache.visible`.
    logits_BTV, (k, v) = decoder(
      variables, tokens_BT, positions_BT, kv, seen_BS, i, prefix, ring=ring
    )
    k, v = ((k,), (v,)) if cache.stacked else (tuple(k), tuple(v))
  cache = cache.replace(
    k=k, v=v, pos_BS=pos_BS, index=i + tokens_BT.shape[1], empty=False, ring_pos_BR=ring_pos_BR
  )
  return logits_BTV, cache


def _ring_call(cache: kv_cache.KVCache, positions_BT):
  """(what `layers.Decoder` takes as `ring`, the ring positions after the call) for a
  cache with window rings (`KVCache.rings`), else (None, None). Rings are written by
  position (`kv_cache.ring_slots`). One token a row attends over its ring once written; a
  block over the ring before it and its own keys (it may displace keys that its first
  tokens still see)."""
  if not cache.rings:
    return None, cache.ring_pos_BR
  positions_BT = positions_BT.astype(jnp.int32)
  slots_BT = kv_cache.ring_slots(positions_BT, cache.ring_pos_BR.shape[1])
  ring_pos_BR = kv_cache.write_ring_pos(cache.ring_pos_BR, positions_BT, slots_BT)
  seen = ring_pos_BR
  if positions_BT.shape[1] > 1:
    seen = jnp.concatenate([cache.ring_pos_BR, positions_BT], axis=1)
  return (cache.rings, slots_BT, seen, cache.prefix_ring_pos_AR), ring_pos_BR


def _apply_paged(decoder, variables, tokens_BT, positions_BT, cache: kv_cache.PagedKVCache):
  """A call on a paged cache, T tokens per row (a decode step, or a block appended in one
  call: `paged.forward`): every layer attends over the rows' pages and the call's own new
  keys, causal by position; the pools are read, not written, and the new keys and values
  come back in `fresh` for `PagedKVCache.commit`."""
  view = kv_cache.PageView(cache.table_NM, cache.pos_PZ, cache.live, block=cache.block)
  kv = (cache.k[0], cache.v[0]) if cache.stacked else (cache.k, cache.v)
  # Ring layers read their rings as they were (`attention.attend_ring`; no slots written).
  ring = (cache.rings, view, cache.ring_pos_NR, None) if cache.rings else None
  logits_BTV, fresh = decoder(variables, tokens_BT, positions_BT, kv, None, view, None, ring=ring)
  return logits_BTV, cache.replace(fresh=fresh)


def _decode(module, variables, *args, sown=None, **kwargs):
  """module.apply(variables, *args, **kwargs); with `sown` (a dict), the "routes"
  collection is also mutable and what the MoE layers sow lands in sown["routes"]."""
  if sown is None:
    return module.apply(variables, *args, **kwargs)
  kwargs["mutable"] = [*kwargs.get("mutable", []), "routes"]
  out, state = module.apply(variables, *args, **kwargs)
  sown["routes"] = state.pop("routes")
  return (out, state) if state else out


def _check_routes(cfg: model_config.ModelConfig, tokens_BT, routes, *, record, router_stats,
                  head_only):  # fmt: skip
  """ValueError unless routes can be replayed or recorded in this forward."""
  if not cfg.n_experts:
    raise ValueError(
      "model.apply(routes=..., record_routes=True) replays or records a mixture of experts' "
      "routing; this model is dense (model.n_experts=0)."
    )
  if head_only or (record and router_stats):
    raise ValueError(
      "model.apply: routes are neither replayed nor recorded by head_only, nor recorded "
      "with router_stats."
    )
  want = (*tokens_BT.shape[:2], cfg.n_layers, cfg.experts_per_token)
  if routes is not None and tuple(routes.shape) != want:
    raise ValueError(f"model.apply(routes=...) must be [B, T, L, k] = {want}, got {routes.shape}.")


def make_model_fn(cfg: model_config.ModelConfig):
  """(params, tokens, positions, cache) -> (logits, cache), the sampler's model protocol."""
  return functools.partial(apply, cfg=cfg)


def positions_from_mask(mask_BT):
  """Position ids that skip padding: cumsum(mask) - 1 on real tokens, -1 on padding."""
  mask_BT = mask_BT.astype(jnp.int32)
  return jnp.where(mask_BT > 0, jnp.cumsum(mask_BT, axis=-1) - 1, -1).astype(jnp.int32)
