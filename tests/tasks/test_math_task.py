"""The dataset math task and the trainer on a Hugging Face checkpoint (committed fixtures)."""

import dataclasses
import json
import pathlib
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.infra import config_lib
from grpo_jax.models import hf, model, sampling
from grpo_jax.trainer import build, train
from grpo_jax.verifiers import math_verify, verdicts

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
QWEN2 = FIXTURES / "hf" / "qwen2"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("tfds"))


@pytest.fixture(scope="module")
def gsm8k(data_dir):
  return tasks.get(
    "math",
    dataset="gsm8k",
    tokenizer_dir=str(QWEN2),
    data_dir=data_dir,
    manual_dir=str(FIXTURES / "data" / "gsm8k"),
  )


def test_prompt_is_the_chat_template_with_the_question(gsm8k):
  ex = gsm8k.example("test", 0, seed=0)
  question = gsm8k.source("test")[0].question
  assert ex.prompt == (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    f"{question}\nPlease reason step by step, and put your final answer within "
    "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
  )
  # Token in: the template's special tokens become their ids in one encode.
  ids = gsm8k.tokenizer().encode(ex.prompt, add_bos=True)
  assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2  # <|im_start|>, <|im_end|>.


def test_stream_is_a_pure_function_of_index_and_seed(gsm8k):
  answers = lambda seed: [gsm8k.example("train", i, seed=seed).answer for i in range(9)]
  assert answers(0) == answers(0)
  assert sorted(answers(0)[:3]) == sorted(p.answer for p in gsm8k.source("train"))  # An epoch.
  # The test split in file order: "the first N problems".
  assert [gsm8k.example("test", i, seed=5).answer for i in range(2)] == [
    p.answer for p in gsm8k.source("test")
  ]


def test_reward_verifies_against_the_gold_answer(gsm8k):
  ex = gsm8k.example("test", 0, seed=0)
  gold = gsm8k.reward_input(ex)
  assert gold == ex.answer != ex.prompt
  assert gsm8k.reward(gold, f"... so the total is \\boxed{{{gold}}}.") == 1.0
  assert gsm8k.reward(gold, "\\boxed{-1}") == 0.0
  assert gsm8k.format_reward(gold, "no answer here") == 0.0
  # Pickled for the reward workers without its data source or tokenizer.
  clone = pickle.loads(pickle.dumps(gsm8k))
  assert clone._sources == {} and clone._tokenizer is None
  assert clone.reward(gold, f"\\boxed{{{gold}}}") == 1.0


def test_verifier_backend_is_a_task_option(gsm8k, data_dir):
  builtin = tasks.get(
    "math",
    dataset="gsm8k",
    tokenizer_dir=str(QWEN2),
    data_dir=data_dir,
    manual_dir=str(FIXTURES / "data" / "gsm8k"),
    verifier_backend="builtin",
  )
  assert gsm8k.reward_fn.backend == "math_verify" and builtin.reward_fn.backend == "builtin"
  # An unboxed labelled answer: accepted by the default backend only.
  assert gsm8k.reward("72", "so $x = 72$") == 1.0
  assert builtin.reward("72", "so $x = 72$") == 0.0
  # An item the verifier cannot decide is a reward error, not a wrong answer.
  with pytest.raises(verdicts.Unscorable):
    gsm8k.reward("12:00", r"\boxed{5}")
  with pytest.raises(ValueError, match="Unknown math verifier backend 'nope'"):
    tasks.get("math", dataset="gsm8k", tokenizer_dir=str(QWEN2), verifier_backend="nope")


def test_think_tags_format_reward(data_dir):
  task = tasks.get(
    "math",
    dataset="gsm8k",
    tokenizer_dir=str(QWEN2),
    data_dir=data_dir,
    manual_dir=str(FIXTURES / "data" / "gsm8k"),
    think_tags=["think"],
  )
  assert task.format_reward("5", "<think>2+3</think> \\boxed{5}") == 1.0
  assert task.format_reward("5", "\\boxed{5}") == 0.0


def test_bad_task_options_are_clear():
  with pytest.raises(ValueError, match=r"Unknown dataset 'gsm9k'; valid: \['gsm8k', 'math'"):
    tasks.get("math", dataset="gsm9k", tokenizer_dir=str(QWEN2))
  with pytest.raises(ValueError, match="needs tokenizer_dir"):
    tasks.get("math", dataset="gsm8k")
  with pytest.raises(ValueError, match=r"must contain '\{question\}'"):
    tasks.get("math", tokenizer_dir=str(QWEN2), prompt_template="no slot")


# ----------------------------------------------------------------------------
# The trainer from a HF checkpoint.
# ----------------------------------------------------------------------------


