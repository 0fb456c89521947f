"""Attention through a Pallas TPU kernel (`model.attention_impl`).

- "xla" (the default, every backend): `attention.attend_causal` and `attention.attend`, plain
  XLA ops.
- "splash": the teacher-forced calls (the update's and the log-prob forwards, the
  reference's, a sampler's prefill: every call without a KV cache) run JAX's splash
  attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`, the block-sparse
  flash attention MaxText runs on TPU), its forward and its backward (dq and dk/dv
  kernels). Scores never exist as a [rows, heads, T, T] array in HBM, and the key blocks
  after each query block are skipped (a causal block mask). TPU only: under a mesh of
  other devices it is an error when the program is traced (`check_platform`).
- "splash_interpret": the same kernel run by Pallas's interpreter on any backend (slow:
  for tests of the kernel path on a CPU).

Why splash: it is maintained with JAX itself (no other dependency), takes grouped-query
attention as it is (query head h reads kv head h // R), has a custom VJP of Pallas kernels
for the backward, and masks padding by segment ids. The older
`pallas.ops.tpu.flash_attention` needs as many kv heads as query heads.

Mapping onto the kernel (`_splash_rows`, per device):
- Layout: the model's queries [B, K, Q = T·R, E] (rows t-major, t·R + r) become
  [B, H = K·R, T, E] with head h = k·R + r, so splash's GQA rule h // R finds kv head k;
  keys [B, K, E, T] are transposed to [B, K, T, E]. The kernel takes one sequence
  ([heads, T, E]); rows are a `jax.vmap` (a grid axis of the kernel).
- Masking: the model's rule (key s visible to query t iff 0 <= pos_s <= pos_t) is
  splash's causal mask (s <= t) and segment ids (1 on real tokens, 0 on padding), given
  the model's contract that positions increase along T on real tokens (as
  `attention.attend_causal` assumes; `model.positions_from_mask` makes them so): a real key
  before a real query then has a smaller position and one after it a larger one. A
  padding query sees only padding keys (itself at least, so no row is empty) and its
  output is set to 0, as `attention.attend` gives it; that also zeroes its gradient.
- Length: T is padded to a multiple of 128 (the kernel's key block is a multiple of the
  TPU's 128 lanes) with padding tokens, cut off after. Blocks of 512, 256 or 128
  positions, the largest that divides the padded T.
- Sharding: under a mesh (`jax.set_mesh`, as `sharding.Layout.context` sets it) the kernel
  runs per device in a `jax.shard_map`, rows split as the logical name
  "activation_batch" and kv heads as "activation_kv_heads" say in the rules table (a
  dimension those mesh axes do not divide stays whole). The kernel itself is
  single-device: the partitioner cannot split a Pallas call.

Sliding windows and soft-caps (Gemma, Mistral): splash's LocalMask and its
attn_logits_soft_cap (`causal`).

What stays XLA, and why: decoding (calls with a KV cache, `attention.attend` and
`attention.attend_shared`). JAX's TPU decode kernels (`paged_attention`,
`ragged_paged_attention`) mask a sequence by one length, slots [0, length) of a paged
cache [K, pages, page_size, E]; our cache masks slot by slot by position, and has holes a
length cannot say: a left-padded prompt's padding slots come first, the refill sampler
writes each row at its own slot (`KVCache.index` [B]), and a shared-prefix cache
(`KVCache.share`) attends over a group's prefix and the row's own slots in one softmax.
Using them would need a paged cache and sampler rewritten around lengths. Splash over
the cache (segment ids from the slots' positions) would be exact only for a one-token
call, pads the R query rows of a kv head to 8 sublanes and cannot skip the empty slots
its segment ids hide; a decode step reads the whole cache either way, which XLA's fused
attention already does at memory speed.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

IMPLS = ("xla", "splash", "splash_interpret")
_LANES = 128  # The kernel's key blocks are multiples of the TPU's lanes.
_BLOCKS = (512, 256, 128)


def check_impl(impl: str) -> None:
  """ValueError naming what was given and what is allowed, unless impl is in IMPLS."""
  if impl not in IMPLS:
    raise ValueError(
      f"model.attention_impl={impl!r}; allowed: 'xla' (every backend, the default), "
      "'splash' (a Pallas flash-attention kernel for the calls without a KV cache; TPU "
      "only), 'splash_interpret' (that kernel in Pallas's interpreter, any backend: slow, "
      "for tests)."
    )


def causal(
  q_BKQE,
  keys_BKET,
  values_BKTE,
  pos_BT,
  *,
  impl: str,
  dtype,
  sliding=None,
  sliding_window: int = 0,
  softcap: float = 0.0,
):
  """`attention.attend_causal`'s result through the kernel `impl` names ("splash" or
  "splash_interpret"): softmax(q kᵀ) v over the call's own keys, key t' visible to query
  t iff 0 <= pos_t' <= pos_t, 0 for a padding query. q is already scaled.

  A sliding-window layer (`sliding`: a layer's bool, traced under nn.scan; None: no layer
  slides) also needs t − t' < sliding_window: splash's LocalMask over the call's columns, which is the positions' rule on real tokens (positions increase one a column
  there; padding is masked by segment ids). Both kernels are built and `lax.cond` picks
  the layer's. softcap c > 0: scores c·tanh(s / c) (splash's attn_logits_soft_cap)."""
  interpret = impl == "splash_interpret"
  mesh = jax.sharding.get_abstract_mesh()
  check_platform(mesh, interpret=interpret)
  cast = lambda x: x.astype(dtype)
  args = (cast(q_BKQE), cast(keys_BKET), cast(values_BKTE), pos_BT)
  body = functools.partial(_splash_rows, interpret=interpret, softcap=softcap)
  if sliding is not None:
    full, local = body, functools.partial(body, local=sliding_window)
    body = lambda *a: jax.lax.cond(sliding, local, full, *a)  # noqa: E731
  if mesh.empty:
    return body(*args)
  heads = local_spec(("activation_batch", "activation_kv_heads", None, None), q_BKQE.shape, mesh)
  rows = local_spec(("activation_batch", None), pos_BT.shape, mesh)
  return jax.shard_map(
    body, mesh=mesh, in_specs=(heads, heads, heads, rows), out_specs=heads, check_vma=False
  )(*args)


def target_platform() -> str:
  """The platform the program being traced is for: the context mesh's devices' (the
  trainer's programs, and an ahead-of-time compile for a TPU topology on a CPU host, are
  traced under one, `sharding.Layout.context`), else this host's default backend. What a
  trace decides by platform (the sampler's decode segments, a bfloat16 model's cache
  dtype, decode attention's p·V form) follows the target, so a TPU program compiled on a
  CPU host is the one a TPU host would build."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else mesh.abstract_device
  return jax.default_backend() if device is None else device.platform


def check_platform(mesh, *, interpret: bool, setting: str = "attention_impl", impl: str = "splash"):
  """ValueError when a Pallas TPU kernel (model.<setting>=<impl>; `moe` uses it for
  megablox) is in a program for another platform than TPU, as far as tracing can
  tell: the platform of the context mesh's devices (the trainer's programs, and an
  ahead-of-time compile for a TPU topology on a CPU host, are traced under one,
  `sharding.Layout.context`). Without a mesh the target is unknown while tracing (an
  abstract trace such as `memory.plan`'s is fine on any host); a program lowered for a
  CPU then fails in Pallas ("Only interpret mode is supported on CPU backend")."""
  device = None if mesh.empty else mesh.abstract_device
  if interpret or device is None or device.platform == "tpu":
    return
  raise ValueError(
    f"model.{setting}={impl!r} runs a Pallas TPU kernel, but this program is for "
    f"{device.platform!r} devices. Use 'xla' there (the default), or '{impl}_interpret' "
    "to run the kernel in Pallas's interpreter (slow: tests)."
  )


def local_spec(names, shape, mesh) -> jax.sharding.PartitionSpec:
  """The mesh axes of logical `names` (the rules in scope), None where their size does not
  divide the dimension (e.g. a held-out batch the mesh does not divide: replicated)."""
  spec = nn.logical_to_mesh_axes(names)
  out = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True):
    group = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    known = group and all(a in mesh.shape for a in group)
    out.append(axes if known and dim % math.prod(mesh.shape[a] for a in group) == 0 else None)
  return jax.sharding.PartitionSpec(*out)


