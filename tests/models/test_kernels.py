"""model.attention_impl (grpo_jax.models.kernels): the splash kernel path equals the XLA
path, run by Pallas's interpreter on this CPU (outputs, gradients, padding), and compiles
into a TPU program (v5e:2x2, the model's mesh) whose attention is Pallas custom calls."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import subproc

from grpo_jax.infra import hlo, tpu
from grpo_jax.models import attention, kernels, model, sharding
from grpo_jax.trainer import aot

# The TPU programs compile through `aot.compile_function` (never into JAX's persistent
# cache, which cannot load them back), each once a machine (conftest's `tpu_compiled_once`).
pytestmark = pytest.mark.usefixtures("tpu_compiled_once")


def _uses_pallas(fn, *args) -> bool:
  return "pallas_call" in str(jax.make_jaxpr(fn)(*args))


# --- config ---------------------------------------------------------------------------


def test_attention_impl_defaults_to_xla_and_names_the_allowed_values():
  assert model.tiny_config(8).attention_impl == "xla"
  assert model.tiny_config(8, attention_impl="splash").attention_impl == "splash"
  with pytest.raises(ValueError, match=r"attention_impl='flash'; allowed: 'xla' .*'splash'"):
    model.tiny_config(8, attention_impl="flash")
  with pytest.raises(ValueError, match="attention_impl='Splash'"):
    model.ModelConfig.from_dict(
      {**dataclasses.asdict(model.tiny_config(8)), "attention_impl": "Splash"}
    )


# --- the kernel against XLA, interpreted on CPU ----------------------------------------


def _attention_case(T=300, B=3, K=2, R=2, E=8):
  """One call of T positions (padded to 384 inside: 3 × 3 key blocks of 128): row 0
  left-padded by 140 (its first block is padding queries only), row 1 right-padded from
  250, row 2 full."""
  ks = jax.random.split(jax.random.key(2), 3)
  q = jax.random.normal(ks[0], (B, K, T * R, E))
  keys, values = jax.random.normal(ks[1], (B, K, E, T)), jax.random.normal(ks[2], (B, K, T, E))
  mask = np.ones((B, T), bool)
  mask[0, :140], mask[1, 250:] = False, False
  return q, keys, values, model.positions_from_mask(jnp.asarray(mask))


def test_splash_attention_equals_xla_attention_with_padding():
  """Outputs and gradients of q, k, v, for left-padded, right-padded and full rows; a
  padding query's output is exactly 0 (as XLA's), a real one's is not."""
  q, keys, values, pos = _attention_case()
  R = q.shape[2] // pos.shape[1]
  q_pos = jnp.repeat(pos, R, axis=1)
  xla = lambda q, k, v: attention.attend_causal(q, q_pos, k, v, pos, dtype=jnp.float32)
  splash = lambda q, k, v: kernels.causal(q, k, v, pos, impl="splash_interpret", dtype=jnp.float32)
  assert _uses_pallas(splash, q, keys, values) and not _uses_pallas(xla, q, keys, values)
  out = np.asarray(jax.jit(splash)(q, keys, values))
  # float32 sums in another order: 2e-6 plus 4e-6 relative (one output of 28,800 left
  # 2.9e-6 on 0.88 on a 2-core AMD EPYC host).
  np.testing.assert_allclose(out, xla(q, keys, values), rtol=4e-6, atol=2e-6)
  assert np.all(out[0, :, : 140 * R] == 0) and np.all(out[1, :, 250 * R :] == 0)
  assert np.abs(out[0, :, 140 * R :]).min() > 0 and np.abs(out[2]).min() > 0
  w = jax.random.normal(jax.random.key(3), q.shape)
  grads = [
    jax.jit(jax.grad(lambda *a, f=f: jnp.sum(f(*a) * w), argnums=(0, 1, 2)))(q, keys, values)
    for f in (splash, xla)
  ]
  for g_splash, g_xla in zip(*grads, strict=True):
    np.testing.assert_allclose(g_splash, g_xla, atol=2e-5)


