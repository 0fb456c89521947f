"""The code sandbox: verdicts, the result channel, and containment of escape attempts.

Every run is bounded by its wall-clock timeout (a few seconds at most), so a test that
fails to contain something fails instead of hanging.
"""

import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from grpo_jax import sandbox

ROOT = pathlib.Path(__file__).resolve().parent.parent
FAST = sandbox.Limits(timeout_s=2.0)
ADD_TESTS = [sandbox.parse_test(t) for t in ("assert add(2, 3) == 5", "assert add(-1, 1) == 0")]
ADD = "def add(a, b):\n  return a + b\n"
NAMESPACES = not sandbox.namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(
  not NAMESPACES, reason=f"namespaces unavailable: {sandbox.namespaces_unavailable()}"
)


def run(code, tests=ADD_TESTS, *, isolation="namespaces" if NAMESPACES else "none", **limits):
  limits = sandbox.Limits(**{"timeout_s": 2.0, **limits})
  return sandbox.run(textwrap.dedent(code), tests, limits=limits, isolation=isolation)


def one(call, expected):
  return [sandbox.Test(call=call, expected=expected)]


def processes_with(marker: str) -> list[int]:
  """Host pids whose command line holds `marker` (zombies have none)."""
  pids = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/cmdline", "rb") as f:
          if marker.encode() in f.read():
            pids.append(int(entry))
      except OSError:
        continue
  return pids


def assert_no_process_with(marker: str) -> None:
  deadline = time.monotonic() + 2.0
  while processes_with(marker) and time.monotonic() < deadline:
    time.sleep(0.05)
  left = processes_with(marker)
  for pid in left:  # Do not leak them into other tests, then fail.
    os.kill(pid, signal.SIGKILL)
  assert not left, f"sandbox processes outlived the run: {left}"


def sleep_marker() -> str:
  """A unique `sleep` argument, so the test can find the candidate's processes."""
  return f"1000.{secrets.randbelow(10**9):09d}"


# ---------------------------------------------------------------------------------------
# Tests as data.


def test_parse_test_splits_the_call_from_the_literal():
  assert sandbox.parse_test("assert add(2, 3) == 5") == sandbox.Test(
    "add(2, 3)", 5, "assert add(2, 3) == 5"
  )
  assert sandbox.parse_test("assert 5 == add(2,3)").call == "add(2, 3)"
  assert sandbox.parse_test("assert f(x)==(1, -2.5, 'a'), 'msg'").expected == (1, -2.5, "a")
  assert sandbox.parse_test("assert set(f()) == set([1, 2])").expected == {1, 2}
  assert sandbox.parse_test("assert f() == frozenset({1})").expected == frozenset({1})
  assert sandbox.parse_test("assert f() == set()").expected == set()
  assert sandbox.parse_test("assert f() == [frozenset({1}), set()]").expected == [{1}, set()]
  with pytest.raises(ValueError, match="unhashable"):
    sandbox.parse_value("set([[1]])")


@pytest.mark.parametrize(
  "source, message",
  [
    ("assert f(1) == g(2)", "neither side of == is a literal"),
    ("assert f(1) == [x for x in range(3)]", "neither side"),
    ("assert math.isclose(f(1), 2.0)", "does not compare with a single =="),
    ("assert abs(f(1) - 2) < 1e-6", "does not compare with a single =="),
    ("assert 1 == f(1) == 1", "does not compare with a single =="),
    ("f(1) == 2", "is not one statement"),
    ("assert f(1) == 2\nassert f(2) == 3", "is not one statement"),
    ("assert f(1 == ", "not valid Python"),
  ],
)
def test_parse_test_rejects_what_it_cannot_check_outside_the_sandbox(source, message):
  with pytest.raises(ValueError, match=message):
    sandbox.parse_test(source)


def test_limits_are_validated():
  with pytest.raises(ValueError, match="timeout_s must be a positive number"):
    sandbox.Limits(timeout_s=0)
  with pytest.raises(ValueError, match="memory_mb must be >= 1"):
    sandbox.Limits(memory_mb=0)
  with pytest.raises(ValueError, match="Unknown sandbox isolation 'docker'"):
    sandbox.run(ADD, ADD_TESTS, isolation="docker")


# ---------------------------------------------------------------------------------------
# Verdicts.


