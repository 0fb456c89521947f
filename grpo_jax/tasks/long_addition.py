"""Long addition written out column by column: a multi-step task with a fixed template.

  prompt:     "Q:478+356\n"
  completion: "8+6+0=14;7+5+1=13;4+3+1=8;A:834."      (then EOS)

One step per column, from the least significant digit: "a_k+b_k+c_k=s_k;" with the
column's digits (0 past an operand's length), the carry in c_k (0 in the first column, then
the previous column's s // 10) and the column sum s_k. The answer line "A:<a+b>." ends it.

The reward is 1 only when every step is right and the answer is a + b, numbers written
without leading zeros: a wrong intermediate step makes the answer wrong even when the
final number happens to match (`check` says which step failed). `format_reward` is 1 when the completion follows the template (any
digits), so a format bonus can reward a well-formatted wrong answer.

Template vs reasoning, by construction: in a completion every digit is a reasoning token
(an operand digit, a carry, a sum or the answer) and every other character ("+", "=", ";",
"A", ":", ".") is a template token, fixed by the grammar. `template_mask` tags each
character of a completion from the parse (digits inside the grammar's number slots are
reasoning); for this grammar that is the same as tagging by character, which is what
`template_chars` tells the diagnostics (tested on every position of many completions).

Steps: each column's "...;" is one step (`step_end_text`), the answer "A:<sum>." the last.

Perturbed prompts (`perturb`), each asking for the same sum and ending in a newline:

  paraphrase: "Q:356+478\n"                  the operands swapped (its worked steps list
                                              each column's digits the other way round)
  hint:       "Q:478+356\nS:8+6+0=14;\n"     the first worked step (units column) given
  repair:     "Q:478+356\nN:<attempt>\n"     a failed attempt shown as wrong ("N": no),
                                              clipped to `max_completion_len` characters
"""

from __future__ import annotations

import re

import numpy as np

from grpo_jax.tasks import base

_PROMPT = re.compile(r"^Q:(\d+)\+(\d+)\n$")
_STEP = re.compile(r"(\d)\+(\d)\+(\d)=(\d{1,2});")
_FORMAT = re.compile(r"^(?:\d\+\d\+\d=\d{1,2};)+A:\d+\.$")
_ANSWER = re.compile(r"A:(\d+)\.$")
TEMPLATE_CHARS = frozenset("+=;A:.")  # The grammar's literal characters.
# Operand digits: 64 digits make a 644-character worked solution (long completions).
MAX_DIGITS = 64


def solution(a: int, b: int) -> str:
  """The worked completion of a + b (no EOS)."""
  da, db = str(a)[::-1], str(b)[::-1]
  steps, carry = [], 0
  for k in range(max(len(da), len(db))):
    x = int(da[k]) if k < len(da) else 0
    y = int(db[k]) if k < len(db) else 0
    s = x + y + carry
    steps.append(f"{x}+{y}+{carry}={s};")
    carry = s // 10
  return "".join(steps) + f"A:{a + b}."


def check(a: int, b: int, completion: str) -> str | None:
  """None when the completion is a correct worked solution of a + b, else why not."""
  if not _FORMAT.match(completion):
    return "does not follow the template"
  steps = _STEP.findall(completion)
  da, db = str(a)[::-1], str(b)[::-1]
  if len(steps) != max(len(da), len(db)):
    return f"{len(steps)} steps for {max(len(da), len(db))} columns"
  carry = 0
  for k, (x, y, c, s) in enumerate(steps):
    want_x = int(da[k]) if k < len(da) else 0
    want_y = int(db[k]) if k < len(db) else 0
    if (int(x), int(y)) != (want_x, want_y):
      return f"step {k}: digits {x},{y}; column {k} holds {want_x},{want_y}"
    if int(c) != carry:
      return f"step {k}: carry {c}, expected {carry}"
    if s != str(want_x + want_y + carry):  # Canonical: no leading zero ("=08").
      return f"step {k}: {x}+{y}+{c}={s} is wrong"
    carry = int(s) // 10
  answer = _ANSWER.search(completion).group(1)
  if answer != str(a + b):  # Canonical: no leading zero ("A:0834.").
    return f"answer {answer}, expected {a + b}"
  return None


