"""The word_problems task: stories with exact answers, disjoint splits, chat prompts, and
the Math-Verify reward. The tokenizer is the committed tiny GGUF's (byte-level, ChatML)."""

import re

import pytest

pytest.importorskip("gguf", reason="the fixture's tokenizer is read from a GGUF: pip install gguf")

import gguf_files  # noqa: E402 -- tests/ is on sys.path.

from grpo_jax import tasks  # noqa: E402

SRC = str(gguf_files.FIXTURE)


def _task(**kwargs):
  return tasks.get("word_problems", tokenizer_dir=SRC, **kwargs)


def _question(prompt: str) -> str:
  return prompt.split("<|im_start|>user\n", 1)[1].split("\nPut the final answer", 1)[0]


def solve(question: str) -> int:
  """An independent reading of a story: the sentences' numbers and verbs."""
  total = None
  for sentence in re.split(r"(?<=[.?])\s", question):
    numbers = [int(n) for n in re.findall(r"\d+", sentence)]
    if total is None:
      total = numbers[0]
    elif "bags with" in sentence:
      total += numbers[0] * numbers[1]
    elif re.search(r"\b(gives|loses|sells)\b", sentence):
      total -= numbers[0]
    elif numbers:
      total += numbers[0]
  return total


def test_a_story_pinned():
  ex = _task(steps=2, max_value=20, ops="+-*").example("test", 0, seed=0)
  q = _question(ex.prompt)
  assert q == (
    "Sam has 18 cards. He buys 3 bags with 6 cards in each bag. Then he buys 15 more cards. "
    "How many cards does Sam have now?"
  )
  assert ex.answer == "51"  # 18 + 3·6 + 15
  assert ex.prompt.startswith("<|im_start|>system\n")
  assert ex.prompt.endswith("in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("steps,ops", [(1, "+-"), (2, "+-*"), (3, "-"), (5, "*")])
def test_answers_are_exact_and_never_negative(steps, ops):
  task = _task(steps=steps, max_value=30, ops=ops)
  for split in ("train", "test"):
    for i in range(60):
      ex = task.example(split, i, seed=3)
      q = _question(ex.prompt)
      assert int(ex.answer) == solve(q) >= 0, q
      assert len(re.findall(r"\. ", q)) == steps + 1  # Start, the changes, the question.


def test_splits_are_disjoint_by_the_arithmetic():
  """A key is the numbers and operations: no held-out problem shares one with training."""
  task = _task(steps=1, max_value=20, ops="+-", test_percent=25)

  def keys(split):
    out = set()
    for i in range(300):
      q = _question(task.example(split, i, seed=0).prompt)
      numbers = re.findall(r"\d+", q)
      op = "-" if re.search(r"\b(gives|loses|sells)\b", q) else "+"
      out.add((numbers[0], op, numbers[1]))
    return out

  train, test = keys("train"), keys("test")
  assert len(test) > 50 and not train & test


def test_deterministic_and_seeded():
  a, b = _task(), _task()
  assert a.example("train", 7, seed=1) == b.example("train", 7, seed=1)
  assert a.example("train", 7, seed=1) != a.example("train", 7, seed=2)


def test_reward_reads_the_answer_however_written():
  task = _task()
  assert task.reward("17", "Mia has 9 + 8 = 17 stickers, so \\boxed{17}.") == 1.0
  assert task.reward("17", "She has 17 stickers now.") == 1.0
  assert task.reward("17", "She has 9 + 8 = 18 stickers now.") == 0.0
  assert (
    task.reward_input(task.example("test", 0, seed=0)) == task.example("test", 0, seed=0).answer
  )


def test_prompt_options():
  task = _task(system_prompt="Be brief.", prompt_template="Q: {question}")
  prompt = task.example("train", 0, seed=0).prompt
  assert prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nQ: ")


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(steps=0), r"steps=0: must be in \[1, 5\]"),
    (dict(max_value=1), "max_value=1: must be >= 2"),
    (dict(ops="+/"), r"ops='\+/'; allowed: a non-empty subset of '\+-\*'"),
    (dict(test_percent=0), r"test_percent must be in \(0, 100\)"),
    (dict(prompt_template="no slot"), r"must contain '\{question\}'"),
  ],
)
def test_bad_options(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _task(**kwargs)
  with pytest.raises(ValueError, match="needs tokenizer_dir"):
    tasks.get("word_problems")


def test_a_task_on_another_tokenizer_than_the_models_is_refused():
  """config.hf_dir's model reads its own tokenizer's ids only: the task on the GGUF
  fixture's tokenizer passes the check against that same source and is refused against
  the Qwen2 fixture's (another vocabulary), in the trainer's build too. (A task with a
  tokenizer of its own, arithmetic's characters: test_cli's one-line errors.)"""
  import pathlib  # noqa: PLC0415

  from grpo_jax.infra import config_lib  # noqa: PLC0415
  from grpo_jax.trainer import build  # noqa: PLC0415

  qwen2 = str(pathlib.Path(__file__).parents[1] / "fixtures" / "hf" / "qwen2")
  task = _task()
  build.check_model_tokenizer(task, task.tokenizer(), hf_dir=SRC)
  refused = r"task 'word_problems' encodes text with its own tokenizer \(HFTokenizer, [\d,]+ ids\), not config\.hf_dir's \(.*qwen2/config\.json"  # fmt: skip
  with pytest.raises(ValueError, match=refused):
    build.check_model_tokenizer(task, task.tokenizer(), hf_dir=qwen2)
  c = config_lib.load("configs/smollm2.py:tiny")
  c.task.kwargs = {**c.task.kwargs, "tokenizer_dir": SRC}
  c.hf_dir = qwen2
  with pytest.raises(ValueError, match=refused):
    build.build(c)
