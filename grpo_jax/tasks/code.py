"""Small Python function problems with hidden unit tests, rewarded by running the code in
`sandbox`.

    task = tasks.get("code")                                # the shipped problems
    task = tasks.get("code", problems="/data/mbpp.jsonl", unconvertible="skip",
                     tokenizer_dir="/models/Qwen2.5-0.5B-Instruct")

Problems. ``problems="builtin"`` (default) is the set shipped in
``grpo_jax/data/code_problems.jsonl``: 53 tiny functions, each with a description, a
signature, one or two visible tests (shown in the prompt), three or more hidden tests and
a reference solution (tests/tasks/test_code_task.py checks every reference passes its tests).
Or a JSONL file (split into train/test by a hash of the problem id, ``test_percent``), or
``{"train": path, "test": path}`` (the files are the splits), in one of three formats,
told apart by the first record's fields (``problem_format="auto"``) or named:

* "native": ``id, description, signature ("def add(a, b)"), solution, visible_tests,
  hidden_tests`` and optional ``prelude, setup`` (the shipped file's format);
* "mbpp" (MBPP's JSONL): ``task_id, text, code, test_list, test_setup_code``. The first
  ``visible_tests`` asserts of test_list are shown in the prompt; all of them are run.
  The entry point is the function defined in ``code`` that the first test calls.
  ``test_setup_code`` runs after the candidate's code (as in MBPP's own evaluation);
  ``challenge_test_list`` is not used;
* "humaneval": ``task_id, prompt, canonical_solution, test, entry_point``. The prompt (a
  stub with a docstring) is shown; the reference is prompt + canonical_solution; the
  prompt's imports run before the candidate's code. The tests are the statements
  ``assert candidate(...) == <literal>`` of ``def check(candidate)``, with ``candidate``
  renamed to the entry point; ``assert <constant>`` is ignored.

Tests must be ``assert <call> == <literal>`` (``sandbox.parse_test``): the expected value
is checked in the trainer's process and never reaches the sandbox. A test that is not of
that form (``math.isclose``, a loop, ``abs(...) < tol``, a non-literal expected value, a
name other than the entry point and builtins in a HumanEval test) is an error naming the
problem and the test (``unconvertible="raise"``, default), or is dropped
(``unconvertible="skip"``) and a problem left with no test is dropped too; the counts are
in ``data_notes()``.

Prompts. ``{description}\\n\\nYour code should pass these tests:\\n{visible tests}\\n\\n
Write the Python function `{signature}` in a ```python code block.`` With a Hugging Face
tokenizer (``tokenizer_dir``) it is the user turn of the chat template (after
``system_prompt``) with the generation prompt, or the text as is with ``chat=False``.
Without one the task uses a character tokenizer over printable ASCII, tab and newline
(``CODE_ALPHABET``; other characters in prompts and references become "?"), the prompt
ending in a newline. The reference completion (warm start) is the solution in a
```python block.

Extracting the code (``extract_code``) from a completion:
  1. Fenced blocks: a line starting with ``` opens a block (its tag is the word after the
     backticks), the next such line or the end of the text closes it. Blocks tagged
     python, py, python3, py3 or untagged are candidates, as is the code before the first
     fence (rule 2 applied to it). The last candidate that defines ``def <entry point>(``
     wins; if none does, the last fenced candidate; if there is none, rule 2.
  2. Unfenced text: from the first line that starts with def, async def, class, import,
     from or @, the lines up to the end; where they do not parse, the lines before the
     line Python's parser names in its error (dropping trailing prose), at most
     ``_MAX_RAW_PARSES`` times; kept if they define a function or class at the top level.
  3. Otherwise there is no code: verdict "no_code", reward 0.

Extraction is linear in the completion's length (each rule is one pass, rule 2 at most
``_MAX_RAW_PARSES`` parses; before round two it tried up to 400 endings, each a parse of
the whole text, twice per row), and ``reward`` and ``format_reward`` share one extraction
and one parse per completion (a small cache). It counts in the row's budget: the sandbox
gets what is left of ``timeout_s`` after it (``sandbox.run(spent_s=...)``), and a row whose
extraction alone used the budget is "fail" (timeout). A pool timeout on a code row
(``timeout_outcome``) is scored the same way, a 0 labelled "timeout", not an error: every
step of the reward is bounded by the row's budget, so only the completion can push it
past the pool's limit, and a policy must not escape its 0 by being slow to read.

Reward. ``reward_input(example)`` is ``example.answer``: a JSON string with the problem
id, entry point, tests (assert sources), prelude and setup; the tests travel to the
reward worker, not into the prompt. ``judge`` gives the verdict: "pass" (reward 1),
"fail" (wrong, reward 0: a wrong value, an exception, a timeout, a MemoryError, a crash
or a tampered result channel, whatever the code did to end: `sandbox`'s rule; also code
with a syntax error), "no_code" (reward 0), or "could_not_run" (the sandbox itself failed
before the code ran): ``reward`` raises ``verdicts.Unscorable`` for it, so the trainer
counts it in ``reward_errors``, apart from wrong answers. So failing loudly never beats
failing: a policy cannot opt out of a zero. ``outcome`` also gives the cause
(``OUTCOMES``: the sandbox's causes, "no_code" and "syntax"), which ``reward`` carries
(``verdicts.Labeled``) and the trainer logs as ``reward/outcome/<cause>``.
``format_reward`` is 1 when code can be extracted and parses.

Each call runs one sandbox (about 20 ms, see `sandbox`): ``timeout_s`` is a row's wall
budget. The trainer's ``reward_timeout_s`` must exceed it plus the interpreter's start
(``reward_budget_s``; checked when the config is built), so a slow answer is judged
"fail" (timeout) by the sandbox rather than killed, unscorable, by the pool.

Startup. The task checks the sandbox once when it is made (``sandbox.check``): with
``isolation`` "auto" or "namespaces" where Linux namespaces do not work, it refuses with
one line (``isolation="none"`` runs unisolated, trusted code only); ``data_notes()``
carries the line saying how code is contained. It also refuses to run when a problems
file would be readable inside the sandbox (``sandbox.visible``: e.g. a file under /usr).

Stream. ``example(split, i, seed=s)`` is the problem at position i of the split: the
train split shuffled per epoch (a permutation seeded by (seed, epoch)), the test split in
file order. A pure function of (split, i, seed), like every task.
"""