def template_mask(completion: str) -> np.ndarray:
  """Per character: True for template, False for reasoning, from the grammar.

  A completion that follows the template is tagged from its parse: the characters inside
  number slots (operand digits, carry, sum, answer) are reasoning, the rest template. A
  completion that does not parse is tagged by the grammar's alphabet: its literal characters
  are template, anything else (digits, which only fill number slots, and characters
  foreign to the grammar) reasoning.
  """
  tags = np.array([ch in TEMPLATE_CHARS for ch in completion], bool)
  if not _FORMAT.match(completion):
    return tags
  parsed = np.ones(len(completion), bool)
  for m in _STEP.finditer(completion):
    for g in range(1, 5):
      parsed[m.start(g) : m.end(g)] = False
  m = _ANSWER.search(completion)
  parsed[m.start(1) : m.end(1)] = False
  return parsed


class LongAddition(base.Task):
  name = "long_addition"
  template_chars = TEMPLATE_CHARS
  step_end_text = (";",)
  perturbations = base.PERTURBATIONS

  def __init__(self, *, min_digits: int = 2, max_digits: int = 3, test_percent: int = 10):
    if not 1 <= min_digits <= max_digits <= MAX_DIGITS:
      raise ValueError(
        f"long_addition needs 1 <= min_digits <= max_digits <= {MAX_DIGITS}, got {min_digits}, "
        f"{max_digits}."
      )
    if not 0 < test_percent < 100:
      raise ValueError(f"test_percent must be in (0, 100), got {test_percent}.")
    self.min_digits, self.max_digits, self.test_percent = min_digits, max_digits, test_percent
    self.max_attempt_chars = self.max_completion_len()  # A repair shows a full-length attempt.

  def _operand(self, rng: np.random.Generator) -> int:
    return base.random_operand(rng, min_digits=self.min_digits, max_digits=self.max_digits)

  def _draw(self, rng):
    a, b = self._operand(rng), self._operand(rng)
    return f"{a}+{b}", base.Example(
      prompt=f"Q:{a}+{b}\n", reference=solution(a, b), answer=str(a + b)
    )

  def template_mask(self, completion: str) -> np.ndarray:
    return template_mask(completion)

  def max_completion_len(self) -> int:
    """Characters of the longest worked solution (without EOS)."""
    d = self.max_digits
    return d * len("9+9+1=19;") + len("A:.") + d + 1

  @staticmethod
  def operands(prompt: str) -> tuple[int, int]:
    m = _PROMPT.match(prompt)
    if not m:
      raise ValueError(f"Not a long_addition prompt: {prompt!r} (expected 'Q:<a>+<b>\\n').")
    return int(m.group(1)), int(m.group(2))

  def format_reward(self, prompt: str, completion: str) -> float:
    return float(_FORMAT.match(completion) is not None)

  def extract_answer(self, completion: str) -> str | None:
    """The integer of the final "A:<n>." (the steps before it not checked), or None."""
    m = _ANSWER.search(completion)
    return str(int(m.group(1))) if m else None

  def reward(self, prompt: str, completion: str) -> float:
    return float(check(*self.operands(prompt), completion) is None)

  def _hint(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    first_step = solution(*self.operands(example.prompt)).split(";")[0] + ";"
    return base.toy_prompt_line(example.prompt, "S", first_step)

  def _paraphrase(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    a, b = self.operands(example.prompt)
    return f"Q:{b}+{a}\n"

  def _repair(self, example: base.Example, attempt: str) -> str:
    return base.toy_prompt_line(example.prompt, "N", attempt)
