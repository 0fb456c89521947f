"""IBPO's counterfactual rows (`counterfactuals`): planning, branching in the jitted
sampler, the merged batch, the full-rewrite filter and the importance weights."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import logprobs, model, sampling
from grpo_jax.rl import alignment, counterfactuals
from grpo_jax.rollouts import counterfactuals as cf_gen

CF = counterfactuals


def _rollouts(tokens, lengths, *, P=4, G=2):
  """Rollouts with the given completions (right-padded with 0) and a fixed prompt."""
  tokens = np.asarray(tokens, np.int32)
  N, T = tokens.shape
  mask = np.arange(T) < np.asarray(lengths)[:, None]
  prompt = np.tile(np.array([[0, 0, 5, 6]], np.int32)[:, :P], (N, 1))
  pmask = prompt != 0
  logp = np.where(mask, -0.5, 0.0).astype(np.float32)
  return sampling.Rollouts(
    prompt_tokens_NP=jnp.asarray(prompt),
    prompt_mask_NP=jnp.asarray(pmask),
    tokens_NT=jnp.asarray(np.where(mask, tokens, 0)),
    mask_NT=jnp.asarray(mask),
    logp_NT=jnp.asarray(logp),
    policy_logp_NT=jnp.asarray(logp),
    eos_N=jnp.ones(N, bool),
    truncated_N=jnp.zeros(N, bool),
    length_N=jnp.asarray(lengths, jnp.int32),
    group_ids_N=jnp.asarray(np.arange(N) // G, jnp.int32),
    num_steps=jnp.asarray(T, jnp.int32),
  )


def test_prefix_prompts_left_align_prompt_and_prefix():
  prompt = jnp.asarray([[0, 0, 5, 6], [0, 7, 8, 9]], jnp.int32)
  tokens = jnp.asarray([[1, 2, 3], [4, 5, 0]], jnp.int32)
  got = cf_gen.prefix_prompts(
    prompt, prompt != 0, tokens, jnp.asarray([2, 0]), pad_id=0
  )  # Keep o[:2] of row 0 and nothing of row 1.
  np.testing.assert_array_equal(got.tokens_BP, [[0, 0, 0, 5, 6, 1, 2], [0, 0, 0, 0, 7, 8, 9]])
  np.testing.assert_array_equal(got.mask_BP, np.asarray(got.tokens_BP) != 0)


def test_plan_picks_failed_parents_per_group_and_cuts_inside_them():
  # Two groups of G = 3; rows 0 and 4 are correct, row 5 is one token long (ineligible).
  r = _rollouts(np.ones((6, 8)), [5, 4, 6, 3, 7, 1], G=3)
  correct = jnp.asarray([1.0, 0, 0, 0, 1, 0])
  cfg = CF.CounterfactualConfig(per_group=4, per_rollout=2, branch_from="failed", cut="uniform")
  p = cf_gen.plan(jax.random.key(0), r, correct, cfg=cfg, group_size=3)
  parent, cut = np.asarray(p.parent_M), np.asarray(p.cut_M)
  np.testing.assert_array_equal(p.active_M, [True] * 4 + [True] * 4)
  assert set(parent[:4]) == {1, 2}  # Group 0's failed rows, each twice (C/k = 2 picks).
  assert set(parent[4:]) == {3}  # Group 1: row 3 only (row 5 too short), cycled.
  assert parent[0] == parent[1] and cut[0] == cut[1]  # k = 2 continuations share a cut.
  length = np.asarray(r.length_N)[parent]
  assert np.all((cut >= 1) & (cut <= length - 1))
  # No eligible row: the group's slots stay inactive.
  p = cf_gen.plan(jax.random.key(0), r, jnp.ones(6), cfg=cfg, group_size=3)
  assert not np.any(p.active_M)


def test_plan_token_budget_and_step_and_divergence_cuts():
  tokens = [[1, 2, 9, 3, 4, 9, 5, 6], [1, 2, 9, 3, 7, 9, 5, 6]]  # 9 ends a step.
  r = _rollouts(tokens, [8, 8], G=2)
  cfg = CF.CounterfactualConfig(per_group=4, branch_from="all", cut="step")
  steps = alignment.StepSplitter(end_ids=(9,))
  p = cf_gen.plan(jax.random.key(1), r, jnp.zeros(2), cfg=cfg, group_size=2, splitter=steps)
  assert set(np.asarray(p.cut_M)) <= {3, 6}  # Step starts (after a 9).
  # A "Step k" splitter: steps start at the pattern [7] instead.
  r7 = _rollouts([[7, 1, 2, 7, 3, 4, 7, 5], [7, 1, 7, 2, 3, 7, 4, 5]], [8, 8], G=2)
  starts = alignment.StepSplitter(start_pattern=(7,))
  p = cf_gen.plan(jax.random.key(2), r7, jnp.zeros(2), cfg=cfg, group_size=2, splitter=starts)
  cut, parent = np.asarray(p.cut_M), np.asarray(p.parent_M)
  assert set(cut[parent == 0]) <= {3, 6} and set(cut[parent == 1]) <= {2, 5}
  cfg = CF.CounterfactualConfig(per_group=2, branch_from="all", cut="divergence")
  p = cf_gen.plan(jax.random.key(1), r, jnp.zeros(2), cfg=cfg, group_size=2)
  np.testing.assert_array_equal(p.cut_M, [5, 5])  # They part at t* = 4: keep o_{≤4}.
  # Budget: a divergence slot is priced T − 1 = 7 (the most a branch may decode, read
  # before the rollouts, not |o| − c): 4 slots under 14 -> 2. A perturbed one costs T = 8.
  cfg = CF.CounterfactualConfig(per_group=4, branch_from="all", cut="divergence", token_budget=14)
  p = cf_gen.plan(jax.random.key(1), r, jnp.zeros(2), cfg=cfg, group_size=2)
  assert int(np.sum(p.active_M)) == 2
  hint = CF.CounterfactualConfig(per_group=4, branch_from="all", source="hint", token_budget=17)
  p = cf_gen.plan(jax.random.key(1), r, jnp.zeros(2), cfg=hint, group_size=2)
  assert int(np.sum(p.active_M)) == 2 and not np.any(np.asarray(p.cut_M))


def test_window_and_next_step_cuts_read_only_the_prefix_they_keep():
  """window: c ~ U{1, …, W} whatever the parent's length, no branch where the parent ended
  first (c ≥ |o|); next_step: the first step start at or after such a draw. Same key, so
  the same draws u: a parent's length or later tokens only switch a slot off."""
  steps = alignment.StepSplitter(end_ids=(9,))
  tokens = [[1, 9, 2, 9, 3, 9, 4, 5], [1, 2, 3, 4, 5, 6, 7, 9]]
  long_ = _rollouts(tokens, [8, 8], G=2)
  short = _rollouts(tokens, [3, 8], G=2)  # Row 0 ends after 3 tokens.
  key = jax.random.key(5)
  kw = dict(group_size=2, splitter=steps)
  win = CF.CounterfactualConfig(per_group=64, branch_from="all", cut="window", cut_window=6)
  a = cf_gen.plan(key, long_, jnp.zeros(2), cfg=win, **kw)
  b = cf_gen.plan(key, short, jnp.zeros(2), cfg=win, **kw)
  cut, parent = np.asarray(a.cut_M), np.asarray(a.parent_M)
  assert set(cut) == set(range(1, 7))  # U{1, …, W}, W = 6 (64 draws).
  assert np.all(a.active_M)
  np.testing.assert_array_equal(b.cut_M, cut)  # The draw does not read the length...
  np.testing.assert_array_equal(b.active_M, (parent == 1) | (cut < 3))  # ...only switches off.
  nxt = CF.CounterfactualConfig(per_group=64, branch_from="all", cut="next_step")
  a = cf_gen.plan(key, long_, jnp.zeros(2), cfg=nxt, **kw)
  cut, parent, on = np.asarray(a.cut_M), np.asarray(a.parent_M), np.asarray(a.active_M)
  assert set(cut[on & (parent == 0)]) == {2, 4, 6}  # Row 0's step starts (after a 9).
  assert not np.any(on & (parent == 1))  # Row 1 ends a step only at its last token.
  # u ~ U{1, …, 7}: a start at or after u exists for u ≤ 6, so about 6/7 of row 0's slots.
  assert 0.6 < on[parent == 0].mean() < 1.0


