"""Run untrusted Python against hidden unit tests, in a sandboxed process, for a reward.

    tests = [sandbox.parse_test("assert add(2, 3) == 5"), ...]
    result = sandbox.run(code, tests)           # Result(verdict="pass", passed=3, total=3, ...)
    result.verdict                              # "pass" | "fail" | "could_not_run"

Verdicts. "pass": every test's value equalled its expected value. "fail": the code is
wrong: a value differed, a test raised, the code did not compile or raised, a value was
not a plain literal (an object with an always-true ``__eq__`` is not one), the program
ended before the tests finished (``os._exit(0)``, ``sys.exit`` at the wrong time) or
tampered with the result channel. "could_not_run": nothing was learned about the code:
the wall-clock timeout, a resource limit that killed the process (CPU seconds, file
size), a ``MemoryError``, or the sandbox itself failing or refusing (namespaces asked
for but unavailable). It is counted apart from "fail", like ``math_verify``'s
"unscorable": ``tasks.code.CodeTask.reward`` raises ``rewards.Unscorable`` for it, so
the trainer counts it in ``reward_errors``. A definite wrong value wins over a later
timeout ("fail"): a candidate cannot dodge a wrong answer by hanging afterwards.

Tests are ``assert <call> == <expected>`` statements (MBPP style). ``parse_test`` splits
one, in this process, into the call expression (source text) and the expected value,
which must be a literal (``ast.literal_eval``; also ``set(...)``, ``frozenset(...)``,
``tuple(...)``, ``list(...)``, ``dict(...)`` of literals), else ``ValueError``.

The verdict channel. The expected values never leave this process: the child gets the
code and the call expressions only. A harness in the child runs the code, evaluates each
call, and writes one line per test, ``<nonce> <i>:ok <repr(value)>`` (or ``<i>:raised``,
``<i>:nonliteral`` ...), to a pipe of its own (not stdout, not the exit code), then
``<nonce> end``. A value is reported only when it is made of exact built-in literal types
(int, float, complex, str, bytes, bool, None, tuple, list, dict, set, frozenset; no
subclasses), so its ``repr`` is the built-in one and cannot run candidate code. This
process parses each repr with the same restricted evaluator as the expected values and
compares the two with ``==``. Nothing the candidate can do in the child (exit early with
status 0, print "all tests passed", patch builtins or the harness, return objects with a
lying ``__eq__``, write its own lines to the pipe) makes a wrong answer pass: to write a
passing line it must know the expected value, i.e. compute the right answer. Lines with
another nonce, out of order, duplicated or after ``end`` mark the channel as tampered
with ("fail"). The per-run random nonce keeps stray or guessed writes from being read
as results. Whether the sandbox
started (``<nonce> ready``, written before any candidate code runs) and how the process
running the code ended (exit status or signal) come from processes that never run
candidate code, over a second pipe the code's process closes first.

Isolation (``isolation=``): "auto" (default) uses Linux namespaces when a probe (one run,
once per process) shows they work, else warns once and runs with "none"; "namespaces"
requires them ("could_not_run" when unavailable); "none" is the fallback, with a warning.

In every mode the child is ``python -I -S`` (isolated: no PYTHON* variables, no user
site, no site-packages), started with an empty environment (the trainer's variables and
secrets are not passed), stdin on /dev/null, stdout/stderr of the code on /dev/null, in
its own session (process group), with rlimits set before any candidate code runs:
RLIMIT_CPU (cpu_s), RLIMIT_AS (memory_mb), RLIMIT_FSIZE (file_mb), RLIMIT_NPROC
(processes), RLIMIT_NOFILE (open_files) and RLIMIT_CORE=0. The wall-clock timeout
(timeout_s, including the interpreter's start) SIGKILLs the whole process group. The
sandbox also dies with its caller (PR_SET_PDEATHSIG: its first process then SIGKILLs its
process group), so a reward worker killed by the pool's timeout takes its sandbox along.
The code's namespace has ``__name__ == "__candidate__"``, so an
``if __name__ == "__main__":`` block does not run.

"namespaces" adds, with unprivileged user namespaces (the kernel must allow them) and
mount_setattr (Linux >= 5.12), on x86_64/aarch64/riscv64/ppc64le/s390x:

* network: a new, empty network namespace (not even loopback is up): no TCP/UDP to
  anywhere, no abstract unix sockets of the host;
* filesystem: a new root (pivot_root, the old root detached) holding only, read-only, the
  system directories /usr /bin /sbin /lib /lib32 /lib64 /libx32 (those that exist),
  /etc/ld.so.cache, the Python installation (``sys.base_prefix``), /dev/null, zero,
  random and urandom, and a writable private tmpfs /tmp of tmp_mb (the working directory;
  it vanishes with the sandbox). Not there: /home, /root, /work, the host's /tmp, /etc,
  /proc, /sys, /run, /var, the repository, the trainer's files and sockets. The mounts are
  locked (the code runs in a nested user namespace), so it cannot unmount them or
  remount them writable;
* processes: a new PID namespace (the code sees only its own processes; all of them die
  when the sandbox's init dies, so a fork bomb or a daemonised child cannot outlive the
  timeout), plus new IPC and UTS namespaces;
* user: the code runs as the trainer's uid mapped into the namespace, except when the
  trainer is root: then as uid/gid 65534 (nobody), because the kernel does not apply
  RLIMIT_NPROC to uid 0, even in a user namespace (where root may not map 65534, e.g. in
  a container that maps one uid, it runs as root inside, without the process limit).

Not contained, even with namespaces: CPU and memory beyond the per-process rlimits (no
cgroups: RLIMIT_AS applies to each of up to ``processes`` processes, plus tmp_mb of
tmpfs); the kernel's attack surface (no seccomp filter); reading the Python installation
and system libraries; timing side channels. With "none" the code can read and write
whatever the trainer's user can (only the working directory is a fresh temporary one),
reach the network, see other processes (and the trainer's /proc entries, so also the
expected values in its memory where ptrace rules allow), and escape the kill by calling
setsid(); RLIMIT_NPROC does not apply to root and counts all of the user's processes
otherwise. Use "none" only for trusted code or tests.

Cost: one ``python -I -S`` start and three forks per call, about 30 ms for a tiny
function (tests/test_sandbox.py prints it); the probe costs one more run, once.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import marshal
import math
import os
import platform
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

from absl import logging

VERDICTS = ("pass", "fail", "could_not_run")
ISOLATIONS = ("auto", "namespaces", "none")
# pivot_root's syscall number per machine (mount_setattr is 442 on all of them).
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
# Constructors allowed around literals in expected values (and in the child's reprs).
_CONSTRUCTORS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict}
_MAX_CHANNEL_BYTES = 16 << 20  # Results beyond this are dropped (and the run fails).
_MAX_STDERR_BYTES = 16 << 10
_KILL_WAIT_S = 5.0


@dataclasses.dataclass(frozen=True)
class Limits:
  """Resources of one run. ``cpu_s=0`` means ceil(timeout_s)."""

  timeout_s: float = 5.0  # Wall clock, from the interpreter's start to the last result.
  cpu_s: int = 0  # RLIMIT_CPU of each process running candidate code.
  memory_mb: int = 512  # RLIMIT_AS of each process.
  file_mb: int = 8  # RLIMIT_FSIZE: the largest file the code may write.
  tmp_mb: int = 16  # Size of the private /tmp (namespaces only).
  processes: int = 16  # RLIMIT_NPROC (threads count too).
  open_files: int = 64  # RLIMIT_NOFILE.
  max_result_chars: int = 100_000  # A longer repr is reported as "oversized" (wrong).

  def __post_init__(self):
    if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
      raise ValueError(f"Limits.timeout_s must be a positive number, got {self.timeout_s}.")
    for name in ("memory_mb", "file_mb", "tmp_mb", "processes", "open_files", "max_result_chars"):
      if getattr(self, name) < 1:
        raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}.")
    if self.cpu_s < 0:
      raise ValueError(f"Limits.cpu_s must be >= 0 (0: ceil(timeout_s)), got {self.cpu_s}.")

  def rlimits(self) -> list[tuple[str, int]]:
    cpu = self.cpu_s or math.ceil(self.timeout_s)
    return [
      ("RLIMIT_CPU", cpu),
      ("RLIMIT_AS", self.memory_mb << 20),
      ("RLIMIT_FSIZE", self.file_mb << 20),
      ("RLIMIT_NPROC", self.processes),
      ("RLIMIT_NOFILE", self.open_files),
      ("RLIMIT_CORE", 0),
    ]


@dataclasses.dataclass(frozen=True)
class Test:
  """One hidden test: the child evaluates ``call``; the value must equal ``expected``."""

  call: str  # Source of an expression, e.g. "add(2, 3)".
  expected: Any  # A literal value; it never leaves the parent process.
  source: str = ""  # The assert it came from (for messages).


@dataclasses.dataclass(frozen=True)
class Result:
  verdict: str  # One of VERDICTS.
  detail: str  # Why (the first wrong test, the signal, the timeout...).
  passed: int  # Tests whose value equalled the expected value.
  total: int
  isolation: str  # "namespaces" or "none": how this run was contained.
  seconds: float  # Wall time of the run.


# ---------------------------------------------------------------------------------------
# Tests and values.


def literal_value(node: ast.expr) -> Any:
  """The value of a literal expression: what ``ast.literal_eval`` accepts, plus
  set/frozenset/tuple/list/dict applied to one literal (or to nothing), at any depth.
  ValueError for anything else."""
  try:
    return _literal(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
    raise ValueError(f"{ast.unparse(node)[:200]!r} is not a literal ({e}).") from None


def _literal(node: ast.expr) -> Any:
  if isinstance(node, ast.Call):
    name = node.func.id if isinstance(node.func, ast.Name) else ""
    if name not in _CONSTRUCTORS or node.keywords or len(node.args) > 1:
      raise ValueError(f"calls other than {sorted(_CONSTRUCTORS)} of one literal")
    return _CONSTRUCTORS[name](*(_literal(arg) for arg in node.args))
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
    return kind(_literal(e) for e in node.elts)
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise ValueError("** in a dict")
    return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
  return ast.literal_eval(node)


def parse_value(text: str) -> Any:
  """``literal_value`` of an expression's source text (ValueError if it is not one)."""
  try:
    node = ast.parse(text, mode="eval").body
  except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    raise ValueError(f"{text[:200]!r} is not an expression ({e}).") from None
  return literal_value(node)


