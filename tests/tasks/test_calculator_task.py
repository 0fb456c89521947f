"""`tasks.calculator`: problems that nest binary operations, the reference transcript of
tool calls, and the two rewards. The environment that answers the calls is
tests/envs/test_episodes.py's."""

import re

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from grpo_jax.tasks import calculator


def test_transcript_of_the_docstrings_problem():
  """7*(12+34): 12+34 = 46 first, then 7*46 = 322."""
  calls = [(12, "+", 34, 46), (7, "*", 46, 322)]
  assert calculator.transcript(calls) == "T:12+34=46;T:7*46=322;A:322."


def _evaluate(text: str) -> int:
  """The problem's value by Python's own arithmetic (digits, + - *, parentheses only)."""
  assert re.fullmatch(r"[0-9+\-*()]+", text), text
  return eval(text)  # noqa: S307 -- checked above: an integer expression.


@hypothesis.given(
  st.integers(0, 2**32),
  st.integers(1, 4),
  st.sampled_from(["+", "*", "-", "+-*"]),
  st.integers(1, 3),
)
@hypothesis.settings(max_examples=150)
def test_a_drawn_problem_chains_its_calls_to_its_value(seed, steps, ops, max_digits):
  """One call per step, each a correct operation from ops; the first combines two drawn
  operands (at most max_digits digits), each later one the value so far with a drawn
  operand on either side; every value lies in [0, 10^6); the last is the problem's value,
  which its text evaluates to."""
  text, calls, value = calculator.draw(
    np.random.default_rng(seed), steps=steps, ops=ops, max_digits=max_digits
  )
  assert len(calls) == steps and calls[-1][3] == value == _evaluate(text)
  ops_of = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
  drawn = lambda x: 0 <= x < 10**max_digits
  for k, (a, op, b, v) in enumerate(calls):
    assert op in ops and ops_of[op](a, b) == v and 0 <= v < calculator.MAX_VALUE
    if k == 0:
      assert drawn(a) and drawn(b)
    else:
      prev = calls[k - 1][3]
      assert (a == prev and drawn(b)) or (b == prev and drawn(a))
  assert calculator.Calculator.solve(f"Q:{text}\n") == value


def test_an_example_is_prompt_transcript_and_answer():
  """An example's prompt is its key, its answer the key's value, its reference two calls that earn
  both rewards."""
  task = calculator.Calculator(steps=2, ops="+-*", max_digits=2)
  for i in range(20):
    key, ex = task.keyed_example("train", i, seed=1)
    assert ex.prompt == f"Q:{key}\n" and ex.answer == str(_evaluate(key))
    assert ex.reference.count("T:") == 2 and ex.reference.endswith(f"A:{ex.answer}.")
    assert (
      task.reward(ex.prompt, ex.reference) == task.format_reward(ex.prompt, ex.reference) == 1.0
    )


def test_solve():
  """The prompt's expression evaluated; anything but 'Q:<expression>\\n' is refused."""
  assert calculator.Calculator.solve("Q:7*(12+34)\n") == 322
  assert calculator.Calculator.solve("Q:(3-5)*2\n") == -4
  with pytest.raises(ValueError, match="Not a calculator prompt: '7\\+1'"):
    calculator.Calculator.solve("7+1")


@pytest.mark.parametrize(
  ("completion", "reward"),
  [
    ("T:12+34=46;T:7*46=322;A:322.", 1.0),
    ("A:322.", 1.0),  # Calls are not required.
    ("T:12+34=99;A:322.", 1.0),  # Only the answer is checked.
    ("A:321.", 0.0),
    ("A:322", 0.0),  # No closing period.
    ("A:322. more", 0.0),  # The answer ends the transcript.
    ("A:1.A:322.", 1.0),  # The last answer at the end counts.
  ],
)
def test_reward_checks_the_final_answer(completion, reward):
  """Against 7*(12+34) = 322: only the 'A:<n>.' that ends the completion counts."""
  assert calculator.Calculator().reward("Q:7*(12+34)\n", completion) == reward


@pytest.mark.parametrize(
  ("completion", "reward"),
  [
    ("T:12+34=46;T:7*46=322;A:322.", 1.0),
    ("T:1-2=5;A:0.", 1.0),  # Any numbers: the grammar only.
    ("A:322.", 1.0),
    ("T:12/34=0;A:0.", 0.0),  # Not an operation of the tool.
    ("T:(1+2)*3=9;A:9.", 0.0),  # One binary operation per call.
    ("T:1+2=3A:3.", 0.0),  # A call ends with ';'.
    ("A:-3.", 0.0),  # Answers are non-negative integers.
  ],
)
def test_format_reward_is_the_grammar(completion, reward):
  """Calls 'T:a<op>b=c;' (one binary + - * each), then 'A:<n>.', whatever the numbers."""
  assert calculator.Calculator().format_reward("Q:1+2\n", completion) == reward


@pytest.mark.parametrize(
  ("kwargs", "match"),
  [
    (dict(steps=0), r"steps=0: must be in \[1, 4\]"),
    (dict(steps=5), r"steps=5: must be in \[1, 4\]"),
    (dict(ops="+/"), r"ops='\+/'; allowed: a non-empty subset of '\+-\*'"),
    (dict(ops=""), "ops=''"),
    (dict(max_digits=4), r"max_digits=4: must be in \[1, 3\]"),
    (dict(test_percent=100), r"test_percent must be in \(0, 100\)"),
  ],
)
def test_bad_options(kwargs, match):
  """Each option out of range is refused, naming it."""
  with pytest.raises(ValueError, match=match):
    calculator.Calculator(**kwargs)


def test_template_characters_and_step_end():
  """In 'T:1+2=3;A:3.' the template characters T : = ; A . are marked; ';' ends a step."""
  task = calculator.Calculator()
  mask = task.template_mask("T:1+2=3;A:3.")
  assert "".join("x" if m else "." for m in mask) == "xx...x.xxx.x"
  assert task.step_end_text == (";",)
