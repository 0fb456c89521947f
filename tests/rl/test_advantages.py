"""Advantage estimators and group bookkeeping: hand-computed values, group properties, bad input."""

import functools
import math

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages, groups

EPS = 1e-6  # The default of the declared eps (`advantages.EPS`).
H = advantages.hyper_values()  # Every declared hyperparameter at its default.
H0 = advantages.hyper_values(eps=0.0)
SETTINGS = hypothesis.settings(max_examples=40, deadline=None)
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
# Estimators whose singleton groups / all-equal groups get exactly 0.
ZERO_ON_EQUAL = (
  "grpo",
  "dr_grpo",
  "rloo",
  "positive_only",
  "optimal_baseline",
  "optimal_token_baseline",
  "fade",
)
# Property tests (and padded small cases) share one [B, T] shape: one compile per estimator.
B, T = 8, 3
REAL = st.floats(-3, 3, width=32, allow_subnormal=False)
BINARY = st.sampled_from([0.0, 1.0])
IDS = st.lists(st.integers(0, B - 1), min_size=B, max_size=B)
LENGTHS = st.lists(st.integers(1, T), min_size=B, max_size=B)


def _mask(lengths, T):
  """[B, T] completion mask with row i holding lengths[i] leading True."""
  return jnp.arange(T)[None, :] < jnp.asarray(lengths, jnp.int32)[:, None]


