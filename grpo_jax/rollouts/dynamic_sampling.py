"""DAPO dynamic sampling with static shapes: keep groups whose rewards vary, refill, cap.

A group whose G correctness rewards are all equal (all wrong or all right) has zero
advantage under every group-relative estimator, so it only dilutes the batch. DAPO
("DAPO: An Open-Source LLM Reinforcement Learning System at Scale", Yu et al. 2025, §3.2,
Dynamic Sampling) over-samples and keeps filling the batch with groups whose accuracy is
strictly between 0 and 1.

Here each iteration samples generation batches of B prompts × G rows until B groups with
varying correctness are collected or `max_gen_batches` batches have been sampled. The
training batch always has B groups (static shapes, no recompile):

    slots 1..n_keep          the first groups with varying correctness, in sampling order;
    slots n_keep+1..B        when the cap is hit, zero-variance groups of the same
                             iteration, kept for shape only: `valid_N` is False on their
                             rows and the trainer removes them from the loss mask.

Counted per iteration: `dynamic/gen_batches`, `dynamic/dropped_groups` (zero-variance
groups not trained on), `dynamic/fill_groups` (slots filled by masked groups) and
`dynamic/surplus_groups` (varying groups sampled beyond B, discarded as in DAPO).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import sampling


@dataclasses.dataclass(frozen=True)
class Selection:
  """Which sampled groups fill the B slots: part index and group index within the part."""

  part_B: np.ndarray
  group_B: np.ndarray
  valid_B: np.ndarray  # bool: a group with varying correctness (trained on)
  dropped: int
  fill: int
  surplus: int


def varying_groups(correct_N: np.ndarray, *, group_size: int, scorable_N=None) -> np.ndarray:
  """[N/G] bool: the correctness rewards of the group's scorable rows (all rows when
  scorable_N is None) are not all equal (max > min); unscorable rows are not trained on,
  so they count as no answer, not as a wrong one."""
  c_GK = np.asarray(correct_N, np.float32).reshape(-1, group_size)
  ok_GK = np.ones_like(c_GK, bool) if scorable_N is None else np.asarray(scorable_N, bool)
  ok_GK = ok_GK.reshape(-1, group_size)
  high = np.where(ok_GK, c_GK, -np.inf).max(axis=1)
  low = np.where(ok_GK, c_GK, np.inf).min(axis=1)
  return high > low


def select(varying_parts: list[np.ndarray], *, num_groups: int) -> Selection:
  """Fills `num_groups` slots: varying groups first (in order), then zero-variance ones.

  varying_parts[k][g] says whether group g of generation batch k has varying correctness.
  """
  keep, rest = [], []
  for k, varying in enumerate(varying_parts):
    for g, v in enumerate(np.asarray(varying)):
      (keep if v else rest).append((k, g))
  total = sum(len(v) for v in varying_parts)
  if total < num_groups:
    raise ValueError(f"Only {total} groups were sampled; {num_groups} are needed.")
  chosen_keep = keep[:num_groups]
  fill = num_groups - len(chosen_keep)
  chosen = chosen_keep + rest[len(rest) - fill :] if fill else chosen_keep
  return Selection(
    part_B=np.array([k for k, _ in chosen], np.int32),
    group_B=np.array([g for _, g in chosen], np.int32),
    valid_B=np.arange(num_groups) < len(chosen_keep),
    dropped=len(rest),
    fill=fill,
    surplus=len(keep) - len(chosen_keep),
  )


def _left_pad(x_NP, width: int, value):
  """x [N, P, ...] left-padded to P = width with `value` (None stays None)."""
  if x_NP is None or width == x_NP.shape[1]:
    return x_NP
  pad = ((0, 0), (width - x_NP.shape[1], 0)) + ((0, 0),) * (x_NP.ndim - 2)
  return jnp.pad(x_NP, pad, constant_values=value)


def assemble(
  parts: list[sampling.Rollouts], sel: Selection, *, group_size: int, pad_id: int
) -> sampling.Rollouts:
  """The rollouts of the selected groups, in slot order, with group ids 0..B-1.

  Prompts of different length buckets are left-padded to the longest (positions skip
  padding, so log-probs are unchanged).
  """
  if len(parts) == 1 and np.array_equal(sel.group_B, np.arange(len(sel.group_B))):
    return parts[0]
  P = max(r.prompt_tokens_NP.shape[1] for r in parts)
  parts = [
    r.replace(
      prompt_tokens_NP=_left_pad(r.prompt_tokens_NP, P, pad_id),
      prompt_mask_NP=_left_pad(r.prompt_mask_NP, P, False),
      prompt_routes_NPLK=_left_pad(r.prompt_routes_NPLK, P, -1),  # Routing replay.
    )
    for r in parts
  ]
  offsets = np.cumsum([0] + [r.tokens_NT.shape[0] for r in parts])
  rows_N = (
    offsets[sel.part_B][:, None] + sel.group_B[:, None] * group_size + np.arange(group_size)
  ).reshape(-1)
  num_steps = jnp.max(jnp.stack([r.num_steps for r in parts]))
  joined = jax.tree.map(
    lambda *xs: jnp.concatenate(xs, axis=0), *[r.replace(num_steps=None) for r in parts]
  )
  out = jax.tree.map(lambda x: jnp.take(x, jnp.asarray(rows_N), axis=0), joined)
  group_ids_N = jnp.repeat(jnp.arange(len(sel.group_B), dtype=out.group_ids_N.dtype), group_size)
  return out.replace(group_ids_N=group_ids_N, num_steps=num_steps)


def select_rows(x_parts: list[np.ndarray], sel: Selection, *, group_size: int) -> np.ndarray:
  """The host-side per-row arrays (rewards, flags) of the selected groups, in slot order."""
  x_KGN = [np.asarray(x).reshape(-1, group_size, *np.shape(x)[1:]) for x in x_parts]
  return np.concatenate([x_KGN[k][g] for k, g in zip(sel.part_B, sel.group_B)], axis=0)
