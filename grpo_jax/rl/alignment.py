"""Alignment between trajectories: edit distances over token ids and steps, and the
full-rewrite filter of IBPO (arXiv 2605.16302; RESEARCH.md §3.2 step 2).

A counterfactual trajectory is kept only when it is a *local repair* of the original: its
normalised Levenshtein distance to it, over tokens or over reasoning steps, is at most τ.

    d_N = jax.vmap(alignment.normalised_distance)(a_NT, len_a_N, b_NT, len_b_N)
    keep_N = alignment.keep_local(d_N, tau)            # τ a runtime array: no recompile
    ali = alignment.align(a_T, len_a, b_T, len_b)      # which positions differ
    d = alignment.normalised_step_distance(a_T, mask_a_T, b_T, mask_b_T, end_ids=(nl,))

Everything but `check_tau`, `differing_spans` and `histogram_metric_names` (host helpers)
is jittable with static shapes and vmap-able over pairs.

Hand-written: no maintained JAX library computes a batched, jittable Levenshtein distance
with a traceback (python-Levenshtein and rapidfuzz are host-side, one pair at a time).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# Bin edges of the distance histogram logged per step (the last bin includes 1.0).
DISTANCE_EDGES = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)


@dataclasses.dataclass(frozen=True)
class StepSplitter:
  """A task's step splitter (`step_ids`): token ids that end a step, and/or the token
  sequence that starts one ("Step "). Hashable: a static argument of jitted code."""

  end_ids: tuple[int, ...] = ()
  start_pattern: tuple[int, ...] = ()

  @property
  def defined(self) -> bool:
    return bool(self.end_ids or self.start_pattern)

  def ids(self, tokens_BT, mask_BT):
    """`step_ids` of the tokens under this splitter."""
    return step_ids(tokens_BT, mask_BT, end_ids=self.end_ids, start_pattern=self.start_pattern)


NO_STEPS = StepSplitter()  # A task without a step splitter.


# Traceback operations (`align`).
_NONE, _MATCH, _SUB, _DEL, _INS = 0, 1, 2, 3, 4

# Step hashing: a polynomial in an odd base over murmur3-mixed tokens, modulo 2^32.
_HASH_BASE = np.uint32(0x01000193)
_HASH_SEED = np.uint32(0x9E3779B9)


# ----------------------------------------------------------------------------------------
# Token-level edit distance.


def _dp_row(b_T, len_b):
  """The row update of the Levenshtein table against b[:len_b], for `lax.scan` over a.

  With D the previous row and c_j = min(D_j + 1, D_{j−1} + 1[a_i ≠ b_j]) the candidates
  without an insertion, the new row is N_j = min_{k ≤ j} (c_k + j − k) (N_0 = i + 1), a
  cumulative minimum of c_k − k. Positions past len_a (and columns past len_b) are left
  unchanged.
  """
  j = jnp.arange(b_T.shape[0] + 1, dtype=jnp.int32)
  live_j = j <= len_b

  def row(prev_J, x, len_a):
    i, a_i = x
    sub_J = prev_J[:-1] + (a_i != b_T).astype(jnp.int32)
    cand_J = jnp.minimum(prev_J[1:] + 1, sub_J)
    cand_J = jnp.concatenate([(i + 1)[None], cand_J])
    new_J = jax.lax.cummin(cand_J - j) + j
    new_J = jnp.where(live_j, new_J, prev_J)
    return jnp.where(i < len_a, new_J, prev_J)

  return j, row


def edit_distance(a_T, len_a, b_T, len_b):
  """Levenshtein distance between a[:len_a] and b[:len_b] (unit insert, delete, substitute).

  Row-by-row dynamic programme, vectorised within a row (see `_dp_row`): one `lax.scan`
  over a's T positions. Jittable; vmap it over pairs.
  """
  first_J, row = _dp_row(b_T, len_b)
  xs = (jnp.arange(a_T.shape[0], dtype=jnp.int32), a_T)
  last_J, _ = jax.lax.scan(lambda p, x: (row(p, x, len_a), None), first_J, xs)
  return last_J[len_b]


def normalised_distance(a_T, len_a, b_T, len_b):
  """d(a, b) / max(|a|, |b|) in [0, 1] (0 for two empty sequences)."""
  d = edit_distance(a_T, len_a, b_T, len_b)
  return d / jnp.maximum(jnp.maximum(len_a, len_b), 1).astype(jnp.float32)


# ----------------------------------------------------------------------------------------
# The full-rewrite filter.


def check_tau(tau):
  """float(τ), or ValueError unless the full-rewrite threshold τ is in (0, 1]."""
  if not 0.0 < float(tau) <= 1.0:
    raise ValueError(f"The full-rewrite threshold tau must be in (0, 1], got {tau}.")
  return float(tau)


def keep_local(d_N, tau):
  """keep_N = d_N ≤ τ: local repairs are kept, full rewrites dropped. Jittable with τ a
  runtime array (changing τ does not recompile); check it on the host with `check_tau`."""
  return d_N <= jnp.asarray(tau, d_N.dtype)


def local_repairs(a_NT, len_a_N, b_NT, len_b_N, *, tau):
  """(keep_N, d_N): pairs whose normalised distance is at most τ are local repairs; the
  others are full rewrites, dropped. τ must be in (0, 1]."""
  tau = check_tau(tau)
  d_N = jax.vmap(normalised_distance)(a_NT, len_a_N, b_NT, len_b_N)
  return keep_local(d_N, tau), d_N


# ----------------------------------------------------------------------------------------
# Steps: splitting, hashing, step-level distance.


def _pattern_starts(tokens_BT, mask_BT, pattern):
  """starts_BT: the pattern occurs at t, all of its tokens valid (sliding comparison)."""
  T, P = tokens_BT.shape[-1], len(pattern)
  pad = [(0, 0)] * (tokens_BT.ndim - 1) + [(0, P)]
  tok_BU, mask_BU = jnp.pad(tokens_BT, pad), jnp.pad(mask_BT, pad)
  idx_TP = jnp.arange(T)[:, None] + jnp.arange(P)[None, :]
  pattern_1P = jnp.asarray(pattern, tokens_BT.dtype).reshape((1,) * tokens_BT.ndim + (P,))
  hit_BTP = (tok_BU[..., idx_TP] == pattern_1P) & mask_BU[..., idx_TP]
  return hit_BTP.all(-1)


def step_ids(tokens_BT, mask_BT, *, end_ids=(), start_pattern=()):
  """step_BT int32: the index (0, 1, 2, ...) of the step each valid token belongs to, −1 off
  the mask. Works on any leading shape [..., T].

  A step ends after a token in `end_ids` and a new one starts at each occurrence of the
  token sequence `start_pattern` (all of it under the mask); both may be given, and an
  end immediately followed by the pattern is one boundary. The first valid token opens
  step 0, tokens off the mask (a prompt, padding) are skipped, and a trailing end token
  opens no empty step. With prev(t) the last valid position before t:
    boundary_t = valid_t ∧ prev(t) exists ∧ (tokens[prev(t)] ∈ end_ids ∨ pattern at t),
    step_t = Σ_{u ≤ t} boundary_u.
  The task splitters:
    newline   end_ids=(id of "\\n",)
    sentence  end_ids=(ids of ".", "!", "?")
    "Step k"  start_pattern=(ids of "Step"), e.g. tokenizer.encode("Step"); with a BPE the
              ids of "Step" after a newline may differ from those at the start of a text.
  """
  mask_BT = mask_BT.astype(bool)
  T = tokens_BT.shape[-1]
  end_BT = jnp.zeros_like(mask_BT)
  if len(end_ids) > 0:
    end_BT = jnp.isin(tokens_BT, jnp.asarray(end_ids, tokens_BT.dtype)) & mask_BT
  start_BT = jnp.zeros_like(mask_BT)
  if len(start_pattern) > 0:
    start_BT = _pattern_starts(tokens_BT, mask_BT, tuple(start_pattern))
  t_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), mask_BT.shape)
  last_valid_BT = jax.lax.cummax(jnp.where(mask_BT, t_BT, -1), axis=tokens_BT.ndim - 1)
  prev_BT = jnp.concatenate(
    [jnp.full(mask_BT.shape[:-1] + (1,), -1, jnp.int32), last_valid_BT[..., :-1]], axis=-1
  )
  prev_end_BT = jnp.take_along_axis(end_BT, jnp.maximum(prev_BT, 0), axis=-1)
  boundary_BT = mask_BT & (prev_BT >= 0) & (prev_end_BT | start_BT)
  step_BT = jnp.cumsum(boundary_BT.astype(jnp.int32), axis=-1)
  return jnp.where(mask_BT, step_BT, -1).astype(jnp.int32)


def _fmix32(h):
  """The murmur3 32-bit finaliser (a bijection of uint32 with good avalanche)."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def _row_hashes(tok_T, mask_T, step_T, max_steps):
  T = tok_T.shape[0]
  valid_T = mask_T.astype(bool) & (step_T >= 0)
  rank_T = jnp.cumsum(valid_T.astype(jnp.int32)) - 1
  seg_T = jnp.where(valid_T & (step_T < max_steps), step_T, max_steps)  # Dropped.
  first_S = jax.ops.segment_min(rank_T, seg_T, num_segments=max_steps)
  pos_T = rank_T - first_S[jnp.clip(seg_T, 0, max_steps - 1)]
  pow_T = jnp.cumprod(jnp.full((T,), _HASH_BASE, jnp.uint32), dtype=jnp.uint32)
  pow_T = jnp.concatenate([jnp.ones((1,), jnp.uint32), pow_T[:-1]])
  term_T = _fmix32(tok_T.astype(jnp.uint32) ^ _HASH_SEED) * pow_T[jnp.clip(pos_T, 0, T - 1)]
  sum_S = jax.ops.segment_sum(term_T, seg_T, num_segments=max_steps)
  len_S = jax.ops.segment_sum(valid_T.astype(jnp.uint32), seg_T, num_segments=max_steps)
  hash_S = _fmix32(sum_S ^ _fmix32(len_S + _HASH_SEED))
  n_steps = jnp.minimum(jnp.max(jnp.where(valid_T, step_T, -1)) + 1, max_steps)
  hash_S = jnp.where(jnp.arange(max_steps) < n_steps, hash_S, jnp.uint32(0))
  return jax.lax.bitcast_convert_type(hash_S, jnp.int32), n_steps.astype(jnp.int32)


