"""Length-bucketed micro-batches (learner.length_buckets): rows sorted by length, each
micro-batch cut to the smallest bucket that holds it; and token-budget micro-batches
(rl.micro_batch_tokens): as many rows, longest first, as fit a token budget at their
bucket. Loss, metrics and gradient equal the unsplit step's for every aggregation mode and
policy loss."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import token_budget

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


# 96 tokens a micro-batch at P = 8 prompt columns: rows (8, 6, 4, 4) at T_j = (4, 8, 12, 16).
BUDGET = dict(micro_batches=1, micro_batch_tokens=96, length_buckets=4)


def _all(cfg, tiny_cfg, params, batch, w_NT):
  """(unbucketed, 4-bucket, token-budget) accumulate_gradients outputs on the same batch
  and weights."""
  packed = dataclasses.replace(cfg, length_buckets=4)
  budget = dataclasses.replace(cfg, **BUDGET)
  assert learner.length_buckets(packed, 16) == (4, 8, 12, 16)
  return tuple(
    _grads_fn(c, tiny_cfg)(params, batch, w_NT, c.step_hyper()) for c in (cfg, packed, budget)
  )


def _assert_same(got, want, mask_NT):
  (g4, s4, t4), (g1, s1, t1) = got, want
  assert set(s4) - set(s1) <= {"micro_batches"}
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
    want, packed, budget = _all(cfg, tiny_cfg, tiny_params, b, w_NT)
    _assert_same(packed, want, b.loss_mask_NT)
    _assert_same(budget, want, b.loss_mask_NT)
    assert budget[1]["micro_batches"] == 3  # See test_token_budget_plan_by_hand.


@pytest.mark.parametrize(
  "changes",
  [{"policy_loss": "gspo", "loss_hyper": {"eps_low": 3e-4, "eps_high": 4e-4}}, {"kl_coef": 0.1}],
  ids=str,
)
def test_bucketed_micro_batches_give_the_unbucketed_sums_for_sequence_losses_and_kl(
  tiny_cfg, tiny_params, skewed_batch, changes
):
  cfg = spec.RLConfig(micro_batches=4, entropy_coef=0.01, **changes)
  b = skewed_batch
  w_NT = aggregation.REGISTRY.make("token_mean")(b.loss_mask_NT, b.group_ids_N, b.adv_NT)
  want, packed, budget = _all(cfg, tiny_cfg, tiny_params, b, w_NT)
  _assert_same(packed, want, b.loss_mask_NT)
  _assert_same(budget, want, b.loss_mask_NT)


def test_bucketing_computes_less_on_skewed_rows(skewed_batch):
  """Sorted lengths [1,1,1,1 | 2,2,2,3 | 3,4,5,7 | 9,12,16,16] run at buckets 4, 4, 8,
  16: (4 + 4 + 8 + 16) × 4 rows = 128 of the unbucketed 16 × 16 = 256 completion columns."""
  cfg = spec.RLConfig(micro_batches=4, length_buckets=4)
  lengths = np.sort(np.asarray(skewed_batch.mask_NT).sum(axis=1)).reshape(4, 4)
  buckets = np.asarray(learner.length_buckets(cfg, 16))
  picked = buckets[np.searchsorted(buckets, lengths.max(axis=1))]
  np.testing.assert_array_equal(picked, [4, 4, 8, 16])
  assert picked.sum() * 4 / (16 * 16) == 0.5  # Half the unbucketed completion columns.


def test_token_budget_plan_by_hand(skewed_batch):
  """B = 96 tokens, P = 8: r_j = ⌊96 / (8 + T_j)⌋ = 8, 6, 4, 4 at T_j = 4, 8, 12, 16.
  Lengths longest first [16,16,12,9 | 7,5,4,3,3,2 | 2,2,1,1,1,1]: the micro-batches start
  at rows 0 (16 -> bucket 16, 4 rows), 4 (7 -> bucket 8, 6 rows) and 10 (2 -> bucket 4, 8
  rows, 6 of them real): 3 micro-batches, 4·24 + 6·16 + 8·12 = 288 token columns run
  against 16 · 24 = 384 unsplit, none over 96."""
  cfg = spec.RLConfig(**BUDGET)
  assert learner.token_budget_rows(cfg, P=8, T=16, N=16) == ((4, 8, 12, 16), (8, 6, 4, 4))
  # Data-parallel devices keep whole rows each: ⌊96 / (q·(8 + T_j))⌋·q.
  assert learner.token_budget_rows(cfg, P=8, T=16, N=16, row_multiple=2)[1] == (8, 6, 4, 4)
  assert learner.token_budget_rows(cfg, P=8, T=16, N=16, row_multiple=4)[1] == (8, 4, 4, 4)
  # No row cap above the mini-batch: short rows fill at most N rows.
  short = dataclasses.replace(cfg, micro_batch_tokens=1000)
  assert learner.token_budget_rows(short, P=8, T=16, N=16)[1] == (16, 16, 16, 16)
  # Without length buckets, one length: the token budget fixes the rows per micro-batch.
  flat = dataclasses.replace(cfg, length_buckets=1)
  assert learner.token_budget_rows(flat, P=8, T=16, N=16) == ((16,), (4,))
  lengths = np.sort(np.asarray(skewed_batch.mask_NT).sum(axis=1))[::-1]
  np.testing.assert_array_equal(lengths[[0, 4, 10]], [16, 7, 2])


def test_token_budget_refuses_a_budget_without_a_full_length_row():
  cfg = spec.RLConfig(micro_batch_tokens=40, length_buckets=4)
  with pytest.raises(
    ValueError,
    match=r"micro_batch_tokens=40 holds no full-length row: one "
    r"takes P \+ T = 8 \+ 16 tokens on each of 2 .*at least 48",
  ):
    learner.token_budget_rows(cfg, P=8, T=16, N=16, row_multiple=2)
  with pytest.raises(ValueError, match=r"rl.micro_batches must stay 1 \(got 4\)"):
    spec.RLConfig(micro_batch_tokens=96, micro_batches=4)
  with pytest.raises(ValueError, match=r"rl.micro_batch_tokens must be >= 0, got -1"):
    spec.RLConfig(micro_batch_tokens=-1)


def test_token_budget_skips_rows_without_tokens(tiny_cfg, tiny_params, skewed_batch):
  """Rows whose completion is empty are never run (w = 0 on them): with the 8 shortest
  rows emptied, lengths longest first [16,16,12,9 | 7,5,4,3 | 0 × 8] run as 2
  micro-batches (4 rows at bucket 16, 6 at bucket 8 holding 4 real rows), and the sums
  equal the unsplit step's."""
  b = skewed_batch
  lengths = np.asarray(b.mask_NT).sum(axis=1)
  keep_N = jnp.asarray(lengths > 3)
  keep_N = keep_N.at[int(np.flatnonzero(lengths == 3)[0])].set(True)
  cut = lambda x: x * keep_N[:, None].astype(x.dtype)
  b = b.replace(mask_NT=cut(b.mask_NT), loss_mask_NT=cut(b.loss_mask_NT), adv_NT=cut(b.adv_NT))
  assert int(jnp.sum(jnp.sum(b.mask_NT, axis=1) > 0)) == 8
  cfg = spec.RLConfig(entropy_coef=0.01)
  w_NT = aggregation.REGISTRY.make("seq_mean_token_mean")(b.loss_mask_NT, b.group_ids_N, b.adv_NT)
  want, _, budget = _all(cfg, tiny_cfg, tiny_params, b, w_NT)
  _assert_same(budget, want, b.loss_mask_NT)
  assert budget[1]["micro_batches"] == 2


def test_the_token_budget_experiment_runs_quick():
  """experiments/token_budget.py --quick: 16 rows, one of them at T = 64 and 15 at 2-8
  tokens, in 4 row micro-batches or 2 token-budget ones (4 rows at bucket 64 with the
  long row, then 12 at bucket 16), with the same gradient; the verdict follows its rule."""
  record = token_budget.main(["--quick"])
  r = record["result"]
  assert r["micro_batches"] == {"rows": 4, "tokens": 2}
  assert r["budget_rows"] == (12, 7, 5, 4)
  assert r["grad_tolerance_used"] <= 1
  assert record["rule"] == token_budget.RULE and record["verdict"] == token_budget.verdict(record)
