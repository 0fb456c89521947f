"""The trainer is never the OOM victim of a sandboxed candidate.

Two defences, each pinned on its own: the runs' memory groups go beside the trainer's group,
not inside it (cgroup v1 on this kind of host: a real kernel; v2: a fake tree), and every
sandbox process has oom_score_adj 1000 (any hierarchy, or none), so that where a run's group
must be nested the kernel's OOM killer still picks the candidate.
"""

import contextlib
import functools
import json
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time

import needs
import pytest

from grpo_jax.verifiers import sandbox
from grpo_jax.verifiers.sandbox import cgroup, runner

V1_MEMORY = pathlib.Path(cgroup.ROOT) / "memory"
TRAINER_MB = 640  # The stand-in's group limit.
HOLD_MB = 400  # What the stand-in holds resident, besides its interpreter.
CANDIDATE_MB = 300  # Within the run's own budget (memory_mb=512 + 64), not beside HOLD_MB.


@functools.cache
def _namespaces() -> bool:
  return not sandbox.namespaces_unavailable()


def _isolation() -> str:
  return "namespaces" if _namespaces() else "none"


# ---------------------------------------------------------------------------------------
# A real kernel: cgroup v1's memory hierarchy.


def _no_v1_memory() -> str:
  """Why the real-kernel test cannot run here ("" when it can)."""
  if not (V1_MEMORY / "memory.limit_in_bytes").is_file():
    return f"no cgroup v1 memory hierarchy at {V1_MEMORY}"
  if os.geteuid() != 0 or not os.access(V1_MEMORY, os.W_OK):
    return f"{V1_MEMORY} is not writable (not root)"
  found = cgroup.available()
  if found and found[0].version == 2:
    return "the sandbox uses cgroup v2 here (the v1 placement is not what runs)"
  return ""


_STANDIN = """
import json, os, sys
procs, out, hold_mb, candidate_mb, isolation, nested = sys.argv[1:]
with open(procs, "w") as f:  # Joins the trainer's group before holding anything.
  f.write(str(os.getpid()))
held = b"\\1" * (int(hold_mb) << 20)  # Resident: every page written.
from grpo_jax.verifiers import sandbox
from grpo_jax.verifiers.sandbox import cgroup
if nested == "1":  # No writable place outside this process's group: the run nests in it.
  cgroup._outside = lambda mount, own: []
code = (
  "def f():\\n"
  f"  block = b'\\\\1' * ({candidate_mb} << 20)\\n"
  "  return len(block) >> 20\\n"
)
limits = sandbox.Limits(memory_mb=512, timeout_s=30.0)
result = sandbox.run(code, [sandbox.Test("f()", int(candidate_mb))], limits=limits,
                     isolation=isolation)
placed = [h.parent for h in cgroup.available()]
with open(out, "w") as f:
  json.dump({"verdict": result.verdict, "cause": result.cause, "detail": result.detail,
             "parents": placed, "held": len(held) >> 20}, f)
"""


def _remove_groups(top: pathlib.Path) -> None:
  """Kills what is left in a cgroup tree and removes it, deepest first."""
  for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
    deadline = time.monotonic() + 5.0
    while True:
      try:
        os.rmdir(dirpath)
        break
      except FileNotFoundError:
        break
      except OSError:
        for pid in (pathlib.Path(dirpath) / "cgroup.procs").read_text().split():
          with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
        if time.monotonic() > deadline:
          raise
        time.sleep(0.05)


def _stand_in(tmp_path: pathlib.Path, *, nested: bool) -> tuple[subprocess.CompletedProcess, dict]:
  """A trainer stand-in in a memory group of its own (TRAINER_MB), holding HOLD_MB, that
  runs a candidate of CANDIDATE_MB: over its group's limit if the run's memory counts in
  it. Returns the process and what it wrote (nothing if it was killed), and the group's
  counters."""
  top = V1_MEMORY / f"grpo_jax_oom_test_{secrets.token_hex(4)}"
  trainer = top / "trainer"
  trainer.mkdir(parents=True)
  out = tmp_path / "result.json"
  try:
    (trainer / "memory.limit_in_bytes").write_text(str(TRAINER_MB << 20))
    args = [trainer / "cgroup.procs", out, HOLD_MB, CANDIDATE_MB, _isolation(), int(nested)]
    proc = subprocess.run(
      [sys.executable, "-c", _STANDIN, *map(str, args)],
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
    )
    report = json.loads(out.read_text()) if out.exists() else {}
    report["failcnt"] = int((trainer / "memory.failcnt").read_text())
    report["top"] = str(top)
    return proc, report
  finally:
    _remove_groups(top)


def _survived(proc: subprocess.CompletedProcess, report: dict) -> None:
  killed = proc.returncode == -signal.SIGKILL
  assert proc.returncode == 0 and "verdict" in report, (
    f"the trainer stand-in {'was SIGKILLed (the OOM killer)' if killed else 'failed'}: "
    f"exit {proc.returncode}, {report}, stderr: {proc.stderr[-2000:]}"
  )
  assert report["held"] == HOLD_MB


