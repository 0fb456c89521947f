"""Advantage estimators: sequence rewards r[B] and group ids -> token advantages A[B, T].

Every estimator has the signature `fn(inputs: AdvantageInputs, hyper: declared.Values,
**static_options) -> A_BT` and is registered by its config name in `REGISTRY`. Outputs
are token-level so token-level estimators plug in the same way; sequence estimators
broadcast A_i over the row's completion mask (A = 0 off the mask). All reductions are
segment sums over `group_ids` (see groups.py): no Python loops over groups.

Notation: r_i the reward of row i, g(i) its group, n_g the group size, r̄_g the group
mean, σ_g the group std (ddof 1 if `unbiased_std` else 0), m_{i,t} the completion mask.

Singleton rule: a group with one row has no baseline from its peers, so GRPO, Dr. GRPO,
RLOO, positive-only and the group optimal baseline give it advantage 0 (r_i - r̄ = 0).
verl instead gives a singleton (r - 0)/1 = r; use a batch-level estimator for G = 1
(`batch_level_names()`: its `Traits.batch_level`).

Excluded rows: rows with valid_B = False (e.g. unscorable rewards, `spec.RLConfig.unscorable`)
take part in no statistic (group or batch means, stds, pass rates, whitening) and get
A = 0; every estimator then equals itself on the batch without those rows (tested).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable

import flax
import jax
import jax.numpy as jnp

from grpo_jax.infra import registry
from grpo_jax.rl import declared, groups, ibpo

# An array hyperparameter an estimator declares where it is registered
# (`@REGISTRY.register(name, hyper={"tau": Hyper(1.0, low=0.0)})`): set by
# config.rl.advantage_hyper.<name>, checked when the config is built, and read by the
# estimator as `hyper.<name>` (float32). Shipped and user estimators declare alike
# (`declared`); the shipped declarations are below, one per name.
Hyper = declared.Hyper

EPS = Hyper(1e-6, low=0.0, doc="ε added to std denominators")
GAMMA = Hyper(1.0, low=0.0, high=1.0, doc="γ, REINFORCE++'s discount")
LAMBDA_S = Hyper(1.0, low=0.0, doc="λ_S, fade's weight of successes")
LAMBDA_F = Hyper(1.0, low=0.0, doc="λ_F, fade's weight of failures")
STD_POWER = Hyper(0.5, low=0.0, doc="α, fade's power of 1/(p(1-p) + ε)")
FOCAL_GAMMA = Hyper(0.0, doc="γ of fade's focal weight (1-p)^γ")
IBPO_LAMBDA = Hyper(1.0, low=0.0, doc="λ of ibpo's prefix baseline; 0: the leave-one-out mean")
IBPO_TAU = Hyper(
  1.0,
  low=0.0,
  high=1.0,
  valid=lambda tau: tau > 0,
  rule="in (0, 1] (1: keep every counterfactual)",
  doc="τ of the counterfactuals' full-rewrite filter",
)
IBPO_IS_CAP = Hyper(
  2.0,
  low=0.0,
  valid=lambda cap: cap > 0,
  rule="> 0",
  doc="c of perturbed counterfactuals' importance weights min(ratio, c)",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Traits:
  """What the trainer asks of an estimator (`REGISTRY.traits(name)`), declared where it is
  registered; no caller compares estimator names.

  needs_old_logp: it reads π_old's distribution (the optimal baselines' score norms), so
    rl.recompute_old_logp=False is refused.
  batch_level: it gives non-zero advantages with one rollout per prompt (its baseline is
    not the group's): True, the options that make it so ({"scope": "batch"}), or a
    function of its options (defaults filled in) whose docstring says which.
  metrics: fn(inputs, hyper, **options) -> {name: scalar}, its own metrics (logged beside
    the others), or None.
  check: fn(**options) that raises on bad option values before anything is traced, or None.
  reads_counterfactuals: counterfactual rows (config.counterfactual) inform it even when
    they are not trained on.
  folds_kl: with rl.kl_in="reward" it subtracts β·kl_t per token itself (`AdvantageInputs.
    kl_BT`); any other estimator sees the sequence reward r_i − β·Σ_t kl_t instead.
  reads_outcome: it splits rows by the verifier's verdict (`AdvantageInputs.success_B`,
    correct vs failed), which a config.rewards mixture (a weighted sum of scores) lacks.
  needs_teacher: it reads a teacher's per-token log-probs (`AdvantageInputs.teacher_logp_BT`),
    so the run loads config.teacher and the trainer computes them (`distill`).
  hyper: {name: Hyper}, the array hyperparameters it declares (read as `hyper.<name>`).
  """

  needs_old_logp: bool = False
  batch_level: bool | dict | Callable = False
  metrics: Callable | None = None
  check: Callable | None = None
  reads_counterfactuals: bool = False
  folds_kl: bool = False
  reads_outcome: bool = False
  needs_teacher: bool = False
  hyper: dict = dataclasses.field(default_factory=dict)


def _check_scope(name: str, scope) -> None:
  if scope not in ("group", "batch"):
    raise ValueError(f"{name} scope must be 'group' or 'batch', got {scope!r}.")


def _check_ibpo(*, shrink=0.0, scale="std", state="prefix", context=0) -> None:
  if not (isinstance(shrink, int | float) and 0 <= shrink < float("inf")):
    raise ValueError(f"ibpo shrink must be a finite number >= 0, got {shrink}.")
  if scale not in ibpo.SCALES:
    raise ValueError(f"ibpo scale must be one of {', '.join(ibpo.SCALES)}, got {scale!r}.")
  if state not in ibpo.STATES:
    raise ValueError(f"ibpo state must be one of {', '.join(ibpo.STATES)}, got {state!r}.")
  if state != "prefix" and not (isinstance(context, int) and 1 <= context <= 64):
    raise ValueError(
      f"ibpo state={state!r} reads the last `context` tokens: an integer in [1, 64], got "
      f"{context!r}."
    )
  if state == "prefix" and context:
    raise ValueError(
      f"ibpo context={context!r} is for state 'window' or 'span'; the prefix state reads "
      "every token before t."
    )


def _scope_check(name: str):
  return lambda *, scope="group": _check_scope(name, scope)


REGISTRY = registry.Registry("advantage estimator", traits=Traits)


@flax.struct.dataclass
class AdvantageInputs:
  """rewards_B f32, group_ids_B int32, mask_BT bool (completion tokens); kl_BT f32 is the
  per-token KL estimate to the reference (REINFORCE++ folds -β·kl into the reward);
  score_sq_B f32 is ‖∇_θ log π(o_i|q)‖² per sequence (for the optimal baseline)."""

  rewards_B: jax.Array
  group_ids_B: jax.Array
  mask_BT: jax.Array
  kl_BT: jax.Array | None = None
  score_sq_B: jax.Array | None = None
  valid_B: jax.Array | None = None  # bool; None: every row takes part.
  # bool: the verifier's verdict (correctness reward c_i > 0, before any shaping); None:
  # r_i > 0. Estimators that split rows into successes and failures (fade) use it, so a
  # format bonus never turns a wrong answer into a success.
  success_B: jax.Array | None = None
  # f32 [B, T]: per-token ‖∇_z log π(o_t)‖² = 1 − 2π(o_t) + Σ_v π_v² (logit-space score
  # norm; for the per-token optimal baseline).
  score_sq_BT: jax.Array | None = None
  # int32 [B, T]: the completion tokens (for estimators that compare trajectories: ibpo).
  tokens_BT: jax.Array | None = None
  # bool: counterfactual rows that inform ibpo's trie (its baseline) but are not trained
  # and take no part in n_g; f32: every row's weight in the trie (importance
  # weights of rows sampled under a perturbed prompt). None: no such rows; weight 1.
  context_B: jax.Array | None = None
  weights_B: jax.Array | None = None
  # int32: the depth from which each row's tokens are its own draw, so it counts in ibpo's
  # trie only there (a branch's cut c; 0 for samples). None: 0 everywhere.
  start_B: jax.Array | None = None
  # f32 [B, T]: log π_old(o_t) (the policy that sampled, temperature 1) and log π_T(o_t),
  # a teacher's log-prob of the same token in the same context (config.teacher); 0 off the
  # mask. None: not computed (only estimators with Traits.needs_teacher read them).
  old_logp_BT: jax.Array | None = None
  teacher_logp_BT: jax.Array | None = None
  # f32 scalar: β of a KL folded into the reward (rl.kl_in = "reward"), for an estimator
  # that folds it itself (`Traits.folds_kl`); None: 0.
  kl_coef: jax.Array | None = None

  @property
  def success(self) -> jax.Array:
    """success_B, or r_i > 0 when not given."""
    return self.rewards_B > 0 if self.success_B is None else self.success_B

  @property
  def valid(self) -> jax.Array:
    """valid_B, all True when not given."""
    return jnp.ones(self.rewards_B.shape, bool) if self.valid_B is None else self.valid_B

  @property
  def token_mask(self) -> jax.Array:
    """mask_BT on valid rows only: where the advantage may be non-zero."""
    return self.mask_BT & self.valid[:, None]


def declared_hyper() -> dict[str, Hyper]:
  """Every registered estimator's declared hyperparameters, by name (config.rl's
  advantage_hyper section lists them with their defaults)."""
  return declared.collect(REGISTRY)


def declared_values(given) -> dict[str, float]:
  """Every estimator's declared hyperparameters: config.rl.advantage_hyper's values
  (checked against each declaration), else the defaults."""
  return declared.values(REGISTRY, given, section="config.rl.advantage_hyper")


def hyper_values(**given) -> declared.Values:
  """The arrays an estimator reads (`declared.Values`), from keyword values with the
  declared defaults elsewhere: what the trainer builds from config.rl.advantage_hyper.

      adv_BT = advantages.grpo(inputs, advantages.hyper_values(eps=1e-4))
  """
  return declared.Values(declared.arrays(declared_values(given)))


def to_tokens(a_B, mask_BT):
  """A_BT = a_B on every token of its row's mask, 0 elsewhere (float32): a sequence-level
  advantage broadcast to the tokens, as an estimator returns it (public: a user's estimator
  that computes per-row advantages ends with `advantages.to_tokens(a_B, inputs.token_mask)`)."""
  return jnp.where(mask_BT, a_B[:, None], 0.0).astype(jnp.float32)


def _batch_mean(x_B, valid_B):
  return jnp.sum(jnp.where(valid_B, x_B, 0.0)) / jnp.maximum(jnp.sum(valid_B), 1)


def _safe_div(num, den):
  """num/den, and 0 where den == 0 (eps = 0 and a zero std: then num is 0 too)."""
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def _masked_whiten(x_BT, mask_BT, eps):
  """(x - μ)/(σ + eps) with μ, σ (ddof 1) over the valid tokens of the whole batch."""
  m_BT = mask_BT.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m_BT), 1.0)
  mu = jnp.sum(x_BT * m_BT) / n
  var = jnp.sum(jnp.square(x_BT - mu) * m_BT) / jnp.maximum(n - 1.0, 1.0)
  return jnp.where(mask_BT, _safe_div(x_BT - mu, jnp.sqrt(var) + eps), 0.0)


@REGISTRY.register("grpo", hyper={"eps": EPS})
def grpo(inputs: AdvantageInputs, hyper: declared.Values, *, unbiased_std: bool = True):
  """A_i = (r_i - r̄_g) / (σ_g + eps); σ_g with ddof 1 (unbiased_std) or 0.

  A group whose rewards are all equal gets 0; a singleton gets 0. Source: DeepSeekMath
  (arXiv 2402.03300) outcome supervision; verl `compute_grpo_outcome_advantage` (ddof 1,
  eps 1e-6).
  """
  r_B, g_B, v_B = inputs.rewards_B.astype(jnp.float32), inputs.group_ids_B, inputs.valid
  std_B = groups.group_std(r_B, g_B, unbiased=unbiased_std, valid_B=v_B)
  dev_B = r_B - groups.group_mean(r_B, g_B, v_B)
  return to_tokens(_safe_div(dev_B, std_B + hyper.eps), inputs.token_mask)


@REGISTRY.register("dr_grpo")
def dr_grpo(inputs: AdvantageInputs, hyper: declared.Values):
  """A_i = r_i - r̄_g (no std). Source: Dr. GRPO, "Understanding R1-Zero-Like Training"
  (arXiv 2503.20783), removing the difficulty bias."""
  del hyper
  r_B, g_B = inputs.rewards_B.astype(jnp.float32), inputs.group_ids_B
  return to_tokens(r_B - groups.group_mean(r_B, g_B, inputs.valid), inputs.token_mask)


@REGISTRY.register("rloo")
def rloo(inputs: AdvantageInputs, hyper: declared.Values):
  """A_i = r_i - (1/(n_g-1)) Σ_{j≠i} r_j = n_g/(n_g-1) · (r_i - r̄_g); 0 for a singleton.

  Source: RLOO, "Back to Basics" (arXiv 2402.14740); verl `compute_rloo_outcome_advantage`.
  """
  del hyper
  r_B, g_B, v_B = inputs.rewards_B.astype(jnp.float32), inputs.group_ids_B, inputs.valid
  n_B = groups.group_size(g_B, valid_B=v_B)
  scale_B = jnp.where(n_B > 1, n_B / jnp.maximum(n_B - 1.0, 1.0), 0.0)
  return to_tokens(scale_B * (r_B - groups.group_mean(r_B, g_B, v_B)), inputs.token_mask)


@REGISTRY.register(
  "reinforce_pp", batch_level=True, folds_kl=True, hyper={"eps": EPS, "gamma": GAMMA}
)
def reinforce_pp(inputs: AdvantageInputs, hyper: declared.Values):
  """Token rewards r_t = 1[t = last]·r_i - β·kl_t, return G_t = Σ_{s>=t} γ^{s-t} r_s over the
  row's valid tokens (s, t count valid tokens only: masked gaps are skipped), then global whitening A = (G - μ)/(σ + eps) over all
  valid tokens of the batch (ddof 1). No group baseline.

  Source: REINFORCE++ (arXiv 2501.03262); verl `compute_reinforce_plus_plus_outcome_advantage`
  (verl whitens with rsqrt(var + 1e-8)).
  """
  mask_BT = inputs.token_mask
  m_BT = mask_BT.astype(jnp.float32)
  # The last valid token of each row (masks may have gaps, e.g. masked observations).
  last_BT = mask_BT & (jnp.cumsum(m_BT[:, ::-1], axis=1)[:, ::-1] == 1.0)
  kl_BT = jnp.zeros_like(m_BT) if inputs.kl_BT is None else inputs.kl_BT.astype(jnp.float32)
  beta = 0.0 if inputs.kl_coef is None else inputs.kl_coef
  rew_BT = (jnp.where(last_BT, inputs.rewards_B[:, None], 0.0) - beta * kl_BT) * m_BT

  def back(carry_B, r_m_B):
    r_B, m_B = r_m_B  # Masked positions (gaps) pass the return through undiscounted.
    g_B = jnp.where(m_B, r_B + hyper.gamma * carry_B, carry_B)
    return g_B, g_B

  _, ret_TB = jax.lax.scan(
    back, jnp.zeros_like(inputs.rewards_B, jnp.float32), (rew_BT.T, mask_BT.T), reverse=True
  )
  return _masked_whiten(ret_TB.T * m_BT, mask_BT, hyper.eps)


@REGISTRY.register("reinforce_pp_baseline", hyper={"eps": EPS})
def reinforce_pp_baseline(inputs: AdvantageInputs, hyper: declared.Values):
  """A = whiten(r_i - r̄_g) over all valid tokens of the batch (μ, σ with ddof 1).

  Source: REINFORCE++-baseline (arXiv 2501.03262); verl
  `compute_reinforce_plus_plus_baseline_outcome_advantage`.
  """
  centred_BT = dr_grpo(inputs, hyper)
  return _masked_whiten(centred_BT, inputs.token_mask, hyper.eps)


@REGISTRY.register("batch_mean", batch_level=True)
def batch_mean(inputs: AdvantageInputs, hyper: declared.Values):
  """A_i = r_i - (1/B) Σ_j r_j: a batch baseline for single-rollout (G = 1) training.

  Source: "Rethinking Groups in Critic-Free RLVR" (arXiv 2606.17250), batch-level advantages.
  """
  del hyper
  r_B = inputs.rewards_B.astype(jnp.float32)
  return to_tokens(r_B - _batch_mean(r_B, inputs.valid), inputs.token_mask)


@REGISTRY.register("batch_mean_std", batch_level=True, hyper={"eps": EPS})
def batch_mean_std(inputs: AdvantageInputs, hyper: declared.Values, *, unbiased_std: bool = True):
  """A_i = (r_i - μ_B)/(σ_B + eps) over the rows of the batch (σ with ddof 1 or 0).

  Source: batch-level normalisation as in REINFORCE++ (arXiv 2501.03262) at sequence level;
  "Rethinking Groups in Critic-Free RLVR" (arXiv 2606.17250).
  """
  r_B, v_B = inputs.rewards_B.astype(jnp.float32), inputs.valid
  # Shifted: exactly 0 (so σ = 0, A = 0) when all rewards are equal.
  s_B = r_B - jnp.max(jnp.where(v_B, r_B, -jnp.inf), initial=-jnp.inf)
  s_B = jnp.where(v_B, s_B, 0.0)
  n = jnp.sum(v_B).astype(jnp.float32)
  dev_B = jnp.where(v_B, s_B - _batch_mean(s_B, v_B), 0.0)
  ddof = 1.0 if unbiased_std else 0.0
  std = jnp.sqrt(jnp.sum(dev_B * dev_B) / jnp.maximum(n - ddof, 1.0))
  return to_tokens(_safe_div(dev_B, std + hyper.eps), inputs.token_mask)


@REGISTRY.register("positive_only", hyper={"eps": EPS})
def positive_only(inputs: AdvantageInputs, hyper: declared.Values, *, unbiased_std: bool = True):
  """A_i = max(GRPO_i, 0): negatives contribute nothing.

  Source: the positive-only arm of "The Cancellation Hypothesis in Critic-Free RL"
  (arXiv 2605.08666).
  """
  return jnp.maximum(grpo(inputs, hyper, unbiased_std=unbiased_std), 0.0)


@REGISTRY.register(
  "optimal_baseline",
  needs_old_logp=True,
  batch_level={"scope": "batch"},
  check=_scope_check("optimal_baseline"),
)
def optimal_baseline(inputs: AdvantageInputs, hyper: declared.Values, *, scope: str = "group"):
  """A_i = r_i - b*, b* = Σ_j s_j r_j / Σ_j s_j over the group (or batch), s_j = ‖∇log π(o_j)‖².

  The variance-minimising constant baseline for the score-function estimator; it equals
  the group mean when s is constant. s comes from the caller (`score_sq_B`); b* falls back
  to the plain mean where Σ s = 0. Source: Weaver & Tao, "The optimal reward baseline for
  gradient-based RL" (UAI 2001); arXiv 2606.29238 §optimal baselines.
  """
  del hyper
  _check_scope("optimal_baseline", scope)
  r_B, v_B = inputs.rewards_B.astype(jnp.float32), inputs.valid
  s_B = jnp.ones_like(r_B) if inputs.score_sq_B is None else inputs.score_sq_B.astype(jnp.float32)
  s_B = jnp.where(v_B, s_B, 0.0)
  if scope == "group":
    g_B = inputs.group_ids_B
    num_B, den_B = groups.group_sum(s_B * r_B, g_B, v_B), groups.group_sum(s_B, g_B, v_B)
    mean_B = groups.group_mean(r_B, g_B, v_B)
  else:
    num_B = jnp.full_like(r_B, jnp.sum(jnp.where(v_B, s_B * r_B, 0.0)))
    den_B = jnp.full_like(r_B, jnp.sum(s_B))
    mean_B = jnp.full_like(r_B, _batch_mean(r_B, v_B))
  b_B = jnp.where(den_B > 0, num_B / jnp.where(den_B > 0, den_B, 1.0), mean_B)
  return to_tokens(r_B - b_B, inputs.token_mask)


@REGISTRY.register(
  "optimal_token_baseline",
  needs_old_logp=True,
  batch_level={"scope": "batch"},
  check=_scope_check("optimal_token_baseline"),
)
def optimal_token_baseline(
  inputs: AdvantageInputs, hyper: declared.Values, *, scope: str = "group"
):
  """A_{i,t} = r_i − B_{g(i),t}, the per-token optimal baseline of each group (or batch):

    B_{g,t} = Σ_{j∈g} m_{j,t} W_{j,t} r_j / Σ_{j∈g} m_{j,t} W_{j,t},
    W_{j,t} = Σ_{s≤t} m_{j,s} ‖e_{o_s} − π_s‖²,   ‖e_y − π‖² = 1 − 2π(y) + Σ_v π_v²,

  over the rows j of the group with a token at t. With a terminal reward the return from
  t is r_j, and W_{j,t} is the squared logit-space score norm of the prefix o_{j,≤t}: the
  Weaver–Tao weighting E[‖∇ log π‖² R] / E[‖∇ log π‖²] applied per position, with each
  token's score norm measured at the logits (where ∇_z log π(y) = e_y − π). Where
  Σ m W = 0 (every prefix certain) B falls back to the mean reward of the rows with a
  token at t. `score_sq_BT` comes from π_old (rl computes it); without it every token's
  norm is taken as 1, so W_{j,t} = t + 1 and B_t is the mean reward of the rows still
  running at t. Like verl's OTB, B includes the row's own reward (so it is not an
  unbiased baseline), and where one row of a group is left running, B = its reward and
  its remaining tokens get A = 0.

  Source: Weaver & Tao, "The optimal reward baseline for gradient-based RL" (UAI 2001);
  the per-token form is verl's Optimal Token Baseline (volcengine/verl
  `core_algos.compute_optimal_token_baseline_advantage`), RESEARCH.md §4.2.
  """
  del hyper
  _check_scope("optimal_token_baseline", scope)
  m_BT = inputs.token_mask.astype(jnp.float32)
  r_B1 = inputs.rewards_B.astype(jnp.float32)[:, None]
  if inputs.score_sq_BT is None:
    s_BT = jnp.ones_like(m_BT)
  else:
    s_BT = inputs.score_sq_BT.astype(jnp.float32)
  w_BT = jnp.cumsum(s_BT * m_BT, axis=1) * m_BT
  B = m_BT.shape[0]
  seg_B = inputs.group_ids_B if scope == "group" else jnp.zeros((B,), jnp.int32)
  total = lambda x_BT: jax.ops.segment_sum(x_BT, seg_B, num_segments=B)[seg_B]
  num_BT, den_BT = total(w_BT * r_B1), total(w_BT)
  mean_BT = _safe_div(total(m_BT * r_B1), total(m_BT))
  b_BT = jnp.where(den_BT > 0, _safe_div(num_BT, den_BT), mean_BT)
  return jnp.where(inputs.token_mask, r_B1 - b_BT, 0.0)


def pass_rate(success_B, group_ids_B, valid_B=None):
  """p_g = (1/n_g) Σ_{i∈g} 1(success_i) over the group's (valid) rows, per row. success_B:
  bool, or rewards (success = r > 0)."""
  s_B = success_B if success_B.dtype == jnp.bool_ else success_B > 0
  return groups.group_mean(s_B.astype(jnp.float32), group_ids_B, valid_B)


_FADE_HYPER = {
  "eps": EPS,
  "std_power": STD_POWER,
  "focal_gamma": FOCAL_GAMMA,
  "lambda_s": LAMBDA_S,
  "lambda_f": LAMBDA_F,
}


@REGISTRY.register("fade", reads_outcome=True, hyper=_FADE_HYPER)
def fade(inputs: AdvantageInputs, hyper: declared.Values):
  """Sign/difficulty family: A_i = f(p)·[λ_S·1(s_i)·(1-p) - λ_F·1(¬s_i)·p], with s_i the
  row's success (the verifier's verdict) and p the group pass rate and f(p) = (p(1-p) + eps)^(-α)·(1-p)^γ (α = std_power, γ = focal_gamma).

  Masses per group: m_S = p·a⁺ = λ_S f p(1-p), m_F = (1-p)|a⁻| = λ_F f p(1-p). α = 1/2,
  γ = 0, λ = 1 is GRPO with the biased std (m_S = m_F = √(p(1-p))); α = 0 is Dr. GRPO
  (m = p(1-p)); γ > 0 focuses on hard prompts, γ < 0 on easy ones; λ_F > λ_S is
  negative-dominant ("suppression"). All-equal groups (p ∈ {0, 1}) get 0. Success is the
  verifier's verdict (`AdvantageInputs.success_B`, from the correctness reward), not the
  shaped reward: with a format bonus a well-formatted wrong answer is still a failure.

  Source: a reconstruction [INF] of FADE, "Don't Let Gains FADE" (arXiv 2607.01490), with
  the focal weight of F-GRPO (arXiv 2602.06717); see RESEARCH.md §5a.
  """
  success_B = inputs.success
  p_B = pass_rate(success_B, inputs.group_ids_B, inputs.valid)
  mixed_B = (p_B > 0) & (p_B < 1)
  q_B = jnp.where(mixed_B, 1.0 - p_B, 0.5)  # Keeps (1-p)^γ finite for γ < 0 off the mix.
  f_B = jnp.power(p_B * (1.0 - p_B) + hyper.eps, -hyper.std_power) * jnp.power(
    q_B, hyper.focal_gamma
  )
  a_B = f_B * jnp.where(success_B, hyper.lambda_s * (1.0 - p_B), -hyper.lambda_f * p_B)
  return to_tokens(jnp.where(mixed_B, a_B, 0.0), inputs.token_mask)


def ibpo_advantage(
  inputs: AdvantageInputs,
  hyper: declared.Values,
  *,
  shrink: float = 0.0,
  scale: str = "std",
  state: str = "prefix",
  context: int = 0,
):
  """A_{i,t} = (n_g − 1)/n_g · (r_i − b_{i,t}) / (σ_g + eps), b_{i,t} = (1 − λ)·r̄_{−i} +
  λ·φ_{−i}(o_{i,<t}): the terminal reward against a leave-one-out baseline read from the
  group's prefix trie at the state before token t (`ibpo.advantage`; λ = hyper.ibpo_lambda,
  κ = shrink: pseudo-counts toward the parent prefix's value; scale "std" or "none": no σ_g).

  φ_{−i}(s) = (Σ_{j through s, j≠i} w_j r_j + κ φ_{−i}(s⁻)) / (Σ_{j through s, j≠i} w_j + κ),
  φ_{−i}(∅) = r̄_{−i}; a row counts at depths ≥ its start (`AdvantageInputs.start_B`: a
  branch's cut). The baseline never contains the credited trajectory, so with scale="none"
  the policy gradient is unbiased; λ = 0 without counterfactual rows is GRPO ("std") or
  Dr. GRPO ("none") exactly. The trie counts the valid rows and the context rows
  (`AdvantageInputs.context_B`, with weights `weights_B`); n_g counts the valid rows.
  state: what s is (`ibpo.STATES`): the exact prefix o_{i,<t} ("prefix"), its last
  `context` tokens at depth t ("window"), or those tokens at any depth ("span": rows whose
  aligned spans match pool, each once); unbiased alike (grpo_jax/rl/ibpo.py, "States").

  Source: IBPO, "Reducing Credit Assignment Variance via Counterfactual Reasoning Paths"
  (arXiv 2605.16302); a reconstruction [INF] derived in grpo_jax/rl/ibpo.py and RESEARCH.md §3.2.
  """
  _check_ibpo(shrink=shrink, scale=scale, state=state, context=context)
  return _ibpo(inputs, hyper, shrink=shrink, scale=scale, state=state, context=context)[0]


def _ibpo(inputs: AdvantageInputs, hyper: declared.Values, *, shrink, scale, state, context):
  if inputs.tokens_BT is None:
    raise ValueError("ibpo needs AdvantageInputs.tokens_BT (the completion tokens).")
  return ibpo.advantage(
    inputs.tokens_BT,
    inputs.mask_BT,
    inputs.rewards_B,
    inputs.group_ids_B,
    inputs.valid,
    lam=hyper.ibpo_lambda,
    eps=hyper.eps,
    shrink=shrink,
    scale=scale,
    start_B=inputs.start_B,
    context_B=inputs.context_B,
    weights_B=inputs.weights_B,
    state=state,
    context=context,
  )


def ibpo_stats(
  inputs: AdvantageInputs,
  hyper: declared.Values,
  *,
  shrink=0.0,
  scale="std",
  state="prefix",
  context=0,
):
  """`ibpo.comparison_stats` of the ibpo estimator with these options, on its batch."""
  adv_BT, parts = _ibpo(inputs, hyper, shrink=shrink, scale=scale, state=state, context=context)
  return ibpo.comparison_stats(adv_BT, inputs.rewards_B, **parts)


REGISTRY.register(
  "ibpo",
  metrics=ibpo_stats,
  check=_check_ibpo,
  reads_counterfactuals=True,
  hyper={"eps": EPS, "ibpo_lambda": IBPO_LAMBDA, "ibpo_tau": IBPO_TAU, "ibpo_is_cap": IBPO_IS_CAP},
)(ibpo_advantage)


# ----------------------------------------------------------------------------
# On-policy distillation: a teacher's per-token log-ratio as a dense advantage.
# ----------------------------------------------------------------------------

_DISTILL_BASE_TRAITS = (
  "needs_teacher",
  "needs_old_logp",
  "reads_counterfactuals",
  "folds_kl",
  "reads_outcome",
)


def distill_bases() -> list[str]:
  """The estimators `distill` may add its dense term to (option `base`), besides "none":
  those that read only rewards and groups (and their own hyperparameters, which the
  arrays distill receives hold: `declared.Values`)."""
  plain = lambda t: not any(getattr(t, f) for f in _DISTILL_BASE_TRAITS)  # noqa: E731
  return [n for n in REGISTRY.names() if plain(REGISTRY.traits(n))]


def _check_distill(*, base: str = "none", base_options=None) -> None:
  if base != "none" and base not in distill_bases():
    raise ValueError(
      f"distill base={base!r}: must be 'none' (the teacher's term alone) or an estimator that "
      f"reads only rewards and groups: {', '.join(distill_bases())}."
    )
  if base_options and base == "none":
    raise ValueError(
      f"distill base_options={base_options!r} is for a base estimator; base is 'none'."
    )
  if base != "none":
    REGISTRY.make(base, **dict(base_options or {}))


def _distill_batch_level(options: dict) -> bool:
  """base='none' or a base that works at group size 1"""
  base = options.get("base", "none")
  return base == "none" or works_without_groups(base, dict(options.get("base_options") or {}))


def _teacher_term(inputs: AdvantageInputs):
  """d_{i,t} = m_{i,t}·(log π_T(o_{i,t}) − log π_old(o_{i,t})) (float32) and the token mask."""
  if inputs.teacher_logp_BT is None or inputs.old_logp_BT is None:
    raise ValueError(
      "distill needs AdvantageInputs.teacher_logp_BT and old_logp_BT (config.teacher)."
    )
  mask_BT = inputs.token_mask
  d_BT = inputs.teacher_logp_BT.astype(jnp.float32) - inputs.old_logp_BT.astype(jnp.float32)
  return jnp.where(mask_BT, d_BT, 0.0), mask_BT


def _discounted(d_BT, mask_BT, gamma):
  """G_{i,t} = Σ_{s≥t} γ^{(s−t)} d_{i,s} over the row's valid tokens (s, t count valid tokens;
  masked gaps pass the sum through); γ = 0: G = d."""

  def back(carry_B, d_m_B):
    d_B, m_B = d_m_B
    g_B = jnp.where(m_B, d_B + gamma * carry_B, carry_B)
    return g_B, g_B

  zeros_B = jnp.zeros(d_BT.shape[:1], jnp.float32)
  _, g_TB = jax.lax.scan(back, zeros_B, (d_BT.T, mask_BT.T), reverse=True)
  return jnp.where(mask_BT, g_TB.T, 0.0)


def distill_stats(inputs: AdvantageInputs, hyper: declared.Values, **options):
  """The teacher term's metrics (metrics.DEFINITIONS "distill/..."), over the trained tokens."""
  del hyper, options
  d_BT, mask_BT = _teacher_term(inputs)
  n = jnp.maximum(jnp.sum(mask_BT), 1)
  t_BT = jnp.where(mask_BT, inputs.teacher_logp_BT.astype(jnp.float32), 0.0)
  return {"distill/reverse_kl": -jnp.sum(d_BT) / n, "distill/teacher_logp": jnp.sum(t_BT) / n}


