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
import tempfile
import textwrap
import threading
import time

import needs
import pytest

from grpo_jax.verifiers import sandbox
from grpo_jax.verifiers.sandbox import channel, runner, values

ROOT = pathlib.Path(__file__).resolve().parents[2]
FAST = sandbox.Limits(timeout_s=2.0)
ADD_TESTS = [sandbox.parse_test(t) for t in ("assert add(2, 3) == 5", "assert add(-1, 1) == 0")]
ADD = "def add(a, b):\n  return a + b\n"
NAMESPACES = not sandbox.namespaces_unavailable()
needs_namespaces = pytest.mark.needs("namespaces", sandbox.namespaces_unavailable())


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


def judge(results: str, status: str = "exit 0", *, timed_out=False, oom=False, raw=b""):
  nonce = "n0"
  lines = "".join(f"{nonce} {line}\n" for line in results.split("|")) if results else ""
  data = {
    "results": raw or lines.encode(),
    "status": f"{nonce} {status}\n".encode() if status else b"",
    "stderr": b"",
  }
  ending = channel.Ending(data, overflow=False, timed_out=timed_out, oom_killed=oom, timeout_s=1.0)
  return channel.judge(ending, ADD_TESTS, nonce=nonce, max_result_chars=1000)[:3]


@pytest.mark.parametrize(
  "results, status, timed_out, verdict, cause, detail",
  [
    ("ready|0:ok 5|1:ok 0|end", "exit 0", False, "pass", "pass", "2 of 2"),
    ("ready|0:ok 5|1:ok 0|end|0:ok 5", "exit 0", False, "fail", "tampered", "a record after"),
    ("ready|1:ok 0|0:ok 5|end", "exit 0", False, "fail", "tampered", "expected test 0"),
    ("ready|0:ok 5|end", "exit 0", False, "fail", "tampered", "the end came after 1 of 2"),
    ("ready|ready|0:ok 5|1:ok 0|end", "exit 0", False, "fail", "tampered", "unexpected record"),
    ("ready|0:ok 5|1:bogus 0|end", "exit 0", False, "fail", "tampered", "unknown record kind"),
    ("ready|0:ok 5", "exit 0", False, "fail", "crash", "exited (status 0) before the tests"),
    ("ready|0:ok 5", "exit 1", False, "fail", "crash", "exited (status 1)"),
    ("ready|0:ok 5", "signal 24", False, "fail", "timeout", "killed by SIGXCPU"),
    ("ready|0:ok 5", "signal 9", False, "fail", "crash", "killed by SIGKILL"),
    ("ready|0:ok 5", "signal 25", False, "fail", "crash", "killed by SIGXFSZ"),
    ("ready|0:ok 5", "", False, "fail", "crash", "died after the code started"),
    ("ready|0:ok 5", "", True, "fail", "timeout", "timed out after 1s (1 of 2 tests done)"),
    ("ready|0:ok 4", "", True, "fail", "wrong", "got 4"),  # A wrong answer wins.
    ("ready|0:raised 'ValueError: x'", "", True, "fail", "raised", "raised 'ValueError"),
    ("ready|0:memory|1:ok 0|end", "exit 0", False, "fail", "memory", "MemoryError"),
    ("ready|code:memory|end", "exit 0", False, "fail", "memory", "MemoryError"),
    ("ready|code:raised 'MemoryError: '|end", "exit 0", False, "fail", "raised", "raised"),
    ("ready|0:ok 5|1:ok __import__('os')", "exit 0", False, "fail", "tampered", "__import__"),
    ("", "setup_error 'OSError: no userns'", False, "could_not_run", "sandbox", "failed to start"),
    ("", "exit 1", False, "could_not_run", "sandbox", "did not start"),
    ("", "", True, "could_not_run", "sandbox", "did not start within 1s"),
  ],
)
def test_channel_reading(results, status, timed_out, verdict, cause, detail):
  got = judge(results, status, timed_out=timed_out)
  assert got[:2] == (verdict, cause) and detail in got[2], got


def test_could_not_run_only_before_the_code_runs():
  # Once "ready" is on the channel (candidate code may have run), no ending is
  # "could_not_run": a policy cannot opt out of a zero by failing loudly.
  endings = [
    dict(status=s, timed_out=t, oom=o)
    for s in ("exit 0", "exit 70", "signal 9", "signal 15", "signal 24", "")
    for t in (False, True)
    for o in (False, True)
  ]
  for results in ("ready", "ready|0:ok 5", "ready|0:memory", "ready|code:memory"):
    for e in endings:
      assert judge(results, **e)[0] == "fail", (results, e)
  assert judge("ready|0:ok 5|1:ok 0", "signal 9", oom=True)[1] == "memory"


def test_a_line_cut_off_by_the_kill_is_ignored():
  got = judge("", "", timed_out=True, raw=b"n0 ready\nn0 0:ok 5\nn0 1:ok")
  assert got == ("fail", "timeout", "timed out after 1s (1 of 2 tests done)")


