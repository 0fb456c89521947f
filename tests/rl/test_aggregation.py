"""Loss aggregation weights: hand-computed weights on a ragged batch, formula equality,
micro-batching invariance (and the naive scheme that breaks it), token cancellation."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages, aggregation

MODES = (
  "token_mean",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "constant_norm",
  "group_token_mean",
  "balanced",
)
SETTINGS = hypothesis.settings(max_examples=30, deadline=None)


def _mask(lengths, T):
  return jnp.arange(T)[None, :] < jnp.asarray(lengths, jnp.int32)[:, None]


@functools.cache
def _jitted(name, max_len=None):
  return jax.jit(functools.partial(aggregation.REGISTRY.make(name), max_len=max_len))


def _weights(name, mask_BT, group_ids_B, adv_BT, max_len=None):
  return np.asarray(
    _jitted(name, max_len)(
      jnp.asarray(mask_BT), jnp.asarray(group_ids_B, jnp.int32), jnp.asarray(adv_BT, jnp.float32)
    )
  )


# ----------------------------------------------------------------------------
# Pinned weights on a ragged batch.
# ----------------------------------------------------------------------------

# B = 6, T = 4. Lengths [4, 1, 0, 3, 2, 0] (two empty rows). Groups are non-contiguous:
# group 1 = rows {0, 2, 4}, group 0 = rows {1, 3}, group 5 = row {5} (all empty).
# Sequence advantages ā = [1, -1, (empty), 2, 0, (empty)]; row 3's tokens vary (3, 2, 1),
# row 4's are (1, -1): ā = 0, so it falls in the zero class of `balanced`.
RAGGED_LENGTHS = [4, 1, 0, 3, 2, 0]
RAGGED_IDS = [1, 0, 1, 0, 1, 5]
RAGGED_MASK = np.asarray(_mask(RAGGED_LENGTHS, 4))
RAGGED_ADV = np.where(
  RAGGED_MASK,
  np.asarray(
    [[1, 1, 1, 1], [-1, 7, 7, 7], [0.5] * 4, [3, 2, 1, 7], [1, -1, 7, 7], [-3] * 4], np.float32
  ),
  0.0,
)


def _per_row(values):
  """[B, T] weights from one weight per row, 0 off the mask."""
  return np.where(RAGGED_MASK, np.asarray(values, np.float64)[:, None], 0.0)


RAGGED_EXPECTED = {
  # N = 4 + 1 + 0 + 3 + 2 + 0 = 10 tokens.
  "token_mean": _per_row([1 / 10] * 6),
  # B' = 4 non-empty rows; w = 1/(B'·L_i) = 1/16, 1/4, -, 1/12, 1/8.
  "seq_mean_token_mean": _per_row([1 / 16, 1 / 4, 0, 1 / 12, 1 / 8, 0]),
  # w = 1/B' = 1/4.
  "seq_mean_token_sum": _per_row([1 / 4] * 6),
  # w = 1/(B·T) = 1/(6·4) = 1/24 (empty rows still count in B).
  "constant_norm": _per_row([1 / 24] * 6),
  # Group 1 holds 4 + 0 + 2 = 6 tokens, group 0 holds 1 + 3 = 4, group 5 none: G' = 2.
  # w = 1/(G'·6) = 1/12 for group 1, 1/(G'·4) = 1/8 for group 0.
  "group_token_mean": _per_row([1 / 12, 1 / 8, 0, 1 / 8, 1 / 12, 0]),
  # Classes over the B' = 4 non-empty rows: positive {0, 3} (7 tokens), negative {1}
  # (1 token), zero {4} (2 tokens). w = (n_c/B')/tokens_c: (2/4)/7 = 1/14, (1/4)/1 = 1/4,
  # (1/4)/2 = 1/8.
  "balanced": _per_row([1 / 14, 1 / 4, 0, 1 / 14, 1 / 8, 0]),
}


@pytest.mark.parametrize("name", MODES)
def test_pinned_weights_on_ragged_batch(name):
  w_BT = _weights(name, RAGGED_MASK, RAGGED_IDS, RAGGED_ADV)
  np.testing.assert_allclose(w_BT, RAGGED_EXPECTED[name], rtol=1e-6, atol=0)


def test_pinned_weight_totals():
  # Means sum to 1; seq_mean_token_sum sums to N/B' = 10/4; constant_norm to N/(B·T) = 10/24.
  totals = {name: RAGGED_EXPECTED[name].sum() for name in MODES}
  np.testing.assert_allclose([totals[n] for n in MODES], [1, 1, 10 / 4, 10 / 24, 1, 1], rtol=1e-12)


def test_constant_norm_uses_max_len():
  # L_max = 8 instead of the padded T = 4: w = 1/(6·8) = 1/48.
  w_BT = _weights("constant_norm", RAGGED_MASK, RAGGED_IDS, RAGGED_ADV, max_len=8)
  np.testing.assert_allclose(w_BT, _per_row([1 / 48] * 6), rtol=1e-6)


def test_all_empty_batch_gives_zero_weights_not_nan():
  mask_BT = np.zeros((3, 4), bool)
  for name in MODES:
    w_BT = _weights(name, mask_BT, [0, 0, 1], np.zeros((3, 4)))
    np.testing.assert_array_equal(w_BT, 0.0, err_msg=name)


def test_aggregate_is_the_weighted_sum():
  # Σ w·ℓ = 0.5·2 + 0.25·(-4) + 0·100 = 0.
  w_BT = jnp.asarray([[0.5, 0.25, 0.0]])
  loss_BT = jnp.asarray([[2.0, -4.0, 100.0]])
  np.testing.assert_allclose(aggregation.aggregate(loss_BT, w_BT), 0.0)
  # w = [2, 1.5, 1]: 2·2 + 1.5·(-4) + 1·100 = 98.
  np.testing.assert_allclose(aggregation.aggregate(loss_BT, 2 * w_BT + 1), 98.0)


# ----------------------------------------------------------------------------
# Each mode equals its formula (an independent numpy implementation).
# ----------------------------------------------------------------------------


def _reference(name, mask_BT, ids_B, adv_BT, max_len=None):
  """The docstring formulas with explicit loops, in float64."""
  B, T = mask_BT.shape
  L = mask_BT.sum(axis=1).astype(np.float64)
  n_seq = max(int((L > 0).sum()), 1)
  a_bar = [adv_BT[i, mask_BT[i]].astype(np.float64).mean() if L[i] else 0.0 for i in range(B)]
  sign = np.sign(a_bar)
  nonempty_groups = {ids_B[j] for j in range(B) if L[j] > 0}
  w = np.zeros((B, T))
  for i in range(B):
    if name == "token_mean":
      wi = 1 / L.sum() if L.sum() else 0.0
    elif name == "seq_mean_token_mean":
      wi = 1 / (n_seq * L[i]) if L[i] else 0.0
    elif name == "seq_mean_token_sum":
      wi = 1 / n_seq
    elif name == "constant_norm":
      wi = 1 / (B * (max_len or T))
    elif name == "group_token_mean":
      group_tokens = sum(L[j] for j in range(B) if ids_B[j] == ids_B[i])
      wi = 1 / (len(nonempty_groups) * group_tokens) if group_tokens else 0.0
    elif name == "balanced":
      members = [j for j in range(B) if L[j] > 0 and sign[j] == sign[i]]
      tokens = sum(L[j] for j in members)
      wi = (len(members) / n_seq) / tokens if L[i] else 0.0
    w[i] = np.where(mask_BT[i], wi, 0.0)
  return w


@st.composite
def ragged_batches(draw, B=6, T=5):
  lengths = np.asarray(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
  ids = np.asarray(draw(st.lists(st.integers(0, B - 1), min_size=B, max_size=B)))
  row_adv = np.asarray(
    draw(st.lists(st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=B, max_size=B))
  )
  mask = np.asarray(_mask(lengths, T))
  adv = np.where(mask, row_adv[:, None], 0.0).astype(np.float32)
  return mask, ids, adv


@SETTINGS
@hypothesis.given(batch=ragged_batches(), max_len=st.sampled_from([None, 7]))
def test_each_mode_equals_its_formula(batch, max_len):
  mask, ids, adv = batch
  for name in MODES:
    got = _weights(name, mask, ids, adv, max_len)
    np.testing.assert_allclose(
      got, _reference(name, mask, ids, adv, max_len), rtol=1e-6, atol=1e-9, err_msg=name
    )


@pytest.mark.parametrize("name", MODES)
def test_pinned_batch_matches_reference(name):
  # The independent implementation agrees with the hand-computed weights too.
  np.testing.assert_allclose(
    _reference(name, RAGGED_MASK, RAGGED_IDS, RAGGED_ADV), RAGGED_EXPECTED[name], rtol=1e-12
  )


# ----------------------------------------------------------------------------
# Micro-batching invariance.
# ----------------------------------------------------------------------------

# B = 8 rows in K = 2 micro-batches of 4 (rows 0-3, 4-7). Ragged, one empty row (5, in the
# second micro-batch), groups split across the micro-batches (group g = rows {g, g + 4}).
MB_B, MB_T, MB_K, MB_V = 8, 5, 2, 6
MB_LENGTHS = [5, 1, 3, 2, 4, 0, 5, 1]
MB_IDS = np.asarray([0, 1, 2, 3, 0, 1, 2, 3], np.int32)
_rng = np.random.default_rng(0)
MB_MASK = np.asarray(_mask(MB_LENGTHS, MB_T))
MB_TOKENS = _rng.integers(0, MB_V, (MB_B, MB_T)).astype(np.int32)
MB_NOISE = _rng.normal(size=(MB_B, MB_T, MB_V)).astype(np.float32)
MB_ADV = np.where(
  MB_MASK, np.asarray([1.0, -1.0, 0.5, -0.5, -1.0, 2.0, 2.0, -2.0], np.float32)[:, None], 0.0
).astype(np.float32)
THETA = jnp.asarray(_rng.normal(size=MB_V), jnp.float32)


def _token_loss(theta_V, rows):
  """ℓ_{i,t} = -A_{i,t}·log π_θ(o_{i,t}) with logits θ + noise_{i,t}: a per-token loss whose
  gradient w.r.t. the shared parameter θ mixes every token."""
  logits_BTV = theta_V[None, None, :] + MB_NOISE[rows]
  logp_BT = jnp.take_along_axis(jax.nn.log_softmax(logits_BTV), MB_TOKENS[rows][..., None], axis=-1)
  return -MB_ADV[rows] * logp_BT[..., 0]


def _slices():
  n = MB_B // MB_K
  return [np.arange(k * n, (k + 1) * n) for k in range(MB_K)]


def _full_objective(name):
  w_BT = _weights(name, MB_MASK, MB_IDS, MB_ADV)
  return lambda theta: jnp.sum(w_BT * _token_loss(theta, np.arange(MB_B)))


def _accumulated_objective(name):
  """The train step: w over the whole mini-batch, then Σ_k Σ_{micro-batch k} w·ℓ."""
  w_BT = _weights(name, MB_MASK, MB_IDS, MB_ADV)
  return lambda theta: sum(jnp.sum(w_BT[r] * _token_loss(theta, r)) for r in _slices())


def _naive_objective(name):
  """Per-micro-batch weights, then the mean of the micro-batch losses."""
  ws = [_weights(name, MB_MASK[r], MB_IDS[r], MB_ADV[r]) for r in _slices()]
  return lambda theta: (
    sum(jnp.sum(w * _token_loss(theta, r)) for w, r in zip(ws, _slices())) / len(ws)
  )


def _value_and_grad(objective):
  value, grad = jax.value_and_grad(objective)(THETA)
  return float(value), np.asarray(grad)


@pytest.mark.parametrize("name", MODES)
def test_micro_batch_accumulation_equals_full_batch(name):
  full_value, full_grad = _value_and_grad(_full_objective(name))
  acc_value, acc_grad = _value_and_grad(_accumulated_objective(name))
  np.testing.assert_allclose(acc_value, full_value, rtol=1e-6)
  np.testing.assert_allclose(acc_grad, full_grad, rtol=1e-5, atol=1e-7)
  assert np.linalg.norm(full_grad) > 1e-2  # Not vacuous: the gradient is far from 0.


# Modes whose naive per-micro-batch normalisation changes the objective on this batch:
#   token_mean: micro-batches hold N_0 = 5+1+3+2 = 11 and N_1 = 4+0+5+1 = 10 tokens, so
#     naive weights are 1/(2·11), 1/(2·10) instead of 1/21 everywhere;
#   seq_mean_token_mean, seq_mean_token_sum: B'_0 = 4, B'_1 = 3 (row 5 is empty), so the
#     naive 1/(2·B'_k) is 1/8 and 1/6 instead of 1/B' = 1/7;
#   group_token_mean: every group is split, so per-micro-batch group sums and G'_k differ;
#   balanced: the class counts and token totals of each micro-batch differ from the batch's.
NAIVE_DIFFERS = (
  "token_mean",
  "seq_mean_token_mean",
  "seq_mean_token_sum",
  "group_token_mean",
  "balanced",
)


@pytest.mark.parametrize("name", NAIVE_DIFFERS)
def test_naive_micro_batch_normalisation_differs(name):
  full_value, full_grad = _value_and_grad(_full_objective(name))
  naive_value, naive_grad = _value_and_grad(_naive_objective(name))
  assert abs(naive_value - full_value) > 1e-3 * abs(full_value), (naive_value, full_value)
  assert np.linalg.norm(naive_grad - full_grad) > 1e-3 * np.linalg.norm(full_grad)


def test_naive_constant_norm_happens_to_match():
  # w = 1/(B_k·T) per micro-batch, averaged over K: 1/(K·B_k·T) = 1/(B·T) when the
  # micro-batches have equal row counts, so constant_norm is the one mode that survives.
  full_value, full_grad = _value_and_grad(_full_objective("constant_norm"))
  naive_value, naive_grad = _value_and_grad(_naive_objective("constant_norm"))
  np.testing.assert_allclose(naive_value, full_value, rtol=1e-6)
  np.testing.assert_allclose(naive_grad, full_grad, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------
# Token cancellation (exchangeability, arXiv 2604.13088).
# ----------------------------------------------------------------------------

# B = 6, T = 6. Group 0 = rows {0, 2, 3, 5}: rewards [1, 0, 0, 1], lengths [2, 3, 4, 6] (all
# different). Group 3 = rows {1, 4}: rewards [1, 1] (A = 0), lengths [1, 5]. Token 7 occurs
# exactly once in every rollout of group 0, at different positions; no other token is 7.
CAN_IDS = [0, 3, 0, 0, 3, 0]
CAN_REWARDS = [1, 1, 0, 0, 1, 1]
CAN_LENGTHS = [2, 1, 3, 4, 5, 6]
CAN_TOKENS = np.asarray(
  [
    [1, 7, 0, 0, 0, 0],
    [2, 0, 0, 0, 0, 0],
    [7, 3, 4, 0, 0, 0],
    [5, 6, 1, 7, 0, 0],
    [3, 4, 5, 6, 1, 0],
    [2, 2, 7, 4, 5, 6],
  ]
)
CAN_MASK = np.asarray(_mask(CAN_LENGTHS, 6))
CANCELS = ("token_mean", "seq_mean_token_sum", "constant_norm", "group_token_mean")


def _advantages(estimator, rewards=CAN_REWARDS, ids=CAN_IDS, mask=CAN_MASK):
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.asarray(rewards, jnp.float32),
    group_ids_B=jnp.asarray(ids, jnp.int32),
    mask_BT=jnp.asarray(mask),
  )
  return np.asarray(advantages.REGISTRY.make(estimator)(inputs, advantages.hyper_values()))


def _residual(w_BT, adv_BT, tokens, mask, rows, token=7):
  """Σ_{i ∈ rows} Σ_{t: o_{i,t} = token} w_{i,t}·A_{i,t}, in float64."""
  hit = (tokens == token) & mask
  hit[[i for i in range(len(tokens)) if i not in rows]] = False
  return float(np.sum(np.where(hit, w_BT.astype(np.float64) * adv_BT.astype(np.float64), 0.0)))


def test_cancellation_setup():
  assert ((CAN_TOKENS == 7) & CAN_MASK).sum(axis=1).tolist() == [1, 0, 1, 1, 0, 1]
  assert not ((CAN_TOKENS == 7) & ~CAN_MASK).any()


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_shared_token_cancels_under_exchangeable_weights(estimator):
  adv_BT = _advantages(estimator)
  group0 = [0, 2, 3, 5]
  a_bar = advantages.sequence_advantage(jnp.asarray(adv_BT), jnp.asarray(CAN_MASK))
  assert abs(float(np.sum(np.asarray(a_bar)[group0]))) < 1e-6  # zero-sum group
  for name in CANCELS:
    w_BT = _weights(name, CAN_MASK, CAN_IDS, adv_BT)
    residual = _residual(w_BT, adv_BT, CAN_TOKENS, CAN_MASK, group0)
    assert abs(residual) <= 1e-7, (name, residual)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_shared_token_does_not_cancel_under_length_or_sign_dependent_weights(estimator):
  adv_BT = _advantages(estimator)
  a = float(adv_BT[0, 0])  # A of a success; failures get -a.
  # a = 0.5 (Dr. GRPO), 0.5/(1/√3 + 1e-6) (GRPO), (4/3)·0.5 (RLOO).
  expected_a = {"dr_grpo": 0.5, "grpo": 0.5 / (1 / np.sqrt(3) + 1e-6), "rloo": 2 / 3}[estimator]
  np.testing.assert_allclose(a, expected_a, rtol=1e-6)
  # seq_mean_token_mean: B' = 6, w_i = 1/(6·L_i), L = [2, 3, 4, 6] for A = [a, -a, -a, a]:
  # (a/6)·(1/2 - 1/3 - 1/4 + 1/6) = (a/6)·(1/12) = a/72.
  w_BT = _weights("seq_mean_token_mean", CAN_MASK, CAN_IDS, adv_BT)
  residual = _residual(w_BT, adv_BT, CAN_TOKENS, CAN_MASK, [0, 2, 3, 5])
  np.testing.assert_allclose(residual, a / 72, rtol=1e-5)
  # balanced: positives {0, 5} hold 8 tokens, negatives {2, 3} hold 7, zero rows {1, 4}; B' = 6.
  # w₊ = (2/6)/8 = 1/24, w₋ = (2/6)/7 = 1/21: 2a/24 - 2a/21 = a(1/12 - 2/21) = -a/84.
  w_BT = _weights("balanced", CAN_MASK, CAN_IDS, adv_BT)
  residual = _residual(w_BT, adv_BT, CAN_TOKENS, CAN_MASK, [0, 2, 3, 5])
  np.testing.assert_allclose(residual, -a / 84, rtol=1e-5)


@SETTINGS
@hypothesis.given(
  lengths=st.lists(st.integers(1, 6), min_size=4, max_size=4),
  k=st.integers(1, 3),
  positions=st.lists(st.integers(0, 5), min_size=4, max_size=4),
)
def test_shared_token_cancels_for_any_lengths_and_pass_rate(lengths, k, positions):
  # One group of 4 (rows 0..3, k successes) plus a zero-advantage group (rows 4, 5).
  lengths = lengths + [3, 6]
  mask = np.asarray(_mask(lengths, 6))
  tokens = np.zeros((6, 6), np.int64)
  for i in range(4):
    tokens[i, positions[i] % lengths[i]] = 7
  rewards = [1.0] * k + [0.0] * (4 - k) + [1.0, 1.0]
  ids = [0, 0, 0, 0, 4, 4]
  for estimator in ("grpo", "dr_grpo", "rloo"):
    adv_BT = _advantages(estimator, rewards, ids, mask)
    for name in CANCELS:
      w_BT = _weights(name, mask, ids, adv_BT)
      residual = _residual(w_BT, adv_BT, tokens, mask, [0, 1, 2, 3])
      assert abs(residual) <= 1e-7, (estimator, name, residual)


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------


def test_get_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="Unknown aggregation mode 'token-mean'") as info:
    aggregation.REGISTRY.make("token-mean")  # verl's spelling is not ours
  valid = str(info.value).split("valid names: ")[1].rstrip(".").split(", ")
  assert valid == sorted(MODES)
