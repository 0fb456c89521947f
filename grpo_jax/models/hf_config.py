"""Hugging Face config.json <-> our ModelConfig, by family record (`families`).

    cfg = hf_config.model_config(hf_config.read_config(hf_dir), param_dtype="bfloat16")
    config = hf_config.hf_config_dict(cfg, arch="qwen2", base=imported)   # for an export

`hf` (the checkpoint's tensors, import and export) re-exports these names. config.json
is read as transformers 4 or 5 writes it (`rope_theta` + `rope_scaling` or
`rope_parameters`, per layer type for Gemma 3; `num_experts` or `num_local_experts`),
and written with transformers 4's keys, which transformers 5 also reads. What the model
cannot represent is refused with what is allowed (`model_config`).
"""

from __future__ import annotations

import json
import pathlib

from grpo_jax.models import families, gguf_import, model


class CheckpointError(ValueError):
  """A Hugging Face checkpoint directory that cannot be imported, with the file named."""


# ----------------------------------------------------------------------------
# config.json <-> ModelConfig.
# ----------------------------------------------------------------------------


def read_config(hf_dir) -> dict:
  """config.json of a checkpoint directory, as a dict (of a GGUF file: from its metadata)."""
  if gguf_import.is_source(hf_dir):
    return gguf_import.hf_config(hf_dir)
  path = pathlib.Path(hf_dir) / "config.json"
  if not path.is_file():
    raise CheckpointError(
      f"{path}: not found; a Hugging Face checkpoint directory needs config.json."
    )
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path}: not valid JSON ({e}).") from None


def arch_of(hf_config: dict, *, where: str = "config.json") -> str:
  """The family's name (`families`), from `architectures` (else `model_type`)."""
  return _family(hf_config, where=where).name


def _family(hf_config: dict, *, where: str) -> families.Family:
  try:
    return families.of_config(hf_config)
  except families.UnknownFamily as e:
    raise CheckpointError(f"{where}: {e}") from None


def _rope(hf_config: dict, *, where: str, family: families.Family) -> dict:
  """Rope fields of ModelConfig from `rope_theta` + `rope_scaling` (transformers 4) or
  `rope_parameters` (transformers 5). Gemma 3: the full layers' rope, and the sliding
  layers' base (`rope_local_base_freq`, or rope_parameters["sliding_attention"])."""
  params = dict(hf_config.get("rope_parameters") or hf_config.get("rope_scaling") or {})
  out = {}
  if "full_attention" in params:  # transformers 5, one rope per layer type.
    local = params.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
      raise CheckpointError(
        f"{where}: sliding layers' rope {local!r}: only 'default' is supported."
      )
    if family.rope_local and local:
      out["rope_local_theta"] = float(local["rope_theta"])
    params = dict(params["full_attention"])
  elif family.rope_local and hf_config.get("rope_local_base_freq"):
    out["rope_local_theta"] = float(hf_config["rope_local_base_freq"])
  theta = params.get("rope_theta", hf_config.get("rope_theta", 10_000.0))
  return dict(out, **_rope_scaling(params, theta, where=where))


def _rope_scaling(params: dict, theta, *, where: str) -> dict:
  """ModelConfig's rope_theta and scaling fields of one rope parameters dict."""
  kind = params.get("rope_type", params.get("type", "default"))
  out = dict(rope_theta=float(theta))
  if kind == "default":
    return out
  if kind == "linear":
    return dict(out, rope_scaling="linear", rope_factor=float(params["factor"]))
  if kind == "llama3":
    return dict(
      out,
      rope_scaling="llama3",
      rope_factor=float(params["factor"]),
      rope_low_freq_factor=float(params["low_freq_factor"]),
      rope_high_freq_factor=float(params["high_freq_factor"]),
      rope_original_max_len=int(params["original_max_position_embeddings"]),
    )
  raise CheckpointError(
    f"{where}: unsupported rope scaling {kind!r}; supported: default, linear, llama3."
  )


