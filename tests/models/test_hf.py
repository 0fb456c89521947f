"""Hugging Face checkpoint import/export against the committed fixtures (no torch needed).

The fixtures (tests/fixtures/make_hf_fixtures.py) hold tiny random Llama 3.1, Qwen2, Qwen3,
Mistral, Gemma 2, Gemma 3 and Qwen3-MoE checkpoints with reference logits from transformers' torch
forward (eager attention, float32).
"""

import dataclasses
import importlib.util
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from grpo_jax.models import attention, hf, model
from tests import subproc

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "qwen3_moe")
MODEL_TYPE = {"gemma3": "gemma3_text"}  # Fixture directory -> its family's name.
TOL = 1e-4  # Max abs logit difference, float32 (the bar).


def _logits(params, cfg, d):
  ref = np.load(d / "expected.npz")
  mask = ref["attention_mask"]
  logits, _ = model.apply(
    params,
    jnp.asarray(ref["input_ids"]),
    model.positions_from_mask(jnp.asarray(mask)),
    cfg=cfg,
  )
  keep = mask.astype(bool)
  return np.asarray(logits)[keep], ref["logits"][keep]


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers(arch, scan):
  d = FIXTURES / arch
  cfg = hf.model_config(hf.read_config(d), scan_layers=scan)
  ours, ref = _logits(hf.load_params(d, cfg), cfg, d)
  assert np.abs(ours - ref).max() <= TOL
  assert np.abs(ref).max() > 1.0  # Peaked logits: the comparison bites.


def test_config_mapping():
  llama = hf.model_config(hf.read_config(FIXTURES / "llama"))
  assert (llama.rope_scaling, llama.rope_factor, llama.rope_original_max_len) == ("llama3", 8.0, 16)
  assert (llama.tie_embeddings, llama.attn_bias, llama.qk_norm) == (False, False, False)
  qwen2 = hf.model_config(hf.read_config(FIXTURES / "qwen2"))
  assert (qwen2.tie_embeddings, qwen2.attn_bias, qwen2.qk_norm) == (True, True, False)
  assert (qwen2.vocab_size, qwen2.rope_theta) == (384, 1e6)
  qwen3 = hf.model_config(hf.read_config(FIXTURES / "qwen3"))
  assert (qwen3.qk_norm, qwen3.attn_bias, qwen3.head_dim, qwen3.d_model) == (True, False, 16, 32)


def test_config_mapping_of_windowed_and_gemma_families():
  mistral = hf.model_config(hf.read_config(FIXTURES / "mistral"))
  assert (mistral.sliding_window, mistral.layer_types, mistral.sliding_layers) == (
    5,
    (),
    (True,) * 2,
  )
  assert (mistral.n_heads, mistral.n_kv_heads, mistral.head_dim, mistral.tie_embeddings) == (
    8, 2, 16, False,
  )  # fmt: skip
  assert (mistral.activation, mistral.norm_offset, mistral.post_norms) == ("silu", 0.0, False)
  g2 = hf.model_config(hf.read_config(FIXTURES / "gemma2"))
  assert (g2.activation, g2.norm_offset, g2.post_norms, g2.embed_scale) == (
    "gelu_tanh",
    1.0,
    True,
    True,
  )
  assert (g2.query_pre_attn_scalar, g2.attn_softcap, g2.final_softcap) == (24.0, 2.0, 5.0)
  assert (g2.sliding_window, g2.sliding_layers, g2.qk_norm) == (4, (True, False) * 2, False)
  g3 = hf.model_config(hf.read_config(FIXTURES / "gemma3"))
  assert g3.sliding_layers == (True,) * 5 + (False,) and g3.sliding_window == 3
  assert (g3.qk_norm, g3.attn_softcap, g3.final_softcap, g3.n_kv_heads) == (True, 0.0, 0.0, 1)
  assert (g3.rope_theta, g3.rope_scaling, g3.rope_factor, g3.rope_local_theta) == (
    1e6, "linear", 8.0, 1e4,
  )  # fmt: skip
  assert [hf.arch_for(c) for c in (mistral, g2, g3)] == ["mistral", "gemma2", "gemma3_text"]
  assert hf.arch_for(dataclasses.replace(mistral, sliding_window=0)) == "llama"