def step_hashes(tokens_BT, mask_BT, step_BT, *, max_steps=None):
  """(hash_BS int32, n_steps_B): one hash per step, 0 past n_steps; S = max_steps (static,
  default T; steps from max_steps on are dropped, and n_steps is capped at it).

  With p_t the position of token t within its step (0, 1, ...) and n_s the step's length,
    H_s = fmix(Σ_{t ∈ s} fmix(x_t ⊕ seed) · β^{p_t} ⊕ fmix(n_s + seed))  mod 2^32,
  β an odd base, fmix the murmur3 finaliser; the sums are segment sums over step ids (no
  loop over tokens). Two steps with the same tokens get the same hash wherever they are;
  different token sequences collide with probability about 2^−32. `step_BT` is as from
  `step_ids` (contiguous ids from 0 over the valid tokens, −1 off the mask).
  """
  S = tokens_BT.shape[-1] if max_steps is None else int(max_steps)
  row = lambda tok_T, mask_T, step_T: _row_hashes(tok_T, mask_T, step_T, S)
  return jax.vmap(row)(tokens_BT, mask_BT, step_BT)


def _step_hash_row(tok_T, mask_T, *, end_ids, start_pattern, max_steps):
  step_T = step_ids(tok_T, mask_T, end_ids=end_ids, start_pattern=start_pattern)
  hash_1S, n_1 = step_hashes(tok_T[None], mask_T[None], step_T[None], max_steps=max_steps)
  return hash_1S[0], n_1[0]