def test_splash_relies_on_increasing_positions_as_the_causal_blocks_do():
  """The kernel masks by index (causal) and padding, not by position: a key placed after
  its queries with a smaller position is seen by `attention.attend` and not by the kernel."""
  q, keys, values, pos = _attention_case()
  pos = pos.at[2, 299].set(5)  # Row 2's last key claims position 5.
  q_pos = jnp.repeat(pos, 2, axis=1)
  full = attention.attend(q, q_pos, keys, values, pos, dtype=jnp.float32)
  splash = kernels.causal(q, keys, values, pos, impl="splash_interpret", dtype=jnp.float32)
  diff = np.abs(np.asarray(splash - full)).max(axis=(1, 3))  # [B, T·R]
  assert diff[:2].max() < 2e-6  # Rows 0 and 1 are untouched.
  # Row 2: its queries at positions 5..298 (rows 10..597) lose the key, and the last
  # one (now at position 5 too) sees all 299 keys before it instead of positions 0..5;
  # queries 0..4 never saw it.
  assert (diff[2, 10:] > 0).all() and np.median(diff[2, 10:]) > 1e-3
  assert diff[2, :10].max() < 2e-6


@pytest.mark.parametrize("variant", ["qwen3", "llama_scan_remat"])
def test_a_splash_model_equals_the_xla_model(variant):
  """The tiny model's logits and parameter gradients, left- and right-padded rows, T = 20
  (padded to 128 inside the kernel); with scanned, rematerialised layers too. Measured:
  logits 1.7e-6 apart (of 4.9), each gradient within 8e-7 of its largest entry."""
  overrides = {"qwen3": {}, "llama_scan_remat": dict(qk_norm=False, scan_layers=True, remat="full")}
  cfg = model.tiny_config(64, **overrides[variant])
  params = model.init(cfg, jax.random.key(0))
  # Scaled-up embeddings (as conftest's) give peaked, input-dependent logits.
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0
  tokens = jax.random.randint(jax.random.key(1), (3, 20), 0, 64)
  mask = np.ones((3, 20), bool)
  mask[0, :6], mask[1, 15:] = False, False
  pos = model.positions_from_mask(jnp.asarray(mask))

  def run(impl):
    c = dataclasses.replace(cfg, attention_impl=impl)
    f = lambda p: model.apply(p, tokens, pos, cfg=c)[0]
    loss = lambda p: jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(f(p)), 0)[..., 3])
    return jax.jit(f)(params), jax.jit(jax.grad(loss))(params)

  (logits_x, grads_x), (logits_s, grads_s) = run("xla"), run("splash_interpret")
  np.testing.assert_allclose(logits_s, logits_x, atol=2e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max()), grads_s, grads_x
  )


