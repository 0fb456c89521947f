"""The paged samplers (`sampler.kv_layout="paged"`): the static and refill samplers'
rollouts with a KV cache whose memory follows the pages rows hold, not rows × the longest
possible row.

  rollouts = paged.sample(params, prompts, key, hyper, model_fn=..., init_cache=..., cfg=...)
  rollouts = refill.sample(..., cfg=dataclasses.replace(cfg, kv_layout="paged"), slots=S)

Layout (`kv_cache.PagedKVCache`, carried with its free-page stack as `Pages`): one pool of
Z-slot pages per layer (Z = `sampler.page_size`), a page table per row. Sliding-window
layers (Mistral, Gemma 2 and 3; `kv_cache.cache_rings`) keep no pool but a window ring per
row, min(S + T, window) slots, as the dense cache does (`PagedKVCache.rings`), where the
rings take fewer slots than the pool (`keeps_rings`: a window shorter than the rows): a
row's ring starts as a copy of its prompt's (`pool`; `load` for a refill slot), moves
with the row (`compact`), and the pages serve the full-attention layers only. Algorithm (static
shapes, one compile per prompt-length bucket):
  1. Prefill: each prompt minus its last token goes into a dense cache of ceil((P−1)/Z)·Z
     slots, once per prompt (`sampling.prefill_cache`, chunked with sampler.prefill_chunk),
     which is cut into pages at the front of the pool (`pool`). The G rows of a group
     point at their prompt's pages (sampler.shared_prefix; else each row gets its own
     copy); a refill slot taking a request points at its prompt's pages (`load`).
  2. Decode (`lax.while_loop`, one token per row a step, as `sampling.decode`): a row
     whose next slot starts a page takes one from the stack (`take`); a row that ends
     (EOS, its limit) returns its completion pages at once (`give_back`), for the rows
     still running. A row that finds the stack empty ends there, truncated: the pool
     (sampler.kv_pool_fraction of the pages every row, or refill slot, at T would take;
     1: never short) bounds the memory, and rows that end early make room for long ones.
  3. Compaction (the static sampler): each step runs the model on the live rows only,
     gathered into the smallest of N, N/2, N/4, N/8 rows that holds them (`lax.switch`);
     their pages stay where they are, only the table rows move. The long tail of a skewed
     batch (a few rows running to T after most have ended) costs its own rows, not N.
     (The refill sampler keeps its slots full instead, and compacts its own tail.)
  Attention reads a row's pages in blocks up to the last live slot, and the row's new
  key (`attention.attend_paged`); the step's keys and values are written once, after the
  branches (`PagedKVCache.commit`), so the pools are updated in place. Tokens are drawn
  over all N rows from the same keys as the dense sampler, so the rollouts are
  `sampling.sample`'s (and `refill.sample`'s on dense slots), up to the order of float32
  sums, until the pool runs short.

Partial rollouts (`rollouts.partial.continue_rows`) and IBPO's counterfactual rows
(`rollouts.counterfactuals.sample_limited`) decode on pages too: `prefill` with G = 1 (each row's
[prompt ; tokens so far] gets its own prompt pages), then `decode` with per-row limits.

Hand-written: JAX has no paged KV cache (vLLM's and SGLang's are outside JAX; vLLM-TPU's
ragged paged attention is a TPU kernel, not a sampler). Multi-turn episodes page their
cache with `take` and `forward` (`envs.episodes`: an action a token a call) and
`append_block` (an observation of O tokens in one call, causal within the block). Not
here yet: a TPU paged-attention kernel (the XLA gather path runs everywhere), and pools
split over data-parallel devices (a pool is one array: with rows over several devices,
each device holds all of it).

Shape letters as in `sampling`; Z page size, M pages per row's table, F completion pages.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp

from grpo_jax.models import kv_cache, model, sampling

# Decode steps run on the live rows gathered into the smallest of N, N/2, ..., N/2^k.
_COMPACT_LEVELS = 4
# Attention reads this many slots of a row's pages per block (`attention.attend_paged`).
_BLOCK_SLOTS = 512


@flax.struct.dataclass
class Pages:
  """A paged cache and its free-page stack free_F[:top], as a sampler carries it: rows'
  tables start with prompt_pages pages of their prompt, then their own pages."""

  cache: kv_cache.PagedKVCache
  free_F: jax.Array
  top: jax.Array
  # With window rings and `pool(prompt_rings=True)`: each prompt's rings, (keys, values)
  # per layer (None where a layer has none) and positions [owners, R], which `load`
  # copies into a slot's rows.
  prompt_rings: tuple = ()
  prompt_pages: int = flax.struct.field(pytree_node=False, default=0)

  def slot(self, t_N):
    """The logical slot of each row's completion token t (after the prompt's pages)."""
    return self.prompt_pages * self.cache.page_size + t_N


@flax.struct.dataclass
class State:
  """The paged decode loop's carry: `sampling.DecodeState`'s buffers and the pages of all
  N rows."""

  step: jax.Array
  pages: Pages
  key: jax.Array
  tok_N: jax.Array
  pos_N: jax.Array
  done_N: jax.Array
  starved_N: jax.Array  # ended because the pool had no page for it (truncated)
  tokens_NT: jax.Array
  mask_NT: jax.Array
  logp_NT: jax.Array
  policy_logp_NT: jax.Array
  prompt_routes_BPLK: jax.Array | None = None
  routes_NTLK: jax.Array | None = None


def keeps_rings(*, rows: int, slots: int, pool_pages: int, page_size: int, window: int) -> bool:
  """Whether a paged cache keeps its sliding layers in window rings (`PagedKVCache.rings`)
  rather than in pages: when one layer's rings, rows × min(slots, window) (slots: a row's
  S + T), hold fewer slots than one layer's pool, (pool_pages + 1) × page_size. A window
  as long as the rows (Mistral's and Gemma 2's 4,096 at short rollouts) would make each
  ring a full copy of its row, giving up the group's shared prompt pages and the pool's
  fraction: such layers stay paged, as the full ones are."""
  return rows * min(slots, window) < (pool_pages + 1) * page_size


def completion_pages(cfg: sampling.SamplerConfig, rows: int) -> int:
  """F: the pool's completion pages, ceil(sampler.kv_pool_fraction · rows · ceil(T / Z))."""
  worst = rows * -(-cfg.max_new_tokens // cfg.page_size)
  return max(1, math.ceil(cfg.kv_pool_fraction * worst))


def _to_pages(x, *, slot_axis: int, page_size: int, stacked: bool):
  """A dense cache buffer [(L,) B, ..., S, ...] as pages [(L,) B·S/Z, ..., Z, ...]: the slot
  axis split into (pages, Z), the pages moved next to the rows and merged with them."""
  lead = 1 if stacked else 0
  slot_axis %= x.ndim
  shape = x.shape
  x = x.reshape(
    *shape[:slot_axis], shape[slot_axis] // page_size, page_size, *shape[slot_axis + 1 :]
  )
  x = jnp.moveaxis(x, slot_axis, lead + 1)
  return x.reshape(*shape[:lead], -1, *x.shape[lead + 2 :])


def _pool(prompt_pages, free_pages: int):
  """The prompt's pages followed by free_pages + 1 zero pages (the last is the null page)."""
  lead = prompt_pages.ndim - 4  # 1 with stacked layers.
  pad = [(0, 0)] * prompt_pages.ndim
  pad[lead] = (0, free_pages + 1)
  return jnp.pad(prompt_pages, pad)


def _prompt_table(owner_R, n_prompt: int):
  """The first n_prompt table entries of rows reading prompt owner_R: its pages, which
  `pool` lays out at owner · n_prompt + [0, n_prompt)."""
  return owner_R[:, None] * n_prompt + jnp.arange(n_prompt)[None, :]


def pool(dense: kv_cache.KVCache, *, rows: int, owner_N, cfg: sampling.SamplerConfig,
         prompt_rings: bool = False) -> Pages:  # fmt: skip
  """Pages for `rows` rows from a dense prompt cache (`owners` rows of ceil(S/Z)·Z slots):
  its slots cut into pages at the front of the pool, then the completion pages
  (`completion_pages` for `rows`) and the null page. Row n's table starts with prompt
  owner_N[n]'s pages. A ring layer of the prompt cache (`KVCache.rings`) becomes a ring
  per row, a copy of its prompt's at min(S + T, window) slots (`KVCache.grown_rings`),
  where that takes fewer slots than pages would (`keeps_rings`; else it is paged:
  `KVCache.unring`); with prompt_rings the prompts' rings are kept for `load`. When every
  layer keeps a ring the pages hold positions only, so the pool is whole (no row starves
  for memory it would not save)."""
  Z, T = cfg.page_size, cfg.max_new_tokens
  owners, S = dense.pos_BS.shape
  n_prompt = S // Z
  F = completion_pages(cfg, rows)
  if dense.rings and not keeps_rings(
    rows=rows, slots=S + T, pool_pages=owners * n_prompt + F, page_size=Z, window=dense.window
  ):
    dense = dense.unring()
  if dense.rings and all(dense.rings):
    F = completion_pages(dataclasses.replace(cfg, kv_pool_fraction=1.0), rows)
  pool_pages = owners * n_prompt + F
  layers = dense.rings or (False,) * len(dense.k)
  ring_k, ring_v, ring_pos = dense.grown_rings(own=S + T)  # Each prompt's, full size.
  pages = functools.partial(_to_pages, page_size=Z, stacked=dense.stacked)
  k = tuple(rk[owner_N] if r else _pool(pages(x, slot_axis=-1), F) for x, rk, r in zip(dense.k, ring_k, layers))  # fmt: skip
  v = tuple(rv[owner_N] if r else _pool(pages(x, slot_axis=-2), F) for x, rv, r in zip(dense.v, ring_v, layers))  # fmt: skip
  pos_PZ = jnp.pad(dense.pos_BS.reshape(owners * n_prompt, Z), ((0, F + 1), (0, 0)), constant_values=-1)  # fmt: skip
  null = pool_pages
  table_NM = jnp.full((rows, n_prompt + -(-T // Z)), null, jnp.int32)
  table_NM = table_NM.at[:, :n_prompt].set(_prompt_table(owner_N, n_prompt))
  cache = kv_cache.PagedKVCache(
    k=k, v=v, pos_PZ=pos_PZ, table_NM=table_NM, slot_N=jnp.full((rows,), -1, jnp.int32),
    live=jnp.zeros((), jnp.int32), stacked=dense.stacked, block=max(1, _BLOCK_SLOTS // Z),
    ring_pos_NR=ring_pos[owner_N] if dense.rings else None, rings=dense.rings,
  ).constrain()  # fmt: skip
  kept = ()
  if prompt_rings and dense.rings:  # Refill slots load them (`load`).
    only = lambda bufs: tuple(b if r else None for b, r in zip(bufs, layers))  # noqa: E731
    kept = (only(ring_k), only(ring_v), ring_pos)
  free_F = (owners * n_prompt + jnp.arange(F, dtype=jnp.int32))[::-1]
  return Pages(cache=cache, free_F=free_F, top=jnp.asarray(F, jnp.int32), prompt_rings=kept,
               prompt_pages=n_prompt)  # fmt: skip


def group_pool(dense: kv_cache.KVCache, *, cfg: sampling.SamplerConfig) -> Pages:
  """`pool` for the G = cfg.group_size rows of each prompt in a dense prompt cache: the
  group's rows read their prompt's pages (sampler.shared_prefix), else each row gets its
  own copy."""
  G = cfg.group_size
  N = dense.pos_BS.shape[0] * G
  shared = cfg.shared_prefix and G > 1
  if not shared:
    dense = dense.repeat(G)
  owner_N = jnp.arange(N) // G if shared else jnp.arange(N)
  return pool(dense, rows=N, owner_N=owner_N, cfg=cfg)


def prefill(params, prompts: sampling.Prompts, key, *, model_fn: Callable,
            init_cache: Callable, cfg: sampling.SamplerConfig) -> State:  # fmt: skip
  """The prompts into pages at the front of the pool, and the decode loop's start."""
  tokens_BP = jnp.asarray(prompts.tokens_BP, jnp.int32)
  mask_BP = jnp.asarray(prompts.mask_BP, jnp.bool_)
  B, P = tokens_BP.shape
  G, T = cfg.group_size, cfg.max_new_tokens
  N = B * G
  positions_BP = model.positions_from_mask(mask_BP)
  dense, routes = prefill_prompts(
    params, tokens_BP, positions_BP, init_cache=init_cache, model_fn=model_fn, cfg=cfg
  )
  if cfg.record_routes:
    routes = {
      "prompt_routes_BPLK": jnp.where(mask_BP[:, :-1, None, None], routes, -1),
      "routes_NTLK": jnp.full((N, T, *routes.shape[2:]), -1, routes.dtype),
    }
  return State(
    step=jnp.zeros((), jnp.int32),
    pages=group_pool(dense, cfg=cfg),
    key=key,
    tok_N=jnp.repeat(tokens_BP[:, -1], G),
    pos_N=jnp.repeat(positions_BP[:, -1], G),
    done_N=jnp.zeros((N,), jnp.bool_),
    starved_N=jnp.zeros((N,), jnp.bool_),
    tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
    mask_NT=jnp.zeros((N, T), jnp.bool_),
    logp_NT=jnp.zeros((N, T), jnp.float32),
    policy_logp_NT=jnp.zeros((N, T), jnp.float32),
    **(routes if cfg.record_routes else {}),
  )


def prefill_prompts(params, tokens_BP, positions_BP, *, init_cache: Callable, model_fn: Callable,
                    cfg: sampling.SamplerConfig):  # fmt: skip
  """Each prompt minus its last token in a dense cache of ceil((P − 1)/Z)·Z slots
  (`sampling.prefill_cache`, chunked by sampler.prefill_chunk), ready to be cut into
  pages; and the experts its tokens took ([B, P − 1, L, k]) with sampler.record_routes,
  else None."""
  P = tokens_BP.shape[1]
  if P < 2:
    raise ValueError(
      f"Prompt batches need >= 2 slots (left-pad a 1-token prompt), got shape {tokens_BP.shape}."
    )
  Z = cfg.page_size
  out = sampling.prefill_cache(
    params, tokens_BP[:, :-1], positions_BP[:, :-1], init_cache=init_cache,
    length=-(-(P - 1) // Z) * Z, model_fn=model_fn, chunk=cfg.prefill_chunk,
    record_routes=cfg.record_routes,
  )  # fmt: skip
  return (out[0], out[1]) if cfg.record_routes else (out, None)


def take(p: Pages, need_N, t_N) -> tuple[Pages, jax.Array]:
  """Rows in need_N (their completion token t_N starts a page) pop a page each from the
  stack, in row order, into table column prompt_pages + t_N // Z; a row that finds the
  stack empty is starved (returned: it ends there, truncated). A taken page's positions
  are reset (its last holder's slots would be visible)."""
  c = p.cache
  rank_N = jnp.cumsum(need_N) - 1
  got_N = need_N & (rank_N < p.top)
  page_N = p.free_F[jnp.clip(p.top - 1 - rank_N, 0, p.free_F.shape[0] - 1)]
  col_N = jnp.minimum(p.prompt_pages + t_N // c.page_size, c.table_NM.shape[1] - 1)
  rows = jnp.arange(c.table_NM.shape[0])
  table_NM = c.table_NM.at[rows, col_N].set(jnp.where(got_N, page_N, c.table_NM[rows, col_N]))
  pos_PZ = c.pos_PZ.at[jnp.where(got_N, page_N, c.pos_PZ.shape[0])].set(-1, mode="drop")
  return p.replace(
    cache=c.replace(table_NM=table_NM, pos_PZ=pos_PZ),
    top=p.top - jnp.sum(got_N, dtype=jnp.int32),
  ), need_N & ~got_N


def give_back(p: Pages, ended_N) -> Pages:
  """Ended rows push their completion pages back on the stack; their table rows then
  point at the null page (prompt pages stay: other rows of the group read them)."""
  c = p.cache
  null = c.null_page
  own_NM = c.table_NM[:, p.prompt_pages :]
  back_NM = ended_N[:, None] & (own_NM != null)
  at = p.top + jnp.cumsum(back_NM.reshape(-1)).reshape(back_NM.shape) - 1
  free_F = p.free_F.at[jnp.where(back_NM, at, p.free_F.shape[0])].set(own_NM, mode="drop")
  return p.replace(
    cache=c.replace(table_NM=jnp.where(ended_N[:, None], null, c.table_NM)),
    free_F=free_F,
    top=p.top + jnp.sum(back_NM, dtype=jnp.int32),
  )


def load(p: Pages, slot_R, b_R) -> Pages:
  """Rows slot_R (out of range: none) start prompt b_R: their tables point at its pages,
  and at the null page after them (a refill slot taking a request; nothing is copied),
  and their window rings, if any, become copies of the prompt's (`pool(prompt_rings=True)`)."""
  c = p.cache
  n = p.prompt_pages
  row_RM = jnp.full((slot_R.shape[0], c.table_NM.shape[1]), c.null_page, jnp.int32)
  row_RM = row_RM.at[:, :n].set(_prompt_table(b_R, n))
  c = c.replace(table_NM=c.table_NM.at[slot_R].set(row_RM, mode="drop"))
  if c.rings:
    if not p.prompt_rings:
      raise ValueError("paged.load: a cache with window rings needs pool(prompt_rings=True).")
    pk, pv, ppos = p.prompt_rings
    b_R = jnp.clip(b_R, 0, ppos.shape[0] - 1)
    put = lambda buf, src: buf if src is None else buf.at[slot_R].set(src[b_R], mode="drop")  # noqa: E731
    c = c.replace(
      k=tuple(map(put, c.k, pk)), v=tuple(map(put, c.v, pv)), ring_pos_NR=put(c.ring_pos_NR, ppos)
    )
  return p.replace(cache=c)


def compact(p: Pages, idx_R) -> Pages:
  """The pages of rows idx_R only, in that order (their tables and rings move, the pool
  stays)."""
  return p.replace(cache=p.cache.rows(idx_R))


def forward(params, p: Pages, tok_N, pos_N, t_N, live_N, *, model_fn: Callable):
  """One decode call on every row: live rows attend over their pages and write their token
  at slot t_N (`PagedKVCache.commit`, in place). Returns (logits [N, 1, V], pages)."""
  slot_N = jnp.where(live_N, p.slot(t_N), -1)
  view = p.cache.replace(slot_N=slot_N, live=jnp.max(slot_N))
  logits_N1V, cache = model_fn(params, tok_N[:, None], pos_N[:, None], view)
  return logits_N1V, p.replace(cache=cache.commit(pos_N))


def append_block(
  params, p: Pages, tok_NO, pos_NO, t_N, n_N, *, model_fn: Callable, chunk: int = 0,
  logits: bool = True,
):  # fmt: skip
  """One call writing each row's first n_N tokens of tok_NO (positions pos_NO, -1 past
  n) at its completion slots t_N .. t_N + n − 1: a page is taken first for every slot of
  those that starts one (`take`, column by column; with a whole pool none starves), then
  every layer attends over the row's pages and the block, causal within it, and the
  block is committed. What O calls of `forward`, a token each, would write, in one call
  (up to the order of float32 sums). With 0 < chunk < O, ceil(O / chunk) calls of `chunk`
  columns (sampler.prefill_chunk): the attention's scores are [N, heads, chunk, slots a
  block] instead of O rows of them. Returns (logits [N, O, V], pages); with
  logits=False (an episode's append reads none) (None, pages), and no call computes the
  LM head or keeps logits."""
  width = tok_NO.shape[1]
  if 0 < chunk < width:
    return _append_chunks(params, p, tok_NO, pos_NO, t_N, n_N, model_fn=model_fn, chunk=chunk,
                          logits=logits)  # fmt: skip
  Z = p.cache.page_size

  def take_column(j, p):
    t_N_ = t_N + j
    return take(p, (j < n_N) & (t_N_ % Z == 0), t_N_)[0]

  p = jax.lax.fori_loop(0, width, take_column, p)
  slot_N = jnp.where(n_N > 0, p.slot(t_N), -1)
  view = p.cache.replace(slot_N=slot_N, live=jnp.max(slot_N))
  logits_NOV, cache = model_fn(params, tok_NO, pos_NO, view)
  return (logits_NOV if logits else None), p.replace(cache=cache.commit(pos_NO))


def _append_chunks(params, p: Pages, tok_NO, pos_NO, t_N, n_N, *, model_fn, chunk: int,
                   logits: bool):  # fmt: skip
  """`append_block` in calls of `chunk` columns (a `lax.fori_loop`; the columns past O are
  padding at position -1, written nowhere). The logits are carried only when asked for:
  an unused loop-carried buffer would not be dropped."""
  N, width = tok_NO.shape
  calls = -(-width // chunk)
  pad = ((0, 0), (0, calls * chunk - width))
  tok_NO, pos_NO = jnp.pad(tok_NO, pad), jnp.pad(pos_NO, pad, constant_values=-1)
  block = functools.partial(append_block, params, model_fn=model_fn, logits=logits)

  def call(c, p):
    cols = lambda x: jax.lax.dynamic_slice_in_dim(x, c * chunk, chunk, axis=1)  # noqa: E731
    n_c = jnp.clip(n_N - c * chunk, 0, chunk)
    return block(p, cols(tok_NO), cols(pos_NO), t_N + c * chunk, n_c)

  if not logits:
    return None, jax.lax.fori_loop(0, calls, lambda c, p: call(c, p)[1], p)

  def one(c, carry):
    p, logits_NOV = carry
    out_NCV, p = call(c, p)
    return p, jax.lax.dynamic_update_slice_in_dim(logits_NOV, out_NCV, c * chunk, axis=1)

  V = jax.eval_shape(block, p, tok_NO[:, :chunk], pos_NO[:, :chunk], t_N, n_N)[0].shape[-1]
  out = jnp.zeros((N, calls * chunk, V), jnp.float32)
  p, out = jax.lax.fori_loop(0, calls, one, (p, out))
  return out[:, :width], p


def _take_pages(s: State, Z: int) -> State:
  """`take` for the static sampler: live rows at a page edge (all rows step together)."""
  need_N = ~s.done_N & (s.step % Z == 0)
  pages, starved_N = take(s.pages, need_N, jnp.broadcast_to(s.step, need_N.shape))
  return s.replace(pages=pages, done_N=s.done_N | starved_N, starved_N=s.starved_N | starved_N)


def _buckets(N: int) -> tuple[int, ...]:
  """The compaction sizes N, ceil(N/2), ..., ceil(N/2^(levels−1)), distinct, decreasing."""
  return tuple(sorted({-(-N // 2**j) for j in range(_COMPACT_LEVELS)}, reverse=True))


def _full_rows(x, axis: int = 0, *, idx, N: int):
  """x's rows (along `axis`) placed at rows idx of an N-row array of zeros."""
  shape = (*x.shape[:axis], N, *x.shape[axis + 1 :])
  return jnp.zeros(shape, x.dtype).at[(slice(None),) * axis + (idx,)].set(x)


def _forward(params, s: State, *, rows: int, model_fn: Callable, record: bool):
  """The model on the first `rows` live rows (all N when rows == N), reading the pools:
  full-N logits [N, V] and new keys and values (zeros on rows not run), and the recorded
  routes [N, 1, L, k]."""
  c = s.pages.cache
  N = s.done_N.shape[0]
  slot = s.pages.slot(s.step)  # Every live row's next slot.
  idx = jnp.arange(N) if rows == N else jnp.argsort(s.done_N, stable=True)[:rows]
  # The live rows' tables and window rings (XLA:CPU keeps every ring layer's gathered keys
  # of a compacted step: `memory._paged_sampler_bytes`).
  view = (c if rows == N else c.rows(idx)).replace(live=slot)
  kw = dict(record_routes=True) if record else {}
  out = model_fn(params, s.tok_N[idx, None], s.pos_N[idx, None], view, **kw)
  full = functools.partial(_full_rows, idx=idx, N=N) if rows < N else (lambda x, axis=0: x)
  row_axis = 1 if c.stacked else 0  # Fresh keys are [L, rows, K, E] when stacked.
  fresh = jax.tree.map(functools.partial(full, axis=row_axis), out[1].fresh)
  routes = None
  if record:
    routes = full(jnp.where(~s.done_N[idx][:, None, None, None], out[2], -1))
    routes = jnp.where(s.done_N[:, None, None, None], -1, routes)
  return full(out[0][:, -1]), fresh, routes


def decode(params, state: State, hyper: sampling.SamplingParams, *, model_fn: Callable,
           cfg: sampling.SamplerConfig, limit_N: jax.Array | None = None) -> State:  # fmt: skip
  """`sampling.decode` on pages: one token per live row a step until every row has ended
  or T columns are filled (limit_N as there)."""
  T = state.tokens_NT.shape[1]
  N = state.done_N.shape[0]
  eos_ids = jnp.asarray(cfg.eos_ids, jnp.int32)
  if limit_N is not None:
    state = state.replace(done_N=state.done_N | (limit_N <= 0))
  record = state.routes_NTLK is not None
  sizes = _buckets(N)

  def body(s: State) -> State:
    s = _take_pages(s, cfg.page_size)
    n_live = jnp.sum(~s.done_N)
    branch = sum((n_live <= size).astype(jnp.int32) for size in sizes[1:])
    run = [
      functools.partial(_forward, params, rows=size, model_fn=model_fn, record=record)
      for size in sizes
    ]
    logits_NV, fresh, r_N1LK = jax.lax.switch(branch, run, s)
    slot_N = jnp.where(s.done_N, -1, s.pages.slot(s.step))
    cache = s.pages.cache.replace(fresh=fresh, slot_N=slot_N).commit(s.pos_N)
    key, step_key = jax.random.split(s.key)
    tok_N, logp_N, policy_logp_N = sampling.choose_tokens(logits_NV, step_key, hyper)
    live_N = ~s.done_N
    tok_N = jnp.where(live_N, tok_N, cfg.pad_id)
    ended_N = live_N & (
      jnp.isin(tok_N, eos_ids) | (False if limit_N is None else s.step + 1 >= limit_N)
    )

    def put(buf_NT, col_N):
      return jax.lax.dynamic_update_slice(buf_NT, col_N[:, None].astype(buf_NT.dtype), (0, s.step))

    routes = {}
    if record:
      routes["routes_NTLK"] = jax.lax.dynamic_update_slice(s.routes_NTLK, r_N1LK, (0, s.step, 0, 0))
    s = s.replace(
      step=s.step + 1,
      pages=s.pages.replace(cache=cache),
      key=key,
      tok_N=tok_N,
      pos_N=s.pos_N + 1,
      done_N=s.done_N | ended_N,
      tokens_NT=put(s.tokens_NT, tok_N),
      mask_NT=put(s.mask_NT, live_N),
      logp_NT=put(s.logp_NT, jnp.where(live_N, logp_N, 0.0)),
      policy_logp_NT=put(s.policy_logp_NT, jnp.where(live_N, policy_logp_N, 0.0)),
      **routes,
    )
    return s.replace(pages=give_back(s.pages, ended_N))

  def cond(s: State):
    return (s.step < T) & ~jnp.all(s.done_N)

  return jax.lax.while_loop(cond, body, state)


def sample(
  params,
  prompts: sampling.Prompts,
  key: jax.Array,
  hyper: sampling.SamplingParams,
  limit_N: jax.Array | None = None,
  *,
  model_fn: Callable,
  init_cache: Callable[[int, int], Any],
  cfg: sampling.SamplerConfig,
) -> sampling.Rollouts:
  """`sampling.sample` with a paged cache: `prefill`, then `decode` (see the module
  docstring). A row the pool starved is truncated (eos_N False)."""
  state = prefill(params, prompts, key, model_fn=model_fn, init_cache=init_cache, cfg=cfg)
  state = decode(params, state, hyper, model_fn=model_fn, cfg=cfg, limit_N=limit_N)
  eos_N = sampling.ended_with_eos(state.tokens_NT, state.mask_NT, cfg.eos_ids)
  rollouts = sampling.to_rollouts(prompts, state, group_size=cfg.group_size, eos_N=eos_N)
  return rollouts.replace(starved_N=state.starved_N)


def make_policy_sampler(model_cfg: model.ModelConfig, cfg: sampling.SamplerConfig):
  """jit(sample) for a grpo_jax transformer policy: fn(params, prompts, key, hyper,
  limit_N=None) (adapters merged for sampling when the config says so: `model.sampler_view`)."""
  mcfg, view = model.sampler_view(model_cfg)
  fn = functools.partial(
    sample,
    model_fn=model.make_model_fn(mcfg),
    init_cache=functools.partial(model.init_cache, mcfg),
    cfg=cfg,
  )
  return jax.jit(sampling.viewed(fn, view))
