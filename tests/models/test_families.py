"""Model families beyond Llama and Qwen in the model itself: sliding windows, soft-caps,
Gemma's norms and rope per layer type, in the attention math (pinned by hand), in every
sampler (equal to the teacher-forced forward token for token), and in the records
(`models/families.py`). The logits against transformers are tests/models/test_hf.py's."""

import dataclasses
import functools
import json

import cheap_compile
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import subproc

from grpo_jax.models import attention, families, logprobs, model, paged, refill, sampling


def test_window_mask_pinned_by_hand():
  """A query at position 3 with a window of 2 sees keys at 2 and 3 only; padding (−1) and
  keys after it never; no window: keys 0..3."""
  q_pos = jnp.asarray([[[[3]]]])
  key_pos = jnp.asarray([[[[0, 1, 2, 3, 4, -1]]]])
  np.testing.assert_array_equal(attention._visible(q_pos, key_pos, 2)[0, 0, 0], [0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(attention._visible(q_pos, key_pos)[0, 0, 0], [1, 1, 1, 1, 0, 0])


def test_softcapped_attention_pinned_by_hand():
  """One query, scores 4 and 0, cap 2: weights softmax(2·tanh(2), 0) = (0.87303, 0.12697)
  on values (1, 0) and (0, 1); without the cap softmax(4, 0) = (0.98201, 0.01799)."""
  q = jnp.asarray([1.0, 0.0]).reshape(1, 1, 1, 2)
  keys = jnp.asarray([[4.0, 0.0], [0.0, 0.0]]).T.reshape(1, 1, 2, 2)  # [B, K, E, S]
  values = jnp.eye(2).reshape(1, 1, 2, 2)  # [B, K, S, E]
  pos_q, pos_k = jnp.asarray([[1]]), jnp.asarray([[0, 1]])
  kw = dict(dtype=jnp.float32)
  capped = attention.attend(q, pos_q, keys, values, pos_k, softcap=2.0, **kw)
  np.testing.assert_allclose(capped.reshape(2), [0.87303, 0.12697], atol=1e-5)
  plain = attention.attend(q, pos_q, keys, values, pos_k, **kw)
  np.testing.assert_allclose(plain.reshape(2), [0.98201, 0.01799], atol=1e-5)
  # A window of 1 leaves the query its own key (position 1): all weight on value (0, 1).
  own = attention.attend(q, pos_q, keys, values, pos_k, window=1, softcap=2.0, **kw)
  np.testing.assert_allclose(own.reshape(2), [0.0, 1.0], atol=1e-6)


def test_gemma_norm_and_final_softcap_pinned_by_hand():
  """RMSNorm with offset 1: x / rms(x) · (1 + w); logits 5·tanh(z / 5)."""
  x = jnp.asarray([[3.0, 4.0]])
  norm = model.layers.RMSNorm(eps=0.0, dtype=jnp.float32, param_dtype=jnp.float32, offset=1.0)
  y = norm.apply({"params": {"scale": jnp.asarray([0.5, -1.0])}}, x)
  rms = np.sqrt((9 + 16) / 2)
  np.testing.assert_allclose(y[0], [3 / rms * 1.5, 0.0], rtol=1e-6)
  cfg = model.tiny_config(8, final_softcap=5.0)
  z = jnp.asarray([[[10.0, -1.0, 0.0, 2.0, 0.5, 100.0, -100.0, 4.0]]])
  np.testing.assert_allclose(
    model.layers._finish_logits(cfg, z), 5.0 * np.tanh(np.asarray(z) / 5.0), rtol=1e-6
  )


# Tiny shapes of each windowed family, on the arithmetic tokenizer: windows of 3 tokens
# against prompts of up to 8 and 10 new tokens, so every window bites.
_GEMMA = dict(
  activation="gelu_tanh", norm_offset=1.0, post_norms=True, embed_scale=True, qk_norm=False,
  query_pre_attn_scalar=24.0, sliding_window=3,
)  # fmt: skip
SHAPES = {
  "gemma2": dict(
    _GEMMA, attn_softcap=3.0, final_softcap=8.0, layer_types=("sliding_attention", "full_attention")
  ),
  "gemma3": dict(
    _GEMMA, qk_norm=True, n_layers=3, rope_local_theta=50.0,
    layer_types=("sliding_attention", "sliding_attention", "full_attention"),
  ),
  "mistral": dict(qk_norm=False, sliding_window=3, n_heads=8, n_kv_heads=2),
  "qwen3_moe": dict(n_experts=4, experts_per_token=2, expert_mlp_dim=32, expert_weights_normalized=True),
}  # fmt: skip


def _policy(tokenizer, shape: str, **overrides):
  cfg = model.tiny_config(tokenizer.vocab_size, **{**SHAPES[shape], **overrides})
  params = model.init(cfg, jax.random.key(1))
  # Peaked, input-dependent logits so that equality tests bite (Gemma's √d is 8 already).
  if not cfg.embed_scale:
    params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0
  return cfg, params


def _rollouts(cfg, params, sampler_cfg, tokenizer, *, refill_slots=0):
  texts = ["Q:12+7\n", "Q:3-45\n", "Q:9+9\n"]
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(t, add_bos=True) for t in texts], cfg=sampler_cfg
  )
  if refill_slots:
    fn = refill.make_policy_sampler(cfg, sampler_cfg, slots=refill_slots)
  elif sampler_cfg.kv_layout == "paged":
    fn = paged.make_policy_sampler(cfg, sampler_cfg)
  else:
    fn = sampling.make_policy_sampler(cfg, sampler_cfg)
  return fn(params, prompts, jax.random.key(0), sampling.sampling_params(temperature=1.2))


