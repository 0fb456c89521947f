"""One definition per metric name: every key in metrics.jsonl and TensorBoard, one table.

Notation: m the loss mask (completion tokens that survive the token masks), v the valid
completion mask, A the token advantage, ā_i its row mean, ρ the policy ratio, w the
aggregation weights, π_θ the current policy, π_old the rollout policy, π_ref the
reference. "mean over tokens" = Σ m·x / Σ m over the mini-batch (step metrics) or the
rollout batch (rollout metrics).

Names are patterns: `<x>` stands for one path segment, `<x...>` for one or more
(`kl_ref/k3` matches `kl_ref/<estimator>`, `eval/pass@4` matches `eval/pass@<k>`).
`definition(name)` resolves a concrete key. This module imports nothing: a notebook or a
plotting script can read the definitions without jax.
"""

from __future__ import annotations

import re

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
  "moe_balance": "The routers' load-balancing loss X·Σ f_jx·P_x (k when perfectly balanced), "
  "mean over micro-batches weighted by their share of rows (rl.moe_balance_coef > 0).",
  "route_flip_frac": "Share of the replayed routing decisions ((token, layer) pairs of the "
  "mini-batch's real tokens whose sampler experts the update's forward replays, "
  "rl.routing_replay) where the forward's own router would have taken another set of "
  "experts: how much routing replay changes (`moe.flip_counts`).",
  "micro_batches": "Micro-batches the mini-batch ran as (rl.micro_batch_tokens > 0): rows "
  "longest first, each micro-batch as many as fit the token budget at its bucket length; "
  "rows without a completion token are not run.",
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
  "task/level": "The task's curriculum level after this iteration's move (a reasoning-gym task "
  "with curriculum=True; `reasoning_gym_tasks`): the difficulty the next prompts are drawn at.",
  "task/level_pass_rate": "Mean batch pass rate over the iterations the curriculum's window "
  "holds at this level (it moves the level when it crosses curriculum_up or curriculum_down).",
  "distill/reverse_kl": "distill estimator: mean over trained tokens of log π_old(o_t) − "
  "log π_T(o_t), the single-sample estimate of the per-token reverse KL(π_old ‖ π_T) to the "
  "teacher (config.teacher) on the student's own samples; 0 when the student is the teacher.",
  "distill/teacher_logp": "distill estimator: mean over trained tokens of the teacher's "
  "log-prob log π_T(o_t) of the student's tokens.",
  "ibpo/comparison_abs_mean": "ibpo estimator: mean over advantaged tokens of "
  "|A_{i,t} − A^{λ=0}_i|, the credit its prefix baseline moves away from the group's "
  "(A^{λ=0}: GRPO's advantage).",
  "ibpo/sign_flip_frac": "ibpo estimator: share of advantaged tokens whose advantage has the "
  "opposite sign of the group-baseline advantage A^{λ=0}_i of their rollout.",
  "ibpo/terminal_comparison_corr": "ibpo estimator: Σxy/√(Σx²Σy²) over advantaged tokens, "
  "x = r_i − r̄_{−i} the terminal term (GRPO's advantage up to (n−1)/n), y = r̄_{−i} − b_{i,t} "
  "the comparison term the prefix baseline adds (A ∝ x + y). 0 in expectation when prefixes "
  "say nothing of the outcome; negative when the comparison is a control variate (IBPO "
  "principle ii); 0 at λ = 0.",
  "ibpo/counterfactual_rows": "Active counterfactual rows of the batch (config.counterfactual): "
  "slots the plan filled within the token budget.",
  "ibpo/counterfactual_tokens": "Tokens the active counterfactual rows decoded themselves (a "
  "branch's continuation, not its parent's prefix).",
  "ibpo/generated_tokens": "Tokens decoded this iteration: the samples' completion tokens plus "
  "ibpo/counterfactual_tokens (the cost to compare arms at).",
  "ibpo/kept_pair_frac": "Among active counterfactual rows, the fraction whose normalised edit "
  "distance to their parent d/max(|o|,|o~|) is <= τ (local repairs; the rest are full rewrites, "
  "dropped).",
  "ibpo/edit_distance_mean": "Mean over active counterfactual rows of the normalised edit distance "
  "to their parent (token or step level, config.counterfactual.distance).",
  "ibpo/is_weight_mean": "Mean over active counterfactual rows of their weight in the trie and "
  "the loss: min(π(o|q)/π(o|q~), c) for rows sampled under a perturbed prompt, 1 for branches.",
  "ibpo/distance_frac/<bin>": "Share of active counterfactual rows whose normalised edit distance "
  "to their parent falls in the bin lo-hi (lo <= d < hi; the last bin includes 1).",
  "masked_frac": "Fraction of valid completion tokens removed by all token masks together.",
  "masked_frac/<mask>": "Fraction of valid completion tokens the named mask removes on its own.",
  "masked_frac/<mask>/<part>": "Fraction of valid completion tokens one part of the named mask "
  "(a negative_token_filter criterion) would remove on its own.",
  "rollout_entropy": "Mean over valid tokens of π_old's entropy at each step (when recomputed; "
  "from the update's forward with rl.old_logp_from 'update', which then logs it).",
  "rollout_kl_ref/<estimator>": "Mean over valid tokens of the KL estimator of π_old vs π_ref "
  "(logged by the update when π_old is its forward's, rl.old_logp_from 'update').",
  "response_length": "Mean completion length in tokens (episodes: the model's own tokens).",
  "truncated_frac": "Fraction of rows that hit max_new_tokens without an EOS.",
  "unscorable_frac": "Fraction of rows whose reward failed (raised, timed out, non-finite): "
  "`reward_errors` of the trained batch / its rows.",
  "excluded_frac": "Fraction of rows the rl.unscorable policy left out of advantages and loss "
  "(unscorable rows, and under 'mask' the rest of a group left with < 2 scorable rows; "
  "under 'drop_group' every group holding one); 0 under 'zero'.",
  # --- train.run, per iteration (metrics.jsonl, TensorBoard) ------------------------
  "iteration": "RL iteration (0: the warm-start evaluation line).",
  "phase": "'warmstart' or 'rl' (a string; not sent to TensorBoard).",
  "accuracy": "Mean correctness c_i over every row sampled this iteration (all generation batches); with config.rewards, c_i is the sources' weighted sum.",
  "reward_errors": "Rows whose reward call raised, returned non-finite or timed out: unscorable, "
  "handled by rl.unscorable (default 'mask': left out of the loss and of group statistics).",
  "reward/unscorable_frac": "Share of the iteration's sampled rows (every generation batch) whose "
  "reward failed (raised, timed out, non-finite; episodes: env_error): masked from the loss. "
  "Above config.warn_unscorable_frac the trainer logs a warning.",
  "reward/unscorable/<name>": "Share of the iteration's rows that were unscorable under "
  "this name: an outcome label of the task the failure carried (e.g. the code task's "
  "'sandbox'), 'timeout' (the reward pool's limit), 'error' (raised without a label), "
  "'other' (a label outside the task's outcomes). They sum to reward/unscorable_frac.",
  "reward/unscorable_failure_corr": "Across the iteration's groups, Pearson's r between a "
  "group's share of unscorable rows and the failure rate 1 − mean c_i of its scorable rows "
  "(not logged where undefined: fewer than 2 groups, or no variation). Near 0 when rewards fail at random; > 0 when "
  "unscorable rows concentrate where answers are wrong (a policy escaping its zeros).",
  "reward/outcome/<label>": "Share of the iteration's scored rows whose reward carried this "
  "outcome label (the task's `outcomes`, e.g. the code task's pass, wrong, raised, timeout, "
  "memory, crash, tampered, no_code, syntax, sandbox; 'other' for labels outside them).",
  "reward/<source>": "config.rewards: mean over the rows this named reward source scored of its raw "
  "score (before its transforms and weight; reward_sources), over every generation batch.",
  "reward/<source>/unscorable": "config.rewards: share of the iteration's rows this reward "
  "source could not score (timeouts, malformed or missing judge answers, a server gone).",
  "reward/<source>/seconds_per_row": "config.rewards: seconds this model source (reward model "
  "or judge) has spent per scored row since the run's process started (cache hits included).",
  "rm/loss": "rm-train: the mini-batch's mean −log σ(r_c − r_r − m) (reward_model.pair_loss).",
  "rm/pair_accuracy": "rm-train: share of the mini-batch's pairs with r(x, y_c) > r(x, y_r).",
  "rm/reward_gap": "rm-train: mean over the mini-batch's pairs of r(x, y_c) − r(x, y_r).",
  "rm/eval_pair_accuracy": "rm-train: share of the held-out pairs with r(x, y_c) > r(x, y_r) "
  "(a tie counts as wrong).",
  "rm/eval_loss": "rm-train: mean −log σ(r_c − r_r) over the held-out pairs (margin 0).",
  "reward_timeouts": "The reward_errors that timed out (reward_timeout_s): unscorable, e.g. a pathological math expression; their worker was replaced. Counted apart from wrong answers (reward 0 without an error).",
  "nonfinite_steps": "Train steps of this iteration skipped for a non-finite loss or gradient.",
  "nonfinite_total": "Skipped (non-finite) train steps since the start of the run.",
  "dynamic/gen_batches": "Generation batches of B prompts sampled this iteration (DAPO dynamic sampling).",
  "dynamic/dropped_groups": "Zero-variance groups sampled this iteration and not trained on.",
  "dynamic/fill_groups": "Batch slots filled by masked zero-variance groups (max_gen_batches reached).",
  "dynamic/surplus_groups": "Groups with varying rewards sampled beyond B and discarded.",
  "time/sample": "Seconds in the jitted sampler this iteration (all generation batches).",
  "time/reward": "Seconds decoding completions and scoring rewards on the host (the old/ref log-prob forwards run on the device meanwhile, without dynamic sampling).",
  "time/prepare": "Seconds from scored rollouts to the training batch on the device: advantages, "
  "token masks and the batch's statistics (the old/ref log-prob forwards ran during time/reward).",
  "time/update": "Seconds from the training batch to the updated state: planning and the train steps.",
  "time/host": "time/iteration less its timed phases (sample, reward, counterfactuals, env, "
  "prepare, update): the host glue between them.",
  "time/iteration": "Seconds of the iteration without evaluation: sample + reward + update + host glue.",
  "time/counterfactuals": "Seconds planning, decoding, merging and scoring IBPO's counterfactual "
  "rows (config.counterfactual), inside time/iteration.",
  # --- multi-turn episodes (config.env; `episodes`), means over the iteration's episodes
  "time/env": "Seconds on the host in the environment: decoding actions, env.reset/step, "
  "encoding observations (episodes; the jitted turns and appends are time/sample).",
  "episode/turns": "Mean number of actions per episode.",
  "episode/action_tokens": "Mean tokens the model produced per episode (the trained tokens).",
  "episode/observation_tokens": "Mean observation tokens the environment put in an episode's "
  "context (never trained).",
  "episode/end/<reason>": "Fraction of episodes that ended for the reason (episodes.END_REASONS): "
  "done (the environment's step returned done), turn_limit (config.env.max_turns actions), "
  "token_limit (sampler.max_new_tokens or config.env.observation_tokens ran out), env_error "
  "(reset or step raised; the episode is unscorable), step_timeout (a step ran past its "
  "environment's step_budget_s; its result is discarded and the episode is scored with the "
  "rewards received before it, the late step counting 0).",
  "pad/sample_frac": "Share of the sampler's row-steps this iteration spent on rows that had already "
  "ended or on idle slots (1 − Σ completion tokens / (decoding rows × decode steps run); decoding "
  "rows = sampler.refill_slots when the refill sampler runs, else every row; with episodes, the "
  "row-columns their turns and observation appends computed, refill slots' included).",
  "sampler/starved_frac": "Share of the iteration's rows that the sampler's page pool had no page "
  "for (sampler.kv_layout='paged', pool sampler.kv_pool_fraction): they ended there, truncated "
  "(no EOS). Logged with a paged cache only; above 0, raise sampler.kv_pool_fraction.",
  "pad/update_frac": "Share of the [rows, P + T] positions of the batch's log-prob forwards and update "
  "that are padding (1 − (Σ prompt tokens + Σ completion tokens) / (rows × (P + T))).",
  # --- off-policy: behaviour-policy mismatch and staleness (grpo_jax.rl.importance, offpolicy)
  "offpolicy/mismatch_k3": "Mean over loss tokens (before the correction drops any) of k3 = "
  "ρ − 1 − log ρ, ρ = π_old/μ (μ the sampler's raw policy, π_old the trainer's recompute): an "
  "estimate of KL(μ ‖ π_old) from μ's samples. 0 when sampler and trainer agree. Needs "
  "rl.recompute_old_logp; with rl.old_logp_from 'update' π_old is the update's forward and "
  "the update logs every offpolicy/ mismatch metric (same definitions).",
  "offpolicy/ratio_p<q>": "The q-th percentile (01, 50, 99) of ρ = π_old/μ over loss tokens "
  "(before the correction).",
  "offpolicy/is_weight_mean": "Mean over the tokens the correction keeps of its weight w "
  "(rl.is_correction; 1 for 'none').",
  "offpolicy/is_drop_frac": "Share of loss tokens the correction dropped (MIS: ρ outside "
  "[rl.importance_hyper.is_lower, is_upper]); 0 for TIS and 'none'.",
  "offpolicy/staleness_mean": "Mean over the batch's rows of their staleness: the trainer's params "
  "version (updates applied) − the version that sampled the row's oldest token "
  "(config.offpolicy; 0 in the synchronous schedule).",
  "offpolicy/staleness_max": "Max over the batch's rows of their staleness.",
  "offpolicy/stale_frac": "Share of rows staler than offpolicy.max_staleness (they follow "
  "offpolicy.stale: dropped, or trained with rl.is_correction).",
  "offpolicy/stale_dropped_frac": "Share of rows left out of advantages and loss for staleness.",
  "offpolicy/mixed_version_frac": "Share of rows whose tokens were sampled by more than one "
  "params version (partial rollouts continued across an update).",
  "offpolicy/segments": "Decode calls that produced the batch (1 without partial rollouts; "
  "with them, one per segment of offpolicy.segment_tokens steps).",
  "offpolicy/in_flight": "Rollout batches in the pipeline after this one was taken.",
  "time/reward_overlap": "Seconds scoring the rewards of in-flight batches while the update "
  "ran (off the critical path: not in time/reward).",
  "time/eval": "Seconds of the held-out evaluation (when it ran).",
  "time/diagnostics": "Seconds of the token-credit diagnostics (config.diagnostics; when they ran): "
  "the params snapshot before the update and the measurements after it.",
  "tokens_per_s": "The policy's own completion tokens of the training batch (episodes: "
  "actions, not observations) / time/sample.",
  "perf/mfu": "Model FLOPs of the iteration (grpo_jax.infra.flops.phase_flops: sampling, the "
  "log-prob forwards, 3x forward per update epoch, over the computed padded shapes; the LM head "
  "only at the positions whose logits are used) / time/iteration / peak FLOP/s.",
  "perf/mfu_sample": "Model FLOPs of sampling (every generation batch: the prefill without a "
  "head, then one head per decode step at the decoded contexts) / time/sample / peak FLOP/s.",
  "perf/mfu_update": "Model FLOPs of the update (3x forward per epoch over the update rows, the "
  "LM head at the T completion positions only) / time/update / peak FLOP/s.",
  "eval/greedy_accuracy": "Held-out accuracy of greedy completions (first eval_size test problems).",
  "eval/greedy_accuracy_low": "Lower end of eval/greedy_accuracy's 95% percentile-bootstrap "
  "interval over its problems (heldout.interval: 2000 resamples, seed 0).",
  "eval/greedy_accuracy_high": "Upper end of eval/greedy_accuracy's 95% percentile-bootstrap "
  "interval over its problems (heldout.interval: 2000 resamples, seed 0).",
  "eval/problems": "Held-out problems the evaluation scored (eval_size, or fewer when the test "
  "split is smaller).",
  "eval/distinct_problems": "Distinct problems among eval/problems (Task.problem_key): a task "
  "that draws its problems can draw one twice (independent draws: the interval stays right, "
  "heldout.interval says why).",
  "eval/format_rate": "Held-out fraction of greedy completions that follow the answer template "
  "(episodes, config.env: the fraction the environment ended, episode/end/done).",
  "eval/reward_errors": "Held-out reward calls that raised, returned non-finite or timed out.",
  "eval/pass@<k>": "Unbiased pass@k (Chen et al. 2021) from eval_samples samples per held-out problem.",
  "eval/mean@<k>": "Mean correctness over the k = eval_samples samples per held-out problem.",
  # --- token-credit diagnostics (config.diagnostics; `diagnostics.hook`) -------------
  # flips.flip_report (pol: pos ā>0 | neg ā<0 | all; cat: reasoning | template | all).
  "flip/<pol>/<cat>/boosted": "Fraction of the (polarity, category) probe tokens with Δlog π > τ.",
  "flip/<pol>/<cat>/suppressed": "Fraction of the (polarity, category) probe tokens with Δlog π < −τ.",
  "flip/<pol>/<cat>/unchanged": "Fraction of the (polarity, category) probe tokens with |Δlog π| <= τ.",
  "flip/<pol>/<cat>/count": "Number of valid probe tokens in the (polarity, category) cell.",
  "flip/<pol>/<cat>/abs_delta_share": "Σ|Δlog π| over the category / Σ|Δlog π| over all tokens of the polarity.",
  # coupling.coupling_report.
  "coupling/fit/<stat>": "Fit of the LM-head SGD first-order prediction η Σ_n c_n K_sn to the measured Δlog π "
  "(corr, slope and intercept of measured on predicted, r2, rel_err = ‖pred − meas‖/‖meas‖).",
  "coupling/self_fit/<stat>": "The same fit for the self term η c_s K_ss alone.",
  "coupling/head_update_fit/<stat>": "The same fit for the first-order effect of the actual LM-head change δW.",
  "coupling/self_abs_mean": "Mean over target tokens of |η c_s K_ss|.",
  "coupling/coupling_abs_mean": "Mean over target tokens of |η Σ_{n≠s} c_n K_sn|.",
  "coupling/self_share": "Σ|self| / (Σ|self| + Σ|coupling|) over target tokens.",
  "coupling/self_sign_agree": "Fraction of target tokens whose measured Δ has the sign of their self term.",
  "coupling/<kind>/abs_share": "Share of Σ_{s≠n}|η c_n K_sn| from pairs of the kind (same_id | diff_id).",
  "coupling/<kind>/mean_k": "Mean LM-head kernel K_sn over non-self pairs of the kind.",
  "coupling/<kind>/pairs": "Number of non-self (target, source) pairs of the kind.",
  "coupling/<kind>/<tbin>/<sbin>/abs_share": "Share of coupling mass from pairs of the kind with target π(y) in "
  "tbin and source π(y) in sbin.",
  "coupling/<kind>/<tbin>/<sbin>/mean_k": "Mean K_sn over those pairs.",
  # cancellation.residual_report (also cancel/<mode>/... from compare_aggregations).
  "cancel/clipped/<...>": "The cancel/... statistic with each token's coefficient as the policy loss "
  "applies it at the updated params, c = −∂(Σ w·ℓ_tok)/∂ℓ = w·A·ρ, 0 where PPO clipping binds "
  "(report.loss_coefficients), instead of w·A. ρ is measured at the end of the update (params after vs "
  "before), not at each mini-batch step; clipped tokens also leave cancel/clipped/gross, so compare "
  "cancel/clipped/abs_residual with cancel/gross for the unclipped scale.",
  "cancel/net": "Σ_v r_v = Σ_{i,t} w·A over loss tokens.",
  "cancel/abs_residual": "Σ_v |r_v|, r_v = Σ_{i,t: o=v} w·A: credit left after batch-level cancellation.",
  "cancel/gross": "Σ_v Σ_{o=v} |w·A|: the credit before cancellation.",
  "cancel/residual_ratio": "cancel/abs_residual / cancel/gross.",
  "cancel/group_abs_residual": "Σ_g Σ_v |r_{g,v}|: credit left after within-group cancellation.",
  "cancel/group_residual_ratio": "cancel/group_abs_residual / cancel/gross.",
  "cancel/top<j>/id": "Token id with the j-th largest |r_v| (j = 0 largest).",
  "cancel/top<j>/residual": "Its residual r_v.",
  "cancel/top<j>/count": "Its number of occurrences among loss tokens.",
  "cancel/band<b>/abs_residual_share": "Σ|r_v| over frequency band b (0 = most frequent ids) / Σ_v |r_v|.",
  "cancel/band<b>/residual_ratio": "Σ|r_v| / Σ gross over the ids of band b.",
  "cancel/band<b>/num_ids": "Number of token ids in band b.",
  "cancel/band<b>/min_count": "Smallest occurrence count in band b.",
  "cancel/band<b>/max_count": "Largest occurrence count in band b.",
  "cancel/<cat>/abs_residual_share": "Σ|r_v| over the ids of the category / Σ_v |r_v|.",
  "cancel/<cat>/residual_ratio": "Σ|r_v| / Σ gross over the ids of the category.",
  # drift.
  "drift/solution_logp_token": "Mean log π per token of the fixed reference solutions.",
  "drift/solution_logp_seq": "Mean over reference solutions of log π(o | q).",
  "drift/entropy": "Mean entropy of π_θ over valid probe tokens.",
  "drift/kl_init": "Mean exact KL(π_θ ‖ π_init) over the vocabulary at the probe contexts.",
  "drift/kl_init_k3": "Mean k3 estimate of KL(π_θ ‖ π_init) at the probe tokens (biased: not π_θ's samples).",
  "drift/length_slope": "Least-squares slope of response length per iteration over the trend window.",
  "tax/learning_tax": "Σ_{v weak} ‖δW[:, v]‖² / ‖δW‖² of the actual LM-head change (weak: frequent ids "
  "whose credit cancels, |r_v| <= ε·gross_v).",
  "tax/learning_tax_sgd": "The same for the LM-head SGD step η Σ c h (e_y − π)^T.",
  "tax/weak_ids": "Number of weak-credit token ids.",
  # rank / sparsity.
  "rank/<matrix...>/<metric>": "entropy_rank, stable_rank, energy_rank_<q>, sigma_max, fro of a named matrix "
  "(the name may hold '/', e.g. a parameter path).",
  "sparsity/hoyer": "Hoyer sparsity (√n − ‖g‖₁/‖g‖₂)/(√n − 1) of the gradient.",
  "sparsity/near_zero": "Fraction of gradient coordinates with |g| <= ε·max|g|.",
  "sparsity/zero_var_groups": "Fraction of groups whose rewards are all equal.",
  "sparsity/minibatch_grad_var": "tr Cov of the mean per-rollout gradient (rank subset, projected) "
  "over mini-batches of half the probe's rollouts drawn without replacement (exact: "
  "(U − m)/(m(U − 1)) · mean ‖g_i − ḡ‖²).",
  "sparsity/minibatch_grad_snr": "‖ḡ‖² / sparsity/minibatch_grad_var: the half-size mini-batch "
  "gradient's signal-to-noise ratio on the probe.",
  # value.value_by_flip.
  "value/<pol>/<state>/value": "Mean MC value V(q, o_<=t) at tokens of the polarity and flip state.",
  "value/<pol>/<state>/gain": "Mean V(q, o_<=t) − V(q, o_<t) at those tokens.",
  "value/<pol>/<state>/count": "Number of those tokens.",
  "value/<pol>/value_gap": "Mean value at boosted − at suppressed tokens.",
  "value/<pol>/gain_gap": "Mean gain at boosted − at suppressed tokens.",
}

# First path segments of the token-credit diagnostics' keys (the section above).
DIAGNOSTICS_ROOTS = ("flip", "coupling", "cancel", "drift", "tax", "rank", "sparsity", "value")


def _pattern(name: str) -> re.Pattern:
  parts = re.split(r"(<[^>]+>)", name)
  body = "".join(
    (".+" if p.endswith("...>") else "[^/]+") if p.startswith("<") else re.escape(p) for p in parts
  )
  return re.compile(body)


_PATTERNS = [(_pattern(k), k) for k in DEFINITIONS]


def definition(name: str) -> str:
  """The definition of a concrete metric key. Exact names first, then patterns;
  "cancel/<mode>/..." rows of `cancellation.compare_aggregations` resolve to their
  "cancel/..." pattern."""
  if name in DEFINITIONS:
    return DEFINITIONS[name]
  candidates = [name]
  if m := re.match(r"^cancel/([^/]+)/(.+)$", name):
    candidates.append(f"cancel/{m.group(2)}")
  for cand in candidates:
    for pat, key in _PATTERNS:
      if pat.fullmatch(cand):
        return DEFINITIONS[key]
  raise KeyError(f"Metric {name!r} has no definition in grpo_jax.infra.metrics.DEFINITIONS.")
