"""Token masks: each mask's semantics on a hand-made batch, masked fractions, bad input."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import masks

VOCAB = 10
HYPER = masks.hyper_values(prob_threshold=0.9, entropy_threshold=0.1)

# The hand-made batch (B = 6, T = 4). Groups are non-contiguous: group 0 = rows {0, 1, 4},
# group 1 = rows {2, 3, 5}.
#   row  group  L  ā           tokens (valid | padding)
#   0    0      3  +1          5 6 7 | 3     positive
#   1    0      4  -1          5 8 3 7       negative: 5, 7 shared with row 0 (same group);
#                                            8 only in row 2 (other group); 3 only at row 0's
#                                            padding position
#   2    1      2  +2          8 4 | 0 0     positive
#   3    1      3  -2.5/3      4 5 2 | 0     negative (token advantages [1, -2, -1.5]):
#                                            4 shared with row 2; 5 only in group 0
#   4    0      2  0           5 7 | 0 0     zero advantage: never filtered
#   5    1      0  -           4 4 4 4       empty row (all padding)
LENGTHS = [3, 4, 2, 3, 2, 0]
GROUP_IDS = [0, 0, 1, 1, 0, 1]
TOKENS = [[5, 6, 7, 3], [5, 8, 3, 7], [8, 4, 0, 0], [4, 5, 2, 0], [5, 7, 0, 0], [4, 4, 4, 4]]
ADV = [[1, 1, 1, 9], [-1, -1, -1, -1], [2, 2, 9, 9], [1, -2, -1.5, 9], [0, 0, 9, 9], [9] * 4]
# π_old of the sampled token; > 0.9 is "confident". Padding values are deliberately extreme.
PROB = [
  [0.95, 0.5, 0.99, 0.99],
  [0.5, 0.95, 0.2, 0.3],  # row 1: t1 confident
  [0.99, 0.99, 0.99, 0.99],
  [0.95, 0.1, 0.92, 0.99],  # row 3: t0, t2 confident (t3 is padding)
  [0.99, 0.99, 0.99, 0.99],
  [0.99, 0.99, 0.99, 0.99],
]
# Entropy at each position; < 0.1 is "low".
ENTROPY = [
  [0.01, 0.01, 0.01, 0.01],
  [1.0, 1.0, 0.05, 1.0],  # row 1: t2 low
  [0.0, 0.0, 0.0, 0.0],
  [0.05, 1.0, 1.0, 0.0],  # row 3: t0 low (t3 is padding)
  [0.0, 0.0, 0.0, 0.0],
  [0.0, 0.0, 0.0, 0.0],
]
TRUNCATED = [False, True, False, False, True, False]
NUM_VALID = 14  # 3 + 4 + 2 + 3 + 2 + 0


def _mask(lengths, T):
  return jnp.arange(T)[None, :] < jnp.asarray(lengths, jnp.int32)[:, None]


def _inputs(
  adv=ADV,
  lengths=LENGTHS,
  tokens=TOKENS,
  group_ids=GROUP_IDS,
  prob=PROB,
  entropy=ENTROPY,
  truncated=TRUNCATED,
):
  mask_BT = _mask(lengths, len(tokens[0]))
  return masks.MaskInputs(
    adv_BT=jnp.where(mask_BT, jnp.asarray(adv, jnp.float32), 0.0),
    mask_BT=mask_BT,
    old_logp_BT=jnp.log(jnp.asarray(prob, jnp.float32)),
    entropy_BT=jnp.asarray(entropy, jnp.float32),
    tokens_BT=jnp.asarray(tokens, jnp.int32),
    group_ids_B=jnp.asarray(group_ids, jnp.int32),
    truncated_B=jnp.asarray(truncated, jnp.bool_),
  )


INPUTS = _inputs()
MASK = np.asarray(INPUTS.mask_BT)


@functools.cache
def _jitted(name, **options):
  return jax.jit(masks.REGISTRY.make(name, **options))


def _loss_mask(name, inputs=INPUTS, **options):
  """keep ∧ completion mask of one mask, as a numpy bool array."""
  keep_BT = _jitted(name, **options)(inputs, HYPER)
  assert keep_BT.dtype == jnp.bool_ and keep_BT.shape == inputs.mask_BT.shape
  return np.asarray(keep_BT & inputs.mask_BT)


def _removed(*cells):
  """The completion mask with the given (row, t) cells removed."""
  out = MASK.copy()
  for i, t in cells:
    assert out[i, t], (i, t)
    out[i, t] = False
  return out


def _rows_removed(*rows):
  out = MASK.copy()
  out[list(rows)] = False
  return out


# ----------------------------------------------------------------------------
# Polarity and truncation masks.
# ----------------------------------------------------------------------------


def test_positive_only_removes_negative_rollouts():
  # ā = [1, -1, 2, -5/6, 0, 0(empty)]: rows 1 and 3 go (4 + 3 = 7 of 14 valid tokens).
  np.testing.assert_array_equal(_loss_mask("positive_only"), _rows_removed(1, 3))
  keep_BT = _jitted("positive_only")(INPUTS, HYPER)
  np.testing.assert_allclose(masks.masked_fraction(INPUTS.mask_BT, keep_BT), 7 / 14)


def test_negative_only_removes_positive_rollouts():
  # Rows 0 and 2 go (3 + 2 = 5 of 14); the zero-advantage row 4 stays.
  np.testing.assert_array_equal(_loss_mask("negative_only"), _rows_removed(0, 2))
  keep_BT = _jitted("negative_only")(INPUTS, HYPER)
  np.testing.assert_allclose(masks.masked_fraction(INPUTS.mask_BT, keep_BT), 5 / 14)


def test_polarity_is_the_sequence_advantage_not_the_first_token():
  # Row 3's first token has A = +1 but ā = (1 - 2 - 1.5)/3 < 0: it is a negative rollout.
  assert not _loss_mask("positive_only")[3].any()
  assert _loss_mask("negative_only")[3].tolist() == [True, True, True, False]


def test_overlong_filter_removes_truncated_rows():
  # Rows 1 and 4 are truncated: 4 + 2 = 6 of 14 valid tokens go.
  np.testing.assert_array_equal(_loss_mask("overlong_filter"), _rows_removed(1, 4))
  keep_BT = _jitted("overlong_filter")(INPUTS, HYPER)
  np.testing.assert_allclose(masks.masked_fraction(INPUTS.mask_BT, keep_BT), 6 / 14)


# ----------------------------------------------------------------------------
# negative_token_filter: each criterion alone and combined.
# ----------------------------------------------------------------------------

# Expected removed cells per criterion (only rows 1 and 3 are negative).
PROB_CELLS = [(1, 1), (3, 0), (3, 2)]  # π_old > 0.9
ENTROPY_CELLS = [(1, 2), (3, 0)]  # H < 0.1
SHARED_CELLS = [(1, 0), (1, 3), (3, 0)]  # tokens 5, 7 (group 0, row 0); token 4 (group 1, row 2)


@pytest.mark.parametrize(
  "criteria, cells",
  [
    (("prob",), PROB_CELLS),
    (("entropy",), ENTROPY_CELLS),
    (("shared",), SHARED_CELLS),
    (("prob", "entropy"), [(1, 1), (1, 2), (3, 0), (3, 2)]),
    (("entropy", "shared"), [(1, 0), (1, 2), (1, 3), (3, 0)]),
    (("prob", "entropy", "shared"), [(1, 0), (1, 1), (1, 2), (1, 3), (3, 0), (3, 2)]),
  ],
)
def test_negative_token_filter_criteria(criteria, cells):
  got = _loss_mask("negative_token_filter", criteria=criteria, vocab_size=VOCAB)
  np.testing.assert_array_equal(got, _removed(*cells))
  # Union of the criteria; fraction of the 14 valid tokens.
  keep_BT = _jitted("negative_token_filter", criteria=criteria, vocab_size=VOCAB)(INPUTS, HYPER)
  frac = masks.masked_fraction(INPUTS.mask_BT, keep_BT)
  np.testing.assert_allclose(frac, len(set(cells)) / NUM_VALID, rtol=1e-6)


def test_negative_token_filter_never_touches_non_negative_rows():
  # Rows 0, 2 (positive) and 4 (ā = 0) are full of confident, low-entropy, shared tokens.
  got = _loss_mask(
    "negative_token_filter", criteria=("prob", "entropy", "shared"), vocab_size=VOCAB
  )
  np.testing.assert_array_equal(got[[0, 2, 4]], MASK[[0, 2, 4]])


def test_shared_tokens_come_from_the_same_group_only():
  got = _loss_mask("negative_token_filter", criteria=("shared",), vocab_size=VOCAB)
  assert got[1, 1]  # token 8: in a positive rollout of group 1 only; row 1 is group 0
  assert got[3, 1]  # token 5: in a positive rollout of group 0 only; row 3 is group 1
  assert got[1, 2]  # token 3: only at row 0's padding position, which never counts
  # Move row 2 (the positive holding 8 and 4) into group 0: now 8 is shared with row 1, and
  # row 3's token 4 no longer is.
  moved = _inputs(group_ids=[0, 0, 0, 1, 0, 1])
  got = _loss_mask("negative_token_filter", inputs=moved, criteria=("shared",), vocab_size=VOCAB)
  np.testing.assert_array_equal(got[1], [False, False, True, False])
  np.testing.assert_array_equal(got[3], [True, True, True, False])


def test_shared_ignores_positive_rollout_padding_even_when_valid_token_matches():
  # Row 0's padding token is 3; give row 0 a longer mask (L = 4) and 3 becomes shared.
  longer = _inputs(lengths=[4, 4, 2, 3, 2, 0])
  got = _loss_mask("negative_token_filter", inputs=longer, criteria=("shared",), vocab_size=VOCAB)
  np.testing.assert_array_equal(got[1], [False, True, False, False])


def _shared_reference(tokens, ids, lengths, seq_adv):
  """Brute force: is (i, t) a valid token of a negative row whose id appears at a valid
  position of a positive row of the same group?"""
  B, T = tokens.shape
  valid = np.arange(T)[None, :] < lengths[:, None]
  out = np.zeros((B, T), bool)
  for i in range(B):
    if seq_adv[i] >= 0:
      continue
    for t in range(lengths[i]):
      out[i, t] = any(
        ids[j] == ids[i] and seq_adv[j] > 0 and valid[j, s] and tokens[j, s] == tokens[i, t]
        for j in range(B)
        for s in range(T)
      )
  return out


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
  tokens=st.lists(st.lists(st.integers(0, 5), min_size=5, max_size=5), min_size=6, max_size=6),
  ids=st.lists(st.integers(0, 5), min_size=6, max_size=6),
  lengths=st.lists(st.integers(0, 5), min_size=6, max_size=6),
  signs=st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=6, max_size=6),
)
def test_shared_matches_brute_force(tokens, ids, lengths, signs):
  tokens, ids, lengths = np.asarray(tokens), np.asarray(ids), np.asarray(lengths)
  seq_adv = np.where(lengths > 0, np.asarray(signs), 0.0)
  inputs = _inputs(
    adv=np.repeat(seq_adv[:, None], 5, axis=1),
    lengths=lengths,
    tokens=tokens,
    group_ids=ids,
    prob=np.full((6, 5), 0.5),
    entropy=np.ones((6, 5)),
    truncated=np.zeros(6, bool),
  )
  got = ~_loss_mask("negative_token_filter", inputs=inputs, criteria=("shared",), vocab_size=6)
  expected = _shared_reference(tokens, ids, lengths, seq_adv)
  np.testing.assert_array_equal(got & np.asarray(inputs.mask_BT), expected)


# ----------------------------------------------------------------------------
# apply, masked_fraction, hyperparameters.
# ----------------------------------------------------------------------------


def test_apply_ands_masks_and_reports_fractions():
  fns = {
    "positive_only": masks.REGISTRY.make("positive_only"),
    "overlong_filter": masks.REGISTRY.make("overlong_filter"),
  }
  loss_mask_BT, stats = jax.jit(functools.partial(masks.apply, fns))(INPUTS, HYPER)
  # positive_only keeps rows 0, 2, 4 (and empty 5); overlong_filter drops 1, 4.
  # Together: rows 0 and 2 stay (3 + 2 = 5 tokens), 9 of 14 removed.
  np.testing.assert_array_equal(loss_mask_BT, _rows_removed(1, 3, 4))
  assert set(stats) == {"masked_frac/positive_only", "masked_frac/overlong_filter", "masked_frac"}
  np.testing.assert_allclose(stats["masked_frac/positive_only"], 7 / 14, rtol=1e-6)
  np.testing.assert_allclose(stats["masked_frac/overlong_filter"], 6 / 14, rtol=1e-6)
  np.testing.assert_allclose(stats["masked_frac"], 9 / 14, rtol=1e-6)


def test_apply_with_no_masks_is_the_completion_mask():
  loss_mask_BT, stats = masks.apply({}, INPUTS, HYPER)
  np.testing.assert_array_equal(loss_mask_BT, MASK)
  assert stats == {"masked_frac": 0.0}


def test_apply_negative_token_filter_with_polarity_mask():
  fns = {
    "negative_token_filter": masks.REGISTRY.make(
      "negative_token_filter", criteria=("prob", "entropy"), vocab_size=VOCAB
    ),
    "negative_only": masks.REGISTRY.make("negative_only"),
  }
  loss_mask_BT, stats = masks.apply(fns, INPUTS, HYPER)
  # Filter removes (1,1), (1,2), (3,0), (3,2) = 4; negative_only removes rows 0, 2 = 5.
  expected = _removed((1, 1), (1, 2), (3, 0), (3, 2)) & _rows_removed(0, 2)
  np.testing.assert_array_equal(loss_mask_BT, expected)
  np.testing.assert_allclose(stats["masked_frac/negative_token_filter"], 4 / 14, rtol=1e-6)
  np.testing.assert_allclose(stats["masked_frac/negative_only"], 5 / 14, rtol=1e-6)
  np.testing.assert_allclose(stats["masked_frac"], 9 / 14, rtol=1e-6)


def test_masked_fraction_pinned():
  mask_BT = _mask([3, 1, 0], 3)  # 4 valid tokens
  keep_BT = jnp.asarray([[True, False, False], [False, False, False], [False, False, False]])
  # Removed valid tokens: (0,1), (0,2), (1,0) = 3 of 4; invalid positions do not count.
  np.testing.assert_allclose(masks.masked_fraction(mask_BT, keep_BT), 0.75)
  np.testing.assert_allclose(masks.masked_fraction(_mask([0, 0], 2), jnp.zeros((2, 2), bool)), 0.0)


def test_thresholds_are_arrays_and_change_results_without_recompiling():
  fn = jax.jit(masks.REGISTRY.make("negative_token_filter", criteria=("prob", "entropy")))
  loose = fn(INPUTS, masks.hyper_values(prob_threshold=0.4, entropy_threshold=0.0))
  # π_old > 0.4 in negative rows: row 1 t0 (0.5), t1 (0.95); row 3 t0 (0.95), t2 (0.92);
  # H < 0 never holds.
  np.testing.assert_array_equal(loose & MASK, _removed((1, 0), (1, 1), (3, 0), (3, 2)))
  strict = fn(INPUTS, masks.hyper_values(prob_threshold=1.0, entropy_threshold=2.0))
  # π_old > 1 never holds; H < 2 holds on every valid token of rows 1 and 3.
  np.testing.assert_array_equal(strict & MASK, _rows_removed(1, 3))
  assert fn._cache_size() == 1


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(prob_threshold=1.5), r"mask_hyper.prob_threshold=1.5: must be a number in \[0, 1\]"),
    (dict(prob_threshold=-0.1), r"prob_threshold=-0.1: must be a number in \[0, 1\]"),
    (dict(entropy_threshold=-1.0), r"entropy_threshold=-1.0: must be a number in \[0, inf\]"),
    (dict(top_k=0), r"top_k=0: must be an integer >= 1"),
    (dict(top_k=1.5), r"top_k=1.5: must be an integer >= 1"),
  ],
)
def test_mask_hyper_rejects_bad_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    masks.hyper_values(**kwargs)


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------


def test_get_unknown_name_lists_valid_names():
  with pytest.raises(ValueError, match="Unknown token mask 'nope'") as info:
    masks.REGISTRY.make("nope")
  valid = str(info.value).split("valid names: ")[1].rstrip(".").split(", ")
  assert valid == ["negative_only", "negative_token_filter", "overlong_filter", "positive_only"]


def test_get_unknown_options_lists_allowed():
  with pytest.raises(
    ValueError, match=r"no options \['threshold'\]; allowed: \['criteria', 'vocab_size'\]"
  ):
    masks.REGISTRY.make("negative_token_filter", threshold=0.5)
  with pytest.raises(ValueError, match="allowed: none"):
    masks.REGISTRY.make("positive_only", criteria=("prob",))


@pytest.mark.parametrize("criteria", [("prob", "nope"), ()])
def test_negative_token_filter_rejects_bad_criteria(criteria):
  fn = masks.REGISTRY.make("negative_token_filter", criteria=criteria)
  with pytest.raises(
    ValueError, match=r"non-empty subset of \('prob', 'entropy', 'rank', 'shared', 'batch_shared'\)"
  ):
    fn(INPUTS, HYPER)


def test_shared_needs_a_vocab_bound():
  with pytest.raises(ValueError, match="needs vocab_size > 0"):
    masks.REGISTRY.make("negative_token_filter", criteria=("shared",))(INPUTS, HYPER)
  # B·V must fit the uint32 keys: 6·2^30 >= 2^32.
  with pytest.raises(ValueError, match=r"batch\*vocab_size < 2\^32"):
    masks.REGISTRY.make("negative_token_filter", criteria=("shared",), vocab_size=2**30)(
      INPUTS, HYPER
    )


# ----------------------------------------------------------------------------
# Batch-level criteria (single-rollout training) and per-criterion reporting.
# ----------------------------------------------------------------------------

# π_old's rank of each sampled token (0 = argmax). Negative rows: row 1 [0, 2, 1, 0],
# row 3 [1, 0, 3, pad]. Positive and zero rows hold ranks that must never matter.
RANK = [[0, 0, 0, 0], [0, 2, 1, 0], [0, 0, 0, 0], [1, 0, 3, 0], [0, 0, 0, 0], [0, 0, 0, 0]]


def _with_rank(inputs=INPUTS):
  return inputs.replace(rank_BT=jnp.asarray(RANK, jnp.int32))


def test_batch_shared_uses_every_positive_rollout_of_the_batch():
  # Positive rows 0 and 2 hold ids {5, 6, 7} and {8, 4}. Negative row 1 (5 8 3 7): 5, 8, 7
  # are in the set (8 only through row 2 of the other group); 3 is not (only at row 0's
  # padding). Negative row 3 (4 5 2): 4 and 5.
  got = _loss_mask("negative_token_filter", criteria=("batch_shared",), vocab_size=VOCAB)
  np.testing.assert_array_equal(got, _removed((1, 0), (1, 1), (1, 3), (3, 0), (3, 1)))


def test_at_group_size_one_shared_finds_nothing_and_batch_shared_filters():
  """G = 1: each row is its own group, so "shared" (within the group) never fires, and the
  batch-level set masks exactly the negative tokens whose ids a positive rollout holds."""
  singles = _inputs(group_ids=list(range(6)))
  shared = _loss_mask("negative_token_filter", inputs=singles, criteria=("shared",), vocab_size=10)
  np.testing.assert_array_equal(shared, MASK)
  batch = _loss_mask(
    "negative_token_filter", inputs=singles, criteria=("batch_shared",), vocab_size=10
  )
  np.testing.assert_array_equal(batch, _removed((1, 0), (1, 1), (1, 3), (3, 0), (3, 1)))


@pytest.mark.parametrize(
  "top_k, cells",
  [(1, [(1, 0), (1, 3), (3, 1)]), (2, [(1, 0), (1, 2), (1, 3), (3, 0), (3, 1)])],
)
def test_rank_criterion_drops_negatives_tokens_in_the_top_k(top_k, cells):
  fn = jax.jit(masks.REGISTRY.make("negative_token_filter", criteria=("rank",)))
  hyper = masks.hyper_values(top_k=top_k)
  np.testing.assert_array_equal(fn(_with_rank(), hyper) & MASK, _removed(*cells))


def test_rank_criterion_without_ranks_is_a_clear_error():
  with pytest.raises(ValueError, match="'rank' needs MaskInputs.rank_BT"):
    masks.REGISTRY.make("negative_token_filter", criteria=("rank",))(INPUTS, HYPER)
  with pytest.raises(ValueError, match="top_k=0: must be an integer >= 1"):
    masks.hyper_values(top_k=0)


def test_apply_reports_each_criterion_alone_and_together():
  fns = {
    "negative_token_filter": masks.REGISTRY.make(
      "negative_token_filter", criteria=("prob", "rank", "batch_shared"), vocab_size=VOCAB
    )
  }
  loss_mask_BT, stats = masks.apply(fns, _with_rank(), HYPER)
  # prob: (1,1), (3,0), (3,2); rank (k = 1): (1,0), (1,3), (3,1);
  # batch_shared: (1,0), (1,1), (1,3), (3,0), (3,1). Union: those 6 cells.
  np.testing.assert_allclose(stats["masked_frac/negative_token_filter/prob"], 3 / 14, rtol=1e-6)
  np.testing.assert_allclose(stats["masked_frac/negative_token_filter/rank"], 3 / 14, rtol=1e-6)
  np.testing.assert_allclose(
    stats["masked_frac/negative_token_filter/batch_shared"], 5 / 14, rtol=1e-6
  )
  np.testing.assert_allclose(stats["masked_frac/negative_token_filter"], 6 / 14, rtol=1e-6)
  want = _removed((1, 0), (1, 1), (1, 3), (3, 0), (3, 1), (3, 2))
  np.testing.assert_array_equal(loss_mask_BT, want)
