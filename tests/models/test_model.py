import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import attention, layers
from grpo_jax.models import model as model_lib


class model:  # noqa: N801 -- the module, with a jitted apply (eager flax is slow).
  apply = staticmethod(jax.jit(model_lib.apply, static_argnames="cfg"))
  init = staticmethod(jax.jit(model_lib.init, static_argnums=0))
  init_cache = staticmethod(model_lib.init_cache)
  tiny_config = staticmethod(model_lib.tiny_config)
  positions_from_mask = staticmethod(model_lib.positions_from_mask)
  logical_axes = staticmethod(model_lib.logical_axes)
  param_count = staticmethod(model_lib.param_count)
  ModelConfig = model_lib.ModelConfig


VOCAB = 37
TOKENS_BT = np.array([[0, 0, 0, 5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 5, 6, 7, 8, 9]], np.int32)
MASK_BT = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1]], bool)

VARIANTS = {
  "qwen3": dict(qk_norm=True, tie_embeddings=True),
  "qwen2": dict(attn_bias=True, tie_embeddings=False, rope_theta=1e6),
  "llama_scan_remat": dict(tie_embeddings=False, scan_layers=True, remat="full"),
  "mha_scan": dict(n_kv_heads=4, scan_layers=True, qk_norm=True),
}


def _setup(**overrides):
  cfg = model.tiny_config(VOCAB, **overrides)
  params = model.init(cfg, jax.random.key(1))
  params["embed"]["embedding"] *= 50.0  # Peaked logits: differences show up.
  return cfg, params


def _positions():
  return model.positions_from_mask(jnp.asarray(MASK_BT))


def test_positions_skip_padding():
  np.testing.assert_array_equal(_positions()[0], [-1, -1, -1, 0, 1, 2, 3, 4, 5])
  np.testing.assert_array_equal(_positions()[1], np.arange(9))
  # Right padding (a completion) too.
  np.testing.assert_array_equal(
    model.positions_from_mask(jnp.array([[0, 1, 1, 0]])), [[-1, 0, 1, -1]]
  )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cached_decode_equals_full_forward(variant):
  cfg, params = _setup(**VARIANTS[variant])
  pos_BT = _positions()
  full_BTV, none = model.apply(params, TOKENS_BT, pos_BT, cfg=cfg)
  assert none is None
  cache = model.init_cache(cfg, 2, 12)
  chunks = []
  for lo, hi in [(0, 5), (5, 6), (6, 7), (7, 9)]:  # A prefill, then steps of 1 and 2 tokens.
    logits, cache = model.apply(params, TOKENS_BT[:, lo:hi], pos_BT[:, lo:hi], cache, cfg=cfg)
    chunks.append(logits)
  assert int(cache.index) == 9
  cached_BTV = jnp.concatenate(chunks, axis=1)
  real = MASK_BT[..., None]
  # float32: 1e-5 absolute, or 1e-7 of the logit's own size on these peaked logits (a
  # 2-core AMD EPYC host's XLA:CPU left 1.14e-5 on qwen3).
  diff_BTV = jnp.abs(jnp.where(real, cached_BTV - full_BTV, 0.0))
  assert float(jnp.max(diff_BTV - 1e-7 * jnp.abs(full_BTV))) <= 1e-5
  # The logits are far from constant, so the comparison means something.
  assert float(jnp.std(full_BTV[1])) > 0.1


@pytest.mark.parametrize("variant", ["qwen3", "llama_scan_remat"])
def test_left_padding_does_not_change_logits(variant):
  cfg, params = _setup(**VARIANTS[variant])
  prompt = np.array([[5, 6, 7, 8, 9, 10]], np.int32)
  padded = np.concatenate([np.zeros((1, 4), np.int32), prompt], axis=1)
  pmask = np.concatenate([np.zeros((1, 4), bool), np.ones((1, 6), bool)], axis=1)
  plain, _ = model.apply(params, prompt, model.positions_from_mask(jnp.ones((1, 6))), cfg=cfg)
  left, _ = model.apply(params, padded, model.positions_from_mask(pmask), cfg=cfg)
  np.testing.assert_allclose(left[:, 4:], plain, atol=1e-5)
  # Control: if pad slots counted as tokens (positions 0..9), the logits would change.
  attended, _ = model.apply(params, padded, jnp.arange(10)[None], cfg=cfg)
  assert float(jnp.max(jnp.abs(attended[:, 4:] - plain))) > 1e-2


