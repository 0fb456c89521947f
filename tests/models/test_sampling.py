import dataclasses
import functools

import flax
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import logprobs, model, refill, sampling

# ----------------------------------------------------------------------------
# A fake deterministic model: the next token is (token + 1) % V, with a margin of
# 30 nats, so even temperature-1 sampling is deterministic in practice.
# ----------------------------------------------------------------------------
FAKE_V, FAKE_EOS, FAKE_PAD = 10, 9, 0


@flax.struct.dataclass
class FakeCache:
  index: jax.Array

  def repeat(self, n):
    del n
    return self


def fake_init_cache(batch, length):
  del batch, length
  return FakeCache(index=jnp.zeros((), jnp.int32))


def fake_model_fn(params, tokens_BT, positions_BT, cache, *, calls=None):
  del params, positions_BT
  if calls is not None:
    jax.debug.callback(lambda t: calls.append(t.shape), tokens_BT)
  logits_BTV = 30.0 * jax.nn.one_hot((tokens_BT + 1) % FAKE_V, FAKE_V)
  return logits_BTV, cache


def _fake_sampler(*, group_size=1, max_new_tokens=6, calls=None):
  cfg = sampling.SamplerConfig(
    max_new_tokens=max_new_tokens,
    eos_ids=(FAKE_EOS,),
    pad_id=FAKE_PAD,
    group_size=group_size,
    prompt_buckets=(4, 8),
  )
  fn = sampling.make_sample_fn(
    model_fn=functools.partial(fake_model_fn, calls=calls), init_cache=fake_init_cache, cfg=cfg
  )
  return fn, cfg