def parse_test(source: str) -> Test:
  """``assert <call> == <expected>`` (either side may be the literal; a message after the
  comparison is ignored) as a Test. ValueError, naming the test, for anything else."""
  try:
    tree = ast.parse(source.strip())
  except SyntaxError as e:
    raise ValueError(f"Test {source!r} is not valid Python: {e}.") from None
  shape = "one statement `assert <call> == <literal>`"
  if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
    raise ValueError(f"Test {source!r} is not {shape}.")
  test = tree.body[0].test
  if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
    raise ValueError(f"Test {source!r} is not {shape}: it does not compare with a single ==.")
  left, right = test.left, test.comparators[0]
  for call, expected in ((left, right), (right, left)):
    try:
      return Test(call=ast.unparse(call), expected=literal_value(expected), source=source)
    except ValueError:
      continue
  raise ValueError(
    f"Test {source!r}: neither side of == is a literal (numbers, strings, bytes, None, "
    "booleans, and tuples/lists/dicts/sets of them, or set/frozenset/tuple/list/dict of "
    "one), so the expected value cannot be checked outside the sandbox."
  )


# ---------------------------------------------------------------------------------------
# The child: a harness run as `python -I -S -c _HARNESS`, the job on stdin (marshal).
#
# Processes, with namespaces: outer (this Popen) -> C (unshares user, mount, net, pid, ipc,
# uts; outer writes its uid/gid maps) -> init (pid 1: builds the new root, pivots) ->
# worker (drops to nobody when root, nested user+mount namespace, rlimits, runs the code).
# Without: outer (supervisor) -> worker. The supervisor (init or outer) reports how the
# worker ended on the status pipe, which the worker closes before running candidate code.
_HARNESS = r"""
import marshal, os, sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, AT_FDCWD, AT_RECURSIVE = 1, 2, -100, 0x8000
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, MNT_DETACH, NOBODY = 1, 38, 2, 65534
ATOMS = (int, float, complex, str, bytes, bool, type(None))
CONTAINERS = (tuple, list, set, frozenset)


def send(fd, nonce, *words):
  data = " ".join((nonce,) + words).encode("utf-8", "backslashreplace") + b"\n"
  while data:
    data = data[os.write(fd, data):]


def fail_setup(job, error):
  # Before any candidate code runs: this process is trusted.
  send(job["status_fd"], job["nonce"], "setup_error", repr(f"{type(error).__name__}: {error}"))
  os._exit(70)


class Libc:
  def __init__(self):
    import ctypes
    self.ctypes, self.lib = ctypes, ctypes.CDLL(None, use_errno=True)

  def __call__(self, name, *args):
    if getattr(self.lib, name)(*args) != 0:
      err = self.ctypes.get_errno()
      raise OSError(err, f"{name}{args[:2]}: {os.strerror(err)}")


def die_with_parent(libc, parent, signum=9):
  libc("prctl", PR_SET_PDEATHSIG, signum, 0, 0, 0)
  if parent and os.getppid() != parent:
    os._exit(71)


def kill_group_on_sigterm():
  # The outer process's parent-death signal: take the whole process group down with it
  # (in "none" mode the code's own children have no parent-death signal).
  import _signal
  _signal.signal(15, lambda signum, frame: os.killpg(0, 9))


def main():
  job = marshal.loads(sys.stdin.buffer.read())
  null = os.open("/dev/null", os.O_RDWR)
  os.dup2(null, 0)
  os.umask(0o022)
  try:
    libc = Libc()
    die_with_parent(libc, job["parent"], signum=15)
    if not job["isolate"]:
      os.chdir(job["workdir"])
      return supervise(job, libc, null, drop=False)
    namespaced(job, libc, null)
  except Exception as e:
    fail_setup(job, e)


def namespaced(job, libc, null):
  root = os.geteuid() == 0
  ready_r, ready_w = os.pipe()
  go_r, go_w = os.pipe()
  outer = os.getpid()
  pid = os.fork()
  if pid == 0:  # C: unshare, wait for the uid/gid maps, start init (pid 1).
    try:
      die_with_parent(libc, outer)
      libc("unshare", CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
           | CLONE_NEWIPC | CLONE_NEWUTS)
      os.write(ready_w, b"u")
      go = os.read(go_r, 1)
      if go not in (b"d", b"k"):
        os._exit(72)
      init = os.fork()
      if init == 0:
        return init_main(job, libc, null, drop=go == b"d")
      os.close(job["status_fd"]), os.close(job["results_fd"])
      os._exit(wait(init))
    except Exception as e:
      fail_setup(job, e)
  os.close(job["results_fd"])
  kill_group_on_sigterm()
  if os.read(ready_r, 1) == b"u":
    os.write(go_w, b"d" if root and map_root_and_nobody(pid) else map_self(pid))
  os.close(job["status_fd"])
  os._exit(wait(pid))


def map_root_and_nobody(pid):
  # Root maps itself (for the mounts) and nobody (for the code: RLIMIT_NPROC does not
  # apply to uid 0). False where that is refused (e.g. a container mapping one uid).
  try:
    write_file(f"/proc/{pid}/uid_map", f"0 0 1\n{NOBODY} {NOBODY} 1\n")
  except OSError:
    return False
  write_file(f"/proc/{pid}/gid_map", f"0 0 1\n{NOBODY} {NOBODY} 1\n")
  return True


def map_self(pid):
  write_file(f"/proc/{pid}/setgroups", "deny")
  write_file(f"/proc/{pid}/uid_map", f"0 {os.geteuid()} 1\n")
  write_file(f"/proc/{pid}/gid_map", f"0 {os.getegid()} 1\n")
  return b"k"


def write_file(path, text):
  fd = os.open(path, os.O_WRONLY)
  try:
    os.write(fd, text.encode())
  finally:
    os.close(fd)


def wait(pid):
  _, status = os.waitpid(pid, 0)
  return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def init_main(job, libc, null, *, drop):
  try:
    die_with_parent(libc, 0)
    new_root(job, libc)
  except Exception as e:
    fail_setup(job, e)
  supervise(job, libc, null, drop=drop)


def new_root(job, libc):
  # /tmp (covered by a tmpfs in this private mount namespace) becomes the new root; the
  # allowed paths are bound into it from fds opened before it is covered.
  libc("mount", None, b"/", None, MS_REC | MS_PRIVATE, None)
  fds = [(path, is_dir, os.open(path, os.O_PATH)) for path, is_dir in job["binds"]]
  new = "/tmp"
  libc("mount", b"tmpfs", new.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=1m,mode=755")
  for path, target in job["links"]:
    os.symlink(target, new + path)
  for path, is_dir, fd in fds:
    dest = new + path
    if is_dir:
      os.makedirs(dest, exist_ok=True)
    else:
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      os.close(os.open(dest, os.O_CREAT | os.O_WRONLY, 0o644))
    libc("mount", f"/proc/self/fd/{fd}".encode(), dest.encode(), None, MS_BIND | MS_REC, None)
    os.close(fd)
  os.makedirs(new + "/tmp")
  attr = (libc.ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
  libc("syscall", 442, AT_FDCWD, new.encode(), AT_RECURSIVE, attr, 32)  # mount_setattr
  options = f"size={job['tmp_mb']}m,mode=1777".encode()
  libc("mount", b"tmpfs", (new + "/tmp").encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
  os.chdir(new)
  libc("syscall", job["pivot_root"], b".", b".")
  libc("umount2", b".", MNT_DETACH)
  os.chdir("/tmp")
  libc("sethostname", b"sandbox", 7)


def supervise(job, libc, null, *, drop):
  # Runs the code in a child and reports how it ended; never runs candidate code.
  pid = os.fork()
  if pid == 0:
    worker(job, libc, null, drop=drop)
  os.close(job["results_fd"])
  if not job["isolate"]:
    kill_group_on_sigterm()
  _, status = os.waitpid(pid, 0)
  if os.WIFSIGNALED(status):
    send(job["status_fd"], job["nonce"], "signal", str(os.WTERMSIG(status)))
  else:
    send(job["status_fd"], job["nonce"], "exit", str(os.WEXITSTATUS(status)))
  os._exit(0)


def worker(job, libc, null, *, drop):
  import resource
  try:
    die_with_parent(libc, 0)
    os.close(job["status_fd"])
    if job["isolate"]:
      if drop:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
      libc("unshare", CLONE_NEWUSER | CLONE_NEWNS)  # Locks the mounts.
      libc("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for name, value in job["rlimits"]:
      soft_hard = (value, value + 1) if name == "RLIMIT_CPU" else (value, value)
      resource.setrlimit(getattr(resource, name), soft_hard)
    os.dup2(null, 1)
    os.dup2(null, 2)
  except BaseException as e:
    send(job["results_fd"], job["nonce"], "setup_error", repr(f"{type(e).__name__}: {e}"))
    os._exit(70)
  run_tests(job)


def literal_kind(value, limit):
  # "ok" when value is built from exact built-in literal types only (so repr is theirs).
  stack, seen, typ = [value], 0, type
  while stack:
    item = stack.pop()
    seen += 1
    if seen > limit:
      return "oversized"
    t = typ(item)
    if t in ATOMS:
      continue
    if t in CONTAINERS:
      stack.extend(item)
    elif t is dict:
      stack.extend(item.keys())
      stack.extend(item.values())
    else:
      return "nonliteral"
  return "ok"


def run_tests(job):
  # Everything this needs is bound now: the code may patch builtins, os or this module.
  out, nonce, limit = job["results_fd"], job["nonce"], job["max_result_chars"]
  rep, typ, length, write, exit_ = repr, type, len, os.write, os._exit
  base, memory_error, exec_, eval_, compile_ = BaseException, MemoryError, exec, eval, compile
  kind_of = literal_kind

  def emit(*words):
    data = " ".join((nonce,) + words).encode("utf-8", "backslashreplace") + b"\n"
    while data:
      data = data[write(out, data):]

  def describe(error):
    try:
      text = f"{typ(error).__name__}: {error}"
      return rep(text[:300] if typ(text) is str else "?")
    except base:
      return "'?'"

  calls = [compile_(call, f"<test {i}>", "eval") for i, call in enumerate(job["calls"])]
  namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
  emit("ready")
  try:
    for name in ("prelude", "code", "setup"):
      exec_(compile_(job[name], f"<{name}>", "exec"), namespace)
  except memory_error:
    emit("code:memory")
    calls = []
  except base as e:
    emit("code:raised", describe(e))
    calls = []
  for i, call in enumerate(calls):
    try:
      value = eval_(call, namespace)
    except memory_error:
      emit(f"{i}:memory")
      continue
    except base as e:
      emit(f"{i}:raised", describe(e))
      continue
    try:
      kind = kind_of(value, limit)
      text = rep(value) if kind == "ok" else ""
    except memory_error:
      kind, text = "memory", ""
    except base:  # ValueError: the repr of an int past the digit limit.
      kind, text = "oversized", ""
    if length(text) > limit:
      kind, text = "oversized", ""
    emit(f"{i}:{kind}", text)
  emit("end")
  exit_(0)


main()
"""


