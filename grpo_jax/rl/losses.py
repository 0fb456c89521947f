"""Per-token policy losses, KL estimators and token entropy (pure JAX, float32 math).

Notation (RESEARCH.md §6): ``logp_BT`` is ℓ_{i,t} = log π_θ(o_{i,t} | q, o_{i,<t}) under the
current parameters, ``old_logp_BT`` is ℓ under the sampling policy π_old, ``adv_BT`` is the
token advantage A_{i,t} and ``mask_BT`` marks completion tokens.

A policy loss is picked by name (``REGISTRY.make("ppo_clip")``) and has the signature

  fn(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper: declared.Values) -> (loss_BT, aux)

``loss_BT`` is the per-token loss ℓ_tok to MINIMISE, 0 where the mask is False. It is not
aggregated here: the train step forms Σ w·ℓ_tok with its own weights (loss_agg_mode).
``aux`` always has the keys ``AUX_KEYS``:

* ``ratio``: the importance ratio the loss used (f32, 1 where the mask is False);
* ``clip_high``: A > 0 and the ratio is above 1 + ε_high, so the clipped branch binds;
* ``clip_low``: A < 0 and the ratio is below 1 − ε_low, so the clipped branch binds;
* ``dual_clip``: A < 0 and the dual-clip bound −A·c binds.

Every flag is False where the mask is False or where it does not apply to the loss.

A KL estimator is picked by name (``KL_REGISTRY.make("k3")``), ``fn(logp_BT, ref_logp_BT) ->
kl_BT``, unmasked (the caller masks). A loss declares the hyperparameters it reads where it
is registered (`Traits.hyper`; ε_low, ε_high and c below); they reach it as float32 arrays
(``hyper.eps_high``), so changing them during a run does not recompile.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.infra import registry
from grpo_jax.rl import declared

# |log ρ| is clamped to this before exp (verl `compute_policy_loss_vanilla`).
LOG_RATIO_CLAMP = 20.0
# GSPO's token-form log-ratio is clamped above at this (verl `compute_policy_loss_gspo`).
GSPO_MAX_LOG_RATIO = 10.0
# k3 clamps −Δ to ±20 and its value to ±10 (verl `kl_penalty`, "low_var_kl").
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0

AUX_KEYS = ("ratio", "clip_high", "clip_low", "dual_clip")

PolicyLoss = Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
KlEstimator = Callable[[jax.Array, jax.Array], jax.Array]

# An array hyperparameter a policy loss declares where it is registered
# (`@REGISTRY.register(name, hyper={"cap": Hyper(2.0, low=1.0)})`): set by
# config.rl.loss_hyper.<name> and read by the loss as `hyper.<name>` (`declared`).
Hyper = declared.Hyper

# The trust region [1 − ε_low, 1 + ε_high] of the ratio (DAPO's clip-higher uses ε_high =
# 0.28, arXiv 2503.14476) and the dual-clip bound c for A < 0 (Ye et al. 2020; verl
# `clip_ratio_c` = 3.0), shared by the losses that clip.
EPS_LOW = Hyper(0.2, low=0.0, doc="ε_low: the ratio's trust region starts at 1 − ε_low")
EPS_HIGH = Hyper(0.2, low=0.0, doc="ε_high: the ratio's trust region ends at 1 + ε_high")
DUAL_CLIP_C = Hyper(
  0.0,
  low=0.0,
  valid=lambda c: c == 0 or c > 1,
  rule="0 (off) or > 1 (verl uses 3.0)",
  doc="the dual-clip bound for A < 0; c <= 1 would cap the loss below PPO's at ratio 1",
)
CLIP = {"eps_low": EPS_LOW, "eps_high": EPS_HIGH}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
  """What a policy loss declares where it is registered (`REGISTRY.traits(name)`).

  hyper: {name: Hyper}, the array hyperparameters it reads (`hyper.<name>`)."""

  hyper: dict = dataclasses.field(default_factory=dict)


REGISTRY: registry.Registry[PolicyLoss] = registry.Registry("policy loss", traits=Traits)
KL_REGISTRY: registry.Registry[KlEstimator] = registry.Registry("KL estimator")


# ----------------------------------------------------------------------------
# Hyperparameters.
# ----------------------------------------------------------------------------


def declared_hyper() -> dict[str, Hyper]:
  """Every registered policy loss's declared hyperparameters, by name (config.rl's
  loss_hyper section lists them with their defaults)."""
  return declared.collect(REGISTRY)


def declared_values(given) -> dict[str, float]:
  """Every policy loss's declared hyperparameters: config.rl.loss_hyper's values (checked
  against each declaration), else the defaults."""
  return declared.values(REGISTRY, given, section="config.rl.loss_hyper")


def hyper_values(**given) -> declared.Values:
  """The arrays a policy loss reads (`declared.Values`), from keyword values with the
  declared defaults elsewhere: what the trainer builds from config.rl.loss_hyper."""
  return declared.Values(declared.arrays(declared_values(given)))


# ----------------------------------------------------------------------------
# Shared pieces.
# ----------------------------------------------------------------------------


def _f32(x):
  return jnp.asarray(x, jnp.float32)


def _masked(x_BT, mask_BT, fill=0.0):
  """x where the mask is True, else ``fill`` (keeps padding garbage out of values and grads)."""
  return jnp.where(mask_BT, x_BT, fill)


def _mask_and_adv(mask_BT, adv_BT):
  """(bool mask, f32 advantage zeroed off the mask, so NaN padding cannot reach gradients)."""
  mask_BT = jnp.asarray(mask_BT, jnp.bool_)
  return mask_BT, _masked(_f32(adv_BT), mask_BT)


def _log_ratio(logp_BT, old_logp_BT, mask_BT):
  """log ρ = ℓ − ℓ_old on masked tokens, 0 elsewhere (f32)."""
  return _masked(_f32(logp_BT) - _f32(old_logp_BT), mask_BT)


def _token_ratio(logp_BT, old_logp_BT, mask_BT):
  """ρ = exp(clamp(ℓ − ℓ_old, −20, 20)); 1 where the mask is False (verl vanilla)."""
  log_ratio_BT = _log_ratio(logp_BT, old_logp_BT, mask_BT)
  return jnp.exp(jnp.clip(log_ratio_BT, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def _clip_ratio(ratio_BT, hyper: declared.Values):
  """clip(ρ, 1 − ε_low, 1 + ε_high)."""
  return jnp.clip(ratio_BT, 1.0 - hyper.eps_low, 1.0 + hyper.eps_high)


def _clipped_surrogate(ratio_BT, adv_BT, hyper: declared.Values):
  """max(−Aρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)), the negated PPO surrogate."""
  return jnp.maximum(-adv_BT * ratio_BT, -adv_BT * _clip_ratio(ratio_BT, hyper))


def _clip_flags(ratio_BT, adv_BT, mask_BT, hyper: declared.Values):
  """(clip_high, clip_low): where the clipped branch of the PPO max binds."""
  clip_high_BT = mask_BT & (adv_BT > 0) & (ratio_BT > 1.0 + hyper.eps_high)
  clip_low_BT = mask_BT & (adv_BT < 0) & (ratio_BT < 1.0 - hyper.eps_low)
  return clip_high_BT, clip_low_BT


def _aux(ratio_BT, mask_BT, *, clip_high_BT=None, clip_low_BT=None, dual_clip_BT=None):
  """The uniform aux dict; flags left out are all False."""
  false_BT = jnp.zeros(mask_BT.shape, jnp.bool_)

  def flag(x_BT):
    return false_BT if x_BT is None else x_BT & mask_BT

  return {
    "ratio": jax.lax.stop_gradient(_masked(ratio_BT, mask_BT, 1.0)),
    "clip_high": flag(clip_high_BT),
    "clip_low": flag(clip_low_BT),
    "dual_clip": flag(dual_clip_BT),
  }


# ----------------------------------------------------------------------------
# Policy losses.
# ----------------------------------------------------------------------------


@REGISTRY.register("ppo_clip", hyper={**CLIP, "dual_clip_c": DUAL_CLIP_C})
def ppo_clip(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper: declared.Values):
  """PPO clipped surrogate with asymmetric (clip-higher) bounds and dual clip.

  ρ = exp(clamp(ℓ − ℓ_old, −20, 20));
  ℓ_tok = max(−Aρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high));
  for A < 0 and c > 1 (dual clip): ℓ_tok = min(ℓ_tok, −A·c).

  Sources: PPO (Schulman et al. 2017, arXiv 1707.06347); DAPO clip-higher (arXiv
  2503.14476); dual-clip PPO (Ye et al. 2020, arXiv 1912.09729); verl
  `compute_policy_loss_vanilla` (RESEARCH.md §6.7).
  """
  mask_BT, adv_BT = _mask_and_adv(mask_BT, adv_BT)
  ratio_BT = _token_ratio(logp_BT, old_logp_BT, mask_BT)
  clipped_BT = _clipped_surrogate(ratio_BT, adv_BT, hyper)
  dual_bound_BT = -adv_BT * hyper.dual_clip_c
  dual_on_BT = (adv_BT < 0) & (hyper.dual_clip_c > 1.0)
  loss_BT = jnp.where(dual_on_BT, jnp.minimum(clipped_BT, dual_bound_BT), clipped_BT)
  clip_high_BT, clip_low_BT = _clip_flags(ratio_BT, adv_BT, mask_BT, hyper)
  aux = _aux(
    ratio_BT,
    mask_BT,
    clip_high_BT=clip_high_BT,
    clip_low_BT=clip_low_BT,
    dual_clip_BT=dual_on_BT & (clipped_BT > dual_bound_BT),
  )
  return _masked(loss_BT, mask_BT), aux


def sequence_log_ratio(logp_BT, old_logp_BT, mask_BT):
  """GSPO's per-sequence log-ratio: log s_i = (1/|o_i|) Σ_t m_{i,t}(ℓ − ℓ_old), 0 for empty rows.

  |o_i| = Σ_t m_{i,t}. Source: GSPO (arXiv 2507.18071), RESEARCH.md §6.6.
  """
  mask_BT = jnp.asarray(mask_BT, jnp.bool_)
  n_B = jnp.sum(mask_BT, axis=1, dtype=jnp.float32)
  total_B = jnp.sum(_log_ratio(logp_BT, old_logp_BT, mask_BT), axis=1)
  return total_B / jnp.maximum(n_B, 1.0)


@REGISTRY.register("gspo", hyper=CLIP)
def gspo(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper: declared.Values):
  """GSPO: PPO clipping on the length-normalised sequence ratio, in token form.

  s_i = exp((1/|o_i|) Σ_t m(ℓ − ℓ_old)) (|o_i| masked tokens; empty rows give s_i = 1);
  log s_{i,t} = min(sg[log s_i] + ℓ_t − sg[ℓ_t], 10), so s_{i,t} has the value of s_i and
  ∂s_{i,t}/∂ℓ_t = s_i;
  ℓ_tok = max(−A s_{i,t}, −A·clip(s_{i,t}, 1 − ε_low, 1 + ε_high)).

  With sequence-constant A and the seq-mean-token-mean weights m/|o_i|, Σ_t w·ℓ_tok has the
  gradient of the sequence loss max(−A s_i, −A·clip(s_i)). As in verl the clamp at 10 acts on
  the token form, so a clamped sequence gets no gradient. Dual clip is not part of GSPO
  (``hyper.dual_clip_c`` is ignored; ``dual_clip`` is all False). The flags are per sequence,
  copied to its masked tokens. Sources: GSPO (arXiv 2507.18071, which recommends ε_low = 3e-4,
  ε_high = 4e-4); verl `compute_policy_loss_gspo` (RESEARCH.md §6.6).
  """
  mask_BT, adv_BT = _mask_and_adv(mask_BT, adv_BT)
  logp_BT = _masked(_f32(logp_BT), mask_BT)
  seq_log_ratio_B1 = sequence_log_ratio(logp_BT, old_logp_BT, mask_BT)[:, None]
  log_ratio_BT = jax.lax.stop_gradient(seq_log_ratio_B1) + logp_BT - jax.lax.stop_gradient(logp_BT)
  ratio_BT = jnp.exp(jnp.minimum(log_ratio_BT, GSPO_MAX_LOG_RATIO))
  loss_BT = _clipped_surrogate(ratio_BT, adv_BT, hyper)
  clip_high_BT, clip_low_BT = _clip_flags(ratio_BT, adv_BT, mask_BT, hyper)
  aux = _aux(ratio_BT, mask_BT, clip_high_BT=clip_high_BT, clip_low_BT=clip_low_BT)
  return _masked(loss_BT, mask_BT), aux


@REGISTRY.register("reinforce")
def reinforce(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper: declared.Values):
  """On-policy REINFORCE: ℓ_tok = −A·ℓ.

  The value differs from PPO's −A·ρ at ρ = 1, but the gradient −A·∇ℓ is identical there.
  No clipping (``hyper`` is unused, every flag is False); the ``ratio`` aux is
  exp(clamp(ℓ − ℓ_old, −20, 20)), for reporting only. Source: Williams 1992 (REINFORCE);
  the ρ = 1 case of every loss here (RESEARCH.md §6.1).
  """
  del hyper
  mask_BT, adv_BT = _mask_and_adv(mask_BT, adv_BT)
  loss_BT = -adv_BT * _masked(_f32(logp_BT), mask_BT)
  ratio_BT = _token_ratio(logp_BT, old_logp_BT, mask_BT)
  return _masked(loss_BT, mask_BT), _aux(ratio_BT, mask_BT)


@REGISTRY.register("cispo", hyper=CLIP)
def cispo(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper: declared.Values):
  """CISPO: clipped, detached importance weight times REINFORCE.

  ρ = exp(clamp(ℓ − ℓ_old, −20, 20)); ℓ_tok = −sg[clip(ρ, 1 − ε_low, 1 + ε_high)]·A·ℓ.
  The gradient −clip(ρ)·A·∇ℓ always flows, also where ρ is outside the trust region (PPO
  gives 0 there). The MiniMax-M1 paper imposes no lower bound: set a large ε_low (e.g. 1e6,
  then 1 − ε_low < 0 <= ρ never clips) and tune ε_high only. Here the flags mark a truncated
  weight whatever the sign of A (A ≠ 0): ``clip_high`` for ρ > 1 + ε_high, ``clip_low`` for
  ρ < 1 − ε_low; ``dual_clip`` is all False. Sources: MiniMax-M1 (arXiv 2506.13585, eq. 4);
  verl `compute_policy_loss_cispo`.
  """
  mask_BT, adv_BT = _mask_and_adv(mask_BT, adv_BT)
  ratio_BT = _token_ratio(logp_BT, old_logp_BT, mask_BT)
  weight_BT = jax.lax.stop_gradient(_clip_ratio(ratio_BT, hyper))
  loss_BT = -weight_BT * adv_BT * _masked(_f32(logp_BT), mask_BT)
  live_BT = mask_BT & (adv_BT != 0)
  aux = _aux(
    ratio_BT,
    mask_BT,
    clip_high_BT=live_BT & (ratio_BT > 1.0 + hyper.eps_high),
    clip_low_BT=live_BT & (ratio_BT < 1.0 - hyper.eps_low),
  )
  return _masked(loss_BT, mask_BT), aux


# ----------------------------------------------------------------------------
# KL estimators: Δ = log π_θ − log π_ref on samples from π_θ (RESEARCH.md §6.8).
# ----------------------------------------------------------------------------


def _delta(logp_BT, ref_logp_BT):
  return _f32(logp_BT) - _f32(ref_logp_BT)


@KL_REGISTRY.register("k1")
def k1(logp_BT, ref_logp_BT):
  """k1 = Δ (unbiased, high variance, can be negative). Schulman, joschu.net/blog/kl-approx."""
  return _delta(logp_BT, ref_logp_BT)


@KL_REGISTRY.register("k2")
def k2(logp_BT, ref_logp_BT):
  """k2 = ½Δ² (verl "mse"); its expected gradient is the KL gradient. Schulman's note."""
  delta_BT = _delta(logp_BT, ref_logp_BT)
  return 0.5 * delta_BT * delta_BT


