"""IBPO's recoverability potential from a group's own trajectories (a prefix trie).

IBPO ("Reducing Credit Assignment Variance via Counterfactual Reasoning Paths", arXiv
2605.16302; RESEARCH.md §3) compares trajectories sampled from the same input: where two
of them share a prefix and then part, the difference of their outcomes is credit for the
tokens where they part. The reconstruction here [INF]:

  φ(s) = (Σ_{j through s} r_j + κ·r̄_g) / (n_s + κ)      the recoverability potential of the
                                                      prefix s: the mean reward of the
                                                      group's trajectories through s, shrunk
                                                      toward the group mean r̄_g by κ;
  φ(∅) = r̄_g;
  A_{i,t} = A_i + λ·(φ(o_{i,≤t}) − φ(o_{i,<t}))       potential-based shaping (Ng et al.
                                                      1999): over a rollout it telescopes to
                                                      λ·(φ(o_i) − r̄_g).

Tokens on a prefix every trajectory through it continues alike get 0 shaping (φ does not
move), so shared tokens keep cancelling; the token where a trajectory leaves the others
gets the difference between its branch's outcome and the trunk's. With κ = 0 a prefix
only one trajectory reaches has φ = r_i, and the shaping alone sums to r_i − r̄_g.

The trie is never built as a tree: each (row, t) gets two 32-bit rolling hashes of
o_{≤t}; sorting the keys (group, t, hashes) makes equal prefixes adjacent, and segment
sums over the runs give n_s and Σ r. O(BT log BT), static shapes, jittable. A hash
collision needs two different prefixes of the same length in one group to agree on 64
bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_P1, _P2 = 1_000_003, 2_654_435_761  # Odd multipliers of the two rolling hashes (mod 2^32).


def prefix_hashes(tokens_BT):
  """(h1_BT, h2_BT) uint32: two rolling hashes of o_{i,≤t} (h_t = h_{t−1}·P + o_t + 1)."""
  x_TB = tokens_BT.T.astype(jnp.uint32) + jnp.uint32(1)

  def step(carry, x_B):
    h1, h2 = carry
    h1 = h1 * jnp.uint32(_P1) + x_B
    h2 = (h2 ^ x_B) * jnp.uint32(_P2) + jnp.uint32(0x9E3779B9)
    return (h1, h2), (h1, h2)

  zeros = jnp.zeros(tokens_BT.shape[:1], jnp.uint32)
  _, (h1_TB, h2_TB) = jax.lax.scan(step, (zeros, zeros), x_TB)
  return h1_TB.T, h2_TB.T


def prefix_stats(tokens_BT, mask_BT, rewards_B, group_ids_B, valid_B=None, weights_B=None):
  """(n_BT, sum_BT): for each valid (i, t), how many valid rows j of i's group have the
  same prefix o_{j,≤t} = o_{i,≤t} (i included) and the sum of their rewards. 0 off the mask.
  With weights_B (f32, e.g. importance weights of counterfactual rows) each row j counts
  w_j times: n = Σ w_j and sum = Σ w_j r_j.

  mask_BT must be a prefix mask per row (right-padded completions): o_{i,≤t} is a real
  prefix exactly where mask_{i,t}.
  """
  B, T = tokens_BT.shape
  valid_B = jnp.ones((B,), bool) if valid_B is None else valid_B
  on_BT = mask_BT & valid_B[:, None]
  h1_BT, h2_BT = prefix_hashes(tokens_BT)
  g_BT = jnp.where(on_BT, group_ids_B.astype(jnp.int32)[:, None], B)  # B: off, sorted last.
  t_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  keys = [k.reshape(-1) for k in (h2_BT, h1_BT, t_BT, g_BT)]
  order = jnp.lexsort(keys)  # Primary key last: group, then t, then the hashes.
  sk = [k[order] for k in keys]
  new = jnp.zeros(B * T, bool).at[0].set(True)
  for k in sk:
    new = new | jnp.concatenate([jnp.ones(1, bool), k[1:] != k[:-1]])
  seg = jnp.cumsum(new) - 1
  w_BT = on_BT.astype(jnp.float32)
  if weights_B is not None:
    w_BT = w_BT * weights_B.astype(jnp.float32)[:, None]
  on = w_BT.reshape(-1)[order]
  r = jnp.broadcast_to(rewards_B.astype(jnp.float32)[:, None], (B, T)).reshape(-1)[order]
  n_sorted = jax.ops.segment_sum(on, seg, num_segments=B * T)[seg]
  s_sorted = jax.ops.segment_sum(on * r, seg, num_segments=B * T)[seg]
  inverse = jnp.zeros(B * T, jnp.int32).at[order].set(jnp.arange(B * T, dtype=jnp.int32))
  n_BT = jnp.where(on_BT, n_sorted[inverse].reshape(B, T), 0.0)
  s_BT = jnp.where(on_BT, s_sorted[inverse].reshape(B, T), 0.0)
  return n_BT, s_BT


def group_mean_reward(rewards_B, group_ids_B, valid_B=None):
  """r̄_g per row over the group's valid rows (0 for a group with none)."""
  B = rewards_B.shape[0]
  v_B = jnp.ones((B,), bool) if valid_B is None else valid_B
  r_B = jnp.where(v_B, rewards_B.astype(jnp.float32), 0.0)
  s = jax.ops.segment_sum(r_B, group_ids_B, num_segments=B)[group_ids_B]
  n = jax.ops.segment_sum(v_B.astype(jnp.float32), group_ids_B, num_segments=B)[group_ids_B]
  return s / jnp.maximum(n, 1.0)