def test_a_candidate_within_its_budget_never_gets_the_trainer_oom_killed(tmp_path):
  """The runs' groups are beside the trainer's (v1, real kernel): the candidate's 300 MB
  are not charged to the trainer's 640 MB group, which holds 400 MB: it never reaches its
  limit, the stand-in lives, and the candidate (within its own 576 MB) passes."""
  needs.require("cgroup_v1_memory", _no_v1_memory())
  proc, report = _stand_in(tmp_path, nested=False)
  _survived(proc, report)
  assert (report["verdict"], report["cause"]) == ("pass", "pass"), report
  assert report["failcnt"] == 0, report  # The trainer's group never reached its limit.
  memory_parent = pathlib.Path(report["parents"][0])
  assert memory_parent == pathlib.Path(report["top"]) / "grpo_jax_sandbox", report


def test_a_run_nested_in_the_trainers_group_loses_the_oom_kill_not_the_trainer(tmp_path):
  """Where no place outside the trainer's group is writable the run's group nests in it
  (v1, real kernel): the trainer's group does reach its limit, and the kernel kills the
  candidate (oom_score_adj 1000), smaller than the stand-in though it is."""
  needs.require("cgroup_v1_memory", _no_v1_memory())
  proc, report = _stand_in(tmp_path, nested=True)
  _survived(proc, report)
  assert report["failcnt"] > 0, report  # It did reach its limit: the OOM killer ran.
  assert report["verdict"] == "fail" and report["cause"] in ("memory", "crash"), report
  memory_parent = pathlib.Path(report["parents"][0])
  assert memory_parent == pathlib.Path(report["top"]) / "trainer" / "grpo_jax_sandbox", report


# ---------------------------------------------------------------------------------------
# oom_score_adj: every process of the sandbox, in any hierarchy (or none).


def _oom_score_adj(pid: int) -> int:
  return int(pathlib.Path(f"/proc/{pid}/oom_score_adj").read_text())


def _ancestors(pid: int, *, until: int) -> list[int]:
  """pid and its parents, up to (not including) `until`."""
  chain = []
  while pid not in (until, 0, 1):
    chain.append(pid)
    status = pathlib.Path(f"/proc/{pid}/status").read_text()
    pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
  assert pid == until, f"{chain} does not descend from {until}"
  return chain


def _find(marker: str, *, wait_s: float) -> list[int]:
  deadline = time.monotonic() + wait_s
  while time.monotonic() < deadline:
    for entry in os.listdir("/proc"):
      if entry.isdigit():
        try:
          if marker.encode() in pathlib.Path(f"/proc/{entry}/cmdline").read_bytes():
            return [int(entry)]
        except OSError:
          continue
    time.sleep(0.02)
  return []


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_every_sandbox_process_is_the_oom_killers_first_choice(isolation, monkeypatch):
  """From the host, while the candidate's child sleeps: it and every process between it
  and this one (worker, supervisor or init, C, outer) have oom_score_adj 1000, and this
  process (the trainer) keeps its own. Inside the namespaces there is no /proc to read it
  from, hence the look from outside; killing the child then lets the run finish."""
  if isolation == "namespaces":
    needs.require("namespaces", sandbox.namespaces_unavailable())
  monkeypatch.setattr(runner, "_WARNED", {runner._NONE_WARNING})
  own = _oom_score_adj(os.getpid())
  marker = f"1000.{secrets.randbelow(10**9):09d}"
  code = f"""
    import os
    child = os.fork()
    if child == 0:
      os.execv('/usr/bin/sleep', ['sleep', {marker!r}])
    os.waitpid(child, 0)
    def f():
      return 1
  """
  limits = sandbox.Limits(timeout_s=10.0)
  results = []
  runs = threading.Thread(
    target=lambda: results.append(
      sandbox.run(
        textwrap.dedent(code), [sandbox.Test("f()", 1)], limits=limits, isolation=isolation
      )
    )
  )
  runs.start()
  found = []
  try:
    found = _find(marker, wait_s=5.0)
    assert found, "the candidate's child never started"
    chain = _ancestors(found[0], until=os.getpid())
    scores = {pid: _oom_score_adj(pid) for pid in chain}
  finally:
    for pid in found:
      os.kill(pid, signal.SIGKILL)
    runs.join()
  assert len(chain) >= (5 if isolation == "namespaces" else 3), chain
  assert set(scores.values()) == {1000}, scores
  assert _oom_score_adj(os.getpid()) == own
  assert (results[0].verdict, results[0].isolation) == ("pass", isolation), results


def test_the_code_reads_its_own_oom_score_adj_as_1000(monkeypatch):
  """Without namespaces the code sees the host's /proc: its own score is 1000."""
  monkeypatch.setattr(runner, "_WARNED", {runner._NONE_WARNING})
  code = "def adj():\n  return open('/proc/self/oom_score_adj').read().strip()\n"
  result = sandbox.run(code, [sandbox.Test("adj()", "1000")], isolation="none")
  assert (result.verdict, result.cause) == ("pass", "pass"), result


