"""Reward sources beyond a task's verifier: a Bradley-Terry reward model
(`reward_model`), HTTP and local LLM judges (`judges`, `local_judge`), and their weighted
mixture from `config.rewards` (`reward_sources`). The verifiers themselves, and the worker
pool that runs them, are in `grpo_jax.verifiers`.
"""

from grpo_jax.infra import moved


def __getattr__(name: str):
  """`rewards.RewardPool` and the rest of 0.1's `grpo_jax.rewards` module (now
  `grpo_jax.verifiers`) -> their module there, with a DeprecationWarning; kept for one
  release."""
  return moved.resolve(
    "grpo_jax.rewards", name, moved.REWARDS_NAMES, attribute=True, namespace=globals()
  )