def _row_tokens(row_keys, T):
  """Tokens of rows identified by `row_keys`: rows with close keys share prefixes (row k
  holds (k // 2, k // 4 % 2, k % 3, ...)), so prefix-comparing estimators see branching."""
  k = np.asarray(row_keys)[:, None]
  return jnp.asarray((k // (2 ** (np.arange(T) + 1)) + np.arange(T) * (k % 3)) % 5, jnp.int32)


def _inputs(rewards, group_ids, lengths=None, *, T=3, kl=None, score_sq=None, row_keys=None):
  B = len(rewards)
  lengths = [T] * B if lengths is None else lengths
  return advantages.AdvantageInputs(
    rewards_B=jnp.asarray(rewards, jnp.float32),
    group_ids_B=jnp.asarray(group_ids, jnp.int32),
    mask_BT=_mask(lengths, T),
    kl_BT=None if kl is None else jnp.asarray(kl, jnp.float32),
    score_sq_B=None if score_sq is None else jnp.asarray(score_sq, jnp.float32),
    tokens_BT=(tokens := _row_tokens(np.arange(B) if row_keys is None else row_keys, T)),
    # A teacher's and π_old's log-probs (distill), functions of a row's tokens like them.
    old_logp_BT=-0.5 - 0.25 * tokens.astype(jnp.float32),
    teacher_logp_BT=-1.5 + 0.5 * (tokens % 3).astype(jnp.float32),
  )


@functools.cache
def _jitted(name, **options):
  """One jitted estimator per (name, options): hypothesis examples of one shape reuse it."""
  return jax.jit(advantages.REGISTRY.make(name, **options))


def _seq(adv_BT, inputs):
  return np.asarray(advantages.sequence_advantage(adv_BT, inputs.mask_BT))


def _run(name, inputs, hyper=H, **options):
  return _jitted(name, **options)(inputs, hyper)


# ----------------------------------------------------------------------------
# Pinned values: GRPO, Dr. GRPO, RLOO, positive-only.
# ----------------------------------------------------------------------------


def test_grpo_unbiased_std_one_group_with_token_broadcast():
  # r = [1, 0, 0, 1]: mean 0.5, deviations ±0.5, Σ dev² = 4·0.25 = 1,
  # unbiased var = 1/3, σ = sqrt(1/3) = 0.577350 -> A = ±0.5/(0.577350 + 1e-6).
  inputs = _inputs([1, 0, 0, 1], [0, 0, 0, 0], lengths=[3, 2, 0, 1])
  a = 0.5 / (math.sqrt(1 / 3) + EPS)
  expected_BT = [[a, a, a], [-a, -a, 0], [0, 0, 0], [a, 0, 0]]  # 0 off the completion mask
  np.testing.assert_allclose(_run("grpo", inputs), expected_BT, rtol=1e-6)
  np.testing.assert_allclose(a, 0.8660239, rtol=1e-6)


def test_grpo_biased_std_one_group():
  # r = [1, 0, 0, 1]: biased var = 1/4, σ = 0.5 -> A = ±0.5/(0.5 + 1e-6) = ±1/(1 + 2e-6).
  inputs = _inputs([1, 0, 0, 1], [0, 0, 0, 0])
  a = 1 / (1 + 2 * EPS)
  adv_BT = _run("grpo", inputs, unbiased_std=False)
  np.testing.assert_allclose(_seq(adv_BT, inputs), [a, -a, -a, a], rtol=1e-7)


# Two groups with non-contiguous rows and non-consecutive ids: group 4 = rows {0, 2, 4},
# group 1 = rows {1, 3, 5}.
TWO_GROUPS = dict(rewards=[1, 2, 0, 5, 0, 8], group_ids=[4, 1, 4, 1, 4, 1])


def test_grpo_two_noncontiguous_groups():
  inputs = _inputs(**TWO_GROUPS)
  # Group 4: r = [1, 0, 0], mean 1/3, dev = [2/3, -1/3, -1/3], Σ dev² = 6/9,
  #   unbiased var = (6/9)/2 = 1/3, σ = 1/√3.
  s4 = 1 / math.sqrt(3) + EPS
  # Group 1: r = [2, 5, 8], mean 5, dev = [-3, 0, 3], Σ dev² = 18, var = 9, σ = 3.
  s1 = 3 + EPS
  expected = [(2 / 3) / s4, -3 / s1, (-1 / 3) / s4, 0 / s1, (-1 / 3) / s4, 3 / s1]
  np.testing.assert_allclose(_seq(_run("grpo", inputs), inputs), expected, rtol=1e-6)
  # Biased: group 4 var = (6/9)/3 = 2/9, σ = √2/3; group 1 var = 18/3 = 6, σ = √6.
  b4, b1 = math.sqrt(2) / 3 + EPS, math.sqrt(6) + EPS
  expected = [(2 / 3) / b4, -3 / b1, (-1 / 3) / b4, 0, (-1 / 3) / b4, 3 / b1]
  got = _seq(_run("grpo", inputs, unbiased_std=False), inputs)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_dr_grpo_two_noncontiguous_groups():
  inputs = _inputs(**TWO_GROUPS)
  # r - group mean: group 4 mean 1/3, group 1 mean 5.
  expected = [2 / 3, -3, -1 / 3, 0, -1 / 3, 3]
  np.testing.assert_allclose(_seq(_run("dr_grpo", inputs), inputs), expected, rtol=1e-6)


def test_rloo_two_noncontiguous_groups():
  inputs = _inputs(**TWO_GROUPS)
  # Leave-one-out: row 0: 1 - (0+0)/2 = 1; row 2: 0 - (1+0)/2 = -0.5; row 4: likewise -0.5.
  # Row 1: 2 - (5+8)/2 = -4.5; row 3: 5 - (2+8)/2 = 0; row 5: 8 - (2+5)/2 = 4.5.
  expected = [1, -4.5, -0.5, 0, -0.5, 4.5]
  np.testing.assert_allclose(_seq(_run("rloo", inputs), inputs), expected, rtol=1e-6)


def test_positive_only_clips_grpo_at_zero():
  inputs = _inputs(**TWO_GROUPS)
  s4, s1 = 1 / math.sqrt(3) + EPS, 3 + EPS
  expected = [(2 / 3) / s4, 0, 0, 0, 0, 3 / s1]  # max(GRPO, 0)
  np.testing.assert_allclose(_seq(_run("positive_only", inputs), inputs), expected, rtol=1e-6)


def test_singleton_group_gets_zero_advantage():
  # Rows 0, 1 form group 0 (r = [1, 0]); row 2 is alone in group 2 (r = 1), row 3 alone in
  # group 3 (r = -4). A singleton has no peers: r - r̄ = 0 (verl would give it r instead).
  # Rows 4..7 (group 7 = [1, 0, 0, 1]) pad the batch to the property tests' [B, T] shape.
  inputs = _inputs(
    [1, 0, 1, -4, 1, 0, 0, 1], [0, 0, 2, 3, 7, 7, 7, 7], score_sq=[1, 1, 5, 2, 1, 1, 1, 1]
  )
  for name in ZERO_ON_EQUAL:
    for hyper in (H, H0):  # eps = 0 too: 0/0 must not turn into NaN.
      seq = _seq(_run(name, inputs, hyper), inputs)
      np.testing.assert_array_equal(seq[2:4], [0, 0], err_msg=name)
      assert seq[0] > 0 >= seq[1], name  # positive_only clips row 1's negative to 0


# ----------------------------------------------------------------------------
# Pinned values: batch-level estimators.
# ----------------------------------------------------------------------------


def test_batch_mean_ignores_groups():
  inputs = _inputs(**TWO_GROUPS, lengths=[1, 2, 3, 0, 3, 1])
  # Batch mean = (1+2+0+5+0+8)/6 = 16/6 = 8/3.
  expected = np.array([1, 2, 0, 5, 0, 8]) - 8 / 3
  expected[3] = 0.0  # An empty row has no tokens, so its sequence advantage is 0.
  np.testing.assert_allclose(_seq(_run("batch_mean", inputs), inputs), expected, rtol=1e-6)


def test_batch_mean_std_whitens_over_rows():
  # Two groups [1, 0] and [0, 1]: GRPO would see σ per group; the batch estimator sees
  # r = [1, 0, 0, 1] as one set: mean 0.5, unbiased σ = sqrt(1/3), biased σ = 0.5.
  inputs = _inputs([1, 0, 0, 1], [0, 0, 1, 1])
  a = 0.5 / (math.sqrt(1 / 3) + EPS)
  np.testing.assert_allclose(
    _seq(_run("batch_mean_std", inputs), inputs), [a, -a, -a, a], rtol=1e-6
  )
  b = 0.5 / (0.5 + EPS)
  got = _seq(_run("batch_mean_std", inputs, unbiased_std=False), inputs)
  np.testing.assert_allclose(got, [b, -b, -b, b], rtol=1e-6)
  # All rewards equal: exactly 0 (0.7 is not a float32 that sums exactly).
  for hyper in (H, H0):
    flat = _run("batch_mean_std", _inputs([0.7] * 7, [0] * 7), hyper)
    np.testing.assert_array_equal(flat, 0.0)


def test_reinforce_pp_discounted_return_with_kl_by_hand():
  # γ = 0.5, β = 0.1, T = 3. Row 0: L = 3, r = 1; row 1: L = 2, r = 0; row 2: empty, r = 1.
  kl = [[0.2, 0.4, 1.0], [0.5, 1.0, 9.0], [3.0, 3.0, 3.0]]  # 9.0 and row 2 sit off the mask.
  inputs = _inputs([1, 0, 1], [0, 0, 1], lengths=[3, 2, 0], kl=kl)
  inputs = inputs.replace(kl_coef=jnp.float32(0.1))  # β: the KL's, not the estimator's.
  hyper = advantages.hyper_values(gamma=0.5)
  # Token rewards r_t = 1[t = last]·r - β·kl_t:
  #   row 0: [-0.02, -0.04, 1 - 0.1 = 0.9];  row 1: [-0.05, 0 - 0.1 = -0.1].
  # Returns G_t = r_t + γ G_{t+1}:
  #   row 0: G2 = 0.9, G1 = -0.04 + 0.45 = 0.41, G0 = -0.02 + 0.205 = 0.185;
  #   row 1: G1 = -0.1, G0 = -0.05 - 0.05 = -0.1.
  # Whitening over the 5 valid tokens: μ = (0.185 + 0.41 + 0.9 - 0.1 - 0.1)/5 = 1.295/5 = 0.259;
  # dev = [-0.074, 0.151, 0.641, -0.359, -0.359], Σ dev² = 0.005476 + 0.022801 + 0.410881
  # + 2·0.128881 = 0.69692, var (ddof 1) = 0.69692/4 = 0.17423.
  sigma = math.sqrt(0.17423) + EPS
  expected_BT = np.array([[-0.074, 0.151, 0.641], [-0.359, -0.359, 0.0], [0, 0, 0]]) / sigma
  expected_BT[1, 2] = 0.0
  np.testing.assert_allclose(_run("reinforce_pp", inputs, hyper), expected_BT, rtol=2e-5, atol=1e-6)


def test_reinforce_pp_gamma_one_no_kl_is_whitened_reward():
  # γ = 1, β = 0: G_t = r on every token of the row. Rows L = [2, 1], r = [1, 0]:
  # tokens [1, 1, 0], μ = 2/3, dev = [1/3, 1/3, -2/3], var = (1/9 + 1/9 + 4/9)/2 = 1/3.
  inputs = _inputs([1, 0], [0, 1], lengths=[2, 1], T=2, kl=[[5, 5], [5, 5]])
  s = math.sqrt(1 / 3) + EPS
  expected_BT = [[(1 / 3) / s, (1 / 3) / s], [(-2 / 3) / s, 0]]
  np.testing.assert_allclose(_run("reinforce_pp", inputs), expected_BT, rtol=1e-6)


def test_reinforce_pp_puts_the_reward_on_the_last_valid_token_of_a_gapped_mask():
  # Row 0 mask [1, 0, 1, 0] (a masked observation at t=1), r = 1; row 1 mask [1, 1, 0, 0], r = 0.
  # γ = 1: row 0 returns [1, -, 1, -], row 1 [0, 0, -, -]. μ = 0.5, dev ±0.5,
  # var (ddof 1) = 4·0.25/3 = 1/3.
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.array([1.0, 0.0]),
    group_ids_B=jnp.array([0, 1], jnp.int32),
    mask_BT=jnp.array([[1, 0, 1, 0], [1, 1, 0, 0]], bool),
  )
  s = math.sqrt(1 / 3) + EPS
  expected_BT = np.array([[0.5, 0, 0.5, 0], [-0.5, -0.5, 0, 0]]) / s
  np.testing.assert_allclose(_run("reinforce_pp", inputs), expected_BT, rtol=1e-6)


def test_reinforce_pp_baseline_whitens_group_centred_rewards():
  # Groups [1, 0] (rows 0, 1) and [1, 1] (rows 2, 3); lengths [2, 1, 3, 0].
  inputs = _inputs([1, 0, 1, 1], [0, 0, 1, 1], lengths=[2, 1, 3, 0])
  # Centred: [0.5, -0.5, 0, 0]; tokens: 0.5 ×2, -0.5 ×1, 0 ×3 (n = 6).
  # μ = (1 - 0.5)/6 = 1/12; dev: 5/12 ×2, -7/12, -1/12 ×3;
  # Σ dev² = (2·25 + 49 + 3)/144 = 102/144; var = (102/144)/5 = 0.141667.
  s = math.sqrt(102 / 144 / 5) + EPS
  d = np.array([5, -7, -1, 0]) / 12
  expected_BT = np.array([[d[0], d[0], 0], [d[1], 0, 0], [d[2], d[2], d[2]], [0, 0, 0]]) / s
  np.testing.assert_allclose(_run("reinforce_pp_baseline", inputs), expected_BT, rtol=1e-6)


# ----------------------------------------------------------------------------
# Pinned values: the optimal baseline and the FADE family.
# ----------------------------------------------------------------------------

# Group 0 = rows {0, 2, 4}: r = [1, 0, 0], s = [2, 1, 1];
# group 1 = rows {1, 3, 5}: r = [0, 1, 1], s = [3, 1, 0].
OPT = dict(rewards=[1, 0, 0, 1, 0, 1], group_ids=[0, 1, 0, 1, 0, 1], score_sq=[2, 3, 1, 1, 1, 0])


def test_optimal_baseline_group_scope_nonuniform_scores():
  inputs = _inputs(**OPT)
  # Group 0: b* = (2·1 + 1·0 + 1·0)/(2+1+1) = 0.5 -> A = [0.5, -0.5, -0.5].
  # Group 1: b* = (3·0 + 1·1 + 0·1)/(3+1+0) = 0.25 -> A = [-0.25, 0.75, 0.75].
  # (The group means would be 1/3 and 2/3.)
  expected = [0.5, -0.25, -0.5, 0.75, -0.5, 0.75]
  got = _seq(_run("optimal_baseline", inputs), inputs)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_optimal_baseline_batch_scope_nonuniform_scores():
  inputs = _inputs(**OPT)
  # b* = Σ s r / Σ s = (2 + 0 + 0 + 1 + 0 + 0)/(2+3+1+1+1+0) = 3/8 for every row.
  expected = np.array([1, 0, 0, 1, 0, 1]) - 3 / 8
  got = _seq(_run("optimal_baseline", inputs, scope="batch"), inputs)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_optimal_baseline_fallbacks():
  # score_sq None: s ≡ 1, so b* is the group mean = Dr. GRPO.
  inputs = _inputs(**TWO_GROUPS)
  np.testing.assert_allclose(
    _run("optimal_baseline", inputs), _run("dr_grpo", inputs), rtol=1e-6, atol=1e-6
  )
  # Σ s = 0 in group 1: b* falls back to the plain mean 2/3; group 0 keeps b* = 0.5.
  inputs = _inputs(OPT["rewards"], OPT["group_ids"], score_sq=[2, 0, 1, 0, 1, 0])
  expected = [0.5, -2 / 3, -0.5, 1 / 3, -0.5, 1 / 3]
  np.testing.assert_allclose(_seq(_run("optimal_baseline", inputs), inputs), expected, rtol=1e-6)


def _token_inputs(rewards, group_ids, lengths, score_sq_BT, *, T=3):
  return _inputs(rewards, group_ids, lengths, T=T).replace(
    score_sq_BT=jnp.asarray(score_sq_BT, jnp.float32)
  )


def test_optimal_token_baseline_by_hand():
  # Group 0 = rows {0, 1}: r = (1, 0), lengths (2, 3), per-token ‖e_y − π‖²:
  #   row 0: 0.5, 0.25        W = cumsum = 0.5, 0.75
  #   row 1: 0.2, 0.4, 0.1    W = 0.2, 0.6, 0.7
  # B_0 = (1·0.5 + 0·0.2) / 0.7 = 5/7; B_1 = 0.75 / 1.35 = 5/9; B_2 = 0 / 0.7 = 0 (row 1 only).
  # Group 1 = rows {2, 3}: r = (1, 0), one token each, every π certain (W = 0): the
  # baseline falls back to the mean reward 0.5.
  score_sq = [[0.5, 0.25, 9.0], [0.2, 0.4, 0.1], [0.0, 9.0, 9.0], [0.0, 9.0, 9.0]]
  inputs = _token_inputs([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], [2, 3, 1, 1], score_sq)
  want = [
    [1 - 5 / 7, 1 - 5 / 9, 0.0],
    [-5 / 7, -5 / 9, 0.0],
    [0.5, 0.0, 0.0],
    [-0.5, 0.0, 0.0],
  ]
  np.testing.assert_allclose(_run("optimal_token_baseline", inputs), want, rtol=1e-6, atol=1e-7)
  # Batch scope: one baseline per position over all four rows.
  # t0: (0.5·1 + 0.2·0 + 0 + 0) / 0.7 = 5/7 (rows 2, 3 have W = 0); t1: 5/9; t2: 0.
  got = _run("optimal_token_baseline", inputs, scope="batch")
  want_b = [[1 - 5 / 7, 1 - 5 / 9, 0], [-5 / 7, -5 / 9, 0], [1 - 5 / 7, 0, 0], [-5 / 7, 0, 0]]
  np.testing.assert_allclose(got, want_b, rtol=1e-6, atol=1e-7)


def test_optimal_token_baseline_with_equal_scores_is_the_group_mean_per_position():
  """Equal score norms: W_{j,t} = (t+1)·s for every row alive at t, so B_t is the mean
  reward of the rows still running at t (not the sequence-level group mean)."""
  inputs = _token_inputs([1.0, 0.0, 0.0], [0, 0, 0], [1, 3, 3], np.full((3, 3), 0.3))
  got = np.asarray(_run("optimal_token_baseline", inputs))
  np.testing.assert_allclose(got[:, 0], [1 - 1 / 3, -1 / 3, -1 / 3], rtol=1e-6)
  np.testing.assert_allclose(got[1:, 1:], 0.0, atol=1e-7)  # Rows 1, 2 both fail: B = 0.


def test_fade_success_is_the_verdict_not_the_shaped_reward():
  """A format bonus (0.5) gives a well-formatted wrong answer r = 0.5 > 0. With the
  verifier's verdict carried in success_B, FADE still counts it as a failure."""
  correct = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
  shaped = correct + 0.5 * np.array([1.0, 1.0, 0.0, 0.0], np.float32)  # (1.5, 0.5, 0, 0)
  by_reward = _seq(_run("fade", _inputs(shaped, [0] * 4)), _inputs(shaped, [0] * 4))
  by_verdict_inputs = _inputs(shaped, [0] * 4).replace(success_B=jnp.asarray(correct > 0))
  by_verdict = _seq(_run("fade", by_verdict_inputs), by_verdict_inputs)
  # Shaped reward: p = 1/2, the wrong formatted row 1 is a "success" with A > 0.
  assert by_reward[1] > 0
  # Verdict: p = 1/4, f = (3/16 + eps)^(-1/2); success 1·(3/4)·f, failures −(1/4)·f.
  f = (3 / 16 + EPS) ** -0.5
  np.testing.assert_allclose(by_verdict, [0.75 * f, -0.25 * f, -0.25 * f, -0.25 * f], rtol=1e-5)
  # ... which is what FADE gives on the correctness rewards alone.
  plain = _seq(_run("fade", _inputs(correct, [0] * 4)), _inputs(correct, [0] * 4))
  np.testing.assert_allclose(by_verdict, plain, rtol=1e-6)


def test_fade_pinned_hyperparameters():
  # Group 0 = rows 0..3, r = [0.7, 0, -1, 0]: success is r > 0, so k = 1, p = 1/4.
  # Group 5 = rows 4..7, r = [1, 1, 0, 0]: p = 1/2.
  inputs = _inputs([0.7, 0, -1, 0, 1, 1, 0, 0], [0, 0, 0, 0, 5, 5, 5, 5])
  hyper = advantages.hyper_values(
    eps=0.0, lambda_s=2.0, lambda_f=0.5, std_power=1.0, focal_gamma=2.0
  )
  # f(p) = (p(1-p))^(-1)·(1-p)^2.
  # p = 1/4: f = (3/16)^(-1)·(9/16) = 3; a⁺ = f·λ_S·(1-p) = 3·2·0.75 = 4.5;
  #          a⁻ = -f·λ_F·p = -3·0.5·0.25 = -0.375.
  # p = 1/2: f = 4·(1/4) = 1; a⁺ = 1·2·0.5 = 1; a⁻ = -1·0.5·0.5 = -0.25.
  expected = [4.5, -0.375, -0.375, -0.375, 1, 1, -0.25, -0.25]
  np.testing.assert_allclose(_seq(_run("fade", inputs, hyper), inputs), expected, rtol=1e-6)
  # α = 1/2, γ = 1, λ = 1, eps = 1e-6 at p = 1/4:
  # f = (3/16 + 1e-6)^(-1/2)·(3/4); a⁺ = f·3/4, a⁻ = -f/4.
  hyper = advantages.hyper_values(std_power=0.5, focal_gamma=1.0)
  f = (3 / 16 + EPS) ** -0.5 * 0.75
  got = _seq(_run("fade", inputs, hyper), inputs)[:4]
  np.testing.assert_allclose(got, [0.75 * f, -f / 4, -f / 4, -f / 4], rtol=1e-6)


def test_fade_negative_focal_gamma_focuses_on_easy_prompts():
  # γ = -1: f = (p(1-p))^(-1/2)·(1-p)^(-1). p = 3/4: f = (3/16)^(-1/2)·4 = 16/√3;
  # a⁺ = f·(1/4) = 4/√3, a⁻ = -f·(3/4) = -12/√3.
  inputs = _inputs([1, 1, 1, 0], [0, 0, 0, 0])
  hyper = advantages.hyper_values(eps=0.0, focal_gamma=-1.0)
  r3 = math.sqrt(3)
  expected = [4 / r3, 4 / r3, 4 / r3, -12 / r3]
  np.testing.assert_allclose(_seq(_run("fade", inputs, hyper), inputs), expected, rtol=1e-6)


# ----------------------------------------------------------------------------
# FADE masses and its GRPO / Dr. GRPO special cases.
# ----------------------------------------------------------------------------


def _binary_group(G, k):
  """One group (id 0) of G rows with k successes in rows [0, G), padded to the property tests'
  [B, T] shape (one compile) with singleton groups, which group estimators leave at 0."""
  return _inputs([1.0] * k + [0.0] * (B - k), [0] * G + list(range(G, B)), T=T)


@pytest.mark.parametrize("G", [2, 3, 4, 8])
def test_fade_and_grpo_masses_equal_sqrt_pq(G):
  # GRPO's parameters (α = 1/2, γ = 0, λ = 1, eps = 0): a⁺ = (1-p)/√(p(1-p)), so
  # m_S = p·a⁺ = √(p(1-p)) and m_F = (1-p)·p/√(p(1-p)) = √(p(1-p)).
  fade_hyper = advantages.hyper_values(eps=0.0, std_power=0.5)
  for k in range(1, G):
    p = k / G
    inputs = _binary_group(G, k)
    for name, opts in (("fade", {}), ("grpo", {"unbiased_std": False})):
      seq = _seq(_run(name, inputs, fade_hyper, **opts), inputs)
      np.testing.assert_array_equal(seq[G:], 0.0)  # the padding singletons
      m_s, m_f = advantages.sign_masses(seq[:G])
      np.testing.assert_allclose([m_s, m_f], [math.sqrt(p * (1 - p))] * 2, rtol=1e-6)
    # Dr. GRPO: m = p(1-p); RLOO: G/(G-1)·p(1-p).
    m_s, m_f = advantages.sign_masses(_seq(_run("dr_grpo", inputs), inputs)[:G])
    np.testing.assert_allclose([m_s, m_f], [p * (1 - p)] * 2, rtol=1e-6)
    m_s, m_f = advantages.sign_masses(_seq(_run("rloo", inputs), inputs)[:G])
    np.testing.assert_allclose([m_s, m_f], [G / (G - 1) * p * (1 - p)] * 2, rtol=1e-6)


def test_sign_masses_pinned():
  # ā = [2, -1, 0, -3]: m_S = 2/4, m_F = (1 + 3)/4.
  m_s, m_f = advantages.sign_masses(jnp.asarray([2.0, -1.0, 0.0, -3.0]))
  np.testing.assert_allclose([m_s, m_f], [0.5, 1.0])
  # One group of 4 with p = 1/4 under GRPO (biased, eps 0): m = √(3/16) = √3/4 = 0.4330127.
  inputs = _binary_group(4, 1)
  adv_BT = _run("grpo", inputs, H0, unbiased_std=False)
  m_s, m_f = advantages.sign_masses(_seq(adv_BT, inputs)[:4])
  np.testing.assert_allclose([m_s, m_f], [0.4330127, 0.4330127], rtol=1e-6)


# ----------------------------------------------------------------------------
# Properties (hypothesis): fixed shapes, so each jitted estimator compiles once.
# ----------------------------------------------------------------------------


def _group_sums(x_B, ids):
  return np.bincount(np.asarray(ids), weights=np.asarray(x_B, np.float64), minlength=B)


@SETTINGS
@hypothesis.given(rewards=st.lists(REAL | BINARY, min_size=B, max_size=B), ids=IDS, lengths=LENGTHS)
def test_group_advantages_sum_to_zero_within_each_group(rewards, ids, lengths):
  inputs = _inputs(rewards, ids, lengths, T=T)
  # float32 rounding of r - mean (~eps·|r|) is divided by the group's std: a group of two
  # nearly equal rewards (1.0 and 0.998) sums to ~4e-5, not 0. The bound scales with it.
  r, g = np.asarray(rewards, np.float64), np.asarray(ids)
  groups = [r[g == i] for i in range(B)]
  # (All-equal and singleton groups get exact zeros: no slack for them.)
  scale = np.array([np.abs(x).max() / x.std() if x.size and x.std() > 0 else 0.0 for x in groups])
  atol = 2e-5 + 16 * np.finfo(np.float32).eps * np.bincount(g, minlength=B) * scale
  for name in GROUP_ESTIMATORS:
    seq = _seq(_run(name, inputs), inputs)
    err = np.abs(_group_sums(seq, ids))
    assert np.all(err <= atol), (name, err, atol)


@SETTINGS
@hypothesis.given(values=st.lists(REAL | BINARY, min_size=B, max_size=B), ids=IDS, lengths=LENGTHS)
def test_all_equal_groups_get_exactly_zero_advantage(values, ids, lengths):
  rewards = np.asarray(values, np.float32)[np.asarray(ids)]  # Each group's rewards are equal.
  inputs = _inputs(rewards, ids, lengths, T=T, score_sq=np.arange(B) % 3)
  for name in ZERO_ON_EQUAL:
    for hyper in (H, H0):
      adv_BT = _run(name, inputs, hyper)
      if name.startswith("optimal_"):  # b* = Σ s·c / Σ s rounds (by ~1 ulp of c), unamplified.
        np.testing.assert_allclose(adv_BT, 0.0, atol=1e-6, err_msg=name)
      else:
        np.testing.assert_array_equal(adv_BT, 0.0, err_msg=name)


@SETTINGS
@hypothesis.given(rewards=st.lists(REAL | BINARY, min_size=B, max_size=B), ids=IDS)
def test_rloo_is_g_over_g_minus_1_times_dr_grpo(rewards, ids):
  inputs = _inputs(rewards, ids, T=T)
  n_B = np.bincount(ids, minlength=B)[np.asarray(ids)].astype(np.float64)
  scale_B = np.where(n_B > 1, n_B / np.maximum(n_B - 1, 1), 0.0)  # singletons: 0
  expected = scale_B * _seq(_run("dr_grpo", inputs), inputs)
  np.testing.assert_allclose(_seq(_run("rloo", inputs), inputs), expected, rtol=1e-5, atol=1e-5)


@SETTINGS
@hypothesis.given(rewards=st.lists(BINARY, min_size=B, max_size=B), ids=IDS)
def test_fade_reduces_to_grpo_and_dr_grpo_on_binary_rewards(rewards, ids):
  inputs = _inputs(rewards, ids, T=T)
  # α = 1/2: f·(1-p) = (1-p)/√(p(1-p)) = (r - p)/σ_biased. Exact with eps = 0; with
  # eps = 1e-6 the two place eps differently (σ + eps vs sqrt(σ² + eps)).
  grpo_b = _run("grpo", inputs, H0, unbiased_std=False)
  np.testing.assert_allclose(_run("fade", inputs, H0), grpo_b, rtol=1e-5, atol=1e-6)
  grpo_b = _run("grpo", inputs, H, unbiased_std=False)
  np.testing.assert_allclose(_run("fade", inputs, H), grpo_b, rtol=1e-4, atol=1e-5)
  # α = 0: f = 1, a⁺ = 1 - p = r - r̄, a⁻ = -p = r - r̄.
  hyper = advantages.hyper_values(std_power=0.0)
  np.testing.assert_allclose(
    _run("fade", inputs, hyper), _run("dr_grpo", inputs), rtol=1e-6, atol=1e-6
  )


@SETTINGS
@hypothesis.given(
  k=st.integers(1, B - 1),
  lambda_s=st.floats(0.1, 4.0),
  lambda_f=st.floats(0.1, 4.0),
  focal_gamma=st.floats(-1.0, 2.0),
)
def test_fade_mass_ratio_is_lambda_ratio(k, lambda_s, lambda_f, focal_gamma):
  # m_S = λ_S f p(1-p) and m_F = λ_F f p(1-p), so m_F/m_S = λ_F/λ_S whatever f is.
  inputs = _inputs([1.0] * k + [0.0] * (B - k), [0] * B, T=T)
  hyper = advantages.hyper_values(
    lambda_s=lambda_s, lambda_f=lambda_f, focal_gamma=focal_gamma, std_power=0.5
  )
  m_s, m_f = advantages.sign_masses(_seq(_run("fade", inputs, hyper), inputs))
  p = k / B
  f = (p * (1 - p) + EPS) ** -0.5 * (1 - p) ** focal_gamma
  np.testing.assert_allclose(
    [m_s, m_f], [lambda_s * f * p * (1 - p), lambda_f * f * p * (1 - p)], rtol=1e-5
  )


# ----------------------------------------------------------------------------
# Statistics.
# ----------------------------------------------------------------------------


def test_sequence_advantage_uses_the_mask_and_zero_for_empty_rows():
  adv_BT = jnp.asarray([[1.0, 2.0, 30.0], [4.0, 5.0, 6.0]])
  seq = advantages.sequence_advantage(adv_BT, _mask([2, 0], 3))
  np.testing.assert_allclose(seq, [1.5, 0.0])  # (1 + 2)/2; the empty row gets 0, not NaN.


def test_group_stats_counts_each_group_once():
  # Group 0 (3 rows): all 0. Group 1 (2 rows): all 1. Group 2 (4 rows): mixed.
  # Group 8 (1 row): 0.5, a singleton: zero variance but neither all-0 nor all-1.
  rewards = jnp.asarray([0, 0, 0, 1, 1, 1, 0, 1, 0, 0.5], jnp.float32)
  ids = jnp.asarray([0, 0, 0, 1, 1, 2, 2, 2, 2, 8], jnp.int32)
  stats = jax.jit(advantages.group_stats)(rewards, ids)
  np.testing.assert_allclose(stats["zero_var_groups"], 3 / 4, rtol=1e-6)  # groups 0, 1, 8
  np.testing.assert_allclose(stats["all_zero_groups"], 1 / 4, rtol=1e-6)
  np.testing.assert_allclose(stats["all_one_groups"], 1 / 4, rtol=1e-6)


def test_advantage_stats_pinned():
  # Row 0: tokens [1, 1], row 1: [-2], row 2: empty (its 100 is off the mask).
  adv_BT = jnp.asarray([[1.0, 1.0, 0.0], [-2.0, 0.0, 0.0], [100.0, 0.0, 0.0]])
  mask_BT = _mask([2, 1, 0], 3)
  stats = jax.jit(advantages.advantage_stats)(
    adv_BT,
    mask_BT,
    jnp.asarray([1.1, 0.1, 0.6]),  # Shaped rewards: correctness + 0.1.
    jnp.asarray([1.0, 0.0, 0.5]),  # Correctness.
    jnp.asarray([0, 0, 2], jnp.int32),
  )
  expected = {
    "adv_mean": 0.0,  # (1 + 1 - 2)/3
    "adv_std": math.sqrt(2.0),  # sqrt((1 + 1 + 4)/3)
    "adv_min": -2.0,
    "adv_max": 1.0,  # not 100: off the mask
    "adv_pos_frac": 1 / 3,  # ā = [1, -2, 0]
    "adv_neg_frac": 1 / 3,
    "m_S": 1 / 3,  # (1 + 0 + 0)/3
    "m_F": 2 / 3,  # (0 + 2 + 0)/3
    "reward_mean": 0.6,  # Shaped: (1.1 + 0.1 + 0.6)/3.
    "pass_rate": 2 / 3,  # Correctness > 0 on rows 0 and 2.
    "zero_var_groups": 0.5,  # group 0 = [1, 0] mixed; group 2 a singleton
    "all_zero_groups": 0.0,
    "all_one_groups": 0.0,
  }
  assert set(stats) == set(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(stats[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


@jax.jit
def _group_helpers(x_B, ids_B):
  return dict(
    sum=groups.group_sum(x_B, ids_B),
    size=groups.group_size(ids_B),
    mean=groups.group_mean(x_B, ids_B),
    std1=groups.group_std(x_B, ids_B, unbiased=True),
    std0=groups.group_std(x_B, ids_B, unbiased=False),
    num=groups.num_groups(ids_B),
  )


def test_group_helpers_pinned():
  # Group 4 = rows {0, 2, 4}: x = [1, 0, 0]; group 1 = rows {1, 3, 5}: x = [2, 5, 8].
  # Rows 6, 7: a singleton group 0 (x = 3) and a singleton group 7 (x = 0.7).
  x = jnp.asarray([1.0, 2.0, 0.0, 5.0, 0.0, 8.0, 3.0, 0.7])
  out = _group_helpers(x, jnp.asarray([4, 1, 4, 1, 4, 1, 0, 7], jnp.int32))
  np.testing.assert_allclose(out["sum"], [1, 15, 1, 15, 1, 15, 3, 0.7], rtol=1e-7)
  np.testing.assert_allclose(out["size"], [3, 3, 3, 3, 3, 3, 1, 1])
  np.testing.assert_allclose(out["mean"], [1 / 3, 5, 1 / 3, 5, 1 / 3, 5, 3, 0.7], rtol=1e-6)
  # Unbiased: group 4 Σ dev² = 4/9 + 1/9 + 1/9 = 2/3, var 1/3; group 1 Σ dev² = 18, var 9.
  # Biased: 2/9 and 6. A singleton has std 0 with either ddof.
  s4, s1 = math.sqrt(1 / 3), 3.0
  np.testing.assert_allclose(out["std1"], [s4, s1] * 3 + [0, 0], rtol=1e-6)
  s4, s1 = math.sqrt(2 / 9), math.sqrt(6)
  np.testing.assert_allclose(out["std0"], [s4, s1] * 3 + [0, 0], rtol=1e-6)
  assert int(out["num"]) == 4
  # An all-equal group's mean is exact (a plain Σ/n of 7 × 0.7, padded by a singleton, is off
  # by rounding), so its deviations and std are exactly 0.
  out = _group_helpers(jnp.full((8,), 0.7), jnp.asarray([0] * 7 + [3], jnp.int32))
  np.testing.assert_array_equal(out["mean"], np.float32(0.7))
  np.testing.assert_array_equal(out["std1"], 0.0)


# ----------------------------------------------------------------------------
# Hyperparameters and compilation.
# ----------------------------------------------------------------------------


def test_changing_hyper_does_not_recompile():
  traces = []

  def fn(inputs, hyper):
    traces.append(None)  # Runs once per trace, never on a cache hit.
    return advantages.fade(inputs, hyper) + advantages.reinforce_pp(inputs, hyper)

  jitted = jax.jit(fn)
  inputs = _inputs([1, 0, 0, 1], [0, 0, 0, 0], lengths=[3, 2, 1, 3], kl=np.ones((4, 3)))
  out_a = jitted(inputs, advantages.hyper_values())
  out_b = jitted(
    inputs,
    advantages.hyper_values(
      eps=1e-3, gamma=0.9, lambda_s=2.0, lambda_f=0.5, std_power=0.0, focal_gamma=1.0
    ),
  )
  assert len(traces) == 1
  assert jitted._cache_size() == 1
  assert not np.allclose(out_a, out_b)  # The new values did take effect.


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(eps=-1e-6), r"advantage_hyper.eps=-1e-06: must be a number in \[0, inf\]"),
    (dict(gamma=1.5), r"advantage_hyper.gamma=1.5: must be a number in \[0, 1\]"),
    (dict(gamma=-0.1), r"advantage_hyper.gamma=-0.1: must be a number in \[0, 1\]"),
    (dict(lambda_s=-1.0), r"advantage_hyper.lambda_s=-1.0: must be a number in \[0, inf\]"),
    (dict(lambda_f=-1.0), r"advantage_hyper.lambda_f=-1.0: must be a number in \[0, inf\]"),
    (dict(std_power=-0.5), r"advantage_hyper.std_power=-0.5: must be a number in \[0, inf\]"),
    (dict(ibpo_tau=0.0), r"ibpo_tau=0.0: must be in \(0, 1\] \(1: keep every"),
    (dict(ibpo_is_cap=0), r"ibpo_is_cap=0: must be > 0 \(c of perturbed"),
    (dict(std_power=float("inf")), r"std_power=inf: must be a number in \[0, inf\]"),
    (dict(kl_coef=0.1), r"\['kl_coef'\] are declared by no advantage estimator"),
  ],
)
def test_advantage_hyper_rejects_bad_values(kwargs, match):
  """Each value out of its declaration's range, an infinite one, and a name no estimator
  declares (β of the KL is rl.kl_coef, not an estimator's)."""
  with pytest.raises(ValueError, match=match):
    advantages.hyper_values(**kwargs)


def test_advantage_hyper_is_float32_arrays():
  hyper = advantages.hyper_values(gamma=0.5, focal_gamma=-1.0)
  for field in ("eps", "gamma", "lambda_s", "lambda_f", "std_power", "focal_gamma"):
    value = getattr(hyper, field)
    assert value.dtype == jnp.float32 and value.shape == (), field
  assert float(hyper.gamma) == 0.5 and float(hyper.focal_gamma) == -1.0


# ----------------------------------------------------------------------------
# Config edge and host-side validation.
# ----------------------------------------------------------------------------


def test_get_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="Unknown advantage estimator 'nope'") as info:
    advantages.REGISTRY.make("nope")
  for name in (
    "batch_mean",
    "batch_mean_std",
    "dr_grpo",
    "fade",
    "grpo",
    "optimal_baseline",
    "positive_only",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
  ):
    assert name in str(info.value)
  assert set(advantages.REGISTRY.names()) == set(
    str(info.value).split("valid names: ")[1][:-1].split(", ")
  )


