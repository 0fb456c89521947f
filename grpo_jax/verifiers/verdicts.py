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


# ---------------------------------------------------------------------------------------
# Where unscorable rows fall. A row whose reward failed is masked from the loss, so a policy
# that can make its *wrong* answers unscorable escapes their 0 (the sandbox's round-two red
# team did it on 34 of 53 code problems). These measure the pattern and warn of it.

UNSCORABLE_EXTRA = ("timeout", "error", "other")


def unscorable_keys(vocabulary: Sequence[str]) -> tuple[str, ...]:
  """The names unscorable rows are counted under: the task's outcome labels, then
  "timeout" (the pool's limit), "error" (raised with no label), "other" (a label outside
  the vocabulary)."""
  return tuple(dict.fromkeys((*vocabulary, *UNSCORABLE_EXTRA)))


def unscorable_counts(vocabulary: Sequence[str], error_N, timeout_N, label_N) -> list[int]:
  """Unscorable rows per `unscorable_keys(vocabulary)` name."""
  keys = unscorable_keys(vocabulary)
  counts = dict.fromkeys(keys, 0)
  labels = list(label_N) if label_N is not None else [""] * len(error_N)
  for failed, timed_out, label in zip(np.asarray(error_N, bool), np.asarray(timeout_N), labels):
    if failed:
      key = (
        label if label in vocabulary else "timeout" if timed_out else "other" if label else "error"
      )
      counts[key] += 1
  return [counts[k] for k in keys]


def unscorable_failure_corr(correct_N, scorable_N, *, group_size: int) -> float:
  """Pearson's r across groups between u_g, the group's share of unscorable rows, and
  f_g = 1 − mean_i c_i over its scorable rows (groups with no scorable row left out); nan
  with fewer than 2 such groups or no variation. Where failures of the reward happen at
  random, r ≈ 0; where wrong answers turn into unscorable ones at rate κ, both u_g = κ·f
  and the scorable failure share f(1 − κ)/(1 − κf) grow with a group's true failure rate
  f, so r > 0. A signal to read beside reward/unscorable_frac, not a proof."""
  c_GK = np.asarray(correct_N, np.float64).reshape(-1, group_size)
  ok_GK = np.asarray(scorable_N, bool).reshape(-1, group_size)
  kept_G = ok_GK.any(axis=1)
  if kept_G.sum() < 2:
    return float("nan")
  u_G = 1.0 - ok_GK[kept_G].mean(axis=1)
  f_G = 1.0 - (c_GK * ok_GK)[kept_G].sum(axis=1) / ok_GK[kept_G].sum(axis=1)
  if u_G.std() == 0 or f_G.std() == 0:
    return float("nan")
  return float(np.corrcoef(u_G, f_G)[0, 1])


def unscorable_warning(metrics: dict, *, limit: float) -> str:
  """A one-line warning when the iteration's unscorable share passes `limit` ("" when
  not): how many, under which names, and the failure correlation."""
  frac = metrics.get("reward/unscorable_frac", 0.0)
  if not frac > limit:
    return ""
  prefix = "reward/unscorable/"
  parts = sorted(((v, k[len(prefix) :]) for k, v in metrics.items() if k.startswith(prefix)))
  named = ", ".join(f"{name} {v:.1%}" for v, name in parts[::-1] if v > 0)
  corr = metrics.get("reward/unscorable_failure_corr")
  across = (
    f"across groups the unscorable share correlates with the failure rate at r = {corr:.2f} "
    "(> 0 where unscorable rows concentrate where answers are wrong)"
    if corr is not None
    else "their correlation with the failure rate is undefined this iteration"
  )
  return (
    f"{frac:.1%} of this iteration's rows were unscorable (more than "
    f"warn_unscorable_frac={limit:g}): {named}. They are masked from the loss, so a policy "
    f"that makes wrong answers unscorable escapes their 0; {across}. Fix the reward "
    "(reward_workers=0 scores inline, with tracebacks) or score those rows."
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
