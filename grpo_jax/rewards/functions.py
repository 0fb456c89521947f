"""Reward functions of (completion, answer) for the jsonl task's verifier option
(`tasks.jsonl`): "grpo_jax.rewards.functions:NAME" calls NAME(completion, answer) -> a
float in [0, 1] for every completion, in the reward processes. Your own go in a file of
yours ("my_reward.py:NAME"); these two are examples and common choices. An exception, or
a value that is not finite, makes the row unscorable."""

import fractions
import re

# A number as written: an optional sign, digits, and decimals after a point (the point
# of "A:12." ends the sentence, not the number).
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _last_number(text: str) -> fractions.Fraction | None:
  """The text's last number, exactly ("2.50" and "2.5", "007" and "7", "-0" and "0" are
  the same value), or None."""
  found = _NUMBER.findall(text)
  return fractions.Fraction(found[-1]) if found else None


def number(completion: str, answer: str) -> float:
  """1 when the completion's last number equals the answer's last number, whatever the
  text around it ("A:12." and "the sum is 12" both score 1 against "A:12."; "2.50"
  against "2.5" too)."""
  said, gold = _last_number(completion), _last_number(answer)
  return float(said is not None and gold is not None and said == gold)


def closeness(completion: str, answer: str) -> float:
  """Partial credit: 1 / (1 + |said − gold|) on the last numbers; 0 when none is said."""
  said, gold = _last_number(completion), _last_number(answer)
  if said is None or gold is None:
    return 0.0
  return float(1 / (1 + abs(said - gold)))
