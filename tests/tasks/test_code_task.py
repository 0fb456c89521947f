"""The code task: problems, loaders (shipped, MBPP, HumanEval), extraction and rewards."""

import json
import pathlib
import pickle
import time

import needs
import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.infra import jsonl
from grpo_jax.tasks import base, code
from grpo_jax.verifiers import reward_pool, sandbox, verdicts

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
MBPP = str(FIXTURES / "code" / "mbpp.jsonl")
HUMANEVAL = str(FIXTURES / "code" / "humaneval.jsonl")
QWEN2 = FIXTURES / "hf" / "qwen2"
ISOLATION = "namespaces" if not sandbox.namespaces_unavailable() else "none"


@pytest.fixture(scope="module")
def task():
  return tasks.get("code", isolation=ISOLATION)


def fenced(body: str) -> str:
  return f"Here is my solution.\n```python\n{body}\n```\nIt adds the numbers."


def add_spec(*tests: str) -> str:
  return code.Problem(
    id="add",
    description="Add.",
    signature="def add(a, b)",
    solution="def add(a, b):\n  return a + b\n",
    visible_tests=(),
    hidden_tests=tests or ("assert add(2, 3) == 5", "assert add(0, 0) == 0"),
  ).spec()


# ---------------------------------------------------------------------------------------
# The shipped problems.


def test_shipped_problems_are_well_formed():
  problems, note = code.load_problems("builtin")
  assert 30 <= len(problems) <= 60, note
  for p in problems:
    assert 1 <= len(p.visible_tests) <= 2 and len(p.hidden_tests) >= 3, p.id
    assert p.entry_point in p.solution and p.entry_point in p.signature
    assert not set(p.visible_tests) & set(p.hidden_tests), p.id


def test_every_shipped_reference_passes_its_own_tests(task):
  problems = task.split_problems("train") + task.split_problems("test")
  assert len(problems) == len(code.load_problems("builtin")[0])
  for problem in problems:
    ex = task.example_of(problem)
    assert task.judge(task.reward_input(ex), ex.reference) == (
      "pass",
      f"{len(problem.tests)} of {len(problem.tests)} tests passed",
    ), problem.id


def test_prompts_show_visible_tests_only_and_encode_with_the_char_tokenizer(task):
  tok = task.tokenizer()
  for split in base.SPLITS:
    for problem in task.split_problems(split):
      ex = task.example_of(problem)
      assert problem.signature in ex.prompt and ex.prompt.endswith("\n")
      assert all(t in ex.prompt for t in problem.visible_tests)
      assert not any(t in ex.prompt for t in problem.hidden_tests)
      assert tok.decode(tok.encode(ex.prompt + ex.reference)) == ex.prompt + ex.reference


def test_stream_is_pure_and_splits_are_disjoint(task):
  def ids(split, seed, n):
    return [json.loads(task.example(split, i, seed=seed).answer)["id"] for i in range(n)]

  train, test = task.split_problems("train"), task.split_problems("test")
  assert train and test
  assert not {p.id for p in train} & {p.id for p in test}
  for p in train + test:
    assert base.split_of(p.id, test_percent=task.test_percent) in ("train", "test")
  assert ids("train", 0, 10) == ids("train", 0, 10)
  assert ids("train", 0, 10) != ids("train", 1, 10)
  assert sorted(ids("train", 3, len(train))) == sorted(p.id for p in train)  # One epoch.
  assert ids("test", 7, len(test)) == [p.id for p in test]  # File order.
  fresh = tasks.get("code", isolation=ISOLATION)
  assert fresh.example("train", 5, seed=2) == task.example("train", 5, seed=2)


# ---------------------------------------------------------------------------------------
# Rewards.


def test_reward_is_one_for_passing_code_and_zero_for_wrong_code(task):
  spec = add_spec()
  assert task.reward(spec, fenced("def add(a, b):\n    return a + b")) == 1.0
  assert task.reward(spec, fenced("def add(a, b):\n    return a * b")) == 0.0
  assert task.judge(spec, fenced("def add(a, b):\n    return a * b"))[0] == "fail"


def test_a_timeout_is_a_zero_labelled_with_its_cause():
  slow = tasks.get("code", isolation=ISOLATION, timeout_s=1.0)
  completion = fenced("def add(a, b):\n    while True:\n        pass")
  assert slow.outcome(add_spec(), completion) == code.Outcome(
    "fail", "timeout", "timed out after 1s (0 of 2 tests done)"
  )
  reward = slow.reward(add_spec(), completion)
  assert (reward, reward.label) == (0.0, "timeout")
  assert slow.reward_budget_s == 1.0 + code._START_S


