"""Multi-step arithmetic solved with a calculator tool: the task of the calculator
environment (`envs.calculator`).

  prompt:      "Q:7*(12+34)\n"
  transcript:  "T:12+34=46;T:7*46=322;A:322."        (then EOS)

The problem nests `steps` binary operations (+, *, and - when allowed) on 1-2 digit
operands, each step combining the value so far with a new operand on either side. The
reference transcript calls the tool "T:<a><op><b>=" once per step, innermost first, in
the problem's operand order; the tool answers "<value>;" (an observation, written by the
environment); "A:<value>." ends the episode. Every intermediate value is an integer in
[0, 10^6) (problems are redrawn otherwise), so the tool's parser (`expr`) reads them all.

`reward` checks the final answer line of a whole transcript against the problem's value
(the environment checks the same; a model that writes the tool's answers itself, with no
environment, is scored the same way). `format_reward`: the transcript follows the
grammar (any numbers).
"""

from __future__ import annotations

import re

import numpy as np

from grpo_jax.tasks import base, expr

_PROMPT = re.compile(r"^Q:([0-9+\-*()]+)\n$")
_FORMAT = re.compile(r"^(?:T:\d+[+\-*]\d+=\d+;)*A:\d+\.$")
_ANSWER = re.compile(r"A:(\d+)\.$")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAX_VALUE = 10**6


def _wrap(text: str) -> str:
  return text if text.isdigit() else f"({text})"


def draw(rng: np.random.Generator, *, steps: int, ops: str, max_digits: int):
  """(problem text, tool calls [(a, op, b, value)], value) of one problem whose
  intermediate values all lie in [0, MAX_VALUE)."""
  while True:
    value = base.random_operand(rng, min_digits=1, max_digits=max_digits)
    text, calls = str(value), []
    for _ in range(steps):
      op = ops[int(rng.integers(len(ops)))]
      x = base.random_operand(rng, min_digits=1, max_digits=max_digits)
      left = bool(rng.integers(2))  # The value so far on the left of the new operand.
      a, b = (value, x) if left else (x, value)
      new = _OPS[op](a, b)
      if not 0 <= new < MAX_VALUE:
        break
      text = f"{_wrap(text)}{op}{x}" if left else f"{x}{op}{_wrap(text)}"
      calls.append((a, op, b, new))
      value = new
    else:
      return text, calls, value


def transcript(calls) -> str:
  """The reference episode: one tool call and its answer per step, then the answer."""
  steps = "".join(f"T:{a}{op}{b}={v};" for a, op, b, v in calls)
  return f"{steps}A:{calls[-1][3]}."


class Calculator(base.Task):
  name = "calculator"
  template_chars = frozenset("T:=;A.")
  step_end_text = (";",)

  def __init__(
    self, *, steps: int = 2, ops: str = "+*", max_digits: int = 2, test_percent: int = 10
  ):
    if not 1 <= steps <= 4:
      raise ValueError(f"calculator steps={steps}: must be in [1, 4].")
    if not ops or set(ops) - set(_OPS):
      raise ValueError(f"calculator ops={ops!r}; allowed: a non-empty subset of {''.join(_OPS)!r}.")
    if not 1 <= max_digits <= 3:
      raise ValueError(f"calculator max_digits={max_digits}: must be in [1, 3].")
    if not 0 < test_percent < 100:
      raise ValueError(f"test_percent must be in (0, 100), got {test_percent}.")
    self.steps, self.ops, self.max_digits = steps, ops, max_digits
    self.test_percent = test_percent

  def _draw(self, rng):
    text, calls, value = draw(rng, steps=self.steps, ops=self.ops, max_digits=self.max_digits)
    example = base.Example(prompt=f"Q:{text}\n", reference=transcript(calls), answer=str(value))
    return text, example

  @staticmethod
  def solve(prompt: str) -> int:
    m = _PROMPT.match(prompt)
    if not m:
      raise ValueError(f"Not a calculator prompt: {prompt!r} (expected 'Q:<expression>\\n').")
    value, _ = expr.evaluate(m.group(1))
    return int(value)

  def format_reward(self, prompt: str, completion: str) -> float:
    return float(_FORMAT.match(completion) is not None)

  def reward(self, prompt: str, completion: str) -> float:
    m = _ANSWER.search(completion)
    return float(m is not None and int(m.group(1)) == self.solve(prompt))
