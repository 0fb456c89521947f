"""One sandboxed run: the limits, the isolation check, starting the child, the result.

See the package docstring (`grpo_jax.verifiers.sandbox`) for the verdicts, the isolation and what
is and is not contained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import marshal
import math
import os
import pathlib
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence

from absl import logging

from grpo_jax.verifiers.sandbox import cgroup, channel, layout, seccomp, values

VERDICTS = ("pass", "fail", "could_not_run")
# Why a run got its verdict: "pass"; the code's own failures (verdict "fail"); the
# sandbox's ("could_not_run").
FAIL_CAUSES = ("wrong", "raised", "timeout", "memory", "crash", "tampered")
CAUSES = ("pass", *FAIL_CAUSES, "sandbox")
ISOLATIONS = ("auto", "namespaces", "none")
# The uid and gid the code runs as on the host when the trainer is root: no account has
# it, so the kernel's per-user counts it takes are charged to no one else.
IDENTITY = 2_000_000_000
# pivot_root's system call number per machine (mount_setattr is 442 on all of them).
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_HARNESS = (pathlib.Path(__file__).parent / "harness.py").read_text()
_KILL_WAIT_S = 5.0
_PROBE_ATTEMPTS = 3


class Unavailable(ValueError):
  """Namespace isolation was asked for (isolation 'auto' or 'namespaces') and does not
  work on this machine."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resources of one run. ``cpu_s=0`` means ceil(timeout_s); ``processes=0`` means 16
  where a control group bounds the whole sandbox's memory, else 4 (`processes_for`)."""

  timeout_s: float = 5.0  # Wall clock, from the interpreter's start to the last result.
  cpu_s: int = 0  # RLIMIT_CPU of each process running candidate code.
  memory_mb: int = 512  # The whole sandbox (control group) and each process (RLIMIT_AS).
  file_mb: int = 8  # RLIMIT_FSIZE: the largest file the code may write.
  tmp_mb: int = 16  # Size of the private /tmp (namespaces only).
  processes: int = 0  # RLIMIT_NPROC (threads count too); 0: 16 with a control group, else 4.
  open_files: int = 64  # RLIMIT_NOFILE.
  max_result_chars: int = 100_000  # A longer repr is reported as "oversized" (wrong).

  def __post_init__(self):
    if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
      raise ValueError(f"Limits.timeout_s must be a positive number, got {self.timeout_s}.")
    for name in ("memory_mb", "file_mb", "tmp_mb", "open_files", "max_result_chars"):
      if getattr(self, name) < 1:
        raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}.")
    if self.processes < 0:
      raise ValueError(f"Limits.processes must be >= 0 (0: automatic), got {self.processes}.")
    if self.cpu_s < 0:
      raise ValueError(f"Limits.cpu_s must be >= 0 (0: ceil(timeout_s)), got {self.cpu_s}.")

  def processes_for(self, *, grouped: bool) -> int:
    return self.processes or (16 if grouped else 4)

  def rlimits(self, *, grouped: bool) -> list[tuple[str, int]]:
    return [
      ("RLIMIT_CPU", self.cpu_s or math.ceil(self.timeout_s)),
      ("RLIMIT_AS", self.memory_mb << 20),
      ("RLIMIT_FSIZE", self.file_mb << 20),
      ("RLIMIT_NPROC", self.processes_for(grouped=grouped)),
      ("RLIMIT_NOFILE", self.open_files),
      ("RLIMIT_CORE", 0),
    ]


@dataclasses.dataclass(frozen=True)
class Result:
  verdict: str  # One of VERDICTS.
  detail: str  # Why (the first wrong test, the signal, the timeout...).
  passed: int  # Tests whose value equalled the expected value.
  total: int
  isolation: str  # "namespaces" or "none": how this run was contained ("" refused).
  seconds: float  # Wall time of the run.
  cause: str = ""  # One of CAUSES.
  identity: int = -1  # The host uid the code ran as (-1: unknown).


# ---------------------------------------------------------------------------------------
# Isolation: what works here, checked at startup and before each run.


def _namespace_problem() -> str:
  """Why namespaces cannot work here without trying ("" when they might)."""
  if sys.platform != "linux":
    return f"namespaces need Linux, this is {sys.platform}"
  if platform.machine() not in _PIVOT_ROOT:
    return f"unknown pivot_root syscall number for machine {platform.machine()!r}"
  return ""


_PASSED_PROBE: list[Result] = []  # The first probe that passed in this process.


def _probe() -> Result:
  return _run(
    "def f():\n  return 1\n",
    [values.Test(call="f()", expected=1)],
    prelude="",
    setup="",
    limits=Limits(timeout_s=30.0),
    isolate=True,
  )


