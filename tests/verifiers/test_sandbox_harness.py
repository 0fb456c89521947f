"""`verifiers.sandbox.harness`, the sandbox's child program, in parts: its result encoding
(`run_tests`, `literal_kind`, `send`) in this process with os._exit stubbed, its small
helpers, and one launch of its text without namespaces (`isolate` off, no seccomp: a few
hundredths of a second). tests/verifiers/test_sandbox.py runs it through `runner` with isolation."""

import marshal
import os
import pathlib
import subprocess
import sys

import pytest

from grpo_jax.verifiers.sandbox import harness


class Exited(Exception):
  pass


def _read(fd: int) -> str:
  out = b""
  while chunk := os.read(fd, 65536):
    out += chunk
  os.close(fd)
  return out.decode()


@pytest.fixture
def exits(monkeypatch):
  """os._exit raises Exited(status) instead of ending the test process."""

  def fake_exit(status):
    raise Exited(status)

  monkeypatch.setattr(os, "_exit", fake_exit)


def _run_tests(code, calls, *, prelude="", setup="", limit=20) -> list[str]:
  r, w = os.pipe()
  job = dict(
    results_fd=w, nonce="N", max_result_chars=limit, prelude=prelude, code=code, setup=setup,
    calls=calls,
  )  # fmt: skip
  with pytest.raises(Exited) as e:
    harness.run_tests(job)
  os.close(w)
  assert e.value.args == (0,)
  return _read(r).splitlines()


def test_each_call_is_one_line_of_its_kind_and_repr(exits):
  """prelude, code and setup run in one namespace (P = 10, f(1) = 11); a literal value's
  repr comes back, a non-literal or a long one comes back empty, an exception as its
  type and message. The limit is 20 characters and 20 items."""
  calls = [
    "f(1)", "f('a')", "[1, (2, None)]", "object()", "'x' * 30", "10 ** 5000", "bytearray(2)",
    "[0] * 50", "{'k': {1.5}}", "setup_value",
  ]  # fmt: skip
  lines = _run_tests("def f(x):\n  return x + P", calls, prelude="P = 10", setup="setup_value = -1")
  assert lines == [
    "N ready",
    "N 0:ok 11",
    "N 1:raised 'TypeError: can only concatenate str (not \"int\") to str'",
    "N 2:ok [1, (2, None)]",
    "N 3:nonliteral ",
    "N 4:oversized ",  # repr is 32 characters.
    "N 5:oversized ",  # 5001 digits: past the int repr's digit limit.
    "N 6:nonliteral ",  # bytearray is not an exact literal type.
    "N 7:oversized ",  # 51 items (the list and its 50) > 20.
    "N 8:ok {'k': {1.5}}",
    "N 9:ok -1",
    "N end",
  ]


def test_code_that_raises_runs_no_calls(exits):
  """Code that raises is one 'code:raised' line; a MemoryError in a call is '<i>:memory'."""
  lines = _run_tests("raise ValueError('no')", ["1"])
  assert lines == ["N ready", "N code:raised 'ValueError: no'", "N end"]
  lines = _run_tests("x = 1", ["[0] * (2 ** 62)"])  # Too big to allocate.
  assert lines == ["N ready", "N 0:memory", "N end"]


def test_an_exception_message_is_cut_to_300_characters(exits):
  """The text 'ValueError: ' (12 characters) and 400 a's is cut to 300, then repr'd."""
  lines = _run_tests("def boom():\n  raise ValueError('a' * 400)", ["boom()"])
  assert lines[1] == "N 0:raised " + repr("ValueError: " + "a" * 288)


@pytest.mark.parametrize(
  ("value", "limit", "kind"),
  [
    ([1, 2, 3], 4, "ok"),  # The list and its three items: 4.
    ([1, 2, 3], 3, "oversized"),
    ({"a": (1, frozenset({2}))}, 10, "ok"),
    (True, 1, "ok"),
    (type("Int", (int,), {})(3), 5, "nonliteral"),  # A subclass is not the literal type.
    ([[[]]], 2, "oversized"),
  ],
)
def test_literal_kind(value, limit, kind):
  """Items counted with their containers against the limit; only exact literal types are ok."""
  assert harness.literal_kind(value, limit, harness.ATOMS, harness.CONTAINERS, type) == kind


def test_send_writes_one_line_and_escapes_what_is_not_utf8():
  """The nonce and the words, space-separated, one line; a lone surrogate is backslash-escaped."""
  r, w = os.pipe()
  harness.send(w, "N", "exit", "0")
  harness.send(w, "N", "bad\udcff")
  os.close(w)
  assert _read(r) == "N exit 0\nN bad\\udcff\n"


