"""Reward transforms: the DAPO soft overlong penalty, truncation policies, format weighting."""

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import reward_transforms

# L_max = 20, L_buf = 4: the buffer starts at L_max - L_buf = 16.
DAPO = reward_transforms.reward_hyper(overlong_max_len=20, overlong_buffer=4, overlong_factor=1.0)


def _penalty(lengths, hyper=DAPO):
  return np.asarray(reward_transforms.overlong_penalty(jnp.asarray(lengths, jnp.int32), hyper))


def test_overlong_penalty_three_regimes():
  # L <= 16: 0.  16 < L <= 20: -(L - 16)/4.  L = L_max = 20: -1 = -factor.
  lengths = [0, 10, 15, 16, 17, 18, 19, 20]
  expected = [0, 0, 0, 0, -0.25, -0.5, -0.75, -1.0]
  np.testing.assert_allclose(_penalty(lengths), expected, rtol=1e-7, atol=0)


def test_overlong_penalty_beyond_max_len_keeps_falling():
  # verl's min(-(L - 16)/4·factor, 0) has no floor: L = 22 gives -6/4 = -1.5.
  np.testing.assert_allclose(_penalty([22, 24]), [-1.5, -2.0], rtol=1e-7)


def test_overlong_penalty_factor_scales_linearly():
  hyper = reward_transforms.reward_hyper(
    overlong_max_len=20, overlong_buffer=4, overlong_factor=2.5
  )
  # factor 2.5: L = 18 -> -(2/4)·2.5 = -1.25; L = 20 -> -2.5.
  np.testing.assert_allclose(_penalty([16, 18, 20], hyper), [0, -1.25, -2.5], rtol=1e-7)


def test_overlong_buffer_equal_to_max_len():
  hyper = reward_transforms.reward_hyper(overlong_max_len=8, overlong_buffer=8, overlong_factor=1)
  # Starts at 0: L = 2 -> -2/8, L = 8 -> -1; L = 0 -> 0.
  np.testing.assert_allclose(_penalty([0, 2, 8], hyper), [0, -0.25, -1], rtol=1e-7)


def test_overlong_penalty_disabled_by_default():
  off = reward_transforms.reward_hyper()
  np.testing.assert_array_equal(_penalty([0, 1, 100, 10**6], off), 0.0)


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(
  lengths=st.lists(st.integers(0, 64), min_size=8, max_size=8),
  max_len=st.integers(1, 48),
  buffer_frac=st.floats(0.05, 1.0),
  factor=st.floats(0.0, 3.0),
)
def test_overlong_penalty_properties(lengths, max_len, buffer_frac, factor):
  buffer = max(1, min(max_len, round(buffer_frac * max_len)))
  hyper = reward_transforms.reward_hyper(
    overlong_max_len=max_len, overlong_buffer=buffer, overlong_factor=factor
  )
  lengths = np.sort(np.asarray(lengths))
  pen = _penalty(lengths, hyper)
  start = max_len - buffer
  np.testing.assert_array_equal(pen[lengths <= start], 0.0)
  inside = (lengths > start) & (lengths <= max_len)
  np.testing.assert_allclose(
    pen[inside], -(lengths[inside] - start) / buffer * factor, rtol=1e-6, atol=1e-6
  )
  assert (pen[lengths <= max_len] >= -factor - 1e-6).all()
  assert (np.diff(pen) <= 1e-6).all()  # Non-increasing in L.


# ----------------------------------------------------------------------------
# shape_rewards.
# ----------------------------------------------------------------------------

CORRECT = [1.0, 0.0, 1.0, 1.0]
FORMAT = [1.0, 1.0, 0.0, 1.0]
LENGTH = [5, 17, 19, 12]
TRUNCATED = [False, False, True, False]
FULL = reward_transforms.reward_hyper(
  format_weight=0.5, overlong_max_len=20, overlong_buffer=4, overlong_factor=1.0
)


def _shape(hyper=FULL, truncation="none", correct=CORRECT):
  return np.asarray(
    reward_transforms.shape_rewards(
      jnp.asarray(correct),
      jnp.asarray(FORMAT),
      jnp.asarray(LENGTH, jnp.int32),
      jnp.asarray(TRUNCATED),
      hyper,
      truncation=truncation,
    )
  )