def test_get_unknown_options_lists_allowed():
  with pytest.raises(ValueError, match=r"no options \['ddof'\]; allowed: \['unbiased_std'\]"):
    advantages.REGISTRY.make("grpo", ddof=1)
  with pytest.raises(ValueError, match="allowed: none"):
    advantages.REGISTRY.make("dr_grpo", unbiased_std=False)
  with pytest.raises(ValueError, match="scope must be 'group' or 'batch'"):
    advantages.REGISTRY.make("optimal_baseline", scope="global")
  with pytest.raises(ValueError, match="optimal_token_baseline scope must be"):
    advantages.REGISTRY.make("optimal_token_baseline", scope="rows")
  assert advantages.REGISTRY.make("rloo") is advantages.rloo  # No options: the function itself.


def test_validate_group_ids_accepts_consistent_batches():
  groups.validate_group_ids(np.array([1, 0, 1, 0]), group_size=2)  # non-contiguous is fine
  groups.validate_group_ids(np.array([3, 3, 3, 3]), group_size=4)
  groups.validate_group_ids(np.array([0, 0, 2]))  # no group_size: any sizes


@pytest.mark.parametrize(
  "ids, group_size, match",
  [
    ([0, 0, 0, 1, 1], 2, "5 rows is not a multiple of group_size 2"),
    ([0, 0, 0, 1], 2, r"every group must have 2 rows, but groups \[0, 1\] have \[3, 1\]"),
    ([0, 1, 2, 3], 2, r"groups \[0, 1, 2, 3\] have \[1, 1, 1, 1\]"),
    ([0, 4, 1, 1], None, r"must lie in \[0, 4\) for a batch of 4 rows; rows \[1\] hold \[4\]"),
    ([0, -1, 1, 1], 2, r"rows \[1\] hold \[-1\]"),
  ],
)
def test_validate_group_ids_rejects(ids, group_size, match):
  with pytest.raises(ValueError, match="group_ids must lie|Group sizes are inconsistent"):
    groups.validate_group_ids(np.array(ids), group_size=group_size)
  with pytest.raises(ValueError, match=match):
    groups.validate_group_ids(np.array(ids), group_size=group_size)