def test_outcomes_are_counted_per_batch():
  from grpo_jax.trainer import rollout

  vocab = ("pass", "wrong", "timeout")
  counts = rollout.outcome_counts(vocab, np.array(["pass", "wrong", "wrong", "odd", ""], object))
  assert counts == [1, 2, 0, 1]
  make = lambda n, outcomes: rollout.Scores(
    np.zeros(n), np.zeros(n), np.ones(n, bool), 0, 0, (), outcomes
  )
  got = rollout.outcome_metrics(vocab, [make(5, (1, 2, 0, 1)), make(3, (0, 0, 3, 0))])
  assert got == {
    "reward/outcome/pass": 1 / 8,
    "reward/outcome/wrong": 2 / 8,
    "reward/outcome/timeout": 3 / 8,
    "reward/outcome/other": 1 / 8,
  }
  assert rollout.outcome_metrics((), [make(5, ())]) == {}


def test_the_pools_timeout_must_exceed_the_tasks_budget():
  from grpo_jax.infra import config_lib
  from grpo_jax.trainer import build

  c = config_lib.load(str(ROOT / "configs" / "code_env.py") + ":tiny")
  with c.unlocked():
    c.task.kwargs.isolation = ISOLATION
  c.reward_timeout_s = 6.0  # The sandbox's 5 s + the interpreter's start: 7 s.
  with pytest.raises(config_lib.ConfigError, match="reward_timeout_s=6 must exceed") as e:
    build.build(c)
  assert "\n" not in str(e.value)
  c.reward_timeout_s = 8.0
  build.build(c)


def test_only_a_failing_sandbox_raises_unscorable(monkeypatch):
  from grpo_jax.verifiers.sandbox import runner

  task = tasks.get("code", isolation=ISOLATION)
  monkeypatch.setattr(runner, "namespaces_unavailable", lambda: "user namespaces are off")
  completion = fenced("def add(a, b):\n    return a + b")
  needs.require("namespaces", sandbox.namespaces_unavailable())  # The fallback never refuses.
  with pytest.raises(verdicts.Unscorable, match="could not run the tests: sandbox refused") as e:
    task.reward(add_spec(), completion)
  assert e.value.label == "sandbox"


def test_the_task_checks_the_sandbox_when_it_is_made(monkeypatch):
  from grpo_jax.verifiers.sandbox import runner

  monkeypatch.setattr(runner, "namespaces_unavailable", lambda: "user namespaces are off")
  monkeypatch.setattr(runner, "_PROBE_ATTEMPTS", 1)
  with pytest.raises(sandbox.Unavailable, match="isolation='auto' needs Linux namespaces"):
    tasks.get("code")
  monkeypatch.setattr(runner, "_WARNED", set())
  with pytest.warns(RuntimeWarning, match="isolation='none'"):
    notes = tasks.get("code", isolation="none").data_notes()
  assert notes[0].startswith("sandbox: isolation='none': untrusted code runs")


@pytest.mark.parametrize(
  "completion, verdict, fmt",
  [
    ("The answer is 5.", "no_code", 0.0),
    ("```text\nadd(2, 3) = 5\n```", "no_code", 0.0),
    ("hello", "no_code", 0.0),
    (fenced("def add(a, b):\n    return a +"), "fail", 0.0),  # Syntax error.
    (fenced("def add(a, b):\n    raise ValueError"), "fail", 1.0),
    (fenced("import os\nos._exit(0)"), "fail", 1.0),
    (fenced("def add(a, b):\n    return a + b"), "pass", 1.0),
  ],
)
def test_verdicts_and_format_reward(task, completion, verdict, fmt):
  spec = add_spec()
  assert task.judge(spec, completion)[0] == verdict
  assert task.format_reward(spec, completion) == fmt
  assert task.reward(spec, completion) == float(verdict == "pass")


def test_reward_in_the_trainers_reward_pool():
  task = tasks.get("code", isolation=ISOLATION, timeout_s=1.0)
  completions = [
    fenced("def add(a, b):\n    return a + b"),
    fenced("def add(a, b):\n    return 0"),
    fenced("import time\ntime.sleep(30)"),
    "no code here",
  ]
  with reward_pool.RewardPool(pickle.loads(pickle.dumps(task)), workers=1, timeout_s=20.0) as pool:
    scores = pool.score([add_spec()] * 4, completions)
  assert scores.correct_N.tolist() == [1.0, 0.0, 0.0, 0.0]
  assert scores.format_N.tolist() == [1.0, 1.0, 1.0, 0.0]
  assert not scores.error_N.any() and not scores.timeout_N.any()  # A timeout is a zero.
  assert scores.label_N.tolist() == ["pass", "wrong", "timeout", "no_code"]


