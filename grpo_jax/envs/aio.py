"""One event loop per process for environments that wait on asyncio code (an OpenEnv
server's WebSocket sessions, a `verifiers` environment's rollouts), on a daemon thread.

Why one shared loop: the episode loop runs hundreds of episodes an iteration; a loop (and
thread) per episode, as the libraries' synchronous wrappers make, costs more than the
steps. The episode loop's step threads (`stepping`) wait on their own episode's futures.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

_LOOP: asyncio.AbstractEventLoop | None = None
_LOCK = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
  """The process's environment event loop, running on its daemon thread (made once)."""
  global _LOOP
  with _LOCK:
    if _LOOP is None:
      _LOOP = asyncio.new_event_loop()
      threading.Thread(target=_LOOP.run_forever, name="grpo-jax-envs", daemon=True).start()
    return _LOOP


def call(coro, timeout_s: float):
  """Runs `coro` on the loop and waits at most timeout_s for its result (TimeoutError
  after, the coroutine cancelled)."""
  future = asyncio.run_coroutine_threadsafe(coro, loop())
  try:
    return future.result(timeout=timeout_s)
  except (TimeoutError, concurrent.futures.TimeoutError):  # One class from Python 3.11 on.
    future.cancel()
    raise TimeoutError(f"no result within {timeout_s:g} s") from None


def spawn(coro) -> None:
  """Schedules `coro` on the loop without waiting for it."""
  asyncio.run_coroutine_threadsafe(coro, loop())