def test_shape_rewards_sums_correctness_format_and_penalty():
  # r = c + 0.5·f + overlong:
  #   row 0: 1 + 0.5 + 0 (L 5)                       = 1.5
  #   row 1: 0 + 0.5 - (17 - 16)/4 = 0.5 - 0.25       = 0.25
  #   row 2: 1 + 0   - (19 - 16)/4 = 1 - 0.75         = 0.25
  #   row 3: 1 + 0.5 + 0 (L 12)                      = 1.5
  np.testing.assert_allclose(_shape(), [1.5, 0.25, 0.25, 1.5], rtol=1e-7)


def test_shape_rewards_truncation_policies():
  # "zero": the truncated row 2 gets 0 instead of 0.25; "none" and "mask" leave it.
  np.testing.assert_allclose(_shape(truncation="zero"), [1.5, 0.25, 0.0, 1.5], rtol=1e-7)
  np.testing.assert_allclose(_shape(truncation="none"), [1.5, 0.25, 0.25, 1.5], rtol=1e-7)
  np.testing.assert_allclose(_shape(truncation="mask"), [1.5, 0.25, 0.25, 1.5], rtol=1e-7)


def test_format_weight():
  # No penalty: r = c + w·f. w = 0 -> c; w = 0.2 -> [1.2, 0.2, 1.0, 1.2]; w = -1 -> [0, -1, 1, 0].
  for w, expected in ((0.0, CORRECT), (0.2, [1.2, 0.2, 1.0, 1.2]), (-1.0, [0, -1, 1, 0])):
    hyper = reward_transforms.reward_hyper(format_weight=w)
    np.testing.assert_allclose(_shape(hyper), expected, rtol=1e-6, err_msg=str(w))


def test_partial_credit_passes_through():
  hyper = reward_transforms.reward_hyper()
  np.testing.assert_allclose(_shape(hyper, correct=[0.3, -2.0, 0.7, 0.0]), [0.3, -2.0, 0.7, 0.0])


def test_shape_rewards_jits_and_hyper_does_not_recompile():
  traces = []

  def fn(hyper):
    traces.append(None)
    return reward_transforms.shape_rewards(
      jnp.asarray(CORRECT),
      jnp.asarray(FORMAT),
      jnp.asarray(LENGTH),
      jnp.asarray(TRUNCATED),
      hyper,
      truncation="zero",
    )

  jitted = jax.jit(fn)
  np.testing.assert_allclose(jitted(FULL), [1.5, 0.25, 0.0, 1.5], rtol=1e-7)
  # Buffer 8 (start 12), factor 2: row 0 (L 5) 1.5; row 1 (L 17): 0.5 - (5/8)·2 = -0.75;
  # row 2 truncated 0; row 3 (L 12) 1.5.
  other = reward_transforms.reward_hyper(
    format_weight=0.5, overlong_max_len=20, overlong_buffer=8, overlong_factor=2.0
  )
  np.testing.assert_allclose(jitted(other), [1.5, -0.75, 0.0, 1.5], rtol=1e-7)
  assert len(traces) == 1


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(overlong_factor=-1.0), "overlong_factor must be >= 0"),
    (
      dict(overlong_max_len=20, overlong_buffer=0, overlong_factor=1.0),
      "0 < overlong_buffer <= overlong_max_len, got buffer 0, max_len 20",
    ),
    (
      dict(overlong_max_len=20, overlong_buffer=-4, overlong_factor=1.0),
      "got buffer -4, max_len 20",
    ),
    (
      dict(overlong_max_len=4, overlong_buffer=8, overlong_factor=1.0),
      "got buffer 8, max_len 4",
    ),
    (dict(overlong_factor=0.5), "got buffer 0, max_len 0"),  # enabled without lengths
  ],
)
def test_reward_hyper_rejects_bad_values(kwargs, match):
  with pytest.raises(ValueError, match=match):
    reward_transforms.reward_hyper(**kwargs)


def test_reward_hyper_accepts_disabled_penalty_without_lengths():
  hyper = reward_transforms.reward_hyper(format_weight=0.1)
  assert float(hyper.overlong_factor) == 0.0
  assert hyper.format_weight.dtype == jnp.float32


def test_unknown_truncation_policy_lists_allowed():
  with pytest.raises(ValueError, match=r"truncation must be one of \('none', 'zero', 'mask'\)"):
    _shape(truncation="drop")