def potential(
  tokens_BT,
  mask_BT,
  rewards_B,
  group_ids_B,
  valid_B=None,
  *,
  shrink=0.0,
  context_B=None,
  weights_B=None,
):
  """φ_BT = φ(o_{i,≤t}) on the mask (see the module docstring), and φ0_B = r̄_g.

  context_B (bool): extra rows (counterfactuals) that count in the trie but not in r̄_g;
  weights_B: their weights in the trie (`prefix_stats`). φ is defined on valid and
  context rows alike.
  """
  trie_B = valid_B if context_B is None else _valid(valid_B, rewards_B) | context_B
  n_BT, s_BT = prefix_stats(tokens_BT, mask_BT, rewards_B, group_ids_B, trie_B, weights_B)
  phi0_B = group_mean_reward(rewards_B, group_ids_B, valid_B)
  phi_BT = (s_BT + shrink * phi0_B[:, None]) / jnp.maximum(n_BT + shrink, 1e-12)
  on_BT = n_BT > 0
  return jnp.where(on_BT, phi_BT, 0.0), phi0_B


def _valid(valid_B, rewards_B):
  return jnp.ones(rewards_B.shape, bool) if valid_B is None else valid_B


def potential_and_shaping(
  tokens_BT, mask_BT, rewards_B, group_ids_B, valid_B=None, *, shrink=0.0, **context
):
  """(φ_BT, Δφ_BT): `potential` and Δφ_{i,t} = φ(o_{i,≤t}) − φ(o_{i,<t}) on the valid
  rows' mask (0 elsewhere, context rows included); Σ_t Δφ_{i,t} = φ(o_i) − r̄_g for a
  valid row. `context` = context_B, weights_B of `potential`."""
  phi_BT, phi0_B = potential(
    tokens_BT, mask_BT, rewards_B, group_ids_B, valid_B, shrink=shrink, **context
  )
  prev_BT = jnp.concatenate([phi0_B[:, None], phi_BT[:, :-1]], axis=1)
  on_BT = mask_BT if valid_B is None else mask_BT & valid_B[:, None]
  return phi_BT, jnp.where(on_BT, phi_BT - prev_BT, 0.0)


def shaping(tokens_BT, mask_BT, rewards_B, group_ids_B, valid_B=None, *, shrink=0.0, **context):
  """Δφ_BT of `potential_and_shaping`."""
  args = (tokens_BT, mask_BT, rewards_B, group_ids_B, valid_B)
  return potential_and_shaping(*args, shrink=shrink, **context)[1]


def shaping_stats(base_BT, shaping_BT, phi_BT, rewards_B, mask_BT, *, lam):
  """IBPO's metrics (`metrics.DEFINITIONS`, "ibpo/..."), over the valid tokens m:

  shaping_abs_mean      mean |λ Δφ|;
  sign_flip_frac        share of tokens whose shaped advantage A + λΔφ has the opposite
                        sign of their rollout's base advantage (where that is non-zero);
  shaping_residual_corr corr(Δφ_{i,t}, r_i − φ(o_{i,≤t})), the shaping term against what
                        the potential leaves unexplained after the token.
  """
  m = mask_BT.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  shaped = lam * shaping_BT
  base_sign = jnp.sign(base_BT)
  flipped = (base_sign != 0) & (jnp.sign(base_BT + shaped) == -base_sign)
  residual = rewards_B.astype(jnp.float32)[:, None] - phi_BT

  def centred(x):
    return (x - jnp.sum(x * m) / n) * m

  a, b = centred(shaping_BT), centred(residual)
  denom = jnp.sqrt(jnp.sum(a * a) * jnp.sum(b * b))
  return {
    "ibpo/shaping_abs_mean": jnp.sum(jnp.abs(shaped) * m) / n,
    "ibpo/sign_flip_frac": jnp.sum(flipped * m) / n,
    "ibpo/shaping_residual_corr": jnp.where(
      denom > 0, jnp.sum(a * b) / jnp.maximum(denom, 1e-30), 0.0
    ),
  }
