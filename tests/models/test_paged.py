"""The paged KV cache (`paged`, `kv_cache.PagedKVCache`, `attention.attend_paged`): the
dense sampler's rollouts from pages, the page allocator by hand, and the config's errors."""

import dataclasses
import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import paged_sampler  # experiments/ is on the tests' path (pyproject.toml)
import pytest
import window_rings

from grpo_jax.models import attention, kv_cache, model, paged, refill, sampling, shapes, sharding
from grpo_jax.trainer import memory

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _prompts(sampler_cfg, tokenizer):
  texts = ["Q:12+7+1+2\n", "Q:3-45\n", "Q:9+9*2-1\n"]
  return sampling.prepare_prompts(
    [tokenizer.encode(t, add_bos=True) for t in texts], cfg=sampler_cfg
  )


def _scanned(tiny_cfg, tiny_params):
  params = {k: v for k, v in tiny_params.items() if not k.startswith("layer_")}
  layers = (tiny_params[f"layer_{i}"] for i in range(tiny_cfg.n_layers))
  params["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
  return dataclasses.replace(tiny_cfg, scan_layers=True), params


def _assert_same(got, want, *, atol=1e-5):
  np.testing.assert_array_equal(got.tokens_NT, want.tokens_NT)
  np.testing.assert_array_equal(got.mask_NT, want.mask_NT)
  np.testing.assert_array_equal(got.eos_N, want.eos_N)
  np.testing.assert_allclose(got.logp_NT, want.logp_NT, atol=atol)
  np.testing.assert_allclose(got.policy_logp_NT, want.policy_logp_NT, atol=atol)


@pytest.mark.parametrize(
  "scan_layers, shared, chunk, limits",
  [(False, True, 0, False), (False, False, 3, True), (True, True, 0, True)],
)
def test_paged_rollouts_equal_the_dense_samplers(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer, scan_layers, shared, chunk, limits
):
  """Pages of 3 slots (a 15-token prompt prefix on 5 pages, completions across 4), with the
  group's prompt pages shared or copied, a chunked prefill, per-row limits and scanned
  layers: the same tokens as the dense sampler and log-probs within 1e-5 (float32, same
  keys)."""
  mcfg, params = (tiny_cfg, tiny_params)
  if scan_layers:
    mcfg, params = _scanned(tiny_cfg, tiny_params)
  kw = dict(model_fn=model.make_model_fn(mcfg), init_cache=functools.partial(model.init_cache, mcfg))  # fmt: skip
  cfg = dataclasses.replace(sampler_cfg, shared_prefix=shared, prefill_chunk=chunk)
  limit_N = jnp.asarray([10, 0, 3, 7] * 3, jnp.int32) if limits else None
  args = (params, _prompts(sampler_cfg, tokenizer), jax.random.key(5), sampling.sampling_params(temperature=1.3), limit_N)  # fmt: skip
  dense = jax.jit(functools.partial(sampling.sample, **kw, cfg=cfg))(*args)
  paged_cfg = dataclasses.replace(cfg, kv_layout="paged", page_size=3)
  got = jax.jit(functools.partial(paged.sample, **kw, cfg=paged_cfg))(*args)
  _assert_same(got, dense)
  assert int(dense.mask_NT.sum()) > 30  # Enough tokens for the comparison to bite.


@pytest.mark.parametrize("scan_layers, slots, chunk", [(False, 5, 0), (True, 8, 3)])
def test_the_refill_sampler_on_pages_equals_the_refill_sampler(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer, scan_layers, slots, chunk
):
  """Continuous batching on pages (`refill` with kv_layout="paged": a refilled slot points
  at its prompt's pages, nothing copied; pages of 3 slots taken and returned per slot;
  the tail compacted) draws the dense refill sampler's tokens with its log-probs (float32,
  same keys), with per-request limits; a pool a quarter of the worst case's truncates
  requests at page edges."""
  mcfg, params = (tiny_cfg, tiny_params)
  if scan_layers:
    mcfg, params = _scanned(tiny_cfg, tiny_params)
  kw = dict(model_fn=model.make_model_fn(mcfg), init_cache=functools.partial(model.init_cache, mcfg), slots=slots)  # fmt: skip
  cfg = dataclasses.replace(sampler_cfg, prefill_chunk=chunk)
  limit_N = jnp.asarray([10, 1, 3, 7] * 3, jnp.int32)
  args = (params, _prompts(sampler_cfg, tokenizer), jax.random.key(5), sampling.sampling_params(temperature=1.3), limit_N)  # fmt: skip
  run = lambda c: jax.jit(functools.partial(refill.sample, **kw, cfg=c))(*args)  # noqa: E731
  dense = run(cfg)
  _assert_same(run(dataclasses.replace(cfg, kv_layout="paged", page_size=3)), dense)
  assert int(dense.mask_NT.sum()) > 30
  # A quarter of the pool: a request that finds no page at a page edge ends there, so a
  # cut request holds a whole number of pages' tokens, short of its limit, and no EOS.
  short = run(dataclasses.replace(cfg, kv_layout="paged", page_size=3, kv_pool_fraction=0.25))
  length_N, eos_N = np.asarray(short.length_N), np.asarray(short.eos_N)
  cut = ~eos_N & (length_N < np.asarray(limit_N))
  assert cut.any() and (length_N[cut] % 3 == 0).all()
  np.testing.assert_array_equal(short.starved_N, cut)
  assert dense.starved_N is None


def test_partial_rollouts_and_counterfactual_branches_on_pages_equal_the_dense_ones(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer, monkeypatch
):
  """The two samplers that decode from a row's own prefix (`rollouts.counterfactuals.sample_limited`):
  partial rollouts continued over two segments (3 then 4 tokens, prefixes of P + T slots
  on pages of 3) and IBPO branches cut at 1–5 tokens of their parents (one slot
  inactive) draw the dense cache's tokens with its log-probs (float32, same keys), and
  decode on pages (`paged.decode` traced)."""
  from grpo_jax.rl import counterfactuals  # noqa: PLC0415
  from grpo_jax.rollouts import counterfactuals as cf_gen  # noqa: PLC0415
  from grpo_jax.rollouts import partial  # noqa: PLC0415

  traced = []
  real_decode = paged.decode
  monkeypatch.setitem(
    cf_gen._LIMITED,
    "paged",
    (paged.prefill, lambda *a, **k: traced.append(1) or real_decode(*a, **k)),
  )

  kw = dict(model_fn=model.make_model_fn(tiny_cfg), init_cache=functools.partial(model.init_cache, tiny_cfg))  # fmt: skip
  hyper = sampling.sampling_params(temperature=1.3)
  prompts = _prompts(sampler_cfg, tokenizer)
  paged_cfg = dataclasses.replace(sampler_cfg, kv_layout="paged", page_size=3)
  T = sampler_cfg.max_new_tokens

  @functools.partial(jax.jit, static_argnums=0)
  def segments(cfg):
    rows = partial.empty_rollouts(prompts, group_size=cfg.group_size, max_new_tokens=T, pad_id=cfg.pad_id)  # fmt: skip
    for steps, seed in ((3, 1), (4, 2)):
      live_N = ~partial.finished(rows)
      rows = partial.continue_rows(tiny_params, rows, live_N, steps, jax.random.key(seed), hyper, **kw, cfg=cfg)  # fmt: skip
    return rows

  dense = segments(sampler_cfg)
  assert not traced
  got = segments(paged_cfg)
  assert len(traced) == 2  # Both segments, on pages.
  _assert_same(got, dense)
  np.testing.assert_array_equal(got.length_N, dense.length_N)
  assert int(dense.mask_NT.sum()) > 30 and int(dense.length_N.max()) == 7  # Two segments.

  parents = sampling.sample(tiny_params, prompts, jax.random.key(3), hyper, **kw, cfg=sampler_cfg)
  assert (np.asarray(parents.length_N)[:11] == T).all()  # Every cut below is inside its parent.
  cf_plan = counterfactuals.Plan(
    parent_M=jnp.asarray([0, 2, 5, 7, 9, 10], jnp.int32),
    cut_M=jnp.asarray([1, 2, 3, 5, 1, 4], jnp.int32),
    active_M=jnp.asarray([True, True, True, True, False, True]),
  )

  @functools.partial(jax.jit, static_argnums=0)
  def branches(cfg):
    return cf_gen.branch(tiny_params, parents, cf_plan, jax.random.key(4), hyper, **kw, cfg=cfg)  # fmt: skip

  (want, own_want), (got, own_got) = branches(sampler_cfg), branches(paged_cfg)
  _assert_same(got, want)
  np.testing.assert_array_equal(own_got, own_want)
  assert int(own_want.sum()) > 15 and not bool(own_want[4].any())  # The inactive slot: none.
  # A pool the config sets at a fifth of the worst case would cut branches (scored as
  # truncated: a bias in IBPO's φ); these rows' pool is always whole, so they are uncut.
  short, own_short = branches(dataclasses.replace(paged_cfg, kv_pool_fraction=0.2))
  _assert_same(short, want)
  np.testing.assert_array_equal(own_short, own_want)


def test_paged_attention_over_blocks_equals_attention_over_the_gathered_slots():
  """attend_paged in blocks of 2 pages (an online softmax over up to 3 blocks, cut short
  by the live bound) equals `attend` over each row's slots laid out densely with its new
  key after them, with and without a window and soft-capping; rows share their first
  page, a null page pads the short rows, and a padding query gets 0."""
  N, K, Q, E, Z, pages = 4, 2, 2, 8, 4, 9
  rng = np.random.RandomState(0)
  k_pool = jnp.asarray(rng.randn(pages + 1, K, E, Z), jnp.float32).at[-1].set(0.0)
  v_pool = jnp.asarray(rng.randn(pages + 1, K, Z, E), jnp.float32).at[-1].set(0.0)
  table_NM = jnp.asarray(
    [[0, 1, 2, 3, 4], [0, 5, 6, 7, 9], [0, 8, 9, 9, 9], [0, 9, 9, 9, 9]], jnp.int32
  )
  # Row n's slots hold positions 0 .. used − 1; the null page (9) and unwritten slots -1.
  used = (19, 15, 6, 0)
  pos_PZ = np.full((pages + 1, Z), -1, np.int32)
  for row, n in enumerate(used[:3]):
    for s in range(n):
      pos_PZ[table_NM[row, s // Z], s % Z] = s
  pos_PZ = jnp.asarray(pos_PZ)
  q_BKQE = jnp.asarray(rng.randn(N, K, Q, E), jnp.float32)
  q_pos_BQ = jnp.asarray([[n, n] for n in used[:3]] + [[-1, -1]], jnp.int32)
  k_BKE = jnp.asarray(rng.randn(N, K, E), jnp.float32)
  v_BKE = jnp.asarray(rng.randn(N, K, E), jnp.float32)
  keys = jnp.transpose(k_pool[table_NM], (0, 2, 3, 1, 4)).reshape(N, K, E, -1)
  values = jnp.transpose(v_pool[table_NM], (0, 2, 1, 3, 4)).reshape(N, K, -1, E)
  keys = jnp.concatenate([keys, k_BKE[..., None]], axis=-1)
  values = jnp.concatenate([values, v_BKE[:, :, None]], axis=2)
  key_pos = jnp.concatenate([pos_PZ[table_NM].reshape(N, -1), q_pos_BQ[:, :1]], axis=1)

  def check(q_BKQE, q_pos_BQ, new_k, new_v, new_pos, keys, values, key_pos):
    """attend_paged over the pool and the new keys equals attend over the gathered slots
    followed by the new keys, with and without a window and soft-capping; the outputs."""
    outs = []
    for window, softcap in ((None, 0.0), (6, 2.0)):
      mask = dict(dtype=jnp.float32, window=window, softcap=softcap)
      got = attention.attend_paged(
        q_BKQE, q_pos_BQ, k_pool, v_pool, pos_PZ, table_NM, jnp.asarray(19), new_k, new_v,
        new_pos, block=2, **mask,
      )  # fmt: skip
      want = attention.attend(q_BKQE, q_pos_BQ, keys, values, key_pos, **mask)
      np.testing.assert_allclose(got, want, atol=1e-6)
      np.testing.assert_array_equal(got[3], 0.0)
      outs.append(got)
    return outs

  check(q_BKQE, q_pos_BQ, k_BKE[..., None], v_BKE[:, :, None], q_pos_BQ[:, :1], keys, values, key_pos)  # fmt: skip
  # A block of O = 3 new keys a row (an episode's observation): each query (one per
  # column, at the column's position) sees the pages and the block's columns up to its
  # own; row 1 has 2 real columns (the third at position -1), row 3 none.
  n = jnp.asarray([3, 2, 3, 0])
  cols_BO = jnp.asarray(used)[:, None] + jnp.arange(3)[None, :]
  new_pos_BO = jnp.where(jnp.arange(3)[None, :] < n[:, None], cols_BO, -1)
  k_BKEO = jnp.asarray(rng.randn(N, K, E, 3), jnp.float32)
  v_BKOE = jnp.asarray(rng.randn(N, K, 3, E), jnp.float32)
  q_BKQE = jnp.asarray(rng.randn(N, K, 3, E), jnp.float32)
  keys = jnp.concatenate([keys[..., :-1], k_BKEO], axis=-1)
  values = jnp.concatenate([values[:, :, :-1], v_BKOE], axis=2)
  key_pos = jnp.concatenate([key_pos[:, :-1], new_pos_BO], axis=1)
  for got in check(q_BKQE, new_pos_BO, k_BKEO, v_BKOE, new_pos_BO, keys, values, key_pos):
    np.testing.assert_array_equal(got[1, :, 2], 0.0)  # Row 1's padding column sees nothing.


def _pages(*, N=4, F=3, Z=2):
  """Pages of N rows with one prompt page (0, shared) and F free pages 1..F (stack
  [F, ..., 1]), the null page F + 1, and tables of 3 columns."""
  null = 1 + F
  cache = kv_cache.PagedKVCache(
    k=(), v=(), pos_PZ=jnp.zeros((null + 1, Z), jnp.int32),
    table_NM=jnp.full((N, 3), null, jnp.int32).at[:, 0].set(0),
    slot_N=jnp.zeros((N,), jnp.int32), live=jnp.zeros((), jnp.int32),
  )  # fmt: skip
  return paged.Pages(cache=cache, free_F=jnp.arange(1, F + 1)[::-1], top=jnp.asarray(F), prompt_pages=1)  # fmt: skip


def test_the_page_stack_by_hand():
  """4 rows, 3 free pages (stack [3, 2, 1], top 3), pages of 2 slots. Token 0: rows 0-2
  pop pages 1, 2, 3 in row order (column 1) and reset their positions; row 3 finds the
  stack empty and is starved. Row 1 ends: its page 2 goes back (top 1) and its table row
  is nulled. Row 0 at token 2 takes page 2 (column 2), row 2 starves (one page, two
  rows). A refill slot loading prompt 0 points at its page and nothing else; compaction
  moves table rows only."""
  p, starved = paged.take(_pages(), jnp.asarray([True] * 4), jnp.zeros(4, jnp.int32))
  np.testing.assert_array_equal(p.cache.table_NM[:, 1], [1, 2, 3, 4])
  np.testing.assert_array_equal(starved, [False, False, False, True])
  assert int(p.top) == 0
  np.testing.assert_array_equal(p.cache.pos_PZ[1:4], -1)
  np.testing.assert_array_equal(p.cache.pos_PZ[0], 0)  # The prompt page is untouched.
  p = paged.give_back(p, jnp.asarray([False, True, False, False]))
  assert int(p.top) == 1 and int(p.free_F[0]) == 2
  np.testing.assert_array_equal(p.cache.table_NM[1], [4, 4, 4])
  p, starved = paged.take(p, jnp.asarray([True, False, True, False]), jnp.asarray([2, 0, 2, 0]))
  np.testing.assert_array_equal(p.cache.table_NM[:, 2], [2, 4, 4, 4])
  np.testing.assert_array_equal(starved, [False, False, True, False])
  p = paged.load(p, jnp.asarray([1, 9]), jnp.asarray([0, 0]))  # Slot 9: none (dropped).
  np.testing.assert_array_equal(p.cache.table_NM[1], [0, 4, 4])
  np.testing.assert_array_equal(paged.compact(p, jnp.asarray([2, 0])).cache.table_NM, [[0, 3, 4], [0, 1, 2]])  # fmt: skip


def test_a_short_pool_truncates_late_rows_and_keeps_every_token_before_the_cut(
  tiny_params, tiny_cfg, sampler_cfg, tokenizer
):
  """A pool of a quarter of the worst case's pages: rows that find no page end there, not
  at an EOS (eos_N False), and every token they drew is the dense sampler's; rows that
  got their pages are the dense rollouts whole."""
  kw = dict(model_fn=model.make_model_fn(tiny_cfg), init_cache=functools.partial(model.init_cache, tiny_cfg))  # fmt: skip
  args = (tiny_params, _prompts(sampler_cfg, tokenizer), jax.random.key(5), sampling.sampling_params(temperature=1.3))  # fmt: skip
  dense = jax.jit(functools.partial(sampling.sample, **kw, cfg=sampler_cfg))(*args)
  cfg = dataclasses.replace(sampler_cfg, kv_layout="paged", page_size=2, kv_pool_fraction=0.25)
  assert paged.completion_pages(cfg, 12) == 15  # 12 rows × 5 pages × 0.25.
  got = jax.jit(functools.partial(paged.sample, **kw, cfg=cfg))(*args)
  mask = np.asarray(got.mask_NT)
  np.testing.assert_array_equal(np.asarray(got.tokens_NT)[mask], np.asarray(dense.tokens_NT)[mask])
  np.testing.assert_allclose(np.asarray(got.logp_NT)[mask], np.asarray(dense.logp_NT)[mask], atol=1e-5)  # fmt: skip
  cut = np.asarray(got.length_N) < np.asarray(dense.length_N)
  assert cut.any() and not np.asarray(got.eos_N)[cut].any()
  np.testing.assert_array_equal(got.starved_N, cut)  # The rows the pool starved, reported.
  assert dense.starved_N is None
  np.testing.assert_array_equal(np.asarray(got.tokens_NT)[~cut], np.asarray(dense.tokens_NT)[~cut])


# Gemma 3's layout in small: two sliding layers of window 5, then a full one.
WINDOWED = dict(
  n_layers=3, sliding_window=5, qk_norm=True,
  layer_types=("sliding_attention", "sliding_attention", "full_attention"),
)  # fmt: skip


def test_window_rings_on_pages_equal_the_dense_samplers():
  """Sliding layers on pages keep a window ring per row (`PagedKVCache.rings`: keys
  [N, K, E, 5] against the full layer's pool of 3-slot pages) and draw the dense
  sampler's tokens with its log-probs (float32, same keys), 20 tokens past prompts of 4-11
  (windows of 5, so the rings wrap): the group's prompt pages shared or copied (the rings
  copied either way), a chunked prefill, per-row limits; the refill sampler on pages (a
  slot's ring loaded from its prompt's, `paged.load`) its dense twin's; with a window as
  long as the rows the sliding layers are paged instead."""
  cfg = model.tiny_config(40, **WINDOWED)
  params = model.init(cfg, jax.random.key(3))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 4.0  # Peaked logits.
  scfg = sampling.SamplerConfig(max_new_tokens=20, group_size=4, eos_ids=(1,), pad_id=0, prompt_buckets=(12,))  # fmt: skip
  rng = np.random.default_rng(0)
  prompts = sampling.prepare_prompts([list(rng.integers(2, 40, size=n)) for n in (9, 4, 11)], cfg=scfg)  # fmt: skip
  kw = dict(model_fn=model.make_model_fn(cfg), init_cache=functools.partial(model.init_cache, cfg))  # fmt: skip
  args = (params, prompts, jax.random.key(5), sampling.sampling_params(temperature=1.3), jnp.asarray([20, 1, 3, 17] * 3, jnp.int32))  # fmt: skip
  dense = jax.jit(functools.partial(sampling.sample, **kw, cfg=scfg))(*args)
  for shared, chunk in ((True, 0), (False, 4)):
    pcfg = dataclasses.replace(scfg, kv_layout="paged", page_size=3, shared_prefix=shared, prefill_chunk=chunk)  # fmt: skip
    _assert_same(jax.jit(functools.partial(paged.sample, **kw, cfg=pcfg))(*args), dense)
  state = jax.eval_shape(lambda: paged.prefill(params, prompts, jax.random.key(0), cfg=pcfg, **kw))  # fmt: skip
  c = state.pages.cache
  assert c.rings == (True, True, False) and c.ring_pos_NR.shape == (12, 5)
  assert [k.shape for k in c.k] == [(12, 2, 16, 5)] * 2 + [(12 * 4 + 12 * 7 + 1, 2, 16, 3)]
  assert int(dense.mask_NT.sum()) > 60 and int(dense.length_N.max()) == 20
  run = lambda c: jax.jit(functools.partial(refill.sample, **kw, cfg=c, slots=5))(*args)  # noqa: E731
  _assert_same(run(dataclasses.replace(scfg, kv_layout="paged", page_size=3)), run(scfg))
  # A window as long as the rows (64 > 12 + 20 slots): rings would copy whole rows, so the
  # sliding layers are paged (`paged.keeps_rings`, `KVCache.unring`), the same rollouts.
  long, pcfg = dataclasses.replace(cfg, sliding_window=64), dataclasses.replace(pcfg, shared_prefix=True)  # fmt: skip
  kw = dict(model_fn=model.make_model_fn(long), init_cache=functools.partial(model.init_cache, long))  # fmt: skip
  state = jax.eval_shape(lambda: paged.prefill(params, prompts, jax.random.key(0), cfg=pcfg, **kw))  # fmt: skip
  assert state.pages.cache.rings == () and len({k.shape for k in state.pages.cache.k}) == 1
  dense = jax.jit(functools.partial(sampling.sample, **kw, cfg=scfg))(*args)
  _assert_same(jax.jit(functools.partial(paged.sample, **kw, cfg=pcfg))(*args), dense)


def test_rings_move_with_their_rows_by_hand():
  """Rows of a cache with one ring layer (ring of 2 slots) and one paged layer: a refill
  slot loading prompt 1 gets a copy of its ring and positions; compaction and `rows`
  move ring rows with the table; `put_rows` puts a view's rings back at its rows and
  drops an out-of-range one, keeping the full cache's write slots and tables."""
  ring_k = jnp.arange(4 * 2, dtype=jnp.float32).reshape(4, 1, 1, 2)  # [N, K, E, R]: row n, n.
  pool = jnp.zeros((3, 1, 1, 2))
  cache = kv_cache.PagedKVCache(
    k=(ring_k, pool), v=(jnp.swapaxes(ring_k, 2, 3), pool), pos_PZ=jnp.zeros((3, 2), jnp.int32),
    table_NM=jnp.asarray([[0, 2]] * 4), slot_N=jnp.asarray([0, 1, 2, 3]),
    live=jnp.zeros((), jnp.int32), ring_pos_NR=jnp.asarray([[0, 1], [2, 3], [4, 5], [6, 7]]),
    rings=(True, False),
  )  # fmt: skip
  prompt = ((jnp.full((2, 1, 1, 2), 7.0), None), (jnp.full((2, 1, 2, 1), 7.0), None), jnp.asarray([[9, 9], [10, 11]]))  # fmt: skip
  p = paged.Pages(cache=cache, free_F=jnp.asarray([1]), top=jnp.asarray(1), prompt_rings=prompt, prompt_pages=1)  # fmt: skip
  p = paged.load(p, jnp.asarray([2, 9]), jnp.asarray([1, 0]))  # Slot 9: none (dropped).
  np.testing.assert_array_equal(p.cache.ring_pos_NR, [[0, 1], [2, 3], [10, 11], [6, 7]])
  np.testing.assert_array_equal(p.cache.k[0][2], 7.0)
  np.testing.assert_array_equal(p.cache.k[0][3].ravel(), [6, 7])
  moved = paged.compact(p, jnp.asarray([3, 0])).cache
  np.testing.assert_array_equal(moved.ring_pos_NR, [[6, 7], [0, 1]])
  np.testing.assert_array_equal(moved.k[0].ravel(), [6, 7, 0, 1])
  assert moved.k[1] is p.cache.k[1]  # The pool stays.
  view = cache.rows(jnp.asarray([1, 3]))
  view = view.replace(k=(view.k[0] + 100, view.k[1]), ring_pos_NR=view.ring_pos_NR + 100, slot_N=view.slot_N * 0)  # fmt: skip
  back = cache.put_rows(jnp.asarray([1, 4]), view)  # Row 4: none.
  np.testing.assert_array_equal(back.ring_pos_NR, [[0, 1], [102, 103], [4, 5], [6, 7]])
  np.testing.assert_array_equal(back.k[0][:, 0, 0, 0], [0, 102, 4, 6])
  np.testing.assert_array_equal(back.slot_N, cache.slot_N)
  np.testing.assert_array_equal(back.table_NM, cache.table_NM)


def test_compaction_sizes():
  assert paged._buckets(40) == (40, 20, 10, 5)
  assert paged._buckets(12) == (12, 6, 3, 2)
  assert paged._buckets(3) == (3, 2, 1)
  assert paged._buckets(1) == (1,)


@pytest.mark.parametrize("scan_layers, shared, chunk", [(False, True, 0), (True, False, 4)])
def test_a_block_on_pages_in_one_call_is_the_block_a_token_a_call(
  tiny_cfg, tiny_params, sampler_cfg, tokenizer, scan_layers, shared, chunk
):
  """`paged.append_block` (an episode's observation) writes rows' blocks of n = 5, 3, 0
  and 6 tokens, across page edges (pages of 3 slots, the first block starting at
  completion slot 2, whose page an earlier token took), in one call: the logits of its columns and the pools it leaves are
  those of n `forward` calls a token each, up to the order of float32 sums, and the
  pages taken are the same; also in calls of 4 columns (sampler.prefill_chunk: 2 calls,
  the second with 2 padding columns)."""
  cfg, params = (tiny_cfg, tiny_params) if not scan_layers else _scanned(tiny_cfg, tiny_params)
  scfg = dataclasses.replace(sampler_cfg, group_size=2, kv_layout="paged", page_size=3, shared_prefix=shared)  # fmt: skip
  prompts = _prompts(scfg, tokenizer)
  model_fn = model.make_model_fn(cfg)
  dense, _ = paged.prefill_prompts(
    params, prompts.tokens_BP[:2], model.positions_from_mask(prompts.mask_BP[:2]),
    init_cache=functools.partial(kv_cache.init_cache, cfg), model_fn=model_fn, cfg=scfg,
  )  # fmt: skip
  pages = paged.group_pool(dense, cfg=scfg)
  t_N, n_N = jnp.asarray([2, 0, 4, 1]), jnp.asarray([5, 3, 0, 6])
  for t in (0, 3):  # The pages of the completion slots before t_N (earlier tokens').
    pages, _ = paged.take(pages, t < t_N, jnp.full((4,), t))
  tok_NO = jnp.asarray(np.random.RandomState(0).randint(3, tokenizer.vocab_size, (4, 6)))
  pos_NO = jnp.where(
    jnp.arange(6)[None] < n_N[:, None], 20 + t_N[:, None] + jnp.arange(6)[None], -1
  )
  block = jax.jit(functools.partial(paged.append_block, model_fn=model_fn, chunk=chunk))
  logits_NOV, got = block(params, pages, tok_NO, pos_NO, t_N, n_N)

  @jax.jit
  def one(p, j):
    live_N = j < n_N
    p, _ = paged.take(p, live_N & ((t_N + j) % 3 == 0), t_N + j)
    return paged.forward(params, p, tok_NO[:, j], pos_NO[:, j], t_N + j, live_N, model_fn=model_fn)  # fmt: skip

  want, columns = pages, []
  for j in range(6):
    logits_N1V, want = one(want, j)
    columns.append(logits_N1V[:, 0])
  real_NO = np.asarray(pos_NO >= 0)
  np.testing.assert_allclose(
    np.asarray(logits_NOV)[real_NO], np.asarray(jnp.stack(columns, 1))[real_NO], atol=2e-5
  )
  np.testing.assert_array_equal(got.cache.table_NM, want.cache.table_NM)
  np.testing.assert_array_equal(got.cache.pos_PZ, want.cache.pos_PZ)
  assert int(got.top) == int(want.top)
  # Without logits (an episode's append): the same pages, and no logits kept.
  silent = jax.jit(functools.partial(paged.append_block, model_fn=model_fn, chunk=chunk, logits=False))  # fmt: skip
  none, same = silent(params, pages, tok_NO, pos_NO, t_N, n_N)
  assert none is None
  for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(got), strict=True):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves((got.cache.k, got.cache.v)), jax.tree.leaves((want.cache.k, want.cache.v)), strict=True):  # fmt: skip
    np.testing.assert_allclose(a, b, atol=2e-5)


def test_bench_paged_append_checks_and_times_both_paths():
  """experiments/bench_paged_append.py --quick: both paths' logits agree, and each is
  timed (speed is the script's business, not a test's)."""
  import bench_paged_append  # noqa: PLC0415

  r = bench_paged_append.main(["--quick"])
  assert [w["observation_tokens"] for w in r["widths"]] == [9]
  for w in r["widths"]:
    assert w["max_abs_logit_diff"] < 1e-3 and w["block_call_s"] > 0 and w["token_calls_s"] > 0
    assert w["speedup"] == pytest.approx(w["token_calls_s"] / w["block_call_s"], rel=0.02)


def test_the_committed_paged_append_record_is_what_its_rows_say():
  """experiments/results/cpu/2026-12-06_epyc_paged_append: a description of one sitting
  (claim None, not judged), each row's speedup its two timings' ratio, the block's logits
  the token calls' (float32)."""
  import json  # noqa: PLC0415

  path = ROOT / "experiments" / "results" / "cpu" / "2026-12-06_epyc_paged_append.json"
  r = json.loads(path.read_text())
  assert (r["claim"], r["verdict"], r["dtype"], r["seeds"]) == (None, "not judged", "float32", [0])
  assert [w["observation_tokens"] for w in r["widths"]] == [16, 64, 256]
  for w in r["widths"]:
    assert w["max_abs_logit_diff"] < 1e-3
    assert w["speedup"] == pytest.approx(w["token_calls_s"] / w["block_call_s"], rel=0.02)


@pytest.mark.parametrize(
  "change, message",
  [
    (dict(kv_layout="ragged"), r"kv_layout='ragged'; allowed: \('dense', 'paged'\)"),
    (dict(kv_layout="paged", kv_pool_fraction=0.0), r"kv_pool_fraction in \(0, 1\]"),
    (dict(kv_layout="paged", page_size=0), "page_size must be >= 1"),
  ],
)
def test_bad_paged_settings_say_what_is_allowed(sampler_cfg, change, message):
  with pytest.raises(ValueError, match=message):
    dataclasses.replace(sampler_cfg, **change)


def test_the_skewed_length_experiment_runs_and_applies_its_rule():
  """experiments/paged_sampler.py --quick: 16 rows to 256 tokens, the same rollouts from
  both caches and no starved row (its memory and speed rule is for the full shape)."""
  record = paged_sampler.main(["--quick"])
  r = record["result"]
  assert r["tokens_equal"] and r["max_abs_dlogp"] <= 1e-5 and r["starved_rows"] == 0
  assert r["dense"]["tokens"] == r["paged"]["tokens"] > 16 * 8
  assert record["rule"] == paged_sampler.RULE and record["verdict"] == paged_sampler.verdict(record)


def test_the_memory_plan_prices_the_paged_sampler_within_its_band_of_xla():
  """40 rows, 64-token prompts, 2,048 new tokens, pages of 64, a pool of 0.15 of the worst
  case (XLA:CPU, compiled, not run): the plan's sampler figure (the pools, one attention
  block, the sampling buffers) within 10% of XLA's temporaries; and under a third of the
  dense sampler's; for Gemma 3's layout, with window rings, within 10% as well. The dense sampler's own figure (4 decode segments over a shared prompt:
  the last grow counted) is within 10% too (0.77 before the grow was counted)."""
  cfg = model.tiny_config(vocab_size=64)
  params = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  B, G, P, T = 10, 4, 64, 2048
  dense = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(1,), pad_id=0, group_size=G, prompt_buckets=(P,),
    max_prompt_len=P,
  )  # fmt: skip
  cfg_paged = dataclasses.replace(dense, kv_layout="paged", page_size=64, kv_pool_fraction=0.15)
  prompts = sampling.Prompts(
    jax.ShapeDtypeStruct((B, P), jnp.int32), jax.ShapeDtypeStruct((B, P), jnp.bool_)
  )
  kw = dict(model_fn=model.make_model_fn(cfg), init_cache=functools.partial(model.init_cache, cfg))  # fmt: skip
  args = (params, prompts, jax.random.key(0), sampling.sampling_params(temperature=1.0))
  temp = lambda fn: jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
  xla = temp(functools.partial(paged.sample, cfg=cfg_paged, **kw))
  plan = paged_sampler._plan(cfg, dense, B=B, P=P, T=T, pages=memory._pool_pages(cfg_paged, prompts=B))  # fmt: skip
  assert 0.9 <= plan / xla <= 1.1
  xla_dense = temp(functools.partial(sampling.sample, cfg=dense, **kw))
  assert xla < xla_dense / 3
  assert sampling.segment_count(dense) == 4
  assert 0.9 <= paged_sampler._plan(cfg, dense, B=B, P=P, T=T, pages=None) / xla_dense <= 1.1
  # Gemma 3's layout (5 sliding layers of window 64, 1 full): the sliding layers' window
  # rings priced within the band too, about half the same pool without them.
  cfg = model.tiny_config(vocab_size=64, **window_rings.GEMMA3_TINY)
  params = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  args = (params, *args[1:])
  kw = dict(model_fn=model.make_model_fn(cfg), init_cache=functools.partial(model.init_cache, cfg))  # fmt: skip
  xla = temp(functools.partial(paged.sample, cfg=cfg_paged, **kw))
  pages = memory._pool_pages(cfg_paged, prompts=B)
  plan = paged_sampler._plan(cfg, dense, B=B, P=P, T=T, pages=pages)
  assert 0.9 <= plan / xla <= 1.1
  assert plan < 0.55 * paged_sampler._plan(cfg, dense, B=B, P=P, T=T, pages=pages, rings=False)
  # Windows of 1,024 on a whole pool: rings longer than an attention block (read whole)
  # and a compacted step's gathered keys, within the band; windows of 4,096, longer than
  # the rows (2,112 slots): paged, as without rings.
  for window, fraction in ((1024, 1.0), (4096, 0.15)):
    cfg = model.tiny_config(vocab_size=64, **dict(window_rings.GEMMA3_TINY, sliding_window=window))
    kw = dict(model_fn=model.make_model_fn(cfg), init_cache=functools.partial(model.init_cache, cfg))  # fmt: skip
    pcfg = dataclasses.replace(cfg_paged, kv_pool_fraction=fraction)
    pages = memory._pool_pages(pcfg, prompts=B)
    plan = paged_sampler._plan(cfg, dense, B=B, P=P, T=T, pages=pages)
    if window == 1024:
      assert 0.9 <= plan / temp(functools.partial(paged.sample, cfg=pcfg, **kw)) <= 1.1
    else:
      assert plan == paged_sampler._plan(cfg, dense, B=B, P=P, T=T, pages=pages, rings=False)