# ---------------------------------------------------------------------------------------
# The parent: isolation probe, one run, the verdict.


def _python() -> str:
  if not sys.executable:
    raise RuntimeError("sandbox: sys.executable is empty; cannot start a Python child.")
  return os.path.realpath(sys.executable)


@functools.cache
def _layout() -> tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, str], ...]]:
  """(binds (path, is_dir), symlinks (path, target)) of the sandbox's new root."""
  dirs = [p for p in _SYSTEM_DIRS if os.path.lexists(p)]
  links = tuple((p, os.readlink(p)) for p in dirs if os.path.islink(p))
  real = [p for p in dirs if not os.path.islink(p)]
  for prefix in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(_python())):
    path = os.path.realpath(prefix)
    if not any(path == d or path.startswith(d + "/") for d in real):
      real.append(path)
  binds = [(p, True) for p in dict.fromkeys(real)]
  binds += [(p, False) for p in _SYSTEM_FILES if os.path.exists(p)]
  return tuple(binds), links


def _namespace_problem() -> str:
  """Why namespaces cannot work here without trying ("" when they might)."""
  if sys.platform != "linux":
    return f"namespaces need Linux, this is {sys.platform}"
  if platform.machine() not in _PIVOT_ROOT:
    return f"unknown pivot_root syscall number for machine {platform.machine()!r}"
  return ""


