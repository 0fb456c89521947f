"""The FADE controller hook: (λ_S, λ_F, γ) from running entropy, its slope and pass rate."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages, controllers, declared

OPTS = dict(entropy_high=1.0, entropy_low=0.2, max_drop=0.05, pass_high=0.9, hard_gamma=2.0)


def _run(entropies, pass_rate=0.5, **opts):
  ctrl = controllers.REGISTRY.make("fade_entropy", **{**OPTS, **opts})
  hyper, state = advantages.hyper_values(), controllers.init_state()
  for h in entropies:
    hyper, state = ctrl(hyper, state, {"rollout_entropy": h, "pass_rate": pass_rate})
  return declared.Values(hyper), state  # A controller maps {name: array} to the same.


def test_healthy_entropy_keeps_balance_and_hard_focus():
  # H = 1.0 at the top of the band, flat: φ = 1 -> λ_F = 1, γ = hard_gamma.
  hyper, state = _run([1.0, 1.0, 1.0])
  assert float(hyper.lambda_s) == 1.0 and float(hyper.lambda_f) == pytest.approx(1.0)
  assert float(hyper.focal_gamma) == pytest.approx(2.0)
  assert float(state["slope"]) == pytest.approx(0.0)


def test_low_entropy_moves_to_suppression_and_medium_focus():
  # H = 0.6 (flat): level φ = (0.6 - 0.2)/0.8 = 0.5 -> λ_F = 1 + (2 - 1)·0.5 = 1.5, γ = 1.
  hyper, _ = _run([0.6, 0.6])
  assert float(hyper.lambda_f) == pytest.approx(1.5)
  assert float(hyper.focal_gamma) == pytest.approx(1.0)
  hyper, _ = _run([0.1])  # Below the band: φ = 0.
  assert float(hyper.lambda_f) == pytest.approx(2.0) and float(hyper.focal_gamma) == 0.0


def test_falling_entropy_counts_as_exploitation():
  # First step: H̄ = 1.0. Second: H̄ = 0.9·1.0 + 0.1·0.0 = 0.9, slope = 0.1·(0.9 - 1.0) = -0.01.
  # φ = level (0.9-0.2)/0.8 = 0.875 times clip(1 - 0.01/0.05) = 0.8 -> 0.7.
  hyper, state = _run([1.0, 0.0])
  assert float(state["entropy"]) == pytest.approx(0.9)
  assert float(state["slope"]) == pytest.approx(-0.01)
  assert float(hyper.focal_gamma) == pytest.approx(2.0 * 0.7, rel=1e-5)
  assert float(hyper.lambda_f) == pytest.approx(1.0 + 0.3, rel=1e-5)


def test_saturated_pass_rate_stops_exploration():
  hyper, _ = _run([1.0], pass_rate=0.95)
  assert float(hyper.lambda_f) == pytest.approx(2.0) and float(hyper.focal_gamma) == 0.0


def test_controller_updates_do_not_recompile_the_estimator():
  fade_fn = advantages.REGISTRY.make("fade")
  fade = jax.jit(lambda inputs, hyper: fade_fn(inputs, hyper))  # Its own jit cache.
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.array([1.0, 0.0, 0.0, 0.0]),
    group_ids_B=jnp.zeros(4, jnp.int32),
    mask_BT=jnp.ones((4, 3), bool),
  )
  ctrl = controllers.REGISTRY.make("fade_entropy", **OPTS)
  hyper, state = advantages.hyper_values(), controllers.init_state()
  outs = []
  for h in (1.0, 0.5, 0.1):
    hyper, state = ctrl(hyper, state, {"rollout_entropy": h, "pass_rate": 0.25})
    outs.append(np.asarray(fade(inputs, declared.Values(hyper))))
  assert fade._cache_size() == 1
  assert not np.allclose(outs[0], outs[2])  # The schedule did change the advantages.


def test_none_controller_and_bad_options():
  hyper = advantages.hyper_values(lambda_f=3.0)
  out, _ = controllers.REGISTRY.make("none")(hyper, controllers.init_state(), {})
  assert float(out.lambda_f) == 3.0
  with pytest.raises(ValueError, match="entropy_high > entropy_low"):
    controllers.REGISTRY.make("fade_entropy", entropy_high=0.1, entropy_low=0.5)
  with pytest.raises(ValueError, match="valid names: fade_entropy, none"):
    controllers.REGISTRY.make("pid")
  with pytest.raises(ValueError, match="no options \\['gain'\\]"):
    controllers.REGISTRY.make("fade_entropy", gain=1.0)
