"""Token masks: which completion tokens enter the loss.

Each mask has the signature `fn(inputs: MaskInputs, hyper: declared.Values, **static_options) ->
keep_BT` (bool; True = the token stays in the loss) and is registered by its config name
in `REGISTRY`. A mask made of parts (negative_token_filter's criteria) also registers in
`PARTS` a function with the same signature returning {part: drop_BT}, so each part's
effect is reported. Masks compose by AND (`apply`), and every mask
(and part) reports the fraction of valid tokens it removed. Removed tokens leave the aggregation normalisers too, since
aggregation weights are computed from the final loss mask.

Polarity is the sign of the row's sequence advantage ā_i = Σ_t m A / Σ_t m.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp

from grpo_jax.infra import registry
from grpo_jax.rl import advantages, declared

Hyper = declared.Hyper


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
  """reads_old_logp: it may read π_old (MaskInputs.old_logp_BT, entropy_BT or rank_BT)
  while the batch is prepared, so π_old cannot come from the update's forward
  (rl.old_logp_from, `spec.RLConfig.old_logp_blockers`)."""

  reads_old_logp: bool = False
  # {name: Hyper}: the array hyperparameters it reads (`hyper.<name>`; config.rl.mask_hyper).
  hyper: dict = dataclasses.field(default_factory=dict)


REGISTRY = registry.Registry("token mask", traits=Traits)


@flax.struct.dataclass
class MaskInputs:
  """adv_BT f32, mask_BT bool (valid completion tokens), old_logp_BT f32 (log π_old of the
  sampled token), entropy_BT f32 (entropy of π_old at that step), tokens_BT int32,
  group_ids_B int32, truncated_B bool (no EOS within the length limit), rank_BT int32 (how
  many ids π_old ranks strictly above the sampled token: 0 = the argmax; None when not
  computed)."""

  adv_BT: jax.Array
  mask_BT: jax.Array
  old_logp_BT: jax.Array
  entropy_BT: jax.Array
  tokens_BT: jax.Array
  group_ids_B: jax.Array
  truncated_B: jax.Array
  rank_BT: jax.Array | None = None


# The hyperparameters negative_token_filter declares (config.rl.mask_hyper.<name>; read
# as `hyper.<name>`, float32 arrays: `declared`).
PROB_THRESHOLD = Hyper(0.9, low=0.0, high=1.0, doc="τ_p: 'prob' drops tokens with π_old > τ_p")
ENTROPY_THRESHOLD = Hyper(0.1, low=0.0, doc="τ_H: 'entropy' drops tokens with entropy < τ_H")
TOP_K = Hyper(
  1,
  low=1,
  valid=lambda k: float(k).is_integer(),
  rule="an integer >= 1",
  doc="k: 'rank' drops the sampled token when it is among π_old's top k",
)


def declared_hyper() -> dict[str, Hyper]:
  """Every registered mask's declared hyperparameters, by name (config.rl.mask_hyper)."""
  return declared.collect(REGISTRY)


def declared_values(given) -> dict[str, float]:
  """config.rl.mask_hyper's values (checked), else the declared defaults."""
  return declared.values(REGISTRY, given, section="config.rl.mask_hyper")


def hyper_values(**given) -> declared.Values:
  """The arrays a mask reads, from keyword values with the declared defaults elsewhere."""
  return declared.Values(declared.arrays(declared_values(given)))


def _polarity(inputs: MaskInputs):
  return advantages.sequence_advantage(inputs.adv_BT, inputs.mask_BT)


@REGISTRY.register("positive_only")
def positive_only(inputs: MaskInputs, hyper: declared.Values):
  """keep_{i,t} = 1(ā_i >= 0): tokens of negative-advantage rollouts are removed.

  Source: the positive-only arm of arXiv 2605.08666 (masking, rather than zeroing A, also
  removes the tokens from token-count normalisers).
  """
  del hyper
  return jnp.broadcast_to((_polarity(inputs) >= 0)[:, None], inputs.mask_BT.shape)