def test_config_mapping_of_a_mixture_of_experts():
  c = hf.read_config(FIXTURES / "qwen3_moe")
  moe = hf.model_config(c)
  assert (moe.n_experts, moe.experts_per_token, moe.expert_mlp_dim) == (8, 2, 24)
  assert moe.expert_weights_normalized and moe.qk_norm and hf.arch_for(moe) == "qwen3_moe"
  # The hub's configs (transformers 4) say num_experts.
  t4 = {k: v for k, v in c.items() if k != "num_local_experts"} | {"num_experts": 8}
  assert hf.model_config(t4) == moe
  with pytest.raises(hf.CheckpointError, match="only every layer sparse"):
    hf.model_config(dict(c, mlp_only_layers=[1]))
  with pytest.raises(ValueError, match="experts take no adapters"):
    hf.model_config(c, lora=dict(rank=4))
  assert hf.model_config(c, lora=dict(rank=4, targets=("q", "v"))).lora.enabled


def test_gemma_configs_written_by_transformers4_read_the_same():
  """Hub configs of Gemma 3 carry rope_local_base_freq, rope_scaling and
  sliding_window_pattern (no layer_types); Gemma 2's carry no pattern at all (every
  second layer full)."""
  c = hf.read_config(FIXTURES / "gemma3")
  c.pop("rope_parameters"), c.pop("layer_types")
  c.update(
    rope_theta=1e6,
    rope_local_base_freq=1e4,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
    sliding_window_pattern=6,
  )
  assert hf.model_config(c) == hf.model_config(hf.read_config(FIXTURES / "gemma3"))
  c = hf.read_config(FIXTURES / "gemma2")
  c.pop("layer_types")
  assert hf.model_config(c) == hf.model_config(hf.read_config(FIXTURES / "gemma2"))


@pytest.mark.parametrize(
  ("arch", "change"),
  [
    ("mistral", dict(sliding_window=0)),
    ("gemma2", dict(sliding_window=0, layer_types=())),
    ("gemma2", dict(attn_softcap=0.0)),
    ("gemma2", dict(final_softcap=0.0)),
    ("gemma2", dict(query_pre_attn_scalar=0.0)),
    ("gemma2", dict(embed_scale=False)),
    ("gemma2", dict(activation="silu")),
    ("gemma2", dict(norm_offset=0.0)),
    ("gemma3", dict(rope_local_theta=0.0)),
    ("gemma3", dict(layer_types=("sliding_attention",) * 6)),
  ],
)
def test_each_family_feature_moves_the_logits_past_the_tolerance(arch, change):
  """Every feature a record switches on is exercised by its fixture: without it the
  logits leave transformers' by far more than the tolerance."""
  d = FIXTURES / arch
  cfg = hf.model_config(hf.read_config(d))
  ours, ref = _logits(hf.load_params(d, cfg), dataclasses.replace(cfg, **change), d)
  assert np.abs(ours - ref).max() > 100 * TOL


def test_transformers4_rope_keys_read_the_same():
  """Hub configs written by transformers 4 carry rope_theta + rope_scaling at top level."""
  c = hf.read_config(FIXTURES / "llama")
  rope = dict(c.pop("rope_parameters"))
  c["rope_theta"] = rope.pop("rope_theta")
  c["rope_scaling"] = rope
  assert hf.model_config(c) == hf.model_config(hf.read_config(FIXTURES / "llama"))