def test_causality_gradient_is_zero_for_future_tokens():
  cfg, params = _setup(**VARIANTS["qwen3"])
  emb_BTD = params["embed"]["embedding"][TOKENS_BT[1:]]
  pos_BT = _positions()[1:]
  t = 4

  def out_at_t(emb_BTD):
    def interceptor(next_fun, args, kwargs, context):
      if isinstance(context.module, nn.Embed) and context.method_name == "__call__":
        return emb_BTD
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
      logits_BTV, _ = model.apply(params, TOKENS_BT[1:], pos_BT, cfg=cfg)
    return jnp.sum(logits_BTV[0, t] * jnp.arange(VOCAB))

  grad_TD = jax.grad(out_at_t)(emb_BTD)[0]
  per_token = jnp.abs(grad_TD).sum(-1)
  np.testing.assert_array_equal(per_token[t + 1 :], 0.0)
  assert bool(jnp.all(per_token[: t + 1] > 0))


def test_parameter_gradient_is_finite_with_padding():
  """Padding queries see no keys; their attention output is 0 and must not give NaN grads."""
  cfg, params = _setup()

  def loss(p):
    logits_BTV, _ = model_lib.apply(p, TOKENS_BT, _positions(), cfg=cfg)
    return jnp.sum(jnp.where(MASK_BT[..., None], jax.nn.log_softmax(logits_BTV), 0.0))

  grads = jax.jit(jax.grad(loss))(params)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
  assert float(jnp.abs(grads["layer_0"]["attn"]["q"]["kernel"]).sum()) > 0


def test_scan_matches_unrolled_layers():
  cfg, params = _setup(qk_norm=True)
  scan_cfg = model.tiny_config(VOCAB, qk_norm=True, scan_layers=True)
  per_layer = [params.pop(f"layer_{i}") for i in range(cfg.n_layers)]
  scan_params = {**params, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *per_layer)}
  assert jax.tree.structure(scan_params) == jax.tree.structure(
    jax.eval_shape(lambda: model.init(scan_cfg, jax.random.key(0)))
  )
  params.update({f"layer_{i}": layer for i, layer in enumerate(per_layer)})
  a, _ = model.apply(params, TOKENS_BT, _positions(), cfg=cfg)
  b, _ = model.apply(scan_params, TOKENS_BT, _positions(), cfg=scan_cfg)
  np.testing.assert_allclose(a, b, atol=1e-5)


