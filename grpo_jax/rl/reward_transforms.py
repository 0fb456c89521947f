"""Reward transforms: verifier outputs -> the scalar reward r_i the advantages see.

    r_i = c_i + w_fmt·f_i + overlong_i,   then r_i = 0 if truncated and policy == "zero",

with c_i the correctness reward, f_i the format reward, w_fmt the format weight and
overlong_i the DAPO soft overlong penalty (0 when disabled). The "mask" truncation policy
leaves r_i alone and removes truncated rollouts from the loss (the `overlong_filter`
token mask). Pure jnp, so the same code runs on host arrays or under jit.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

TRUNCATION_POLICIES = ("none", "zero", "mask")


@flax.struct.dataclass
class RewardHyper:
  """format_weight w_fmt; overlong penalty L_max, L_buf and factor (arrays; factor 0 = off)."""

  format_weight: jax.Array
  overlong_max_len: jax.Array
  overlong_buffer: jax.Array
  overlong_factor: jax.Array


def reward_hyper(
  *,
  format_weight: float = 0.0,
  overlong_max_len: int = 0,
  overlong_buffer: int = 0,
  overlong_factor: float = 0.0,
) -> RewardHyper:
  if overlong_factor < 0:
    raise ValueError(f"overlong_factor must be >= 0, got {overlong_factor}.")
  if overlong_factor > 0 and not 0 < overlong_buffer <= overlong_max_len:
    raise ValueError(
      "The overlong penalty needs 0 < overlong_buffer <= overlong_max_len, got "
      f"buffer {overlong_buffer}, max_len {overlong_max_len}."
    )
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return RewardHyper(
    format_weight=f32(format_weight),
    overlong_max_len=f32(overlong_max_len),
    overlong_buffer=f32(max(overlong_buffer, 1)),
    overlong_factor=f32(overlong_factor),
  )


def overlong_penalty(length_B, hyper: RewardHyper):
  """DAPO soft overlong punishment: min(-(L - (L_max - L_buf))/L_buf · factor, 0).

  0 while L <= L_max - L_buf, linear down to -factor at L = L_max (and below it beyond).
  Source: DAPO (arXiv 2503.14476) eq. 13; verl `reward_manager/dapo.py`.
  """
  start = hyper.overlong_max_len - hyper.overlong_buffer
  pen_B = -(length_B.astype(jnp.float32) - start) / hyper.overlong_buffer * hyper.overlong_factor
  return jnp.minimum(pen_B, 0.0)


def shape_rewards(
  correct_B, format_B, length_B, truncated_B, hyper: RewardHyper, *, truncation: str = "none"
):
  """r_i = c_i + w_fmt·f_i + overlong_i; truncated rows get 0 under truncation="zero"."""
  if truncation not in TRUNCATION_POLICIES:
    raise ValueError(f"truncation must be one of {TRUNCATION_POLICIES}, got {truncation!r}.")
  r_B = (
    jnp.asarray(correct_B, jnp.float32)
    + hyper.format_weight * jnp.asarray(format_B, jnp.float32)
    + overlong_penalty(jnp.asarray(length_B), hyper)
  )
  if truncation == "zero":
    r_B = jnp.where(jnp.asarray(truncated_B), 0.0, r_B)
  return r_B
