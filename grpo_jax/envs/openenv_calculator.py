"""The calculator environment served over OpenEnv: a real server for the `openenv` adapter.

    python -m grpo_jax.envs.openenv_calculator --port 8000 --max_sessions 512
    grpo-jax --config=configs/calculator.py:openenv --workdir=/tmp/calculator_openenv

The same rules as the in-process environment (`calculator.respond`), as an OpenEnv
`Environment` (`openenv-core`: `pip install -e ".[openenv]"`): an action {"text": "T:12+34="}
gets {"text": "46;"}, an answer line ends the episode with reward 1 when it is right.
`reset(prompt="Q:7*(12+34)\\n")` solves the prompt the trainer's task drew (its observation
is empty: the prompt already states the problem); a reset without a prompt draws a
problem from `seed` (two nested + or * operations) and returns its prompt as the
observation, for clients that take their problems from the server.

Each WebSocket session is its own environment instance (OpenEnv's design); the server
allows `max_sessions` at once, at least the episodes a trainer has in flight
(prompts_per_step × G, or the held-out evaluation's batch).

`serve` starts it on a thread of this process (the tests, `experiments/openenv_calculator.py`);
the command above serves it until interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import threading
import time

import numpy as np
from openenv.core import env_server

from grpo_jax.envs import calculator
from grpo_jax.tasks import calculator as calculator_task


class TextAction(env_server.Action):
  text: str


class TextObservation(env_server.Observation):
  text: str = ""


class CalculatorServerEnv(env_server.Environment):
  """One episode's calculator on the server (a fresh instance per session)."""

  SUPPORTS_CONCURRENT_SESSIONS = True

  def __init__(self):
    super().__init__()
    self._state = env_server.State(episode_id=None, step_count=0)
    self.answer = None

  def reset(self, seed=None, episode_id=None, prompt=None, **kwargs):
    del kwargs
    self._state = env_server.State(episode_id=episode_id, step_count=0)
    if prompt is None:
      rng = np.random.default_rng(seed)
      text, _, value = calculator_task.draw(rng, steps=2, ops="+*", max_digits=2)
      self.answer = int(value)
      return TextObservation(text=f"Q:{text}\n")
    self.answer = calculator_task.Calculator.solve(prompt)
    return TextObservation(text="")

  def step(self, action, timeout_s=None, **kwargs):
    del timeout_s, kwargs
    if self.answer is None:
      raise RuntimeError("step before reset")
    self._state.step_count += 1
    text, reward, done = calculator.respond(action.text, self.answer)
    return TextObservation(text=text, reward=reward, done=done)

  @property
  def state(self):
    return self._state


def make_app(*, max_sessions: int = 512):
  """The FastAPI app (OpenEnv's routes: /ws sessions, /health, /reset, /step...)."""
  return env_server.create_app(
    CalculatorServerEnv,
    TextAction,
    TextObservation,
    env_name="grpo_jax_calculator",
    max_concurrent_envs=max_sessions,
  )


class _Quiet(logging.Filter):
  """Drops the ASGI error uvicorn logs each time a client closes its session (openenv-core
  0.3.0's close handler lets starlette's WebSocketDisconnect escape; the client sees none)."""

  def filter(self, record):
    return "WebSocketDisconnect" not in f"{record.getMessage()} {record.exc_info}"


@dataclasses.dataclass
class Server:
  """A server running on a thread of this process; `stop()` ends it."""

  url: str
  server: object
  thread: threading.Thread

  def stop(self) -> None:
    self.server.should_exit = True
    self.thread.join(timeout=10)


def serve(*, host: str = "127.0.0.1", port: int = 0, max_sessions: int = 512) -> Server:
  """Starts the server on a thread (port 0: a free one) and returns once it listens."""
  import uvicorn  # noqa: PLC0415 -- openenv-core's dependency, needed only to serve.

  logging.getLogger("uvicorn.error").addFilter(_Quiet())
  config = uvicorn.Config(make_app(max_sessions=max_sessions), host=host, port=port,
                          log_level="warning", ws_ping_interval=None)  # fmt: skip
  server = uvicorn.Server(config)
  thread = threading.Thread(target=server.run, name="openenv-calculator", daemon=True)
  thread.start()
  deadline = time.monotonic() + 30
  while not server.started:
    if not thread.is_alive() or time.monotonic() > deadline:
      raise RuntimeError(f"the OpenEnv calculator server did not start on {host}:{port}")
    time.sleep(0.02)
  bound = server.servers[0].sockets[0].getsockname()[1]
  return Server(url=f"http://{host}:{bound}", server=server, thread=thread)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m grpo_jax.envs.openenv_calculator",
                              description=__doc__.splitlines()[0])  # fmt: skip
  p.add_argument("--host", default="127.0.0.1")
  p.add_argument("--port", type=int, default=8000)
  p.add_argument("--max_sessions", type=int, default=512)
  args = p.parse_args(argv)
  running = serve(host=args.host, port=args.port, max_sessions=args.max_sessions)
  print(f"OpenEnv calculator at {running.url} ({args.max_sessions} sessions at most)", flush=True)
  try:
    running.thread.join()
  except KeyboardInterrupt:
    running.stop()


if __name__ == "__main__":
  main()