@REGISTRY.register("negative_only")
def negative_only(inputs: MaskInputs, hyper: declared.Values):
  """keep_{i,t} = 1(ā_i <= 0): tokens of positive-advantage rollouts are removed.

  Source: the negative-sample arm of arXiv 2605.08666; cf. NSR, "The Surprising
  Effectiveness of Negative Reinforcement" (arXiv 2506.01347).
  """
  del hyper
  return jnp.broadcast_to((_polarity(inputs) <= 0)[:, None], inputs.mask_BT.shape)


def _in_positive_rollouts(inputs: MaskInputs, vocab_bound, *, per_group: bool = True):
  """Per token: does its id occur at a valid position of a positive rollout of its group
  (per_group) or of the batch?

  Keys k = g·V + v (uint32; g = 0 for the batch) of all valid positive-rollout tokens are
  sorted once; each token's key is then looked up by binary search: O(BT log BT), static
  shapes, no [B, V].
  """
  B, T = inputs.tokens_BT.shape
  g_B = inputs.group_ids_B if per_group else jnp.zeros_like(inputs.group_ids_B)
  key_BT = g_B.astype(jnp.uint32)[:, None] * jnp.uint32(vocab_bound) + (
    inputs.tokens_BT.astype(jnp.uint32)
  )
  positive_BT = inputs.mask_BT & (_polarity(inputs) > 0)[:, None]
  sentinel = jnp.uint32(0xFFFFFFFF)
  table_K = jnp.sort(jnp.where(positive_BT, key_BT, sentinel).reshape(-1))
  at_BT = jnp.clip(jnp.searchsorted(table_K, key_BT), 0, B * T - 1)
  return table_K[at_BT] == key_BT


CRITERIA = ("prob", "entropy", "rank", "shared", "batch_shared")


def filter_criteria(
  inputs: MaskInputs, hyper: declared.Values, *, criteria: tuple[str, ...], vocab_size: int = 0
) -> dict:
  """{criterion: drop_BT}, where each criterion holds (before restricting to negatives):
  "prob":         π_old(o_t) > τ_p        (confident tokens: penalising them squeezes),
  "entropy":      H(π_old(·|o_<t)) < τ_H  (low-entropy positions),
  "rank":         rank_t < k: o_t is among π_old's top k at t (k = 1: the argmax),
  "shared":       o_t occurs in a positive rollout of the same group,
  "batch_shared": o_t occurs in a positive rollout anywhere in the batch (the criterion
                  of single-rollout training, G = 1, where a group holds no other row).
  """
  unknown = sorted(set(criteria) - set(CRITERIA))
  if unknown or not criteria:
    raise ValueError(
      f"negative_token_filter criteria must be a non-empty subset of {CRITERIA}, got "
      f"{tuple(criteria)}."
    )
  out = {}
  if "prob" in criteria:
    out["prob"] = jnp.exp(inputs.old_logp_BT) > hyper.prob_threshold
  if "entropy" in criteria:
    out["entropy"] = inputs.entropy_BT < hyper.entropy_threshold
  if "rank" in criteria:
    if inputs.rank_BT is None:
      raise ValueError("negative_token_filter 'rank' needs MaskInputs.rank_BT (π_old's ranks).")
    out["rank"] = inputs.rank_BT < hyper.top_k
  for name, per_group in (("shared", True), ("batch_shared", False)):
    if name not in criteria:
      continue
    if vocab_size <= 0:
      raise ValueError(f"negative_token_filter with {name!r} needs vocab_size > 0.")
    B = inputs.tokens_BT.shape[0]
    if B * vocab_size >= 2**32:
      raise ValueError(
        f"negative_token_filter {name!r} needs batch*vocab_size < 2^32, got {B}*{vocab_size}."
      )
    out[name] = _in_positive_rollouts(inputs, vocab_size, per_group=per_group)
  return out


