"""Group bookkeeping: segment reductions over `group_ids`, and host-side validation.

A rollout batch has B rows; row i belongs to group `group_ids_B[i]`, an int in [0, B)
(the sampler numbers the prompts of a batch 0..B/G-1). Every reduction here is a
`jax.ops.segment_sum` with the static segment count B, so it is jit-compatible,
static-shaped and free of Python loops over groups. Rows of one group need not be
contiguous. An optional `valid_B` leaves rows out of every statistic (rows the trainer
excludes, e.g. unscorable ones): the result equals that of the batch without them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def group_sum(x_B, group_ids_B, valid_B=None):
  """Per row, the sum of x over the valid rows of its group: out_i = Σ_{j: g_j = g_i, v_j} x_j
  (every row valid when valid_B is None)."""
  n = x_B.shape[0]
  if valid_B is not None:
    x_B = jnp.where(valid_B, x_B, jnp.zeros((), x_B.dtype))
  return jax.ops.segment_sum(x_B, group_ids_B, num_segments=n)[group_ids_B]


def group_size(group_ids_B, *, valid_B=None, dtype=jnp.float32):
  """Per row, the number of (valid) rows in its group."""
  return group_sum(jnp.ones(group_ids_B.shape, dtype), group_ids_B, valid_B)


def group_mean(x_B, group_ids_B, valid_B=None):
  """Per row, the mean of x over the valid rows of its group (0 for a group with none).

  Computed as c + mean(x - c) with c the group max, so a group whose values are all equal
  gets exactly that value (a plain sum/n rounds, and GRPO would divide the rounding error
  by a near-zero std).
  """
  n = x_B.shape[0]
  masked_B = x_B if valid_B is None else jnp.where(valid_B, x_B, -jnp.inf)
  ref_B = jax.ops.segment_max(masked_B, group_ids_B, num_segments=n)[group_ids_B]
  ref_B = jnp.where(jnp.isfinite(ref_B), ref_B, jnp.zeros((), x_B.dtype))
  n_B = group_size(group_ids_B, valid_B=valid_B, dtype=x_B.dtype)
  return ref_B + group_sum(x_B - ref_B, group_ids_B, valid_B) / jnp.maximum(n_B, 1.0)


def group_std(x_B, group_ids_B, *, unbiased: bool, valid_B=None):
  """Per row, the std of x over the valid rows of its group: sqrt(Σ (x - mean)^2 / (n - ddof)),
  ddof 1 or 0.

  A singleton group has std 0 with either ddof (the unbiased estimate is undefined;
  0 keeps the result finite and the advantage rules decide what a singleton gets).
  """
  n_B = group_size(group_ids_B, valid_B=valid_B, dtype=x_B.dtype)
  dev_B = x_B - group_mean(x_B, group_ids_B, valid_B)
  ss_B = group_sum(dev_B * dev_B, group_ids_B, valid_B)
  denom_B = n_B - 1.0 if unbiased else n_B
  return jnp.sqrt(jnp.where(denom_B > 0, ss_B / jnp.maximum(denom_B, 1.0), 0.0))


def num_groups(group_ids_B):
  """Number of distinct group ids present (a traced int32 scalar)."""
  n = group_ids_B.shape[0]
  present_B = jax.ops.segment_sum(jnp.ones(group_ids_B.shape, jnp.int32), group_ids_B, n) > 0
  return jnp.sum(present_B, dtype=jnp.int32)


# ----------------------------------------------------------------------------
# Host-side validation (at the edge, before anything is jitted).
# ----------------------------------------------------------------------------


def validate_group_ids(group_ids_B, *, group_size: int | None = None) -> None:
  """Raises ValueError unless ids are ints in [0, B) and, when given, every group has
  exactly `group_size` rows (so B must be a multiple of it)."""
  g = np.asarray(group_ids_B)
  if g.ndim != 1 or not np.issubdtype(g.dtype, np.integer):
    raise ValueError(f"group_ids must be a 1-D integer array, got shape {g.shape} {g.dtype}.")
  B = g.shape[0]
  bad = np.flatnonzero((g < 0) | (g >= B))
  if bad.size:
    raise ValueError(
      f"group_ids must lie in [0, {B}) for a batch of {B} rows; rows {bad[:8].tolist()} hold "
      f"{g[bad[:8]].tolist()}."
    )
  if group_size is None:
    return
  if B % group_size:
    raise ValueError(
      f"Group sizes are inconsistent with the batch: {B} rows is not a multiple of "
      f"group_size {group_size}."
    )
  ids, counts = np.unique(g, return_counts=True)
  wrong = counts != group_size
  if wrong.any():
    raise ValueError(
      f"Group sizes are inconsistent with the batch: every group must have {group_size} "
      f"rows, but groups {ids[wrong][:8].tolist()} have {counts[wrong][:8].tolist()}."
    )


def validate_rewards(rewards_B) -> None:
  """Raises ValueError naming the rows whose reward is NaN or infinite."""
  r = np.asarray(rewards_B, dtype=np.float64)
  bad = np.flatnonzero(~np.isfinite(r))
  if bad.size:
    raise ValueError(
      f"Rewards must be finite; rows {bad[:8].tolist()} hold {r[bad[:8]].tolist()}"
      + (f" ({bad.size} rows in all)." if bad.size > 8 else ".")
    )
