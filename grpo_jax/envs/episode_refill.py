"""Slot refill for multi-turn episodes: a turn's actions decoded through S slots, each
refilled with the next episode that still has to act as soon as its slot's episode ends
its action (`sampler.refill_slots=S` with `sampler.kv_layout="paged"` and `config.env`).

    state = refill_turn(params, state, hyper, active_N, model_fn=..., stop_ids=...,
                        turn_tokens=16, slots=S)

The lockstep turn (`episodes.decode_turn`) runs every decode step on all N rows until the
longest action of the turn ends: an episode whose action is 3 tokens long keeps feeding a
pad for the rest of the turn. Here a decode step runs S rows; a slot whose episode emits
a turn-end token (or reaches `turn_tokens`, or the budget T) takes the lowest-index
episode still waiting to act this turn, so the turn costs about (total action tokens) / S
steps of S rows instead of (longest action) steps of N rows.

Slots hold episodes; pages hold the KV. An episode keeps its page-table row (`paged.Pages`,
episode-indexed: N rows, a whole pool) whether or not a slot runs it, so taking a slot
copies nothing: a decode step gathers its slots' table rows into an S-row view (as
`paged.compact` does for the static sampler), runs the model on it (`paged.forward`:
attention reads each row's pages by logical slot, new keys committed in place) and puts
the N-row table back. A page is taken on the *episode's* row when its next slot starts
one (`paged.take`, whole pool: none starves), so the pages an episode holds are the
lockstep run's, up to their ids.

Counter-based draws: token t of episode n is drawn with key fold_in(fold_in(key, n), t)
(`sampling.keys_by_row`, the state's key never split), so a draw depends on its episode
and column only, not on the slot, the step or the neighbours. With the same draws
(`decode_turn(row_keys=True)`) the lockstep turn gives the same episodes: tokens, masks,
turns, rewards and ends exactly, log-probs up to the order of float32 sums (a matmul of S
rows need not sum as one of N: 1.9e-6 apart at S = 1 on CPU;
`tests/envs/test_episodes.py`). Greedy decoding draws nothing. Only the refill loop uses
these keys, so lockstep runs keep their draws.

In turns (`refill_turn`) the environments' steps stay a barrier between turns
(`episodes.Runner._act`, as in the lockstep runner): what refill removes is the decode
padding within a turn. With env.overlap_steps = K (`play_overlapped`) there
are no turns: the slots decode K steps a segment (`refill_segment`, the slots carried
over), the actions that ended go to their environments on the step workers while the next
segments decode (`stepping.Flight`), and observations are appended as they come back, S
episodes a call (`append_rows`): an episode waiting on its tool frees its slot.

Hand-written: the refill sampler of single-turn rows (`models.refill`) retires a row for
good and loads a new prompt into its slot; an episode pauses between actions and keeps
its pages, which that sampler has no way to express.

Shape letters as in `episodes`; S slots.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import distributed
from grpo_jax.models import paged, sampling


def _fill(ep_S, k_S, ready_N):
  """Idle slots (ep_S == N) take the lowest-index ready episodes, in slot order; returns
  (ep_S, k_S with 0 for the slots filled, ready_N without the episodes taken)."""
  N = ready_N.shape[0]
  idle_S = ep_S == N
  rank_S = jnp.cumsum(idle_S) - 1
  order_N = jnp.argsort(~ready_N, stable=True)  # Ready episodes first, by index.
  got_S = idle_S & (rank_S < jnp.sum(ready_N))
  ep_S = jnp.where(got_S, order_N[jnp.clip(rank_S, 0, N - 1)], ep_S)
  ready_N = ready_N.at[jnp.where(got_S, ep_S, N)].set(False, mode="drop")
  return ep_S, jnp.where(got_S, 0, k_S), ready_N


def _forward_slots(params, pages: paged.Pages, ep_S, tok_S, pos_S, t_S, live_S, *, model_fn):
  """(logits [S, 1, V], pages): the slots' episodes fed one token each. Episodes whose
  token starts a page take one first (on their own table rows); the call reads and
  commits through an S-row view of the table, which is then put back whole."""
  N = pages.cache.table_NM.shape[0]
  Z = pages.cache.page_size
  need_N = jnp.zeros((N,), jnp.bool_).at[jnp.where(live_S, ep_S, N)].set(t_S % Z == 0, mode="drop")
  t_N = jnp.zeros((N,), jnp.int32).at[jnp.where(live_S, ep_S, N)].set(t_S, mode="drop")
  pages, _ = paged.take(pages, need_N, t_N)
  c = pages.cache
  view = pages.replace(cache=c.rows(ep_S))  # Window rings move with the rows.
  logits_S1V, view = paged.forward(params, view, tok_S, pos_S, t_S, live_S, model_fn=model_fn)
  return logits_S1V, view.replace(cache=c.put_rows(jnp.where(live_S, ep_S, N), view.cache))


@flax.struct.dataclass
class Slots:
  """The slots between two segments (`refill_segment`): the episode each runs (N: idle) and
  the tokens of its current action."""

  ep_S: jax.Array
  k_S: jax.Array

  @classmethod
  def idle(cls, slots: int, episodes: int) -> Slots:
    return cls(jnp.full((slots,), episodes, jnp.int32), jnp.zeros((slots,), jnp.int32))


def _slot_loop(params, state, slots: Slots, hyper, ready_N, *, model_fn, stop_ids, turn_tokens,
               max_steps: int | None):  # fmt: skip
  """Decode steps through the slots while one runs or an episode is ready (at most
  `max_steps`; None: until then). Returns (state, slots, ready_N left, acted_N: the
  episodes whose action ended, written: with `max_steps`, each step's (episode [K, S], N
  where a slot idled; column [K, S]; token [K, S]), else ())."""
  N, T = state.tokens_NT.shape
  stop = jnp.asarray(stop_ids, jnp.int32)
  limit = jnp.iinfo(jnp.int32).max if max_steps is None else max_steps
  shape = (max_steps or 0, slots.ep_S.shape[0])
  written = () if max_steps is None else tuple(jnp.full(shape, v, jnp.int32) for v in (N, 0, 0))

  def cond(carry):
    _, ep_S, _, ready_N, _, _, j = carry
    return (jnp.any(ep_S < N) | jnp.any(ready_N)) & (j < limit)

  def body(carry):
    s, ep_S, k_S, ready_N, acted_N, written, j = carry
    ep_S, k_S, ready_N = _fill(ep_S, k_S, ready_N)
    live_S = ep_S < N
    n_S = jnp.minimum(ep_S, N - 1)
    tok_S, pos_S, t_S = s.tok_N[n_S], s.pos_N[n_S], s.t_N[n_S]
    logits_S1V, pages = _forward_slots(
      params, s.cache, ep_S, tok_S, pos_S, t_S, live_S, model_fn=model_fn
    )
    keys_S = sampling.keys_by_row(s.key, n_S, t_S)
    new_S, logp_S, policy_S = sampling.choose_tokens(
      logits_S1V[:, -1], keys_S, hyper, row_keys=True
    )
    rows_S = jnp.where(live_S, ep_S, N)  # N: an idle slot writes nothing.
    put = lambda buf_NT, x_S: buf_NT.at[rows_S, t_S].set(x_S.astype(buf_NT.dtype), mode="drop")  # noqa: E731
    row = lambda buf_N, x_S: buf_N.at[rows_S].set(x_S, mode="drop")  # noqa: E731
    s = s.replace(
      cache=pages,
      tok_N=row(s.tok_N, new_S),
      pos_N=row(s.pos_N, pos_S + 1),
      t_N=row(s.t_N, t_S + 1),
      tokens_NT=put(s.tokens_NT, new_S),
      mask_NT=put(s.mask_NT, live_S),
      action_mask_NT=put(s.action_mask_NT, live_S),
      logp_NT=put(s.logp_NT, logp_S),
      policy_logp_NT=put(s.policy_logp_NT, policy_S),
      step=s.step + ep_S.shape[0] / N,
    )
    k_S = k_S + live_S
    ended_S = live_S & (jnp.isin(new_S, stop) | (t_S + 1 >= T) | (k_S >= turn_tokens))
    acted_N = acted_N.at[jnp.where(ended_S, ep_S, N)].set(True, mode="drop")
    written = tuple(w.at[j].set(x) for w, x in zip(written, (rows_S, t_S, new_S)))
    return s, jnp.where(ended_S, N, ep_S), k_S, ready_N, acted_N, written, j + 1

  ready_N = jnp.asarray(ready_N, jnp.bool_)
  # A ready episode with no column left acts at once, with an empty action (the host then
  # ends it, token_limit, as the lockstep loop's next turn would).
  acted_N, ready_N = ready_N & (state.t_N >= T), ready_N & (state.t_N < T)
  carry = (state, slots.ep_S, slots.k_S, ready_N, acted_N, written, jnp.int32(0))
  s, ep_S, k_S, ready_N, acted_N, written, _ = jax.lax.while_loop(cond, body, carry)
  return s, Slots(ep_S, k_S), ready_N, acted_N, written


def refill_turn(
  params,
  state,
  hyper: sampling.SamplingParams,
  active_N,
  *,
  model_fn: Callable,
  stop_ids: tuple[int, ...],
  turn_tokens: int,
  slots: int,
):
  """One action per active episode (`episodes.decode_turn`'s ends: a stop id, kept as the
  action's last token; `turn_tokens` tokens; the budget T), decoded S = `slots` episodes a
  step: a slot whose episode ends its action takes the next one still to act. `state`:
  an `episodes.EpisodeState` on pages; its `step` grows by S/N a decode step."""
  N = state.tokens_NT.shape[0]
  kw = dict(model_fn=model_fn, stop_ids=stop_ids, turn_tokens=turn_tokens, max_steps=None)
  return _slot_loop(params, state, Slots.idle(slots, N), hyper, active_N, **kw)[0]


def refill_segment(params, state, slots: Slots, hyper, ready_N, *, model_fn: Callable,
                   stop_ids: tuple[int, ...], turn_tokens: int, steps: int):  # fmt: skip
  """At most `steps` decode steps through the slots, carried over from the segment before
  (env.overlap_steps: the host runs environment steps meanwhile): idle slots take ready
  episodes as in `refill_turn`, and a slot keeps its episode across segments until the
  action ends. Returns (state, slots, ready_N: the ready episodes no slot took yet,
  acted_N: the episodes whose action ended in this segment, written: the tokens it
  decoded, as (episode, column, token) [steps, S] each, episode N where a slot idled: what
  the host reads of the actions, instead of the [N, T] token buffer)."""
  kw = dict(model_fn=model_fn, stop_ids=stop_ids, turn_tokens=turn_tokens, max_steps=steps)
  return _slot_loop(params, state, slots, hyper, ready_N, **kw)


def observation_block(tok_R, pos_R, obs_RO, n_R, *, pad_id: int):
  """What an append feeds for each row's n_R[r] observation tokens obs_RO[r, :n]:
  [tok_R, obs_0, ..., obs_{n−2}] (pads past n) at positions pos_R + 0..n−1 (−1 past n),
  which columns hold a token, and obs_{n−1}, the row's next token to feed. Returns
  (feed_RO, pos_RO, has_RO, last_R); `episodes.append` and `append_rows`."""
  j_O = jnp.arange(obs_RO.shape[1])
  has_RO = j_O[None, :] < n_R[:, None]
  feed_RO = jnp.where(has_RO, jnp.concatenate([tok_R[:, None], obs_RO[:, :-1]], axis=1), pad_id)
  pos_RO = jnp.where(has_RO, pos_R[:, None] + j_O[None, :], -1)
  last_R = jnp.take_along_axis(obs_RO, jnp.maximum(n_R - 1, 0)[:, None], axis=1)[:, 0]
  return feed_RO, pos_RO, has_RO, last_R


def append_rows(params, state, idx_R, obs_RO, n_R, *, model_fn: Callable, pad_id: int,
                chunk: int = 0):  # fmt: skip
  """`episodes.append` for R episodes only (idx_R; N: none), on pages: episode idx_R[r]
  gets its n_R[r] observation tokens obs_RO[r, :n] (fed after its last token, as there),
  in one call of R rows (in calls of `chunk` columns with 0 < chunk < O), through an R-row
  view of the page table whose rows, with the pages they took, are put back. The
  overlapped loop appends the observations that are ready, not all N rows'."""
  N, T = state.tokens_NT.shape
  width = obs_RO.shape[1]
  has_R = idx_R < N
  n_R = jnp.where(has_R, jnp.asarray(n_R, jnp.int32), 0)
  r_R = jnp.minimum(idx_R, N - 1)
  tok_R, pos_R, t_R = state.tok_N[r_R], state.pos_N[r_R], state.t_N[r_R]
  feed_RO, pos_RO, has_RO, last_R = observation_block(tok_R, pos_R, obs_RO, n_R, pad_id=pad_id)
  pages, c = state.cache, state.cache.cache
  view = pages.replace(cache=c.rows(r_R))
  _, view = paged.append_block(
    params, view, feed_RO, pos_RO, t_R, n_R, model_fn=model_fn, chunk=chunk, logits=False
  )
  # Rows put back their table rows (with the pages they took) and window rings.
  pages = view.replace(cache=c.put_rows(jnp.where(has_R, idx_R, N), view.cache, tables=True))
  moved_R = jnp.where(n_R > 0, idx_R, N)
  rows_RO = jnp.where(has_RO, idx_R[:, None], N)
  cols_RO = jnp.minimum(t_R[:, None] + jnp.arange(width)[None, :], T)
  put = lambda buf, x: buf.at[rows_RO, cols_RO].set(x, mode="drop")  # noqa: E731
  return state.replace(
    cache=pages,
    tok_N=state.tok_N.at[moved_R].set(last_R, mode="drop"),
    pos_N=state.pos_N.at[moved_R].set(pos_R + n_R, mode="drop"),
    t_N=state.t_N.at[moved_R].set(t_R + n_R, mode="drop"),
    tokens_NT=put(state.tokens_NT, obs_RO),
    mask_NT=put(state.mask_NT, True),
    step=state.step + idx_R.shape[0] * width / N,
  )


def overlap_pieces(runner, model_fn: Callable, *, constrain: Callable) -> dict:
  """The overlapped loop's jitted pieces (`play_overlapped`): "segment" (`refill_segment`,
  env.overlap_steps decode steps) and "append_rows" (`append_rows`, up to S rows a call);
  both donate the state and return it through `constrain` (its rows split as the other
  pieces' are). Refill slots on pages only (`episodes.Runner._turn` checks)."""
  scfg, cfg = runner.sampler_cfg, runner.cfg
  if not scfg.refill_slots:
    raise ValueError(
      f"config.env.overlap_steps={cfg.overlap_steps} needs config.sampler.refill_slots > 0 "
      "(the slots a waiting episode frees)."
    )
  segment = functools.partial(
    refill_segment, model_fn=model_fn, stop_ids=runner.stop_ids, turn_tokens=cfg.turn_tokens,
    steps=cfg.overlap_steps,
  )  # fmt: skip
  append = functools.partial(
    append_rows, model_fn=model_fn, pad_id=scfg.pad_id, chunk=scfg.prefill_chunk
  )

  def segment_rows(*args):
    state, *rest = segment(*args)
    return constrain(state), *rest

  return {
    "segment": jax.jit(segment_rows, donate_argnums=(1,)),
    "append_rows": jax.jit(lambda *args: constrain(append(*args)), donate_argnums=(1,)),
  }


def play_overlapped(runner, params, state, hyper, rows, clock):
  """The episodes from their first action to their end with environment steps overlapping
  the decoding (env.overlap_steps = K): segments of at most K decode steps through the S
  slots; after each, the actions that ended go to their environments (`stepping.Flight`:
  they run on the step workers while the next segments decode), and the observations that
  came back are appended, S episodes a call (`append_rows`); an episode is ready to act
  again once its observation is in. The host waits on the environments only when no slot
  has an episode and none is ready. Each episode's turns, limits and end reasons are the
  lockstep loop's (`episodes.Runner._action`, `_answer`, the observation limits of
  `_observe`), and its draws are keyed by episode and column, so the episodes are those of
  the lockstep turns drawing with the same keys, whatever the tools' timing.

  On several processes each steps the environments of its own rows (`rows.mine`; every
  row must have one owner, `one_owner_each`), and after each segment the processes agree
  (`_env_phase`): the answers taken anywhere are all-gathered, so every process appends the
  same observations and marks the same episodes ready, and the next segment is the same
  program call everywhere. When no process can go on, each polls its steps until one has
  an answer (`_take`). Returns the final state (every episode ended)."""
  N, S = len(rows.t_N), runner.sampler_cfg.refill_slots
  if jax.process_count() > 1 and rows.sharding is not None:
    one_owner_each(rows.sharding, N)
  slots, ready_N, busy = Slots.idle(S, N), rows.running_N.copy(), False
  actions_NT = np.zeros((N, runner.sampler_cfg.max_new_tokens), np.int32)  # As decoded.
  flight = runner._steps.flight()
  try:
    while rows.running_N.any():
      acted = np.zeros(0, np.int64)
      if busy or ready_N.any():
        with clock("sample"):
          state, slots, left_N, acted_N, written = runner.pieces["segment"](
            params, state, slots, hyper, ready_N
          )
          got = distributed.host_values(left_N, acted_N, slots.ep_S, state.t_N, *written)
          ready_N, acted, busy = np.array(got[0]), np.flatnonzero(got[1]), (got[2] < N).any()
          rows.t_N = np.array(got[3], np.int32)
          n_KS, t_KS, tok_KS = got[4:]
          actions_NT[n_KS[n_KS < N], t_KS[n_KS < N]] = tok_KS[n_KS < N]
      with clock("env"):
        mine = acted[(acted >= rows.mine.start) & (acted < rows.mine.stop)]
        obs = _env_phase(runner, rows, flight, mine, actions_NT, busy=busy or ready_N.any())
      with clock("sample"):
        state = _append_answers(runner, params, state, rows, obs)
      ready_N[[i for i in obs if rows.running_N[i]]] = True
  finally:
    flight.close()
  return state


def one_owner_each(sharding, n: int) -> None:
  """ValueError unless each of the n episode rows belongs to one process: overlapped, the
  holders of a row would each step their own environment of it, and their answers come
  back at different times (a mesh whose batch axes span fewer devices than the processes
  replicates rows across processes)."""
  spans = sorted(distributed.row_ranges(sharding, n).items(), key=lambda kv: kv[1])
  for (p, (_, stop)), (q, (start, _)) in zip(spans, spans[1:]):
    if start < stop:
      raise ValueError(
        f"config.env.overlap_steps on several processes needs each episode row on one "
        f"process; this mesh gives processes {p} and {q} rows [{start}, {stop}) both (its "
        "batch axes, data x fsdp, span fewer devices than the processes). Use turns "
        "(env.overlap_steps=0) or a mesh whose batch axes split the rows over the processes."
      )


def _env_phase(runner, rows, flight, mine, actions_NT, *, busy: bool) -> dict:
  """After a segment: the actions this process's episodes `mine` ended go to their
  environments (`stepping.Flight`); then the answers taken ({episode: observation}, ()
  where the episode ended), every process's (`_shared`). Waits for an answer only when no
  process can go on: no slot busy and no episode ready (`busy`), no failed action."""
  failed = []
  for i in mine:
    action = runner._action(rows, i, actions_NT[i])
    if isinstance(action, str):
      flight.submit(i, rows.envs[i], action)
    elif action is not None:
      failed.append((i, action))
  rows.share()  # Turns, and the token limits `_action` ended.
  can_go = busy or distributed.any_across(bool(failed))
  if not (can_go or distributed.any_across(flight.pending > 0)) and rows.running_N.any():
    raise RuntimeError(f"episodes {np.flatnonzero(rows.running_N)} neither act nor wait")
  got = sorted(failed + _take(flight, wait=not can_go))
  last = lambda i: rows.turns_N[i] >= runner.cfg.max_turns  # noqa: E731
  return _shared(runner, rows, {i: runner._answer(rows, i, o, last_turn=last(i)) for i, o in got})


_POLL_S = 0.01  # How long a process waits on its own steps before asking the others.


def _take(flight, *, wait: bool) -> list:
  """The steps done; with `wait`, at least one on some process: one process blocks on its
  flight; several poll theirs (`_POLL_S`) and ask the others after each poll, so the first
  answer anywhere ends every process's wait."""
  if jax.process_count() == 1:
    return flight.take(block=wait)
  got = flight.take(block=False)
  while wait and not distributed.any_across(bool(got)):
    got += flight.take(block=True, timeout=_POLL_S)
  return got


def _shared(runner, rows, obs: dict) -> dict:
  """This process's answers ({episode: observation tokens}, () where the episode ended)
  -> every process's, on every process, with the rows' rewards, ends and turns
  (`rows.share`).
  An observation longer than env.observation_tokens O travels as its first O tokens and
  pads to its length: `_append_answers` ends its episode without appending it."""
  rows.share()
  if jax.process_count() == 1:
    return obs
  N, width, pad = len(rows.t_N), runner.cfg.observation_tokens, runner.sampler_cfg.pad_id
  # [N, 2 + O] per row: answered, length, the first O tokens (one all-gather).
  packed_NO = np.zeros((N, 2 + width), np.int32)
  packed_NO[:, 2:] = pad
  for i, o in obs.items():
    packed_NO[i, :2] = 1, len(o)
    packed_NO[i, 2 : 2 + min(len(o), width)] = o[:width]
  packed_NO = rows.gather(packed_NO)
  answered_N, n_N, obs_NO = packed_NO[:, 0], packed_NO[:, 1], packed_NO[:, 2:]
  out = {}
  for i in np.flatnonzero(answered_N):
    out[int(i)] = tuple(int(t) for t in obs_NO[i, : n_N[i]]) + (pad,) * max(0, n_N[i] - width)
  return out


def _append_width(n: int, slots: int) -> int:
  """Rows of an append call for n observations: the smallest of S, S/2, S/4, S/8 (at
  least 1) that holds them, so a call with few ready episodes computes few rows (one
  compile per width)."""
  widths = sorted({max(1, -(-slots // 2**j)) for j in range(4)})
  return next(w for w in widths if w >= n)


def _append_answers(runner, params, state, rows, obs: dict):
  """The observations `obs` ({episode: tokens}) of running episodes appended, at most S a
  call (`_append_width` rows); one over env.observation_tokens or leaving no column for
  another action ends its episode (token_limit), as `episodes.Runner._observe` does."""
  width = runner.cfg.observation_tokens
  N, S, pad = len(rows.t_N), runner.sampler_cfg.refill_slots, runner.sampler_cfg.pad_id
  n_N = np.zeros(N, np.int32)
  n_N[list(obs)] = [len(o) for o in obs.values()]
  runner.end_over_limit(rows, n_N)
  todo = [(i, o) for i, o in sorted(obs.items()) if o and rows.running_N[i]]
  for k in range(0, len(todo), S):
    part = todo[k : k + S]
    R = _append_width(len(part), S)
    idx_R, n_R = np.full(R, N, np.int32), np.zeros(R, np.int32)
    obs_RO = np.full((R, width), pad, np.int32)
    for r, (i, o) in enumerate(part):
      idx_R[r], n_R[r], obs_RO[r, : len(o)] = i, len(o), o
    state = runner.pieces["append_rows"](params, state, idx_R, obs_RO, n_R)
  for i, o in todo:
    rows.t_N[i] += len(o)
  for i in obs:
    rows.action_start_N[i] = rows.t_N[i]
  return state
