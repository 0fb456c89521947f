"""`hf_config`, through its own module, on config.json dicts written here (no weights):
the defaults a sparse config.json gets, the rope keys of both transformers versions,
each refusal with the file named, and export followed by import giving the config back
for every family. tests/models/test_hf.py checks the same mapping on the committed checkpoints."""

import json

import pytest

from grpo_jax.models import hf_config, model_config

LLAMA = {
  "architectures": ["LlamaForCausalLM"],
  "vocab_size": 128,
  "hidden_size": 64,
  "num_hidden_layers": 2,
  "num_attention_heads": 8,
  "intermediate_size": 96,
}


def test_a_sparse_config_gets_the_defaults():
  """No num_key_value_heads: as many as the query heads (8); no head_dim: 64 / 8 = 8; no
  rope keys: theta 10000, no scaling; untied; norm eps 1e-6; silu."""
  cfg = hf_config.model_config(LLAMA)
  assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim) == (8, 8, 8, 96)
  assert (cfg.rope_theta, cfg.rope_scaling, cfg.tie_embeddings) == (10_000.0, "none", False)
  assert (cfg.norm_eps, cfg.activation, cfg.qk_norm, cfg.attn_bias) == (1e-6, "silu", False, False)


def test_overrides_and_the_family_of_a_model_type():
  """Overrides (dtypes, scan) win; without `architectures`, model_type names the family,
  and Qwen2's q/k/v biases come with it."""
  cfg = hf_config.model_config(LLAMA, param_dtype="bfloat16", scan_layers=True)
  assert (cfg.param_dtype, cfg.scan_layers) == ("bfloat16", True)
  qwen2 = {k: v for k, v in LLAMA.items() if k != "architectures"} | {"model_type": "qwen2"}
  assert hf_config.arch_of(qwen2) == "qwen2"
  assert hf_config.model_config(qwen2).attn_bias


@pytest.mark.parametrize(
  ("rope", "expected"),
  [
    ({"rope_theta": 5e5}, (5e5, "none", 1.0)),
    ({"rope_scaling": {"type": "linear", "factor": 2}}, (10_000.0, "linear", 2.0)),  # Legacy.
    (
      {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}},
      (1e6, "linear", 4.0),
    ),
    ({"rope_scaling": {"rope_type": "default"}, "rope_theta": 3.0}, (3.0, "none", 1.0)),
  ],
)
def test_rope_keys_of_both_transformers_versions(rope, expected):
  """(rope_theta, rope_scaling, rope_factor) from transformers 4 keys, the legacy 'type', and
  transformers 5's rope_parameters."""
  cfg = hf_config.model_config(LLAMA | rope)
  assert (cfg.rope_theta, cfg.rope_scaling, cfg.rope_factor) == expected


def test_llama3_rope_fields():
  """Each llama3 scaling key lands in its ModelConfig field."""
  rope = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
  }  # fmt: skip
  cfg = hf_config.model_config(LLAMA | {"rope_scaling": rope, "rope_theta": 5e5})
  got = (cfg.rope_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor)
  assert got == (8.0, 1.0, 4.0) and cfg.rope_original_max_len == 8192


