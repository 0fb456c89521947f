"""Model families as records: what tells Llama 3, Qwen2/2.5, Qwen3, Mistral, Gemma 2 and
Gemma 3 apart.

    family = families.of_config(hf.read_config(hf_dir))      # from config.json
    family = families.of_model(cfg)                          # the one a ModelConfig is
    family.hf_class, family.qk_norm, family.export_keys ...

A record carries a family's names (config.json's `model_type` and `architectures[0]`,
its sequence-classification class for reward models, GGUF's `general.architecture`), the
features the model reads from it (`qk_norm`, `attn_bias`), what an import may accept
(`attention_bias`) and what an export writes (`export_keys`), and how llama.cpp stores
it (`gguf_*`: whether its GGUF files import, the q/k row permutation, the norm shift, the
config.json keys llama.cpp assumes rather than reads). `hf`, `gguf_import` and
`reward_model` read these fields; no module decides a family by its name anywhere else
(tests/test_architecture.py checks that no comparison or mapping outside this module names
a family).

Families (transformers' configuration classes are the reference):
  llama   LlamaForCausalLM   Llama 3.x: SwiGLU, RMSNorm, no biases; rope scaling "llama3".
  qwen2   Qwen2ForCausalLM   Qwen2 / Qwen2.5: biases on q, k and v (attention_bias is
                             implied, not a config key).
  qwen3   Qwen3ForCausalLM   Qwen3: RMSNorm over head_dim on q and k, no biases.
  mistral MistralForCausalLM Mistral: a Llama body whose every layer attends within
                             `sliding_window` (none when config.json says null).
  gemma2  Gemma2ForCausalLM  Gemma 2: GeGLU, RMSNorm y·(1 + w), norms before and after
                             attention and the MLP, embeddings × √d, queries scaled by
                             query_pre_attn_scalar^-1/2, attention and final logits
                             soft-capped, sliding and full layers alternating.
                             GGUF "gemma2" (norms stored 1 + w; query_pre_attn_scalar
                             as llama.cpp implies it, `gguf_wide_query_layers`).
  gemma3_text Gemma3ForCausalLM  Gemma 3 (text): Gemma 2's body with q/k norm, 5 sliding
                             layers to 1 full, and the sliding layers' own rope base.
                             GGUF "gemma3" (as Gemma 2; local rope base 10000).
  qwen3_moe Qwen3MoeForCausalLM  Qwen3-MoE: Qwen3's attention, every MLP a mixture of
                             experts (top-k of softmax routing, norm_topk_prob).

Matching a ModelConfig to its family (`of_model`, for an export) compares the features a
record fixes; features a family cannot carry (soft-capping on a Llama body) match none.
"""

from __future__ import annotations

import dataclasses

