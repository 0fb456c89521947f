"""IBPO in the trainer: counterfactual rows through the whole iteration (sample, branch,
score, merge, prepare, update), exact resume, perturbed prompts, and the config checks."""

import dataclasses

import ibpo
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import runs

from grpo_jax.infra import config_lib, metrics
from grpo_jax.rl import advantages, aggregation, counterfactuals, learner, losses, spec
from grpo_jax.trainer import build, rollout, run_state, steps, train
from grpo_jax.verifiers import reward_pool


def _tiny(variant="tiny", **loop):
  c = ibpo.get_config(variant)
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
  c.task.kwargs = dict(min_digits=1, max_digits=2)
  c.sampler.update(max_new_tokens=26, group_size=4)
  c.counterfactual.update(per_group=4 if variant == "tiny" else 2)
  c.update(prompts_per_step=4, iterations=4, warmstart_steps=40, warmstart_batch=32)
  c.update(eval_every=2, eval_size=8, eval_samples=0, checkpoint_every=2, reward_workers=0)
  c.update(progress=False, **loop)
  c.rl.format_weight = 0.5  # Rewards vary even when the small model solves nothing.
  return c


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("ibpo_reference")
  train.run(_tiny(), workdir, log=lambda _: None)
  return workdir


def test_counterfactual_rows_train_and_log_their_metrics(reference_run):
  lines = runs.lines(reference_run)
  assert [x["iteration"] for x in lines] == [0, 1, 2, 3, 4]
  for line in lines:
    for name in line:
      metrics.definition(name)  # Every logged key is documented.
  rl_lines = lines[1:]
  assert any(x["ibpo/counterfactual_rows"] > 0 for x in rl_lines)
  for x in rl_lines:
    assert 0 <= x["ibpo/counterfactual_rows"] <= 16  # 4 prompts × C = 4 slots.
    assert x["ibpo/generated_tokens"] >= x["ibpo/counterfactual_tokens"] >= 0
    hist = sum(v for k, v in x.items() if k.startswith("ibpo/distance_frac/"))
    if x["ibpo/counterfactual_rows"]:
      assert hist == pytest.approx(1.0, abs=1e-5)
      assert 0.0 <= x["ibpo/kept_pair_frac"] <= 1.0
      assert 0.0 <= x["ibpo/edit_distance_mean"] <= 1.0
    assert x["ibpo/is_weight_mean"] in (0.0, 1.0)  # Branches: weight 1.
    assert "time/counterfactuals" in x and np.isfinite(x["loss"])


def test_resume_with_counterfactuals_reproduces_the_uninterrupted_run(reference_run, tmp_path):
  ref = runs.lines(reference_run)

  def crash(it, record):
    if it == 3:
      raise RuntimeError("simulated crash")

  with pytest.raises(RuntimeError, match="simulated crash"):
    train.run(_tiny(), tmp_path, log=lambda _: None, on_iteration=crash)
  train.run(_tiny(), tmp_path, log=lambda _: None)
  lines = runs.lines(tmp_path)
  assert [x["iteration"] for x in lines] == [0, 1, 2, 3, 4]
  for got, want in zip(lines, ref, strict=True):
    assert runs.untimed(got) == runs.untimed(want)


def _iteration(c, *, key=1):
  """One iteration's merged batch through prepare from the initial policy: (setup,
  collected, RolloutBatch, stats, params)."""
  setup = build.build(c)
  fns = steps.functions(setup)
  params = run_state.initial_params(setup, fns, jax.random.key(0))
  with reward_pool.RewardPool(setup.task, workers=0, timeout_s=10.0) as pool:
    got = rollout.collect(setup, fns, pool, params, None, index=0, key=jax.random.key(key))
  hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  s = got.scores
  batch, _, stats = fns.rl.finish(
    got.logprobs, got.rollouts, s.correct_N, s.format_N, hyper, s.scorable_N, None, got.provenance
  )
  return setup, got, batch, stats, params


def test_counterfactuals_inform_phi_only_and_lambda_zero_is_grpo_on_the_samples():
  c = _tiny()
  c.rl.advantage_hyper.ibpo_lambda = 0.0
  setup, got, batch, _, _ = _iteration(c)
  prov = got.provenance
  sample_N = np.asarray(prov.kind_N) == 0
  cf_N = ~sample_N
  assert cf_N.sum() == 16 and sample_N.sum() == 16
  # Not trained: no loss token, no advantage on counterfactual rows.
  assert not np.any(np.asarray(batch.loss_mask_NT)[cf_N])
  # λ = 0: the samples' advantages are GRPO's over the G samples of each group alone.
  r = jnp.asarray(got.scores.correct_N) + 0.5 * jnp.asarray(got.scores.format_N)
  inputs = advantages.AdvantageInputs(
    rewards_B=r[sample_N],
    group_ids_B=got.rollouts.group_ids_N[sample_N],
    mask_BT=got.rollouts.mask_NT[sample_N],
  )
  want = advantages.REGISTRY.make("grpo")(
    inputs, advantages.hyper_values(**setup.rl_cfg.advantage_values)
  )
  np.testing.assert_allclose(np.asarray(batch.adv_NT)[sample_N], want, atol=1e-6)
  # The merged batch is group-major: G samples then C counterfactuals per group.
  np.testing.assert_array_equal(prov.kind_N, np.tile([0] * 4 + [1] * 4, 4))