def test_correct_code_passes_and_reports_its_isolation():
  result = run(ADD)
  assert (result.verdict, result.passed, result.total) == ("pass", 2, 2)
  assert result.isolation == ("namespaces" if NAMESPACES else "none")


@pytest.mark.parametrize(
  "code, detail",
  [
    ("def add(a, b):\n  return a - b\n", "assert add(2, 3) == 5: got -1"),
    ("def add(a, b):\n  return a +\n", "the code raised 'SyntaxError"),
    ("raise RuntimeError('at import')\n", "the code raised 'RuntimeError: at import'"),
    ("def add(a, b):\n  return a / 0\n", "raised 'ZeroDivisionError"),
    ("def plus(a, b):\n  return a + b\n", 'raised "NameError'),
    ("def add(a, b):\n  return str(a + b)\n", "got '5'"),
    ("def add(a, b):\n  return add(a, b)\n", "RecursionError"),
    ("def add(a, b):\n  return float('nan')\n", "got nan"),
  ],
)
def test_wrong_code_fails_with_the_reason(code, detail):
  result = run(code)
  assert result.verdict == "fail", result
  assert detail in result.detail


def test_one_wrong_test_fails_the_run_and_counts_the_passes():
  result = run("def add(a, b):\n  return 5\n")
  assert (result.verdict, result.passed) == ("fail", 1)
  assert "assert add(-1, 1) == 0: got 5" in result.detail


def test_values_compare_as_python_equality_of_literals():
  code = "def f():\n  return {'a': (1, 2.0), 'b': {3}, 'c': [None, True, b'x', 1j]}\n"
  expected = {"a": (1, 2), "b": {3}, "c": [None, 1, b"x", 1j]}
  assert run(code, one("f()", expected)).verdict == "pass"
  assert run("def f():\n  return frozenset({1})\n", one("f()", {1})).verdict == "pass"
  nested = {frozenset({1}), (frozenset(), -0.5, "x\n")}
  assert run(f"def f():\n  return {nested!r}\n", one("f()", nested)).verdict == "pass"


def test_prelude_and_setup_run_around_the_code():
  tests = one("f(data)", 6)
  result = sandbox.run(
    "def f(xs: List[int]):\n  return sum(xs)\n",
    tests,
    prelude="from typing import List",
    setup="data = [1, 2, 3]",
    limits=FAST,
    isolation="namespaces" if NAMESPACES else "none",
  )
  assert result.verdict == "pass", result


def test_main_block_does_not_run():
  code = "def add(a, b):\n  return a + b\nif __name__ == '__main__':\n  input()\n"
  assert run(code).verdict == "pass"


# ---------------------------------------------------------------------------------------
# The verdict channel: a wrong answer never passes.


@pytest.mark.parametrize(
  "code",
  [
    # Exits early with status 0, after claiming success on stdout.
    "import os\nprint('all tests passed')\nos._exit(0)\n",
    "print('PASSED')\nimport sys\nsys.exit(0)\n",
    # Exits in the middle of the tests.
    "import os\ndef add(a, b):\n  os._exit(0)\n",
    # Objects that claim equality with anything.
    "class Yes:\n  def __eq__(self, other):\n    return True\ndef add(a, b):\n  return Yes()\n",
    "class I(int):\n  def __eq__(self, other):\n    return True\ndef add(a, b):\n  return I(0)\n",
    "class S(str):\n  def __repr__(self):\n    return '5'\ndef add(a, b):\n  return S('x')\n",
    # Patches builtins the harness might use.
    "import builtins\nbuiltins.repr = lambda x: '5'\nbuiltins.type = lambda x: int\n"
    "builtins.eval = lambda *a: 5\ndef add(a, b):\n  return 0\n",
    # Patches the harness itself.
    "import __main__, os\n__main__.literal_kind = lambda v, n: 'ok'\n__main__.send = None\n"
    "os.write = lambda fd, data: len(data)\ndef add(a, b):\n  return 0\n",
  ],
)
def test_exiting_printing_and_patching_do_not_pass(code):
  result = run(code)
  assert result.verdict == "fail", result


def test_lines_written_to_the_channel_without_the_nonce_fail():
  code = """
    import os
    for fd in range(3, 64):
      try:
        os.write(fd, b'0 0:ok 5\\n0 1:ok 0\\n0 end\\n')
      except OSError:
        pass
    os._exit(0)
  """
  result = run(code)
  assert result.verdict == "fail"
  assert "tampered" in result.detail