def test_validate_group_ids_rejects_non_integer_or_2d():
  with pytest.raises(ValueError, match="1-D integer array"):
    groups.validate_group_ids(np.array([0.0, 1.0]))
  with pytest.raises(ValueError, match="1-D integer array"):
    groups.validate_group_ids(np.zeros((2, 2), np.int32))


def test_validate_rewards_names_the_bad_rows():
  groups.validate_rewards(np.array([0.0, 1.0, -3.5]))
  with pytest.raises(ValueError, match=r"rows \[2\] hold \[nan\]"):
    groups.validate_rewards(np.array([0.0, 1.0, np.nan, 1.0]))
  with pytest.raises(ValueError, match=r"rows \[1, 3\] hold \[inf, nan\]"):
    groups.validate_rewards([0.0, np.inf, 1.0, np.nan])
  with pytest.raises(ValueError, match=r"\(10 rows in all\)"):
    groups.validate_rewards(np.full(10, np.nan))


# ----------------------------------------------------------------------------
# Excluded rows (valid_B = False): masked equals dropped, for every estimator.
# ----------------------------------------------------------------------------

_EVERY_ESTIMATOR = [(n, {}) for n in advantages.REGISTRY.names()] + [
  ("optimal_baseline", {"scope": "batch"}),
  ("optimal_token_baseline", {"scope": "batch"}),
]


