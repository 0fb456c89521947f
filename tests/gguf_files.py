"""Tiny GGUF files written with `gguf.GGUFWriter`, for tests and the committed fixture.

    python tests/gguf_files.py     # rewrites tests/fixtures/gguf/tiny_llama.gguf

`write_llama(path, weights_hf)` writes HF-layout weights as llama.cpp's converter would
(names `blk.N.attn_q.weight`..., q/k rows permuted for its interleaved RoPE with
`llama_cpp_permute`, a copy of `convert_hf_to_gguf.py`'s `LlamaModel.permute`), each
tensor in the GGML type `types` gives it. `random_weights` makes a small random llama
(norm scales away from 1, peaked logits). The vocabulary is byte-level BPE (GPT-2's byte
alphabet) with ChatML specials and a handful of merges, and SmolLM2's chat template.

`write_gemma(path, hf_config, weights)` writes a Gemma 2 or Gemma 3 text checkpoint (HF
config.json and HF-named weights) as llama.cpp's `convert_hf_to_gguf.py` (Gemma2Model,
Gemma3Model) does: every `*norm.weight` stored as 1 + w, Gemma's tensor names
(post_attention_norm, ffn_norm for pre_feedforward_layernorm, post_ffw_norm), no
output.weight, the metadata keys those classes write and no others (no query_pre_attn_scalar,
no layer pattern, no local rope base; Gemma 2 no rope.freq_base), and a SentencePiece
vocabulary (`sentencepiece_vocabulary`: specials, a user-defined run of two spaces stored as
spaces, the 256 <0xNN> byte tokens, ▁-prefixed pieces with scores) with
add_space_prefix false.

The numpy dequantizers `dequantize_q8_0` and `dequantize_q4_1` are written from the block
layouts in ggml (`ggml-common.h`: block_q8_0 = {f16 d; int8 qs[32]}, x = d·q; block_q4_1 =
{f16 d; f16 m; uint8 qs[16]}, x[j] = d·(qs[j] & 15) + m, x[j + 16] = d·(qs[j] >> 4) + m),
independently of the `gguf` library the importer uses.
"""

from __future__ import annotations

import pathlib

import gguf
import numpy as np

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "gguf" / "tiny_llama.gguf"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = ("Ġ t", "h e", "Ġt he", "Ġ a", "1 2", "Ġ 1")
# SmolLM2-135M-Instruct's chat template (its GGUF's tokenizer.chat_template).
CHAT_TEMPLATE = (
  "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
  "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
  "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
  "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
  "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SHAPE = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128)
# Each kind of tensor in the type llama.cpp's Q4_1 files use, plus F16 for o.
TYPES = {
  "token_embd": "Q8_0",
  "attn_q": "Q4_1",
  "attn_k": "Q4_1",
  "attn_v": "Q4_1",
  "attn_output": "F16",
  "ffn_gate": "Q4_1",
  "ffn_up": "Q4_1",
  "ffn_down": "Q4_1",
}


def byte_alphabet() -> list[str]:
  """GPT-2's `bytes_to_unicode` spelling of the 256 bytes, in byte order."""
  printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
  out, extra = {}, 0
  for b in range(256):
    if b in printable:
      out[b] = chr(b)
    else:
      out[b] = chr(256 + extra)
      extra += 1
  return [out[b] for b in range(256)]


def vocabulary() -> tuple[list[str], list[int]]:
  """(tokens, llama.cpp token types): the specials (CONTROL, 3), the 256 bytes, the merges'
  results (NORMAL, 1)."""
  merged = ["".join(m.split(" ")) for m in MERGES]
  tokens = [*SPECIALS, *byte_alphabet(), *merged]
  return tokens, [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))


def llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
  """llama.cpp `convert_hf_to_gguf.py` LlamaModel.permute (q with H heads, k with K)."""
  return (
    w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
  )