def model_config(hf_config: dict, *, where: str = "config.json", **overrides) -> model.ModelConfig:
  """Our ModelConfig for a HF config dict; `overrides` set dtypes, scan_layers, remat...

  Refuses what the model cannot represent (an o_proj bias, an MLP bias, an activation
  other than silu and tanh-gelu, Qwen2's sliding window, bidirectional attention) rather
  than importing it wrongly.
  """
  family = _family(hf_config, where=where)
  c = hf_config
  act = c.get(family.activation_key) or c.get("hidden_act") or "silu"
  if act not in families.HF_ACTIVATIONS:
    raise CheckpointError(
      f"{where}: {family.activation_key} {act!r} is not supported; allowed: "
      f"{sorted(families.HF_ACTIVATIONS)} (a gated MLP)."
    )
  if c.get("use_bidirectional_attention"):
    raise CheckpointError(f"{where}: use_bidirectional_attention=true is not supported.")
  if c.get("mlp_bias"):
    raise CheckpointError(f"{where}: mlp_bias=true is not supported (the MLP has no biases).")
  if c.get("attention_bias") and not family.attention_bias:
    raise CheckpointError(
      f"{where}: {family.name} attention_bias=true (biases on q, k, v and o) is not "
      "supported; the model has q/k/v biases only (Qwen2)."
    )
  if c.get("use_sliding_window"):
    raise CheckpointError(
      f"{where}: use_sliding_window=true is not supported (Qwen2's window, on the layers "
      "past max_window_layers)."
    )
  n_heads = c["num_attention_heads"]
  fields = dict(
    vocab_size=c["vocab_size"],
    d_model=c["hidden_size"],
    n_layers=c["num_hidden_layers"],
    n_heads=n_heads,
    n_kv_heads=c.get("num_key_value_heads") or n_heads,
    head_dim=c.get("head_dim") or c["hidden_size"] // n_heads,
    mlp_dim=c["intermediate_size"],
    norm_eps=float(c.get("rms_norm_eps", 1e-6)),
    qk_norm=family.qk_norm,
    attn_bias=family.attn_bias,
    tie_embeddings=bool(c.get("tie_word_embeddings", False)),
    activation=families.HF_ACTIVATIONS[act],
    norm_offset=family.norm_offset,
    post_norms=family.post_norms,
    embed_scale=family.embed_scale,
    **_windows(c, family),
    **_rope(c, where=where, family=family),
  )
  if family.moe:
    fields.update(_experts(c, where=where))
  if family.gemma_attention:
    fields.update(
      query_pre_attn_scalar=float(c.get("query_pre_attn_scalar") or 0.0),
      attn_softcap=float(c.get("attn_logit_softcapping") or 0.0),
      final_softcap=float(c.get("final_logit_softcapping") or 0.0),
    )
  try:
    return model.ModelConfig(**{**fields, **overrides})
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{where}: {e}") from None


def _experts(c: dict, *, where: str) -> dict:
  """The mixture-of-experts fields of a Qwen3-MoE config.json (every layer sparse)."""
  if int(c.get("decoder_sparse_step", 1)) != 1 or c.get("mlp_only_layers"):
    raise CheckpointError(
      f"{where}: decoder_sparse_step={c.get('decoder_sparse_step')}, mlp_only_layers="
      f"{c.get('mlp_only_layers')}: only every layer sparse is supported (step 1, no dense "
      "layers)."
    )
  return dict(
    # transformers 4 (the hub's configs) says num_experts, transformers 5 num_local_experts.
    n_experts=int(c.get("num_experts") or c["num_local_experts"]),
    experts_per_token=int(c["num_experts_per_tok"]),
    expert_mlp_dim=int(c["moe_intermediate_size"]),
    expert_weights_normalized=bool(c.get("norm_topk_prob", False)),
  )


