"""GGUF import (`gguf_import`, through `hf` and `hf_tokenizer`) on files the tests write with
`gguf.GGUFWriter` (tests/gguf_files.py): dequantization against numpy decoders written
from ggml's block layouts, llama.cpp's q/k permutation undone, the same model as the HF
import of the same weights, the tokenizer rebuilt from the metadata, the export, errors.
Gemma 2 and Gemma 3: the committed HF fixtures (tests/fixtures/hf/gemma2, gemma3) written
as llama.cpp's converter would, then imported: transformers' logits, a SentencePiece
vocabulary pinned by hand and against transformers' own GGUF tokenizer."""

import dataclasses
import json
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the GGUF importer needs `pip install gguf`")

import gguf_files  # noqa: E402 -- tests/ is on sys.path.

from grpo_jax.infra import config_lib  # noqa: E402
from grpo_jax.models import gguf_import, hf, hf_tokenizer, model  # noqa: E402
from grpo_jax.trainer import build  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
V = len(gguf_files.vocabulary()[0])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  """(path, weights as written: HF layout, dequantized by the test's own decoders)."""
  path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
  return path, gguf_files.write_llama(path, gguf_files.random_weights(V, seed=1))


def _logits(params, cfg, ids):
  ids = jnp.asarray([ids])
  return np.asarray(model.apply(params, ids, model.positions_from_mask(ids >= 0), cfg=cfg)[0])


# ----------------------------------------------------------------------------
# Dequantization.
# ----------------------------------------------------------------------------


def test_numpy_decoders_pinned_by_hand():
  """One block of each type, bytes written out: Q4_1 x = d·q + m (low nibbles first),
  Q8_0 x = d·q."""
  d, m = np.float16(0.5).tobytes(), np.float16(-1.0).tobytes()
  q4 = np.frombuffer(d + m + bytes([0x21, 0xF0] + [0] * 14), np.uint8).reshape(1, 20)
  x = gguf_files.dequantize_q4_1(q4)[0]
  assert x[0] == 0.5 * 1 - 1 and x[16] == 0.5 * 2 - 1  # byte 0x21: low 1, high 2
  assert x[1] == -1.0 and x[17] == 0.5 * 15 - 1  # byte 0xF0: low 0, high 15
  assert x[2] == -1.0
  q8 = np.frombuffer(np.float16(0.25).tobytes() + np.int8([-4, 3] + [0] * 30).tobytes(), np.uint8)
  assert gguf_files.dequantize_q8_0(q8.reshape(1, 34))[0, :3].tolist() == [-1.0, 0.75, 0.0]


@pytest.mark.parametrize("kind", ["F32", "F16", "Q8_0", "Q4_1"])
def test_read_tensor_equals_the_numpy_dequantization(tmp_path, kind):
  w = np.random.default_rng(0).normal(size=(32, 64)).astype(np.float32)
  weights = {"model.layers.0.mlp.up_proj.weight": w}
  expected = gguf_files.write_llama(tmp_path / "t.gguf", weights, types={"ffn_up": kind})
  entry = gguf_import.tensor_index(tmp_path / "t.gguf")["model.layers.0.mlp.up_proj.weight"]
  assert (entry.dtype, entry.shape) == (kind, (32, 64))
  got = hf.read_tensor(entry)
  np.testing.assert_array_equal(got, expected["model.layers.0.mlp.up_proj.weight"])
  error = np.abs(got - w).max()
  assert (error == 0) if kind == "F32" else (0 < error < 0.2)  # A quantized type is lossy.


def test_rope_rows_are_unpermuted():
  """llama.cpp's permute then ours is the identity, and the permute is not (so a missing
  unpermute would show)."""
  w = np.arange(2 * 16 * 3, dtype=np.float32).reshape(32, 3)
  permuted = gguf_files.llama_cpp_permute(w, 2)
  assert not np.array_equal(permuted, w)
  # Head 0's rows: HF (half s, pair j) = s·8 + j; llama.cpp interleaves them: 0, 8, 1, 9...
  assert permuted[:4, 0].tolist() == [0.0, 24.0, 3.0, 27.0]
  np.testing.assert_array_equal(gguf_import.unpermute_rope_rows(permuted, 2), w)