def test_a_splash_prefill_then_xla_decode_equals_the_xla_model():
  """The sampler's prefill (a call without a cache) goes through the kernel, decoding
  stays XLA: a left-padded prompt's prefill and one decode step give XLA's logits."""
  cfg = model.tiny_config(64)
  params = model.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
  mask = np.ones((2, 9), bool)
  mask[0, :3] = False
  pos = model.positions_from_mask(jnp.asarray(mask))
  nxt = jnp.array([[5], [7]])

  def run(impl):
    c = dataclasses.replace(cfg, attention_impl=impl)
    logits, cache = model.apply(params, tokens, pos, model.init_cache(c, 2, 10), cfg=c)
    step, _ = model.apply(params, nxt, pos[:, -1:] + 1, cache, cfg=c)
    return logits, step

  for a, b in zip(jax.jit(lambda: run("splash_interpret"))(), jax.jit(lambda: run("xla"))()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


# The tiny model's loss gradient on 4 CPU devices as fsdp 2 × tensor 2, each arm's params
# and rows sharded as the trainer shards them (`sharding.Jitted`).
_MESH_SCRIPT = """
import dataclasses, json, numpy as np, jax, jax.numpy as jnp
from grpo_jax.models import model, sharding
layout = sharding.Layout.create(sharding.MeshConfig(data=1, fsdp=2, tensor=2))
cfg = model.tiny_config(64)
params = sharding.init_params(layout, cfg, jax.random.key(0))
p_shardings = sharding.param_shardings(layout, cfg)
tokens = jax.random.randint(jax.random.key(1), (4, 20), 0, 64)
mask = np.ones((4, 20), bool)
mask[0, :6], mask[1, 15:] = False, False
pos = model.positions_from_mask(jnp.asarray(mask))
grads, shard_map = {}, {}
for impl in ("xla", "splash_interpret"):
  c = dataclasses.replace(cfg, attention_impl=impl)
  logp = lambda p, t, q: jax.nn.log_softmax(model.apply(p, t, q, cfg=c)[0])
  loss = lambda p, t, q: jnp.sum(jnp.where(mask[..., None], logp(p, t, q), 0)[..., 3])
  rows = layout.rows(4)
  step = sharding.Jitted(
    layout, jax.grad(loss), in_shardings=(p_shardings, rows, rows), out_shardings=p_shardings
  )
  grads[impl] = step(params, tokens, pos)
  with layout.context():
    shard_map[impl] = "shard_map" in str(jax.make_jaxpr(jax.grad(loss))(params, tokens, pos))
rel = jax.tree.map(
  lambda a, b: float(jnp.abs(a - b).max() / jnp.abs(b).max()),
  grads["splash_interpret"], grads["xla"],
)
print(json.dumps({"rel": max(jax.tree.leaves(rel)), "shard_map": shard_map}))
"""


def test_the_sharded_kernel_step_equals_the_sharded_xla_step():
  """Under the trainer's mesh the kernel runs per device in a shard_map (rows over fsdp,
  kv heads over tensor) and its gradient equals XLA's: measured within 8.2e-7 of each
  parameter's largest gradient entry."""
  r = subproc.run(["-c", _MESH_SCRIPT], devices=4)
  got = json.loads(r.stdout.strip().splitlines()[-1])
  assert got["shard_map"] == {"xla": False, "splash_interpret": True}
  assert got["rel"] < 1e-5


# --- where the kernel may run ----------------------------------------------------------


def test_splash_under_a_cpu_mesh_is_an_error_naming_the_way_out():
  cfg = model.tiny_config(64, attention_impl="splash")
  params = model.init(cfg, jax.random.key(0))  # Init's dummy forward runs XLA.
  layout = sharding.Layout.create(sharding.MeshConfig(), devices=jax.devices()[:1])
  tokens = jnp.zeros((1, 4), jnp.int32)
  with layout.context(), pytest.raises(ValueError, match="Pallas TPU kernel.*'cpu'.*'xla'"):
    jax.jit(lambda p: model.apply(p, tokens, tokens, cfg=cfg)[0])(params)
  # Without a mesh the target is unknown while tracing: Pallas refuses when lowering.
  with pytest.raises(ValueError, match="Only interpret mode is supported on CPU"):
    jax.jit(lambda p: model.apply(p, tokens, tokens, cfg=cfg)[0])(params)


def test_trace_time_platform_choices_follow_the_context_mesh_not_the_host():
  """Under a TPU topology's mesh on this CPU host (an ahead-of-time compile), the sampler
  builds what a TPU host would: one decode segment, a bfloat16 model's cache in bfloat16,
  p·V as a matmul; without a mesh, or under a CPU mesh, XLA:CPU's choices."""
  from grpo_jax.models import kv_cache, sampling  # noqa: PLC0415

  cfg = model.tiny_config(64, dtype="bfloat16")
  scfg = sampling.SamplerConfig(max_new_tokens=256, eos_ids=(1,), pad_id=0)
  pv = (256, 4, 2, 191, 64)  # [rows, kv heads, Q, S, E]: a multiply-reduce on XLA:CPU.

  def choices():
    return (
      kernels.target_platform(),
      sampling.segment_count(scfg),
      kv_cache.cache_dtype(cfg),
      attention._pv_by_reduce(*pv),
    )

  on_host = ("cpu", 4, jnp.float32, True)
  assert choices() == on_host
  cpu = sharding.Layout.create(sharding.MeshConfig(), devices=jax.devices()[:1])
  with cpu.context():
    assert choices() == on_host
  tpu_layout = sharding.Layout.create(sharding.MeshConfig(), devices=tpu.load_topology("v5e:2x2"))
  with tpu_layout.context():
    assert choices() == ("tpu", 1, jnp.bfloat16, False)


# --- compiled for TPU ------------------------------------------------------------------


def _tpu_update(layout, cfg, B=4, T=20):
  """The compiled gradient of a loss of the model's logits over the layout's TPU mesh."""
  shardings = sharding.param_shardings(layout, cfg)
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  params = jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), params, shardings
  )
  tokens = jax.ShapeDtypeStruct((B, T), jnp.int32, sharding=layout.rows(B))

  def loss(p, tokens_BT, pos_BT):
    return jnp.mean(jax.nn.log_softmax(model.apply(p, tokens_BT, pos_BT, cfg=cfg)[0])[..., 3])

  jitted = jax.jit(jax.grad(loss), out_shardings=shardings)
  return aot.compile_function(jitted, (params, tokens, tokens), layout=layout)


