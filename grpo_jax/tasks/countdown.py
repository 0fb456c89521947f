"""Countdown: reach a target from given numbers with + - * / and parentheses.

  prompt:     "N:3,7,25 T:82\n"
  completion: "A:25*3+7."       (then EOS)

Each given number must be used exactly once (``exact_use=False``: at most once).
Division is exact (rational); the value must equal the target. Completions are
parsed by ``tasks.expr`` and never evaluated as Python. A completion is one step, ended
by "." (`step_end_text`).

Perturbed prompts (`perturb`), each with the same numbers and target, ending in a newline:

  paraphrase: "N:7,25,3 T:82\n"                the numbers reordered: rotated left by
                                               one, or a permutation drawn from `rng`
                                               (rotated when it draws the original
                                               order); the same prompt only when all
                                               numbers are equal
  hint:       "N:3,7,25 T:82\nS:25*3=75;\n"    the reference's first operation worked out
  repair:     "N:3,7,25 T:82\nN:<attempt>\n"   a failed attempt shown as wrong ("N": no,
                                               after the numbers line), clipped to
                                               `max_attempt_chars` characters
"""

from __future__ import annotations

import collections
import re

import numpy as np

from grpo_jax.tasks import base, expr

_PROMPT = re.compile(r"^N:(\d+(?:,\d+)*) T:(\d+)\n$")
_ANSWER = re.compile(r"^A:([0-9+\-*/() ]+)\.$")
_FIRST_OP = re.compile(r"(\d+)([+\-*/])(\d+)")  # In a left-deep reference: its first step.


class Countdown(base.Task):
  name = "countdown"
  template_chars = frozenset("A:.")
  step_end_text = (".",)
  perturbations = base.PERTURBATIONS

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

  def _hint(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    """The first operation of the reference, which `_build` writes left-deep: its first
    two numbers with the operator between them (parentheses only open before them)."""
    m = _ANSWER.match(example.reference)
    first = _FIRST_OP.search(m.group(1)) if m else None
    if first is None:
      raise ValueError(f"countdown: no first step in the reference {example.reference!r}.")
    value, _ = expr.evaluate(first.group(0))
    return base.toy_prompt_line(example.prompt, "S", f"{first.group(0)}={value};")

  def _paraphrase(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    numbers, target = self.parse_prompt(example.prompt)
    order = [int(i) for i in rng.permutation(len(numbers))] if rng is not None else []
    reordered = [numbers[i] for i in order]
    if reordered in ([], numbers):
      reordered = numbers[1:] + numbers[:1]
    return f"N:{','.join(map(str, reordered))} T:{target}\n"

  def _repair(self, example: base.Example, attempt: str) -> str:
    return base.toy_prompt_line(example.prompt, "N", attempt)