def test_pickled_task_carries_no_problems_or_tokenizer(task):
  task.split_problems("train")
  state = pickle.loads(pickle.dumps(task)).__dict__
  assert state["_splits"] is None and state["_tokenizer"] is None
  assert len(pickle.dumps(task)) < 2000


def test_reward_input_must_be_a_spec(task):
  with pytest.raises(ValueError, match="reward_input is not a problem spec"):
    task.reward("What is 2 + 3?", "5")


# ---------------------------------------------------------------------------------------
# Extracting the code.


@pytest.mark.parametrize(
  "completion, expected",
  [
    ("```python\ndef add(a, b):\n    return a + b\n```", "def add(a, b):\n    return a + b"),
    ("```py\ndef add(a, b): return 1\n```", "def add(a, b): return 1"),
    ("```\ndef add(a, b): return 1\n```", "def add(a, b): return 1"),
    ("  ```Python  \ndef add(a, b): return 1\n  ```", "def add(a, b): return 1"),
    # The last block that defines the entry point, not a later usage example.
    (
      "```python\ndef add(a, b): return 1\n```\nUsage:\n```python\nprint(add(1, 2))\n```",
      "def add(a, b): return 1",
    ),
    # No block defines it: the last Python block.
    ("```python\nx = 1\n```\n```python\ny = 2\n```", "y = 2"),
    # Non-Python blocks are ignored.
    (
      "```bash\npython a.py\n```\n```python\ndef add(a, b): return 1\n```",
      "def add(a, b): return 1",
    ),
    # An unclosed block (the completion hit its length limit) runs to the end.
    ("Sure:\n```python\ndef add(a, b):\n    return a + b", "def add(a, b):\n    return a + b"),
    # Raw code, and raw code between prose.
    ("def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a + b"),
    (
      "Sure! Here it is:\nimport math\ndef add(a, b):\n    return a + b\nThis works because...",
      "import math\ndef add(a, b):\n    return a + b",
    ),
    # Code before a closing fence (the prompt opened the block).
    ("def add(a, b):\n    return a + b\n```\nDone.", "def add(a, b):\n    return a + b"),
    ("The answer is 5.", None),
    ("hello", None),
    ("x = add(2, 3)", None),  # Raw text must define a function or class.
    ("```text\nnothing\n```", None),
    ("", None),
  ],
)
def test_extract_code(completion, expected):
  assert code.extract_code(completion, entry_point="add") == expected


# ---------------------------------------------------------------------------------------
# Loaders.


def test_mbpp_fixture_loads_and_its_references_pass():
  task = tasks.get("code", problems=MBPP, test_percent=0, isolation=ISOLATION)
  problems = task.split_problems("train")
  assert [p.id for p in problems] == ["mbpp/901", "mbpp/902", "mbpp/903", "mbpp/904"]
  assert task.split_problems("test") == []
  by_id = {p.id: p for p in problems}
  assert by_id["mbpp/901"].signature == "def similar_elements(test_tup1, test_tup2)"
  assert by_id["mbpp/903"].setup == "data = [3, 1, 2]"
  assert by_id["mbpp/902"].tests == (  # challenge_test_list is not used.
    "assert is_not_prime(2) == False",
    "assert is_not_prime(10) == True",
    "assert is_not_prime(35) == True",
  )
  assert len(by_id["mbpp/902"].visible_tests) == 1
  for problem in problems:
    ex = task.example_of(problem)
    assert task.judge(ex.answer, ex.reference)[0] == "pass", problem.id
  assert task.data_notes()[1:] == [f"code: 4 mbpp problems from {MBPP}"]


def test_mbpp_setup_code_is_needed_by_its_tests():
  task = tasks.get("code", problems=MBPP, test_percent=0, isolation=ISOLATION)
  problem = next(p for p in task.split_problems("train") if p.id == "mbpp/903")
  spec = json.loads(task.example_of(problem).answer)
  assert spec["setup"] == "data = [3, 1, 2]"
  # The candidate must not sort in place: the setup's list is checked afterwards.
  in_place = fenced("def sorted_copy(items):\n    items.sort()\n    return items")
  assert task.judge(json.dumps(spec), in_place)[0] == "fail"