def namespaces_unavailable() -> str:
  """Why namespace isolation does not work in this process ("" when it does). A probe
  (one sandboxed run of a one-line function) that passed is remembered for the life of
  the process; one that failed is not: the next call probes again, so a transient failure
  (a resource short for a moment) costs only the calls it happened in."""
  if _PASSED_PROBE:
    return ""
  problem = _namespace_problem()
  if problem:
    return problem
  result = _probe()
  if result.verdict == "pass":
    _PASSED_PROBE.append(result)
    return ""
  return f"the probe run gave {result.verdict}: {result.detail}"


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
  if message not in _WARNED:
    _WARNED.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logging.warning(message)


_NONE_WARNING = (
  "sandbox: isolation='none': untrusted code runs with the trainer's network and "
  "filesystem access (rlimits, seccomp, an empty environment and a timeout only)."
)


def _check_name(isolation: str) -> None:
  if isolation not in ISOLATIONS:
    raise ValueError(f"Unknown sandbox isolation {isolation!r}; valid: {ISOLATIONS}.")


def check(isolation: str) -> str:
  """The startup check: one line saying how code will be contained, or Unavailable.

  "none": the line is a warning (logged once). "auto" and "namespaces" (the same: no mode
  ever falls back to running without isolation) probe up to three times; when no probe
  passes, Unavailable says why and what to do."""
  _check_name(isolation)
  if isolation == "none":
    _warn_once(_NONE_WARNING)
    return _NONE_WARNING
  reason = ""
  for attempt in range(_PROBE_ATTEMPTS):
    reason = namespaces_unavailable()
    if not reason or _namespace_problem():
      break
    time.sleep(0.1 * (attempt + 1))
  if reason:
    raise Unavailable(
      f"sandbox: isolation={isolation!r} needs Linux namespaces, which do not work here "
      f"({reason}). Enable unprivileged user namespaces (e.g. sysctl "
      "kernel.unprivileged_userns_clone=1 or kernel.apparmor_restrict_unprivileged_userns=0), "
      "or set isolation='none' to run the code without isolation (trusted code only)."
    )
  return describe()


def describe() -> str:
  """How a run is contained here (after a probe passed)."""
  probe = _PASSED_PROBE[0] if _PASSED_PROBE else None
  who = f"as uid {probe.identity}" if probe and probe.identity >= 0 else "as an unknown identity"
  filtered = seccomp.program()
  seccomp_text = (
    f"a seccomp filter ({len(filtered) // 8} instructions)"
    if filtered
    else f"no seccomp filter (no system call table for {platform.machine()})"
  )
  return f"sandbox: namespace isolation, {who}, {seccomp_text}, {cgroup.describe()}."


def run(
  code: str,
  tests: Sequence[values.Test],
  *,
  prelude: str = "",
  setup: str = "",
  limits: Limits | None = None,
  isolation: str = "auto",
  spent_s: float = 0.0,
) -> Result:
  """Runs ``prelude``, ``code``, ``setup`` (one namespace, in that order) and then each
  test's call in a sandboxed child, and judges the values here (see the package
  docstring). ``limits`` defaults to ``Limits()``. Where namespaces do not work, "auto"
  and "namespaces" give "could_not_run" (cause "sandbox") with ``isolation=""``.

  ``spent_s``: seconds of the row's budget (``limits.timeout_s``) the caller already spent
  on the completion (extracting and parsing its code): the run's wall clock ends that much
  earlier, so the whole row stays within timeout_s. A row with no time left "fail"s with
  cause "timeout" without starting a child."""
  _check_name(isolation)
  limits = limits or Limits()
  if spent_s >= limits.timeout_s:
    detail = (
      f"timed out after {limits.timeout_s:g}s (reading the completion took {spent_s:.2f}s; "
      f"0 of {len(tests)} tests done)"
    )
    return Result("fail", detail, 0, len(tests), "", spent_s, "timeout")
  run = functools.partial(
    _run, code, tests, prelude=prelude, setup=setup, limits=limits, spent_s=spent_s
  )
  if isolation == "none":
    _warn_once(_NONE_WARNING)
    return run(isolate=False)
  reason = namespaces_unavailable()
  if reason:
    detail = f"sandbox refused: namespace isolation does not work here ({reason})"
    return Result("could_not_run", detail, 0, len(tests), "", 0.0, "sandbox")
  return run(isolate=True)


# ---------------------------------------------------------------------------------------
# One run.


def _job(code, tests, *, prelude, setup, limits, isolate, grouped, nonce, fds, workdir) -> dict:
  binds, links, masks = layout.layout()
  return {
    "nonce": nonce,
    "code": code,
    "prelude": prelude,
    "setup": setup,
    "calls": [t.call for t in tests],
    "results_fd": fds[0],
    "status_fd": fds[1],
    "parent": os.getpid(),
    "isolate": isolate,
    "workdir": workdir,
    "binds": [list(b) for b in binds],
    "links": [list(link) for link in links],
    "masks": list(masks),
    "identity": IDENTITY,
    "seccomp": _seccomp(),
    "pivot_root": _PIVOT_ROOT.get(platform.machine(), -1),
    "tmp_mb": limits.tmp_mb,
    "rlimits": limits.rlimits(grouped=grouped),
    "max_result_chars": limits.max_result_chars,
  }