def _step_distance_and_counts(a_T, mask_a_T, b_T, mask_b_T, end_ids, start_pattern, max_steps):
  opts = dict(end_ids=end_ids, start_pattern=start_pattern, max_steps=max_steps)
  hash_a_S, n_a = _step_hash_row(a_T, mask_a_T, **opts)
  hash_b_S, n_b = _step_hash_row(b_T, mask_b_T, **opts)
  return edit_distance(hash_a_S, n_a, hash_b_S, n_b), n_a, n_b


def step_distance(a_T, mask_a_T, b_T, mask_b_T, *, end_ids=(), start_pattern=(), max_steps=None):
  """Levenshtein distance between the step sequences of a and b (int32): each step is one
  symbol, its `step_hashes` hash, split by `step_ids(end_ids=, start_pattern=)`. One pair;
  vmap it over pairs."""
  d, _, _ = _step_distance_and_counts(
    a_T, mask_a_T, b_T, mask_b_T, end_ids, start_pattern, max_steps
  )
  return d


def normalised_step_distance(
  a_T, mask_a_T, b_T, mask_b_T, *, end_ids=(), start_pattern=(), max_steps=None
):
  """step_distance / max(#steps a, #steps b) in [0, 1] (0 when both have no step)."""
  d, n_a, n_b = _step_distance_and_counts(
    a_T, mask_a_T, b_T, mask_b_T, end_ids, start_pattern, max_steps
  )
  return d / jnp.maximum(jnp.maximum(n_a, n_b), 1).astype(jnp.float32)


