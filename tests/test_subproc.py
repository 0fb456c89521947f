"""tests/subproc.py: a worker's core, what a child process inherits, and the allocator settings."""

import json
import os
import subprocess
import sys

import subproc

# A child given all the cores this worker started with (it is pinned itself under xdist),
# then pin_worker's return and the cores left to it.
_AFFINITY = (
  "import json, os, sys, subproc; os.sched_setaffinity(0, json.loads(sys.argv[1])); "
  "print(json.dumps([subproc.pin_worker(), sorted(os.sched_getaffinity(0))]))"
)


def _pinned(worker: str, count: int) -> tuple:
  """(pin_worker()'s return, the affinity after it) in a child on subproc.CORES with that
  xdist worker id and count (a child: pinning this process would bind the rest of its
  tests to one core)."""
  env = subproc.child_env(PYTEST_XDIST_WORKER=worker, PYTEST_XDIST_WORKER_COUNT=str(count))
  out = subprocess.run(
    [sys.executable, "-c", _AFFINITY, json.dumps(subproc.CORES)],
    env=env, capture_output=True, text=True, check=True,
  ).stdout  # fmt: skip
  return tuple(json.loads(out))


def test_as_many_workers_as_cores_each_takes_the_core_of_its_index():
  cores = list(subproc.CORES)
  if len(cores) < 2:  # One core: nothing to split, and nothing changes.
    assert _pinned("gw0", 1) == (None, cores)
    return
  n = len(cores)
  assert _pinned("gw0", n) == (cores[0], [cores[0]])
  assert _pinned(f"gw{n - 1}", n) == (cores[-1], [cores[-1]])


def test_another_count_or_no_worker_changes_nothing():
  cores = list(subproc.CORES)
  assert _pinned("gw0", len(cores) + 1) == (None, cores)
  assert _pinned("", len(cores)) == (None, cores)
  assert _pinned("master", len(cores)) == (None, cores)


def _started_with(environ: bytes) -> bool:
  """Whether a process's environment held `subproc.MALLOC_TUNABLES` when it started. glibc
  (2.36 here) parses the variable in place, leaving a NUL where each ":" was."""
  return any(
    b"\0GLIBC_TUNABLES=" + subproc.MALLOC_TUNABLES.replace(":", sep).encode() + b"\0"
    in b"\0" + environ
    for sep in (":", "\0")
  )


def test_workers_with_a_core_each_and_their_children_start_with_the_allocator_tunables():
  """glibc reads GLIBC_TUNABLES only as a process starts: the conftest sets it in pytest's
  main process before pytest-xdist starts workers that each get a core (`pin_worker`), so
  such a worker and its children start with it (`subproc.keep_freed_memory`)."""
  pinned = os.environ.get("PYTEST_XDIST_WORKER_COUNT") == str(len(subproc.CORES)) > "1"
  if not pinned or os.environ.get("GLIBC_TUNABLES") != subproc.MALLOC_TUNABLES:
    # Not such a run (or the user's own setting): the decision is the function's, below.
    assert subproc.keep_freed_memory(1) is False
    return
  with open("/proc/self/environ", "rb") as f:
    assert _started_with(f.read())
  code = "import sys; sys.stdout.buffer.write(open('/proc/self/environ', 'rb').read())"
  out = subprocess.run(
    [sys.executable, "-c", code], env=subproc.child_env(), capture_output=True, check=True
  ).stdout
  assert _started_with(out)


def test_the_tunables_are_set_only_for_workers_with_a_core_each(monkeypatch):
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  cores = len(subproc.CORES)
  for workers in (None, 0, 1, cores + 1):  # -n0, one worker, more workers than cores.
    assert subproc.keep_freed_memory(workers) is False
    assert "GLIBC_TUNABLES" not in os.environ
  assert subproc.keep_freed_memory(cores) is (cores >= 2)
  if cores >= 2:
    assert os.environ["GLIBC_TUNABLES"] == subproc.MALLOC_TUNABLES
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")  # The user's: kept.
    assert subproc.keep_freed_memory(cores) is False
    assert os.environ["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