@pytest.mark.parametrize("greedy", [False, True])
def test_fake_model_exact_sequence_stops_at_eos(greedy):
  fn, cfg = _fake_sampler()
  prompts = sampling.prepare_prompts([[3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [2]], cfg=cfg)
  np.testing.assert_array_equal(
    prompts.tokens_BP[0], [0, 0, 0, 0, 0, 0, 3, 4]
  )  # Bucket 8, left-padded.
  r = fn({}, prompts, jax.random.key(0), sampling.sampling_params(greedy=greedy))
  np.testing.assert_array_equal(
    r.tokens_NT,
    [
      [5, 6, 7, 8, 9, 0],  # EOS (9) after 5 tokens, then padding.
      [9, 0, 0, 0, 0, 0],  # EOS at once.
      [3, 4, 5, 6, 7, 8],  # No EOS within max_new_tokens: truncated.
    ],
  )
  np.testing.assert_array_equal(r.mask_NT.sum(-1), [5, 1, 6])
  np.testing.assert_array_equal(r.length_N, [5, 1, 6])
  np.testing.assert_array_equal(r.eos_N, [True, True, False])
  np.testing.assert_array_equal(r.truncated_N, [False, False, True])
  assert int(r.num_steps) == 6
  # Log-probs are ~0 (a sure token) on the mask and exactly 0 off it.
  assert float(jnp.max(jnp.abs(r.policy_logp_NT))) < 1e-6
  assert bool(jnp.all(jnp.where(r.mask_NT, True, r.logp_NT == 0.0)))


def test_loop_stops_early_once_every_row_is_done():
  fn, cfg = _fake_sampler(max_new_tokens=6)
  r = fn(
    {}, sampling.prepare_prompts([[6], [7]], cfg=cfg), jax.random.key(0), sampling.sampling_params()
  )
  np.testing.assert_array_equal(r.tokens_NT, [[7, 8, 9, 0, 0, 0], [8, 9, 0, 0, 0, 0]])
  assert int(r.num_steps) == 3


def test_prefill_runs_once_per_prompt_not_per_rollout():
  calls = []
  fn, cfg = _fake_sampler(group_size=4, max_new_tokens=3, calls=calls)
  r = fn(
    {},
    sampling.prepare_prompts([[3, 4, 1], [5, 5]], cfg=cfg),
    jax.random.key(0),
    sampling.sampling_params(),
  )
  jax.block_until_ready(r)
  jax.effects_barrier()
  prefills = [shape for shape in calls if shape[1] > 1]
  assert prefills == [
    (2, 3)
  ]  # One prefill call over the B=2 prompts (bucket 4, minus the last token).
  assert [shape for shape in calls if shape[1] == 1] == [
    (8, 1)
  ] * 3  # Decode runs on the N=B*G rows.
  np.testing.assert_array_equal(r.group_ids_N, [0, 0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(r.prompt_tokens_NP[:4], np.tile([0, 3, 4, 1], (4, 1)))


def test_prefill_then_decode_as_two_jits_equals_sample(
  tiny_sampler, tiny_params, tiny_cfg, sampler_cfg, tokenizer
):
  """The two phases carry everything between them in DecodeState (cache, key, positions):
  run as separate compiled calls, they give the fused sampler's tokens and log-probs."""
  prompts, key, hyper = (
    _prompts(sampler_cfg, tokenizer),
    jax.random.key(7),
    sampling.sampling_params(),
  )
  model_fn = model.make_model_fn(tiny_cfg)
  prefill = jax.jit(
    functools.partial(
      sampling.prefill,
      model_fn=model_fn,
      init_cache=functools.partial(model.init_cache, tiny_cfg),
      cfg=sampler_cfg,
    )
  )
  decode = jax.jit(functools.partial(sampling.decode, model_fn=model_fn, cfg=sampler_cfg))
  state = prefill(tiny_params, prompts, key)
  assert int(state.step) == 0 and state.tokens_NT.shape == (3 * sampler_cfg.group_size, 10)
  two = sampling.to_rollouts(prompts, decode(tiny_params, state, hyper), group_size=4)
  one = tiny_sampler(tiny_params, prompts, key, hyper)
  np.testing.assert_array_equal(two.tokens_NT, one.tokens_NT)
  np.testing.assert_allclose(two.policy_logp_NT, one.policy_logp_NT, rtol=1e-6, atol=1e-6)
  assert int(two.num_steps) == int(one.num_steps) > 1


@pytest.mark.parametrize("segments", [3, 10])
def test_decode_in_segments_gives_the_single_loop_rollouts(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer, segments
):
  """Segment j attends over a cache grown to its last step's slots: the same tokens and
  log-probs as one loop over the whole cache (empty slots are masked), with and without
  per-row limits, and one segment per step (10)."""
  cfg = dataclasses.replace(sampler_cfg, decode_segments=segments)
  prompts, key = _prompts(sampler_cfg, tokenizer), jax.random.key(7)
  hyper = sampling.sampling_params(temperature=1.3)
  kw = dict(model_fn=model.make_model_fn(tiny_cfg), init_cache=functools.partial(model.init_cache, tiny_cfg))  # fmt: skip
  state = jax.jit(functools.partial(sampling.prefill, **kw, cfg=cfg))(tiny_params, prompts, key)
  P = prompts.tokens_BP.shape[1]  # 8: a 7-slot prefix, then T = 10 steps.
  expected = {3: (11, 14, 17), 10: tuple(range(8, 18))}[segments]  # 7 + ceil(j·10/n).
  assert state.segment_slots == expected and state.cache.length == expected[0]
  assert P - 1 + sampler_cfg.max_new_tokens == expected[-1]
  limit_N = jnp.asarray([10, 0, 3, 7] * 3, jnp.int32)
  for limit in (None, limit_N):
    one = jax.jit(functools.partial(sampling.sample, **kw, cfg=sampler_cfg))(
      tiny_params, prompts, key, hyper, limit
    )
    seg = jax.jit(functools.partial(sampling.sample, **kw, cfg=cfg))(
      tiny_params, prompts, key, hyper, limit
    )
    np.testing.assert_array_equal(seg.tokens_NT, one.tokens_NT)
    np.testing.assert_array_equal(seg.mask_NT, one.mask_NT)
    np.testing.assert_allclose(seg.logp_NT, one.logp_NT, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(seg.policy_logp_NT, one.policy_logp_NT, rtol=1e-5, atol=1e-5)
    assert int(seg.num_steps) == int(one.num_steps)
  assert int(one.mask_NT.sum()) > 20  # Enough tokens for the comparison to bite.


def test_segment_count_is_automatic_on_cpu_and_capped_by_the_steps():
  make = lambda T, n=0: sampling.SamplerConfig(max_new_tokens=T, eos_ids=(2,), pad_id=0, decode_segments=n)  # fmt: skip
  assert jax.default_backend() == "cpu"
  assert [sampling.segment_count(make(T)) for T in (1, 40, 64, 128, 1024)] == [1, 1, 2, 4, 4]
  assert sampling.segment_count(make(10, 200)) == 10  # At most one per step.
  assert sampling.segment_slots(63, make(128)) == (95, 127, 159, 191)
  assert sampling.segment_slots(5, make(7, 3)) == (8, 10, 12)  # 5 + ceil(7j/3).


def test_kv_cache_grows_with_empty_slots(tiny_cfg):
  for cfg in (tiny_cfg, dataclasses.replace(tiny_cfg, scan_layers=True)):
    cache = model.init_cache(cfg, 2, 3)
    cache = cache.replace(
      k=tuple(k + 1.0 for k in cache.k), v=tuple(v + 2.0 for v in cache.v),
      pos_BS=jnp.asarray([[0, 1, -1], [5, 6, 7]]), index=jnp.asarray(2),
    )  # fmt: skip
    grown = cache.grow(5)
    assert grown.length == 5 and grown.index == 2 and grown.stacked == cfg.scan_layers
    np.testing.assert_array_equal(grown.pos_BS, [[0, 1, -1, -1, -1], [5, 6, 7, -1, -1]])
    for old, new, axis in [(o, n, -1) for o, n in zip(cache.k, grown.k)] + [
      (o, n, -2) for o, n in zip(cache.v, grown.v)
    ]:
      assert new.shape[axis] == 5 and new.shape[: axis % new.ndim] == old.shape[: axis % old.ndim]
      np.testing.assert_array_equal(jax.lax.slice_in_dim(new, 0, 3, axis=axis % new.ndim), old)
      assert not jnp.any(jax.lax.slice_in_dim(new, 3, 5, axis=axis % new.ndim))
    assert cache.grow(3) is cache
    with pytest.raises(ValueError, match="already has 3 slots"):
      cache.grow(2)


@pytest.mark.parametrize("segments, scan_layers", [(1, False), (3, True)])
def test_a_shared_prompt_cache_gives_the_copied_cache_rollouts(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer, segments, scan_layers
):
  """The group rows attending to one shared copy of their prompt's slots
  (`KVCache.share`) sample what rows with their own copies (`KVCache.repeat`) sample:
  the same tokens and log-probs, in one loop, and in segments with scanned layers, with
  and without per-row limits."""
  prompts, key = _prompts(sampler_cfg, tokenizer), jax.random.key(7)
  hyper = sampling.sampling_params(temperature=1.3)
  limit_N = jnp.asarray([10, 0, 3, 7] * 3, jnp.int32)
  mcfg, params = tiny_cfg, tiny_params
  if scan_layers:
    mcfg = dataclasses.replace(tiny_cfg, scan_layers=True)
    params = {k: v for k, v in tiny_params.items() if not k.startswith("layer_")}
    params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *(tiny_params[f"layer_{i}"] for i in range(tiny_cfg.n_layers)))  # fmt: skip
  kw = dict(model_fn=model.make_model_fn(mcfg), init_cache=functools.partial(model.init_cache, mcfg))  # fmt: skip
  out = {}
  for shared in (False, True):
    cfg = dataclasses.replace(sampler_cfg, decode_segments=segments, shared_prefix=shared)
    state = jax.jit(functools.partial(sampling.prefill, **kw, cfg=cfg))(params, prompts, key)
    assert (state.cache.prefix_pos_AS is not None) == shared
    assert state.cache.pos_BS.shape[1] == state.segment_slots[0] - (7 if shared else 0)
    for limit in (None, limit_N):
      out[shared, limit is None] = jax.jit(functools.partial(sampling.sample, **kw, cfg=cfg))(
        params, prompts, key, hyper, limit
      )
  for free in (True, False):
    copied, shared = out[False, free], out[True, free]
    np.testing.assert_array_equal(shared.tokens_NT, copied.tokens_NT)
    np.testing.assert_array_equal(shared.mask_NT, copied.mask_NT)
    np.testing.assert_allclose(shared.logp_NT, copied.logp_NT, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(shared.policy_logp_NT, copied.policy_logp_NT, atol=1e-5)
  assert int(out[True, True].mask_NT.sum()) > 20  # Enough tokens for the comparison to bite.


def _scanned(tiny_cfg, tiny_params):
  """The tiny model with its layers scanned, on the same weights."""
  params = {k: v for k, v in tiny_params.items() if not k.startswith("layer_")}
  layers = (tiny_params[f"layer_{i}"] for i in range(tiny_cfg.n_layers))
  params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return dataclasses.replace(tiny_cfg, scan_layers=True), params


def test_prefill_chunks_cover_the_prompt_in_order():
  assert sampling.prefill_chunks(7, 3) == ((0, 3), (3, 6), (6, 7))
  assert sampling.prefill_chunks(8, 4) == ((0, 4), (4, 8))
  assert sampling.prefill_chunks(7, 0) == sampling.prefill_chunks(7, 7) == ((0, 7),)
  assert sampling.prefill_chunks(7, 99) == ((0, 7),)


def _long_prompts(sampler_cfg, tokenizer, *, padding: int):
  """Three prompts in the 16-token bucket, the longest after `padding` pad slots."""
  texts = ["Q:12+7+1+2\n", "Q:3-45\n", "Q:9+9*2-1\n"]
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(t, add_bos=True) for t in texts], cfg=sampler_cfg
  )
  assert prompts.tokens_BP.shape[1] == 16 and not prompts.mask_BP[:, :padding].any()
  return prompts


def test_a_chunked_prefill_gives_the_one_call_rollouts(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer
):
  """Prefilling a 15-token prompt prefix 3 tokens a call (the first call left padding
  only, the later ones attending over slots not yet written), the static sampler and the
  refill sampler draw the tokens the one-call prefill draws, with the same log-probs
  (float32, same keys)."""
  prompts = _long_prompts(sampler_cfg, tokenizer, padding=3)
  kw = dict(model_fn=model.make_model_fn(tiny_cfg), init_cache=functools.partial(model.init_cache, tiny_cfg))  # fmt: skip
  args = (tiny_params, prompts, jax.random.key(3), sampling.sampling_params(temperature=1.3))
  run = lambda fn, slots=(), **c: jax.jit(functools.partial(fn, **kw, **dict(slots), cfg=dataclasses.replace(sampler_cfg, **c)))(*args)  # fmt: skip
  one = run(sampling.sample)
  pairs = [
    (one, run(sampling.sample, prefill_chunk=3)),
    (
      run(refill.sample, slots={"slots": 6}),
      run(refill.sample, slots={"slots": 6}, prefill_chunk=3),
    ),
  ]
  for want, got in pairs:
    np.testing.assert_array_equal(got.tokens_NT, want.tokens_NT)
    np.testing.assert_array_equal(got.mask_NT, want.mask_NT)
    np.testing.assert_allclose(got.logp_NT, want.logp_NT, atol=2e-5)
    np.testing.assert_allclose(got.policy_logp_NT, want.policy_logp_NT, atol=2e-5)
  assert int(one.mask_NT.sum()) > 40  # Enough tokens for the comparison to bite.


def test_a_chunked_prefill_of_scanned_layers_writes_the_one_call_cache(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer
):
  """Scanned layers (one stacked cache), 4 tokens a call: the shared prompt slots hold
  the keys, values and positions one call writes."""
  prompts = _long_prompts(sampler_cfg, tokenizer, padding=4)
  mcfg, params = _scanned(tiny_cfg, tiny_params)
  kw = dict(model_fn=model.make_model_fn(mcfg), init_cache=functools.partial(model.init_cache, mcfg))  # fmt: skip
  caches = [
    jax.jit(
      functools.partial(
        sampling.prefill, **kw, cfg=dataclasses.replace(sampler_cfg, prefill_chunk=c)
      )
    )(params, prompts, jax.random.key(0)).cache  # fmt: skip
    for c in (0, 4)
  ]
  one, chunked = caches
  np.testing.assert_array_equal(chunked.prefix_pos_AS, one.prefix_pos_AS)
  assert int((one.prefix_pos_AS >= 0).sum()) == 11 + 7 + 10  # Each prompt's tokens but its last.
  for got, want in zip(jax.tree.leaves((chunked.prefix_k, chunked.prefix_v)), jax.tree.leaves((one.prefix_k, one.prefix_v)), strict=True):  # fmt: skip
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_kv_cache_share_holds_the_prefix_once_and_empty_own_slots(tiny_cfg):
  for cfg in (tiny_cfg, dataclasses.replace(tiny_cfg, scan_layers=True)):
    cache = model.init_cache(cfg, 2, 3)
    cache = cache.replace(
      k=tuple(k + 1.0 for k in cache.k), v=tuple(v + 2.0 for v in cache.v),
      pos_BS=jnp.asarray([[-1, 0, 1], [0, 1, 2]]), index=jnp.asarray(3),
    )  # fmt: skip
    shared = cache.share(4, 7)  # 2 prompts × G = 4 rows; 3 prefix slots + 4 own.
    assert shared.length == 7 and int(shared.index) == 0 and shared.stacked == cfg.scan_layers
    np.testing.assert_array_equal(shared.prefix_pos_AS, cache.pos_BS)
    np.testing.assert_array_equal(shared.pos_BS, np.full((8, 4), -1))
    rows = 1 if cfg.scan_layers else 0
    for own, prefix, old in zip(
      shared.k + shared.v, shared.prefix_k + shared.prefix_v, cache.k + cache.v
    ):
      assert own.shape[rows] == 8 and not jnp.any(own)  # fmt: skip
      np.testing.assert_array_equal(prefix, old)
    assert shared.k[0].shape[-1] == 4 and shared.v[0].shape[-2] == 4
    grown = shared.grow(9)  # Grows the own slots only.
    assert (
      grown.length == 9 and grown.k[0].shape[-1] == 6 and grown.prefix_k[0] is shared.prefix_k[0]
    )
    with pytest.raises(ValueError, match="needs more than the prefix's 3 slots"):
      cache.share(4, 3)
    with pytest.raises(ValueError, match="already shared"):
      shared.share(2, 12)
    with pytest.raises(ValueError, match="already shared"):
      shared.repeat(2)


def test_a_cache_without_grow_decodes_in_one_segment_or_says_why():
  fn, cfg = _fake_sampler(max_new_tokens=64)  # Automatic: 2 segments, but FakeCache can't grow.
  assert sampling.segment_count(cfg) == 2
  r = fn(
    {}, sampling.prepare_prompts([[6]], cfg=cfg), jax.random.key(0), sampling.sampling_params()
  )
  np.testing.assert_array_equal(r.tokens_NT[0, :4], [7, 8, 9, 0])
  explicit = dataclasses.replace(cfg, decode_segments=2)
  with pytest.raises(ValueError, match="needs a cache with a grow"):
    sampling.prefill({}, sampling.prepare_prompts([[6]], cfg=explicit), jax.random.key(0), model_fn=fake_model_fn, init_cache=fake_init_cache, cfg=explicit)  # fmt: skip


def _prompts(sampler_cfg, tokenizer):
  texts = ["Q:12+7\n", "Q:3-45\n", "Q:9+9\n"]
  return sampling.prepare_prompts(
    [tokenizer.encode(t, add_bos=True) for t in texts], cfg=sampler_cfg
  )


def test_greedy_equals_argmax_of_teacher_forced_logits(
  tiny_sampler, tiny_params, tiny_model_fn, sampler_cfg, tokenizer
):
  r = tiny_sampler(
    tiny_params,
    _prompts(sampler_cfg, tokenizer),
    jax.random.key(0),
    sampling.sampling_params(greedy=True),
  )
  P = r.prompt_tokens_NP.shape[1]
  tokens = jnp.concatenate([r.prompt_tokens_NP, r.tokens_NT], axis=1)
  mask = jnp.concatenate([r.prompt_mask_NP, r.mask_NT], axis=1)
  logits, _ = tiny_model_fn(tiny_params, tokens, model.positions_from_mask(mask), None)
  argmax_NT = jnp.argmax(logits[:, P - 1 : -1], axis=-1)
  assert bool(jnp.all(jnp.where(r.mask_NT, argmax_NT == r.tokens_NT, True)))
  assert int(r.mask_NT.sum()) > 12  # Enough generated tokens to mean something.
  # Greedy rows of one group are identical; their sampling log-prob is 0 (a point mass).
  np.testing.assert_array_equal(r.tokens_NT[0], r.tokens_NT[3])
  np.testing.assert_array_equal(r.logp_NT, 0.0)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 0.9)])
