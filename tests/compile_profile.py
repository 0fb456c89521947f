"""Where the suite's time goes to JAX: with GRPO_JAX_COMPILE_PROFILE=<dir>, every test
process and every child it starts (`subproc.child_env`) appends one JSON line per test
(per process, for a child) to <dir>/<pid>.jsonl with the seconds spent tracing, lowering
and compiling (a persistent-cache load counts as compiling: `/jax/core/compile/
backend_compile_duration` times both), and the persistent-cache hits and misses.

    GRPO_JAX_COMPILE_PROFILE=/tmp/prof python -m pytest -n auto -q
    python tests/compile_profile.py /tmp/prof          # the totals, most expensive first

Off by default: it costs nothing then."""

from __future__ import annotations

import atexit
import collections
import json
import os
import pathlib
import sys

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
  return True


def flush(name: str) -> None:
  """Appends what was counted since the last flush, as `name`'s line, and starts again."""
  if not os.environ.get(ENV) or not _now:
    return
  out = pathlib.Path(os.environ[ENV])
  out.mkdir(parents=True, exist_ok=True)
  with open(out / f"{os.getpid()}.jsonl", "a") as f:
    f.write(json.dumps({"name": name, **{k: round(v, 3) for k, v in _now.items()}}) + "\n")
  _now.clear()


def install_in_child() -> None:
  """A child process's profile: one line at exit, named by its script."""
  if install():
    atexit.register(flush, "child:" + " ".join(pathlib.Path(a).name for a in sys.argv[:2]))


def report(folder: str) -> None:
  """The totals, then per test module (a child: per script) the 40 most expensive."""
  files = pathlib.Path(folder).glob("*.jsonl")
  rows = [json.loads(line) for p in files for line in p.read_text().splitlines()]
  keys = ("trace_s", "lower_s", "compile_s", "cache_load_s", "hits", "misses")
  total = collections.Counter()
  for r in rows:
    total.update({k: r.get(k, 0) for k in keys})
  print({k: round(v, 1) for k, v in total.items()})
  by = collections.defaultdict(collections.Counter)
  for r in rows:
    by[r["name"].split("::")[0]].update({k: r.get(k, 0) for k in keys})
  cost = lambda c: c["trace_s"] + c["lower_s"] + c["compile_s"]  # noqa: E731
  for name, c in sorted(by.items(), key=lambda kv: -cost(kv[1]))[:40]:
    print(f"{cost(c):8.1f}  {name}  " + " ".join(f"{k}={round(c[k], 1)}" for k in keys))


if __name__ == "__main__":
  report(sys.argv[1])