def _tiny(data_dir, **loop):
  c = config_lib.load(f"{ROOT / 'configs' / 'gsm8k_qwen.py'}:tiny")
  c.task.kwargs.data_dir = data_dir
  c.update(iterations=2, progress=False, tensorboard=False, **loop)
  return c


def test_build_takes_the_architecture_from_the_checkpoint(data_dir):
  setup = build.build(_tiny(data_dir))
  expected = hf.model_config(hf.read_config(QWEN2))
  assert setup.model_cfg == dataclasses.replace(expected, vocab_limit=320)
  assert setup.sampler_cfg.eos_ids == (2, 0)  # <|im_end|>, <|endoftext|>.


def test_build_rejects_an_architecture_key_that_conflicts(data_dir):
  c = _tiny(data_dir)
  c.model.d_model = 48
  with pytest.raises(
    ValueError, match=r"config.model.d_model=48 conflicts with .*qwen2/config.json \(32\)"
  ):
    build.build(c)


def test_build_rejects_a_tokenizer_larger_than_the_model(data_dir, tmp_path):
  d = tmp_path / "small"
  d.mkdir()
  for f in QWEN2.iterdir():
    (d / f.name).write_bytes(f.read_bytes())
  hf_config = json.loads((d / "config.json").read_text())
  (d / "config.json").write_text(json.dumps({**hf_config, "vocab_size": 300}))
  c = _tiny(data_dir)
  c.hf_dir = str(d)
  with pytest.raises(
    ValueError, match=r"tokenizer has 320 tokens but .*config.json has vocab_size 300"
  ):
    build.build(c)


def test_run_from_a_checkpoint_scores_and_exports(data_dir, tmp_path):
  """The whole pipeline: HF import, chat prompts, sampling, math verification in a worker
  process, GRPO updates, checkpoints, and the export that transformers-format tools read."""
  summary = train.run(_tiny(data_dir), tmp_path, log=lambda *_: None)
  assert summary["iterations_done"] == 2
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  rl_records = [r for r in records if r.get("phase") != "warmstart"]
  assert [r["iteration"] for r in rl_records] == [1, 2]
  assert all(r["reward_errors"] == 0 and r["reward_timeouts"] == 0 for r in rl_records)
  out = pathlib.Path(summary["hf_export"])
  cfg = hf.model_config(hf.read_config(out))
  assert cfg == hf.model_config(hf.read_config(QWEN2))
  assert (out / "tokenizer.json").read_bytes() == (QWEN2 / "tokenizer.json").read_bytes()
  params = hf.load_params(out, cfg)
  assert model.param_count(params) == 27936


def test_vocab_limit_keeps_sampling_inside_the_tokenizer():
  """The fixture's table has 384 rows, its tokenizer 320 tokens: with the limit no sampled
  id is >= 320; without it a random model samples them ~1/6 of the time."""
  cfg = hf.model_config(hf.read_config(QWEN2))
  params = hf.load_params(QWEN2, cfg)
  scfg = sampling.SamplerConfig(max_new_tokens=32, eos_ids=(10_000,), pad_id=0, group_size=4)
  prompts = sampling.prepare_prompts([[5, 6, 7], [8, 9]], cfg=scfg)
  hyper = sampling.sampling_params(temperature=1.0)
  max_ids = []
  for c in (cfg, dataclasses.replace(cfg, vocab_limit=320)):
    rollouts = sampling.make_policy_sampler(c, scfg)(params, prompts, jax.random.key(0), hyper)
    max_ids.append(int(jnp.max(rollouts.tokens_NT)))
    assert np.isfinite(np.asarray(rollouts.policy_logp_NT)).all()
  assert max_ids[0] >= 320 > max_ids[1]


def test_reference_solution_asks_for_what_the_prompt_asks():
  from grpo_jax.tasks import math as math_task

  gsm = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nSo 72.\n#### 72"
  assert math_task.reference_solution(gsm, "72") == (
    "Natalia sold 48/2 = 24 clips in May.\nSo 72.\nThe answer is \\boxed{72}."
  )
  assert (
    math_task.reference_solution("So \\boxed{\\frac12}.", "\\frac12") == "So \\boxed{\\frac12}."
  )
  assert math_task.reference_solution("", "5") == "The answer is \\boxed{5}."
  assert math_verify.verify(math_task.reference_solution(gsm, "72"), "72") == "correct"


def test_url_workdir_is_refused_before_anything_runs():
  with pytest.raises(ValueError, match=r"'gs://bucket/run': URL workdirs .* gcsfuse"):
    train.run(None, "gs://bucket/run")