def test_the_trainer_runs_every_sampler_on_pages(tmp_path):
  """Two iterations of the arithmetic quick config with a Gemma-3-shaped policy (a sliding
  layer of window 4, kept in a ring per row on pages, and a full one; q/k norms, local
  rope) under LoRA on pages of 4 slots (the train, greedy and eval samplers), then two of
  the off-policy pipeline's partial rollouts on pages; IBPO's trained counterfactual rows
  build on pages; one iteration of the calculator's episodes on pages (training, greedy
  and pass@k evaluation)."""
  import arithmetic  # noqa: PLC0415

  from grpo_jax.infra import config_lib, logs  # noqa: PLC0415
  from grpo_jax.trainer import build, train  # noqa: PLC0415

  c = arithmetic.get_config("quick")
  c.model.update(
    n_layers=2, sliding_window=4, layer_types=("sliding_attention", "full_attention"),
    qk_norm=True, rope_local_theta=50.0, activation="gelu_tanh", norm_offset=1.0,
    post_norms=True, embed_scale=True,
  )  # fmt: skip
  c.model.lora.update(rank=4, alpha=8.0)
  c.sampler.update(group_size=4, kv_layout="paged", page_size=4, kv_pool_fraction=0.5)
  c.update(prompts_per_step=4, iterations=2, warmstart_steps=2, warmstart_batch=8, eval_size=8)
  c.update(eval_every=2, checkpoint_every=2, reward_workers=0, progress=False)
  train.run(c, tmp_path, log=lambda _: None)
  lines = logs.read_jsonl(tmp_path / "metrics.jsonl")
  assert [x["iteration"] for x in lines] == [0, 1, 2]
  assert all(np.isfinite(x["loss"]) for x in lines[1:])
  assert all(0.0 <= x["sampler/starved_frac"] <= 1.0 for x in lines[1:])
  c.offpolicy.update(enabled=True, max_staleness=1, partial="continue", segment_tokens=5)
  c.rl.is_correction = "tis_token"
  train.run(c, tmp_path / "partial", log=lambda _: None)
  lines = logs.read_jsonl(tmp_path / "partial" / "metrics.jsonl")
  assert [x["iteration"] for x in lines] == [0, 1, 2]
  assert all(np.isfinite(x["loss"]) and x["offpolicy/segments"] >= 1 for x in lines[1:])
  cf = config_lib.load("configs/ibpo.py:tiny")
  cf.sampler.update(kv_layout="paged", page_size=4)
  cf.counterfactual.train = True
  assert build.build(cf).sampler_cfg.kv_layout == "paged"
  c = config_lib.load("configs/calculator.py:quick")
  c.sampler.update(kv_layout="paged", page_size=4)
  c.update(prompts_per_step=4, iterations=1, warmstart_steps=2, warmstart_batch=8, eval_size=8)
  c.update(eval_every=1, eval_samples=2, checkpoint_every=1, reward_workers=0, progress=False)
  train.run(c, tmp_path / "episodes", log=lambda _: None)
  lines = logs.read_jsonl(tmp_path / "episodes" / "metrics.jsonl")
  assert [x["iteration"] for x in lines] == [0, 1] and np.isfinite(lines[1]["loss"])
  assert lines[1]["episode/turns"] >= 1 and "eval/pass@2" in lines[1]