@functools.cache
def _seccomp() -> bytes:
  return seccomp.program()


def _run(code, tests, *, prelude, setup, limits, isolate, spent_s=0.0) -> Result:
  start = time.monotonic()
  nonce = secrets.token_hex(16)
  mode = "namespaces" if isolate else "none"
  # Without namespaces the code works in a fresh temporary directory (removed afterwards);
  # with them, in the sandbox's private /tmp.
  tempdir = (
    contextlib.nullcontext() if isolate else tempfile.TemporaryDirectory(prefix="grpo_jax_sandbox_")
  )
  with tempdir as workdir:
    try:
      ending = _execute(
        functools.partial(
          _job, code, tests, prelude=prelude, setup=setup, limits=limits, isolate=isolate
        ),
        nonce=nonce,
        workdir=workdir,
        limits=limits,
        n_tests=len(tests),
        spent_s=spent_s,
      )
    except OSError as e:  # Fork, pipe or control group failed: the host is short of something.
      detail = f"could not start the sandbox: {e}"
      seconds = time.monotonic() - start
      return Result("could_not_run", detail, 0, len(tests), mode, seconds, "sandbox")
  verdict, cause, detail, passed = channel.judge(
    ending, tests, nonce=nonce, max_result_chars=limits.max_result_chars
  )
  identity = _identity(ending, nonce) if isolate else os.geteuid()
  seconds = time.monotonic() - start
  return Result(verdict, detail, passed, len(tests), mode, seconds, cause, identity)


def _identity(ending: channel.Ending, nonce: str) -> int:
  prefix = f"{nonce} identity ".encode()
  for line in ending.data["status"].split(b"\n"):
    if line.startswith(prefix):
      with contextlib.suppress(ValueError):
        return int(line[len(prefix) :])
  return -1


def _execute(job, *, nonce: str, workdir: str | None, limits: Limits, n_tests: int, spent_s=0.0):
  """Starts the harness in its control group with the job, collects its pipes (within
  their caps), kills what is left. Returns a channel.Ending."""
  deadline = time.monotonic() + limits.timeout_s - spent_s
  budget = cgroup.Budget.create(
    memory_mb=limits.memory_mb, processes=limits.processes_for(grouped=True)
  )
  try:
    return _start_and_collect(
      job, nonce=nonce, workdir=workdir, limits=limits, n_tests=n_tests,
      deadline=deadline, budget=budget,
    )  # fmt: skip
  finally:
    if budget is not None:
      budget.remove()


def _start_and_collect(job, *, nonce, workdir, limits, n_tests, deadline, budget):
  results_r, results_w = os.pipe()
  status_r, status_w = os.pipe()
  try:
    proc = subprocess.Popen(
      [layout.python(), "-I", "-S", "-c", _HARNESS],
      stdin=subprocess.PIPE,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      env={},
      cwd=workdir or "/",
      pass_fds=(results_w, status_w),
      start_new_session=True,
    )
  except OSError:
    os.close(results_r)
    os.close(status_r)
    raise
  finally:
    os.close(results_w)
    os.close(status_w)
  try:
    if budget is not None:
      budget.add(proc.pid)  # Before the job: the harness waits for it, runs nothing yet.
    payload = job(
      grouped=budget is not None, nonce=nonce, fds=(results_w, status_w), workdir=workdir
    )
    payload["join"] = budget.self_join() if budget is not None else []
    with contextlib.suppress(BrokenPipeError):  # The harness died: judged from its pipes.
      proc.stdin.write(marshal.dumps(payload))
      proc.stdin.close()
    fds = {"results": results_r, "status": status_r, "stderr": proc.stderr.fileno()}
    caps = {
      "results": channel.results_cap(n_tests, limits.max_result_chars),
      "status": channel.STATUS_BYTES,
      "stderr": channel.STDERR_BYTES,
    }
    data, overflow, timed_out = channel.collect(fds, deadline=deadline, caps=caps)
  finally:
    _kill(proc)
    os.close(results_r)
    os.close(status_r)
  oom = budget.oom_killed() if budget is not None else False
  return channel.Ending(data, overflow, timed_out, oom, limits.timeout_s)


def _kill(proc: subprocess.Popen) -> None:
  """SIGKILLs the child's process group (whatever is left of it) and reaps the child."""
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(proc.pid, signal.SIGKILL)  # Before wait: the unreaped leader keeps the group id.
  try:
    proc.wait(timeout=_KILL_WAIT_S)
  except subprocess.TimeoutExpired:
    logging.warning(
      "sandbox: process %d did not die within %gs of SIGKILL.", proc.pid, _KILL_WAIT_S
    )
  with contextlib.suppress(OSError):
    proc.stdin.close()
  proc.stderr.close()
