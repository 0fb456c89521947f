"""Edit distances, alignment and the full-rewrite filter (`alignment`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import alignment


def _levenshtein(a, b):
  """The textbook O(|a||b|) recurrence, for comparison."""
  d = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    prev, d[0] = d[0], i
    for j, y in enumerate(b, 1):
      prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
  return d[-1]


def test_edit_distance_by_hand_and_against_the_textbook_recurrence():
  edit_distance = jax.jit(alignment.edit_distance)  # Compiled once (T = 8).

  def dist(a, b, T=8):
    pad = lambda s: jnp.asarray(list(s) + [0] * (T - len(s)), jnp.int32)
    return int(edit_distance(pad(a), len(a), pad(b), len(b)))

  # kitten -> sitting: 3 (two substitutions, one insertion), as ids.
  assert dist([11, 9, 20, 20, 5, 14], [19, 9, 20, 20, 9, 14, 7]) == 3
  assert dist([], [1, 2, 3]) == 3 and dist([1, 2], []) == 2 and dist([], []) == 0
  assert dist([1, 2, 3], [1, 2, 3]) == 0 and dist([1, 2, 3], [3, 2, 1]) == 2
  rng = np.random.default_rng(0)
  for _ in range(200):
    a = list(rng.integers(1, 4, size=rng.integers(0, 9)))
    b = list(rng.integers(1, 4, size=rng.integers(0, 9)))
    assert dist(a, b) == _levenshtein(a, b), (a, b)


def test_local_repairs_filter_full_rewrites():
  a = jnp.asarray([[1, 2, 3, 4], [1, 2, 3, 4]], jnp.int32)
  b = jnp.asarray([[1, 2, 9, 4], [5, 6, 7, 8]], jnp.int32)
  n = jnp.asarray([4, 4])
  keep, d = alignment.local_repairs(a, n, b, n, tau=0.5)
  np.testing.assert_allclose(d, [0.25, 1.0])  # One substitution of 4; a full rewrite.
  np.testing.assert_array_equal(keep, [True, False])
  for bad in (0.0, 1.5):
    with pytest.raises(ValueError, match=r"tau must be in \(0, 1\]"):
      alignment.local_repairs(a, n, b, n, tau=bad)


def _ids(s):
  """Characters as token ids."""
  return [ord(c) for c in s]


_step_ids = jax.jit(alignment.step_ids, static_argnames=("end_ids", "start_pattern"))


def _steps(tokens, valid=None, T=12, **opts):
  """step_ids of one row, padded to T (off the mask) and cut back."""
  mask = [True] * len(tokens) if valid is None else valid
  tok_1T = jnp.asarray([tokens + [0] * (T - len(tokens))], jnp.int32)
  mask_1T = jnp.asarray([mask + [False] * (T - len(tokens))])
  return _step_ids(tok_1T, mask_1T, **opts)[0, : len(tokens)].tolist()


def test_step_ids_by_hand():
  # Ends after the end id; a trailing end opens no empty step; padding is −1.
  assert _steps([5, 1, 6, 7, 1, 8, 0, 0], [True] * 6 + [False] * 2, end_ids=(1,)) == [
    0, 0, 1, 1, 1, 2, -1, -1,
  ]  # fmt: skip
  assert _steps([5, 1, 6, 1], end_ids=(1,)) == [0, 0, 1, 1]
  assert _steps([5, 1, 6, 2, 7], end_ids=(1, 2)) == [0, 0, 1, 1, 2]
  assert _steps([5, 1, 6]) == [0, 0, 0]  # No splitter: one step.
  # A masked prompt full of end ids: the first valid token opens step 0.
  assert _steps([1, 1, 5, 1, 6], [False, False, True, True, True], end_ids=(1,)) == [
    -1, -1, 0, 0, 1,
  ]  # fmt: skip
  # "Step" = (3, 4): a pattern at 0 opens step 0, a partial one (3, 7) is no boundary.
  assert _steps([3, 4, 5, 9, 3, 4, 6, 3, 7], start_pattern=(3, 4)) == [0] * 4 + [1] * 5
  # A pattern cut by the mask is no boundary.
  assert _steps([3, 4, 5, 3, 4], [True] * 4 + [False], start_pattern=(3, 4)) == [0] * 4 + [-1]
  # Both: an end followed by the pattern is one boundary.
  assert _steps([5, 1, 3, 4, 6, 3, 4, 1, 2], end_ids=(1,), start_pattern=(3, 4)) == [
    0, 0, 1, 1, 1, 2, 2, 2, 3,
  ]  # fmt: skip
  # Batched: rows are independent.
  tok = jnp.asarray([[5, 1, 6, 1], [1, 5, 5, 1]], jnp.int32)
  step = alignment.step_ids(tok, jnp.ones_like(tok, bool), end_ids=(1,))
  np.testing.assert_array_equal(step, [[0, 0, 1, 1], [0, 1, 1, 1]])


def test_step_hashes_equal_steps_equal_hashes():
  tok = jnp.asarray([[5, 6, 1, 5, 6, 1, 6, 5, 1, 7, 1, 7, 0, 1, 0, 0]], jnp.int32)
  mask = jnp.asarray([[True] * 14 + [False] * 2])
  step = alignment.step_ids(tok, mask, end_ids=(1,))
  hash_BS, n_B = alignment.step_hashes(tok, mask, step)
  assert hash_BS.shape == (1, 16) and hash_BS.dtype == jnp.int32 and int(n_B[0]) == 5
  h = hash_BS[0].tolist()
  assert h[0] == h[1]  # "5 6 ;" twice, at different offsets.
  assert len(set(h[:5])) == 4  # "6 5 ;" (order), "7 ;" and "7 0 ;" (length) all differ.
  assert h[5:] == [0] * 11
  hash_BS, n_B = alignment.step_hashes(tok, mask, step, max_steps=3)  # Truncated.
  assert hash_BS.shape == (1, 3) and int(n_B[0]) == 3 and hash_BS[0].tolist() == h[:3]


@functools.partial(jax.jit, static_argnames=("end_ids", "start_pattern"))
def _step_distances(a_T, mask_a_T, b_T, mask_b_T, *, end_ids=(), start_pattern=()):
  opts = dict(end_ids=end_ids, start_pattern=start_pattern, max_steps=8)
  return (
    alignment.step_distance(a_T, mask_a_T, b_T, mask_b_T, **opts),
    alignment.normalised_step_distance(a_T, mask_a_T, b_T, mask_b_T, **opts),
  )


def _step_dist(a, b, T=40, **opts):
  pad = lambda s: jnp.asarray(s + [0] * (T - len(s)), jnp.int32)
  mask = lambda s: jnp.arange(T) < len(s)
  d, nd = _step_distances(pad(a), mask(a), pad(b), mask(b), **opts)
  return int(d), float(nd)


def test_step_distance_by_hand():
  semi = {"end_ids": (ord(";"),)}
  a = _ids("8+6+0=14;7+5+1=13;")
  assert _step_dist(a, a, **semi) == (0, 0.0)
  assert _step_dist(a, _ids("8+6+0=14;7+5+2=14;"), **semi) == (1, 0.5)  # One step of 2.
  assert _step_dist(a, _ids("8+6+0=14;7+5+1=13;1=1;"), **semi) == (1, pytest.approx(1 / 3))
  assert _step_dist(a, _ids("7+5+1=13;8+6+0=14;"), **semi) == (2, 1.0)  # Swapped.
  assert _step_dist(a, [], **semi) == (2, 1.0) and _step_dist([], [], **semi) == (0, 0.0)
  step = {"start_pattern": tuple(_ids("Step"))}
  a = _ids("Step 1: x=2 Step 2: y=3 ")  # Steps "Step 1: x=2 " and "Step 2: y=3 ".
  # One token of 24 differs, but it is one step of 2.
  assert _step_dist(a, _ids("Step 1: x=2 Step 2: y=4 "), **step) == (1, 0.5)
  assert _step_dist(a, a + _ids("Step 3: z"), **step) == (1, pytest.approx(1 / 3))
  assert _step_dist(a, a[:12], **step) == (1, 0.5)
  # Both splitters: "x;Step y" is two steps either way, "x;y" two by the end id alone.
  both = {"end_ids": (ord(";"),), **step}
  assert _step_dist(_ids("x;Step y"), _ids("x;y"), **both) == (1, 0.5)


def _pad(s, T=8, fill=0):
  return jnp.asarray(list(s) + [fill] * (T - len(s)), jnp.int32)


_align_jit = jax.jit(alignment.align)


def _align(a, b, T=8):
  ali = _align_jit(_pad(a, T, 99), len(a), _pad(b, T, 98), len(b))
  return ali._replace(
    diff_a_T=ali.diff_a_T.astype(int).tolist(), diff_b_T=ali.diff_b_T.astype(int).tolist()
  )


def test_align_by_hand():
  # kitten -> sitting: k/s and e/i substituted, g inserted (padding never marked).
  ali = _align([11, 9, 20, 20, 5, 14], [19, 9, 20, 20, 9, 14, 7])
  assert ali.diff_a_T == [1, 0, 0, 0, 1, 0, 0, 0] and ali.diff_b_T == [1, 0, 0, 0, 1, 0, 1, 0]
  assert (ali.distance, ali.n_sub, ali.n_del, ali.n_ins) == (3, 2, 0, 1)
  # A deletion in the middle.
  ali = _align([1, 2, 3], [1, 3])
  assert ali.diff_a_T == [0, 1, 0, 0, 0, 0, 0, 0] and ali.diff_b_T == [0] * 8
  assert (ali.distance, ali.n_sub, ali.n_del, ali.n_ins) == (1, 0, 1, 0)
  # Tie: two substitutions are preferred to delete 1, match 2, insert 1.
  ali = _align([1, 2], [2, 1])
  assert ali.diff_a_T[:2] == [1, 1] and ali.diff_b_T[:2] == [1, 1]
  assert (ali.distance, ali.n_sub, ali.n_del, ali.n_ins) == (2, 2, 0, 0)
  # Empty sides: all deleted, all inserted, nothing.
  ali = _align([4, 5], [])
  assert ali.diff_a_T[:3] == [1, 1, 0] and (ali.n_del, ali.n_ins) == (2, 0)
  ali = _align([], [4, 5, 6])
  assert ali.diff_b_T[:4] == [1, 1, 1, 0] and (ali.n_del, ali.n_ins) == (0, 3)
  ali = _align([], [])
  assert ali.diff_a_T == ali.diff_b_T == [0] * 8 and ali.distance == 0
  # Two separate edits are two spans.
  ali = _align([1, 2, 3, 4, 5, 6], [1, 9, 3, 4, 5, 8])
  assert alignment.differing_spans(ali.diff_a_T) == [(1, 2), (5, 6)]


def test_align_identities_on_random_pairs_under_jit_and_vmap():
  rng = np.random.default_rng(1)
  T, N = 8, 200
  len_a, len_b = rng.integers(0, T + 1, size=N), rng.integers(0, T + 1, size=N)
  a = rng.integers(1, 4, size=(N, T)).astype(np.int32)
  b = rng.integers(1, 4, size=(N, T)).astype(np.int32)
  ali = jax.jit(jax.vmap(alignment.align))(a, len_a, b, len_b)
  d = jax.jit(jax.vmap(alignment.edit_distance))(a, len_a, b, len_b)
  np.testing.assert_array_equal(ali.distance, d)
  np.testing.assert_array_equal(ali.n_sub + ali.n_del + ali.n_ins, d)
  np.testing.assert_array_equal(ali.diff_a_T.sum(-1), ali.n_sub + ali.n_del)
  np.testing.assert_array_equal(ali.diff_b_T.sum(-1), ali.n_sub + ali.n_ins)
  for n in range(N):
    x, y = list(a[n, : len_a[n]]), list(b[n, : len_b[n]])
    assert int(d[n]) == _levenshtein(x, y), (x, y)
    da, db = np.asarray(ali.diff_a_T[n]), np.asarray(ali.diff_b_T[n])
    assert not da[len_a[n] :].any() and not db[len_b[n] :].any()
    # The unmarked positions are the matches, in order.
    np.testing.assert_array_equal(
      a[n, : len_a[n]][~da[: len_a[n]]], b[n, : len_b[n]][~db[: len_b[n]]]
    )
  one = jax.jit(alignment.align)(a[0], len_a[0], b[0], len_b[0])
  np.testing.assert_array_equal(one.diff_a_T, ali.diff_a_T[0])
  np.testing.assert_array_equal(one.diff_b_T, ali.diff_b_T[0])


def test_count_and_list_spans():
  diff = jnp.asarray([[0, 1, 1, 0, 1, 0, 0, 1], [0] * 8, [1] * 8], bool)
  np.testing.assert_array_equal(alignment.count_spans(diff), [3, 0, 1])
  assert alignment.differing_spans(diff[0]) == [(1, 3), (4, 5), (7, 8)]
  assert alignment.differing_spans(diff[1]) == [] and alignment.differing_spans(diff[2]) == [(0, 8)]


def test_keep_local_with_a_runtime_tau_does_not_recompile():
  a = jnp.asarray([[1, 2, 3, 4]] * 3, jnp.int32)
  b = jnp.asarray([[1, 2, 9, 4], [1, 9, 9, 4], [5, 6, 7, 8]], jnp.int32)
  n = jnp.asarray([4, 4, 4])

  @jax.jit
  def keep(a, len_a, b, len_b, tau):
    return alignment.keep_local(jax.vmap(alignment.normalised_distance)(a, len_a, b, len_b), tau)

  expected = {0.5: [True, True, False], 0.3: [True, False, False], 1.0: [True, True, True]}
  for tau, want in expected.items():  # d = 0.25, 0.5 and 1.0 (a full rewrite).
    np.testing.assert_array_equal(keep(a, n, b, n, jnp.float32(tau)), want)
  assert keep._cache_size() == 1


def test_check_tau():
  assert alignment.check_tau(1) == 1.0 and alignment.check_tau(0.25) == 0.25
  for bad in (0.0, -0.1, 1.01, float("nan")):
    with pytest.raises(ValueError, match=r"The full-rewrite threshold tau must be in \(0, 1\]"):
      alignment.check_tau(bad)


def test_distance_histogram_by_hand():
  d = jnp.asarray([0.0, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 0.99, 0.2], jnp.float32)
  valid = jnp.asarray([True] * 8 + [False])  # The 0.2 is not counted.
  counts = jax.jit(lambda d, v: alignment.distance_histogram(d, v, fractions=False))(d, valid)
  np.testing.assert_array_equal(counts, [2, 1, 1, 1, 3])
  np.testing.assert_allclose(
    alignment.distance_histogram(d, valid), [2 / 8, 1 / 8, 1 / 8, 1 / 8, 3 / 8]
  )
  np.testing.assert_array_equal(alignment.distance_histogram(d, jnp.zeros(9, bool)), [0.0] * 5)
  counts = alignment.distance_histogram(d, valid, edges=(0.0, 0.5, 1.0), fractions=False)
  np.testing.assert_array_equal(counts, [4, 4])
  assert alignment.histogram_metric_names() == [
    "ibpo/distance_frac/0-0.1",
    "ibpo/distance_frac/0.1-0.25",
    "ibpo/distance_frac/0.25-0.5",
    "ibpo/distance_frac/0.5-0.75",
    "ibpo/distance_frac/0.75-1",
  ]
  assert alignment.histogram_metric_names((0, 0.5, 1), prefix="d/") == ["d/0-0.5", "d/0.5-1"]
  with pytest.raises(ValueError, match="increasing"):
    alignment.histogram_metric_names((0.0, 0.5, 0.5))


def test_step_distance_vmaps_over_pairs():
  T, semi = 20, (ord(";"),)
  rows = lambda *ss: jnp.asarray([_ids(s) + [0] * (T - len(s)) for s in ss], jnp.int32)
  masks = lambda *ss: jnp.asarray([[t < len(s) for t in range(T)] for s in ss])
  a = ("1=1;2=2;", "1=1;2=2;3=3;4=4;")
  b = ("1=1;2=3;", "1=1;3=3;4=4;")
  f = jax.jit(jax.vmap(lambda *x: alignment.normalised_step_distance(*x, end_ids=semi)))
  np.testing.assert_allclose(f(rows(*a), masks(*a), rows(*b), masks(*b)), [0.5, 0.25])