def test_llama3_rope_scaling_matters_and_matches_by_hand():
  """Dropping the scaling moves the logits far past the tolerance; ω pinned by hand."""
  d = FIXTURES / "llama"
  cfg = hf.model_config(hf.read_config(d))
  params = hf.load_params(d, cfg)
  ours, ref = _logits(params, dataclasses.replace(cfg, rope_scaling="none"), d)
  assert np.abs(ours - ref).max() > 100 * TOL
  # head_dim 8, theta 5e5, N=16, factor 8, l=1, h=4: wavelengths 2π·theta^(2i/8).
  inv = 5e5 ** (-np.arange(0, 8, 2) / 8)
  # Wavelengths 2π/ω = [6.28, 167, 4443, 1.2e5]: the first lies between N/h = 4 and
  # N/l = 16 (smoothed), the others above N/l (divided by the factor).
  wavelen = 2 * np.pi / inv
  s0 = (16 / wavelen[0] - 1) / 3
  expected = np.array([(1 - s0) * inv[0] / 8 + s0 * inv[0], *(inv[1:] / 8)])
  np.testing.assert_allclose(attention.rope_inv_freq(cfg), expected, rtol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_round_trip_identical(arch, tmp_path):
  d = FIXTURES / arch
  base = hf.read_config(d)
  cfg = hf.model_config(base)
  params = hf.load_params(d, cfg)
  out = hf.export(
    params,
    cfg,
    tmp_path / "out",
    arch=MODEL_TYPE.get(arch, arch),
    dtype="float32",
    base_config=base,
    tokenizer_dir=d,
  )
  cfg2 = hf.model_config(hf.read_config(out))
  assert cfg2 == cfg
  again = hf.load_params(out, cfg2)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, again
  )
  # The same tensor names and shapes as the transformers checkpoint.
  src = {n: e.shape for n, e in hf.tensor_index(d).items()}
  if cfg.tie_embeddings:
    src.pop("lm_head.weight", None)
  assert {n: e.shape for n, e in hf.tensor_index(out).items()} == src
  assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()


