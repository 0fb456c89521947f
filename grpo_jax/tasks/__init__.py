"""Verifiable toy tasks, picked by name: ``tasks.get("arithmetic", max_digits=3)``."""

from grpo_jax import registry
from grpo_jax.tasks import arithmetic, countdown
from grpo_jax.tasks.base import SPLITS, TOY_ALPHABET, Example, Task, split_of

REGISTRY: registry.Registry[type[Task]] = registry.Registry("task")
REGISTRY.register("arithmetic")(arithmetic.Arithmetic)
REGISTRY.register("countdown")(countdown.Countdown)


def get(name: str, **kwargs) -> Task:
  """Builds the task registered as ``name`` with its keyword options."""
  return REGISTRY.get(name)(**kwargs)


__all__ = ["REGISTRY", "SPLITS", "TOY_ALPHABET", "Example", "Task", "get", "split_of"]
