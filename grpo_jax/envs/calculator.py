"""A calculator tool: the model calls it on sub-expressions, then states the answer.

  action "T:12+34="  ->  observation "46;"   (reward 0, the episode goes on)
  action "A:322."    ->  done, reward 1 if 322 is the example's answer, else 0

A turn ends at "=" (a tool call; `stop_text`) or at EOS (the answer). The tool evaluates
the call's expression with the safe parser `tasks.expr` (integers, + - * / and
parentheses, never `eval`): "?;" answers an expression it cannot read or whose value is
not an integer. Any other action ends the episode with reward 0. Problems and reference
transcripts come from the "calculator" task (`tasks.calculator`).
"""

from __future__ import annotations

import re

from grpo_jax.envs import base
from grpo_jax.tasks import expr

_CALL = re.compile(r"^T:(.+)=$")
_ANSWER = re.compile(r"^A:(-?\d+)\.$")


class Calculator(base.Environment):
  stop_text = ("=",)

  def __init__(self, *, tokenizer):
    super().__init__(tokenizer=tokenizer)
    self.answer = None

  def reset(self, example) -> list[int]:
    self.answer = int(example.answer)
    return []

  @staticmethod
  def calculate(expression: str) -> str:
    """The tool's answer text: "<value>;", or "?;" when it has no integer value."""
    try:
      value, _ = expr.evaluate(expression)
    except expr.ExprError:
      return "?;"
    return f"{value.numerator};" if value.denominator == 1 else "?;"

  def step(self, action: str) -> base.Step:
    text, reward, done = respond(action, self.answer)
    return base.Step(observation=self.encode_observation(text), reward=reward, done=done)


def respond(action: str, answer: int) -> tuple[str, float, bool]:
  """(observation text, reward, done) of one action on a problem whose value is `answer`:
  a tool call gets the tool's answer; anything else ends the episode, with reward 1 for
  the right answer line (the same rules served over OpenEnv: `openenv_calculator`)."""
  call = _CALL.match(action)
  if call:
    return Calculator.calculate(call.group(1)), 0.0, False
  said = _ANSWER.match(action)
  return "", float(said is not None and int(said.group(1)) == answer), True