@functools.cache
def namespaces_unavailable() -> str:
  """Why namespace isolation does not work in this process ("" when it does). Probes once
  (one sandboxed run of a one-line function) and caches the answer."""
  problem = _namespace_problem()
  if problem:
    return problem
  result = _run(
    "def f():\n  return 1\n",
    [Test(call="f()", expected=1)],
    prelude="",
    setup="",
    limits=Limits(timeout_s=30.0),
    isolate=True,
  )
  return "" if result.verdict == "pass" else f"the probe run gave {result.verdict}: {result.detail}"


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
  if message not in _WARNED:
    _WARNED.add(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    logging.warning(message)


def resolve_isolation(isolation: str) -> str:
  """The mode a run gets: "namespaces", "none", or "" when namespaces were required but
  are unavailable. Warns (once per process) when code will run without isolation."""
  if isolation not in ISOLATIONS:
    raise ValueError(f"Unknown sandbox isolation {isolation!r}; valid: {ISOLATIONS}.")
  if isolation == "none":
    _warn_once(
      "sandbox: isolation='none': untrusted code runs with the trainer's network and "
      "filesystem access (rlimits, an empty environment and a timeout only)."
    )
    return "none"
  reason = namespaces_unavailable()
  if not reason:
    return "namespaces"
  if isolation == "namespaces":
    return ""
  _warn_once(
    f"sandbox: namespace isolation is unavailable ({reason}); untrusted code runs WITHOUT "
    "network or filesystem isolation (rlimits, an empty environment and a timeout only). "
    "Enable unprivileged user namespaces (e.g. sysctl kernel.unprivileged_userns_clone=1 "
    "or kernel.apparmor_restrict_unprivileged_userns=0) or pass isolation='namespaces' "
    "to refuse to run."
  )
  return "none"


def run(
  code: str,
  tests: Sequence[Test],
  *,
  prelude: str = "",
  setup: str = "",
  limits: Limits | None = None,
  isolation: str = "auto",
) -> Result:
  """Runs ``prelude``, ``code``, ``setup`` (one namespace, in that order) and then each
  test's call in a sandboxed child, and judges the values here (see the module docstring).
  ``limits`` defaults to ``Limits()``. A refused run has ``isolation=""``."""
  limits = limits or Limits()
  mode = resolve_isolation(isolation)
  if not mode:
    reason = namespaces_unavailable()
    return Result("could_not_run", f"sandbox refused: {reason}", 0, len(tests), "", 0.0)
  return _run(code, tests, prelude=prelude, setup=setup, limits=limits, isolate=mode != "none")


def _job(code, tests, *, prelude, setup, limits, isolate, nonce, fds, workdir) -> dict:
  binds, links = _layout()
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
    "pivot_root": _PIVOT_ROOT.get(platform.machine(), -1),
    "tmp_mb": limits.tmp_mb,
    "rlimits": limits.rlimits(),
    "max_result_chars": limits.max_result_chars,
  }


