"""The seed papers' remedies, each selected by name, on the multi-step long_addition task.

Command (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/remedies.py:tiny --workdir=/tmp/remedy_none
  grpo-jax --config=configs/remedies.py:query_preserved --workdir=/tmp/remedy_qp
  grpo-jax --config=configs/remedies.py:single_rollout_filter --workdir=/tmp/remedy_g1

Variants (all at the scale of configs/long_addition.py:tiny, 60 GRPO iterations, a few
minutes on a 2-core CPU):
  tiny: the setting the remedies address, without any: 4 mini-batches per rollout batch
    split at random (groups cut across optimizer steps), per-sequence length normalisation
    (seq_mean_token_mean) and PPO clip ε = 0.2. Each variant below changes one thing.
  query_preserved: rl.planner="query_preserved" (each group in one mini-batch; 2605.08666).
  reward_balanced: rl.planner="reward_balanced" (polarity balanced per mini-batch; 2605.08666).
  group_norm: rl.aggregation="group_token_mean" (a group-shared normaliser, 1/Σ_group L;
    2604.13088).
  fade: rl.advantage="fade" with the "fade_entropy" controller (2607.01490).
  optimal_token_baseline: rl.advantage="optimal_token_baseline" (per-token Weaver–Tao
    baseline; 2606.29238 / verl OTB).
  single_rollout_filter: G = 1 over 8× the prompts (equal rollouts), batch_mean_std
    advantages and negative_token_filter with the "prob" and "batch_shared" criteria
    (2606.17250).
  positive_only: the positive-only arm (rl.token_masks=("positive_only",); 2605.08666).
  ibpo: rl.advantage="ibpo" (the terminal reward against a leave-one-out prefix baseline
    from the group's trie, λ = rl.advantage_hyper.ibpo_lambda = 1; 2605.16302, no counterfactual rows).

Expected result: each variant trains and logs its remedy's own metrics (masked_frac/...,
m_S / m_F, lambda_f); what each does to accuracy, drift and cancellation at this scale is
measured with 3 seeds by `python experiments/reproduce.py` (docs/claims.md, "Seed claims,
reproduced"). Those measured figures, not this docstring, are the results.
"""

import importlib.util
import pathlib

# The base recipe is configs/long_addition.py, loaded by path: a config file is loaded by
# path too (--config=...), so its directory is not importable.
_BASE = importlib.util.spec_from_file_location(
  "_grpo_jax_config_long_addition", pathlib.Path(__file__).with_name("long_addition.py")
)
long_addition = importlib.util.module_from_spec(_BASE)
_BASE.loader.exec_module(long_addition)

REMEDIES = (
  "query_preserved",
  "reward_balanced",
  "group_norm",
  "fade",
  "optimal_token_baseline",
  "single_rollout_filter",
  "positive_only",
  "ibpo",
)


VARIANTS = ("tiny", *REMEDIES)


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/remedies.py variant {arg!r}; allowed: 'tiny' (no remedy), {', '.join(REMEDIES)}."
    )
  c = long_addition.get_config("tiny")
  c.update(iterations=60, eval_every=20)
  c.rl.update(num_minibatches=4, planner="random", aggregation="seq_mean_token_mean")
  if arg == "query_preserved":
    c.rl.planner = "query_preserved"
  elif arg == "reward_balanced":
    c.rl.planner = "reward_balanced"
  elif arg == "group_norm":
    c.rl.aggregation = "group_token_mean"
  elif arg == "fade":
    c.rl.update(advantage="fade", controller="fade_entropy")
  elif arg == "optimal_token_baseline":
    c.rl.advantage = "optimal_token_baseline"
  elif arg == "single_rollout_filter":
    c.sampler.group_size = 1
    c.prompts_per_step *= 8
    c.rl.update(advantage="batch_mean_std", token_masks=("negative_token_filter",))
    c.rl.mask_options = {"negative_token_filter": {"criteria": ("prob", "batch_shared")}}
  elif arg == "positive_only":
    c.rl.token_masks = ("positive_only",)
  elif arg == "ibpo":
    c.rl.advantage = "ibpo"
  return c
