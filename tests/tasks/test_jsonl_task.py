"""The jsonl task: your prompts and answers, scored exactly, by Math-Verify or by your
function, split by a hash of the prompt or by a second file, on the toy tokenizer or a
model's (its chat template too), and trained by the trainer with reward processes that
load your function again."""

import json
import pickle

import gguf_files  # tests/ is on sys.path (conftest).
import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.infra import config_lib, logs
from grpo_jax.tasks import base, jsonl
from grpo_jax.trainer import train

REWARD = """
import re

def last_number(completion, answer):
  said = re.findall(r"\\d+", completion)
  return float(bool(said) and said[-1] == re.findall(r"\\d+", answer)[-1])

def broken(completion, answer):
  raise RuntimeError("no")
"""


def _file(path, records):
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  return str(path)


def _sums(path, n=40):
  return _file(path, [{"prompt": f"Q:{i}+1\n", "answer": f"A:{i + 1}."} for i in range(n)])


def test_splits_by_a_hash_of_the_prompt_or_by_a_test_file(tmp_path):
  path = _sums(tmp_path / "s.jsonl")
  task = tasks.get("jsonl", path=path, test_percent=25)
  train_, test = task.splits["train"], task.splits["test"]
  assert len(train_) + len(test) == 40 and 0 < len(test) < 20
  assert all(base.split_of(r["prompt"], test_percent=25) == "test" for r in test)
  assert not {r["prompt"] for r in train_} & {r["prompt"] for r in test}  # Disjoint.
  # Training order: a seeded shuffle per epoch, a pure function of (index, seed); test: file order.
  n = len(train_)
  epoch = [task.example("train", i, seed=3).prompt for i in range(n)]
  assert sorted(epoch) == sorted(r["prompt"] for r in train_) and epoch != [r["prompt"] for r in train_]  # fmt: skip
  assert [task.example("train", i, seed=3).prompt for i in range(n)] == epoch
  assert [task.example("train", n + i, seed=3).prompt for i in range(n)] != epoch  # Reshuffled.
  assert [task.example("test", i, seed=9).prompt for i in range(len(test))] == [r["prompt"] for r in test]  # fmt: skip
  assert task.example("test", 0, seed=0).reference == test[0]["answer"]  # The warm start's target.
  other = _file(tmp_path / "t.jsonl", [{"prompt": "Q:1+1\n", "answer": "A:2."}])
  held = tasks.get("jsonl", path=path, test_path=other)
  assert len(held.splits["train"]) == 40 and held.test_size == 1
  with pytest.raises(ValueError, match=r"the test split is empty \(0% of the records"):
    tasks.get("jsonl", path=path, test_percent=0).example("test", 0, seed=0)


def test_the_verifiers_exact_math_and_yours(tmp_path):
  path = _sums(tmp_path / "s.jsonl")
  exact = tasks.get("jsonl", path=path)
  assert exact.reward("A:5.", " A:5.\n") == 1.0 and exact.reward("A:5.", "A:6.") == 0.0
  assert exact.format_reward("A:5.", "xyz") == 1.0
  math = tasks.get("jsonl", path=path, verifier="math")
  assert math.reward("1/2", "so \\boxed{0.5}") == 1.0 and math.reward("1/2", "\\boxed{3}") == 0.0
  (tmp_path / "mine.py").write_text(REWARD)
  mine = tasks.get("jsonl", path=path, verifier=f"{tmp_path / 'mine.py'}:last_number")
  assert mine.reward("A:12.", "twelve is 12") == 1.0 and mine.reward("A:12.", "13") == 0.0
  assert mine.reward("A:12.", "none") == 0.0 and mine.format_reward("A:12.", "none") == 1.0
  # A reward process gets the task pickled, without the function, and loads it again.
  again = pickle.loads(pickle.dumps(mine))
  assert again._user_fn is None and again.reward("A:7.", "A:7.") == 1.0
  number = tasks.get("jsonl", path=path, verifier="grpo_jax.rewards.functions:number")
  assert number.reward("A:12.", "the sum is 12") == 1.0 and number.reward("A:12.", "A:21.") == 0.0
  close = tasks.get("jsonl", path=path, verifier="grpo_jax.rewards.functions:closeness")
  assert (
    close.reward("A:12.", "A:10.") == pytest.approx(1 / 3) and close.reward("A:12.", "?") == 0.0
  )
  broken = tasks.get("jsonl", path=path, verifier=f"{tmp_path / 'mine.py'}:broken")
  with pytest.raises(RuntimeError, match="no"):  # The pool counts the row unscorable.
    broken.reward("A:7.", "A:7.")