def test_logprobs_equal_teacher_forced_forward(
  tiny_sampler, tiny_params, tiny_model_fn, sampler_cfg, tokenizer, temperature, top_k, top_p
):
  hyper = sampling.sampling_params(temperature=temperature, top_k=top_k, top_p=top_p)
  r = tiny_sampler(tiny_params, _prompts(sampler_cfg, tokenizer), jax.random.key(3), hyper)
  tf_NT = logprobs.teacher_forced_logprobs(tiny_params, r, model_fn=tiny_model_fn)
  assert float(jnp.max(jnp.abs(tf_NT - r.policy_logp_NT))) <= 1e-5
  # The sampling-distribution log-prob: log_softmax(filter(logits)) at the sampled token.
  P = r.prompt_tokens_NP.shape[1]
  tokens = jnp.concatenate([r.prompt_tokens_NP, r.tokens_NT], axis=1)
  mask = jnp.concatenate([r.prompt_mask_NP, r.mask_NT], axis=1)
  logits, _ = tiny_model_fn(tiny_params, tokens, model.positions_from_mask(mask), None)
  N, T, V = r.tokens_NT.shape + (logits.shape[-1],)
  filtered = sampling.filter_logits(logits[:, P - 1 : -1].reshape(N * T, V), hyper)
  expected = jnp.take_along_axis(
    jax.nn.log_softmax(filtered), r.tokens_NT.reshape(-1, 1), axis=-1
  ).reshape(N, T)
  assert float(jnp.max(jnp.abs(jnp.where(r.mask_NT, expected - r.logp_NT, 0.0)))) <= 1e-4
  if temperature != 1.0:  # The two log-probs differ when the distribution is modified.
    assert float(jnp.max(jnp.abs(r.logp_NT - r.policy_logp_NT))) > 1e-2


