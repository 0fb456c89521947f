"""Multi-turn episodes: the policy acts, an environment answers, until the episode ends.

    env_cls = envs.get("calculator")
    runner = episodes.Runner(model_fn=..., init_cache=..., sampler_cfg=...,
                             cfg=episodes.EpisodeConfig(name="calculator"), tokenizer=tok,
                             make_env=functools.partial(env_cls, tokenizer=tok), env_cls=env_cls)
    got = runner.run(params, prompts, examples_B, key, hyper)
    got.rollouts (Rollouts with action_mask_NT), got.reward_N, got.end_N, got.seconds

An `Environment` (`envs.base`) is a host object per episode: `reset(example)` returns observation tokens
put in the context before the first action (often none: the prompt already states the
problem), `step(action_text)` returns a `Step` (observation tokens, reward, done). Strings,
environments and rewards stay on the host; the jitted pieces map pytrees to pytrees.

One episode is one rollout row: its completion region holds the model's actions and the
environment's observations in order, [a_1 ; o_1 ; a_2 ; o_2 ; ... ; a_K], right-padded to
T = sampler.max_new_tokens (the episode's token budget). `mask_NT` marks every token in the
context (actions and observations: position ids and attention see both, as a single-turn
sampler would on the concatenated text) and `action_mask_NT` the model's own tokens: only
those are trained or counted (`preparation.action_view`). Group sampling, advantages and planners
see one row per episode with a sequence reward R_i = Σ_k r_{i,k}, the sum of its steps'
rewards.

The loop (`Runner.run`), all rows in lockstep turns:
  1. `start`: the prompts minus their last token are prefilled once per prompt and the
     cache repeated to the G rows of each group (as `sampling.prefill`); the cache gets a
     write column per row and `observation_tokens` spare columns. With
     sampler.kv_layout="paged" the prompts go into pages the G rows of a group read, and
     each row takes pages as its episode grows (`paged.take`, from a whole pool).
  2. `decode_turn` (jitted `lax.while_loop`): every live row samples tokens until it emits
     a turn-end token (the environment's `stop_text`, or EOS), or `turn_tokens` tokens,
     or the budget T is spent. Rows not live this turn feed nothing (position −1: their
     cache and write column stay put).
  3. On the host: each row's new action tokens are decoded (decode only: the sampled ids
     stay in the token buffer, never re-encoded) and passed to its environment's `step`;
     the steps of a turn run at once on `step_workers` threads (`stepping`: a step is
     often a wait on a child process, like the code environment's sandbox), each within
     its environment's `step_budget_s`, and come back in row order.
  4. `append` (jitted): the observation tokens are written into each row's cache at its own
     write column, one padded block of `observation_tokens` columns for all rows (pad
     columns have position −1: invisible, and the write column advances by the row's own
     count), and into the token buffer with action mask False. The history is never
     re-encoded: one forward of the new tokens per turn (on pages too: `paged.append_block`).
  5. Repeat until every episode ended, at most `max_turns` turns.
With sampler.refill_slots = S (pages only), step 2 decodes through S slots instead of all
N rows, a slot taking the next episode to act when its own ends its action; with
env.overlap_steps = K there are no turns: segments of K decode steps alternate with the
environment steps and appends of the episodes that are ready (`episode_refill`).
On several processes, each holds the environments of its own rows (those its devices
hold) and steps 1 and 3 run there for them; the per-row outcomes (reward, end, turns,
observation counts) are all-gathered after each host phase, so every process feeds the
jitted pieces the same running rows (`_Rows`).

Why an episode ended (`END_REASONS`, per row in `end_N`):
  done         the environment's step returned done=True (an answer, or it gave up);
  turn_limit   max_turns actions without done;
  token_limit  the budget T ran out: an action was cut at T, or an observation did not fit
               the budget or `observation_tokens`;
  env_error    reset or step raised (or returned a non-finite reward); the row is
               unscorable (`rl.unscorable` decides);
  step_timeout a step ran past its environment's `step_budget_s`: its result (reward,
               observation, done, or what it raised) is discarded, and the episode ends
               scored, like a turn or token limit.
The reward is the sum of the rewards received until then (0 for env_error).

Why step_timeout is a scored end, not env_error. The late step's reward is unknown and
counts 0, so for an environment that rewards only its final answer (the code
environment) a late answer is a zero. Unscorable would drop the row from training
(`rl.unscorable`), so a policy that learned to be slow on problems it would fail (code
that hangs the sandbox past its own timeout) would opt out of its zeros; scored, being
slow never beats failing. The budget is the environment's own worst case plus a margin
(the code environment's: its largest sandbox timeout + `envs.code.STEP_MARGIN_S`), so a
step past it is pathological; a host too loaded to meet it shows as
episode/end/step_timeout. The late step's thread may still run: the loop drops its row's
environment (never read again: its outcome label is "") and keeps nothing the step
returns.

Shape letters: B prompts, G group size, N = B·G episodes, P prompt tokens, T the episode
token budget, O = observation_tokens, V vocab.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.envs import base, episode_refill, stepping
from grpo_jax.infra import distributed
from grpo_jax.models import kv_cache, paged, sampling, sharding
from grpo_jax.models import model as model_lib

END_REASONS = ("done", "turn_limit", "token_limit", "env_error", "step_timeout")
DONE, TURN_LIMIT, TOKEN_LIMIT, ENV_ERROR, STEP_TIMEOUT = range(len(END_REASONS))


@dataclasses.dataclass(frozen=True, kw_only=True)
class EpisodeConfig:
  """config.env: the environment by registry name, its options, and the episode limits."""

  name: str
  kwargs: dict = dataclasses.field(default_factory=dict)
  max_turns: int = 4  # Actions per episode.
  turn_tokens: int = 16  # Tokens per action.
  observation_tokens: int = 8  # Tokens per observation (O, the append's static width).
  # Threads that run the environment steps of a turn at once (`stepping`); 1: one by one on
  # the trainer's thread. Each code environment step is a sandbox process: keep it at most
  # the cores the sandboxes may use, since a run's timeout is wall-clock time.
  step_workers: int = 8
  # With sampler.refill_slots (pages): decode in segments of this many steps while the
  # environment steps of finished actions run, so an episode waiting on a tool frees its
  # slot (`episode_refill.play_overlapped`); 0: turns, the steps between them.
  overlap_steps: int = 0

  def __post_init__(self):
    if not self.name:
      raise ValueError("config.env.name must name an environment (or leave config.env off).")
    for attr in ("max_turns", "turn_tokens", "observation_tokens", "step_workers"):
      if getattr(self, attr) < 1:
        raise ValueError(f"config.env.{attr} must be >= 1, got {getattr(self, attr)}.")
    if self.overlap_steps < 0:
      raise ValueError(f"config.env.overlap_steps must be >= 0 (0: off), got {self.overlap_steps}.")


# ----------------------------------------------------------------------------
# Jitted pieces.
# ----------------------------------------------------------------------------


@flax.struct.dataclass
class EpisodeState:
  """The episodes' device state between turns. The cache holds the context up to, not
  including, `tok_N` (the next token to feed, at position `pos_N`); `t_N` counts the filled
  completion columns; `step` the token columns computed over N rows, a float32 (1 a
  lockstep decode step, S/N a step of S refill slots, O an append of N rows, R·O/N one of
  R): Rollouts.num_steps is its ceiling (`to_rollouts`), so `pad/sample_frac` and the
  sampling FLOPs count the appends' padding too (a count of row-columns would pass 2^31 at
  N·T ≈ 65k × 32k)."""

  cache: Any
  key: jax.Array
  tok_N: jax.Array
  pos_N: jax.Array
  t_N: jax.Array
  tokens_NT: jax.Array
  mask_NT: jax.Array
  action_mask_NT: jax.Array
  logp_NT: jax.Array
  policy_logp_NT: jax.Array
  step: jax.Array


def _rows_constrained(state: EpisodeState) -> EpisodeState:
  """The state's per-row arrays ([N] and [N, T]) split over the batch axes (in a layout's
  context: `Runner.context`; a no-op outside one), so every piece takes and returns the
  state sharded alike (the KV cache is constrained by `KVCache.constrain`)."""
  rows = lambda x: nn.with_logical_constraint(x, ("activation_batch",) + (None,) * (x.ndim - 1))  # noqa: E731
  cache = state.cache
  if isinstance(cache, kv_cache.KVCache) and cache.index.ndim == 1:
    cache = cache.replace(index=rows(cache.index))
  return state.replace(
    cache=cache,
    **{
      f: rows(getattr(state, f))
      for f in ("tok_N", "pos_N", "t_N", "tokens_NT", "mask_NT", "action_mask_NT", "logp_NT",
                "policy_logp_NT")
    },
  )  # fmt: skip


def start(
  params,
  prompts: sampling.Prompts,
  key,
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
  observation_tokens: int,
) -> EpisodeState:
  """Prefills each prompt minus its last token once into the cache of cfg.kv_layout
  (`_CACHES`) and starts the episodes."""
  tokens_BP = jnp.asarray(prompts.tokens_BP, jnp.int32)
  mask_BP = jnp.asarray(prompts.mask_BP, jnp.bool_)
  (B, P), G, T = tokens_BP.shape, cfg.group_size, cfg.max_new_tokens
  N = B * G
  if P < 2:
    raise ValueError(f"Prompt batches need >= 2 slots, got shape {(B, P)}.")
  positions_BP = model_lib.positions_from_mask(mask_BP)
  make = _CACHES[cfg.kv_layout]
  cache = make(params, tokens_BP, positions_BP, model_fn=model_fn, init_cache=init_cache, cfg=cfg,
               observation_tokens=observation_tokens)  # fmt: skip
  zeros = lambda dtype: jnp.zeros((N, T), dtype)
  return _rows_constrained(
    EpisodeState(
      cache=cache,
      key=key,
      tok_N=jnp.repeat(tokens_BP[:, -1], G),
      pos_N=jnp.repeat(positions_BP[:, -1], G),
      t_N=jnp.zeros((N,), jnp.int32),
      tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
      mask_NT=zeros(jnp.bool_),
      action_mask_NT=zeros(jnp.bool_),
      logp_NT=zeros(jnp.float32),
      policy_logp_NT=zeros(jnp.float32),
      step=jnp.zeros((), jnp.float32),
    )
  )


def _dense_cache(params, tokens_BP, positions_BP, *, model_fn, init_cache, cfg, observation_tokens):
  """The cache repeated to the G rows of each group, with a write column per row; P − 1 +
  T + O columns (O spare: the padded observation block of `append` never runs past the
  end)."""
  (B, P), G, T = tokens_BP.shape, cfg.group_size, cfg.max_new_tokens
  cache = sampling.prefill_cache(
    params, tokens_BP[:, :-1], positions_BP[:, :-1], init_cache=init_cache,
    length=P - 1 + T + observation_tokens, model_fn=model_fn, chunk=cfg.prefill_chunk,
  )  # fmt: skip
  return cache.repeat(G).replace(index=jnp.full((B * G,), P - 1, jnp.int32))


def _paged_cache(params, tokens_BP, positions_BP, *, model_fn, init_cache, cfg, observation_tokens):
  """`paged.Pages`: the prompts' pages at the front of the pool, read by the G rows of each
  group (sampler.shared_prefix; else each row gets its own copy), and completion pages for
  every row's T tokens. The pool never runs short (kv_pool_fraction 1): an episode the pool
  cut would be scored as a truncated one. Observations take slots as actions do (fed a
  block a call by `_write_paged`), so no spare columns."""
  del observation_tokens
  cfg = dataclasses.replace(cfg, kv_pool_fraction=1.0)
  dense, _ = paged.prefill_prompts(
    params, tokens_BP, positions_BP, init_cache=init_cache, model_fn=model_fn, cfg=cfg
  )
  return paged.group_pool(dense, cfg=cfg)


def _feed_dense(params, cache, tok_N, pos_N, t_N, live_N, *, model_fn):
  """(logits [N, 1, V], cache): tok_N at each live row's write column; a row not live
  feeds position −1 (its key is invisible) and its write column stays."""
  del t_N
  logits_N1V, out = model_fn(params, tok_N[:, None], jnp.where(live_N, pos_N, -1)[:, None], cache)
  return logits_N1V, out.replace(index=jnp.where(live_N, out.index, cache.index))


def _feed_paged(params, pages, tok_N, pos_N, t_N, live_N, *, model_fn):
  """(logits [N, 1, V], pages): tok_N at each live row's completion slot t_N, a page taken
  first where t_N starts one (`paged.take`: the pool is whole, so none starves); a row not
  live writes nothing."""
  need_N = live_N & (t_N % pages.cache.page_size == 0)
  pages, _ = paged.take(pages, need_N, t_N)
  return paged.forward(params, pages, tok_N, pos_N, t_N, live_N, model_fn=model_fn)


def _write_dense(params, state, feed_NO, pos_NO, n_N, *, model_fn, chunk=0):
  """(cache, token columns computed): the O-token block in one forward (pad columns at
  position −1), the write column advanced by each row's n. (`chunk` is the paged write's.)"""
  del chunk
  _, cache = model_fn(params, feed_NO, pos_NO, state.cache)
  return cache.replace(index=state.cache.index + n_N), feed_NO.shape[1]


def _write_paged(params, state, feed_NO, pos_NO, n_N, *, model_fn, chunk=0):
  """(pages, token columns computed): the O-token block on the rows' pages, after the
  pages it starts are taken (`paged.append_block`), in one call or in calls of `chunk`."""
  _, pages = paged.append_block(
    params, state.cache, feed_NO, pos_NO, state.t_N, n_N, model_fn=model_fn, chunk=chunk,
    logits=False,
  )  # fmt: skip
  return pages, feed_NO.shape[1]


# Per sampler.kv_layout: the cache `start` makes, one token fed per row (`decode_turn`),
# and an observation block written in one model call (`append`).
_CACHES = {"dense": _dense_cache, "paged": _paged_cache}
_FEEDS = {"dense": _feed_dense, "paged": _feed_paged}
_WRITES = {"dense": _write_dense, "paged": _write_paged}


def _put(buf_NT, rows_N, cols_N, x_N):
  """buf[rows, cols] = x; rows out of range (N: not written) are dropped."""
  return buf_NT.at[rows_N, cols_N].set(x_N.astype(buf_NT.dtype), mode="drop")


def decode_turn(
  params,
  state: EpisodeState,
  hyper: sampling.SamplingParams,
  active_N,
  *,
  model_fn: Callable,
  stop_ids: tuple[int, ...],
  turn_tokens: int,
  pad_id: int,
  kv_layout: str = "dense",
  row_keys: bool = False,
) -> EpisodeState:
  """One action per active row: tokens are sampled until a stop id (kept, as the action's
  last token), `turn_tokens` tokens, or the budget T. A row not live feeds a pad that
  nothing sees, and its cache does not advance (`_FEEDS[kv_layout]`). With `row_keys`,
  token t of row n is drawn with the refill loop's key (`sampling.keys_by_row`; the
  state's key is not split): the same episodes as `episode_refill.refill_turn`."""
  feed = functools.partial(_FEEDS[kv_layout], model_fn=model_fn)
  N, T = state.tokens_NT.shape
  stop = jnp.asarray(stop_ids, jnp.int32)

  def cond(carry):
    _, live_N, k = carry
    return (k < turn_tokens) & jnp.any(live_N)

  def body(carry):
    s, live_N, k = carry
    feed_N = jnp.where(live_N, s.tok_N, pad_id)
    logits_N1V, cache = feed(params, s.cache, feed_N, s.pos_N, s.t_N, live_N)
    if row_keys:
      key, step_key = s.key, sampling.keys_by_row(s.key, jnp.arange(N), s.t_N)
    else:
      key, step_key = jax.random.split(s.key)
    tok_N, logp_N, policy_N = sampling.choose_tokens(
      logits_N1V[:, -1], step_key, hyper, row_keys=row_keys
    )
    rows_N = jnp.where(live_N, jnp.arange(N), N)
    put = functools.partial(_put, rows_N=rows_N, cols_N=s.t_N)
    s = s.replace(
      cache=cache,
      key=key,
      tok_N=jnp.where(live_N, tok_N, s.tok_N),
      pos_N=s.pos_N + live_N,
      t_N=s.t_N + live_N,
      tokens_NT=put(s.tokens_NT, x_N=tok_N),
      mask_NT=put(s.mask_NT, x_N=live_N),
      action_mask_NT=put(s.action_mask_NT, x_N=live_N),
      logp_NT=put(s.logp_NT, x_N=logp_N),
      policy_logp_NT=put(s.policy_logp_NT, x_N=policy_N),
      step=s.step + 1,
    )
    return s, live_N & ~jnp.isin(tok_N, stop) & (s.t_N < T), k + 1

  live_N = jnp.asarray(active_N, jnp.bool_) & (state.t_N < T)
  out = jax.lax.while_loop(cond, body, (state, live_N, jnp.zeros((), jnp.int32)))[0]
  return _rows_constrained(out)


