"""Behaviour-policy corrections: the sampler is not the policy being trained.

The rows of a batch were sampled by the behaviour policy μ, with log-probs
``behav_logp_NT`` (`sampling.Rollouts.policy_logp_NT`: the sampler's raw policy at
temperature 1, under the parameters, dtype and kernels that sampled each token). The
trainer's policy loss compares π_θ with π_old, the trainer's own forward of the batch
(``old_logp_NT``, `rl.recompute_old_logp`). The two differ when

* the sampler computes differently (bfloat16 sampler against a float32 trainer, TF32
  matmuls on a GPU, other kernels): a mismatch of the same parameters, or
* the sampler's parameters are older (`offpolicy`: rollouts generated while earlier
  updates ran, s updates stale).

The policy-gradient estimator then needs the importance ratio of the trained policy's
proximal point to the behaviour policy,

    ρ_t = π_old(o_t | o_<t) / μ(o_t | o_<t) = exp(old_logp − behav_logp),

on top of the loss's own ratio π_θ / π_old (the decoupled objective of AReaL; the same
correction verl applies as "rollout importance sampling"). A correction is picked by name
(`rl.is_correction`) and maps the two log-probs to a per-token weight and a keep mask:

    fn(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values) -> (weight_NT, keep_NT)

* ``none``:         w = 1.
* ``tis_token``:    w_t = min(ρ_t, U)                     truncated IS (Yao et al. 2025,
                                                          "off-policy RL training", TIS)
* ``tis_sequence``: w_i = min(Π_t ρ_t, U) on every token of row i
* ``mis_token``:    w_t = ρ_t, token dropped unless L ≤ ρ_t ≤ U   masked IS (Liu et al.
                                                          2025, "When speed kills
                                                          stability", MIS)
* ``mis_sequence``: w_i = Π_t ρ_t, row dropped unless L ≤ Π_t ρ_t ≤ U
* ``mis_geometric``: w = 1, row dropped unless L ≤ exp(mean_t log ρ_t) ≤ U (the per-token
                    geometric mean: a length-independent sequence test)

U = `rl.importance_hyper.is_upper`, L = `rl.importance_hyper.is_lower` (declared by the
corrections that read them; arrays: no recompile). The weight is a
constant of the update (no gradient flows through it). `preparation.finish_prepare` folds it into
the token advantage, A_t ← w_t·A_t: every policy loss here is positively homogeneous in A
per token (PPO clip, dual clip, GSPO's token form, CISPO, REINFORCE), so this equals
multiplying each token's loss by w_t, for every loss; the KL and entropy terms are not
weighted. Dropped tokens leave the loss mask (and every aggregation denominator).

log ρ is clamped to ±LOG_RATIO_CLAMP before exp, as the policy losses clamp theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.infra import registry
from grpo_jax.rl import declared

Hyper = declared.Hyper

LOG_RATIO_CLAMP = 20.0
QUANTILES = (0.01, 0.5, 0.99)

Correction = Callable[..., tuple[jax.Array, jax.Array]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
  """corrects: it reweights or drops tokens by π_old / μ (False only for "none", which
  needs no sampler log-probs and corrects nothing)."""

  corrects: bool = True
  # {name: Hyper}: the bounds it reads (`hyper.is_lower`, `hyper.is_upper`).
  hyper: dict = dataclasses.field(default_factory=dict)


REGISTRY: registry.Registry[Correction] = registry.Registry("importance correction", traits=Traits)


# The bounds the corrections declare (config.rl.importance_hyper.<name>, `declared`).
IS_LOWER = Hyper(0.5, low=0.0, doc="L: MIS keeps ratios >= L")
IS_UPPER = Hyper(
  2.0, low=0.0, valid=lambda u: u > 0, rule="> 0", doc="U: TIS truncates at U; MIS keeps <= U"
)
BOUNDS = {"is_lower": IS_LOWER, "is_upper": IS_UPPER}


def declared_hyper() -> dict[str, Hyper]:
  """Every correction's declared hyperparameters, by name (config.rl.importance_hyper)."""
  return declared.collect(REGISTRY)


def declared_values(given) -> dict[str, float]:
  """config.rl.importance_hyper's values (checked, and L < U), else the defaults."""
  values = declared.values(REGISTRY, given, section="config.rl.importance_hyper")
  check_bounds(lower=values["is_lower"], upper=values["is_upper"])
  return values


def hyper_values(**given) -> declared.Values:
  """The arrays a correction reads, from keyword values with the defaults elsewhere."""
  return declared.Values(declared.arrays(declared_values(given)))


def check_bounds(*, lower: float, upper: float, where: str = "rl.importance_hyper") -> None:
  """Refuses bounds that cannot be a truncation or a keep interval: 0 ≤ L < U."""
  if not (0.0 <= lower < upper):
    raise ValueError(
      f"{where}.is_lower={lower}, {where}.is_upper={upper}: importance-ratio bounds need "
      f"0 <= is_lower < is_upper (TIS truncates at is_upper; MIS keeps ratios in "
      f"[is_lower, is_upper], e.g. [0.5, 2.0])."
    )


