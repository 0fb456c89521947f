"""One definition per metric name. Every metric the RL step emits is defined here.

Notation: m the loss mask (completion tokens that survive the token masks), v the valid
completion mask, A the token advantage, ā_i its row mean, ρ the policy ratio, w the
aggregation weights, π_θ the current policy, π_old the rollout policy, π_ref the
reference. "mean over tokens" = Σ m·x / Σ m over the mini-batch (step metrics) or the
rollout batch (rollout metrics). Names with `<x>` are patterns.
"""

from __future__ import annotations

DEFINITIONS = {
  # --- train_step, per mini-batch --------------------------------------------------
  "loss": "Σ w·ℓ, the minimised objective of the mini-batch (policy loss + β·KL − c_H·H).",
  "pg_loss": "Σ w·ℓ^pg, the policy-loss part of `loss`.",
  "pg_clipfrac": "Fraction of loss tokens whose clipped branch binds (clip_high or clip_low).",
  "pg_clipfrac_high": "Among loss tokens with A > 0, the fraction with ρ > 1 + ε_high (clipped).",
  "pg_clipfrac_low": "Among loss tokens with A < 0, the fraction with ρ < 1 − ε_low (clipped).",
  "dual_clipfrac": "Among loss tokens with A < 0, the fraction where the dual clip −A·c binds.",
  "ppo_kl": "Mean over loss tokens of log π_old − log π_θ (k1 of π_old vs π_θ on π_old's samples).",
  "kl_ref/<estimator>": "Mean over loss tokens of the named KL estimator of log π_θ − log π_ref.",
  "entropy": "Mean over loss tokens of the current policy's entropy H = −Σ_v π_θ log π_θ.",
  "ratio_mean": "Mean over loss tokens of the policy loss's ratio ρ (GSPO: the sequence ratio).",
  "loss_tokens": "Number of loss tokens (Σ m) in the mini-batch.",
  "grad_norm": "Global L2 norm of the accumulated gradient, before any clipping.",
  # --- prepare, per rollout batch ----------------------------------------------------
  "adv_mean": "Mean of A over valid completion tokens.",
  "adv_std": "Std (ddof 0) of A over valid completion tokens.",
  "adv_min": "Min of A over valid completion tokens.",
  "adv_max": "Max of A over valid completion tokens.",
  "adv_pos_frac": "Fraction of rows with ā > 0.",
  "adv_neg_frac": "Fraction of rows with ā < 0.",
  "m_S": "Positive gradient mass (1/B) Σ_i max(ā_i, 0) (FADE, arXiv 2607.01490).",
  "m_F": "Negative gradient mass (1/B) Σ_i max(−ā_i, 0) (FADE, arXiv 2607.01490).",
  "reward_mean": "Mean shaped reward r_i over rows.",
  "pass_rate": "Fraction of rows whose correctness reward c_i is > 0 (before shaping).",
  "zero_var_groups": "Fraction of groups whose correctness rewards c_i are all equal.",
  "all_zero_groups": "Fraction of groups whose correctness rewards are all 0.",
  "all_one_groups": "Fraction of groups whose correctness rewards are all 1.",
  "masked_frac": "Fraction of valid completion tokens removed by all token masks together.",
  "masked_frac/<mask>": "Fraction of valid completion tokens the named mask removes on its own.",
  "rollout_entropy": "Mean over valid tokens of π_old's entropy at each step (when recomputed).",
  "rollout_kl_ref/<estimator>": "Mean over valid tokens of the KL estimator of π_old vs π_ref.",
  "response_length": "Mean completion length in tokens.",
  "truncated_frac": "Fraction of rows that hit max_new_tokens without an EOS.",
}

_PREFIXES = {name.split("<")[0]: name for name in DEFINITIONS if "<" in name}


def definition(name: str) -> str:
  """The definition of a metric name (`kl_ref/k3` resolves to `kl_ref/<estimator>`)."""
  if name in DEFINITIONS:
    return DEFINITIONS[name]
  prefix, _, rest = name.rpartition("/")
  if rest and f"{prefix}/" in _PREFIXES:
    return DEFINITIONS[_PREFIXES[f"{prefix}/"]]
  raise KeyError(f"Metric {name!r} has no definition in grpo_jax.metrics.DEFINITIONS.")