def append(
  params, state: EpisodeState, obs_NO, n_N, *, model_fn: Callable, pad_id: int,
  kv_layout: str = "dense", chunk: int = 0,
):  # fmt: skip
  """Puts n_N[i] observation tokens obs_NO[i, :n] after row i's context (n = 0: nothing).

  The cache takes [tok_N, obs_0, ..., obs_{n−2}] at positions pos_N + 0..n−1
  (`_WRITES[kv_layout]`: in one forward, the columns past n pads at position −1; dense,
  the row's write column advanced by n; paged, the pages taken first, in calls of `chunk`
  columns when 0 < chunk < O: sampler.prefill_chunk), and obs_{n−1} becomes
  the next token to feed. The token buffer takes obs at columns t_N .. t_N + n − 1, in the
  context (mask) but not actions.
  """
  obs_NO, n_N = jnp.asarray(obs_NO, jnp.int32), jnp.asarray(n_N, jnp.int32)
  (N, width), T = obs_NO.shape, state.tokens_NT.shape[1]
  j_O = jnp.arange(width)
  feed_NO, pos_NO, has_NO, last_N = episode_refill.observation_block(
    state.tok_N, state.pos_N, obs_NO, n_N, pad_id=pad_id
  )
  cache, columns = _WRITES[kv_layout](
    params, state, feed_NO, pos_NO, n_N, model_fn=model_fn, chunk=chunk
  )
  rows_NO = jnp.where(has_NO, jnp.arange(N)[:, None], N)
  cols_NO = jnp.minimum(state.t_N[:, None] + j_O[None, :], T)  # T: out of range, dropped.
  put = lambda buf, x: buf.at[rows_NO, cols_NO].set(x, mode="drop")
  return _rows_constrained(
    state.replace(
      cache=cache,
      tok_N=jnp.where(n_N > 0, last_N, state.tok_N),
      pos_N=state.pos_N + n_N,
      t_N=state.t_N + n_N,
      tokens_NT=put(state.tokens_NT, obs_NO),
      mask_NT=put(state.mask_NT, True),
      step=state.step + columns,
    )
  )


