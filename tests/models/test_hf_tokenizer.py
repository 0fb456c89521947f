"""hf_tokenizer against the transformers outputs recorded in tests/fixtures/hf/*/expected.json."""

import datetime
import json
import pathlib
import pickle
import shutil
import subprocess
import sys
import threading

import pytest
import tokenizers as hf_tokenizers

from grpo_jax.models import hf_tokenizer, tokenizers

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "hf"
ARCHS = ("llama", "qwen2", "qwen3")
FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
# The fixtures' generation_config.json eos lists: Llama [<|end_of_text|>, <|eot_id|>],
# ChatML [<|im_end|>, <|endoftext|>], and bos_token_id <|endoftext|> for ChatML.
LLAMA_GENERATION = {"bos_token_id": 0, "eos_token_id": [1, 4]}
CHATML_GENERATION = {"bos_token_id": 0, "eos_token_id": [2, 0], "pad_token_id": 0}


def expected(arch):
  return json.loads((FIXTURES / arch / "expected.json").read_text())


def copy(tmp_path, arch, *, config=None, generation=None):
  """The fixture's tokenizer files in tmp_path, with keys of the two configs replaced."""
  dst = tmp_path / arch
  dst.mkdir(parents=True)
  for name in FILES:
    shutil.copy(FIXTURES / arch / name, dst / name)
  for name, edits in (("tokenizer_config.json", config), ("generation_config.json", generation)):
    if edits is not None:
      data = json.loads((dst / name).read_text())
      (dst / name).write_text(json.dumps({**data, **edits}))
  return dst


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
  return request.param


@pytest.fixture(scope="module")
def llama():
  return hf_tokenizer.load(FIXTURES / "llama")


@pytest.fixture(scope="module")
def qwen():
  return hf_tokenizer.load(FIXTURES / "qwen2")


# ---------------------------------------------------------------- Parity with transformers


def test_encode_decode_match_transformers(arch):
  tok, exp = hf_tokenizer.load(FIXTURES / arch), expected(arch)
  assert [tok.encode(t) for t in exp["texts"]] == exp["ids"]
  assert [tok.encode(t, add_bos=True) for t in exp["texts"]] == exp["ids_with_special"]
  assert [tok.decode(ids) for ids in exp["ids"]] == exp["decoded"]
  assert tok.vocab_size == exp["tokenizer_size"] == 320


def test_chat_template_matches_transformers(arch):
  tok, exp = hf_tokenizer.load(FIXTURES / arch), expected(arch)
  assert tok.apply_chat_template(exp["messages"]) == exp["chat"]
  assert tok.apply_chat_template(exp["messages"][1:2]) == exp["chat_no_system"]
  assert tok.decode_all(tok.encode_chat(exp["messages"])) == exp["chat"]


def test_is_a_protocol_tokenizer(arch):
  assert isinstance(hf_tokenizer.load(FIXTURES / arch), tokenizers.Tokenizer)


# ---------------------------------------------------------------- Special ids


def test_special_ids_of_the_fixtures(llama, qwen):
  # Llama: BOS from the config; no pad anywhere, so pad falls back to eos (<|eot_id|>).
  assert (llama.has_bos, llama.bos_id, llama.eos_ids, llama.eos_id, llama.pad_id) == (
    True,
    0,
    (4, 1),
    4,
    4,
  )
  assert [llama.token_str(i) for i in (0, 4)] == ["<|begin_of_text|>", "<|eot_id|>"]
  # ChatML: bos_token null, so no BOS and bos_id is pad_id (<|endoftext|>).
  assert (qwen.has_bos, qwen.bos_id, qwen.eos_ids, qwen.eos_id, qwen.pad_id) == (
    False,
    0,
    (2, 0),
    2,
    0,
  )
  assert [qwen.token_str(i) for i in (0, 1, 2)] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def test_eos_ids_union_config_first(tmp_path):
  llama = hf_tokenizer.load(copy(tmp_path, "llama", generation=LLAMA_GENERATION))
  assert (llama.eos_ids, llama.eos_id, llama.pad_id, llama.bos_id) == ((4, 1), 4, 4, 0)
  assert [llama.token_str(i) for i in llama.eos_ids] == ["<|eot_id|>", "<|end_of_text|>"]
  qwen = hf_tokenizer.load(copy(tmp_path, "qwen2", generation=CHATML_GENERATION))
  assert (qwen.eos_ids, qwen.eos_id, qwen.pad_id) == ((2, 0), 2, 0)
  assert [qwen.token_str(i) for i in qwen.eos_ids] == ["<|im_end|>", "<|endoftext|>"]
  # generation_config's bos_token_id does not give Qwen a BOS.
  assert (qwen.has_bos, qwen.encode("hi", add_bos=True)) == (False, [74, 75])


