"""`tasks.word_problems` without a real tokenizer: the chat template is a stand-in that
shows its messages, so the prompts, keys, splits, answers and rewards are checked by hand
here (tests/tasks/test_word_problems.py renders the same stories with a GGUF's tokenizer)."""

import pickle
import re

import pytest

from grpo_jax.models import hf_tokenizer
from grpo_jax.tasks import base, word_problems


class Template:
  """apply_chat_template as "role:content|...|<gen>"."""

  def apply_chat_template(self, messages, *, add_generation_prompt):
    assert add_generation_prompt
    return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|<gen>"


@pytest.fixture
def loads(monkeypatch):
  """The tokenizer directories `hf_tokenizer.load` was asked for; it returns a Template."""
  asked = []

  def load(directory):
    asked.append(directory)
    return Template()

  monkeypatch.setattr(hf_tokenizer, "load", load)
  return asked


def _value(key: str) -> int:
  """A key's arithmetic by hand: the start, then +b, -b or *bxc (adds b·c)."""
  total = int(re.match(r"\d+", key)[0])
  for op, b, c in re.findall(r"([+\-*])(\d+)(?:x(\d+))?", key[len(str(total)) :]):
    total += {"+": int(b), "-": -int(b), "*": int(b) * int(c or 0)}[op]
  return total


def _steps(key: str) -> list[tuple[str, int]]:
  """(operation, total before it) of each change of a key."""
  total, out = int(re.match(r"\d+", key)[0]), []
  for op, b, c in re.findall(r"([+\-*])(\d+)(?:x(\d+))?", key[len(str(total)) :]):
    out.append((op, total))
    total += {"+": int(b), "-": -int(b), "*": int(b) * int(c or 0)}[op]
  return out


def test_value_of_the_docstrings_story():
  """Mia: 14, buys 9, gives 6 -> 17; a bag step: 18 + 3·6 + 15 = 51."""
  assert _value("14+9-6") == 17 and _value("18*3x6+15") == 51


def test_render_is_the_user_turn_after_the_system_prompt(loads):
  """The template formats the question into the user turn, after the system prompt; the tokenizer
  loads once."""
  task = word_problems.WordProblems(tokenizer_dir="some/dir", system_prompt="Be brief.")
  assert task.render("How many?") == (
    "system:Be brief.|user:How many?\nPut the final answer in \\boxed{}.|<gen>"
  )
  bare = word_problems.WordProblems(tokenizer_dir="d", prompt_template="Q: {question}")
  assert bare.render("x") == "user:Q: x|<gen>"
  task.render("again")
  assert loads == ["some/dir", "d"]  # Loaded once per task, when first needed.


@pytest.mark.parametrize(("steps", "ops"), [(1, "+"), (2, "+-"), (3, "+-*"), (5, "-*")])
def test_examples_follow_their_key(loads, steps, ops):
  """The key holds the story's numbers in order and its operations, each from ops except
  a "-" on a total below 2, which becomes "+"; the answer is the key's value (never
  negative), the key hashes into the split asked for, and the reference boxes the
  answer."""
  task = word_problems.WordProblems(tokenizer_dir="d", steps=steps, ops=ops, max_value=30)
  for split in ("train", "test"):
    for i in range(30):
      key, ex = task.keyed_example(split, i, seed=4)
      question = ex.prompt.removeprefix("user:").split("\nPut the final", 1)[0]
      assert re.findall(r"\d+", question) == re.findall(r"\d+", key)
      assert len(re.findall(r"[+\-*]", key)) == steps
      for op, before in _steps(key):
        assert op in ops or (op == "+" and "-" in ops and before < 2), key
      assert ex.answer == str(_value(key)) and int(ex.answer) >= 0
      assert base.split_of(key, test_percent=10) == split
      assert ex.reference == f"The answer is \\boxed{{{ex.answer}}}."
      assert task.reward_input(ex) == ex.answer


def test_starts_and_changes_are_at_least_two(loads):
  """Plural nouns: the start and every +/- change lie in [2, max_value], a bag's factors
  in [2, 9]."""
  task = word_problems.WordProblems(tokenizer_dir="d", steps=4, ops="+-*", max_value=6)
  for i in range(50):
    key = task.problem_key("train", i, seed=0)
    numbers = [int(n) for n in re.findall(r"\d+", key)]
    assert 2 <= numbers[0] <= 6 and all(n >= 2 for n in numbers)
    assert all(2 <= int(b) <= 9 and 2 <= int(c) <= 9 for b, c in re.findall(r"\*(\d+)x(\d+)", key))


def test_rewards_and_extraction_need_no_tokenizer(loads):
  """Rewards and extraction read only the answer text, and never load the tokenizer."""
  task = word_problems.WordProblems(tokenizer_dir="d", verifier_backend="builtin")
  assert task.reward("17", "so she has \\boxed{17} stickers") == 1.0
  assert task.reward("17", "The answer is 18.") == 0.0
  assert task.format_reward("17", "The answer is 18.") == 1.0  # An answer is there.
  assert task.format_reward("17", "seventeen") == 0.0
  assert task.extract_answer("The answer is \\boxed{1 000}.") == "1000"  # Spaces go.
  assert task.extract_answer("no marker") is None
  assert loads == []


def test_a_pickled_task_leaves_its_tokenizer_behind(loads):
  """Reward workers get the task without the tokenizer, which loads again on use."""
  task = word_problems.WordProblems(tokenizer_dir="d", verifier_backend="builtin")
  task.render("q")
  copy = pickle.loads(pickle.dumps(task))
  assert copy._tokenizer is None and task._tokenizer is not None
  assert copy.reward("3", "\\boxed{3}") == 1.0 and copy.render("q") == task.render("q")
  assert loads == ["d", "d"]


def test_ops_must_not_repeat():
  """A repeated operation is refused like an unknown one."""
  with pytest.raises(ValueError, match=r"ops='\+\+'; allowed: a non-empty subset of '\+-\*'"):
    word_problems.WordProblems(tokenizer_dir="d", ops="++")
  assert word_problems.OPS == "+-*"