# ----------------------------------------------------------------------------------------
# Alignment by traceback.


class Alignment(NamedTuple):
  """One optimal alignment of a[:len_a] with b[:len_b] (see `align`)."""

  diff_a_T: jax.Array  # bool: a's positions substituted or deleted.
  diff_b_T: jax.Array  # bool: b's positions substituted or inserted.
  distance: jax.Array  # int32: the edit distance, = n_sub + n_del + n_ins.
  n_sub: jax.Array  # int32: substitutions.
  n_del: jax.Array  # int32: deletions (a's positions with no counterpart in b).
  n_ins: jax.Array  # int32: insertions (b's positions with no counterpart in a).


def _table(a_T, len_a, b_T, len_b):
  """D_IJ int32 [T_a + 1, T_b + 1]: the full Levenshtein table (a scan emitting every row);
  D[i, j] = d(a[:i], b[:j]) for i ≤ len_a, j ≤ len_b."""
  first_J, row = _dp_row(b_T, len_b)

  def step(prev_J, x):
    new_J = row(prev_J, x, len_a)
    return new_J, new_J

  xs = (jnp.arange(a_T.shape[0], dtype=jnp.int32), a_T)
  _, rows_IJ = jax.lax.scan(step, first_J, xs)
  return jnp.concatenate([first_J[None], rows_IJ])


def align(a_T, len_a, b_T, len_b):
  """`Alignment`: one optimal Levenshtein alignment of a[:len_a] with b[:len_b].

  The full table D (`_table`) is walked back from (len_a, len_b) to (0, 0) by a `lax.scan`
  of fixed length T_a + T_b (idle once at the origin). Ties are broken, at each cell, in
  the order: diagonal (match, or substitution), then deletion (up), then insertion (left):
    diagonal   if i, j > 0 and D[i, j] = D[i−1, j−1] + 1[a_{i−1} ≠ b_{j−1}]
    deletion   else if i > 0 and D[i, j] = D[i−1, j] + 1
    insertion  otherwise.
  So [1, 2] vs [2, 1] is two substitutions, not a deletion, a match and an insertion.
  diff_a marks a's substituted and deleted positions, diff_b b's substituted and inserted
  ones; matched positions and positions past the lengths are False. Identities:
    Σ diff_a = n_sub + n_del,  Σ diff_b = n_sub + n_ins,
    distance = n_sub + n_del + n_ins = edit_distance(a, len_a, b, len_b),
  and a[~diff_a][:len_a − Σ diff_a] = b[~diff_b][:len_b − Σ diff_b] (the matches, in order).
  Jittable; vmap it over pairs. Memory O(T_a T_b) per pair.
  """
  T_a, T_b = a_T.shape[0], b_T.shape[0]
  D_IJ = _table(a_T, len_a, b_T, len_b)

  def back(ij, _):
    i, j = ij
    live = (i > 0) | (j > 0)
    im, jm = jnp.maximum(i - 1, 0), jnp.maximum(j - 1, 0)
    differ = a_T[im] != b_T[jm]
    d = D_IJ[i, j]
    diag = (i > 0) & (j > 0) & (d == D_IJ[im, jm] + differ.astype(jnp.int32))
    dele = ~diag & (i > 0) & (d == D_IJ[im, j] + 1)
    op = jnp.where(diag, jnp.where(differ, _SUB, _MATCH), jnp.where(dele, _DEL, _INS))
    op = jnp.where(live, op, _NONE)
    mark_a = (op == _SUB) | (op == _DEL)
    mark_b = (op == _SUB) | (op == _INS)
    i = i - ((op == _MATCH) | mark_a).astype(jnp.int32)
    j = j - ((op == _MATCH) | mark_b).astype(jnp.int32)
    return (i, j), (op, jnp.where(mark_a, im, T_a), jnp.where(mark_b, jm, T_b))

  start = (jnp.asarray(len_a, jnp.int32), jnp.asarray(len_b, jnp.int32))
  _, (op_K, ia_K, jb_K) = jax.lax.scan(back, start, None, length=T_a + T_b)
  diff_a_T = jnp.zeros((T_a,), bool).at[ia_K].set(True, mode="drop")
  diff_b_T = jnp.zeros((T_b,), bool).at[jb_K].set(True, mode="drop")
  count = lambda k: jnp.sum(op_K == k, dtype=jnp.int32)
  return Alignment(
    diff_a_T=diff_a_T,
    diff_b_T=diff_b_T,
    distance=D_IJ[len_a, len_b],
    n_sub=count(_SUB),
    n_del=count(_DEL),
    n_ins=count(_INS),
  )