@REGISTRY.register(
  "distill",
  needs_teacher=True,
  batch_level=_distill_batch_level,
  check=_check_distill,
  metrics=distill_stats,
  hyper={
    "distill_coef": Hyper(1.0, low=0.0, doc="λ_T, the weight of the teacher's log-ratio"),
    "distill_reward_coef": Hyper(1.0, low=0.0, doc="w_r, the weight of the base advantage"),
    "distill_discount": Hyper(0.0, low=0.0, high=1.0, doc="γ_T, the log-ratio's discount"),
  },
)
def distill(
  inputs: AdvantageInputs, hyper: declared.Values, *, base: str = "none", base_options=None
):
  """On-policy distillation: a teacher's per-token log-ratio as a dense advantage, alone or
  added to a sequence estimator's,

    A_{i,t} = w_r·A^base_{i,t} + λ_T·Σ_{s≥t} γ_T^{(s−t)} d_{i,s},
    d_{i,s} = log π_T(o_{i,s} | q, o_{i,<s}) − log π_old(o_{i,s} | q, o_{i,<s}),

  over the row's valid tokens (A = 0 elsewhere), with λ_T = distill_coef, w_r =
  distill_reward_coef and γ_T = distill_discount (declared hyperparameters: arrays), and
  A^base the estimator named by `base` (with `base_options`; "none": 0). −d_{i,s} is the
  single-sample estimate of the reverse KL(π_old ‖ π_T) at that context, so with γ_T = 1
  and w_r = 0 the policy-gradient term Σ_t A_{i,t}∇log π(o_{i,t}) is that of
  −KL(π ‖ π_T) over the sequence; γ_T = 0 (the default) keeps only each token's own term,
  lower in variance (what Tinker does, `kl_discount_factor` 0). The teacher scores the
  student's own samples, so the student learns where it goes, not where the teacher would.

  Source: Agarwal et al., "On-Policy Distillation of Language Models: Learning from
  Self-Generated Mistakes" (GKD, arXiv 2306.13649); Gu et al., MiniLLM (arXiv 2306.08543);
  Lu & Thinking Machines Lab, "On-Policy Distillation" (2025; the per-token reverse KL as
  the advantage, discount 0); Qwen3 technical report (arXiv 2505.09388) §4.5.
  """
  _check_distill(base=base, base_options=base_options)
  d_BT, mask_BT = _teacher_term(inputs)
  dense_BT = hyper.distill_coef * _discounted(d_BT, mask_BT, hyper.distill_discount)
  if base == "none":
    return dense_BT
  base_BT = REGISTRY.make(base, **dict(base_options or {}))(inputs, hyper)
  return jnp.where(mask_BT, hyper.distill_reward_coef * base_BT + dense_BT, 0.0)