GEMMA2_SCAN = dict(
  scan_layers=True, remat="full", dtype="bfloat16", qk_norm=False, attn_softcap=3.0,
  sliding_window=5, layer_types=("sliding_attention", "full_attention"),
)  # fmt: skip


@pytest.mark.parametrize(
  "overrides",
  [{}, dict(scan_layers=True, remat="full", dtype="bfloat16"), GEMMA2_SCAN],
  ids=["f32", "scan", "gemma2_windows_scan"],
)
def test_splash_compiles_for_tpu_per_device_under_the_mesh(overrides):
  """On v5e:2x2 as fsdp 2 × tensor 2: the forward and both backward kernels are Pallas
  custom calls on each device's 2 rows and 2 query heads; the XLA program has none, and
  the kernel's shard_map adds no collective (kinds and mesh axes equal XLA's)."""
  layout = sharding.Layout.create(
    sharding.MeshConfig(data=1, fsdp=2, tensor=2), devices=tpu.load_topology("v5e:2x2")
  )
  cfg = model.tiny_config(64, **overrides)
  texts = {
    impl: _tpu_update(layout, dataclasses.replace(cfg, attention_impl=impl)).as_text()
    for impl in ("splash", "xla")
  }
  assert "tpu_custom_call" not in texts["xla"]
  calls = [line for line in texts["splash"].splitlines() if '"tpu_custom_call"' in line]
  names = {re.match(r"\s*(?:ROOT )?%(splash_mha_\w+?)[.\d]* =", c).group(1) for c in calls}
  assert names == {
    "splash_mha_fwd_segmented_residuals",
    "splash_mha_dq_segmented_no_residuals",
    "splash_mha_dkv_segmented_no_residuals",
  }
  dt = "bf16" if overrides else "f32"
  out = next(c for c in calls if "splash_mha_fwd" in c)
  assert f"{dt}[2,2,128,16]" in out  # [rows, heads, T padded to 128, head_dim] per device.
  kinds = lambda text: {(c.kind, c.axes) for c in hlo.collectives(text, layout.mesh)}
  assert kinds(texts["splash"]) == kinds(texts["xla"])


@pytest.mark.parametrize("scan", [False, True])
def test_splash_with_gemma_windows_and_soft_caps_equals_the_xla_model(scan):
  """A Gemma-2-shaped tiny model (a 5-token window on alternate layers, attention and final
  soft-caps) through splash (interpreted): splash's LocalMask and soft-cap, picked per
  layer by lax.cond under nn.scan, give the XLA path's logits and gradients, left- and
  right-padded rows included."""
  cfg = model.tiny_config(
    64, qk_norm=False, norm_offset=1.0, post_norms=True, embed_scale=True,
    activation="gelu_tanh", query_pre_attn_scalar=24.0, attn_softcap=3.0, final_softcap=10.0,
    sliding_window=5, layer_types=("sliding_attention", "full_attention"), scan_layers=scan,
  )  # fmt: skip
  params = model.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (3, 20), 0, 64)
  mask = np.ones((3, 20), bool)
  mask[0, :6], mask[1, 15:] = False, False
  pos = model.positions_from_mask(jnp.asarray(mask))

  def run(c):
    f = lambda p: model.apply(p, tokens, pos, cfg=c)[0]
    loss = lambda p: jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(f(p)), 0)[..., 3])
    return jax.jit(f)(params), jax.jit(jax.grad(loss))(params)

  (logits_x, grads_x) = run(cfg)
  (logits_s, grads_s) = run(dataclasses.replace(cfg, attention_impl="splash_interpret"))
  np.testing.assert_allclose(logits_s, logits_x, atol=2e-5)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5 * np.abs(b).max()), grads_s, grads_x
  )
  # Without the window the XLA logits move: the window bites at T = 20.
  wide = run(dataclasses.replace(cfg, sliding_window=0, layer_types=()))[0]
  assert float(jnp.abs(wide - logits_x).max()) > 1e-2
