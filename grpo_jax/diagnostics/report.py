"""One periodic token-credit report on a fixed probe batch, and the definition of every
metric key the diagnostics emit.

  probe = report.Probe.from_batch(rollout_batch)          # once, kept fixed
  before = state.params                                    # every N steps: snapshot,
  ... train steps ...                                      # update,
  metrics = report.token_credit_report(before, state.params, probe, model_cfg=..., ...)

`DEFINITIONS` maps key patterns (`<x>` = one path segment, `<x...>` = one or more) to
definitions, in the style
of `grpo_jax.metrics.DEFINITIONS`; `definition(name)` resolves a concrete key.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

import flax
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import advantages, sampling
from grpo_jax import model as model_lib
from grpo_jax.diagnostics import cancellation, coupling, drift, flips


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
    """From an `rl.RolloutBatch` (its N rows are the probe's B rows)."""
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
  *,
  model_cfg: model_lib.ModelConfig,
  aggregation: str,
  max_len: int | None,
  source_chunk: int | None,
  weak_eps: float,
  weak_quantile: float,
):
  """Every device array `token_credit_report` summarises, in one jittable function."""
  model_fn = model_lib.make_model_fn(model_cfg)
  tokens_BT, mask_BT = inputs[2], inputs[3]

  def logp(params):
    return sampling.completion_logprobs(params, *inputs, model_fn=model_fn)[0]

  delta_BT = logp(params_after) - logp(params_before)
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
    "coupling": coupling.coupling_arrays(head, measured_S, valid_S, lr=lr),
    "measured_S": measured_S,
    "head_update_fit": coupling.fit_stats(head_pred_S, measured_S, valid_S),
    "tax": {
      "tax/learning_tax": drift.learning_tax(dW_DV, weak_V),
      "tax/learning_tax_sgd": drift.learning_tax(head["dW_DV"], weak_V),
      "tax/weak_ids": jnp.sum(weak_V),
    },
  }


