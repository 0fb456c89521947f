"""Slot-refill (continuous batching) sampler: a fixed number of decode slots, refilled from
the pending (prompt, sample) requests as rows end, so no slot decodes a finished row.

  rollouts = refill.sample(params, prompts, key, hyper, model_fn=..., init_cache=...,
                           cfg=sampler_cfg, slots=S)          # same Rollouts as sampling.sample

The static sampler (`sampling.sample`) decodes all N = B·G rows until the longest has
ended: under a long-tailed length distribution most of its row-steps are spent on rows
that already emitted EOS (`pad/sample_frac`). Here (static shapes, one `lax.while_loop`):

  1. Every prompt's first P − 1 tokens are prefilled once (B rows, not B·G): a prefix
     cache of P − 1 columns, shared by the prompt's G requests.
  2. S slots hold a cache of P − 1 + T columns each, with a write column per row (the
     model's per-row cache index). Request r = b·G + g (prompt b, sample g) starts in a
     slot by copying prompt b's prefix keys/values into its columns [0, P − 1) and
     invalidating the rest (position −1); its tokens are then written at P − 1, P, ...
  3. Each step decodes one token in every slot. A request ends at an EOS id or after
     limit_N[r] tokens (default T); its slot takes the next pending request in the same
     step (requests are issued in order 0 .. N − 1), or idles when none is left.
  4. Once no request is pending and at most S/4 rows are live, those rows' caches are
     gathered into S/4 slots and decoded there to the end: a long request issued late no
     longer keeps the full batch of slots stepping.

The slots' cache follows sampler.kv_layout (`_SLOT_CACHES`): dense, as above, or paged
(`paged`): a slot taking a request points its page table at the prompt's pages instead
of copying them, takes pages as the request grows and returns them when it ends, so the
pool holds what the live requests hold.

Sampling draws one key per step for all slots, so a request's tokens depend on the slot
schedule: the rows are samples of the same distribution as the static sampler's, not the
same samples. Its log-probs are those of the tokens it drew (the teacher-forced forward of
each row gives the same values; tested). Hand-written: no JAX library does continuous
batching for a functional KV cache (vLLM, SGLang and JetStream do it outside JAX or
around their own engines).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp

from grpo_jax.models import model as model_lib
from grpo_jax.models import paged, sampling


@flax.struct.dataclass
class _State:
  step: jax.Array
  cache: Any
  key: jax.Array
  req_S: jax.Array  # Request in each slot; N when idle.
  t_S: jax.Array  # Tokens the slot's request has emitted.
  tok_S: jax.Array  # Next token to feed.
  pos_S: jax.Array  # Its position id.
  next_req: jax.Array  # First request not yet issued.
  tokens_NT: jax.Array
  mask_NT: jax.Array
  logp_NT: jax.Array
  policy_logp_NT: jax.Array
  eos_N: jax.Array
  starved_N: jax.Array  # Requests a paged pool had no page for (`_paged_slots`).


def _load(cache, prefix, slot_R, b_R, *, P: int):
  """Slots slot_R (index S: none) start prompts b_R: the prompt's prefix keys/values in
  columns [0, P − 1), every later column invalidated, the write column at P − 1. A scatter
  of R rows: the copy costs what the refilled rows hold, not the whole cache."""
  w = P - 1

  def put(buf, pre, axis):  # The prefix's slots are the first of the slot's (a ring's too).
    head = jnp.take(pre, b_R, axis=0)
    cols = (slice(None),) * (axis - 1) + (slice(0, pre.shape[axis]),)
    return buf.at[(slot_R, *cols)].set(head.astype(buf.dtype), mode="drop")

  def fresh(pos, pre):  # The prefix's positions, then empty slots.
    head = jnp.take(pre, b_R, axis=0)
    rest = jnp.full((slot_R.shape[0], pos.shape[1] - pre.shape[1]), -1, jnp.int32)
    return pos.at[slot_R].set(jnp.concatenate([head, rest], axis=1), mode="drop")

  if cache.stacked:
    k = (jax.vmap(lambda b, p: put(b, p, 3))(cache.k[0], prefix.k[0]),)
    v = (jax.vmap(lambda b, p: put(b, p, 2))(cache.v[0], prefix.v[0]),)
  else:
    k = tuple(put(b, p, 3) for b, p in zip(cache.k, prefix.k, strict=True))
    v = tuple(put(b, p, 2) for b, p in zip(cache.v, prefix.v, strict=True))
  # A window ring (`KVCache.rings`) holds position p at slot p mod R: the prompt's ring
  # (min(w, window) slots) and the slot's (min(w + T, window)) agree on the prompt's
  # positions, being equal or the prompt's holding every position it has.
  ring = None if cache.ring_pos_BR is None else fresh(cache.ring_pos_BR, prefix.ring_pos_BR)
  index = cache.index.at[slot_R].set(w, mode="drop")
  return cache.replace(
    k=k, v=v, pos_BS=fresh(cache.pos_BS, prefix.pos_BS), index=index, ring_pos_BR=ring
  )


@dataclasses.dataclass(frozen=True)
class _Slots:
  """How the slots' cache is kept (sampler.kv_layout): `load` starts prompts b_R in slots
  slot_R, `forward` runs one decode call on every slot (returning the logits, the cache,
  and the slots starved of a page), `release` frees the slots whose request ended,
  `compact` keeps slots idx_R only."""

  load: Callable
  forward: Callable
  release: Callable
  compact: Callable
  starves: bool = False  # A pool can run short: the rollouts report `starved_N`.


def _dense_slots(params, tokens_BP, positions_BP, req_S, *, G, init_cache, model_fn, cfg):
  """Dense slots: each holds P − 1 + T columns, its prompt's prefix copied in (`_load`)."""
  P, S = tokens_BP.shape[1], req_S.shape[0]
  prefix = sampling.prefill_cache(
    params, tokens_BP[:, :-1], positions_BP[:, :-1], init_cache=init_cache, length=P - 1,
    model_fn=model_fn, chunk=cfg.prefill_chunk,
  )  # fmt: skip
  cache = init_cache(S, P - 1 + cfg.max_new_tokens)
  cache = cache.replace(index=jnp.zeros((S,), jnp.int32), empty=False)

  def forward(cache, tok_S, pos_S, t_S, live_S):
    del t_S
    logits_S1V, cache = model_fn(params, tok_S[:, None], pos_S[:, None], cache)
    return logits_S1V, cache, jnp.zeros_like(live_S)

  def compact(cache, idx_R):
    if cache.stacked:
      k, v = (cache.k[0][:, idx_R],), (cache.v[0][:, idx_R],)
    else:
      k, v = tuple(b[idx_R] for b in cache.k), tuple(b[idx_R] for b in cache.v)
    ring = None if cache.ring_pos_BR is None else cache.ring_pos_BR[idx_R]
    return cache.replace(
      k=k, v=v, pos_BS=cache.pos_BS[idx_R], index=cache.index[idx_R], ring_pos_BR=ring
    )

  slots = _Slots(
    load=functools.partial(_load, prefix=prefix, P=P),
    forward=forward,
    release=lambda cache, ended_S: cache,
    compact=compact,
  )
  return slots.load(cache, slot_R=req_S, b_R=req_S // G), slots


def _paged_slots(params, tokens_BP, positions_BP, req_S, *, G, init_cache, model_fn, cfg):
  """Paged slots (`paged`): a slot starting a request points its table at the prompt's
  pages (nothing copied), takes pages as the request grows, and returns them when it
  ends; the pool holds sampler.kv_pool_fraction of what S slots at T would take."""
  dense, _ = paged.prefill_prompts(
    params, tokens_BP, positions_BP, init_cache=init_cache, model_fn=model_fn, cfg=cfg
  )

  def forward(pages, tok_S, pos_S, t_S, live_S):
    pages, starved_S = paged.take(pages, live_S & (t_S % cfg.page_size == 0), t_S)
    logits_S1V, pages = paged.forward(
      params, pages, tok_S, pos_S, t_S, live_S & ~starved_S, model_fn=model_fn
    )
    return logits_S1V, pages, starved_S

  slots = _Slots(
    load=lambda pages, slot_R, b_R: paged.load(pages, slot_R, b_R),
    forward=forward,
    release=paged.give_back,
    compact=paged.compact,
    starves=True,
  )
  pages = paged.pool(dense, rows=req_S.shape[0], owner_N=req_S // G, cfg=cfg, prompt_rings=True)
  return pages, slots


# The slots' cache of each sampler.kv_layout (`sampling.KV_LAYOUTS`).
_SLOT_CACHES = {"dense": _dense_slots, "paged": _paged_slots}


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
  slots: int,
) -> sampling.Rollouts:
  """cfg.group_size completions per prompt through `slots` refilled decode slots (module
  docstring); limit_N (int32 [N], optional) ends request r after limit_N[r] tokens (at
  least 1, at most T).
  Pure and jittable; returns the Rollouts `sampling.sample` would (rows in request order)."""
  tokens_BP = jnp.asarray(prompts.tokens_BP, jnp.int32)
  mask_BP = jnp.asarray(prompts.mask_BP, jnp.bool_)
  B, P = tokens_BP.shape
  G, T, S = cfg.group_size, cfg.max_new_tokens, slots
  N = B * G
  if not 1 <= S <= N:
    raise ValueError(f"refill slots must be in [1, {N}] (prompts × group_size), got {S}.")
  if P < 2:
    raise ValueError(f"Prompt batches need >= 2 slots, got shape {(B, P)}.")
  limit_N = jnp.full((N,), T, jnp.int32) if limit_N is None else jnp.clip(limit_N, 1, T)
  positions_BP = model_lib.positions_from_mask(mask_BP)
  req_S = jnp.arange(S, dtype=jnp.int32)
  cache, slots = _SLOT_CACHES[cfg.kv_layout](
    params, tokens_BP, positions_BP, req_S, G=G, init_cache=init_cache, model_fn=model_fn,
    cfg=cfg,
  )  # fmt: skip
  eos_ids = jnp.asarray(cfg.eos_ids, jnp.int32)
  state = _State(
    step=jnp.zeros((), jnp.int32),
    cache=cache,
    key=key,
    req_S=req_S,
    t_S=jnp.zeros((S,), jnp.int32),
    tok_S=tokens_BP[req_S // G, -1],
    pos_S=positions_BP[req_S // G, -1],
    next_req=jnp.asarray(S, jnp.int32),
    tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
    mask_NT=jnp.zeros((N, T), bool),
    logp_NT=jnp.zeros((N, T), jnp.float32),
    policy_logp_NT=jnp.zeros((N, T), jnp.float32),
    eos_N=jnp.zeros((N,), bool),
    starved_N=jnp.zeros((N,), bool),
  )

  tail = max(1, S // TAIL_FRACTION)
  limit_steps = N * (T + 1) + 1

  def cond(s: _State):  # Until the queue is empty and the live rows fit the tail's slots.
    live = jnp.sum(s.req_S < N)
    return ((s.next_req < N) | (live > (tail if tail < S else 0))) & (s.step < limit_steps)

  def step(s: _State):
    logits_S1V, cache, starved_S = slots.forward(s.cache, s.tok_S, s.pos_S, s.t_S, s.req_S < N)
    key, step_key = jax.random.split(s.key)
    tok_S, logp_S, policy_S = sampling.choose_tokens(logits_S1V[:, -1], step_key, hyper)
    live_S = (s.req_S < N) & ~starved_S  # A starved request ends, truncated, emitting nothing.
    at = (jnp.where(live_S, s.req_S, N), s.t_S)

    def put(buf, x):
      return buf.at[at].set(x.astype(buf.dtype), mode="drop")

    eos_S = jnp.isin(tok_S, eos_ids)
    s = s.replace(
      step=s.step + 1,
      cache=cache,
      key=key,
      tokens_NT=put(s.tokens_NT, tok_S),
      mask_NT=put(s.mask_NT, live_S),
      logp_NT=put(s.logp_NT, logp_S),
      policy_logp_NT=put(s.policy_logp_NT, policy_S),
      eos_N=s.eos_N.at[jnp.where(live_S & eos_S, s.req_S, N)].set(True, mode="drop"),
      starved_N=s.starved_N.at[jnp.where(starved_S, s.req_S, N)].set(True, mode="drop"),
      tok_S=tok_S,
      pos_S=s.pos_S + 1,
      t_S=s.t_S + 1,
    )
    ended = starved_S | live_S & (eos_S | (s.t_S >= limit_N[jnp.minimum(s.req_S, N - 1)]))
    return s.replace(cache=slots.release(s.cache, ended)), ended

  def body(s: _State):
    s, ended = step(s)
    return _retire(s, ended, slots.load, tokens_BP, positions_BP, limit_N, G=G)

  def tail_body(s: _State):  # No request is pending: ended slots just go idle.
    s, ended = step(s)
    return s.replace(req_S=jnp.where(ended, N, s.req_S).astype(jnp.int32))

  state = jax.lax.while_loop(cond, body, state)
  if tail < S:  # The schedule's tail: the last live rows, decoded in `tail` slots.
    state = jax.lax.while_loop(
      lambda s: jnp.any(s.req_S < N) & (s.step < limit_steps),
      tail_body,
      _compact(state, tail, slots.compact),
    )
  rollouts = sampling.to_rollouts(prompts, state, group_size=G, eos_N=state.eos_N)
  return rollouts.replace(starved_N=state.starved_N if slots.starves else None)


def _compact(s: _State, tail: int, compact: Callable) -> _State:
  """The state with its live slots (at most `tail` of them) gathered into `tail` slots:
  their caches (`_Slots.compact`), write columns and decode state; the rest of the tail's
  slots idle."""
  N = s.eos_N.shape[0]
  live_S = s.req_S < N
  idx_R = jnp.nonzero(live_S, size=tail, fill_value=0)[0]
  used_R = jnp.arange(tail) < jnp.sum(live_S)
  return s.replace(
    cache=compact(s.cache, idx_R),
    req_S=jnp.where(used_R, s.req_S[idx_R], N).astype(jnp.int32),
    t_S=s.t_S[idx_R],
    tok_S=s.tok_S[idx_R],
    pos_S=s.pos_S[idx_R],
  )


# When no request is pending and at most S / TAIL_FRACTION rows are live, they move into
# that many slots (`_compact`): a decode step costs about what its rows cost, and the
# schedule's tail (a long request issued late) then runs at a quarter of the batch.
TAIL_FRACTION = 4


def _retire(s: _State, ended_S, load: Callable, tokens_BP, positions_BP, limit_N, *, G: int):
  """Idle slots and slots whose request just ended take the next pending requests in
  order, at most R = max(1, S // 16) per step (a slot left over waits a step: refilling
  costs a scatter of R rows each step, not a copy of every slot's cache)."""
  N, S = limit_N.shape[0], s.req_S.shape[0]
  R = max(1, S // 16)
  free_S = ended_S | (s.req_S >= N)
  rank_S = jnp.cumsum(free_S) - 1
  take_S = free_S & (rank_S < R) & (s.next_req + rank_S < N)
  new_S = (s.next_req + rank_S).astype(jnp.int32)
  req_S = jnp.where(take_S, new_S, jnp.where(ended_S, N, s.req_S)).astype(jnp.int32)
  slot_R = jnp.nonzero(take_S, size=R, fill_value=S)[0]
  b_R = jnp.minimum(req_S[jnp.minimum(slot_R, S - 1)], N - 1) // G
  b_S = jnp.minimum(req_S, N - 1) // G
  return s.replace(
    cache=load(s.cache, slot_R=slot_R, b_R=b_R),
    req_S=req_S,
    next_req=(s.next_req + jnp.sum(take_S)).astype(jnp.int32),
    tok_S=jnp.where(take_S, tokens_BP[b_S, -1], s.tok_S),
    pos_S=jnp.where(take_S, positions_BP[b_S, -1], s.pos_S),
    t_S=jnp.where(take_S, 0, s.t_S),
  )


def make_sample_fn(
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
  slots: int,
  view: Callable | None = None,
):
  """jit(sample) with the model, config and slot count bound: fn(params, prompts, key,
  hyper, limit_N=None), run on view(params) when a view is given (`sampling.viewed`)."""
  fn = functools.partial(sample, model_fn=model_fn, init_cache=init_cache, cfg=cfg, slots=slots)
  return jax.jit(sampling.viewed(fn, view))


def make_policy_sampler(
  model_cfg: model_lib.ModelConfig, cfg: sampling.SamplerConfig, *, slots: int
):
  """The refill sampler for a grpo_jax transformer policy (adapters merged for sampling when
  the config says so: `model.sampler_view`)."""
  mcfg, view = model_lib.sampler_view(model_cfg)
  return make_sample_fn(
    model_fn=model_lib.make_model_fn(mcfg),
    init_cache=functools.partial(model_lib.init_cache, mcfg),
    cfg=cfg,
    slots=slots,
    view=view,
  )