def test_group_rows_get_distinct_randomness_and_seeds_reproduce(
  tiny_sampler, tiny_params, sampler_cfg, tokenizer
):
  prompts = _prompts(sampler_cfg, tokenizer)
  hot = sampling.sampling_params(temperature=3.0)
  r = tiny_sampler(tiny_params, prompts, jax.random.key(7), hot)
  for g in range(3):
    rows = {tuple(np.asarray(x)) for x in r.tokens_NT[4 * g : 4 * g + 4]}
    assert len(rows) > 1, f"group {g}: all G rows identical"
  again = tiny_sampler(tiny_params, prompts, jax.random.key(7), hot)
  np.testing.assert_array_equal(r.tokens_NT, again.tokens_NT)
  other = tiny_sampler(tiny_params, prompts, jax.random.key(8), hot)
  assert not np.array_equal(r.tokens_NT, other.tokens_NT)


def test_one_compile_per_prompt_bucket(tiny_cfg, tiny_params, tokenizer):
  traces = []

  def counting_model_fn(*args):
    traces.append(1)
    return model.make_model_fn(tiny_cfg)(*args)

  cfg = sampling.SamplerConfig(
    max_new_tokens=2, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, prompt_buckets=(4, 8)
  )
  fn = sampling.make_sample_fn(
    model_fn=counting_model_fn, init_cache=functools.partial(model.init_cache, tiny_cfg), cfg=cfg
  )
  params = tiny_params
  hyper = sampling.sampling_params()
  for lengths in ([5, 6], [8, 2], [3, 1], [4, 4]):  # Buckets 8, 8, 4, 4.
    prompts = sampling.prepare_prompts([[4] * n for n in lengths], cfg=cfg)
    fn(params, prompts, jax.random.key(0), hyper)
  fn(
    params,
    prompts,
    jax.random.key(0),
    sampling.sampling_params(temperature=0.5, top_p=0.9, greedy=True),
  )
  assert fn._cache_size() == 2
  assert len(traces) == 4  # Two buckets, each traced once: prefill + decode body.