def _splash_rows(
  q_BKQE, keys_BKET, values_BKTE, pos_BT, *, interpret: bool, softcap: float = 0.0, local: int = 0
):
  """The kernel over B rows on one device; see the module docstring for the mapping."""
  from jax.experimental.pallas.ops.tpu import splash_attention  # 0.17 s: only when used.

  B, K, Q, E = q_BKQE.shape
  T = pos_BT.shape[1]
  R, Tp = Q // T, -(-T // _LANES) * _LANES
  q_BHTE = jnp.swapaxes(q_BKQE.reshape(B, K, T, R, E), 2, 3).reshape(B, K * R, T, E)
  pad = lambda x_BNTE: jnp.pad(x_BNTE, ((0, 0), (0, 0), (0, Tp - T), (0, 0)))
  seg_BT = (jnp.pad(pos_BT, ((0, 0), (0, Tp - T)), constant_values=-1) >= 0).astype(jnp.int32)
  kernel = _kernel(K * R, Tp, interpret, softcap=softcap, local=local)

  def one_row(q_HTE, k_KTE, v_KTE, seg_T):
    return kernel(q_HTE, k_KTE, v_KTE, segment_ids=splash_attention.SegmentIds(seg_T, seg_T))

  out_BHTE = jax.vmap(one_row)(
    pad(q_BHTE), pad(jnp.swapaxes(keys_BKET, 2, 3)), pad(values_BKTE), seg_BT
  )
  out_BHTE = jnp.where(seg_BT[:, None, :, None] > 0, out_BHTE, 0)[:, :, :T]
  return jnp.swapaxes(out_BHTE.reshape(B, K, R, T, E), 2, 3).reshape(B, K, Q, E)


def _kernel(H: int, T: int, interpret: bool, *, softcap: float = 0.0, local: int = 0):
  """Splash attention for H query heads over T positions (T a multiple of 128), causal,
  within `local` columns when local > 0 (the query and local − 1 keys before it),
  soft-capped when softcap > 0.
  Built in the trace that uses it: its mask arrays are that program's constants (the
  numpy work behind them is cached by splash: `_process_mask`, an lru_cache)."""
  from jax.experimental.pallas.ops.tpu import splash_attention

  b = next(b for b in _BLOCKS if T % b == 0)
  sizes = splash_attention.BlockSizes(
    block_q=b, block_kv=b, block_kv_compute=b,
    block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b,
    block_q_dq=b, block_kv_dq=b,
  )  # fmt: skip
  if local:
    one = splash_attention.LocalMask((T, T), window_size=(local - 1, 0), offset=0)
  else:
    one = splash_attention.CausalMask((T, T))
  mask = splash_attention.MultiHeadMask([one] * H)
  return splash_attention.make_splash_mha(
    mask,
    block_sizes=sizes,
    head_shards=1,
    q_seq_shards=1,
    interpret=interpret,
    attn_logits_soft_cap=softcap or None,
  )
