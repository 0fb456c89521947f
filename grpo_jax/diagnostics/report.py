"""One periodic token-credit report on a fixed probe batch.

  probe = report.Probe.from_batch(rollout_batch)          # once, kept fixed
  before = state.params                                    # every N steps: snapshot,
  ... train steps ...                                      # update,
  metrics = report.token_credit_report(before, state.params, probe, model_cfg=..., ...)

Every key it emits is defined in `grpo_jax.infra.metrics.DEFINITIONS` (`metrics.definition`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.diagnostics import cancellation, coupling, drift, flips
from grpo_jax.models import logprobs
from grpo_jax.models import model as model_lib
from grpo_jax.rl import advantages, declared, losses


@flax.struct.dataclass
class Probe:
  """A fixed rollout batch the diagnostics re-evaluate: valid-token mask_BT, the loss mask
  (mask AND the token masks), token advantages and group ids of the step it came from."""

  prompt_tokens_BP: jax.Array
  prompt_mask_BP: jax.Array
  tokens_BT: jax.Array
  mask_BT: jax.Array
  loss_mask_BT: jax.Array
  adv_BT: jax.Array
  group_ids_B: jax.Array

  @classmethod
  def from_batch(cls, batch) -> Probe:
    """From an `spec.RolloutBatch` (its N rows are the probe's B rows)."""
    return cls(
      prompt_tokens_BP=batch.prompt_tokens_NP,
      prompt_mask_BP=batch.prompt_mask_NP,
      tokens_BT=batch.tokens_NT,
      mask_BT=batch.mask_NT,
      loss_mask_BT=batch.loss_mask_NT,
      adv_BT=batch.adv_NT,
      group_ids_B=batch.group_ids_N,
    )

  @property
  def inputs(self):
    return self.prompt_tokens_BP, self.prompt_mask_BP, self.tokens_BT, self.mask_BT


def _credit_arrays(
  params_before,
  params_after,
  inputs,
  loss_mask_BT,
  adv_BT,
  group_ids_B,
  rows_S,
  cols_S,
  valid_S,
  is_template_V,
  tau,
  lr,
  loss_hyper,
  *,
  model_cfg: model_lib.ModelConfig,
  aggregation: str,
  policy_loss: str | None,
  max_len: int | None,
  source_chunk: int | None,
  weak_eps: float,
  weak_quantile: float,
):
  """Every device array `token_credit_report` summarises, in one jittable function."""
  model_fn = model_lib.make_model_fn(model_cfg)
  tokens_BT, mask_BT = inputs[2], inputs[3]

  def logp(params):
    return logprobs.completion_logprobs(params, *inputs, model_fn=model_fn)[0]

  logp_after_BT, logp_before_BT = logp(params_after), logp(params_before)
  delta_BT = logp_after_BT - logp_before_BT
  adv_B = advantages.sequence_advantage(adv_BT, mask_BT)
  is_template_BT = is_template_V[tokens_BT]
  flip = flips.flip_table(delta_BT, mask_BT, adv_B, is_template_BT, tau=tau)
  w_BT = cancellation.aggregation_weights(
    aggregation, loss_mask_BT, group_ids_B, adv_BT, max_len=max_len
  )
  residual = cancellation.residual_arrays(
    tokens_BT, w_BT, adv_BT, loss_mask_BT, group_ids_B, vocab_size=model_cfg.vocab_size
  )
  coef_BT = cancellation.coefficients(adv_BT, w_BT, loss_mask_BT)
  clipped = None
  if policy_loss is not None:
    loss_coef_BT = loss_coefficients(
      logp_after_BT, logp_before_BT, adv_BT, loss_mask_BT, w_BT, loss_hyper, policy_loss
    )
    clipped = cancellation.residual_arrays(
      tokens_BT,
      loss_coef_BT,
      jnp.ones_like(adv_BT),
      loss_mask_BT,
      group_ids_B,
      vocab_size=model_cfg.vocab_size,
    )
  head = coupling.lm_head_probe(
    params_before, *inputs, coef_BT, rows_S, cols_S, cfg=model_cfg, lr=lr, source_chunk=source_chunk
  )
  measured_S = delta_BT[rows_S, cols_S]
  dW_DV = coupling.lm_head_weight(params_after, cfg=model_cfg) - coupling.lm_head_weight(
    params_before, cfg=model_cfg
  )
  head_pred_S = coupling.delta_from_head_update(head["h_SD"], head["probs_SV"], head["y_S"], dW_DV)
  weak_V = drift.weak_credit_ids(
    residual["residual"],
    residual["gross"],
    residual["count"],
    eps=weak_eps,
    freq_quantile=weak_quantile,
  )
  return {
    "flip": flip,
    "residual": residual,
    "clipped": clipped,
    "coupling": coupling.coupling_arrays(head, measured_S, valid_S, lr=lr),
    "measured_S": measured_S,
    "head_update_fit": coupling.fit_stats(head_pred_S, measured_S, valid_S),
    "tax": {
      "tax/learning_tax": drift.learning_tax(dW_DV, weak_V),
      "tax/learning_tax_sgd": drift.learning_tax(head["dW_DV"], weak_V),
      "tax/weak_ids": jnp.sum(weak_V),
    },
  }


def loss_coefficients(logp_BT, old_logp_BT, adv_BT, mask_BT, w_BT, loss_hyper, policy_loss):
  """c_{i,t} = −∂(Σ w·ℓ_tok)/∂ℓ_{i,t}: each token's credit as the policy loss applies it at
  log-probs ℓ (vs π_old's ℓ_old). For PPO's clipped surrogate c = w·A·ρ·1[not clipped]:
  a token whose clipped branch binds (or whose dual clip binds) gets 0. At ρ = 1 (nothing
  moved yet) c = w·A, the coefficient the plain residual uses. loss_hyper: {name: array},
  the policy losses' declared hyperparameters (`spec.StepHyper.loss`)."""
  fn = losses.REGISTRY.make(policy_loss)
  loss_hyper = declared.Values(loss_hyper)

  def total(lp_BT):
    return jnp.sum(w_BT * fn(lp_BT, old_logp_BT, adv_BT, mask_BT, loss_hyper)[0])

  return jnp.where(mask_BT, -jax.grad(total)(logp_BT), 0.0)


@functools.cache
def _compiled(model_cfg: model_lib.ModelConfig):
  """The report's jitted functions, built once per model config (a periodic hook must not
  recompile on every call): the credit arrays of one update, and the drift stats."""
  credit = jax.jit(
    functools.partial(_credit_arrays, model_cfg=model_cfg),
    static_argnames=(
      "aggregation",
      "policy_loss",
      "max_len",
      "source_chunk",
      "weak_eps",
      "weak_quantile",
    ),
  )
  model_fn = model_lib.make_model_fn(model_cfg)
  stats = jax.jit(
    functools.partial(drift.policy_stats, model_fn=model_fn), static_argnames="row_chunk"
  )
  return credit, stats


def token_credit_report(
  params_before,
  params_after,
  probe: Probe,
  *,
  model_cfg: model_lib.ModelConfig,
  aggregation: str = "token_mean",
  max_len: int | None = None,
  template_ids: Iterable[int] = (),
  tau: float = 1e-3,
  sgd_lr: float = 1.0,
  max_tokens: int = 256,
  seed: int = 0,
  init_params=None,
  weak_eps: float = 0.1,
  weak_quantile: float = 0.5,
  source_chunk: int | None = None,
  row_chunk: int | None = None,
  policy_loss: str | None = None,
  loss_hyper=None,
) -> dict[str, float]:
  """Flip table, cancellation residual, LM-head coupling fit, learning tax, entropy and KL
  for one update (params_before -> params_after) on the probe batch. Host; returns a
  flat metrics dict (keys defined in `grpo_jax.infra.metrics.DEFINITIONS`).

  Measured Δ = log π_after − log π_before on the probe tokens. The coupling fit compares
  it with (a) the SGD first-order prediction on the LM-head block, η = sgd_lr, c = w·A
  (`coupling/...`; the trainer's optimizer is not SGD, so read corr, not slope) and (b)
  the first-order effect of the actual change of the LM-head block
  (`coupling/head_update_fit/...`). Targets are `max_tokens` sampled valid tokens;
  source_chunk (`coupling.lm_head_probe`) and row_chunk (`drift.policy_stats`) bound
  memory for a real vocabulary. The KL metrics need init_params.

  With `policy_loss` (a `losses.REGISTRY` name) and its `loss_hyper`, the residual is also
  measured with the coefficients the loss applies at params_after (`loss_coefficients`:
  w·A·ρ, 0 where PPO's clipping binds): `cancel/clipped/...`. That is where clipping of a
  multi-step update (several mini-batches or epochs) breaks exchangeability; at one
  on-policy step ρ = 1 and it equals the plain residual.

  The device work is one jitted function per (model config, static options), compiled
  on the first call; later calls with the same shapes compile nothing.
  """
  credit, stats = _compiled(model_cfg)
  inputs = tuple(jnp.asarray(x) for x in probe.inputs)
  is_template_V = np.isin(np.arange(model_cfg.vocab_size), list(template_ids))
  rows_S, cols_S, valid_S = coupling.select_tokens(probe.mask_BT, max_tokens=max_tokens, seed=seed)
  got = jax.device_get(
    credit(
      params_before,
      params_after,
      inputs,
      jnp.asarray(probe.loss_mask_BT),
      jnp.asarray(probe.adv_BT, jnp.float32),
      jnp.asarray(probe.group_ids_B, jnp.int32),
      jnp.asarray(rows_S),
      jnp.asarray(cols_S),
      jnp.asarray(valid_S),
      jnp.asarray(is_template_V),
      jnp.float32(tau),
      jnp.float32(sgd_lr),
      loss_hyper,
      aggregation=aggregation,
      policy_loss=policy_loss,
      max_len=max_len,
      source_chunk=source_chunk,
      weak_eps=weak_eps,
      weak_quantile=weak_quantile,
    )
  )
  out = flips.flip_summary(*got["flip"])
  out.update(cancellation.residual_summary(got["residual"], category_V=is_template_V))
  if got["clipped"] is not None:
    out.update(
      cancellation.residual_summary(
        got["clipped"], category_V=is_template_V, prefix="cancel/clipped"
      )
    )
  out.update(coupling.coupling_summary(got["coupling"], valid_S, got["measured_S"]))
  out.update({f"coupling/head_update_fit/{k}": float(v) for k, v in got["head_update_fit"].items()})
  out.update({k: float(v) for k, v in got["tax"].items()})
  out["tax/weak_ids"] = int(out["tax/weak_ids"])
  if init_params is not None:
    kl = stats(params_after, init_params, *inputs, row_chunk=row_chunk)
    out.update({k: float(v) for k, v in jax.device_get(kl).items()})
  return out
