"""Multi-digit arithmetic with a fixed answer template.

  prompt:     "Q:47+85\n"
  completion: "A:132."          (then EOS)

"A", ":" and "." are template tokens (the same in every rollout); the digits are
reasoning tokens. The diagnostics rely on having both. A completion is one step, ended by
"." (`step_end_text`).

Perturbed prompts (`perturb`), each with the same value and ending in a newline:

  paraphrase: "Q:85+47\n"                 + and * commuted; a-b written "Q:-b+a\n"
  hint:       "Q:47+85\nS:7+5=12;\n"      the units digits' column worked out (the first
                                           step by hand; "S:3-5=-2;" for 43-15)
  repair:     "Q:47+85\nN:<attempt>\n"    a failed attempt shown as wrong ("N": no),
                                           clipped to `max_attempt_chars` characters
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
  step_end_text = (".",)
  perturbations = base.PERTURBATIONS

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
  def parse(prompt: str) -> tuple[int, str, int]:
    """(a, op, b) of a prompt "Q:<a><op><b>\\n"."""
    m = _PROMPT.match(prompt)
    if not m:
      raise ValueError(f"Not an arithmetic prompt: {prompt!r} (expected 'Q:<a><op><b>\\n').")
    a, op, b = m.groups()
    return int(a), op, int(b)

  @classmethod
  def solve(cls, prompt: str) -> int:
    a, op, b = cls.parse(prompt)
    return _OPS[op](a, b)

  def format_reward(self, prompt: str, completion: str) -> float:
    return float(_ANSWER.match(completion) is not None)

  def extract_answer(self, completion: str) -> str | None:
    """The integer of "A:<n>." ("A:07." -> "7"), or None."""
    m = _ANSWER.match(completion)
    return str(int(m.group(1))) if m else None

  def reward(self, prompt: str, completion: str) -> float:
    m = _ANSWER.match(completion)
    return float(m is not None and int(m.group(1)) == self.solve(prompt))

  def _hint(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    a, op, b = self.parse(example.prompt)
    x, y = a % 10, b % 10
    return base.toy_prompt_line(example.prompt, "S", f"{x}{op}{y}={_OPS[op](x, y)};")

  def _paraphrase(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    a, op, b = self.parse(example.prompt)
    return f"Q:-{b}+{a}\n" if op == "-" else f"Q:{b}{op}{a}\n"

  def _repair(self, example: base.Example, attempt: str) -> str:
    return base.toy_prompt_line(example.prompt, "N", attempt)
