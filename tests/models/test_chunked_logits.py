"""The LM head in chunks (rl.logit_chunk): the same log-probs, statistics and gradients as
the whole-T head, less memory; and model.remat = "auto" chosen by the memory plan."""

import dataclasses
import functools

import arithmetic
import cheap_compile
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import logprobs, model
from grpo_jax.rl import learner, spec
from grpo_jax.trainer import build, memory

N, P, T, V = 3, 4, 7, 40


def _batch():
  k = jax.random.split(jax.random.key(1), 2)
  prompt = jax.random.randint(k[0], (N, P), 1, V)
  prompt_mask = jnp.ones((N, P), bool).at[0, :2].set(False)
  tokens = jax.random.randint(k[1], (N, T), 1, V)
  mask = jnp.arange(T)[None] < jnp.array([[7], [3], [5]])
  return prompt, prompt_mask, tokens, mask


@pytest.mark.parametrize("tie", [True, False])
def test_chunked_head_gives_the_same_logprobs_stats_ranks_and_gradients(tie):
  cfg = dataclasses.replace(model.tiny_config(V), tie_embeddings=tie)
  params = model.init(cfg, jax.random.key(0))
  fn = model.make_model_fn(cfg)
  batch = _batch()

  def loss(p, chunk):
    lp, st = logprobs.completion_logprobs(
      p, *batch, model_fn=fn, with_stats=True, with_rank=True, chunk=chunk
    )
    return jnp.sum(lp) + 0.3 * jnp.sum(st["entropy"]) + jnp.sum(st["sum_sq"]), (lp, st)

  grad = cheap_compile.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (want, (lp0, st0)), g0 = grad(params, 0)
  for chunk in (2, 3, T - 1):  # 3 does not divide T = 7: padded, cut off.
    (got, (lp, st)), g = grad(params, chunk)
    assert float(got) == pytest.approx(float(want), rel=1e-6)
    np.testing.assert_allclose(lp, lp0, atol=1e-6)
    np.testing.assert_allclose(st["entropy"], st0["entropy"], atol=1e-6)
    np.testing.assert_array_equal(st["rank"], st0["rank"])
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g0), strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_head_only_and_hidden_only_compose_to_the_full_forward():
  cfg = model.tiny_config(V)
  params = model.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(2), (2, 6), 1, V)
  pos = jnp.broadcast_to(jnp.arange(6), (2, 6))

  @functools.partial(cheap_compile.jit, static_argnums=1)
  def apply(p, hidden_only):
    return model.apply(p, tokens, pos, cfg=cfg, logits_slice=(2, 6), hidden_only=hidden_only)

  logits, _ = apply(params, False)
  hidden, _ = apply(params, True)
  assert hidden.shape == (2, 4, cfg.d_model)
  head = cheap_compile.jit(lambda p, h: model.head_logits(p, h, cfg=cfg))
  np.testing.assert_allclose(head(params, hidden), logits, atol=1e-5)


def _loss_grad_temp_bytes(chunk):
  cfg = model.tiny_config(4096)
  params = model.init(cfg, jax.random.key(0))
  fn = model.make_model_fn(cfg)
  n, p, t = 8, 4, 64
  args = (
    jnp.ones((n, p), jnp.int32),
    jnp.ones((n, p), bool),
    jnp.ones((n, t), jnp.int32),
    jnp.ones((n, t), bool),
  )

  def loss(params):
    return jnp.sum(logprobs.completion_logprobs(params, *args, model_fn=fn, chunk=chunk)[0])

  compiled = jax.jit(jax.grad(loss)).lower(params).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.skipif(
  jax.default_backend() != "cpu", reason="temporary sizes are XLA:CPU's buffer assignment"
)
def test_chunks_shrink_the_compiled_backward():
  """[8, 64, 4096] float32 logits are 8 MiB, and their gradient again; chunks of 8 keep
  1/8 of that at a time."""
  whole, chunked = _loss_grad_temp_bytes(0), _loss_grad_temp_bytes(8)
  assert chunked < 0.5 * whole, (chunked, whole)


def test_train_step_terms_equal_with_and_without_chunks():
  cfg = model.tiny_config(V)
  params = model.init(cfg, jax.random.key(0))
  prompt, prompt_mask, tokens, mask = _batch()
  mb = spec.RolloutBatch(
    prompt_tokens_NP=prompt,
    prompt_mask_NP=prompt_mask,
    tokens_NT=tokens,
    mask_NT=mask,
    loss_mask_NT=mask,
    adv_NT=jnp.where(mask, jnp.array([[1.0], [-0.5], [0.25]]), 0.0),
    old_logp_NT=jnp.full((N, T), -3.0),
    ref_logp_NT=jnp.full((N, T), -3.5),
    group_ids_N=jnp.zeros((N,), jnp.int32),
  )
  out = {}
  for chunk in (0, 2):
    rl_cfg = spec.RLConfig(logit_chunk=chunk, kl_coef=0.1, entropy_coef=0.01)
    fn = lambda p, rl_cfg=rl_cfg: jnp.sum(  # noqa: E731
      learner.token_terms(
        p, mb, rl_cfg.step_hyper(), cfg=rl_cfg, model_fn=model.make_model_fn(cfg)
      )[0]
    )
    out[chunk] = cheap_compile.jit(jax.value_and_grad(fn))(params)
  assert float(out[2][0]) == pytest.approx(float(out[0][0]), rel=1e-6)
  for a, b in zip(jax.tree.leaves(out[2][1]), jax.tree.leaves(out[0][1]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_negative_chunk_is_refused():
  with pytest.raises(ValueError, match="logit_chunk must be >= 0"):
    spec.RLConfig(logit_chunk=-1)


@functools.cache  # The setups are only read (test_the_plan_counts_... replaces, not edits).
def _auto(limit_gib):
  c = arithmetic.get_config("tiny")
  c.sampler.max_new_tokens = 64
  c.model.remat = "auto"
  c.memory_limit_gib = limit_gib
  return build.build(c)


def test_auto_remat_takes_the_fastest_plan_that_fits():
  """The plan of this config: about 0.93 GiB without remat, 0.38 GiB with full remat over
  scanned layers (memory.plan); the usable share of a limit is memory.USABLE_FRACTION."""
  roomy = _auto(4.0)
  assert (roomy.model_cfg.remat, roomy.model_cfg.scan_layers) == ("none", False)
  tight = _auto(0.6)
  assert (tight.model_cfg.remat, tight.model_cfg.scan_layers) == ("full", True)
  assert tight.rl_cfg.logit_chunk == 0
  assert memory.fits(memory.plan_for(tight), 0.6 * memory.GIB)
  assert not memory.fits(memory.plan_for(roomy), 0.6 * memory.GIB)
  hopeless = _auto(0.01)  # Nothing fits: the last candidate (the memory check refuses it).
  assert (hopeless.model_cfg.remat, hopeless.rl_cfg.logit_chunk) == ("full", 256)
  assert _auto(0.0).model_cfg.remat == "none"  # A CPU knows no limit: no remat.


def test_the_plan_counts_the_logits_gradient_of_one_chunk():
  s = _auto(4.0)
  whole = memory.plan_for(s)
  chunked = memory.plan_for(
    dataclasses.replace(s, rl_cfg=dataclasses.replace(s.rl_cfg, logit_chunk=8))
  )
  assert chunked.backward_working < whole.backward_working
  assert chunked.activations <= whole.activations
