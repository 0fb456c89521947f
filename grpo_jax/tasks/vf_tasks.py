"""A `verifiers` environment's dataset as a task: task.name = "vf:<env_id>".

    c.task.name = "vf:grpo_jax.envs.vf_calculator"   # any module with load_environment()
    c.task.kwargs = dict(env_args=dict(steps=2))      # its load_environment's arguments
    c.env.name = "verifiers"                          # its rollouts as episodes (envs.vf_env)

`verifiers` here is Prime Intellect's environment library (`pip install -e ".[verifiers]"`;
not grpo_jax.verifiers, the answer checkers). `vf.load_environment(env_id, **env_args)`
imports the module named env_id (an installed environment package, or any importable
module) and calls its `load_environment`. Its environment carries a dataset of rows
(prompt: a string for message_type "completion", chat messages for "chat"; answer; task;
info) and a rubric that scores a finished rollout. This module draws the rows; the
episodes (`envs.vf_env`) run the environment's own rollouts and take the rubric's reward.

Rows and splits: training draws `dataset`, held-out evaluation `eval_dataset`; an
environment without one has its dataset split by a stable hash of each prompt
(test_percent). Index i of a split is row perm_e[i mod n] of the split's n rows, perm_e a
permutation drawn from (seed, split, e = i div n): epochs of the rows, reshuffled each
epoch, a pure function of (split, index, seed) so a resume draws the same rows.

Prompts: a completion environment's prompt string as it is (the toy character tokenizer
without config.hf_dir); a chat environment's messages through the model's chat template
(config.hf_dir required), ending with the generation prompt. A row's info["reference"],
when present, is its supervised warm-start target.

Versions: the interface driven here is `Environment.rollout(client, model, prompt, answer,
task, info)` with an `openai.AsyncOpenAI` client, verifiers 0.1.3 to 0.1.7 (0.1.3 in the
test extra; 0.1.7 checked by hand). 0.1.8 moved to `rollout(input: RolloutInput, ...)`,
0.1.11 to its own client class and 0.4 to agent harnesses: an environment whose rollout
lacks (client, model, prompt, answer) is refused when the task is built, naming the
installed version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import json

import numpy as np

from grpo_jax.tasks import base

PREFIX = "vf:"
ROLLOUT_ARGS = ("client", "model", "prompt", "answer")  # verifiers 0.1.x's rollout.


@dataclasses.dataclass(frozen=True)
class VfExample(base.Example):
  """A row of a verifiers environment's dataset: which environment (`env_id`, its
  `env_args` as JSON), which of its datasets ("dataset" or "eval_dataset") and which row."""

  env_id: str = ""
  env_args: str = "{}"
  source: str = "dataset"
  row: int = 0


def _verifiers():
  try:
    import verifiers  # noqa: PLC0415 -- the optional extra, imported when a vf: task is built.
  except ImportError:
    raise ImportError(
      "task 'vf:...' needs the verifiers package: pip install -e \".[verifiers]\" "
      "(verifiers 0.1.3 to 0.1.7)."
    ) from None
  return verifiers


def args_json(env_args: dict | None) -> str:
  """`env_args` as the canonical JSON the loader caches by (sorted keys)."""
  try:
    return json.dumps(dict(env_args or {}), sort_keys=True)
  except TypeError as e:
    raise ValueError(f"task 'vf:...' env_args={env_args!r}: must be JSON values ({e}).") from None


@functools.cache
def load(env_id: str, env_args: str = "{}"):
  """The verifiers environment `env_id` built with `env_args` (JSON), once per process."""
  vf = _verifiers()
  try:
    env = vf.load_environment(env_id, **json.loads(env_args))
  except (ValueError, RuntimeError, TypeError) as e:
    raise ValueError(f"task 'vf:{env_id}': {e}") from None
  params = inspect.signature(env.rollout).parameters
  if not set(ROLLOUT_ARGS) <= set(params):
    raise ValueError(
      f"task 'vf:{env_id}': its rollout takes ({', '.join(params)}), not verifiers 0.1.x's "
      f"({', '.join(ROLLOUT_ARGS)}, ...) that grpo_jax drives (installed verifiers "
      f"{getattr(vf, '__version__', '?')}): pip install 'verifiers>=0.1.3,<0.1.8'."
    )
  if getattr(env, "oai_tools", None):
    raise ValueError(
      f"task 'vf:{env_id}' offers tools (oai_tools: a ToolEnv): their calls need the chat "
      "template's tool format, which grpo_jax's verifiers adapter does not parse; write the "
      "tool as an env_response that reads the action's text (grpo_jax/envs/vf_calculator.py)."
    )
  if env.message_type not in ("chat", "completion"):
    raise ValueError(
      f"task 'vf:{env_id}': message_type {env.message_type!r} is not chat/completion."
    )
  return env


def row(env, source: str, i: int) -> dict:
  """Row i of the environment's `source` dataset ("dataset" or "eval_dataset"), with the
  fields every row has (task "default" and info {} where it has none)."""
  got = dict(getattr(env, source)[int(i)])
  info = got.get("info") or {}
  if isinstance(info, str):  # Environments may store info as JSON text.
    info = json.loads(info) if info else {}
  return {
    "prompt": got["prompt"], "answer": str(got.get("answer", "")),
    "task": got.get("task") or "default", "info": info,
  }  # fmt: skip


def _score_state() -> dict:
  """The rollout state a rubric scores a bare completion with: no responses, no turns, and
  the timing fields verifiers 0.1.7's rubric writes into."""
  return {
    "responses": [],
    "turn": 0,
    "timing": {"generation_ms": 0.0, "scoring_ms": 0.0, "total_ms": 0.0},
  }