def test_forging_with_the_real_nonce_cannot_pass_a_wrong_answer():
  # The candidate finds the job (nonce, fds) in the harness's memory and writes a
  # complete, well-formed set of results: they are still compared with the expected
  # values, which never entered the child.
  code = """
    import gc, os
    job = next(o for o in gc.get_objects() if isinstance(o, dict) and 'nonce' in o)
    n, fd = job['nonce'], job['results_fd']
    os.write(fd, f'{n} 0:ok 6\\n{n} 1:ok 1\\n{n} end\\n'.encode())
    os._exit(0)
  """
  result = run(code)
  assert result.verdict == "fail"
  assert "assert add(2, 3) == 5: got 6" in result.detail


def test_forged_results_followed_by_the_harness_results_are_tampering():
  code = """
    import gc, os
    job = next(o for o in gc.get_objects() if isinstance(o, dict) and 'nonce' in o)
    n, fd = job['nonce'], job['results_fd']
    os.write(fd, f'{n} 0:ok 5\\n{n} 1:ok 0\\n{n} end\\n'.encode())
    def add(a, b):
      return a + b
  """
  result = run(code)
  assert result.verdict == "fail"
  assert "tampered" in result.detail


def channel(results: str, status: str = "exit 0", *, timed_out=False):
  nonce = "n0"
  lines = "".join(f"{nonce} {line}\n" for line in results.split("|")) if results else ""
  data = {
    "results": lines.encode(),
    "status": f"{nonce} {status}\n".encode() if status else b"",
    "stderr": b"",
  }
  reading = sandbox._Channel(nonce, data, overflow=False, timed_out=timed_out, timeout_s=1.0)
  return reading.judge(ADD_TESTS)[:2]


@pytest.mark.parametrize(
  "results, status, timed_out, verdict, detail",
  [
    ("ready|0:ok 5|1:ok 0|end", "exit 0", False, "pass", "2 of 2"),
    ("ready|0:ok 5|1:ok 0|end|0:ok 5", "exit 0", False, "fail", "a record after the end"),
    ("ready|1:ok 0|0:ok 5|end", "exit 0", False, "fail", "expected test 0"),
    ("ready|0:ok 5|end", "exit 0", False, "fail", "the end came after 1 of 2"),
    ("ready|ready|0:ok 5|1:ok 0|end", "exit 0", False, "fail", "unexpected record 'ready'"),
    ("ready|0:ok 5|1:bogus 0|end", "exit 0", False, "fail", "unknown record kind"),
    ("ready|0:ok 5", "exit 0", False, "fail", "exited (status 0) before the tests finished"),
    ("ready|0:ok 5", "signal 24", False, "could_not_run", "killed by SIGXCPU"),
    ("ready|0:ok 5", "", True, "could_not_run", "timed out after 1s (1 of 2 tests done)"),
    ("ready|0:ok 4", "", True, "fail", "got 4"),  # A wrong answer wins over a timeout.
    ("ready|0:memory|1:ok 0|end", "exit 0", False, "could_not_run", "MemoryError"),
    ("ready|0:ok 5|1:ok __import__('os')", "exit 0", False, "fail", "got __import__"),
    ("", "setup_error 'OSError: no userns'", False, "could_not_run", "failed to start"),
    ("", "exit 1", False, "could_not_run", "did not start"),
  ],
)
def test_channel_reading(results, status, timed_out, verdict, detail):
  got = channel(results, status, timed_out=timed_out)
  assert got[0] == verdict and detail in got[1], got


def test_a_line_cut_off_by_the_kill_is_ignored():
  data = {"results": b"n0 ready\nn0 0:ok 5\nn0 1:ok", "status": b"", "stderr": b""}
  reading = sandbox._Channel("n0", data, overflow=False, timed_out=True, timeout_s=1.0)
  assert reading.judge(ADD_TESTS)[:2] == ("could_not_run", "timed out after 1s (1 of 2 tests done)")


# ---------------------------------------------------------------------------------------
# Could not run: timeouts, resource limits, a broken or refused sandbox.


