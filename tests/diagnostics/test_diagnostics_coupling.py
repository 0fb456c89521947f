"""LM-head coupling: the analytic kernel equals autodiff inner products, the first-order
prediction matches one SGD step, summaries pinned by hand; gradients and projections."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.diagnostics import cancellation, coupling, grads
from grpo_jax.infra import metrics
from grpo_jax.models import logprobs, model

V, B, P, T = 16, 4, 3, 5
LR = 0.02


@pytest.fixture(scope="module")
def untied():
  cfg = model.tiny_config(V, tie_embeddings=False)
  params = _init(cfg, 0)
  # Scaled-up embeddings: peaked, input-dependent distributions (confidences spread over bins).
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0
  return cfg, params


@pytest.fixture(scope="module")
def probe():
  """Ragged probe batch: one left-padded prompt, completion lengths [5, 3, 4, 2]; token 5
  appears in several rows (same-id pairs); A = ±1 by row, two groups."""
  rng = np.random.default_rng(0)
  pt = rng.integers(3, V, (B, P)).astype(np.int32)
  pm = np.ones((B, P), bool)
  pm[0, 0] = False
  tt = rng.integers(3, V, (B, T)).astype(np.int32)
  tt[:, 1] = 5
  mm = np.arange(T)[None, :] < np.asarray([5, 3, 4, 2])[:, None]
  adv = np.where(mm, np.asarray([1.0, -1.0, 1.0, -1.0], np.float32)[:, None], 0.0)
  ids = np.asarray([0, 0, 1, 1], np.int32)
  w = cancellation.aggregation_weights("token_mean", mm, ids, adv)
  coef = np.asarray(cancellation.coefficients(adv, w, mm))
  rows, cols, valid = coupling.select_tokens(mm, max_tokens=B * T)
  return dict(
    inputs=(pt, pm, tt, mm),
    adv=adv.astype(np.float32),
    ids=ids,
    coef=coef,
    rows=rows,
    cols=cols,
    valid=valid,
  )


@functools.partial(jax.jit, static_argnames="cfg")
def _logp(params, pt, pm, tt, mm, *, cfg):
  return logprobs.completion_logprobs(params, pt, pm, tt, mm, model_fn=model.make_model_fn(cfg))[0]


_lm_head_probe = jax.jit(coupling.lm_head_probe, static_argnames=("cfg", "source_chunk"))
_features = jax.jit(coupling.completion_features, static_argnames="cfg")


def _init(cfg, seed=0):
  return jax.jit(functools.partial(model.init, cfg))(jax.random.key(seed))


def test_select_tokens_pads_and_samples():
  mask = np.asarray([[1, 1, 0], [0, 1, 0]], bool)
  rows, cols, valid = coupling.select_tokens(mask, max_tokens=5)
  np.testing.assert_array_equal(rows, [0, 0, 1, 0, 0])
  np.testing.assert_array_equal(cols, [0, 1, 1, 0, 0])
  np.testing.assert_array_equal(valid, [1, 1, 1, 0, 0])
  rows, cols, valid = coupling.select_tokens(np.ones((4, 8), bool), max_tokens=6, seed=3)
  assert valid.all() and len(set(zip(rows, cols))) == 6
  assert list(zip(rows, cols)) == sorted(zip(rows, cols))


@pytest.mark.parametrize("tie", [True, False])
def test_lm_head_features_reproduce_the_models_logits(tie, probe):
  cfg = model.tiny_config(V, tie_embeddings=tie)
  params = _init(cfg, 1)
  pt, pm, tt, mm = probe["inputs"]
  h_BTD, logits_BTV = _features(params, pt, pm, tt, mm, cfg=cfg)
  assert h_BTD.shape == (B, T, cfg.d_model)
  # z = h W with W the head kernel or E^T, and the same logits completion_logprobs scores.
  W_DV = coupling.lm_head_weight(params, cfg=cfg)
  np.testing.assert_allclose(h_BTD @ W_DV, logits_BTV, rtol=1e-5, atol=1e-5)
  logp_BT = jnp.take_along_axis(jax.nn.log_softmax(logits_BTV), tt[..., None], axis=-1)[..., 0]
  np.testing.assert_allclose(
    np.where(mm, logp_BT, 0.0), _logp(params, *probe["inputs"], cfg=cfg), rtol=1e-5, atol=1e-5
  )


def test_analytic_lm_head_coupling_equals_autodiff_inner_products(untied, probe):
  cfg, params = untied
  pt, pm, tt, mm = probe["inputs"]
  rows, cols = probe["rows"], probe["cols"]
  out = _lm_head_probe(params, *probe["inputs"], probe["coef"], rows, cols, cfg=cfg, lr=LR)
  sub, merge = grads.param_subset(params, "lm_head", cfg=cfg)
  fn = grads.token_logp_fn(merge, pt, pm, tt, mm, rows, cols, model_fn=model.make_model_fn(cfg))
  g_SQ = np.asarray(jax.jit(lambda s: grads.per_token_grads(fn, s))(sub), np.float64)
  assert g_SQ.shape == (B * T, cfg.d_model * V)
  K_auto = g_SQ @ g_SQ.T
  K_analytic = np.asarray(out["K_SN"])[:, rows * T + cols]  # Targets = sources here.
  v = probe["valid"]
  scale = np.abs(K_auto[np.ix_(v, v)]).max()
  assert scale > 10.0  # ‖h‖² ≈ d_model = 64 on the diagonal: not vacuous.
  np.testing.assert_allclose(
    K_analytic[np.ix_(v, v)] / scale, K_auto[np.ix_(v, v)] / scale, atol=1e-5
  )


def test_tied_head_block_is_the_output_use_of_the_embedding(probe):
  cfg = model.tiny_config(V)
  params = _init(cfg, 2)
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0
  pt, pm, tt, mm = probe["inputs"]
  rows, cols = probe["rows"], probe["cols"]
  h_BTD, logits_BTV = _features(params, pt, pm, tt, mm, cfg=cfg)
  h_SD, y_S = h_BTD[rows, cols], tt[rows, cols]
  probs_SV = jax.nn.softmax(logits_BTV[rows, cols])
  K = np.asarray(coupling.head_coupling(h_SD, probs_SV, y_S, h_SD, probs_SV, y_S))

  # Autodiff of log π with h held fixed and E used as the output projection only.
  def head_only(E_VD):
    return jnp.take_along_axis(jax.nn.log_softmax(h_SD @ E_VD.T), y_S[:, None], axis=1)[:, 0]

  g = np.asarray(grads.per_token_grads(head_only, params["embed"]["embedding"]), np.float64)
  v = probe["valid"]
  scale = np.abs(K[np.ix_(v, v)]).max()
  np.testing.assert_allclose(K[np.ix_(v, v)] / scale, (g @ g.T)[np.ix_(v, v)] / scale, atol=1e-5)
  # The whole embedding's gradient (input lookup too) is a different block.
  sub, merge = grads.param_subset(params, "embed", cfg=cfg)
  fn = grads.token_logp_fn(merge, pt, pm, tt, mm, rows, cols, model_fn=model.make_model_fn(cfg))
  g_all = np.asarray(jax.jit(lambda s: grads.per_token_grads(fn, s))(sub), np.float64)
  assert np.abs((g_all @ g_all.T - g @ g.T)[np.ix_(v, v)]).max() > 1e-2 * scale


def test_first_order_prediction_matches_one_sgd_step_on_the_lm_head(untied, probe):
  """One SGD step η = 0.02 on L = −Σ c log π (c = w·A, token_mean) updating only the
  lm_head kernel. Tolerance: relative error ‖pred − measured‖/‖measured‖ < 5% and
  correlation > 0.999 (the residual is second order in η)."""
  cfg, params = untied
  coef, rows, cols, valid = probe["coef"], probe["rows"], probe["cols"], probe["valid"]
  sub, merge = grads.param_subset(params, "lm_head", cfg=cfg)
  loss = lambda s: -jnp.sum(coef * _logp(merge(s), *probe["inputs"], cfg=cfg))
  g = jax.grad(loss)(sub)
  after = merge(jax.tree.map(lambda p, d: p - LR * d, sub, g))
  measured_BT = np.asarray(_logp(after, *probe["inputs"], cfg=cfg)) - np.asarray(
    _logp(params, *probe["inputs"], cfg=cfg)
  )
  measured_S = measured_BT[rows, cols]
  out = _lm_head_probe(params, *probe["inputs"], coef, rows, cols, cfg=cfg, lr=LR)
  # The analytic SGD update of the head is exactly −η ∇L.
  np.testing.assert_allclose(out["dW_DV"], -LR * g["kernel"], rtol=1e-4, atol=1e-7)
  fit = jax.device_get(coupling.fit_stats(out["total_S"], measured_S, valid))
  assert fit["rel_err"] < 0.05 and fit["corr"] > 0.999, fit
  assert 0.95 < fit["slope"] < 1.05, fit
  assert np.abs(measured_S[valid]).max() > 1e-2  # A step that moves log-probs.
  # Sources in chunks of 5 (of N = 20) give the same kernel and update.
  chunked = _lm_head_probe(
    params, *probe["inputs"], coef, rows, cols, cfg=cfg, lr=LR, source_chunk=5
  )
  for k in ("K_SN", "dW_DV", "conf_N", "total_S"):
    np.testing.assert_allclose(chunked[k], out[k], rtol=1e-5, atol=1e-7, err_msg=k)
  # Self + coupling = total, and the δW path gives the same first-order prediction.
  np.testing.assert_allclose(out["self_S"] + out["coupling_S"], out["total_S"], atol=1e-7)
  h_BTD, logits_BTV = _features(params, *probe["inputs"], cfg=cfg)
  via_dW = coupling.delta_from_head_update(
    h_BTD[rows, cols],
    jax.nn.softmax(logits_BTV[rows, cols]),
    probe["inputs"][2][rows, cols],
    out["dW_DV"],
  )
  np.testing.assert_allclose(via_dW, out["total_S"], rtol=1e-4, atol=1e-6)
  # The coupling terms matter: the self term alone explains Δ worse.
  self_fit = jax.device_get(coupling.fit_stats(out["self_S"], measured_S, valid))
  assert self_fit["rel_err"] > 2 * fit["rel_err"]
  rep = coupling.coupling_report(out, measured_S, valid, lr=LR)
  np.testing.assert_allclose(rep["coupling/fit/corr"], fit["corr"], rtol=1e-6)
  assert rep["coupling/same_id/mean_k"] > rep["coupling/diff_id/mean_k"]
  np.testing.assert_allclose(
    rep["coupling/same_id/abs_share"] + rep["coupling/diff_id/abs_share"], 1.0, rtol=1e-6
  )
  for key in rep:
    metrics.definition(key)


def test_coupling_table_and_terms_pinned():
  # Targets s = sources 0, 1; source 2 extra. Confidence bins (0, 0.5, 1): S [0, 1], N [0, 1, 0].
  K = jnp.asarray([[10.0, 1.0, 4.0], [1.0, 2.0, -3.0]])
  coef = jnp.asarray([1.0, -1.0, 2.0])
  is_self = jnp.asarray([[True, False, False], [False, True, False]])
  terms = coupling.first_order_terms(K, coef, is_self, lr=1.0)
  np.testing.assert_allclose(terms["total"], [17.0, -7.0])  # [10 − 1 + 8, 1 − 2 − 6]
  np.testing.assert_allclose(terms["self"], [10.0, -2.0])
  np.testing.assert_allclose(terms["coupling"], [7.0, -5.0])
  t = coupling.coupling_table(
    K,
    coef,
    y_S=jnp.asarray([1, 2]),
    y_N=jnp.asarray([1, 2, 1]),
    conf_S=jnp.asarray([0.05, 0.95]),
    conf_N=jnp.asarray([0.05, 0.95, 0.3]),
    is_self_SN=is_self,
    valid_S=jnp.asarray([True, True]),
    valid_N=jnp.asarray([True, True, True]),
    lr=1.0,
    edges=(0.0, 0.5, 1.0),
  )
  # Non-self pairs: (0,1) diff, bins (0,1), |C| = 1, K = 1; (0,2) same, (0,0), |C| = 8, K = 4;
  # (1,0) diff, (1,0), |C| = 1, K = 1; (1,2) diff, (1,0), |C| = 6, K = −3.
  want_abs = np.zeros((2, 2, 2))
  want_abs[1, 0, 0], want_abs[0, 0, 1], want_abs[0, 1, 0] = 8.0, 1.0, 7.0
  want_k = np.zeros((2, 2, 2))
  want_k[1, 0, 0], want_k[0, 0, 1], want_k[0, 1, 0] = 4.0, 1.0, -2.0
  want_pairs = np.zeros((2, 2, 2))
  want_pairs[1, 0, 0], want_pairs[0, 0, 1], want_pairs[0, 1, 0] = 1, 1, 2
  np.testing.assert_allclose(t["abs_mass"], want_abs)
  np.testing.assert_allclose(t["sum_k"], want_k)
  np.testing.assert_allclose(t["pairs"], want_pairs)


def test_fit_stats_pinned():
  f = coupling.fit_stats(jnp.asarray([1.0, 2.0, 3.0, 9.0]), jnp.asarray([2.0, 4.0, 6.0, -5.0]),
                         jnp.asarray([True, True, True, False]))  # fmt: skip
  f = {k: float(v) for k, v in f.items()}
  # measured = 2·pred on the valid entries: corr 1, slope 2, intercept 0, rel_err 1/2.
  np.testing.assert_allclose(
    [f["corr"], f["slope"], f["r2"], f["rel_err"]], [1, 2, 1, 0.5], rtol=1e-6
  )
  np.testing.assert_allclose(f["intercept"], 0.0, atol=1e-6)


def test_confidence_bins():
  conf = jnp.asarray([0.0, 0.05, 0.1, 0.49, 0.5, 0.95, 1.0])
  np.testing.assert_array_equal(coupling.confidence_bins(conf), [0, 0, 1, 1, 2, 3, 3])


# ----------------------------------------------------------------------------
# Generic gradients and projections.
# ----------------------------------------------------------------------------


def _toy_fn(theta):
  """[S = 3] outputs of a pytree {a [4], b [2, 3]}."""
  x = jnp.arange(12.0).reshape(3, 4)
  return jnp.tanh(x @ theta["a"]) + jnp.sum(theta["b"] ** 2) * jnp.asarray([1.0, 2.0, 3.0])


def test_jacobian_rows_chunked_equals_jacrev():
  theta = {"a": jnp.linspace(-0.3, 0.4, 4), "b": jnp.arange(6.0).reshape(2, 3) / 7}
  full = grads.jacobian_rows(_toy_fn, theta)
  jac = jax.jacrev(_toy_fn)(theta)
  want = np.concatenate(
    [np.asarray(jac["a"]).reshape(3, -1), np.asarray(jac["b"]).reshape(3, -1)], 1
  )
  np.testing.assert_allclose(full, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(
    grads.jacobian_rows(_toy_fn, theta, chunk_size=2), want, rtol=1e-6, atol=1e-7
  )


@pytest.mark.parametrize("kind", ["gaussian", "countsketch"])
def test_projection_is_seeded_and_preserves_inner_products(kind):
  rng = np.random.default_rng(0)
  rows = [{"a": rng.normal(size=(300,)), "b": rng.normal(size=(20, 10))} for _ in range(3)]
  rows[2] = jax.tree.map(lambda x, y: x + 0.5 * y, rows[0], rows[1])
  proj = grads.make_projector(rows[0], dim=4096, key=jax.random.key(7), kind=kind)
  y = np.stack([np.asarray(proj(r)) for r in rows]).astype(np.float64)
  x = np.stack([np.concatenate([r["a"], r["b"].ravel()]) for r in rows])
  gram, approx = x @ x.T, y @ y.T
  np.testing.assert_allclose(approx, gram, atol=0.1 * np.abs(gram).max())
  again = grads.make_projector(rows[0], dim=4096, key=jax.random.key(7), kind=kind)
  np.testing.assert_array_equal(again(rows[1]), y[1].astype(np.float32))
  # Linear: R^T(x0 + 0.5 x1) = R^T x0 + 0.5 R^T x1.
  np.testing.assert_allclose(y[2], y[0] + 0.5 * y[1], rtol=1e-4, atol=1e-3)


def test_param_subset_merge_roundtrip_and_errors():
  cfg = model.tiny_config(V, scan_layers=True, n_layers=3)
  shapes = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), shapes)
  sub, merge = grads.param_subset(params, "last_block", cfg=cfg)
  assert sub["mlp"]["up"]["kernel"].shape == (64, 192)
  np.testing.assert_array_equal(
    sub["mlp"]["up"]["kernel"], params["layers"]["mlp"]["up"]["kernel"][2]
  )
  bumped = merge(jax.tree.map(lambda x: x + 1.0, sub))
  diff = bumped["layers"]["mlp"]["up"]["kernel"] - params["layers"]["mlp"]["up"]["kernel"]
  np.testing.assert_allclose(diff[2], 1.0, atol=1e-6)
  np.testing.assert_allclose(diff[:2], 0.0)
  cfg2 = model.tiny_config(V, n_layers=2)
  shapes2 = jax.eval_shape(functools.partial(model.init, cfg2), jax.random.key(0))
  sub2, _ = grads.param_subset(shapes2, "last_block", cfg=cfg2)
  assert sub2 is shapes2["layer_1"]
  with pytest.raises(ValueError, match="untied head"):
    grads.param_subset(params, "lm_head", cfg=cfg)
  with pytest.raises(ValueError, match="top-level keys"):
    grads.param_subset(params, "decoder", cfg=cfg)


def test_per_rollout_grads_vanish_for_zero_advantage_rows(untied, probe):
  cfg, params = untied
  pt, pm, tt, mm = probe["inputs"]
  coef = probe["coef"].copy()
  coef[2] = 0.0  # Row 2 gets no credit.
  sub, merge = grads.param_subset(params, "lm_head", cfg=cfg)
  fn = grads.rollout_objective_fn(merge, pt, pm, tt, mm, coef, model_fn=model.make_model_fn(cfg))
  g_BQ = np.asarray(jax.jit(lambda s: grads.per_rollout_grads(fn, s, project_dim=64))(sub))
  assert g_BQ.shape == (B, 64)
  assert np.abs(g_BQ[2]).max() == 0.0 and np.abs(g_BQ[[0, 1, 3]]).min(axis=1).max() > 0
