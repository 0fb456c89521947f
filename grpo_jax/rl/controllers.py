"""Advantage controllers: update FADE's (λ_S, λ_F, γ) between steps from running metrics.

A controller is `fn(hyper: dict, state: dict, metrics: dict, **options) -> (hyper, state)`,
registered by name in `REGISTRY`; hyper is {name: f32}, every advantage estimator's
declared hyperparameter (config.rl.advantage_hyper). It returns arrays of the same shapes
and dtypes, so the jitted prepare step never recompiles, and its state is a dict of
float32 scalars that checkpoints with the run. `init_state()` gives the starting state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from grpo_jax.infra import registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
  """check: fn(**options) that raises on bad option values (`REGISTRY.make`), or None.
  reads_old_logp: it steers by π_old's entropy, so rl.recompute_old_logp=False is refused."""

  check: Callable | None = None
  reads_old_logp: bool = True


REGISTRY = registry.Registry("advantage controller", traits=Traits)


def _check_fade_entropy(*, entropy_high=1.0, entropy_low=0.2, max_drop=0.05, ema=0.9, **_):
  if not entropy_high > entropy_low:
    raise ValueError(
      f"fade_entropy needs entropy_high > entropy_low, got {entropy_high} <= {entropy_low}."
    )
  if max_drop <= 0 or not 0 <= ema < 1:
    raise ValueError("fade_entropy needs max_drop > 0 and ema in [0, 1).")


def init_state() -> dict:
  """Running entropy (EMA), its per-step slope (EMA) and a started flag."""
  z = jnp.zeros((), jnp.float32)
  return {"entropy": z, "slope": z, "started": z}


@REGISTRY.register("none", reads_old_logp=False)
def none(hyper: dict, state: dict, metrics: dict):
  """Leaves the hyperparameters unchanged."""
  del metrics
  return hyper, state


@REGISTRY.register("fade_entropy", check=_check_fade_entropy)
def fade_entropy(
  hyper: dict,
  state: dict,
  metrics: dict,
  *,
  entropy_high: float = 1.0,
  entropy_low: float = 0.2,
  max_drop: float = 0.05,
  pass_high: float = 0.9,
  hard_gamma: float = 1.0,
  max_suppression: float = 2.0,
  ema: float = 0.9,
):
  """Exploration score φ ∈ [0, 1] from the running entropy H̄, its slope s̄ and pass rate p:

    φ = clip((H̄ - H_low)/(H_high - H_low), 0, 1) · clip(1 + s̄/max_drop, 0, 1)
        · 1(p < pass_high),
    λ_S = 1,  λ_F = 1 + (max_suppression - 1)(1 - φ),  γ = hard_gamma · φ.

  Exploring (healthy, slowly changing entropy) keeps the sign balanced and the focus on
  hard prompts; exploiting (low or fast-falling entropy, saturated pass rate) moves to
  negative-dominant ("suppression") updates, which raise entropy, and a medium focus.
  H̄ and s̄ are EMAs (factor `ema`) of metrics["rollout_entropy"] and its step change;
  p = metrics["pass_rate"].

  Source: a reconstruction [INF] of FADE's schedule, "Don't Let Gains FADE" (arXiv
  2607.01490): "exploration favours balance and hard focus; exploitation favours
  suppression and medium focus". The paper's exact schedule is not public.
  """
  h = jnp.asarray(metrics["rollout_entropy"], jnp.float32)
  p = jnp.asarray(metrics["pass_rate"], jnp.float32)
  started = state["started"] > 0
  h_bar = jnp.where(started, ema * state["entropy"] + (1 - ema) * h, h)
  slope = jnp.where(started, ema * state["slope"] + (1 - ema) * (h_bar - state["entropy"]), 0.0)
  level = jnp.clip((h_bar - entropy_low) / (entropy_high - entropy_low), 0.0, 1.0)
  phi = level * jnp.clip(1.0 + slope / max_drop, 0.0, 1.0) * (p < pass_high)
  hyper = {
    **hyper,
    "lambda_s": jnp.ones_like(hyper["lambda_s"]),
    "lambda_f": (1.0 + (max_suppression - 1.0) * (1.0 - phi)).astype(jnp.float32),
    "focal_gamma": (hard_gamma * phi).astype(jnp.float32),
  }
  state = {"entropy": h_bar, "slope": slope, "started": jnp.ones((), jnp.float32)}
  return hyper, state
