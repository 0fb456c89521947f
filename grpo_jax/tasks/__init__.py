"""Verifiable tasks, picked by name: ``tasks.get("arithmetic", max_digits=3)``.

Toy tasks (character tokenizer, problems drawn from a seed): "arithmetic", "countdown",
"long_addition" (multi-step: one line per column with carries), "calculator" (multi-step
expressions solved with a calculator tool: `envs.calculator`).
Dataset tasks (a Hugging Face tokenizer, problems from TFDS): "math" (GSM8K, MATH,
MATH-500, your own JSONL/Parquet files; verified by `math_verify`); "code" (Python functions
with hidden unit tests, run in `sandbox`: shipped problems, MBPP or HumanEval JSONL).
Generated problems for a pretrained chat model (its tokenizer and chat template):
"word_problems" (English arithmetic stories, verified by `math_verify`).
Your own data: "jsonl" ({"prompt", "answer"} lines, scored exactly, by Math-Verify or by a
Python function of yours; the model's tokenizer, or the toy one).
reasoning-gym's generated datasets: "rg:<dataset>" (`reasoning_gym_tasks`: its scorer, its
options as the task's kwargs; the model's tokenizer and chat template, or a toy one).
A verifiers environment's dataset: "vf:<env_id>" (`vf_tasks`; its rows, played as episodes
by environment "verifiers").
"""

from grpo_jax.infra import registry
from grpo_jax.tasks import (
  arithmetic,
  calculator,
  code,
  countdown,
  jsonl,
  long_addition,
  math,
  reasoning_gym_tasks,
  vf_tasks,
  word_problems,
)
from grpo_jax.tasks.base import SPLITS, TOY_ALPHABET, Example, Task, split_of

REGISTRY: registry.Registry[type[Task]] = registry.Registry("task")
REGISTRY.register("arithmetic")(arithmetic.Arithmetic)
REGISTRY.register("calculator")(calculator.Calculator)
REGISTRY.register("countdown")(countdown.Countdown)
REGISTRY.register("jsonl")(jsonl.JsonlProblems)
REGISTRY.register("long_addition")(long_addition.LongAddition)
REGISTRY.register("math")(math.MathTask)
REGISTRY.register("code")(code.CodeTask)
REGISTRY.register("word_problems")(word_problems.WordProblems)


def task_class(name: str) -> type[Task]:
  """The class of task `name`: a registered one, "rg:<dataset>" (reasoning-gym) or
  "vf:<env_id>" (a verifiers environment)."""
  if name.startswith(reasoning_gym_tasks.PREFIX):
    return reasoning_gym_tasks.ReasoningGymTask
  if name.startswith(vf_tasks.PREFIX):
    return vf_tasks.VfTask
  return REGISTRY.get(name)


def known(name: str) -> bool:
  """Whether `name` names a task (`task_class` would not raise for an unknown name)."""
  return name in REGISTRY or name.startswith((reasoning_gym_tasks.PREFIX, vf_tasks.PREFIX))


def get(name: str, **kwargs) -> Task:
  """Builds the task registered as ``name`` with its keyword options; "rg:<dataset>" is
  reasoning-gym's dataset (its options in kwargs), "vf:<env_id>" a verifiers environment's
  rows (its load_environment arguments in kwargs["env_args"])."""
  if name.startswith(reasoning_gym_tasks.PREFIX):
    return reasoning_gym_tasks.ReasoningGymTask(
      dataset=name[len(reasoning_gym_tasks.PREFIX) :], **kwargs
    )
  if name.startswith(vf_tasks.PREFIX):
    return vf_tasks.VfTask(env_id=name[len(vf_tasks.PREFIX) :], **kwargs)
  return REGISTRY.get(name)(**kwargs)


__all__ = [
  "REGISTRY", "SPLITS", "TOY_ALPHABET", "Example", "Task", "get", "known", "split_of", "task_class",
]  # fmt: skip