def test_records_past_the_bounds_are_not_read(monkeypatch):
  parsed = []
  monkeypatch.setattr(values, "parse_value", lambda text: parsed.append(len(text)) or 5)
  too_many = b"".join(b"n0 0:ok 5\n" for _ in range(6))  # n + 3 = 5 records at most.
  assert judge("", raw=b"n0 ready\n" + too_many)[:2] == ("fail", "tampered")
  too_long = b"n0 ready\nn0 0:ok " + b"5" * 5000 + b"\nn0 1:ok 0\nn0 end\n"
  got = judge("", raw=too_long)
  assert got[:2] == ("fail", "tampered") and "at most" in got[2]
  assert parsed == []  # Nothing of either was parsed.


def test_a_value_longer_than_any_equal_value_is_wrong_unparsed(monkeypatch):
  parsed = []
  real = values.parse_value
  monkeypatch.setattr(values, "parse_value", lambda text: parsed.append(len(text)) or real(text))
  bound = values.max_equal_repr(5)
  long = "[" + "0," * (bound // 2) + "]"
  got = judge(f"ready|0:ok {long}|1:ok 0|end")
  assert got[:2] == ("fail", "wrong") and f"a value of {len(long)} characters" in got[2]
  assert parsed == [1]  # Only test 1's "0".
  assert judge("ready|0:ok 5.0|1:ok (-0-0j)|end")[0] == "pass"


# Adversarial records: what the child sends can make no reader in the caller raise. Before
# round two, a payload such as "-" * 500 + "1" (a long unary chain) or "1+1+...+1" made
# the value parser raise RecursionError inside its own except clause (formatting the parse
# error), so the row became an error (unscorable, masked) instead of a 0.
_DEEP = 3000
ADVERSARIAL_VALUES = {
  "unary_chain": "-" * _DEEP + "1",
  "not_chain": "not " * _DEEP + "1",
  "invert_chain": "~" * 600 + "1",
  "binop_chain": "+".join(["1"] * _DEEP),
  "power_chain": "**".join(["2"] * 600),
  "compare_chain": "<".join(["1"] * _DEEP),
  "conditional_chain": "1 if 1 else " * 600 + "1",
  "lambda_chain": "lambda: " * 600 + "1",
  "subscript_chain": "a" + "[0]" * 600,
  "call_chain": "f" + "()" * 600,
  "nested_lists": "[" * 300 + "]" * 300,
  "nested_dicts": "{1:" * 150 + "1" + "}" * 150,
  "nested_calls": "set(" * 150 + ")" * 150,
  "nested_tuples": "(" * 199 + "5" + ")" * 199,
  "huge_int": "9" * 5000,
  "huge_exponent": "1e" + "9" * 5000,
  "huge_complex": "(" + "9" * 5000 + "j)",
  "truncated": "[1, 2, (3",
  "unbalanced": ")))",
  "nul_byte": "5\x00",
  "carriage_return": "5\r5",
  "form_feed": "\x0c9",
  "tab_indent": "\t5",
  "leading_space": " 5",
  "replacement_chars": "'\ufffd" * 200,
  "unterminated_string": "'abc",
  "triple_quote": "'" * 3 + "a",
  "fstring": "f'{1}'",
  "walrus": "(x := 5)",
  "name": "__import__('os').system('true')",
  "empty": "",
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL_VALUES))
def test_an_adversarial_value_record_is_a_verdict_never_an_error(name):
  payload = ADVERSARIAL_VALUES[name]
  for results in (f"ready|0:ok {payload}|1:ok 0|end", f"ready|0:ok 5|1:ok {payload}|end"):
    verdict, cause, detail = judge(results)
    assert (verdict, cause) in (("fail", "wrong"), ("fail", "tampered")), (name, detail)
  how, got = values.read_reported(payload, ["a" * 400])  # A generous length bound.
  assert how in ("wrong", "tampered") or (how == "value" and got != ["a" * 400]), name


@pytest.mark.parametrize(
  "raw",
  [
    b"n0 ready\nn0 0:ok \xff\xfe\xfd\nn0 1:ok 0\nn0 end\n",  # Invalid UTF-8.
    b"n0 ready\nn0 0:ok " + b"\xc3" * 500 + b"\nn0 end\n",
    b"n0 ready\nn0 0:ok 5\nn0 1:ok [1, 2",  # Cut off mid-record by the kill.
    b"n0 ready\nn0 00:ok 5\nn0 1:ok 0\nn0 end\n",
    b"n0 ready\nn0 -1:ok 5\nn0 end\n",
    b"n0 ready\nn0 99999999999999999999999:ok 5\nn0 end\n",
    b"n0 ready\nn0 0:\nn0 :ok\nn0 \nn0\n",
    b"n0 ready\n" + b"n0 0:ok " + b"[" * 2000 + b"\n",
    b"\n\n\nn0 ready\n\x00\x00\n",
    b"n0 ready\nn0 0:ok 5\nn0 1:ok 0\nn0 end " + b"x" * 500 + b"\n",
  ],
)
def test_adversarial_raw_records_are_a_verdict(raw):
  verdict, cause, _ = judge("", raw=raw)
  assert verdict in sandbox.VERDICTS and cause in sandbox.CAUSES, (raw[:60], cause)


@pytest.mark.parametrize(
  "status",
  ["signal 99999999999999999999999", "signal -1", "signal x", "exit " + "9" * 5000, "exit",
   "identity " + "9" * 5000, "setup_error", "\xff\x00"],
)  # fmt: skip
def test_adversarial_status_records_are_a_verdict(status):
  verdict, cause, _ = judge("ready|0:ok 5", status)
  assert verdict in sandbox.VERDICTS and cause in sandbox.CAUSES


