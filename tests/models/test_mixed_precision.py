"""Mixed precision (model.dtype = "bfloat16", params float32): the step stays close to the
float32 step, params, gradients and optimizer state stay float32, logits and log-probs are
float32, and the demo still learns."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import layers, logprobs, model, sampling
from grpo_jax.rl import learner, spec

# Tolerances of a bfloat16 step against the float32 step on the same params and batch
# (bfloat16 keeps 8 mantissa bits: relative rounding ~4e-3 per operation). The loss is
# Σ w·ℓ with Σ w·|A| = 1 and advantages ±1 that mostly cancel, so its error is stated
# against that scale (absolute), not against the small value left after cancelling.
LOSS_ATOL = 5e-3
GRAD_COSINE = 0.99
GRAD_NORM_RTOL = 5e-2


@pytest.fixture(scope="module")
def batch(tiny_cfg, tiny_params, sampler_cfg, tiny_sampler, tokenizer):
  """A float32 rollout batch of the shared tiny policy with varied rewards."""
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(p, add_bos=True) for p in ("Q:12+7=", "Q:3+45=", "Q:60+6=")], cfg=sampler_cfg
  )
  r = tiny_sampler(tiny_params, prompts, jax.random.key(1), sampling.sampling_params())
  n = r.tokens_NT.shape[0]
  adv = jnp.where(jnp.arange(n) % 2 == 0, 1.0, -1.0)[:, None] * r.mask_NT
  return spec.RolloutBatch(
    prompt_tokens_NP=r.prompt_tokens_NP,
    prompt_mask_NP=r.prompt_mask_NP,
    tokens_NT=r.tokens_NT,
    mask_NT=r.mask_NT,
    loss_mask_NT=r.mask_NT,
    adv_NT=adv,
    old_logp_NT=r.policy_logp_NT,
    ref_logp_NT=jnp.zeros_like(r.policy_logp_NT),
    group_ids_N=r.group_ids_N,
  )


def _step(cfg_model, params, batch):
  cfg = spec.RLConfig(micro_batches=2)
  optimizer = spec.make_optimizer(lr=1e-3)
  state = spec.init_state(params, optimizer)
  model_fn = model.make_model_fn(cfg_model)
  w = jnp.where(batch.loss_mask_NT, 1.0, 0.0) / jnp.sum(batch.loss_mask_NT)
  grads, sums, _ = jax.jit(
    functools.partial(learner.accumulate_gradients, cfg=cfg, model_fn=model_fn, token_outputs=False)
  )(params, batch, w, cfg.step_hyper())
  new, metrics = jax.jit(
    functools.partial(learner.train_step, cfg=cfg, model_fn=model_fn, optimizer=optimizer)
  )(state, batch, cfg.step_hyper())
  return grads, sums, new, metrics


def _flat(tree):
  return jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in jax.tree.leaves(tree)])


def test_a_bfloat16_step_stays_within_tolerance_of_the_float32_step(tiny_cfg, tiny_params, batch):
  bf16 = dataclasses.replace(tiny_cfg, dtype="bfloat16")
  g32, s32, new32, m32 = _step(tiny_cfg, tiny_params, batch)
  g16, s16, new16, m16 = _step(bf16, tiny_params, batch)
  assert abs(float(s16["loss"]) - float(s32["loss"])) < LOSS_ATOL
  a, b = _flat(g32), _flat(g16)
  cosine = float(jnp.dot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))
  assert cosine > GRAD_COSINE, cosine
  assert abs(float(jnp.linalg.norm(b) / jnp.linalg.norm(a)) - 1) < GRAD_NORM_RTOL
  # Master weights, gradients and Adam's moments stay float32 under bfloat16 compute.
  for tree in (g16, new16.params, new16.opt_state):
    for x in jax.tree.leaves(tree):
      if jnp.issubdtype(x.dtype, jnp.floating):
        assert x.dtype == jnp.float32, x.dtype
  assert float(m16["nonfinite"]) == 0.0


def test_bfloat16_logits_and_logprobs_are_float32_and_close(tiny_cfg, tiny_params, batch):
  bf16 = dataclasses.replace(tiny_cfg, dtype="bfloat16")
  args = (batch.prompt_tokens_NP, batch.prompt_mask_NP, batch.tokens_NT, batch.mask_NT)
  lp32, _ = logprobs.completion_logprobs(tiny_params, *args, model_fn=model.make_model_fn(tiny_cfg))
  lp16, _ = logprobs.completion_logprobs(tiny_params, *args, model_fn=model.make_model_fn(bf16))
  assert lp16.dtype == jnp.float32
  m = np.asarray(batch.mask_NT)
  err = np.abs(np.asarray(lp16) - np.asarray(lp32))[m]
  # Per-token log-prob error of bfloat16 compute: small against log-probs of order 1.
  assert np.median(err) < 0.05 and err.max() < 0.5, (np.median(err), err.max())


def test_bfloat16_tied_head_matches_autodiff_and_rounds_only_its_gradient():
  """layers._tied_logits of a bfloat16 model (`_logits_bf16`): float32 logits equal to
  the plain contraction's, and gradients within bfloat16 rounding of autodiff's (its
  backward rounds the logits gradient to bfloat16), compiled (the table's gradient is a
  transposed [D, V] product behind a barrier, which XLA:CPU must accept)."""
  cfg = model.tiny_config(vocab_size=40, dtype="bfloat16")
  k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
  x = jax.random.normal(k1, (2, 3, cfg.d_model), jnp.float32).astype(jnp.bfloat16)
  table = jax.random.normal(k2, (40, cfg.d_model), jnp.float32) * 0.2
  g = jax.random.normal(k3, (2, 3, 40), jnp.float32)

  def loss(head, x, table):
    return jnp.sum(head(x, table) * g)

  plain = lambda x, t: jnp.einsum(
    "btd,vd->btv", x, t.astype(jnp.bfloat16), preferred_element_type=jnp.float32
  )  # noqa: E731
  ours = functools.partial(layers._tied_logits, cfg)
  np.testing.assert_array_equal(jax.jit(ours)(x, table), jax.jit(plain)(x, table))
  want = jax.jit(jax.grad(functools.partial(loss, plain), argnums=(0, 1)))(x, table)
  got = jax.jit(jax.grad(functools.partial(loss, ours), argnums=(0, 1)))(x, table)
  for a, b in zip(got, want, strict=True):
    assert a.dtype == b.dtype and a.shape == b.shape
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    np.testing.assert_allclose(a, b, rtol=2e-2, atol=2e-2 * np.abs(b).max())
  assert not np.array_equal(got[1], want[1])  # The gradient was rounded: not autodiff's.


def test_dense_contractions_match_the_plain_contraction_and_its_gradient():
  """layers._dot_general_rows (rows flattened; bfloat16 operands: float32 accumulation,
  float32 weight gradient) computes the same contraction as lax.dot_general, for one and
  two contracted axes, in both dtypes, and falls back to it for anything else."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(k1, (3, 5, 4, 6), jnp.float32)
  w = jax.random.normal(k2, (4, 6, 7), jnp.float32) * 0.3
  g = jax.random.normal(k3, (3, 5, 7), jnp.float32)
  dims = (((2, 3), (0, 1)), ((), ()))  # o_proj: heads × head_dim contracted.

  def f(dot, x, w):
    out = dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), dims)
    return jnp.sum(out.astype(jnp.float32) * g)

  plain = lambda a, b, d: jax.lax.dot_general(a, b, d, preferred_element_type=jnp.float32)
  want, want_grads = jax.value_and_grad(functools.partial(f, plain), argnums=(0, 1))(x, w)
  got, got_grads = jax.value_and_grad(
    functools.partial(f, layers._dot_general_rows), argnums=(0, 1)
  )(x, w)
  np.testing.assert_allclose(got, want, rtol=2e-2)
  for a, b in zip(got_grads, want_grads, strict=True):
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(a, b, rtol=3e-2, atol=3e-2 * float(jnp.abs(b).max()))
  # float32 operands: the same values and gradients as the unflattened contraction.
  f32 = lambda dot, x, w: jnp.sum(dot(x, w, dims) * g)  # noqa: E731
  want, want_grads = jax.value_and_grad(functools.partial(f32, jax.lax.dot_general), (0, 1))(x, w)
  got, got_grads = jax.value_and_grad(functools.partial(f32, layers._dot_general_rows), (0, 1))(
    x, w
  )
  np.testing.assert_allclose(got, want, rtol=1e-5)
  for a, b in zip(got_grads, want_grads, strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # Batch dims and other contractions take lax.dot_general unchanged.
  y = jax.random.normal(k1, (2, 4, 6), jnp.float32)
  batch = (((2,), (1,)), ((0,), (0,)))
  np.testing.assert_array_equal(
    layers._dot_general_rows(y, jnp.swapaxes(y, 1, 2), batch),
    jax.lax.dot_general(y, jnp.swapaxes(y, 1, 2), batch),
  )