def test_pad_precedence_and_dict_tokens(tmp_path):
  gen_pad = hf_tokenizer.load(copy(tmp_path, "llama", generation={"pad_token_id": 1}))
  assert gen_pad.pad_id == 1
  dicts = {
    "eos_token": {"content": "<|end_of_text|>"},
    "pad_token": {"content": "<|start_header_id|>"},
  }
  cfg_pad = hf_tokenizer.load(
    copy(tmp_path / "b", "llama", config=dicts, generation={"pad_token_id": 1})
  )
  assert (cfg_pad.pad_id, cfg_pad.eos_ids) == (2, (1, 4))


def test_encode_bos_and_eos(llama, qwen):
  assert llama.encode("hi") == [76, 77]
  assert llama.encode("hi", add_bos=True, add_eos=True) == [0, 76, 77, 4]
  assert llama.encode("<|begin_of_text|>hi", add_bos=True) == [0, 76, 77]  # No double BOS.
  assert qwen.encode("hi", add_bos=True, add_eos=True) == [74, 75, 2]
  assert qwen.encode("<|im_start|>hi<|im_end|>") == [1, 74, 75, 2]


def test_encode_chat_ids(llama, qwen):
  msgs = expected("llama")["messages"][1:2]
  # transformers' apply_chat_template(tokenize=True) gives these ids: one BOS, from the template.
  assert llama.encode_chat(msgs) == [
    0, 2, 89, 87, 266, 3, 203, 203, 59, 76, 69, 88, 289, 316, 315, 225, 23, 35, 4,
    2, 69, 87, 87, 278, 88, 299, 88, 3, 203, 203,
  ]  # fmt: skip
  ids = qwen.encode_chat(msgs)  # No BOS; three <|im_start|>, two <|im_end|>.
  assert (ids[0], ids.count(1), ids.count(2), ids[-9:]) == (
    1,
    3,
    2,
    [1, *qwen.encode("assistant\n")],
  )
  assert (
    qwen.decode_all(ids, skip_special_tokens=True)
    == "system\nYou are a helpful assistant.\nuser\nWhat is 2 + 3?\nassistant\n"
  )


# ---------------------------------------------------------------- Decode


def test_decode_stops_at_any_eos_and_drops_padding(tmp_path, qwen):
  tok = hf_tokenizer.load(copy(tmp_path, "qwen2", generation=CHATML_GENERATION))
  hi = tok.encode("hi")
  assert tok.decode([0, 0, *hi, 2, 74]) == "hi"
  assert tok.decode([*hi, 0, 74]) == "hi"  # <|endoftext|> is an EOS id here (and the pad).
  one_eos = hf_tokenizer.load(copy(tmp_path / "one", "qwen2", generation={"eos_token_id": 2}))
  assert one_eos.decode([0, 0, *hi, 0, 74, 2, 74]) == "hih"  # ... but only the pad here.
  assert qwen.decode_all([0, *hi, 2, 74]) == "<|endoftext|>hi<|im_end|>h"


def test_decode_with_pad_equal_to_eos(llama):
  # Llama's pad is its EOS: left padding is dropped, the first EOS after text stops.
  assert llama.decode([4, 4, 0, 76, 77, 4, 76, 4]) == "hi"


