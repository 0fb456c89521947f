"""A code environment: the model may run its code on the visible tests, then answers.

  action "```python\\ndef add(a, b):\\n  return a - b\\n```\\n$"
      ->  observation "\\nvisible tests: 0/1 passed; assert add(2, 3) == 5: got -1\\n"
  action "```python\\ndef add(a, b):\\n  return a + b\\n```" (then EOS)
      ->  done, reward 1 if the code passes every test of the problem, else 0

The problems, prompts and final scoring are the "code" task's (`tasks.code`; use it with
config.task.name = "code"). An action ending in "$" (`RUN_TEXT`, one token for the task's
character tokenizer and for the byte-level BPE tokenizers; `stop_text`) is a run turn:
the code in it (extracted as `tasks.code.extract_code` does, the "$" dropped) runs in the
sandbox on the example's visible tests only, and the observation says how many passed and
the first failure (or "no code found", "syntax error: ...", "timed out after 2s ...",
"could not run: ..." when the sandbox itself failed); reward 0, the episode goes on. "$" is not a Python operator, so it rarely ends a
turn inside code (inside a string it does: the code is cut there, and the run most likely
reports a syntax error). With a BPE tokenizer only the stand-alone "$" token ends a turn,
not a token that merges it with other characters.

Any other action is the final answer (an action ended by EOS, or one cut at
config.env.turn_tokens: the episode loop passes both to `step`): its code is judged on all
of the problem's tests, visible and hidden, exactly as `tasks.code.CodeTask.reward` does
(with this environment's sandbox options): reward 1.0 for "pass", 0.0 for "fail" (a wrong
value, an exception, a timeout, a MemoryError, a crash: the sandbox's rule, so failing
loudly never beats failing) or "no_code", done. An answer with no code of its own (e.g. a
bare EOS after a run that passed) submits the last code sent to a run (a run turn with
code, within max_runs). When the sandbox itself could not run the final code (it failed
to start), nothing is known about it: `step` raises `verdicts.Unscorable`, so the episode
ends with "env_error" and the row is unscorable (the episode loop's convention: counted
in reward_errors, never as a wrong answer). `outcome` keeps the final verdict ("pass",
"fail", "no_code", "could_not_run") and `cause` its cause (`tasks.code.OUTCOMES`).

Every run, turn or answer, goes through `sandbox.run` in the trainer's process: what it
reads back from the child is bounded before the run starts (`sandbox.channel`), so a
candidate cannot stall or bloat the trainer through its results; its wall time is the
run's timeout.

Visible tests. The example carries all of its tests in `example.answer`
(`CodeTask.reward_input`: visible and hidden together); the visible ones are those shown in
its prompt: the tests whose source is one or more whole lines of the prompt. So a run turn
can only report on tests the model has already seen: the hidden tests never reach the
run's sandbox, and no observation can reveal them. (A test shown altered, e.g. a non-ASCII
character replaced by "?" for the character tokenizer, counts as hidden.)

Limits (config.env.kwargs):
  max_runs       run turns answered per episode (default 3). A run turn past it is not run:
                 the observation says "no runs left; give your final answer", reward 0, and
                 the episode goes on, so it ends at the final answer ("done") or at
                 config.env.max_turns ("turn_limit", reward 0). With max_turns = max_runs + 1
                 a run past the limit is the last action: "turn_limit".
  max_chars      the longest observation in characters (default 160; longer messages are cut,
                 ending in "..."). Characters the tokenizer lacks become "?" (character
                 tokenizer). With the character tokenizer a character is a token: keep
                 config.env.observation_tokens >= max_chars (a longer observation ends the
                 episode with "token_limit").
  run_timeout_s  the sandbox's wall-clock limit for a run turn (default 2 s; a timeout is
                 reported to the model as a failure: "timed out after 2s ...").
  timeout_s, memory_mb, isolation
                 the final answer's sandbox (as `tasks.code.CodeTask`'s options; memory_mb
                 and isolation apply to run turns too). The episode's reward comes from
                 here, not from the task's own options.

Cost: each run turn and each answer is one sandbox run (about 30 ms for a tiny function,
see `sandbox`; up to its timeout for slow code). The episode loop runs the steps of a turn
on worker threads (config.env.step_workers), so one slow episode costs the turn about its
own run, not the sum of all runs; `step_budget_s`, the largest sandbox timeout plus
STEP_MARGIN_S, is the most the loop waits for one step (past it: "step_timeout", a scored
zero). A step touches its own instance only; `sandbox.run` may run on several threads.

Observations are encoded with special-token text as text (`encode_observation`): a run
whose output holds "<|im_end|>" shows those characters to the model, never the
end-of-turn token.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import time

from grpo_jax.envs import base
from grpo_jax.tasks import code as code_task
from grpo_jax.verifiers import sandbox, verdicts

RUN_TEXT = "$"
NO_RUNS_LEFT = "no runs left; give your final answer"
# What a step adds to its sandbox's timeout at most: the interpreter's start, the control
# group's setup and removal, and the kill of what is left (the sandbox waits up to 5 s for
# a killed child), on a loaded host. Generous: past it a step is a zero, not a slow answer.
STEP_MARGIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class Problem:
  """What an episode needs of its example: the reward spec (all tests, for the answer)
  and what run turns use (the visible tests, the entry point, prelude and setup)."""

  id: str
  spec: str  # `CodeTask.reward_input`: what the final answer is judged on.
  entry_point: str
  visible: tuple[sandbox.Test, ...]
  prelude: str = ""
  setup: str = ""


def problem_of(example) -> Problem:
  """The example's Problem; its visible tests are the spec's tests shown in its prompt."""
  try:
    d = json.loads(example.answer)
    tests = [sandbox.parse_test(t) for t in d["tests"]]
    problem_id, entry_point = str(d["id"]), str(d["entry_point"])
    prelude, setup = str(d.get("prelude", "")), str(d.get("setup", ""))
  except (AttributeError, ValueError, KeyError, TypeError) as e:
    answer = str(getattr(example, "answer", example))[:200]
    raise ValueError(
      f"code environment: the example's answer is not a code problem spec "
      f"(tasks.code.CodeTask.reward_input) ({e}): {answer!r}. Use config.env.name='code' "
      "with config.task.name='code'."
    ) from None
  shown = f"\n{example.prompt}\n"
  visible = tuple(t for t in tests if f"\n{t.source}\n" in shown)
  return Problem(problem_id, example.answer, entry_point, visible, prelude, setup)


def syntax_error(code: str) -> str:
  """Why `code` does not parse as Python ("" when it does)."""
  try:
    ast.parse(code)
  except SyntaxError as e:
    return f"{e.msg} (line {e.lineno})"
  except (ValueError, MemoryError, RecursionError) as e:
    return f"{type(e).__name__}: {e}"
  return ""


def run_message(result: sandbox.Result) -> str:
  """A run's outcome on the visible tests, for the model."""
  if result.verdict == "could_not_run":
    return f"could not run: {result.detail}"
  head = f"visible tests: {result.passed}/{result.total} passed"
  return head if result.verdict == "pass" else f"{head}; {result.detail}"


