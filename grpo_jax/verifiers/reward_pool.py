"""Host-side reward scoring in a pool of worker processes with a per-item timeout.

    pool = reward_pool.RewardPool(task, workers=2, timeout_s=5.0)
    scores = pool.score(prompts, completions)   # Scores(correct_N, format_N, error_N, timeout_N)
    pool.close()                                # or: with reward_pool.RewardPool(...) as pool:

For item i, with p_i its prompt and y_i its completion,

    correct_N[i] = float(task.reward(p_i, y_i)),   format_N[i] = float(task.format_reward(p_i, y_i)),

unless scoring item i *fails*: either call raises an ``Exception``, returns a value that is
not a finite number, the two calls together run longer than ``timeout_s``, or they kill
the worker process. A failed item scores correct_N[i] = format_N[i] = 0 and
error_N[i] = True (timeout_N[i] = True too when it timed out). Failures never raise:
training goes on. The trainer logs ``reward_errors = Σ_i error_N[i]`` (``Scores.errors``)
per iteration, so a broken or hanging verifier shows up separately from wrong answers
(a wrong answer is correct_N[i] = 0 with error_N[i] = False).

Timeouts. Threads cannot be stopped, so each worker is a process. Before each item a
worker writes the item's index and start time (``time.monotonic``, one system-wide clock)
to a shared array; the parent reads it while it waits. An item running longer than
``timeout_s`` gets its worker killed (SIGKILL) and replaced by a fresh one; the item
scores as a failure (or, for a task that declares ``timeout_outcome``, as a 0 with that
label: `tasks.base.Task.timeout_outcome`), and the other items of that worker's chunk are
scored again by the next free worker (results travel once per chunk, so the killed worker's finished items
are lost; rewards are pure, so rescoring them is safe). Each hang costs one worker
``timeout_s``, so k hanging items cost about k·timeout_s / workers of wall time.

Batching. ``score`` splits the N items into up to 4 contiguous chunks per worker (two
pipe messages per chunk: about a millisecond for a few hundred short strings rather than
one round trip per item), handed to whichever worker is free. So a slow item holds one
worker for at most its time, and the other workers take the rest of the batch meanwhile.
Results come back in input order.

Outcomes. A reward may carry the task's name for its outcome: ``reward`` returns a
``Labeled`` value (a float with a ``label``), or raises ``Unscorable(message,
label=...)``; ``Scores.label_N`` keeps each item's label ("" when none), and the trainer
counts them per task vocabulary (``Task.outcomes``; e.g. the code sandbox's "timeout" or
"crash") as ``reward/outcome/<label>``.

The task is pickled once per worker process (at pool start and when a worker is
replaced), never per call. Any picklable object with ``reward(prompt, completion)`` and
``format_reward(prompt, completion)`` methods serves (the ``Task`` protocol); its class
must be importable by name in a fresh process (not defined in a notebook's ``__main__``).

Scripts, notebooks and config files. A worker gets the task pickled in the parent and,
when the task's class lives in a module loaded from a file but not importable by name (a
config file: `--config=my_config.py` with the task class in it), imports that file first.
The caller's script is not re-run in the workers when the task's class lives elsewhere, so
a script without ``if __name__ == "__main__":`` works. A task class defined in
``__main__`` needs the script re-run in each worker (put its top level under the guard);
in a notebook it cannot be imported at all: then the pool scores inline, with one warning
saying why.

Start method: "forkserver" where the platform has it, else "spawn". Not "fork": the
trainer's process has JAX (multithreaded) initialised, and a fork() of a multithreaded
process can deadlock in the child on locks other threads held. The fork server is
started with a fresh exec (no JAX threads), imports the task's module once (with the
parent's sys.path) and forks each worker from its single thread, so a worker, first or
replacement, starts in milliseconds. Workers exit when the parent process dies.

``workers=0`` scores inline in the calling process: the same accounting of exceptions
and non-finite values, but no timeout (a hanging reward hangs the caller). Use it to
debug a reward function (tracebacks and breakpoints work) and for tiny runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from absl import logging

from grpo_jax.infra import registry
from grpo_jax.verifiers import verdicts

# Seconds between the parent's looks at the workers' progress while it waits.
_POLL_S = 0.05
# Seconds a new pool waits for its workers to start (import the task's modules).
_START_TIMEOUT_S = 300.0
# Seconds ``close`` lets workers exit on their own before killing them.
_CLOSE_GRACE_S = 1.0
# Chunks per worker in a call: a slow item holds up only its chunk's worker.
CHUNKS_PER_WORKER = 4


def _score_one(task: verdicts.RewardFn, prompt: str, completion: str):
  """(correct, format, None, label), or (0, 0, error message, label) if either call fails."""
  label = ""
  try:
    value = task.reward(prompt, completion)
    label = value.label if isinstance(value, verdicts.Labeled) else ""
    correct = float(value)
    fmt = float(task.format_reward(prompt, completion))
    if not (math.isfinite(correct) and math.isfinite(fmt)):
      raise ValueError(f"non-finite reward {correct} / format reward {fmt}")
  except Exception as e:  # noqa: BLE001 -- any verifier failure is a scored error.
    return 0.0, 0.0, f"{type(e).__name__}: {e}", getattr(e, "label", label)
  return correct, fmt, None, label


def _score_chunk(task, prompts, completions, progress=None):
  """Lists (correct, format), {index: error message} and the labels; progress gets
  (start time, index)."""
  correct, fmt, errors, labels = [], [], {}, []
  for i, (prompt, completion) in enumerate(zip(prompts, completions)):
    if progress is not None:
      progress[0] = time.monotonic()  # Time first: a reader never sees a stale time.
      progress[1] = i
    c, f, err, label = _score_one(task, prompt, completion)
    correct.append(c)
    fmt.append(f)
    labels.append(label)
    if err is not None:
      errors[i] = f"{err} (prompt {prompt!r:.80}, completion {completion!r:.80})"
  if progress is not None:
    progress[0] = math.inf  # Idle: the chunk's results are on their way.
  return correct, fmt, errors, labels


def _exit_with_parent():
  """Exits this worker when the process that started it dies (even if a reward hangs)."""
  parent = multiprocessing.parent_process()
  if parent is None:
    return

  def watch():
    parent.join()
    os._exit(1)

  threading.Thread(target=watch, name="reward-worker-watchdog", daemon=True).start()


@dataclasses.dataclass(frozen=True)
class _Packed:
  """The task pickled in the parent, and the file of its class's module: a worker imports
  a module that is not importable by name (a config file loaded by path) from its file."""

  module: str
  path: str | None
  data: bytes

  @classmethod
  def of(cls, task) -> _Packed:
    module, path = registry.origin(type(task))
    return cls(module, path if module != "__main__" else None, pickle.dumps(task))

  def load(self):
    if self.path:
      registry.import_origin(self.module, self.path)
    return pickle.loads(self.data)


def _worker_main(conn, packed: _Packed, progress):
  """Scores chunks (prompts, completions) from conn until it gets None or EOF."""
  _exit_with_parent()
  try:
    task = packed.load()
  except Exception as e:  # noqa: BLE001 -- reported to the parent, which falls back.
    conn.send(("error", f"{type(e).__name__}: {e}"))
    return
  conn.send("ready")
  while True:
    try:
      msg = conn.recv()
    except EOFError:
      return
    if msg is None:
      return
    conn.send(_score_chunk(task, *msg, progress))


class _Worker:
  """One worker process, its pipe, its progress array and the chunk it is scoring."""

  def __init__(self, ctx, packed: _Packed):
    # progress: [start time of the item in flight (inf when idle), its index in the chunk].
    self.progress = ctx.RawArray("d", [math.inf, 0.0])
    self.conn, child_conn = ctx.Pipe()
    self.process = ctx.Process(
      target=_worker_main,
      args=(child_conn, packed, self.progress),
      name="reward-worker",
      daemon=True,
    )
    with _main_hidden(packed.module != "__main__"):
      self.process.start()
    child_conn.close()  # So the parent sees EOF when the worker dies.
    self.ready = False
    self.job_J: np.ndarray | None = None  # Input indices of the chunk in flight.

  def deadline(self, timeout_s: float) -> float:
    return self.progress[0] + timeout_s

  def kill(self):
    self.process.kill()
    self.process.join(timeout=5.0)
    self.conn.close()


@contextlib.contextmanager
def _main_hidden(hide: bool):
  """Starts processes without re-running the caller's script in them: multiprocessing
  re-imports ``__main__`` in each child (the whole script, when its top level is not under
  ``if __name__ == "__main__":``), which a task defined in a module never needs."""
  main = sys.modules.get("__main__")
  saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main and k in main.__dict__}
  if not (hide and saved):
    yield
    return
  main.__dict__.pop("__file__", None)
  main.__spec__ = None
  try:
    yield
  finally:
    main.__dict__.update(saved)
    if "__spec__" not in saved:
      del main.__spec__


def _start_forkserver(ctx, module: str) -> None:
  """Starts this process's fork server (once) with the task's module imported, so that a
  worker replacing a killed one is a fork, not a fresh import of everything the task needs
  (seconds when it imports jax): a hang then costs about timeout_s / workers.

  Python 3.11's fork server neither applies the parent's sys.path nor imports its
  __main__, so the parent's sys.path goes to it as PYTHONPATH (a task defined next to a
  script or test imports there too). A fork server started earlier keeps its modules."""
  ctx.set_forkserver_preload([module])
  paths = [os.path.abspath(p or ".") for p in sys.path]
  old = os.environ.get("PYTHONPATH")
  os.environ["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
  try:
    with _main_hidden(module != "__main__"):
      multiprocessing.forkserver.ensure_running()
  finally:
    if old is None:
      del os.environ["PYTHONPATH"]
    else:
      os.environ["PYTHONPATH"] = old


def default_start_method() -> str:
  methods = multiprocessing.get_all_start_methods()
  return "forkserver" if "forkserver" in methods else "spawn"


class _WorkersFailed(RuntimeError):
  """The reward workers could not start; the pool scores inline instead."""

  def __init__(self, what: str, task):
    where = type(task).__module__
    if where == "__main__":
      hint = (
        f"its class {type(task).__name__} is defined in __main__ (a notebook, or a script "
        "re-run by each worker): define it in a module of its own"
      )
    else:
      hint = f"check that module {where!r} imports in a fresh Python process"
    super().__init__(
      f"Reward workers could not start: {what}; {hint}. Scoring inline in this process "
      "instead (no per-item timeout; config.reward_workers=0 does this without the warning)."
    )


class RewardPool:
  """Scores (prompt, completion) pairs with ``task`` in ``workers`` processes.

  Args:
    task: a picklable object with ``reward`` and ``format_reward`` (a ``tasks.Task``).
    workers: worker processes; 0 scores inline in the caller, with no timeout.
    timeout_s: the most seconds one item (reward + format_reward) may take.
    start_method: multiprocessing start method; None picks ``default_start_method()``.

  ``score`` is not thread-safe: call it from one thread at a time.
  """

  def __init__(
    self,
    task: verdicts.RewardFn,
    *,
    workers: int = 2,
    timeout_s: float = 10.0,
    start_method: str | None = None,
  ):
    if workers < 0:
      raise ValueError(f"workers must be >= 0 (0 scores inline), got {workers}.")
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be > 0, got {timeout_s}.")
    self.task, self.workers, self.timeout_s = task, workers, timeout_s
    self._workers: list[_Worker] = []
    self._closed = False
    if workers == 0:
      return
    try:
      pickle.dumps(task)
    except Exception as e:
      raise TypeError(
        f"RewardPool sends the task to worker processes, but {task!r} does not pickle ({e}); "
        "use workers=0 to score inline."
      ) from e
    self._ctx = multiprocessing.get_context(start_method or default_start_method())
    self._packed = _Packed.of(task)
    if self._ctx.get_start_method() == "forkserver":
      _start_forkserver(self._ctx, type(task).__module__)
    self._workers = [_Worker(self._ctx, self._packed) for _ in range(workers)]
    try:
      self._await_ready()
    except _WorkersFailed as e:
      self.close()
      self._closed, self.workers = False, 0
      logging.warning("%s", e)

  def _await_ready(self):
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not all(w.ready for w in self._workers):
      waiting = [w for w in self._workers if not w.ready]
      if not multiprocessing.connection.wait(
        [w.conn for w in waiting], deadline - time.monotonic()
      ):
        self.close()
        raise RuntimeError(f"Reward workers did not start within {_START_TIMEOUT_S} s.")
      for w in waiting:
        if w.conn.poll():
          self._receive_ready(w)

  def _receive_ready(self, worker: _Worker):
    try:
      msg = worker.conn.recv()
    except (EOFError, OSError) as e:
      raise _WorkersFailed(
        f"it died while starting (exit code {worker.process.exitcode})", self.task
      ) from e
    if isinstance(msg, tuple) and msg[:1] == ("error",):
      raise _WorkersFailed(f"it could not load the task ({msg[1]})", self.task)
    if msg != "ready":
      raise RuntimeError(f"A reward worker sent {msg!r} before 'ready'.")
    worker.ready = True

  def score(self, prompts: Sequence[str], completions: Sequence[str]) -> verdicts.Scores:
    """Scores[i] for (prompts[i], completions[i]); failures score 0 and set error_N[i]."""
    if self._closed:
      raise RuntimeError("score() on a closed RewardPool.")
    if len(prompts) != len(completions):
      raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions.")
    n = len(prompts)
    out = verdicts.Scores(
      correct_N=np.zeros(n, np.float32),
      format_N=np.zeros(n, np.float32),
      error_N=np.zeros(n, bool),
      timeout_N=np.zeros(n, bool),
      label_N=np.full(n, "", object),
    )
    messages: list[str] = []
    if self.workers == 0:
      c, f, errs, labels = _score_chunk(self.task, prompts, completions)
      out.correct_N[:], out.format_N[:], out.label_N[:] = c, f, labels
      out.error_N[list(errs)] = True
      messages += errs.values()
    elif n:
      chunks = min(n, self.workers * CHUNKS_PER_WORKER)
      # Last chunk first out of `jobs` (a stack): the input order is kept in the results.
      jobs = [j for j in np.array_split(np.arange(n), chunks) if j.size][::-1]
      self._run(jobs, prompts, completions, out, messages)
    out.messages.extend(messages)
    if messages:
      logging.log_every_n_seconds(
        logging.WARNING,
        "Reward scoring failed on %d of %d items (reward_errors); e.g. %s",
        60,
        out.errors,
        n,
        messages[0],
      )
    return out

  def _run(
    self, jobs: list[np.ndarray], prompts, completions, out: verdicts.Scores, messages: list[str]
  ):
    """Scores the chunks ``jobs`` (input indices) into ``out``, replacing stuck workers."""
    try:
      while jobs or any(w.job_J is not None for w in self._workers):
        for w in list(self._workers):
          if jobs and w.ready and w.job_J is None:
            self._send(w, jobs, prompts, completions)
        now = time.monotonic()
        wait_s = min([_POLL_S] + [w.deadline(self.timeout_s) - now for w in self._workers])
        ready = multiprocessing.connection.wait([w.conn for w in self._workers], max(wait_s, 0))
        for w in list(self._workers):
          if w.conn in ready:
            self._receive(w, jobs, out, messages)
          elif w.job_J is not None and time.monotonic() > w.deadline(self.timeout_s):
            self._fail_item(w, jobs, out, timed_out=True)
    finally:  # Interrupted (e.g. KeyboardInterrupt): busy workers hold stale chunks.
      for w in list(self._workers):
        if w.job_J is not None:
          self._replace(w)

  def _send(self, w: _Worker, jobs, prompts, completions):
    job_J = jobs.pop()
    try:
      w.conn.send(([prompts[i] for i in job_J], [completions[i] for i in job_J]))
    except OSError:  # It died while idle.
      jobs.append(job_J)
      self._replace(w)
      return
    w.job_J = job_J

  def _receive(self, w: _Worker, jobs, out: verdicts.Scores, messages: list[str]):
    try:
      msg = w.conn.recv()
    except (EOFError, OSError):  # The worker died; blame the item it was scoring.
      if not w.ready:
        self._receive_ready(w)  # Raises: a replacement could not start.
      if w.job_J is None:
        self._replace(w)
      else:
        self._fail_item(w, jobs, out, timed_out=False)
      return
    if msg == "ready":
      w.ready = True
      return
    correct, fmt, errors, labels = msg
    job_J, w.job_J = w.job_J, None
    out.correct_N[job_J], out.format_N[job_J] = correct, fmt
    out.label_N[job_J] = labels
    out.error_N[job_J[list(errors)]] = True
    messages += errors.values()

  def _fail_item(self, w: _Worker, jobs, out: verdicts.Scores, *, timed_out: bool):
    """Kills w, fails the item it was stuck on and queues the rest of its chunk again."""
    job_J = w.job_J
    self._replace(w)  # First, so progress is final.
    started, index = w.progress[0], int(w.progress[1])
    if timed_out and not time.monotonic() - started > self.timeout_s:
      jobs.append(job_J)  # It finished that item just in time: nothing to blame.
      return
    if math.isinf(started):  # Died between items: no item to blame, so fail the chunk.
      out.error_N[job_J] = True
      return
    label = getattr(self.task, "timeout_outcome", "") if timed_out else ""
    if label:  # The task's every step is bounded: only the completion can time it out.
      out.label_N[job_J[index]] = label
    else:
      out.error_N[job_J[index]] = True
      out.timeout_N[job_J[index]] = timed_out
    rest_J = np.delete(job_J, index)
    if rest_J.size:
      jobs.append(rest_J)

  def _replace(self, w: _Worker):
    w.kill()
    self._workers[self._workers.index(w)] = _Worker(self._ctx, self._packed)

  def close(self):
    """Stops the workers (killing any still busy after a short grace period). Idempotent."""
    workers, self._workers = self._workers, []
    self._closed = True
    for w in workers:
      with contextlib.suppress(OSError, ValueError):
        w.conn.send(None)
    deadline = time.monotonic() + _CLOSE_GRACE_S
    for w in workers:
      w.process.join(timeout=max(deadline - time.monotonic(), 0))
      w.kill()

  def __enter__(self) -> RewardPool:
    return self

  def __exit__(self, *exc: Any):
    self.close()