def works_without_groups(name: str, options: dict) -> bool:
  """Whether estimator `name` with `options` gives non-zero advantages at group size 1 (its
  `Traits.batch_level`); every other one gives A = 0 there (a singleton group is its own
  baseline) and trains nothing."""
  level = REGISTRY.traits(name).batch_level
  options = {**_keyword_defaults(REGISTRY.get(name)), **options}
  if callable(level):
    return bool(level(options))
  if isinstance(level, dict):
    return all(options.get(k) == v for k, v in level.items())
  return bool(level)


def _keyword_defaults(fn) -> dict:
  """fn's keyword-only options with their defaults (what an option left out means)."""
  params = inspect.signature(fn).parameters.values()
  return {
    p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty
  }


def batch_level_names() -> list[str]:
  """The estimators (with the options they need) that work at group size 1."""
  out = []
  for name in REGISTRY.names():
    level = REGISTRY.traits(name).batch_level
    if callable(level):
      out.append(f"{name}({level.__doc__})")
    elif isinstance(level, dict):
      out.append(f"{name}({', '.join(f'{k}={v!r}' for k, v in level.items())})")
    elif level:
      out.append(name)
  return out


# ----------------------------------------------------------------------------
# Statistics shared by every estimator.
# ----------------------------------------------------------------------------