def clip(text: str, max_chars: int) -> str:
  """`text` in at most `max_chars` characters: cut, ending in "...", when longer."""
  return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


class CodeRunner(base.Environment):
  """Run turns on the visible tests, then a final answer on all tests (module docstring)."""

  stop_text = (RUN_TEXT,)
  outcomes = code_task.OUTCOMES

  def __init__(
    self,
    *,
    tokenizer,
    max_runs: int = 3,
    max_chars: int = 160,
    run_timeout_s: float = 2.0,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    isolation: str = "auto",
  ):
    super().__init__(tokenizer=tokenizer)
    if max_runs < 0:
      raise ValueError(f"code environment: max_runs must be >= 0, got {max_runs}.")
    if max_chars < 16:
      raise ValueError(f"code environment: max_chars must be >= 16, got {max_chars}.")
    try:
      self.run_limits = sandbox.Limits(timeout_s=run_timeout_s, memory_mb=memory_mb)
      self.task = code_task.CodeTask(timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation)
    except ValueError as e:
      raise ValueError(f"code environment: {e}") from None
    self.max_runs, self.max_chars, self.isolation = max_runs, max_chars, isolation
    # One step is one sandbox run at most (a run turn's or the answer's).
    self.step_budget_s = max(run_timeout_s, timeout_s) + STEP_MARGIN_S
    self.problem: Problem | None = None
    self.runs, self.last_run, self.outcome, self.cause = 0, "", "", ""

  def reset(self, example) -> tuple[int, ...]:
    self.problem = problem_of(example)
    self.runs, self.last_run, self.outcome, self.cause = 0, "", "", ""
    return ()  # The prompt states the problem and its visible tests.

  def step(self, action: str) -> base.Step:
    if self.problem is None:
      raise RuntimeError("code environment: step() before reset().")
    if self.outcome:
      raise RuntimeError(f"code environment: the episode is over (answer: {self.outcome}).")
    if action.endswith(RUN_TEXT):
      return base.Step(observation=self.observe(self.run(action[: -len(RUN_TEXT)])))
    return base.Step(reward=self.answer(action), done=True)

  def run(self, text: str) -> str:
    """A run turn's message: the code in `text` on the visible tests."""
    self.runs += 1
    if self.runs > self.max_runs:
      return NO_RUNS_LEFT
    p, start = self.problem, time.monotonic()
    code = code_task.extract_code(text, entry_point=p.entry_point)
    if code is None:
      return "no code found"
    self.last_run = text
    error = syntax_error(code)
    if error:
      return f"syntax error: {error}"
    result = sandbox.run(
      code,
      p.visible,
      prelude=p.prelude,
      setup=p.setup,
      limits=self.run_limits,
      isolation=self.isolation,
      spent_s=time.monotonic() - start,  # Reading the action counts in the run's budget.
    )
    return run_message(result)

  def answer(self, action: str) -> float:
    """The final answer's reward on all tests (the last run's code when it has none);
    raises verdicts.Unscorable when its tests could not run."""
    p = self.problem
    text = action
    if self.last_run and code_task.extract_code(action, entry_point=p.entry_point) is None:
      text = self.last_run
    got = self.task.outcome(p.spec, text)
    self.outcome, self.cause = got.verdict, got.cause
    self.label = got.cause
    if self.outcome == "could_not_run":
      message = f"code {p.id}: could not run the tests: {got.detail}"
      raise verdicts.Unscorable(message, label=got.cause)
    return float(self.outcome == "pass")

  def observe(self, message: str) -> tuple[int, ...]:
    """The observation tokens of a message: on its own lines, clipped to max_chars, in
    the tokenizer's alphabet (characters it lacks become "?"), special-token text as text
    (the code's output is the candidate's: it may print an end-of-turn marker)."""
    text = f"\n{clip(message, self.max_chars - 2)}\n"
    alphabet = getattr(self.tokenizer, "alphabet", None)
    if alphabet is not None:
      text = code_task.to_alphabet(text, alphabet)
    return self.encode_observation(text)