def _windows(c: dict, family: families.Family) -> dict:
  """sliding_window and layer_types of a family whose layers may slide (others: none)."""
  if family.windows == "none" or not c.get("sliding_window"):
    return {}
  return dict(
    sliding_window=int(c["sliding_window"]),
    layer_types=families.layer_types(family, c, c["num_hidden_layers"]),
  )


def arch_for(cfg: model.ModelConfig) -> str:
  """The family that represents a ModelConfig (`families.of_model`: the one with its q/k
  norm and q/k/v biases). Both at once has no HF counterpart (Qwen3's attention_bias also
  puts a bias on o_proj)."""
  return families.of_model(cfg).name


def hf_config_dict(
  cfg: model.ModelConfig, *, arch: str, dtype: str = "bfloat16", base=None
) -> dict:
  """config.json for our ModelConfig (transformers 4 keys, which transformers 5 also reads);
  `base` (the imported config) keeps fields we do not model (token ids, max positions)."""
  if arch not in families.FAMILIES:
    raise ValueError(f"Unknown arch {arch!r}; allowed: {sorted(families.FAMILIES)}.")
  if not families.get(arch).represents(cfg):
    raise ValueError(
      f"A model with qk_norm={cfg.qk_norm}, attn_bias={cfg.attn_bias} is a "
      f"{arch_for(cfg)!r} checkpoint, not {arch!r}."
    )
  out = {k: v for k, v in (base or {}).items() if k not in ("rope_parameters", "torch_dtype")}
  out.update(
    architectures=[families.get(arch).hf_class],
    model_type=arch,
    vocab_size=cfg.vocab_size,
    hidden_size=cfg.d_model,
    num_hidden_layers=cfg.n_layers,
    num_attention_heads=cfg.n_heads,
    num_key_value_heads=cfg.n_kv_heads,
    head_dim=cfg.head_dim,
    intermediate_size=cfg.mlp_dim,
    rms_norm_eps=cfg.norm_eps,
    tie_word_embeddings=cfg.tie_embeddings,
    rope_theta=cfg.rope_theta,
    dtype=dtype,
    torch_dtype=dtype,  # The transformers 4 name, which older transformers and vLLM read.
  )
  family = families.get(arch)
  out[family.activation_key] = families.ACTIVATION_NAMES[cfg.activation]
  out.update(family.export_keys)
  out.update(_export_attention(cfg, family))
  scaling = None
  if cfg.rope_scaling == "linear":
    scaling = dict(rope_type="linear", factor=cfg.rope_factor)
  elif cfg.rope_scaling == "llama3":
    scaling = dict(
      rope_type="llama3",
      factor=cfg.rope_factor,
      low_freq_factor=cfg.rope_low_freq_factor,
      high_freq_factor=cfg.rope_high_freq_factor,
      original_max_position_embeddings=cfg.rope_original_max_len,
    )
  out["rope_scaling"] = scaling
  return out


def _int_if_whole(x):
  return int(x) if float(x).is_integer() else x


def _export_attention(cfg: model.ModelConfig, family: families.Family) -> dict:
  """config.json's window, Gemma attention and local-rope keys of a family that has them."""
  out = {}
  if family.windows != "none":
    out["sliding_window"] = cfg.sliding_window or None
  if family.windows == "pattern":
    out["layer_types"] = [
      "sliding_attention" if s else "full_attention" for s in cfg.sliding_layers
    ]
  if family.gemma_attention:
    out.update(
      # An int in transformers' config class (strictly typed).
      query_pre_attn_scalar=_int_if_whole(cfg.query_pre_attn_scalar or cfg.head_dim),
      attn_logit_softcapping=cfg.attn_softcap or None,
      final_logit_softcapping=cfg.final_softcap or None,
    )
  if family.rope_local:
    out["rope_local_base_freq"] = cfg.rope_local_theta or cfg.rope_theta
  if family.moe:
    out.update(
      num_experts=cfg.n_experts,
      num_experts_per_tok=cfg.experts_per_token,
      moe_intermediate_size=cfg.expert_mlp_dim,
      norm_topk_prob=cfg.expert_weights_normalized,
    )
  return out
