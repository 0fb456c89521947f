"""The environment steps of one turn: at once on worker threads, each within its budget.

    steps = stepping.Steps(workers=8)              # config.env.step_workers; 1: serial
    got = steps.run([(env, action), ...])          # one Outcome per step, in that order
    got[k].step, got[k].error, got[k].late

    flight = steps.flight()                        # steps given out one at a time
    flight.submit(i, env, action)                  # i: any key (the episode loop: the row)
    flight.take(block=True)                        # [(i, Outcome)] of the steps done, by key

Why threads. The code environment's step is a sandboxed child process (`sandbox.run`): its
thread spends the step waiting on the child's pipes and exit (select, read, waitpid), which
release the GIL, so a few threads wait on a few children at once and the trainer's thread
waits for the slowest, not for the sum. Not processes: a step reads and writes its
environment (the run count, the last run's code, the outcome label) and encodes with the
trainer's tokenizer, so a process pool would pickle each environment there and back at
every step, start interpreters that import the environment's modules, and still have the
child's work to wait for: the work that leaves the GIL is already in the child. A step that
computes in Python (the calculator's) gains nothing from threads (the GIL), and pays a
queue hand-off per step.

Budget (`base.Environment.step_budget_s`, read from each environment when its step is
given out; None: unbounded). A step that runs longer than its budget is *late*: its
result, or what it raised, is discarded, and the episode loop ends its episode. The clock
starts when a worker starts the step (a step waiting for a free worker is not running
late). With workers > 1 the trainer's thread stops waiting at the budget: the late step's
thread is left to finish alone (a thread cannot be stopped; the code environment's run
ends at its sandbox's timeout), leaves the pool when it does, and a new thread takes its
place, so the trainer never waits for a free worker behind a late step either. With
workers = 1 the steps run one by one on the calling thread, which waits for each, and a
step found late when it returns is late by the same rule: the worker count changes the
trainer's wait, never an episode's outcome. The threads hold the job queue, not the
`Steps`: when a `Steps` is collected (its run's functions left `steps._FUNCTIONS`, or a
notebook dropped them), each of its waiting workers is told to leave, so runs started one
after another in a process do not pile up idle threads.

A `Flight` takes steps as they come and gives back each outcome when it is ready: the
episode refill loop overlaps environment steps with the decoding of other episodes
(`episodes.Runner`, env.overlap_steps); `run` is a flight of one turn's steps, waited for.

Determinism. Outcomes come back in the order given, whatever order the threads finish
in, and each step touches its own environment only, so the same actions give the same
steps as the serial loop (an environment whose outcome depends on wall time, like a
sandbox's timeout, may differ under a different load, as it would serially).
"""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
import weakref
from collections.abc import Sequence

from grpo_jax.envs import base


@dataclasses.dataclass(frozen=True)
class Outcome:
  """One step's outcome: what `env.step` returned or raised, or late (past its budget:
  both unknown)."""

  step: base.Step | None = None
  error: BaseException | None = None
  late: bool = False
  seconds: float = 0.0  # The step's wall time, until it returned (late: the budget).


def budget_s(env: base.Environment) -> float | None:
  """The environment's step budget in seconds (None: unbounded); an error when it is not
  a positive number."""
  budget = getattr(env, "step_budget_s", None)
  if budget is None:
    return None
  ok = isinstance(budget, (int, float)) and not isinstance(budget, bool)
  if not (ok and math.isfinite(budget) and budget > 0):
    raise ValueError(
      f"{type(env).__name__}.step_budget_s must be None or a positive number of seconds, "
      f"got {budget!r}."
    )
  return float(budget)


def _timed_step(env: base.Environment, action: str, *, catch: type[BaseException]) -> Outcome:
  t0 = time.monotonic()
  try:
    step, error = env.step(action), None
  except catch as err:  # noqa: BLE001 -- the episode loop decides what an error means.
    step, error = None, err
  return Outcome(step, error, seconds=time.monotonic() - t0)


def _judged(outcome: Outcome, budget: float | None) -> Outcome:
  """The outcome, or late when the step took longer than its budget."""
  if budget is not None and outcome.seconds > budget:
    return Outcome(late=True, seconds=budget)
  return outcome


class _Job:
  """One step given to the workers. Under a lock, `__call__` and `abandon` decide which
  came first: a step abandoned while queued never runs, one abandoned while running never
  reports, so nothing it returns can reach the caller."""

  def __init__(self, k: int, env: base.Environment, action: str, events: queue.SimpleQueue):
    self.k, self.env, self.action, self.events = k, env, action, events
    self._lock = threading.Lock()
    self.running = self._finished = self._abandoned = False

  def __call__(self) -> bool:
    """Runs the step (on a worker); False when it was abandoned while it ran (its worker
    then leaves the pool: a new one replaced it)."""
    with self._lock:
      if self._abandoned:
        return True
      self.running = True
    self.events.put(("start", self.k, time.monotonic()))
    # Any BaseException is reported: the caller re-raises what is not an Exception.
    outcome = _timed_step(self.env, self.action, catch=BaseException)
    with self._lock:
      if self._abandoned:
        return False
      self._finished = True
    self.events.put(("done", self.k, outcome))
    return True

  def abandon(self) -> bool:
    """Abandons the step unless it finished first; True when it did abandon it."""
    with self._lock:
      self._abandoned = not self._finished
      return self._abandoned