ALLOWED_NAMES = {"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "layers"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_param_has_logical_axis_names(variant):
  cfg = model.tiny_config(VOCAB, **VARIANTS[variant])
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  axes = model.logical_axes(cfg)
  flat_params = jax.tree_util.tree_leaves_with_path(params)
  flat_axes = jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  assert len(flat_params) == len(flat_axes)
  for (path, leaf), spec in zip(flat_params, flat_axes):
    assert len(spec) == leaf.ndim, (path, spec)
    assert set(spec) <= ALLOWED_NAMES, (path, spec)
    if cfg.scan_layers and "layers" in jax.tree_util.keystr(path):
      assert spec[0] == "layers"
  q_kernel = (
    axes["layers"]["attn"]["q"]["kernel"]
    if cfg.scan_layers
    else axes["layer_0"]["attn"]["q"]["kernel"]
  )
  assert tuple(q_kernel)[-3:] == ("embed", "q_heads", "head_dim")


def test_shapes_param_count_and_gqa():
  cfg = model.tiny_config(VOCAB)
  params = model.init(cfg, jax.random.key(0))
  attn = params["layer_0"]["attn"]
  assert attn["q"]["kernel"].shape == (64, 4, 16)
  assert attn["k"]["kernel"].shape == (64, 2, 16)
  assert attn["o"]["kernel"].shape == (4, 16, 64)
  assert params["layer_0"]["mlp"]["gate"]["kernel"].shape == (64, 192)
  # Hand count: embed V*D + final norm D + per layer (q 64*64 + k,v 2*64*32 + o 64*64
  # + mlp 3*64*192 + 2 norms 2*64 + qk norms 2*16).
  per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 192 + 2 * 64 + 2 * 16
  assert model.param_count(params) == VOCAB * 64 + 64 + 2 * per_layer


def test_bfloat16_compute_and_param_dtypes():
  cfg = model.tiny_config(VOCAB, dtype="bfloat16", param_dtype="bfloat16")
  params = model.init(cfg, jax.random.key(0))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  logits, cache = model.apply(params, TOKENS_BT, _positions(), model.init_cache(cfg, 2, 9), cfg=cfg)
  # The cache: bfloat16 on an accelerator; on XLA:CPU the same bfloat16-rounded values in
  # float32 (`model.cache_dtype`).
  assert logits.dtype == jnp.float32 and cache.k[0].dtype == model_lib.cache_dtype(cfg)
  assert model_lib.cache_dtype(cfg) == (
    jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
  )
  np.testing.assert_array_equal(cache.k[0], cache.k[0].astype(jnp.bfloat16).astype(jnp.float32))
  assert model_lib.cache_dtype(model.tiny_config(VOCAB)) == jnp.float32
  f32_cfg = model.tiny_config(VOCAB)
  ref, _ = model.apply(
    jax.tree.map(lambda x: x.astype(jnp.float32), params), TOKENS_BT, _positions(), cfg=f32_cfg
  )
  real = MASK_BT[..., None]  # Padding rows attend to garbage by design.
  np.testing.assert_allclose(jnp.where(real, logits, 0), jnp.where(real, ref, 0), atol=2e-2)


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(n_heads=6, n_kv_heads=4), "multiple of n_kv_heads"),
    (dict(dtype="float16"), "allowed: ['bfloat16', 'float32']"),
    (dict(remat="some"), "ModelConfig.remat"),
    (dict(head_dim=15), "even"),
    (dict(d_model=0), "positive int"),
    (dict(vocab_limit=VOCAB + 1), "vocab_limit"),
    (dict(rope_scaling="yarn"), "allowed: ['none', 'linear', 'llama3']"),
    (dict(rope_scaling="llama3", rope_low_freq_factor=4.0), "rope_low_freq_factor <"),
  ],
)
def test_bad_config_errors_are_clear(overrides, message):
  with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
    model.tiny_config(VOCAB, **overrides)


def test_from_dict_rejects_unknown_keys():
  with pytest.raises(ValueError, match="unknown ModelConfig keys \\['n_layer'\\]"):
    model.ModelConfig.from_dict(dict(vocab_size=10, n_layer=2))
  cfg = model.ModelConfig.from_dict(
    dict(vocab_size=10, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, mlp_dim=16)
  )
  assert cfg.n_kv_heads == 1


def test_logits_slice_equals_slicing_the_full_logits(tiny_cfg, tiny_params):
  tokens_BT = jax.random.randint(jax.random.key(1), (2, 9), 3, tiny_cfg.vocab_size)
  positions_BT = model_lib.positions_from_mask(jnp.ones((2, 9), bool))
  full, _ = model_lib.apply(tiny_params, tokens_BT, positions_BT, cfg=tiny_cfg)
  part, _ = model_lib.apply(tiny_params, tokens_BT, positions_BT, cfg=tiny_cfg, logits_slice=(3, 8))
  assert part.shape == (2, 5, tiny_cfg.vocab_size)
  np.testing.assert_allclose(part, full[:, 3:8], rtol=1e-5, atol=1e-5)