def test_fail_setup_reports_on_the_status_pipe_and_exits_70(exits):
  """The error's type and message, repr'd, on the status pipe, then exit status 70."""
  r, w = os.pipe()
  with pytest.raises(Exited) as e:
    harness.fail_setup({"status_fd": w, "nonce": "N"}, OSError("no pipe"))
  os.close(w)
  assert e.value.args == (70,) and _read(r) == "N setup_error 'OSError: no pipe'\n"


@pytest.mark.parametrize(
  ("path", "inside"), [("/tmp", True), ("/tmp/a/b", True), ("/tmpx", False), ("/var/tmp", False)]
)
def test_under_tmp(path, inside):
  """/tmp itself and paths below it, not names that merely start with /tmp."""
  assert harness.under_tmp(path) is inside


@pytest.mark.parametrize(("script", "status"), [("exit 3", 3), ("kill -9 $$", 128 + 9)])
def test_wait_is_the_exit_status_or_128_plus_the_signal(script, status):
  """exit 3 gives 3; killed by signal 9 gives 137."""
  pid = os.posix_spawn("/bin/sh", ["sh", "-c", script], {})
  assert harness.wait(pid) == status


def test_write_file_writes_an_existing_file_only(tmp_path):
  """As /proc files are written: from the start, without truncating or creating."""
  path = tmp_path / "f"
  path.write_text("old text")
  harness.write_file(str(path), "new")
  assert path.read_text() == "new text"
  with pytest.raises(FileNotFoundError):
    harness.write_file(str(tmp_path / "missing"), "x")


def _launch(job: dict, cwd) -> tuple[int, str, str]:
  """(harness exit status, results pipe, status pipe) of one run of the harness's text."""
  results_r, results_w = os.pipe()
  status_r, status_w = os.pipe()
  proc = subprocess.Popen(
    [sys.executable, "-I", "-S", "-c", pathlib.Path(harness.__file__).read_text()],
    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={},
    cwd=cwd, pass_fds=(results_w, status_w), start_new_session=True,
  )  # fmt: skip
  os.close(results_w), os.close(status_w)
  job = dict(job, results_fd=results_w, status_fd=status_w, parent=os.getpid())
  proc.stdin.write(marshal.dumps(job))
  proc.stdin.close()
  status = proc.wait(timeout=30)
  return status, _read(results_r), _read(status_r)


JOB = dict(
  nonce="N", prelude="", setup="", isolate=False, join=[], seccomp=b"", max_result_chars=100,
  rlimits=[("RLIMIT_NOFILE", 64)],
)  # fmt: skip


def test_a_launch_without_namespaces_runs_the_code_in_its_workdir(tmp_path):
  """isolate off: the code runs in job["workdir"] under its rlimits, the results pipe
  has each call, the status pipe how the worker ended."""
  code = "import os, resource\ndef f():\n  return os.getcwd()"
  calls = ["f()", "resource.getrlimit(resource.RLIMIT_NOFILE)", "1/0"]
  status, results, ending = _launch(
    dict(JOB, code=code, calls=calls, workdir=str(tmp_path)), cwd="/"
  )
  assert status == 0 and ending == "N exit 0\n"
  assert results.splitlines() == [
    "N ready",
    f"N 0:ok {str(tmp_path)!r}",
    "N 1:ok (64, 64)",
    "N 2:raised 'ZeroDivisionError: division by zero'",
    "N end",
  ]


def test_a_launch_reports_how_the_worker_ended(tmp_path):
  """Code that exits with 5 or kills itself: no 'end' line, the status says which."""
  for code, ending in (
    ("import os\nos._exit(5)", "N exit 5\n"),
    ("import os\nos.kill(os.getpid(), 9)", "N signal 9\n"),
  ):
    status, results, got = _launch(dict(JOB, code=code, calls=["1"], workdir=str(tmp_path)), "/")
    assert (status, results, got) == (0, "N ready\n", ending)


def test_a_setup_failure_is_reported_before_any_code(tmp_path):
  """A control group file that cannot be joined: setup_error on the status pipe, exit 70,
  and the code never ran."""
  missing = str(tmp_path / "no" / "cgroup.procs")
  status, results, ending = _launch(
    dict(JOB, code="open('ran', 'w')", calls=[], workdir=str(tmp_path), join=[missing]), "/"
  )
  assert status == 70 and results == ""
  assert ending.startswith('N setup_error "FileNotFoundError: [Errno 2] No such file')
  assert missing in ending
  assert not (tmp_path / "ran").exists()