def count_spans(diff_NT):
  """int32 [...]: the number of maximal runs of True along the last axis (jittable):
  Σ_t diff_t ∧ ¬diff_{t−1}."""
  prev_NT = jnp.concatenate([jnp.zeros_like(diff_NT[..., :1]), diff_NT[..., :-1]], axis=-1)
  return jnp.sum(diff_NT & ~prev_NT, axis=-1, dtype=jnp.int32)


def differing_spans(diff_T):
  """Host helper: the maximal runs of True in a 1-D mask, as [(start, stop), ...]
  (half-open, in order)."""
  diff_U = np.concatenate([[False], np.asarray(diff_T, bool), [False]])
  edges = np.flatnonzero(diff_U[1:] != diff_U[:-1])
  return [(int(s), int(e)) for s, e in zip(edges[::2], edges[1::2])]


# ----------------------------------------------------------------------------------------
# The distance histogram logged per step.


def _check_edges(edges):
  edges = tuple(float(e) for e in edges)
  if len(edges) < 2 or any(lo >= hi for lo, hi in zip(edges[:-1], edges[1:])):
    raise ValueError(f"Histogram edges must be at least two, increasing, got {edges}.")
  return edges


def distance_histogram(d_N, valid_N, *, edges=DISTANCE_EDGES, fractions=True):
  """[K − 1] per-bin share (or int32 count, fractions=False) of the valid pairs' distances.

  Bin k is [e_k, e_{k+1}), the last [e_{K−2}, e_{K−1}] (so d = 1 is counted); values
  outside [e_0, e_{K−1}] are in no bin. Fractions divide by the number of valid pairs
  (all 0 when there is none). `edges` is static; jittable.
  """
  edges = _check_edges(edges)
  lo_1K = jnp.asarray(edges[:-1], d_N.dtype)[None, :]
  hi_1K = jnp.asarray(edges[1:], d_N.dtype)[None, :]
  last_1K = (jnp.arange(len(edges) - 1) == len(edges) - 2)[None, :]
  d_N1 = d_N[:, None]
  in_NK = (d_N1 >= lo_1K) & ((d_N1 < hi_1K) | (last_1K & (d_N1 <= hi_1K)))
  counts_K = jnp.sum(in_NK & valid_N.astype(bool)[:, None], axis=0, dtype=jnp.int32)
  if not fractions:
    return counts_K
  n_valid = jnp.sum(valid_N.astype(jnp.int32))
  return counts_K / jnp.maximum(n_valid, 1).astype(jnp.float32)


def histogram_metric_names(edges=DISTANCE_EDGES, *, prefix="ibpo/distance_frac/"):
  """Stable metric names, one per `distance_histogram` bin: prefix + "lo-hi" with %g
  numbers, e.g. "ibpo/distance_frac/0-0.1", ..., "ibpo/distance_frac/0.75-1"."""
  edges = _check_edges(edges)
  return [f"{prefix}{lo:g}-{hi:g}" for lo, hi in zip(edges[:-1], edges[1:])]
