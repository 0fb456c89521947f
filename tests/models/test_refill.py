"""The slot-refill sampler (`refill`): every request decoded once, with the policy's own
log-probs (the teacher-forced forward agrees), limits and EOS respected, fewer steps than
the static sampler under skewed lengths."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import logprobs, model, refill, sampling


@pytest.fixture(scope="module")
def setup(tiny_cfg, tokenizer):
  cfg = sampling.SamplerConfig(
    max_new_tokens=10,
    eos_ids=tokenizer.eos_ids,
    pad_id=tokenizer.pad_id,
    group_size=4,
    prompt_buckets=(8,),
  )
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(p, add_bos=True) for p in ("Q:12+7=", "Q:3+45=", "Q:60+6=")], cfg=cfg
  )
  return cfg, prompts


def _refill(tiny_cfg, cfg, *, slots):
  return jax.jit(
    functools.partial(
      refill.sample,
      model_fn=model.make_model_fn(tiny_cfg),
      init_cache=functools.partial(model.init_cache, tiny_cfg),
      cfg=cfg,
      slots=slots,
    )
  )


@pytest.mark.parametrize("slots", [1, 5, 12])
def test_every_request_is_decoded_with_the_policy_s_log_probs(tiny_cfg, tiny_params, setup, slots):
  cfg, prompts = setup
  r = _refill(tiny_cfg, cfg, slots=slots)(
    tiny_params, prompts, jax.random.key(0), sampling.sampling_params()
  )
  N, T = r.tokens_NT.shape
  assert N == 12 and T == 10
  length = np.asarray(r.length_N)
  assert np.all(length >= 1)  # Every request was issued and decoded.
  mask = np.asarray(r.mask_NT)
  np.testing.assert_array_equal(mask, np.arange(T)[None, :] < length[:, None])  # Contiguous.
  eos = np.isin(np.asarray(r.tokens_NT), cfg.eos_ids) & mask
  np.testing.assert_array_equal(np.asarray(r.eos_N), eos.any(axis=1))
  for n in np.flatnonzero(eos.any(axis=1)):  # An EOS is the row's last token.
    assert eos[n, length[n] - 1] and eos[n].sum() == 1
  np.testing.assert_array_equal(r.group_ids_N, np.repeat(np.arange(3), 4))
  lp, _ = logprobs.completion_logprobs(
    tiny_params,
    r.prompt_tokens_NP,
    r.prompt_mask_NP,
    r.tokens_NT,
    r.mask_NT,
    model_fn=model.make_model_fn(tiny_cfg),
  )
  np.testing.assert_allclose(
    np.where(mask, lp, 0.0), np.where(mask, r.policy_logp_NT, 0.0), atol=2e-4
  )
  # With one slot per request there is nothing to refill: the loop runs the longest row.
  if slots == 12:
    assert int(r.num_steps) == length.max()


def test_limits_end_requests_and_refill_saves_steps(tiny_cfg, tiny_params, setup):
  cfg, prompts = setup
  limit = jnp.asarray([1, 2, 3, 10, 1, 1, 1, 1, 2, 2, 2, 2], jnp.int32)
  hyper = sampling.sampling_params()
  r = _refill(tiny_cfg, cfg, slots=4)(tiny_params, prompts, jax.random.key(1), hyper, limit)
  length = np.asarray(r.length_N)
  assert np.all(length <= np.asarray(limit)) and np.all(length >= 1)
  # EOS or the limit ended every row; a row at its limit without EOS is truncated.
  at_limit = length == np.asarray(limit)
  assert np.all(at_limit | np.asarray(r.eos_N))
  # The static sampler decodes every row until the longest (10) ends: 10 steps of 12 rows
  # = 120 row-steps; refilling 4 slots needs about Σ lengths / 4 steps.
  assert int(r.num_steps) * 4 < 10 * 12
  assert int(r.num_steps) >= int(np.ceil(length.sum() / 4))


def test_bad_slot_counts_are_refused(tiny_cfg, tiny_params, setup):
  cfg, prompts = setup
  for slots in (0, 13):
    with pytest.raises(ValueError, match=r"refill slots must be in \[1, 12\]"):
      _refill(tiny_cfg, cfg, slots=slots)(
        tiny_params, prompts, jax.random.key(0), sampling.sampling_params()
      )


def test_the_trainer_runs_on_the_refill_sampler(tmp_path):

  import arithmetic

  from grpo_jax.infra import config_lib, logs
  from grpo_jax.trainer import build, train

  c = arithmetic.get_config("quick")
  c.sampler.update(group_size=4, refill_slots=6)
  c.update(prompts_per_step=4, iterations=2, warmstart_steps=2, warmstart_batch=8, eval_size=8)
  c.update(eval_every=2, checkpoint_every=2, reward_workers=0, progress=False)
  train.run(c, tmp_path, log=lambda _: None)
  lines = logs.read_jsonl(tmp_path / "metrics.jsonl")
  assert [x["iteration"] for x in lines] == [0, 1, 2]
  for x in lines[1:]:
    assert 0.0 <= x["pad/sample_frac"] < 1.0 and np.isfinite(x["loss"])
  c.sampler.refill_slots = 17  # More slots than the 16 rows it decodes.
  with pytest.raises(config_lib.ConfigError, match="refill_slots=17 exceeds the rows"):
    build.build(c)
  c.sampler.refill_slots = -1
  with pytest.raises(config_lib.ConfigError, match="refill_slots must be >= 0"):
    build.build(c)


def test_refill_with_scanned_layers_matches_the_teacher_forced_forward(tiny_cfg, setup):
  """Stacked ([L, ...]) caches: the prefix copy and the per-row write work through nn.scan."""
  import dataclasses  # noqa: PLC0415

  cfg_s = dataclasses.replace(tiny_cfg, scan_layers=True)
  params = model.init(cfg_s, jax.random.key(3))
  cfg, prompts = setup
  r = _refill(cfg_s, cfg, slots=5)(params, prompts, jax.random.key(4), sampling.sampling_params())
  lp, _ = logprobs.completion_logprobs(
    params,
    r.prompt_tokens_NP,
    r.prompt_mask_NP,
    r.tokens_NT,
    r.mask_NT,
    model_fn=model.make_model_fn(cfg_s),
  )
  m = np.asarray(r.mask_NT)
  assert np.all(m.sum(axis=1) >= 1)
  np.testing.assert_allclose(np.where(m, lp, 0.0), np.where(m, r.policy_logp_NT, 0.0), atol=2e-4)
