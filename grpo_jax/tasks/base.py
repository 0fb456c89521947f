"""Verifiable task interface: a deterministic prompt stream, references and rewards."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
from collections.abc import Iterator

import numpy as np

from grpo_jax import tokenizers

SPLITS = ("train", "test")
# Every toy task writes prompts and completions in this alphabet, so one tokenizer
# (and one model) serves all of them.
TOY_ALPHABET = "0123456789+-*/()=?:,.; \nANQST"


def random_operand(rng: np.random.Generator, *, min_digits: int, max_digits: int) -> int:
  """A non-negative integer with a uniform digit count in [min_digits, max_digits], uniform
  among the numbers of that many digits (one digit: 0-9)."""
  digits = int(rng.integers(min_digits, max_digits + 1))
  low = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(low, 10**digits))


@dataclasses.dataclass(frozen=True)
class Example:
  prompt: str
  reference: str  # A correct completion (no EOS): the supervised warm-start target.
  answer: str  # The ground truth the reward checks against, for display.


def split_of(key: str, *, test_percent: int) -> str:
  """Train/test split by a stable hash of the problem, so splits are disjoint by construction."""
  h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
  return "test" if h % 100 < test_percent else "train"


class Task(abc.ABC):
  """A verifiable task. Subclasses draw problems and score completions.

  ``example(split, index, seed=s)`` is a pure function of its arguments, so a data
  stream position is one integer and resuming a run is exact.
  """

  name: str = ""
  test_percent: int = 10
  # Characters that are format/template (not reasoning) in completions; diagnostics use it.
  template_chars: frozenset[str] = frozenset()

  @abc.abstractmethod
  def _draw(self, rng: np.random.Generator) -> tuple[str, Example]:
    """Returns (problem key, example) for one random problem."""

  @abc.abstractmethod
  def reward(self, prompt: str, completion: str) -> float:
    """1.0 for a correct, well-formatted completion, else 0.0 (in [0, 1])."""

  @abc.abstractmethod
  def format_reward(self, prompt: str, completion: str) -> float:
    """1.0 if the completion follows the answer template, whether or not it is right."""

  def reward_input(self, example: Example) -> str:
    """What the trainer passes as `reward`'s first argument for a completion of
    `example`: the prompt (toy tasks parse the problem from it). Tasks whose prompt does
    not hold the answer (a dataset problem) return the ground truth instead."""
    return example.prompt

  def example(self, split: str, index: int, *, seed: int) -> Example:
    if split not in SPLITS:
      raise ValueError(f"Unknown split {split!r}; valid splits: {SPLITS}.")
    split_id = SPLITS.index(split)
    for attempt in range(10_000):
      key, ex = self._draw(np.random.default_rng([seed, split_id, index, attempt]))
      if split_of(key, test_percent=self.test_percent) == split:
        return ex
    raise RuntimeError(
      f"{self.name}: could not draw a {split} problem; is the problem space empty?"
    )

  def examples(self, split: str, *, seed: int, start: int = 0) -> Iterator[Example]:
    """Infinite deterministic stream: example(split, start), example(split, start + 1), ..."""
    index = start
    while True:
      yield self.example(split, index, seed=seed)
      index += 1

  def template_mask(self, completion: str) -> np.ndarray:
    """Per character of a completion: True for a template token, False for reasoning.
    By default from `template_chars`; tasks with a grammar tag from its parse."""
    return np.array([ch in self.template_chars for ch in completion], bool)

  def data_notes(self) -> list[str]:
    """Lines for the run's log about where the task's data came from (e.g. which dataset
    cache was built or reused); none for generated tasks."""
    return []

  def tokenizer(self) -> tokenizers.CharTokenizer:
    return tokenizers.CharTokenizer(TOY_ALPHABET)
