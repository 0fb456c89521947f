"""The composed objective: RLConfig, prepare, train_step (with the tiny model), update."""

import dataclasses
import functools
import itertools
import re

import arithmetic
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from grpo_jax.infra import metrics
from grpo_jax.models import logprobs, sampling
from grpo_jax.rl import advantages, guards, learner, preparation, presets, spec

B_PROMPTS, G = 4, 4
N = B_PROMPTS * G
# Mixed groups, an all-0 group and an all-1 group (hand-made, fixed).
CORRECT_N = np.array([1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 1, 1, 1], np.float32)


@pytest.fixture(scope="module")
def rollouts(tiny_sampler, tiny_params, tokenizer, sampler_cfg):
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(f"Q:{a}+{a + 3}\n", add_bos=True) for a in range(B_PROMPTS)], cfg=sampler_cfg
  )
  hyper = sampling.sampling_params(temperature=1.0)
  return tiny_sampler(tiny_params, prompts, jax.random.key(1), hyper)


def _prepare(cfg, params, rollouts, model_fn, *, ref_params=None):
  fn = preparation.make_prepare(cfg, model_fn)
  hyper = cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  return fn(params, ref_params, rollouts, jnp.asarray(CORRECT_N), jnp.zeros(N), hyper)


# ----------------------------------------------------------------------------
# Config edge.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("advantage", "ppo", "valid names: .*grpo"),
    ("aggregation", "mean", "valid names: .*token_mean"),
    ("policy_loss", "dpo", "valid names: .*ppo_clip"),
    ("planner", "shuffle", "valid names: .*query_preserved"),
    ("kl_estimator", "k4", "valid names: .*k3"),
    ("token_masks", ("nope",), "valid names: .*negative_token_filter"),
    ("kl_in", "both", "allowed"),
    ("truncation", "drop", "allowed"),
    ("num_minibatches", 0, ">= 1"),
    ("advantage_options", {"biased": True}, "allowed: .*unbiased_std"),
    ("mask_options", {"negative_only": {}}, "not in rl.token_masks"),
  ],
)
def test_rl_config_rejects_bad_values_with_the_allowed_ones(field, value, match):
  with pytest.raises(ValueError, match=match):
    spec.RLConfig(**{field: value})


def test_rl_config_from_dict_rejects_unknown_keys():
  with pytest.raises(ValueError, match="unknown RLConfig keys \\['advantge'\\]"):
    spec.RLConfig.from_dict({"advantge": "rloo"})


@pytest.mark.parametrize("name", presets.REGISTRY.names())
def test_every_preset_is_a_valid_config(name):
  cfg = spec.RLConfig.from_dict(presets.get(name))
  assert isinstance(presets.get(name), ml_collections.ConfigDict)
  assert presets.REGISTRY.get(name).__doc__ and "arXiv" in presets.REGISTRY.get(name).__doc__
  assert cfg.advantage in advantages.REGISTRY