def to_rollouts(prompts, state: EpisodeState, ended_N, *, group_size: int) -> sampling.Rollouts:
  """The episodes as Rollouts: eos_N = the environment ended the episode (`done`), and
  truncated_N its complement; `action_mask_NT` the model's tokens; num_steps the columns
  computed over N rows, rounded up (`EpisodeState.step`)."""
  state = state.replace(step=jnp.ceil(state.step).astype(jnp.int32))
  rollouts = sampling.to_rollouts(prompts, state, group_size=group_size, eos_N=ended_N)
  return rollouts.replace(action_mask_NT=state.action_mask_NT)


# ----------------------------------------------------------------------------
# Host side: the turn loop.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Episodes:
  """A batch of finished episodes: rollouts, and per row its reward, why it ended (an
  index into END_REASONS), its number of actions, and whether its rewards are valid."""

  rollouts: sampling.Rollouts
  reward_N: np.ndarray
  end_N: np.ndarray
  turns_N: np.ndarray
  seconds: dict  # "sample": the jitted pieces; "env": decoding, env steps, encoding.
  messages: tuple[str, ...] = ()  # The first environment errors.
  labels: tuple[str, ...] = ()  # Each row's outcome label ("" when none).
  outcomes: tuple[str, ...] = ()  # The environment's label vocabulary.

  @property
  def scorable_N(self) -> np.ndarray:
    return self.end_N != ENV_ERROR

  def metrics(self) -> dict:
    """Means over the batch's episodes (`metrics.DEFINITIONS`, "episode/...")."""
    r = self.rollouts
    actions = distributed.host_value(jnp.sum(r.action_mask_NT, axis=1))
    out = {
      "episode/turns": float(self.turns_N.mean()),
      "episode/action_tokens": float(actions.mean()),
      "episode/observation_tokens": float((distributed.host_value(r.length_N) - actions).mean()),
    }
    for i, reason in enumerate(END_REASONS):
      out[f"episode/end/{reason}"] = float(np.mean(self.end_N == i))
    if self.outcomes:
      n, labels = len(self.labels), list(self.labels)
      for label in self.outcomes:
        out[f"reward/outcome/{label}"] = labels.count(label) / n
      out["reward/outcome/other"] = sum(x not in self.outcomes for x in labels if x) / n
    return out


