"""Low-rank adapters: the reference is the base with adapters off, bit for bit at B = 0;
the adapter path equals the merged weights; only adapters train; the optimizer never holds
the base; the reference shares the base's arrays; a LoRA run learns."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import runs  # tests/ is on sys.path (conftest).
from jax import flatten_util

from grpo_jax.infra import config_lib
from grpo_jax.models import model
from grpo_jax.rl import learner, preparation, spec
from grpo_jax.trainer import build

V = 32
# The forward compiled (as the trainer runs it): op by op, each new shape compiles anew.
_apply = jax.jit(model.apply, static_argnames=("cfg", "logits_slice", "hidden_only", "head_only"))


def _cfg(**lora):
  return model.tiny_config(V, lora=dict(rank=4, **lora))


def _inputs():
  tokens_BT = (jnp.arange(14).reshape(2, 7) * 5) % V
  return tokens_BT, jnp.broadcast_to(jnp.arange(7), (2, 7))


def _random_adapters(params, seed=1, scale=0.1):
  leaves, tree = jax.tree.flatten(params["lora"])
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [jax.random.normal(k, x.shape) * scale for k, x in zip(keys, leaves)]
  return {"base": params["base"], "lora": jax.tree.unflatten(tree, noisy)}


@pytest.mark.parametrize("scan, dtype", [(False, "float32"), (True, "float32"), (True, "bfloat16")])
def test_fresh_adapters_are_the_reference_bit_for_bit(scan, dtype):
  cfg = dataclasses.replace(_cfg(), scan_layers=scan, dtype=dtype)
  params = model.init(cfg, jax.random.key(0))
  assert set(params) == {"base", "lora"}
  b_leaves = [
    x for path, x in jax.tree_util.tree_leaves_with_path(params["lora"]) if path[-1].key == "b"
  ]
  assert b_leaves and all(not np.asarray(b).any() for b in b_leaves)  # B = 0.
  policy, _ = _apply(params, *_inputs(), cfg=cfg)
  ref, _ = _apply(model.reference(params), *_inputs(), cfg=cfg)
  np.testing.assert_array_equal(policy, ref)
  # The reference is the base model's own forward: the same weights under a config
  # without adapters.
  plain = dataclasses.replace(cfg, lora=model.LoraConfig())
  base_logits, _ = _apply(params["base"], *_inputs(), cfg=plain)
  np.testing.assert_array_equal(ref, base_logits)
  # And trained adapters move the policy off it.
  moved, _ = _apply(_random_adapters(params), *_inputs(), cfg=cfg)
  assert float(jnp.abs(moved - ref).max()) > 1e-2


@pytest.mark.parametrize("scan", [False, True])
def test_the_adapter_path_equals_the_merged_weights(scan):
  targets = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")
  lora = dict(rank=4, targets=targets)
  cfg = model.tiny_config(V, lora=lora, scan_layers=scan, tie_embeddings=False)
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  plain = dataclasses.replace(cfg, lora=model.LoraConfig())
  merged = model.merge_adapters(params, cfg)
  assert jax.tree.structure(merged) == jax.tree.structure(params["base"])
  got, _ = _apply(params, *_inputs(), cfg=cfg)
  want, _ = _apply(merged, *_inputs(), cfg=plain)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=2e-5)
  # The LM head alone (the chunked log-prob path) sees its adapter too.
  hidden, _ = _apply(params, *_inputs(), cfg=cfg, hidden_only=True)
  np.testing.assert_allclose(model.head_logits(params, hidden, cfg=cfg), got, atol=2e-5)


def test_merge_by_hand_on_one_kernel():
  # W + (alpha/r)·A·B written out for q of layer 0: alpha 8, rank 4 -> scale 2.
  cfg = _cfg(alpha=8.0)
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  merged = model.merge_adapters(params, cfg)
  w = params["base"]["layer_0"]["attn"]["q"]["kernel"]  # [D, H, E]
  a = params["lora"]["layer_0"]["attn"]["q_lora"]["a"]  # [D, r]
  b = params["lora"]["layer_0"]["attn"]["q_lora"]["b"]  # [r, H, E]
  want = w + 2.0 * np.einsum("dr,rhe->dhe", a, b)
  np.testing.assert_allclose(merged["layer_0"]["attn"]["q"]["kernel"], want, atol=1e-6)
  assert merged["layer_0"]["attn_norm"]["scale"] is params["base"]["layer_0"]["attn_norm"]["scale"]


def test_gradients_reach_only_the_adapters_and_equal_the_merged_path():
  cfg = _cfg()
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  plain = dataclasses.replace(cfg, lora=model.LoraConfig())
  tokens_BT, positions_BT = _inputs()

  def loss(p, c):
    logits, _ = _apply(p, tokens_BT, positions_BT, cfg=c)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 3])

  trainable, join = model.split_trainable(params)
  assert trainable is params["lora"]
  got = jax.jit(jax.grad(lambda t: loss(join(t), cfg)))(trainable)
  want = jax.jit(jax.grad(lambda t: loss(model.merge_adapters(join(t), cfg), plain)))(trainable)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5), got, want)
  base_part, join_base = model.split_trainable(params, part="base")
  assert base_part is params["base"] and join_base(base_part)["lora"] is params["lora"]


@pytest.mark.parametrize("scan", [False, True])
def test_adapter_dropout_acts_only_in_a_training_forward(scan):
  """model.lora.dropout = 0.5: without a key (sampling, π_old, the reference) the forward is
  the dropout-free model's bit for bit; with one it differs, is the same for the same key
  and another for another key; while B = 0 it changes nothing (the adapter adds 0)."""
  cfg = _cfg(dropout=0.5)
  if scan:
    cfg = dataclasses.replace(cfg, scan_layers=True)
  plain = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, dropout=0.0))
  fresh = model.init(cfg, jax.random.key(0))
  params = _random_adapters(fresh)
  args = _inputs()
  k1, k2 = jax.random.key(1), jax.random.key(2)
  want, _ = _apply(params, *args, cfg=plain)
  np.testing.assert_array_equal(_apply(params, *args, cfg=cfg)[0], want)
  np.testing.assert_array_equal(_apply(params, *args, cfg=plain, dropout_key=k1)[0], want)
  one, two = (_apply(params, *args, cfg=cfg, dropout_key=k)[0] for k in (k1, k2))
  np.testing.assert_array_equal(_apply(params, *args, cfg=cfg, dropout_key=k1)[0], one)
  assert float(jnp.abs(one - want).max()) > 1e-3 and float(jnp.abs(one - two).max()) > 1e-3
  np.testing.assert_array_equal(
    _apply(fresh, *args, cfg=cfg, dropout_key=k1)[0], _apply(fresh, *args, cfg=plain)[0]
  )


def test_adapter_dropout_reaches_a_chunked_lm_head():
  """An adapted, untied LM head run in chunks of 2 positions (rl.logit_chunk): without a key
  its log-probs equal the unchunked ones; with a key they differ from the undropped ones,
  and the same key repeats them."""
  from grpo_jax.models import logprobs  # noqa: PLC0415

  cfg = model.tiny_config(
    V, tie_embeddings=False, lora=dict(rank=4, dropout=0.5, targets=("q", "lm_head"))
  )
  params = _random_adapters(model.init(cfg, jax.random.key(0)), scale=0.3)
  tokens_BT, _ = _inputs()
  args = (
    params,
    tokens_BT[:, :3],
    jnp.ones((2, 3), bool),
    tokens_BT[:, 3:],
    jnp.ones((2, 4), bool),
  )
  model_fn = model.make_model_fn(cfg)

  @functools.partial(jax.jit, static_argnames="chunk")
  def logp(key, chunk):
    return logprobs.completion_logprobs(*args, model_fn=model_fn, chunk=chunk, dropout_key=key)[0]

  full = logp(None, 0)
  np.testing.assert_allclose(logp(None, 2), full, rtol=1e-5, atol=1e-6)
  dropped = logp(jax.random.key(1), 2)
  assert float(jnp.abs(dropped - full).max()) > 1e-3
  np.testing.assert_array_equal(logp(jax.random.key(1), 2), dropped)


def test_adapter_dropout_gradients_are_unbiased():
  """At B = 0 the forward does not depend on the masks, so ∂L/∂B = scale·(drop(x)·A)ᵀ·∂L/∂y
  is linear in the inverted-dropped input and its mean over masks is the dropout-free
  gradient: over 512 keys the mean is within 6% of it (relative L2; measured 3.2%, and
  one key's 60-71% over √512 is ~3%), while one key's gradient is far from it (asserted
  > 20%)."""
  cfg = _cfg(dropout=0.5)
  plain = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, dropout=0.0))
  params = model.init(cfg, jax.random.key(0))
  tokens_BT, positions_BT = _inputs()
  trainable, join = model.split_trainable(params)

  def grad(t, key, c):
    def loss(t):
      logits, _ = model.apply(join(t), tokens_BT, positions_BT, cfg=c, dropout_key=key)
      return jnp.sum(jax.nn.log_softmax(logits)[..., 3])

    return flatten_util.ravel_pytree(jax.grad(loss)(t))[0]

  want = jax.jit(functools.partial(grad, c=plain))(trainable, None)
  keys = jax.random.split(jax.random.key(3), 512)
  each = jax.jit(jax.vmap(functools.partial(grad, c=cfg), in_axes=(None, 0)))(trainable, keys)
  rel = lambda g: float(jnp.linalg.norm(g - want) / jnp.linalg.norm(want))  # noqa: E731
  assert float(jnp.linalg.norm(want)) > 0
  assert rel(each.mean(0)) < 0.06, rel(each.mean(0))
  assert rel(each[0]) > 0.2, rel(each[0])


def test_the_optimizer_holds_only_the_adapters_and_the_base_never_moves():
  cfg = _cfg()
  params = model.init(cfg, jax.random.key(0))
  optimizer = optax.adam(1e-2)
  state = spec.init_state(params, optimizer)
  n_adapters = model.param_count(params["lora"])
  assert sum(x.size for x in jax.tree.leaves(state.opt_state)) == 2 * n_adapters + 1  # m, v, count
  grads = jax.tree.map(jnp.ones_like, params["lora"])
  new, applied = learner.apply_if_finite(state, grads, jnp.asarray(True), optimizer)
  assert bool(applied)
  assert new.params["base"] is params["base"]  # Not even copied.
  changed = jax.tree.map(lambda a, b: bool((a != b).any()), new.params["lora"], params["lora"])
  assert all(jax.tree.leaves(changed))
  # The warm start of a random init trains the base instead (adapters untouched).
  sft = spec.init_state(params, optimizer, part="base")
  grads = jax.tree.map(jnp.ones_like, params["base"])
  new, _ = learner.apply_if_finite(sft, grads, jnp.asarray(True), optimizer, part="base")
  assert new.params["lora"] is params["lora"]


def test_the_reference_shares_the_bases_arrays():
  params = model.init(_cfg(), jax.random.key(0))
  ref = model.reference(params)
  assert set(ref) == {"base"}
  assert all(a is b for a, b in zip(jax.tree.leaves(ref["base"]), jax.tree.leaves(params["base"])))
  plain = model.init(model.tiny_config(V), jax.random.key(0))
  copied = model.reference(plain)  # Full fine-tuning: its own copy.
  assert not any(a is b for a, b in zip(jax.tree.leaves(copied), jax.tree.leaves(plain)))


def test_the_memory_plan_counts_adapters_for_gradients_and_optimizer_and_no_reference_copy():
  from grpo_jax.models import sharding  # noqa: PLC0415
  from grpo_jax.trainer import memory  # noqa: PLC0415

  def plan(cfg, micro_batches=2):
    return memory.plan(
      cfg,
      spec.RLConfig(micro_batches=micro_batches, kl_coef=0.01),
      sharding.MeshConfig(data=1, fsdp=1, tensor=1),
      n_devices=1, prompts=2, group_size=4, prompt_len=8, max_new_tokens=8,
      optimizer=spec.make_optimizer(lr=1e-3),
    )  # fmt: skip

  full, lora = plan(model.tiny_config(V)), plan(_cfg())
  params = model.init(_cfg(), jax.random.key(0))
  adapter_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params["lora"]))
  base_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params["base"]))
  assert full.ref_params == full.params == base_bytes and lora.ref_params == 0
  assert lora.params == base_bytes + adapter_bytes
  assert lora.grads == 2 * adapter_bytes and full.grads == 2 * base_bytes  # + accumulator.
  assert lora.opt_state < full.opt_state / 5
  # A bfloat16 base (model.lora.base_dtype) holds half the base's bytes.
  half = plan(_cfg(base_dtype="bfloat16"))
  assert half.params == base_bytes // 2 + adapter_bytes and half.grads == lora.grads
  # An int8 base: a byte per kernel weight and a float32 scale per output channel (the
  # kernel's size over its first input axis), the rest in bfloat16.
  flat = jax.tree_util.tree_flatten_with_path(params["base"])[0]
  kernels = [x for path, x in flat if path[-1].key == "kernel"]
  rest = [x for path, x in flat if path[-1].key != "kernel"]
  int8_bytes = sum(x.size + 4 * x.size // x.shape[0] for x in kernels)
  int8_bytes += sum(2 * x.size for x in rest)
  assert kernels and rest
  int8 = plan(_cfg(base_dtype="int8"))
  assert int8.params == int8_bytes + adapter_bytes and int8.grads == lora.grads
  assert int8_bytes < base_bytes / 3


@pytest.mark.parametrize("scan", [False, True])
def test_a_bfloat16_base_is_the_float32_model_on_rounded_weights(scan):
  """model.lora.base_dtype="bfloat16": each base weight is stored in bfloat16 and cast back
  inside its matmul, so the policy equals the float32 model whose base weights were
  rounded to bfloat16, bit for bit; adapters stay float32 and the reference is that base."""
  cfg = dataclasses.replace(_cfg(base_dtype="bfloat16"), scan_layers=scan)
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  stored = model.cast_base(params, cfg)
  assert {x.dtype for x in jax.tree.leaves(stored["base"])} == {jnp.dtype(jnp.bfloat16)}
  assert {x.dtype for x in jax.tree.leaves(stored["lora"])} == {jnp.dtype(jnp.float32)}
  rounded = {
    "base": jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), params["base"]),
    "lora": params["lora"],
  }
  got, _ = _apply(stored, *_inputs(), cfg=cfg)
  want, _ = _apply(rounded, *_inputs(), cfg=cfg)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, want)
  ref, _ = _apply(model.reference(stored), *_inputs(), cfg=cfg)
  ref_want, _ = _apply(model.reference(rounded), *_inputs(), cfg=cfg)
  np.testing.assert_array_equal(ref, ref_want)
  # Gradients reach the adapters (float32) through the bfloat16 base.
  trainable, join = model.split_trainable(stored)
  grads = jax.jit(jax.grad(lambda t: model.apply(join(t), *_inputs(), cfg=cfg)[0].sum()))(trainable)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("base_dtype", ["", "int8"])
def test_the_samplers_run_the_merged_weights_and_draw_the_unmerged_policys_tokens(base_dtype):
  """merge_for_sampling=True folds the adapters into the kernels once per sampler call
  (`model.sampler_view`); the sampler then draws the tokens the unmerged policy (False,
  the default) draws from the same key, with log-probs equal to float rounding."""
  from grpo_jax.models import sampling  # noqa: PLC0415

  on, off = (_cfg(base_dtype=base_dtype, merge_for_sampling=m) for m in (True, False))
  assert model.sampler_view(off) == (off, None) and off == _cfg(base_dtype=base_dtype)
  mcfg, view = model.sampler_view(on)
  assert mcfg == model.base_config(on) and view is not None
  params = model.cast_base(_random_adapters(model.init(on, jax.random.key(0)), scale=0.3), on)
  scfg = sampling.SamplerConfig(
    max_new_tokens=12, eos_ids=(1,), pad_id=0, group_size=4, prompt_buckets=(8,)
  )
  prompts = sampling.prepare_prompts([[2, 5, 7], [3, 9, 4, 11]], cfg=scfg)
  hyper = sampling.sampling_params(temperature=1.0)
  got, want = (
    sampling.make_policy_sampler(c, scfg)(params, prompts, jax.random.key(3), hyper)
    for c in (on, off)
  )
  assert int(want.mask_NT.sum()) > 16  # Real completions, not EOS at once.
  np.testing.assert_array_equal(got.tokens_NT, want.tokens_NT)
  np.testing.assert_allclose(got.policy_logp_NT, want.policy_logp_NT, atol=2e-5)
  # The adapters are in what the merged sampler reads: without them it draws otherwise.
  fresh = {"base": params["base"], "lora": jax.tree.map(jnp.zeros_like, params["lora"])}
  base_rows = sampling.make_policy_sampler(on, scfg)(fresh, prompts, jax.random.key(3), hyper)
  assert float(jnp.abs(base_rows.policy_logp_NT - got.policy_logp_NT).max()) > 1e-2


def test_int8_quantization_by_hand():
  """Per output channel (columns of a [in, out] kernel): s = max|W| / 127.5 (qwix's int8
  bound: the top bucket is [126.5, 127.5]), Q = clip(round(W / s), -128, 127): column 0
  max 1 -> s = 1/127.5, 1 -> 127.5 -> 127, 0.5 -> 63.75 -> 64; column 1 max 4 ->
  s = 4/127.5, -2 -> -63.75 -> -64, 4 -> 127."""
  from grpo_jax.models import quant  # noqa: PLC0415

  w = jnp.array([[1.0, -2.0], [0.5, 4.0]])
  q = quant.quantize(w, axis=0)
  np.testing.assert_array_equal(q.qvalue, np.array([[127, -64], [64, 127]], np.int8))
  np.testing.assert_allclose(q.scale, [[1 / 127.5, 4 / 127.5]], rtol=1e-7)
  want = np.array([[127, -256], [64, 508]]) / 127.5
  np.testing.assert_allclose(quant.dequantized(q), want, rtol=1e-6)


@pytest.mark.parametrize("scan", [False, True])
def test_an_int8_base_is_the_float32_model_on_dequantized_weights(scan):
  """model.lora.base_dtype="int8": every Dense kernel is stored as (Q int8, s float32) and
  dequantized inside its layer, so the policy equals the float32 model whose kernels are
  s·Q (the embedding table and norms rounded to bfloat16), bit for bit under jit; the
  reference is that base; adapter gradients are float32 and equal that model's up to the
  order of float32 sums (XLA fuses the two gradient programs differently: bit for bit with
  XLA:CPU's fusion emitters, 1.9e-6 apart at most with the loop emitter the tests compile
  with, `subproc.FAST_COMPILE`); each weight is within s/2 of the original."""
  from grpo_jax.models import quant  # noqa: PLC0415

  cfg = dataclasses.replace(_cfg(base_dtype="int8"), scan_layers=scan)
  cfg32 = dataclasses.replace(_cfg(), scan_layers=scan)
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  stored = model.cast_base(params, cfg)
  flat = jax.tree_util.tree_flatten_with_path(stored["base"], is_leaf=quant.is_quantized)[0]
  kernels = {jax.tree_util.keystr(p): x for p, x in flat if quant.is_quantized(x)}
  assert len(kernels) == 7 * (1 if scan else cfg.n_layers), sorted(kernels)
  assert {x.qvalue.dtype for x in kernels.values()} == {jnp.dtype(jnp.int8)}
  assert {x.dtype for _, x in flat if not quant.is_quantized(x)} == {jnp.dtype(jnp.bfloat16)}
  originals = {
    jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(params["base"])[0]
  }
  for name, q in kernels.items():
    error = jnp.abs(quant.dequantized(q) - originals[name])
    assert bool(jnp.all(error <= q.scale / 2 * (1 + 1e-4))), name
  dequantized = jax.jit(lambda s: {"base": quant.dequantized(s["base"]), "lora": s["lora"]})(stored)
  policy = jax.jit(lambda p, c: model.apply(p, *_inputs(), cfg=c)[0], static_argnums=1)
  np.testing.assert_array_equal(policy(stored, cfg), policy(dequantized, cfg32))
  np.testing.assert_array_equal(
    policy(model.reference(stored), cfg), policy(model.reference(dequantized), cfg32)
  )

  def adapter_grads(p, c):
    trainable, join = model.split_trainable(p)
    return jax.jit(jax.grad(lambda t: model.apply(join(t), *_inputs(), cfg=c)[0].sum()))(trainable)

  got, want = adapter_grads(stored, cfg), adapter_grads(dequantized, cfg32)
  assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(got))
  assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(got))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=0, atol=1e-5), got, want)
  # Merging folds the adapters into s·Q, and leaves no quantized kernel behind.
  merged = model.merge_adapters(stored, cfg)
  assert not any(quant.is_quantized(x) for x in jax.tree.leaves(merged, is_leaf=quant.is_quantized))
  jax.tree.map(np.testing.assert_array_equal, merged, model.merge_adapters(dequantized, cfg32))


def test_adapters_follow_their_kernels_logical_axes():
  axes = model.logical_axes(dataclasses.replace(_cfg(), scan_layers=True))
  q = axes["lora"]["layers"]["attn"]["q_lora"]
  assert tuple(q["a"]) == ("layers", "embed", "lora_rank")
  assert tuple(q["b"]) == ("layers", "lora_rank", "q_heads", "head_dim")
  o = axes["lora"]["layers"]["attn"]["o_lora"]
  assert tuple(o["a"]) == ("layers", "q_heads", "head_dim", "lora_rank")


@pytest.mark.parametrize(
  "lora, message",
  [
    (dict(rank=-1), "model.lora.rank must be an int >= 0"),
    (dict(rank=4, alpha=0.0), "model.lora.alpha must be a positive number"),
    (dict(rank=4, dropout=1.0), r"dropout=1.0; allowed: a number in \[0, 1\)"),
    (dict(rank=4, dropout=-0.1), r"dropout=-0.1; allowed"),
    (dict(rank=4, targets=("q", "embed")), r"unknown \['embed'\]"),
    (dict(rank=4, targets=("lm_head",)), "tied embedding table"),
    (dict(rank=4, warm_start="never"), "warm_start='never'"),
    (dict(rank=4, base_dtype="nf4"), "allowed: '' .*'int8'"),
    (dict(rank=4, merge_for_sampling="yes"), "merge_for_sampling='yes'; allowed: True, False"),
    (dict(rnak=4), "unknown LoraConfig keys"),
  ],
)
def test_bad_lora_options_are_one_clear_error(lora, message, tmp_path):
  c = config_lib.load("configs/arithmetic.py:tiny")
  with c.unlocked():
    c.model.lora = lora
  with pytest.raises(config_lib.ConfigError, match=message) as e:
    build.build(c)
  assert "\n" not in str(e.value)


def test_diagnostics_with_adapters_are_refused_in_one_line():
  c = config_lib.load("configs/arithmetic.py:tiny")
  c.model.lora.rank = 4
  c.diagnostics.every = 5
  with pytest.raises(config_lib.ConfigError, match="diagnostics.every=5 with config.model.lora"):
    build.build(c)


def test_the_warm_start_trains_the_base_of_a_random_init():
  c = config_lib.load("configs/arithmetic.py:tiny")
  c.model.lora.rank = 4
  assert build.build(c).model_cfg.lora.warm_start == "base"
  c.model.lora.warm_start = "adapters"
  assert build.build(c).model_cfg.lora.warm_start == "adapters"


@pytest.mark.parametrize("scan", [False, True])
def test_merged_and_adapter_exports_agree_as_peft_reads_them(scan, tmp_path):
  """base + (lora_alpha / r)·B·A, from the PEFT files, is the merged export, tensor by
  tensor (PEFT's formula, without PEFT: it is not installable here)."""
  import json

  from grpo_jax.models import hf

  lora = dict(rank=4, alpha=8.0, targets=("q", "o", "down", "lm_head"))
  cfg = model.tiny_config(V, lora=lora, scan_layers=scan, tie_embeddings=False)
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  base_cfg = model.base_config(cfg)
  hf.export(params["base"], base_cfg, tmp_path / "base", arch="qwen3", dtype="float32")
  hf.export(params, cfg, tmp_path / "merged", arch="qwen3", dtype="float32")
  hf.export_adapters(params, cfg, tmp_path / "adapters", base_model=str(tmp_path / "base"))
  config_json = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
  assert (config_json["r"], config_json["lora_alpha"]) == (4, 8.0)
  assert config_json["target_modules"] == ["down_proj", "lm_head", "o_proj", "q_proj"]
  read = lambda d: {n: hf.read_tensor(e) for n, e in hf.tensor_index(tmp_path / d).items()}
  base, merged = read("base"), read("merged")
  entries = hf.tensor_index(tmp_path / "adapters")
  adapted = 0
  for name, w in base.items():
    module = name[: -len(".weight")]
    a_name = f"base_model.model.{module}.lora_A.weight"
    if a_name in entries:
      a = hf.read_tensor(entries[a_name])
      b = hf.read_tensor(entries[f"base_model.model.{module}.lora_B.weight"])
      assert a.shape[0] == 4 and b.shape[1] == 4
      np.testing.assert_allclose(w + 2.0 * b @ a, merged[name], atol=1e-5)
      adapted += 1
    else:
      np.testing.assert_array_equal(w, merged[name])
  assert adapted == 3 * cfg.n_layers + 1  # q, o, down per layer, and the LM head.


def test_peft_loads_the_exported_adapters_onto_the_base(tmp_path):
  """With the bench extra (torch, transformers, peft): PeftModel.from_pretrained(base,
  adapters) gives the merged export's logits, and ours."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  peft = pytest.importorskip("peft")
  from grpo_jax.models import hf

  cfg = model.tiny_config(V, lora=dict(rank=4, alpha=8.0), tie_embeddings=False)
  params = _random_adapters(model.init(cfg, jax.random.key(0)))
  hf.export(
    params["base"], model.base_config(cfg), tmp_path / "base", arch="qwen3", dtype="float32"
  )
  hf.export_adapters(params, cfg, tmp_path / "adapters", base_model=str(tmp_path / "base"))
  base = transformers.AutoModelForCausalLM.from_pretrained(
    tmp_path / "base", torch_dtype=torch.float32
  )
  peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "adapters").eval()
  tokens_BT, _ = _inputs()
  with torch.no_grad():
    theirs = peft_model(torch.tensor(np.asarray(tokens_BT))).logits.numpy()
  ours, _ = _apply(params, *_inputs(), cfg=cfg)
  np.testing.assert_allclose(theirs, ours, atol=2e-4, rtol=2e-4)


def test_a_checkpoint_base_loads_with_fresh_adapters_and_the_policy_is_the_checkpoints():
  """config.hf_dir with model.lora: the base is the checkpoint's weights (as without
  adapters), the adapters start at B = 0, and the reference is that base."""
  from grpo_jax.models import hf  # noqa: PLC0415
  from grpo_jax.trainer import run_state, steps  # noqa: PLC0415

  c = config_lib.load("configs/gsm8k_qwen.py:tiny")
  c.model.lora.rank = 4
  setup = build.build(c)
  assert setup.model_cfg.lora.warm_start == "adapters"  # A checkpoint: the base stays.
  fns = steps.functions(setup)
  params = run_state.initial_params(setup, fns, jax.random.key(0))
  assert model.is_adapted(params)
  want = hf.load_params(setup.loop.hf_dir, model.base_config(setup.model_cfg), shardings=None)
  for a, b in zip(jax.tree.leaves(params["base"]), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(a, b)
  for name, leaf in jax.tree_util.tree_flatten_with_path(params["lora"])[0]:
    if jax.tree_util.keystr(name).endswith("['b']"):
      assert not np.any(np.asarray(leaf)), name
  assert set(model.reference(params)) == {"base"}


# ----------------------------------------------------------------------------
# Checkpoints: adapters and their optimizer state only; the base kept once and checked.
# ----------------------------------------------------------------------------


def test_the_fingerprint_changes_with_one_bit_a_dtype_or_a_path():
  from grpo_jax.models import frozen_base  # noqa: PLC0415

  tree = {"a": jnp.arange(6.0).reshape(2, 3), "b": {"c": jnp.ones(4, jnp.bfloat16)}}
  same = jax.tree.map(jnp.copy, tree)
  assert frozen_base.fingerprint(tree) == frozen_base.fingerprint(same)
  flipped = np.asarray(tree["a"]).copy().view(np.uint32)
  flipped[1, 2] ^= 1  # The lowest mantissa bit of one weight.
  one_bit = {**tree, "a": jnp.asarray(flipped.view(np.float32))}
  swapped = {**tree, "a": tree["a"][::-1]}  # The same values, in another order.
  retyped = {**tree, "b": {"c": jnp.ones(4, jnp.float16)}}
  renamed = {"a": tree["a"], "d": tree["b"]}
  prints = {frozen_base.fingerprint(t) for t in (tree, one_bit, swapped, retyped, renamed)}
  assert len(prints) == 5


def _lora_run_config(iterations=4, base_dtype="", dynamic=False, dropout=0.0):
  c = runs.small_arithmetic()
  c.model.lora.update(rank=4, base_dtype=base_dtype, dropout=dropout)
  c.rl.update(dynamic_sampling=dynamic, max_gen_batches=2)
  c.update(warmstart_steps=120, iterations=iterations, eval_every=iterations, eval_size=16)
  c.update(checkpoint_every=2, prompts_per_step=8, eval_samples=0)
  c.update(reward_workers=0, progress=False, tensorboard=False)
  return c


def _saved_leaves(step_dir):
  """The checkpoint's "state" item: {leaf path: shape} from its metadata."""
  from grpo_jax.infra import checkpoint  # noqa: PLC0415

  ckpt = checkpoint.Checkpointer(step_dir.parent, keep=3)
  try:
    meta = ckpt._mngr.item_metadata(int(step_dir.name))["state"]
    return checkpoint._metadata_shapes(meta), ckpt.read_meta(int(step_dir.name))
  finally:
    ckpt.close()


def test_a_lora_checkpoint_holds_the_adapters_resumes_exactly_and_checks_its_base(tmp_path):
  """One test, so that its runs are made once (xdist's worksteal would repeat a module
  fixture on each worker): an uninterrupted 4-iteration LoRA run; the same run stopped
  after iteration 3 (checkpoint 2 its latest) and resumed; that run's base swapped for
  another, then removed. Both runs drop zero-variance groups and sample again (DAPO's
  dynamic sampling) and drop adapter inputs (model.lora.dropout = 0.1), which the resume
  reproduces too."""
  import shutil  # noqa: PLC0415

  from grpo_jax.infra import checkpoint  # noqa: PLC0415
  from grpo_jax.models import frozen_base
  from grpo_jax.trainer import train  # noqa: PLC0415

  whole, cut = tmp_path / "whole", tmp_path / "cut"
  run_config = functools.partial(_lora_run_config, dynamic=True, dropout=0.1)
  train.run(run_config(), whole, log=lambda _: None)

  class Stop(Exception):
    pass

  def stop_after(n):
    def stop(it, record):
      if it == n:
        raise Stop

    return stop

  with pytest.raises(Stop):
    train.run(run_config(), cut, log=lambda _: None, on_iteration=stop_after(3))
  resume_log = []
  train.run(run_config(), cut, log=resume_log.append)

  # The checkpoint holds the adapters and their optimizer state, and names its base.
  shapes, meta = _saved_leaves(whole / "checkpoints" / "4")
  params = [k for k in shapes if k.startswith("train/params/")]
  assert params and all(k.startswith("train/params/lora/") for k in params), params[:5]
  assert not any("base" in k for k in shapes)
  assert any(k.startswith("train/opt_state/") for k in shapes)
  identity = meta["base_identity"]
  # A random init whose base the warm start trained: kept once, in workdir/base.
  assert identity["source"] == "workdir" and len(identity["fingerprint"]) == 16
  assert (whole / "base" / "0").is_dir()

  # The resumed run ends with the uninterrupted run's metrics.
  lines = [runs.untimed(r) for r in runs.lines(whole)]
  assert [runs.untimed(r) for r in runs.lines(cut)] == lines
  # Not vacuous: the warm-started policy solves some problems, so advantages are non-zero
  # and the adapters move.
  assert lines[0]["eval/greedy_accuracy"] > 0.05, lines[0]
  assert all(r["adv_std"] > 0 for r in lines if r["phase"] == "rl"), lines
  # Dynamic sampling did drop groups and sample again (measured: a second batch every
  # iteration, 8-10 of the 16 groups sampled dropped).
  assert all(r["dynamic/dropped_groups"] > 0 for r in lines if r["phase"] == "rl"), lines
  assert any("resumed from" in line for line in resume_log)

  # Another base in its place (a run with another seed, stopped once its base is stored:
  # the same compiled functions, the config differing only in seed and extent) or none:
  # refused in one line.
  c = run_config(iterations=6)
  other = tmp_path / "other"
  c_other = run_config(iterations=1)
  c_other.update(seed=7, warmstart_steps=10)
  with pytest.raises(Stop):
    train.run(c_other, other, log=lambda _: None, on_iteration=stop_after(1))
  assert (other / frozen_base.BASE_DIR / "0").is_dir()
  shutil.rmtree(cut / frozen_base.BASE_DIR)
  shutil.copytree(other / frozen_base.BASE_DIR, cut / frozen_base.BASE_DIR)
  with pytest.raises(checkpoint.CheckpointMismatchError, match="not the one this run's adapters"):
    train.run(c, cut, log=lambda _: None)
  shutil.rmtree(cut / frozen_base.BASE_DIR)
  with pytest.raises(checkpoint.CheckpointMismatchError, match="which is missing"):
    train.run(c, cut, log=lambda _: None)


@pytest.mark.parametrize(
  "base_dtype, dtypes", [("bfloat16", {"bfloat16"}), ("int8", {"int8", "float32", "bfloat16"})]
)
def test_a_stored_base_is_kept_and_resumed_in_its_dtype(base_dtype, dtypes, tmp_path):
  """A random init with model.lora.base_dtype set: the warm start trains the base in
  float32, then it is stored in bfloat16 (or int8 kernels with float32 scales, the rest
  bfloat16), in workdir/base too, and the run resumes on it."""
  from grpo_jax.infra import checkpoint  # noqa: PLC0415
  from grpo_jax.models import frozen_base
  from grpo_jax.trainer import train  # noqa: PLC0415

  c = _lora_run_config(iterations=2, base_dtype=base_dtype)
  c.update(warmstart_steps=10, checkpoint_every=1, eval_size=8)
  train.run(c, tmp_path, log=lambda _: None)
  keeper = checkpoint.Checkpointer(tmp_path / frozen_base.BASE_DIR, keep=1, keep_best=False)
  try:
    saved = checkpoint._metadata_shapes(keeper._mngr.item_metadata(0)["state"])
    saved_dtypes = {m.dtype for m in jax.tree.leaves(keeper._mngr.item_metadata(0)["state"])}
  finally:
    keeper.close()
  assert saved and {str(d) for d in saved_dtypes} == dtypes, saved_dtypes
  quantized = [k for k in saved if k.endswith("kernel/qvalue")]
  assert bool(quantized) == (base_dtype == "int8"), list(saved)[:8]
  c.iterations = 3
  logs = []
  train.run(c, tmp_path, log=logs.append)  # Resumes: the base read back passes its check.
  assert any("resumed from" in line for line in logs), logs


# ----------------------------------------------------------------------------
# Composition: the off-policy pipeline samples with the current adapters.
# ----------------------------------------------------------------------------


def _pipeline_config(*, is_correction="none", merge=False, **offpolicy):
  """test_offpolicy's small run (it learns within 4 iterations), with adapters."""
  c = runs.small_arithmetic()
  c.model.lora.update(rank=4, alpha=32.0, merge_for_sampling=merge)
  c.update(prompts_per_step=4, iterations=4, warmstart_steps=120)
  c.update(eval_every=100, eval_size=8, eval_samples=0, checkpoint_every=2, peak_flops=1e11)
  c.update(reward_workers=0, progress=False, tensorboard=False, learning_rate=3e-3)
  c.offpolicy.update(offpolicy)
  c.rl.is_correction = is_correction
  return c


def test_the_pipeline_samples_with_the_current_adapters(tmp_path):
  """At staleness 0 the async pipeline's rollouts are the synchronous run's, bit for bit
  (every batch sampled by the adapters just trained); at staleness 2 a batch sampled two
  updates back has log-probs that differ from the trainer's (the adapters moved), and
  one sampled by the current adapters has the trainer's own (verl #7495: an adapter that
  never reached the sampler would leave every batch at mismatch 0). The stale run samples
  with the adapters merged (merge_for_sampling), so the merged weights are the current
  ones too, and their log-probs are the unmerged trainer's to float32 rounding."""

  from grpo_jax.trainer import train  # noqa: PLC0415

  def run(name, **options):
    train.run(_pipeline_config(**options), tmp_path / name, log=lambda _: None)
    return runs.lines(tmp_path / name)[1:]

  timing = ("offpolicy/", "time/", "seconds", "mfu", "tokens_per_s")

  def untimed(line):
    return {k: v for k, v in runs.untimed(line).items() if not k.startswith(timing)}

  sync = run("sync")
  assert sync[0]["grad_norm"] > 0 and sync[0]["accuracy"] > 0  # Adapters train.
  at_zero = run("async0", enabled=True)
  assert [untimed(x) for x in at_zero] == [untimed(x) for x in sync]
  stale = run("async2", enabled=True, max_staleness=2, is_correction="tis_token", merge=True)
  assert [x["offpolicy/staleness_max"] for x in stale] == [0, 1, 2, 2]
  assert stale[0]["offpolicy/mismatch_k3"] < 1e-6  # Sampled by the adapters trained on.
  assert stale[2]["offpolicy/mismatch_k3"] > 1e-5  # Two adapter updates apart.


@pytest.mark.parametrize("base_dtype", ["int8"])  # CI time: int8 runs the float path and more.
def test_a_resume_reads_the_checkpoint_base_again_and_refuses_an_edited_one(base_dtype, tmp_path):
  """A base from config.hf_dir is not copied into the workdir: a resume reads it again
  (from wherever config.hf_dir points now), stores it again (int8: quantized the same
  way) and checks its fingerprint; a checkpoint whose weights were edited in between is
  refused in one line."""
  import shutil  # noqa: PLC0415

  import safetensors.numpy  # noqa: PLC0415

  from grpo_jax.infra import checkpoint  # noqa: PLC0415
  from grpo_jax.models import frozen_base
  from grpo_jax.trainer import train  # noqa: PLC0415

  hf_dir = tmp_path / "qwen2"
  c = config_lib.load("configs/gsm8k_qwen.py:tiny")
  shutil.copytree(c.hf_dir, hf_dir)
  c.update(hf_dir=str(hf_dir), iterations=1, eval_every=1, checkpoint_every=1)
  c.update(reward_workers=0, progress=False, tensorboard=False, export_hf=False)
  c.model.lora.update(rank=4, base_dtype=base_dtype)
  workdir = tmp_path / "run"
  train.run(c, workdir, log=lambda _: None)
  assert not (workdir / frozen_base.BASE_DIR).exists()  # Named, not copied.
  moved = tmp_path / "moved"
  shutil.move(hf_dir, moved)  # The same weights elsewhere: resumes.
  c.update(hf_dir=str(moved), iterations=2)
  logs = []
  train.run(c, workdir, log=logs.append)
  assert any("resumed from" in line for line in logs), logs
  (path,) = moved.glob("*.safetensors")
  tensors = safetensors.numpy.load_file(path)
  name = next(k for k in sorted(tensors) if k.endswith("q_proj.weight"))
  tensors[name] = tensors[name] + np.float32(1e-3).astype(tensors[name].dtype)
  safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
  c.iterations = 3
  with pytest.raises(checkpoint.CheckpointMismatchError, match="is not the one this run's"):
    train.run(c, workdir, log=lambda _: None)


# Estimators that read more than rewards: π_old (optimal baselines), the KL (reinforce_pp,
# which folds it into the reward), batch statistics, and a group estimator. The others see
# only rewards and lengths, which adapters do not change (every estimator on the full
# model: test_episodes, test_advantages).
_ESTIMATORS = (
  "optimal_token_baseline", "optimal_baseline", "reinforce_pp", "batch_mean_std", "grpo", "rloo"
)  # fmt: skip


def _variant_configs():
  """Six configs that run every policy loss, KL estimator, planner, aggregation and
  importance correction at least once, with the estimators of `_ESTIMATORS`. IBPO, which
  needs counterfactual rows, is not among them: no test trains it with adapters."""
  from grpo_jax.rl import aggregation, importance, losses, planners  # noqa: PLC0415

  registries = (
    losses.REGISTRY, losses.KL_REGISTRY, planners.REGISTRY, aggregation.REGISTRY, importance.REGISTRY
  )  # fmt: skip
  n = max(len(r.names()) for r in registries)
  assert n == len(_ESTIMATORS)
  return [
    dict(
      advantage=_ESTIMATORS[i],
      policy_loss=losses.REGISTRY.names()[i % len(losses.REGISTRY.names())],
      kl_estimator=losses.KL_REGISTRY.names()[i % len(losses.KL_REGISTRY.names())],
      planner=planners.REGISTRY.names()[i % len(planners.REGISTRY.names())],
      aggregation=aggregation.REGISTRY.names()[i % len(aggregation.REGISTRY.names())],
      is_correction=importance.REGISTRY.names()[i % len(importance.REGISTRY.names())],
      kl_coef=0.05,
      num_minibatches=2,
    )
    for i in range(n)
  ]


@pytest.fixture(scope="module")
def lora_rollouts(tokenizer, sampler_cfg):
  """(model config, LoRA params with random adapters, rollouts the merged sampler drew)
  of a 1-layer model (each variant compiles its prepare and update)."""
  from grpo_jax.models import sampling  # noqa: PLC0415

  cfg = model.tiny_config(
    tokenizer.vocab_size, n_layers=1, d_model=32, mlp_dim=64, lora=dict(rank=4)
  )
  params = _random_adapters(model.init(cfg, jax.random.key(2)))
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(f"Q:{a}+{a + 3}\n", add_bos=True) for a in range(4)], cfg=sampler_cfg
  )
  hyper = sampling.sampling_params(temperature=1.0)
  sample = sampling.make_policy_sampler(cfg, sampler_cfg)
  return cfg, params, sample(params, prompts, jax.random.key(1), hyper)