def test_divergence_gives_no_branch_where_the_parent_never_leaves_or_leaves_last():
  # Rows 0 and 1 are equal (never unique); row 2 leaves at t = 2, its last token; row 3 at
  # t = 1 of 4.
  tokens = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 0], [1, 6, 7, 8]]
  r = _rollouts(tokens, [4, 4, 3, 4], G=4)
  cfg = CF.CounterfactualConfig(per_group=4, branch_from="all", cut="divergence")
  p = cf_gen.plan(jax.random.key(0), r, jnp.zeros(4), cfg=cfg, group_size=4)
  on = dict(zip(np.asarray(p.parent_M), np.asarray(p.active_M), strict=True))
  cut = dict(zip(np.asarray(p.parent_M), np.asarray(p.cut_M), strict=True))
  assert on == {0: False, 1: False, 2: False, 3: True} and cut[3] == 2


def test_biased_choices_name_each_choice_and_its_replacement():
  ok = CF.CounterfactualConfig(per_group=4, branch_from="all", cut="window")
  none = alignment.NO_STEPS
  assert CF.biased_choices(ok, tau=1.0, steps=none) == ()
  # The shipped default plan is one IBPO may read (the default τ is 1).
  assert CF.biased_choices(CF.CounterfactualConfig(per_group=4), tau=1.0, steps=none) == ()
  for cut in ("divergence", "next_step"):
    cfg = CF.CounterfactualConfig(per_group=4, branch_from="all", cut=cut)
    assert CF.biased_choices(cfg, tau=1.0, steps=alignment.StepSplitter(end_ids=(9,))) == ()
  hint = CF.CounterfactualConfig(per_group=4, branch_from="all", source="hint", cut="uniform")
  assert CF.biased_choices(hint, tau=1.0, steps=none) == ()  # The cut is a branch's only.
  bad = CF.CounterfactualConfig(per_group=4, branch_from="failed", cut="step", source="branch")
  got = CF.biased_choices(bad, tau=0.5, steps=none)
  assert len(got) == 3
  assert "use 'all'" in got[0] and "use 'next_step'" in got[1] and "(use 1.0)" in got[2]
  pattern = alignment.StepSplitter(start_pattern=(7,))
  nxt = CF.CounterfactualConfig(per_group=4, branch_from="all", cut="next_step")
  assert "reads the tokens from c on" in CF.biased_choices(nxt, tau=1.0, steps=pattern)[0]
  repair = CF.CounterfactualConfig(per_group=4, branch_from="all", source="repair")
  assert "whole completion" in CF.biased_choices(repair, tau=1.0, steps=none)[0]