def test_random_records_never_make_the_reading_raise():
  from hypothesis import given, settings
  from hypothesis import strategies as st

  pieces = list("-+~([{}]),:'\"0159jex n.") + ["not ", "set(", "inf", "\\"]
  alphabet = st.sampled_from(pieces)

  @settings(max_examples=300, deadline=None, derandomize=True)
  @given(st.lists(alphabet, max_size=400).map("".join), st.binary(max_size=200))
  def check(text, junk):
    verdict, cause, _ = judge(f"ready|0:ok {text}|1:ok 0|end")
    assert verdict in ("pass", "fail") and cause in sandbox.CAUSES
    verdict, _, _ = judge("", raw=b"n0 ready\nn0 0:ok " + junk + b"\nn0 1:ok 0\nn0 end\n")
    assert verdict in ("pass", "fail")

  check()


def test_reading_a_value_is_linear_and_shallow():
  # A long legitimate value is read in time proportional to its length; a deep or chained
  # one is refused after one pass over its tokens, before any recursive parser sees it.
  expected = list(range(4000))
  for n in (1000, 4000):
    start = time.perf_counter()
    assert values.read_reported(repr(list(range(n))), expected)[0] == "value"
    assert time.perf_counter() - start < 1.0
  assert values.max_equal_depth([[1]]) == 4  # [[1]] -> frozenset? no: [[(1+0j)]] is 3.
  assert values.read_reported("[" * 5 + "]" * 5, [[1]])[0] == "wrong"  # Deeper: unread.
  assert values.read_reported("[[(1+0j)]]", [[1]]) == ("value", [[1]])
  assert values.read_reported("frozenset({(1+0j)})", {1}) == ("value", frozenset({1}))
  assert values.read_reported("(nan+nanj)", 1)[0] == "wrong"
  assert values.read_reported("-1", -1) == ("value", -1)
  assert values.read_reported("--1", -1)[0] == "tampered"  # Parses, but no repr has it.
  assert values.read_reported("---1", -1)[0] == "tampered"  # Refused by the scan.


def test_a_forged_deep_record_through_the_code_task_is_a_zero_not_unscorable():
  from grpo_jax.tasks import code as code_task

  # The expected value's repr (16 characters) lets a value of up to 1,088 be parsed.
  spec = code_task.Problem(
    id="greet", description="Greet.", signature="def greet(name)",
    solution="def greet(name):\n  return 'hello, ' + name + '!'\n", visible_tests=(),
    hidden_tests=("assert greet('world') == 'hello, world!'",),
  ).spec()  # fmt: skip
  attack = "forge(n + b' 0:ok ' + b'-' * 1000 + b'1\\n')\nos._exit(0)\n"
  completion = f"```python\n{_FORGE.strip()}\n{attack}\ndef greet(name):\n  return ''\n```"
  task = code_task.CodeTask(isolation="namespaces" if NAMESPACES else "none")
  value = task.reward(spec, completion)  # Before: verdicts.Unscorable (RecursionError).
  assert float(value) == 0.0 and value.label == "tampered", value


def _equal_variants(value):
  """Values equal to `value` whose reprs are as long as equal values get."""
  if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
    return [value]
  if isinstance(value, int):
    return [value, float(value), complex(value)] if abs(value) < 2**53 else [value]
  if isinstance(value, float):
    if value.is_integer():
      return [value, int(value), complex(value)]
    return [value, complex(value)]
  if isinstance(value, (list, tuple)):
    return [type(value)(v[-1] for v in map(_equal_variants, value))]
  if isinstance(value, (set, frozenset)):
    return [frozenset(value), set(value)]
  if isinstance(value, dict):
    return [{k: _equal_variants(v)[-1] for k, v in value.items()}]
  return [value]


def test_max_equal_repr_bounds_every_equal_value():
  from hypothesis import given
  from hypothesis import strategies as st

  atoms = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.0, -0.0, 1e308, 1e300, 5e-324, True, False, 1.0]),
    st.text(max_size=5),
    st.binary(max_size=5),
  )
  hashable = st.one_of(atoms, st.frozensets(st.integers(), max_size=3))
  tree = st.recursive(
    atoms,
    lambda kids: st.one_of(
      st.lists(kids, max_size=4),
      st.tuples(kids, kids),
      st.dictionaries(st.integers(-5, 5), kids, max_size=3),
      st.frozensets(hashable, max_size=3),
    ),
    max_leaves=12,
  )

  @given(tree)
  def check(value):
    for variant in _equal_variants(value):
      assert variant == value
      assert len(repr(variant)) <= values.max_equal_repr(value), (value, variant)

  check()
  big = 1e308
  assert len(repr(int(big))) == 309 and values.max_equal_repr(big) >= 309
  assert len(repr(complex(-0.0, -0.0))) <= values.max_equal_repr(0)


# ---------------------------------------------------------------------------------------
# Failures of the code are "fail" (with their cause); only the sandbox's are
# "could_not_run".