def test_round_trip_bfloat16_sharded_files(tmp_path):
  """bfloat16 params export and re-import bit for bit, through several shard files and
  the scanned layout."""
  d = FIXTURES / "qwen3"
  cfg = hf.model_config(hf.read_config(d), param_dtype="bfloat16", scan_layers=True)
  params = hf.load_params(d, cfg)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  out = hf.export(params, cfg, tmp_path / "out", arch="qwen3", max_shard_bytes=20_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  assert len(set(index["weight_map"].values())) > 2
  assert all(e.dtype == "BF16" for e in hf.tensor_index(out).values())
  again = hf.load_params(out, cfg)
  jax.tree.map(
    lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, again
  )


def test_safetensors_reader_pins_bytes(tmp_path):
  """The writer's layout is the safetensors format: 8-byte header size, JSON, raw data."""
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  b = np.array([1.5, -2.0], ml_dtypes.bfloat16)
  path = tmp_path / "x.safetensors"
  shapes = {"a": ((2, 3), np.float32), "b": ((2,), ml_dtypes.bfloat16)}
  hf.write_safetensors(path, [("a", a), ("b", b)], shapes=shapes)
  raw = path.read_bytes()
  n = int(np.frombuffer(raw[:8], "<u8")[0])
  header = json.loads(raw[8 : 8 + n])
  assert header["a"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}
  assert header["b"] == {"dtype": "BF16", "shape": [2], "data_offsets": [24, 28]}
  assert n % 8 == 0 and len(raw) == 8 + n + 28
  assert raw[8 + n + 24 :] == b"\xc0\x3f\x00\xc0"  # bf16 1.5 = 0x3fc0, -2.0 = 0xc000.
  index = hf.tensor_index(tmp_path)
  np.testing.assert_array_equal(hf.read_tensor(index["a"]), a)
  np.testing.assert_array_equal(hf.read_tensor(index["b"]), b)


# ----------------------------------------------------------------------------
# Bad input: each error names the file and what was expected.
# ----------------------------------------------------------------------------


def _copy(tmp_path, arch="qwen2"):
  d = tmp_path / arch
  shutil.copytree(FIXTURES / arch, d)
  return d


def _rewrite(path, drop=(), reshape=None):
  index = hf.tensor_index(path.parent)
  kept = {n: hf.read_tensor(e) for n, e in index.items() if n not in drop}
  if reshape:
    kept[reshape] = kept[reshape][:-1]
  hf.write_safetensors(
    path, list(kept.items()), shapes={n: (x.shape, x.dtype) for n, x in kept.items()}
  )


def test_missing_tensor_names_it(tmp_path):
  d = _copy(tmp_path)
  _rewrite(d / "model.safetensors", drop=["model.layers.1.mlp.up_proj.weight"])
  with pytest.raises(hf.CheckpointError, match=r"missing tensors \['model.layers.1.mlp.up_proj"):
    hf.load_params(d, hf.model_config(hf.read_config(d)))


def test_wrong_shape_names_tensor_file_and_shapes(tmp_path):
  d = _copy(tmp_path)
  _rewrite(d / "model.safetensors", reshape="model.layers.0.self_attn.k_proj.weight")
  with pytest.raises(
    hf.CheckpointError,
    match=r"k_proj.weight in model.safetensors: shape \[15, 32\], expected \[16, 32\]",
  ):
    hf.load_params(d, hf.model_config(hf.read_config(d)))


def test_unsupported_architecture_lists_supported(tmp_path):
  c = hf.read_config(FIXTURES / "llama")
  c["architectures"] = ["MixtralForCausalLM"]
  with pytest.raises(hf.CheckpointError, match=r"'MixtralForCausalLM'.*LlamaForCausalLM.*Qwen3"):
    hf.model_config(c)
  for key, value, msg in [
    ("attention_bias", True, "o"),
    ("hidden_act", "gelu", "gelu"),
    ("rope_parameters", {"rope_type": "yarn", "factor": 4.0}, "yarn"),
  ]:
    bad = dict(c, architectures=["LlamaForCausalLM"], **{key: value})
    with pytest.raises(hf.CheckpointError, match=msg):
      hf.model_config(bad)


def test_missing_files_are_named(tmp_path):
  with pytest.raises(hf.CheckpointError, match="config.json"):
    hf.read_config(tmp_path)
  with pytest.raises(hf.CheckpointError, match=r"no \*.safetensors"):
    hf.tensor_index(tmp_path)
  d = _copy(tmp_path, "llama")
  (d / "model-00002-of-00004.safetensors").unlink()
  with pytest.raises(hf.CheckpointError, match="model-00002-of-00004.safetensors"):
    hf.tensor_index(d)
  (tmp_path / "junk").mkdir()
  (tmp_path / "junk" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json")
  with pytest.raises(hf.CheckpointError, match="junk/model.safetensors: not a safetensors file"):
    hf.tensor_index(tmp_path / "junk")


def test_sharded_import_places_each_shard():
  """On a (1, 4, 2) mesh of forced CPU devices every param lands split by its rules
  (per-device shard shapes asserted) and the logits still match transformers."""
  r = subproc.run(["tests/hf_sharded_run.py"], devices=8, timeout=300)
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["max_abs_diff"] <= TOL
  assert out["shard_shapes"]["embed/embedding"] == [192, 8]  # vocab / tensor, embed / fsdp.
  assert out["shard_shapes"]["layer_0/mlp/gate/kernel"] == [8, 24]  # fsdp 4, tensor 2.
  assert out["shard_shapes"]["layer_0/attn/q/kernel"] == [8, 2, 8]


# ----------------------------------------------------------------------------
# hf-check.
# ----------------------------------------------------------------------------


def test_hf_check_cli_prints_json_figures():
  # Without transformers nothing can be compared: an error unless --nocompare.
  compare = [] if importlib.util.find_spec("transformers") else ["--nocompare"]
  r = subproc.run(
    ["-m", "grpo_jax.main", "hf-check", f"--hf_dir={FIXTURES / 'qwen3'}", *compare], timeout=300
  )
  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["arch"] == "qwen3" and out["params"] == 34016 and out["ok"] is True
  assert out["logits_std"] > 0.5
  if out["max_abs_diff"] is not None:  # transformers installed here.
    assert out["max_abs_diff"] <= TOL


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3", "qwen3_moe"])
def test_hf_check_passes_for_each_new_family_and_for_its_export(arch, tmp_path):
  """`hf.check` (what `grpo-jax hf-check` prints) on each new family's transformers
  checkpoint: logits within 1e-4 of transformers' float32 forward and the same greedy id
  at every real position; then on the checkpoint exported back (`hf.export`), which
  transformers loads and which passes the same check."""
  d = FIXTURES / arch
  figures = hf.check(d)
  assert figures["ok"] and figures["max_abs_diff"] <= TOL and figures["greedy_mismatches"] == 0
  assert figures["positions"] >= 40 and figures["logits_std"] > 0.1
  base = hf.read_config(d)
  cfg = hf.model_config(base)
  out = hf.export(
    hf.load_params(d, cfg), cfg, tmp_path / "out", arch=MODEL_TYPE.get(arch, arch),
    dtype="float32", base_config=base,
  )  # fmt: skip
  again = hf.check(out)
  assert again["ok"] and again["greedy_mismatches"] == 0
  assert again["max_abs_diff"] <= TOL and again["params"] == figures["params"]


def test_hf_check_batch_left_pads_one_row():
  ids, mask = hf.check_batch(50)
  assert mask.sum(1).tolist() == [16, 11, 16] and (ids[mask == 0] == 0).all()


def test_export_loads_in_transformers_and_check_fails_past_tolerance(tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  d = FIXTURES / "llama"
  base = hf.read_config(d)
  cfg = hf.model_config(base)
  out = hf.export(hf.load_params(d, cfg), cfg, tmp_path / "x", arch="llama", dtype="float32")
  figures = hf.check(out)
  assert figures["max_abs_diff"] <= TOL and figures["ok"]
  args = ["-m", "grpo_jax.main", "hf-check", f"--hf_dir={out}", "--tolerance=1e-12"]
  r = subproc.run(args, timeout=300, check=False)
  assert r.returncode == 1 and json.loads(r.stdout.strip().splitlines()[-1])["ok"] is False


def test_qwen3_attention_bias_and_unexportable_models_are_refused():
  c = hf.read_config(FIXTURES / "qwen3")
  with pytest.raises(
    hf.CheckpointError, match=r"qwen3 attention_bias=true \(biases on q, k, v and o\)"
  ):
    hf.model_config(dict(c, attention_bias=True))
  both = dataclasses.replace(hf.model_config(c), attn_bias=True)
  with pytest.raises(ValueError, match="no Hugging Face architecture"):
    hf.arch_for(both)
  with pytest.raises(ValueError, match="is a 'qwen2' checkpoint, not 'llama'"):
    hf.hf_config_dict(hf.model_config(hf.read_config(FIXTURES / "qwen2")), arch="llama")


def test_tied_checkpoint_with_a_different_lm_head_is_an_error(tmp_path):
  d = _copy(tmp_path)
  index = hf.tensor_index(d)
  tensors = {n: hf.read_tensor(e) for n, e in index.items()}
  embed = tensors["model.embed_tokens.weight"]
  shapes = lambda t: {n: (x.shape, x.dtype) for n, x in t.items()}
  same = {**tensors, "lm_head.weight": embed.copy()}  # Some tied checkpoints store it.
  hf.write_safetensors(d / "model.safetensors", list(same.items()), shapes=shapes(same))
  cfg = hf.model_config(hf.read_config(d))
  hf.load_params(d, cfg)
  other = {**tensors, "lm_head.weight": embed + 1}
  hf.write_safetensors(d / "model.safetensors", list(other.items()), shapes=shapes(other))
  with pytest.raises(hf.CheckpointError, match="lm_head.weight .* differs from model.embed_tokens"):
    hf.load_params(d, cfg)


def test_export_copies_the_tokenizer_files_and_both_dtype_keys(tmp_path):
  d = _copy(tmp_path)
  (d / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
  cfg = hf.model_config(hf.read_config(d))
  out = hf.export(hf.load_params(d, cfg), cfg, tmp_path / "out", arch="qwen2", tokenizer_dir=d)
  assert (out / "chat_template.jinja").read_text() == "{{ messages[0]['content'] }}"
  config = json.loads((out / "config.json").read_text())
  assert config["dtype"] == config["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("scan", [False, True])
def test_moe_balance_loss_equals_transformers(scan):
  """The load-balancing loss of the fixture batch's real tokens (the left padding
  excluded) is transformers' `aux_loss` (output_router_logits=True), unrolled and
  scanned."""
  d = FIXTURES / "qwen3_moe"
  cfg = hf.model_config(hf.read_config(d), scan_layers=scan)
  ref = np.load(d / "expected.npz")
  mask = jnp.asarray(ref["attention_mask"])
  _, router = model.apply(
    hf.load_params(d, cfg),
    jnp.asarray(ref["input_ids"]),
    model.positions_from_mask(mask),
    cfg=cfg,
    router_stats=True,
  )
  np.testing.assert_allclose(router["moe_balance"], ref["aux_loss"], rtol=1e-5)
  assert float(ref["aux_loss"]) > cfg.experts_per_token  # Above the floor k: it bites.