from __future__ import annotations

import ast
import builtins
import collections
import dataclasses
import functools
import importlib.resources
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from grpo_jax.infra import jsonl
from grpo_jax.models import tokenizers
from grpo_jax.tasks import base
from grpo_jax.verifiers import sandbox, verdicts

VERDICTS = ("pass", "fail", "could_not_run", "no_code")
# Why a completion got its reward (`outcome`): the sandbox's causes, and two of our own.
OUTCOMES = (*sandbox.CAUSES, "no_code", "syntax")
_START_S = 2.0  # The most an interpreter's start may add to a row's wall time.
FORMATS = ("auto", "native", "mbpp", "humaneval")
CODE_ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n\t"
_PYTHON_TAGS = ("", "python", "py", "python3", "py3")
_FENCE = re.compile(r"^[ \t]*```+[ \t]*([\w+-]*)")
_CODE_START = re.compile(r"^(def|async\s+def|class|import|from|@)\b")
_SIGNATURE = re.compile(r"^def\s+([A-Za-z_]\w*)\s*\(")
_MAX_RAW_PARSES = 4  # Rule 2 parses at most this many prefixes (each cut at the error).
_BUILTIN_NAMES = frozenset(dir(builtins))


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem. ``tests`` (visible + hidden) are what the reward runs."""

  id: str
  description: str
  signature: str  # "def add(a, b)": the function the tests call.
  solution: str  # A reference solution (the whole function, with its imports).
  visible_tests: tuple[str, ...]  # Asserts shown in the prompt.
  hidden_tests: tuple[str, ...]  # Asserts not shown.
  prelude: str = ""  # Runs before the candidate's code (e.g. HumanEval's imports).
  setup: str = ""  # Runs after it, before the tests (MBPP's test_setup_code).

  def __post_init__(self):
    if not _SIGNATURE.match(self.signature):
      raise ValueError(f"Problem {self.id!r}: signature {self.signature!r} is not 'def name(...)'.")
    if not self.tests:
      raise ValueError(f"Problem {self.id!r} has no tests.")
    for test in self.tests:
      try:
        sandbox.parse_test(test)
      except ValueError as e:
        raise ValueError(f"Problem {self.id!r}: {e}") from None
    for name in ("solution", "prelude", "setup"):
      try:
        ast.parse(getattr(self, name))
      except SyntaxError as e:
        raise ValueError(f"Problem {self.id!r}: its {name} is not valid Python: {e}.") from None

  @property
  def entry_point(self) -> str:
    return _SIGNATURE.match(self.signature).group(1)

  @property
  def tests(self) -> tuple[str, ...]:
    return self.visible_tests + self.hidden_tests

  def spec(self) -> str:
    """What the reward needs, as the JSON string `reward_input` returns."""
    return json.dumps(
      {
        "id": self.id,
        "entry_point": self.entry_point,
        "tests": list(self.tests),
        "prelude": self.prelude,
        "setup": self.setup,
      },
      sort_keys=True,
    )


# ---------------------------------------------------------------------------------------
# Loading problems.


@dataclasses.dataclass
class _Skips:
  """What ``unconvertible="skip"`` dropped."""

  tests: int = 0
  problems: int = 0


def detect_format(record: Mapping) -> str:
  """The format a record is in, from its fields; ValueError when it fits none."""
  fields = {
    "native": ("id", "description", "signature", "solution", "visible_tests", "hidden_tests"),
    "mbpp": ("task_id", "text", "code", "test_list"),
    "humaneval": ("task_id", "prompt", "canonical_solution", "test", "entry_point"),
  }
  for name, needed in fields.items():
    if all(f in record for f in needed):
      return name
  raise ValueError(
    f"Cannot tell the format of a problem with fields {sorted(record)}; expected those of "
    + "; ".join(f"{name}: {list(needed)}" for name, needed in fields.items())
    + "."
  )


def _missing(record: Mapping, fields: Sequence[str], *, where: str) -> None:
  absent = [f for f in fields if f not in record]
  if absent:
    raise ValueError(f"{where}: missing fields {absent} (has {sorted(record)}).")


def native_problem(record: Mapping, *, where: str) -> Problem:
  needed = ("id", "description", "signature", "solution", "visible_tests", "hidden_tests")
  _missing(record, needed, where=where)
  for name in ("visible_tests", "hidden_tests"):
    if not isinstance(record[name], list):
      raise ValueError(f"{where}: {name} must be a list of assert strings.")
  return Problem(
    id=str(record["id"]),
    description=str(record["description"]),
    signature=str(record["signature"]),
    solution=str(record["solution"]),
    visible_tests=tuple(record["visible_tests"]),
    hidden_tests=tuple(record["hidden_tests"]),
    prelude=str(record.get("prelude", "")),
    setup=str(record.get("setup", "")),
  )


def _convertible(tests: Iterable[str], *, where: str, skip: bool, skips: _Skips) -> list[str]:
  """The tests `sandbox.parse_test` accepts; the others raise or are counted."""
  kept = []
  for test in tests:
    try:
      sandbox.parse_test(test)
    except ValueError as e:
      if not skip:
        raise ValueError(f"{where}: {e} Pass unconvertible='skip' to drop such tests.") from None
      skips.tests += 1
      continue
    kept.append(test)
  return kept


def _functions(code: str) -> dict[str, ast.FunctionDef]:
  tree = ast.parse(code)
  return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _signature(node: ast.FunctionDef) -> str:
  returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
  return f"def {node.name}({ast.unparse(node.args)}){returns}"


def _called_names(source: str) -> list[str]:
  """Names of the functions a test calls by name, outermost first."""
  tree = ast.parse(source)
  return [
    n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
  ]


def mbpp_problem(
  record: Mapping, *, where: str, visible_tests: int, skip: bool, skips: _Skips
) -> Problem | None:
  """An MBPP record as a Problem (None when `skip` dropped all its tests)."""
  _missing(record, ("task_id", "text", "code", "test_list"), where=where)
  code = str(record["code"]).replace("\r\n", "\n")
  setup = str(record.get("test_setup_code") or "")
  tests = _convertible(record["test_list"], where=where, skip=skip, skips=skips)
  if not tests:
    skips.problems += 1
    return None
  try:
    functions = _functions(code)
  except SyntaxError as e:
    raise ValueError(f"{where}: its code is not valid Python: {e}.") from None
  entry = next((name for name in _called_names(tests[0]) if name in functions), None)
  if entry is None:
    if skip:
      skips.problems += 1
      return None
    raise ValueError(
      f"{where}: its first test {tests[0]!r} calls none of the functions its code defines "
      f"({sorted(functions)})."
    )
  return Problem(
    id=f"mbpp/{record['task_id']}",
    description=str(record["text"]).strip(),
    signature=_signature(functions[entry]),
    solution=code,
    visible_tests=tuple(tests[:visible_tests]),
    hidden_tests=tuple(tests[visible_tests:]),
    setup=setup,
  )


class _Rename(ast.NodeTransformer):
  def __init__(self, old: str, new: str):
    self.old, self.new = old, new

  def visit_Name(self, node: ast.Name) -> ast.Name:  # noqa: N802 -- ast's visitor naming.
    return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def humaneval_tests(test: str, *, entry_point: str, where: str, skip: bool, skips: _Skips):
  """The asserts of HumanEval's ``def check(candidate)`` as ``assert <entry>(...) == v``."""
  try:
    tree = ast.parse(test)
  except SyntaxError as e:
    raise ValueError(f"{where}: its test is not valid Python: {e}.") from None
  check = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
  if check is None or len(check.args.args) != 1:
    raise ValueError(f"{where}: its test has no 'def check(candidate):'.")
  param = check.args.args[0].arg
  tests = []
  for statement in check.body:
    if isinstance(statement, ast.Assert) and isinstance(statement.test, ast.Constant):
      continue  # `assert True, "..."`: a no-op.
    source = ast.unparse(_Rename(param, entry_point).visit(statement))
    problem = _humaneval_problem(statement, source, entry_point=entry_point)
    if problem:
      if not skip:
        raise ValueError(f"{where}: {problem} Pass unconvertible='skip' to drop such tests.")
      skips.tests += 1
      continue
    tests.append(source)
  return tests


