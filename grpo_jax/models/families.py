"""Model families as records: what tells Llama 3, Qwen2/2.5 and Qwen3 apart.

    family = families.of_config(hf.read_config(hf_dir))      # from config.json
    family = families.of_model(cfg)                          # the one a ModelConfig is
    family.hf_class, family.qk_norm, family.export_keys ...

A record carries a family's names (config.json's `model_type` and `architectures[0]`,
its sequence-classification class for reward models, GGUF's `general.architecture`), the
features the model reads from it (`qk_norm`, `attn_bias`), what an import may accept
(`attention_bias`) and what an export writes (`export_keys`), and how llama.cpp stored
its tensors (`gguf_rope_permuted`). `hf`, `gguf_import` and `reward_model` read these
fields; no module decides a family by its name anywhere else (tests/test_architecture.py
checks that no comparison or mapping outside this module names a family).

Families (transformers' configuration classes are the reference):
  llama   LlamaForCausalLM   Llama 3.x: SwiGLU, RMSNorm, no biases; rope scaling "llama3".
  qwen2   Qwen2ForCausalLM   Qwen2 / Qwen2.5: biases on q, k and v (attention_bias is
                             implied, not a config key).
  qwen3   Qwen3ForCausalLM   Qwen3: RMSNorm over head_dim on q and k, no biases.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
  """One decoder family: its names, the features the model reads, import and export."""

  name: str  # config.json model_type; GGUF general.architecture.
  hf_class: str  # config.json architectures[0] (causal LM).
  seq_cls_class: str  # transformers' sequence-classification class (a reward model).
  qk_norm: bool  # RMSNorm over head_dim on q and k.
  attn_bias: bool  # Biases on the q, k and v projections.
  # Whether a config.json with attention_bias=true imports (it would put biases on o too
  # in Llama and Qwen3, which the model does not have; Qwen2's own are q/k/v only).
  attention_bias: bool = False
  export_keys: tuple[tuple[str, object], ...] = ()  # config.json keys an export writes.
  gguf_rope_permuted: bool = False  # llama.cpp permuted the q/k rows (`LlamaModel.permute`).

  @property
  def doc(self) -> str:
    return f"{self.hf_class} (model_type {self.name!r})"


LLAMA = Family(
  name="llama",
  hf_class="LlamaForCausalLM",
  seq_cls_class="LlamaForSequenceClassification",
  qk_norm=False,
  attn_bias=False,
  export_keys=(("attention_bias", False), ("mlp_bias", False)),
  gguf_rope_permuted=True,
)
QWEN2 = Family(
  name="qwen2",
  hf_class="Qwen2ForCausalLM",
  seq_cls_class="Qwen2ForSequenceClassification",
  qk_norm=False,
  attn_bias=True,
  attention_bias=True,
)
QWEN3 = Family(
  name="qwen3",
  hf_class="Qwen3ForCausalLM",
  seq_cls_class="Qwen3ForSequenceClassification",
  qk_norm=True,
  attn_bias=False,
  export_keys=(("attention_bias", False),),
)
FAMILIES: dict[str, Family] = {f.name: f for f in (LLAMA, QWEN2, QWEN3)}
BY_HF_CLASS: dict[str, Family] = {f.hf_class: f for f in FAMILIES.values()}
BY_SEQ_CLS_CLASS: dict[str, Family] = {f.seq_cls_class: f for f in FAMILIES.values()}


class UnknownFamily(ValueError):
  """An architecture no record describes; the message lists those that are."""


def get(name: str) -> Family:
  """The family named `name` (model_type / GGUF architecture)."""
  if name not in FAMILIES:
    raise UnknownFamily(f"unsupported architecture {name!r}; supported: {sorted(FAMILIES)}.")
  return FAMILIES[name]


def of_config(hf_config: dict) -> Family:
  """The family of a config.json: its first `architectures` entry a record knows, else (no
  `architectures`) its `model_type`."""
  archs = hf_config.get("architectures") or []
  for a in archs:
    if a in BY_HF_CLASS:
      return BY_HF_CLASS[a]
  if not archs and hf_config.get("model_type") in FAMILIES:
    return FAMILIES[hf_config["model_type"]]
  found = archs or hf_config.get("model_type")
  raise UnknownFamily(f"unsupported architecture {found!r}; supported: {sorted(BY_HF_CLASS)}.")


def of_model(cfg) -> Family:
  """The one family whose features a ModelConfig has (its q/k norm and q/k/v biases); a
  combination no family has cannot be exported."""
  got = [f for f in FAMILIES.values() if (f.qk_norm, f.attn_bias) == (cfg.qk_norm, cfg.attn_bias)]
  if len(got) != 1:
    raise ValueError(
      f"A model with qk_norm={cfg.qk_norm}, attn_bias={cfg.attn_bias} has no Hugging Face "
      f"architecture (supported: {sorted(BY_HF_CLASS)}); it cannot be exported."
    )
  return got[0]