@dataclasses.dataclass
class _Rows:
  """Host bookkeeping of the N episodes in flight. On several processes this process
  holds the environments of its own rows (`mine`, from the rows' `sharding`), and the
  per-row arrays are all-gathered after each host phase (`share`): every process sees
  every row's reward, end and turns."""

  envs: list  # None where a late step's environment was dropped, or another process's.
  reward_N: np.ndarray
  end_N: np.ndarray  # -1 while running.
  turns_N: np.ndarray
  t_N: np.ndarray  # Filled completion columns.
  action_start_N: np.ndarray  # Column of the current action's first token.
  messages: list  # This process's first environment errors.
  sharding: Any = None  # The rows' sharding (None: one process holds them all).
  mine: slice = dataclasses.field(default_factory=lambda: slice(0, 0))
  outcomes: tuple[str, ...] = ()  # The environment's label vocabulary.

  @classmethod
  def create(cls, n: int, sharding=None) -> _Rows:
    zeros = lambda: np.zeros(n, np.int32)
    mine = slice(0, n) if sharding is None else distributed.local_rows(sharding, n)
    return cls([None] * n, np.zeros(n), np.full(n, -1), zeros(), zeros(), zeros(), [],
               sharding, mine)  # fmt: skip

  @property
  def running_N(self) -> np.ndarray:
    return self.end_N < 0

  def gather(self, x_N: np.ndarray) -> np.ndarray:
    """A per-row array whose entries are right on this process's rows -> right on all."""
    if jax.process_count() == 1 or self.sharding is None:
      return x_N
    return distributed.gather_rows(np.asarray(x_N)[self.mine], self.sharding, len(x_N))

  def share(self) -> None:
    """Every process's rows' reward, end and turns, on every process (one all-gather of
    the three as columns of one float array: ends and turns are small integers, exact in
    float32 too)."""
    if jax.process_count() == 1 or self.sharding is None:
      return
    columns = self.gather(np.stack([self.reward_N, self.end_N, self.turns_N], axis=1))
    self.reward_N = columns[:, 0]
    self.end_N = columns[:, 1].astype(self.end_N.dtype)
    self.turns_N = columns[:, 2].astype(self.turns_N.dtype)

  def shared_labels(self, outcomes: tuple[str, ...]) -> tuple[str, ...]:
    """Each row's outcome label ("" when none), every process's rows (as indices into
    `outcomes`, all-gathered; a label outside them comes back as "?": "other")."""
    labels = ["" if e is None else e.label for e in self.envs]
    if jax.process_count() == 1 or self.sharding is None:
      return tuple(labels)
    vocab = ("", *outcomes, "?")
    own = np.asarray([vocab.index(x) if x in vocab else len(vocab) - 1 for x in labels])
    return tuple(vocab[k] for k in self.gather(own.astype(np.int32)))

  def fail(self, i: int, err: Exception) -> None:
    self.end_N[i], self.reward_N[i] = ENV_ERROR, 0.0
    if len(self.messages) < 3:
      self.messages.append(f"{type(err).__name__}: {err}")