@pytest.mark.parametrize(
  "code",
  [
    "while True:\n  pass\n",
    "import time\ntime.sleep(60)\n",
    "def add(a, b):\n  while True: pass\n",
  ],
)
def test_hangs_are_killed_at_the_wall_timeout(code):
  start = time.monotonic()
  result = run(code, timeout_s=1.0)
  assert result.verdict == "could_not_run"
  assert "timed out after 1s" in result.detail
  assert time.monotonic() - start < 10.0  # Bounded: the trainer never hangs.


def test_cpu_limit_kills_a_busy_loop():
  result = run("while True:\n  pass\n", timeout_s=5.0, cpu_s=1)
  assert result.verdict == "could_not_run"
  assert "SIGXCPU" in result.detail or "SIGKILL" in result.detail


@pytest.mark.parametrize(
  "code",
  ["x = bytearray(2 << 30)\n", "def add(a, b):\n  return len([0] * (1 << 30))\n"],
)
def test_huge_allocation_is_stopped_by_the_memory_limit(code):
  result = run(code, memory_mb=256)
  assert result.verdict == "could_not_run"
  assert "MemoryError" in result.detail


def test_writing_a_huge_file_fails_at_the_file_size_limit():
  code = "def add(a, b):\n  open('big', 'wb').write(b'x' * (4 << 20))\n  return a + b\n"
  result = run(code, file_mb=1)
  assert result.verdict == "fail"
  assert "File too large" in result.detail


def test_a_crashing_harness_could_not_run(monkeypatch):
  monkeypatch.setattr(sandbox, "_HARNESS", "import sys\nsys.exit('harness broke')\n")
  result = run(ADD)
  assert result.verdict == "could_not_run"
  assert "did not start" in result.detail and "harness broke" in result.detail


def test_a_harness_that_runs_out_of_memory_before_the_code_could_not_run():
  result = run(ADD, memory_mb=1)
  assert result.verdict == "could_not_run", result


def test_required_namespaces_that_are_unavailable_refuse_to_run(monkeypatch):
  monkeypatch.setattr(sandbox, "namespaces_unavailable", lambda: "user namespaces are off")
  result = sandbox.run(ADD, ADD_TESTS, isolation="namespaces")
  assert result.verdict == "could_not_run"
  assert result.detail == "sandbox refused: user namespaces are off"


def test_unavailable_namespaces_warn_once_and_fall_back(monkeypatch):
  monkeypatch.setattr(sandbox, "namespaces_unavailable", lambda: "user namespaces are off")
  monkeypatch.setattr(sandbox, "_WARNED", set())
  with pytest.warns(RuntimeWarning, match="namespace isolation is unavailable"):
    result = sandbox.run(ADD, ADD_TESTS, limits=FAST)
  assert (result.verdict, result.isolation) == ("pass", "none")
  with pytest.warns() as record:  # The second run does not warn again.
    sandbox.run(ADD, ADD_TESTS, limits=FAST)
    warnings.warn("sentinel", UserWarning, stacklevel=1)
  assert [str(w.message) for w in record] == ["sentinel"]


# ---------------------------------------------------------------------------------------
# Containment (namespaces).


@needs_namespaces
def test_cannot_write_outside_its_temporary_directory(tmp_path):
  name = f"sandbox_escape_{secrets.token_hex(4)}"
  targets = [ROOT / name, pathlib.Path("/tmp") / name, tmp_path / name, pathlib.Path("/") / name]
  code = f"""
    import os
    def escape():
      wrote = []
      for path in {[str(t) for t in targets]!r} + ['here.txt']:
        try:
          with open(path, 'w') as f:
            f.write('x')
          wrote.append(path)
        except OSError:
          pass
      return wrote
  """
  result = run(code, one("escape()", []))
  # Writing is allowed only in its own /tmp (and its cwd), which vanish with it.
  assert result.verdict == "fail"
  assert f"got ['/tmp/{name}', 'here.txt']" in result.detail
  for target in targets:
    assert not target.exists(), target


