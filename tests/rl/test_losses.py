"""Policy losses, KL estimators and entropy: hand-computed values and gradient properties."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import losses

LOSS_NAMES = ("ppo_clip", "gspo", "reinforce", "cispo")
KL_NAMES = ("k1", "k2", "k3", "abs", "k1+", "k3+")
DAPO = dict(eps_low=0.2, eps_high=0.28)


def _row(x):
  """A [1, T] float32 numpy array (inputs stay numpy: eager jnp ops each compile)."""
  return np.asarray([x], np.float32)


@functools.partial(jax.jit, static_argnames="name")
def _loss(name, logp_BT, old_logp_BT, adv_BT, mask_BT, hyper):
  return losses.REGISTRY.make(name)(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)


@functools.partial(jax.jit, static_argnames="name")
def _grad_logp(name, logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, hyper):
  """∂/∂logp of Σ w·ℓ_tok (the train step's aggregation with weights w)."""

  def objective(logp_BT):
    loss_BT, _ = losses.REGISTRY.make(name)(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)
    return jnp.sum(w_BT * loss_BT)

  return jax.grad(objective)(logp_BT)


def _run(name, ratios, advs, **hyper):
  """Loss of ``name`` on one row with logp = log ρ, old_logp = 0 (so the token ratio is ρ)."""
  logp_BT = np.log(_row(ratios))
  mask_BT = np.ones(logp_BT.shape, bool)
  return _loss(
    name, logp_BT, np.zeros_like(logp_BT), _row(advs), mask_BT, losses.hyper_values(**hyper)
  )


def _random_batch(seed, *, b=4, t=7):
  rng = np.random.default_rng(seed)
  logp_BT = -rng.exponential(1.0, (b, t)).astype(np.float32)
  adv_BT = rng.normal(size=(b, t)).astype(np.float32)
  mask_BT = rng.random((b, t)) < 0.7
  mask_BT[0] = True  # A full row ...
  mask_BT[1] = False  # ... and an empty one.
  w_BT = rng.random((b, t)).astype(np.float32)
  return logp_BT, adv_BT, mask_BT, w_BT


# ----------------------------------------------------------------------------
# ppo_clip.
# ----------------------------------------------------------------------------


def test_ppo_clip_pinned_values():
  # eps_low = 0.2, eps_high = 0.28, so clip(ρ) = clip(ρ, 0.8, 1.28).
  loss_BT, aux = _run("ppo_clip", [1.5, 0.5, 1.1, 5.0, 0.5, 1.5], [1, -1, 1, -1, 1, -1], **DAPO)
  expected = [
    -1.28,  # ρ=1.5, A=+1: max(-1.5, -1.28) = -1.28 (clipped branch binds)
    0.8,  # ρ=0.5, A=-1: max(0.5, 0.8) = 0.8 (clipped branch binds)
    -1.1,  # ρ=1.1, A=+1: inside [0.8, 1.28]: max(-1.1, -1.1) = -1.1
    5.0,  # ρ=5, A=-1, no dual clip: max(5, 1.28) = 5
    -0.5,  # ρ=0.5, A=+1: max(-0.5, -0.8) = -0.5 (unclipped branch)
    1.5,  # ρ=1.5, A=-1: max(1.5, 1.28) = 1.5 (unclipped branch)
  ]
  np.testing.assert_allclose(loss_BT[0], expected, rtol=1e-6)
  np.testing.assert_allclose(aux["ratio"][0], [1.5, 0.5, 1.1, 5.0, 0.5, 1.5], rtol=1e-6)
  np.testing.assert_array_equal(aux["clip_high"][0], [1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(aux["clip_low"][0], [0, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(aux["dual_clip"][0], [0, 0, 0, 0, 0, 0])


def test_ppo_dual_clip():
  loss_BT, aux = _run(
    "ppo_clip", [5.0, 2.0, 5.0, 0.5], [-1, -2, 1, -1], eps_low=0.2, eps_high=0.2, dual_clip_c=3.0
  )
  expected = [
    3.0,  # A=-1, ρ=5: min(max(5, 1.2), -A·c = 3) = 3 (dual clip binds)
    4.0,  # A=-2, ρ=2: min(max(4, 2.4), 6) = 4 (bound 6 not reached)
    -1.2,  # A=+1, ρ=5: max(-5, -1.2) = -1.2; dual clip is for A<0 only
    0.8,  # A=-1, ρ=0.5: min(max(0.5, 0.8), 3) = 0.8
  ]
  np.testing.assert_allclose(loss_BT[0], expected, rtol=1e-6)
  np.testing.assert_array_equal(aux["dual_clip"][0], [1, 0, 0, 0])
  np.testing.assert_array_equal(aux["clip_high"][0], [0, 0, 1, 0])
  np.testing.assert_array_equal(aux["clip_low"][0], [0, 0, 0, 1])


def test_ppo_log_ratio_is_clamped_at_20():
  # log ρ = 30 -> clamped to 20; A=-1, no clip binding: loss = max(e^20, 1.2) = e^20.
  logp_BT = _row([30.0])
  loss_BT, aux = _loss(
    "ppo_clip",
    logp_BT,
    np.zeros_like(logp_BT),
    _row([-1.0]),
    np.ones((1, 1), bool),
    losses.hyper_values(),
  )
  np.testing.assert_allclose(aux["ratio"][0, 0], math.exp(20.0), rtol=1e-6)
  np.testing.assert_allclose(loss_BT[0, 0], math.exp(20.0), rtol=1e-6)


# ----------------------------------------------------------------------------
# Properties shared by every loss.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_on_policy_gradient_is_reinforce(name):
  # At logp == old_logp (ρ = 1, inside the trust region) every loss has gradient -A·w·m.
  logp_BT, adv_BT, mask_BT, w_BT = _random_batch(0)
  hyper = losses.hyper_values(eps_low=0.2, eps_high=0.28, dual_clip_c=3.0)
  grad_BT = _grad_logp(name, logp_BT, logp_BT, adv_BT, mask_BT, w_BT, hyper)
  reinforce_BT = _grad_logp("reinforce", logp_BT, logp_BT, adv_BT, mask_BT, w_BT, hyper)
  np.testing.assert_allclose(grad_BT, reinforce_BT, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(grad_BT, np.where(mask_BT, -adv_BT * w_BT, 0.0), rtol=1e-6)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_masked_tokens_give_zero_loss_false_flags_and_finite_grads(name):
  # Padding holds garbage that would clip / dual-clip if it were live (and NaN/inf).
  logp_BT = _row([math.log(3.0), 10.0, -np.inf, math.log(0.1)])
  old_logp_BT = _row([0.0, -5.0, 0.0, np.nan])
  adv_BT = _row([1.0, -1.0, np.nan, -1.0])
  mask_BT = np.asarray([[True, False, False, False]])
  hyper = losses.hyper_values(dual_clip_c=3.0)
  loss_BT, aux = _loss(name, logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)
  np.testing.assert_array_equal(loss_BT[0, 1:], 0.0)
  np.testing.assert_array_equal(aux["ratio"][0, 1:], 1.0)
  for key in ("clip_high", "clip_low", "dual_clip"):
    assert not np.any(aux[key][0, 1:]), key
  w_BT = np.ones(logp_BT.shape, np.float32)
  grad_BT = _grad_logp(name, logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, hyper)
  assert np.all(np.isfinite(grad_BT)) and np.all(grad_BT[0, 1:] == 0.0)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_aux_keys_dtypes_and_jit_without_recompiles(name):
  logp_BT, adv_BT, mask_BT, _ = _random_batch(1)
  old_logp_BT = logp_BT + 0.3 * np.sin(np.arange(7, dtype=np.float32))[None, :]
  loss_fn = losses.REGISTRY.make(name)
  fn = jax.jit(lambda *args: loss_fn(*args))  # Its own jit cache.
  out_a = fn(logp_BT, old_logp_BT, adv_BT, mask_BT, losses.hyper_values())
  out_b = fn(logp_BT, old_logp_BT, adv_BT, mask_BT, losses.hyper_values(**DAPO, dual_clip_c=3.0))
  assert fn._cache_size() == 1  # New hyperparameter values are just new array inputs.
  for loss_BT, aux in (out_a, out_b):
    assert loss_BT.dtype == jnp.float32 and loss_BT.shape == (4, 7)
    assert sorted(aux) == sorted(losses.AUX_KEYS)  # jit returns dicts key-sorted.
    assert aux["ratio"].dtype == jnp.float32
    for key in ("clip_high", "clip_low", "dual_clip"):
      assert aux[key].dtype == jnp.bool_ and aux[key].shape == (4, 7)


def test_loss_accepts_bfloat16_and_computes_in_float32():
  logp_BT = jnp.asarray([[-0.5, -1.0]], jnp.bfloat16)
  loss_BT, aux = _loss(
    "ppo_clip", logp_BT, logp_BT, _row([1.0, -2.0]), np.ones((1, 2), bool), losses.hyper_values()
  )
  assert loss_BT.dtype == jnp.float32 and aux["ratio"].dtype == jnp.float32
  np.testing.assert_allclose(loss_BT[0], [-1.0, 2.0])  # ρ = 1: -A.


# ----------------------------------------------------------------------------
# reinforce and cispo.
# ----------------------------------------------------------------------------


def test_reinforce_value_and_flags():
  # ℓ = log 2 = 0.693147, A = 3: loss = -3·0.693147 = -2.079442; ratio reported as 2.
  loss_BT, aux = _run("reinforce", [2.0, 0.5], [3.0, -1.0], **DAPO)
  # ℓ = log 0.5 = -0.693147, A = -1: loss = -(-1)·(-0.693147) = -0.693147.
  np.testing.assert_allclose(loss_BT[0], [-2.0794415, -0.6931472], rtol=1e-6)
  np.testing.assert_allclose(aux["ratio"][0], [2.0, 0.5], rtol=1e-6)
  assert not any(np.any(aux[k]) for k in ("clip_high", "clip_low", "dual_clip"))


def test_cispo_values_and_flags():
  # clip(ρ) = clip(ρ, 0.8, 1.28); ℓ = log ρ (old_logp = 0).
  loss_BT, aux = _run("cispo", [2.0, 0.5, 1.1, 2.0], [1.0, -1.0, 1.0, -1.0], **DAPO)
  expected = [
    -1.28 * 1 * math.log(2.0),  # weight clipped to 1.28: -0.887228
    -0.8 * -1 * math.log(0.5),  # weight clipped to 0.8: 0.8·(-0.693147) = -0.554518
    -1.1 * 1 * math.log(1.1),  # weight 1.1: -0.104841
    -1.28 * -1 * math.log(2.0),  # A<0 above 1+ε_high: weight still truncated to 1.28
  ]
  np.testing.assert_allclose(loss_BT[0], expected, rtol=1e-6)
  # CISPO flags mark a truncated weight, whatever the sign of A.
  np.testing.assert_array_equal(aux["clip_high"][0], [1, 0, 0, 1])
  np.testing.assert_array_equal(aux["clip_low"][0], [0, 1, 0, 0])


def test_cispo_gradient_flows_outside_trust_region_where_ppo_is_zero():
  # ρ = 2 (A=+1) and ρ = 0.5 (A=-1) both lie outside [0.8, 1.28].
  logp_BT = np.log(_row([2.0, 0.5]))
  old_logp_BT = np.zeros_like(logp_BT)
  adv_BT = _row([1.0, -1.0])
  mask_BT = np.ones(logp_BT.shape, bool)
  w_BT = _row([0.5, 2.0])
  hyper = losses.hyper_values(**DAPO)
  cispo_BT = _grad_logp("cispo", logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, hyper)
  # -clip(ρ)·A·w: -1.28·1·0.5 = -0.64 and -0.8·(-1)·2 = 1.6.
  np.testing.assert_allclose(cispo_BT[0], [-0.64, 1.6], rtol=1e-6)
  ppo_BT = _grad_logp("ppo_clip", logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, hyper)
  np.testing.assert_array_equal(ppo_BT[0], [0.0, 0.0])  # The clipped branch is constant.


def test_cispo_large_eps_low_removes_lower_bound():
  # ε_low = 1e6: 1 − ε_low < 0, so ρ = 0.1 keeps its weight: loss = -0.1·(-1)·log 0.1.
  loss_BT, aux = _run("cispo", [0.1], [-1.0], eps_low=1e6, eps_high=0.28)
  np.testing.assert_allclose(loss_BT[0, 0], 0.1 * math.log(0.1), rtol=1e-6)
  assert not aux["clip_low"][0, 0]


# ----------------------------------------------------------------------------
# gspo.
# ----------------------------------------------------------------------------


def test_gspo_sequence_ratio_is_exp_mean_masked_log_ratio():
  # Row 0: masked log-ratios 0.2, 0.4 (the 9.0 is padding): mean 0.3, s = e^0.3 = 1.349859.
  # Row 1: no tokens: s = 1 and loss 0.
  logp_BT = np.asarray([[0.2, 0.4, 9.0], [1.0, 2.0, 3.0]], np.float32)
  old_logp_BT = np.zeros_like(logp_BT)
  mask_BT = np.asarray([[True, True, False], [False, False, False]])
  adv_BT = np.ones((2, 3), np.float32)
  hyper = losses.hyper_values(**DAPO)
  loss_BT, aux = _loss("gspo", logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)
  seq_log_ratio_B = jax.jit(losses.sequence_log_ratio)(logp_BT, old_logp_BT, mask_BT)
  np.testing.assert_allclose(seq_log_ratio_B, [0.3, 0.0], atol=1e-7)
  np.testing.assert_allclose(aux["ratio"][0, :2], [math.exp(0.3)] * 2, rtol=1e-6)
  # A = +1, s = 1.3499 > 1.28: loss = max(-1.3499, -1.28) = -1.28, clipped.
  np.testing.assert_allclose(loss_BT[0], [-1.28, -1.28, 0.0], rtol=1e-6)
  np.testing.assert_array_equal(aux["clip_high"], [[1, 1, 0], [0, 0, 0]])
  np.testing.assert_array_equal(loss_BT[1], 0.0)
  np.testing.assert_array_equal(aux["ratio"][1], 1.0)


def test_gspo_token_form_gradient_matches_sequence_ratio_gradient():
  rng = np.random.default_rng(3)
  b, t = 6, 5
  logp_BT = -rng.exponential(1.0, (b, t)).astype(np.float32)
  # Per-row mean log-ratios spread over [-0.5, 0.5] so some rows clip and some do not.
  old_logp_BT = logp_BT - rng.uniform(-0.5, 0.5, (b, t)).astype(np.float32)
  adv_B = np.array([1.0, -1.0, 0.5, -2.0, 1.5, -0.3], np.float32)
  adv_BT = np.repeat(adv_B[:, None], t, axis=1)
  mask_BT = np.arange(t)[None, :] < np.array([5, 4, 3, 5, 1, 2])[:, None]
  n_B1 = np.sum(mask_BT, axis=1, keepdims=True).astype(np.float32)
  w_BT = np.where(mask_BT, 1.0 / n_B1, 0.0).astype(np.float32) / b  # seq-mean-token-mean.
  hyper = losses.hyper_values(eps_low=0.1, eps_high=0.15)

  def sequence_loss(logp_BT):
    # Direct GSPO: s_i = exp(mean_t m(ℓ − ℓ_old)); loss_i = max(-A s_i, -A clip(s_i)).
    diff_BT = jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0)
    s_B = jnp.exp(jnp.sum(diff_BT, axis=1) / n_B1[:, 0])
    clip_B = jnp.clip(s_B, 0.9, 1.15)
    return jnp.mean(jnp.maximum(-adv_B * s_B, -adv_B * clip_B))

  direct_BT = jax.jit(jax.grad(sequence_loss))(logp_BT)
  token_BT = _grad_logp("gspo", logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, hyper)
  np.testing.assert_allclose(token_BT, direct_BT, rtol=1e-5, atol=1e-7)
  _, aux = _loss("gspo", logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)
  clipped_B = np.any(aux["clip_high"] | aux["clip_low"], axis=1)
  assert clipped_B.any() and not clipped_B.all()  # Both regimes are exercised.
  assert np.any(direct_BT == 0.0) and np.any(direct_BT != 0.0)


def test_gspo_log_ratio_clamped_at_10():
  # Mean log-ratio 12 > 10: s = e^10 = 22026.47; A = -1: loss = max(e^10, 0.8) = e^10.
  logp_BT = _row([12.0, 12.0])
  old_logp_BT = np.zeros_like(logp_BT)
  adv_BT = _row([-1.0, -1.0])
  mask_BT = np.ones((1, 2), bool)
  hyper = losses.hyper_values()
  loss_BT, aux = _loss("gspo", logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)
  np.testing.assert_allclose(aux["ratio"][0], [math.exp(10.0)] * 2, rtol=1e-6)
  np.testing.assert_allclose(loss_BT[0], [math.exp(10.0)] * 2, rtol=1e-6)
  # As in verl the clamp sits on the token form: a clamped sequence gets no gradient.
  w_BT = np.ones((1, 2), np.float32)
  grad_BT = _grad_logp("gspo", logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, hyper)
  np.testing.assert_array_equal(grad_BT, 0.0)
  # Just below the clamp (mean 9): s = e^9, loss e^9, gradient -A·s·w = e^9 per token.
  loss_BT, _ = _loss("gspo", logp_BT - 3.0, old_logp_BT, adv_BT, mask_BT, hyper)
  np.testing.assert_allclose(loss_BT[0], [math.exp(9.0)] * 2, rtol=1e-6)
  grad_BT = _grad_logp("gspo", logp_BT - 3.0, old_logp_BT, adv_BT, mask_BT, w_BT, hyper)
  np.testing.assert_allclose(grad_BT[0], [math.exp(9.0)] * 2, rtol=1e-6)


# ----------------------------------------------------------------------------
# KL estimators.
# ----------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="name")
def _kl_and_grad(name, logp_BT, ref_logp_BT):
  """(kl_BT, ∂/∂logp of Σ kl)."""
  fn = losses.KL_REGISTRY.make(name)
  return fn(logp_BT, ref_logp_BT), jax.grad(lambda x: jnp.sum(fn(x, ref_logp_BT)))(logp_BT)


def _kl(name, deltas):
  """The estimator at Δ = deltas (logp = Δ, ref_logp = 0), as a [1, T] array."""
  logp_BT = _row(deltas)
  return _kl_and_grad(name, logp_BT, np.zeros_like(logp_BT))[0]


def test_kl_pinned_values():
  # Δ = 0.5: k1 = 0.5; k2 = ½·0.25 = 0.125; k3 = e^-0.5 + 0.5 - 1 = 0.606531 - 0.5 = 0.106531.
  # Δ = -1: k1 = -1; k2 = ½·1 = 0.5; k3 = e^1 - 1 - 1 = 0.718282.
  np.testing.assert_allclose(_kl("k1", [0.5, -1.0])[0], [0.5, -1.0], rtol=1e-7)
  np.testing.assert_allclose(_kl("k2", [0.5, -1.0])[0], [0.125, 0.5], rtol=1e-7)
  np.testing.assert_allclose(_kl("k3", [0.5, -1.0])[0], [0.10653066, 0.71828183], rtol=1e-6)
  np.testing.assert_allclose(_kl("abs", [0.5, -1.0])[0], [0.5, 1.0], rtol=1e-7)
  np.testing.assert_allclose(_kl("k1+", [0.5, -1.0])[0], [0.5, -1.0], rtol=1e-7)
  np.testing.assert_allclose(_kl("k3+", [0.5, -1.0])[0], [0.10653066, 0.71828183], rtol=1e-6)


def test_k3_clamps():
  # Δ = 5: e^-5 + 4 = 4.006738 (no clamp). Δ = 15: e^-15 + 14 -> 10. Δ = -30: -Δ -> 20,
  # e^20 - 21 -> 10. Δ = 30: -Δ -> -20, e^-20 + 19 -> 10.
  np.testing.assert_allclose(
    _kl("k3", [5.0, 15.0, -30.0, 30.0])[0], [4.0067379, 10.0, 10.0, 10.0], rtol=1e-6
  )


def test_k3_is_nonnegative_on_a_wide_sample():
  rng = np.random.default_rng(7)
  scales = 10.0 ** np.arange(-8, 4)  # 1e-8 .. 1e3
  delta = np.concatenate(
    [(rng.normal(size=(scales.size, 4000)) * scales[:, None]).ravel(), [0.0, 1e30, -1e30]]
  ).astype(np.float32)
  for name in ("k3", "k3+"):  # Clamped: finite and in [0, 10] even at |Δ| = 1e30.
    kl = np.asarray(_kl(name, delta))
    assert np.all(np.isfinite(kl)) and np.all(kl >= 0.0) and np.all(kl <= 10.0), name
  for name in ("k2", "abs"):
    assert np.all(np.asarray(_kl(name, delta)) >= 0.0), name


@pytest.mark.parametrize("plus, base", [("k1+", "k1"), ("k3+", "k3")])
def test_straight_through_value_of_base_gradient_of_k2(plus, base):
  logp_BT = _row([0.5, -1.0, 2.0, -0.1])
  ref_logp_BT = _row([0.1, 0.3, -0.5, 0.0])  # Δ = 0.4, -1.3, 2.5, -0.1.

  def value(name):
    return _kl_and_grad(name, logp_BT, ref_logp_BT)[0]

  def grad(name):
    return _kl_and_grad(name, logp_BT, ref_logp_BT)[1]

  np.testing.assert_allclose(value(plus), value(base), rtol=1e-6)
  # ∂k2/∂logp = Δ; the base estimator's own gradient differs (k1: 1, k3: 1 - e^-Δ).
  np.testing.assert_allclose(grad(plus)[0], [0.4, -1.3, 2.5, -0.1], rtol=1e-6)
  np.testing.assert_allclose(grad(plus), grad("k2"), rtol=1e-6)
  assert not np.allclose(grad(base), grad("k2"))


# ----------------------------------------------------------------------------
# Entropy.
# ----------------------------------------------------------------------------


_entropy = jax.jit(losses.token_entropy)
_entropy_grad = jax.jit(jax.grad(lambda logits_BTV: jnp.sum(losses.token_entropy(logits_BTV))))


def test_entropy_uniform_is_log_v():
  for v in (2, 7, 1000):
    np.testing.assert_allclose(
      _entropy(np.full((2, 3, v), 4.2, np.float32)), np.full((2, 3), math.log(v)), rtol=1e-6
    )


def test_entropy_pinned_and_in_float32():
  # p = (1/2, 1/4, 1/4): H = ½ln2 + ¼ln4 + ¼ln4 = 1.5·ln2 = 1.0397208.
  logits_BTV = np.log(np.asarray([[[0.5, 0.25, 0.25]]], np.float32)) + 3.0
  np.testing.assert_allclose(_entropy(logits_BTV), [[1.5 * math.log(2)]], rtol=1e-6)
  assert _entropy(jnp.asarray(logits_BTV, jnp.bfloat16)).dtype == jnp.float32


def test_entropy_with_inf_and_huge_negative_logits_has_no_nan():
  # Two live logits of equal value: H = ln 2; the rest have p = 0 and contribute 0.
  logits_BTV = np.asarray([[[0.0, 0.0, -np.inf, -np.inf], [1.0, 1.0, -1e30, -3e38]]], np.float32)
  np.testing.assert_allclose(_entropy(logits_BTV), [[math.log(2)] * 2], rtol=1e-6)
  assert np.all(np.isfinite(_entropy_grad(logits_BTV)))
  # One live logit: a point mass, H = 0 (and a finite gradient).
  point_BTV = np.asarray([[[3.0, -np.inf, -np.inf, 0.0]]], np.float32)
  point_BTV[..., 3] = -np.inf
  np.testing.assert_array_equal(_entropy(point_BTV), [[0.0]])
  assert np.all(np.isfinite(_entropy_grad(point_BTV)))


# ----------------------------------------------------------------------------
# Hyperparameters and registries.
# ----------------------------------------------------------------------------


def test_loss_hyper_defaults_are_float32_arrays():
  hyper = losses.hyper_values()
  for field, value in (("eps_low", 0.2), ("eps_high", 0.2), ("dual_clip_c", 0.0)):
    x = getattr(hyper, field)
    assert x.dtype == jnp.float32 and x.shape == ()
    np.testing.assert_allclose(x, value)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(eps_low=-0.1), r"loss_hyper.eps_low=-0.1: must be a number in \[0, inf\]"),
    (dict(eps_high=float("nan")), r"loss_hyper.eps_high=nan: must be a number in \[0, inf\]"),
    (dict(dual_clip_c=1.0), "dual_clip_c=1.0: must be 0 .off. or > 1"),
    (dict(dual_clip_c=0.5), "dual_clip_c=0.5: must be 0 .off. or > 1"),
    (dict(dual_clip_c=-3.0), "dual_clip_c=-3.0: must be 0 .off. or > 1"),
  ],
)
def test_loss_hyper_rejects_bad_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    losses.hyper_values(**kwargs)


def test_registries_list_names_and_reject_unknown():
  assert losses.REGISTRY.names() == sorted(LOSS_NAMES)
  assert losses.KL_REGISTRY.names() == sorted(KL_NAMES)
  assert losses.REGISTRY.make("ppo_clip") is losses.ppo_clip
  assert losses.KL_REGISTRY.make("k3+") is losses.k3_plus
  with pytest.raises(ValueError, match="Unknown policy loss 'ppo'.*cispo, gspo, ppo_clip"):
    losses.REGISTRY.make("ppo")
  with pytest.raises(ValueError, match="Unknown KL estimator 'low_var_kl'.*k3"):
    losses.KL_REGISTRY.make("low_var_kl")