def test_the_committed_paged_record_carries_its_claim_and_the_verdict_of_its_rule():
  """experiments/results/long_rollouts/paged_sampler.json (15 minutes here: not in CI)."""
  import json  # noqa: PLC0415

  root = pathlib.Path(__file__).resolve().parents[2]
  r = json.loads((root / "experiments/results/long_rollouts/paged_sampler.json").read_text())
  assert r["claim"] == paged_sampler.CLAIM and r["rule"] == paged_sampler.RULE
  assert r["seeds"] == paged_sampler.SEEDS
  assert r["verdict"] == paged_sampler.verdict(r) == "supports"
  res = r["result"]
  assert res["shape"]["max_new_tokens"] == 8192 and res["shape"]["long_rows"] == 4
  assert res["paged"]["tokens"] == res["dense"]["tokens"]
  assert res["temp_ratio"] == round(res["paged"]["xla_temp_bytes"] / res["dense"]["xla_temp_bytes"], 3)  # fmt: skip


def test_the_committed_tpu_record_carries_its_claim_and_the_verdict_of_its_rule():
  """experiments/results/long_rollouts/paged_sampler_tpu.json (6 minutes of libtpu
  compiles here: not in CI): a negative result, kept as it was judged."""
  import json  # noqa: PLC0415

  root = pathlib.Path(__file__).resolve().parents[2]
  r = json.loads((root / "experiments/results/long_rollouts/paged_sampler_tpu.json").read_text())
  assert r["claim"] == paged_sampler.TPU_CLAIM and r["rule"] == paged_sampler.TPU_RULE
  assert r["seeds"] == paged_sampler.TPU_SEEDS
  assert r["verdict"] == paged_sampler.tpu_verdict(r) == "contradicts"  # 0.547 of dense.
  res = r["result"]
  assert res["temp_ratio"] == round(res["paged_128"]["xla_temp_bytes"] / res["dense"]["xla_temp_bytes"], 3)  # fmt: skip