def test_vocab_limit_removes_padded_ids_and_keeps_the_rest(tiny_cfg, tiny_params):
  """Ids past the limit get logit -1e9 (probability exactly 0, finite logits and entropy);
  the others are unchanged, so log π renormalises over the live ids only."""
  limited = dataclasses.replace(tiny_cfg, vocab_limit=tiny_cfg.vocab_size - 5)
  tokens_BT = jax.random.randint(jax.random.key(2), (2, 6), 3, limited.vocab_limit)
  positions_BT = model_lib.positions_from_mask(jnp.ones((2, 6), bool))
  full, _ = model_lib.apply(tiny_params, tokens_BT, positions_BT, cfg=tiny_cfg)
  cut, _ = model_lib.apply(tiny_params, tokens_BT, positions_BT, cfg=limited)
  np.testing.assert_array_equal(cut[..., : limited.vocab_limit], full[..., : limited.vocab_limit])
  assert (cut[..., limited.vocab_limit :] == -1e9).all()
  p = jax.nn.softmax(cut, axis=-1)
  assert (p[..., limited.vocab_limit :] == 0).all() and np.isfinite(np.sum(p * cut)).all()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_decode_pv_multiply_reduce_equals_the_matmul(monkeypatch, dtype):
  # Decode-shaped attention (Q = 2 query rows per kv head) with a padding slot, a future
  # slot and an empty one: the CPU multiply-reduce form of p·V and the batched matmul
  # give the same output and gradients.
  B, K, Q, S, E = 3, 2, 2, 6, 8
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (B, K, Q, E)).astype(dtype)
  keys = jax.random.normal(ks[1], (B, K, E, S)).astype(dtype)
  values = jax.random.normal(ks[2], (B, K, S, E)).astype(dtype)
  key_pos = jnp.array([[-1, 0, 1, 2, 3, -1], [0, 1, 2, 3, 4, 5], [-1, -1, 0, 1, 2, 9]])
  q_pos = jnp.array([[3, 3], [5, 5], [-1, -1]])  # The last row is a padding query.

  def run(by_reduce):
    monkeypatch.setattr(attention, "_pv_by_reduce", lambda *shape: by_reduce)
    f = lambda v: attention.attend(q, q_pos, keys, v, key_pos, dtype=dtype)
    out = f(values)
    grad = jax.grad(lambda v: jnp.sum(f(v).astype(jnp.float32) ** 2))(values)
    return np.asarray(out, np.float32), np.asarray(grad, np.float32)

  (out_r, grad_r), (out_m, grad_m) = run(True), run(False)
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(out_r, out_m, atol=tol)
  np.testing.assert_allclose(grad_r, grad_m, atol=tol)
  assert np.all(out_m[2] == 0) and np.abs(out_m[:2]).max() > 0.1