# Our block's norms -> their names inside a HF layer: pre-norm blocks (Llama, Qwen,
# Mistral), and Gemma's, with a norm after attention and after the MLP too.
PRE_NORMS = (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))
SANDWICH_NORMS = (
  ("attn_norm", "input_layernorm"),
  ("attn_post_norm", "post_attention_layernorm"),
  ("mlp_norm", "pre_feedforward_layernorm"),
  ("mlp_post_norm", "post_feedforward_layernorm"),
)
# transformers' activation names <-> ModelConfig.activation.
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
ACTIVATION_NAMES = {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
  """One decoder family: its names, the features the model reads, import and export."""

  name: str  # config.json model_type; GGUF general.architecture.
  hf_class: str  # config.json architectures[0] (causal LM).
  seq_cls_class: str  # transformers' sequence-classification class (a reward model).
  qk_norm: bool  # RMSNorm over head_dim on q and k.
  attn_bias: bool  # Biases on the q, k and v projections.
  norm_offset: float = 0.0  # RMSNorm y·(offset + w): 1 for Gemma.
  post_norms: bool = False  # Norms after attention and after the MLP (SANDWICH_NORMS).
  embed_scale: bool = False  # Embeddings × √d_model.
  activation_key: str = "hidden_act"  # config.json's key for the MLP activation.
  # Which layers slide: "none", "all" (Mistral: every layer, config.json's
  # `sliding_window`), "pattern" (Gemma: `layer_types`, else every n-th layer full with n
  # = `sliding_window_pattern` or `window_pattern`).
  windows: str = "none"
  window_pattern: int = 0
  gemma_attention: bool = False  # query_pre_attn_scalar and the two soft-caps are read.
  rope_local: bool = False  # Sliding layers have their own rope base (Gemma 3).
  moe: bool = False  # Every layer's MLP a mixture of experts (Qwen3-MoE's config keys).
  # Whether a config.json with attention_bias=true imports (it would put biases on o too
  # in Llama and Qwen3, which the model does not have; Qwen2's own are q/k/v only).
  attention_bias: bool = False
  export_keys: tuple[tuple[str, object], ...] = ()  # config.json keys an export writes.
  gguf_rope_permuted: bool = False  # llama.cpp permuted the q/k rows (`LlamaModel.permute`).
  # Whether GGUF files of this family import (`gguf_import`).
  gguf: bool = True
  # GGUF's general.architecture (and its metadata keys' prefix) when it is not `name`.
  gguf_arch: str = ""
  # What llama.cpp's converter added to every `*norm.weight` (Gemma: 1, so the file holds
  # the multiplier 1 + w); the import subtracts it.
  gguf_norm_shift: float = 0.0
  # config.json keys llama.cpp fixes or defaults for the family instead of reading them
  # from the file (the file's own keys, where it has them, win).
  gguf_config: tuple[tuple[str, object], ...] = ()
  # Block counts at which llama.cpp scales queries by (d_model / n_heads)^-1/2 rather than
  # head_dim^-1/2 (its "27B" types); GGUF has no query_pre_attn_scalar key.
  gguf_wide_query_layers: tuple[int, ...] = ()
  # Control tokens that end a turn as the EOS does, by their text (llama.cpp's vocabulary
  # loader recognises them so; its Gemma files name no EOT id): added to the EOS ids of
  # the generation config, as transformers' Gemma checkpoints list <end_of_turn>.
  gguf_end_of_turn: tuple[str, ...] = ()

  @property
  def doc(self) -> str:
    return f"{self.hf_class} (model_type {self.name!r})"

  @property
  def gguf_name(self) -> str:
    """GGUF's general.architecture for this family."""
    return self.gguf_arch or self.name

  @property
  def block_norms(self) -> tuple[tuple[str, str], ...]:
    return SANDWICH_NORMS if self.post_norms else PRE_NORMS

  def represents(self, cfg) -> bool:
    """Whether a ModelConfig is a model of this family (every feature it fixes agrees,
    and the config uses no feature the family cannot carry)."""
    fixed = ("qk_norm", "attn_bias", "norm_offset", "post_norms", "embed_scale")
    if any(getattr(cfg, f) != getattr(self, f) for f in fixed):
      return False
    if bool(cfg.n_experts) != self.moe:
      return False
    gemma = (cfg.query_pre_attn_scalar, cfg.attn_softcap, cfg.final_softcap)
    if any(gemma) and not self.gemma_attention:
      return False
    if cfg.rope_local_theta and not self.rope_local:
      return False
    if self.windows == "none":
      return not cfg.sliding_window and cfg.activation == "silu"
    if self.windows == "all":
      return not any(t == "full_attention" for t in cfg.layer_types) and cfg.activation == "silu"
    return True


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
QWEN3_MOE = Family(
  name="qwen3_moe",
  hf_class="Qwen3MoeForCausalLM",
  seq_cls_class="Qwen3MoeForSequenceClassification",
  qk_norm=True,
  attn_bias=False,
  moe=True,
  export_keys=(("attention_bias", False), ("decoder_sparse_step", 1), ("mlp_only_layers", [])),
  gguf=False,
)
MISTRAL = Family(
  name="mistral",
  hf_class="MistralForCausalLM",
  seq_cls_class="MistralForSequenceClassification",
  qk_norm=False,
  attn_bias=False,
  windows="all",
  gguf=False,  # llama.cpp writes Mistral's GGUF files as "llama".
)
_GEMMA = dict(
  attn_bias=False,
  norm_offset=1.0,
  post_norms=True,
  embed_scale=True,
  activation_key="hidden_activation",
  windows="pattern",
  gemma_attention=True,
  export_keys=(("attention_bias", False),),
  gguf_norm_shift=1.0,  # convert_hf_to_gguf.py Gemma2Model/Gemma3Model.modify_tensors.
  gguf_end_of_turn=("<end_of_turn>",),
)
_GEMMA_ACTIVATION = ("hidden_activation", "gelu_pytorch_tanh")  # llama.cpp: LLM_FFN_GELU.
GEMMA2 = Family(
  name="gemma2",
  hf_class="Gemma2ForCausalLM",
  seq_cls_class="Gemma2ForSequenceClassification",
  qk_norm=False,
  window_pattern=2,
  # llama.cpp's gemma2 hparams: a 4096 window and soft-caps 50 / 30 unless the file says.
  gguf_config=(
    _GEMMA_ACTIVATION,
    ("sliding_window", 4096),
    ("attn_logit_softcapping", 50.0),
    ("final_logit_softcapping", 30.0),
  ),
  gguf_wide_query_layers=(46,),  # Gemma 2 27B.
  **_GEMMA,
)
GEMMA3 = Family(
  name="gemma3_text",
  hf_class="Gemma3ForCausalLM",
  seq_cls_class="Gemma3TextForSequenceClassification",
  qk_norm=True,
  window_pattern=6,
  rope_local=True,
  gguf_arch="gemma3",
  # llama.cpp's gemma3 hparams: sliding layers' rope base 10000 (rope_freq_base_train_swa),
  # no attention soft-cap, a window only when the file names one.
  gguf_config=(_GEMMA_ACTIVATION, ("rope_local_base_freq", 10_000.0)),
  gguf_wide_query_layers=(62,),  # Gemma 3 27B.
  **_GEMMA,
)
FAMILIES: dict[str, Family] = {
  f.name: f for f in (LLAMA, QWEN2, QWEN3, QWEN3_MOE, MISTRAL, GEMMA2, GEMMA3)
}
BY_HF_CLASS: dict[str, Family] = {f.hf_class: f for f in FAMILIES.values()}
BY_SEQ_CLS_CLASS: dict[str, Family] = {f.seq_cls_class: f for f in FAMILIES.values()}


class UnknownFamily(ValueError):
  """An architecture no record describes; the message lists those that are."""


def get(name: str) -> Family:
  """The family named `name` (model_type / GGUF architecture)."""
  if name not in FAMILIES:
    raise UnknownFamily(f"unsupported architecture {name!r}; supported: {sorted(FAMILIES)}.")
  return FAMILIES[name]


def of_gguf(name: str) -> Family:
  """The family of a GGUF file's general.architecture (one whose GGUF import is mapped)."""
  known = {f.gguf_name: f for f in FAMILIES.values() if f.gguf}
  if name not in known:
    raise UnknownFamily(f"unsupported architecture {name!r}; supported: {sorted(known)}.")
  return known[name]


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
  """The family a ModelConfig is (`Family.represents`): a Llama body with a window is
  Mistral's, without one Llama's. A combination no family has cannot be exported."""
  got = [f for f in FAMILIES.values() if f.represents(cfg)]
  if len(got) > 1:  # Only Llama and Mistral overlap (a Mistral without a window).
    got = [f for f in got if (f.windows != "none") == bool(cfg.sliding_window)]
  if len(got) != 1:
    raise ValueError(
      f"A model with qk_norm={cfg.qk_norm}, attn_bias={cfg.attn_bias}, "
      f"norm_offset={cfg.norm_offset}, post_norms={cfg.post_norms}, "
      f"sliding_window={cfg.sliding_window}, attn_softcap={cfg.attn_softcap} has no Hugging "
      f"Face architecture (supported: {sorted(BY_HF_CLASS)}); it cannot be exported."
    )
  return got[0]


def layer_types(family: Family, hf_config: dict, n_layers: int) -> tuple[str, ...]:
  """config.json's per-layer attention types for a family with a window pattern:
  `layer_types` when given, else every n-th layer full (n = sliding_window_pattern, or the
  family's), as transformers derives them. () for the other families."""
  if family.windows != "pattern":
    return ()
  given = hf_config.get("layer_types")
  if given:
    return tuple(given)
  n = int(hf_config.get("sliding_window_pattern") or family.window_pattern)
  return tuple(
    "full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(n_layers)
  )