@functools.cache
def _compiled(model_cfg: model_lib.ModelConfig):
  """The report's jitted functions, built once per model config (a periodic hook must not
  recompile on every call): the credit arrays of one update, and the drift stats."""
  credit = jax.jit(
    functools.partial(_credit_arrays, model_cfg=model_cfg),
    static_argnames=(
      "aggregation",
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
) -> dict[str, float]:
  """Flip table, cancellation residual, LM-head coupling fit, learning tax, entropy and KL
  for one update (params_before -> params_after) on the probe batch. Host; returns a
  flat metrics dict (keys in `DEFINITIONS`).

  Measured Δ = log π_after − log π_before on the probe tokens. The coupling fit compares
  it with (a) the SGD first-order prediction on the LM-head block, η = sgd_lr, c = w·A
  (`coupling/...`; the trainer's optimizer is not SGD, so read corr, not slope) and (b)
  the first-order effect of the actual change of the LM-head block
  (`coupling/head_update_fit/...`). Targets are `max_tokens` sampled valid tokens;
  source_chunk (`coupling.lm_head_probe`) and row_chunk (`drift.policy_stats`) bound
  memory for a real vocabulary. The KL metrics need init_params.

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
      aggregation=aggregation,
      max_len=max_len,
      source_chunk=source_chunk,
      weak_eps=weak_eps,
      weak_quantile=weak_quantile,
    )
  )
  out = flips.flip_summary(*got["flip"])
  out.update(cancellation.residual_summary(got["residual"], category_V=is_template_V))
  out.update(coupling.coupling_summary(got["coupling"], valid_S, got["measured_S"]))
  out.update({f"coupling/head_update_fit/{k}": float(v) for k, v in got["head_update_fit"].items()})
  out.update({k: float(v) for k, v in got["tax"].items()})
  out["tax/weak_ids"] = int(out["tax/weak_ids"])
  if init_params is not None:
    kl = stats(params_after, init_params, *inputs, row_chunk=row_chunk)
    out.update({k: float(v) for k, v in jax.device_get(kl).items()})
  return out


# ----------------------------------------------------------------------------
# Definitions.
# ----------------------------------------------------------------------------

DEFINITIONS = {
  # flips.flip_report (pol: pos ā>0 | neg ā<0 | all; cat: reasoning | template | all).
  "flip/<pol>/<cat>/boosted": "Fraction of the (polarity, category) probe tokens with Δlog π > τ.",
  "flip/<pol>/<cat>/suppressed": "Fraction of the (polarity, category) probe tokens with Δlog π < −τ.",
  "flip/<pol>/<cat>/unchanged": "Fraction of the (polarity, category) probe tokens with |Δlog π| <= τ.",
  "flip/<pol>/<cat>/count": "Number of valid probe tokens in the (polarity, category) cell.",
  "flip/<pol>/<cat>/abs_delta_share": "Σ|Δlog π| over the category / Σ|Δlog π| over all tokens of the polarity.",
  # coupling.coupling_report.
  "coupling/fit/<stat>": "Fit of the LM-head SGD first-order prediction η Σ_n c_n K_sn to the measured Δlog π "
  "(corr, slope and intercept of measured on predicted, r2, rel_err = ‖pred − meas‖/‖meas‖).",
  "coupling/self_fit/<stat>": "The same fit for the self term η c_s K_ss alone.",
  "coupling/head_update_fit/<stat>": "The same fit for the first-order effect of the actual LM-head change δW.",
  "coupling/self_abs_mean": "Mean over target tokens of |η c_s K_ss|.",
  "coupling/coupling_abs_mean": "Mean over target tokens of |η Σ_{n≠s} c_n K_sn|.",
  "coupling/self_share": "Σ|self| / (Σ|self| + Σ|coupling|) over target tokens.",
  "coupling/self_sign_agree": "Fraction of target tokens whose measured Δ has the sign of their self term.",
  "coupling/<kind>/abs_share": "Share of Σ_{s≠n}|η c_n K_sn| from pairs of the kind (same_id | diff_id).",
  "coupling/<kind>/mean_k": "Mean LM-head kernel K_sn over non-self pairs of the kind.",
  "coupling/<kind>/pairs": "Number of non-self (target, source) pairs of the kind.",
  "coupling/<kind>/<tbin>/<sbin>/abs_share": "Share of coupling mass from pairs of the kind with target π(y) in "
  "tbin and source π(y) in sbin.",
  "coupling/<kind>/<tbin>/<sbin>/mean_k": "Mean K_sn over those pairs.",
  # cancellation.residual_report (also cancel/<mode>/... from compare_aggregations).
  "cancel/net": "Σ_v r_v = Σ_{i,t} w·A over loss tokens.",
  "cancel/abs_residual": "Σ_v |r_v|, r_v = Σ_{i,t: o=v} w·A: credit left after batch-level cancellation.",
  "cancel/gross": "Σ_v Σ_{o=v} |w·A|: the credit before cancellation.",
  "cancel/residual_ratio": "cancel/abs_residual / cancel/gross.",
  "cancel/group_abs_residual": "Σ_g Σ_v |r_{g,v}|: credit left after within-group cancellation.",
  "cancel/group_residual_ratio": "cancel/group_abs_residual / cancel/gross.",
  "cancel/top<j>/id": "Token id with the j-th largest |r_v| (j = 0 largest).",
  "cancel/top<j>/residual": "Its residual r_v.",
  "cancel/top<j>/count": "Its number of occurrences among loss tokens.",
  "cancel/band<b>/abs_residual_share": "Σ|r_v| over frequency band b (0 = most frequent ids) / Σ_v |r_v|.",
  "cancel/band<b>/residual_ratio": "Σ|r_v| / Σ gross over the ids of band b.",
  "cancel/band<b>/num_ids": "Number of token ids in band b.",
  "cancel/band<b>/min_count": "Smallest occurrence count in band b.",
  "cancel/band<b>/max_count": "Largest occurrence count in band b.",
  "cancel/<cat>/abs_residual_share": "Σ|r_v| over the ids of the category / Σ_v |r_v|.",
  "cancel/<cat>/residual_ratio": "Σ|r_v| / Σ gross over the ids of the category.",
  # drift.
  "drift/solution_logp_token": "Mean log π per token of the fixed reference solutions.",
  "drift/solution_logp_seq": "Mean over reference solutions of log π(o | q).",
  "drift/entropy": "Mean entropy of π_θ over valid probe tokens.",
  "drift/kl_init": "Mean exact KL(π_θ ‖ π_init) over the vocabulary at the probe contexts.",
  "drift/kl_init_k3": "Mean k3 estimate of KL(π_θ ‖ π_init) at the probe tokens (biased: not π_θ's samples).",
  "drift/length_slope": "Least-squares slope of response length per iteration over the trend window.",
  "tax/learning_tax": "Σ_{v weak} ‖δW[:, v]‖² / ‖δW‖² of the actual LM-head change (weak: frequent ids "
  "whose credit cancels, |r_v| <= ε·gross_v).",
  "tax/learning_tax_sgd": "The same for the LM-head SGD step η Σ c h (e_y − π)^T.",
  "tax/weak_ids": "Number of weak-credit token ids.",
  # rank / sparsity.
  "rank/<matrix...>/<metric>": "entropy_rank, stable_rank, energy_rank_<q>, sigma_max, fro of a named matrix "
  "(the name may hold '/', e.g. a parameter path).",
  "sparsity/hoyer": "Hoyer sparsity (√n − ‖g‖₁/‖g‖₂)/(√n − 1) of the gradient.",
  "sparsity/near_zero": "Fraction of gradient coordinates with |g| <= ε·max|g|.",
  "sparsity/zero_var_groups": "Fraction of groups whose rewards are all equal.",
  "sparsity/minibatch_grad_var": "tr Cov of the mean per-rollout gradient (rank subset, projected) "
  "over mini-batches of half the probe's rollouts drawn without replacement (exact: "
  "(U − m)/(m(U − 1)) · mean ‖g_i − ḡ‖²).",
  "sparsity/minibatch_grad_snr": "‖ḡ‖² / sparsity/minibatch_grad_var: the half-size mini-batch "
  "gradient's signal-to-noise ratio on the probe.",
  # value.value_by_flip.
  "value/<pol>/<state>/value": "Mean MC value V(q, o_<=t) at tokens of the polarity and flip state.",
  "value/<pol>/<state>/gain": "Mean V(q, o_<=t) − V(q, o_<t) at those tokens.",
  "value/<pol>/<state>/count": "Number of those tokens.",
  "value/<pol>/value_gap": "Mean value at boosted − at suppressed tokens.",
  "value/<pol>/gain_gap": "Mean gain at boosted − at suppressed tokens.",
}


def _pattern(name: str) -> re.Pattern:
  parts = re.split(r"(<[^>]+>)", name)
  body = "".join(
    (".+" if p.endswith("...>") else "[^/]+") if p.startswith("<") else re.escape(p) for p in parts
  )
  return re.compile(body)


_PATTERNS = [(_pattern(k), k) for k in DEFINITIONS]


def definition(name: str) -> str:
  """The definition of a concrete key; "cancel/<mode>/..." rows of
  `cancellation.compare_aggregations` resolve to their "cancel/..." pattern."""
  candidates = [name]
  m = re.match(r"^cancel/([^/]+)/(.+)$", name)
  if m:
    candidates.append(f"cancel/{m.group(2)}")
  for cand in candidates:
    for pat, key in _PATTERNS:
      if pat.fullmatch(cand):
        return DEFINITIONS[key]
  raise KeyError(
    f"Diagnostics metric {name!r} has no definition in diagnostics.report.DEFINITIONS."
  )
