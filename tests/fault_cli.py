"""`grpo-jax` with one fault injected: the real command line, in a process of its own.

  python tests/fault_cli.py --fault=kill_in_warmstart:2 -- --config=... --workdir=...

Everything after `--` goes to `grpo_jax.main` unchanged. Faults (N counts from 1):

  kill_in_warmstart:N     SIGKILL after the N-th warm-start step
  term_in_warmstart:N     SIGTERM to itself after the N-th warm-start step (a preemption)
  kill_after_iteration:N  SIGKILL after iteration N's metrics line, before its checkpoint
  kill_mid_save:N         SIGKILL right after checkpoint N's background save started
  term_after_iteration:N  SIGTERM to itself after iteration N's metrics line
  none                    no fault

It also registers the test tasks of `fault_tasks` (a verifier that raises, one that hangs).
"""

import argparse
import os
import signal
import sys

import fault_tasks  # noqa: E402, F401 -- registers the test tasks.

from grpo_jax import main  # noqa: E402
from grpo_jax.infra import checkpoint  # noqa: E402
from grpo_jax.trainer import train, warmstart  # noqa: E402


def _after(n: int, act):
  """A counter that calls act() on its n-th call."""
  calls = [0]

  def tick():
    calls[0] += 1
    if calls[0] == n:
      act()

  return tick


def inject(fault: str) -> None:
  kind, _, n = fault.partition(":")
  if kind == "none":
    return
  n = int(n)
  kill = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
  term = lambda: os.kill(os.getpid(), signal.SIGTERM)  # noqa: E731
  if kind in ("kill_in_warmstart", "term_in_warmstart"):
    # warmstart.batch runs once per step on the host, before the step: its (N+1)-th call
    # comes after N steps were dispatched.
    tick = _after(n + 1, kill if kind.startswith("kill") else term)
    real = warmstart.batch

    def batch(*args, **kwargs):
      tick()
      return real(*args, **kwargs)

    warmstart.batch = batch
    return
  if kind in ("kill_after_iteration", "term_after_iteration"):
    tick = _after(n, kill if kind.startswith("kill") else term)
    real_write = train.logs.RunLogger.write

    def write(self, record):
      real_write(self, record)
      if record.get("phase") == "rl":
        tick()

    train.logs.RunLogger.write = write
    return
  if kind == "kill_mid_save":
    real_save = checkpoint.Checkpointer.save

    def save(self, step, *args, **kwargs):
      real_save(self, step, *args, **kwargs)
      if step == n and self.directory.name == "checkpoints":
        kill()

    checkpoint.Checkpointer.save = save
    return
  raise SystemExit(f"unknown fault {fault!r}")


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("--fault", default="none")
  args, rest = parser.parse_known_args()
  inject(args.fault)
  sys.argv = [sys.argv[0], *[a for a in rest if a != "--"]]
  main.run()