def _run(code, tests, *, prelude, setup, limits, isolate) -> Result:
  start = time.monotonic()
  nonce = secrets.token_hex(16)
  mode = "namespaces" if isolate else "none"
  # Without namespaces the code works in a fresh temporary directory (removed afterwards);
  # with them, in the sandbox's private /tmp.
  tempdir = (
    contextlib.nullcontext() if isolate else tempfile.TemporaryDirectory(prefix="grpo_jax_sandbox_")
  )
  with tempdir as workdir:
    job = functools.partial(
      _job, code, tests, prelude=prelude, setup=setup, limits=limits, isolate=isolate
    )
    try:
      data, overflow, timed_out = _execute(job, nonce=nonce, workdir=workdir, limits=limits)
    except OSError as e:  # Fork or pipe failed: no process or file descriptor left.
      detail = f"could not start the sandbox: {e}"
      return Result("could_not_run", detail, 0, len(tests), mode, time.monotonic() - start)
  channel = _Channel(
    nonce, data, overflow=overflow, timed_out=timed_out, timeout_s=limits.timeout_s
  )
  verdict, detail, passed = channel.judge(tests)
  return Result(verdict, detail, passed, len(tests), mode, time.monotonic() - start)


def _execute(job, *, nonce: str, workdir: str | None, limits: Limits):
  """Starts the harness with the job, collects its pipes, kills what is left."""
  deadline = time.monotonic() + limits.timeout_s
  results_r, results_w = os.pipe()
  status_r, status_w = os.pipe()
  try:
    proc = subprocess.Popen(
      [_python(), "-I", "-S", "-c", _HARNESS],
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
    with contextlib.suppress(BrokenPipeError):  # The harness died: judged from its pipes.
      proc.stdin.write(marshal.dumps(job(nonce=nonce, fds=(results_w, status_w), workdir=workdir)))
      proc.stdin.close()
    fds = {"results": results_r, "status": status_r, "stderr": proc.stderr.fileno()}
    return _collect(fds, deadline=deadline)
  finally:
    _kill(proc)
    os.close(results_r)
    os.close(status_r)


def _collect(fds: dict[str, int], *, deadline: float) -> tuple[dict[str, bytes], bool, bool]:
  """Reads the pipes until the status pipe closes (the supervisor exited) or the deadline,
  then what the others already hold. Returns ({name: bytes}, results overflowed, timed out).
  """
  caps = {"results": _MAX_CHANNEL_BYTES, "status": 1 << 16, "stderr": _MAX_STDERR_BYTES}
  data = {name: bytearray() for name in fds}
  overflow = False
  sel = selectors.DefaultSelector()
  for name, fd in fds.items():
    os.set_blocking(fd, False)
    sel.register(fd, selectors.EVENT_READ, name)

  def read(fd: int, name: str) -> bool:
    """Reads one chunk; False when the pipe is empty or closed."""
    nonlocal overflow
    try:
      chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
      return False
    if not chunk:
      sel.unregister(fd)
      return False
    room = max(caps[name] - len(data[name]), 0)
    data[name] += chunk[:room]
    overflow = overflow or (name == "results" and len(chunk) > room)
    return True

  timed_out = False
  while fds["status"] in sel.get_map():
    left = deadline - time.monotonic()
    if left <= 0:
      timed_out = True
      break
    for key, _ in sel.select(left):
      read(key.fd, key.data)
  for key in list(sel.get_map().values()):
    for _ in range(2 * _MAX_CHANNEL_BYTES >> 16):  # Bounded: a writer may still be running.
      if not read(key.fd, key.data):
        break
  sel.close()
  return {name: bytes(buf) for name, buf in data.items()}, overflow, timed_out


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
  proc.stderr.close()


@dataclasses.dataclass
class _Channel:
  """The bytes that came back from one run, and their reading."""

  nonce: str
  data: dict[str, bytes]
  overflow: bool
  timed_out: bool
  timeout_s: float

  def _records(self, name: str) -> tuple[list[tuple[str, str]], bool]:
    """(tag, payload) per complete line, and whether every line had this run's nonce."""
    text = self.data[name].decode("utf-8", "replace")
    lines = text.split("\n")[:-1]  # A last line without "\n" was cut off by a kill.
    records, clean = [], True
    for line in lines:
      nonce, _, rest = line.partition(" ")
      if nonce != self.nonce:
        clean = False
        continue
      tag, _, payload = rest.partition(" ")
      records.append((tag, payload))
    return records, clean

  def _stderr(self) -> str:
    text = self.data["stderr"].decode("utf-8", "replace").strip()
    return f"; stderr: {text[-500:]}" if text else ""

  def judge(self, tests: Sequence[Test]) -> tuple[str, str, int]:
    """(verdict, detail, tests passed). See the module docstring."""
    status, _ = self._records("status")
    results, clean = self._records("results")
    for tag, payload in status + results[:1]:
      if tag == "setup_error":
        return "could_not_run", f"the sandbox failed to start: {payload}", 0
    if not results or results[0][0] != "ready":
      ended = " ".join(" ".join(r) for r in status) or "no status"
      return "could_not_run", f"the sandbox did not start ({ended}){self._stderr()}", 0
    reading = _Reading(tests)
    for tag, payload in results[1:]:
      reading.add(tag, payload)
    if not clean or self.overflow:
      reading.tampered = reading.tampered or "lines without this run's nonce, or too much data"
    return reading.verdict(status, timed_out=self.timed_out, timeout_s=self.timeout_s)


@dataclasses.dataclass
class _Reading:
  """The result records after "ready", read in order."""

  tests: Sequence[Test]
  next_index: int = 0
  passed: int = 0
  wrong: str = ""  # The first definite wrong answer.
  memory: str = ""
  tampered: str = ""
  ended: bool = False

  def add(self, tag: str, payload: str) -> None:
    if self.ended or self.tampered:
      self.tampered = self.tampered or f"a record after the end: {tag!r}"
      return
    if tag == "end":
      if self.next_index != len(self.tests):
        self.tampered = f"the end came after {self.next_index} of {len(self.tests)} results"
      self.ended = True
    elif tag == "code:raised":
      self.wrong = self.wrong or f"the code raised {payload}"
      self.next_index = len(self.tests)
    elif tag == "code:memory":
      self.memory = self.memory or "the code ran out of memory (MemoryError)"
      self.next_index = len(self.tests)
    else:
      self._add_test(tag, payload)

  def _add_test(self, tag: str, payload: str) -> None:
    index, _, kind = tag.partition(":")
    if index != str(self.next_index) or self.next_index >= len(self.tests):
      self.tampered = f"an unexpected record {tag!r} (expected test {self.next_index})"
      return
    test = self.tests[self.next_index]
    self.next_index += 1
    where = test.source or f"{test.call} == {test.expected!r}"
    if kind == "ok":
      try:
        value = parse_value(payload)
      except ValueError:
        value = _Unparsable()
      if _equal(value, test.expected):
        self.passed += 1
      else:
        self.wrong = self.wrong or f"{where}: got {payload[:200]}"
    elif kind == "memory":
      self.memory = self.memory or f"{where}: MemoryError"
    elif kind in ("raised", "nonliteral", "oversized"):
      self.wrong = self.wrong or f"{where}: {kind} {payload[:200]}".rstrip()
    else:
      self.tampered = f"an unknown record kind {tag!r}"

  def verdict(self, status, *, timed_out: bool, timeout_s: float) -> tuple[str, str, int]:
    done = f"{self.next_index} of {len(self.tests)} tests done"
    if self.tampered:
      return "fail", f"the result channel was tampered with: {self.tampered}", self.passed
    if self.wrong:
      return "fail", self.wrong, self.passed
    if timed_out:
      return "could_not_run", f"timed out after {timeout_s:g}s ({done})", self.passed
    if self.memory:
      return "could_not_run", self.memory, self.passed
    if self.ended:
      return "pass", f"{self.passed} of {len(self.tests)} tests passed", self.passed
    ended = dict(status)
    if "signal" in ended:
      name = _signal_name(ended["signal"])
      return "could_not_run", f"the code's process was killed by {name} ({done})", self.passed
    if "exit" in ended:
      detail = f"the program exited (status {ended['exit']}) before the tests finished ({done})"
      return "fail", detail, self.passed
    return "could_not_run", f"the sandbox died before the tests finished ({done})", self.passed


class _Unparsable:
  """A reported value that does not parse (e.g. nan, inf): equal to nothing."""

  def __eq__(self, other):
    return False

  __hash__ = None


def _equal(value: Any, expected: Any) -> bool:
  try:
    return bool(value == expected)
  except Exception:  # noqa: BLE001 -- e.g. comparing huge nested values.
    return False


def _signal_name(number: str) -> str:
  try:
    return signal.Signals(int(number)).name
  except ValueError:
    return f"signal {number}"