@needs_namespaces
def test_cannot_read_the_trainers_files(tmp_path):
  secret = secrets.token_hex(8)
  planted = [ROOT / f".sandbox_secret_{secret}", tmp_path / "secret.txt"]
  try:
    for path in planted:
      path.write_text(secret)
    paths = [str(p) for p in planted] + [str(ROOT / "pyproject.toml"), "/etc/passwd"]
    code = f"""
      def read():
        found = []
        for path in {paths!r}:
          try:
            found.append(open(path).read())
          except OSError as e:
            found.append(type(e).__name__)
        return found
    """
    result = run(code, one("read()", [secret, secret, "x", "x"]))
  finally:
    for path in planted:
      path.unlink()
  assert result.verdict == "fail"
  assert result.detail.endswith(f"got {['FileNotFoundError'] * 4}")


@needs_namespaces
def test_sees_only_system_directories_and_cannot_remount_them():
  code = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    def look():
      umount = libc.umount2(b'/usr', 2)
      remount = libc.mount(None, b'/usr', None, 32 | 4096, None)  # MS_REMOUNT | MS_BIND
      try:
        open('/usr/sandbox_test', 'w')
        wrote = True
      except OSError:
        wrote = False
      return (sorted(os.listdir('/')), sorted(os.listdir('/etc')), sorted(os.listdir('/dev')),
              os.path.exists('/proc/self'), umount, remount, wrote)
  """
  result = run(code, one("look()", None))
  assert result.verdict == "fail"
  root, etc, dev, has_proc, umount, remount, wrote = sandbox.parse_value(
    result.detail.split("got ", 1)[1]
  )
  python_top = pathlib.Path(os.path.realpath(sys.base_prefix)).parts[1]  # e.g. "usr", "root"
  system = {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "tmp"}
  assert set(root) <= system | {python_top}
  assert {"bin", "lib", "usr", "tmp", "dev"} <= set(root)
  assert etc == ["ld.so.cache"] and dev == ["null", "random", "urandom", "zero"]
  assert not has_proc
  assert (umount, remount, wrote) == (-1, -1, False)


@needs_namespaces
def test_does_not_see_the_trainers_environment(monkeypatch):
  monkeypatch.setenv("GRPO_JAX_TEST_SECRET", "hunter2")
  code = """
    import os
    def env():
      return [k for k, v in os.environ.items() if 'GRPO' in k or v == 'hunter2']
  """
  assert run(code, one("env()", [])).verdict == "pass"
  # Not through /proc either: there is none.
  code = "def env():\n  return open(f'/proc/{os.getppid()}/environ').read()\nimport os\n"
  result = run(code, one("env()", ""))
  assert result.verdict == "fail" and "hunter2" not in result.detail


def test_fallback_does_not_pass_the_environment_either(monkeypatch):
  monkeypatch.setenv("GRPO_JAX_TEST_SECRET", "hunter2")
  code = "import os\ndef env():\n  return os.environ.get('GRPO_JAX_TEST_SECRET')\n"
  with pytest.warns(RuntimeWarning):
    monkeypatch.setattr(sandbox, "_WARNED", set())
    assert run(code, one("env()", None), isolation="none").verdict == "pass"


@needs_namespaces
def test_has_no_network():
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen()
  server.setblocking(False)
  unix = socket.socket(socket.AF_UNIX)
  abstract = f"\0grpo_jax_sandbox_{secrets.token_hex(4)}"
  unix.bind(abstract)
  unix.listen()
  unix.setblocking(False)
  port = server.getsockname()[1]
  code = """
    import socket
    def connect(family, address):
      s = socket.socket(family)
      s.settimeout(1.0)
      try:
        s.connect(address)
        s.sendall(b'leak')
        return 'connected'
      except OSError as e:
        return type(e).__name__
  """
  tests = [
    sandbox.Test(f"connect(socket.AF_INET, ('127.0.0.1', {port}))", "connected"),
    sandbox.Test(f"connect(socket.AF_UNIX, {abstract!r})", "connected"),
    sandbox.Test("connect(socket.AF_INET, ('8.8.8.8', 53))", "connected"),
  ]
  try:
    result = run(code, tests, timeout_s=4.0)
    assert result.verdict == "fail" and result.passed == 0, result
    assert "got 'connected'" not in result.detail
    for listener in (server, unix):
      with pytest.raises(BlockingIOError):
        listener.accept()
  finally:
    server.close()
    unix.close()


@needs_namespaces
def test_fork_bomb_is_limited_and_leaves_no_process_behind():
  marker = sleep_marker()
  code = f"""
    import os
    def bomb():
      while True:
        try:
          pid = os.fork()
        except OSError:
          continue
        if pid == 0 and os.getpid() % 2:
          os.execv('/usr/bin/sleep', ['sleep', {marker!r}])
    bomb()
  """
  start = time.monotonic()
  result = run(code, timeout_s=1.5)
  assert result.verdict == "could_not_run"
  assert time.monotonic() - start < 10.0
  assert_no_process_with(marker)


@needs_namespaces
def test_process_limit_stops_forks():
  code = """
    import os, time
    def forks():
      n = 0
      try:
        while n < 100:
          if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
          n += 1
      except OSError:
        pass
      return n
  """
  result = run(code, one("forks()", 100), processes=8)
  assert result.verdict == "fail" and "got 7" in result.detail, result


@needs_namespaces
def test_a_daemonised_child_dies_with_the_sandbox():
  marker = sleep_marker()
  code = f"""
    import os
    if os.fork() == 0:
      os.setsid()
      if os.fork() == 0:
        os.execv('/usr/bin/sleep', ['sleep', {marker!r}])
      os._exit(0)
    def add(a, b):
      return a + b
  """
  assert run(code).verdict == "pass"
  assert_no_process_with(marker)


def test_fallback_kills_the_process_group_at_the_timeout(monkeypatch):
  monkeypatch.setattr(sandbox, "_WARNED", set())
  marker = sleep_marker()
  code = f"""
    import os, time
    if os.fork() == 0:
      os.execv('/usr/bin/sleep', ['sleep', {marker!r}])
    time.sleep(60)
  """
  with pytest.warns(RuntimeWarning, match="isolation='none'"):
    result = run(code, isolation="none", timeout_s=1.0)
  assert result.verdict == "could_not_run" and result.isolation == "none"
  assert_no_process_with(marker)


_CALLER = """
import sys
from grpo_jax import sandbox
marker, isolation = sys.stdin.read().split()
code = (
  "import os, time\\n"
  f"if os.fork() == 0:\\n  os.execv('/usr/bin/sleep', ['sleep', {marker!r}])\\n"
  "time.sleep(60)\\n"
)
print("running", flush=True)
limits = sandbox.Limits(timeout_s=60)
sandbox.run(code, [sandbox.Test("f()", 1)], limits=limits, isolation=isolation)
"""


@pytest.mark.parametrize("isolation", ["namespaces", "none"])
def test_killing_the_caller_kills_the_sandbox(isolation):
  # What happens when the reward pool SIGKILLs a worker that is waiting on a sandbox.
  if isolation == "namespaces" and not NAMESPACES:
    pytest.skip("namespaces unavailable")
  marker = sleep_marker()
  caller = subprocess.Popen(
    [sys.executable, "-c", _CALLER],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
  )
  try:
    caller.stdin.write(f"{marker} {isolation}")
    caller.stdin.close()
    assert caller.stdout.readline() == "running\n"
    deadline = time.monotonic() + 10.0
    while not processes_with(marker) and time.monotonic() < deadline:
      time.sleep(0.05)
    assert processes_with(marker), "the candidate's child never started"
  finally:
    caller.kill()
    caller.wait()
  assert_no_process_with(marker)


def test_root_without_a_nobody_mapping_still_isolates(monkeypatch):
  # Where root may map only itself (e.g. some containers), the code runs as root in the
  # namespaces (without RLIMIT_NPROC) rather than without namespaces.
  if not NAMESPACES:
    pytest.skip("namespaces unavailable")
  refuse = "def map_root_and_nobody(pid):\n"
  assert refuse in sandbox._HARNESS
  monkeypatch.setattr(
    sandbox, "_HARNESS", sandbox._HARNESS.replace(refuse, refuse + "  return False\n")
  )
  result = run("import os\ndef add(a, b):\n  return a + b if not os.path.exists('/work') else 0\n")
  assert (result.verdict, result.isolation) == ("pass", "namespaces"), result


def test_fallback_judges_like_the_sandbox(monkeypatch):
  monkeypatch.setattr(sandbox, "_WARNED", set())
  with pytest.warns(RuntimeWarning):
    assert run(ADD, isolation="none").verdict == "pass"
  assert run("def add(a, b):\n  return 0\n", isolation="none").verdict == "fail"
  assert run("import os\nos._exit(0)\n", isolation="none").verdict == "fail"
