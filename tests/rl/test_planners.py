"""Mini-batch planners: permutation property, group preservation, stated balance bounds."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import numpy as np
import pytest

from grpo_jax.rl import planners

EPOCHS = 2
# (B, G, M): batch size, group size, mini-batches; M divides K = B / G in every shape.
SHAPES = ((27, 3, 3), (32, 4, 4))  # odd and even rounds of dealing
VARIANTS = (
  ("random", ()),
  ("query_preserved", ()),
  ("reward_balanced", (("balance_by", "count"), ("keep_groups", False))),
  ("reward_balanced", (("balance_by", "mass"), ("keep_groups", False))),
  ("reward_balanced", (("balance_by", "count"), ("keep_groups", True))),
  ("reward_balanced", (("balance_by", "mass"), ("keep_groups", True))),
  ("length_sorted", ()),
)
KEEPS_GROUPS = [v for v in VARIANTS if v[0] == "query_preserved" or ("keep_groups", True) in v[1]]
TOL = 1e-4  # float32 rounding in device-side sums (the bounds are exact in real arithmetic)
SETTINGS = hypothesis.settings(max_examples=30, deadline=None)


@functools.cache
def _planner(name, options, batch_size, group_size, num_minibatches, ppo_epochs=EPOCHS):
  """One jitted planner per (variant, shape): hypothesis examples reuse the compile."""
  return planners.make_planner(
    name,
    num_minibatches=num_minibatches,
    ppo_epochs=ppo_epochs,
    batch_size=batch_size,
    group_size=group_size,
    **dict(options),
  )


@st.composite
def batches(draw, shapes=SHAPES):
  """A batch with non-contiguous, non-consecutive group ids, mixed-polarity advantages."""
  B, G, M = draw(st.sampled_from(shapes))
  ids_K = np.asarray(draw(st.permutations(range(B))))[: B // G]
  layout_B = draw(st.permutations(np.repeat(np.arange(B // G), G).tolist()))
  value = st.sampled_from([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0]) | st.floats(
    -3, 3, width=32, allow_subnormal=False
  )
  adv_B = draw(st.lists(value, min_size=B, max_size=B))
  len_B = draw(st.lists(st.integers(1, 64), min_size=B, max_size=B))
  return dict(
    shape=(B, G, M),
    group_ids_B=ids_K[np.asarray(layout_B)].astype(np.int32),
    advantages_B=np.asarray(adv_B, np.float32),
    lengths_B=np.asarray(len_B, np.int32),
    seed=draw(st.integers(0, 2**31 - 1)),
  )


def _plan(variant, batch, key=None):
  name, options = variant
  B, G, M = batch["shape"]
  plan = _planner(name, options, B, G, M)
  key = jax.random.key(batch["seed"]) if key is None else key
  return np.asarray(plan(key, batch["group_ids_B"], batch["advantages_B"], batch["lengths_B"]))


def _spread(x):
  return float(np.max(x) - np.min(x))


def _groups_per_minibatch(idx_Mb, group_ids_B):
  return [set(group_ids_B[row].tolist()) for row in idx_Mb]


def _example_batch(shape=SHAPES[1], seed=0):
  """A fixed batch in one of the hypothesis shapes, so the compiled planners are reused."""
  B, G, _ = shape
  rng = np.random.default_rng(seed)
  return dict(
    shape=shape,
    group_ids_B=rng.permutation(np.repeat(rng.permutation(B)[: B // G], G)).astype(np.int32),
    advantages_B=rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0], B).astype(np.float32),
    lengths_B=rng.integers(1, 100, B).astype(np.int32),
    seed=seed,
  )


# ----------------------------------------------------------------------------
# Every planner.
# ----------------------------------------------------------------------------


def test_registry_names():
  assert planners.REGISTRY.names() == [
    "length_sorted",
    "query_preserved",
    "random",
    "reward_balanced",
  ]


@SETTINGS
@hypothesis.given(batch=batches())
def test_every_row_once_per_epoch(batch):
  B, _, M = batch["shape"]
  for variant in VARIANTS:
    idx_EMb = _plan(variant, batch)
    assert idx_EMb.shape == (EPOCHS, M, B // M) and idx_EMb.dtype == np.int32, variant
    for idx_Mb in idx_EMb:
      np.testing.assert_array_equal(np.sort(idx_Mb.ravel()), np.arange(B), err_msg=str(variant))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}{dict(v[1])}")
def test_epochs_get_different_partitions(variant):
  # 9 groups in 3 mini-batches: 3 rounds of dealing, so even distinct scores give new
  # partitions (with R <= 2 rounds and distinct scores only the order would change).
  batch = _example_batch(SHAPES[0])
  batch["advantages_B"] = np.random.default_rng(1).normal(size=27).astype(np.float32)
  idx_EMb = _plan(variant, batch, key=jax.random.key(3))
  parts = [{frozenset(row.tolist()) for row in idx_Mb} for idx_Mb in idx_EMb]
  assert parts[0] != parts[1]


def test_raw_planner_jits_with_static_options_and_matches_factory():
  batch = _example_batch()
  static = ("num_minibatches", "ppo_epochs", "group_size", "balance_by", "keep_groups")
  raw = jax.jit(planners.plan_reward_balanced, static_argnames=static)
  args = (batch["group_ids_B"], batch["advantages_B"], batch["lengths_B"])
  got = raw(
    jax.random.key(0),
    *args,
    num_minibatches=4,
    ppo_epochs=EPOCHS,
    group_size=4,
    balance_by="count",
    keep_groups=True,
  )
  want = _plan(KEEPS_GROUPS[1], batch, key=jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(got), want)


# ----------------------------------------------------------------------------
# Group preservation.
# ----------------------------------------------------------------------------


@SETTINGS
@hypothesis.given(batch=batches())
def test_group_keeping_planners_never_split_a_group(batch):
  B, G, M = batch["shape"]
  gid_B = batch["group_ids_B"]
  for variant in KEEPS_GROUPS:
    for idx_Mb in _plan(variant, batch):
      sets = _groups_per_minibatch(idx_Mb, gid_B)
      assert all(len(s) == B // G // M for s in sets), variant  # k whole groups each
      assert len(set().union(*sets)) == B // G, variant  # so no group in two mini-batches
      for row_b in idx_Mb:  # rows of a group keep their batch order
        for g in set(gid_B[row_b].tolist()):
          rows = row_b[gid_B[row_b] == g]
          assert np.all(np.diff(rows) > 0), variant


def test_random_does_split_groups_control():
  batch = _example_batch()
  split = []
  for seed in range(10):
    idx_EMb = _plan(("random", ()), batch, key=jax.random.key(seed))
    split.append(sum(map(len, _groups_per_minibatch(idx_EMb[0], batch["group_ids_B"]))) > 8)
  assert any(split)


def test_query_preserved_hand_pinned():
  plan = _planner("query_preserved", (), 4, 2, 2, ppo_epochs=3)
  idx_EMb = np.asarray(
    plan(jax.random.key(0), np.array([0, 1, 0, 1], np.int32), np.zeros(4), np.ones(4, np.int32))
  )
  for idx_Mb in idx_EMb:
    assert sorted(map(tuple, idx_Mb.tolist())) == [(0, 2), (1, 3)]


# ----------------------------------------------------------------------------
# reward_balanced: the tolerances stated in its docstring.
# ----------------------------------------------------------------------------


def _imbalance(stats, balance_by):
  """D_m = n+_m - n-_m (count) or sum_m A (mass), float64."""
  if balance_by == "count":
    return np.asarray(stats["num_pos"], np.float64) - np.asarray(stats["num_neg"])
  return np.asarray(stats["pos_mass"], np.float64) - np.asarray(stats["neg_mass"])


def _group_imbalance(batch, balance_by):
  """d_g over present groups, float64 on the host."""
  gid_B, a_B = batch["group_ids_B"], batch["advantages_B"].astype(np.float64)
  s_B = np.sign(a_B) if balance_by == "count" else a_B
  return np.array([s_B[gid_B == g].sum() for g in np.unique(gid_B)])


def _check_floor_ceil(count_M, total, M):
  assert set(count_M.tolist()) <= {total // M, -(-total // M)}, (count_M, total, M)


@SETTINGS
@hypothesis.given(batch=batches())
def test_reward_balanced_rows_meet_stated_tolerance(batch):
  _, _, M = batch["shape"]
  a_B = batch["advantages_B"].astype(np.float64)
  n_pos, n_neg = int(np.sum(a_B > 0)), int(np.sum(a_B < 0))
  for balance_by in planners.BALANCE_BY:
    variant = ("reward_balanced", (("balance_by", balance_by), ("keep_groups", False)))
    for idx_Mb in _plan(variant, batch):
      stats = planners.minibatch_balance(idx_Mb, batch["advantages_B"])
      _check_floor_ceil(np.asarray(stats["num_pos"]), n_pos, M)
      _check_floor_ceil(np.asarray(stats["num_neg"]), n_neg, M)
      d_M = _imbalance(stats, balance_by)
      if balance_by == "count":
        assert np.max(np.abs(d_M - (n_pos - n_neg) / M)) <= 2 * (M - 1) / M + 1e-9, d_M
      else:
        assert _spread(d_M) <= a_B.max() - a_B.min() + TOL, (d_M, a_B)
        assert np.max(np.abs(d_M - a_B.sum() / M)) <= (M - 1) / M * np.ptp(a_B) + TOL
        pos = np.maximum(a_B, 0.0)
        neg = np.maximum(-a_B, 0.0)
        assert _spread(np.asarray(stats["pos_mass"])) <= np.ptp(pos) + TOL
        assert _spread(np.asarray(stats["neg_mass"])) <= np.ptp(neg) + TOL


@SETTINGS
@hypothesis.given(batch=batches())
def test_reward_balanced_groups_meet_stated_tolerance(batch):
  _, _, M = batch["shape"]
  for balance_by in planners.BALANCE_BY:
    variant = ("reward_balanced", (("balance_by", balance_by), ("keep_groups", True)))
    d_K = _group_imbalance(batch, balance_by)
    for idx_Mb in _plan(variant, batch):
      d_M = _imbalance(planners.minibatch_balance(idx_Mb, batch["advantages_B"]), balance_by)
      assert _spread(d_M) <= np.ptp(d_K) + TOL, (balance_by, d_M, d_K)
      assert np.max(np.abs(d_M - d_K.sum() / M)) <= (M - 1) / M * np.ptp(d_K) + TOL


def test_reward_balanced_hand_pinned():
  # Rows: two positives, two negatives, M = 2 -> each mini-batch one of each.
  plan = _planner("reward_balanced", (), 4, 1, 2, ppo_epochs=4)
  adv = np.array([1.0, 1.0, -1.0, -1.0], np.float32)
  for idx_b in np.asarray(
    plan(jax.random.key(0), np.arange(4, dtype=np.int32), adv, np.ones(4, np.int32))
  ).reshape(-1, 2):
    assert sorted(idx_b.tolist())[0] in (0, 1) and sorted(idx_b.tolist())[1] in (2, 3)
  # Groups d = (2, 0, -2, 1): sorted g0, g3, g1, g2; snake pairs {g0, g2} (D=0), {g3, g1} (D=1).
  opts = (("keep_groups", True),)
  plan = _planner("reward_balanced", opts, 8, 2, 2, ppo_epochs=4)
  ids = np.array([0, 0, 1, 1, 2, 2, 3, 3], np.int32)
  adv = np.array([1, 1, 1, -1, -1, -1, 1, 0], np.float32)
  for idx_Mb in np.asarray(plan(jax.random.key(1), ids, adv, np.ones(8, np.int32))):
    assert sorted(map(tuple, idx_Mb.tolist())) == [(0, 1, 4, 5), (6, 7, 2, 3)]


def _violates_row_count_bound(idx_Mb, a_B, M):
  stats = planners.minibatch_balance(idx_Mb, a_B)
  d_M = _imbalance(stats, "count")
  d_bar = (np.sum(a_B > 0) - np.sum(a_B < 0)) / M
  return np.max(np.abs(d_M - d_bar)) > 2 * (M - 1) / M


def test_random_often_violates_the_balance_bounds_control():
  rows = _example_batch()
  # Polarised groups: 4 all-correct (d_g = 4), 4 all-wrong (d_g = -4); bound spread <= 8.
  polar = _example_batch()
  polar["advantages_B"] = np.where(
    polar["group_ids_B"] < np.median(polar["group_ids_B"]), 1.0, -1.0
  ).astype(np.float32)
  d_K = _group_imbalance(polar, "count")
  assert sorted(d_K.tolist()) == [-4] * 4 + [4] * 4
  row_violations = group_violations = 0
  for seed in range(20):
    key = jax.random.key(seed)
    idx_Mb = _plan(("random", ()), rows, key=key)[0]
    row_violations += _violates_row_count_bound(idx_Mb, rows["advantages_B"], 4)
    idx_Mb = _plan(("query_preserved", ()), polar, key=key)[0]
    d_M = _imbalance(planners.minibatch_balance(idx_Mb, polar["advantages_B"]), "count")
    group_violations += _spread(d_M) > np.ptp(d_K)
    # The balanced planners on the same batches and keys stay within their bounds.
    idx_Mb = _plan(VARIANTS[2], rows, key=key)[0]
    assert not _violates_row_count_bound(idx_Mb, rows["advantages_B"], 4)
    idx_Mb = _plan(KEEPS_GROUPS[1], polar, key=key)[0]
    d_M = _imbalance(planners.minibatch_balance(idx_Mb, polar["advantages_B"]), "count")
    np.testing.assert_array_equal(d_M, 0.0)  # one +4 and one -4 group in each
  assert row_violations >= 10 and group_violations >= 10, (row_violations, group_violations)


def test_minibatch_balance_values():
  idx_EMb = np.array([[[0, 1], [2, 3]]], np.int32)
  stats = planners.minibatch_balance(idx_EMb, np.array([2.0, -0.5, 0.0, -1.0], np.float32))
  np.testing.assert_array_equal(stats["num_pos"], [[1, 0]])
  np.testing.assert_array_equal(stats["num_neg"], [[1, 1]])
  np.testing.assert_allclose(stats["pos_mass"], [[2.0, 0.0]])
  np.testing.assert_allclose(stats["neg_mass"], [[0.5, 1.0]])
  np.testing.assert_allclose(stats["net_mass"], [[1.5, -1.0]])


# ----------------------------------------------------------------------------
# length_sorted.
# ----------------------------------------------------------------------------


@SETTINGS
@hypothesis.given(batch=batches())
def test_length_sorted_token_totals_within_length_range(batch):
  len_B = batch["lengths_B"]
  for idx_Mb in _plan(("length_sorted", ()), batch):
    assert _spread(len_B[idx_Mb].sum(axis=1)) <= np.ptp(len_B), len_B[idx_Mb]


def test_length_sorted_hand_pinned():
  # Lengths 5, 1, 7, 3 -> sorted rows 2, 0, 3, 1; snake pairs 1st with 4th, 2nd with 3rd.
  plan = _planner("length_sorted", (), 4, 1, 2, ppo_epochs=3)
  ids = np.arange(4, dtype=np.int32)
  for idx_Mb in np.asarray(plan(jax.random.key(0), ids, np.zeros(4), np.array([5, 1, 7, 3]))):
    assert sorted(map(tuple, idx_Mb.tolist())) == [(0, 3), (2, 1)]
  # Lengths 5 1 7 3 2 8 4 6: rounds {8,7} {6,5} {4,3} {2,1}; each pair of rounds is
  # snaked, so both mini-batches total 18 and each is one of two partitions.
  plan = _planner("length_sorted", (), 8, 1, 2, ppo_epochs=8)
  len_B = np.array([5, 1, 7, 3, 2, 8, 4, 6], np.int32)
  allowed = {frozenset({5, 0, 6, 1}), frozenset({2, 7, 3, 4}), frozenset({5, 0, 3, 4})}
  allowed |= {frozenset({2, 7, 6, 1})}
  seen = set()
  for idx_Mb in np.asarray(
    plan(jax.random.key(0), np.arange(8, dtype=np.int32), np.zeros(8), len_B)
  ):
    np.testing.assert_array_equal(len_B[idx_Mb].sum(axis=1), [18, 18])
    seen |= {frozenset(row.tolist()) for row in idx_Mb}
  assert seen == allowed  # 8 epochs see both partitions


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "name, kwargs, match",
  [
    ("nope", {}, r"Unknown planner 'nope'; valid names: length_sorted, query_preserved, random"),
    (
      "random",
      dict(num_minibatches=3),
      r"num_minibatches=3 does not divide the batch size 8; valid choices: \[1, 2, 4, 8\]",
    ),
    ("random", dict(num_minibatches=0), r"num_minibatches must be an int >= 1, got 0"),
    ("random", dict(ppo_epochs=0), r"ppo_epochs must be an int >= 1, got 0"),
    (
      "random",
      dict(group_size=3),
      r"group_size=3 must be an int >= 1 that divides the batch size 8",
    ),
    (
      "random",
      dict(keep_groups=True),
      r"Planner 'random' has no option\(s\) \['keep_groups'\]; its options: \[\]",
    ),
    (
      "query_preserved",
      dict(num_minibatches=8),
      r"num_minibatches=8 does not divide the group count 4 .*valid choices: \[1, 2, 4\]",
    ),
    (
      "reward_balanced",
      dict(num_minibatches=8, keep_groups=True),
      r"does not divide the group count 4",
    ),
    (
      "reward_balanced",
      dict(balance_by="sum"),
      r"balance_by must be one of \('count', 'mass'\), got 'sum'",
    ),
  ],
)
def test_bad_input_raises_clear_error(name, kwargs, match):
  args = dict(num_minibatches=2, ppo_epochs=1, batch_size=8, group_size=2) | kwargs
  with pytest.raises(ValueError, match=match):
    planners.make_planner(name, **args)


def test_row_level_reward_balanced_allows_any_divisor_of_the_batch():
  # Only group-keeping variants need M | K: K = 4 groups, M = 8 mini-batches is fine here.
  planners.make_planner(
    "reward_balanced", num_minibatches=8, ppo_epochs=1, batch_size=8, group_size=2
  )


def test_query_preserved_called_directly_needs_group_size():
  with pytest.raises(ValueError, match="needs group_size"):
    planners.plan_query_preserved(
      jax.random.key(0),
      np.zeros(4, np.int32),
      np.zeros(4),
      np.zeros(4),
      num_minibatches=2,
      ppo_epochs=1,
    )
