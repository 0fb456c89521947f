"""A whole-sandbox memory and process budget: one control group per run.

Rlimits bound each process (RLIMIT_AS, RLIMIT_NPROC), so a sandbox could hold
processes × memory_mb (16 × 512 MB by default before this module). A control group bounds
the sum: ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1) is the run's memory budget
plus the four supervising processes' share, ``pids.max`` its processes plus those four.
A run that the kernel's out-of-memory killer stopped inside its group is recognised from
the group's ``oom_kill`` count (a "memory" failure of the code, not of the sandbox).

Where: cgroup v2 when the unified hierarchy has the memory and pids controllers and this
process may create a group under its own group's parent or the root (root, or a delegated
subtree); else cgroup v1's memory and pids hierarchies when writable (root on a hybrid
host). Otherwise there is no group and `runner` falls back to a lower default process
count (see `runner.Limits`). `available()` probes once per process and says which.

Outside the trainer's group (`_outside`). In both versions the runs' parent goes beside
this process's own group (in that group's parent), else at the hierarchy's root. A run's
memory is then not charged to the trainer's group: it cannot push that group to its limit,
where the kernel's OOM killer would kill the group's largest process (the trainer, while
the candidate stays within its own budget); each run's own limit bounds it instead. Only v1
falls back to nesting the parent inside this process's group, where nothing outside it is
writable (`Hierarchy.nested`, said by `describe()`); v2's rule forbids that. Either way the
harness gives every sandbox process ``oom_score_adj`` 1000 (the trainer keeps its own), so
an OOM kill in any group holding both (a nested run's, a common ancestor's) or on the whole
host takes a sandbox process, never the trainer.

Cost: a mkdir, four writes and an rmdir per hierarchy and run (v2: one hierarchy, v1: two),
measured by experiments/bench_sandbox.py within the per-call overhead; the rmdir of a group
whose killed processes are still being reaped is deferred (`_PENDING`), not waited for.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import functools
import os
import secrets
import threading
import time

ROOT = "/sys/fs/cgroup"
SUPERVISORS = 4  # outer, C, init and the supervisor's own share of memory.
SUPERVISOR_MB = 64
_PARENT_NAME = "grpo_jax_sandbox"


@dataclasses.dataclass(frozen=True)
class Hierarchy:
  version: int  # 1 or 2.
  parent: str  # The directory the runs' groups are made in.
  nested: bool = False  # Inside this process's own group (v1, nothing outside writable).


def _read(path: str) -> str:
  with open(path) as f:
    return f.read()


def _write(path: str, text: str) -> None:
  fd = os.open(path, os.O_WRONLY)
  try:
    os.write(fd, text.encode())
  finally:
    os.close(fd)


def _own_group(version: int, controller: str = "") -> str:
  """This process's group path (relative) in a hierarchy, from /proc/self/cgroup."""
  for line in _read("/proc/self/cgroup").splitlines():
    number, controllers, path = line.split(":", 2)
    if version == 2 and number == "0":
      return path
    if version == 1 and controller in controllers.split(","):
      return path
  return ""


def _make_parent(base: str, controllers: tuple[str, ...], *, v2: bool) -> str:
  parent = os.path.join(base, _PARENT_NAME)
  with contextlib.suppress(FileExistsError):
    os.mkdir(parent)
  if v2:
    _write(os.path.join(parent, "cgroup.subtree_control"), " ".join(f"+{c}" for c in controllers))
  return parent


def _outside(mount: str, own: str) -> list[str]:
  """Where the runs' parent may go, best first: beside this process's group `own` (in its
  parent), else the hierarchy's root; never inside `own` (unless `own` is the root)."""
  return list(dict.fromkeys([os.path.dirname(own) if own != mount else mount, mount]))


def _v2() -> Hierarchy | None:
  mount = ROOT if os.path.exists(os.path.join(ROOT, "cgroup.controllers")) else ""
  mount = mount or (os.path.join(ROOT, "unified") if os.path.isdir(f"{ROOT}/unified") else "")
  if not mount:
    return None
  own = os.path.join(mount, _own_group(2).strip("/")).rstrip("/")
  # A group with processes cannot have controllers for its children (v2's rule): the
  # runs' parent goes beside this process's group, or at the root.
  for base in _outside(mount, own):
    try:
      controllers = set(_read(os.path.join(base, "cgroup.controllers")).split())
      if not {"memory", "pids"} <= controllers:
        continue
      if "memory" not in _read(os.path.join(base, "cgroup.subtree_control")).split():
        _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
      return Hierarchy(2, _make_parent(base, ("memory", "pids"), v2=True))
    except OSError:
      continue
  return None


def _v1() -> tuple[Hierarchy, Hierarchy] | None:
  out = []
  for controller in ("memory", "pids"):
    mount = os.path.join(ROOT, controller)
    own = os.path.join(mount, _own_group(1, controller).strip("/")).rstrip("/")
    if not os.path.isdir(own):  # Where this process is cannot be told (a container's view).
      return None
    # Beside this process's group, so a run is not charged to it (module docstring); in
    # it only where nothing outside is writable, the OOM score then protecting the trainer.
    for base in [*_outside(mount, own), own]:
      try:
        out.append(Hierarchy(1, _make_parent(base, (), v2=False), nested=base == own != mount))
        break
      except OSError:
        continue
    else:
      return None
  return out[0], out[1]


@functools.cache
def available() -> tuple[Hierarchy, ...]:
  """The hierarchies a run's group goes in: (v2,), (v1 memory, v1 pids) or () for none."""
  if not os.path.isdir(ROOT):
    return ()
  v2 = _v2()
  found = (v2,) if v2 else (_v1() or ())
  for h in found:
    _sweep(h.parent)
  return found


