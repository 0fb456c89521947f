"""Behaviour-policy corrections (`importance`): weights and drops computed by hand on a
small batch, the mismatch metrics, bounds checks, and the correction inside prepare."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import importance, preparation, spec

# ρ = π_old / μ per token: row 0 (2, 0.4, 3), row 1 (1, 3, —masked—).
OLD = jnp.log(jnp.array([[0.5, 0.2, 0.9], [0.3, 0.6, 0.1]]))
BEHAV = jnp.log(jnp.array([[0.25, 0.5, 0.3], [0.3, 0.2, 0.5]]))
MASK = jnp.array([[1, 1, 1], [1, 1, 0]], bool)
HYPER = importance.hyper_values(is_lower=0.5, is_upper=2.5)


def _run(name):
  w, keep = importance.REGISTRY.make(name)(OLD, BEHAV, MASK, HYPER)
  return np.asarray(w), np.asarray(keep)


def test_tis_token_truncates_each_ratio_at_the_upper_bound():
  w, keep = _run("tis_token")
  np.testing.assert_allclose(w, [[2.0, 0.4, 2.5], [1.0, 2.5, 1.0]], rtol=1e-6)
  np.testing.assert_array_equal(keep, MASK)


def test_tis_sequence_truncates_the_product_of_a_row():
  w, keep = _run("tis_sequence")  # Π ρ: row 0 2·0.4·3 = 2.4, row 1 1·3 = 3 -> 2.5.
  np.testing.assert_allclose(w, [[2.4, 2.4, 2.4], [2.5, 2.5, 1.0]], rtol=1e-6)
  np.testing.assert_array_equal(keep, MASK)


def test_mis_token_drops_ratios_outside_the_interval_and_weights_the_rest():
  w, keep = _run("mis_token")  # [0.5, 2.5]: 0.4 and 3 leave.
  np.testing.assert_array_equal(keep, [[1, 0, 0], [1, 0, 0]])
  np.testing.assert_allclose(w[keep], [2.0, 1.0], rtol=1e-6)


def test_mis_sequence_drops_whole_rows():
  w, keep = _run("mis_sequence")  # Row 0: 2.4 kept; row 1: 3 dropped.
  np.testing.assert_array_equal(keep, [[1, 1, 1], [0, 0, 0]])
  np.testing.assert_allclose(w[0], [2.4] * 3, rtol=1e-6)


def test_mis_geometric_tests_the_per_token_geometric_mean():
  hyper = importance.hyper_values(is_lower=0.5, is_upper=1.6)
  w, keep = importance.REGISTRY.make("mis_geometric")(OLD, BEHAV, MASK, hyper)
  # Row 0: 2.4^(1/3) = 1.34 kept; row 1: sqrt(3) = 1.73 dropped.
  np.testing.assert_array_equal(np.asarray(keep), [[1, 1, 1], [0, 0, 0]])
  np.testing.assert_array_equal(np.asarray(w), np.ones((2, 3)))


def test_mismatch_metrics_by_hand():
  w, keep = importance.REGISTRY.make("mis_token")(OLD, BEHAV, MASK, HYPER)
  m = importance.mismatch_metrics(OLD, BEHAV, MASK, w, keep)
  k3 = lambda r: r - 1 - math.log(r)
  want = (k3(2) + k3(0.4) + k3(3) + k3(1) + k3(3)) / 5
  assert float(m["offpolicy/mismatch_k3"]) == pytest.approx(want, rel=1e-5)
  assert float(m["offpolicy/is_drop_frac"]) == pytest.approx(3 / 5)
  assert float(m["offpolicy/is_weight_mean"]) == pytest.approx(1.5)
  assert float(m["offpolicy/ratio_p50"]) == pytest.approx(2.0, rel=1e-5)
  # Linear interpolation between the sorted ratios 0.4, 1, 2, 3, 3 at q = 0.01: 0.4 + 0.04·0.6.
  assert float(m["offpolicy/ratio_p01"]) == pytest.approx(0.424, rel=1e-4)


def test_no_mismatch_gives_unit_weights_and_zero_kl():
  for name in importance.REGISTRY.names():
    w, keep = importance.REGISTRY.make(name)(OLD, OLD, MASK, HYPER)
    np.testing.assert_allclose(np.asarray(w)[np.asarray(MASK)], 1.0, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(keep), np.asarray(MASK))
  m = importance.mismatch_metrics(
    OLD, OLD, MASK, *importance.REGISTRY.make("none")(OLD, OLD, MASK, HYPER)
  )
  assert float(m["offpolicy/mismatch_k3"]) == 0.0


@pytest.mark.parametrize("lower,upper", [(2.0, 0.5), (1.0, 1.0), (-0.1, 2.0)])
def test_inverted_or_negative_bounds_are_refused(lower, upper):
  with pytest.raises(ValueError, match="is_lower|0 <= is_lower < is_upper"):
    spec.RLConfig(importance_hyper=dict(is_lower=lower, is_upper=upper))


def test_unknown_correction_and_correction_without_recompute_are_refused():
  with pytest.raises(ValueError, match="importance correction"):
    spec.RLConfig(is_correction="tis")
  with pytest.raises(ValueError, match="recompute_old_logp"):
    spec.RLConfig(is_correction="tis_token", recompute_old_logp=False)


def test_prepare_folds_the_weights_into_the_advantage_and_drops_from_the_loss_mask():
  """finish_prepare with tis_token: A·w per token; with mis_token the dropped tokens leave
  the loss mask; 'none' leaves A as it is."""
  from grpo_jax.models import sampling

  N, T = 2, 3
  rollouts = sampling.Rollouts(
    prompt_tokens_NP=jnp.ones((N, 2), jnp.int32),
    prompt_mask_NP=jnp.ones((N, 2), bool),
    tokens_NT=jnp.ones((N, T), jnp.int32),
    mask_NT=MASK,
    logp_NT=BEHAV,
    policy_logp_NT=BEHAV,
    eos_N=jnp.ones((N,), bool),
    truncated_N=jnp.zeros((N,), bool),
    length_N=jnp.sum(MASK, axis=1, dtype=jnp.int32),
    group_ids_N=jnp.zeros((N,), jnp.int32),
    num_steps=jnp.int32(T),
  )
  lp = preparation.PolicyLogProbs(
    old_logp_NT=jnp.where(MASK, OLD, 0.0),
    entropy_NT=jnp.zeros((N, T)),
    score_sq_N=jnp.zeros((N,)),
    score_sq_NT=jnp.zeros((N, T)),
    rank_NT=None,
    ref_logp_NT=jnp.zeros((N, T)),
    kl_NT=jnp.zeros((N, T)),
  )
  correct = jnp.array([1.0, 0.0])
  out = {}
  for name in ("none", "tis_token", "mis_token"):
    cfg = spec.RLConfig(
      advantage="rloo", is_correction=name, importance_hyper=dict(is_lower=0.5, is_upper=2.5)
    )
    hyper = cfg.prepare_hyper(max_new_tokens=T)
    batch, _, stats = preparation.finish_prepare(
      lp, rollouts, correct, jnp.zeros(N), hyper, cfg=cfg
    )
    out[name] = (np.asarray(batch.adv_NT), np.asarray(batch.loss_mask_NT), stats)
  adv0, mask0, _ = out["none"]
  np.testing.assert_allclose(adv0[0], [1.0, 1.0, 1.0])  # RLOO, G = 2: ±1.
  adv, mask, stats = out["tis_token"]
  np.testing.assert_allclose(adv, adv0 * np.array([[2.0, 0.4, 2.5], [1.0, 2.5, 1.0]]), rtol=1e-6)
  np.testing.assert_array_equal(mask, mask0)
  assert float(stats["offpolicy/is_weight_mean"]) > 1
  adv, mask, stats = out["mis_token"]
  np.testing.assert_array_equal(mask, [[1, 0, 0], [1, 0, 0]])
  assert float(stats["offpolicy/is_drop_frac"]) == pytest.approx(0.6)
