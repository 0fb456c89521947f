"""Length-bucketed micro-batches (learner.length_buckets): rows sorted by length, each
micro-batch cut to the smallest bucket that holds it. Loss, metrics and gradient equal the
unbucketed step's for every aggregation mode and policy loss."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import model, sampling
from grpo_jax.rl import aggregation, learner, spec


@pytest.fixture(scope="module")
def skewed_batch(tiny_cfg, tiny_params, tokenizer):
  """16 rollouts of very different lengths (limits 1..16 of T = 16), varied advantages."""
  cfg = sampling.SamplerConfig(
    max_new_tokens=16, eos_ids=(-1,), pad_id=tokenizer.pad_id, group_size=4, prompt_buckets=(8,)
  )
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(p, add_bos=True) for p in ("Q:1+2=", "Q:33+4=", "Q:5+66=", "Q:7+8=")],
    cfg=cfg,
  )
  fn = jax.jit(
    functools.partial(
      sampling.sample,
      model_fn=model.make_model_fn(tiny_cfg),
      init_cache=functools.partial(model.init_cache, tiny_cfg),
      cfg=cfg,
    )
  )
  limit = jnp.asarray([1, 16, 2, 3, 9, 1, 4, 16, 2, 5, 1, 12, 3, 2, 7, 1], jnp.int32)
  r = fn(tiny_params, prompts, jax.random.key(0), sampling.sampling_params(), limit)
  np.testing.assert_array_equal(r.length_N, limit)
  adv = jnp.asarray(np.random.default_rng(0).normal(size=(16, 1)), jnp.float32) * r.mask_NT
  return spec.RolloutBatch(
    prompt_tokens_NP=r.prompt_tokens_NP,
    prompt_mask_NP=r.prompt_mask_NP,
    tokens_NT=r.tokens_NT,
    mask_NT=r.mask_NT,
    loss_mask_NT=r.mask_NT,
    adv_NT=adv,
    old_logp_NT=r.policy_logp_NT - 0.01,
    ref_logp_NT=r.policy_logp_NT + 0.02,
    group_ids_N=r.group_ids_N,
  )


_JITTED = {}


def _grads_fn(cfg, tiny_cfg):
  """jit(accumulate_gradients) per config: one compile per (config, bucketing)."""
  key = repr((cfg, tiny_cfg))
  if key not in _JITTED:
    _JITTED[key] = jax.jit(
      functools.partial(
        learner.accumulate_gradients,
        cfg=cfg,
        model_fn=model.make_model_fn(tiny_cfg),
        token_outputs=True,
      )
    )
  return _JITTED[key]


def _both(cfg, tiny_cfg, params, batch, w_NT):
  """(unbucketed, 4-bucket) accumulate_gradients outputs on the same batch and weights."""
  packed = dataclasses.replace(cfg, length_buckets=4)
  assert learner.length_buckets(packed, 16) == (4, 8, 12, 16)
  return tuple(_grads_fn(c, tiny_cfg)(params, batch, w_NT, c.step_hyper()) for c in (cfg, packed))


def _assert_same(got, want, mask_NT):
  (g4, s4, t4), (g1, s1, t1) = got, want
  for k in s1:
    np.testing.assert_allclose(s4[k], s1[k], rtol=2e-5, atol=1e-7, err_msg=k)
  for a, b in zip(jax.tree.leaves(g4), jax.tree.leaves(g1), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  # Per-token outputs in the original row order and shape (equal on the loss mask;
  # columns past a micro-batch's bucket were never computed).
  m = np.asarray(mask_NT)
  for k, v in t1.items():
    np.testing.assert_allclose(
      np.where(m, t4[k], 0), np.where(m, v, 0), rtol=1e-4, atol=1e-6, err_msg=k
    )


def test_bucketed_micro_batches_give_the_unbucketed_sums_for_every_aggregation(
  tiny_cfg, tiny_params, skewed_batch
):
  cfg = spec.RLConfig(micro_batches=4, entropy_coef=0.01)
  b = skewed_batch
  for name in aggregation.REGISTRY.names():
    w_NT = aggregation.REGISTRY.make(name)(b.loss_mask_NT, b.group_ids_N, b.adv_NT)
    want, got = _both(cfg, tiny_cfg, tiny_params, b, w_NT)
    _assert_same(got, want, b.loss_mask_NT)


@pytest.mark.parametrize(
  "changes", [{"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4}, {"kl_coef": 0.1}], ids=str
)
def test_bucketed_micro_batches_give_the_unbucketed_sums_for_sequence_losses_and_kl(
  tiny_cfg, tiny_params, skewed_batch, changes
):
  cfg = spec.RLConfig(micro_batches=4, entropy_coef=0.01, **changes)
  b = skewed_batch
  w_NT = aggregation.REGISTRY.make("token_mean")(b.loss_mask_NT, b.group_ids_N, b.adv_NT)
  want, got = _both(cfg, tiny_cfg, tiny_params, b, w_NT)
  _assert_same(got, want, b.loss_mask_NT)


def test_bucketing_computes_less_on_skewed_rows(skewed_batch):
  """Sorted lengths [1,1,1,1 | 2,2,2,3 | 3,4,5,7 | 9,12,16,16] run at buckets 4, 4, 8,
  16: (4 + 4 + 8 + 16) × 4 rows = 128 of the unbucketed 16 × 16 = 256 completion columns."""
  cfg = spec.RLConfig(micro_batches=4, length_buckets=4)
  lengths = np.sort(np.asarray(skewed_batch.mask_NT).sum(axis=1)).reshape(4, 4)
  buckets = np.asarray(learner.length_buckets(cfg, 16))
  picked = buckets[np.searchsorted(buckets, lengths.max(axis=1))]
  np.testing.assert_array_equal(picked, [4, 4, 8, 16])
  assert picked.sum() * 4 / (16 * 16) == 0.5  # Half the unbucketed completion columns.
