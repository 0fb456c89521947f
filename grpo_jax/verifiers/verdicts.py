"""What a verifier says of one completion, and what a batch of scores carries:
`Unscorable` (raised, with an outcome label), `Labeled` (a reward with a label), the
`Scores` of a batch, the `SourceScores` of one reward source, and `RewardFailure` when
too many rows could not be scored.

The worker pool that produces `Scores` is `grpo_jax.verifiers.reward_pool`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Unscorable(Exception):  # noqa: N818 -- a verdict, not a bug.
  """Raised by a reward function for an item it cannot score (e.g. a math expression the
  verifier cannot decide): the item counts as a reward error, never as a wrong answer.
  ``label`` names the outcome (see ``Labeled``)."""

  def __init__(self, message: str = "", *, label: str = ""):
    super().__init__(message)
    self.label = label

  def __reduce__(self):
    return (_unscorable, (str(self), self.label))


def _unscorable(message: str, label: str) -> Unscorable:
  return Unscorable(message, label=label)


class Labeled(float):
  """A reward value with the task's name for its outcome, e.g. ``Labeled(0.0, "timeout")``:
  a float everywhere, counted per batch as ``reward/outcome/<label>``."""

  label: str

  def __new__(cls, value: float, label: str) -> Labeled:
    obj = super().__new__(cls, value)
    obj.label = label
    return obj

  def __reduce__(self):
    return (Labeled, (float(self), self.label))


class RewardFailure(RuntimeError):
  """The reward function failed on (nearly) every item: the run cannot learn from it."""


def check_failures(error_N, messages: Sequence[str], *, limit: float, where: str) -> None:
  """Raises RewardFailure when the fraction of failed items exceeds `limit` (in (0, 1]),
  naming where, how many, and the first failure's message."""
  error_N = np.asarray(error_N, bool)
  if error_N.size == 0 or error_N.mean() <= limit:
    return
  example = f" The first failure: {messages[0]}" if messages else ""
  raise RewardFailure(
    f"The reward function failed on {int(error_N.sum())} of {error_N.size} items ({where}), "
    f"more than max_unscorable_frac={limit:g}: training on the rest would be noise.{example} "
    "Fix the verifier (reward_workers=0 scores inline, with tracebacks) or the reward "
    "source the message names (config.rewards: a judge's base_url, timeout_s, retries), "
    "raise reward_timeout_s if the verifier timed out, or raise config.max_unscorable_frac."
  )


class RewardFn(Protocol):
  """The part of ``tasks.Task`` the pool uses."""

  def reward(self, prompt: str, completion: str) -> float: ...

  def format_reward(self, prompt: str, completion: str) -> float: ...


@dataclasses.dataclass(frozen=True)
class Scores:
  """Per-item scores, in input order. Failed items are 0 in correct_N and format_N."""

  correct_N: np.ndarray  # float32: task.reward.
  format_N: np.ndarray  # float32: task.format_reward.
  error_N: np.ndarray  # bool: raised, non-finite, timed out or killed its worker.
  timeout_N: np.ndarray  # bool: the subset of error_N that timed out.
  messages: list[str] = dataclasses.field(default_factory=list)  # What failed, per error.
  label_N: np.ndarray | None = None  # object: each item's outcome label ("" when none).
  # A `reward_sources.Mixture`'s: each named source's `SourceScores` (correct_N is their
  # weighted sum); None from the pool.
  parts: dict | None = None

  @property
  def errors(self) -> int:
    """Σ error_N: the ``reward_errors`` metric."""
    return int(self.error_N.sum())

  @property
  def timeouts(self) -> int:
    return int(self.timeout_N.sum())


@dataclasses.dataclass(frozen=True)
class SourceScores:
  """One named reward source's scores of a batch (`reward_sources`), in input order."""

  value_N: np.ndarray  # float32; 0 where error_N.
  error_N: np.ndarray  # bool: unscorable by this source.
  messages: list[str] = dataclasses.field(default_factory=list)  # What failed, per error.

  @classmethod
  def of(cls, values, errors, messages=()) -> SourceScores:
    error_N = np.asarray(errors, bool)
    value_N = np.where(error_N, 0.0, np.asarray(values, np.float32)).astype(np.float32)
    return cls(value_N, error_N, list(messages))