# ----------------------------------------------------------------------------
# Sampling distributions.
# ----------------------------------------------------------------------------


def _filtered_set(logits, **kw):
  out = sampling.filter_logits(
    jnp.log(jnp.asarray([logits], jnp.float32)), sampling.sampling_params(**kw)
  )
  return set(np.flatnonzero(np.isfinite(np.asarray(out[0]))))


def test_filter_logits_pinned_by_hand():
  probs = [0.5, 0.3, 0.15, 0.05]
  assert _filtered_set(probs) == {0, 1, 2, 3}
  assert _filtered_set(probs, top_p=0.4) == {0}
  assert _filtered_set(probs, top_p=0.75) == {0, 1}
  assert _filtered_set(probs, top_p=0.85) == {0, 1, 2}
  assert _filtered_set(probs, top_k=2) == {0, 1}
  assert _filtered_set(probs, top_k=2, top_p=0.9) == {0, 1}  # Renormalised top-2: 0.625, 0.375.
  assert _filtered_set(probs, top_k=3, top_p=0.6) == {0, 1}  # Renormalised top-3: .526, .316, .158.
  assert _filtered_set(probs, top_k=10) == {0, 1, 2, 3}


_choose = jax.jit(sampling.choose_tokens)


def _allowed(logits_V, temperature, top_k, top_p, slack=1e-5):
  """Reference (numpy, a superset by `slack`) of the tokens top-k/top-p may emit."""
  # Scaled in float32, as the sampler does, so that ties created by rounding agree.
  s = (np.asarray(logits_V, np.float32) / np.float32(temperature)).astype(np.float64)
  desc = np.sort(s)[::-1]
  kk = min(top_k, len(s)) if top_k > 0 else len(s)
  kept = desc[desc >= desc[kk - 1]]  # Ties with the k-th largest logit are kept.
  p = np.exp(kept - kept[0])
  cum = np.cumsum(p / p.sum())
  n_keep = min(int(np.searchsorted(cum, min(top_p + slack, 1.0))) + 1, len(kept))
  return set(np.flatnonzero(s >= kept[n_keep - 1]))