def test_the_tpu_record_of_the_tpu_hosts_program_carries_its_claim_and_verdict():
  """experiments/results/long_rollouts/paged_sampler_tpu_target.json: both samplers as a
  TPU host builds them (`kernels.target_platform`), a claim of its own written before its
  compile; and the memory plan's dense figure within 10% of that compile's."""
  import json  # noqa: PLC0415

  root = pathlib.Path(__file__).resolve().parents[2]
  r = json.loads((root / "experiments/results/long_rollouts/paged_sampler_tpu_target.json").read_text())  # fmt: skip
  assert r["claim"] == paged_sampler.TPU_TARGET_CLAIM and r["rule"] == paged_sampler.TPU_TARGET_RULE
  assert r["verdict"] == paged_sampler.tpu_verdict(r) == "supports"  # 0.369 of dense.
  res = r["result"]
  assert res["temp_ratio"] == round(res["paged_128"]["xla_temp_bytes"] / res["dense"]["xla_temp_bytes"], 3)  # fmt: skip
  cfg = dataclasses.replace(
    shapes.model_config("qwen2.5-1.5b", param_dtype="bfloat16", scan_layers=False),
    dtype="bfloat16",
  )
  boxed = jax.eval_shape(functools.partial(model.init_boxed, cfg), jax.random.key(0))
  plan = memory._sampler_bytes(
    cfg, boxed, rules=sharding.MeshConfig().rules, rows=16, prompt_rows=4, P=256, T=8192,
    sizes=dict(data=1, fsdp=1, sequence=1, tensor=1), shared=True, platform="tpu",
  )  # fmt: skip
  assert 0.9 <= plan / res["dense"]["xla_temp_bytes"] <= 1.1