def random_weights(vocab_size: int, *, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
  """HF-named float32 weights of a random llama of SHAPE."""
  rng = np.random.default_rng(seed)
  D, H, K, E, F = (SHAPE[k] for k in ("d_model", "n_heads", "n_kv_heads", "head_dim", "mlp_dim"))
  out = {"model.embed_tokens.weight": rng.normal(0, 1.0, (vocab_size, D))}
  out["model.norm.weight"] = 1 + 0.3 * rng.normal(size=D)
  if not tied:
    out["lm_head.weight"] = rng.normal(0, 0.2, (vocab_size, D))
  for i in range(SHAPE["n_layers"]):
    p = f"model.layers.{i}."
    shapes = {
      "self_attn.q_proj.weight": (H * E, D),
      "self_attn.k_proj.weight": (K * E, D),
      "self_attn.v_proj.weight": (K * E, D),
      "self_attn.o_proj.weight": (D, H * E),
      "mlp.gate_proj.weight": (F, D),
      "mlp.up_proj.weight": (F, D),
      "mlp.down_proj.weight": (D, F),
    }
    for name, shape in shapes.items():
      out[p + name] = rng.normal(0, 0.5 / np.sqrt(shape[1]), shape)
    out[p + "input_layernorm.weight"] = 1 + 0.3 * rng.normal(size=D)
    out[p + "post_attention_layernorm.weight"] = 1 + 0.3 * rng.normal(size=D)
  return {k: v.astype(np.float32) for k, v in out.items()}


_GGUF_NAMES = {
  "self_attn.q_proj.weight": "attn_q.weight",
  "self_attn.k_proj.weight": "attn_k.weight",
  "self_attn.v_proj.weight": "attn_v.weight",
  "self_attn.o_proj.weight": "attn_output.weight",
  "mlp.gate_proj.weight": "ffn_gate.weight",
  "mlp.up_proj.weight": "ffn_up.weight",
  "mlp.down_proj.weight": "ffn_down.weight",
  "input_layernorm.weight": "attn_norm.weight",
  "post_attention_layernorm.weight": "ffn_norm.weight",
}
_GLOBAL = {
  "model.embed_tokens.weight": "token_embd.weight",
  "model.norm.weight": "output_norm.weight",
  "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
  if hf_name in _GLOBAL:
    return _GLOBAL[hf_name]
  _, _, i, rest = hf_name.split(".", 3)
  return f"blk.{i}.{_GGUF_NAMES[rest]}"


def encode(w: np.ndarray, kind: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
  """(data for GGUFWriter.add_tensor, its type) of a float32 array in GGML type `kind`."""
  qtype = gguf.GGMLQuantizationType[kind]
  if kind == "F32":
    return w.astype(np.float32), qtype
  if kind == "F16":
    return w.astype(np.float16), qtype
  return gguf.quants.quantize(w.astype(np.float32), qtype), qtype


def as_written(w: np.ndarray, kind: str) -> np.ndarray:
  """What a reader gets back for w stored as `kind`, by this module's own dequantizers."""
  data, _ = encode(w, kind)
  if kind in ("F32", "F16"):
    return data.astype(np.float32)
  return {"Q8_0": dequantize_q8_0, "Q4_1": dequantize_q4_1}[kind](data).reshape(w.shape)


def dequantize_q8_0(data: np.ndarray) -> np.ndarray:
  blocks = np.asarray(data, np.uint8).reshape(-1, 34)
  d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
  q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
  return (d * q).reshape(data.shape[0], -1)


def dequantize_q4_1(data: np.ndarray) -> np.ndarray:
  blocks = np.asarray(data, np.uint8).reshape(-1, 20)
  d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
  m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
  qs = blocks[:, 4:]
  q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)
  return (d * q + m).reshape(data.shape[0], -1)


def _kind(hf_name: str, types: dict) -> str:
  if hf_name.endswith("norm.weight"):
    return "F32"
  stem = gguf_name(hf_name).split(".")[-2]
  return types.get("token_embd" if stem == "token_embd" else stem, "F32")


def write_llama(
  path,
  weights: dict[str, np.ndarray],
  *,
  types: dict | None = None,
  arch: str = "llama",
  pre: str = "smollm",
  tokenizer_model: str = "gpt2",
  extra_tensors: dict | None = None,
) -> dict[str, np.ndarray]:
  """Writes the HF-named `weights` as a GGUF; returns them as a reader should get them
  back (stored and dequantized by this module, in HF layout: unpermuted)."""
  types = TYPES if types is None else types
  tokens, token_types = vocabulary()
  D, H, K = SHAPE["d_model"], SHAPE["n_heads"], SHAPE["n_kv_heads"]
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(SHAPE["n_layers"])
  w.add_context_length(2048)
  w.add_embedding_length(D)
  w.add_feed_forward_length(SHAPE["mlp_dim"])
  w.add_head_count(H)
  w.add_head_count_kv(K)
  w.add_rope_dimension_count(SHAPE["head_dim"])
  w.add_rope_freq_base(100_000.0)
  w.add_layer_norm_rms_eps(1e-5)
  w.add_vocab_size(len(tokens))
  w.add_tokenizer_model(tokenizer_model)
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types(token_types)
  w.add_token_merges(list(MERGES))
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_unk_token_id(0)
  w.add_pad_token_id(2)
  w.add_add_bos_token(False)
  w.add_chat_template(CHAT_TEMPLATE)
  expected = {}
  for name, value in weights.items():
    kind = _kind(name, types)
    stored = value
    heads = H if "q_proj" in name else K if "k_proj" in name else 0
    if heads and arch == "llama":
      stored = llama_cpp_permute(value, heads)
    data, qtype = encode(stored, kind)
    w.add_tensor(gguf_name(name), data, raw_dtype=qtype)
    expected[name] = as_written(value, kind)  # Rows are quantized alone: unpermuted = same.
  for name, value in (extra_tensors or {}).items():
    w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return expected


# ----------------------------------------------------------------------------
# Gemma 2 / Gemma 3 text, as convert_hf_to_gguf.py writes them.
# ----------------------------------------------------------------------------

# (token, llama.cpp type): Gemma's own first ids, <unk> UNKNOWN (2), the rest CONTROL (3).
SPM_SPECIALS = (
  ("<pad>", 3),
  ("<eos>", 3),
  ("<bos>", 3),
  ("<unk>", 2),
  ("<start_of_turn>", 3),
  ("<end_of_turn>", 3),
)
# Gemma's added "▁▁": llama.cpp's converter writes a user-defined token's ▁ as spaces.
SPM_USER_DEFINED = ("  ",)
# Normal pieces, best first (score -k for the k-th): merged pieces, then single characters
# (SentencePiece ranks those last). "ing" outranks "▁in", so " ing" is ▁ + ing.
SPM_PIECES = (
  *("▁t", "he", "▁the", "in", "▁a", "er", "ing", "▁s", "on", "an", "▁w", "or", "▁in"),
  *("re", "▁an", "nd", "▁and", "at", "is", "▁is", "el", "ll", "lo", "▁h", "▁he", "▁hel"),
  *("▁hell", "▁hello", "ld", "▁wor", "▁world", "12"),
  *("▁", "t", "h", "e", "a", "i", "n", "g", "s", "o", "r", "w", "d", "l", "c", "m", "u"),
  *("y", "1", "2", "3", ".", ",", "!", "?"),
)
# The committed HF Gemma fixtures' chat template (tests/fixtures/hf/gemma2).
GEMMA_CHAT_TEMPLATE = (
  "{{- bos_token }}{%- for message in messages %}{%- set role = 'model' if message['role'] == "
  "'assistant' else message['role'] %}{{- '<start_of_turn>' + role + '\\n' + "
  "message['content'] | trim + '<end_of_turn>\\n' }}{%- endfor %}{%- if add_generation_prompt "
  "%}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)
_GEMMA_NAMES = {
  "input_layernorm.weight": "attn_norm.weight",
  "post_attention_layernorm.weight": "post_attention_norm.weight",
  "pre_feedforward_layernorm.weight": "ffn_norm.weight",
  "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
  "self_attn.q_norm.weight": "attn_q_norm.weight",
  "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def sentencepiece_vocabulary(
  scores: dict[str, float] | None = None,
) -> tuple[list[str], list[float], list[int]]:
  """(tokens, scores, llama.cpp types) of 320 tokens, as `_create_vocab_sentencepiece`
  writes them: specials (score 0), user-defined (-1000), bytes <0x00>..<0xFF> (type 6,
  score 0), SPM_PIECES (type 1, score -k). `scores` overrides pieces' scores."""
  tokens = [t for t, _ in SPM_SPECIALS] + list(SPM_USER_DEFINED)
  types = [ty for _, ty in SPM_SPECIALS] + [4] * len(SPM_USER_DEFINED)
  score = [0.0] * len(SPM_SPECIALS) + [-1000.0] * len(SPM_USER_DEFINED)
  tokens += [f"<0x{b:02X}>" for b in range(256)]
  types += [6] * 256
  score += [0.0] * 256
  tokens += list(SPM_PIECES)
  types += [1] * len(SPM_PIECES)
  score += [-float(k) for k in range(len(SPM_PIECES))]
  score = [(scores or {}).get(t, s) for t, s in zip(tokens, score)]
  assert len(tokens) == 320 and len(set(tokens)) == 320
  return tokens, score, types


def _gemma_metadata(w: gguf.GGUFWriter, c: dict) -> None:
  """The keys Gemma2Model / Gemma3Model.set_gguf_parameters write."""
  w.add_context_length(c["max_position_embeddings"])
  w.add_embedding_length(c["hidden_size"])
  w.add_block_count(c["num_hidden_layers"])
  w.add_feed_forward_length(c["intermediate_size"])
  w.add_head_count(c["num_attention_heads"])
  w.add_head_count_kv(c["num_key_value_heads"])
  w.add_layer_norm_rms_eps(c["rms_norm_eps"])
  w.add_key_length(c["head_dim"])
  w.add_value_length(c["head_dim"])
  if c["model_type"] == "gemma2":
    w.add_attn_logit_softcapping(c["attn_logit_softcapping"])
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
    w.add_sliding_window(c["sliding_window"])
    return
  rope = c.get("rope_parameters") or {}
  full = rope.get("full_attention", rope)
  w.add_rope_freq_base(full.get("rope_theta", c.get("rope_theta", 1_000_000.0)))
  scaling = full if full.get("rope_type") == "linear" else (c.get("rope_scaling") or {})
  if scaling.get("rope_type", scaling.get("type")) == "linear":
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(scaling["factor"])
  if c.get("final_logit_softcapping"):
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
  if c.get("sliding_window_pattern") != 1:
    w.add_sliding_window(c["sliding_window"])


def _sentencepiece_metadata(w: gguf.GGUFWriter, scores: dict | None, space_prefix: bool) -> None:
  tokens, score, types = sentencepiece_vocabulary(scores)
  w.add_tokenizer_model("llama")
  w.add_tokenizer_pre("default")
  w.add_token_list(tokens)
  w.add_token_scores(score)
  w.add_token_types(types)
  w.add_bos_token_id(2)
  w.add_eos_token_id(1)
  w.add_unk_token_id(3)
  w.add_pad_token_id(0)
  w.add_add_bos_token(True)
  w.add_add_eos_token(False)
  w.add_add_space_prefix(space_prefix)
  w.add_chat_template(GEMMA_CHAT_TEMPLATE)


def gemma_gguf_name(hf_name: str) -> str:
  if hf_name in _GLOBAL:
    return _GLOBAL[hf_name]
  _, _, i, rest = hf_name.split(".", 3)
  return f"blk.{i}.{_GEMMA_NAMES.get(rest) or _GGUF_NAMES[rest]}"


def write_gemma(
  path,
  hf_config: dict,
  weights: dict[str, np.ndarray],
  *,
  types: dict | None = None,
  scores: dict[str, float] | None = None,
  space_prefix: bool = False,
  drop_keys: tuple[str, ...] = (),
  extra: dict | None = None,
) -> dict[str, np.ndarray]:
  """Writes a Gemma 2 / Gemma 3 text checkpoint as llama.cpp's converter would; returns the
  HF-layout weights a reader should get back (norms: float32(w + 1) - 1). `types`: GGML
  type per kind as in `write_llama` (default all F32); `scores`: piece scores to change;
  `space_prefix`: tokenizer.ggml.add_space_prefix (Gemma: false). `drop_keys` and `extra`
  ({key: int, float or list}): metadata keys (without the arch prefix) to leave out or add,
  as an older or newer converter might."""
  arch = "gemma2" if hf_config["model_type"] == "gemma2" else "gemma3"
  w = gguf.GGUFWriter(str(path), arch)
  _gemma_metadata(w, hf_config)
  for key in drop_keys:  # The writer's pending key-values (one file: one dict).
    w.kv_data[0].pop(f"{arch}.{key}")
  for key, value in (extra or {}).items():
    add = {int: w.add_uint32, float: w.add_float32, list: w.add_array}[type(value)]
    add(f"{arch}.{key}", value)
  _sentencepiece_metadata(w, scores, space_prefix)
  expected = {}
  for name, value in weights.items():
    if name == "lm_head.weight":  # Tied: filter_tensors drops it.
      continue
    value = np.asarray(value, np.float32)
    kind = (
      "F32" if value.ndim == 1 else (types or {}).get(gemma_gguf_name(name).split(".")[-2], "F32")
    )
    stored = value + np.float32(1) if name.endswith("norm.weight") else value
    data, qtype = encode(stored, kind)
    w.add_tensor(gemma_gguf_name(name), data, raw_dtype=qtype)
    back = as_written(stored, kind)
    expected[name] = back - np.float32(1) if name.endswith("norm.weight") else back
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return expected


if __name__ == "__main__":
  FIXTURE.parent.mkdir(parents=True, exist_ok=True)
  write_llama(FIXTURE, random_weights(len(vocabulary()[0])))
  print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes)")