@KL_REGISTRY.register("k3")
def k3(logp_BT, ref_logp_BT):
  """k3 = exp(−Δ) + Δ − 1 >= 0 (verl "low_var_kl"), with x = clamp(−Δ, −20, 20) and the
  value clamped to [−10, 10] as in verl `kl_penalty`: k3 = clamp(expm1(x) − x, −10, 10).

  expm1 keeps the value >= 0 in float32 near Δ = 0 (exp(x) − x − 1 rounds below 0 there).
  Source: Schulman, http://joschu.net/blog/kl-approx.html.
  """
  x_BT = jnp.clip(-_delta(logp_BT, ref_logp_BT), -K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
  return jnp.clip(jnp.expm1(x_BT) - x_BT, -K3_VALUE_CLAMP, K3_VALUE_CLAMP)


@KL_REGISTRY.register("abs")
def abs_kl(logp_BT, ref_logp_BT):
  """abs = |Δ| (verl "abs")."""
  return jnp.abs(_delta(logp_BT, ref_logp_BT))


def _with_k2_gradient(value_BT, delta_BT):
  """Value of ``value``, gradient of k2 = ½Δ², i.e. Δ·∇Δ.

  Equals k2 + sg(value − k2) in value and gradient, written as
  sg(value) + sg(Δ)·(Δ − sg(Δ)): the second term is exactly 0 with gradient Δ, so there is
  no k2 − k2 cancellation (inf − inf = NaN once ½Δ² overflows float32).
  """
  return jax.lax.stop_gradient(value_BT) + jax.lax.stop_gradient(delta_BT) * (
    delta_BT - jax.lax.stop_gradient(delta_BT)
  )


@KL_REGISTRY.register("k1+")
def k1_plus(logp_BT, ref_logp_BT):
  """k1+ = k2 + sg(k1 − k2): k1's value with k2's (unbiased KL) gradient. verl `kl_penalty`
  "+" suffix: the expected gradient of k1 and k3 is not the expected gradient of KL."""
  return _with_k2_gradient(k1(logp_BT, ref_logp_BT), _delta(logp_BT, ref_logp_BT))


@KL_REGISTRY.register("k3+")
def k3_plus(logp_BT, ref_logp_BT):
  """k3+ = k2 + sg(k3 − k2): k3's value with k2's gradient Δ·∇ℓ. verl `kl_penalty`."""
  return _with_k2_gradient(k3(logp_BT, ref_logp_BT), _delta(logp_BT, ref_logp_BT))


# ----------------------------------------------------------------------------
# Entropy.
# ----------------------------------------------------------------------------


def token_entropy(logits_BTV):
  """H_{b,t} = −Σ_v p_v log p_v with log p = log_softmax(logits) in float32.

  Terms with p_v = 0 (−inf or hugely negative logits) count 0, in value and gradient (no
  0·(−inf) = NaN). Needs at least one finite logit per position.
  """
  logp_BTV = jax.nn.log_softmax(_f32(logits_BTV), axis=-1)
  p_BTV = jnp.exp(logp_BTV)
  safe_logp_BTV = jnp.where(p_BTV > 0, logp_BTV, 0.0)
  return -jnp.sum(p_BTV * safe_logp_BTV, axis=-1)