def sequence_advantage(adv_BT, mask_BT):
  """ā_i = Σ_t m A / Σ_t m (0 for an empty row): the sign that decides a row's polarity."""
  m_BT = mask_BT.astype(jnp.float32)
  return jnp.sum(adv_BT * m_BT, axis=1) / jnp.maximum(jnp.sum(m_BT, axis=1), 1.0)


def sign_masses(adv_B):
  """m_S = (1/B) Σ_i max(ā_i, 0), m_F = (1/B) Σ_i max(-ā_i, 0): positive and negative
  gradient mass (FADE, arXiv 2607.01490). For one binary group: m_S = p·a⁺, m_F = (1-p)|a⁻|."""
  return jnp.mean(jnp.maximum(adv_B, 0.0)), jnp.mean(jnp.maximum(-adv_B, 0.0))


def group_stats(rewards_B, group_ids_B):
  """Fractions of groups whose rewards have zero variance: all equal, all 0, all 1."""
  r_B = rewards_B.astype(jnp.float32)
  n_B = groups.group_size(group_ids_B)
  mean_B = groups.group_mean(r_B, group_ids_B)
  equal_B = groups.group_sum(jnp.square(r_B - mean_B), group_ids_B) <= 1e-12
  all0_B = equal_B & (mean_B == 0.0)
  all1_B = equal_B & (mean_B == 1.0)
  # Each group counted once: weight each row by 1/n_g.
  per_group = lambda flag_B: jnp.sum(flag_B / n_B) / jnp.sum(1.0 / n_B)
  return {
    "zero_var_groups": per_group(equal_B),
    "all_zero_groups": per_group(all0_B),
    "all_one_groups": per_group(all1_B),
  }