@pytest.mark.parametrize("rl_options", _variant_configs(), ids=lambda o: o["advantage"])
def test_every_variant_trains_the_adapters_against_the_base_as_reference(rl_options, lora_rollouts):
  """With adapters, each policy loss, KL estimator, planner, aggregation and importance
  correction (`_variant_configs`) prepares and updates: the reference log-probs are the
  base model's own, the loss is finite, the adapters move and the base does not change
  by one bit."""
  cfg, params, rollouts = lora_rollouts
  rl_cfg = spec.RLConfig(**rl_options)
  model_fn = model.make_model_fn(cfg)
  correct_N = jnp.asarray(np.arange(16) % 3 == 0, jnp.float32)
  prep_hyper = rl_cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  batch, _, _ = preparation.make_prepare(rl_cfg, model_fn)(
    params, model.reference(params), rollouts, correct_N, jnp.zeros(16), prep_hyper
  )
  if rl_options["advantage"] == _ESTIMATORS[0]:  # Once: the reference is the base model.
    plain = model.make_model_fn(model.base_config(cfg))
    base_logp = functools.partial(preparation.rollout_logprobs, cfg=spec.RLConfig(), model_fn=plain)
    want = jax.jit(base_logp)(params["base"], None, rollouts)
    # Two programs (the adapted model with adapters off, the plain base) fuse their sums
    # differently: equal up to float32 rounding, not bit for bit on every CPU (2.4e-7 at
    # one of 160 log-probs on a 2-core AMD EPYC; equal on the Intel Xeon it was written on).
    np.testing.assert_allclose(batch.ref_logp_NT, want.old_logp_NT, rtol=0, atol=1e-6)
  optimizer = spec.make_optimizer(lr=1e-2)
  update = learner.make_update(
    rl_cfg, model_fn, optimizer, batch_size=16, group_size=4, donate=False
  )
  state, _, history = update(
    spec.init_state(params, optimizer), batch, jax.random.key(0), rl_cfg.step_hyper()
  )
  assert np.isfinite(np.asarray(history["loss"])).all()
  jax.tree.map(np.testing.assert_array_equal, state.params["base"], params["base"])
  moved = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), state.params["lora"], params["lora"]
  )
  assert max(jax.tree.leaves(moved)) > 1e-4, rl_options