@pytest.mark.parametrize(
  "code, cause",
  [
    ("while True:\n  pass\n", "timeout"),
    ("import time\ntime.sleep(60)\n", "timeout"),
    ("def add(a, b):\n  while True: pass\n", "timeout"),
  ],
)
def test_hangs_are_killed_at_the_wall_timeout_and_fail(code, cause):
  start = time.monotonic()
  result = run(code, timeout_s=1.0)
  assert (result.verdict, result.cause) == ("fail", cause), result
  assert "timed out after 1s" in result.detail
  assert time.monotonic() - start < 10.0  # Bounded: the trainer never hangs.


def test_cpu_limit_kills_a_busy_loop():
  result = run("while True:\n  pass\n", timeout_s=5.0, cpu_s=1)
  assert result.verdict == "fail" and result.cause in ("timeout", "crash"), result
  assert "SIGXCPU" in result.detail or "SIGKILL" in result.detail


@pytest.mark.parametrize(
  "code",
  ["x = bytearray(2 << 30)\n", "def add(a, b):\n  return len([0] * (1 << 30))\n"],
)
def test_huge_allocation_is_stopped_by_the_memory_limit(code):
  result = run(code, memory_mb=256)
  assert (result.verdict, result.cause) == ("fail", "memory"), result
  assert "MemoryError" in result.detail


# The ways a wrong answer could opt out of its zero, each "fail" now.
_OPT_OUTS = {
  "raises MemoryError when unsure": (
    "def add(a, b):\n  if a < 0:\n    raise MemoryError\n  return a + b\n",
    "memory",
  ),
  "raises only on inputs it is unsure of": (
    "def add(a, b):\n  if a < 0:\n    raise ValueError('unsure')\n  return a + b\n",
    "raised",
  ),
  "kills itself with SIGKILL": (
    "import os\ndef add(a, b):\n  if a < 0:\n    os.kill(os.getpid(), 9)\n  return a + b\n",
    "crash",
  ),
  "kills itself with SIGSEGV": (
    "import os\ndef add(a, b):\n  if a < 0:\n    os.kill(os.getpid(), 11)\n  return a + b\n",
    "crash",
  ),
  "exits with an error status": ("import os\ndef add(a, b):\n  os._exit(3)\n", "crash"),
  "hangs when unsure": (
    "import time\ndef add(a, b):\n  if a < 0:\n    time.sleep(60)\n  return a + b\n",
    "timeout",
  ),
  "kills its supervisor": (
    "import os, signal\ndef add(a, b):\n  os.kill(os.getppid(), 9)\n  os.kill(0, 9)\n",
    "crash",
  ),
}


@pytest.mark.parametrize("name", sorted(_OPT_OUTS))
def test_failing_loudly_is_a_fail_not_could_not_run(name):
  code, cause = _OPT_OUTS[name]
  result = run(code, timeout_s=1.0)
  assert (result.verdict, result.cause) == ("fail", cause), result


@pytest.mark.parametrize("name", ["kills its supervisor", "exits with an error status"])
def test_failing_loudly_is_a_fail_without_namespaces_too(name, monkeypatch):
  monkeypatch.setattr(runner, "_WARNED", set())
  code, cause = _OPT_OUTS[name]
  with pytest.warns(RuntimeWarning):
    result = run(code, isolation="none", timeout_s=1.0)
  assert (result.verdict, result.cause) == ("fail", cause), result


def test_writing_a_huge_file_fails_at_the_file_size_limit():
  code = "def add(a, b):\n  open('big', 'wb').write(b'x' * (4 << 20))\n  return a + b\n"
  result = run(code, file_mb=1)
  assert (result.verdict, result.cause) == ("fail", "raised"), result
  assert "File too large" in result.detail


def test_a_crashing_harness_could_not_run(monkeypatch):
  monkeypatch.setattr(runner, "_HARNESS", "import sys\nsys.exit('harness broke')\n")
  result = run(ADD)
  assert (result.verdict, result.cause) == ("could_not_run", "sandbox")
  assert "did not start" in result.detail and "harness broke" in result.detail


def test_a_harness_that_runs_out_of_memory_before_the_code_could_not_run():
  result = run(ADD, memory_mb=1)
  assert (result.verdict, result.cause) == ("could_not_run", "sandbox"), result


# ---------------------------------------------------------------------------------------
# Isolation never falls back silently.


def test_required_namespaces_that_are_unavailable_refuse_to_run(monkeypatch):
  monkeypatch.setattr(runner, "namespaces_unavailable", lambda: "user namespaces are off")
  for isolation in ("namespaces", "auto"):
    result = sandbox.run(ADD, ADD_TESTS, isolation=isolation)
    assert (result.verdict, result.cause, result.isolation) == ("could_not_run", "sandbox", "")
    assert "user namespaces are off" in result.detail


def test_the_startup_check_is_one_clear_error_or_one_line(monkeypatch):
  monkeypatch.setattr(runner, "namespaces_unavailable", lambda: "user namespaces are off")
  monkeypatch.setattr(runner, "_PROBE_ATTEMPTS", 2)
  for isolation in ("auto", "namespaces"):
    with pytest.raises(sandbox.Unavailable) as e:
      sandbox.check(isolation)
    message = str(e.value)
    assert "\n" not in message and "user namespaces are off" in message
    assert "isolation='none'" in message
  monkeypatch.setattr(runner, "_WARNED", set())
  with pytest.warns(RuntimeWarning, match="isolation='none'"):
    line = sandbox.check("none")
  assert "\n" not in line and "untrusted code runs" in line
  with pytest.raises(ValueError, match="Unknown sandbox isolation 'docker'"):
    sandbox.check("docker")