@pytest.mark.parametrize(
  "verifier, match",
  [
    (
      "fuzzy",
      r"jsonl verifier 'fuzzy'; allowed: exact, math, FILE\.py:FUNCTION, package\.module:FUNCTION",
    ),
    ("mine.py:", r"allowed: exact, math, FILE\.py:FUNCTION"),
    ("no_such_module:f", r"no module 'no_such_module'"),
    (
      "grpo_jax.rewards.functions:nope",
      r"has no function 'nope' \(it has \[.*'closeness', .*'number'",
    ),
    ("missing.py:f", r"no such file 'missing\.py'"),
    ("mine.py:nope", r"mine\.py has no function 'nope' \(it has \['broken', 'last_number'\]\)"),
    ("bad.py:f", r"importing bad\.py failed: ZeroDivisionError"),
  ],
)
def test_a_verifier_that_cannot_load_is_one_clear_error(verifier, match, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # Paths are relative to the working directory.
  (tmp_path / "mine.py").write_text(REWARD)
  (tmp_path / "bad.py").write_text("x = 1 / 0\n")
  with pytest.raises(ValueError, match=match):
    tasks.get("jsonl", path=_sums(tmp_path / "s.jsonl"), verifier=verifier)


def test_the_toy_tokenizer_takes_only_its_alphabet_and_a_models_takes_its_chat(tmp_path):
  questions = [f"What is {i}+3?" for i in range(30)]
  path = _file(tmp_path / "w.jsonl", [{"prompt": q, "answer": "5"} for q in questions])
  with pytest.raises(ValueError, match=r"record 1's prompt has characters outside .*\['W', 'a', 'h', 'i', 's', 't'\]"):  # fmt: skip
    tasks.get("jsonl", path=path)
  with pytest.raises(ValueError, match="chat=True needs tokenizer_dir"):
    tasks.get("jsonl", path=path, chat=True)
  src = str(gguf_files.FIXTURE)
  plain = tasks.get("jsonl", path=path, tokenizer_dir=src)
  question = plain.example("train", 0, seed=0).prompt
  assert question in questions  # As written.
  chat = tasks.get("jsonl", path=path, tokenizer_dir=src, chat=True, system="Be brief.")
  prompt = chat.example("train", 0, seed=0).prompt
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
  assert prompt == chat.tokenizer().apply_chat_template(messages, add_generation_prompt=True)
  assert prompt.index("Be brief.") < prompt.index(question)
  # A benchmark's text is the evaluated run's tokenizer's business: no alphabet check.
  assert jsonl.JsonlProblems.benchmark(path).test_size == 30


def test_the_config_trains_on_the_file_with_your_function_in_reward_processes(tmp_path):
  """configs/jsonl.py:tiny on the quick model, 2 iterations with 2 reward processes
  scoring by grpo_jax.rewards.functions:number: the processes import the function again;
  rewards are real (the warm start answers some problems)."""
  c = config_lib.load("configs/jsonl.py:tiny")
  c.task.kwargs.verifier = "grpo_jax.rewards.functions:number"
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
  c.update(warmstart_steps=150, iterations=2, prompts_per_step=8, eval_every=2, eval_size=16)
  c.update(eval_samples=0, checkpoint_every=2, reward_workers=2, progress=False, tensorboard=False)
  summary = train.run(c, tmp_path, log=lambda _: None)
  # A process that could not load the function would fail every row it scores.
  records = [r for r in logs.read_jsonl(tmp_path / "metrics.jsonl") if r["phase"] == "rl"]
  assert len(records) == 2 and all(np.isfinite(r["loss"]) for r in records)
  assert all(r["reward_errors"] == 0 and r["unscorable_frac"] == 0.0 for r in records)
  assert summary["final_problems"] == 16 and summary["warmstart_accuracy"] > 0.0
  c.eval_size = 200  # Past the 90 test records.
  with pytest.raises(ValueError, match=r"config.eval_size=200 exceeds the 90 test problems of task 'jsonl'"):  # fmt: skip
    train.run(c, tmp_path / "more", log=lambda _: None)
