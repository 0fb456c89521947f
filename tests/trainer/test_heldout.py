import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_jax.trainer import heldout


def _direct(n, c, k):
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@pytest.mark.parametrize(
  "n, c, k, expected",
  [
    (5, 2, 2, 0.7),  # 1 − C(3,2)/C(5,2) = 1 − 3/10.
    (5, 0, 2, 0.0),
    (5, 5, 2, 1.0),
    (5, 2, 1, 0.4),  # pass@1 = c/n.
    (10, 3, 8, 1.0),  # n − c = 7 < k: every 8-subset holds a correct sample.
    (4, 1, 4, 1.0),
    (10, 1, 3, 0.3),  # 1 − C(9,3)/C(10,3) = 1 − 84/120.
  ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
  assert heldout.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_vectorised_over_problems():
  got = heldout.pass_at_k(np.array([5, 5, 5, 10]), np.array([0, 5, 2, 1]), 2)
  np.testing.assert_allclose(got, [0.0, 1.0, 0.7, 1 - 36 / 45])
  assert got.shape == (4,)
  np.testing.assert_allclose(heldout.pass_at_k(8, np.arange(9), 1), np.arange(9) / 8)


@pytest.mark.parametrize(
  "n, c, k, match",
  [
    (5, 2, 6, "k=6 exceeds"),
    (5, 6, 2, "num_correct_c must be <= num_samples_n"),
    (5, -1, 2, "non-negative"),
    (-5, 0, 2, "non-negative"),
    (5, 2, 0, "k must be an integer >= 1"),
    (5, 2.5, 2, "non-negative integers"),
    ([5, 3], [1, 1], 4, "exceeds"),
  ],
)
def test_pass_at_k_rejects_bad_counts(n, c, k, match):
  with pytest.raises(ValueError, match=match):
    heldout.pass_at_k(n, c, k)


@given(st.integers(1, 30).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n))))
def test_pass_at_k_matches_binomials_and_is_monotone(nc):
  n, c = nc
  ks = range(1, n + 1)
  got = [float(heldout.pass_at_k(n, c, k)) for k in ks]
  np.testing.assert_allclose(got, [_direct(n, c, k) for k in ks], atol=1e-12)
  assert all(a <= b + 1e-12 for a, b in zip(got, got[1:]))  # Nondecreasing in k.
  by_c = heldout.pass_at_k(n, np.arange(n + 1), max(1, n // 2))
  assert np.all(np.diff(by_c) >= -1e-12)  # Nondecreasing in c.
  assert by_c[0] == 0.0 and by_c[-1] == 1.0


def test_mean_at_k():
  correct_PK = np.array([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
  assert heldout.mean_at_k(correct_PK) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
  c_P = correct_PK.sum(axis=1)
  assert heldout.mean_at_k(correct_PK) == pytest.approx(heldout.pass_at_k(4, c_P, 1).mean())
  with pytest.raises(ValueError, match=r"\[P, K\]"):
    heldout.mean_at_k(np.ones(3))