def test_trained_branches_train_only_the_tokens_they_decoded():
  c = _tiny()
  c.counterfactual.update(train=True, branch_from="all", cut="window")
  _, got, batch, _, _ = _iteration(c)
  prov = got.provenance
  own = np.asarray(prov.own_NT)
  loss = np.asarray(batch.loss_mask_NT)
  cf_N = np.asarray(prov.kind_N) != 0
  assert not np.any(loss & ~own)  # A branch's prefix (its parent's tokens) is never trained.
  assert np.any(loss[cf_N])  # Its continuation is.
  # The prefix equals its parent's tokens.
  tokens, parent = np.asarray(got.rollouts.tokens_NT), np.asarray(prov.parent_N)
  for n in np.flatnonzero(cf_N & np.asarray(prov.active_N)):
    head = np.asarray(got.rollouts.mask_NT[n]) & ~own[n]
    np.testing.assert_array_equal(tokens[n][head], tokens[parent[n]][head])


def test_perturbed_prompt_rows_carry_truncated_importance_weights():
  c = _tiny("hint")
  c.counterfactual.update(train=True, branch_from="all")
  c.rl.advantage_hyper.ibpo_is_cap = 1.5
  _, got, batch, stats, _ = _iteration(c)
  assert float(stats["ibpo/counterfactual_rows"]) == 8
  w = float(stats["ibpo/is_weight_mean"])
  assert 0.0 <= w <= 1.5
  # The rows carry the original prompt q (the trainer's π(o|q) forward), not the hint q~.
  prov = got.provenance
  cf = np.asarray(prov.kind_N) == counterfactuals.KINDS.index("hint")
  p = np.asarray(prov.parent_N)
  np.testing.assert_array_equal(
    np.asarray(got.rollouts.prompt_tokens_NP)[cf], np.asarray(got.rollouts.prompt_tokens_NP)[p[cf]]
  )


@pytest.mark.parametrize(
  "changes, match",
  [
    (
      {"rl.advantage": "grpo", "rl.advantage_options": {}},
      "the counterfactual rows would be sampled and never used",
    ),
    (
      {"rl.dynamic_sampling": True, "rl.max_gen_batches": 4},
      "does not combine with rl.dynamic_sampling",
    ),
    (
      {"counterfactual.source": "hint", "rl.recompute_old_logp": False},
      "weighting='truncated_is' needs",
    ),
    ({"rl.advantage_hyper.ibpo_tau": 0.0}, r"ibpo_tau=0.0: must be in \(0, 1\]"),
    ({"rl.advantage_hyper.ibpo_tau": 1.5}, r"ibpo_tau=1.5: must be in \(0, 1\]"),
    ({"counterfactual.per_group": 3}, "must be a multiple of per_rollout"),
    ({"counterfactual.weighting": "clip"}, "counterfactual.weighting='clip'; allowed"),
    (
      {"counterfactual.train": True, "diagnostics.every": 2},
      "the diagnostics probe groups of G samples",
    ),
    # Plans that read more of a parent than the prefix its row keeps (biased_choices).
    ({"counterfactual.branch_from": "failed"}, r"biases rl.advantage='ibpo'.*outcome.*use 'all'"),
    (
      {"counterfactual.cut": "uniform"},
      r"cut='uniform' draws the cut from \|o_p\| \(use 'window'\)",
    ),
    ({"counterfactual.cut": "step"}, r"cut='step' .* \(use 'next_step'\)"),
    (
      {"rl.advantage_hyper.ibpo_tau": 0.5},
      r"rl.advantage_hyper.ibpo_tau=0.5 keeps a counterfactual by its distance",
    ),
    (
      {"rl.advantage_options": {"state": "span", "context": 2}},
      r"branches with ibpo state 'span'.*Use state 'window' or 'prefix'",
    ),
    (
      {"rl.advantage_options": {"state": "span", "context": 2}, "counterfactual.accept_bias": True},
      r"branches with ibpo state 'span'",
    ),
    ({"rl.advantage_options": {"state": "trie"}}, r"ibpo state must be one of prefix, window"),
    ({"rl.advantage_options": {"state": "window"}}, r"reads the last `context` tokens"),
    ({"rl.advantage_options": {"context": 3}}, r"context=3 is for state 'window' or 'span'"),
    (
      {"counterfactual.branch_from": "correct", "rl.advantage_hyper.ibpo_tau": 0.5},
      r"branch_from='correct'.*; rl.advantage_hyper.ibpo_tau=0.5.*accept_bias=True",
    ),
  ],
)
def test_bad_counterfactual_configs_fail_before_compiling(changes, match):
  c = _tiny()
  for k, v in changes.items():
    *parents, leaf = k.split(".")
    node = c
    for p in parents:
      node = node[p]
    node[leaf] = v
  with pytest.raises(config_lib.ConfigError, match=match):
    build.build(c)


