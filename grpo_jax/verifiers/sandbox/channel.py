"""Reading what a run sends back, within bounds fixed before it starts, and the verdict.

The child writes one record per line, ``<nonce> <tag> <payload>``: on the results pipe
"ready", then one record per test (``<i>:ok <repr>``, ``<i>:raised <message>``,
``<i>:memory``, ``<i>:nonliteral``, ``<i>:oversized``) or one for the code
(``code:raised``, ``code:memory``), then "end"; on the status pipe, from processes that
never run candidate code, "identity <uid>", "setup_error <message>", and how the code's
process ended ("exit <status>" or "signal <number>").

Bounds (the code may find the nonce and write records of its own, so nothing it sends is
read past them): at most n + 3 records of at most ``max_result_chars`` + 2 KB each are
read from the results pipe (n tests), the rest is not read and the run is "tampered";
a value's repr is parsed only when it is no longer than any value equal to the expected
one can be (`values.max_equal_repr`), else it is wrong unread, and only after one linear
pass over its tokens has bounded its depth (`values.read_reported`). So the caller's work
per run is bounded by the tests' own expected values, whatever the code sends.

The reading never raises (`judge`): a record it cannot read, or any exception while
reading, makes the run "fail" with cause "tampered". A row the candidate controls never
becomes an error (unscorable, masked from the loss) through what it writes.
"""

from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import time
from collections.abc import Sequence

from grpo_jax.verifiers.sandbox import values

STATUS_BYTES = 1 << 16
STDERR_BYTES = 16 << 10
_RECORD_OVERHEAD = 2048  # Nonce, tag, an exception's message (300 characters, escaped).


def record_cap(max_result_chars: int) -> int:
  return max_result_chars + _RECORD_OVERHEAD


def results_cap(n_tests: int, max_result_chars: int) -> int:
  """The most bytes read from the results pipe: n + 3 records."""
  return (n_tests + 3) * record_cap(max_result_chars)


def collect(fds: dict[str, int], *, deadline: float, caps: dict[str, int]):
  """Reads the pipes until the status pipe closes (the supervisor exited), the deadline,
  or the results pipe passing its cap; then what the others already hold, within their
  caps. Returns ({name: bytes}, results overflowed, timed out)."""
  data = {name: bytearray() for name in fds}
  state = {"overflow": False}
  sel = selectors.DefaultSelector()
  for name, fd in fds.items():
    sel.register(fd, selectors.EVENT_READ, name)

  def read(fd: int, name: str) -> bool:
    """Reads one chunk; False when the pipe is empty, closed or full."""
    try:
      chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
      return False
    if not chunk:
      sel.unregister(fd)
      return False
    room = max(caps[name] - len(data[name]), 0)
    data[name] += chunk[:room]
    if len(chunk) > room:
      state["overflow"] |= name == "results"
      sel.unregister(fd)  # Not read further: whatever else it sends is not looked at.
      return False
    return True

  for fd in fds.values():
    os.set_blocking(fd, False)
  timed_out = False
  while fds["status"] in sel.get_map() and not state["overflow"]:
    left = deadline - time.monotonic()
    if left <= 0:
      timed_out = True
      break
    for key, _ in sel.select(left):
      read(key.fd, key.data)
  for key in list(sel.get_map().values()):
    while read(key.fd, key.data):
      pass
  sel.close()
  return {name: bytes(buf) for name, buf in data.items()}, state["overflow"], timed_out


@dataclasses.dataclass(frozen=True)
class Ending:
  """How one run ended, as the caller saw it."""

  data: dict[str, bytes]
  overflow: bool  # The results pipe passed its cap.
  timed_out: bool  # The wall-clock deadline came first.
  oom_killed: bool  # The kernel's OOM killer acted in the run's control group.
  timeout_s: float


def _lines(raw: bytes, *, cap: int, limit: int) -> tuple[list[bytes], str]:
  """Complete lines (a last line without "\\n" was cut off by a kill), and why they are
  not to be trusted ("" when they may be read)."""
  lines = raw.split(b"\n")[:-1]
  if len(lines) > limit:
    return [], f"{len(lines)} records (at most {limit})"
  long = next((i for i, line in enumerate(lines) if len(line) > cap), None)
  if long is not None:
    return [], f"a record of {len(lines[long])} bytes (at most {cap})"
  return lines, ""


def _records(lines: list[bytes], nonce: str) -> tuple[list[tuple[str, str]], bool]:
  """(tag, payload) per line with this run's nonce, and whether every line had it."""
  records, clean = [], True
  for line in lines:
    got, _, rest = line.decode("utf-8", "replace").partition(" ")
    if got != nonce:
      clean = False
      continue
    tag, _, payload = rest.partition(" ")
    records.append((tag, payload))
  return records, clean


def judge(
  ending: Ending, tests: Sequence[values.Test], *, nonce: str, max_result_chars: int
) -> tuple[str, str, str, int]:
  """(verdict, cause, detail, tests passed): the policy in the package docstring. Never
  raises: whatever the records make the reading do, it ends in a verdict ("fail",
  "tampered" when the reading itself failed)."""
  try:
    return _judge(ending, tests, nonce=nonce, max_result_chars=max_result_chars)
  except Exception as e:  # noqa: BLE001 -- the child controls what is read: never raise.
    return "fail", "tampered", f"reading the run's records failed ({type(e).__name__})", 0