@REGISTRY.register(
  "negative_token_filter",
  reads_old_logp=True,
  hyper={"prob_threshold": PROB_THRESHOLD, "entropy_threshold": ENTROPY_THRESHOLD, "top_k": TOP_K},
)
def negative_token_filter(
  inputs: MaskInputs,
  hyper: declared.Values,
  *,
  criteria: tuple[str, ...] = ("prob",),
  vocab_size: int = 0,
):
  """keep_{i,t} = 1 − 1(ā_i < 0)·1(any selected criterion holds at t), with the criteria of
  `filter_criteria` ("prob", "entropy", "rank", "shared", "batch_shared"). Tokens of
  non-negative rollouts are kept. "shared" and "batch_shared" need `vocab_size` (a bound on
  ids, with B·vocab_size < 2^32); "rank" needs π_old's ranks (rl computes them when the
  criterion is selected). The trainer logs what each criterion alone removes
  (masked_frac/negative_token_filter/<criterion>, `negative_token_filter_parts`).

  Source: negative token filtering, "Rethinking Groups in Critic-Free RLVR" (arXiv
  2606.17250); the criteria are a reconstruction [INF], RESEARCH.md §5b.
  """
  parts = negative_token_filter_parts(inputs, hyper, criteria=criteria, vocab_size=vocab_size)
  return ~functools.reduce(jnp.logical_or, parts.values())


def negative_token_filter_parts(
  inputs: MaskInputs, hyper: declared.Values, *, criteria=("prob",), vocab_size: int = 0
) -> dict:
  """{criterion: the tokens of negative rollouts it alone removes}."""
  parts = filter_criteria(inputs, hyper, criteria=tuple(criteria), vocab_size=vocab_size)
  negative_B1 = (_polarity(inputs) < 0)[:, None]
  return {name: negative_B1 & drop_BT for name, drop_BT in parts.items()}


# Masks made of parts: {name: fn(inputs, hyper, **the mask's options) -> {part: drop_BT}}.
PARTS = {"negative_token_filter": negative_token_filter_parts}


@REGISTRY.register("overlong_filter")
def overlong_filter(inputs: MaskInputs, hyper: declared.Values):
  """keep_{i,t} = 1(row i ended with EOS): truncated rollouts leave the loss entirely.

  Source: DAPO overlong filtering (arXiv 2503.14476).
  """
  del hyper
  return jnp.broadcast_to(~inputs.truncated_B[:, None], inputs.mask_BT.shape)


def masked_fraction(mask_BT, keep_BT):
  """Fraction of valid tokens that `keep_BT` removes: Σ m·(1 - keep) / Σ m."""
  m_BT = mask_BT.astype(jnp.float32)
  return jnp.sum(m_BT * (~keep_BT).astype(jnp.float32)) / jnp.maximum(jnp.sum(m_BT), 1.0)


def apply(mask_fns: dict, inputs: MaskInputs, hyper: declared.Values):
  """AND of the named masks with the completion mask.

  Returns (loss_mask_BT, {"masked_frac/<name>": fraction each removes on its own,
  "masked_frac/<name>/<part>": the same for each part of a mask that reports parts,
  "masked_frac": fraction removed by all together}).
  """
  loss_mask_BT = inputs.mask_BT
  stats = {}
  for name, fn in mask_fns.items():
    if name in PARTS:  # keep = no part drops the token: the parts, computed once.
      parts = PARTS[name](inputs, hyper, **getattr(fn, "keywords", {}))
      keep_BT = ~functools.reduce(jnp.logical_or, parts.values())
      for part, drop_BT in parts.items():
        stats[f"masked_frac/{name}/{part}"] = masked_fraction(inputs.mask_BT, ~drop_BT)
    else:
      keep_BT = fn(inputs, hyper)
    stats[f"masked_frac/{name}"] = masked_fraction(inputs.mask_BT, keep_BT)
    loss_mask_BT = loss_mask_BT & keep_BT
  stats["masked_frac"] = masked_fraction(inputs.mask_BT, loss_mask_BT)
  return loss_mask_BT, stats