@pytest.mark.parametrize("name, options", _EVERY_ESTIMATOR, ids=lambda x: str(x))
@hypothesis.given(
  rewards=st.lists(BINARY | REAL, min_size=B, max_size=B),
  ids=IDS,
  lengths=LENGTHS,
  valid=st.lists(st.booleans(), min_size=B, max_size=B),
  score_sq=st.lists(st.floats(0.125, 4.0, width=32), min_size=B, max_size=B),
)
@SETTINGS
def test_excluded_rows_change_nothing_else(name, options, rewards, ids, lengths, valid, score_sq):
  """Rows with valid_B = False get A = 0, and the other rows get exactly what the estimator
  gives on the batch without them (group and batch statistics skip them)."""
  hypothesis.assume(any(valid))
  full = _inputs(rewards, ids, lengths, score_sq=score_sq)
  masked = full.replace(valid_B=jnp.asarray(valid))
  got = np.asarray(_run(name, masked, **options))
  keep = np.flatnonzero(valid)
  _, dense_ids = np.unique(np.asarray(ids)[keep], return_inverse=True)  # Ids in [0, B').
  pad = B - keep.size  # Same shape (one compile): padding rows are excluded too.
  dropped = _inputs(
    [rewards[i] for i in keep] + [0.0] * pad,
    list(dense_ids) + [0] * pad,
    [lengths[i] for i in keep] + [1] * pad,
    score_sq=[score_sq[i] for i in keep] + [1.0] * pad,
    row_keys=list(keep) + [B + i for i in range(pad)],  # Each kept row keeps its tokens.
  ).replace(valid_B=jnp.arange(B) < keep.size)
  want = np.asarray(_run(name, dropped, **options))
  np.testing.assert_array_equal(got[~np.asarray(valid)], 0.0)
  np.testing.assert_allclose(got[keep], want[: keep.size], rtol=2e-5, atol=2e-5)


