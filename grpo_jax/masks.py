"""Token masks: which completion tokens enter the loss.

Each mask has the signature `fn(inputs: MaskInputs, hyper: MaskHyper, **static_options) ->
keep_BT` (bool; True = the token stays in the loss) and is registered by its config name
in `REGISTRY`. Masks compose by AND (`apply`), and every mask reports the fraction of
valid tokens it removed. Removed tokens leave the aggregation normalisers too, since
aggregation weights are computed from the final loss mask.

Polarity is the sign of the row's sequence advantage ā_i = Σ_t m A / Σ_t m.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from grpo_jax import advantages, registry

REGISTRY = registry.Registry("token mask")


@flax.struct.dataclass
class MaskInputs:
  """adv_BT f32, mask_BT bool (valid completion tokens), old_logp_BT f32 (log π_old of the
  sampled token), entropy_BT f32 (entropy of π_old at that step), tokens_BT int32,
  group_ids_B int32, truncated_B bool (no EOS within the length limit)."""

  adv_BT: jax.Array
  mask_BT: jax.Array
  old_logp_BT: jax.Array
  entropy_BT: jax.Array
  tokens_BT: jax.Array
  group_ids_B: jax.Array
  truncated_B: jax.Array


@flax.struct.dataclass
class MaskHyper:
  """prob_threshold τ_p and entropy_threshold τ_H of negative-token filtering (arrays)."""

  prob_threshold: jax.Array
  entropy_threshold: jax.Array


def mask_hyper(*, prob_threshold: float = 0.9, entropy_threshold: float = 0.1) -> MaskHyper:
  if not 0.0 <= prob_threshold <= 1.0:
    raise ValueError(f"prob_threshold must be in [0, 1], got {prob_threshold}.")
  if entropy_threshold < 0:
    raise ValueError(f"entropy_threshold must be >= 0, got {entropy_threshold}.")
  return MaskHyper(
    prob_threshold=jnp.asarray(prob_threshold, jnp.float32),
    entropy_threshold=jnp.asarray(entropy_threshold, jnp.float32),
  )


def _polarity(inputs: MaskInputs):
  return advantages.sequence_advantage(inputs.adv_BT, inputs.mask_BT)


@REGISTRY.register("positive_only")
def positive_only(inputs: MaskInputs, hyper: MaskHyper):
  """keep_{i,t} = 1(ā_i >= 0): tokens of negative-advantage rollouts are removed.

  Source: the positive-only arm of arXiv 2605.08666 (masking, rather than zeroing A, also
  removes the tokens from token-count normalisers).
  """
  del hyper
  return jnp.broadcast_to((_polarity(inputs) >= 0)[:, None], inputs.mask_BT.shape)


@REGISTRY.register("negative_only")
def negative_only(inputs: MaskInputs, hyper: MaskHyper):
  """keep_{i,t} = 1(ā_i <= 0): tokens of positive-advantage rollouts are removed.

  Source: the negative-sample arm of arXiv 2605.08666; cf. NSR, "The Surprising
  Effectiveness of Negative Reinforcement" (arXiv 2506.01347).
  """
  del hyper
  return jnp.broadcast_to((_polarity(inputs) <= 0)[:, None], inputs.mask_BT.shape)


def _in_positive_rollouts(inputs: MaskInputs, vocab_bound):
  """Per token: does its id occur at a valid position of a positive rollout of its group?

  Keys k = g·V + v (uint32) of all valid positive-rollout tokens are sorted once; each
  token's key is then looked up by binary search: O(BT log BT), static shapes, no [B, V].
  """
  B, T = inputs.tokens_BT.shape
  key_BT = inputs.group_ids_B.astype(jnp.uint32)[:, None] * jnp.uint32(vocab_bound) + (
    inputs.tokens_BT.astype(jnp.uint32)
  )
  positive_BT = inputs.mask_BT & (_polarity(inputs) > 0)[:, None]
  sentinel = jnp.uint32(0xFFFFFFFF)
  table_K = jnp.sort(jnp.where(positive_BT, key_BT, sentinel).reshape(-1))
  at_BT = jnp.clip(jnp.searchsorted(table_K, key_BT), 0, B * T - 1)
  return table_K[at_BT] == key_BT


@REGISTRY.register("negative_token_filter")
def negative_token_filter(
  inputs: MaskInputs,
  hyper: MaskHyper,
  *,
  criteria: tuple[str, ...] = ("prob",),
  vocab_size: int = 0,
):
  """keep_{i,t} = 1 - 1(ā_i < 0)·1(any selected criterion holds at t), the criteria being:
    "prob":    π_old(o_t) > τ_p              (confident tokens: penalising them squeezes),
    "entropy": H(π_old(·|o_<t)) < τ_H        (low-entropy positions),
    "shared":  o_t occurs in a positive rollout of the same group.
  Tokens of non-negative rollouts are kept. "shared" needs `vocab_size` (a bound on ids,
  with B·vocab_size < 2^32).

  Source: negative token filtering, "Rethinking Groups in Critic-Free RLVR" (arXiv
  2606.17250); the criteria are a reconstruction [INF], RESEARCH.md §5b.
  """
  unknown = sorted(set(criteria) - {"prob", "entropy", "shared"})
  if unknown or not criteria:
    raise ValueError(
      f"negative_token_filter criteria must be a non-empty subset of ('prob', 'entropy', "
      f"'shared'), got {tuple(criteria)}."
    )
  drop_BT = jnp.zeros(inputs.mask_BT.shape, jnp.bool_)
  if "prob" in criteria:
    drop_BT |= jnp.exp(inputs.old_logp_BT) > hyper.prob_threshold
  if "entropy" in criteria:
    drop_BT |= inputs.entropy_BT < hyper.entropy_threshold
  if "shared" in criteria:
    if vocab_size <= 0:
      raise ValueError("negative_token_filter with 'shared' needs vocab_size > 0.")
    B = inputs.tokens_BT.shape[0]
    if B * vocab_size >= 2**32:
      raise ValueError(
        f"negative_token_filter 'shared' needs batch*vocab_size < 2^32, got {B}*{vocab_size}."
      )
    drop_BT |= _in_positive_rollouts(inputs, vocab_size)
  negative_B = _polarity(inputs) < 0
  return ~(negative_B[:, None] & drop_BT)


@REGISTRY.register("overlong_filter")
def overlong_filter(inputs: MaskInputs, hyper: MaskHyper):
  """keep_{i,t} = 1(row i ended with EOS): truncated rollouts leave the loss entirely.

  Source: DAPO overlong filtering (arXiv 2503.14476).
  """
  del hyper
  return jnp.broadcast_to(~inputs.truncated_B[:, None], inputs.mask_BT.shape)


def masked_fraction(mask_BT, keep_BT):
  """Fraction of valid tokens that `keep_BT` removes: Σ m·(1 - keep) / Σ m."""
  m_BT = mask_BT.astype(jnp.float32)
  return jnp.sum(m_BT * (~keep_BT).astype(jnp.float32)) / jnp.maximum(jnp.sum(m_BT), 1.0)


def get(name: str, **options):
  """The mask `name` with its static options bound: fn(inputs, hyper) -> keep_BT."""
  return REGISTRY.bind(name, **options)


def apply(mask_fns: dict, inputs: MaskInputs, hyper: MaskHyper):
  """AND of the named masks with the completion mask.

  Returns (loss_mask_BT, {"masked_frac/<name>": fraction each removes on its own,
  "masked_frac": fraction removed by all together}).
  """
  loss_mask_BT = inputs.mask_BT
  stats = {}
  for name, fn in mask_fns.items():
    keep_BT = fn(inputs, hyper)
    stats[f"masked_frac/{name}"] = masked_fraction(inputs.mask_BT, keep_BT)
    loss_mask_BT = loss_mask_BT & keep_BT
  stats["masked_frac"] = masked_fraction(inputs.mask_BT, loss_mask_BT)
  return loss_mask_BT, stats
