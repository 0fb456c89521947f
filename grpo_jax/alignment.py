"""Alignment between trajectories: edit distances over token ids and steps, and the
full-rewrite filter of IBPO (arXiv 2605.16302; RESEARCH.md §3.2 step 2).

Hand-written: no maintained JAX library computes a batched, jittable Levenshtein distance
with a traceback (python-Levenshtein and rapidfuzz are host-side, one pair at a time).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def edit_distance(a_T, len_a, b_T, len_b):
  """Levenshtein distance between a[:len_a] and b[:len_b] (unit insert, delete, substitute).

  Row-by-row dynamic programme, vectorised within a row: with D the previous row and
  c_j = min(D_j + 1, D_{j−1} + 1[a_i ≠ b_j]) the candidates without an insertion, the new
  row is N_j = min_{k ≤ j} (c_k + j − k) (N_0 = i), a cumulative minimum of c_k − k. One
  `lax.scan` over a's T positions; positions past len_a leave the row unchanged. Jittable;
  vmap it over pairs.
  """
  T_b = b_T.shape[0]
  j = jnp.arange(T_b + 1, dtype=jnp.int32)
  live_b = j[1:] <= len_b

  def row(prev, x):
    i, a_i = x
    sub = prev[:-1] + (a_i != b_T).astype(jnp.int32)
    cand = jnp.minimum(prev[1:] + 1, sub)
    cand = jnp.concatenate([jnp.array([i + 1], jnp.int32), cand])
    new = jax.lax.cummin(cand - j) + j
    new = jnp.where(jnp.concatenate([jnp.array([True]), live_b]), new, prev)
    return jnp.where(i < len_a, new, prev), None

  last, _ = jax.lax.scan(row, j, (jnp.arange(a_T.shape[0], dtype=jnp.int32), a_T))
  return last[len_b]


def normalised_distance(a_T, len_a, b_T, len_b):
  """d(a, b) / max(|a|, |b|) in [0, 1] (0 for two empty sequences)."""
  d = edit_distance(a_T, len_a, b_T, len_b)
  return d / jnp.maximum(jnp.maximum(len_a, len_b), 1).astype(jnp.float32)


def local_repairs(a_NT, len_a_N, b_NT, len_b_N, *, tau):
  """(keep_N, d_N): pairs whose normalised distance is at most τ are local repairs; the
  others are full rewrites, dropped. τ must be in (0, 1]."""
  if not 0.0 < float(tau) <= 1.0:
    raise ValueError(f"The full-rewrite threshold tau must be in (0, 1], got {tau}.")
  d_N = jax.vmap(normalised_distance)(a_NT, len_a_N, b_NT, len_b_N)
  return d_N <= tau, d_N
