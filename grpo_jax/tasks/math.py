"""Math word problems from a dataset (GSM8K, MATH, your own files), verified by `math_verify`.

    task = tasks.get("math", dataset="gsm8k", manual_dir="/data/gsm8k",
                     tokenizer_dir="/models/Qwen2.5-0.5B-Instruct")

Prompts. Each problem becomes `prompt_template.format(question=...)`, rendered as the
user turn of the tokenizer's chat template (after `system_prompt` when set) with the
generation prompt, or used as is with `chat=False` (base models). The rendered text holds
the template's special tokens as text; the HF tokenizer maps them to their ids once, when
the trainer encodes the prompt (token in, token out: completions are never re-encoded).

Stream. `example(split, i, seed=s)` is the problem at global index i of the split's
seeded permutation, epoch after epoch (`data_order.record_index`): a pure function of
(split, i, seed), so resuming is exact and every host count reads the same stream. The
test split is read in file order (no shuffle), so `eval_size` = N means "the first N".

Reward. The trainer passes `reward_input(example)` = the gold answer as the first
argument of `reward` (the prompt is not needed to verify): `reward(gold, completion)` is
1.0 when `math_verify.verify` says "correct" and 0.0 when it says "wrong" or "no_answer",
and `format_reward` is `math_verify.format_reward` with `think_tags`. `verifier_backend`
picks the verifier: "math_verify" (default, Hugging Face's Math-Verify) or "builtin" (the
hand-written one); `math_verify`'s docstring compares them. Both calls run in the trainer's
reward worker processes under its hard timeout; an item the verifier cannot decide
(`verdicts.Unscorable`, "unscorable") or that times out counts in `reward_errors` (and
`reward_timeouts`), apart from wrong answers.

Perturbed prompts (`perturb`, kinds "hint" and "repair"; no safe "paraphrase" of free
text). Both re-render the question with text appended inside the same template, so the
user turn still ends with the template's instruction and the answer is unchanged:

  hint:    "{question}\nHint: {first step}"    the reference's first sentence (clipped to
           HINT_MAX_CHARS at a word); a reference with no step before its boxed answer
           gives no hint, and the prompt is returned unchanged (q~ = q: an on-policy sample)
  repair:  "{question}\n\nA previous attempt was wrong:\n{attempt}\nSolve it again."
           with the attempt's first `max_attempt_chars` characters

The dataset is built (array_record, no TensorFlow) on first use, in `data_dir`.
"""

from __future__ import annotations

import re

import numpy as np

from grpo_jax.tasks import base, data_order
from grpo_jax.verifiers import math_verify

DEFAULT_TEMPLATE = (
  "{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
)
_TEST_SPLITS = {"gsm8k": "test", "math": "math500", "problem_files": "test"}
HINT_MAX_CHARS = 300
_SENTINEL = "<<grpo_jax question>>"  # Stands for the question when a prompt is split.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def reference_solution(solution: str, answer: str) -> str:
  """The warm-start target in the form the prompt asks for: GSM8K's calculator notes
  `<<48/2=24>>` dropped and its `#### N` line replaced by `The answer is \\boxed{N}.`;
  a solution without a boxed answer (or no solution) gets that sentence appended."""
  text = re.sub(r"<<[^<>]*>>", "", solution)
  text = re.sub(r"\n?####\s*(.+?)\s*$", "", text).rstrip()
  if "\\boxed" in text:
    return text
  final = f"The answer is \\boxed{{{answer}}}."
  return f"{text}\n{final}" if text else final


def first_step(reference: str, *, max_chars: int = HINT_MAX_CHARS) -> str:
  """The first sentence of a reference solution, for a hint: "" when it already gives the
  boxed answer (a solution that is only its answer); clipped at a word past max_chars."""
  lines = [line.strip() for line in reference.split("\n") if line.strip()]
  step = _SENTENCE_END.split(lines[0])[0] if lines else ""
  if "\\boxed" in step:
    return ""
  if len(step) > max_chars:
    step = step[:max_chars].rsplit(" ", 1)[0] + " ..."
  return step


