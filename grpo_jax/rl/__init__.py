"""The RL objective: advantage estimators, token masks, policy losses and KL, aggregation,
importance correction, mini-batch planners, controllers, presets and IBPO (one module
each), and the jitted objective built from them: `spec` (RLConfig, the hyperparameter
arrays, the batch and state pytrees), `preparation` (rollouts + rewards -> RolloutBatch),
`learner` (the train step and the update scan) and `guards` (host-side checks).
"""

from grpo_jax.infra import moved


def __getattr__(name: str):
  """`rl.RLConfig` and the rest of 0.1's `grpo_jax.rl` module -> their module here, and
  0.2's `rl.dynamic_sampling` -> grpo_jax.rollouts, with a DeprecationWarning; kept for
  one release."""
  if name in moved.RL_MODULES:
    return moved.resolve(
      "grpo_jax.rl", name, moved.RL_MODULES, attribute=False, namespace=globals()
    )
  return moved.resolve("grpo_jax.rl", name, moved.RL_NAMES, attribute=True, namespace=globals())