def test_humaneval_fixture_converts_what_it_can_and_counts_the_rest():
  task = tasks.get("code", problems=HUMANEVAL, test_percent=0, unconvertible="skip")
  problems = task.split_problems("train")
  assert [p.id for p in problems] == [f"HumanEvalFixture/{i}" for i in range(3)]
  first, second, third = problems
  assert first.prelude == "from typing import List"
  assert first.signature == "def below_threshold(numbers: List[int], threshold: int) -> bool"
  assert first.hidden_tests[0] == "assert below_threshold([1, 2, 4], 5) == True"
  assert second.hidden_tests == ("assert mean([1, 2, 3]) == 2.0", "assert mean([4]) == 4.0")
  assert third.hidden_tests[1] == "assert 0 == count_char('', 'x')"
  assert task.data_notes()[1:] == [
    f"code: 3 humaneval problems from {HUMANEVAL} (4 unconvertible tests and 0 problems skipped)"
  ]
  for problem in problems:
    ex = task.example_of(problem)
    assert "Complete this Python function" in ex.prompt
    assert task.judge(ex.answer, ex.reference)[0] == "pass", problem.id


def test_humaneval_unconvertible_tests_raise_by_default():
  with pytest.raises(ValueError, match=r"HumanEvalFixture/1\).*abs\(mean.*unconvertible='skip'"):
    code.load_problems(HUMANEVAL)


def write_jsonl(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def test_non_literal_expected_values_are_an_error_at_load_time(tmp_path):
  record = {
    "id": "p",
    "description": "d",
    "signature": "def f()",
    "solution": "def f():\n  return 1\n",
    "visible_tests": ["assert f() == 1"],
    "hidden_tests": ["assert f() == g()"],
  }
  with pytest.raises(
    ValueError, match=r"Problem 'p': Test 'assert f\(\) == g\(\)': neither side of == is a literal"
  ):
    code.load_problems(write_jsonl(tmp_path / "p.jsonl", [record]))


def test_mbpp_unconvertible_tests_raise_or_are_skipped(tmp_path):
  good = json.loads(pathlib.Path(MBPP).read_text().splitlines()[0])
  bad = {
    "task_id": 7,
    "text": "Circle area.",
    "code": "import math\ndef area(r):\n  return math.pi * r * r",
    "test_list": ["assert math.isclose(area(1), 3.14159, rel_tol=1e-4)"],
    "test_setup_code": "",
    "challenge_test_list": [],
  }
  path = write_jsonl(tmp_path / "mbpp.jsonl", [good, bad])
  with pytest.raises(ValueError, match=r"problem 2 \(7\).*isclose.*unconvertible='skip'"):
    code.load_problems(path)
  problems, note = code.load_problems(path, unconvertible="skip")
  assert [p.id for p in problems] == ["mbpp/901"]
  assert note.endswith("(1 unconvertible tests and 1 problems skipped)")


@pytest.mark.parametrize(
  "records, message",
  [
    ([{"question": "q"}], "Cannot tell the format of a problem with fields \\['question'\\]"),
    ([], "no problems"),
  ],
)
def test_bad_problem_files(tmp_path, records, message):
  with pytest.raises(ValueError, match=message):
    code.load_problems(write_jsonl(tmp_path / "x.jsonl", records))


def test_bad_json_line_is_named(tmp_path):
  path = tmp_path / "x.jsonl"
  path.write_text('{"id": 1}\n{not json\n')
  with pytest.raises(ValueError, match=r"x.jsonl:2: not valid JSON"):
    jsonl.read(str(path))


def test_explicit_split_files():
  task = tasks.get("code", problems={"train": MBPP, "test": HUMANEVAL}, unconvertible="skip")
  assert len(task.split_problems("train")) == 4 and len(task.split_problems("test")) == 3
  assert (
    task.example("test", 0, seed=0).answer == task.example_of(task.split_problems("test")[0]).answer
  )


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(problem_format="apps"), "Unknown problem_format 'apps'"),
    (dict(unconvertible="ignore"), "unconvertible must be 'raise' or 'skip'"),
    (dict(isolation="docker"), "Unknown isolation 'docker'"),
    (dict(problems={"train": MBPP}), "needs exactly the keys"),
    (dict(test_percent=101), "test_percent must be in"),
  ],
)
def test_bad_options(kwargs, message):
  with pytest.raises(ValueError, match=message):
    tasks.get("code", **kwargs)


