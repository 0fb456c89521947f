"""The RL objective as function composition, and the jitted update of one rollout batch.

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

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import (
  advantages,
  aggregation,
  config_lib,
  controllers,
  counterfactuals,
  groups,
  importance,
  logprobs,
  losses,
  masks,
  model,
  planners,
  reward_transforms,
)

KL_PLACEMENTS = ("loss", "reward")
# What happens to rows whose reward could not be computed (`rewards.Scores.error_N`: the
# verifier raised, timed out or returned a non-finite value); see `trained_rows`.
UNSCORABLE_POLICIES = ("mask", "zero", "drop_group")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLConfig:
  """The RL algorithm, by name. Validated once, at the config edge (`from_dict`)."""

  # Advantages (advantages.REGISTRY) and their array hyperparameters.
  advantage: str = "grpo"
  advantage_options: dict = dataclasses.field(default_factory=dict)
  adv_eps: float = 1e-6
  gamma: float = 1.0
  lambda_s: float = 1.0
  lambda_f: float = 1.0
  std_power: float = 0.5
  focal_gamma: float = 0.0
  ibpo_lambda: float = 1.0  # λ of the ibpo estimator's prefix baseline (an array: no recompile).
  ibpo_tau: float = 1.0  # τ of the counterfactuals' full-rewrite filter (an array).
  ibpo_is_cap: float = 2.0  # c of perturbed counterfactuals' weights min(ratio, c) (an array).
  # Hyperparameters an estimator declares at registration (`advantages.Hyper`), by name.
  advantage_hyper: dict = dataclasses.field(default_factory=dict)
  # Controller (controllers.REGISTRY) that updates λ_S, λ_F, γ between steps.
  controller: str = "none"
  controller_options: dict = dataclasses.field(default_factory=dict)
  # Token masks (masks.REGISTRY), AND-ed; options per mask name.
  token_masks: tuple[str, ...] = ()
  mask_options: dict = dataclasses.field(default_factory=dict)
  prob_threshold: float = 0.9
  entropy_threshold: float = 0.1
  top_k: int = 1  # negative_token_filter 'rank': drop negatives' tokens in π_old's top k.
  # Reward transforms.
  truncation: str = "none"  # "none" | "zero" (reward 0) | "mask" (overlong_filter)
  unscorable: str = "mask"  # UNSCORABLE_POLICIES: rows whose reward failed (`trained_rows`).
  format_weight: float = 0.0
  overlong_buffer: int = 0
  overlong_factor: float = 0.0
  # Policy loss (losses.REGISTRY).
  policy_loss: str = "ppo_clip"
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip_c: float = 0.0
  # KL to the reference policy (losses.KL_REGISTRY); off when kl_coef == 0.
  kl_estimator: str = "k3"
  kl_coef: float = 0.0
  kl_in: str = "loss"
  entropy_coef: float = 0.0
  # Aggregation (aggregation.REGISTRY); max_len is L_max of constant_norm (0 = padded T).
  aggregation: str = "token_mean"
  max_len: int = 0
  # Mini-batching (planners.REGISTRY).
  planner: str = "query_preserved"
  planner_options: dict = dataclasses.field(default_factory=dict)
  num_minibatches: int = 1
  ppo_epochs: int = 1
  micro_batches: int = 1
  # Micro-batches cut to the smallest of k length buckets that holds their rows (sorted
  # by length first; `length_buckets`): no compute on completion padding. 1: off.
  length_buckets: int = 1
  # Completion positions whose logits exist at once in the log-prob forwards and the
  # update (`logprobs.chunked_stats`; 0: all T). Saves the [rows, T, V] logits and their
  # gradient for [rows, chunk, V], for a second LM-head matmul in the backward.
  logit_chunk: int = 0
  recompute_old_logp: bool = True
  # The behaviour-policy correction (`importance`): π_old / μ per token, μ the sampler.
  is_correction: str = "none"
  is_lower: float = 0.5  # L (an array: no recompile): MIS keeps ratios >= L.
  is_upper: float = 2.0  # U (an array): TIS truncates at U; MIS keeps ratios <= U.
  # Batch filtering (used by the trainer's loop): DAPO dynamic sampling.
  dynamic_sampling: bool = False
  max_gen_batches: int = 1

  def __post_init__(self):
    for attr, registry_ in (
      ("advantage", advantages.REGISTRY),
      ("policy_loss", losses.REGISTRY),
      ("kl_estimator", losses.KL_REGISTRY),
      ("aggregation", aggregation.REGISTRY),
      ("planner", planners.REGISTRY),
      ("is_correction", importance.REGISTRY),
    ):
      if getattr(self, attr) not in registry_:
        raise ValueError(
          f"rl.{attr}={getattr(self, attr)!r} is not a registered {registry_.kind}; "
          f"valid names: {', '.join(registry_.names())}."
        )
    advantages.declared_values(self.advantage, config_lib.to_dict(self.advantage_hyper))
    for name in self.token_masks:
      masks.REGISTRY.get(name)
    for name in self.mask_options:
      if name not in self.token_masks:
        raise ValueError(f"rl.mask_options names {name!r}, which is not in rl.token_masks.")
    if self.truncation not in reward_transforms.TRUNCATION_POLICIES:
      raise ValueError(
        f"rl.truncation={self.truncation!r}; allowed: {reward_transforms.TRUNCATION_POLICIES}."
      )
    if self.kl_in not in KL_PLACEMENTS:
      raise ValueError(f"rl.kl_in={self.kl_in!r}; allowed: {KL_PLACEMENTS}.")
    if self.unscorable not in UNSCORABLE_POLICIES:
      raise ValueError(f"rl.unscorable={self.unscorable!r}; allowed: {UNSCORABLE_POLICIES}.")
    for f in dataclasses.fields(self):
      v = getattr(self, f.name)
      if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"rl.{f.name}={v}: must be a finite number.")
    for attr in (
      "num_minibatches",
      "ppo_epochs",
      "micro_batches",
      "max_gen_batches",
      "length_buckets",
    ):
      if getattr(self, attr) < 1:
        raise ValueError(f"rl.{attr} must be >= 1, got {getattr(self, attr)}.")
    for attr in ("kl_coef", "entropy_coef", "max_len", "overlong_buffer", "logit_chunk"):
      if getattr(self, attr) < 0:
        raise ValueError(f"rl.{attr} must be >= 0, got {getattr(self, attr)}.")
    # Build every variant once, so bad options fail here, before anything compiles.
    advantages.REGISTRY.make(self.advantage, **self.advantage_options)
    if not self.recompute_old_logp:
      criteria = config_lib.to_dict(self.mask_options.get("negative_token_filter", {}))
      needs = [
        what
        for what, used in (
          (
            f"advantage={self.advantage!r}",
            advantages.REGISTRY.traits(self.advantage).needs_old_logp,
          ),
          (
            "the 'entropy' negative_token_filter criterion",
            "entropy" in criteria.get("criteria", ()),
          ),
          (
            "the 'rank' negative_token_filter criterion",
            "rank" in criteria.get("criteria", ()),
          ),
          (
            f"controller={self.controller!r}",
            controllers.REGISTRY.traits(self.controller).reads_old_logp,
          ),
        )
        if used
      ]
      if needs:
        raise ValueError(
          f"rl.recompute_old_logp=False gives no π_old distribution, which {', '.join(needs)} "
          "needs; set recompute_old_logp=True."
        )
    importance.check_bounds(lower=self.is_lower, upper=self.is_upper)
    if importance.REGISTRY.traits(self.is_correction).corrects and not self.recompute_old_logp:
      raise ValueError(
        f"rl.is_correction={self.is_correction!r} corrects π_old against the sampler's "
        "log-probs, but rl.recompute_old_logp=False makes π_old the sampler's own log-probs "
        "(nothing to correct); set recompute_old_logp=True or is_correction='none'."
      )
    controllers.REGISTRY.make(self.controller, **config_lib.to_dict(self.controller_options))
    self.mask_fns()
    self.prepare_hyper(max_new_tokens=max(self.overlong_buffer, 1))
    self.step_hyper()

  @classmethod
  def from_dict(cls, d, *, where: str = "rl") -> RLConfig:
    d = config_lib.to_dict(d)
    return config_lib.from_dict(cls, d, where=where)

  @property
  def needs_rank(self) -> bool:
    """Whether a token mask reads π_old's ranks (negative_token_filter's 'rank')."""
    options = config_lib.to_dict(self.mask_options.get("negative_token_filter", {}))
    return "negative_token_filter" in self.token_masks and "rank" in options.get("criteria", ())

  @property
  def use_ref(self) -> bool:
    return self.kl_coef > 0

  def mask_fns(self) -> dict[str, Callable]:
    names = list(self.token_masks)
    if self.truncation == "mask" and "overlong_filter" not in names:
      names.append("overlong_filter")
    return {
      n: masks.REGISTRY.make(n, **config_lib.to_dict(self.mask_options.get(n, {}))) for n in names
    }

  def prepare_hyper(self, *, max_new_tokens: int) -> PrepareHyper:
    return PrepareHyper(
      adv=advantages.advantage_hyper(
        eps=self.adv_eps,
        gamma=self.gamma,
        kl_coef=self.kl_coef if self.kl_in == "reward" else 0.0,
        lambda_s=self.lambda_s,
        lambda_f=self.lambda_f,
        std_power=self.std_power,
        focal_gamma=self.focal_gamma,
        ibpo_lambda=self.ibpo_lambda,
        ibpo_tau=self.ibpo_tau,
        ibpo_is_cap=self.ibpo_is_cap,
        extra=advantages.declared_values(self.advantage, config_lib.to_dict(self.advantage_hyper)),
      ),
      mask=masks.mask_hyper(
        prob_threshold=self.prob_threshold,
        entropy_threshold=self.entropy_threshold,
        top_k=self.top_k,
      ),
      reward=reward_transforms.reward_hyper(
        format_weight=self.format_weight,
        overlong_max_len=max_new_tokens if self.overlong_factor > 0 else 0,
        overlong_buffer=self.overlong_buffer,
        overlong_factor=self.overlong_factor,
      ),
      importance=importance.is_hyper(lower=self.is_lower, upper=self.is_upper),
    )

  def step_hyper(self) -> StepHyper:
    return StepHyper(
      loss=losses.loss_hyper(
        eps_low=self.eps_low, eps_high=self.eps_high, dual_clip_c=self.dual_clip_c
      ),
      kl_coef=jnp.asarray(self.kl_coef if self.kl_in == "loss" else 0.0, jnp.float32),
      entropy_coef=jnp.asarray(self.entropy_coef, jnp.float32),
    )


@flax.struct.dataclass
class PrepareHyper:
  adv: advantages.AdvantageHyper
  mask: masks.MaskHyper
  reward: reward_transforms.RewardHyper
  importance: importance.ISHyper


@flax.struct.dataclass
class StepHyper:
  loss: losses.LossHyper
  kl_coef: jax.Array
  entropy_coef: jax.Array


@flax.struct.dataclass
class RolloutBatch:
  """Everything a train step needs, per rollout row (N rows, T completion tokens)."""

  prompt_tokens_NP: jax.Array
  prompt_mask_NP: jax.Array
  tokens_NT: jax.Array
  mask_NT: jax.Array  # Valid completion tokens.
  loss_mask_NT: jax.Array  # mask_NT AND every token mask.
  adv_NT: jax.Array
  old_logp_NT: jax.Array
  ref_logp_NT: jax.Array
  group_ids_N: jax.Array
  # Episodes (`episodes`): the model's own tokens among mask_NT, which then also holds
  # observations (in the forward's context, never trained); None: all of mask_NT.
  action_mask_NT: jax.Array | None = None


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


def init_state(params, optimizer: optax.GradientTransformation, *, part="adapters") -> TrainState:
  """The optimizer state covers the trainable part only (`model.split_trainable`: with
  adapters, the adapters, or the base for part="base")."""
  trainable, _ = model.split_trainable(params, part=part)
  return TrainState(
    step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(trainable)
  )


def make_optimizer(
  *, lr: float, warmup_steps: int = 0, weight_decay: float = 0.0, grad_clip: float = 1.0
) -> optax.GradientTransformation:
  """Global-norm clipping (off when grad_clip = 0), then AdamW (β = 0.9, 0.99) whose
  learning rate ramps linearly from 0 to `lr` over `warmup_steps` (0: constant)."""
  schedule = optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else lr
  return optax.chain(
    optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity(),
    optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=weight_decay),
  )


# ----------------------------------------------------------------------------
# Prepare: rollouts + rewards -> RolloutBatch (once per rollout batch).
# ----------------------------------------------------------------------------


@flax.struct.dataclass
class PolicyLogProbs:
  """The per-token forwards of a rollout batch. They need no rewards, so the trainer
  dispatches them before it scores rewards on the host (`rollout_logprobs`)."""

  old_logp_NT: jax.Array  # log π_old(o_t) at temperature 1 (the sampler's when not recomputed).
  entropy_NT: jax.Array  # H(π_old(·|o_<t)); zeros when not recomputed.
  score_sq_N: Any  # Σ_t ‖e_y − π_t‖² (None when not recomputed).
  score_sq_NT: Any  # ‖e_y − π_t‖² per token, 0 off the mask (None when not recomputed).
  rank_NT: Any  # π_old's rank of each token (0 = argmax); None unless a mask needs it.
  ref_logp_NT: jax.Array  # log π_ref(o_t); zeros without a reference policy.
  kl_NT: jax.Array  # The configured estimator of KL(π_old ‖ π_ref) per token, masked.


def action_view(rollouts):
  """The rollouts as everything trained or counted sees them: mask_NT the model's own
  tokens (`Rollouts.action_mask_NT`) and length_N their count. The identity for
  single-turn rollouts (action_mask_NT None).

  Multi-turn episodes (`episodes`) put the environment's observation tokens in the context
  (rollouts.mask_NT: the forwards' position ids and attention need them) but never in a
  loss, an advantage, a token mask, an aggregation denominator (1/|o_i| counts actions), a
  length or a metric: `rollout_logprobs` and `finish_prepare` substitute this view once,
  on entry, and keep the context mask for the forwards only (RolloutBatch.mask_NT).
  """
  if rollouts.action_mask_NT is None:
    return rollouts
  action_NT = rollouts.action_mask_NT & rollouts.mask_NT
  return rollouts.replace(
    mask_NT=action_NT, length_N=jnp.sum(action_NT, axis=-1, dtype=rollouts.length_N.dtype)
  )


def rollout_logprobs(params, ref_params, rollouts, *, cfg: RLConfig, model_fn):
  """Old and reference log-probs, entropy and score norms of a rollout batch.

  score_sq_i = Σ_t ‖e_{y_t} − π_t‖² = Σ_t (1 − 2 π_t(y_t) + Σ_v π_t(v)²), the per-sequence
  squared score norm in logit space: the optimal baseline's weight (the form verl's OTB uses).
  The forwards see the whole context (rollouts.mask_NT); every output is 0 off the tokens
  the model produced (`action_view`).
  """
  mask_NT = action_view(rollouts).mask_NT
  logp = functools.partial(
    logprobs.completion_logprobs,
    prompt_tokens_NP=rollouts.prompt_tokens_NP,
    prompt_mask_NP=rollouts.prompt_mask_NP,
    tokens_NT=rollouts.tokens_NT,
    mask_NT=rollouts.mask_NT,
    model_fn=model_fn,
    chunk=cfg.logit_chunk,
  )
  if cfg.recompute_old_logp:
    old_logp_NT, old_stats = logp(params, with_stats=True, with_rank=cfg.needs_rank)
    entropy_NT = old_stats["entropy"]
    rank_NT = old_stats.get("rank")
    score_sq_NT = (1.0 - 2.0 * jnp.exp(old_logp_NT) + old_stats["sum_sq"]) * mask_NT
    score_sq_N = jnp.sum(score_sq_NT, axis=1)
  else:  # RLConfig refuses the features that need π_old's distribution in this mode.
    old_logp_NT, entropy_NT = rollouts.policy_logp_NT, jnp.zeros(mask_NT.shape, jnp.float32)
    score_sq_N = score_sq_NT = rank_NT = None
  if cfg.use_ref:
    ref_logp_NT = logp(ref_params)[0]
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


def shaped_rewards(rollouts, correct_N, format_N, hyper: PrepareHyper, *, cfg: RLConfig):
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
    rewards_N = rewards_N - hyper.adv.kl_coef * jnp.sum(lp.kl_NT, axis=1)
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
  )


def compute_advantages(
  lp: PolicyLogProbs,
  rollouts,
  rewards_N,
  valid_N,
  hyper: PrepareHyper,
  success_N=None,
  *,
  cfg: RLConfig,
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
  return adv_fn(inputs, hyper.adv)


def estimator_metrics(
  lp: PolicyLogProbs,
  rollouts,
  rewards_N,
  valid_N,
  hyper: PrepareHyper,
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
  return metrics(inputs, hyper.adv, **config_lib.to_dict(cfg.advantage_options))


def loss_mask(lp: PolicyLogProbs, rollouts, adv_NT, valid_N, hyper: PrepareHyper, *, cfg):
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
  mask_NT, stats = masks.apply(cfg.mask_fns(), inputs, hyper.mask)
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
  if cfg.recompute_old_logp:
    out["rollout_entropy"] = jnp.sum(lp.entropy_NT * m_NT) / n_tok
  if cfg.use_ref:
    out[f"rollout_kl_ref/{cfg.kl_estimator}"] = jnp.sum(lp.kl_NT) / n_tok
  return out


def finish_prepare(
  lp: PolicyLogProbs,
  rollouts,
  correct_N,
  format_N,
  hyper: PrepareHyper,
  scorable_N=None,
  keep_N=None,
  prov=None,
  *,
  cfg: RLConfig,
  cf_cfg=None,
  splitter=None,
  group_size: int = 0,
):
  """Shaped rewards, the trained rows, advantages, the loss mask and the batch's metrics,
  given its log-probs. scorable_N: False where the reward failed (default: all scored);
  keep_N: False on rows kept only for shape (default: all kept); prov
  (`counterfactuals.Provenance`, with cf_cfg and the samples' group_size G): IBPO's
  counterfactual rows in the group-major batch (`_counterfactual_rows`).

  Returns (RolloutBatch, shaped rewards_N, metrics). Episodes' observation tokens stay in
  the batch's context (RolloutBatch.mask_NT) and out of everything else (`action_view`).
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
  batch = RolloutBatch(
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
  whenever π_old is recomputed (otherwise π_old is the sampler's: no mismatch to see)."""
  if not cfg.recompute_old_logp:
    return adv_NT, loss_mask_NT, {}
  old_NT, behav_NT = lp.old_logp_NT, rollouts.policy_logp_NT
  w_NT, keep_NT = importance.REGISTRY.make(cfg.is_correction)(
    old_NT, behav_NT, loss_mask_NT, hyper.importance
  )
  stats = importance.mismatch_metrics(old_NT, behav_NT, loss_mask_NT, w_NT, keep_NT)
  return adv_NT * w_NT, keep_NT, stats  # w = 1 off the kept tokens.


def _counterfactual_rows(
  lp, rollouts, keep_N, prov, hyper: PrepareHyper, cf_cfg, splitter, *, group_size: int
):
  """IBPO's counterfactual rows (`counterfactuals`): the full-rewrite filter (τ =
  hyper.adv.ibpo_tau) and the importance weights (c = hyper.adv.ibpo_is_cap). Returns
  (keep_N: the rows trained, context_N: kept counterfactuals that only inform φ,
  weights_N, own_NT, "ibpo/..." metrics)."""
  C = cf_cfg.per_group
  kept_N, d_N = counterfactuals.rewrite_filter(
    rollouts.tokens_NT,
    rollouts.mask_NT,
    prov,
    hyper.adv.ibpo_tau,
    distance=cf_cfg.distance,
    splitter=splitter,
    rows=counterfactuals.counterfactual_rows(
      rollouts.tokens_NT.shape[0], group_size=group_size, per_group=C
    )
    if group_size
    else None,
  )
  w_N = counterfactuals.importance_weights(
    lp.old_logp_NT, rollouts.policy_logp_NT, prov, hyper.adv.ibpo_is_cap, weighting=cf_cfg.weighting
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
  hyper: PrepareHyper,
  scorable_N=None,
  keep_N=None,
  *,
  cfg: RLConfig,
  model_fn: Callable,
):
  """Rewards, old/ref log-probs, advantages and the loss mask of one rollout batch:
  `finish_prepare(rollout_logprobs(...), ...)` in one function (scorable_N and keep_N as
  there: rows whose reward failed follow `cfg.unscorable`).

  Returns (RolloutBatch, shaped rewards_N, metrics). Pure and jittable (`make_prepare`).
  """
  lp = rollout_logprobs(params, ref_params, rollouts, cfg=cfg, model_fn=model_fn)
  return finish_prepare(lp, rollouts, correct_N, format_N, hyper, scorable_N, keep_N, cfg=cfg)


def make_prepare(cfg: RLConfig, model_fn: Callable):
  """jit(prepare) with the config and model bound: fn(params, ref_params, rollouts,
  correct_N, format_N, hyper) -> (RolloutBatch, rewards_N, metrics)."""
  return jax.jit(functools.partial(prepare, cfg=cfg, model_fn=model_fn))


# ----------------------------------------------------------------------------
# The train step.
# ----------------------------------------------------------------------------


def token_terms(
  params, mb: RolloutBatch, hyper: StepHyper, *, cfg: RLConfig, model_fn, dropout_key=None
):
  """Per-token objective terms of a (micro-)batch: (total ℓ_NT, dict of per-token arrays).
  dropout_key: the forward's adapter-dropout key (`model.apply`; None: deterministic)."""
  logp_NT, stats = logprobs.completion_logprobs(
    params,
    mb.prompt_tokens_NP,
    mb.prompt_mask_NP,
    mb.tokens_NT,
    mb.mask_NT,
    model_fn=model_fn,
    with_stats=True,
    chunk=cfg.logit_chunk,
    dropout_key=dropout_key,
  )
  ent_NT = stats["entropy"]
  m_NT = mb.loss_mask_NT
  pg_NT, aux = losses.REGISTRY.make(cfg.policy_loss)(
    logp_NT, mb.old_logp_NT, mb.adv_NT, m_NT, hyper.loss
  )
  total_NT = pg_NT - hyper.entropy_coef * ent_NT
  kl_NT = jnp.zeros_like(logp_NT)
  if cfg.use_ref:
    kl_NT = losses.KL_REGISTRY.make(cfg.kl_estimator)(logp_NT, mb.ref_logp_NT)
    total_NT = total_NT + hyper.kl_coef * kl_NT
  total_NT = jnp.where(m_NT, total_NT, 0.0)
  terms = dict(aux, pg_loss=pg_NT, kl=kl_NT, entropy=ent_NT, logp=logp_NT, loss=total_NT)
  return total_NT, terms


def _sums(terms, mb: RolloutBatch, w_NT):
  """Numerators and denominators of the step metrics: additive over micro-batches."""
  m = mb.loss_mask_NT.astype(jnp.float32)
  pos, neg = m * (mb.adv_NT > 0), m * (mb.adv_NT < 0)
  f = lambda x: x.astype(jnp.float32)
  return {
    "loss": jnp.sum(w_NT * terms["loss"]),
    "pg_loss": jnp.sum(w_NT * terms["pg_loss"]),
    "n_tok": jnp.sum(m),
    "n_pos": jnp.sum(pos),
    "n_neg": jnp.sum(neg),
    "clip_high": jnp.sum(pos * f(terms["clip_high"])),
    "clip_low": jnp.sum(neg * f(terms["clip_low"])),
    "dual_clip": jnp.sum(neg * f(terms["dual_clip"])),
    "ppo_kl": jnp.sum(m * (mb.old_logp_NT - terms["logp"])),
    "kl_ref": jnp.sum(m * terms["kl"]),
    "entropy": jnp.sum(m * terms["entropy"]),
    "ratio": jnp.sum(m * terms["ratio"]),
  }


def _metrics_from_sums(s, *, cfg: RLConfig):
  d = lambda a, b: s[a] / jnp.maximum(s[b], 1.0)
  out = {
    "loss": s["loss"],
    "pg_loss": s["pg_loss"],
    "pg_clipfrac": (s["clip_high"] + s["clip_low"]) / jnp.maximum(s["n_tok"], 1.0),
    "pg_clipfrac_high": d("clip_high", "n_pos"),
    "pg_clipfrac_low": d("clip_low", "n_neg"),
    "dual_clipfrac": d("dual_clip", "n_neg"),
    "ppo_kl": d("ppo_kl", "n_tok"),
    "entropy": d("entropy", "n_tok"),
    "ratio_mean": d("ratio", "n_tok"),
    "loss_tokens": s["n_tok"],
  }
  if cfg.use_ref:
    out[f"kl_ref/{cfg.kl_estimator}"] = d("kl_ref", "n_tok")
  return out


def _split(x, k):
  """[b, ...] -> [k, b/k, ...], slice j holding rows j, j + k, j + 2k, ... (strided: each
  slice keeps the rows' split over the data-parallel devices)."""
  return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def _unsplit(x):
  """The inverse of `_split`: [k, b/k, ...] -> [b, ...] in the original row order."""
  return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def _rows_constraint(tree):
  """Rows over the data-parallel axes (the rules' "activation_batch"); a no-op outside a
  mesh context."""
  return jax.tree.map(
    lambda x: nn.with_logical_constraint(x, ("activation_batch",) + (None,) * (x.ndim - 1)), tree
  )


_COMPLETION_FIELDS = (
  "tokens_NT",
  "mask_NT",
  "loss_mask_NT",
  "adv_NT",
  "old_logp_NT",
  "ref_logp_NT",
)


def length_buckets(cfg: RLConfig, T: int) -> tuple[int, ...]:
  """The completion lengths micro-batches are cut to (rl.length_buckets = k > 1: T·j/k
  rounded up, j = 1..k); () when off."""
  k = cfg.length_buckets
  return tuple(sorted({-(-T * j // k) for j in range(1, k + 1)})) if k > 1 else ()


def _cut(micro, Tb: int):
  """A micro-batch (RolloutBatch, w) with its completion columns cut to the first Tb."""
  mbk, wk = micro
  cut = {f: getattr(mbk, f)[:, :Tb] for f in _COMPLETION_FIELDS}
  if mbk.action_mask_NT is not None:  # Episodes.
    cut["action_mask_NT"] = mbk.action_mask_NT[:, :Tb]
  return mbk.replace(**cut), wk[:, :Tb]


def accumulate_gradients(
  params,
  mb: RolloutBatch,
  w_NT,
  hyper: StepHyper,
  *,
  cfg: RLConfig,
  model_fn,
  token_outputs,
  dropout_key=None,
):
  """(Σ_k ∇ Σ_{(i,t)∈micro-batch k} w·ℓ, additive metric sums, per-token outputs) over
  `cfg.micro_batches` slices of the mini-batch, in a `lax.scan`. The weights w are the
  whole mini-batch's, so the sum equals the unsplit gradient.

  Slices are strided (rows j, j + k, ...) by default. With rl.length_buckets = k > 1 the
  rows are sorted by length and sliced contiguously, and each micro-batch runs at the
  smallest bucket length (`length_buckets`) that holds its longest row (a `lax.switch`
  over one compiled branch per bucket): the padding past it is never computed, and since
  w = 0 there the sum is unchanged.

  With a dropout_key (adapter dropout), micro-batch k's forward gets fold_in(key, k): the
  masks, so the gradient, then depend on how the rows are split (the expectation does not)."""
  K, T = cfg.micro_batches, mb.tokens_NT.shape[1]
  buckets = length_buckets(cfg, T)
  trainable, join = model.split_trainable(params)  # Gradients of the trainable part only.

  def micro_loss(trainable, micro):
    mbk, wk, k = micro
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, k)
    total_NT, terms = token_terms(
      join(trainable), mbk, hyper, cfg=cfg, model_fn=model_fn, dropout_key=key
    )
    return jnp.sum(wk * total_NT), (terms, _sums(terms, mbk, wk))

  grad_fn = jax.grad(micro_loss, has_aux=True)
  keep = ("loss", "ratio", "clip_high", "clip_low", "dual_clip") if token_outputs else ()

  def at_length(Tb):
    def run(micro):
      cut = (*_cut(micro[:2], Tb), micro[2]) if Tb < T else micro
      grads, (terms, sums) = grad_fn(trainable, cut)
      pad = lambda x: jnp.pad(x, ((0, 0), (0, T - Tb))) if Tb < T else x
      return grads, sums, {k: pad(terms[k]) for k in keep}

    return run

  def body(acc, micro):
    micro = (*_rows_constraint(micro[:2]), micro[2])
    if buckets:
      longest = jnp.max(jnp.sum(micro[0].mask_NT, axis=1))
      branch = jnp.searchsorted(jnp.asarray(buckets), longest)
      grads, sums, tok = jax.lax.switch(branch, [at_length(b) for b in buckets], micro)
    else:
      grads, sums, tok = at_length(T)(micro)
    return jax.tree.map(jnp.add, acc, (grads, sums)), tok

  order = None
  if buckets:  # Sorted by length, sliced contiguously.
    order = jnp.argsort(jnp.sum(mb.mask_NT, axis=1))
    mb, w_NT = jax.tree.map(lambda x: x[order], mb), w_NT[order]
    split = lambda x: x.reshape(K, x.shape[0] // K, *x.shape[1:])
  else:
    split = functools.partial(_split, k=K)
  micro = (*jax.tree.map(split, (mb, w_NT)), jnp.arange(K))
  # The accumulator starts at zeros shaped like one micro-batch's (grads, sums).
  grads_shape, (_, sums_shape) = jax.eval_shape(
    grad_fn, trainable, jax.tree.map(lambda x: x[0], micro)
  )
  zeros = jax.tree.map(jnp.zeros_like, (grads_shape, sums_shape))
  (grads, sums), tok = jax.lax.scan(body, zeros, micro)
  if order is None:
    return grads, sums, jax.tree.map(_unsplit, tok)
  inverse = jnp.argsort(order)
  return grads, sums, jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:])[inverse], tok)


def all_finite(tree) -> jax.Array:
  """True when every floating-point leaf of `tree` is finite (a jitted-friendly reduction)."""
  leaves = [
    jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)
  ]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def apply_if_finite(
  state: TrainState, grads, finite, optimizer: optax.GradientTransformation, *, part="adapters"
):
  """The optimizer's update, applied only if `finite` and the updated params and optimizer
  state are all finite (a finite gradient can still overflow them, e.g. with a huge
  learning rate); otherwise params and optimizer state stay unchanged. state.step advances
  either way. Returns (state, applied)."""
  trainable, join = model.split_trainable(state.params, part=part)
  updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
  new = optax.apply_updates(trainable, updates)
  applied = finite & all_finite((new, opt_state))
  new, opt_state = jax.tree.map(
    lambda a, b: jnp.where(applied, a, b), (new, opt_state), (trainable, state.opt_state)
  )
  return TrainState(step=state.step + 1, params=join(new), opt_state=opt_state), applied


def train_step(
  state: TrainState,
  mb: RolloutBatch,
  hyper: StepHyper,
  *,
  cfg: RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  token_outputs: bool = False,
  dropout_key: jax.Array | None = None,
):
  """One optimizer step on one mini-batch: (state, metrics).

  w = aggregation(mini-batch); grads = `accumulate_gradients`; `apply_if_finite`. With
  `token_outputs`, metrics["tokens"] holds the per-token loss, weight, ratio and clip
  flags of the mini-batch ([N, T] each).

  Non-finite guard: a step whose loss, gradient norm or updated state is not finite leaves
  params and optimizer state unchanged (state.step still advances) and reports
  metrics["nonfinite"] = 1; the trainer counts these and stops after `max_nonfinite_steps`
  in a row.

  dropout_key: the step's adapter-dropout key (model.lora.dropout; `update` passes one per
  step); None: a deterministic forward.
  """
  w_NT = aggregation.REGISTRY.make(cfg.aggregation)(
    mb.loss_mask_NT, mb.group_ids_N, mb.adv_NT, max_len=cfg.max_len or None
  )
  grads, sums, tok = accumulate_gradients(
    state.params,
    mb,
    w_NT,
    hyper,
    cfg=cfg,
    model_fn=model_fn,
    token_outputs=token_outputs,
    dropout_key=dropout_key,
  )
  metrics = _metrics_from_sums(sums, cfg=cfg)
  metrics["grad_norm"] = optax.tree.norm(grads)
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(metrics["grad_norm"])
  state, applied = apply_if_finite(state, grads, finite, optimizer)
  metrics["nonfinite"] = 1.0 - applied.astype(jnp.float32)
  if token_outputs:
    metrics["tokens"] = {"weight": w_NT, **tok}
  return state, metrics


def make_train_step(
  cfg: RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  *,
  token_outputs: bool = False,
  donate: bool = True,
):
  """jit(train_step) with everything static bound: fn(state, minibatch, hyper)."""
  fn = functools.partial(
    train_step, cfg=cfg, model_fn=model_fn, optimizer=optimizer, token_outputs=token_outputs
  )
  return jax.jit(fn, donate_argnums=(0,) if donate else ())


def gather(batch: RolloutBatch, idx_b) -> RolloutBatch:
  """The rows idx_b of a rollout batch (jittable; on device)."""
  return jax.tree.map(lambda x: jnp.take(x, idx_b, axis=0), batch)


# ----------------------------------------------------------------------------
# The update phase of one rollout batch: plan, then a scan of train steps.
# ----------------------------------------------------------------------------


def make_plan_fn(cfg: RLConfig, *, batch_size: int, group_size: int):
  """The configured planner, validated for this batch shape: fn(key, group_ids_N, adv_N,
  lengths_N) -> idx [ppo_epochs, num_minibatches, batch_size // num_minibatches]."""
  return planners.make_planner(
    cfg.planner,
    num_minibatches=cfg.num_minibatches,
    ppo_epochs=cfg.ppo_epochs,
    batch_size=batch_size,
    group_size=group_size,
    **config_lib.to_dict(cfg.planner_options),
  )


def update(
  state: TrainState,
  batch: RolloutBatch,
  key: jax.Array,
  hyper: StepHyper,
  *,
  cfg: RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  plan_fn: Callable,
):
  """ppo_epochs × num_minibatches train steps over one rollout batch, as one `lax.scan`.

  plan_fn(key, group_ids_N, adv_N, lengths_N) -> idx [E, M, b] (`make_plan_fn`); step s =
  e·M + m trains on rows idx[e, m]. Pure and jittable. Returns (state, idx_EMb, metrics)
  where every metric is stacked over the E·M steps ([E·M] arrays, step order). Step s's
  adapter-dropout key is split from fold_in(key, 1) (the plan's key is `key` itself).
  """
  acted_NT = batch.mask_NT if batch.action_mask_NT is None else batch.action_mask_NT
  adv_N = advantages.sequence_advantage(batch.adv_NT, acted_NT)
  lengths_N = jnp.sum(batch.mask_NT, axis=1, dtype=jnp.int32)  # Compute: the whole context.
  idx_EMb = plan_fn(key, batch.group_ids_N, adv_N, lengths_N)
  E, M, b = idx_EMb.shape

  def step(state, xs):
    idx_b, dropout_key = xs
    mb = _rows_constraint(gather(batch, idx_b))
    return train_step(
      state, mb, hyper, cfg=cfg, model_fn=model_fn, optimizer=optimizer, dropout_key=dropout_key
    )

  keys_S = jax.random.split(jax.random.fold_in(key, 1), E * M)
  state, metrics_S = jax.lax.scan(step, state, (idx_EMb.reshape(E * M, b), keys_S))
  return state, idx_EMb, metrics_S


def make_update(
  cfg: RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  *,
  batch_size: int,
  group_size: int,
  donate: bool = True,
):
  """jit(update) with the planner for this batch shape bound: fn(state, batch, key, hyper)
  -> (state, idx_EMb, stacked metrics)."""
  fn = functools.partial(
    update,
    cfg=cfg,
    model_fn=model_fn,
    optimizer=optimizer,
    plan_fn=make_plan_fn(cfg, batch_size=batch_size, group_size=group_size),
  )
  return jax.jit(fn, donate_argnums=(0,) if donate else ())


# ----------------------------------------------------------------------------
# Host side: per-iteration checks of what the device cannot check.
# ----------------------------------------------------------------------------


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
  `config.build`.)"""
  groups.validate_rewards(rewards_N)
  groups.validate_group_ids(np.asarray(group_ids_N), group_size=group_size)
