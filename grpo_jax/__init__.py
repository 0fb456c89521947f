"""grpo_jax: RL of language models from sequence-level rewards, in JAX.

The folders follow the data path (README, "Architecture"): `infra/` at the bottom, then
`models/`, `verifiers/`, `tasks/`, `rewards/`, `envs/`, `rl/` and `diagnostics/`, with the
trainer's modules (config, rollout, steps, train, ...) on top.
"""

from grpo_jax.infra import moved


def __getattr__(name: str):
  """`from grpo_jax import advantages` (0.1's flat path) -> grpo_jax.rl.advantages, with a
  DeprecationWarning; kept for one release."""
  return moved.resolve("grpo_jax", name, moved.MODULES, attribute=False, namespace=globals())