# ---------------------------------------------------------------------------------------
# Where the runs' parent goes, on fake trees.


def _fake_tree(monkeypatch, *, own: str, interface: tuple[str, ...], refuse=()) -> None:
  """cgroup on a fake tree under cgroup.ROOT: each directory it makes gets the kernel's
  interface files; making one in a directory of `refuse` fails as an unwritable one would."""
  real_mkdir = os.mkdir

  def mkdir(path, *args):
    if os.path.dirname(path) in refuse:
      raise PermissionError(13, "Permission denied", path)
    real_mkdir(path, *args)
    for name in interface:
      (pathlib.Path(path) / name).write_text("")

  monkeypatch.setattr(cgroup.os, "mkdir", mkdir)
  monkeypatch.setattr(cgroup, "_own_group", lambda version, controller="": own)
  monkeypatch.setattr(cgroup, "_write", lambda path, text: pathlib.Path(path).write_text(text))
  cgroup.available.cache_clear()


@pytest.fixture
def fresh_cache():
  cgroup.available.cache_clear()
  yield
  cgroup.available.cache_clear()


def _inside(path: pathlib.Path, group: pathlib.Path) -> bool:
  return path == group or group in path.parents


_V2_FILES = ("cgroup.procs", "cgroup.kill", "memory.max", "memory.swap.max", "pids.max",
             "memory.events", "cgroup.controllers", "cgroup.subtree_control")  # fmt: skip


@pytest.mark.parametrize(
  "own, refused, expected",
  [
    ("/trainer.slice/trainer", (), "trainer.slice"),  # Beside it, in its parent.
    ("/trainer.slice/trainer", ("trainer.slice",), ""),  # The parent refuses: the root.
    ("/trainer", (), ""),  # A group at the top: beside it is the root.
    ("/", (), ""),
  ],
)
def test_cgroup_v2_runs_never_go_inside_the_trainers_group(
  own, refused, expected, tmp_path, monkeypatch, fresh_cache
):
  root = tmp_path / "cg"
  group = root / own.strip("/")
  group.mkdir(parents=True, exist_ok=True)
  for d in (root, *[p for p in group.parents if _inside(p, root)]):
    (d / "cgroup.controllers").write_text("cpu memory pids\n")
    (d / "cgroup.subtree_control").write_text("cpu\n")
  monkeypatch.setattr(cgroup, "ROOT", str(root))
  _fake_tree(
    monkeypatch, own=own, interface=_V2_FILES, refuse=tuple(str(root / r) for r in refused)
  )
  ((h,),) = [cgroup.available()]
  assert (h.version, pathlib.Path(h.parent)) == (2, root / expected / "grpo_jax_sandbox")
  assert own == "/" or not _inside(pathlib.Path(h.parent), group)
  assert not h.nested


@pytest.mark.parametrize(
  "own, refused, expected, nested",
  [
    ("/process_api/job", (), "process_api", False),  # Beside it, in its parent.
    ("/process_api/job", ("process_api",), "", False),  # The parent refuses: the root.
    ("/job", (), "", False),
    ("/process_api/job", ("process_api", ""), "process_api/job", True),  # Nothing outside.
    ("/", (), "", False),  # At the root (an unlimited group) already.
  ],
)
def test_cgroup_v1_runs_go_beside_the_trainers_group_where_they_can(
  own, refused, expected, nested, tmp_path, monkeypatch, fresh_cache
):
  root = tmp_path / "cg"
  for controller in ("memory", "pids"):
    (root / controller / own.strip("/")).mkdir(parents=True, exist_ok=True)
  monkeypatch.setattr(cgroup, "ROOT", str(root))
  refuse = tuple(str(root / c / r).rstrip("/") for c in ("memory", "pids") for r in refused)
  interface = ("cgroup.procs", "tasks", "memory.limit_in_bytes", "memory.oom_control", "pids.max")
  _fake_tree(monkeypatch, own=own, interface=interface, refuse=refuse)
  found = cgroup.available()
  want = [root / c / expected / "grpo_jax_sandbox" for c in ("memory", "pids")]
  assert [pathlib.Path(h.parent) for h in found] == want
  assert {(h.version, h.nested) for h in found} == {(1, nested)}
  group = root / "memory" / own.strip("/")
  assert nested or own == "/" or not _inside(pathlib.Path(found[0].parent), group)
  assert ("nested" in cgroup.describe()) == nested


def test_cgroup_v1_without_the_trainers_own_group_makes_no_group(
  tmp_path, monkeypatch, fresh_cache
):
  """/proc/self/cgroup names a group the mount does not show (a container's view): where
  this process is cannot be told, so no group is made (the rlimits and the OOM score only)."""
  root = tmp_path / "cg"
  for controller in ("memory", "pids"):
    (root / controller).mkdir(parents=True)
  monkeypatch.setattr(cgroup, "ROOT", str(root))
  _fake_tree(monkeypatch, own="/docker/abc", interface=("tasks",))
  assert cgroup.available() == ()