def _teacher_forced(params, rollouts, cfg):
  tf = functools.partial(logprobs.teacher_forced_logprobs, model_fn=model.make_model_fn(cfg))
  return cheap_compile.jit(tf)(params, rollouts)


@pytest.mark.parametrize(
  ("shape", "scan", "shared", "refill_slots"),
  [
    ("gemma2", False, False, 0),
    ("gemma2", True, True, 0),
    ("gemma3", False, True, 0),
    ("gemma3", True, False, 5),
    ("mistral", False, True, 0),
    ("mistral", False, False, 5),
    ("qwen3_moe", False, True, 0),
    ("qwen3_moe", True, False, 5),
    ("gemma2", False, True, "paged"),  # Window rings on pages, soft-capped.
    ("qwen3_moe", False, True, "paged"),
  ],
)
def test_windowed_samplers_equal_the_teacher_forced_forward(
  tokenizer, sampler_cfg, shape, scan, shared, refill_slots
):
  """Each sampler's policy log-probs (prefill, decode over the cache, a group-shared
  prompt, the refill sampler's per-row slots, the paged cache's pages of 2 slots and
  window rings; scanned and unrolled layers) are the teacher-forced forward's, which a window changes:
  the windows bite."""
  cfg, params = _policy(tokenizer, shape, scan_layers=scan)
  scfg = dataclasses.replace(sampler_cfg, shared_prefix=shared, decode_segments=2)
  if refill_slots == "paged":
    scfg, refill_slots = dataclasses.replace(scfg, kv_layout="paged", page_size=2), 0
  r = _rollouts(cfg, params, scfg, tokenizer, refill_slots=refill_slots)
  tf_NT = _teacher_forced(params, r, cfg)
  assert int(r.mask_NT.sum()) > 40
  assert float(jnp.max(jnp.abs(jnp.where(r.mask_NT, tf_NT - r.policy_logp_NT, 0.0)))) <= 2e-5
  if cfg.n_experts:  # Routing changes with the rows a call holds; the sampler still equals.
    return
  tf_wide = _teacher_forced(params, r, dataclasses.replace(cfg, sliding_window=0, layer_types=()))
  assert float(jnp.max(jnp.abs(jnp.where(r.mask_NT, tf_wide - tf_NT, 0.0)))) > 1e-2


