"""Verifiable task interface: a deterministic prompt stream, references and rewards."""

from __future__ import annotations

import abc
import dataclasses
import hashlib
from collections.abc import Iterator

import numpy as np

from grpo_jax.models import tokenizers

SPLITS = ("train", "test")
# Every toy task writes prompts and completions in this alphabet, so one tokenizer
# (and one model) serves all of them.
TOY_ALPHABET = "0123456789+-*/()=?:,.; \nANQST"
# Counterfactual prompts q~ of a prompt q (IBPO): the same problem, with the same answer,
# asked another way. "hint": q with a true first step of the solution; "paraphrase": q
# reworded (e.g. operands commuted); "repair": q with a failed attempt shown as wrong.
PERTURBATIONS = ("hint", "paraphrase", "repair")


class PerturbationUnsupported(ValueError):
  """The task cannot build this kind of perturbed prompt (see `supported_perturbations`)."""


def check_perturbation(kind: str) -> None:
  if kind not in PERTURBATIONS:
    raise ValueError(f"Unknown perturbation {kind!r}; valid perturbations: {PERTURBATIONS}.")


def clip_attempt(attempt: str, *, max_chars: int) -> str:
  """The first `max_chars` characters of a failed attempt (a prompt stays bounded)."""
  return attempt[:max_chars]


def toy_line(text: str) -> str:
  """`text` as one line of the toy alphabet: newlines become spaces and characters
  outside TOY_ALPHABET become "?", so the line encodes and ends where the prompt says."""
  return "".join(" " if ch == "\n" else ch if ch in TOY_ALPHABET else "?" for ch in text)


def toy_prompt_line(prompt: str, tag: str, text: str) -> str:
  """A toy prompt (ending in a newline) with one more line `<tag>:<text>\n`: "S" for a
  hint step, "N" ("no") for a failed attempt shown as wrong."""
  return f"{prompt}{tag}:{toy_line(text)}\n"


def random_operand(rng: np.random.Generator, *, min_digits: int, max_digits: int) -> int:
  """A non-negative integer with a uniform digit count in [min_digits, max_digits], uniform
  among the numbers of that many digits (one digit: 0-9). Past 18 digits (int64's range)
  the digits are drawn one by one: a leading 1-9, then 0-9 each."""
  digits = int(rng.integers(min_digits, max_digits + 1))
  if digits > 18:
    lead, rest = int(rng.integers(1, 10)), rng.integers(0, 10, size=digits - 1)
    return int(str(lead) + "".join(str(int(d)) for d in rest))
  low = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(low, 10**digits))


@dataclasses.dataclass(frozen=True)
class Example:
  prompt: str
  reference: str  # A correct completion (no EOS): the supervised warm-start target.
  answer: str  # The ground truth the reward checks against, for display.