@pytest.mark.parametrize(
  ("change", "match"),
  [
    ({"hidden_act": "gelu"}, r"hidden_act 'gelu' is not supported; allowed: \['gelu_pytorch_tanh'"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention=true"),
    ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
    ({"attention_bias": True}, r"llama attention_bias=true \(biases on q, k, v and o\)"),
    ({"rope_scaling": {"rope_type": "yarn"}}, "unsupported rope scaling 'yarn'"),
    ({"architectures": ["GPT2LMHeadModel"]}, r"unsupported architecture \['GPT2LMHeadModel'\]"),
    # ModelConfig's own refusal, with the file named: 8 heads over 3 KV heads.
    ({"num_key_value_heads": 3}, r"n_heads \(8\) must be a multiple of n_kv_heads \(3\)"),
  ],
)
def test_refusals_name_the_file(change, match):
  """What the model cannot represent is a CheckpointError starting with `where`."""
  with pytest.raises(hf_config.CheckpointError, match=f"^ckpt/config.json: .*{match}"):
    hf_config.model_config(LLAMA | change, where="ckpt/config.json")


def test_read_config(tmp_path):
  """A missing or broken config.json names the file; a good one reads as the dict."""
  with pytest.raises(hf_config.CheckpointError, match="config.json: not found"):
    hf_config.read_config(tmp_path)
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(hf_config.CheckpointError, match="config.json: not valid JSON"):
    hf_config.read_config(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(LLAMA))
  assert hf_config.read_config(str(tmp_path)) == LLAMA


def _tiny(**overrides):
  return model_config.tiny_config(64, **overrides)


GEMMA = dict(norm_offset=1.0, post_norms=True, embed_scale=True, activation="gelu_tanh")
TWO_TYPES = ("sliding_attention", "full_attention")
FAMILY_CONFIGS = {
  "llama": _tiny(
    qk_norm=False, rope_scaling="llama3", rope_factor=8.0, rope_original_max_len=16,
    tie_embeddings=False,
  ),
  "qwen2": _tiny(qk_norm=False, attn_bias=True, rope_theta=1e6),
  "qwen3": _tiny(),
  "mistral": _tiny(qk_norm=False, sliding_window=5),
  "gemma2": _tiny(
    qk_norm=False, **GEMMA, query_pre_attn_scalar=24.0, attn_softcap=2.0, final_softcap=5.0,
    sliding_window=4, layer_types=TWO_TYPES,
  ),
  "gemma3_text": _tiny(
    **GEMMA, query_pre_attn_scalar=16.0, rope_local_theta=1e4, rope_scaling="linear",
    rope_factor=8.0, sliding_window=3, layer_types=TWO_TYPES,
  ),
  "qwen3_moe": _tiny(n_experts=4, experts_per_token=2, expert_mlp_dim=24),
}  # fmt: skip


@pytest.mark.parametrize("arch", list(FAMILY_CONFIGS))
def test_export_then_import_gives_the_config_back(arch):
  """hf_config_dict then model_config is the identity, for every family; arch_for names
  the family and the export names its class."""
  cfg = FAMILY_CONFIGS[arch]
  assert hf_config.arch_for(cfg) == arch
  exported = hf_config.hf_config_dict(cfg, arch=arch)
  assert exported["model_type"] == arch and len(exported["architectures"]) == 1
  assert hf_config.arch_of(exported) == arch
  assert hf_config.model_config(exported) == cfg


def test_the_export_keeps_the_base_and_writes_what_transformers_reads():
  """`base`'s keys we do not model stay, its rope_parameters and torch_dtype go; both
  dtype keys are the export's; Gemma's query scalar 0 (head_dim^-1/2) is written as
  head_dim = 16, an int; no soft-cap is None."""
  base = {"bos_token_id": 1, "rope_parameters": {"rope_theta": 1.0}, "torch_dtype": "float16"}
  out = hf_config.hf_config_dict(FAMILY_CONFIGS["qwen3"], arch="qwen3", dtype="float32", base=base)
  assert out["bos_token_id"] == 1 and "rope_parameters" not in out
  assert (out["dtype"], out["torch_dtype"], out["rope_scaling"]) == ("float32", "float32", None)
  assert out["architectures"] == ["Qwen3ForCausalLM"] and out["attention_bias"] is False
  g2 = _tiny(qk_norm=False, **GEMMA)
  out = hf_config.hf_config_dict(g2, arch="gemma2")
  assert out["query_pre_attn_scalar"] == 16 and isinstance(out["query_pre_attn_scalar"], int)
  assert out["attn_logit_softcapping"] is None and out["sliding_window"] is None
  assert out["hidden_activation"] == "gelu_pytorch_tanh"
  with pytest.raises(ValueError, match="Unknown arch 'gpt2'"):
    hf_config.hf_config_dict(g2, arch="gpt2")
