"""Host side: per-iteration checks of what the device cannot check (non-finite steps,
malformed reward batches)."""

from __future__ import annotations

import numpy as np

from grpo_jax.rl import (
  groups,
)


class NonFiniteError(RuntimeError):
  """Too many consecutive train steps with a non-finite loss, gradient or updated state."""


def count_nonfinite(flags, run: int, *, limit: int, where: str) -> tuple[int, int]:
  """(skipped steps among `flags`, the consecutive run after them, continuing `run`);
  raises NonFiniteError once the run reaches `limit`."""
  for f in flags:
    run = run + 1 if f else 0
    if run >= limit:
      raise NonFiniteError(
        f"{run} consecutive train steps had a non-finite loss, gradient or updated state "
        f"({where}); they were skipped, and the state is that of the last finite step. Lower "
        "the learning rate, check rewards and advantages for NaN/inf, or raise "
        "config.max_nonfinite_steps."
      )
  return int(sum(bool(f) for f in flags)), run


def validate_batch(*, rewards_N, group_ids_N, group_size: int) -> None:
  """Bad scores fail here with a clear message: NaN rewards (row index) and group ids that
  do not match the group size. (Batch and mini-batch shapes are checked once, by
  `build.build`.)"""
  groups.validate_rewards(rewards_N)
  groups.validate_group_ids(np.asarray(group_ids_N), group_size=group_size)
