"""Teacher-forced log-probs: `token_stats` values and its hand-written backward."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import logprobs


def _reference(z, *, y_NT):
  """(log π(y), H, Σ π²) by autodiff-able log-softmax."""
  logp_NTV = jax.nn.log_softmax(z, axis=-1)
  p_NTV = jnp.exp(logp_NTV)
  lp = jnp.take_along_axis(logp_NTV, y_NT[..., None], axis=-1)[..., 0]
  return lp, -jnp.sum(p_NTV * logp_NTV, axis=-1), jnp.sum(p_NTV * p_NTV, axis=-1)


def test_token_stats_values_and_custom_gradient_match_autodiff_of_log_softmax():
  z_NTV = jax.random.normal(jax.random.key(3), (3, 5, 11)) * 3.0
  y_NT = jax.random.randint(jax.random.key(4), (3, 5), 0, 11)
  w = jax.random.normal(jax.random.key(5), (3, 3, 5))

  reference = functools.partial(_reference, y_NT=y_NT)
  got, want = logprobs.token_stats(z_NTV, y_NT), reference(z_NTV)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  loss = lambda f: lambda z: sum(jnp.sum(w[i] * x) for i, x in enumerate(f(z)))
  np.testing.assert_allclose(
    jax.grad(loss(lambda z: logprobs.token_stats(z, y_NT)))(z_NTV),
    jax.grad(loss(reference))(z_NTV),
    rtol=1e-4,
    atol=1e-6,
  )


def test_token_stats_gradient_of_each_subset_of_statistics():
  """A statistic the loss leaves out reaches the backward as a symbolic zero and its term
  is skipped; every subset still gets autodiff's gradient (the target-id scatter too,
  with a token repeated across positions)."""
  z_NTV = jax.random.normal(jax.random.key(6), (2, 4, 7)) * 2.0
  y_NT = jnp.asarray([[3, 3, 0, 6], [1, 3, 3, 2]])
  w = jax.random.normal(jax.random.key(7), (3, 2, 4))

  reference = functools.partial(_reference, y_NT=y_NT)
  for subset in ([0], [1], [2], [0, 2], [1, 2], []):
    loss = lambda f, s=subset: lambda z: sum(jnp.sum(w[i] * f(z)[i]) for i in s) + 0.0 * z[0, 0, 0]
    got = jax.jit(jax.grad(loss(lambda z: logprobs.token_stats(z, y_NT))))(z_NTV)
    np.testing.assert_allclose(got, jax.grad(loss(reference))(z_NTV), rtol=1e-4, atol=1e-6)
  # By hand, one position, log π(y) alone: ∂/∂z = 1[v = y] − π.
  z = jnp.log(jnp.asarray([[[0.5, 0.25, 0.25]]]))
  g = jax.grad(lambda z: logprobs.token_stats(z, jnp.asarray([[1]]))[0].sum())(z)
  np.testing.assert_allclose(g, [[[-0.5, 0.75, -0.25]]], atol=1e-6)


def test_rank_counts_the_ids_ranked_strictly_above_the_token():
  # logits for N = 1, T = 3, V = 4; the model is a stand-in that returns them.
  z_NTV = jnp.asarray([[[0.0, 2.0, 1.0, 2.0], [5.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]])
  y_NT = jnp.asarray([[2, 0, 3]])
  fake_model = lambda params, *args, logits_slice: (params, None)
  prompt_NP, prompt_mask_NP = jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2), bool)
  mask_NT = jnp.asarray([[True, True, False]])
  _, stats = logprobs.completion_logprobs(
    z_NTV,
    prompt_NP,
    prompt_mask_NP,
    y_NT,
    mask_NT,
    model_fn=fake_model,
    with_stats=True,
    with_rank=True,
  )
  # Token 2 at t0: ids 1 and 3 (2.0) are above 1.0 -> rank 2. Token 0 at t1 is the argmax
  # -> 0. t2 is off the mask -> 0 (all tied anyway: nothing strictly above).
  np.testing.assert_array_equal(stats["rank"], [[2, 0, 0]])
  _, no_rank = logprobs.completion_logprobs(
    z_NTV, prompt_NP, prompt_mask_NP, y_NT, mask_NT, model_fn=fake_model, with_stats=True
  )
  assert "rank" not in no_rank
