"""The sampler's KV cache: per-layer keys and values with each slot's position, repeated
or shared across a group's rows (`KVCache`), and an empty one (`init_cache`).

Sliding-window layers keep a ring of min(S, W) slots instead of S (`KVCache.rings`): a
query at position p sees keys p − W + 1 .. p only, so a ring indexed by position holds all
it can see, and the cache of a Gemma 3 layout (5 of 6 layers sliding) or a Mistral one
grows with the window, not the rollout. Written by position, not by column: token at
position p goes to slot p mod R (`ring_slots`), padding nowhere, so left padding, an
episode's padded observation block or a row that feeds nothing never costs a ring slot."""

from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models import kernels, model_config

Params = Any


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

  Rings (`rings[l]`, the sliding layers of an unstacked cache, `init_cache(rings=True)`):
  layer l's buffers hold R = min(S, window) slots, R the same for every ring layer, whose
  positions are ring_pos_BR; a token at position p lies in slot p mod R (`ring_slots`).
  A ring smaller than the window never wraps (its part holds at most R positions); `grow`
  re-slots it. With a shared prefix, the prefix's ring layers are rings too, their
  positions prefix_ring_pos_AR.
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  pos_BS: jax.Array
  index: jax.Array  # int32 scalar: the next slot to write; or [B]: one per row (decode).
  empty: bool = flax.struct.field(pytree_node=False, default=False)
  stacked: bool = flax.struct.field(pytree_node=False, default=False)
  # A call attends over slots [0, visible) only (0: all of them), static: the calls of a
  # chunked prefill (`sampling.prefill_cache`), whose slots after their own are empty.
  visible: int = flax.struct.field(pytree_node=False, default=0)
  prefix_k: tuple[jax.Array, ...] = ()
  prefix_v: tuple[jax.Array, ...] = ()
  prefix_pos_AS: jax.Array | None = None
  ring_pos_BR: jax.Array | None = None
  prefix_ring_pos_AR: jax.Array | None = None
  rings: tuple[bool, ...] = flax.struct.field(pytree_node=False, default=())
  window: int = flax.struct.field(pytree_node=False, default=0)

  def repeat(self, n: int) -> KVCache:
    """Each row repeated n times, consecutively: row b -> rows b*n .. b*n+n-1."""
    if self.prefix_pos_AS is not None:
      raise ValueError("KVCache.repeat: this cache is already shared (`share`).")
    rep = functools.partial(jnp.repeat, repeats=n, axis=1 if self.stacked else 0)
    ring = self.ring_pos_BR
    return self.replace(
      k=tuple(map(rep, self.k)),
      v=tuple(map(rep, self.v)),
      pos_BS=jnp.repeat(self.pos_BS, n, axis=0),
      ring_pos_BR=None if ring is None else jnp.repeat(ring, n, axis=0),
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
    ring = min(own, self.window)
    empty = lambda x, slot_axis, slots: jnp.broadcast_to(
      zero,
      tuple(
        d * n if a == b else slots if a == x.ndim + slot_axis else d for a, d in enumerate(x.shape)
      ),
    )
    slots = [ring if r else own for r in (self.rings or (False,) * len(self.k))]
    rows = self.pos_BS.shape[0] * n
    return KVCache(
      k=tuple(empty(k, -1, m) for k, m in zip(self.k, slots)),  # [..., E, S]
      v=tuple(empty(v, -2, m) for v, m in zip(self.v, slots)),  # [..., S, E]
      pos_BS=jnp.full((rows, own), -1, jnp.int32),
      index=jnp.zeros((), jnp.int32),
      stacked=self.stacked,
      prefix_k=self.k,
      prefix_v=self.v,
      prefix_pos_AS=self.pos_BS,
      ring_pos_BR=None if not self.rings else jnp.full((rows, ring), -1, jnp.int32),
      prefix_ring_pos_AR=self.ring_pos_BR,
      rings=self.rings,
      window=self.window,
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
    rings = self.rings or (False,) * len(self.k)
    ring_k, ring_v, ring_pos = self.grown_rings(own=self.pos_BS.shape[-1] + extra)
    return self.replace(
      k=tuple(rk if r else pad(k, -1) for k, rk, r in zip(self.k, ring_k, rings)),  # [..., E, S]
      v=tuple(rv if r else pad(v, -2) for v, rv, r in zip(self.v, ring_v, rings)),  # [..., S, E]
      pos_BS=jnp.pad(self.pos_BS, ((0, 0), (0, extra)), constant_values=-1),
      ring_pos_BR=ring_pos,
    ).constrain()

  def unring(self) -> KVCache:
    """The same cache with every layer in S column slots (`rings` off): a ring layer's key
    for column c is its ring's slot pos_c mod R where that slot holds pos_c, else zeros. A
    position a ring no longer holds is outside every later query's window (it keeps the
    last R >= min(window, positions) of its row), so the result attends as the ring does.
    The paged sampler cuts this layout into pages where window rings would hold more
    (`paged.keeps_rings`)."""
    if not self.rings:
      return self
    if self.prefix_pos_AS is not None:
      raise ValueError("KVCache.unring: a shared cache (`share`) keeps its rings.")
    R = self.ring_pos_BR.shape[-1]
    slot_BS = jnp.where(self.pos_BS >= 0, self.pos_BS % R, 0)
    held_BS = (self.pos_BS >= 0) & (
      jnp.take_along_axis(self.ring_pos_BR, slot_BS, 1) == self.pos_BS
    )

    def columns(buf, axis):  # buf [B, K, E, R] (axis 3) or [B, K, R, E] (axis 2).
      shape = [buf.shape[0], 1, 1, 1]
      shape[axis] = slot_BS.shape[1]
      idx, held = slot_BS.reshape(shape), held_BS.reshape(shape)
      return jnp.where(held, jnp.take_along_axis(buf, idx, axis=axis), 0).astype(buf.dtype)

    k = tuple(columns(b, 3) if r else b for b, r in zip(self.k, self.rings))
    v = tuple(columns(b, 2) if r else b for b, r in zip(self.v, self.rings))
    return self.replace(k=k, v=v, ring_pos_BR=None, rings=(), window=0).constrain()

  def grown_rings(self, *, own: int):
    """(keys, values, ring positions) with the ring layers' buffers at min(own, window)
    slots (`grow`, and a paged cache's rings: `paged.pool`; a layer without a ring is left
    as it is): a ring that was smaller than the window (so never wrapped) re-slotted by
    position into the larger one (slot p mod R changes with R); a full-size ring kept."""
    if not self.rings:
      return self.k, self.v, self.ring_pos_BR
    old, new = self.ring_pos_BR.shape[-1], min(own, self.window)
    if new == old:
      return self.k, self.v, self.ring_pos_BR
    slots_BR = jnp.where(self.ring_pos_BR >= 0, self.ring_pos_BR % new, new)
    blank = lambda x, axis: jnp.zeros(x.shape[:axis] + (new,) + x.shape[axis + 1 :], x.dtype)
    k = tuple(
      write_ring(blank(b, 3), b, slots_BR, slot_axis=-1) if r else b
      for b, r in zip(self.k, self.rings)
    )
    v = tuple(
      write_ring(blank(b, 2), b, slots_BR, slot_axis=-2) if r else b
      for b, r in zip(self.v, self.rings)
    )
    pos = write_ring_pos(
      jnp.full((slots_BR.shape[0], new), -1, jnp.int32), self.ring_pos_BR, slots_BR
    )
    return k, v, pos

  def constrain(self) -> KVCache:
    """Sharding constraints from the logical names model_config.CACHE_K / model_config.CACHE_V (rows over the
    batch axes, kv heads over `tensor` by the default rules); no-op without rules."""
    lead = ("layers",) if self.stacked else ()
    c = lambda names: lambda x: nn.with_logical_constraint(x, (*lead, *names))
    pos = lambda x: nn.with_logical_constraint(x, ("activation_batch", "activation_cache"))
    return self.replace(
      k=tuple(map(c(model_config.CACHE_K), self.k)),
      v=tuple(map(c(model_config.CACHE_V), self.v)),
      pos_BS=pos(self.pos_BS),
      prefix_k=tuple(map(c(model_config.CACHE_K), self.prefix_k)),
      prefix_v=tuple(map(c(model_config.CACHE_V), self.prefix_v)),
      prefix_pos_AS=None if self.prefix_pos_AS is None else pos(self.prefix_pos_AS),
      ring_pos_BR=None if self.ring_pos_BR is None else pos(self.ring_pos_BR),
      prefix_ring_pos_AR=None if self.prefix_ring_pos_AR is None else pos(self.prefix_ring_pos_AR),
    )


def ring_slots(positions_BT, size: int):
  """The ring slot of each of a call's tokens, [B, T] int32: p mod size for a token at
  position p, and `size` (out of range: not written) for padding (p = −1) and for a token
  that a later one of its row in the same call displaces (p <= its row's last position −
  size): the kept tokens' slots are distinct."""
  last_B1 = jnp.max(positions_BT, axis=1, keepdims=True)
  keep_BT = (positions_BT >= 0) & (positions_BT > last_B1 - size)
  return jnp.where(keep_BT, positions_BT % size, size).astype(jnp.int32)


def write_ring(buf, new, slots_BT, *, slot_axis: int):
  """buf [B, ..., R, ...] with new [B, ..., T, ...] written at each row's slots (slot_axis:
  the slots' axis, negative; out-of-range slots dropped): a ring's keys or values."""

  def row(b, n, s):
    at = (slice(None),) * (b.ndim + slot_axis) + (s,)
    return b.at[at].set(n.astype(b.dtype), mode="drop")

  return jax.vmap(row)(buf, new, slots_BT)


def write_and_read(cache_kv, k_BKET, v_BKTE, cache_pos_BS, index, *, ring: bool = False):
  """(the layer's buffers after a call with a cache, (keys, values, positions) it attends
  over) for this call's keys [B, K, E, T] and values [B, K, T, E] (`layers.Attention`).

  - A window ring (`KVCache.rings`; index: the call's ring slots [B, T], `ring_slots`):
    written at those slots; one token a row attends over the ring once written, a block
    over the ring as it was and its own keys (cache_pos_BS the positions of both).
  - A paged cache (index a `PageView`; its ring layers too, ring=True): nothing written,
    the call's keys and values come back as they are (`PagedKVCache.fresh`), and keys None
    (`attention.attend_paged`, `attend_ring`).
  - Else written in place at column `index` (a scalar, or [B]: one per row, the refill
    sampler's), then the buffers' first cache_pos_BS.shape[1] slots are attended over
    (fewer than the buffers hold: `KVCache.visible`, a chunked prefill's call)."""
  if isinstance(index, PageView):  # Pages and rings alike, committed later.
    return (k_BKET, v_BKTE), None
  if ring:
    new_kv = (
      write_ring(cache_kv[0], k_BKET, index, slot_axis=-1),
      write_ring(cache_kv[1], v_BKTE, index, slot_axis=-2),
    )
    if k_BKET.shape[-1] == 1:
      return new_kv, (*new_kv, cache_pos_BS)
    before = (
      jnp.concatenate([cache_kv[0], k_BKET.astype(cache_kv[0].dtype)], axis=-1),
      jnp.concatenate([cache_kv[1], v_BKTE.astype(cache_kv[1].dtype)], axis=2),
    )
    return new_kv, (*before, cache_pos_BS)
  write = lambda buf, new, at: jax.lax.dynamic_update_slice(buf, new.astype(buf.dtype), at)
  if jnp.ndim(index) == 1:
    new_kv = (
      jax.vmap(lambda b, n, i: write(b, n, (0, 0, i)))(cache_kv[0], k_BKET, index),
      jax.vmap(lambda b, n, i: write(b, n, (0, i, 0)))(cache_kv[1], v_BKTE, index),
    )
  else:
    new_kv = (
      write(cache_kv[0], k_BKET, (0, 0, 0, index)),
      write(cache_kv[1], v_BKTE, (0, 0, index, 0)),
    )
  n = 0 if cache_pos_BS is None else cache_pos_BS.shape[1]
  if n < new_kv[0].shape[-1]:  # Only then: the decode loop's HLO stays as it was.
    return new_kv, (new_kv[0][..., :n], new_kv[1][:, :, :n], cache_pos_BS)
  return new_kv, (*new_kv, cache_pos_BS)


def write_ring_pos(pos_BR, positions_BT, slots_BT):
  """A ring's slot positions [B, R] with positions_BT written at slots_BT (`write_ring`)."""
  row = lambda p, n, s: p.at[s].set(n.astype(p.dtype), mode="drop")
  return jax.vmap(row)(pos_BR, positions_BT, slots_BT)


def cache_dtype(cfg: model_config.ModelConfig):
  """The KV cache's dtype: the compute dtype, except a bfloat16 model on XLA:CPU, whose
  cache holds the same bfloat16-rounded keys and values in float32 (`_attend`). XLA:CPU
  runs a bfloat16 batched matmul on float32 copies of its operands, so a bfloat16 cache
  was converted at every decode step: the anchor model's sampler (8 layers, 128 rows,
  64 + 128 tokens; one sitting on a 2-core Intel Xeon with AMX) took 14.0 s a call in
  bfloat16 against 10.5 s in float32, and 7.4 s with the float32 cache. Decided by the
  traced program's platform (`kernels.target_platform`), as `_pv_by_reduce` is (the
  memory plan, made for an accelerator, does not count it)."""
  if cfg.compute_dtype == jnp.bfloat16 and kernels.target_platform() == "cpu":
    return jnp.float32
  return cfg.compute_dtype


def cache_rings(cfg: model_config.ModelConfig) -> tuple[bool, ...]:
  """Which layers of an unstacked cache keep a window-sized ring: the sliding ones (`rings`
  in `KVCache`); () when none slides, or with scan_layers (one stacked buffer for all)."""
  return () if cfg.scan_layers or not any(cfg.sliding_layers) else cfg.sliding_layers


def init_cache(
  cfg: model_config.ModelConfig, batch_size: int, max_len: int, *, rings: bool = True
) -> KVCache:
  """An empty cache of max_len slots: keys [B, K, E, S], values [B, K, S, E] per layer,
  in `cache_dtype`. With `rings` (and unstacked layers), each sliding-window layer keeps
  min(S, window) slots (`cache_rings`); rings=False: S slots for every layer (a paged
  sampler's prompt cache, cut into pages)."""
  ring = cache_rings(cfg) if rings else ()
  R = min(max_len, cfg.sliding_window)
  K, E, B = cfg.n_kv_heads, cfg.head_dim, batch_size
  dtype = cache_dtype(cfg)
  if cfg.scan_layers:
    k, v = (
      (jnp.zeros((cfg.n_layers, *shape), dtype),)
      for shape in ((B, K, E, max_len), (B, K, max_len, E))
    )
  else:
    slots = [R if r else max_len for r in (ring or (False,) * cfg.n_layers)]
    k = tuple(jnp.zeros((B, K, E, s), dtype) for s in slots)
    v = tuple(jnp.zeros((B, K, s, E), dtype) for s in slots)
  return KVCache(
    k=k,
    v=v,
    pos_BS=jnp.full((batch_size, max_len), -1, jnp.int32),
    index=jnp.zeros((), jnp.int32),
    empty=True,
    stacked=cfg.scan_layers,
    ring_pos_BR=jnp.full((batch_size, R), -1, jnp.int32) if ring else None,
    rings=ring,
    window=cfg.sliding_window if ring else 0,
  ).constrain()


@flax.struct.dataclass
class PagedKVCache:
  """Keys/values in fixed-size pages of Z slots from one pool per layer, addressed per row
  by a page table (`sampler.kv_layout="paged"`, `paged`): memory follows the pages taken,
  not rows × the longest possible row.

  k holds one [pages + 1, K, E, Z] pool per layer (stacked [L, ...] with scan_layers), v
  one [pages + 1, K, Z, E]; pos_PZ [pages + 1, Z] each slot's position id (-1: empty). The
  last page is the null page: never written, all positions -1; unassigned table entries
  point at it. Row n's logical slot s lies in page table_NM[n, s // Z] at offset s % Z.
  Pages may be shared: the G rows of a group point at their prompt's pages (read only).

  A call (decode: one token per row; an episode's observation: a block of T) reads the
  pools and leaves them as they are: each row attends over its pages in blocks of
  `block` pages, up to the page holding slot live − 1 (live: a dynamic bound on every
  row's slots, so early steps read few pages), and over the call's own new keys
  (`attention.attend_paged`). The call's keys and values come back in `fresh` (keys
  [N, K, E, T], values [N, K, T, E] per layer, stacked with scan_layers), and `commit`
  writes them, and the positions, at each row's slots slot_N + t (-1: nowhere, an ended
  row; a column at position -1 is not written). The
  sampler commits once per step, outside the branches that run the model on the live
  rows (`paged`), so XLA updates the pools in place instead of copying them through a
  conditional (XLA:CPU, 40 rows × 8,192 tokens: 57.7 MB of temporaries with the write
  inside the branches, the pool twice, against 32.0 MB). The pool and the table belong
  to that sampler: it takes pages as rows grow and returns them when they end.

  Window rings (`rings[l]`, the sliding layers of an unstacked cache, as in `KVCache`):
  layer l holds no pool but a ring per row, keys [N, K, E, R] and values [N, K, R, E]
  with positions ring_pos_NR [N, R] (R = min(the row's slots, window), the same for every
  ring layer; slot p mod R, `ring_slots`), so those layers' memory follows the window, not
  the pages. A call attends over the ring as it was and its own keys
  (`attention.attend_ring`), and `commit` writes them in. The table, and the pages it
  points at, serve the other layers; rows move with their rings (`rows`, `put_rows`).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  pos_PZ: jax.Array
  table_NM: jax.Array
  slot_N: jax.Array
  live: jax.Array  # int32 scalar
  fresh: tuple = ()  # (keys, values) of the last call, not yet committed.
  ring_pos_NR: jax.Array | None = None
  stacked: bool = flax.struct.field(pytree_node=False, default=False)
  block: int = flax.struct.field(pytree_node=False, default=8)
  rings: tuple[bool, ...] = flax.struct.field(pytree_node=False, default=())

  @property
  def page_size(self) -> int:
    return self.pos_PZ.shape[-1]

  @property
  def null_page(self) -> int:
    return self.pos_PZ.shape[0] - 1

  def _ring_layers(self) -> tuple[bool, ...]:
    return self.rings or (False,) * len(self.k)

  def rows(self, idx_R) -> PagedKVCache:
    """The cache as rows idx_R see it, in that order (indices clipped to the rows): their
    table rows, write slots and rings; the pools are shared, not copied."""
    idx_R = jnp.clip(idx_R, 0, self.table_NM.shape[0] - 1)
    pick = lambda bufs: tuple(b[idx_R] if r else b for b, r in zip(bufs, self._ring_layers()))
    ring = self.ring_pos_NR
    return self.replace(
      k=pick(self.k), v=pick(self.v), table_NM=self.table_NM[idx_R], slot_N=self.slot_N[idx_R],
      ring_pos_NR=None if ring is None else ring[idx_R],
    ).constrain()  # fmt: skip

  def put_rows(self, idx_R, view: PagedKVCache, *, tables: bool = False) -> PagedKVCache:
    """This cache after a call on the view `rows(idx_R)`: the view's pools and positions,
    its rings (and, with `tables`, its table rows) put back at rows idx_R (out of range:
    not put back; the rows put back must be distinct); the write slots stay this cache's."""
    n = self.table_NM.shape[0]
    at = jnp.where((idx_R >= 0) & (idx_R < n), idx_R, n)
    put = lambda full, part: full.at[at].set(part, mode="drop")  # noqa: E731
    layers = self._ring_layers()
    ring = self.ring_pos_NR
    return view.replace(
      k=tuple(put(f, b) if r else b for f, b, r in zip(self.k, view.k, layers)),
      v=tuple(put(f, b) if r else b for f, b, r in zip(self.v, view.v, layers)),
      ring_pos_NR=None if ring is None else put(ring, view.ring_pos_NR),
      table_NM=put(self.table_NM, view.table_NM) if tables else self.table_NM,
      slot_N=self.slot_N,
    ).constrain()

  def constrain(self) -> PagedKVCache:
    """Sharding constraints on the window rings, which are per row: keys and values as a
    dense cache's (`model_config.CACHE_K` / `CACHE_V`), positions over the batch axes. The
    pools are one array each, left to XLA (every device holds them: `paged`)."""
    if not self.rings:
      return self
    c = lambda names: lambda x: nn.with_logical_constraint(x, names)  # noqa: E731
    layers = self._ring_layers()
    return self.replace(
      k=tuple(c(model_config.CACHE_K)(b) if r else b for b, r in zip(self.k, layers)),
      v=tuple(c(model_config.CACHE_V)(b) if r else b for b, r in zip(self.v, layers)),
      ring_pos_NR=c(("activation_batch", "activation_cache"))(self.ring_pos_NR),
    )

  def commit(self, positions) -> PagedKVCache:
    """The pools with `fresh` (the last call's T keys and values a row: keys [N, K, E, T],
    values [N, K, T, E] per layer) written at each row's slots slot_N + t, and the
    positions ([N, T], or [N] when T = 1) there. A row with slot -1, or a column at
    position -1 (padding), writes nothing (its page index is out of range, which the
    scatters' mode="drop" skips)."""
    Z = self.page_size
    new_k, new_v = self.fresh
    T = jax.tree.leaves(new_k)[0].shape[-1]  # [N, K, E, T] a layer; [L, N, K, E, T] stacked.
    pos_NT = positions.reshape(positions.shape[0], -1)
    slot_NT = jnp.maximum(self.slot_N, 0)[:, None] + jnp.arange(T)[None, :]
    page_NT = jnp.take_along_axis(
      self.table_NM, jnp.minimum(slot_NT // Z, self.table_NM.shape[1] - 1), axis=1
    )
    writes_NT = (self.slot_N[:, None] >= 0) & (pos_NT >= 0)
    page_NT = jnp.where(writes_NT, page_NT, self.pos_PZ.shape[0])
    off_NT = slot_NT % Z
    if self.rings:
      return self._commit_rings(new_k, new_v, jnp.where(writes_NT, pos_NT, -1), page_NT, off_NT)
    if self.stacked:  # [L, pages, K, E, Z] <- [L, N, K, E, T] at (:, page, :, :, offset).
      k = (self.k[0].at[:, page_NT, :, :, off_NT].set(jnp.transpose(new_k, (1, 4, 0, 2, 3)).astype(self.k[0].dtype), mode="drop"),)  # fmt: skip
      v = (self.v[0].at[:, page_NT, :, off_NT].set(jnp.transpose(new_v, (1, 3, 0, 2, 4)).astype(self.v[0].dtype), mode="drop"),)  # fmt: skip
    else:  # [pages, K, E, Z] <- [N, K, E, T] at (page, :, :, offset): [N, T, K, E] values.
      k = tuple(b.at[page_NT, :, :, off_NT].set(jnp.transpose(n, (0, 3, 1, 2)).astype(b.dtype), mode="drop") for b, n in zip(self.k, new_k))  # fmt: skip
      v = tuple(b.at[page_NT, :, off_NT].set(jnp.swapaxes(n, 1, 2).astype(b.dtype), mode="drop") for b, n in zip(self.v, new_v))  # fmt: skip
    pos_PZ = self.pos_PZ.at[page_NT, off_NT].set(pos_NT.astype(jnp.int32), mode="drop")
    return self.replace(k=k, v=v, pos_PZ=pos_PZ, fresh=())

  def _commit_rings(self, new_k, new_v, pos_NT, page_NT, off_NT) -> PagedKVCache:
    """`commit` of a cache with window rings (unstacked): a ring layer's keys and values
    at each row's ring slots (`ring_slots` of the positions written, pos_NT: -1 where
    nothing is), the other layers' in their pages. Rings exist only unstacked
    (`cache_rings`)."""
    assert not self.stacked, "window rings are kept by unstacked caches only (`cache_rings`)"
    ring_NT = ring_slots(pos_NT, self.ring_pos_NR.shape[-1])
    # One scatter at (row, slot) pairs, as the pools' (a vmapped per-row write was not
    # done in place: the decode loop kept a second copy of every ring).
    row_NT = jnp.broadcast_to(jnp.arange(pos_NT.shape[0])[:, None], pos_NT.shape)
    k, v = [], []
    for kb, vb, nk, nv, r in zip(self.k, self.v, new_k, new_v, self.rings):
      if r:
        k.append(kb.at[row_NT, :, :, ring_NT].set(jnp.transpose(nk, (0, 3, 1, 2)).astype(kb.dtype), mode="drop"))  # fmt: skip
        v.append(vb.at[row_NT, :, ring_NT].set(jnp.swapaxes(nv, 1, 2).astype(vb.dtype), mode="drop"))  # fmt: skip
      else:
        k.append(kb.at[page_NT, :, :, off_NT].set(jnp.transpose(nk, (0, 3, 1, 2)).astype(kb.dtype), mode="drop"))  # fmt: skip
        v.append(vb.at[page_NT, :, off_NT].set(jnp.swapaxes(nv, 1, 2).astype(vb.dtype), mode="drop"))  # fmt: skip
    return self.replace(
      k=tuple(k), v=tuple(v), fresh=(),
      pos_PZ=self.pos_PZ.at[page_NT, off_NT].set(pos_NT.astype(jnp.int32), mode="drop"),
      ring_pos_NR=write_ring_pos(self.ring_pos_NR, pos_NT, ring_NT),
    ).constrain()  # fmt: skip


@flax.struct.dataclass
class PageView:
  """What each layer's attention reads of a `PagedKVCache` in a call (`layers.Attention`):
  the rows' page tables, the pool's positions and the live-slot bound."""

  table_NM: jax.Array
  pos_PZ: jax.Array
  live: jax.Array
  block: int = flax.struct.field(pytree_node=False, default=8)