class Runner:
  """The episode loop for one group size, with its jitted pieces compiled once per shape."""

  def __init__(
    self,
    *,
    model_fn: Callable,
    init_cache: Callable,
    sampler_cfg: sampling.SamplerConfig,
    cfg: EpisodeConfig,
    tokenizer,
    make_env: Callable[[], base.Environment],
    env_cls: type[base.Environment],
    view: Callable | None = None,
    layout: sharding.Layout | None = None,
  ):
    """`view`: the policy's params -> what model_fn reads (`model.sampler_view`: adapters
    merged), applied once per `run`; None: the params as given. `layout`
    (`sharding.Layout`): the run's mesh and rules; the pieces are traced and run in its
    context, so the model's and the cache's activation constraints apply (the cache's rows
    over the batch axes, as in the sampler), and the prompts go on its rows; None: the
    pieces follow the params' shardings. `tokenizer` None (a shapes-only Setup,
    `build.plan_setup`): the turn ends at the sampler's EOS ids only; the pieces compile
    (`aot`), `run` refuses.

    The turn and the append donate the state they take (`pieces`): the loop never reads
    the old one, so a device holds one KV cache, not two, while it decodes."""
    self.cfg, self.sampler_cfg, self.tokenizer = cfg, sampler_cfg, tokenizer
    self.layout = layout
    self.make_env = make_env
    self.stop_ids = (
      base.stop_ids(env_cls, tokenizer, cfg.kwargs)
      if tokenizer is not None
      else tuple(sampler_cfg.eos_ids)
    )
    self._steps = stepping.Steps(workers=cfg.step_workers)
    pad, width = sampler_cfg.pad_id, cfg.observation_tokens
    # The jitted pieces, by name: what `run` calls, and what `aot` compiles for a TPU.
    # Equal pieces of another runner (the same model, sampler and layout) are its jits.
    jit = functools.partial(sharding.jit, context=layout)
    self.pieces = {
      "start": jit(
        functools.partial(
          start, model_fn=model_fn, init_cache=init_cache, cfg=sampler_cfg, observation_tokens=width
        )
      ),
      "turn": jit(self._turn(model_fn), donate_argnums=(1,)),
      "append": jit(
        functools.partial(
          append,
          model_fn=model_fn,
          pad_id=pad,
          kv_layout=sampler_cfg.kv_layout,
          chunk=sampler_cfg.prefill_chunk,
        ),  # fmt: skip
        donate_argnums=(1,),
      ),
      "finish": jit(functools.partial(to_rollouts, group_size=sampler_cfg.group_size)),
    }
    if cfg.overlap_steps:
      self.pieces.update(episode_refill.overlap_pieces(self, model_fn, constrain=_rows_constrained))
    if view is not None:
      self.pieces["view"] = jit(view)

  def _turn(self, model_fn: Callable) -> Callable:
    """The turn piece: `decode_turn` on all N rows in lockstep, or with
    sampler.refill_slots = S > 0, `episode_refill.refill_turn` through S slots (pages only:
    an episode keeps its pages between actions; a dense row would be copied in and out)."""
    scfg, kw = self.sampler_cfg, dict(stop_ids=self.stop_ids, turn_tokens=self.cfg.turn_tokens)
    if not scfg.refill_slots:
      return functools.partial(
        decode_turn, model_fn=model_fn, pad_id=scfg.pad_id, kv_layout=scfg.kv_layout, **kw
      )
    if scfg.kv_layout != "paged":
      raise ValueError(
        f"Episodes with config.sampler.refill_slots={scfg.refill_slots} need "
        f'config.sampler.kv_layout="paged" (got {scfg.kv_layout!r}): an episode keeps its '
        "pages while it waits for its next action."
      )
    refill = functools.partial(
      episode_refill.refill_turn, model_fn=model_fn, slots=scfg.refill_slots, **kw
    )
    return lambda *args: _rows_constrained(refill(*args))

  def context(self):
    """The layout's mesh and rules in scope (nothing without a layout)."""
    return self.layout.context() if self.layout is not None else contextlib.nullcontext()

  def run(self, params, prompts: sampling.Prompts, examples: Sequence, key, hyper) -> Episodes:
    """Plays G episodes of each of the B examples (`examples[b]` is prompt b's: on several
    processes, None is allowed where this process plays none of b's rows); `hyper` the
    sampling parameters of every action."""
    if self.tokenizer is None:
      raise ValueError("Runner.run needs a tokenizer (this runner only compiles: `aot`).")
    with self.context():
      return self._run(params, prompts, examples, key, hyper)

  def _run(self, params, prompts: sampling.Prompts, examples: Sequence, key, hyper) -> Episodes:
    """On several processes each plays the episodes of the rows its devices hold (their
    environments live there), and the per-row outcomes are all-gathered after every host
    phase, so every process feeds the jitted pieces the same running rows and observation
    counts (`_Rows.share`)."""
    G = self.sampler_cfg.group_size
    seconds = {"sample": 0.0, "env": 0.0}
    clock = functools.partial(_timed, seconds)
    if "view" in self.pieces:
      with clock("sample"):
        params = self.pieces["view"](params)
    with clock("sample"):
      if self.layout is not None:
        prompts = jax.device_put(prompts, self.layout.rows(prompts.tokens_BP.shape[0]))
      state = self.pieces["start"](params, prompts, key)
    sharding, N = state.tokens_NT.sharding, len(examples) * G
    with clock("env"):
      rows, first = self._reset([examples[n // G] for n in range(N)], sharding)
    try:
      return self._play(params, prompts, state, hyper, rows, first, clock, seconds)
    finally:
      for env in rows.envs:  # Every episode has ended; the late ones' were dropped.
        if env is not None:
          env.close()

  def _play(self, params, prompts, state, hyper, rows: _Rows, first, clock, seconds) -> Episodes:
    """The turns of `_run` from the started state and the reset environments (`rows`) to
    the finished rollouts."""
    outcomes = rows.outcomes
    with clock("sample"):
      state = self._observe(params, state, first, rows)
    if self.cfg.overlap_steps:
      state = episode_refill.play_overlapped(self, params, state, hyper, rows, clock)
    for turn in range(self.cfg.max_turns):
      if not rows.running_N.any():
        break
      with clock("sample"):
        state = self.pieces["turn"](params, state, hyper, rows.running_N)
        tokens_NT = distributed.fetch_local(state.tokens_NT)  # This process's rows.
        t_N = distributed.host_value(state.t_N)
      with clock("env"):
        rows.t_N = np.array(t_N, np.int32)
        obs = self._act(rows, tokens_NT, last_turn=turn == self.cfg.max_turns - 1)
      with clock("sample"):
        state = self._observe(params, state, obs, rows)
    with clock("sample"):
      rollouts = jax.block_until_ready(self.pieces["finish"](prompts, state, rows.end_N == DONE))
    return Episodes(
      rollouts,
      rows.reward_N,
      rows.end_N,
      rows.turns_N,
      seconds,
      tuple(rows.messages),
      labels=rows.shared_labels(outcomes),
      outcomes=outcomes,
    )

  def _reset(self, examples_N, sharding) -> tuple[_Rows, list]:
    """A fresh environment per episode of this process's rows (`sharding`), and its reset
    observation (the resets at once where the environment can: `Environment.reset_all`)."""
    N = len(examples_N)
    rows, first = _Rows.create(N, sharding), [()] * N
    mine = range(rows.mine.start, rows.mine.stop)
    for i in mine:
      rows.envs[i] = self.make_env()
    envs = [rows.envs[i] for i in mine]
    got = type(envs[0]).reset_all(envs, [examples_N[i] for i in mine]) if envs else []
    rows.outcomes = type(envs[0]).outcomes if envs else ()
    for i, obs in zip(mine, got, strict=True):
      try:
        if isinstance(obs, BaseException):
          raise obs
        first[i] = tuple(int(t) for t in obs)
      except Exception as err:  # noqa: BLE001 -- any environment failure ends the episode.
        rows.fail(i, err)
    rows.share()
    return rows, first

  def _act(self, rows: _Rows, tokens_NT, *, last_turn: bool) -> list:
    """Each running row's new action (decoded, never re-encoded) to its environment, the
    steps at once (`stepping`); returns the observations to append (empty for rows that
    ended, and for other processes' rows). Outcomes are taken in row order, as one thread
    stepping row by row would. `tokens_NT`: this process's rows."""
    lo = rows.mine.start
    obs = [()] * len(rows.t_N)
    acting, failed = [], {}
    for i in np.flatnonzero(rows.running_N):
      if not rows.mine.start <= i < rows.mine.stop:
        continue
      action = self._action(rows, i, tokens_NT[i - lo])
      if isinstance(action, str):
        acting.append((i, action))
      elif action is not None:
        failed[i] = action
    got = self._steps.run([(rows.envs[i], action) for i, action in acting])
    outcomes = {**failed, **{i: o for (i, _), o in zip(acting, got)}}
    for i in sorted(outcomes):
      obs[i] = self._answer(rows, i, outcomes[i], last_turn=last_turn)
    rows.share()
    return obs

  def _action(self, rows: _Rows, i: int, tokens_T) -> str | stepping.Outcome | None:
    """Row i's new action (tokens_T: its token buffer row) counted as a turn: its text for
    the environment, a failed Outcome when it cannot be decoded, or None when it ended the
    episode (cut at the budget T without a stop id: token_limit)."""
    action_ids = tokens_T[rows.action_start_N[i] : rows.t_N[i]]
    rows.turns_N[i] += 1
    stopped = len(action_ids) > 0 and int(action_ids[-1]) in self.stop_ids
    if rows.t_N[i] >= len(tokens_T) and not stopped:
      rows.end_N[i] = TOKEN_LIMIT
      return None
    rows.envs[i].action_eos = stopped and int(action_ids[-1]) in self.tokenizer.eos_ids
    try:
      return self.tokenizer.decode(action_ids)
    except Exception as err:  # noqa: BLE001 -- any environment failure ends the episode.
      return stepping.Outcome(error=err)

  def _answer(self, rows: _Rows, i: int, outcome: stepping.Outcome, *, last_turn: bool) -> tuple:
    """Row i's step taken: the observation to append, () when the episode ended (done,
    its last turn, or what `_take` ends)."""
    step = self._take(rows, i, outcome)
    if step is None:
      return ()
    if step.done:
      rows.end_N[i] = DONE
    elif last_turn:
      rows.end_N[i] = TURN_LIMIT
    else:
      return tuple(int(t) for t in step.observation)
    return ()

  def _take(self, rows: _Rows, i: int, outcome: stepping.Outcome) -> base.Step | None:
    """Row i's step with its reward added, or None when the step ended the episode: late
    (step_timeout, the environment dropped) or failed (env_error)."""
    if outcome.late:
      rows.end_N[i], rows.envs[i] = STEP_TIMEOUT, None
      return None
    try:
      if outcome.error is not None:
        raise outcome.error  # Not an Exception (KeyboardInterrupt...): out of the loop.
      step = outcome.step
      if not math.isfinite(float(step.reward)):
        raise ValueError(f"the environment's step returned reward {step.reward}")
      rows.reward_N[i] += float(step.reward)
    except Exception as err:  # noqa: BLE001 -- any environment failure ends the episode.
      rows.fail(i, err)
      return None
    return step

  def end_over_limit(self, rows: _Rows, n_N) -> None:
    """Running rows whose observation of n_N tokens is longer than env.observation_tokens,
    or leaves no column for another action, end (token_limit)."""
    T = self.sampler_cfg.max_new_tokens
    over_N = (n_N > 0) & ((n_N > self.cfg.observation_tokens) | (rows.t_N + n_N >= T))
    rows.end_N[rows.running_N & over_N] = TOKEN_LIMIT

  def _observe(self, params, state: EpisodeState, obs: list, rows: _Rows) -> EpisodeState:
    """Appends the observations of running rows; one that exceeds O or leaves no column
    for another action ends its episode with token_limit. Records where each row's next
    action starts. `obs`: this process's rows' (others' are all-gathered)."""
    width = self.cfg.observation_tokens
    n_N = rows.gather(np.array([len(o) for o in obs], np.int32))
    self.end_over_limit(rows, n_N)
    n_N = np.where(rows.running_N, n_N, 0).astype(np.int32)
    rows.t_N = rows.t_N + n_N
    rows.action_start_N = rows.t_N.copy()
    if not n_N.any():
      return state
    obs_NO = np.full((len(obs), width), self.sampler_cfg.pad_id, np.int32)
    for i in np.flatnonzero(n_N):
      if rows.mine.start <= i < rows.mine.stop:
        obs_NO[i, : n_N[i]] = obs[i]
    if jax.process_count() > 1:  # A global array from each process's own rows.
      obs_NO = distributed.to_global(obs_NO[rows.mine], rows.sharding, len(obs))
    return self.pieces["append"](params, state, obs_NO, n_N)


@contextlib.contextmanager
def _timed(seconds: dict, phase: str):
  """Adds the seconds of the `with` block to seconds[phase]."""
  t0 = time.perf_counter()
  yield
  seconds[phase] += time.perf_counter() - t0