@needs_namespaces
def test_the_startup_check_describes_the_containment():
  line = sandbox.check("auto")
  assert line.startswith("sandbox: namespace isolation") and "\n" not in line
  if os.geteuid() == 0:
    assert f"as uid {sandbox.IDENTITY}" in line


def test_a_failed_probe_is_not_remembered(monkeypatch):
  outcomes = iter(["could_not_run", "pass"])
  fake = lambda: sandbox.Result(next(outcomes), "transient", 0, 1, "namespaces", 0.0, "sandbox")
  monkeypatch.setattr(runner, "_probe", fake)
  monkeypatch.setattr(runner, "_PASSED_PROBE", [])
  monkeypatch.setattr(runner, "_namespace_problem", lambda: "")
  assert "transient" in sandbox.namespaces_unavailable()  # Failed: asked again next time.
  assert sandbox.namespaces_unavailable() == ""  # Passed: remembered.
  assert sandbox.namespaces_unavailable() == ""


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
    monkeypatch.setattr(runner, "_WARNED", set())
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
  assert (result.verdict, result.cause) == ("fail", "timeout"), result
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
  monkeypatch.setattr(runner, "_WARNED", set())
  marker = sleep_marker()
  code = f"""
    import os, time
    if os.fork() == 0:
      os.execv('/usr/bin/sleep', ['sleep', {marker!r}])
    time.sleep(60)
  """
  with pytest.warns(RuntimeWarning, match="isolation='none'"):
    result = run(code, isolation="none", timeout_s=1.0)
  assert (result.verdict, result.cause, result.isolation) == ("fail", "timeout", "none")
  assert_no_process_with(marker)


_CALLER = """
import sys
from grpo_jax.verifiers import sandbox
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
  if isolation == "namespaces":
    needs.require("namespaces", sandbox.namespaces_unavailable())
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


def test_root_that_may_not_change_identity_still_isolates(monkeypatch):
  # Where root may not use the dedicated uid (a container mapping one uid), the code
  # runs as root in the namespaces rather than without them.
  needs.require("namespaces", sandbox.namespaces_unavailable())
  refuse = "def drop_identity(job, libc):\n"
  assert refuse in runner._HARNESS
  monkeypatch.setattr(
    runner, "_HARNESS", runner._HARNESS.replace(refuse, refuse + "  return False\n")
  )
  result = run("import os\ndef add(a, b):\n  return a + b if not os.path.exists('/work') else 0\n")
  assert (result.verdict, result.isolation) == ("pass", "namespaces"), result
  assert result.identity == os.geteuid()


def test_fallback_judges_like_the_sandbox(monkeypatch):
  monkeypatch.setattr(runner, "_WARNED", set())
  with pytest.warns(RuntimeWarning):
    assert run(ADD, isolation="none").verdict == "pass"
  assert run("def add(a, b):\n  return 0\n", isolation="none").verdict == "fail"
  assert run("import os\nos._exit(0)\n", isolation="none").verdict == "fail"


def test_rebinding_the_harness_literal_types_does_not_make_a_value_literal():
  code = """
    import __main__
    class Five:
      def __repr__(self):
        return '5'
    __main__.ATOMS = __main__.ATOMS + (Five,)
    __main__.CONTAINERS = __main__.CONTAINERS + (Five,)
    def add(a, b):
      return Five()
  """
  result = run(code)
  assert (result.verdict, result.cause) == ("fail", "wrong") and "nonliteral" in result.detail


# ---------------------------------------------------------------------------------------
# The result channel cannot stall or bloat the caller.

_FORGE = """
import gc, os
job = next(o for o in gc.get_objects() if isinstance(o, dict) and 'nonce' in o)
n, fd = job['nonce'].encode(), job['results_fd']
def forge(data):
  while data:
    data = data[os.write(fd, data):]
"""


@pytest.mark.parametrize(
  "attack",
  [
    # One well-formed record just under the old 16 MB channel cap.
    "forge(n + b' 0:ok [' + b'0,' * (7 << 20) + b']\\n')",
    # Records of the longest allowed size, for every test, each far longer than any
    # value equal to the expected one.
    "forge(b''.join(n + b' %d:ok [' % i + b'0,' * 49_000 + b']\\n' for i in range(2)))",
    # A flood of small records.
    "forge((n + b' 0:ok 5\\n') * 200_000)",
  ],
)
def test_an_enormous_forged_result_is_not_parsed(attack, monkeypatch):
  import resource

  parsed = []
  real = values.parse_value
  monkeypatch.setattr(values, "parse_value", lambda text: parsed.append(len(text)) or real(text))
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  start = time.monotonic()
  result = run(_FORGE + attack + "\nos._exit(0)\n", timeout_s=5.0)
  assert result.verdict == "fail" and result.cause in ("tampered", "wrong"), result
  assert time.monotonic() - start < 5.0  # Before: 26 s against a 5 s timeout.
  assert sum(parsed) < 1000, parsed  # Nothing long was parsed.
  grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
  assert grew_mb < 200, f"the caller grew by {grew_mb:.0f} MB (before: 7.9 GB)"


# ---------------------------------------------------------------------------------------
# No task data inside; no interpreter location breaks the sandbox.

_PREFIX_PROBE = """
import json, os, sys
sys.path[:0] = {paths!r}
from grpo_jax.verifiers import sandbox
from grpo_jax.tasks import code as code_task
problems = {problems!r}
out = {{"base_prefix": sys.base_prefix, "check": sandbox.check("auto"),
        "visible": sandbox.visible(problems)}}
