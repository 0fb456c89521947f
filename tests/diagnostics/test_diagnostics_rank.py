"""Effective ranks, sparsity and mini-batch gradient variance: values pinned by hand."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.diagnostics import rank
from grpo_jax.infra import metrics
from grpo_jax.models import model


def _rank2(m=6, n=5):
  """σ = [3, 1] on orthonormal directions: M = 3 u1 v1^T + 1 u2 v2^T."""
  q_u, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(m, 2)))
  q_v, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(n, 2)))
  return (3.0 * np.outer(q_u[:, 0], q_v[:, 0]) + np.outer(q_u[:, 1], q_v[:, 1])).astype(np.float32)


def _metrics(m):
  return {k: float(v) for k, v in jax.device_get(rank.rank_metrics(jnp.asarray(m))).items()}


def test_rank2_matrix_pinned():
  r = _metrics(_rank2())
  # Energy: σ² = [9, 1], total 10: 90% is reached by the first (9 >= 9), 95% and 99% need 2.
  assert (r["energy_rank_90"], r["energy_rank_95"], r["energy_rank_99"]) == (1, 2, 2)
  # Stable rank 10/9; entropy rank exp(H(3/4, 1/4)).
  np.testing.assert_allclose(r["stable_rank"], 10 / 9, rtol=1e-5)
  h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
  np.testing.assert_allclose(r["entropy_rank"], math.exp(h), rtol=1e-5)
  assert 1.0 <= r["stable_rank"] <= 2.0 and 1.0 <= r["entropy_rank"] <= 2.0
  np.testing.assert_allclose([r["sigma_max"], r["fro"]], [3.0, math.sqrt(10)], rtol=1e-5)


def test_equal_rank2_matrix_has_every_rank_two():
  q, _ = np.linalg.qr(np.random.default_rng(2).normal(size=(7, 2)))
  r = _metrics(q @ q.T * 5.0)  # σ = [5, 5, 0, ...]
  assert (r["energy_rank_90"], r["energy_rank_99"]) == (2, 2)
  np.testing.assert_allclose([r["stable_rank"], r["entropy_rank"]], [2.0, 2.0], rtol=1e-5)


@pytest.mark.parametrize("n", [1, 4, 10])
def test_identity_has_rank_n(n):
  r = _metrics(np.eye(n))
  np.testing.assert_allclose([r["entropy_rank"], r["stable_rank"]], [n, n], rtol=1e-6)
  assert r["energy_rank_90"] == math.ceil(0.9 * n) and r["energy_rank_99"] == n


def test_zero_matrix_has_rank_zero():
  assert _metrics(np.zeros((3, 4))) == {
    "entropy_rank": 0.0,
    "stable_rank": 0.0,
    "sigma_max": 0.0,
    "fro": 0.0,
    "energy_rank_90": 0,
    "energy_rank_95": 0,
    "energy_rank_99": 0,
  }


def test_hoyer_and_near_zero_pinned():
  # n = 4, √n = 2: one non-zero -> 1; equal magnitudes -> 0; [3, 4, 0, 0]: 2 − 7/5 = 0.6.
  for x, want in (([1, 0, 0, 0], 1.0), ([1, -1, 1, 1], 0.0), ([3, 4, 0, 0], 0.6)):
    np.testing.assert_allclose(rank.hoyer_sparsity(np.asarray(x, np.float32)), want, atol=1e-6)
  # A pytree counts every leaf: {[3, 4], [0, 0]} is [3, 4, 0, 0].
  tree = {"a": np.asarray([3.0, 4.0]), "b": np.zeros(2)}
  np.testing.assert_allclose(rank.hoyer_sparsity(tree), 0.6, atol=1e-6)
  # ε·max = 0.01·10 = 0.1: -0.05 and 0 are near zero: 2/5.
  x = np.asarray([10.0, 0.5, -0.05, 0.0, 2.0], np.float32)
  np.testing.assert_allclose(rank.near_zero_fraction(x, eps=0.01), 0.4)


def test_zero_variance_groups_pinned():
  # Groups of 2: [1, 1] (all 1), [0, 1], [0, 0] (all 0), [1, 0]: 2 of 4 have zero variance.
  rewards = np.asarray([1, 1, 0, 1, 0, 0, 1, 0], np.float32)
  ids = np.asarray([0, 0, 1, 1, 2, 2, 3, 3], np.int32)
  np.testing.assert_allclose(rank.zero_variance_groups(rewards, ids), 0.5)
  out = rank.sparsity_report(np.asarray([1.0, 0, 0, 0]), rewards_B=rewards, group_ids_B=ids)
  assert out == {"sparsity/hoyer": 1.0, "sparsity/near_zero": 0.75, "sparsity/zero_var_groups": 0.5}
  for k in out:
    metrics.definition(k)


def test_minibatch_variance_pinned_and_monte_carlo():
  # Units g = [1, -1, 3, -3] (Q = 1), m = 2: the 6 subsets have means 0, 2, -1, 1, -2, 0,
  # so tr Var = (0 + 4 + 1 + 1 + 4 + 0)/6 = 5/3 = (4-2)/(2·3) · 5 (population variance 5).
  g = np.asarray([[1.0], [-1.0], [3.0], [-3.0]], np.float32)
  np.testing.assert_allclose(rank.minibatch_grad_variance_exact(g, batch_size=2), 5 / 3, rtol=1e-6)
  mc = rank.minibatch_grad_variance(g, batch_size=2, num_draws=4000, key=jax.random.key(0))
  np.testing.assert_allclose(mc, 5 / 3, rtol=0.08)
  # Full batch: no variance at all.
  assert float(rank.minibatch_grad_variance_exact(g, batch_size=4)) == 0.0
  # Group units: rows {0, 1} and {2, 3} sum to 0 and 0: nothing varies across groups.
  ids = np.asarray([0, 0, 1, 1], np.int32)
  assert (
    float(rank.minibatch_grad_variance_exact(g, batch_size=1, group_ids_N=ids, num_groups=2)) == 0
  )


def test_update_matrices_and_rank_report():
  cfg = model.tiny_config(11, scan_layers=True, n_layers=2)
  shapes = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  before = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  after = jax.tree.map(np.copy, before)
  u, v = np.ones((64, 1), np.float32), np.arange(192, dtype=np.float32)[None, :]
  after["layers"]["mlp"]["up"]["kernel"][1] += u @ v  # A rank-1 change in layer 1.
  mats = rank.update_matrices(before, after)
  assert mats["layers/1/mlp/up/kernel"].shape == (64, 192)
  assert mats["layers/0/attn/o/kernel"].shape == (4 * 16, 64)  # [H, E, D] -> [H·E, D]
  assert mats["layers/0/attn/q/kernel"].shape == (64, 4 * 16)
  out = rank.rank_report({"up1": mats["layers/1/mlp/up/kernel"]})
  assert out["rank/up1/energy_rank_99"] == 1
  np.testing.assert_allclose(out["rank/up1/stable_rank"], 1.0, rtol=1e-5)
  assert float(np.abs(mats["layers/0/mlp/up/kernel"]).max()) == 0.0
  for k in out:
    metrics.definition(k)
