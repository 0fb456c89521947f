"""Algorithm presets: ml-collections snippets for the `rl` block of a config.

    config.rl = presets.get("dapo")          # then override fields as usual
    presets.apply(config.rl, "dapo")         # or set its fields on a config's rl block
    rl_cfg = spec.RLConfig.from_dict(config.rl)

On the command line: `--config.rl.preset=dapo` (`cli`), applied before the other overrides.

Each preset sets only what defines the algorithm; everything else keeps RLConfig's
defaults. Learning rate, batch and group sizes belong to the experiment config; the
values the papers used are in each docstring. Sources are checked against public code
(RESEARCH.md §6).
"""

from __future__ import annotations

import ml_collections

from grpo_jax.infra import registry

REGISTRY = registry.Registry("algorithm preset")


def _cfg(**fields) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(fields)


@REGISTRY.register("grpo")
def grpo():
  """GRPO (DeepSeekMath, arXiv 2402.03300): A = (r - mean)/(std + eps) (ddof 1, as verl),
  PPO clip ε = 0.2, seq-mean-token-mean, k3 KL in the loss with β = 0.04.

  Paper: G = 64, lr 1e-6, one policy update per exploration stage.
  """
  return _cfg(
    advantage="grpo",
    policy_loss="ppo_clip",
    loss_hyper=dict(eps_low=0.2, eps_high=0.2),
    aggregation="seq_mean_token_mean",
    kl_estimator="k3",
    kl_coef=0.04,
    kl_in="loss",
  )


@REGISTRY.register("dr_grpo")
def dr_grpo():
  """Dr. GRPO (arXiv 2503.20783; sail-sg/understand-r1-zero): A = r - mean (no std),
  Σ_t ℓ / L_max per sequence then a mean (constant_norm), no KL, truncated outputs get
  reward 0. Recipe: G = 8, lr 1e-6, temperature 1, generate_max_length 3000."""
  return _cfg(
    advantage="dr_grpo",
    policy_loss="ppo_clip",
    aggregation="constant_norm",
    kl_coef=0.0,
    truncation="zero",
  )


@REGISTRY.register("dapo")
def dapo():
  """DAPO (arXiv 2503.14476; verl recipe/dapo): clip-higher ε_low 0.2 / ε_high 0.28,
  token-mean, dynamic sampling (drop zero-variance groups, refill up to 10 generation
  batches), soft overlong penalty with L_buf 4096 (the recipe's L_max = max_new_tokens is
  20480; a shorter run must lower overlong_buffer below its max_new_tokens), no KL.
  Recipe: G = 16, 512 prompts per batch, mini-batch 32 prompts (16 steps), lr 1e-6.
  """
  return _cfg(
    advantage="grpo",
    policy_loss="ppo_clip",
    loss_hyper=dict(eps_low=0.2, eps_high=0.28),
    aggregation="token_mean",
    kl_coef=0.0,
    dynamic_sampling=True,
    max_gen_batches=10,
    overlong_buffer=4096,
    overlong_factor=1.0,
  )


@REGISTRY.register("rloo")
def rloo():
  """RLOO (arXiv 2402.14740): leave-one-out baseline G/(G-1)(r - mean), PPO clip 0.2,
  token-mean, no KL in the loss (verl `rloo`)."""
  return _cfg(advantage="rloo", policy_loss="ppo_clip", aggregation="token_mean", kl_coef=0.0)


@REGISTRY.register("reinforce_pp")
def reinforce_pp():
  """REINFORCE++ (arXiv 2501.03262; verl `reinforce_plus_plus`): KL (k2 in OpenRLHF,
  β = 0.01 typical) folded into the token reward, discounted return γ = 1, global
  whitening, PPO clip 0.2, token-mean."""
  return _cfg(
    advantage="reinforce_pp",
    policy_loss="ppo_clip",
    aggregation="token_mean",
    kl_estimator="k2",
    kl_coef=0.01,
    kl_in="reward",
    advantage_hyper=dict(gamma=1.0),
  )


@REGISTRY.register("reinforce_pp_baseline")
def reinforce_pp_baseline():
  """REINFORCE++-baseline (arXiv 2501.03262; verl `reinforce_plus_plus_baseline`): group
  mean baseline then batch whitening; k3 KL in the loss (β = 0.001, verl default
  kl_loss_coef), PPO clip 0.2, token-mean."""
  return _cfg(
    advantage="reinforce_pp_baseline",
    policy_loss="ppo_clip",
    aggregation="token_mean",
    kl_estimator="k3",
    kl_coef=0.001,
    kl_in="loss",
  )


@REGISTRY.register("gspo")
def gspo():
  """GSPO (arXiv 2507.18071; verl `compute_policy_loss_gspo`, examples/gspo_trainer):
  sequence-level geometric-mean ratio with ε_low 3e-4 / ε_high 4e-4, seq-mean-token-mean,
  GRPO advantages, no KL."""
  return _cfg(
    advantage="grpo",
    policy_loss="gspo",
    loss_hyper=dict(eps_low=3e-4, eps_high=4e-4),
    aggregation="seq_mean_token_mean",
    kl_coef=0.0,
  )


@REGISTRY.register("positive_only")
def positive_only():
  """Positive-only arm (arXiv 2605.08666): GRPO with the tokens of negative-advantage
  rollouts removed from the loss (token mask), token-mean, no KL."""
  return _cfg(
    advantage="grpo",
    token_masks=("positive_only",),
    policy_loss="ppo_clip",
    aggregation="token_mean",
    kl_coef=0.0,
  )


def get(name: str) -> ml_collections.ConfigDict:
  """A fresh ConfigDict of the preset `name` (unknown names list the valid ones)."""
  return REGISTRY.get(name)()


def apply(rl_config, name: str) -> list[tuple[str, object, object]]:
  """Sets the preset `name`'s fields on a config's `rl` block (a ConfigDict, locked or
  not); returns (key, value before, preset's value) for each field it changed, a
  hyperparameter section's keys dotted ("loss_hyper.eps_high"): the section's other keys
  keep their values."""
  return _apply(rl_config, get(name), prefix="")


def _apply(node, preset, *, prefix: str) -> list[tuple[str, object, object]]:
  changes = []
  for key, value in preset.items():
    if isinstance(value, ml_collections.ConfigDict):
      changes += _apply(node[key], value, prefix=f"{prefix}{key}.")
      continue
    before = node[key]
    if before != value:
      changes.append((prefix + key, before, value))
    node[key] = value
  return changes