def _sweep(parent: str) -> None:
  """Removes the empty groups of runs whose process died without removing them."""
  with contextlib.suppress(OSError):
    for name in os.listdir(parent):
      parts = name.split("-")
      if len(parts) == 3 and parts[0] == "run" and parts[1].isdigit():
        try:
          os.kill(int(parts[1]), 0)
        except ProcessLookupError:
          with contextlib.suppress(OSError):
            os.rmdir(os.path.join(parent, name))
        except OSError:
          pass


_PENDING: list[tuple[Hierarchy, str]] = []  # Killed, not yet reaped: removed later.
# Runs start and end on several threads at once (the reward pool): one at a time edits
# _PENDING, so two never remove the same group.
_PENDING_LOCK = threading.Lock()


def _rmdir(path: str) -> bool:
  """Removes an empty group; False while it still holds (killed, unreaped) processes."""
  try:
    os.rmdir(path)
  except FileNotFoundError:
    return True
  except OSError as e:
    return e.errno != errno.EBUSY  # Another error: nothing a retry would change.
  return True


def _retry_pending(*, wait_s: float = 0.0) -> None:
  """Removes the pending groups that are empty now; with wait_s, retries for that long."""
  deadline = time.monotonic() + wait_s
  while True:
    with _PENDING_LOCK:
      for h, path in list(_PENDING):
        Budget._kill(h, path)
        if _rmdir(path):
          _PENDING.remove((h, path))
      if not _PENDING or time.monotonic() >= deadline:
        return
    time.sleep(0.005)


atexit.register(lambda: _retry_pending(wait_s=1.0))


def describe() -> str:
  found = available()
  if not found:
    return "no control group (the per-process rlimits only)"
  where = f"cgroup v{found[0].version} under {', '.join(h.parent for h in found)}"
  if any(h.nested for h in found):  # The OOM score alone keeps the trainer from the killer.
    where += " (nested in this process's own group: nothing outside it is writable)"
  return where


@dataclasses.dataclass
class Budget:
  """One run's group(s): made by `create`, joined by `add` (v2) or by the run's first
  process through `self_join` (v1), read by `oom_killed`,
  removed (its processes killed first) by `remove`."""

  dirs: list[tuple[Hierarchy, str]]

  @classmethod
  def create(cls, *, memory_mb: int, processes: int) -> Budget | None:
    """The run's groups with their limits, or None where no hierarchy is available or
    making one failed (then the run has the rlimits only)."""
    found, name = available(), f"run-{os.getpid()}-{secrets.token_hex(4)}"
    if not found:
      return None
    _retry_pending()
    budget = cls([])
    memory = (memory_mb + SUPERVISOR_MB) << 20
    try:
      for h in found:
        path = os.path.join(h.parent, name)
        os.mkdir(path)
        budget.dirs.append((h, path))
        budget._limit(h, path, memory=memory, pids=processes + SUPERVISORS)
    except OSError:
      budget.remove()
      return None
    return budget

  @staticmethod
  def _limit(h: Hierarchy, path: str, *, memory: int, pids: int) -> None:
    files = os.listdir(path)
    if h.version == 2:
      _write(os.path.join(path, "memory.max"), str(memory))
      if "memory.swap.max" in files:
        _write(os.path.join(path, "memory.swap.max"), "0")
    elif "memory.limit_in_bytes" in files:
      _write(os.path.join(path, "memory.limit_in_bytes"), str(memory))
      if "memory.memsw.limit_in_bytes" in files:
        _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(memory))
    if "pids.max" in files:
      _write(os.path.join(path, "pids.max"), str(pids))

  def add(self, pid: int) -> None:
    """Moves process pid into the v2 group (cgroup.procs). The v1 groups are joined by
    the process itself (`self_join`), so add skips them."""
    for h, path in self.dirs:
      if h.version == 2:
        _write(os.path.join(path, "cgroup.procs"), str(pid))

  def self_join(self) -> list[str]:
    """The files the run's first process writes "0" to, before it does anything else, to
    join the v1 groups: v1's ``tasks`` file moves the writing thread (the harness is
    single-threaded then) without the kernel's global threadgroup lock, which moving
    another process by pid takes (an RCU grace period that stalls every fork on the host:
    14 ms median per write here, 0.04 ms for the thread's own write)."""
    return [os.path.join(path, "tasks") for h, path in self.dirs if h.version == 1]

  def oom_killed(self) -> bool:
    """Whether the kernel's out-of-memory killer stopped a process of the group."""
    for h, path in self.dirs:
      name = "memory.events" if h.version == 2 else "memory.oom_control"
      with contextlib.suppress(OSError):
        for line in _read(os.path.join(path, name)).splitlines():
          key, _, value = line.partition(" ")
          if key == "oom_kill" and int(value or 0) > 0:
            return True
    return False

  def remove(self) -> None:
    """Kills what is left in the groups and removes them. A group whose killed processes
    the kernel has not reaped yet (rmdir: EBUSY) is left for later: `create` retries
    the pending ones without waiting, and the exit of this process waits for them briefly
    (the run's verdict never waits on the reaper: about 2.5 ms a run with 2 workers)."""
    for h, path in reversed(self.dirs):
      self._kill(h, path)
      if not _rmdir(path):
        with _PENDING_LOCK:
          _PENDING.append((h, path))
    self.dirs = []

  @staticmethod
  def _kill(h: Hierarchy, path: str) -> None:
    if h.version == 2 and os.path.exists(os.path.join(path, "cgroup.kill")):
      with contextlib.suppress(OSError):
        _write(os.path.join(path, "cgroup.kill"), "1")
      return
    with contextlib.suppress(OSError):
      for pid in _read(os.path.join(path, "cgroup.procs")).split():
        with contextlib.suppress(OSError):
          os.kill(int(pid), 9)
