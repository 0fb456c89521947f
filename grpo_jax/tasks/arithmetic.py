"""Multi-digit arithmetic with a fixed answer template.

  prompt:     "Q:47+85\n"
  completion: "A:132."          (then EOS)

"A", ":" and "." are template tokens (the same in every rollout); the digits are
reasoning tokens. The diagnostics rely on having both.
"""

from __future__ import annotations

import re

import numpy as np

from grpo_jax.tasks import base

_PROMPT = re.compile(r"^Q:(\d+)([+\-*])(\d+)\n$")
_ANSWER = re.compile(r"^A:(-?\d+)\.$")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class Arithmetic(base.Task):
  name = "arithmetic"
  template_chars = frozenset("A:.")

  def __init__(
    self, *, min_digits: int = 1, max_digits: int = 2, ops: str = "+-", test_percent: int = 10
  ):
    if not 1 <= min_digits <= max_digits <= 9:
      raise ValueError(
        f"arithmetic needs 1 <= min_digits <= max_digits <= 9, got {min_digits}, {max_digits}."
      )
    if not ops or set(ops) - set(_OPS):
      raise ValueError(f"arithmetic ops={ops!r}; allowed: a non-empty subset of {''.join(_OPS)!r}.")
    if not 0 < test_percent < 100:
      raise ValueError(f"test_percent must be in (0, 100), got {test_percent}.")
    self.min_digits, self.max_digits, self.ops = min_digits, max_digits, ops
    self.test_percent = test_percent

  def _operand(self, rng: np.random.Generator) -> int:
    return base.random_operand(rng, min_digits=self.min_digits, max_digits=self.max_digits)

  def _draw(self, rng):
    a, b = self._operand(rng), self._operand(rng)
    op = self.ops[int(rng.integers(len(self.ops)))]
    answer = str(_OPS[op](a, b))
    return f"{a}{op}{b}", base.Example(
      prompt=f"Q:{a}{op}{b}\n", reference=f"A:{answer}.", answer=answer
    )

  @staticmethod
  def solve(prompt: str) -> int:
    m = _PROMPT.match(prompt)
    if not m:
      raise ValueError(f"Not an arithmetic prompt: {prompt!r} (expected 'Q:<a><op><b>\\n').")
    a, op, b = m.groups()
    return _OPS[op](int(a), int(b))

  def format_reward(self, prompt: str, completion: str) -> float:
    return float(_ANSWER.match(completion) is not None)

  def reward(self, prompt: str, completion: str) -> float:
    m = _ANSWER.match(completion)
    return float(m is not None and int(m.group(1)) == self.solve(prompt))
