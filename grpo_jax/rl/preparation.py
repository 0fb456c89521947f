"""The RL objective as function composition: prepare (this module) and the jitted update of
one rollout batch (`learner`).

    rollouts --rollout_logprobs--> PolicyLogProbs (old/ref log-probs, entropy, score norms)
    + scores --finish_prepare----> RolloutBatch (A[N, T], loss mask):
               shaped_rewards -> compute_advantages -> loss_mask -> prepare_metrics
    RolloutBatch --update--------> one lax.scan over the planner's idx[epochs × minibatches]:
               train_step = aggregation weights -> accumulate_gradients -> apply_if_finite

Which advantage estimator, token masks, policy loss, KL estimator, aggregation mode and
planner run is decided by name in `RLConfig` (the config edge), through the registries of
`advantages`, `masks`, `losses`, `aggregation` and `planners`. Everything that may change
during a run (clip ranges, coefficients, thresholds, FADE's λ and γ) is an array in
`PrepareHyper` / `StepHyper`, so changing it does not recompile.

Per-token objective of a mini-batch (w from the aggregation mode, over the mini-batch):

    J = Σ_{i,t} w_{i,t} · [ ℓ^pg_{i,t} + β·kl_{i,t}·1(kl_in = "loss") - c_H·H_{i,t} ]

Gradient accumulation: w is computed over the whole mini-batch first, then Σ w·ℓ is
summed over `micro_batches` strided slices (micro-batch k holds rows k, k + K, k + 2K, ...,
so every slice stays spread over the data-parallel devices) in a `lax.scan`, so the
gradient equals the unsplit one.

The optimizer (`make_optimizer`) is global-norm clipping, then AdamW with an optional
linear warmup; the trainer, the warm start and the memory plan all build it here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.infra import config_lib
from grpo_jax.models import logprobs
from grpo_jax.rl import (
  advantages,
  counterfactuals,
  declared,
  groups,
  importance,
  losses,
  masks,
  reward_transforms,
  spec,
)


@flax.struct.dataclass
class PolicyLogProbs:
  """The per-token forwards of a rollout batch. They need no rewards, so the trainer
  dispatches them before it scores rewards on the host (`rollout_logprobs`)."""

  # log π_old(o_t) at temperature 1; the sampler's when not recomputed, or when the update's
  # forward gives π_old (rl.old_logp_from="update": the update reads this as μ).
  old_logp_NT: jax.Array
  entropy_NT: jax.Array  # H(π_old(·|o_<t)); zeros when not recomputed.
  score_sq_N: Any  # Σ_t ‖e_y − π_t‖² (None when not recomputed).
  score_sq_NT: Any  # ‖e_y − π_t‖² per token, 0 off the mask (None when not recomputed).
  rank_NT: Any  # π_old's rank of each token (0 = argmax); None unless a mask needs it.
  ref_logp_NT: jax.Array  # log π_ref(o_t); zeros without a reference policy.
  kl_NT: jax.Array  # The configured estimator of KL(π_old ‖ π_ref) per token, masked.
  # log π_T(o_t), a teacher's (config.teacher; `teacher_logprobs`), 0 off the mask; None
  # when no estimator reads one (`advantages.Traits.needs_teacher`).
  teacher_logp_NT: Any = None


def action_view(rollouts):
  """The rollouts as everything trained or counted sees them: mask_NT the model's own
  tokens (`Rollouts.action_mask_NT`) and length_N their count. The identity for
  single-turn rollouts (action_mask_NT None).

  Multi-turn episodes (`episodes`) put the environment's observation tokens in the context
  (rollouts.mask_NT: the forwards' position ids and attention need them) but never in a
  loss, an advantage, a token mask, an aggregation denominator (1/|o_i| counts actions), a
  length or a metric: `rollout_logprobs` and `finish_prepare` substitute this view once,
  on entry, and keep the context mask for the forwards only (spec.RolloutBatch.mask_NT).
  """
  if rollouts.action_mask_NT is None:
    return rollouts
  action_NT = rollouts.action_mask_NT & rollouts.mask_NT
  return rollouts.replace(
    mask_NT=action_NT, length_N=jnp.sum(action_NT, axis=-1, dtype=rollouts.length_N.dtype)
  )


def in_slices(fn, rows, *, slices: int):
  """fn(rows) computed over `slices` slices of the rows one after another (`lax.map`), so
  that one slice's activations and logits exist at a time; the same rows, in order, as
  fn(rows). Slice j holds rows j, j + slices, j + 2·slices, ... (strided: every slice keeps
  the rows' split over the data-parallel devices, so no row moves between devices)."""
  if slices == 1:
    return fn(rows)
  N = jax.tree.leaves(rows)[0].shape[0]
  if N % slices:
    raise ValueError(f"rl.logprob_batches={slices} does not divide the {N} rollout rows.")
  split = lambda x: x.reshape(N // slices, slices, *x.shape[1:]).swapaxes(0, 1)  # noqa: E731
  rows_constraint = lambda x: nn.with_logical_constraint(  # noqa: E731
    x, ("activation_batch",) + (None,) * (x.ndim - 1)
  )
  out = jax.lax.map(lambda r: fn(jax.tree.map(rows_constraint, r)), jax.tree.map(split, rows))
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(N, *x.shape[2:]), out)


def rollout_logprobs(params, ref_params, rollouts, *, cfg: spec.RLConfig, model_fn):
  """Old and reference log-probs, entropy and score norms of a rollout batch.

  score_sq_i = Σ_t ‖e_{y_t} − π_t‖² = Σ_t (1 − 2 π_t(y_t) + Σ_v π_t(v)²), the per-sequence
  squared score norm in logit space: the optimal baseline's weight (the form verl's OTB uses).
  The forwards see the whole context (rollouts.mask_NT); every output is 0 off the tokens
  the model produced (`action_view`).
  """
  mask_NT = action_view(rollouts).mask_NT
  rows = (rollouts.prompt_tokens_NP, rollouts.prompt_mask_NP, rollouts.tokens_NT, rollouts.mask_NT)
  routes = logprobs.replayed(rollouts)
  logp = lambda params, routes=None, **kw: in_slices(  # noqa: E731
    lambda r: logprobs.completion_logprobs(
      params, *r[0], model_fn=model_fn, chunk=cfg.logit_chunk, routes=r[1], **kw
    ),
    (rows, routes),
    slices=cfg.logprob_batches,
  )
  if cfg.forwards_old_logp:  # π_old replays the sampler's routes (rl.routing_replay).
    old_logp_NT, old_stats = logp(params, routes, with_stats=True, with_rank=cfg.needs_rank)
    entropy_NT = old_stats["entropy"]
    rank_NT = old_stats.get("rank")
    score_sq_NT = (1.0 - 2.0 * jnp.exp(old_logp_NT) + old_stats["sum_sq"]) * mask_NT
    score_sq_N = jnp.sum(score_sq_NT, axis=1)
  else:  # The sampler's log-probs: π_old's when not recomputed, and the update's mismatch
    # metrics' μ when π_old comes from the update's forward (spec.RLConfig refuses the
    # features that need π_old's distribution before the update in both modes).
    old_logp_NT, entropy_NT = rollouts.policy_logp_NT, jnp.zeros(mask_NT.shape, jnp.float32)
    score_sq_N = score_sq_NT = rank_NT = None
  if cfg.use_ref:
    ref_logp_NT = logp(ref_params)[0]
    kl_NT = jnp.zeros_like(old_logp_NT)  # No π_old yet: the update logs KL(π_old ‖ π_ref).
    if not cfg.old_logp_in_update:
      kl_NT = losses.KL_REGISTRY.make(cfg.kl_estimator)(old_logp_NT, ref_logp_NT) * mask_NT
  else:
    ref_logp_NT = jnp.zeros_like(old_logp_NT)
    kl_NT = jnp.zeros_like(old_logp_NT)
  only = lambda x_NT: None if x_NT is None else jnp.where(mask_NT, x_NT, jnp.zeros_like(x_NT))
  return PolicyLogProbs(
    old_logp_NT=only(old_logp_NT),
    entropy_NT=only(entropy_NT),
    score_sq_N=score_sq_N,
    score_sq_NT=score_sq_NT,
    rank_NT=only(rank_NT),
    ref_logp_NT=only(ref_logp_NT),
    kl_NT=kl_NT,
  )


def teacher_logprobs(teacher_params, rollouts, *, cfg: spec.RLConfig, model_fn):
  """log π_T(o_t) of every completion token under a teacher (config.teacher: its own
  params and `model_fn`, the same tokenizer), 0 off the tokens the student produced
  (`action_view`); sliced like the student's forwards (rl.logprob_batches, rl.logit_chunk).
  A dense model's forward: the teacher never replays the student's expert routes."""
  mask_NT = action_view(rollouts).mask_NT
  rows = (rollouts.prompt_tokens_NP, rollouts.prompt_mask_NP, rollouts.tokens_NT, rollouts.mask_NT)
  logp_NT, _ = in_slices(
    lambda r: logprobs.completion_logprobs(
      teacher_params, *r, model_fn=model_fn, chunk=cfg.logit_chunk
    ),
    rows,
    slices=cfg.logprob_batches,
  )
  return jnp.where(mask_NT, logp_NT, jnp.zeros_like(logp_NT))


def shaped_rewards(rollouts, correct_N, format_N, hyper: spec.PrepareHyper, *, cfg: spec.RLConfig):
  """r_i = c_i + w_fmt·f_i + overlong penalty, truncation policy applied
  (`reward_transforms.shape_rewards`)."""
  return reward_transforms.shape_rewards(
    correct_N,
    format_N,
    rollouts.length_N,
    rollouts.truncated_N,
    hyper.reward,
    truncation=cfg.truncation,
  )


def trained_rows(scorable_N, keep_N, group_ids_N, *, policy: str):
  """valid_N: the rows that take part in advantages (their statistics) and in the loss.

  keep_N False (dynamic-sampling fill groups) is never trained. Rows whose reward failed
  (scorable_N False), by `policy`:
    "mask"        excluded; so is a group left with fewer than two scorable rows (it has
                  no baseline: it would contribute nothing but noise). A group of one row
                  (G = 1 training) is kept when its row is scorable.
    "drop_group"  every group holding an unscorable row is excluded.
    "zero"        trained with reward 0 (a failure then counts as a wrong answer).
  """
  if policy == "zero":
    return keep_N
  n_B = groups.group_size(group_ids_N)
  s_B = groups.group_size(group_ids_N, valid_B=scorable_N)
  if policy == "drop_group":
    return keep_N & (s_B == n_B)
  return keep_N & scorable_N & ((n_B == 1) | (s_B >= 2))


def _advantage_inputs(
  lp: PolicyLogProbs,
  rollouts,
  rewards_N,
  valid_N,
  hyper,
  success_N,
  *,
  cfg,
  context_N=None,
  weights_N=None,
  start_N=None,
):
  if cfg.kl_in == "reward" and not advantages.REGISTRY.traits(cfg.advantage).folds_kl:
    rewards_N = rewards_N - hyper.kl_coef * jnp.sum(lp.kl_NT, axis=1)
  return advantages.AdvantageInputs(
    rewards_B=rewards_N,
    group_ids_B=rollouts.group_ids_N,
    mask_BT=rollouts.mask_NT,
    kl_BT=lp.kl_NT,
    score_sq_B=lp.score_sq_N,
    score_sq_BT=lp.score_sq_NT,
    tokens_BT=rollouts.tokens_NT,
    valid_B=valid_N,
    success_B=success_N,
    context_B=context_N,
    weights_B=weights_N,
    start_B=start_N,
    old_logp_BT=lp.old_logp_NT,
    teacher_logp_BT=lp.teacher_logp_NT,
    kl_coef=hyper.kl_coef,
  )


def compute_advantages(
  lp: PolicyLogProbs,
  rollouts,
  rewards_N,
  valid_N,
  hyper: spec.PrepareHyper,
  success_N=None,
  *,
  cfg: spec.RLConfig,
  **context,
):
  """A[N, T] from the configured estimator, over the rows valid_N (`trained_rows`; the
  others take part in no statistic and get A = 0). With the KL folded into the reward
  (kl_in = "reward"), sequence estimators see r_i − β Σ_t kl_t; REINFORCE++ folds kl_t
  per token itself. success_N (bool): the verifier's verdict, for estimators that split
  successes from failures (fade); None: shaped reward > 0. context (context_N, weights_N,
  start_N): counterfactual rows that inform ibpo's trie only, the rows' weights in it and
  the depth from which each row counts there (a branch's cut)."""
  adv_fn = advantages.REGISTRY.make(cfg.advantage, **config_lib.to_dict(cfg.advantage_options))
  inputs = _advantage_inputs(lp, rollouts, rewards_N, valid_N, hyper, success_N, cfg=cfg, **context)
  return adv_fn(inputs, declared.Values(hyper.adv))


def estimator_metrics(
  lp: PolicyLogProbs,
  rollouts,
  rewards_N,
  valid_N,
  hyper: spec.PrepareHyper,
  success_N,
  *,
  cfg,
  **context,
):
  """The configured estimator's own metrics (its `advantages.Traits.metrics`: "ibpo/..."
  for ibpo), none for the others."""
  metrics = advantages.REGISTRY.traits(cfg.advantage).metrics
  if metrics is None:
    return {}
  inputs = _advantage_inputs(lp, rollouts, rewards_N, valid_N, hyper, success_N, cfg=cfg, **context)
  return metrics(inputs, declared.Values(hyper.adv), **config_lib.to_dict(cfg.advantage_options))


def loss_mask(lp: PolicyLogProbs, rollouts, adv_NT, valid_N, hyper: spec.PrepareHyper, *, cfg):
  """(valid completion tokens of trained rows AND every configured token mask, per-mask
  statistics)."""
  inputs = masks.MaskInputs(
    adv_BT=adv_NT,
    mask_BT=rollouts.mask_NT,
    old_logp_BT=lp.old_logp_NT,
    entropy_BT=lp.entropy_NT,
    tokens_BT=rollouts.tokens_NT,
    group_ids_B=rollouts.group_ids_N,
    truncated_B=rollouts.truncated_N,
    rank_BT=lp.rank_NT,
  )
  mask_NT, stats = masks.apply(cfg.mask_fns(), inputs, declared.Values(hyper.mask))
  return mask_NT & valid_N[:, None], stats


def prepare_metrics(lp: PolicyLogProbs, rollouts, adv_NT, rewards_N, correct_N, *, cfg):
  """The rollout batch's metrics (`metrics.DEFINITIONS`, "prepare" section)."""
  m_NT = rollouts.mask_NT.astype(jnp.float32)
  n_tok = jnp.maximum(jnp.sum(m_NT), 1.0)
  correct_N = jnp.asarray(correct_N, jnp.float32)
  out = {
    **advantages.advantage_stats(
      adv_NT, rollouts.mask_NT, rewards_N, correct_N, rollouts.group_ids_N
    ),
    "response_length": jnp.mean(rollouts.length_N.astype(jnp.float32)),
    "truncated_frac": jnp.mean(rollouts.truncated_N.astype(jnp.float32)),
  }
  if cfg.forwards_old_logp:  # Else the update logs it (`learner.old_logp_metrics`).
    out["rollout_entropy"] = jnp.sum(lp.entropy_NT * m_NT) / n_tok
  if cfg.use_ref and not cfg.old_logp_in_update:
    out[f"rollout_kl_ref/{cfg.kl_estimator}"] = jnp.sum(lp.kl_NT) / n_tok
  return out


def finish_prepare(
  lp: PolicyLogProbs,
  rollouts,
  correct_N,
  format_N,
  hyper: spec.PrepareHyper,
  scorable_N=None,
  keep_N=None,
  prov=None,
  *,
  cfg: spec.RLConfig,
  cf_cfg=None,
  splitter=None,
  group_size: int = 0,
):
  """Shaped rewards, the trained rows, advantages, the loss mask and the batch's metrics,
  given its log-probs. scorable_N: False where the reward failed (default: all scored);
  keep_N: False on rows kept only for shape (default: all kept); prov
  (`counterfactuals.Provenance`, with cf_cfg and the samples' group_size G): IBPO's
  counterfactual rows in the group-major batch (`_counterfactual_rows`).

  Returns (spec.RolloutBatch, shaped rewards_N, metrics). Episodes' observation tokens stay in
  the batch's context (spec.RolloutBatch.mask_NT) and out of everything else (`action_view`).
  """
  context_NT, rollouts = rollouts.mask_NT, action_view(rollouts)
  ones_N = jnp.ones(rollouts.group_ids_N.shape, bool)
  scorable_N = ones_N if scorable_N is None else jnp.asarray(scorable_N, bool)
  keep_N = ones_N if keep_N is None else jnp.asarray(keep_N, bool)
  cf_stats, context_N, weights_N, own_NT = {}, None, None, None
  if prov is not None:
    keep_N, context_N, weights_N, own_NT, cf_stats = _counterfactual_rows(
      lp,
      rollouts,
      keep_N & prov.active_N,
      prov,
      hyper,
      cf_cfg,
      splitter,
      group_size=group_size,
    )
  valid_N = trained_rows(scorable_N, keep_N, rollouts.group_ids_N, policy=cfg.unscorable)
  if context_N is not None:
    context_N = context_N & scorable_N & ~valid_N
  rewards_N = shaped_rewards(rollouts, correct_N, format_N, hyper, cfg=cfg)
  success_N = jnp.asarray(correct_N) > 0
  ctx = dict(context_N=context_N, weights_N=weights_N)
  if own_NT is not None:  # A branch counts in ibpo's trie from its cut (its first own token).
    ctx["start_N"] = jnp.argmax(own_NT, axis=1).astype(jnp.int32)
  adv_NT = compute_advantages(lp, rollouts, rewards_N, valid_N, hyper, success_N, cfg=cfg, **ctx)
  if weights_N is not None:  # A trained perturbed row's loss carries its weight.
    adv_NT = adv_NT * weights_N[:, None]
  loss_mask_NT, mask_stats = loss_mask(lp, rollouts, adv_NT, valid_N, hyper, cfg=cfg)
  if own_NT is not None:  # A branch's prefix is its parent's: never trained twice.
    loss_mask_NT = loss_mask_NT & own_NT
  adv_NT, loss_mask_NT, is_stats = behaviour_correction(
    lp, rollouts, adv_NT, loss_mask_NT, hyper, cfg=cfg
  )
  batch = spec.RolloutBatch(
    prompt_tokens_NP=rollouts.prompt_tokens_NP,
    prompt_mask_NP=rollouts.prompt_mask_NP,
    tokens_NT=rollouts.tokens_NT,
    mask_NT=context_NT,
    loss_mask_NT=loss_mask_NT,
    adv_NT=adv_NT,
    old_logp_NT=lp.old_logp_NT,
    ref_logp_NT=lp.ref_logp_NT,
    group_ids_N=rollouts.group_ids_N,
    action_mask_NT=rollouts.action_mask_NT,
    prompt_routes_NPLK=rollouts.prompt_routes_NPLK,
    routes_NTLK=rollouts.routes_NTLK,
  )
  metrics = prepare_metrics(lp, rollouts, adv_NT, rewards_N, correct_N, cfg=cfg)
  metrics |= estimator_metrics(lp, rollouts, rewards_N, valid_N, hyper, success_N, cfg=cfg, **ctx)
  metrics["unscorable_frac"] = 1.0 - jnp.mean(scorable_N.astype(jnp.float32))
  metrics["excluded_frac"] = 1.0 - jnp.mean((valid_N | ~keep_N).astype(jnp.float32))
  return batch, rewards_N, {**metrics, **mask_stats, **cf_stats, **is_stats}


def behaviour_correction(lp: PolicyLogProbs, rollouts, adv_NT, loss_mask_NT, hyper, *, cfg):
  """The configured behaviour-policy correction (`importance`, rl.is_correction) folded
  into the batch: A_t ← w_t·A_t (each policy loss is positively homogeneous in A, so this
  weights each token's policy loss by w_t) and the tokens it drops leave the loss mask.
  Also the sampler–trainer mismatch metrics ("offpolicy/...") over the trained tokens,
  whenever π_old is recomputed by a forward of its own (otherwise π_old is the sampler's:
  no mismatch to see; or the update's forward, which logs them: `learner.old_logp_metrics`)."""
  if not cfg.forwards_old_logp:
    return adv_NT, loss_mask_NT, {}
  old_NT, behav_NT = lp.old_logp_NT, rollouts.policy_logp_NT
  w_NT, keep_NT = importance.REGISTRY.make(cfg.is_correction)(
    old_NT, behav_NT, loss_mask_NT, declared.Values(hyper.importance)
  )
  stats = importance.mismatch_metrics(old_NT, behav_NT, loss_mask_NT, w_NT, keep_NT)
  return adv_NT * w_NT, keep_NT, stats  # w = 1 off the kept tokens.


def _counterfactual_rows(
  lp, rollouts, keep_N, prov, hyper: spec.PrepareHyper, cf_cfg, splitter, *, group_size: int
):
  """IBPO's counterfactual rows (`counterfactuals`): the full-rewrite filter (τ =
  hyper.adv["ibpo_tau"]) and the importance weights (c = hyper.adv["ibpo_is_cap"]). Returns
  (keep_N: the rows trained, context_N: kept counterfactuals that only inform φ,
  weights_N, own_NT, "ibpo/..." metrics)."""
  C = cf_cfg.per_group
  kept_N, d_N = counterfactuals.rewrite_filter(
    rollouts.tokens_NT,
    rollouts.mask_NT,
    prov,
    hyper.adv["ibpo_tau"],
    distance=cf_cfg.distance,
    splitter=splitter,
    rows=counterfactuals.counterfactual_rows(
      rollouts.tokens_NT.shape[0], group_size=group_size, per_group=C
    )
    if group_size
    else None,
  )
  w_N = counterfactuals.importance_weights(
    lp.old_logp_NT,
    rollouts.policy_logp_NT,
    prov,
    hyper.adv["ibpo_is_cap"],
    weighting=cf_cfg.weighting,
  )
  useful_N = keep_N & kept_N & (w_N > 0)
  cf_N = prov.kind_N != counterfactuals.SAMPLED
  trained_N = useful_N & (~cf_N | cf_cfg.train)
  stats = counterfactuals.stats(prov, kept_N, d_N, w_N)
  return trained_N, useful_N & cf_N, w_N, prov.own_NT, stats


def prepare(
  params,
  ref_params,
  rollouts,
  correct_N,
  format_N,
  hyper: spec.PrepareHyper,
  scorable_N=None,
  keep_N=None,
  *,
  cfg: spec.RLConfig,
  model_fn: Callable,
  teacher=None,
):
  """Rewards, old/ref log-probs, advantages and the loss mask of one rollout batch:
  `finish_prepare(rollout_logprobs(...), ...)` in one function (scorable_N and keep_N as
  there: rows whose reward failed follow `cfg.unscorable`); `teacher`: (params, model_fn)
  of a distillation teacher (`teacher_logprobs`), for an estimator that reads one.

  Returns (spec.RolloutBatch, shaped rewards_N, metrics). Pure and jittable (`make_prepare`).
  """
  lp = rollout_logprobs(params, ref_params, rollouts, cfg=cfg, model_fn=model_fn)
  if teacher is not None:
    t_params, t_fn = teacher
    lp = lp.replace(teacher_logp_NT=teacher_logprobs(t_params, rollouts, cfg=cfg, model_fn=t_fn))
  return finish_prepare(lp, rollouts, correct_N, format_N, hyper, scorable_N, keep_N, cfg=cfg)


def make_prepare(cfg: spec.RLConfig, model_fn: Callable):
  """jit(prepare) with the config and model bound: fn(params, ref_params, rollouts,
  correct_N, format_N, hyper) -> (spec.RolloutBatch, rewards_N, metrics)."""
  return jax.jit(functools.partial(prepare, cfg=cfg, model_fn=model_fn))