def test_hf_tokenizer_renders_the_chat_template():
  task = tasks.get("code", tokenizer_dir=str(QWEN2), isolation=ISOLATION)
  ex = task.example("test", 0, seed=0)
  assert ex.prompt.startswith("<|im_start|>") and ex.prompt.endswith("<|im_start|>assistant\n")
  assert "Write the Python function" in ex.prompt
  plain = tasks.get("code", tokenizer_dir=str(QWEN2), chat=False)
  problem = plain.split_problems("test")[0]
  assert plain.example("test", 0, seed=0).prompt == code.problem_text(problem) + "\n"


# ---------------------------------------------------------------------------------------
# Work on a completion: linear, shared by the reward and the format reward, and counted in
# the row's budget (round two: a long completion plus a sleep made rows unscorable).


def _counting_parses(monkeypatch) -> list[int]:
  """Counts the parses extraction and the syntax check make (each is O(length))."""
  calls, real = [], code._parse
  monkeypatch.setattr(code, "_parse", lambda text: calls.append(len(text)) or real(text))
  for cached in (code.extract_code, code.parses):
    getattr(cached, "cache_clear", lambda: None)()
  return calls


def test_unfenced_extraction_parses_a_bounded_number_of_times(monkeypatch):
  calls = _counting_parses(monkeypatch)
  # Every prefix fails at its first line: before, rule 2 parsed 400 endings of the whole
  # text (about 4 s here for this completion, twice per row).
  completion = "def add(a, b:\n" + "x = 1\n" * 20_000
  assert code.extract_code(completion, entry_point="add") is None
  assert len(calls) <= 4  # code._MAX_RAW_PARSES (before: 400).
  calls.clear()
  prose = "Sure! Here it is:\nimport math\ndef add(a, b):\n    return a + b\n"
  tail = "This works because addition is commutative.\n" * 5_000
  assert code.extract_code(prose + tail, entry_point="add") == (
    "import math\ndef add(a, b):\n    return a + b"
  )
  assert len(calls) == 2  # The whole text, then the lines before the line it blames.


def test_the_reward_and_the_format_reward_share_one_extraction(monkeypatch):
  calls = _counting_parses(monkeypatch)
  task = tasks.get("code", isolation=ISOLATION)
  completion = fenced("def add(a, b):\n    return a + b") + "\n# pad" * 1000
  assert task.reward(add_spec(), completion) == 1.0
  assert task.format_reward(add_spec(), completion) == 1.0
  assert len(calls) == 1  # One parse of the extracted code for both calls.


def test_reading_the_completion_counts_in_the_rows_budget(monkeypatch):
  task = tasks.get("code", isolation=ISOLATION, timeout_s=3.0)
  real = code.extract_code

  def slow(completion, *, entry_point=""):
    time.sleep(2.2)  # A completion that takes long to read.
    return real(completion, entry_point=entry_point)

  monkeypatch.setattr(code, "extract_code", slow)
  sleepy = fenced("def add(a, b):\n    import time\n    time.sleep(1.0)\n    return a + b")
  start = time.monotonic()
  got = task.outcome(add_spec(), sleepy)  # Before: "pass" after 3.2 s (budget 3 s).
  assert (got.verdict, got.cause) == ("fail", "timeout"), got
  assert time.monotonic() - start < 3.0 + 1.0  # Within the budget and a kill's margin.

  def slower(completion, *, entry_point=""):
    time.sleep(3.1)
    return real(completion, entry_point=entry_point)

  monkeypatch.setattr(code, "extract_code", slower)
  got = task.outcome(add_spec(), fenced("def add(a, b):\n    return a + b"))
  assert (got.verdict, got.cause) == ("fail", "timeout") and "reading the completion" in got.detail


def test_a_pool_timeout_on_a_code_row_is_a_zero_not_unscorable():
  task = tasks.get("code", isolation=ISOLATION, timeout_s=5.0)
  completions = [fenced("import time\ntime.sleep(30)"), fenced("def add(a, b):\n    return a + b")]
  # The pool's limit below the task's own budget: the pool kills the worker mid-row.
  with reward_pool.RewardPool(task, workers=1, timeout_s=1.0) as pool:
    scores = pool.score([add_spec()] * 2, completions)
  assert scores.error_N.tolist() == [False, False]  # Before: [True, False] (unscorable).
  assert scores.correct_N.tolist() == [0.0, 1.0]
  assert scores.label_N.tolist() == ["timeout", "pass"]
