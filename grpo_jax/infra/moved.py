"""Where the flat modules of grpo_jax 0.1 went when the package got its folders, and the
deprecation shim that keeps the old spellings working for one release.

    from grpo_jax import advantages        # still works: grpo_jax.rl.advantages, with a
                                           # DeprecationWarning naming the new path
    from grpo_jax import rl; rl.RLConfig   # still works: grpo_jax.rl.spec.RLConfig

Hand-written because the moves are ours: a lazy module `__getattr__` (PEP 562) in the
package faces, so nothing is imported until an old name is asked for.
"""

from __future__ import annotations

import importlib
import warnings

# The release that removes the old spellings (tests/test_architecture.py fails once the
# package's version reaches it, so they are not kept by oversight).
REMOVED_IN = (0, 3)

# Old module `grpo_jax.<name>` -> its new dotted path.
MODULES = {
  **{
    m: f"grpo_jax.infra.{m}"
    for m in (
      "registry",
      "config_lib",
      "checkpoint",
      "distributed",
      "logs",
      "metrics",
      "trackers",
      "flops",
      "collapse",
    )
  },
  **{
    m: f"grpo_jax.models.{m}"
    for m in (
      "model",
      "quant",
      "hf",
      "gguf_import",
      "hf_tokenizer",
      "tokenizers",
      "sampling",
      "refill",
      "sharding",
      "logprobs",
      "frozen_base",
      "shapes",
    )
  },
  **{
    m: f"grpo_jax.rl.{m}"
    for m in (
      "advantages",
      "aggregation",
      "controllers",
      "groups",
      "ibpo",
      "importance",
      "losses",
      "masks",
      "planners",
      "presets",
      "reward_transforms",
      "alignment",
      "counterfactuals",
      "offpolicy",
    )
  },
  "dynamic_sampling": "grpo_jax.rollouts.dynamic_sampling",
  **{
    m: f"grpo_jax.rewards.{m}" for m in ("judges", "local_judge", "reward_model", "reward_sources")
  },
  "math_verify": "grpo_jax.verifiers.math_verify",
  "sandbox": "grpo_jax.verifiers.sandbox",
  "datasets": "grpo_jax.tasks.datasets",
  "episodes": "grpo_jax.envs.episodes",
  # 0.2's trainer modules at the package root, in grpo_jax/trainer/ since.
  **{
    m: f"grpo_jax.trainer.{m}"
    for m in (
      "build",
      "rollout",
      "pipeline",
      "warmstart",
      "heldout",
      "steps",
      "run_state",
      "train",
      "memory",
      "memory_advice",
      "aot",
      "abstract",
      "rm_train",
      "eval_command",
      "eval_figures",
    )
  },
  # Renamed in 0.2 by what they do (three names that sounded alike).
  "evaluation": "grpo_jax.trainer.heldout",
  "evaluate": "grpo_jax.trainer.eval_command",
  "benchmarks": "grpo_jax.trainer.eval_figures",
}

# Names of the old `grpo_jax.rl` module -> the module of grpo_jax.rl that holds them now.
RL_NAMES = {
  **dict.fromkeys(
    (
      "KL_PLACEMENTS",
      "UNSCORABLE_POLICIES",
      "RLConfig",
      "PrepareHyper",
      "StepHyper",
      "RolloutBatch",
      "TrainState",
      "init_state",
      "make_optimizer",
    ),
    "grpo_jax.rl.spec",
  ),
  **dict.fromkeys(
    (
      "PolicyLogProbs",
      "action_view",
      "rollout_logprobs",
      "shaped_rewards",
      "trained_rows",
      "compute_advantages",
      "estimator_metrics",
      "loss_mask",
      "prepare_metrics",
      "finish_prepare",
      "behaviour_correction",
      "prepare",
      "make_prepare",
    ),
    "grpo_jax.rl.preparation",
  ),
  **dict.fromkeys(
    (
      "token_terms",
      "length_buckets",
      "accumulate_gradients",
      "all_finite",
      "apply_if_finite",
      "train_step",
      "make_train_step",
      "gather",
      "make_plan_fn",
      "update",
      "make_update",
    ),
    "grpo_jax.rl.learner",
  ),
  **dict.fromkeys(("NonFiniteError", "count_nonfinite", "validate_batch"), "grpo_jax.rl.guards"),
}

# Names of the old `grpo_jax.rewards` module (the verifiers' pool) -> their new module.
REWARDS_NAMES = {
  **dict.fromkeys(
    (
      "Unscorable",
      "Labeled",
      "RewardFailure",
      "check_failures",
      "RewardFn",
      "Scores",
      "SourceScores",
    ),
    "grpo_jax.verifiers.verdicts",
  ),
  **dict.fromkeys(
    ("RewardPool", "default_start_method", "CHUNKS_PER_WORKER"), "grpo_jax.verifiers.reward_pool"
  ),
}


# 0.2's generation modules and names in rl/, now in rollouts/ (the same one release).
RL_MODULES = {"dynamic_sampling": "grpo_jax.rollouts.dynamic_sampling"}
COUNTERFACTUAL_NAMES = dict.fromkeys(
  (
    "eligible",
    "first_unique",
    "plan",
    "prefix_prompts",
    "sample_limited",
    "branch",
    "perturbed",
    "generate",
    "perturbed_prompts",
    "merge",
    "sample_rows",
  ),
  "grpo_jax.rollouts.counterfactuals",
)
OFFPOLICY_NAMES = dict.fromkeys(
  ("empty_rollouts", "finished", "restart_rows", "continue_rows"), "grpo_jax.rollouts.partial"
)

# Names of the old `grpo_jax.config` module that build the Setup -> grpo_jax.trainer.build.
CONFIG_NAMES = dict.fromkeys(
  ("Setup", "build", "plan_setup", "as_dict", "task_and_tokenizer", "model_config_of"),
  "grpo_jax.trainer.build",
)


def resolve(package: str, name: str, table: dict[str, str], *, attribute: bool, namespace: dict):
  """The object an old spelling `package.name` meant, with a DeprecationWarning that
  names its new home (once: the object is then kept in the package's `namespace`);
  AttributeError (as Python would raise) for any other name."""
  if name not in table:
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
  new = table[name]
  where = f"{new}.{name}" if attribute else new
  warnings.warn(
    f"{package}.{name} moved to {where}; the old path is kept for one release and removed in "
    f"{'.'.join(map(str, REMOVED_IN))}.",
    DeprecationWarning,
    stacklevel=3,
  )
  module = importlib.import_module(new)
  namespace[name] = getattr(module, name) if attribute else module
  return namespace[name]