def test_unsupported_perturbation_and_missing_step_splitter_are_refused(monkeypatch):
  c = _tiny()
  c.task.name = "arithmetic"
  c.task.kwargs = {}
  c.counterfactual.source = "repair"
  with pytest.raises(config_lib.ConfigError, match=r"source='repair' samples from a prompt"):
    build.build(c)  # Biased for IBPO: refused unless accepted.
  c.counterfactual.accept_bias = True
  setup = build.build(c)  # Arithmetic supports repair.
  assert setup.train_group == 8
  from grpo_jax.tasks import arithmetic  # noqa: PLC0415

  monkeypatch.setattr(arithmetic.Arithmetic, "perturbations", ("hint",))
  with pytest.raises(config_lib.ConfigError, match="perturbs its prompts by hint"):
    build.build(c)
  monkeypatch.setattr(arithmetic.Arithmetic, "step_end_text", ("AN",))  # Not one token.
  c.counterfactual.update(source="branch", cut="step")
  with pytest.raises(config_lib.ConfigError, match="needs the task's step splitter"):
    build.build(c)
  c.counterfactual.update(cut="next_step")  # It reads step starts too (else no branch ever).
  with pytest.raises(config_lib.ConfigError, match="cut 'next_step' .* use cut 'window'"):
    build.build(c)


@pytest.fixture(scope="module")
def ibpo_batch():
  """A prepared IBPO batch with trained branches (λ = 1): (setup, params, batch)."""
  c = _tiny()
  c.counterfactual.update(train=True, branch_from="all")
  setup, got, _, _, params = _iteration(c, key=5)
  # Rewards that vary within every group (the tiny policy solves nothing), so the base
  # advantage and the prefix baseline's comparison are both non-zero.
  n = got.rollouts.tokens_NT.shape[0]
  correct = (np.arange(n) % 3 == 0).astype(np.float32)
  hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=26)
  batch, _, stats = steps.functions(setup).rl.finish(
    got.logprobs, got.rollouts, correct, 0 * correct, hyper, None, None, got.provenance
  )
  assert float(jnp.max(jnp.abs(batch.adv_NT))) > 0 and float(stats["ibpo/comparison_abs_mean"]) > 0
  return setup, params, batch


_COMBOS = [("policy_loss", n) for n in ("cispo", "gspo", "ppo_clip", "reinforce")] + [
  ("aggregation", n)
  for n in (
    "balanced",
    "constant_norm",
    "group_token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
  )
]


@pytest.mark.parametrize("field, name", _COMBOS)
def test_ibpo_advantages_compose_with_every_policy_loss_and_aggregation(ibpo_batch, field, name):
  """The shaped token advantages (with counterfactual rows in the batch) feed every policy
  loss and aggregation mode: a finite step that moves the params."""
  assert name in (losses.REGISTRY if field == "policy_loss" else aggregation.REGISTRY)
  setup, params, batch = ibpo_batch
  cfg = dataclasses.replace(setup.rl_cfg, **{field: name})
  optimizer = spec.make_optimizer(lr=1e-2)
  fns = steps.functions(setup)
  state = spec.init_state(params, optimizer)
  new, m = jax.jit(
    lambda s, b: learner.train_step(
      s, b, cfg.step_hyper(), cfg=cfg, model_fn=fns.model_fn, optimizer=optimizer
    )
  )(state, batch)
  assert float(m["nonfinite"]) == 0.0 and np.isfinite(float(m["loss"]))
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.any(a != b), new.params, params))
  assert any(bool(x) for x in moved)


@pytest.mark.parametrize(
  "planner", ["length_sorted", "query_preserved", "random", "reward_balanced"]
)
def test_ibpo_with_counterfactuals_builds_under_every_planner(planner):
  """Every planner plans the merged groups of G + C rows (trained counterfactuals) or the
  samples' groups (φ-only), before anything compiles."""
  for train_cf in (False, True):
    c = _tiny()
    c.counterfactual.train = train_cf
    c.rl.update(planner=planner, num_minibatches=2)
    setup = build.build(c)
    assert setup.update_group == (8 if train_cf else 4)
