"""A benchmark from a JSONL file: one {"prompt": ..., "answer": ...} object per line.

    task = jsonl.JsonlProblems(path="bench.jsonl", verifier="math")

The prompt is given to the model as it is (the model's tokenizer encodes it; a chat model
wants it already in its template), and every record is a test problem, in file order.
Verifiers:
  exact  the completion, stripped, equals the answer, stripped (reward 1 or 0); no
         template, so the format reward is 1; the stated answer is the stripped completion.
  math   Math-Verify against the answer (`math_verify.MathReward`: its extraction,
         equivalence and unscorable cases); the format reward is its template check.
Made for `grpo-jax eval --config.eval.benchmarks=jsonl:PATH[:VERIFIER]`; not a training task
(it has no train split).
"""

from __future__ import annotations

import pathlib

from grpo_jax.infra import jsonl as jsonl_file
from grpo_jax.tasks import base
from grpo_jax.verifiers import math_verify

VERIFIERS = ("exact", "math")


class JsonlProblems(base.Task):
  """The records of a {"prompt", "answer"} JSONL file as test problems (module docstring)."""

  name = "jsonl"

  def __init__(self, *, path: str, verifier: str = "exact"):
    if verifier not in VERIFIERS:
      raise ValueError(f"jsonl verifier {verifier!r}; allowed: {', '.join(VERIFIERS)}.")
    self.path, self.verifier = str(path), verifier
    self.records = _read(pathlib.Path(path))
    self.test_size = len(self.records)  # A finite test split: an eval scores at most these.
    self.reward_fn = math_verify.MathReward(tags=()) if verifier == "math" else None

  def _draw(self, rng):
    raise NotImplementedError("JsonlProblems reads its problems from its file (see example).")

  def example(self, split: str, index: int, *, seed: int) -> base.Example:
    del seed  # File order.
    if split != "test":
      raise ValueError(f"{self.path}: a JSONL benchmark has a test split only, not {split!r}.")
    r = self.records[index % len(self.records)]
    return base.Example(prompt=r["prompt"], reference=r["answer"], answer=r["answer"])

  def reward_input(self, example: base.Example) -> str:
    return example.answer

  def reward(self, prompt: str, completion: str) -> float:
    """`prompt` is the gold answer here (`reward_input`)."""
    if self.reward_fn is not None:
      return self.reward_fn.reward(prompt, completion)
    return float(completion.strip() == prompt.strip())

  def format_reward(self, prompt: str, completion: str) -> float:
    if self.reward_fn is not None:
      return self.reward_fn.format_reward(prompt, completion)
    return 1.0

  def extract_answer(self, completion: str) -> str | None:
    if self.reward_fn is None:
      return completion.strip() or None
    got = math_verify.extract_answer(completion)
    return None if got is None else "".join(got.split())


def _read(path: pathlib.Path) -> list[dict]:
  """The file's records (`infra.jsonl.read`); a missing file, a line that is not a JSON
  object with string "prompt" and "answer", or an empty file is one ValueError naming it."""
  if not path.is_file():
    raise ValueError(f"jsonl benchmark {str(path)!r}: no such file.")
  records = jsonl_file.read(str(path))
  for i, r in enumerate(records):
    if not all(isinstance(r.get(k), str) for k in ("prompt", "answer")):
      raise ValueError(f'{path}: record {i + 1} must be {{"prompt": str, "answer": str}}.')
  if not records:
    raise ValueError(f"jsonl benchmark {path}: no records.")
  return records
