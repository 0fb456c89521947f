"""Countdown: reach a target from given numbers with + - * / and parentheses.

  prompt:     "N:3,7,25 T:82\n"
  completion: "A:25*3+7."       (then EOS)

Each given number must be used exactly once (``exact_use=False``: at most once).
Division is exact (rational); the value must equal the target. Completions are
parsed by ``tasks.expr`` and never evaluated as Python.
"""

from __future__ import annotations

import collections
import re

from grpo_jax.tasks import base, expr

_PROMPT = re.compile(r"^N:(\d+(?:,\d+)*) T:(\d+)\n$")
_ANSWER = re.compile(r"^A:([0-9+\-*/() ]+)\.$")


class Countdown(base.Task):
  name = "countdown"
  template_chars = frozenset("A:.")

  def __init__(
    self,
    *,
    min_numbers: int = 3,
    max_numbers: int = 3,
    max_number: int = 20,
    max_target: int = 100,
    exact_use: bool = True,
    test_percent: int = 10,
  ):
    if not 2 <= min_numbers <= max_numbers <= 6:
      raise ValueError(
        f"countdown needs 2 <= min_numbers <= max_numbers <= 6, got {min_numbers}, {max_numbers}."
      )
    if max_number < 2 or max_target < 1:
      raise ValueError(
        f"countdown needs max_number >= 2 and max_target >= 1, got {max_number}, {max_target}."
      )
    self.min_numbers, self.max_numbers = min_numbers, max_numbers
    self.max_number, self.max_target, self.exact_use = max_number, max_target, exact_use
    self.test_percent = test_percent

  def _build(self, rng, numbers):
    """A left-deep expression over the numbers with positive integer intermediates."""
    value, text, low_prec = numbers[0], str(numbers[0]), False
    for n in numbers[1:]:
      ops = ["+", "*"] + ["-"] * int(value > n) + ["/"] * int(value % n == 0)
      op = ops[int(rng.integers(len(ops)))]
      if op in "*/" and low_prec:
        text = f"({text})"
      text += f"{op}{n}"
      value = {"+": value + n, "-": value - n, "*": value * n, "/": value // n}[op]
      low_prec = op in "+-"
    return value, text

  def _draw(self, rng):
    while True:
      count = int(rng.integers(self.min_numbers, self.max_numbers + 1))
      numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=count)]
      target, solution = self._build(rng, [int(x) for x in rng.permutation(numbers)])
      if 1 <= target <= self.max_target:
        break
    key = f"{sorted(numbers)}->{target}"
    prompt = f"N:{','.join(map(str, numbers))} T:{target}\n"
    return key, base.Example(prompt=prompt, reference=f"A:{solution}.", answer=str(target))

  @staticmethod
  def parse_prompt(prompt: str) -> tuple[list[int], int]:
    m = _PROMPT.match(prompt)
    if not m:
      raise ValueError(
        f"Not a countdown prompt: {prompt!r} (expected 'N:<n>,<n>,... T:<target>\\n')."
      )
    return [int(x) for x in m.group(1).split(",")], int(m.group(2))

  def _check(self, prompt: str, completion: str) -> tuple[bool, bool]:
    """(well formed, correct)."""
    m = _ANSWER.match(completion)
    if m is None:
      return False, False
    try:
      value, used = expr.evaluate(m.group(1))
    except expr.ExprError:
      return False, False
    numbers, target = self.parse_prompt(prompt)
    used_c, given_c = collections.Counter(used), collections.Counter(numbers)
    uses_ok = used_c == given_c if self.exact_use else not used_c - given_c
    return True, uses_ok and value == target

  def format_reward(self, prompt: str, completion: str) -> float:
    return float(self._check(prompt, completion)[0])

  def reward(self, prompt: str, completion: str) -> float:
    return float(self._check(prompt, completion)[1])