@pytest.mark.parametrize("by_reduce", [True, False])
def test_shared_prefix_attention_equals_attention_over_the_concatenated_cache(
  monkeypatch, by_reduce
):
  """Rows b·G .. b·G+G−1 attend to prefix b, then to their own slots: the output of
  `_attend` over [prefix b | own slots], with padding and empty slots in both parts, a
  query that sees no own slot, and a padding query (output 0)."""
  monkeypatch.setattr(attention, "_pv_by_reduce", lambda *shape: by_reduce)
  A, G, K, Q, E, P, S = 2, 3, 2, 2, 8, 4, 3
  N = A * G
  ks = jax.random.split(jax.random.key(1), 5)
  q = jax.random.normal(ks[0], (N, K, Q, E))
  keys, values = jax.random.normal(ks[1], (N, K, E, S)), jax.random.normal(ks[2], (N, K, S, E))
  pk, pv = jax.random.normal(ks[3], (A, K, E, P)), jax.random.normal(ks[4], (A, K, P, E))
  prefix_pos = jnp.array([[-1, 0, 1, 2], [0, 1, 2, 3]])  # Prompt a is left-padded by one.
  own_pos = jnp.array(
    [[3, 4, -1], [3, -1, -1], [-1, -1, -1], [4, 5, 6], [4, 5, -1], [4, -1, -1]]
  )  # Row 2 has no own slot yet; row 3's slot 6 is in its future.
  q_pos = jnp.array([[4, 4], [3, 3], [2, 2], [5, 5], [5, 5], [-1, -1]])  # Row 5: padding.
  shared = attention.attend_shared(
    q, q_pos, keys, values, own_pos, (pk, pv), prefix_pos, dtype=jnp.float32
  )
  rep = lambda x: jnp.repeat(x, G, axis=0)
  full = attention.attend(
    q,
    q_pos,
    jnp.concatenate([rep(pk), keys], axis=-1),
    jnp.concatenate([rep(pv), values], axis=-2),
    jnp.concatenate([rep(prefix_pos), own_pos], axis=-1),
    dtype=jnp.float32,
  )
  np.testing.assert_allclose(shared, full, rtol=1e-6, atol=1e-6)
  assert np.all(np.asarray(shared[5]) == 0) and np.abs(np.asarray(shared[:5])).min() > 0
  # Row 2 sees prefix slots 0..2 of prompt 0 only: softmax over those three by hand.
  s = np.einsum("kqe,kes->kqs", q[2], pk[0])[..., 1:]
  p = np.exp(s - s.max(-1, keepdims=True))
  by_hand = np.einsum("kqs,kse->kqe", p / p.sum(-1, keepdims=True), pv[0][:, 1:])
  np.testing.assert_allclose(shared[2], by_hand, rtol=1e-5, atol=1e-6)


def test_causal_blocks_are_pinned():
  assert attention.causal_blocks(63) == ((0, 63),)  # Under two blocks of 64: one block.
  assert attention.causal_blocks(192) == ((0, 64), (64, 128), (128, 192))
  assert attention.causal_blocks(200) == ((0, 67), (67, 133), (133, 200))
  assert attention.causal_blocks(1536) == ((0, 384), (384, 768), (768, 1152), (1152, 1536))
  # 64·64 + 64·128 + 64·192 = 24576 = 2/3 of 192²; four blocks: 5/8 of T².
  assert attention.causal_score_entries(192) == 24576
  assert attention.causal_score_entries(1536) * 8 == 5 * 1536**2
  assert attention.causal_score_entries(63) == 63**2


def _causal_case(T=200, B=3, K=2, R=2, E=8):
  """A teacher-forced attention call of T positions, three blocks: row 0 left-padded by
  70 (its first block holds padding queries only), row 1 right-padded from 150, row 2 full."""
  ks = jax.random.split(jax.random.key(2), 3)
  q = jax.random.normal(ks[0], (B, K, T * R, E))
  keys, values = jax.random.normal(ks[1], (B, K, E, T)), jax.random.normal(ks[2], (B, K, T, E))
  mask = np.ones((B, T), bool)
  mask[0, :70], mask[1, 150:] = False, False
  pos = model.positions_from_mask(jnp.asarray(mask))
  return q, jnp.repeat(pos, R, axis=1), keys, values, pos


def _assert_attends_as(f, g, q, keys, values):
  """f(q, keys, values) has g's output (to 2e-6) and gradients (to 2e-5) for a random
  cotangent."""
  np.testing.assert_allclose(f(q, keys, values), g(q, keys, values), atol=2e-6)
  w = jax.random.normal(jax.random.key(3), q.shape)
  grads = [
    jax.jit(jax.grad(lambda *a, h=h: jnp.sum(h(*a) * w), argnums=(0, 1, 2)))(q, keys, values)
    for h in (f, g)
  ]
  for g_f, g_g in zip(*grads, strict=True):
    np.testing.assert_allclose(g_f, g_g, atol=2e-5)


