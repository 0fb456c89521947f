"""Model shapes to plan with before any checkpoint is on disk (`grpo-jax plan --model=...`).

    cfg = shapes.model_config("qwen2.5-7b")                 # a built-in shape
    cfg = shapes.model_config("/models/Qwen2.5-7B/config.json", param_dtype="bfloat16")

A source is a built-in name (`CONFIGS`: the published config.json fields of each model that
the shape depends on), a config.json file, a checkpoint directory (only its config.json is
read) or a GGUF source (`gguf_import`: only its metadata). No weights or tokenizer files.
"""

from __future__ import annotations

import json
import pathlib

from grpo_jax.models import hf, model

_QWEN2 = dict(architectures=["Qwen2ForCausalLM"], rope_theta=1e6, rms_norm_eps=1e-6)
_LLAMA3 = dict(architectures=["LlamaForCausalLM"], rope_theta=5e5, rms_norm_eps=1e-5)
_MISTRAL = dict(architectures=["MistralForCausalLM"], rope_theta=1e4, rms_norm_eps=1e-5)
_GEMMA = dict(rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh", head_dim=256)
_GEMMA2 = dict(
  _GEMMA,
  architectures=["Gemma2ForCausalLM"],
  rope_theta=1e4,
  sliding_window=4096,
  attn_logit_softcapping=50.0,
  final_logit_softcapping=30.0,
)
_GEMMA3 = dict(
  _GEMMA,
  architectures=["Gemma3ForCausalLM"],
  rope_theta=1e6,
  rope_local_base_freq=1e4,
  sliding_window_pattern=6,
)


def _llama3_rope(factor: float) -> dict:
  return dict(
    rope_type="llama3",
    factor=factor,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
  )


def _shape(base, d, layers, heads, kv, mlp, vocab, tied, **more) -> dict:
  return dict(
    base,
    hidden_size=d,
    num_hidden_layers=layers,
    num_attention_heads=heads,
    num_key_value_heads=kv,
    intermediate_size=mlp,
    vocab_size=vocab,
    tie_word_embeddings=tied,
    **more,
  )


# name: the config.json fields of the published checkpoint (Hugging Face hub).
CONFIGS = {
  "qwen2.5-0.5b": _shape(_QWEN2, 896, 24, 14, 2, 4864, 151936, True),
  "qwen2.5-1.5b": _shape(_QWEN2, 1536, 28, 12, 2, 8960, 151936, True),
  "qwen2.5-3b": _shape(_QWEN2, 2048, 36, 16, 2, 11008, 151936, True),
  "qwen2.5-7b": _shape(_QWEN2, 3584, 28, 28, 4, 18944, 152064, False),
  "qwen3-0.6b": _shape(
    dict(_QWEN2, architectures=["Qwen3ForCausalLM"]), 1024, 28, 16, 8, 3072, 151936, True,
    head_dim=128,
  ),
  "llama-3.2-1b": _shape(
    _LLAMA3, 2048, 16, 32, 8, 8192, 128256, True, rope_scaling=_llama3_rope(32.0)
  ),
  "llama-3.1-8b": _shape(
    _LLAMA3, 4096, 32, 32, 8, 14336, 128256, False, rope_scaling=_llama3_rope(8.0)
  ),
  "qwen3-30b-a3b": _shape(
    dict(_QWEN2, architectures=["Qwen3MoeForCausalLM"]), 2048, 48, 32, 4, 6144, 151936, False,
    head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
    norm_topk_prob=True,
  ),
  "mistral-7b": _shape(_MISTRAL, 4096, 32, 32, 8, 14336, 32000, False, sliding_window=4096),
  "gemma-2-2b": _shape(_GEMMA2, 2304, 26, 8, 4, 9216, 256000, True, query_pre_attn_scalar=256),
  "gemma-2-9b": _shape(_GEMMA2, 3584, 42, 16, 8, 14336, 256000, True, query_pre_attn_scalar=256),
  "gemma-3-1b": _shape(
    _GEMMA3, 1152, 26, 4, 1, 6912, 262144, True, sliding_window=512, query_pre_attn_scalar=256
  ),
  "gemma-3-4b": _shape(
    _GEMMA3, 2560, 34, 8, 4, 10240, 262208, True, sliding_window=1024,
    query_pre_attn_scalar=256, rope_scaling=dict(rope_type="linear", factor=8.0),
  ),
}  # fmt: skip


def read(source: str) -> tuple[dict, str]:
  """(config.json fields, where they came from) of a model source (module docstring)."""
  if source in CONFIGS:
    return dict(CONFIGS[source]), f"the built-in shape {source!r}"
  path = pathlib.Path(source).expanduser()
  if path.suffix == ".json" and path.is_file():
    try:
      return json.loads(path.read_text()), str(path)
    except json.JSONDecodeError as e:
      raise hf.CheckpointError(f"{path}: not valid JSON ({e}).") from None
  try:
    return hf.read_config(source), hf.config_where(source)
  except (hf.CheckpointError, ValueError) as e:
    raise hf.CheckpointError(
      f"{e} A model source is a built-in shape ({', '.join(CONFIGS)}), a config.json, a "
      "checkpoint directory or a GGUF file."
    ) from None


def model_config(source: str, **overrides) -> model.ModelConfig:
  """The ModelConfig of a model source; `overrides` set dtypes, scan_layers, remat."""
  fields, where = read(source)
  return hf.model_config(fields, where=where, **overrides)