def test_branch_keeps_the_prefix_and_its_continuation_is_the_policy_s(
  tiny_cfg, tiny_params, sampler_cfg, tiny_sampler
):
  """The branch row's continuation log-probs equal the teacher-forced log-probs of the
  whole row: the left-aligned prefix and the positions are right."""
  prompts = sampling.prepare_prompts([[1, 5, 6, 7], [1, 8, 9]], cfg=sampler_cfg)
  hyper = sampling.sampling_params()
  r = tiny_sampler(tiny_params, prompts, jax.random.key(3), hyper)
  N, T = r.tokens_NT.shape
  plan = CF.Plan(
    parent_M=jnp.asarray([0, 0, 5, 6], jnp.int32),
    cut_M=jnp.asarray([1, 3, 2, 4], jnp.int32),
    active_M=jnp.asarray([True, True, True, False]),
  )
  plan = plan.replace(cut_M=jnp.minimum(plan.cut_M, jnp.maximum(r.length_N[plan.parent_M] - 1, 1)))
  fn = jax.jit(
    functools.partial(
      cf_gen.branch,
      model_fn=model.make_model_fn(tiny_cfg),
      init_cache=functools.partial(model.init_cache, tiny_cfg),
      cfg=sampler_cfg,
    )
  )
  rows, own = fn(tiny_params, r, plan, jax.random.key(4), hyper)
  cut = np.asarray(plan.cut_M)
  for m in range(3):
    p = int(plan.parent_M[m])
    np.testing.assert_array_equal(rows.tokens_NT[m, : cut[m]], r.tokens_NT[p, : cut[m]])
    assert not np.any(np.asarray(own[m, : cut[m]]))
    assert int(rows.length_N[m]) <= T
  assert int(rows.length_N[3]) == 0 and not np.any(np.asarray(own[3]))
  np.testing.assert_array_equal(rows.group_ids_N, [0, 0, 1, 1])
  lp, _ = logprobs.completion_logprobs(
    tiny_params,
    rows.prompt_tokens_NP,
    rows.prompt_mask_NP,
    rows.tokens_NT,
    rows.mask_NT,
    model_fn=model.make_model_fn(tiny_cfg),
  )
  np.testing.assert_allclose(
    np.where(own, lp, 0.0), np.where(own, rows.policy_logp_NT, 0.0), atol=2e-4
  )
  np.testing.assert_allclose(
    np.where(rows.mask_NT, lp, 0.0), np.where(rows.mask_NT, rows.policy_logp_NT, 0.0), atol=2e-4
  )


