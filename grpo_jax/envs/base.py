"""The environment interface: what an environment of a multi-turn episode implements.

    class MyEnv(base.Environment):
      stop_text = ("=",)                       # one-token texts that end a turn, besides EOS
      def reset(self, example): return ()      # observation tokens before the first action
      def step(self, action): return base.Step(observation=..., reward=..., done=...)

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
  # The outcome labels `label` may take (e.g. the code environment's sandbox causes),
  # logged per batch as reward/outcome/<label>; () when the environment labels nothing.
  outcomes: tuple[str, ...] = ()

  def __init__(self, *, tokenizer):
    self.tokenizer = tokenizer
    self.label = ""  # The episode's outcome label, set by `step` (one of `outcomes`).

  @abc.abstractmethod
  def reset(self, example) -> Sequence[int]:
    """Starts an episode on a task example; returns observation tokens put in the context
    before the first action (may be empty)."""

  @abc.abstractmethod
  def step(self, action: str) -> Step:
    """One action (the text of the model's turn, its turn-end token included, EOS not)."""


def stop_ids(env_cls: type[Environment], tokenizer) -> tuple[int, ...]:
  """Token ids that end a turn: EOS and the environment's one-token stop texts."""
  ids = list(tokenizer.eos_ids)
  for text in env_cls.stop_text:
    got = tokenizer.encode(text)
    if len(got) != 1:
      raise ValueError(
        f"{env_cls.__name__}.stop_text {text!r} is {len(got)} tokens for this tokenizer; "
        "a turn-end text must be exactly one token."
      )
    ids.append(got[0])
  return tuple(sorted(set(ids)))