def test_records_name_their_families_and_match_configs():
  c = lambda **kw: model.tiny_config(32, **kw)
  assert families.of_model(c()).name == "qwen3"
  assert families.of_model(c(qk_norm=False)).name == "llama"
  assert families.of_model(c(qk_norm=False, sliding_window=4)).name == "mistral"
  gemma = dict(norm_offset=1.0, post_norms=True, embed_scale=True, activation="gelu_tanh")
  assert families.of_model(c(qk_norm=False, **gemma)).name == "gemma2"
  assert families.of_model(c(**gemma, rope_local_theta=1e4, sliding_window=2)).name == "gemma3_text"
  for bad in (dict(qk_norm=False, attn_softcap=5.0), dict(activation="gelu_tanh")):
    with pytest.raises(ValueError, match="no Hugging Face architecture"):
      families.of_model(c(**bad))
  assert families.layer_types(families.GEMMA3, {}, 7) == ("sliding_attention",) * 5 + (
    "full_attention",
    "sliding_attention",
  )
  assert families.layer_types(families.GEMMA2, {"sliding_window_pattern": 3}, 3)[-1] == (
    "full_attention"
  )
  assert families.layer_types(families.MISTRAL, {}, 3) == ()
  assert families.of_config({"architectures": ["Gemma2ForCausalLM"]}) is families.GEMMA2


@pytest.mark.parametrize(
  ("change", "message"),
  [
    (dict(activation="relu"), "model.activation|activation='relu'"),
    (dict(norm_offset=0.5), "norm_offset=0.5"),
    (dict(sliding_window=-1), "sliding_window=-1"),
    (dict(layer_types=("full_attention",)), "one of .* per layer"),
    (dict(layer_types=("sliding_attention", "full_attention")), "sliding_window is 0"),
    (dict(attn_softcap=-1.0), "attn_softcap=-1.0 must be >= 0"),
  ],
)
def test_bad_family_features_are_clear_errors(change, message):
  with pytest.raises(ValueError, match=message):
    model.tiny_config(32, **change)


TPU_SHAPES = {
  "gemma3": dict(
    SHAPES["gemma3"], n_layers=2, attn_softcap=20.0, final_softcap=15.0, scan_layers=True,
    layer_types=("sliding_attention", "full_attention"),
  ),
  "qwen3_moe_megablox": dict(
    SHAPES["qwen3_moe"], n_layers=2, scan_layers=True, moe_impl="megablox"
  ),
  "qwen3_moe_expert_axis": dict(SHAPES["qwen3_moe"], n_layers=2, scan_layers=True),
  "qwen3_moe_megablox_expert_axis": dict(
    SHAPES["qwen3_moe"], n_layers=2, scan_layers=True, moe_impl="megablox"
  ),
}  # fmt: skip
# Expert parallelism on the `expert` mesh axis: the 4 experts over the 4 chips of v5e:2x2
# (through ragged_dot, XLA's partitioner), or 2 a chip over expert=2 × fsdp=2 (megablox,
# `moe._expert_parallel`: its group_offset).
TPU_MESHES = {
  "qwen3_moe_expert_axis": dict(expert=4, fsdp=-1),
  "qwen3_moe_megablox_expert_axis": dict(expert=2, fsdp=-1),
}