def test_excluding_rows_changes_the_others_when_it_should():
  """The control: without valid_B the excluded row's reward moves its group's baseline."""
  inputs = _inputs([1.0, 0.0, 0.0, 1.0], [0, 0, 0, 0])
  a = np.asarray(_run("dr_grpo", inputs))[:, 0]
  b = np.asarray(_run("dr_grpo", inputs.replace(valid_B=jnp.array([True, True, True, False]))))
  np.testing.assert_allclose(a, [0.5, -0.5, -0.5, 0.5])
  np.testing.assert_allclose(b[:, 0], [2 / 3, -1 / 3, -1 / 3, 0.0], rtol=1e-6)


def test_works_without_groups():
  assert advantages.works_without_groups("batch_mean", {})
  assert advantages.works_without_groups("optimal_baseline", {"scope": "batch"})
  assert advantages.works_without_groups("optimal_token_baseline", {"scope": "batch"})
  assert not advantages.works_without_groups("optimal_baseline", {})
  assert not advantages.works_without_groups("grpo", {})
  # Every estimator listed as batch-level gives non-zero advantages to singleton groups.
  inputs = _inputs([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0], list(range(8)))
  for name, options in _EVERY_ESTIMATOR:
    nonzero = bool(np.any(np.asarray(_run(name, inputs, **options)) != 0))
    assert nonzero == advantages.works_without_groups(name, options), name