@hypothesis.settings(max_examples=40, deadline=None)  # Subnormals excluded: XLA flushes them to 0.
@hypothesis.given(
  logits=st.lists(
    st.floats(-8, 8, allow_nan=False, allow_subnormal=False, width=32), min_size=16, max_size=16
  ),
  temperature=st.floats(0.2, 3.0),
  top_k=st.integers(0, 20),
  top_p=st.floats(0.05, 1.0),
  seed=st.integers(0, 2**31 - 1),
)
def test_top_k_top_p_never_emit_outside_allowed_set(logits, temperature, top_k, top_p, seed):
  hyper = sampling.sampling_params(temperature=temperature, top_k=top_k, top_p=top_p)
  logits_NV = jnp.tile(jnp.asarray(logits, jnp.float32), (256, 1))
  tok_N, logp_N, _ = _choose(logits_NV, jax.random.key(seed), hyper)
  allowed = _allowed(logits, temperature, top_k, top_p)
  emitted = set(np.asarray(tok_N).tolist())
  assert emitted <= allowed, (emitted - allowed, allowed)
  assert bool(jnp.all(jnp.isfinite(logp_N)))


def test_temperature_sampling_matches_softmax_chi_square():
  logits_V = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
  n, temperature = 20_000, 0.7
  tok_N, _, _ = _choose(
    jnp.tile(logits_V, (n, 1)), jax.random.key(0), sampling.sampling_params(temperature=temperature)
  )
  counts = np.bincount(np.asarray(tok_N), minlength=6)

  def chi2(probs):
    expected = n * np.asarray(probs)
    return float(np.sum((counts - expected) ** 2 / expected))

  critical = 20.515  # chi-square, 5 degrees of freedom, p = 0.001.
  assert chi2(jax.nn.softmax(logits_V / temperature)) < critical
  assert chi2(jax.nn.softmax(logits_V)) > 10 * critical  # The test can tell T=0.7 from T=1.


