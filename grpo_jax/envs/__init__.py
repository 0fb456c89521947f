"""Environments for multi-turn episodes (`episodes`), picked by name: config.env.name.

  env_cls = envs.get("calculator")
  env = env_cls(tokenizer=tok, **config.env.kwargs)      # one per episode

"calculator": a calculator tool for the "calculator" task's multi-step problems.
"code": run the code on the visible tests and revise, then answer (the "code" task).
"openenv": any OpenEnv server, one session per episode (`openenv_env`; the `openenv` extra).
"verifiers": a verifiers environment's own rollouts, one per episode, on the rows of task
  "vf:<env_id>" (`vf_env`; the `verifiers` extra).
"""

from grpo_jax.envs import calculator, code, openenv_env, vf_env
from grpo_jax.infra import registry

REGISTRY = registry.Registry("environment")
REGISTRY.register("calculator")(calculator.Calculator)
REGISTRY.register("code")(code.CodeRunner)
REGISTRY.register("openenv")(openenv_env.OpenEnv)
REGISTRY.register("verifiers")(vf_env.VfEnv)


def get(name: str):
  """The environment class registered as `name`."""
  return REGISTRY.get(name)


__all__ = ["REGISTRY", "get"]
