"""Your prompts and your reward: a task from a JSONL file of {"prompt": ..., "answer": ...}
objects, scored by a built-in verifier or a Python function of yours.

    task = tasks.get("jsonl", path="train.jsonl", verifier="my_reward.py:score",
                     tokenizer_dir="/models/Qwen2.5-0.5B-Instruct", chat=True)
    grpo-jax --config=configs/jsonl.py:tiny --config.task.kwargs.verifier=grpo_jax.rewards.functions:number

Verifiers (`verifier`):
  exact           the completion, stripped, equals the answer, stripped (reward 1 or 0);
                  no template, so the format reward is 1; the stated answer is the
                  stripped completion.
  math            Math-Verify against the answer (`math_verify.MathReward`: its extraction,
                  equivalence and unscorable cases); the format reward is its template check.
  FILE.py:NAME    your function NAME(completion: str, answer: str) -> float in [0, 1],
                  loaded from FILE.py (relative to the working directory); the format
                  reward is 1. An exception or a value that is not finite makes the row
                  unscorable (`rl.unscorable`), as for any task. The reward processes
                  load the file again by its path.
  module:NAME     the same from an importable module (`grpo_jax.rewards.functions` has
                  two: the last number, and partial credit by closeness).

Splits: with `test_path` its records are the test split and `path`'s the train split;
otherwise `path`'s records are split by a stable hash of the prompt, `test_percent` of
them to test (`base.split_of`). Training draws the train records in a seeded order that
reshuffles each epoch (`data_order.record_index`: resuming is exact); the test split is in
file order (an evaluation scores its first eval_size records). The warm start's target
is the answer.

Text: with `tokenizer_dir` (the trainer passes config.hf_dir) the model's tokenizer encodes
the prompt, as it is or, with `chat`, as a user turn (after `system`, if any) in its chat
template with the generation prompt. Without one the toy character tokenizer does
(`base.TOY_ALPHABET`): every prompt and answer must be written in it, which is checked.

`grpo-jax eval --config.eval.benchmarks=jsonl:PATH[:VERIFIER]` scores every record of a
file as a test problem (test_percent 100).
"""

from __future__ import annotations

import importlib.util
import pathlib

from grpo_jax.infra import jsonl as jsonl_file
from grpo_jax.tasks import base, data_order
from grpo_jax.verifiers import math_verify

VERIFIERS = ("exact", "math", "FILE.py:FUNCTION", "package.module:FUNCTION")


class JsonlProblems(base.Task):
  """The records of a {"prompt", "answer"} JSONL file (module docstring)."""

  name = "jsonl"
  uses_hf_tokenizer = True  # The trainer passes config.hf_dir as tokenizer_dir.

  def __init__(
    self,
    *,
    path: str,
    verifier: str = "exact",
    test_path: str = "",
    test_percent: int = 10,
    tokenizer_dir: str = "",
    chat: bool = False,
    system: str = "",
    _benchmark: bool = False,
  ):
    if not 0 <= test_percent <= 100:
      raise ValueError(f"jsonl test_percent={test_percent}; allowed: 0 to 100.")
    self.path, self.verifier, self.test_path = str(path), verifier, str(test_path)
    self.test_percent, self.tokenizer_dir = test_percent, str(tokenizer_dir)
    self.chat, self.system = chat, system
    if chat and not tokenizer_dir:
      raise ValueError("jsonl chat=True needs tokenizer_dir (or config.hf_dir): its chat template.")
    self._tokenizer, self._user_fn = None, None
    self.reward_fn = math_verify.MathReward(tags=()) if verifier == "math" else None
    if verifier not in ("exact", "math"):
      self._user_fn = load_reward(verifier)  # Fails now, in one line, if it cannot load.
    records = _read(pathlib.Path(path))
    if test_path:
      self.splits = {"train": records, "test": _read(pathlib.Path(test_path))}
    else:
      by = {"train": [], "test": []}
      for r in records:
        by[base.split_of(r["prompt"], test_percent=test_percent)].append(r)
      self.splits = by
    if not tokenizer_dir and not _benchmark:  # A benchmark's text: the run's tokenizer.
      _check_alphabet(self.splits, self.path)
    self.test_size = len(self.splits["test"])  # A finite test split: an eval scores these.

  @classmethod
  def benchmark(cls, path: str, verifier: str = "exact") -> JsonlProblems:
    """Every record of the file a test problem, in file order, encoded by the evaluated
    run's tokenizer (`grpo-jax eval --config.eval.benchmarks=jsonl:PATH[:VERIFIER]`)."""
    return cls(path=path, verifier=verifier, test_percent=100, _benchmark=True)

  def __getstate__(self):  # Reward workers reload the tokenizer and the user's function.
    return {**self.__dict__, "_tokenizer": None, "_user_fn": None}

  def tokenizer(self):
    if not self.tokenizer_dir:
      return super().tokenizer()
    if self._tokenizer is None:
      from grpo_jax.models import hf_tokenizer  # noqa: PLC0415 -- only with a model's.

      self._tokenizer = hf_tokenizer.load(self.tokenizer_dir)
    return self._tokenizer

  def _draw(self, rng):
    raise NotImplementedError("JsonlProblems reads its problems from its file (see example).")

  def example(self, split: str, index: int, *, seed: int) -> base.Example:
    if split not in base.SPLITS:
      raise ValueError(f"Unknown split {split!r}; valid splits: {base.SPLITS}.")
    records = self.splits[split]
    if not records:
      raise ValueError(
        f"{self.path}: the {split} split is empty ({self.test_percent}% of the records go to "
        "test); give more records, another test_percent, or test_path."
      )
    shuffled = split == "train"  # The test split in file order: an eval's first records.
    r = records[data_order.record_index(index, n=len(records), seed=seed, shuffle=shuffled)]
    return base.Example(prompt=self._render(r["prompt"]), reference=r["answer"], answer=r["answer"])

  def _render(self, prompt: str) -> str:
    return base.chat_prompt(self.tokenizer(), prompt, system=self.system) if self.chat else prompt

  def reward_input(self, example: base.Example) -> str:
    return example.answer

  def reward(self, prompt: str, completion: str) -> float:
    """`prompt` is the gold answer here (`reward_input`)."""
    if self.reward_fn is not None:
      return self.reward_fn.reward(prompt, completion)
    if self.verifier == "exact":
      return float(completion.strip() == prompt.strip())
    if self._user_fn is None:  # A reward process: the function was not pickled.
      self._user_fn = load_reward(self.verifier)
    return float(self._user_fn(completion, prompt))

  def format_reward(self, prompt: str, completion: str) -> float:
    if self.reward_fn is not None:
      return self.reward_fn.format_reward(prompt, completion)
    return 1.0

  def extract_answer(self, completion: str) -> str | None:
    if self.reward_fn is None:
      return completion.strip() or None
    got = math_verify.extract_answer(completion)
    return None if got is None else "".join(got.split())