def test_causal_blocks_attention_equals_attention_over_all_keys():
  """Each query block attends to the keys up to its end only; with positions that
  increase along T (`positions_from_mask`) that is the softmax over all keys: the same
  output and gradients, and 0 for padding queries."""
  q, q_pos, keys, values, pos = _causal_case()
  blocked = lambda q, k, v: attention.attend_causal(q, q_pos, k, v, pos, dtype=jnp.float32)
  full = lambda q, k, v: attention.attend(q, q_pos, k, v, pos, dtype=jnp.float32)
  _assert_attends_as(blocked, full, q, keys, values)
  out = np.asarray(blocked(q, keys, values))
  assert np.all(out[0, :, : 70 * 2] == 0) and np.abs(out[1:, :, :2]).min() > 0


@pytest.mark.parametrize("query_block,softcap", [(20, 0.0), (30, 5.0)])
def test_causal_blocks_in_query_steps_equal_attention_over_all_keys(query_block, softcap):
  """Long causal blocks in steps (`attend_causal` with query_block): the 3 blocks of 67, 66
  and 67 tokens go in 4 steps of 17 (query_block 20) or 3 of 23, 22, 23 (30), the last
  step padded, and
  give `attend`'s output and gradients, with soft-capping too; at query_block 34 (67 is
  not above 2 · 34) the blocks stay whole."""
  assert [attention.query_step(b - a, query_block) for a, b in attention.causal_blocks(200)] == (
    [17, 17, 17] if query_block == 20 else [23, 22, 23]
  )
  assert attention.query_step(67, 34) == 67 and attention.query_step(67, 0) == 67
  q, q_pos, keys, values, pos = _causal_case()
  kw = dict(dtype=jnp.float32, softcap=softcap)
  full = lambda q, k, v: attention.attend(q, q_pos, k, v, pos, **kw)
  stepped = lambda q, k, v: attention.attend_causal(q, q_pos, k, v, pos, query_block=query_block, **kw)  # fmt: skip
  _assert_attends_as(stepped, full, q, keys, values)
  # The memory plan's score entries (a row, a query head): whole blocks (b − a)·b summed,
  # 67·67 + 66·133 + 67·200; in steps the largest step's, 17·200 (twice: step_buffers=2).
  assert attention.causal_score_entries(200) == 67 * 67 + 66 * 133 + 67 * 200
  assert attention.causal_score_entries(200, 20, step_buffers=2) == 2 * 17 * 200


@pytest.mark.parametrize("parts,block", [(1, 64), (2, 48), (4, 26)])
def test_query_blocks_equal_attention_over_all_keys(parts, block):
  """`attend_query_blocks` (context parallelism's attention, here without a mesh): the
  400 query rows in `parts` parts of 400 / parts, `block` rows of each at a time, the
  last block of a part padded (48 and 26 do not divide 200 and 100), give `attend`'s
  output and gradients, padding queries included."""
  q, q_pos, keys, values, pos = _causal_case()
  full = lambda q, k, v: attention.attend(q, q_pos, k, v, pos, dtype=jnp.float32)
  blocked = lambda q, k, v: attention.attend_query_blocks(
    q, q_pos, k, v, pos, parts=parts, block=block, dtype=jnp.float32
  )
  _assert_attends_as(blocked, full, q, keys, values)


def test_causal_blocks_rely_on_increasing_positions():
  """The contract is real: a key placed after its query with a smaller position is seen by
  `_attend` and skipped by the blocks, so their outputs differ."""
  q, q_pos, keys, values, pos = _causal_case()
  pos = pos.at[2, 199].set(5)  # Row 2's last key claims position 5.
  q_pos = jnp.repeat(pos, 2, axis=1)
  blocked = attention.attend_causal(q, q_pos, keys, values, pos, dtype=jnp.float32)
  full = attention.attend(q, q_pos, keys, values, pos, dtype=jnp.float32)
  diff = np.abs(np.asarray(blocked - full)).max(axis=(1, 3))  # [B, T·R]
  assert diff[:2].max() < 2e-6  # Rows 0 and 1 are untouched.
  # Row 2: the queries of blocks one and two from position 5 on (rows 10..265) lose the
  # key; those before it never saw it, and block three (rows 266 on) attends over it.
  assert (diff[2, 10:266] > 0).all() and np.median(diff[2, 10:266]) > 1e-3
  assert diff[2, :10].max() < 2e-6 and diff[2, 266:].max() < 2e-6