def test_presets_pin_their_defining_values():
  dapo = spec.RLConfig.from_dict(presets.get("dapo"))
  assert dapo.loss_values == {"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 0.0}
  assert dapo.aggregation == "token_mean" and dapo.dynamic_sampling
  assert dapo.overlong_factor == 1.0
  gspo = spec.RLConfig.from_dict(presets.get("gspo"))
  assert gspo.policy_loss == "gspo"
  assert (gspo.loss_values["eps_low"], gspo.loss_values["eps_high"]) == (3e-4, 4e-4)
  assert spec.RLConfig.from_dict(presets.get("dr_grpo")).aggregation == "constant_norm"
  rpp = spec.RLConfig.from_dict(presets.get("reinforce_pp"))
  assert rpp.advantage_values["gamma"] == 1.0 and rpp.kl_in == "reward"


def test_a_preset_sets_a_hyperparameter_and_keeps_the_sections_other_keys():
  """presets.apply on a full (locked) config: dapo's eps_high lands in rl.loss_hyper and
  is reported dotted; the section's other keys, and a value set before, stay."""
  from grpo_jax import config  # noqa: PLC0415

  c = config.default_config()
  c.rl.loss_hyper.dual_clip_c = 3.0
  c.lock()
  changes = presets.apply(c.rl, "dapo")
  assert ("loss_hyper.eps_high", 0.2, 0.28) in changes
  assert not any(k == "loss_hyper.eps_low" for k, _, _ in changes)  # 0.2 already.
  assert dict(c.rl.loss_hyper) == {"eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": 3.0}


# ----------------------------------------------------------------------------
# Prepare.
# ----------------------------------------------------------------------------


def test_prepare_recomputes_old_logp_and_builds_advantages(rollouts, tiny_model_fn, tiny_params):
  cfg = spec.RLConfig(advantage="grpo")
  batch, rewards_N, m = _prepare(cfg, tiny_params, rollouts, tiny_model_fn)
  # The recomputed old log-probs match the sampler's policy log-probs.
  np.testing.assert_allclose(batch.old_logp_NT, rollouts.policy_logp_NT, atol=2e-5)
  np.testing.assert_array_equal(rewards_N, CORRECT_N)
  # GRPO advantages broadcast over each row's completion tokens.
  r_G = CORRECT_N[:4]  # [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3).
  a_expected = (r_G - 0.5) / (np.sqrt(1 / 3) + 1e-6)
  a_rows = np.asarray(advantages.sequence_advantage(batch.adv_NT, batch.mask_NT))
  np.testing.assert_allclose(a_rows[:4], a_expected, rtol=1e-5)
  np.testing.assert_allclose(a_rows[8:], 0.0)  # All-0 and all-1 groups.
  np.testing.assert_array_equal(batch.loss_mask_NT, rollouts.mask_NT)
  assert float(m["zero_var_groups"]) == pytest.approx(0.5)
  assert float(m["all_zero_groups"]) == pytest.approx(0.25)
  assert float(m["all_one_groups"]) == pytest.approx(0.25)
  for name in m:
    metrics.definition(name)


def test_prepare_positive_only_mask_and_kl_to_reference(rollouts, tiny_model_fn, tiny_params):
  cfg = spec.RLConfig(token_masks=("positive_only",), kl_coef=0.1, kl_estimator="k3")
  ref = jax.tree.map(lambda x: x * 0.9, tiny_params)
  batch, _, m = _prepare(cfg, tiny_params, rollouts, tiny_model_fn, ref_params=ref)
  a_N = advantages.sequence_advantage(batch.adv_NT, batch.mask_NT)
  assert not np.any(np.asarray(batch.loss_mask_NT)[np.asarray(a_N) < 0])
  frac = (
    np.asarray(rollouts.mask_NT)[np.asarray(a_N) < 0].sum() / np.asarray(rollouts.mask_NT).sum()
  )
  assert float(m["masked_frac"]) == pytest.approx(frac)
  assert float(m["rollout_kl_ref/k3"]) > 0
  assert not np.allclose(batch.ref_logp_NT, batch.old_logp_NT)


@pytest.mark.parametrize("advantage", ["optimal_baseline", "reinforce_pp"])
def test_split_prepare_equals_prepare(rollouts, tiny_model_fn, tiny_params, advantage):
  """The trainer's two halves (forwards dispatched before rewards exist, then advantages
  and masks) give prepare's batch, rewards and metrics."""
  cfg = spec.RLConfig(
    advantage=advantage, kl_coef=0.1, token_masks=("negative_token_filter",), kl_in="reward"
  )
  ref = jax.tree.map(lambda x: x * 0.9, tiny_params)
  want = _prepare(cfg, tiny_params, rollouts, tiny_model_fn, ref_params=ref)
  logprobs = jax.jit(
    functools.partial(preparation.rollout_logprobs, cfg=cfg, model_fn=tiny_model_fn)
  )
  finish = jax.jit(functools.partial(preparation.finish_prepare, cfg=cfg))
  lp = logprobs(tiny_params, ref, rollouts)
  hyper = cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  got = finish(lp, rollouts, jnp.asarray(CORRECT_N), jnp.zeros(N), hyper)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
  assert float(np.abs(lp.kl_NT).max()) > 1e-4  # The reference half is not vacuous.


def test_kl_folded_into_the_reward(rollouts, tiny_model_fn, tiny_params):
  """kl_in="reward": sequence estimators see r_i - β Σ_t kl_t (here GRPO, k2, β = 0.5)."""
  cfg = spec.RLConfig(advantage="dr_grpo", kl_coef=0.5, kl_estimator="k2", kl_in="reward")
  ref = jax.tree.map(lambda x: x * 0.9, tiny_params)
  batch, rewards_N, m = _prepare(cfg, tiny_params, rollouts, tiny_model_fn, ref_params=ref)
  delta_NT = np.asarray(batch.old_logp_NT) - np.asarray(batch.ref_logp_NT)
  kl_N = (0.5 * delta_NT**2 * np.asarray(batch.mask_NT)).sum(1)
  r_N = np.asarray(rewards_N) - 0.5 * kl_N
  expected_N = r_N - np.repeat(r_N.reshape(B_PROMPTS, G).mean(1), G)
  got_N = np.asarray(advantages.sequence_advantage(batch.adv_NT, batch.mask_NT))
  np.testing.assert_allclose(got_N, expected_N, rtol=1e-4, atol=1e-5)
  assert np.abs(kl_N).max() > 1e-3  # The KL term is not vacuous.
  assert cfg.step_hyper().kl_coef == 0.0  # ...and it is not also in the loss.


def test_optimal_baseline_gets_score_norms_from_prepare(rollouts, tiny_model_fn, tiny_params):
  """b* = Σ s r / Σ s with s_i = Σ_t (1 - 2π_t(y) + Σ_v π_v²), computed from the logits."""
  cfg = spec.RLConfig(advantage="optimal_baseline")
  batch, rewards_N, _ = _prepare(cfg, tiny_params, rollouts, tiny_model_fn)
  full = logprobs.completion_logprobs(
    tiny_params,
    rollouts.prompt_tokens_NP,
    rollouts.prompt_mask_NP,
    rollouts.tokens_NT,
    rollouts.mask_NT,
    model_fn=tiny_model_fn,
    with_stats=True,
  )
  p_NT = np.exp(np.asarray(full[0]))
  s_N = ((1 - 2 * p_NT + np.asarray(full[1]["sum_sq"])) * np.asarray(rollouts.mask_NT)).sum(1)
  r_GN, s_GN = np.asarray(rewards_N).reshape(B_PROMPTS, G), s_N.reshape(B_PROMPTS, G)
  b_G = (s_GN * r_GN).sum(1) / s_GN.sum(1)
  expected_N = (r_GN - b_G[:, None]).reshape(-1)
  got_N = np.asarray(advantages.sequence_advantage(batch.adv_NT, batch.mask_NT))
  np.testing.assert_allclose(got_N, expected_N, rtol=1e-4, atol=1e-6)
  dr = r_GN - r_GN.mean(1, keepdims=True)
  assert not np.allclose(got_N, dr.reshape(-1), atol=1e-4)  # Not the plain group mean.


def test_features_needing_the_old_distribution_require_recompute():
  with pytest.raises(ValueError, match="recompute_old_logp=True"):
    spec.RLConfig(advantage="optimal_baseline", recompute_old_logp=False)
  with pytest.raises(ValueError, match="'entropy' negative_token_filter"):
    spec.RLConfig(
      token_masks=("negative_token_filter",),
      mask_options={"negative_token_filter": {"criteria": ("entropy",)}},
      recompute_old_logp=False,
    )


# ----------------------------------------------------------------------------
# The train step.
# ----------------------------------------------------------------------------


def _sgd_step(cfg, model_fn, **kw):
  return learner.make_train_step(cfg, model_fn, optax.sgd(0.1), donate=False, **kw)


def test_on_policy_first_step_has_ratio_one_and_documented_metrics(
  rollouts, tiny_model_fn, tiny_params
):
  cfg = spec.RLConfig(loss_hyper=dict(eps_high=0.28))
  batch, _, _ = _prepare(cfg, tiny_params, rollouts, tiny_model_fn)
  step = _sgd_step(cfg, tiny_model_fn, token_outputs=True)
  state = spec.init_state(tiny_params, optax.sgd(0.1))
  new_state, m = step(state, batch, cfg.step_hyper())
  assert float(m["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
  assert float(m["ppo_kl"]) == pytest.approx(0.0, abs=1e-5)
  assert float(m["pg_clipfrac"]) == 0.0
  assert float(m["grad_norm"]) > 0
  assert int(new_state.step) == 1
  tok = m.pop("tokens")
  assert set(tok) == {"weight", "loss", "ratio", "clip_high", "clip_low", "dual_clip"}
  assert all(v.shape == batch.tokens_NT.shape for v in tok.values())
  # token-mean weights: 1 / (number of loss tokens) on every loss token.
  n_tok = float(np.asarray(batch.loss_mask_NT).sum())
  np.testing.assert_allclose(np.asarray(tok["weight"])[np.asarray(batch.loss_mask_NT)], 1 / n_tok)
  # The loss is Σ w·ℓ: on-policy PPO gives ℓ = -A, so loss = -mean_tokens(A).
  a = np.asarray(batch.adv_NT)[np.asarray(batch.loss_mask_NT)]
  assert float(m["loss"]) == pytest.approx(-a.mean(), abs=1e-5)
  for name in m:
    metrics.definition(name)


@pytest.mark.parametrize("where", ["adv", "old_logp"])
def test_nonfinite_step_is_skipped_and_counted(where, rollouts, tiny_model_fn, tiny_params):
  """A NaN in the loss (via A) or only in the gradient path leaves params and Adam state
  untouched and reports nonfinite = 1; the next finite step applies normally."""
  cfg = spec.RLConfig()
  batch, _, _ = _prepare(cfg, tiny_params, rollouts, tiny_model_fn)
  opt = optax.adam(1e-2)
  step = learner.make_train_step(cfg, tiny_model_fn, opt, donate=False)
  state = spec.init_state(tiny_params, opt)
  state, m = step(state, batch, cfg.step_hyper())  # One good step: non-trivial Adam moments.
  assert float(m["nonfinite"]) == 0.0
  field = {"adv": "adv_NT", "old_logp": "old_logp_NT"}[where]
  x = np.asarray(getattr(batch, field)).copy()
  x[np.nonzero(np.asarray(batch.loss_mask_NT))[0][0], 0] = np.nan
  bad = batch.replace(**{field: jnp.asarray(x)})
  new, m = step(state, bad, cfg.step_hyper())
  assert float(m["nonfinite"]) == 1.0
  assert int(new.step) == int(state.step) + 1
  for a, b in zip(
    jax.tree.leaves((new.params, new.opt_state)), jax.tree.leaves((state.params, state.opt_state))
  ):
    np.testing.assert_array_equal(a, b)
  after, m = step(new, batch, cfg.step_hyper())
  assert float(m["nonfinite"]) == 0.0
  moved = [
    not np.array_equal(a, b)
    for a, b in zip(jax.tree.leaves(after.params), jax.tree.leaves(new.params))
  ]
  assert all(moved)


# Every mode's weights are micro-batch invariant by construction (tests/rl/test_aggregation.py
# checks each formula); here two modes run through the real model and optimizer, off-policy
# (after one update) with a tight clip range, so clipping is active in the compared step.
@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "group_token_mean"])
def test_micro_batching_does_not_change_the_update(
  aggregation, rollouts, tiny_model_fn, tiny_params
):
  """Four micro-batches, or micro-batches of at most 3 full-length rows' tokens (two
  length buckets), give the same SGD update as one (weights are mini-batch wide)."""
  base = spec.RLConfig(
    aggregation=aggregation, loss_hyper=dict(eps_low=0.01, eps_high=0.01), entropy_coef=0.01
  )
  batch, _, _ = _prepare(base, tiny_params, rollouts, tiny_model_fn)
  moved, _ = _sgd_step(base, tiny_model_fn)(
    spec.init_state(tiny_params, optax.sgd(1.0)), batch, base.step_hyper()
  )
  row_tokens = batch.prompt_tokens_NP.shape[1] + batch.tokens_NT.shape[1]
  out = {}
  for k, changes in (
    (1, {}),
    (4, {"micro_batches": 4}),
    ("tokens", {"micro_batch_tokens": 3 * row_tokens, "length_buckets": 2}),
  ):
    cfg = dataclasses.replace(base, **changes)
    new, m = _sgd_step(cfg, tiny_model_fn)(moved, batch, cfg.step_hyper())
    out[k] = (new.params, m)
  assert float(out[1][1]["pg_clipfrac"]) > 0.05  # Clipping is active.
  assert float(out["tokens"][1]["micro_batches"]) >= 2
  for k in (4, "tokens"):
    for a, b in zip(jax.tree.leaves(out[1][0]), jax.tree.leaves(out[k][0])):
      np.testing.assert_allclose(a, b, atol=1e-6)
    for name in ("loss", "entropy", "pg_clipfrac", "pg_clipfrac_high", "ppo_kl", "grad_norm"):
      assert float(out[1][1][name]) == pytest.approx(float(out[k][1][name]), rel=1e-5, abs=1e-7)


def test_micro_batches_are_strided_and_token_outputs_come_back_in_row_order(
  rollouts, tiny_model_fn, tiny_params
):
  """Micro-batch k holds rows k, k + K, ... (each slice keeps the rows' data-parallel
  split); the per-token outputs are reassembled in the mini-batch's own row order."""
  x = np.arange(12).reshape(6, 2)
  np.testing.assert_array_equal(learner._split(x, 3)[1], x[[1, 4]])
  np.testing.assert_array_equal(learner._unsplit(learner._split(x, 3)), x)
  base = spec.RLConfig(loss_hyper=dict(eps_low=0.01, eps_high=0.01))
  batch, _, _ = _prepare(base, tiny_params, rollouts, tiny_model_fn)
  state = spec.init_state(tiny_params, optax.sgd(1.0))
  moved, _ = _sgd_step(base, tiny_model_fn)(state, batch, base.step_hyper())
  tok = {}
  for k in (1, 4):
    cfg = dataclasses.replace(base, micro_batches=k)
    _, m = _sgd_step(cfg, tiny_model_fn, token_outputs=True)(moved, batch, cfg.step_hyper())
    tok[k] = m["tokens"]
  assert float(np.asarray(tok[1]["clip_high"]).sum() + np.asarray(tok[1]["clip_low"]).sum()) > 0
  for name in tok[1]:
    np.testing.assert_allclose(tok[4][name], tok[1][name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_changing_hyperparameters_does_not_recompile(rollouts, tiny_model_fn, tiny_params):
  cfg = spec.RLConfig(kl_coef=0.05, entropy_coef=0.0)
  ref = jax.tree.map(lambda x: x * 0.95, tiny_params)
  batch, _, _ = _prepare(cfg, tiny_params, rollouts, tiny_model_fn, ref_params=ref)
  step = _sgd_step(cfg, tiny_model_fn)
  state = spec.init_state(tiny_params, optax.sgd(0.1))
  losses_seen = []
  for eps, kl, ent in [(0.2, 0.05, 0.0), (0.1, 0.5, 0.01), (0.3, 0.0, 0.1)]:
    h = dataclasses.replace(
      cfg, loss_hyper=dict(eps_low=eps, eps_high=eps), kl_coef=kl, entropy_coef=ent
    )
    _, m = step(state, batch, h.step_hyper())
    losses_seen.append(float(m["loss"]))
  assert step._cache_size() == 1
  assert len(set(losses_seen)) == 3  # The hyperparameters did take effect.


def test_repeated_steps_raise_positive_and_lower_negative_logprobs(
  rollouts, tiny_model_fn, tiny_params
):
  cfg = spec.RLConfig(
    advantage="dr_grpo", aggregation="token_mean", loss_hyper=dict(eps_low=10.0, eps_high=10.0)
  )
  batch, _, _ = _prepare(cfg, tiny_params, rollouts, tiny_model_fn)
  step = _sgd_step(cfg, tiny_model_fn)
  state = spec.init_state(tiny_params, optax.sgd(1.0))
  for _ in range(5):
    state, _ = step(state, batch, cfg.step_hyper())
  after, _ = logprobs.completion_logprobs(
    state.params,
    batch.prompt_tokens_NP,
    batch.prompt_mask_NP,
    batch.tokens_NT,
    batch.mask_NT,
    model_fn=tiny_model_fn,
  )
  delta_N = np.asarray(jnp.sum(after - batch.old_logp_NT, axis=1))
  a_N = np.asarray(advantages.sequence_advantage(batch.adv_NT, batch.mask_NT))
  assert delta_N[a_N > 0].mean() > 0 > delta_N[a_N < 0].mean()


# ----------------------------------------------------------------------------
# The update phase and host validation.
# ----------------------------------------------------------------------------


def test_update_runs_epochs_times_minibatches_with_whole_groups(
  rollouts, tiny_model_fn, tiny_params
):
  cfg = spec.RLConfig(planner="query_preserved", num_minibatches=2, ppo_epochs=2)
  batch, _, _ = _prepare(cfg, tiny_params, rollouts, tiny_model_fn)
  update = learner.make_update(
    cfg, tiny_model_fn, optax.sgd(0.1), batch_size=N, group_size=G, donate=False
  )
  state = spec.init_state(tiny_params, optax.sgd(0.1))
  new, idx_EMb, history = update(state, batch, jax.random.key(0), cfg.step_hyper())
  assert idx_EMb.shape == (2, 2, N // 2) and int(new.step) == 4
  assert all(v.shape == (4,) for v in history.values())  # Stacked over E·M steps.
  g_N = np.asarray(batch.group_ids_N)
  for e, m in itertools.product(range(2), range(2)):
    ids = set(g_N[np.asarray(idx_EMb[e, m])])
    others = set(g_N[np.asarray(idx_EMb[e, 1 - m])])
    assert not ids & others
  # Later mini-batches are off-policy: their ratios move away from 1.
  assert float(history["ppo_kl"][-1]) != pytest.approx(0.0, abs=1e-9)
  assert float(history["ppo_kl"][0]) == pytest.approx(0.0, abs=1e-6)

  # The scan is the loop of train steps over the plan's mini-batches, step for step.
  step = _sgd_step(cfg, tiny_model_fn)
  for s, idx_b in enumerate(np.asarray(idx_EMb).reshape(4, -1)):
    state, metrics = step(state, learner.gather(batch, idx_b), cfg.step_hyper())
    assert float(metrics["loss"]) == pytest.approx(float(history["loss"][s]), rel=1e-5, abs=1e-7)
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(new.params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_validate_batch_errors():
  ok_ids = np.repeat(np.arange(4), 4)
  with pytest.raises(ValueError, match="rows \\[2\\]"):
    guards.validate_batch(
      rewards_N=[1.0, 0.0, np.nan, 1.0], group_ids_N=ok_ids[:4] * 0, group_size=4
    )
  with pytest.raises(ValueError, match="inconsistent"):
    guards.validate_batch(rewards_N=np.zeros(16), group_ids_N=np.r_[ok_ids[:-1], 0], group_size=4)
  with pytest.raises(ValueError, match="group count"):
    learner.make_plan_fn(
      spec.RLConfig(planner="query_preserved", num_minibatches=8), batch_size=16, group_size=4
    )


# ----------------------------------------------------------------------------
# Unscorable rows (rl.unscorable).
# ----------------------------------------------------------------------------


def test_trained_rows_by_policy_pinned():
  """Groups of 3: group 0 all scorable, group 1 one failure, group 2 two failures; the
  last row (group 3, a group of one) failed, the one before it (group 4) is fill."""
  g = jnp.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4])
  scorable = jnp.array([1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 1], bool)
  keep = jnp.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], bool)
  rows = lambda policy: np.asarray(
    preparation.trained_rows(scorable, keep, g, policy=policy)
  ).astype(int)
  # mask: failed rows out; group 2 keeps one scorable row (< 2): out too.
  np.testing.assert_array_equal(rows("mask"), [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows("drop_group"), [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows("zero"), [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0])
  # A group of one (G = 1 training) that scored is kept under "mask".
  one = preparation.trained_rows(
    jnp.array([True]), jnp.array([True]), jnp.array([0]), policy="mask"
  )
  assert bool(one[0])


def test_unscorable_rows_get_no_loss_and_no_say_in_their_group(
  rollouts, tiny_model_fn, tiny_params
):
  """A failed row scored 0 pushes its group's correct answers up (zero) or is left out
  (mask): the other rows' advantages then equal those of the group without it."""
  cfg = spec.RLConfig(advantage="dr_grpo")
  lp = preparation.rollout_logprobs(tiny_params, None, rollouts, cfg=cfg, model_fn=tiny_model_fn)
  correct = jnp.asarray(np.tile([1.0, 0.0, 0.0, 0.0], N // 4), jnp.float32)  # Row 1: failed.
  scorable = jnp.asarray(np.tile([True, False, True, True], N // 4))
  hyper = cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  zero = dataclasses.replace(cfg, unscorable="zero")
  mask, _, m_mask = preparation.finish_prepare(
    lp, rollouts, correct, correct * 0, hyper, scorable, cfg=cfg
  )
  zeroed, _, m_zero = preparation.finish_prepare(
    lp, rollouts, correct, correct * 0, hyper, scorable, cfg=zero
  )
  seq = lambda b: np.asarray(advantages.sequence_advantage(b.adv_NT, b.mask_NT))[:4]
  np.testing.assert_allclose(seq(zeroed), [0.75, -0.25, -0.25, -0.25], atol=1e-6)
  np.testing.assert_allclose(seq(mask), [2 / 3, 0.0, -1 / 3, -1 / 3], atol=1e-6)
  assert not np.asarray(mask.loss_mask_NT)[1].any() and np.asarray(zeroed.loss_mask_NT)[1].any()
  assert float(m_mask["unscorable_frac"]) == float(m_zero["unscorable_frac"]) == 0.25
  assert float(m_mask["excluded_frac"]) == 0.25 and float(m_zero["excluded_frac"]) == 0.0


def test_fade_in_the_trainer_counts_a_formatted_wrong_answer_as_a_failure(
  rollouts, tiny_model_fn, tiny_params
):
  """finish_prepare hands FADE the verifier's verdict (correct_N > 0), not the shaped
  reward: with a format bonus of 0.5, a well-formatted wrong answer (r = 0.5 > 0) still
  gets a failure's (negative) advantage, equal to the other failures'."""
  cfg = spec.RLConfig(advantage="fade", format_weight=0.5)
  lp = preparation.rollout_logprobs(tiny_params, None, rollouts, cfg=cfg, model_fn=tiny_model_fn)
  correct = jnp.asarray(np.tile([1.0, 0.0, 0.0, 0.0], N // 4), jnp.float32)
  formatted = jnp.asarray(np.tile([1.0, 1.0, 0.0, 0.0], N // 4), jnp.float32)  # Row 1: wrong.
  hyper = cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  batch, rewards_N, _ = preparation.finish_prepare(lp, rollouts, correct, formatted, hyper, cfg=cfg)
  assert float(rewards_N[1]) == 0.5  # The shaped reward of the formatted wrong answer.
  seq = np.asarray(advantages.sequence_advantage(batch.adv_NT, batch.mask_NT))[:4]
  f = (3 / 16 + 1e-6) ** -0.5  # p = 1/4 from the verdicts (the shaped rewards say 1/2).
  np.testing.assert_allclose(seq, [0.75 * f, -0.25 * f, -0.25 * f, -0.25 * f], rtol=1e-5)


def test_log_prob_slices_give_the_forwards_of_all_rows_at_once(
  rollouts, tiny_model_fn, tiny_params
):
  """rl.logprob_batches = 4: π_old, entropy, score norms and the reference's log-probs of
  every row, in order, as one forward over all rows gives them; a count that does not
  divide the rows is refused by name."""
  ref = jax.tree.map(lambda x: x * 0.9, tiny_params)
  cfg = spec.RLConfig(advantage="grpo", kl_coef=0.1)
  run = lambda c: preparation.rollout_logprobs(  # noqa: E731
    tiny_params, ref, rollouts, cfg=c, model_fn=tiny_model_fn
  )
  want, got = run(cfg), run(dataclasses.replace(cfg, logprob_batches=4))
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
  assert float(np.abs(np.asarray(want.old_logp_NT)).max()) > 0  # Not vacuous.
  with pytest.raises(ValueError, match=r"rl.logprob_batches=3 does not divide the 16 rollout"):
    run(dataclasses.replace(cfg, logprob_batches=3))


# ----------------------------------------------------------------------------
# π_old from the update's own forward (rl.old_logp_from).
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "changes",
  [{}, {"micro_batch_tokens": "3 rows", "length_buckets": 2}, {"kl_coef": 0.05}],
  ids=["one_micro_batch", "token_budgets", "kl_in_loss"],
)
def test_pi_old_from_the_update_gives_the_forwards_update_and_metrics(
  changes, rollouts, tiny_model_fn, tiny_params
):
  """rl.old_logp_from="update" (one optimizer step): no π_old forward in prepare, and the
  same SGD update, loss and metrics as π_old's own forward. rollout_entropy and the
  sampler–trainer mismatch ("offpolicy/...") move from prepare's metrics to the
  update's, equal (the token-budget case reassembles the rows' log-probs from two
  length buckets), and so does KL(π_old ‖ π_ref) with a KL in the loss (rollout_kl_ref/k3;
  the reference forward stays); the ratio is exactly 1. The batch's old_logp_NT is then only μ, the
  sampler's: shifting it by 0.5 moves the mismatch metrics and nothing trained (a learner
  that read it as π_old would clip every token)."""
  if "micro_batch_tokens" in changes:
    row_tokens = rollouts.prompt_tokens_NP.shape[1] + rollouts.tokens_NT.shape[1]
    changes = {**changes, "micro_batch_tokens": 3 * row_tokens}
  ref = jax.tree.map(lambda x: x * 0.9, tiny_params) if "kl_coef" in changes else None
  forward = spec.RLConfig(old_logp_from="forward", entropy_coef=0.01, **changes)
  out = {}
  for name in ("forward", "update", "shifted"):
    cfg = dataclasses.replace(forward, old_logp_from="forward" if name == "forward" else "update")
    batch, _, prep = _prepare(cfg, tiny_params, rollouts, tiny_model_fn, ref_params=ref)
    if name == "shifted":
      batch = batch.replace(old_logp_NT=batch.old_logp_NT - 0.5)
    update = learner.make_update(
      cfg, tiny_model_fn, optax.sgd(0.1), batch_size=N, group_size=G, donate=False
    )
    state = spec.init_state(tiny_params, optax.sgd(0.1))
    new, _, history = update(state, batch, jax.random.key(0), cfg.step_hyper())
    out[name] = (new.params, {k: float(v) for k, v in prep.items()}, history)
  (p_f, prep_f, hist_f), (p_u, prep_u, hist_u) = out["forward"], out["update"]
  moved = {"rollout_entropy"} | {k for k in prep_f if k.startswith(("offpolicy/", "rollout_kl"))}
  assert len(moved) == 7 + (ref is not None) and moved <= set(prep_f) and not moved & set(prep_u)
  if ref is not None:
    assert prep_f["rollout_kl_ref/k3"] > 1e-4  # A reference apart from π_old.
  assert moved <= set(hist_u) and not moved & set(hist_f)
  for k in moved:
    assert float(hist_u[k][0]) == pytest.approx(prep_f[k], rel=1e-5, abs=1e-6), k
  assert prep_u == pytest.approx({k: v for k, v in prep_f.items() if k not in moved}, rel=1e-6)
  for k, v in hist_f.items():
    assert float(hist_u[k][0]) == pytest.approx(float(v[0]), rel=1e-5, abs=1e-6), k
  assert float(hist_u["ratio_mean"][0]) == 1.0 and float(hist_u["ppo_kl"][0]) == 0.0
  for a, b in zip(jax.tree.leaves(p_f), jax.tree.leaves(p_u), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  p_s, _, hist_s = out["shifted"]
  for a, b in zip(jax.tree.leaves(p_u), jax.tree.leaves(p_s), strict=True):
    np.testing.assert_array_equal(a, b)
  assert float(hist_s["pg_clipfrac"][0]) == 0.0
  # log ρ = log π_old − log μ moved by +0.5: ρ's median by e^0.5.
  assert float(hist_s["offpolicy/ratio_p50"][0]) == pytest.approx(
    np.exp(0.5) * float(hist_u["offpolicy/ratio_p50"][0]), rel=1e-5
  )


@pytest.mark.parametrize(
  "changes,blocker",
  [
    ({"num_minibatches": 2}, "2 optimizer steps"),
    ({"ppo_epochs": 3}, "3 optimizer steps"),
    ({"recompute_old_logp": False}, "recompute_old_logp=False"),
    ({"advantage": "optimal_baseline"}, "rl.advantage='optimal_baseline'"),
    ({"token_masks": ("negative_token_filter",)}, "negative_token_filter"),
    ({"controller": "fade_entropy", "advantage": "fade"}, "rl.controller='fade_entropy'"),
    ({"is_correction": "tis_token"}, "rl.is_correction='tis_token'"),
    ({"kl_coef": 0.1, "kl_in": "reward"}, "rl.kl_in='reward'"),
  ],
)
def test_pi_old_from_the_update_is_refused_where_it_is_not_pi_old(changes, blocker):
  """Each thing that makes the update's forward other than π_old, or reads π_old before
  the update, is a blocker: "auto" then resolves to "forward" (`build`), and an explicit
  "update" is one error naming it."""
  assert any(blocker in b for b in spec.RLConfig(**changes).old_logp_blockers())
  with pytest.raises(ValueError, match=f"this config has .*{re.escape(blocker)}"):
    spec.RLConfig(old_logp_from="update", **changes)


def test_pi_old_source_is_resolved_at_the_config_edge():
  """The trainer's config edge resolves "auto": "update" for the demo's plan (one step),
  "forward" with two mini-batches or adapter dropout; an explicit "update" with adapter
  dropout is one error, and an unknown source names the allowed ones."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415
  from grpo_jax.trainer import build  # noqa: PLC0415

  def resolved(**rl):
    c = arithmetic.get_config("quick")
    c.rl.update(rl)
    return build.build(c).rl_cfg.old_logp_from

  assert spec.RLConfig().old_logp_from == "auto"
  assert resolved() == "update"
  assert resolved(kl_coef=0.04) == "update"  # A KL in the loss reads π_θ, not π_old.
  assert resolved(num_minibatches=2) == "forward"
  c = arithmetic.get_config("quick")
  c.model.lora.update(rank=2, dropout=0.1)
  assert build.build(c).rl_cfg.old_logp_from == "forward"
  c.rl.old_logp_from = "update"
  with pytest.raises(config_lib.ConfigError, match="this config has adapter dropout"):
    build.build(c)
  with pytest.raises(ValueError, match=r"allowed: \('auto', 'forward', 'update'\)"):
    spec.RLConfig(old_logp_from="fused")


def test_bench_old_logp_times_both_sources_on_the_same_run():
  """experiments/bench_old_logp.py --quick: both sources train the same losses and each
  phase is timed (speed is the script's business, not a test's)."""
  import bench_old_logp  # noqa: PLC0415

  r = bench_old_logp.main(["--quick"])
  w = r["workloads"]["quick"]
  assert w["loss_max_rel_diff"] < 1e-3 and w["samples"] == 2
  assert w["iteration_ratio"] == pytest.approx(
    w["forward"]["iteration_s"] / w["update"]["iteration_s"]
  )
  assert all(w[s][k] > 0 for s in ("forward", "update") for k in ("update_s", "iteration_s"))


def test_the_committed_old_logp_record_is_what_its_rows_say():
  """experiments/results/cpu/2026-12-06_epyc_old_logp: a description of one sitting (not
  judged), each workload's ratio its two iteration times', the two sources' losses equal,
  and its figures the ones docs/benchmarks.md quotes."""
  import json  # noqa: PLC0415
  import pathlib  # noqa: PLC0415

  root = pathlib.Path(__file__).resolve().parents[2]
  r = json.loads((root / "experiments/results/cpu/2026-12-06_epyc_old_logp.json").read_text())
  assert (r["claim"], r["verdict"], r["dtype"], r["seeds"]) == (None, "not judged", "float32", [0])
  doc = (root / "docs" / "benchmarks.md").read_text()
  for name, w in r["workloads"].items():
    assert w["loss_max_rel_diff"] < 1e-3, name
    ratio = w["forward"]["iteration_s"] / w["update"]["iteration_s"]
    assert w["iteration_ratio"] == pytest.approx(ratio)
    assert f"{w['forward']['iteration_s']:.3f} s against {w['update']['iteration_s']:.3f} s" in doc
    assert f"({ratio:.2f}×)" in doc