reader = '''
import os
def look(path):
  found = []
  d = os.path.dirname
  for p in (path, d(path), d(d(path)), d(d(d(path)))):
    try:
      found.append(sorted(os.listdir(p)) if os.path.isdir(p) else open(p).read()[:20])
    except OSError as e:
      found.append(type(e).__name__)
  return found
'''
result = sandbox.run(reader, [sandbox.Test(f"look({{problems!r}})", None)])
out["verdict"], out["detail"] = result.verdict, result.detail
try:
  code_task.CodeTask(problems=problems)
  out["task"] = "built"
except ValueError as e:
  out["task"] = str(e)
print(json.dumps(out))
"""


def _base_prefix_install(root: pathlib.Path) -> pathlib.Path:
  """A Python installation under `root` (under /tmp): the interpreter, the standard
  library (hard links), and grpo_jax's problems file installed in its site-packages, as
  a Docker-style `pip install .` into the base interpreter would put it."""
  real = pathlib.Path(os.path.realpath(sys.base_prefix))
  version = f"python{sys.version_info.major}.{sys.version_info.minor}"
  stdlib = real / "lib" / version
  (root / "bin").mkdir(parents=True)
  exe = root / "bin" / version
  exe.write_bytes(pathlib.Path(os.path.realpath(sys.executable)).read_bytes())
  exe.chmod(0o755)
  for dirpath, dirnames, filenames in os.walk(stdlib):
    rel = pathlib.Path(dirpath).relative_to(stdlib)
    dirnames[:] = [
      d for d in dirnames if not (rel == pathlib.Path(".") and d in ("site-packages", "test"))
    ]
    (root / "lib" / version / rel).mkdir(parents=True, exist_ok=True)
    for name in filenames:
      try:
        os.link(os.path.join(dirpath, name), root / "lib" / version / rel / name)
      except OSError:
        (root / "lib" / version / rel / name).write_bytes(pathlib.Path(dirpath, name).read_bytes())
  data = root / "lib" / version / "site-packages" / "grpo_jax" / "data"
  data.mkdir(parents=True)
  (data / "code_problems.jsonl").write_bytes(
    (ROOT / "grpo_jax/data/code_problems.jsonl").read_bytes()
  )
  return exe


@needs_namespaces
def test_an_install_into_a_base_prefix_under_tmp_hides_the_problems_and_isolates():
  # Class 3 (the hidden tests readable when grpo_jax is installed into the interpreter's
  # own site-packages) and class 5 (an interpreter under /tmp broke the sandbox's setup,
  # and "auto" then ran everything unisolated): both at once.
  import json
  import shutil
  import site

  root = pathlib.Path(tempfile.mkdtemp(prefix="grpo_jax_prefix_", dir="/tmp"))
  root.chmod(0o755)  # An installation others may read (the sandbox's identity among them).
  try:
    exe = _base_prefix_install(root)
    version = exe.name
    problems = str(root / "lib" / version / "site-packages/grpo_jax/data/code_problems.jsonl")
    paths = [str(ROOT), *site.getsitepackages()]
    code = _PREFIX_PROBE.format(paths=paths, problems=problems)
    r = subprocess.run([str(exe), "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
  finally:
    shutil.rmtree(root, ignore_errors=True)
  assert out["base_prefix"] == str(root), out
  assert out["check"].startswith("sandbox: namespace isolation"), out
  assert out["visible"] is False
  # Inside: site-packages is empty, so the file, its directory and the package are not there.
  missing = "'FileNotFoundError', " * 3
  assert out["verdict"] == "fail" and f"got [{missing}[]]" in out["detail"], out
  assert out["task"] == "built"


def test_a_task_refuses_to_run_when_its_problems_would_be_visible(tmp_path, monkeypatch):
  from grpo_jax.verifiers.sandbox import layout

  problems = tmp_path / "problems.jsonl"
  problems.write_bytes((ROOT / "grpo_jax/data/code_problems.jsonl").read_bytes())
  binds, links, masks = layout.layout()
  monkeypatch.setattr(layout, "layout", lambda: (binds + ((str(tmp_path), True),), links, masks))
  assert sandbox.visible(str(problems))
  from grpo_jax.tasks import code as code_task

  with pytest.raises(ValueError, match="would be readable inside the sandbox") as e:
    code_task.CodeTask(problems=str(problems), isolation="namespaces" if NAMESPACES else "none")
  assert str(problems) in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------------
# The host's per-user kernel counts, and the whole sandbox's memory.


def test_the_seccomp_filter_refuses_what_a_pure_function_never_needs():
  from grpo_jax.verifiers.sandbox import seccomp

  for machine, (arch, numbers, x32) in seccomp.MACHINES.items():
    prog = seccomp.program(machine)
    check = lambda nr, arg0=0, arch=arch, prog=prog: seccomp.evaluate(
      prog, arch=arch, nr=nr, arg0=arg0
    )
    eperm, allow = seccomp.RET_ERRNO | seccomp.EPERM, seccomp.RET_ALLOW
    for name in (
      "inotify_init1",
      "fanotify_init",
      "unshare",
      "setns",
      "mount",
      "keyctl",
      "bpf",
      "ptrace",
      "io_uring_setup",
      "open_by_handle_at",
      "mq_open",
      "pivot_root",
    ):
      assert check(numbers[name]) == eperm, (machine, name)
    assert check(numbers["clone3"]) == seccomp.RET_ERRNO | seccomp.ENOSYS
    assert check(numbers["clone"], 0x10000000) == eperm  # CLONE_NEWUSER
    assert check(numbers["clone"], 0x00020000 | 0x11) == eperm  # CLONE_NEWNS
    assert check(numbers["clone"], 0x003D0F00) == allow  # A thread.
    assert check(numbers["clone"], 0x01200011) == allow  # fork().
    for nr in (0, 1, 2, 3, 57, 60, 63, 64, 93, 231):  # read, write, exit... (either table)
      if nr not in set(numbers.values()):
        assert check(nr) == allow, (machine, nr)
    assert seccomp.evaluate(prog, arch=0x40000003, nr=1) == seccomp.RET_KILL_PROCESS
    if x32:
      assert check(seccomp.X32_BIT | 1) == eperm
  assert seccomp.program("sparc") == b""


_INOTIFY_HOG = """
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
made = [libc.inotify_init1(0) for _ in range(200)]
time.sleep(1.0)
def hog():
  return sum(fd >= 0 for fd in made), ctypes.get_errno()