@pytest.mark.parametrize("shape", list(TPU_SHAPES))
def test_new_families_compile_for_tpu_with_their_update_checks_passing(shape, tpu_compiled_once):
  """The quick config with Gemma 3's features (per-layer windows and rope under nn.scan,
  soft-caps, sandwich norms), or a Qwen3-MoE-shaped policy on the megablox kernel (per
  device in a shard_map) with its balance loss and routing replay (the sampler records
  routes, the update replays them), or that policy with its experts over the `expert`
  mesh axis (mesh.expert=4: one expert a chip, the batch split over it; or 2 a chip on
  megablox over mesh.expert=2, each chip's kernel over its own experts' groups), compiles for
  v5e:2x2: its update keeps the train state sharded like the parameters and aliased, with
  no host callback (`aot.check_update`), and its sampler compiles too."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415
  from grpo_jax.trainer import aot, steps  # noqa: PLC0415 (libtpu is loaded only here)

  c = config_lib.load("configs/arithmetic.py:quick")
  c.model.update(TPU_SHAPES[shape])
  c.mesh.update(TPU_MESHES.get(shape, {}))
  if shape.startswith("qwen3_moe"):  # With routing replay: the routes in the batch.
    c.rl.moe_balance_coef, c.rl.routing_replay = 0.01, True
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(c, target)
  fns = steps.functions_on(setup, target.devices)
  if shape in TPU_MESHES:  # [layers, X, D, F]: the experts over `expert`, X / expert a chip.
    cfg = setup.model_cfg
    gate = fns.param_shardings["layers"]["mlp"]["gate"]
    whole = (cfg.n_layers, cfg.n_experts, cfg.d_model, cfg.expert_mlp_dim)
    per_chip = cfg.n_experts // TPU_MESHES[shape]["expert"]
    assert gate.spec[1] == ("expert", "tensor") and gate.shard_shape(whole)[1] == per_chip
    assert fns.layout.batch_axes == ("data", "fsdp", "expert")
  args = aot.abstract_arguments(setup, fns)
  update, update_args = args["update"]
  assert aot.check_update(aot.compile_function(update, update_args), update, update_args[0]) == []
  sample, sample_args = args["sample"]
  compiled = aot.compile_function(sample, sample_args)
  assert compiled.memory_analysis().temp_size_in_bytes > 0
  if setup.rl_cfg.routing_replay:
    routes = compiled.out_info.routes_NTLK
    assert routes.shape[2:] == (2, 2) and routes.dtype == jnp.int8
    assert update_args[1].routes_NTLK.shape == routes.shape


@pytest.mark.parametrize(
  ("name", "family", "billions"),
  [
    ("mistral-7b", "mistral", 7.2417),
    ("gemma-2-2b", "gemma2", 2.6143),
    ("gemma-2-9b", "gemma2", 9.2417),
    ("gemma-3-1b", "gemma3_text", 0.99989),
    ("gemma-3-4b", "gemma3_text", 3.8803),
    ("qwen3-30b-a3b", "qwen3_moe", 30.532),
  ],
)
def test_built_in_shapes_of_the_new_families_have_their_published_sizes(name, family, billions):
  """Parameter counts of the published checkpoints (Mistral-7B-v0.1 7.24B; Gemma 2 2.61B
  and 9.24B; Gemma 3 1B 1.00B; Gemma 3 4B's text model 3.88B of its 4.3B; Qwen3-30B-A3B
  30.5B, of which a token goes through 3.04B matmul parameters: its "A3B")."""
  from grpo_jax.models import shapes  # noqa: PLC0415

  cfg = shapes.model_config(name)
  params = jax.eval_shape(lambda: model.init(cfg, jax.random.key(0)))
  assert families.of_model(cfg).name == family
  assert sum(x.size for x in jax.tree.leaves(params)) / 1e9 == pytest.approx(billions, rel=1e-4)
  if cfg.n_experts:
    from grpo_jax.infra import flops  # noqa: PLC0415

    assert flops.matmul_params(cfg) / 1e9 == pytest.approx(3.0417, rel=1e-4)


def _moe_reference(x_ND, router_DX, gate_XDF, up_XDF, down_XFD, *, k, normalized):
  """Every expert on every token (numpy, float64), then the top-k of softmax mixed."""
  x = np.asarray(x_ND, np.float64)
  logits = x @ np.asarray(router_DX, np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  out = np.zeros_like(x)
  silu = lambda z: z / (1 + np.exp(-z))
  for n in range(x.shape[0]):
    top = np.argsort(-p[n])[:k]
    w = p[n, top] / (p[n, top].sum() if normalized else 1.0)
    for e, we in zip(top, w):
      h = silu(x[n] @ gate_XDF[e]) * (x[n] @ up_XDF[e])
      out[n] += we * (h @ down_XFD[e])
  return out


@pytest.mark.parametrize("normalized", [False, True])
def test_moe_layer_equals_every_expert_computed_densely(normalized):
  """The grouped-matmul MoE (`layers.MoeMlp`) equals the dense definition: each token's
  top-2 of 4 experts by softmax(x·W_r), weighted (renormalised or not)."""
  cfg = model.tiny_config(
    32, n_experts=4, experts_per_token=2, expert_mlp_dim=8, expert_weights_normalized=normalized
  )
  layer = model.layers.MoeMlp(cfg)
  x_BTD = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  variables = flax.linen.unbox(layer.init(jax.random.key(1), x_BTD))
  got = layer.apply(variables, x_BTD)
  p = variables["params"]
  want = _moe_reference(
    x_BTD.reshape(10, -1), p["router"]["kernel"], p["gate"], p["up"], p["down"], k=2,
    normalized=normalized,
  )  # fmt: skip
  np.testing.assert_allclose(np.asarray(got).reshape(10, -1), want, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("axis", ["expert", "tensor", "megablox"])
def test_expert_parallel_on_4_devices_equals_one_device(axis):
  """Experts split over 4 CPU devices (2 each): on the mesh axis `expert` (mesh.expert=4,
  the default rules: the batch's rows split over it too), and on `tensor` (the rules
  table's "expert" row's second axis, heads and MLP whole). The logits and every gradient
  equal one device's, and no expert weight is all-gathered (XLA partitions the grouped
  matmuls by expert): on `tensor` no float is gathered, on `expert` only the routing
  weights [B·T, X] of each of the 2 layers (f32[48, 8], seen in the compiled text). On
  megablox (interpreted) over expert=2 × tensor=2, each device runs the kernel over its
  own 2 experts' groups (`moe._expert_parallel`), and the floats gathered are, per layer,
  those routing weights, the tokens f32[48, 64] and their top-2 weights f32[48, 2] (the
  two expert devices' rows: a device's experts may take any of them)."""
  r = subproc.run(["tests/moe_mesh_run.py", axis], devices=4, timeout=300)
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["devices"] == 4 and out["gate_shard"] == [2, 64, 24]
  assert out["logits"] <= 1e-5 and out["grads"] <= 1e-6 < out["grad_gate_absmax"]
  assert out["expert_weight_gathers"] == 0
  assert out["float_all_gathers"] == {"expert": 2, "tensor": 0, "megablox": 6}[axis]
  assert out["batch_axes"] == ["data", "fsdp", "expert"]


def test_a_mistral_bodied_mixture_of_experts_trains_under_grpo_with_lora_replaying_its_routes(
  tmp_path,
):
  """Two GRPO iterations of the quick config with a Mixtral-shaped policy: Mistral's body
  (every layer sliding, window 3, no q/k norm, 8 query heads on 2 kv heads) with
  Qwen3-MoE's experts (4, top 2, weights renormalised); LoRA on q, k, v, o,
  rl.moe_balance_coef, and the routes of a bfloat16 sampler replayed (rl.routing_replay,
  π_old's forward in two slices): each iteration logs the balance loss, between its floor
  k = 2 and X = 4, the sampler/trainer mismatch and the share of replayed routes the
  update's router would not have taken. So Mistral's window and the experts both train
  under GRPO and LoRA. (Full fine-tuning of a mixture of experts learns in
  test_moe_learning.py; Gemma 2 with LoRA in test_lora_learning.py; Gemma 3 with LoRA in
  test_paged.py's trainer run.)"""
  import runs  # noqa: PLC0415

  from grpo_jax.trainer import train  # noqa: PLC0415

  c = runs.small_arithmetic()
  c.model.update(**SHAPES["mistral"], **SHAPES["qwen3_moe"])
  assert c.model.sliding_window == 3 and not c.model.qk_norm
  c.model.lora.update(rank=4, alpha=8.0, targets=("q", "k", "v", "o"))
  c.update(prompts_per_step=4, iterations=2, warmstart_steps=2, warmstart_batch=8)
  c.update(eval_every=2, eval_size=8, eval_samples=0, checkpoint_every=2, reward_workers=0)
  c.update(progress=False, tensorboard=False)
  c.rl.moe_balance_coef = 0.01
  c.rl.routing_replay, c.sampler.dtype, c.rl.logprob_batches = True, "bfloat16", 2
  train.run(c, tmp_path, log=lambda _: None)
  steps = [r for r in runs.lines(tmp_path) if "moe_balance" in r]
  assert len(steps) == 2
  assert all(2.0 <= r["moe_balance"] <= 4.0 for r in steps), steps
  assert all(0.0 <= r["offpolicy/mismatch_k3"] < 0.05 for r in steps), steps
  assert all(0.0 <= r["route_flip_frac"] < 0.5 for r in steps), steps  # Replay changed some.


def test_a_balance_loss_on_a_dense_model_is_a_clear_error():
  import runs  # noqa: PLC0415

  from grpo_jax.trainer import build  # noqa: PLC0415

  c = runs.small_arithmetic()
  c.rl.moe_balance_coef = 0.01
  with pytest.raises(ValueError, match="needs a mixture-of-experts model"):
    build.build(c)


def test_the_megablox_grouped_matmul_equals_ragged_dot_forward_and_backward():
  """model.moe_impl="megablox_interpret" (the Pallas TPU kernel, interpreted on CPU) gives
  the "xla" path's (jax.lax.ragged_dot) outputs and gradients, rows not a multiple of
  its tile included."""
  base = dict(SHAPES["qwen3_moe"], n_layers=1)
  xla_cfg = model.tiny_config(32, **base)
  mb_cfg = model.tiny_config(32, **base, moe_impl="megablox_interpret")
  params = model.init(xla_cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (3, 7), 0, 32)
  positions = jnp.broadcast_to(jnp.arange(7), (3, 7))

  def loss(p, cfg):
    logits, _ = model.apply(p, tokens, positions, cfg=cfg)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 1]), logits

  grad = cheap_compile.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (_, want), g_want = grad(params, xla_cfg)
  (_, got), g_got = grad(params, mb_cfg)
  np.testing.assert_allclose(got, want, atol=2e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5), g_got, g_want)
  assert float(jnp.abs(g_want["layer_0"]["mlp"]["gate"]).max()) > 1e-3


def test_megablox_under_a_cpu_mesh_is_an_error_naming_the_way_out():
  """The shared Pallas platform check (`kernels.check_platform`) names the MoE setting."""
  from grpo_jax.models import sharding  # noqa: PLC0415

  cfg = model.tiny_config(32, **SHAPES["qwen3_moe"], moe_impl="megablox")
  params = model.init(cfg, jax.random.key(0))  # Init's dummy forward runs XLA.
  layout = sharding.Layout.create(sharding.MeshConfig(), devices=jax.devices()[:1])
  tokens = jnp.zeros((1, 4), jnp.int32)
  with (
    layout.context(),
    pytest.raises(ValueError, match="moe_impl='megablox' runs a Pallas TPU kernel.*'cpu'.*"
                  "'megablox_interpret'"),
  ):  # fmt: skip
    jax.jit(lambda p: model.apply(p, tokens, tokens, cfg=cfg)[0])(params)
