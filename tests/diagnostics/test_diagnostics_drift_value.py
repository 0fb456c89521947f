"""Drift monitors, learning tax, Monte-Carlo token value (with a fake policy whose success
probability is known), and the periodic report end to end on the tiny model."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.diagnostics import cancellation, drift, report, value
from grpo_jax.infra import metrics
from grpo_jax.models import logprobs, model, sampling
from grpo_jax.rl import spec

V = 16


# ----------------------------------------------------------------------------
# Host helpers and pinned formulas.
# ----------------------------------------------------------------------------


def test_pad_references_layout():
  pt, pm, ct, cm = drift.pad_references([[5, 6], [7]], [[8], [9, 10, 11]], pad_id=0)
  np.testing.assert_array_equal(pt, [[5, 6], [0, 7]])
  np.testing.assert_array_equal(pm, [[1, 1], [0, 1]])
  np.testing.assert_array_equal(ct, [[8, 0, 0], [9, 10, 11]])
  np.testing.assert_array_equal(cm, [[1, 0, 0], [1, 1, 1]])
  with pytest.raises(ValueError, match="exceeds"):
    drift.pad_references([[5, 6]], [[1]], pad_id=0, prompt_len=1)


def test_length_trend_pinned():
  assert drift.length_trend([1, 3, 5, 7]) == 2.0
  assert drift.length_trend([10, 0, 4, 6], window=2) == 2.0
  np.testing.assert_allclose(drift.length_trend([3, 1, 2]), -0.5)  # x = [-1, 0, 1]: (-3 + 2)/2
  assert np.isnan(drift.length_trend([4.0]))


def test_weak_credit_ids_and_learning_tax_pinned():
  # Present counts [10, 8, 1, 9]: median 8.5, so ids 1 (10) and 4 (9) are frequent; id 1's
  # residual 0.05 <= 0.1·1 (weak), id 4's 0.01 > 0.1·0.05 (not).
  weak = drift.weak_credit_ids(
    jnp.asarray([0.0, 0.05, 0.5, 0.0, 0.01]),
    jnp.asarray([0.0, 1.0, 1.0, 0.2, 0.05]),
    jnp.asarray([0.0, 10.0, 8.0, 1.0, 9.0]),
    eps=0.1,
    freq_quantile=0.5,
  )
  np.testing.assert_array_equal(weak, [False, True, False, False, False])
  # Column norms² 9, 16, 1 (total 26); weak columns {0, 2}: 10/26.
  dW = jnp.asarray([[3.0, 0.0, 1.0], [0.0, 4.0, 0.0]])
  np.testing.assert_allclose(drift.learning_tax(dW, jnp.asarray([True, False, True])), 10 / 26)
  assert float(drift.learning_tax(jnp.zeros((2, 3)), jnp.ones(3, bool))) == 0.0


def test_value_by_flip_pinned():
  # Tokens: (value, gain, Δ, ā): boosted pos (0.9, 0.2), boosted neg (0.7, 0.1), suppressed pos
  # (0.3, -0.1), suppressed neg (0.1, -0.3), unchanged pos (0.5, 0.0).
  v = value.value_by_flip(
    [0.9, 0.7, 0.3, 0.1, 0.5],
    [0.2, 0.1, -0.1, -0.3, 0.0],
    [0.5, 0.2, -0.4, -0.2, 0.0],
    [1.0, -1.0, 2.0, -0.5, 1.0],
    tau=0.01,
  )
  np.testing.assert_allclose(v["value/pos/value_gap"], 0.9 - 0.3)
  np.testing.assert_allclose(v["value/neg/value_gap"], 0.7 - 0.1)
  np.testing.assert_allclose(v["value/all/boosted/value"], 0.8)
  np.testing.assert_allclose(v["value/all/gain_gap"], 0.15 - (-0.2))
  assert (v["value/pos/unchanged/count"], v["value/neg/unchanged/count"]) == (1, 0)
  assert np.isnan(v["value/neg/unchanged/value"])
  for key in v:
    metrics.definition(key)


# ----------------------------------------------------------------------------
# Monte-Carlo value with a fake policy.
# ----------------------------------------------------------------------------

# Tokens: 0 pad, 1 EOS, 2 = A, 3 = B, 4 = X. After A or B the policy emits EOS; after anything
# else it emits A with probability p = sigmoid(params["logit"]) and B otherwise. The reward is
# 1 iff the completion contains A, so V(prefix) = 1 if the prefix holds A, 0 if it ends in B,
# and p otherwise.
PAD, EOS, A, B, X = 0, 1, 2, 3, 4
P_A = 0.3


@flax.struct.dataclass
class FakeCache:
  index: jax.Array

  def repeat(self, n):
    del n
    return self


def _fake_model(params, tokens_BT, positions_BT, cache):
  del positions_BT
  base = jnp.full((5,), -1e9).at[A].set(params["logit"]).at[B].set(0.0)
  done_BT = (tokens_BT == A) | (tokens_BT == B)
  logits_BTV = jnp.where(done_BT[..., None], 30.0 * jax.nn.one_hot(EOS, 5), base[None, None, :])
  return logits_BTV, cache


@pytest.fixture(scope="module")
def fake_sampler():
  cfg = sampling.SamplerConfig(
    max_new_tokens=3, eos_ids=(EOS,), pad_id=PAD, group_size=256, prompt_buckets=(4, 8)
  )
  fn = sampling.make_sample_fn(
    model_fn=_fake_model,
    init_cache=lambda b, n: FakeCache(index=jnp.zeros((), jnp.int32)),
    cfg=cfg,
  )
  return (lambda p, prompts, key: fn(p, prompts, key, sampling.sampling_params())), cfg


def _reward(prompt, completion):
  del prompt
  return float(A in completion)


def test_mc_value_equals_the_known_success_probability(fake_sampler):
  sample_fn, cfg = fake_sampler
  params = {"logit": jnp.log(P_A / (1 - P_A))}
  # Probe rows: prompt [X, X]; completions [X, A, EOS] and [X, B, EOS].
  pt = np.full((2, 2), X, np.int32)
  pm = np.ones((2, 2), bool)
  tt = np.asarray([[X, A, EOS], [X, B, EOS]], np.int32)
  rows, cols = np.asarray([0, 0, 1]), np.asarray([0, 1, 1])
  out = value.token_values(
    sample_fn,
    params,
    pt,
    pm,
    tt,
    rows,
    cols,
    jax.random.key(0),
    reward_fn=_reward,
    sampler_cfg=cfg,
    batch_size=4,  # 6 prefixes: two batches, the second padded.
  )
  # Deterministic cases: exactly 1 after A, exactly 0 after B.
  assert out["after"][1] == 1.0 and out["after"][2] == 0.0
  # Prefixes without A or B: p, within 4 binomial standard errors (K = 256 each).
  se = np.sqrt(P_A * (1 - P_A) / 256)
  for v in (out["before"][0], out["after"][0], out["before"][1], out["before"][2]):
    assert abs(v - P_A) < 4 * se, v
  np.testing.assert_allclose(out["gain"], out["after"] - out["before"])
  # The continuation's own length is what the reward sees: A then EOS, or B then EOS.
  prefixes = value.build_prefixes(pt, pm, tt, rows, cols, include_token=True)
  assert prefixes == [([X, X], [X]), ([X, X], [X, A]), ([X, X], [X, B])]


def test_mc_value_is_exact_for_a_deterministic_policy(fake_sampler):
  sample_fn, cfg = fake_sampler
  prefixes = [([X], []), ([X], [X, X])]
  for logit, want in ((40.0, 1.0), (-40.0, 0.0)):
    values, rewards = value.mc_values(
      sample_fn,
      {"logit": jnp.float32(logit)},
      prefixes,
      jax.random.key(1),
      reward_fn=_reward,
      sampler_cfg=cfg,
    )
    np.testing.assert_array_equal(values, [want, want])
    assert rewards.shape == (2, 256)


# ----------------------------------------------------------------------------
# Drift monitors and the report on the tiny model.
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
  cfg = model.tiny_config(V, tie_embeddings=False)
  params = jax.jit(functools.partial(model.init, cfg))(jax.random.key(0))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0
  rng = np.random.default_rng(1)
  pt = rng.integers(3, V, (4, 3)).astype(np.int32)
  pm = np.ones((4, 3), bool)
  pm[1, :2] = False
  tt = rng.integers(5, V, (4, 5)).astype(np.int32)
  tt[:, 0] = 4  # A shared "template" token at the start of every completion.
  mm = np.arange(5)[None, :] < np.asarray([5, 2, 4, 3])[:, None]
  return cfg, params, (pt, pm, tt, mm)


def test_solution_drift_and_policy_stats(tiny):
  cfg, params, inputs = tiny
  model_fn = model.make_model_fn(cfg)
  logp, stats = jax.jit(
    lambda p: logprobs.completion_logprobs(p, *inputs, model_fn=model_fn, with_stats=True)
  )(params)
  m = inputs[3]
  got = jax.jit(lambda p: drift.solution_drift(p, *inputs, model_fn=model_fn))(params)
  np.testing.assert_allclose(
    got["drift/solution_logp_token"], np.sum(logp * m) / m.sum(), rtol=1e-6
  )
  np.testing.assert_allclose(
    got["drift/solution_logp_seq"], np.mean(np.sum(logp * m, 1)), rtol=1e-6
  )

  stats_fn = jax.jit(drift.policy_stats, static_argnames=("model_fn", "row_chunk"))
  same = stats_fn(params, params, *inputs, model_fn=model_fn)
  np.testing.assert_allclose(
    same["drift/entropy"], np.sum(stats["entropy"] * m) / m.sum(), rtol=1e-5
  )
  assert abs(float(same["drift/kl_init"])) < 1e-6 and float(same["drift/kl_init_k3"]) == 0.0
  # A perturbed policy: exact KL over the vocabulary, checked against numpy; chunked rows agree.
  other = jax.tree.map(lambda x: x * 1.3, params)
  kl = stats_fn(other, params, *inputs, model_fn=model_fn)
  chunked = stats_fn(other, params, *inputs, model_fn=model_fn, row_chunk=2)
  z = np.asarray(drift.completion_logits(other, *inputs, model_fn=model_fn), np.float64)
  z0 = np.asarray(drift.completion_logits(params, *inputs, model_fn=model_fn), np.float64)
  lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
  lp0 = z0 - np.log(np.exp(z0).sum(-1, keepdims=True))
  want = np.sum(np.sum(np.exp(lp) * (lp - lp0), -1) * m) / m.sum()
  assert want > 1e-2
  np.testing.assert_allclose(kl["drift/kl_init"], want, rtol=1e-4)
  for k in kl:
    np.testing.assert_allclose(chunked[k], kl[k], rtol=1e-5)
    metrics.definition(k)


def test_token_credit_report_after_an_lm_head_sgd_step(tiny):
  cfg, params, (pt, pm, tt, mm) = tiny
  adv = np.where(mm, np.asarray([1.0, -1.0, -1.0, 1.0], np.float32)[:, None], 0.0).astype(
    np.float32
  )
  ids = np.asarray([0, 0, 1, 1], np.int32)
  batch = spec.RolloutBatch(
    prompt_tokens_NP=pt,
    prompt_mask_NP=pm,
    tokens_NT=tt,
    mask_NT=mm,
    loss_mask_NT=mm,
    adv_NT=adv,
    old_logp_NT=np.zeros_like(adv),
    ref_logp_NT=np.zeros_like(adv),
    group_ids_N=ids,
  )
  probe = report.Probe.from_batch(batch)
  lr = 0.02
  w = cancellation.aggregation_weights("token_mean", mm, ids, adv)
  coef = cancellation.coefficients(adv, w, mm)
  model_fn = model.make_model_fn(cfg)

  def loss(kernel):
    p = {**params, "lm_head": {"kernel": kernel}}
    return -jnp.sum(coef * logprobs.completion_logprobs(p, pt, pm, tt, mm, model_fn=model_fn)[0])

  kernel = params["lm_head"]["kernel"]
  after = {**params, "lm_head": {"kernel": kernel - lr * jax.jit(jax.grad(loss))(kernel)}}
  out = report.token_credit_report(
    params, after, probe, model_cfg=cfg, template_ids=[4], sgd_lr=lr, init_params=params
  )
  for key in out:
    metrics.definition(key)
  # The update is exactly the SGD step on the head: both fits are first-order tight.
  assert out["coupling/fit/corr"] > 0.999 and out["coupling/fit/rel_err"] < 0.05
  np.testing.assert_allclose(
    out["coupling/head_update_fit/corr"], out["coupling/fit/corr"], rtol=1e-4
  )
  assert out["flip/all/all/count"] == mm.sum() and out["flip/all/template/count"] == 4
  assert 0.0 <= out["tax/learning_tax"] <= 1.0
  np.testing.assert_allclose(out["tax/learning_tax"], out["tax/learning_tax_sgd"], rtol=1e-3)
  assert out["drift/kl_init"] > 0.0
  # Token 4 opens every completion, A = [1, -1, -1, 1] with w = 1/14: it cancels exactly.
  assert out["cancel/template/residual_ratio"] == 0.0
  # A periodic hook: calling again (new params, same shapes) compiles nothing new.
  again = report.token_credit_report(after, params, probe, model_cfg=cfg, init_params=params)
  assert all(f._cache_size() == 1 for f in report._compiled(cfg))
  np.testing.assert_allclose(again["flip/all/all/boosted"], out["flip/all/all/suppressed"])