def chat_prompt(tokenizer, user: str, *, system: str = "") -> str:
  """The prompt text of one user turn (after a system turn when `system` is set) in the
  tokenizer's chat template, ending with the generation prompt: what a chat model is
  asked (the math, code, word_problems and jsonl tasks' prompts)."""
  messages = [{"role": "system", "content": system}] if system else []
  messages.append({"role": "user", "content": user})
  return tokenizer.apply_chat_template(messages, add_generation_prompt=True)


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
  # How the trainer splits a completion into steps (step-level edit distance): a step ends
  # after any of `step_end_text` (the text left after the last one is the final step), and
  # starts at each `step_start_text` when that is set (e.g. "Step " for "Step k:" lines).
  step_end_text: tuple[str, ...] = ("\n",)
  step_start_text: str = ""
  # The kinds of `perturb` this task builds (a subset of PERTURBATIONS, in that order).
  perturbations: tuple[str, ...] = ()
  # A repair prompt shows at most this many characters of the failed attempt (its head).
  max_attempt_chars: int = 64
  # The outcome labels `reward` may carry (`verdicts.Labeled`), logged per batch as
  # reward/outcome/<label>; () when the task labels nothing.
  outcomes: tuple[str, ...] = ()
  # The most seconds one reward call takes by design (e.g. a sandbox's timeout plus the
  # interpreter's start); the trainer's reward_timeout_s must exceed it. None: unbounded.
  reward_budget_s: float | None = None
  # The outcome label of a row the reward pool timed out (reward_timeout_s), when the
  # task's every step is bounded by its own budget so that only the completion can cause
  # one: such a row scores 0 with this label instead of being unscorable. "": unscorable.
  timeout_outcome: str = ""

  @abc.abstractmethod
  def _draw(self, rng: np.random.Generator) -> tuple[str, Example]:
    """Returns (problem key, example) for one random problem."""

  @abc.abstractmethod
  def reward(self, prompt: str, completion: str) -> float:
    """1.0 for a correct, well-formatted completion, else 0.0 (in [0, 1])."""

  @abc.abstractmethod
  def format_reward(self, prompt: str, completion: str) -> float:
    """1.0 if the completion follows the answer template, whether or not it is right."""

  def extract_answer(self, completion: str) -> str | None:
    """The final answer a completion states, normalised so equal answers compare equal
    (maj@k votes over these), or None when it states none. Tasks whose answers are not
    comparable strings (an expression, a program) keep this default: no answer, and
    maj@k is not reported for them."""
    del completion
    return None

  def reward_input(self, example: Example) -> str:
    """What the trainer passes as `reward`'s first argument for a completion of
    `example`: the prompt (toy tasks parse the problem from it). Tasks whose prompt does
    not hold the answer (a dataset problem) return the ground truth instead."""
    return example.prompt

  def example(self, split: str, index: int, *, seed: int) -> Example:
    return self.keyed_example(split, index, seed=seed)[1]

  def problem_key(self, split: str, index: int, *, seed: int) -> str:
    """The identity of example(split, index): two indices with one key are one problem drawn
    twice (an evaluation counts the distinct ones: eval/distinct_problems). A drawn
    problem's key is the one its split hashes; a task that reads its problems from a
    dataset (it overrides `example`) keys them by prompt."""
    return self.keyed_example(split, index, seed=seed)[0]

  def keyed_example(self, split: str, index: int, *, seed: int) -> tuple[str, Example]:
    """(problem_key, example) of one index, from one draw."""
    if type(self).example is not Task.example:
      ex = self.example(split, index, seed=seed)
      return ex.prompt, ex
    if split not in SPLITS:
      raise ValueError(f"Unknown split {split!r}; valid splits: {SPLITS}.")
    split_id = SPLITS.index(split)
    for attempt in range(10_000):
      key, ex = self._draw_for(split, np.random.default_rng([seed, split_id, index, attempt]))
      if split_of(key, test_percent=self.test_percent) == split:
        return key, ex
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

  def supported_perturbations(self) -> tuple[str, ...]:
    """The kinds `perturb` accepts; config code checks a requested kind against these."""
    return self.perturbations

  def perturb(
    self,
    example: Example,
    kind: str,
    *,
    attempt: str = "",
    rng: np.random.Generator | None = None,
  ) -> str:
    """The perturbed prompt q~ of `example` (kind in PERTURBATIONS): text of the same kind
    as `example.prompt`, which the sampler continues with a completion. It asks the same
    problem with the same answer, so a completion sampled under q~ is scored with
    `reward(reward_input(example), completion)`, the original example's reward.

    "repair" needs `attempt`, the failed completion's text (without EOS); it is shown
    clipped to `max_attempt_chars`. `rng` picks among rewordings where a task has several
    (the same rng state gives the same prompt); without it the choice is fixed.
    """
    check_perturbation(kind)
    if kind not in self.supported_perturbations():
      raise PerturbationUnsupported(
        f"Task {self.name!r} cannot build a {kind!r} perturbation; it supports "
        f"{self.supported_perturbations()}."
      )
    if kind == "repair":
      if not attempt:
        raise ValueError(f"Task {self.name!r}: a 'repair' perturbation needs a failed attempt.")
      return self._repair(example, clip_attempt(attempt, max_chars=self.max_attempt_chars))
    if kind == "hint":
      return self._hint(example, rng=rng)
    return self._paraphrase(example, rng=rng)

  def _hint(self, example: Example, *, rng: np.random.Generator | None) -> str:
    raise PerturbationUnsupported(f"Task {self.name!r} has no 'hint' perturbation.")

  def _paraphrase(self, example: Example, *, rng: np.random.Generator | None) -> str:
    raise PerturbationUnsupported(f"Task {self.name!r} has no 'paraphrase' perturbation.")

  def _repair(self, example: Example, attempt: str) -> str:
    raise PerturbationUnsupported(f"Task {self.name!r} has no 'repair' perturbation.")

  # --- A curriculum: state the trainer keeps and checkpoints (none by default) -------------

  def state(self) -> dict:
    """What the task's problem stream depends on beyond (split, index, seed): a curriculum's
    level. The trainer checkpoints it (RunState.task_state) and hands it back on resume
    (`load_state`), so a resumed stream is the one the run would have drawn. {}: none."""
    return {}

  def load_state(self, state: dict) -> None:
    """Restores `state()` (a resume); the default keeps nothing."""
    del state

  def observe(self, pass_rate, *, outcomes: tuple[int, ...] = ()) -> dict:
    """Called by the trainer once per iteration, after the batch's rewards and before any
    later prompt is drawn, with the batch's pass rate (the share of rows whose correctness
    reward is > 0, over every process; a device scalar: `float()` it to read it, so a task
    without a curriculum costs no transfer) and its rows per outcome label (`outcomes`,
    then "other": host counts over every process; () when the task labels none). Returns
    metrics to log ({} by default)."""
    del pass_rate, outcomes
    return {}

  def hardest(self) -> Task | None:
    """The task as the hardest problems its state can reach would draw them (a curriculum
    at its top level), for the start-up check of prompt lengths; None: no state."""
    return None

  def _draw_for(self, split: str, rng: np.random.Generator) -> tuple[str, Example]:
    """`_draw` for a split (a task may draw its held-out problems otherwise: a curriculum's
    fixed evaluation level)."""
    del split
    return self._draw(rng)

  def data_notes(self) -> list[str]:
    """Lines for the run's log about where the task's data came from (e.g. which dataset
    cache was built or reused); none for generated tasks."""
    return []

  def tokenizer(self) -> tokenizers.CharTokenizer:
    return tokenizers.CharTokenizer(TOY_ALPHABET)