def _judge(ending: Ending, tests, *, nonce: str, max_result_chars: int):
  status_lines, _ = _lines(ending.data["status"], cap=STATUS_BYTES, limit=1 << 10)
  status, _ = _records(status_lines, nonce)
  cap, limit = record_cap(max_result_chars), len(tests) + 3
  lines, untrusted = _lines(ending.data["results"], cap=cap, limit=limit)
  results, clean = _records(lines, nonce)
  for tag, payload in status + results[:1]:
    if tag == "setup_error":
      return "could_not_run", "sandbox", f"the sandbox failed to start: {payload}", 0
  started = bool(results) and results[0][0] == "ready"
  if not started and not untrusted and not ending.overflow:
    stderr = ending.data["stderr"].decode("utf-8", "replace").strip()
    stderr = f"; stderr: {stderr[-500:]}" if stderr else ""
    if ending.timed_out:
      detail = f"the sandbox did not start within {ending.timeout_s:g}s{stderr}"
    else:
      ended = " ".join(" ".join(r) for r in status) or "no status"
      detail = f"the sandbox did not start ({ended}){stderr}"
    return "could_not_run", "sandbox", detail, 0
  reading = _Reading(tests)
  if untrusted or ending.overflow or not clean:
    why = untrusted or ("more than the results' cap" if ending.overflow else "")
    reading.tampered = why or "lines without this run's nonce"
  for tag, payload in results[1:]:
    if reading.tampered:
      break
    reading.add(tag, payload)
  return reading.verdict(dict(status), ending)


@dataclasses.dataclass
class _Reading:
  """The result records after "ready", read in order."""

  tests: Sequence[values.Test]
  next_index: int = 0
  passed: int = 0
  wrong: tuple[str, str] = ("", "")  # (cause, detail) of the first definite wrong answer.
  memory: str = ""
  tampered: str = ""
  ended: bool = False

  def add(self, tag: str, payload: str) -> None:
    if self.ended:
      self.tampered = f"a record after the end: {tag!r}"
    elif tag == "end":
      if self.next_index != len(self.tests):
        self.tampered = f"the end came after {self.next_index} of {len(self.tests)} results"
      self.ended = True
    elif tag == "code:raised":
      self._wrong("raised", f"the code raised {payload[:300]}")
      self.next_index = len(self.tests)
    elif tag == "code:memory":
      self.memory = self.memory or "the code ran out of memory (MemoryError)"
      self.next_index = len(self.tests)
    else:
      self._add_test(tag, payload)

  def _wrong(self, cause: str, detail: str) -> None:
    if not self.wrong[0]:
      self.wrong = (cause, detail)

  def _add_test(self, tag: str, payload: str) -> None:
    index, _, kind = tag.partition(":")
    if index != str(self.next_index) or self.next_index >= len(self.tests):
      self.tampered = f"an unexpected record {tag[:40]!r} (expected test {self.next_index})"
      return
    test = self.tests[self.next_index]
    self.next_index += 1
    where = test.source or f"{test.call} == {test.expected!r}"
    if kind == "ok":
      how, got = values.read_reported(payload, test.expected)
      if how == "tampered":
        self.tampered = f"{where}: {got}"
      elif how == "wrong":
        self._wrong("wrong", f"{where}: {got}")
      elif values.equal(got, test.expected):
        self.passed += 1
      else:
        self._wrong("wrong", f"{where}: got {payload[:200]}")
    elif kind == "memory":
      self.memory = self.memory or f"{where}: MemoryError"
    elif kind == "raised":
      self._wrong("raised", f"{where}: raised {payload[:200]}")
    elif kind in ("nonliteral", "oversized"):
      self._wrong("wrong", f"{where}: {kind}")
    else:
      self.tampered = f"an unknown record kind {tag[:40]!r}"

  def verdict(self, status: dict, ending: Ending) -> tuple[str, str, str, int]:
    done = f"{self.next_index} of {len(self.tests)} tests done"
    fail = lambda cause, detail: ("fail", cause, detail, self.passed)
    if self.tampered:
      return fail("tampered", f"the result channel was tampered with: {self.tampered}")
    if self.wrong[0]:
      return fail(*self.wrong)
    if ending.timed_out:
      return fail("timeout", f"timed out after {ending.timeout_s:g}s ({done})")
    if self.memory or ending.oom_killed:
      return fail("memory", self.memory or f"killed by the out-of-memory killer ({done})")
    if self.ended:
      return "pass", "pass", f"{self.passed} of {len(self.tests)} tests passed", self.passed
    if "signal" in status:
      name = _signal_name(status["signal"])
      cause = "timeout" if name == "SIGXCPU" else "crash"
      return fail(cause, f"the code's process was killed by {name} ({done})")
    if "exit" in status:
      return fail(
        "crash", f"the program exited (status {status['exit']}) before the tests finished ({done})"
      )
    return fail("crash", f"the sandbox's processes died after the code started ({done})")


def _signal_name(number: str) -> str:
  try:
    return signal.Signals(int(number)).name
  except ValueError:
    return f"signal {number}"
