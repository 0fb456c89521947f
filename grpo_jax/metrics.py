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
  "nonfinite": "1 if the step's loss or gradient was not finite (the update was skipped), else 0.",
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
  # --- train.run, per iteration (metrics.jsonl, TensorBoard) ------------------------
  "iteration": "RL iteration (0: the warm-start evaluation line).",
  "phase": "'warmstart' or 'rl' (a string; not sent to TensorBoard).",
  "accuracy": "Mean correctness c_i over every row sampled this iteration (all generation batches).",
  "reward_errors": "Rows whose reward call raised, returned non-finite or timed out (scored 0).",
  "reward_timeouts": "The reward_errors that timed out (reward_timeout_s): unscorable, e.g. a pathological math expression; their worker was replaced. Counted apart from wrong answers (reward 0 without an error).",
  "nonfinite_steps": "Train steps of this iteration skipped for a non-finite loss or gradient.",
  "nonfinite_total": "Skipped (non-finite) train steps since the start of the run.",
  "dynamic/gen_batches": "Generation batches of B prompts sampled this iteration (DAPO dynamic sampling).",
  "dynamic/dropped_groups": "Zero-variance groups sampled this iteration and not trained on.",
  "dynamic/fill_groups": "Batch slots filled by masked zero-variance groups (max_gen_batches reached).",
  "dynamic/surplus_groups": "Groups with varying rewards sampled beyond B and discarded.",
  "time/sample": "Seconds in the jitted sampler this iteration (all generation batches).",
  "time/reward": "Seconds decoding completions and scoring rewards on the host (the old/ref log-prob forwards run on the device meanwhile, without dynamic sampling).",
  "time/update": "Seconds from scored rollouts to the updated state: the rest of prepare, planning, train steps.",
  "time/iteration": "Seconds of the iteration without evaluation: sample + reward + update + host glue.",
  "time/eval": "Seconds of the held-out evaluation (when it ran).",
  "time/diagnostics": "Seconds of the token-credit diagnostics (config.diagnostics; when they ran): "
  "the params snapshot before the update and the measurements after it.",
  "tokens_per_s": "Valid completion tokens of the training batch / time/sample.",
  "perf/mfu": "Model FLOPs of the iteration (grpo_jax.flops: sampling, prepare forwards, "
  "3x forward per update epoch, over the computed padded shapes) / time/iteration / peak FLOP/s.",
  "eval/greedy_accuracy": "Held-out accuracy of greedy completions (first eval_size test problems).",
  "eval/format_rate": "Held-out fraction of greedy completions that follow the answer template.",
  "eval/reward_errors": "Held-out reward calls that raised, returned non-finite or timed out.",
  "eval/pass@<k>": "Unbiased pass@k (Chen et al. 2021) from eval_samples samples per held-out problem.",
  "eval/mean@<k>": "Mean correctness over the k = eval_samples samples per held-out problem.",
}

_PREFIXES = {name.split("<")[0]: name for name in DEFINITIONS if "<" in name}
# First path segments of the token-credit diagnostics' keys (config.diagnostics), defined
# in grpo_jax.diagnostics.report.DEFINITIONS.
DIAGNOSTICS_ROOTS = ("flip", "coupling", "cancel", "drift", "tax", "rank", "sparsity", "value")


def definition(name: str) -> str:
  """The definition of a metric name (`kl_ref/k3` resolves to `kl_ref/<estimator>`,
  `eval/pass@4` to `eval/pass@<k>`); diagnostics keys (`flip/...`, `coupling/...`, ...)
  resolve through `grpo_jax.diagnostics.report.definition`."""
  if name in DEFINITIONS:
    return DEFINITIONS[name]
  for prefix, pattern in _PREFIXES.items():
    if name.startswith(prefix) and len(name) > len(prefix) and "/" not in name[len(prefix) :]:
      return DEFINITIONS[pattern]
  if name.split("/")[0] in DIAGNOSTICS_ROOTS:
    from grpo_jax.diagnostics import report  # noqa: PLC0415 (lazy: this module stays jax-free)

    return report.definition(name)
  raise KeyError(f"Metric {name!r} has no definition in grpo_jax.metrics.DEFINITIONS.")