@pytest.mark.parametrize("variant", ["qwen3", "llama_scan_remat"])
def test_a_model_in_causal_blocks_equals_one_block(monkeypatch, variant):
  """Blocks of 2 positions (the 9-token case splits into 4) give the one-block model's
  logits and parameter gradients, with left padding; so does the block of 3 positions in
  steps of 1 (model.context_query_block=1, `attention.attend_causal`)."""
  cfg, params = _setup(**VARIANTS[variant])
  pos_BT = _positions()

  def run(min_block, query_block=cfg.context_query_block):
    monkeypatch.setattr(attention, "_CAUSAL_MIN_BLOCK", min_block)
    c = dataclasses.replace(cfg, context_query_block=query_block)
    f = lambda p: model_lib.apply(p, TOKENS_BT, pos_BT, cfg=c)[0]
    loss = lambda p: jnp.sum(jnp.where(MASK_BT[..., None], jax.nn.log_softmax(f(p)), 0)[..., 3])
    return jax.jit(f)(params), jax.jit(jax.grad(loss))(params)

  assert len(attention.causal_blocks(9)) == 1
  (logits_1, grads_1), (logits_4, grads_4) = run(64), run(2)
  assert attention.causal_blocks(9) == ((0, 2), (2, 4), (4, 7), (7, 9))
  np.testing.assert_allclose(logits_4, logits_1, rtol=1e-5, atol=1e-4)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads_4, grads_1
  )
  assert [attention.query_step(b - a, 1) for a, b in attention.causal_blocks(9)] == [2, 2, 1, 2]
  logits_s, grads_s = run(2, query_block=1)
  np.testing.assert_allclose(logits_s, logits_1, rtol=1e-5, atol=1e-4)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), grads_s, grads_1
  )


def test_pv_multiply_reduce_is_chosen_for_small_decode_shapes_only():
  on_cpu = jax.default_backend() == "cpu"
  assert attention._pv_by_reduce(256, 4, 2, 191, 64) == on_cpu  # The G = 8 benchmark.
  assert not attention._pv_by_reduce(256, 4, 4, 191, 64)  # Q > 3.
  assert not attention._pv_by_reduce(1024, 4, 2, 191, 64)  # Past 2^25 product elements.
  assert not attention._pv_by_reduce(2, 4, 64, 64, 64)  # A prefill or training forward.


def _transposed_row_arrays(cfg, params, *, B=4, T=12) -> list[str]:
  """Arrays [features, B·T] in the optimized HLO of the model's float32 gradient: the
  transposed copies of activation gradients that XLA:CPU makes for a weight gradient
  contracted over two row axes (layers._dot_general_rows)."""
  fn = model_lib.make_model_fn(cfg)
  tokens_BT = jnp.ones((B, T), jnp.int32)
  positions_BT = jnp.broadcast_to(jnp.arange(T), (B, T))

  def loss(p):
    logits_BTV, _ = fn(p, tokens_BT, positions_BT, None)
    return jnp.sum(jax.nn.log_softmax(logits_BTV)[..., 3])

  hlo = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
  rows = B * T
  return re.findall(rf"= f32\[\d+,{rows}\]\{{1,0\}} (?:fusion|copy|transpose)\b", hlo)


def test_weight_gradients_make_no_transposed_copy_of_an_activation_gradient(monkeypatch):
  """Every Dense and the tied head contract their rows flattened, so the compiled float32
  gradient holds no [features, rows] array. The same layers on nn.DenseGeneral's own
  contraction over [B, T, K] make at least one per layer: the detector bites."""
  cfg = model.tiny_config(64)
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))  # Compiled, never run.
  assert _transposed_row_arrays(cfg, params) == []
  monkeypatch.setattr(layers, "_dot_general_rows", jax.lax.dot_general)
  assert len(_transposed_row_arrays(cfg, params)) >= cfg.n_layers
