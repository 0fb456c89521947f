"""The off-policy rollout source: batches in flight, sampled by older params (`offpolicy`).

    source = pipeline.Source.create(setup, fns, pool, buffer=restored.buffer)
    got = source.take(st, it)       # batch it, finished and scored; π_old forwards dispatched
    ...                             # the trainer prepares and dispatches the update
    source.while_updating()         # scores the batches started this iteration
    buffer = source.buffer(it, data_index=st.data_index)   # saved in checkpoint `it`

`take` starts the batches up to it + s (sampled by θ_{it−1}, dispatched before the
update so that, queued first, they run while the trainer's work waits behind them, or in
parallel with placement "split"), decodes one segment of each in-flight batch with
partial rollouts, finishes batch it, and dispatches its π_old / π_ref forwards under the
trainer's current params. Rows staler than s follow offpolicy.stale (`offpolicy`).
Multi-turn episodes (config.env) are played whole when their batch starts (`_play`),
with the environment's rewards.

Resume. The in-flight buffer (the pending rollouts with their per-token params versions
and scores, the step and data position of the checkpoint it belongs to) is saved as the
`buffer` item of each checkpoint (`checkpoint.Checkpointer.save`), so it is committed,
hashed, pruned and set aside with the state it belongs to, and a run killed in async
mode resumes with the batches it had in flight: its metrics equal an uninterrupted
run's. On restore `buffer_problem` rejects a checkpoint whose buffer is missing (an
off-policy run wrote it), holds another step's, or starts at another data position;
the trainer then falls back to the newest checkpoint whose buffer is whole. A
checkpoint a synchronous run wrote (none) starts an empty pipeline from its data
position.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import sampling
from grpo_jax.rollouts import partial
from grpo_jax.trainer import build, rollout

_SCORE_FIELDS = ("correct_N", "format_N", "scorable_N")


@dataclasses.dataclass
class InFlight:
  """One rollout batch in the pipeline: the iteration that trains it and its rows."""

  it: int
  index: int  # Data position of its first prompt.
  drawn: rollout.Drawn
  rollouts: sampling.Rollouts
  version_NT: np.ndarray  # int32: the params version that sampled each token (−1: none).
  start_version: int  # The params version when it started.
  segments: int = 0
  scores: rollout.Scores | None = None
  # Multi-turn episodes (config.env): played whole when the batch starts, so its scores
  # come from the environment then, with the "episode/..." metrics of `rollout.play`.
  episode_metrics: dict | None = None


class Source:
  """The pipelined data source of `train._Loop` when config.offpolicy.enabled."""

  def __init__(self, setup: build.Setup, fns, pool):
    self.setup, self.fns, self.pool = setup, fns, pool
    self.cfg = setup.offpolicy
    self.pending: dict[int, InFlight] = {}
    self.next_index: int | None = None  # Data position of the next batch to start.
    self.seconds = {"sample": 0.0, "reward": 0.0}
    self.overlap_seconds = 0.0

  @classmethod
  def create(cls, setup: build.Setup, fns, pool, *, buffer: dict | None = None) -> Source:
    """The pipeline, holding a restored checkpoint's in-flight `buffer` (None: empty)."""
    source = cls(setup, fns, pool)
    if buffer is not None:
      source.load(buffer)
    return source

  # --- The iteration's batch ----------------------------------------------------------

  def take(self, st, it: int) -> rollout.Collected:
    """Batch it, finished and scored, with its forwards under st.train.params dispatched."""
    self.seconds = {"sample": 0.0, "reward": 0.0}
    version = it - 1
    if self.next_index is None:
      self.next_index = st.data_index
    for j in range(it, it + self.cfg.max_staleness + 1):
      if j not in self.pending:
        self.pending[j] = self._start(j, st, version)
    if self.cfg.partial != "off":
      for j in sorted(self.pending):
        if not self._finished(self.pending[j]):
          self._segment(self.pending[j], st, version)
    b = self.pending.pop(it)
    t0 = time.perf_counter()
    while not self._finished(b):
      self._segment(b, st, version)
    self.seconds["sample"] += time.perf_counter() - t0
    if b.scores is None:
      self._score(b, "reward")
    return self._collected(b, st, version)

  def while_updating(self) -> None:
    """Scores every finished in-flight batch not yet scored (during the update)."""
    t0 = time.perf_counter()
    for b in self.pending.values():
      if b.scores is None and (self.cfg.partial == "off" or self._finished(b)):
        self._score(b, None)
    self.overlap_seconds = time.perf_counter() - t0

  def _start(self, j: int, st, version: int) -> InFlight:
    """Batch j: its prompts, and with partial off its rows sampled by st.train.params."""
    B = self.setup.loop.prompts_per_step
    index, self.next_index = self.next_index, self.next_index + B
    drawn = rollout.draw(self.setup, self.fns, index)
    T = self.setup.sampler_cfg.max_new_tokens
    N = B * self.setup.sampler_cfg.group_size
    if self.setup.episodes is not None:  # Whole episodes (build refuses partial ones).
      return self._play(j, index, drawn, st, version)
    if self.cfg.partial == "off":
      t0 = time.perf_counter()
      rollouts = self.fns.samplers.train(
        st.train.params, drawn.prompts, batch_key(st.key, j), self.setup.sampling_hyper
      )
      self.seconds["sample"] += time.perf_counter() - t0
      version_NT = np.full((N, T), version, np.int32)
      return InFlight(j, index, drawn, rollouts, version_NT, version, segments=1)
    rollouts = self.fns.partial.empty(drawn.prompts)
    return InFlight(j, index, drawn, rollouts, np.full((N, T), -1, np.int32), version)

  def _play(self, j: int, index: int, drawn: rollout.Drawn, st, version: int) -> InFlight:
    """Batch j as multi-turn episodes played by st.train.params: rows, the environment's
    scores and the episode metrics at once (the synchronous loop's `rollout.play`, same
    key). Every token of an episode is of one params version; observation tokens are
    never trained (`preparation.action_view`), so importance ratios see actions only."""
    seconds = {}
    rollouts, scores, metrics = rollout.play(
      self.setup, self.fns, st.train.params, drawn, batch_key(st.key, j), seconds
    )
    for phase, s in seconds.items():
      self.seconds[phase] = self.seconds.get(phase, 0.0) + s
    N, T = rollouts.tokens_NT.shape[0], self.setup.sampler_cfg.max_new_tokens
    version_NT = np.full((N, T), version, np.int32)
    return InFlight(j, index, drawn, rollouts, version_NT, version, 1, scores, metrics)

  def _finished(self, b: InFlight) -> bool:
    return self.cfg.partial == "off" or bool(jnp.all(partial.finished(b.rollouts)))

  def _segment(self, b: InFlight, st, version: int) -> None:
    """One segment of a partial batch under st.train.params (version): with "restart",
    unfinished rows that hold tokens of another version are emptied first."""
    before_NT = np.asarray(b.rollouts.mask_NT)
    rows = b.rollouts
    if self.cfg.partial == "restart":
      stale_N = np.any(before_NT & (b.version_NT != version), axis=1)
      reset_N = stale_N & ~np.asarray(partial.finished(rows))
      if reset_N.any():
        rows = partial.restart_rows(
          rows, jnp.asarray(reset_N), pad_id=self.setup.sampler_cfg.pad_id
        )
        b.version_NT[reset_N] = -1
        before_NT = np.asarray(rows.mask_NT)
    live_N = ~partial.finished(rows)
    steps = self.cfg.segment(self.setup.sampler_cfg.max_new_tokens)
    key = jax.random.fold_in(batch_key(st.key, b.it), 1 + b.segments)
    b.rollouts = self.fns.partial.cont(
      st.train.params, rows, live_N, jnp.int32(steps), key, self.setup.sampling_hyper
    )
    new_NT = np.asarray(b.rollouts.mask_NT) & ~before_NT
    b.version_NT[new_NT] = version
    b.segments += 1

  def _score(self, b: InFlight, phase: str | None) -> None:
    t0 = time.perf_counter()
    G = self.setup.sampler_cfg.group_size
    b.scores = rollout.score(self.setup, self.pool, b.drawn.examples, b.rollouts.tokens_NT, group=G)
    if phase:
      self.seconds[phase] += time.perf_counter() - t0

  # --- What the trainer gets --------------------------------------------------------

  def versions(self, b: InFlight) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the params versions of its oldest and newest tokens (rows with none: the
    batch's start version, twice)."""
    mask_NT = np.asarray(b.rollouts.mask_NT)
    any_N = mask_NT.any(axis=1)
    oldest_N = np.where(mask_NT, b.version_NT, np.iinfo(np.int32).max).min(axis=1)
    newest_N = np.where(mask_NT, b.version_NT, -1).max(axis=1)
    return np.where(any_N, oldest_N, b.start_version), np.where(any_N, newest_N, b.start_version)

  def staleness(self, b: InFlight, version: int) -> np.ndarray:
    """Per row: version − the version of its oldest token (rows with none: of its start)."""
    return version - self.versions(b)[0]

  def _collected(self, b: InFlight, st, version: int) -> rollout.Collected:
    s = self.cfg.max_staleness
    oldest_N, newest_N = self.versions(b)
    stale_N = version - oldest_N
    keep_N = (stale_N <= s) | (self.cfg.stale == "correct")
    mixed_N = newest_N != oldest_N
    logprobs = self.fns.rl.logprobs(st.train.params, st.reference(), b.rollouts)
    sc = b.scores
    metrics = {
      # config.rewards' sources: a batch restored from a checkpoint keeps its total alone.
      **rollout.score_metrics(self.setup, self.pool, [sc]),
      **(b.episode_metrics or {}),
      "offpolicy/staleness_mean": float(stale_N.mean()),
      "offpolicy/staleness_max": int(stale_N.max()),
      "offpolicy/stale_frac": float(np.mean(stale_N > s)),
      "offpolicy/stale_dropped_frac": float(np.mean(~keep_N)),
      "offpolicy/mixed_version_frac": float(mixed_N.mean()),
      "offpolicy/segments": b.segments,
      "offpolicy/in_flight": len(self.pending),
      "time/reward_overlap": self.overlap_seconds,
    }
    B = self.setup.loop.prompts_per_step
    return rollout.Collected(
      b.rollouts, logprobs, sc, keep_N, b.index + B, metrics, dict(self.seconds)
    )

  # --- Resume -----------------------------------------------------------------------

  def buffer(self, step: int, *, data_index: int) -> dict:
    """The in-flight buffer for checkpoint `step` (whose data position is `data_index`):
    a tree of host numpy arrays, copied (the pipeline goes on changing its own while the
    checkpoint is written in the background)."""
    batches = {}
    for j, b in self.pending.items():
      fields = {f.name: getattr(b.rollouts, f.name) for f in dataclasses.fields(sampling.Rollouts)}
      # Optional fields left out (they load as None).
      rows = {k: np.array(x) for k, x in jax.device_get(fields).items() if x is not None}
      out = {"rollouts": rows, "version_NT": np.array(b.version_NT)}
      out["meta"] = np.asarray([b.index, b.start_version, b.segments], np.int64)
      if b.scores is not None:
        out["scores"] = {name: np.array(getattr(b.scores, name)) for name in _SCORE_FIELDS}
        out["scores"]["counts"] = np.asarray([b.scores.errors, b.scores.timeouts], np.int64)
        out["scores"]["unscorable"] = np.asarray(b.scores.unscorable, np.int64)
      if b.episode_metrics is not None:
        out["episode_metrics"] = {k: np.asarray(v) for k, v in b.episode_metrics.items()}
      batches[str(j)] = out
    nxt = self.next_index if self.next_index is not None else -1
    return {**empty_buffer(step, data_index=data_index, next_index=nxt), "batches": batches}

  def load(self, buffer: dict) -> None:
    """Takes over a restored checkpoint's in-flight buffer (`buffer`)."""
    nxt = int(buffer["next_index"])
    self.next_index = None if nxt < 0 else nxt
    for key in sorted(buffer.get("batches", {}), key=int):
      b = buffer["batches"][key]
      index, start_version, segments = (int(x) for x in b["meta"])
      rollouts = sampling.Rollouts(
        **{
          f.name: jnp.asarray(b["rollouts"][f.name])
          for f in dataclasses.fields(sampling.Rollouts)
          if f.name in b["rollouts"]
        }
      )
      scores = None
      if "scores" in b:
        errors, timeouts = (int(x) for x in b["scores"]["counts"])
        unscorable = tuple(int(x) for x in b["scores"].get("unscorable", ()))
        scores = rollout.Scores(
          *(b["scores"][n] for n in _SCORE_FIELDS),
          errors=errors,
          timeouts=timeouts,
          unscorable=unscorable,
        )
      played = b.get("episode_metrics")
      drawn = rollout.draw(self.setup, self.fns, index)
      self.pending[int(key)] = InFlight(
        int(key), index, drawn, rollouts, np.array(b["version_NT"]), start_version, segments,
        scores, None if played is None else {k: v.item() for k, v in played.items()},
      )  # fmt: skip


def empty_buffer(step: int, *, data_index: int, next_index: int = -1) -> dict:
  """The in-flight buffer of checkpoint `step` with no batch in flight (a fresh run's
  checkpoint 0; next_index −1: the pipeline starts at the checkpoint's data position)."""
  return {
    "step": np.asarray(step, np.int64),
    "data_index": np.asarray(data_index, np.int64),
    "next_index": np.asarray(next_index, np.int64),
    "batches": {},
  }


def buffer_problem(restored, *, enabled: bool) -> str | None:
  """Why a restored checkpoint (`checkpoint.Restored`) cannot resume the off-policy
  pipeline (`enabled`: config.offpolicy.enabled), or None. An off-policy run's checkpoint
  must hold the buffer it saved with it: its own step, its data position, and batches
  of later iterations only; a synchronous run's holds none (the pipeline starts empty)."""
  if not enabled:
    return None
  buf, meta = restored.buffer, restored.meta
  written_offpolicy = (meta.get("config") or {}).get("offpolicy", {}).get("enabled", False)
  if buf is None:
    return "its off-policy in-flight buffer is missing" if written_offpolicy else None
  if int(buf["step"]) != restored.step:
    return f"its in-flight buffer is that of step {int(buf['step'])}"
  if int(buf["data_index"]) != meta["data_index"]:
    return (
      f"its in-flight buffer starts at data position {int(buf['data_index'])}, the "
      f"checkpoint at {meta['data_index']}"
    )
  early = [int(j) for j in buf.get("batches", {}) if int(j) <= restored.step]
  if early:
    return f"its in-flight buffer holds batches {early} of iterations already trained"
  return None


def batch_key(run_key, it: int):
  """The sampling key of iteration it's batch: the synchronous loop's (`train._Loop`)."""
  return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(run_key, it), 0), 0)