def test_a_lora_iteration_on_a_mesh_equals_the_one_device_run(tmp_path):
  """Adapters and base sharded by the logical rules on (data 1, fsdp 2, tensor 2) of 4 CPU
  devices: from the same random init (no warm start), one RL iteration with a KL term
  gives the one-device run's metrics (float32; the reductions sum in another order). The
  1-layer model of `runs.small_arithmetic`, whose 2 query heads split over tensor."""
  import subproc  # noqa: PLC0415

  from grpo_jax.infra import logs  # noqa: PLC0415

  small = ["d_model=32", "n_layers=1", "n_heads=2", "n_kv_heads=2", "head_dim=16", "mlp_dim=64"]

  def run(name, devices, *mesh):
    workdir = tmp_path / name
    args = ["-m", "grpo_jax.main", "--config=configs/arithmetic.py:tiny", f"--workdir={workdir}"]
    args += [f"--config.model.{x}" for x in small] + ["--config.model.lora.rank=4"]
    # An entropy term: a random policy's groups may all score 0 (no advantage), and the
    # loss and gradient must still be real for the comparison to mean something.
    args += ["--config.rl.kl_coef=0.05", "--config.rl.entropy_coef=0.01"]
    args += ["--config.iterations=1", "--config.warmstart_steps=0"]
    args += ["--config.eval_every=100", "--config.eval_size=4", "--config.prompts_per_step=4"]
    args += ["--config.sampler.group_size=4", "--config.progress=False", *mesh]
    # Rewards scored inline (no reward processes to start) and no event files: neither
    # changes a metric compared here.
    args += ["--config.reward_workers=0", "--config.tensorboard=False"]
    subproc.run(args, devices=devices)
    (record,) = [r for r in logs.read_jsonl(workdir / "metrics.jsonl") if r["phase"] == "rl"]
    return record

  one = run("one", 1)
  mesh = run("mesh", 4, "--config.mesh.fsdp=2", "--config.mesh.tensor=2")
  assert one["loss"] != 0 and one["grad_norm"] > 0 and "kl_ref/k3" in one
  untimed = runs.untimed(one)
  compared = [k for k, v in untimed.items() if isinstance(v, float)]
  assert len(compared) > 20
  for k in compared:
    assert mesh[k] == pytest.approx(one[k], rel=1e-4, abs=1e-5), (k, one[k], mesh[k])