class MathTask(base.Task):
  """A dataset of math problems with gold answers. See the module docstring."""

  name = "math"
  uses_hf_tokenizer = True  # The trainer passes config.hf_dir as tokenizer_dir.
  perturbations = ("hint", "repair")
  max_attempt_chars = 2048

  def __init__(
    self,
    *,
    dataset: str = "gsm8k",
    tokenizer_dir: str = "",
    data_dir: str = "",
    manual_dir: str = "",
    config: str = "",
    files: dict | None = None,
    fields: dict | None = None,
    train_split: str = "train",
    test_split: str = "",
    chat: bool = True,
    system_prompt: str = "",
    prompt_template: str = DEFAULT_TEMPLATE,
    think_tags: tuple[str, ...] = (),
    answer_tag: str = "",
    verifier_backend: str = math_verify.DEFAULT_BACKEND,
  ):
    if not tokenizer_dir:
      raise ValueError(
        "task 'math' needs tokenizer_dir (a directory with tokenizer.json), or config.hf_dir."
      )
    if "{question}" not in prompt_template:
      raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}.")
    from grpo_jax.tasks import datasets

    if dataset not in datasets.REGISTRY.names():
      raise ValueError(f"Unknown dataset {dataset!r}; valid: {datasets.REGISTRY.names()}.")
    self.dataset = dataset
    self.tokenizer_dir = str(tokenizer_dir)
    self.data_dir = data_dir or None
    self.manual_dir = manual_dir or None
    self.builder_config = config or None
    if dataset == "problem_files":
      if not files or not fields:
        raise ValueError("dataset 'problem_files' needs files={split: path} and fields={...}.")
      self.builder_config = datasets.ProblemFilesConfig(
        name=config or "problems", files=dict(files), fields=datasets.Fields(**fields)
      )
    self.splits = {"train": train_split, "test": test_split or _TEST_SPLITS[dataset]}
    self.chat = chat
    self.system_prompt = system_prompt
    self.prompt_template = prompt_template
    self.reward_fn = math_verify.MathReward(
      tags=tuple(think_tags), answer_tag=answer_tag or None, backend=verifier_backend
    )
    self._tokenizer = None
    self._sources = {}
    self._notes: list[str] = []

  def __getstate__(self):  # Reward workers need the verifier only, not data or tokenizer.
    return {**self.__dict__, "_tokenizer": None, "_sources": {}, "_notes": []}

  def tokenizer(self):
    if self._tokenizer is None:
      from grpo_jax.models import hf_tokenizer

      self._tokenizer = hf_tokenizer.load(self.tokenizer_dir)
    return self._tokenizer

  def source(self, split: str):
    """The split's problems (`datasets.ProblemSource`), built on first use."""
    if split not in base.SPLITS:
      raise ValueError(f"Unknown split {split!r}; valid splits: {base.SPLITS}.")
    if split not in self._sources:
      from grpo_jax.tasks import datasets

      builder = datasets.get(self.dataset, data_dir=self.data_dir, config=self.builder_config)
      datasets.prepare(builder, manual_dir=self.manual_dir)
      note = builder.grpo_jax_note  # One line per dataset: the second split's is "reused".
      if not any(n.split(":")[0] == note.split(":")[0] for n in self._notes):
        self._notes.append(note)
      self._sources[split] = datasets.problems(builder, self.splits[split])
    return self._sources[split]

  def data_notes(self) -> list[str]:
    return list(dict.fromkeys(self._notes))

  def render(self, question: str) -> str:
    """The prompt text for a question (chat template applied unless chat=False)."""
    user = self.prompt_template.format(question=question)
    if not self.chat:
      return user
    return base.chat_prompt(self.tokenizer(), user, system=self.system_prompt)

  def question(self, prompt: str) -> str:
    """The question inside a prompt that `render` made (its inverse)."""
    pieces = self.render(_SENTINEL).split(_SENTINEL)
    if len(pieces) != 2:
      raise ValueError(f"math: the prompt template shows the question {len(pieces) - 1} times.")
    prefix, suffix = pieces
    if len(prompt) < len(prefix) + len(suffix) or not (
      prompt.startswith(prefix) and prompt.endswith(suffix)
    ):
      raise ValueError(f"math: not a prompt of this task's template: {prompt[:200]!r}.")
    return prompt[len(prefix) : len(prompt) - len(suffix)]

  def _hint(self, example: base.Example, *, rng: np.random.Generator | None) -> str:
    step = first_step(example.reference)
    if not step:
      return example.prompt
    return self.render(f"{self.question(example.prompt)}\nHint: {step}")

  def _repair(self, example: base.Example, attempt: str) -> str:
    question = self.question(example.prompt)
    return self.render(f"{question}\n\nA previous attempt was wrong:\n{attempt}\nSolve it again.")

  def example(self, split: str, index: int, *, seed: int) -> base.Example:
    src = self.source(split)
    i = data_order.record_index(index, n=len(src), seed=seed, shuffle=split == "train")
    problem = src[i]
    reference = reference_solution(problem.solution, problem.answer)
    return base.Example(
      prompt=self.render(problem.question), reference=reference, answer=problem.answer
    )

  def _draw(self, rng):
    raise NotImplementedError("MathTask reads its problems from a dataset (see example).")

  def reward_input(self, example: base.Example) -> str:
    return example.answer

  def reward(self, prompt: str, completion: str) -> float:
    """`prompt` is the gold answer here (`reward_input`)."""
    return self.reward_fn.reward(prompt, completion)

  def format_reward(self, prompt: str, completion: str) -> float:
    return self.reward_fn.format_reward(prompt, completion)

  def extract_answer(self, completion: str) -> str | None:
    """Math-Verify's extraction (`math_verify.extract_answer`: last \\boxed{}, '####',
    'the answer is'), spaces removed: equivalent forms (1/2, 0.5) stay distinct votes."""
    got = math_verify.extract_answer(completion, answer_tag=self.reward_fn.answer_tag)
    return None if got is None else "".join(got.split())
