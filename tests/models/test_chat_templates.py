"""hf_tokenizer renders the official Llama 3.1 / 3.2, Qwen2.5 and Qwen3 chat templates as
transformers does.

The templates and transformers' `apply_chat_template(tokenize=False)` output for each case are
committed under tests/fixtures/chat_templates/ (made by
tests/fixtures/make_chat_template_fixtures.py, which also says where each template comes
from). Offline, and without transformers.
"""

import datetime
import hashlib
import json
import pathlib
import shutil

import pytest

from grpo_jax.models import hf_tokenizer

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures"
TEMPLATES = FIXTURES / "chat_templates"
EXPECTED = json.loads((TEMPLATES / "expected.json").read_text(encoding="utf-8"))
FAMILIES = EXPECTED["families"]
CASES = EXPECTED["cases"]


def case_id(case):
  return f"{case['family']}-{case['name']}"


def template(family):
  return (TEMPLATES / FAMILIES[family]["template"]).read_text(encoding="utf-8")


def make_dir(dst, family, *, in_config=False):
  """The family's fixture tokenizer with its special tokens and its template, in `dst`.

  The template goes to chat_template.jinja, or to tokenizer_config.json with `in_config`.
  """
  info = FAMILIES[family]
  src = FIXTURES / "hf" / info["fixture"]
  dst.mkdir(parents=True)
  for name in ("tokenizer.json", "generation_config.json"):
    shutil.copy(src / name, dst / name)
  config = json.loads((src / "tokenizer_config.json").read_text())
  config.pop("chat_template")
  config.update({"bos_token": None, "pad_token": None, **info["special_tokens"]})
  if in_config:
    config["chat_template"] = template(family)
  else:
    (dst / "chat_template.jinja").write_text(template(family), encoding="utf-8")
  (dst / "tokenizer_config.json").write_text(json.dumps(config))
  return dst


@pytest.fixture(scope="module")
def toks(tmp_path_factory):
  root = tmp_path_factory.mktemp("chat_templates")
  return {f: hf_tokenizer.load(make_dir(root / f, f)) for f in FAMILIES}


def today():
  return datetime.datetime.now().strftime(EXPECTED["today_format"])


def render(tok, case):
  """Our render of `case`, and transformers' text with today's date where it had it."""
  before = today()
  text = tok.apply_chat_template(case["messages"], **case["kwargs"])
  if before != today():
    pytest.skip("Rendered across midnight.")
  return text, case["text"].replace(EXPECTED["today_marker"], before)


# ---------------------------------------------------------------- The fixtures


def test_templates_are_the_recorded_files():
  for family, info in FAMILIES.items():
    assert hashlib.sha256(template(family).encode()).hexdigest() == info["sha256"], family


def test_every_family_has_the_required_cases():
  names = {f: {c["name"] for c in CASES if c["family"] == f} for f in FAMILIES}
  common = {
    "single_user_gen",
    "multi_turn_gen",
    "multi_turn_no_gen",
    "no_system_multi_turn_gen",
    "ends_with_assistant",
    "whitespace",
    "non_ascii",
    "tools_none",
    "think_in_history",
  }
  assert all(common <= n for n in names.values()), names
  assert {"thinking_off_gen", "reasoning_stripped_from_history"} <= names["qwen3"]
  assert all(isinstance(c["kwargs"]["add_generation_prompt"], bool) for c in CASES)


# ---------------------------------------------------------------- Parity with transformers


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_render_matches_transformers(toks, case):
  ours, theirs = render(toks[case["family"]], case)
  assert ours == theirs


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_encode_chat_decodes_to_the_text(toks, case):
  tok = toks[case["family"]]
  ids = tok.encode_chat(case["messages"], **case["kwargs"])
  _, text = render(tok, case)
  assert tok.decode_all(ids) == text
  # Control-token text became the token itself (one id each), and no BOS was added twice.
  added = json.loads(tok.files.tokenizer_json)["added_tokens"]
  for t in added:
    assert ids.count(t["id"]) == text.count(t["content"]), t["content"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_template_in_tokenizer_config_renders_alike(tmp_path, toks, family):
  tok = hf_tokenizer.load(make_dir(tmp_path / family, family, in_config=True))
  assert tok.files.template_jinja is None
  for case in (c for c in CASES if c["family"] == family):
    assert render(tok, case) == render(toks[family], case), case["name"]


# ---------------------------------------------------------------- The cases discriminate


PAIRS = [(f, g) for f in sorted(FAMILIES) for g in sorted(FAMILIES) if f != g]


@pytest.mark.parametrize("family,other", PAIRS, ids=[f"{f}-by-{g}" for f, g in PAIRS])
def test_another_family_template_fails_the_cases(toks, family, other):
  # Some cases render alike under two templates (Qwen2.5 and Qwen3 with a system prompt and no
  # reasoning; Llama 3.1 and 3.2 given date_string), but each family has cases no other passes.
  cases = [c for c in CASES if c["family"] == family]
  failed = [c["name"] for c in cases if render(toks[other], c)[0] != render(toks[family], c)[1]]
  assert failed, f"{other}'s template passes every {family} case"


def test_llama_3_2_differs_from_3_1_by_the_default_date(toks):
  def texts(family, name):
    case = next(c for c in CASES if (c["family"], c["name"]) == (family, name))
    return render(toks[family], case)[1], render(toks["llama3_1"], case)[0]

  for name in ("multi_turn_gen", "whitespace"):
    assert texts("llama3_2", name)[0] == texts("llama3_1", name)[0]
  text_3_2, rendered_by_3_1 = texts("llama3_2", "default_date")
  assert f"Today Date: {today()}\n" in text_3_2
  assert "Today Date: 26 Jul 2024\n" in rendered_by_3_1


def test_qwen3_thinking_switch_and_history():
  by_name = {c["name"]: c["text"] for c in CASES if c["family"] == "qwen3"}
  assert by_name["thinking_off_gen"] == by_name["single_user_gen"] + "<think>\n\n</think>\n\n"
  assert by_name["thinking_on_gen"] == by_name["single_user_gen"]
  assert "<think>" not in by_name["reasoning_stripped_from_history"]
  assert "<think>\nAdd them.\n</think>\n\nIt is 5." in by_name["final_assistant_keeps_reasoning"]