def test_the_update_drops_adapter_inputs_and_prepare_does_not(lora_rollouts):
  """model.lora.dropout = 0.3: prepare's log-probs (π_old, the reference) are the
  dropout-free model's bit for bit; the update's forwards drop (the first step's π/π_old
  is no longer 1: |ppo_kl| grows from float noise to a measurable size), and the same key
  repeats the same update."""
  cfg, params, rollouts = lora_rollouts
  drop = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, dropout=0.3))
  rl_cfg = spec.RLConfig(kl_coef=0.05, num_minibatches=2)
  correct_N = jnp.asarray(np.arange(16) % 3 == 0, jnp.float32)
  prep_hyper = rl_cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  optimizer = spec.make_optimizer(lr=1e-2)

  def compiled(c):
    model_fn = model.make_model_fn(c)
    update = learner.make_update(
      rl_cfg, model_fn, optimizer, batch_size=16, group_size=4, donate=False
    )
    return preparation.make_prepare(rl_cfg, model_fn), update

  def run(fns):
    prepare, update = fns
    batch, _, _ = prepare(
      params, model.reference(params), rollouts, correct_N, jnp.zeros(16), prep_hyper
    )
    state, _, history = update(
      spec.init_state(params, optimizer), batch, jax.random.key(0), rl_cfg.step_hyper()
    )
    return batch, state.params["lora"], np.asarray(history["ppo_kl"])

  dropping = compiled(drop)  # Compiled once; the repeat runs the same program again.
  plain_batch, plain_lora, plain_kl = run(compiled(cfg))
  batch, lora, kl = run(dropping)
  np.testing.assert_array_equal(batch.old_logp_NT, plain_batch.old_logp_NT)
  np.testing.assert_array_equal(batch.ref_logp_NT, plain_batch.ref_logp_NT)
  # Measured: first-step ppo_kl 1.5e-8 without dropout, -7.6e-3 with it.
  assert abs(plain_kl[0]) < 1e-5 and abs(kl[0]) > 1e-3, (plain_kl, kl)
  jax.tree.map(np.testing.assert_array_equal, run(dropping)[1], lora)
  moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), lora, plain_lora)
  assert max(jax.tree.leaves(moved)) > 1e-4