"""


@needs_namespaces
def test_sandboxes_cannot_take_the_hosts_inotify_instances():
  import ctypes

  libc = ctypes.CDLL(None, use_errno=True)
  results = []
  threads = [
    threading.Thread(
      target=lambda: results.append(run(_INOTIFY_HOG, one("hog()", None), timeout_s=5.0))
    )
    for _ in range(3)
  ]
  for t in threads:
    t.start()
  time.sleep(0.5)  # The candidates are holding whatever they got.
  fd = libc.inotify_init1(0)
  for t in threads:
    t.join()
  assert fd >= 0, f"the host could not create an inotify instance (errno {ctypes.get_errno()})"
  os.close(fd)
  assert len(results) == 3
  for r in results:
    assert r.verdict == "fail" and "got (0, 1)" in r.detail, r  # None made: EPERM.
  if os.geteuid() == 0:
    assert {r.identity for r in results} == {sandbox.IDENTITY}


_HOLDERS = """
import os, time
def hold(n, mb):
  children = []
  for _ in range(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
      try:
        block = bytearray(mb << 20)
        for i in range(0, len(block), 4096):
          block[i] = 1
        os.write(w, b'y')
      except MemoryError:
        os.write(w, b'n')
      time.sleep(30)
      os._exit(0)
    os.close(w)  # A child the OOM killer stops gives EOF.
    children.append((pid, r))
  said = [(pid, os.read(r, 1) == b'y') for pid, r in children]
  time.sleep(0.3)
  return sum(yes and os.waitpid(pid, os.WNOHANG) == (0, 0) for pid, yes in said)
"""


def test_the_whole_sandbox_has_one_memory_budget():
  from grpo_jax.verifiers.sandbox import cgroup

  assert sandbox.Limits().processes_for(grouped=False) == 4
  assert sandbox.Limits().processes_for(grouped=True) == 16
  assert sandbox.Limits(processes=7).processes_for(grouped=False) == 7
  needs.require("namespaces", sandbox.namespaces_unavailable())
  # Without one, the fallback is 4 processes x memory_mb (asserted above).
  needs.require("cgroup", "" if cgroup.available() else "cgroup.available() found none")
  # Six processes of 120 MB each: 720 MB under RLIMIT_AS per process, but the sandbox's
  # budget is 256 MB (+64 for its supervisors): at most two still hold theirs at the end.
  result = run(_HOLDERS, one("hold(6, 120)", 6), memory_mb=256, timeout_s=8.0)
  assert result.verdict == "fail", result
  held = int(result.detail.split("got ")[1]) if "got " in result.detail else 0
  assert held <= 2, result


def _fake_cgroup_files(monkeypatch, cgroup, interface):
  """A fake cgroup tree: each directory cgroup makes gets the kernel's interface files."""
  real_mkdir = os.mkdir

  def mkdir(path, *args):
    real_mkdir(path, *args)
    for name in interface:
      (pathlib.Path(path) / name).write_text("")

  monkeypatch.setattr(cgroup.os, "mkdir", mkdir)


def test_a_cgroup_v1_run_is_joined_by_the_harness_itself(tmp_path, monkeypatch):
  """cgroup v1 on a fake tree: the caller sets the run's limits but does not move the
  child by pid (cgroup.procs: the kernel's global threadgroup lock); the harness writes
  "0" to each group's tasks file itself, before anything else. (That the code then runs
  inside the real groups, where this machine has them: the memory-budget test above
  fails without the join.)"""
  from grpo_jax.verifiers.sandbox import cgroup

  interface = ("cgroup.procs", "tasks", "memory.limit_in_bytes", "memory.oom_control",
               "pids.max")  # fmt: skip

  root = tmp_path / "cg"
  for controller in ("memory", "pids"):
    (root / controller / "job").mkdir(parents=True)
  monkeypatch.setattr(cgroup, "ROOT", str(root))
  monkeypatch.setattr(cgroup, "_own_group", lambda version, controller="": "/job")
  _fake_cgroup_files(monkeypatch, cgroup, interface)
  monkeypatch.setattr(cgroup, "_write", lambda path, text: pathlib.Path(path).write_text(text))
  cgroup.available.cache_clear()
  try:
    parents = [root / c / "grpo_jax_sandbox" for c in ("memory", "pids")]  # Beside /job.
    assert cgroup.available() == tuple(cgroup.Hierarchy(1, str(p)) for p in parents)
    with pytest.warns(RuntimeWarning, match="isolation='none'"):
      result = run(ADD, isolation="none", memory_mb=256, processes=8)
    assert result.verdict == "pass", result
    for parent in parents:
      (run_dir,) = [d for d in parent.iterdir() if d.name.startswith(f"run-{os.getpid()}-")]
      assert (run_dir / "tasks").read_text() == "0"  # The harness joined by itself,
      assert (run_dir / "cgroup.procs").read_text() == ""  # never moved by pid.
    assert (parents[0] / run_dir.name / "memory.limit_in_bytes").read_text() == str(320 << 20)
    assert (parents[1] / run_dir.name / "pids.max").read_text() == "12"
  finally:
    cgroup.available.cache_clear()


def test_pending_groups_are_removed_once_when_runs_end_on_many_threads(tmp_path, monkeypatch):
  """Runs start on the reward pool's threads, and each start retries the groups left
  pending by earlier runs: two threads must never both remove one (CI once saw
  `list.remove(x): x not in list` from that race). rmdir is slowed to widen the window."""
  from grpo_jax.verifiers.sandbox import cgroup

  groups = [tmp_path / f"run-{i}" for i in range(40)]
  for g in groups:
    g.mkdir()
  real_rmdir = cgroup._rmdir

  def slow_rmdir(path):
    time.sleep(0.001)
    return real_rmdir(path)

  monkeypatch.setattr(cgroup, "_rmdir", slow_rmdir)
  monkeypatch.setattr(
    cgroup, "_PENDING", [(cgroup.Hierarchy(1, str(tmp_path)), str(g)) for g in groups]
  )
  errors = []

  def retry():
    try:
      cgroup._retry_pending()
    except Exception as e:  # noqa: BLE001 -- any error is the failure this test looks for.
      errors.append(e)

  threads = [threading.Thread(target=retry) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert errors == []
  assert cgroup._PENDING == [] and not any(g.exists() for g in groups)


def test_a_cgroup_v2_hierarchy_gets_the_whole_budget(tmp_path, monkeypatch):
  # cgroup v2 on a fake tree (this machine may only have v1): where the runs' parent
  # goes, what each run's group is limited to, how an OOM kill is read.
  from grpo_jax.verifiers.sandbox import cgroup

  interface = ("cgroup.procs", "cgroup.kill", "memory.max", "memory.swap.max", "pids.max",
               "memory.events", "cgroup.controllers", "cgroup.subtree_control")  # fmt: skip

  root = tmp_path / "cg"
  (root / "user.slice" / "session").mkdir(parents=True)
  for d in (root, root / "user.slice"):
    (d / "cgroup.controllers").write_text("cpu memory pids\n")
    (d / "cgroup.subtree_control").write_text("cpu\n")
  monkeypatch.setattr(cgroup, "ROOT", str(root))
  monkeypatch.setattr(cgroup, "_own_group", lambda version, controller="": "/user.slice/session")
  _fake_cgroup_files(monkeypatch, cgroup, interface)
  monkeypatch.setattr(cgroup, "_write", lambda path, text: pathlib.Path(path).write_text(text))
  cgroup.available.cache_clear()
  try:
    found = cgroup.available()
    parent = root / "user.slice" / "grpo_jax_sandbox"
    assert found == (cgroup.Hierarchy(2, str(parent)),)
    # Beside this process's group: controllers enabled for the parent's children.
    assert (root / "user.slice" / "cgroup.subtree_control").read_text() == "+memory +pids"
    assert (parent / "cgroup.subtree_control").read_text() == "+memory +pids"
    budget = cgroup.Budget.create(memory_mb=256, processes=16)
    ((h, run_dir),) = budget.dirs
    run_dir = pathlib.Path(run_dir)
    assert run_dir.parent == parent and run_dir.name.startswith(f"run-{os.getpid()}-")
    assert (run_dir / "memory.max").read_text() == str((256 + 64) << 20)
    assert (run_dir / "memory.swap.max").read_text() == "0"
    assert (run_dir / "pids.max").read_text() == "20"
    budget.add(4321)
    assert (run_dir / "cgroup.procs").read_text() == "4321"
    (run_dir / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert not budget.oom_killed()
    (run_dir / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n")
    assert budget.oom_killed()
    budget.remove()
    assert (run_dir / "cgroup.kill").read_text() == "1" and budget.dirs == []
  finally:
    cgroup.available.cache_clear()
