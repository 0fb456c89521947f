"""Reward functions of (completion, answer) for the jsonl task's verifier option
(`tasks.jsonl`): "grpo_jax.rewards.functions:NAME" calls NAME(completion, answer) -> a
float in [0, 1] for every completion, in the reward processes. Your own go in a file of
yours ("my_reward.py:NAME"); these two are examples and common choices. An exception, or
a value that is not finite, makes the row unscorable."""

import re


def number(completion: str, answer: str) -> float:
  """1 when the completion's last number is the answer's last number, whatever the text
  around it ("A:12." and "the sum is 12" both score 1 against "A:12.")."""
  said, gold = re.findall(r"-?\d+", completion), re.findall(r"-?\d+", answer)
  return float(bool(said) and bool(gold) and said[-1] == gold[-1])


def closeness(completion: str, answer: str) -> float:
  """Partial credit: 1 / (1 + |said − gold|) on the last numbers; 0 when none is said."""
  said, gold = re.findall(r"-?\d+", completion), re.findall(r"-?\d+", answer)
  if not said or not gold:
    return 0.0
  return 1.0 / (1.0 + abs(int(said[-1]) - int(gold[-1])))
