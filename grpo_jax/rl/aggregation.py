"""Loss aggregation as explicit per-token weights: loss = Σ_{i,t} w_{i,t}·ℓ_{i,t}.

Each mode has the signature `fn(mask_BT, group_ids_B, adv_BT, *, max_len) -> w_BT` and is
registered by its config name in `REGISTRY`. The weights are computed from the rows they
are given, which the train step makes the whole mini-batch (the rows of one optimizer
step), never a micro-batch: the step computes w over the mini-batch first and then sums
Σ w·ℓ over micro-batches, so gradient accumulation cannot change the result.

Notation: m_{i,t} the loss mask, L_i = Σ_t m_{i,t}, B the rows given, B' = #{i: L_i > 0},
g(i) the row's group, G' the number of groups with Σ_{j∈g} L_j > 0, ā_i the sequence
advantage. Names do not transfer across frameworks (verl's and tunix's same-named modes
differ); these are defined by the formulas below.

Exchangeability (arXiv 2604.13088): with zero-sum group advantages, a token occurring
once in every rollout of a group cancels exactly iff its weight does not depend on the
rollout: true for token_mean, constant_norm and group_token_mean; false for
seq_mean_token_mean (1/L_i) and balanced (sign-dependent) with unequal lengths.
"""

from __future__ import annotations

import jax.numpy as jnp

from grpo_jax.infra import registry
from grpo_jax.rl import advantages, groups

REGISTRY = registry.Registry("aggregation mode")


def _lengths(mask_BT):
  return jnp.sum(mask_BT.astype(jnp.float32), axis=1)


@REGISTRY.register("token_mean")
def token_mean(mask_BT, group_ids_B, adv_BT, *, max_len=None):
  """w_{i,t} = m_{i,t} / Σ_{j,s} m_{j,s}: one mean over every token of the mini-batch.

  Source: DAPO token-level loss (arXiv 2503.14476); verl `token-mean` (global token count).
  """
  del group_ids_B, adv_BT, max_len
  m_BT = mask_BT.astype(jnp.float32)
  return m_BT / jnp.maximum(jnp.sum(m_BT), 1.0)


@REGISTRY.register("seq_mean_token_mean")
def seq_mean_token_mean(mask_BT, group_ids_B, adv_BT, *, max_len=None):
  """w_{i,t} = m_{i,t} / (B'·L_i): a token mean per sequence, then a mean over sequences.

  Source: GRPO (DeepSeekMath, arXiv 2402.03300) 1/G Σ_i 1/|o_i| Σ_t; verl
  `seq-mean-token-mean`; GSPO uses it.
  """
  del group_ids_B, adv_BT, max_len
  m_BT = mask_BT.astype(jnp.float32)
  L_B = _lengths(mask_BT)
  n_seq = jnp.maximum(jnp.sum(L_B > 0), 1)
  return m_BT / (jnp.maximum(L_B, 1.0)[:, None] * n_seq)


@REGISTRY.register("seq_mean_token_sum")
def seq_mean_token_sum(mask_BT, group_ids_B, adv_BT, *, max_len=None):
  """w_{i,t} = m_{i,t} / B': a token sum per sequence, then a mean over sequences.

  Source: verl `seq-mean-token-sum`.
  """
  del group_ids_B, adv_BT, max_len
  m_BT = mask_BT.astype(jnp.float32)
  return m_BT / jnp.maximum(jnp.sum(_lengths(mask_BT) > 0), 1)


@REGISTRY.register("constant_norm")
def constant_norm(mask_BT, group_ids_B, adv_BT, *, max_len=None):
  """w_{i,t} = m_{i,t} / (B·L_max), L_max = max_len (default: the padded length T).

  Source: Dr. GRPO (arXiv 2503.20783; oat `masked_sum(...)/generate_max_length` then a
  mean over sequences) = tunix `sequence-mean-token-scale`.
  """
  del group_ids_B, adv_BT
  B, T = mask_BT.shape
  return mask_BT.astype(jnp.float32) / (B * float(max_len or T))


@REGISTRY.register("group_token_mean")
def group_token_mean(mask_BT, group_ids_B, adv_BT, *, max_len=None):
  """w_{i,t} = m_{i,t} / (G'·Σ_{j∈g(i)} L_j): a token mean per group, then a mean over groups.

  The normaliser is shared by every rollout of a group, so the weight of a token does not
  depend on which rollout it sits in (exchangeability-preserving). The group sum runs over
  the group's rows in the mini-batch (all of them under query-preserved planning).
  Source: the group-shared normaliser [INF] for arXiv 2604.13088, RESEARCH.md §1.2.
  """
  del adv_BT, max_len
  m_BT = mask_BT.astype(jnp.float32)
  group_L_B = groups.group_sum(_lengths(mask_BT), group_ids_B)
  # G' = Σ_i L_i / Σ_{j∈g(i)} L_j counts each non-empty group once.
  n_groups = jnp.maximum(jnp.sum(_lengths(mask_BT) / jnp.maximum(group_L_B, 1.0)), 1.0)
  return m_BT / (jnp.maximum(group_L_B, 1.0)[:, None] * n_groups)


@REGISTRY.register("balanced")
def balanced(mask_BT, group_ids_B, adv_BT, *, max_len=None):
  """Token means over positive (ā>0), negative (ā<0) and zero-advantage rows separately,
  combined by sequence counts: w_{i,t} = m_{i,t}·(n_c/B') / Σ_{j∈c} L_j for i in class c.

  With no zero-advantage rows this is Balanced Aggregation: (n₊/n)·mean₊ + (n₋/n)·mean₋.
  Source: Balanced Aggregation (arXiv 2605.04077).
  """
  del group_ids_B, max_len
  m_BT = mask_BT.astype(jnp.float32)
  L_B = _lengths(mask_BT)
  a_B = advantages.sequence_advantage(adv_BT, mask_BT)
  n_seq = jnp.maximum(jnp.sum(L_B > 0), 1)
  w_B = jnp.zeros_like(L_B)
  for cls_B in (a_B > 0, a_B < 0, a_B == 0):
    in_B = cls_B & (L_B > 0)
    tokens = jnp.sum(jnp.where(in_B, L_B, 0.0))
    w_B = jnp.where(in_B, (jnp.sum(in_B) / n_seq) / jnp.maximum(tokens, 1.0), w_B)
  return m_BT * w_B[:, None]


def aggregate(loss_BT, w_BT):
  """Σ_{i,t} w_{i,t}·ℓ_{i,t}."""
  return jnp.sum(w_BT * loss_BT)