class Steps:
  """Runs the steps of a turn on `workers` threads (daemons, made on first use and kept
  for later turns), or serially on the calling thread when workers == 1 (module
  docstring)."""

  def __init__(self, *, workers: int):
    if workers < 1:
      raise ValueError(f"Steps needs workers >= 1, got {workers}.")
    self.workers = workers
    self._jobs: queue.SimpleQueue | None = None

  def run(self, jobs: Sequence[tuple[base.Environment, str]]) -> list[Outcome]:
    """One Outcome per (environment, action), in order; a step that raised has its error
    (with worker threads any exception, KeyboardInterrupt included: the caller decides;
    with one worker an Exception, anything else propagates), a step past its budget is
    late."""
    budgets = [budget_s(env) for env, _ in jobs]  # Checked before any step runs.
    if self.workers == 1:
      return [
        _judged(_timed_step(env, action, catch=Exception), budget)
        for (env, action), budget in zip(jobs, budgets)
      ]
    flight, out = self.flight(), {}
    try:
      for k, (env, action) in enumerate(jobs):
        flight.submit(k, env, action, budget=budgets[k])
      while len(out) < len(jobs):
        out.update(flight.take(block=True))
    finally:  # Interrupted (an error while waiting): no step of this call runs on.
      flight.close()
    return [out[k] for k in range(len(jobs))]

  def flight(self) -> Flight:
    """A flight of steps on this pool's workers (`Flight`)."""
    if self.workers > 1 and self._jobs is None:
      self._jobs = queue.SimpleQueue()
      weakref.finalize(self, _dismiss, self._jobs, self.workers)
      for _ in range(self.workers):
        self._spawn()
    return Flight(self)

  def _abandon(self, job: _Job) -> bool:
    """Abandons a step (True unless it finished first); a running one's worker is replaced,
    as it leaves the pool when its step returns."""
    abandoned = job.abandon()
    if abandoned and job.running:
      self._spawn()
    return abandoned

  def _spawn(self) -> None:
    threading.Thread(target=_serve, args=(self._jobs,), name="env-step", daemon=True).start()


class Flight:
  """Steps given out one at a time (`submit`), their outcomes taken as they are ready
  (`take`): on the pool's workers, each within its budget as `Steps.run`'s; with one
  worker each step runs when submitted, on the calling thread. `close` abandons the steps
  not taken yet (their outcomes never come back)."""

  def __init__(self, steps: Steps):
    self._steps = steps
    self._events: queue.SimpleQueue = queue.SimpleQueue()  # This flight's own reports.
    self._given: dict = {}  # key -> (job, budget), until its outcome is taken.
    self._deadlines: dict = {}
    self._ready: dict = {}  # key -> Outcome, not yet taken.

  @property
  def pending(self) -> int:
    """Steps submitted whose outcome has not been taken."""
    return len(self._given) + len(self._ready)

  def submit(self, key, env: base.Environment, action: str, *, budget=False) -> None:
    """Gives out env.step(action) under `key` (budget: `budget_s(env)` unless given)."""
    budget = budget_s(env) if budget is False else budget
    if self._steps.workers == 1:
      self._ready[key] = _judged(_timed_step(env, action, catch=Exception), budget)
      return
    job = _Job(key, env, action, self._events)
    self._given[key] = (job, budget)
    self._steps._jobs.put(job)

  def take(self, *, block: bool, timeout: float | None = None) -> list[tuple]:
    """[(key, Outcome)] of the steps done (late ones too), sorted by key; with `block`,
    waits for at least one while any is pending (and takes every other one done by
    then), at most `timeout` seconds when given."""
    end = None if timeout is None else time.monotonic() + timeout
    while block and self._given and not self._ready:
      if not self._wait(block=True, end=end) and end is not None and time.monotonic() >= end:
        break
      self._expire()
    while self._wait(block=False):
      pass
    self._expire()
    out, self._ready = sorted(self._ready.items(), key=lambda kv: kv[0]), {}
    return out

  def _wait(self, *, block: bool, end: float | None = None) -> bool:
    """Takes one report (False when there was none by the nearest deadline or `end`, or
    none at all without `block`): a start sets the step's deadline, a finished step its
    outcome."""
    nearest = min([*self._deadlines.values()] + ([] if end is None else [end]), default=None)
    timeout = None if nearest is None else max(0.0, nearest - time.monotonic())
    try:
      kind, key, value = self._events.get(block=block, timeout=timeout if block else None)
    except queue.Empty:
      return False
    budget = self._given[key][1] if key in self._given else None
    if kind == "start" and budget is not None:
      self._deadlines[key] = value + budget
    elif kind == "done" and key in self._given:
      self._deadlines.pop(key, None)
      del self._given[key]
      self._ready[key] = _judged(value, budget)
    return True

  def _expire(self) -> None:
    """Steps past their deadline become late (unless they finished just now: their
    report is coming)."""
    now = time.monotonic()
    for key in [k for k, deadline in self._deadlines.items() if deadline <= now]:
      del self._deadlines[key]
      job, budget = self._given[key]
      if self._steps._abandon(job):
        del self._given[key]
        self._ready[key] = Outcome(late=True, seconds=budget)

  def close(self) -> None:
    """Abandons every step not taken yet."""
    for job, _ in self._given.values():
      self._steps._abandon(job)
    self._given, self._deadlines, self._ready = {}, {}, {}


def _serve(jobs: queue.SimpleQueue) -> None:
  """A worker: runs steps until one of them is abandoned (late), or it takes `_leave`,
  then leaves."""
  while jobs.get()():
    pass


def _leave() -> bool:
  """The job that tells a worker to leave."""
  return False


def _dismiss(jobs: queue.SimpleQueue, workers: int) -> None:
  """A collected Steps' workers leave: `workers` are waiting or at work (a late step's
  thread leaves by itself and was replaced), each takes one `_leave` after its jobs."""
  for _ in range(workers):
    jobs.put(_leave)