def log_ratio(old_logp_NT, behav_logp_NT, mask_NT):
  """log ρ_t = old − behav, clamped, 0 off the mask."""
  d_NT = jnp.clip(
    old_logp_NT.astype(jnp.float32) - behav_logp_NT.astype(jnp.float32),
    -LOG_RATIO_CLAMP,
    LOG_RATIO_CLAMP,
  )
  return jnp.where(mask_NT, d_NT, 0.0)


def _sequence_log_ratio(old_logp_NT, behav_logp_NT, mask_NT):
  """log Π_t ρ_t per row, clamped, broadcast to [N, 1]."""
  d_N1 = jnp.sum(log_ratio(old_logp_NT, behav_logp_NT, mask_NT), axis=1, keepdims=True)
  return jnp.clip(d_N1, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _inside(r, hyper: declared.Values):
  return (r >= hyper.is_lower) & (r <= hyper.is_upper)


@REGISTRY.register("none", corrects=False)
def no_correction(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values):
  """w = 1: the behaviour policy is taken to be π_old (today's on-policy assumption)."""
  del old_logp_NT, behav_logp_NT, hyper
  return jnp.ones(mask_NT.shape, jnp.float32), mask_NT


@REGISTRY.register("tis_token", hyper={"is_upper": IS_UPPER})
def tis_token(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values):
  """w_t = min(ρ_t, U), ρ_t = π_old/μ per token (truncated importance sampling)."""
  r_NT = jnp.exp(log_ratio(old_logp_NT, behav_logp_NT, mask_NT))
  return jnp.where(mask_NT, jnp.minimum(r_NT, hyper.is_upper), 1.0), mask_NT


@REGISTRY.register("tis_sequence", hyper={"is_upper": IS_UPPER})
def tis_sequence(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values):
  """w_i = min(Π_t ρ_t, U) on every token of row i."""
  r_N1 = jnp.exp(_sequence_log_ratio(old_logp_NT, behav_logp_NT, mask_NT))
  w_NT = jnp.broadcast_to(jnp.minimum(r_N1, hyper.is_upper), mask_NT.shape)
  return jnp.where(mask_NT, w_NT, 1.0), mask_NT


@REGISTRY.register("mis_token", hyper=BOUNDS)
def mis_token(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values):
  """w_t = ρ_t; tokens with ρ_t outside [L, U] are dropped (masked importance sampling)."""
  r_NT = jnp.exp(log_ratio(old_logp_NT, behav_logp_NT, mask_NT))
  keep_NT = mask_NT & _inside(r_NT, hyper)
  return jnp.where(keep_NT, r_NT, 1.0), keep_NT


@REGISTRY.register("mis_sequence", hyper=BOUNDS)
def mis_sequence(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values):
  """w_i = Π_t ρ_t; rows whose Π_t ρ_t leaves [L, U] are dropped."""
  r_N1 = jnp.exp(_sequence_log_ratio(old_logp_NT, behav_logp_NT, mask_NT))
  keep_NT = mask_NT & _inside(r_N1, hyper)
  return jnp.where(keep_NT, jnp.broadcast_to(r_N1, mask_NT.shape), 1.0), keep_NT


@REGISTRY.register("mis_geometric", hyper=BOUNDS)
def mis_geometric(old_logp_NT, behav_logp_NT, mask_NT, hyper: declared.Values):
  """w = 1; rows whose geometric-mean ratio exp(mean_t log ρ_t) leaves [L, U] are dropped."""
  n_N1 = jnp.maximum(jnp.sum(mask_NT, axis=1, keepdims=True), 1)
  d_N1 = jnp.sum(log_ratio(old_logp_NT, behav_logp_NT, mask_NT), axis=1, keepdims=True)
  keep_NT = mask_NT & _inside(jnp.exp(d_N1 / n_N1), hyper)
  return jnp.ones(mask_NT.shape, jnp.float32), keep_NT


def masked_quantiles(x_NT, mask_NT, qs=QUANTILES):
  """Quantiles of x over the masked entries (linear interpolation; NaN when none)."""
  x = jnp.where(mask_NT, x_NT.astype(jnp.float32), jnp.nan).reshape(-1)
  return jnp.nanquantile(x, jnp.asarray(qs, jnp.float32))


def mismatch_metrics(old_logp_NT, behav_logp_NT, mask_NT, weight_NT, keep_NT) -> dict:
  """Per-iteration sampler–trainer mismatch (`metrics.DEFINITIONS`, "offpolicy/..."):
  k3 = mean_t (ρ_t − 1 − log ρ_t), an estimate of KL(μ ‖ π_old) from μ's samples; ρ's
  quantiles; the mean weight and the share of tokens the correction dropped."""
  m = mask_NT.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  d_NT = log_ratio(old_logp_NT, behav_logp_NT, mask_NT)
  r_NT = jnp.exp(d_NT)
  out = {
    "offpolicy/mismatch_k3": jnp.sum(m * (r_NT - 1.0 - d_NT)) / n,
    "offpolicy/is_weight_mean": jnp.sum(keep_NT * weight_NT) / jnp.maximum(jnp.sum(keep_NT), 1),
    "offpolicy/is_drop_frac": 1.0 - jnp.sum(keep_NT) / n,
  }
  for q, v in zip(QUANTILES, masked_quantiles(r_NT, mask_NT), strict=True):
    out[f"offpolicy/ratio_p{round(q * 100):02d}"] = v
  return out
