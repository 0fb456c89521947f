"""The environment interface: what an environment of a multi-turn episode implements.

    class MyEnv(base.Environment):
      stop_text = ("=",)                       # one-token texts that end a turn, besides EOS
      step_budget_s = 10.0                     # the most seconds one step takes (None: unbounded)
      def reset(self, example): return ()      # observation tokens before the first action
      def step(self, action):
        return base.Step(observation=self.encode_observation(text), reward=..., done=...)

Register it (`envs.REGISTRY.register("my_env")(MyEnv)`) and name it in config.env.name;
the episode loop that runs it is `grpo_jax.envs.episodes`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Step:
  """What an environment returns for one action: observation tokens to put in the context
  (never trained), the step's reward, and whether the episode is over."""

  observation: tuple[int, ...] = ()
  reward: float = 0.0
  done: bool = False


class Environment(abc.ABC):
  """One episode's environment; a fresh instance per episode (`make_env()`).

  `stop_text`: texts, one token each, that end a turn besides EOS (e.g. "=" closing a
  tool call). The episode loop decodes each action's tokens to text; the environment
  encodes its own observations with the tokenizer it was built with.
  """

  stop_text: tuple[str, ...] = ()
  # The most seconds one `step` takes by design (e.g. its sandbox's timeout plus the
  # interpreter's start); a step past it ends its episode with "step_timeout" (`episodes`),
  # and with config.env.step_workers > 1 the trainer stops waiting for it there. A class or
  # instance attribute, read at each step. None: unbounded (a step that computes in this
  # process, like the calculator's).
  step_budget_s: float | None = None
  # The outcome labels `label` may take (e.g. the code environment's sandbox causes),
  # logged per batch as reward/outcome/<label>; () when the environment labels nothing.
  outcomes: tuple[str, ...] = ()

  def __init__(self, *, tokenizer):
    self.tokenizer = tokenizer
    self.label = ""  # The episode's outcome label, set by `step` (one of `outcomes`).
    # Set by the episode loop before each `step`: whether the action ended with an EOS id,
    # which is in the context but not in the action's text (a chat template's end of turn).
    self.action_eos = False

  @abc.abstractmethod
  def reset(self, example) -> Sequence[int]:
    """Starts an episode on a task example; returns observation tokens put in the context
    before the first action (may be empty)."""

  @abc.abstractmethod
  def step(self, action: str) -> Step:
    """One action (the text of the model's turn, its turn-end token included, EOS not).
    Steps of different episodes may run at once on worker threads (`episodes`): a step
    touches its own instance only (shared objects, like the tokenizer, read-only)."""

  @classmethod
  def reset_all(cls, envs: Sequence[Environment], examples: Sequence) -> list:
    """Each environment's `reset` on its example, in order: the observation tokens, or the
    exception it raised (not raised: the episode loop ends that episode). One by one here;
    an environment whose resets wait on a server overrides it to wait on all at once."""
    out = []
    for env, example in zip(envs, examples, strict=True):
      try:
        out.append(env.reset(example))
      except Exception as err:  # noqa: BLE001 -- returned: the loop decides what it means.
        out.append(err)
    return out

  @classmethod
  def turn_end_text(cls, kwargs: dict) -> tuple[str, ...]:
    """The one-token texts that end a turn for an environment built with `kwargs`
    (config.env.kwargs): `stop_text`, unless the environment takes them as an option."""
    del kwargs
    return tuple(cls.stop_text)

  @classmethod
  def check_task(cls, task) -> None:
    """Raises, in one line, when the environment cannot play `task`'s examples (one that
    reads fields only its own task's examples have); called once when the run is built.
    Any task by default."""
    del task

  def check(self) -> None:
    """Raises, in one line, when the environment cannot run at all (a server that does not
    answer): called once when the run is built. Nothing to check by default."""
    return

  def close(self) -> None:
    """Frees what the episode holds (a server session); called when its episode ends. A
    step after it is not made. Nothing to free by default."""
    return

  def encode_observation(self, text: str) -> tuple[int, ...]:
    """Observation tokens of `text`, with special-token text encoded as ordinary text: a
    tool's output that holds "<|im_end|>" or "<|eot_id|>" must not put an end-of-turn id
    in the model's context (it would end the turn, or cut the transcript there)."""
    return tuple(self.tokenizer.encode(text, special=False))


def stop_ids(env_cls: type[Environment], tokenizer, kwargs: dict | None = None) -> tuple[int, ...]:
  """Token ids that end a turn: EOS and the environment's one-token stop texts (for an
  environment built with `kwargs`: `Environment.turn_end_text`)."""
  ids = list(tokenizer.eos_ids)
  for text in env_cls.turn_end_text(kwargs or {}):
    got = tokenizer.encode(text)
    if len(got) != 1:
      raise ValueError(
        f"{env_cls.__name__}'s turn-end text {text!r} is {len(got)} tokens for this tokenizer; "
        "a turn-end text must be exactly one token."
      )
    ids.append(got[0])
  return tuple(sorted(set(ids)))