def load_reward(spec: str):
  """The function NAME of a verifier "FILE.py:NAME" or "package.module:NAME"; one
  ValueError saying what is wrong (the form, a missing file or module, an import error, a
  missing or uncallable NAME)."""
  where, _, name = spec.rpartition(":")
  dotted = all(part.isidentifier() for part in where.split("."))
  if not name.isidentifier() or not (where.endswith(".py") or dotted):
    raise ValueError(f"jsonl verifier {spec!r}; allowed: {', '.join(VERIFIERS)}.")
  try:
    module = _module_of_file(where) if where.endswith(".py") else importlib.import_module(where)
  except ModuleNotFoundError as e:
    raise ValueError(f"jsonl verifier {spec!r}: no module {where!r} ({e}).") from e
  except FileNotFoundError:
    raise ValueError(f"jsonl verifier {spec!r}: no such file {where!r}.") from None
  except Exception as e:  # noqa: BLE001 -- the user's code: say which and why.
    raise ValueError(
      f"jsonl verifier {spec!r}: importing {where} failed: {type(e).__name__}: {e}"
    ) from e
  fn = getattr(module, name, None)
  if not callable(fn):
    found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
    raise ValueError(f"jsonl verifier {spec!r}: {where} has no function {name!r} (it has {found}).")
  return fn


def _module_of_file(file: str):
  path = pathlib.Path(file).expanduser()
  if not path.is_file():
    raise FileNotFoundError(path)
  module_spec = importlib.util.spec_from_file_location(f"_grpo_jax_reward_{path.stem}", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def _check_alphabet(splits: dict, path: str) -> None:
  """Without a model's tokenizer every prompt and answer is in the toy alphabet."""
  for split, records in splits.items():
    for i, r in enumerate(records):
      for key in ("prompt", "answer"):
        bad = sorted(set(r[key]) - set(base.TOY_ALPHABET))
        if bad:
          raise ValueError(
            f"{path}: {split} record {i + 1}'s {key} has characters outside the toy tokenizer's "
            f"alphabet {base.TOY_ALPHABET!r}: {bad}. Give tokenizer_dir (a model's tokenizer; "
            "the trainer passes config.hf_dir), or write the file in that alphabet."
          )


def _read(path: pathlib.Path) -> list[dict]:
  """The file's records (`infra.jsonl.read`); a missing file, a line that is not a JSON
  object with string "prompt" and "answer", or an empty file is one ValueError naming it."""
  if not path.is_file():
    raise ValueError(f"jsonl file {str(path)!r}: no such file.")
  records = jsonl_file.read(str(path))
  for i, r in enumerate(records):
    if not all(isinstance(r.get(k), str) for k in ("prompt", "answer")):
      raise ValueError(f'{path}: record {i + 1} must be {{"prompt": str, "answer": str}}.')
  if not records:
    raise ValueError(f"jsonl file {path}: no records.")
  return records