def test_merge_is_group_major_with_provenance():
  r = _rollouts(np.arange(1, 9)[:, None] * np.ones((8, 3), int), [3] * 8, G=2)  # B = 4.
  cf_rows = jax.tree.map(lambda x: x[:4] if x.ndim else x, r)
  plan = CF.Plan(
    parent_M=jnp.asarray([1, 2, 5, 7], jnp.int32),
    cut_M=jnp.ones(4, jnp.int32),
    active_M=jnp.ones(4, bool),
  )
  cf_rows = cf_rows.replace(group_ids_N=jnp.arange(4, dtype=jnp.int32))
  merged, prov = cf_gen.merge(r, cf_rows, cf_rows.mask_NT, plan, group_size=2, kind=1)
  np.testing.assert_array_equal(CF.merge_order(4, 2, 1), [0, 1, 8, 2, 3, 9, 4, 5, 10, 6, 7, 11])
  np.testing.assert_array_equal(merged.group_ids_N, np.repeat(np.arange(4), 3))
  np.testing.assert_array_equal(prov.kind_N, [0, 0, 1] * 4)
  # Parents, as rows of the merged batch: sample n sits at n + n // G.
  np.testing.assert_array_equal(prov.parent_N[2::3], [1, 3, 7, 10])
  np.testing.assert_array_equal(prov.parent_N[0::3], [0, 3, 6, 9])


def _prov(kind, parent, own):
  own = jnp.asarray(own)
  return CF.Provenance(
    kind_N=jnp.asarray(kind, jnp.int32),
    parent_N=jnp.asarray(parent, jnp.int32),
    own_NT=own,
    active_N=jnp.ones(own.shape[0], bool),
  )


def test_importance_weights_by_hand():
  own = [[True, True, False], [True, True, True], [True, False, False], [True, True, False]]
  prov = _prov([0, 1, 2, 4], [0, 0, 0, 0], own)
  old = jnp.asarray([[-1.0, -1, 0], [-1, -1, -1], [-0.5, 0, 0], [-2.0, -1.0, 0]])
  behaviour = jnp.asarray([[-1.0, -1, 0], [-3, -3, -3], [-1.0, 0, 0], [-1.0, -1.0, 0]])
  w = CF.importance_weights(old, behaviour, prov, jnp.float32(1.5), weighting="truncated_is")
  # Samples and branches: 1 (they are π(·|q)'s). Row 2: e^{0.5} = 1.6487 -> capped 1.5;
  # row 3: e^{-1} = 0.3679.
  np.testing.assert_allclose(w, [1.0, 1.0, 1.5, np.exp(-1.0)], rtol=1e-6)
  none = CF.importance_weights(old, behaviour, prov, 1.5, weighting="none")
  drop = CF.importance_weights(old, behaviour, prov, 1.5, weighting="drop")
  np.testing.assert_array_equal(none, [1, 1, 1, 1])
  np.testing.assert_array_equal(drop, [1, 1, 0, 0])
  # An unperturbed row's weight is 1 whatever its log-probs say.
  w_same = CF.importance_weights(old, old, prov, 1.5, weighting="truncated_is")
  np.testing.assert_allclose(w_same, [1, 1, 1, 1])


def test_rewrite_filter_keeps_local_repairs_only():
  tokens = jnp.asarray([[1, 2, 3, 4], [1, 2, 9, 4], [5, 6, 7, 8]], jnp.int32)
  mask = jnp.ones((3, 4), bool)
  prov = _prov([0, 1, 1], [0, 0, 0], mask)
  for tau, want in ((0.5, [True, True, False]), (1.0, [True, True, True])):
    kept, d = CF.rewrite_filter(tokens, mask, prov, jnp.float32(tau), distance="token")
    np.testing.assert_allclose(d, [0.0, 0.25, 1.0])
    np.testing.assert_array_equal(kept, want)
    # Only the counterfactual slots computed: the same answer.
    rows = CF.counterfactual_rows(3, group_size=1, per_group=2)
    np.testing.assert_array_equal(rows, [1, 2])
    kept_r, d_r = CF.rewrite_filter(
      tokens, mask, prov, jnp.float32(tau), distance="token", rows=rows
    )
    np.testing.assert_array_equal(kept_r, kept)
    np.testing.assert_allclose(d_r, d)


def test_config_errors():
  for bad, match in (
    (dict(source="nope"), "counterfactual.source='nope'; allowed"),
    (dict(per_group=-1), "per_group must be >= 0"),
    (dict(per_group=3, per_rollout=2), "must be a multiple of per_rollout"),
    (dict(cut="middle"), "counterfactual.cut='middle'"),
    (dict(per_rollout=0), "per_rollout must be >= 1"),
    (dict(cut_window=-1), "cut_window must be >= 0"),
  ):
    with pytest.raises(ValueError, match=match):
      CF.CounterfactualConfig(**bad)