# ----------------------------------------------------------------------------
# The model: the HF import of the same weights.
# ----------------------------------------------------------------------------


def _as_hf_checkpoint(directory: pathlib.Path, weights: dict, hf_config: dict) -> pathlib.Path:
  directory.mkdir()
  shapes = {k: (v.shape, np.float32) for k, v in weights.items()}
  hf.write_safetensors(directory / "model.safetensors", list(weights.items()), shapes=shapes)
  (directory / "config.json").write_text(json.dumps(hf_config))
  return directory


def test_import_equals_the_hf_import_of_the_same_weights(written, tmp_path):
  path, expected = written
  hf_config = hf.read_config(path)
  assert (hf_config["num_hidden_layers"], hf_config["head_dim"], hf_config["vocab_size"]) == (
    2,
    16,
    V,
  )
  assert hf_config["tie_word_embeddings"] and hf_config["rope_theta"] == 100_000.0
  cfg = hf.model_config(hf_config)
  ours = hf.load_params(path, cfg)
  ref = hf.load_params(_as_hf_checkpoint(tmp_path / "hf", expected, hf_config), cfg)
  for a, b in zip(*(jax_leaves(p) for p in (ours, ref)), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # A model that kept llama.cpp's row order would compute other logits (RoPE pairs rows).
  scrambled = dict(expected)
  for name in [n for n in expected if "q_proj" in n or "k_proj" in n]:
    scrambled[name] = gguf_files.llama_cpp_permute(expected[name], 4 if "q_proj" in name else 2)
  wrong = hf.load_params(_as_hf_checkpoint(tmp_path / "wrong", scrambled, hf_config), cfg)
  ids = [1, 40, 200, 7, 99, 12, 33]
  assert np.abs(_logits(ours, cfg, ids) - _logits(wrong, cfg, ids)).max() > 0.1


def jax_leaves(tree):
  import jax

  return jax.tree.leaves(tree)


def test_scanned_layers_and_bfloat16(written):
  path, _ = written
  base = hf.model_config(hf.read_config(path))
  cfg = hf.model_config(hf.read_config(path), scan_layers=True, param_dtype="bfloat16")
  a, b = hf.load_params(path, base), hf.load_params(path, cfg)
  assert b["layers"]["attn"]["q"]["kernel"].dtype == jnp.bfloat16
  np.testing.assert_allclose(
    np.asarray(b["layers"]["attn"]["q"]["kernel"][1], np.float32),
    np.asarray(a["layer_1"]["attn"]["q"]["kernel"]),
    rtol=2**-8,
  )


# ----------------------------------------------------------------------------
# The tokenizer.
# ----------------------------------------------------------------------------


def test_tokenizer_from_the_metadata(written):
  path, _ = written
  tok = hf_tokenizer.load(path)
  assert (tok.vocab_size, tok.eos_ids, tok.pad_id, tok.has_bos) == (V, (2,), 2, False)
  # Ids: 3 specials, then byte b at b + 3, then the merges' tokens at 259.. in order.
  # "the": t h e -> t he (merge "h e"); " a": merge "Ġ a" (id 262); smollm's pre-tokenizer
  # splits digits first, so " 12" stays Ġ 1 2 (merges "Ġ 1", "1 2" unused).
  assert tok.encode("the a 12") == [ord("t") + 3, 260, 262, 35, ord("1") + 3, ord("2") + 3]
  assert tok.encode("<|im_end|>x") == [2, ord("x") + 3]
  assert tok.decode(tok.encode("héllo wörld ✓") + [2, 5]) == "héllo wörld ✓"
  chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
  assert chat == (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  )
  assert tok.encode_chat([{"role": "user", "content": "hi"}])[:2] == [1, ord("s") + 3]


def test_gpt2_pre_tokenizer_merges_digits(tmp_path):
  """The pre-tokenizer follows tokenizer.ggml.pre: GPT-2's keeps " 12" one piece, so the
  merges apply ("1 2" ranks before "Ġ 1"): Ġ 12."""
  gguf_files.write_llama(tmp_path / "g.gguf", {}, pre="gpt2")
  assert hf_tokenizer.load(tmp_path / "g.gguf").encode(" 12") == [35, 263]


def test_tokenizer_pickles(written):
  import pickle

  tok = hf_tokenizer.load(written[0])
  assert pickle.loads(pickle.dumps(tok)).encode("the 12") == tok.encode("the 12")


# ----------------------------------------------------------------------------
# Gemma 2 and Gemma 3: the committed HF fixtures, as llama.cpp's converter writes them.
# ----------------------------------------------------------------------------

HF_FIXTURES = ROOT / "tests" / "fixtures" / "hf"
TOL = 1e-4  # Max abs logit difference against transformers' (test_hf's bar).
# SentencePiece ids (gguf_files.sentencepiece_vocabulary): specials 0..5, the two-space
# user-defined token 6, byte b at 7 + b, SPM_PIECES from 263.
BYTE = 7
PIECE = {t: 263 + k for k, t in enumerate(gguf_files.SPM_PIECES)}
# transformers 5.18's own GGUF tokenizer (AutoTokenizer.from_pretrained(dir,
# gguf_file=...), add_special_tokens=False) on the Gemma 2 file of `gemma_file`, run once.
TRANSFORMERS_IDS = {
  "hello world": [264, 284, 304, 293],
  "a   b": [299, 6, 295, 105],
  "héllo wörld ✓": [297, 202, 176, 284, 304, 273, 202, 189, 305, 291, 295, 233, 163, 154],
  "<start_of_turn>user\nhi<end_of_turn>": [4, 311, 303, 268, 17, 297, 300, 5],
  "12 123": [294, 295, 294, 315],
  "  leading": [6, 308, 298, 299, 307, 269],
  "The answer is \\boxed{72}.": [91, 264, 277, 303, 306, 268, 282, 295, 99, 105, 304, 127]
  + [298, 307, 130, 62, 314, 132, 316],
  "in the world, is it? and hello!": [266, 265, 293, 317, 282, 295, 300, 296, 319, 279, 290]
  + [318],
  "   ": [6, 295],
  " hell hello heller": [289, 290, 289, 268],
  "Über naïve café ✓ 数学 🙂": [202, 163, 105, 268, 295, 301, 299, 202, 182, 125, 298, 295]
  + [309, 299, 109, 202, 176, 295, 233, 163, 154, 295, 237, 156, 183, 236, 180, 173, 295]
  + [247, 166, 160, 137],
}


def _hf_weights(d: pathlib.Path) -> dict[str, np.ndarray]:
  return {n: np.asarray(hf.read_tensor(e), np.float32) for n, e in hf.tensor_index(d).items()}


@pytest.fixture(scope="module", params=["gemma2", "gemma3"])
def gemma_file(request, tmp_path_factory):
  """(fixture dir, GGUF path, weights as a reader should get them back) of one family."""
  d = HF_FIXTURES / request.param
  path = tmp_path_factory.mktemp("gemma") / f"{request.param}.gguf"
  return d, path, gguf_files.write_gemma(path, hf.read_config(d), _hf_weights(d))


def test_gemma_import_matches_transformers(gemma_file):
  """Config, tensors and logits of the imported file are the HF checkpoint's: the norms'
  + 1 undone, Gemma's norm names mapped, the logits transformers' within TOL. GGUF holds
  no query_pre_attn_scalar: the import says head_dim, as llama.cpp computes, where these
  fixtures' config.json says otherwise (24, 16), so the logits take the fixture's value."""
  d, path, expected = gemma_file
  hf_cfg = hf.model_config(hf.read_config(d))
  cfg = hf.model_config(hf.read_config(path))
  assert cfg == dataclasses.replace(hf_cfg, query_pre_attn_scalar=float(hf_cfg.head_dim))
  assert hf_cfg.query_pre_attn_scalar != hf_cfg.head_dim  # The one thing GGUF cannot carry.
  index, originals = hf.tensor_index(path), _hf_weights(d)
  assert set(index) == set(originals)
  for name, entry in index.items():
    np.testing.assert_array_equal(hf.read_tensor(entry), expected[name])
    np.testing.assert_allclose(expected[name], originals[name], atol=2e-7)
  norm = "model.layers.0.pre_feedforward_layernorm.weight"
  assert index[norm].name == "blk.0.ffn_norm.weight" and index[norm].norm_shift == 1.0
  ref = np.load(d / "expected.npz")
  mask = ref["attention_mask"]
  run = dataclasses.replace(cfg, query_pre_attn_scalar=hf_cfg.query_pre_attn_scalar)
  logits, _ = model.apply(
    hf.load_params(path, run),
    jnp.asarray(ref["input_ids"]),
    model.positions_from_mask(jnp.asarray(mask)),
    cfg=run,
  )
  keep = mask.astype(bool)
  assert np.abs(np.asarray(logits)[keep] - ref["logits"][keep]).max() <= TOL


def _config_only(tmp_path, arch: str, **kwargs) -> dict:
  """config.json of a Gemma file with the fixture's metadata (changed by `hf_changes`) and
  only the embedding table."""
  c = dict(hf.read_config(HF_FIXTURES / arch), **kwargs.pop("hf_changes", {}))
  embed = {"model.embed_tokens.weight": np.zeros((c["vocab_size"], c["hidden_size"]), np.float32)}
  gguf_files.write_gemma(tmp_path / f"{arch}.gguf", c, embed, **kwargs)
  return hf.read_config(tmp_path / f"{arch}.gguf")


def test_gemma_config_follows_llama_cpp(tmp_path):
  """What llama.cpp assumes where the file is silent: Gemma 2's 4096 window and soft-caps
  50 / 30; Gemma 3 without a window has no sliding layer; a 27B block count (46, 62)
  scales queries by (d_model / n_heads)^-1/2 = 8^-1/2 here; a window pattern (period or
  per-layer) and Gemma 3's sliding rope base are read when the file has them."""
  silent = ("attn_logit_softcapping", "final_logit_softcapping", "attention.sliding_window")
  g2 = hf.model_config(_config_only(tmp_path, "gemma2", drop_keys=silent))
  assert (g2.sliding_window, g2.attn_softcap, g2.final_softcap) == (4096, 50.0, 30.0)
  assert g2.sliding_layers == (True, False) * 2 and g2.query_pre_attn_scalar == 16.0
  g3 = hf.model_config(_config_only(tmp_path, "gemma3", drop_keys=("attention.sliding_window",)))
  assert (g3.sliding_window, any(g3.sliding_layers), g3.attn_softcap) == (0, False, 0.0)
  wide = _config_only(tmp_path, "gemma2", hf_changes=dict(num_hidden_layers=46))
  assert wide["query_pre_attn_scalar"] == 32 // 4
  wide = _config_only(tmp_path, "gemma3", hf_changes=dict(num_hidden_layers=62))
  assert wide["query_pre_attn_scalar"] == 32 // 4
  pattern = dict(extra={"attention.sliding_window_pattern": 3, "rope.freq_base_swa": 500.0})
  g3 = hf.model_config(_config_only(tmp_path, "gemma3", **pattern))
  assert g3.sliding_layers == (True, True, False) * 2 and g3.rope_local_theta == 500.0
  per_layer = dict(extra={"attention.sliding_window_pattern": [True, False, False, True]})
  assert hf.model_config(_config_only(tmp_path, "gemma2", **per_layer)).sliding_layers == (
    True, False, False, True,
  )  # fmt: skip


def test_sentencepiece_tokenizer_pinned_by_hand(gemma_file):
  """Merges by score: "▁t" (score 0) before "he" (-1) makes " the" one piece ▁t·he ->
  ▁the, while "the" (no ▁: add_space_prefix is false) stays t, he; "ing" (-6) outranks
  "▁in" (-12), so " ing" is ▁, ing. "é" is not a piece: its bytes. The user-defined
  two-space token matches whole in the raw text, "<end_of_turn>" is its control id, and
  ends a turn as <eos> does (llama.cpp's rule by its text; the file names no EOT id)."""
  tok = hf_tokenizer.load(gemma_file[1])
  assert (tok.vocab_size, tok.eos_ids, tok.pad_id, tok.has_bos, tok.bos_id) == (
    320,
    (1, 5),
    0,
    True,
    2,
  )
  assert tok.encode("the") == [PIECE["t"], PIECE["he"]]
  assert tok.encode(" the") == [PIECE["▁the"]]
  assert tok.encode(" ing") == [PIECE["▁"], PIECE["ing"]]
  assert tok.encode("é!") == [BYTE + 0xC3, BYTE + 0xA9, PIECE["!"]]
  assert tok.encode("a  b") == [PIECE["a"], 6, BYTE + ord("b")]
  assert tok.encode("hi<end_of_turn>", add_bos=True) == [2, PIECE["h"], PIECE["i"], 5]
  assert tok.encode("<end_of_turn>", special=False)[:2] == [BYTE + ord("<"), PIECE["e"]]
  text = "  héllo wörld ✓ the 12\tand\n"
  assert tok.decode(tok.encode(text)) == text
  assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == (
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
  )
  assert tok.encode_chat([{"role": "user", "content": "hi"}])[:3] == [2, 4, PIECE["u"]]


def test_sentencepiece_encodings_match_transformers(gemma_file):
  tok = hf_tokenizer.load(gemma_file[1])
  for text, ids in TRANSFORMERS_IDS.items():
    assert tok.encode(text) == ids, text
    assert tok.decode(ids) == text.replace("<start_of_turn>", "").replace("<end_of_turn>", "")


def test_sentencepiece_merges_follow_the_scores(tmp_path):
  """llama.cpp merges the pair whose token scores highest, wherever the token sits in the
  vocabulary: with "▁in" scored above "ing", " ing" is ▁in, g (transformers' Gemma loader
  ranks by position instead and would give ▁, ing). The merges of a small vocabulary, by
  hand: "ab" (-1) before "bc" (-2) before "abc" (-3, its two splits in order)."""
  _config_only(tmp_path, "gemma2", scores={"▁in": 0.5})
  assert hf_tokenizer.load(tmp_path / "gemma2.gguf").encode(" ing") == [PIECE["▁in"], PIECE["g"]]
  merges = gguf_import.sentencepiece_merges(
    ["a", "b", "ab", "c", "abc", "bc", "<0x61>"], [1, 1, 1, 1, 1, 1, 6], [0, 0, -1, 0, -3, -2, 0]
  )
  assert merges == [("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]


def test_sentencepiece_space_prefix(tmp_path):
  """add_space_prefix (llama.cpp's default; Llama 2's files): a ▁ before the text and after
  a special token, dropped again when decoding."""
  _config_only(tmp_path, "gemma2", space_prefix=True)
  tok = hf_tokenizer.load(tmp_path / "gemma2.gguf")
  assert tok.encode("the") == [PIECE["▁the"]]
  assert tok.encode("<start_of_turn>the") == [4, PIECE["▁the"]]
  assert tok.decode(tok.encode("the cat")) == "the cat"


def test_gemma_export_round_trip(gemma_file, tmp_path):
  """hf.export of the imported model reloads to the same params and the same tokenizer."""
  _, path, _ = gemma_file
  config = hf.read_config(path)
  cfg = hf.model_config(config)
  params = hf.load_params(path, cfg)
  out = hf.export(
    params, cfg, tmp_path / "hf", arch=config["model_type"], dtype="float32",
    tokenizer_dir=str(path),
  )  # fmt: skip
  back = hf.load_params(out, hf.model_config(hf.read_config(out)))
  for a, b in zip(jax_leaves(params), jax_leaves(back), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  text = "<start_of_turn>user\n the héllo  12<end_of_turn>"
  assert hf_tokenizer.load(out).encode(text) == hf_tokenizer.load(path).encode(text)


# ----------------------------------------------------------------------------
# Export, hf-check, config.
# ----------------------------------------------------------------------------


def test_export_round_trip(written, tmp_path):
  """hf.export writes safetensors and the tokenizer files from the metadata: the export
  reloads to the same params and the same tokenizer."""
  path, _ = written
  cfg = hf.model_config(hf.read_config(path))
  params = hf.load_params(path, cfg)
  out = hf.export(
    params, cfg, tmp_path / "hf", arch="llama", dtype="float32", tokenizer_dir=str(path)
  )
  back = hf.load_params(out, hf.model_config(hf.read_config(out)))
  for a, b in zip(jax_leaves(params), jax_leaves(back), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tok, tok_back = hf_tokenizer.load(path), hf_tokenizer.load(out)
  text = "<|im_start|>user\nthe 12 ü<|im_end|>"
  assert tok_back.encode(text) == tok.encode(text)
  assert (tok_back.eos_ids, tok_back.pad_id, tok_back.has_bos) == ((2,), 2, False)
  assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True


def test_hf_check_accepts_a_gguf_path(written):
  out = hf.check(written[0], compare=False)
  assert (out["arch"], out["ok"], out["max_abs_diff"]) == ("llama", True, None)
  assert out["params"] == model.param_count(
    hf.load_params(written[0], hf.model_config(hf.read_config(written[0])))
  )


def test_the_tiny_config_builds_from_the_committed_fixture():
  setup = build.build(config_lib.load(f"{ROOT / 'configs' / 'smollm2.py'}:tiny"))
  assert setup.model_cfg.n_layers == 2 and setup.model_cfg.vocab_size == V
  assert setup.sampler_cfg.eos_ids == (2,)
  prompt = setup.task.example("test", 0, seed=0).prompt
  assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")


# ----------------------------------------------------------------------------
# Errors.
# ----------------------------------------------------------------------------


def test_unsupported_architecture(tmp_path):
  gguf_files.write_llama(tmp_path / "p.gguf", {}, arch="phi3")
  with pytest.raises(
    gguf_import.GGUFError,
    match=r"unsupported architecture 'phi3'; supported: \['gemma2', 'gemma3', 'llama', 'qwen2', "
    r"'qwen3'\]",
  ):
    hf.read_config(tmp_path / "p.gguf")


def test_unsupported_tensor_type(tmp_path):
  gguf_files.write_llama(
    tmp_path / "f.gguf", {}, extra_tensors={"blk.0.ffn_up.weight": np.zeros((4, 32))}
  )
  with pytest.raises(
    gguf_import.GGUFError, match=r"blk.0.ffn_up.weight has type F64; supported: F32, F16, BF16"
  ):
    hf.tensor_index(tmp_path / "f.gguf")


def test_unknown_tensor_is_refused_by_the_import(tmp_path):
  weights = gguf_files.random_weights(V)
  gguf_files.write_llama(
    tmp_path / "x.gguf",
    weights,
    extra_tensors={"blk.0.attn_qkv.weight": np.zeros((4, 32), np.float32)},
  )
  cfg = hf.model_config(hf.read_config(tmp_path / "x.gguf"))
  with pytest.raises(hf.CheckpointError, match=r"no place for: \['blk.0.attn_qkv.weight'\]"):
    hf.load_params(tmp_path / "x.gguf", cfg)


def test_unsupported_tokenizer_model_is_refused(tmp_path):
  gguf_files.write_llama(tmp_path / "s.gguf", {}, tokenizer_model="t5")
  with pytest.raises(
    gguf_import.GGUFError,
    match=r"tokenizer.ggml.model='t5' is not supported; supported: 'gpt2' \(byte-level BPE.*"
    r"'llama' \(SentencePiece BPE",
  ):
    hf_tokenizer.load(tmp_path / "s.gguf")


def test_bad_sources(tmp_path):
  with pytest.raises(gguf_import.GGUFError, match="no such GGUF file"):
    hf.read_config(tmp_path / "missing.gguf")
  with pytest.raises(gguf_import.GGUFError, match=r"no installed Python package 'no_such_pkg_x'"):
    hf.read_config("pkg:no_such_pkg_x")
  with pytest.raises(gguf_import.GGUFError, match=r"package 'json' ships 0 .gguf files"):
    hf.read_config("pkg:json")
  (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
  with pytest.raises(gguf_import.GGUFError, match="not a readable GGUF file"):
    hf.read_config(tmp_path / "junk.gguf")


def test_a_missing_gguf_package_is_one_clear_error(monkeypatch, written):
  gguf_import._reader.cache_clear()
  monkeypatch.setitem(sys.modules, "gguf", None)
  with pytest.raises(gguf_import.GGUFError, match=r"needs the `gguf` package: `pip install gguf`"):
    hf.read_config(written[0])