def run(coro):
  """`coro`'s result on a fresh event loop: in this thread, or in another when this one
  already runs a loop (a notebook's)."""
  try:
    asyncio.get_running_loop()
  except RuntimeError:
    return asyncio.run(coro)
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    return pool.submit(asyncio.run, coro).result()


class VfTask(base.Task):
  """The rows of verifiers environment `env_id` (module docstring). Options: `env_args`
  (its load_environment's keyword arguments), `test_percent` (the held-out share of an
  environment without an eval_dataset)."""

  uses_hf_tokenizer = True  # The trainer passes config.hf_dir as tokenizer_dir.

  def __init__(
    self,
    *,
    env_id: str,
    env_args: dict | None = None,
    tokenizer_dir: str = "",
    test_percent: int = 10,
  ):
    if not env_id:
      raise ValueError("task 'vf:<env_id>': name the environment's module after 'vf:'.")
    if not 0 < test_percent < 100:
      raise ValueError(f"task 'vf:{env_id}' test_percent={test_percent}: must be in (0, 100).")
    self.name = PREFIX + env_id
    self.env_id, self.env_args = env_id, args_json(env_args)
    self.tokenizer_dir, self.test_percent = str(tokenizer_dir), test_percent
    env = self.env()
    self.message_type = env.message_type
    if self.message_type == "chat" and not self.tokenizer_dir:
      raise ValueError(
        f"task 'vf:{env_id}' is a chat environment: set config.hf_dir to a model whose "
        "tokenizer has a chat template (its prompts are chat messages)."
      )
    self._rows = self._split(env)
    for split, rows in self._rows.items():
      if not rows[1]:
        raise ValueError(f"task 'vf:{env_id}': its {split} split has no rows.")
    self._tokenizer = None
    self._by_prompt: dict | None = None

  def __getstate__(self):  # Reward workers reload the environment (`load`).
    return {**self.__dict__, "_tokenizer": None, "_by_prompt": None}

  def env(self):
    return load(self.env_id, self.env_args)

  def _split(self, env) -> dict[str, tuple[str, list[int]]]:
    """Per split: (the environment's dataset attribute, its row numbers)."""
    train = env.dataset if env.dataset is not None else env.eval_dataset
    if env.eval_dataset is not None and env.dataset is not None:
      return {
        "train": ("dataset", list(range(len(env.dataset)))),
        "test": ("eval_dataset", list(range(len(env.eval_dataset)))),
      }
    source = "dataset" if env.dataset is not None else "eval_dataset"
    keys = [json.dumps(p, sort_keys=True) for p in train["prompt"]]
    of = [base.split_of(k, test_percent=self.test_percent) for k in keys]
    return {s: (source, [i for i, x in enumerate(of) if x == s]) for s in base.SPLITS}

  def data_notes(self) -> list[str]:
    (a, train), (b, test) = self._rows["train"], self._rows["test"]
    how = "its eval_dataset" if b != a else f"a hash split of its {a} ({self.test_percent}%)"
    return [
      f"vf:{self.env_id}: {len(train)} training rows from its {a}, {len(test)} held-out "
      f"rows from {how} (verifiers {_verifiers().__version__}, {self.message_type})."
    ]

  def tokenizer(self):
    if self._tokenizer is None:
      if self.tokenizer_dir:
        from grpo_jax.models import hf_tokenizer  # noqa: PLC0415

        self._tokenizer = hf_tokenizer.load(self.tokenizer_dir)
      else:
        self._tokenizer = super().tokenizer()
    return self._tokenizer

  def row(self, source: str, i: int) -> dict:
    return row(self.env(), source, i)

  def render(self, prompt) -> str:
    """A row's prompt as the model reads it (module docstring)."""
    if self.message_type == "completion":
      if not isinstance(prompt, str):
        raise ValueError(
          f"task 'vf:{self.env_id}': a completion row's prompt is text, got {prompt!r}."
        )
      return prompt
    return self.tokenizer().apply_chat_template(list(prompt), add_generation_prompt=True)

  def example(self, split: str, index: int, *, seed: int) -> VfExample:
    if split not in base.SPLITS:
      raise ValueError(f"Unknown split {split!r}; valid splits: {base.SPLITS}.")
    source, rows = self._rows[split]
    epoch, k = divmod(int(index), len(rows))
    perm = np.random.default_rng([seed, base.SPLITS.index(split), epoch]).permutation(len(rows))
    return self._example(source, rows[int(perm[k])])

  def _example(self, source: str, i: int) -> VfExample:
    row = self.row(source, i)
    return VfExample(
      prompt=self.render(row["prompt"]),
      reference=str(row["info"].get("reference", "")),
      answer=row["answer"],
      env_id=self.env_id,
      env_args=self.env_args,
      source=source,
      row=i,
    )

  def _draw(self, rng: np.random.Generator):
    source, rows = self._rows["train"]
    ex = self._example(source, rows[int(rng.integers(len(rows)))])
    return ex.prompt, ex

  def _row_of(self, prompt: str) -> dict:
    """The row whose rendered prompt is `prompt` (rewards get the prompt text)."""
    if self._by_prompt is None:
      self._by_prompt = {}
      for source, rows in self._rows.values():
        for i in rows:
          self._by_prompt.setdefault(self.render(self.row(source, i)["prompt"]), (source, i))
    if prompt not in self._by_prompt:
      raise KeyError(f"task 'vf:{self.env_id}': no row has the prompt {prompt[:80]!r}.")
    return self.row(*self._by_prompt[prompt])

  def _completion(self, text: str):
    return text if self.message_type == "completion" else [{"role": "assistant", "content": text}]

  def reward(self, prompt: str, completion: str) -> float:
    """The rubric's reward for `completion` as the whole rollout's completion (a single-turn
    answer, or a completion environment's transcript text), with a state that holds no
    model responses (`_score_state`)."""
    row = self._row_of(prompt)
    score = run(
      self.env().rubric.score_rollout(
        row["prompt"],
        self._completion(completion),
        row["answer"],
        _score_state(),
        task=row["task"],
        info=row["info"],
      )  # fmt: skip
    )
    return float(score.reward)

  def format_reward(self, prompt: str, completion: str) -> float:
    """The environment parser's format reward (verifiers' default parser: always 1)."""
    del prompt
    try:
      return float(
        self.env().parser.get_format_reward_func()(completion=self._completion(completion))
      )
    except Exception:  # noqa: BLE001 -- a format function that cannot read it: 0.
      return 0.0