def test_the_plan_prices_a_whole_pool_where_the_training_rows_take_one():
  """Episodes (and partial or counterfactual rows) decode on a whole pool whatever
  sampler.kv_pool_fraction says, so the memory plan prices it whole for them (episodes
  through refill slots too: a pool of every episode's pages, not the slots'); the static
  sampler's pool follows the fraction, and the refill sampler's its slots."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415
  from grpo_jax.trainer import build, memory  # noqa: PLC0415

  def kv_bytes(name, fraction, slots=0, **offpolicy):
    c = config_lib.load(f"configs/{name}.py:quick")
    c.sampler.update(kv_layout="paged", page_size=4, kv_pool_fraction=fraction)
    c.sampler.refill_slots = slots
    c.offpolicy.update(offpolicy)
    return memory.plan_for(build.build(c), n_devices=1).kv_cache

  assert kv_bytes("calculator", 0.25) == kv_bytes("calculator", 1.0)
  # Episodes through refill slots keep their pages while they wait: still every row's.
  assert kv_bytes("calculator", 0.25, slots=4) == kv_bytes("calculator", 1.0)
  assert kv_bytes("arithmetic", 1.0, slots=4) < kv_bytes("arithmetic", 1.0)
  assert kv_bytes("arithmetic", 0.25) < kv_bytes("arithmetic", 1.0)
  partial = dict(enabled=True, max_staleness=1, partial="continue")
  assert kv_bytes("arithmetic", 0.25, **partial) == kv_bytes("arithmetic", 1.0, **partial)