def _humaneval_problem(statement: ast.stmt, source: str, *, entry_point: str) -> str:
  """Why a check() statement cannot be a test ("" when it can)."""
  if not isinstance(statement, ast.Assert):
    return f"the check statement {source[:200]!r} is not an assert."
  try:
    test = sandbox.parse_test(source)
  except ValueError as e:
    return str(e)
  names = {n.id for n in ast.walk(ast.parse(test.call)) if isinstance(n, ast.Name)}
  unknown = sorted(names - {entry_point} - _BUILTIN_NAMES)
  if unknown:
    return f"the test {source[:200]!r} uses names defined elsewhere in check(): {unknown}."
  return ""


def humaneval_problem(record: Mapping, *, where: str, skip: bool, skips: _Skips) -> Problem | None:
  """A HumanEval record as a Problem (None when `skip` dropped all its tests)."""
  needed = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
  _missing(record, needed, where=where)
  prompt, entry = str(record["prompt"]), str(record["entry_point"])
  tests = humaneval_tests(
    str(record["test"]), entry_point=entry, where=where, skip=skip, skips=skips
  )
  if not tests:
    if skip:
      skips.problems += 1
      return None
    raise ValueError(f"{where}: check() has no test of the form assert candidate(...) == value.")
  try:
    tree = ast.parse(prompt)
  except SyntaxError as e:
    raise ValueError(f"{where}: its prompt is not valid Python: {e}.") from None
  stub = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry), None)
  if stub is None:
    raise ValueError(f"{where}: its prompt does not define the entry point {entry!r}.")
  imports = [ast.unparse(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
  return Problem(
    id=str(record["task_id"]),
    description=f"Complete this Python function:\n```python\n{prompt.strip()}\n```",
    signature=_signature(stub),
    solution=prompt + str(record["canonical_solution"]),
    visible_tests=(),
    hidden_tests=tuple(tests),
    prelude="\n".join(imports),
  )


def load_problems(
  path: str, *, problem_format: str = "auto", visible_tests: int = 1, unconvertible: str = "raise"
) -> tuple[list[Problem], str]:
  """The problems of a JSONL file (or "builtin") and a note on what was loaded/skipped."""
  if problem_format not in FORMATS:
    raise ValueError(f"Unknown problem_format {problem_format!r}; valid: {FORMATS}.")
  if unconvertible not in ("raise", "skip"):
    raise ValueError(f"unconvertible must be 'raise' or 'skip', got {unconvertible!r}.")
  if path == "builtin":
    resource = importlib.resources.files("grpo_jax").joinpath("data", "code_problems.jsonl")
    with importlib.resources.as_file(resource) as file:
      records = jsonl.read(str(file))
  else:
    records = jsonl.read(path)
  if not records:
    raise ValueError(f"{path}: no problems.")
  fmt = detect_format(records[0]) if problem_format == "auto" else problem_format
  skip, skips, problems = unconvertible == "skip", _Skips(), []
  for number, record in enumerate(records, 1):
    where = f"{path}, problem {number} ({record.get('task_id', record.get('id', '?'))})"
    if fmt == "native":
      problem = native_problem(record, where=where)
    elif fmt == "mbpp":
      problem = mbpp_problem(
        record, where=where, visible_tests=visible_tests, skip=skip, skips=skips
      )
    else:
      problem = humaneval_problem(record, where=where, skip=skip, skips=skips)
    if problem is not None:
      problems.append(problem)
  repeated = sorted(i for i, n in collections.Counter(p.id for p in problems).items() if n > 1)
  if repeated:
    raise ValueError(f"{path}: problem ids repeat: {repeated}.")
  note = f"code: {len(problems)} {fmt} problems from {path}"
  if skips.tests or skips.problems:
    note += f" ({skips.tests} unconvertible tests and {skips.problems} problems skipped)"
  return problems, note


# ---------------------------------------------------------------------------------------
# Extracting code from a completion.


def fenced_blocks(text: str) -> list[tuple[str, str]]:
  """(tag, body) of each ``` block, in order; an unclosed last block runs to the end."""
  blocks, tag, body = [], None, []
  for line in text.split("\n"):
    fence = _FENCE.match(line)
    if tag is None:
      if fence:
        tag, body = fence.group(1).lower(), []
    elif fence:
      blocks.append((tag, "\n".join(body)))
      tag = None
    else:
      body.append(line)
  if tag is not None and body:
    blocks.append((tag, "\n".join(body)))
  return blocks


def _parse(code: str) -> tuple[ast.Module | None, int]:
  """(the module, 0), or (None, the line Python's parser blames: 0 when it names none)."""
  try:
    return ast.parse(code), 0
  except SyntaxError as e:
    return None, e.lineno or 0
  except (ValueError, MemoryError, RecursionError):
    return None, 0


@functools.lru_cache(maxsize=64)
def parses(code: str) -> bool:
  """Whether `code` parses (cached: the reward and the format reward ask of the same code)."""
  return _parse(code)[0] is not None


def code_in_text(text: str) -> str | None:
  """Rule 2: unfenced code in prose (None when there is none)."""
  lines = text.split("\n")
  start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
  if start is None:
    return None
  end = len(lines)
  for _ in range(_MAX_RAW_PARSES):
    code = "\n".join(lines[start:end]).strip("\n")
    tree, bad_line = _parse(code)
    if tree is not None:
      defines = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
      return code if any(isinstance(n, defines) for n in tree.body) else None
    if bad_line <= 1:  # Nothing before the error, or no line named.
      return None
    end = min(end, start + bad_line - 1)
  return None


def _defines(code: str, name: str) -> bool:
  return (
    re.search(rf"^[ \t]*(async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None
  )


@functools.lru_cache(maxsize=64)
def extract_code(completion: str, *, entry_point: str = "") -> str | None:
  """The code in a completion (the module docstring's rules), or None. Cached: the reward
  and the format reward of a row read the same completion."""
  lines = completion.split("\n")
  fenced = [body for tag, body in fenced_blocks(completion) if tag in _PYTHON_TAGS]
  if entry_point:
    for code in reversed(fenced):
      if _defines(code, entry_point):
        return code
  first_fence = next((i for i, line in enumerate(lines) if _FENCE.match(line)), len(lines))
  raw = code_in_text("\n".join(lines[:first_fence]))
  if raw and entry_point and _defines(raw, entry_point):
    return raw
  return fenced[-1] if fenced else raw


# ---------------------------------------------------------------------------------------
# The task.


@dataclasses.dataclass(frozen=True)
class Outcome:
  verdict: str  # One of VERDICTS.
  cause: str  # One of OUTCOMES.
  detail: str


@dataclasses.dataclass(frozen=True)
class _Spec:
  id: str
  entry_point: str
  tests: tuple[sandbox.Test, ...]
  prelude: str
  setup: str


@functools.lru_cache(maxsize=4096)
def _spec(reward_input: str) -> _Spec:
  """The parsed `reward_input` (each worker parses a problem's tests once)."""
  try:
    d = json.loads(reward_input)
    tests = tuple(sandbox.parse_test(t) for t in d["tests"])
    return _Spec(d["id"], d["entry_point"], tests, d.get("prelude", ""), d.get("setup", ""))
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(
      f"code: reward_input is not a problem spec from CodeTask.reward_input ({e}): "
      f"{reward_input[:200]!r}"
    ) from None


def _refuse_visible(source: str | Mapping[str, str]) -> None:
  """ValueError when a problems file (hidden tests, reference solutions) would be
  readable by the code in the sandbox."""
  if isinstance(source, Mapping):
    paths = list(source.values())
  elif source == "builtin":
    paths = [str(importlib.resources.files("grpo_jax") / "data" / "code_problems.jsonl")]
  else:
    paths = [source]
  for path in paths:
    if sandbox.visible(path):
      raise ValueError(
        f"code: the problems file {path!r} would be readable inside the sandbox (it sits in a "
        "directory the sandbox shows, e.g. /usr or the Python installation), so a candidate "
        "could read its hidden tests. Move it elsewhere (e.g. under your home or data "
        "directory)."
      )


def problem_text(problem: Problem) -> str:
  """The problem as the user sees it (before any chat template)."""
  parts = [problem.description.strip()]
  if problem.visible_tests:
    parts.append("Your code should pass these tests:\n" + "\n".join(problem.visible_tests))
  parts.append(f"Write the Python function `{problem.signature}` in a ```python code block.")
  return "\n\n".join(parts)


def to_alphabet(text: str, alphabet: str = CODE_ALPHABET) -> str:
  """`text` with characters outside `alphabet` replaced by "?"."""
  allowed = frozenset(alphabet)
  return "".join(ch if ch in allowed else "?" for ch in text)


class CodeTask(base.Task):
  """Python function problems scored by running hidden tests. See the module docstring."""

  name = "code"
  uses_hf_tokenizer = True  # The trainer passes config.hf_dir as tokenizer_dir.
  step_end_text = ("\n",)
  outcomes = OUTCOMES
  timeout_outcome = "timeout"  # A pool timeout is the completion's: a 0, not an error.

  def __init__(
    self,
    *,
    problems: str | Mapping[str, str] = "builtin",
    problem_format: str = "auto",
    tokenizer_dir: str = "",
    chat: bool = True,
    system_prompt: str = "",
    visible_tests: int = 1,
    unconvertible: str = "raise",
    test_percent: int = 25,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    isolation: str = "auto",
  ):
    if isinstance(problems, Mapping) and sorted(problems) != sorted(base.SPLITS):
      raise ValueError(
        f"problems as a dict needs exactly the keys {base.SPLITS}, got {sorted(problems)}."
      )
    if not 0 <= test_percent <= 100:
      raise ValueError(f"test_percent must be in [0, 100], got {test_percent}.")
    if visible_tests < 0:
      raise ValueError(f"visible_tests must be >= 0, got {visible_tests}.")
    if isolation not in sandbox.ISOLATIONS:
      raise ValueError(f"Unknown isolation {isolation!r}; valid: {sandbox.ISOLATIONS}.")
    if problem_format not in FORMATS:
      raise ValueError(f"Unknown problem_format {problem_format!r}; valid: {FORMATS}.")
    if unconvertible not in ("raise", "skip"):
      raise ValueError(f"unconvertible must be 'raise' or 'skip', got {unconvertible!r}.")
    self.problems_source = dict(problems) if isinstance(problems, Mapping) else str(problems)
    self.load_options = dict(
      problem_format=problem_format, visible_tests=visible_tests, unconvertible=unconvertible
    )
    self.tokenizer_dir = str(tokenizer_dir)
    self.chat = chat
    self.system_prompt = system_prompt
    self.test_percent = test_percent
    self.limits = sandbox.Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    self.isolation = isolation
    self.reward_budget_s = timeout_s + _START_S
    self._tokenizer = None
    self._splits: dict[str, list[Problem]] | None = None
    self._notes: list[str] = [sandbox.check(isolation)]
    if isolation != "none":
      _refuse_visible(self.problems_source)

  def __getstate__(self):  # Reward workers need the sandbox options only.
    return {**self.__dict__, "_tokenizer": None, "_splits": None, "_notes": []}

  # Problems and prompts.

  def split_problems(self, split: str) -> list[Problem]:
    """The split's problems, in file order (loaded on first use)."""
    if split not in base.SPLITS:
      raise ValueError(f"Unknown split {split!r}; valid splits: {base.SPLITS}.")
    if self._splits is None:
      self._splits = self._load()
    return self._splits[split]

  def _load(self) -> dict[str, list[Problem]]:
    if isinstance(self.problems_source, dict):
      splits = {}
      for split, path in self.problems_source.items():
        splits[split], note = load_problems(path, **self.load_options)
        self._notes.append(note)
      return splits
    problems, note = load_problems(self.problems_source, **self.load_options)
    self._notes.append(note)
    return {
      split: [p for p in problems if base.split_of(p.id, test_percent=self.test_percent) == split]
      for split in base.SPLITS
    }

  def data_notes(self) -> list[str]:
    return list(dict.fromkeys(self._notes))

  def tokenizer(self):
    if self._tokenizer is None:
      if self.tokenizer_dir:
        from grpo_jax.models import hf_tokenizer

        self._tokenizer = hf_tokenizer.load(self.tokenizer_dir)
      else:
        self._tokenizer = tokenizers.CharTokenizer(CODE_ALPHABET)
    return self._tokenizer

  def render(self, text: str) -> str:
    """The prompt for a problem's text: chat template, plain text, or the char alphabet."""
    if not self.tokenizer_dir:
      return to_alphabet(text) + "\n"
    if not self.chat:
      return text + "\n"
    return base.chat_prompt(self.tokenizer(), text, system=self.system_prompt)

  def example_of(self, problem: Problem) -> base.Example:
    reference = f"```python\n{problem.solution.strip()}\n```"
    if not self.tokenizer_dir:
      reference = to_alphabet(reference)
    return base.Example(
      prompt=self.render(problem_text(problem)), reference=reference, answer=problem.spec()
    )

  def example(self, split: str, index: int, *, seed: int) -> base.Example:
    problems = self.split_problems(split)
    if not problems:
      raise ValueError(
        f"code: the {split} split has no problems (test_percent={self.test_percent}, "
        f"{self.data_notes()})."
      )
    if index < 0:
      raise ValueError(f"code: index must be >= 0, got {index}.")
    epoch, position = divmod(index, len(problems))
    if split == "train":
      position = int(np.random.default_rng([seed, epoch]).permutation(len(problems))[position])
    return self.example_of(problems[position])

  def _draw(self, rng):
    raise NotImplementedError("CodeTask reads its problems from a file (see example).")

  # Rewards.

  def reward_input(self, example: base.Example) -> str:
    return example.answer

  def outcome(self, reward_input: str, completion: str) -> Outcome:
    """The verdict, its cause and why, for a completion of the problem in `reward_input`.
    Reading the completion counts in the row's budget (`sandbox.run`'s spent_s)."""
    start = time.monotonic()
    spec = _spec(reward_input)
    code = extract_code(completion, entry_point=spec.entry_point)
    if code is None:
      return Outcome("no_code", "no_code", "no Python code found in the completion")
    if not parses(code):
      return Outcome("fail", "syntax", "the code has a syntax error")
    result = sandbox.run(
      code,
      spec.tests,
      prelude=spec.prelude,
      setup=spec.setup,
      limits=self.limits,
      isolation=self.isolation,
      spent_s=time.monotonic() - start,
    )
    return Outcome(result.verdict, result.cause, result.detail)

  def judge(self, reward_input: str, completion: str) -> tuple[str, str]:
    """(verdict in VERDICTS, detail) for a completion of the problem in `reward_input`."""
    got = self.outcome(reward_input, completion)
    return got.verdict, got.detail

  def reward(self, prompt: str, completion: str) -> float:
    """`prompt` is the problem spec here (`reward_input`): 1.0 or 0.0 labelled with the
    outcome's cause. Raises verdicts.Unscorable when the tests could not run."""
    got = self.outcome(prompt, completion)
    if got.verdict == "could_not_run":
      message = f"code {_spec(prompt).id}: could not run the tests: {got.detail}"
      raise verdicts.Unscorable(message, label=got.cause)
    return verdicts.Labeled(1.0 if got.verdict == "pass" else 0.0, got.cause)

  def format_reward(self, prompt: str, completion: str) -> float:
    code = extract_code(completion, entry_point=_spec(prompt).entry_point)
    return float(code is not None and parses(code))