def test_two_level_inverse_cdf_matches_softmax_across_blocks():
  # V = 100 in blocks of 16: 7 blocks, the last one padded; some tokens have zero mass.
  logits_V = jax.random.normal(jax.random.key(5), (100,)) * 1.5
  logits_V = logits_V.at[jnp.array([0, 17, 99])].set(-jnp.inf)
  n = 50_000
  tok_N = jax.jit(functools.partial(sampling.sample_categorical, block=16))(
    jax.random.key(6), jnp.tile(logits_V, (n, 1))
  )
  counts = np.bincount(np.asarray(tok_N), minlength=100)
  assert counts[[0, 17, 99]].sum() == 0 and counts.sum() == n
  probs = np.asarray(jax.nn.softmax(logits_V))
  live = probs > 0
  chi2 = float(np.sum((counts[live] - n * probs[live]) ** 2 / (n * probs[live])))
  df = int(live.sum()) - 1
  critical = (
    df * (1 - 2 / (9 * df) + 3.09 * np.sqrt(2 / (9 * df))) ** 3
  )  # Wilson-Hilferty, p = 0.001.
  assert chi2 < critical, (chi2, critical)
  shuffled = probs[live][::-1]  # Control: a different distribution is rejected.
  assert float(np.sum((counts[live] - n * shuffled) ** 2 / (n * shuffled))) > 10 * critical


# ----------------------------------------------------------------------------
# Bad input.
# ----------------------------------------------------------------------------


def test_prompt_longer_than_max_is_an_error_or_left_truncated():
  cfg = sampling.SamplerConfig(
    max_new_tokens=2, eos_ids=(2,), pad_id=0, max_prompt_len=4, prompt_buckets=(4, 8)
  )
  with pytest.raises(
    ValueError, match=r"Prompt 1 has 6 tokens > max_prompt_len=4.*truncate_prompts='left'"
  ):
    sampling.prepare_prompts([[1, 2], [1, 2, 3, 4, 5, 6]], cfg=cfg)
  left = sampling.SamplerConfig(
    max_new_tokens=2,
    eos_ids=(2,),
    pad_id=0,
    max_prompt_len=4,
    prompt_buckets=(4, 8),
    truncate_prompts="left",
  )
  prompts = sampling.prepare_prompts([[1, 2], [1, 2, 3, 4, 5, 6]], cfg=left)
  np.testing.assert_array_equal(prompts.tokens_BP, [[0, 0, 1, 2], [3, 4, 5, 6]])
  np.testing.assert_array_equal(prompts.mask_BP, [[0, 0, 1, 1], [1, 1, 1, 1]])


