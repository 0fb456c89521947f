"""Where the suite's time goes: with GRPO_JAX_COMPILE_PROFILE=<dir>, every test process
and every child it starts (`subproc.child_env`) appends one JSON line per test (per
process, for a child) to <dir>/<pid>.jsonl with the seconds spent tracing, lowering and
compiling (a persistent-cache load counts as compiling: `/jax/core/compile/
backend_compile_duration` times both), the persistent-cache hits and misses, and the wall
seconds, this process's CPU seconds and its finished children's since the line before
(for a test: from the end of the test before it, so pytest's own work between tests
counts to the next test). Wall minus both CPU figures is time waiting: on a suite bound by
CPU, what a shorter wait cannot give back.

    GRPO_JAX_COMPILE_PROFILE=/tmp/prof python -m pytest -n auto -q
    python tests/compile_profile.py /tmp/prof          # the totals, most expensive first

Off by default: it costs nothing then."""

from __future__ import annotations

import atexit
import collections
import json
import os
import pathlib
import resource
import sys
import time

ENV = "GRPO_JAX_COMPILE_PROFILE"
_EVENTS = {
  "/jax/core/compile/jaxpr_trace_duration": "trace_s",
  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
  "/jax/core/compile/backend_compile_duration": "compile_s",
  "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load_s",
}
_COUNTS = {
  "/jax/compilation_cache/cache_hits": "hits",
  "/jax/compilation_cache/cache_misses": "misses",
}
_now: collections.Counter = collections.Counter()
_since: list = []  # [wall, own CPU, children's CPU] at the last line (or at `install`).
_first_done: list = []  # Not empty once `first_test` has written its line.
_CLOCK_KEYS = ("wall_s", "cpu_s", "children_cpu_s")  # What `_clock`'s differences are named.


def _clock() -> list:
  own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
  return [time.monotonic(), own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime]


def install() -> bool:
  """Registers the listeners where GRPO_JAX_COMPILE_PROFILE is set: True if it is."""
  if not os.environ.get(ENV):
    return False
  import jax  # noqa: PLC0415

  def on_duration(event, secs, **_):
    if event in _EVENTS:
      _now[_EVENTS[event]] += secs

  def on_event(event, **_):
    if event in _COUNTS:
      _now[_COUNTS[event]] += 1

  jax.monitoring.register_event_duration_secs_listener(on_duration)
  jax.monitoring.register_event_listener(on_event)
  _since[:] = _clock()
  return True


def flush(name: str) -> None:
  """Appends what was counted since the last flush, as `name`'s line, and starts again."""
  if not os.environ.get(ENV) or not _since:
    return
  now = _clock()
  _now.update(dict(zip(_CLOCK_KEYS, (a - b for a, b in zip(now, _since)))))
  _since[:] = now
  out = pathlib.Path(os.environ[ENV])
  out.mkdir(parents=True, exist_ok=True)
  with open(out / f"{os.getpid()}.jsonl", "a") as f:
    f.write(json.dumps({"name": name, **{k: round(v, 3) for k, v in _now.items()}}) + "\n")
  _now.clear()


def first_test() -> None:
  """Before a test process's first test: what came before it (imports, collection, the wait
  for xdist to hand out tests) as one line, "(start)", not as that test's."""
  if not _first_done:
    flush("(start)")
    _first_done.append(True)


def install_in_child() -> None:
  """A child process's profile: one line at exit, named by its script."""
  if install():
    atexit.register(flush, "child:" + " ".join(pathlib.Path(a).name for a in sys.argv[:2]))


def report(folder: str) -> None:
  """The totals, then per test module (a child: per script) the 40 most expensive."""
  files = pathlib.Path(folder).glob("*.jsonl")
  rows = [json.loads(line) for p in files for line in p.read_text().splitlines()]
  keys = ("trace_s", "lower_s", "compile_s", "cache_load_s", "hits", "misses", *_CLOCK_KEYS)
  by = collections.defaultdict(collections.Counter)
  for r in rows:
    by[r["name"].split("::")[0]].update({k: r.get(k, 0) for k in keys})
  # The test processes' lines alone for the wall: a child's wall is inside its test's.
  tests = {n: c for n, c in by.items() if not n.startswith("child:")}
  total, tested = _summed(by.values()), _summed(tests.values())
  print({k: round(total[k], 1) for k in keys})
  print(
    f"Test processes: wall_s={round(tested['wall_s'], 1)} waiting_s={round(_waiting(tested), 1)}"
  )
  cost = lambda c: c["trace_s"] + c["lower_s"] + c["compile_s"]  # noqa: E731
  for name, c in sorted(by.items(), key=lambda kv: -cost(kv[1]))[:40]:
    print(f"{cost(c):8.1f}  {name}  " + " ".join(f"{k}={round(c[k], 1)}" for k in keys))
  print("Waiting (wall - own CPU - children's CPU), per test module, the 15 longest:")
  for name, c in sorted(tests.items(), key=lambda kv: -_waiting(kv[1]))[:15]:
    print(f"{_waiting(c):8.1f}  {name}  wall_s={round(c['wall_s'], 1)}")


def _summed(counters) -> collections.Counter:
  """The counters added up, zero counts kept (0 misses is a figure)."""
  out = collections.Counter()
  for c in counters:
    out.update(c)
  return out


def _waiting(c) -> float:
  """Wall seconds no CPU of the process or its finished children accounts for."""
  return c["wall_s"] - c["cpu_s"] - c["children_cpu_s"]


if __name__ == "__main__":
  report(sys.argv[1])
