"""Edit distances, alignment and the full-rewrite filter (`alignment`)."""

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import alignment


def _levenshtein(a, b):
  """The textbook O(|a||b|) recurrence, for comparison."""
  d = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    prev, d[0] = d[0], i
    for j, y in enumerate(b, 1):
      prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
  return d[-1]


def test_edit_distance_by_hand_and_against_the_textbook_recurrence():
  def dist(a, b, T=8):
    pad = lambda s: jnp.asarray(list(s) + [0] * (T - len(s)), jnp.int32)
    return int(alignment.edit_distance(pad(a), len(a), pad(b), len(b)))

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