def test_the_trainer_asks_an_estimators_traits_not_its_name(monkeypatch):
  """A toy estimator registered with traits (as a user's file would) is judged by them: its
  need of π_old refuses recompute_old_logp=False, its batch level passes group_size 1, its
  option check runs in `get`, and its own metrics are what the trainer logs for it."""
  from grpo_jax.infra import registry  # noqa: PLC0415
  from grpo_jax.rl import spec  # noqa: PLC0415

  monkeypatch.setattr(advantages.REGISTRY, "_items", dict(advantages.REGISTRY._items))
  monkeypatch.setattr(advantages.REGISTRY, "_traits", dict(advantages.REGISTRY._traits))

  def check(*, width=1.0):
    if width <= 0:
      raise ValueError(f"toy width must be > 0, got {width}.")

  @advantages.REGISTRY.register(
    "toy",
    needs_old_logp=True,
    batch_level=True,
    check=check,
    metrics=lambda inputs, hyper, **o: {"toy/reward_sum": jnp.sum(inputs.rewards_B)},
  )
  def toy(inputs, hyper, *, width=1.0):
    """A_i = width · r_i."""
    return advantages.to_tokens(width * inputs.rewards_B, inputs.token_mask)

  with pytest.raises(ValueError, match=r"advantage='toy' needs; set recompute_old_logp=True"):
    spec.RLConfig(advantage="toy", recompute_old_logp=False)
  spec.RLConfig(advantage="toy")  # Fine with π_old recomputed.
  assert advantages.works_without_groups("toy", {}) and "toy" in advantages.batch_level_names()
  with pytest.raises(ValueError, match="toy width must be > 0"):
    advantages.REGISTRY.make("toy", width=0.0)
  inputs = _inputs([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1])
  np.testing.assert_allclose(
    np.asarray(advantages.REGISTRY.make("toy", width=2.0)(inputs, None))[:, 0], [2, 0, 2, 2]
  )
  assert advantages.REGISTRY.traits("toy").metrics(inputs, None)["toy/reward_sum"] == 3.0
  # The defaults, and the one hyperparameter grpo reads.
  assert advantages.REGISTRY.traits("grpo") == advantages.Traits(hyper={"eps": advantages.EPS})
  with pytest.raises(TypeError, match="unexpected keyword argument 'needs_reference'"):
    advantages.REGISTRY.register("toy2", needs_reference=True)
  with pytest.raises(ValueError, match="declares no traits"):
    registry.Registry("thing").register("x", fast=True)
