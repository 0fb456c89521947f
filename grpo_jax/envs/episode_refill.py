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
`tests/envs/test_episodes.py`). Greedy decoding draws nothing. Only the refill loop uses these keys, so lockstep runs keep their draws.

The environments' steps stay a barrier between turns (`episodes.Runner._act`, as in the
lockstep runner); what refill removes is the decode padding within a turn.

Hand-written: the refill sampler of single-turn rows (`models.refill`) retires a row for
good and loads a new prompt into its slot; an episode pauses between actions and keeps
its pages, which that sampler has no way to express.

Shape letters as in `episodes`; S slots.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

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
  n_S = jnp.minimum(ep_S, N - 1)
  view = pages.replace(cache=c.replace(table_NM=c.table_NM[n_S], slot_N=c.slot_N[n_S]))
  logits_S1V, view = paged.forward(params, view, tok_S, pos_S, t_S, live_S, model_fn=model_fn)
  return logits_S1V, view.replace(cache=view.cache.replace(table_NM=c.table_NM, slot_N=c.slot_N))


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
  an `episodes.EpisodeState` on pages; its `step` grows by S a decode step (row-columns
  computed)."""
  N, T = state.tokens_NT.shape
  stop = jnp.asarray(stop_ids, jnp.int32)

  def cond(carry):
    _, ep_S, _, ready_N = carry
    return jnp.any(ep_S < N) | jnp.any(ready_N)

  def body(carry):
    s, ep_S, k_S, ready_N = carry
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
      step=s.step + ep_S.shape[0],
    )
    k_S = k_S + live_S
    ended_S = live_S & (jnp.isin(new_S, stop) | (t_S + 1 >= T) | (k_S >= turn_tokens))
    return s, jnp.where(ended_S, N, ep_S), k_S, ready_N

  ready_N = jnp.asarray(active_N, jnp.bool_) & (state.t_N < T)
  idle_S = jnp.full((slots,), N, jnp.int32)
  carry = (state, idle_S, jnp.zeros((slots,), jnp.int32), ready_N)
  return jax.lax.while_loop(cond, body, carry)[0]