def test_ibpo_with_counterfactual_rows_trains_adapters_with_dropout(tmp_path):
  """IBPO (configs/ibpo.py:tiny's estimator and branches: 4 counterfactual rows per group,
  2 continuations at each of 2 window cuts) on the 1-layer LoRA run of `_lora_run_config`
  with adapter dropout and a KL term: two iterations whose counterfactual rows, prefix
  comparisons, advantages, KL and gradients are non-zero and finite, and no step is
  skipped (measured: reward ~0.17, adv_std ~0.4, ibpo/comparison_abs_mean ~0.03)."""

  from grpo_jax.trainer import train  # noqa: PLC0415

  c = _lora_run_config(iterations=2)
  c.model.lora.dropout = 0.1
  c.rl.update(advantage="ibpo", kl_coef=0.05)
  c.rl.advantage_hyper.update(ibpo_lambda=0.5, ibpo_tau=1.0)
  c.rl.advantage_options = {"shrink": 16.0, "scale": "std"}
  c.counterfactual.update(per_group=4, per_rollout=2, branch_from="all", cut="window")
  c.update(checkpoint_every=100, eval_every=100)
  train.run(c, tmp_path, log=lambda _: None)
  rl_lines = [r for r in runs.lines(tmp_path) if r["phase"] == "rl"]
  assert len(rl_lines) == 2
  for r in rl_lines:
    # 32 slots; a window cut past its parent's end gives no branch.
    assert 0 < r["ibpo/counterfactual_rows"] <= 32 and r["ibpo/comparison_abs_mean"] > 0, r
    assert r["adv_std"] > 0 and r["grad_norm"] > 0 and np.isfinite(r["loss"]), r
    assert r["nonfinite_steps"] == 0, r
  assert rl_lines[-1]["kl_ref/k3"] > 0, rl_lines[-1]


