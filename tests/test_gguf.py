"""GGUF import (`gguf_import`, through `hf` and `hf_tokenizer`) on files the tests write with
`gguf.GGUFWriter` (tests/gguf_files.py): dequantization against numpy decoders written
from ggml's block layouts, llama.cpp's q/k permutation undone, the same model as the HF
import of the same weights, the tokenizer rebuilt from the metadata, the export, errors."""

import json
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the GGUF importer needs `pip install gguf`")

import gguf_files  # noqa: E402 -- tests/ is on sys.path.

from grpo_jax import build  # noqa: E402
from grpo_jax.infra import config_lib  # noqa: E402
from grpo_jax.models import gguf_import, hf, hf_tokenizer, model  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
    gguf_import.GGUFError, match=r"unsupported architecture 'phi3'; supported: \['llama'"
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


def test_sentencepiece_vocabulary_is_refused(tmp_path):
  gguf_files.write_llama(tmp_path / "s.gguf", {}, tokenizer_model="llama")
  with pytest.raises(gguf_import.GGUFError, match=r"tokenizer.ggml.model='llama' is not supported"):
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