def test_decode_drops_ids_past_the_tokenizer_and_rejects_negative(qwen):
  assert qwen.decode([74, 350, 75]) == "hi"  # Qwen's padded embedding rows.
  with pytest.raises(
    ValueError, match=r"Negative token id -1 given to the tokenizer of .*qwen2/tokenizer\.json"
  ):
    qwen.decode([74, -1])
  with pytest.raises(
    ValueError,
    match=r"Token id 320 is not in the vocabulary of .*qwen2/tokenizer\.json \(size 320\)",
  ):
    qwen.token_str(320)


def _wordpiece(tmp_path, words):
  """A WordPiece (BERT-style) tokenizer directory with clean_up_tokenization_spaces set."""
  vocab = {w: i for i, w in enumerate(["[UNK]", "[SEP]", *words])}
  tok = hf_tokenizers.Tokenizer(hf_tokenizers.models.WordPiece(vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = hf_tokenizers.pre_tokenizers.BertPreTokenizer()
  tok.decoder = hf_tokenizers.decoders.WordPiece()
  dst = tmp_path / "wordpiece"
  dst.mkdir()
  tok.save(str(dst / "tokenizer.json"))
  config = {"eos_token": "[SEP]", "unk_token": "[UNK]", "clean_up_tokenization_spaces": True}
  (dst / "tokenizer_config.json").write_text(json.dumps(config))
  return dst


# (text, decoded with the clean-up): transformers 5.23 gives these for a WordPiece model
# and for a BPE model with the force flag; a BPE model alone decodes the text unchanged.
CLEAN_UP = [
  ("x ' y", "x'y"),
  ("a , b . c 're", "a, b. c're"),
  ("I 'm here , ok ?", "I'm here, ok?"),
  ("it is n't", "it isn't"),
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_clean_up_tokenization_spaces_is_ignored_for_bpe(tmp_path, arch):
  on = {"clean_up_tokenization_spaces": True}
  tok = hf_tokenizer.load(copy(tmp_path / "a", arch, config=on))
  assert [tok.decode(tok.encode(t)) for t, _ in CLEAN_UP] == [t for t, _ in CLEAN_UP]
  forced = hf_tokenizer.load(
    copy(tmp_path / "b", arch, config={**on, hf_tokenizer.FORCE_BPE_CLEAN_UP: True})
  )
  assert [forced.decode(forced.encode(t)) for t, _ in CLEAN_UP] == [c for _, c in CLEAN_UP]


def test_clean_up_tokenization_spaces_applies_to_wordpiece(tmp_path):
  words = ["x", "'", "y", "a", ",", "b", ".", "c", "re", "I", "m", "here", "ok", "?", "it"]
  tok = hf_tokenizer.load(_wordpiece(tmp_path, [*words, "is", "n", "t"]))
  assert [tok.decode(tok.encode(t)) for t, _ in CLEAN_UP] == [c for _, c in CLEAN_UP]


# ---------------------------------------------------------------- Vocab size


def test_check_model_vocab(llama):
  hf_tokenizer.check_model_vocab(llama, 320, path="ckpt/config.json")
  hf_tokenizer.check_model_vocab(llama, 384, path="ckpt/config.json")
  with pytest.raises(
    ValueError,
    match=r"llama/tokenizer\.json has 320 tokens but the model at ckpt/config\.json has a vocabulary of 319",
  ):
    hf_tokenizer.check_model_vocab(llama, 319, path="ckpt/config.json")


# ---------------------------------------------------------------- Special-token text as text


def _special_ids(tok) -> dict[int, str]:
  """The tokenizer's special added tokens, id -> text (EOS, BOS, ChatML markers...)."""
  added = hf_tokenizers.Tokenizer.from_str(tok.files.tokenizer_json).get_added_tokens_decoder()
  return {i: t.content for i, t in added.items() if t.special}


def _family(name, tmp_path):
  """A shipped tokenizer per chat template family: Llama 3 (<|eot_id|>), ChatML of Qwen2.5
  and Qwen3 (<|im_end|>, <|endoftext|>), and SmolLM2's (ChatML, from GGUF metadata)."""
  if name != "smollm2_gguf":
    return hf_tokenizer.load(FIXTURES / name)
  import gguf_files  # noqa: PLC0415 -- tests/ is on sys.path; gguf is in the test extra.

  gguf_files.write_llama(tmp_path / "smollm2.gguf", {})
  return hf_tokenizer.load(tmp_path / "smollm2.gguf")


@pytest.mark.parametrize("family", [*ARCHS, "smollm2_gguf"])
def test_special_token_text_encodes_as_text_with_special_false(family, tmp_path):
  """Every special token's text inside an observation (special=False) encodes to ids none
  of which is a special id (so none is EOS) and decodes back to the same text; the default
  (prompts, chat) still encodes it as the special token."""
  tok = _family(family, tmp_path)
  special = _special_ids(tok)
  assert set(tok.eos_ids) <= set(special) and len(special) >= 3
  for i, content in special.items():
    text = f"got '{content}' then{content}\n{content}"
    ids = tok.encode(text, special=False)
    assert not set(ids) & set(special), (content, ids)
    assert tok.decode(ids) == text
    assert i in tok.encode(text)  # Prompts keep special tokens (unchanged).
  assert tok.encode("plain text 12", special=False) == tok.encode("plain text 12")


def test_special_false_never_changes_what_other_threads_encode(qwen):
  """Observations (special=False) and prompts (the default) encoded at once from several
  threads: each gets its own rule (no tokenizer-wide flag is toggled)."""
  text = "a<|im_end|>b<|endoftext|>"
  want = {True: qwen.encode(text), False: qwen.encode(text, special=False)}
  assert want[True] != want[False]
  got, start = [], threading.Barrier(4)

  def work(k):
    start.wait()
    got.extend((k % 2 == 0, qwen.encode(text, special=k % 2 == 0)) for _ in range(300))

  threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(got) == 1200 and all(ids == want[kind] for kind, ids in got)
  back = pickle.loads(pickle.dumps(qwen))
  assert back.encode(text, special=False) == want[False] and back.encode(text) == want[True]


def test_the_character_tokenizer_takes_special_false():
  tok = tokenizers.CharTokenizer("<>eos|imnd_ ")
  ids = tok.encode("<eos> <|im_end|>", special=False)
  assert ids == tok.encode("<eos> <|im_end|>") and tok.eos_id not in ids
  assert tok.decode(ids) == "<eos> <|im_end|>"


# ---------------------------------------------------------------- Pickling


def test_pickle_round_trip_without_the_files(tmp_path):
  exp = expected("qwen3")
  tok = hf_tokenizer.load(copy(tmp_path, "qwen3", generation=CHATML_GENERATION))
  data = pickle.dumps(tok)
  shutil.rmtree(tmp_path / "qwen3")
  back = pickle.loads(data)
  assert (back.eos_ids, back.pad_id, back.has_bos, back.vocab_size) == ((2, 0), 0, False, 320)
  assert [back.encode(t) for t in exp["texts"]] == exp["ids"]
  assert back.apply_chat_template(exp["messages"]) == exp["chat"]


# ---------------------------------------------------------------- Chat templates


def test_raise_exception_names_the_role_and_file(llama):
  with pytest.raises(
    hf_tokenizer.ChatTemplateError,
    match=r"llama/tokenizer_config\.json raised an error: Unknown role tool",
  ):
    llama.apply_chat_template([{"role": "tool", "content": "42"}])


def test_template_features(tmp_path):
  template = (
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
    "{% set ns.n = ns.n + 1 %}{{ m | tojson }}\n{% endfor %}{{ ns.n }} {{ tools | tojson(indent=1) }} "
    "{{ strftime_now('%Y') }} {{ bos_token is defined }} {{ eos_token }} {{ extra }}"
  )
  tok = hf_tokenizer.load(copy(tmp_path, "qwen2", config={"chat_template": template}))
  msgs = [{"role": "user", "content": "é <b>", "name": None}, {"role": "skip", "content": ""}]
  year = datetime.datetime.now().year
  assert tok.apply_chat_template(msgs, tools=[{"n": "f"}], extra=(1, 2)) == (
    f'{{"role": "user", "content": "é <b>"}}\n1 [\n {{\n  "n": "f"\n }}\n] {year} False <|im_end|> [1, 2]'
  )


def test_generation_blocks_render_their_body(tmp_path):
  # As transformers 5.23 renders it: the body is a call block, so its `set` stays inside.
  template = (
    "{% set x = 'out' %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% generation %}[{{ m.content }}{% set x = 'in' %}]{% endgeneration %}"
    "{% else %}<{{ m.content }}>{% endif %}{% endfor %}{{ x }}"
    "{% if add_generation_prompt %}{% generation %}A:{% endgeneration %}{% endif %}"
  )
  tok = hf_tokenizer.load(copy(tmp_path, "qwen2", config={"chat_template": template}))
  msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
  assert tok.apply_chat_template(msgs) == "<q>[a]outA:"
  assert tok.apply_chat_template(msgs, add_generation_prompt=False) == "<q>[a]out"


def test_named_templates(tmp_path):
  named = [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]
  tok = hf_tokenizer.load(copy(tmp_path, "qwen2", config={"chat_template": named}))
  assert (tok.apply_chat_template([]), tok.apply_chat_template([], tools=[])) == ("D", "T")
  (tmp_path / "qwen2" / "chat_template.jinja").write_text("J{{ messages | length }}")
  assert hf_tokenizer.load(tmp_path / "qwen2").apply_chat_template([]) == "J0"


def test_template_errors(tmp_path):
  missing = hf_tokenizer.load(copy(tmp_path / "a", "qwen2", config={"chat_template": None}))
  with pytest.raises(
    ValueError, match=r"No chat template: .*a/qwen2/tokenizer_config\.json has no chat_template"
  ):
    missing.apply_chat_template([])
  no_default = hf_tokenizer.load(
    copy(tmp_path / "b", "qwen2", config={"chat_template": [{"name": "x", "template": ""}]})
  )
  with pytest.raises(
    ValueError, match=r"tokenizer_config\.json: chat templates \['x'\] include none named 'default'"
  ):
    no_default.apply_chat_template([])
  bad = hf_tokenizer.load(copy(tmp_path / "c", "qwen2", config={"chat_template": "{% if %}"}))
  with pytest.raises(
    hf_tokenizer.ChatTemplateError, match=r"c/qwen2/tokenizer_config\.json does not parse"
  ):
    bad.apply_chat_template([])


# ---------------------------------------------------------------- File errors


def test_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"Tokenizer directory .*nowhere does not exist"):
    hf_tokenizer.load(tmp_path / "nowhere")
  dst = copy(tmp_path, "llama")
  (dst / "tokenizer.json").unlink()
  with pytest.raises(
    FileNotFoundError, match=r"llama has no tokenizer\.json: expected a Hugging Face fast tokenizer"
  ):
    hf_tokenizer.load(dst)


@pytest.mark.parametrize("name", FILES)
def test_malformed_json(tmp_path, name):
  dst = copy(tmp_path, "llama")
  (dst / name).write_text('{"eos_token": ')
  with pytest.raises(ValueError, match=rf"llama/{name} is not valid JSON"):
    hf_tokenizer.load(dst)


def test_bad_special_tokens(tmp_path):
  with pytest.raises(
    ValueError,
    match=r"a/llama/tokenizer_config\.json: eos_token '<\|im_end\|>' is not in the vocabulary",
  ):
    hf_tokenizer.load(copy(tmp_path / "a", "llama", config={"eos_token": "<|im_end|>"}))
  with pytest.raises(
    ValueError,
    match=r"generation_config\.json: eos_token_id must be an int or a list of ints in \[0, 320\)",
  ):
    hf_tokenizer.load(copy(tmp_path / "b", "llama", generation={"eos_token_id": [4, 999]}))
  with pytest.raises(
    ValueError, match=r"No EOS token: neither .*tokenizer_config\.json \(eos_token\) nor"
  ):
    hf_tokenizer.load(
      copy(tmp_path / "c", "llama", config={"eos_token": None}, generation={"eos_token_id": None})
    )


# ---------------------------------------------------------------- No transformers


def test_does_not_import_transformers():
  code = (
    "import sys; from grpo_jax.models import hf_tokenizer as h\n"
    f"t = h.load({str(FIXTURES / 'qwen2')!r})\n"
    "t.decode(t.encode_chat([{'role': 'user', 'content': 'hi'}]))\n"
    "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