@pytest.mark.parametrize("lora", [True, False])
def test_the_trainers_reference_is_the_train_states_own_base(lora, tmp_path, monkeypatch):
  """With adapters the reference policy is the base with adapters off: the compiled
  log-prob step gets the very device buffers of the train state's base every iteration,
  never a copy (a copy holds a second base: an 8B model's 16 GB; a mutation that copied it
  each iteration passed every other LoRA test). Full fine-tuning keeps a reference of its
  own, which must not be the policy's buffers (the update donates those)."""
  from grpo_jax.trainer import steps, train  # noqa: PLC0415

  seen = []
  real = steps.functions

  def spying(setup):
    fns = real(setup)
    logprobs = fns.rl.logprobs

    def spy(params, ref_params, rollouts):
      policy = params["base"] if lora else params
      reference = ref_params["base"] if lora else ref_params
      pointers = lambda tree: [x.unsafe_buffer_pointer() for x in jax.tree.leaves(tree)]
      seen.append((pointers(policy), pointers(reference)))
      return logprobs(params, ref_params, rollouts)

    return dataclasses.replace(fns, rl=dataclasses.replace(fns.rl, logprobs=spy))

  monkeypatch.setattr(steps, "functions", spying)
  c = _lora_run_config(iterations=2)
  c.model.lora.rank = 4 if lora else 0
  c.update(warmstart_steps=0, eval_size=4, checkpoint_every=2)
  c.rl.kl_coef = 0.01  # A KL term: the reference's log-probs are computed.
  train.run(c, tmp_path, log=lambda _: None)
  assert len(seen) == 2 and all(len(p) > 10 and len(p) == len(r) for p, r in seen)
  for policy, reference in seen:
    assert policy == reference if lora else set(policy).isdisjoint(reference)
