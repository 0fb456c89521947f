"""The RL run's spec: `RLConfig` (the config edge of the objective), the hyperparameter
arrays `PrepareHyper` / `StepHyper`, the `RolloutBatch` and `TrainState` pytrees, and the
optimizer.

The objective as a whole, prepare then update, is described in `grpo_jax.rl.preparation`
and `grpo_jax.rl.learner`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax

from grpo_jax.infra import config_lib
from grpo_jax.models import model
from grpo_jax.rl import (
  advantages,
  aggregation,
  controllers,
  declared,
  importance,
  losses,
  masks,
  planners,
  reward_transforms,
)

KL_PLACEMENTS = ("loss", "reward")
# Where π_old's log-probs come from when recomputed (rl.old_logp_from, `RLConfig`).
OLD_LOGP_SOURCES = ("auto", "forward", "update")
# What happens to rows whose reward could not be computed (`verdicts.Scores.error_N`: the
# verifier raised, timed out or returned a non-finite value); see `trained_rows`.
UNSCORABLE_POLICIES = ("mask", "zero", "drop_group")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLConfig:
  """The RL algorithm, by name. Validated once, at the config edge (`from_dict`)."""

  # Advantages (advantages.REGISTRY) and their array hyperparameters.
  advantage: str = "grpo"
  advantage_options: dict = dataclasses.field(default_factory=dict)
  # The hyperparameters the estimators declare where they are registered (`declared`:
  # eps, gamma, fade's lambda_s, lambda_f, std_power, focal_gamma, ibpo's ibpo_lambda,
  # ibpo_tau, ibpo_is_cap, distill's, a user's), by name; arrays: no recompile.
  advantage_hyper: dict = dataclasses.field(default_factory=dict)
  # Controller (controllers.REGISTRY) that moves advantage_hyper's arrays between steps.
  controller: str = "none"
  controller_options: dict = dataclasses.field(default_factory=dict)
  # Token masks (masks.REGISTRY), AND-ed; options per mask name.
  token_masks: tuple[str, ...] = ()
  mask_options: dict = dataclasses.field(default_factory=dict)
  # The hyperparameters the masks declare (`masks.Traits.hyper`: negative_token_filter's
  # prob_threshold, entropy_threshold, top_k), by name.
  mask_hyper: dict = dataclasses.field(default_factory=dict)
  # Reward transforms.
  truncation: str = "none"  # "none" | "zero" (reward 0) | "mask" (overlong_filter)
  unscorable: str = "mask"  # UNSCORABLE_POLICIES: rows whose reward failed (`trained_rows`).
  format_weight: float = 0.0
  overlong_buffer: int = 0
  overlong_factor: float = 0.0
  # Policy loss (losses.REGISTRY).
  policy_loss: str = "ppo_clip"
  # The hyperparameters the policy losses declare (`losses.Traits.hyper`: eps_low,
  # eps_high, dual_clip_c, a user's), by name.
  loss_hyper: dict = dataclasses.field(default_factory=dict)
  # KL to the reference policy (losses.KL_REGISTRY); off when kl_coef == 0.
  kl_estimator: str = "k3"
  kl_coef: float = 0.0
  kl_in: str = "loss"
  entropy_coef: float = 0.0
  # A mixture-of-experts policy's load-balancing loss (Switch Transformer's, as
  # transformers' Qwen3-MoE computes it: `layers.balance_loss`), times this coefficient,
  # added to each micro-batch's loss. 0: off (not computed).
  moe_balance_coef: float = 0.0
  # Routing replay (a mixture-of-experts policy): the sampler records the experts each
  # token took and the trainer's forwards of π_old and π replay them (`moe.route`), so
  # both see the sampler's experts (the reference policy routes itself). Off: each
  # forward routes itself, and a token whose routing flips between sampler and trainer
  # adds to the sampler/trainer mismatch.
  routing_replay: bool = False
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
  # Micro-batches by token count instead of row count (`learner.token_budget_rows`): the
  # mini-batch's rows, longest first, each micro-batch as many of them as fit this many
  # tokens (prompt + completion columns) at the bucket length of its longest row, so
  # short rows share a micro-batch and long ones get fewer. 0: off (rl.micro_batches).
  micro_batch_tokens: int = 0
  # Completion positions whose logits exist at once in the log-prob forwards and the
  # update (`logprobs.chunked_stats`; 0: all T). Saves the [rows, T, V] logits and their
  # gradient for [rows, chunk, V], for a second LM-head matmul in the backward.
  logit_chunk: int = 0
  # The log-prob forwards (π_old, reference) over the rollout rows in this many slices, one
  # after another (`preparation.rollout_logprobs`): a forward holds rows / logprob_batches
  # rows' activations and logits. 1: all rows at once.
  logprob_batches: int = 1
  recompute_old_logp: bool = True
  # Where the recomputed π_old log-probs come from: "forward", a forward of their own
  # before rewards (`preparation.rollout_logprobs`); "update", the update's own forward,
  # stop_gradient(log π_θ), which is π_old exactly when the update takes one optimizer
  # step from the params that forward would have used (one forward of the batch saved);
  # "auto", "update" where it is exact and nothing reads π_old before the update
  # (`old_logp_blockers`; the trainer's config edge also counts counterfactual rows and
  # adapter dropout), else "forward".
  old_logp_from: str = "auto"
  # The behaviour-policy correction (`importance`): π_old / μ per token, μ the sampler.
  is_correction: str = "none"
  # The bounds the corrections declare (`importance.Traits.hyper`: is_lower L, MIS keeps
  # ratios >= L; is_upper U, TIS truncates at U and MIS keeps ratios <= U), by name.
  importance_hyper: dict = dataclasses.field(default_factory=dict)
  # Batch filtering (used by the trainer's loop): DAPO dynamic sampling.
  dynamic_sampling: bool = False
  max_gen_batches: int = 1

  def __post_init__(self):
    """Every value checked once, here, before anything compiles; an error names the key,
    its value and what is allowed."""
    self._check_names()
    self._check_numbers()
    # Build every variant once, so bad options fail here, before anything compiles.
    advantages.REGISTRY.make(self.advantage, **self.advantage_options)
    self._check_old_logp_readers()
    self._check_old_logp_source()
    controllers.REGISTRY.make(self.controller, **config_lib.to_dict(self.controller_options))
    self.mask_fns()
    self.prepare_hyper(max_new_tokens=max(self.overlong_buffer, 1))
    self.step_hyper()

  def _check_names(self) -> None:
    """Registered variant names, declared hyperparameters and the named policies."""
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
    # Every declared hyperparameter, checked (each property raises on a bad value).
    self.advantage_values, self.loss_values, self.mask_values, self.importance_values  # noqa: B018
    for name in self.token_masks:
      masks.REGISTRY.get(name)
    for name in self.mask_options:
      if name not in self.token_masks:
        raise ValueError(f"rl.mask_options names {name!r}, which is not in rl.token_masks.")
    for attr, allowed in (
      ("truncation", reward_transforms.TRUNCATION_POLICIES),
      ("kl_in", KL_PLACEMENTS),
      ("unscorable", UNSCORABLE_POLICIES),
    ):
      if getattr(self, attr) not in allowed:
        raise ValueError(f"rl.{attr}={getattr(self, attr)!r}; allowed: {allowed}.")

  def _check_numbers(self) -> None:
    """Finite floats, counts >= 1 and magnitudes >= 0."""
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
      "logprob_batches",
    ):
      if getattr(self, attr) < 1:
        raise ValueError(f"rl.{attr} must be >= 1, got {getattr(self, attr)}.")
    for attr in (
      "kl_coef",
      "entropy_coef",
      "moe_balance_coef",
      "max_len",
      "overlong_buffer",
      "logit_chunk",
      "micro_batch_tokens",
    ):
      if getattr(self, attr) < 0:
        raise ValueError(f"rl.{attr} must be >= 0, got {getattr(self, attr)}.")
    if self.micro_batch_tokens and self.micro_batches != 1:
      raise ValueError(
        f"rl.micro_batch_tokens={self.micro_batch_tokens} cuts the micro-batches by token "
        f"count, so rl.micro_batches must stay 1 (got {self.micro_batches}); set one of them."
      )

  def _check_old_logp_readers(self) -> None:
    """With recompute_old_logp=False, π_old is the sampler's log-probs and no distribution:
    refused for every variant that reads one (by its traits) or corrects against it."""
    if self.recompute_old_logp:
      return
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
        ("the 'rank' negative_token_filter criterion", "rank" in criteria.get("criteria", ())),
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
    if importance.REGISTRY.traits(self.is_correction).corrects:
      raise ValueError(
        f"rl.is_correction={self.is_correction!r} corrects π_old against the sampler's "
        "log-probs, but rl.recompute_old_logp=False makes π_old the sampler's own log-probs "
        "(nothing to correct); set recompute_old_logp=True or is_correction='none'."
      )

  def old_logp_blockers(self) -> list[str]:
    """What makes the update's forward other than π_old, or reads π_old before the update
    (each a phrase for an error): rl.old_logp_from="update" needs this empty."""
    out = []
    if not self.recompute_old_logp:
      out.append("rl.recompute_old_logp=False (π_old is the sampler's log-probs)")
    if self.num_minibatches * self.ppo_epochs > 1:
      out.append(
        f"{self.num_minibatches * self.ppo_epochs} optimizer steps per update "
        "(rl.num_minibatches × rl.ppo_epochs; after the first, π_θ is no longer π_old)"
      )
    traits = advantages.REGISTRY.traits(self.advantage)
    if traits.needs_old_logp or traits.needs_teacher:
      out.append(f"rl.advantage={self.advantage!r} (it reads π_old)")
    out += [
      f"the {name} token mask (it reads π_old)"
      for name in self.mask_fns()
      if masks.REGISTRY.traits(name).reads_old_logp
    ]
    if controllers.REGISTRY.traits(self.controller).reads_old_logp:
      out.append(f"rl.controller={self.controller!r} (it reads π_old's entropy)")
    if importance.REGISTRY.traits(self.is_correction).corrects:
      out.append(f"rl.is_correction={self.is_correction!r} (it weights by π_old / μ)")
    if self.use_ref and self.kl_in == "reward":
      out.append("the KL folded into the reward (rl.kl_in='reward': measured from π_old)")
    return out

  def _check_old_logp_source(self, extra_blockers=()) -> None:
    if self.old_logp_from not in OLD_LOGP_SOURCES:
      raise ValueError(f"rl.old_logp_from={self.old_logp_from!r}; allowed: {OLD_LOGP_SOURCES}.")
    blockers = [*self.old_logp_blockers(), *extra_blockers]
    if self.old_logp_from == "update" and blockers:
      raise ValueError(
        "rl.old_logp_from='update' takes π_old from the update's own forward, which is "
        f"exact only with one optimizer step and no reader of π_old before it; this config "
        f"has {'; '.join(blockers)}. Set rl.old_logp_from='forward' (or 'auto')."
      )

  def resolved_old_logp(self, *, extra_blockers=()) -> RLConfig:
    """This config with old_logp_from "auto" resolved: "update" when neither
    `old_logp_blockers` nor `extra_blockers` (what only the whole config shows: the
    trainer's config edge, `build`) has anything, else "forward". An explicit "update"
    with an extra blocker is refused."""
    self._check_old_logp_source(extra_blockers)
    if self.old_logp_from != "auto":
      return self
    blocked = self.old_logp_blockers() or extra_blockers
    return dataclasses.replace(self, old_logp_from="forward" if blocked else "update")

  @property
  def old_logp_in_update(self) -> bool:
    """π_old's log-probs are the update's forward's (rl.old_logp_from="update", as
    resolved from "auto" by the trainer's config edge): no forward of their own."""
    return self.old_logp_from == "update"

  @property
  def forwards_old_logp(self) -> bool:
    """π_old's log-probs need a forward of their own before rewards."""
    return self.recompute_old_logp and not self.old_logp_in_update

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

  @property
  def advantage_values(self) -> dict[str, float]:
    """Every estimator's declared hyperparameter: rl.advantage_hyper's value, else the
    default (checked)."""
    return advantages.declared_values(config_lib.to_dict(self.advantage_hyper))

  @property
  def loss_values(self) -> dict[str, float]:
    """Every policy loss's declared hyperparameter: rl.loss_hyper's, else the default."""
    return losses.declared_values(config_lib.to_dict(self.loss_hyper))

  @property
  def mask_values(self) -> dict[str, float]:
    """Every token mask's declared hyperparameter: rl.mask_hyper's, else the default."""
    return masks.declared_values(config_lib.to_dict(self.mask_hyper))

  @property
  def importance_values(self) -> dict[str, float]:
    """Every importance correction's bound: rl.importance_hyper's, else the default."""
    return importance.declared_values(config_lib.to_dict(self.importance_hyper))

  def prepare_hyper(self, *, max_new_tokens: int) -> PrepareHyper:
    return PrepareHyper(
      adv=declared.arrays(self.advantage_values),
      kl_coef=jnp.asarray(self.kl_coef if self.kl_in == "reward" else 0.0, jnp.float32),
      mask=declared.arrays(self.mask_values),
      reward=reward_transforms.reward_hyper(
        format_weight=self.format_weight,
        overlong_max_len=max_new_tokens if self.overlong_factor > 0 else 0,
        overlong_buffer=self.overlong_buffer,
        overlong_factor=self.overlong_factor,
      ),
      importance=declared.arrays(self.importance_values),
    )

  def step_hyper(self) -> StepHyper:
    return StepHyper(
      loss=declared.arrays(self.loss_values),
      kl_coef=jnp.asarray(self.kl_coef if self.kl_in == "loss" else 0.0, jnp.float32),
      entropy_coef=jnp.asarray(self.entropy_coef, jnp.float32),
    )


@flax.struct.dataclass
class PrepareHyper:
  # {name: f32}: every advantage estimator's declared hyperparameter (`declared.Values`
  # when an estimator reads them); a controller moves them between iterations.
  adv: dict
  mask: dict  # {name: f32}: every token mask's declared hyperparameter.
  reward: reward_transforms.RewardHyper
  importance: dict  # {name: f32}: every importance correction's declared bound.
  # β of a KL folded into the reward (rl.kl_in = "reward"; 0 otherwise).
  kl_coef: jax.Array


@flax.struct.dataclass
class StepHyper:
  loss: dict  # {name: f32}: every policy loss's declared hyperparameter.
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
  # Routing replay (rl.routing_replay): the sampler's experts per prompt and completion
  # token (`sampling.Rollouts`), replayed by the update's forward; None: off.
  prompt_routes_NPLK: jax.Array | None = None
  routes_NTLK: jax.Array | None = None


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


@functools.lru_cache(maxsize=64, typed=True)
def make_optimizer(
  *, lr: float, warmup_steps: int = 0, weight_decay: float = 0.0, grad_clip: float = 1.0
) -> optax.GradientTransformation:
  """Global-norm clipping (off when grad_clip = 0), then AdamW (β = 0.9, 0.99) whose
  learning rate ramps linearly from 0 to `lr` over `warmup_steps` (0: constant). One
  object per setting, so that the updates built around it are shared (`sharding.jit`)."""
  schedule = optax.linear_schedule(0.0, lr, warmup_steps) if warmup_steps else lr
  return optax.chain(
    optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity(),
    optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=weight_decay),
  )
