"""tests/subproc.py: a worker's core, and what a child process inherits."""

import json
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
