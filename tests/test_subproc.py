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


_ENVIRON = "import sys; sys.stdout.buffer.write(open('/proc/self/environ', 'rb').read())"


def _child_started_with_tunables(cores) -> bool:
  """Whether a child of a process on `cores` started with `MALLOC_TUNABLES` (glibc read
  them): the child_env is made in a grandchild pinned to `cores` (pinning this process
  would bind the rest of its tests)."""
  code = (
    "import json, os, subprocess, sys, subproc; os.sched_setaffinity(0, json.loads(sys.argv[1])); "
    "sys.stdout.buffer.write(subprocess.run([sys.executable, '-c', sys.argv[2]], "
    "env=subproc.child_env(), capture_output=True, check=True).stdout)"
  )
  env = {k: v for k, v in subproc.child_env().items() if k != "GLIBC_TUNABLES"}
  out = subprocess.run(
    [sys.executable, "-c", code, json.dumps(cores), _ENVIRON], env=env, capture_output=True,
    check=True,
  ).stdout  # fmt: skip
  return _started_with(out)


def test_a_child_of_a_process_on_one_core_starts_with_the_allocator_tunables():
  """glibc reads GLIBC_TUNABLES only as a process starts: `child_env` gives it to the
  children of a process on one core (an xdist worker's), which start with it."""
  assert _child_started_with_tunables(list(subproc.CORES[:1]))
  if len(subproc.CORES) > 1:  # On several cores the one heap would be contended: no.
    assert not _child_started_with_tunables(list(subproc.CORES))


def test_the_tunables_are_for_one_core_and_a_users_setting_is_kept(monkeypatch):
  monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
  one = len(os.sched_getaffinity(0)) == 1
  assert subproc.malloc_env() == ({"GLIBC_TUNABLES": subproc.MALLOC_TUNABLES} if one else {})
  monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")  # The user's: kept.
  assert subproc.malloc_env() == {}
  assert subproc.child_env()["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2"