@pytest.mark.parametrize(
  "make, message",
  [
    (lambda: sampling.prepare_prompts([[1], []], cfg=sampling.SamplerConfig(max_new_tokens=1, eos_ids=(2,), pad_id=0)), "Prompt 1 is empty"),
    (lambda: sampling.prepare_prompts([[1] * 9], cfg=sampling.SamplerConfig(max_new_tokens=1, eos_ids=(2,), pad_id=0, prompt_buckets=(4, 8))), "exceeds the largest bucket 8"),
    (lambda: sampling.SamplerConfig(max_new_tokens=1, eos_ids=(), pad_id=0), "at least one EOS"),
    (lambda: sampling.SamplerConfig(max_new_tokens=1, eos_ids=(2,), pad_id=0, truncate_prompts="right"), "allowed: \\('error', 'left'\\)"),
    (lambda: sampling.SamplerConfig(max_new_tokens=0, eos_ids=(2,), pad_id=0), "max_new_tokens must be >= 1"),
    (lambda: sampling.SamplerConfig(max_new_tokens=1, eos_ids=(2,), pad_id=0, prompt_buckets=(1, 8)), "increasing ints >= 2"),
    (lambda: sampling.SamplerConfig(max_new_tokens=1, eos_ids=(2,), pad_id=0, decode_segments=-1), "decode_segments must be >= 0"),
    (lambda: sampling.SamplerConfig(max_new_tokens=1, eos_ids=(2,), pad_id=0, prefill_chunk=-1), "prefill_chunk must be >= 0"),
    (lambda: sampling.sampling_params(temperature=0.0), "use greedy=True"),
    (lambda: sampling.sampling_params(top_p=0.0), "top_p must be in \\(0, 1\\]"),
    (lambda: sampling.sampling_params(top_k=-1), "top_k must be >= 0"),
  ],
)  # fmt: skip
def test_bad_sampler_input_errors_are_clear(make, message):
  with pytest.raises(ValueError, match=message):
    make()


def test_scanned_layers_decode_unrolled_on_the_same_weights():
  """A scanned model's samplers run the unrolled model on its layers' slices
  (`model.sampler_view`): same logits, same tokens as decoding with the layer scan, and
  the cache is one buffer per layer. Sharded over fsdp the layers stay scanned; adapters
  merged for sampling are unstacked after the fold."""
  cfg = model.tiny_config(vocab_size=48, scan_layers=True)  # 2 layers.
  params = model.init(cfg, jax.random.key(0))
  mcfg, view = model.sampler_view(cfg)
  assert not mcfg.scan_layers and mcfg.remat == "none"
  assert model.sampler_view(cfg, fsdp=2) == (cfg, None)
  unrolled = view(params)
  assert sorted(unrolled) == ["embed", "final_norm", "layer_0", "layer_1"]
  assert jax.tree.structure(unrolled) == jax.tree.structure(
    jax.eval_shape(lambda: model.init(mcfg, jax.random.key(1)))
  )
  np.testing.assert_array_equal(
    unrolled["layer_1"]["mlp"]["up"]["kernel"], params["layers"]["mlp"]["up"]["kernel"][1]
  )
  tokens_BT = jax.random.randint(jax.random.key(2), (3, 7), 1, 48)
  positions_BT = jnp.broadcast_to(jnp.arange(7), (3, 7))
  apply = jax.jit(model.apply, static_argnames="cfg")  # Eager Flax is slow.
  scanned_logits, _ = apply(params, tokens_BT, positions_BT, cfg=cfg)
  unrolled_logits, _ = apply(unrolled, tokens_BT, positions_BT, cfg=mcfg)
  np.testing.assert_allclose(unrolled_logits, scanned_logits, atol=1e-5)

  scfg = sampling.SamplerConfig(max_new_tokens=4, eos_ids=(47,), pad_id=0, group_size=2)
  prompts = sampling.prepare_prompts([[3, 4, 5], [6, 7]], cfg=scfg)
  hyper = sampling.sampling_params(temperature=1.0)
  with_scan = sampling.make_sample_fn(
    model_fn=model.make_model_fn(cfg), init_cache=functools.partial(model.init_cache, cfg), cfg=scfg
  )
  policy = sampling.make_policy_sampler(cfg, scfg)
  a, b = (f(params, prompts, jax.random.key(3), hyper) for f in (with_scan, policy))
  np.testing.assert_array_equal(a.tokens_NT, b.tokens_NT)
  np.testing.assert_allclose(a.policy_logp_NT, b.policy_logp_NT, atol=1e-5)
  assert len(model.init_cache(mcfg, 2, 4).k) == 2  # One key buffer per layer.

  lora = dataclasses.replace(cfg, lora=model.LoraConfig(rank=2, merge_for_sampling=True))
  lcfg, lview = model.sampler_view(lora)
  assert lcfg == mcfg  # The base, unrolled.
  adapted = model.init(lora, jax.random.key(4))
  merged = lview(adapted)
  expected = view(model.merge_adapters(adapted, lora))
  assert jax.tree.structure(merged) == jax.tree.structure(expected)
  jax.tree.map(np.testing.assert_array_equal, merged, expected)
