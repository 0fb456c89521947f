"""`rewards.functions`, the jsonl task's example verifiers ("grpo_jax.rewards.functions:NAME"):
the last number of the completion against the last number of the answer."""

import hypothesis
import hypothesis.strategies as st
import pytest

from grpo_jax.rewards import functions


@pytest.mark.parametrize(
  ("completion", "answer", "reward"),
  [
    ("A:12.", "A:12.", 1.0),
    ("the sum is 12", "A:12.", 1.0),  # Only the numbers count, not the text around them.
    ("3 + 9 = 12", "12", 1.0),  # The last number is the one said.
    ("12, no wait, 13", "12", 0.0),
    ("A:-4.", "-4", 1.0),  # A sign belongs to its number.
    ("A:4.", "-4", 0.0),
    ("no number", "12", 0.0),
    ("12", "no number", 0.0),  # An answer without a number scores nothing.
    ("A:2.5.", "3.5", 0.0),  # Decimals are part of the number (2.5 is not 3.5).
    ("A:2.50.", "2.5", 1.0),  # Values, not strings: 2.50 = 2.5, 007 = 7, -0 = 0.
    ("A:007.", "7", 1.0),
    ("A:-0.", "0", 1.0),
  ],
)
def test_number(completion, answer, reward):
  """1 exactly when the last numbers of completion and answer have the same value."""
  assert functions.number(completion, answer) == reward


@pytest.mark.parametrize(
  ("completion", "answer", "reward"),
  [
    ("A:12.", "12", 1.0),  # 1 / (1 + 0).
    ("A:10.", "12", 1 / 3),  # 1 / (1 + 2).
    ("A:-3.", "1", 0.2),  # 1 / (1 + 4).
    ("A:112.", "12", 1 / 101),
    ("nothing", "12", 0.0),
    ("12", "", 0.0),
    ("A:2.5.", "3.5", 0.5),  # 1 / (1 + 1): the decimals count.
    ("A:007.", "7", 1.0),
  ],
)
def test_closeness(completion, answer, reward):
  """1 / (1 + |said - gold|) on the last numbers, worked out in each comment."""
  assert functions.closeness(completion, answer) == pytest.approx(reward, rel=1e-12)


@hypothesis.given(st.integers(-(10**9), 10**9), st.integers(-(10**9), 10**9))
def test_closeness_is_one_exactly_when_number_is(said, gold):
  """For integers written plainly both score 1 together, and closeness lies in (0, 1]."""
  completion, answer = f"so A:{said}.", f"A:{gold}."
  close = functions.closeness(completion, answer)
  assert 0.0 < close <= 1.0
  assert (close == 1.0) == (functions.number(completion, answer) == 1.0) == (said == gold)
