"""Token-credit diagnostics without a model: flip table, taggers, cancellation residual,
metric-key definitions. Numbers pinned by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.diagnostics import cancellation, flips
from grpo_jax.infra import metrics
from grpo_jax.rl import advantages
from tests.rl import test_aggregation as agg_case

# ----------------------------------------------------------------------------
# Token flipping.
# ----------------------------------------------------------------------------

# Rows 0, 2 are positive (ā > 0), rows 1, 3 negative. Category 1 = template. τ = 1e-3.
FLIP_DELTA = np.asarray(
  [
    [0.5, -0.2, 0.0005, 0.3],  # B(template) S(reasoning) U(reasoning) B(template)
    [-0.4, 0.1, 0.2, 9.9],  # S(template) B B; the 9.9 is off the mask
    [0.0, -0.01, 9.0, 9.0],  # U(template) S(reasoning); two masked slots
    [-0.3, -0.002, 0.05, 0.0008],  # S(template) S(template) B(reasoning) U(reasoning)
  ],
  np.float32,
)
FLIP_MASK = np.arange(4)[None, :] < np.asarray([4, 3, 2, 4])[:, None]
FLIP_CAT = np.asarray([[1, 0, 0, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]])
FLIP_ADV = np.asarray([1.0, -1.0, 0.5, -2.0], np.float32)


def test_flip_fractions_pinned_by_hand():
  r = flips.flip_report(FLIP_DELTA, FLIP_MASK, FLIP_ADV, FLIP_CAT, tau=1e-3)
  expected = {
    # Positive rows: 6 tokens, 2 boosted (0.5, 0.3), 2 suppressed (-0.2, -0.01), 2 unchanged.
    "pos/all": (2 / 6, 2 / 6, 2 / 6, 6),
    "pos/template": (2 / 3, 0, 1 / 3, 3),  # 0.5, 0.3, 0.0
    "pos/reasoning": (0, 2 / 3, 1 / 3, 3),  # -0.2, 0.0005, -0.01
    # Negative rows: 7 tokens; boosted 0.1, 0.2, 0.05; suppressed -0.4, -0.3, -0.002.
    "neg/all": (3 / 7, 3 / 7, 1 / 7, 7),
    "neg/template": (0, 1, 0, 3),
    "neg/reasoning": (3 / 4, 0, 1 / 4, 4),
    "all/all": (5 / 13, 5 / 13, 3 / 13, 13),
  }
  for cell, (b, s, u, n) in expected.items():
    got = [r[f"flip/{cell}/{k}"] for k in ("boosted", "suppressed", "unchanged", "count")]
    np.testing.assert_allclose(got, [b, s, u, n], rtol=1e-6, atol=1e-12, err_msg=cell)
  # |Δ| share of template tokens: pos 0.8 / 1.0105, neg 0.702 / 1.0528.
  np.testing.assert_allclose(r["flip/pos/template/abs_delta_share"], 0.8 / 1.0105, rtol=1e-5)
  np.testing.assert_allclose(r["flip/neg/template/abs_delta_share"], 0.702 / 1.0528, rtol=1e-5)
  np.testing.assert_allclose(r["flip/all/all/abs_delta_share"], 1.0, rtol=1e-6)


def test_flip_dead_band_zero_and_bool_categories():
  # τ = 0: 0.0005 and 0.0008 become boosted; only the exact 0.0 stays unchanged.
  r = flips.flip_report(FLIP_DELTA, FLIP_MASK, FLIP_ADV, FLIP_CAT.astype(bool), tau=0.0)
  np.testing.assert_allclose(r["flip/all/all/boosted"], 7 / 13)
  np.testing.assert_allclose(r["flip/all/all/unchanged"], 1 / 13)
  empty = flips.flip_report(FLIP_DELTA, np.zeros_like(FLIP_MASK), FLIP_ADV, tau=0.0)
  assert np.isnan(empty["flip/pos/all/boosted"]) and empty["flip/pos/all/count"] == 0


def test_taggers():
  tokens = np.asarray([[3, 4, 5], [7, 3, 0]])
  np.testing.assert_array_equal(
    flips.template_mask(tokens, template_ids=[3, 7]), [[1, 0, 0], [1, 1, 0]]
  )
  strings = ["<pad>", " ", "\\boxed{", "12", "A", ".", "think", "<think>"]
  got = flips.regex_tagger(strings, patterns=[r"^\s*$", r"^[\W_]+$", r"\\boxed", r"^<\w+>$"])
  np.testing.assert_array_equal(got, [1, 1, 1, 0, 0, 1, 0, 1])
  task = tasks.get("arithmetic")
  tok = task.tokenizer()
  ids = flips.task_template_ids(task, tok)
  assert sorted(tok.token_str(i) for i in ids) == [".", ":", "A"]
  names = flips.vocab_strings(tok)
  assert names[:3] == ["<pad>", "<bos>", "<eos>"] and names[ids[0]] in "A:."


# ----------------------------------------------------------------------------
# Cancellation residual.
# ----------------------------------------------------------------------------

# The constructed case of tests/rl/test_aggregation.py: group 0 = rows {0, 2, 3, 5} with
# rewards [1, 0, 0, 1] and lengths [2, 3, 4, 6]; group 3 = rows {1, 4}, both rewarded
# (A = 0). Token 7 occurs exactly once in every rollout of group 0.
CAN_IDS = np.asarray(agg_case.CAN_IDS, np.int32)
CAN_REWARDS = np.asarray(agg_case.CAN_REWARDS, np.float32)
CAN_TOKENS = np.asarray(agg_case.CAN_TOKENS, np.int32)
CAN_MASK = np.asarray(agg_case.CAN_MASK, bool)
V = 8


def _can_adv(estimator="grpo"):
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.asarray(CAN_REWARDS),
    group_ids_B=jnp.asarray(CAN_IDS),
    mask_BT=jnp.asarray(CAN_MASK),
  )
  return np.asarray(advantages.REGISTRY.make(estimator)(inputs, advantages.hyper_values()))


def _residuals(mode, adv_BT):
  w_BT = cancellation.aggregation_weights(mode, CAN_MASK, CAN_IDS, adv_BT)
  r = cancellation.token_residual(CAN_TOKENS, w_BT, adv_BT, CAN_MASK, vocab_size=V)
  r_GV = cancellation.group_token_residual(
    CAN_TOKENS, w_BT, adv_BT, CAN_MASK, CAN_IDS, vocab_size=V
  )
  return {k: np.asarray(x) for k, x in r.items()}, np.asarray(r_GV)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_residual_is_exactly_zero_in_the_constructed_case(estimator):
  adv_BT = _can_adv(estimator)
  r, r_GV = _residuals("token_mean", adv_BT)
  assert abs(r["residual"][7]) <= 1e-7 and abs(r_GV[0, 7]) <= 1e-7
  # Not vacuous: gross credit 4·|a|/21 (21 loss tokens) cancels.
  assert r["count"][7] == 4
  np.testing.assert_allclose(r["gross"][7], 4 * abs(adv_BT[0, 0]) / 21, rtol=1e-6)
  np.testing.assert_allclose(r_GV.sum(axis=0), r["residual"], atol=1e-7)  # groups add up


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_residual_is_nonzero_under_length_normalisation(estimator):
  adv_BT = _can_adv(estimator)
  a = float(adv_BT[0, 0])
  # w_i = 1/(6 L_i), L = [2, 3, 4, 6], A = [a, -a, -a, a]: (a/6)(1/2 - 1/3 - 1/4 + 1/6) = a/72.
  r, r_GV = _residuals("seq_mean_token_mean", adv_BT)
  np.testing.assert_allclose(r["residual"][7], a / 72, rtol=1e-5)
  np.testing.assert_allclose(r_GV[0, 7], a / 72, rtol=1e-5)
  assert a > 0.4


def test_residual_report_pinned():
  # One group of two rollouts, A = [1, -1], token_mean w = 1/4: r_5 = 0, r_6 = 1/4, r_7 = -1/4.
  tokens = np.asarray([[5, 6], [5, 7]], np.int32)
  mask = np.ones((2, 2), bool)
  adv = np.asarray([[1.0, 1.0], [-1.0, -1.0]], np.float32)
  ids = np.zeros(2, np.int32)
  w = cancellation.aggregation_weights("token_mean", mask, ids, adv)
  r = cancellation.residual_report(
    tokens, w, adv, mask, ids, vocab_size=V, top_k=2, num_bands=2, category_V=np.arange(V) == 5
  )
  assert r["cancel/net"] == 0.0
  np.testing.assert_allclose([r["cancel/abs_residual"], r["cancel/gross"]], [0.5, 1.0])
  np.testing.assert_allclose(r["cancel/residual_ratio"], 0.5)
  np.testing.assert_allclose(r["cancel/group_abs_residual"], 0.5)
  # |r_6| = |r_7|: ties go to the smaller id.
  assert (r["cancel/top0/id"], r["cancel/top1/id"]) == (6, 7)
  np.testing.assert_allclose([r["cancel/top0/residual"], r["cancel/top1/residual"]], [0.25, -0.25])
  # Bands by count: 5 (2 occurrences), 6 (1) | 7 (1).
  assert (r["cancel/band0/num_ids"], r["cancel/band0/max_count"]) == (2, 2.0)
  np.testing.assert_allclose(r["cancel/band0/abs_residual_share"], 0.5)
  np.testing.assert_allclose(r["cancel/band0/residual_ratio"], 0.25 / 0.75)
  np.testing.assert_allclose(r["cancel/band1/residual_ratio"], 1.0)
  # Category 1 = {id 5}: fully cancelled.
  assert r["cancel/template/abs_residual_share"] == 0.0
  assert r["cancel/template/residual_ratio"] == 0.0


def test_frequency_bands_pinned():
  # Present ids by count: 4 (5), 1 (3), 2 (1), 3 (1) -> bands [4, 1] | [2, 3].
  np.testing.assert_array_equal(
    cancellation.frequency_bands([0, 3, 1, 1, 5], num_bands=2), [-1, 0, 1, 1, 0]
  )


def test_compare_aggregations_table():
  adv_BT = _can_adv("grpo")
  table = cancellation.compare_aggregations(
    ["token_mean", "seq_mean_token_mean"], CAN_TOKENS, adv_BT, CAN_MASK, CAN_IDS, vocab_size=V
  )
  assert list(table) == ["token_mean", "seq_mean_token_mean"]
  w_BT = cancellation.aggregation_weights("seq_mean_token_mean", CAN_MASK, CAN_IDS, adv_BT)
  row = cancellation.residual_report(
    CAN_TOKENS, w_BT, adv_BT, CAN_MASK, CAN_IDS, vocab_size=V, prefix="cancel/seq_mean_token_mean"
  )
  assert table["seq_mean_token_mean"] == row
  tm, sm = (table[n][f"cancel/{n}/abs_residual"] for n in table)
  assert abs(tm - sm) > 1e-3  # The modes differ on this ragged batch.
  flat = {k: v for row in table.values() for k, v in row.items()}
  for key in flat:
    metrics.definition(key)


# ----------------------------------------------------------------------------
# Definitions.
# ----------------------------------------------------------------------------


def test_every_flip_key_has_a_definition():
  for key in flips.flip_report(FLIP_DELTA, FLIP_MASK, FLIP_ADV, FLIP_CAT, tau=1e-3):
    metrics.definition(key)
  with pytest.raises(KeyError, match="no definition"):
    metrics.definition("flip/pos/template/sideways")
  assert "parameter path" in metrics.definition("rank/layer_1/mlp/up/kernel/stable_rank")


def test_loss_coefficients_are_what_ppo_clipping_applies():
  """c = −∂(Σ w·ℓ_tok)/∂ℓ: w·A·ρ where the unclipped branch is active, 0 where clipping
  binds (ε = 0.2), and exactly w·A at ρ = 1."""
  from grpo_jax.diagnostics import report
  from grpo_jax.rl import losses

  #            A>0 ρ=1.5  A>0 ρ=1.1  A<0 ρ=0.5  A<0 ρ=1.3  padding
  adv = jnp.asarray([[2.0, 2.0, -1.0, -1.0, 5.0]])
  ratio = jnp.asarray([[1.5, 1.1, 0.5, 1.3, 1.0]])
  mask = jnp.asarray([[True, True, True, True, False]])
  w = jnp.asarray([[0.5, 0.25, 0.5, 0.25, 1.0]])
  old = jnp.log(jnp.asarray([[0.2, 0.3, 0.4, 0.5, 0.5]]))
  hyper = losses.hyper_values(eps_low=0.2, eps_high=0.2)
  got = report.loss_coefficients(old + jnp.log(ratio), old, adv, mask, w, hyper, "ppo_clip")
  np.testing.assert_allclose(got, [[0.0, 0.25 * 2.0 * 1.1, 0.0, 0.25 * -1.0 * 1.3, 0.0]], rtol=1e-5)
  at_old = report.loss_coefficients(old, old, adv, mask, w, hyper, "ppo_clip")
  np.testing.assert_allclose(at_old, jnp.where(mask, w * adv, 0.0), rtol=1e-6)
