"""The calculator as a `verifiers` environment: a real one for the verifiers adapter.

    c.task.name = "vf:grpo_jax.envs.vf_calculator"
    c.env.name = "verifiers"

A `verifiers.MultiTurnEnv` (message_type "completion", the toy model's plain text) with
the in-process environment's rules (`calculator.respond`): an action "T:12+34=" gets the
tool's answer "46;" from `env_response`; any other action ends the rollout
(`is_completed`), and the rubric's one reward function gives 1 when the last action is
the right answer line "A:<value>.". Its dataset holds `size` problems of the calculator
task's training split and its eval_dataset `eval_size` of its held-out split (drawn from
`seed`), each with the reference transcript in info["reference"] (the warm-start target).

`load_environment` is what `verifiers.load_environment("grpo_jax.envs.vf_calculator")`
calls, as for an environment installed from the Environments Hub.
"""

from __future__ import annotations

import datasets
import verifiers as vf

from grpo_jax.envs import calculator
from grpo_jax.tasks import calculator as calculator_task


def _last_action(completion: str, state: dict) -> str:
  """The rollout's last action: its last model response, or (a transcript scored without
  a rollout's state) the text after the last observation (observations end in ";")."""
  responses = state.get("responses") or []
  if responses:
    return responses[-1].choices[0].text or ""
  return completion.rsplit(";", 1)[-1]


def correct_answer(completion, answer, state, **kwargs) -> float:
  """1 when the last action states the problem's value ("A:<value>."), else 0."""
  del kwargs
  return calculator.respond(_last_action(completion, state), int(answer))[1]


class CalculatorEnv(vf.MultiTurnEnv):
  """The calculator tool (module docstring); the rules are `calculator.respond`'s."""

  async def is_completed(self, messages, state, **kwargs) -> bool:
    del messages, kwargs
    if not state.get("responses"):
      return False
    text, _, done = calculator.respond(_last_action("", state), int(state["answer"]))
    state["tool"] = text
    return done

  async def env_response(self, messages, state, **kwargs):
    del messages, kwargs
    return state.pop("tool"), state


def _rows(task, split: str, n: int, seed: int) -> datasets.Dataset:
  examples = [task.example(split, i, seed=seed) for i in range(n)]
  return datasets.Dataset.from_list(
    [{"prompt": x.prompt, "answer": x.answer, "info": {"reference": x.reference}} for x in examples]
  )


def load_environment(
  steps: int = 2,
  ops: str = "+*",
  max_digits: int = 2,
  size: int = 4096,
  eval_size: int = 256,
  seed: int = 0,
  max_turns: int = 4,
) -> CalculatorEnv:
  """The environment on `size` training and `eval_size` held-out problems (module docstring)."""
  task = calculator_task.Calculator(steps=steps, ops=ops, max_digits=max_digits)
  return CalculatorEnv(
    dataset=_rows(task, "train", size, seed),
    eval_dataset=_rows(task, "test", eval_size, seed),
    rubric=vf.Rubric(funcs=[correct_answer]),
    message_type="completion",
    max_turns=max_turns,
  )