def advantage_stats(adv_BT, mask_BT, rewards_B, correct_B, group_ids_B):
  """Advantage and reward statistics (see metrics.DEFINITIONS). Group fractions and the
  pass rate come from the correctness reward c_i, the rest from the shaped reward r_i."""
  m_BT = mask_BT.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m_BT), 1.0)
  mean = jnp.sum(adv_BT * m_BT) / n
  big = jnp.float32(3e38)
  a_B = sequence_advantage(adv_BT, mask_BT)
  m_s, m_f = sign_masses(a_B)
  return {
    "adv_mean": mean,
    "adv_std": jnp.sqrt(jnp.sum(jnp.square(adv_BT - mean) * m_BT) / n),
    "adv_min": jnp.min(jnp.where(mask_BT, adv_BT, big)),
    "adv_max": jnp.max(jnp.where(mask_BT, adv_BT, -big)),
    "adv_pos_frac": jnp.mean((a_B > 0).astype(jnp.float32)),
    "adv_neg_frac": jnp.mean((a_B < 0).astype(jnp.float32)),
    "m_S": m_s,
    "m_F": m_f,
    "reward_mean": jnp.mean(rewards_B.astype(jnp.float32)),
    "pass_rate": jnp.mean((correct_B > 0).astype(jnp.float32)),
    **group_stats(correct_B, group_ids_B),
  }
