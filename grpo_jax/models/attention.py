"""Attention math of the policy: rotary embeddings and masked attention over a cache, a
causal block schedule, or a prefix shared by a group of rows (pure functions; the layer is
`layers.Attention`).

Masking rule (`model`): a query at position p sees keys at positions 0 <= q <= p, and
on a sliding-window layer only p − window < q (`layer_windows`); padding has position -1.
Scores may be soft-capped, c·tanh(s / c), before the mask (Gemma 2). Shape letters as in `model`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import kernels, model_config

Params = Any


def layer_windows(cfg: model_config.ModelConfig) -> np.ndarray | None:
  """Each layer's window [L] (int32; `FULL_WINDOW` on full-attention layers), or None when
  no layer slides (the mask then has no window term at all)."""
  sliding = cfg.sliding_layers
  if not any(sliding):
    return None
  return np.array(
    [cfg.sliding_window if s else model_config.FULL_WINDOW for s in sliding], np.int32
  )


def layer_inv_freq(cfg: model_config.ModelConfig) -> np.ndarray | None:
  """Each layer's rotary inverse frequencies [L, E/2] (float32) when sliding layers have a
  rope of their own (`rope_local_theta`, Gemma 3: plain theta^(-2i/E), no scaling), else
  None: every layer uses `rope_inv_freq(cfg)`."""
  if not cfg.rope_local_theta or not any(cfg.sliding_layers):
    return None
  E = cfg.head_dim
  local = cfg.rope_local_theta ** (-np.arange(0, E, 2, dtype=np.float64) / E)
  full = rope_inv_freq(cfg)
  return np.stack([local if s else full for s in cfg.sliding_layers]).astype(np.float32)


def rope_inv_freq(cfg: model_config.ModelConfig) -> np.ndarray:
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
  """Whether `attend` computes p·V as sum_s(p_qs V_se) (a fused loop) on this backend.

  Measured on a 2-core Xeon (XLA:CPU with YNNPACK), 8 layers of decode attention:
  [256 rows, 4 kv heads, Q = 2, S = 191, E = 64] takes 38 ms as a multiply-reduce and
  53 ms as a batched matmul (1024 matmuls of [2, 191] x [191, 64]); Q = 3: 44 vs 58 ms.
  Past ~2^25 product elements the fused loop falls off a cliff (Q = 4 with 256 rows:
  157 vs 52 ms; 1024 rows with Q = 2: 376 vs 158 ms), hence the size bound. Both forms
  compute the same sum in float32; GPUs and TPUs always take the matmul.
  """
  return (
    kernels.target_platform() == "cpu"
    and Q <= _PV_REDUCE_MAX_Q
    and B * K * Q * S * E <= _PV_REDUCE_MAX_ELEMENTS
  )


def attend(
  q_BKQE, q_pos_BQ, keys_BKES, values_BKSE, key_pos_BS, *, dtype, window=None, softcap=0.0
):
  """softmax(q k^T) v where key slot s is visible to query q iff 0 <= pos_s <= pos_q
  (and pos_q − pos_s < window, with a window: `_visible`). softcap c > 0: the scores are
  c·tanh(s / c) before the mask (Gemma 2's attention-logit soft-capping).

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
  s_BKQS = _capped(_scores(q_BKQE, keys_BKES, mm), softcap)
  valid = _visible(q_pos_BQ[:, None, :, None], key_pos_BS[:, None, None, :], window)
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


def query_step(length: int, query_block: int) -> int:
  """The query tokens a causal block of `length` attends at a time: all of them when
  query_block is 0 or length is at most 2·query_block (below that the steps' loop and
  recomputation cost more time than their memory saves: see `attend_causal`); else
  length cut into n = ⌈length / query_block⌉ near-equal steps, ⌈length / n⌉ tokens each
  (padding under n tokens)."""
  if query_block <= 0 or length <= 2 * query_block:
    return length
  n = -(-length // query_block)
  return -(-length // n)


def causal_score_entries(T: int, query_block: int = 0, *, step_buffers: int = 1) -> int:
  """Score entries per (row, query head) of a call of T positions: sum (b − a)·b over the
  blocks attended whole, plus step_buffers × the largest step·b of the blocks attended
  in steps (`attend_causal` with query_block: one step's scores live at a time)."""
  whole, stepped = 0, 0
  for a, b in causal_blocks(T):
    step = query_step(b - a, query_block)
    if step < b - a:
      stepped = max(stepped, step * b)
    else:
      whole += (b - a) * b
  return whole + step_buffers * stepped


def attend_causal(
  q_BKQE, q_pos_BQ, keys_BKET, values_BKTE, pos_BT, *, dtype, window=None, softcap=0.0,
  query_block: int = 0,
):  # fmt: skip
  """`attend` of a call over its own T keys, one query block at a time (`causal_blocks`).

  Query rows are t-major (row t·R + r), so block [a, b) is rows [a·R, b·R), and it attends
  keys [0, b) only. Exact when positions increase along T on real tokens, as
  `positions_from_mask` makes them (the model's padding convention): a key after a query
  then has a larger position or −1, so it is invisible to it, and the softmax over keys
  [0, b) is the softmax over all T (up to the order of the float32 sums).

  A block longer than 2·query_block tokens (query_block > 0; rows past 8·query_block
  tokens) attends `query_step` of its tokens at a time over its keys
  (`attend_query_blocks`: a `lax.map` under `jax.checkpoint`), so one step's scores live
  at a time, in the forward and in the backward, which recomputes them. XLA otherwise
  keeps every block's score buffers live together in the backward. Measured on this
  2-core CPU (float32, the tiny model, one row, scanned and rematerialised layers, a
  forward and backward, one sitting), whole blocks against steps of at most 512 tokens:
  4,112 tokens 863 MB of temporaries, 1.30-1.48 s, against 87 MB, 1.00-1.19 s; 8,208
  tokens 3,403 MB, 4.85-4.93 s, against 200 MB, 5.41-5.80 s. At 2,064 tokens steps would
  cost 0.26-0.32 s against 0.21-0.22 s (179 MB against 35 MB), hence whole blocks there.
  """
  T = pos_BT.shape[1]
  R = q_BKQE.shape[2] // T
  kw = dict(dtype=dtype, window=window, softcap=softcap)
  outs = []
  for a, b in causal_blocks(T):
    args = (
      q_BKQE[:, :, a * R : b * R],
      q_pos_BQ[:, a * R : b * R],
      keys_BKET[..., :b],
      values_BKTE[:, :, :b],
      pos_BT[:, :b],
    )
    step = query_step(b - a, query_block)
    if step < b - a:
      outs.append(attend_query_blocks(*args, parts=1, block=step * R, **kw))
    else:
      outs.append(attend(*args, **kw))
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)


def attend_query_blocks(
  q_BKQE, q_pos_BQ, keys_BKES, values_BKSE, key_pos_BS, *, parts, block, dtype, window=None,
  softcap=0.0, split=lambda x: x,
):  # fmt: skip
  """`attend` of Q query rows held in `parts` contiguous parts (the devices of context
  parallelism, rows t-major), `block` rows of every part at a time: a `lax.map` over
  n = ⌈Q / (parts · block)⌉ steps, step j taking each part's j-th block, under
  `jax.checkpoint`. The scores live one step at a time, [B, K, parts · block, S] (block × S
  on each device), in the forward and in the backward, which recomputes a step's scores
  instead of keeping them: memory-efficient attention in the query dimension (Rabe and
  Staats 2021); every block sees all S keys, so it is `attend` row for row. A part's rows
  are padded to n · block with position −1 (queries that see nothing), then cut off.
  `split` constrains a step's [B, K, parts · block, ...] arrays to the parts' devices."""
  B, K, Q, E = q_BKQE.shape
  local = Q // parts
  n = -(-local // block)
  pad = n * block - local

  def steps(x, axis, fill):  # Q at `axis` -> [n, ..., parts · block, ...]: step j's rows.
    lead, rest = x.shape[:axis], x.shape[axis + 1 :]
    x = x.reshape(*lead, parts, local, *rest)
    widths = [(0, 0)] * x.ndim
    widths[axis + 1] = (0, pad)
    x = jnp.pad(x, widths, constant_values=fill).reshape(*lead, parts, n, block, *rest)
    return jnp.moveaxis(x, axis + 1, 0).reshape(n, *lead, parts * block, *rest)

  @jax.checkpoint
  def one(q_step, pos_step):
    out = attend(
      split(q_step), split(pos_step), keys_BKES, values_BKSE, key_pos_BS, dtype=dtype,
      window=window, softcap=softcap,
    )  # fmt: skip
    return split(out)

  out_nBKqE = jax.lax.map(lambda xs: one(*xs), (steps(q_BKQE, 2, 0), steps(q_pos_BQ, 1, -1)))
  out = out_nBKqE.reshape(n, B, K, parts, block, E)
  out = jnp.moveaxis(out, 0, 3).reshape(B, K, parts, n * block, E)[:, :, :, :local]
  return out.reshape(B, K, Q, E)


def attend_shared(
  q_BKQE,
  q_pos_BQ,
  keys_BKES,
  values_BKSE,
  key_pos_BS,
  prefix_kv,
  prefix_pos_AS,
  *,
  dtype,
  window=None,
  softcap=0.0,
):
  """`attend` over each row's own slots and a prefix shared by its group (Hydragen,
  Juravsky et al. 2024): rows a·G .. a·G+G−1 (N = A·G rows) all attend to prefix a.

  prefix_kv = (keys [A, K, E, P], values [A, K, P, E]), positions prefix_pos_AS [A, P].
  The prefix's scores are one batched matmul per (a, k) with the G·Q query rows of the
  group stacked, so each prefix key and value is read once per group instead of once per
  row. One shift m = max(m_own, m_prefix) serves both parts, so
    out = (Σ_own e V + Σ_prefix e V) / (Σ_own e + Σ_prefix e)
  is the softmax over the union of the slots: `attend` on the concatenated cache, up to
  the order of the float32 sums.
  """
  pk_AKEP, pv_AKPE = prefix_kv
  A, (N, K, Q, _) = pk_AKEP.shape[0], q_BKQE.shape
  G = N // A
  # Rows -> groups: [N, K, Q, ...] <-> [A, K, G·Q, ...] (row-major within a group).
  to_groups = lambda x: jnp.swapaxes(x.reshape(A, G, K, Q, -1), 1, 2).reshape(A, K, G * Q, -1)
  to_rows = lambda x: jnp.swapaxes(x.reshape(A, K, G, Q, -1), 1, 2).reshape(N, K, Q, -1)
  mm = _attention_matmul_dtype(keys_BKES, dtype)
  s_BKQS = _capped(_scores(q_BKQE, keys_BKES, mm), softcap)
  s_AKqP = _capped(_scores(to_groups(q_BKQE), pk_AKEP, mm), softcap)
  valid = _visible(q_pos_BQ[:, None, :, None], key_pos_BS[:, None, None, :], window)
  q_pos_Aq1 = q_pos_BQ.reshape(A, 1, G * Q, 1)
  valid_pre = _visible(q_pos_Aq1, prefix_pos_AS[:, None, None, :], window)
  m_BKQ1 = jnp.maximum(_masked_max(s_BKQS, valid), to_rows(_masked_max(s_AKqP, valid_pre)))
  e_BKQS = _exp_shifted(s_BKQS, valid, m_BKQ1)
  e_AKqP = _exp_shifted(s_AKqP, valid_pre, to_groups(m_BKQ1))
  out_BKQE = _weighted_values(e_BKQS, values_BKSE, dtype, mm) + to_rows(
    _weighted_values(e_AKqP, pv_AKPE, dtype, mm)
  )
  sum_BKQ1 = e_BKQS.sum(-1, keepdims=True) + to_rows(e_AKqP.sum(-1, keepdims=True))
  return _normalised(out_BKQE, sum_BKQ1, dtype)


def attend_paged(
  q_BKQE, q_pos_BQ, k_pool, v_pool, pos_PZ, table_NM, live, k_BKEO, v_BKOE, new_pos_BO, *,
  block, dtype, window=None, softcap=0.0,
):  # fmt: skip
  """`attend` over each row's pages of a paged cache (`kv_cache.PagedKVCache`) and the
  call's own new keys k_BKEO / values v_BKOE at positions new_pos_BO (O per row, not yet
  in the pool; -1: a padding column, invisible), block by block with an online softmax
  (flash-decoding; Dao et al. 2023, vLLM's paged attention). A decode call has O = 1, the
  new key at the query's own position; a block of O tokens (an episode's observation)
  is causal within itself by the positions.

  Pools: keys [P, K, E, Z], values [P, K, Z, E], positions pos_PZ [P, Z]; row n's logical
  slot s is in page table_NM[n, s // Z]. The running shift m, sum l and output o start
  from the new keys (m = their masked max, l = Σ e, o = Σ e·V), and block j gathers pages
  table[:, jb : (j+1)b] ([N, K, E, b·Z] keys: one layer's block, never the row's whole
  cache) and folds them in:
    m' = max(m, max_s s_qs),  l' = l·e^(m − m') + Σ_s e^(s_qs − m'),
    o' = o·e^(m − m') + Σ_s e^(s_qs − m') V_s,   out = o / l
  — the softmax over the row's slots and its new one, up to the order of the float32
  sums. Only the blocks up to the one holding slot live − 1 run (a dynamic trip count:
  early decode steps read few pages).
  """
  N, K, Q, E = q_BKQE.shape
  Z = pos_PZ.shape[-1]
  M = table_NM.shape[1]
  block = min(block, M)
  n_blocks = -(-M // block)
  null = pos_PZ.shape[0] - 1  # The pool's last page: never written, all positions -1.
  table_NM = jnp.pad(table_NM, ((0, 0), (0, n_blocks * block - M)), constant_values=null)
  mm = _attention_matmul_dtype(k_pool, dtype)
  q_pos = q_pos_BQ[:, None, :, None]

  def fold(j, carry):
    m_BKQ1, l_BKQ1, o_BKQE = carry
    pages_Nb = jax.lax.dynamic_slice_in_dim(table_NM, j * block, block, axis=1)
    keys_BKES = jnp.transpose(k_pool[pages_Nb], (0, 2, 3, 1, 4)).reshape(N, K, E, block * Z)
    values_BKSE = jnp.transpose(v_pool[pages_Nb], (0, 2, 1, 3, 4)).reshape(N, K, block * Z, E)
    key_pos = pos_PZ[pages_Nb].reshape(N, 1, 1, block * Z)
    s_BKQS = _capped(_scores(q_BKQE, keys_BKES, mm), softcap)
    valid = _visible(q_pos, key_pos, window)
    m_new = jnp.maximum(m_BKQ1, _masked_max(s_BKQS, valid))
    rescale = jnp.exp(m_BKQ1 - m_new)
    e_BKQS = _exp_shifted(s_BKQS, valid, m_new)
    o_new = o_BKQE * rescale + _weighted_values(e_BKQS, values_BKSE, dtype, mm)
    return m_new, l_BKQ1 * rescale + e_BKQS.sum(-1, keepdims=True), o_new

  # The new keys, as `attend` takes them (one decode key: weight exp(s − s) = 1 on a real
  # query; a padding query sees nothing).
  k_new, v_new = k_BKEO.astype(k_pool.dtype), v_BKOE.astype(v_pool.dtype)
  s_new = _capped(_scores(q_BKQE, k_new, mm), softcap)  # [N, K, Q, O]
  valid_new = _visible(q_pos, new_pos_BO[:, None, None, :], window)
  m_new = _masked_max(s_new, valid_new)
  e_new = _exp_shifted(s_new, valid_new, m_new)
  init = (m_new, e_new.sum(-1, keepdims=True), _weighted_values(e_new, v_new, dtype, mm))
  trips = jnp.clip(-(-live // (block * Z)), 1, n_blocks)
  _, l_BKQ1, o_BKQE = jax.lax.fori_loop(0, trips, fold, init)
  return _normalised(o_BKQE, l_BKQ1, dtype)


def attend_ring(
  q_BKQE, q_pos_BQ, ring_k_BKER, ring_v_BKRE, ring_pos_BR, k_BKEO, v_BKOE, new_pos_BO, *,
  dtype, window=None, softcap=0.0,
):  # fmt: skip
  """`attend` over a window ring as it was before the call (a paged cache's ring layer,
  `kv_cache.PagedKVCache.rings`: keys [N, K, E, R], values [N, K, R, E], positions
  [N, R]) and the call's own O new keys at new_pos_BO (not yet written; -1: padding),
  causal by position. One shift m = max(m_ring, m_new) serves both parts, so
    out = (Σ_ring e V + Σ_new e V) / (Σ_ring e + Σ_new e)
  is the softmax over their union: `attend` on the concatenated keys (up to the order of
  the float32 sums) without copying the ring into a concatenation at every step. A ring
  slot the call's block will overwrite still holds its older key, which its window (or
  causality) decides as it would in a full cache."""
  mm = _attention_matmul_dtype(ring_k_BKER, dtype)
  q_pos = q_pos_BQ[:, None, :, None]
  k_new, v_new = k_BKEO.astype(ring_k_BKER.dtype), v_BKOE.astype(ring_v_BKRE.dtype)
  s_ring = _capped(_scores(q_BKQE, ring_k_BKER, mm), softcap)
  s_new = _capped(_scores(q_BKQE, k_new, mm), softcap)
  valid_ring = _visible(q_pos, ring_pos_BR[:, None, None, :], window)
  valid_new = _visible(q_pos, new_pos_BO[:, None, None, :], window)
  m_BKQ1 = jnp.maximum(_masked_max(s_ring, valid_ring), _masked_max(s_new, valid_new))
  e_ring = _exp_shifted(s_ring, valid_ring, m_BKQ1)
  e_new = _exp_shifted(s_new, valid_new, m_BKQ1)
  out_BKQE = _weighted_values(e_ring, ring_v_BKRE, dtype, mm) + _weighted_values(
    e_new, v_new, dtype, mm
  )
  sum_BKQ1 = e_ring.sum(-1, keepdims=True) + e_new.sum(-1, keepdims=True)
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


def _visible(q_pos, key_pos, window=None):
  """1.0 where a key slot is visible to a query (0 <= pos_key <= pos_query, and
  pos_query − pos_key < window when there is one: the query and the window − 1 keys
  before it, transformers' sliding-window mask), else 0.0."""
  visible = (key_pos >= 0) & (key_pos <= q_pos) & (q_pos >= 0)
  if window is not None:
    visible = visible & (q_pos - key_pos < window)
  return visible.astype(jnp.float32)


def _capped(s, softcap):
  """c·tanh(s / c) for a cap c > 0 (soft-capping), else s."""
  return s if not softcap else softcap * jnp.tanh(s / softcap)


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
