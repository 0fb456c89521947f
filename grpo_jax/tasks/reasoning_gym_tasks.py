"""reasoning-gym's procedurally generated, verifiable tasks by name: task.name = "rg:<dataset>".

    c.task.name = "rg:chain_sum"
    c.task.kwargs = dict(min_terms=2, max_terms=2, max_digits=1)   # the dataset's own options
    c.hf_dir = "/models/SmolLM2-135M-Instruct"     # its tokenizer and chat template (optional)

Any of reasoning-gym's datasets (`reasoning_gym.factory.DATASETS`, 100 and more: arithmetic,
algebra, logic, string manipulation, puzzles) is a task here; nothing is downloaded, every
problem is generated. The options of the task's kwargs go to the dataset's config class
(size, difficulty: `min_terms`, `max_digits`...), checked by it; a key it does not have is
refused with the ones it has.

Problems. Problem `index` of a split under run seed s is the dataset's entry j (its own
generator seeded with `rg_seed`, j drawn from the run's rng), kept when its question's hash
falls in the split (`base.split_of`, test_percent% to "test"): a pure function of (split,
index, s), so a resume is exact, and no held-out question is a training question.

Prompt and tokenizer. With a tokenizer directory (config.hf_dir: a Hugging Face directory
or GGUF file): reasoning-gym's system prompt `system_prompt` (default "default": think, then
the answer in <answer></answer>) and the question as the user turn of the model's chat
template; the answer is the last <answer> tag's text (`reasoning_gym.utils.extract_answer`).
Without one (the toy model): "Q:<question>\\n" under a character tokenizer over printable
ASCII, the completion "A:<answer>." as the arithmetic task writes it.

Verifier. The dataset's own scorer, `score_answer(answer, entry)` in [0, 1] (the entry
regenerated from its index in the reward worker). Pass/fail and partial credit are kept
apart: the reward is 1 for a full score and 0 otherwise, and a partial score (0 < s < 1) is
labelled "partial" (reward/outcome/partial: how often the scorer gave part credit); with
partial_credit=True the reward is s itself. Outcomes: "exact", "partial", "wrong",
"no_answer".

Curriculum (curriculum=True, for the datasets reasoning-gym gives one: `curricula()`): the
dataset's difficulty knobs at one global level L (reasoning-gym's curriculum: each knob at
its L-th value, or its last), starting at curriculum_level (0). After every iteration the
trainer hands the batch's outcome counts to `observe`; p, the share of the batch's labelled
rows the scorer judged exact (partial credit is not a pass, whatever partial_credit says
the reward is), moves the level: over the last `curriculum_window` iterations at this
level, a mean p ≥ curriculum_up raises L by one and a mean p ≤ curriculum_down lowers it
(the window starts again after a move), never past the highest level whose options build
(`_levels_that_work`). The level is the task's state (`state`), which the trainer
checkpoints and restores, so a resumed run draws the problems it would have; a problem's
reward input carries the level it was drawn at. Held-out problems are drawn at one fixed
level, curriculum_eval_level (-1: the start level), so the evaluation curve measures the
policy, not the moving difficulty; task/level and task/level_pass_rate are logged. The
start-up check of prompt lengths draws at the top level too (`hardest`).

Hand-written: reasoning-gym ships datasets and scorers, not a trainer's task (splits by
seed, a tokenizer, prompts, a picklable verifier); this is that adapter.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import string

import numpy as np

from grpo_jax.tasks import base
from grpo_jax.verifiers import verdicts

PREFIX = "rg:"
OUTCOMES = ("exact", "partial", "wrong", "no_answer")
# The toy tokenizer's alphabet: printable ASCII and the newline (no tabs or form feeds).
ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
_TOY_ANSWER = re.compile(r"^A:(.*)\.$", re.DOTALL)
_NOT_OPTIONS = ("seed", "size")  # Set by the task: a seed, and no end.


def _rg():
  """The reasoning_gym package (imported when an rg: task is built: 3 s)."""
  try:
    import reasoning_gym  # noqa: PLC0415

    return reasoning_gym
  except ImportError:
    raise ValueError(
      "task 'rg:...' needs the reasoning-gym package: pip install reasoning-gym (it is in "
      "grpo_jax's dependencies; reinstall with pip install -e .)."
    ) from None


def datasets() -> list[str]:
  """The names reasoning-gym generates (`rg:<name>`)."""
  return sorted(_rg().factory.DATASETS)


def _dataset(name: str, options: dict, rg_seed: int):
  """The dataset `name` with config options (hashable values: `_frozen`), seeded rg_seed;
  built once per (name, options, seed)."""
  return _built(name, tuple(sorted(options.items())), rg_seed)[0]


def _span(name: str, options: dict, rg_seed: int) -> int:
  """How many entries that dataset draws from: a generated dataset's are unbounded
  (2^31 − 1); one read from a file (acre, word_ladder...) has len(ds) and refuses an index
  past it. Found once, with the dataset."""
  return _built(name, tuple(sorted(options.items())), rg_seed)[1]


@functools.cache
def _built(name: str, options: tuple, rg_seed: int):
  """(dataset, span) of `_dataset` and `_span`."""
  rg = _rg()
  _, config_cls = rg.factory.DATASETS[name]
  cfg = config_cls(**dict(options), seed=rg_seed)
  # Its fields shallowly: a nested config (arc_agi's) stays the dataclass the dataset expects.
  ds = rg.create_dataset(name, **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
  try:
    ds[2**31 - 2]
  except IndexError:
    return ds, len(ds)
  return ds, 2**31 - 1


def _frozen(value):
  """An option's value hashable and as its config class expects it: lists (a config read
  back from JSON) as tuples."""
  if isinstance(value, list | tuple):
    return tuple(_frozen(v) for v in value)
  return value


def curricula() -> list[str]:
  """The datasets reasoning-gym gives a curriculum (curriculum=True)."""
  return sorted(_rg().factory.CURRICULA)


def _check_options(name: str, options: dict) -> None:
  rg = _rg()
  if name not in rg.factory.DATASETS:
    close = [d for d in datasets() if name and name[:3] in d][:8]
    raise ValueError(
      f"task 'rg:{name}': reasoning-gym has no dataset {name!r}"
      f"{f' (close: {close})' if close else ''}; `grpo_jax.tasks.reasoning_gym_tasks.datasets()` "
      "lists all."
    )
  _, config_cls = rg.factory.DATASETS[name]
  known = [f.name for f in dataclasses.fields(config_cls) if f.name not in _NOT_OPTIONS]
  if taken := sorted(set(options) & set(_NOT_OPTIONS)):
    raise ValueError(
      f"task 'rg:{name}' options {taken}: problems are drawn without end from the run's seed "
      "(its splits by seed), so the dataset's size and seed are not set; use rg_seed for "
      "another problem stream."
    )
  unknown = sorted(set(options) - set(known))
  if unknown:
    raise ValueError(f"task 'rg:{name}' options {unknown}: its dataset takes {known}.")
  try:
    _dataset(name, {k: _frozen(v) for k, v in options.items()}, 0)
  except (ValueError, AssertionError, TypeError) as e:  # Its config's own validation.
    raise ValueError(f"task 'rg:{name}' options {options}: {e}") from None


class ReasoningGymTask(base.Task):
  """One reasoning-gym dataset as a task. See the module docstring."""

  uses_hf_tokenizer = True  # The trainer passes config.hf_dir as tokenizer_dir.
  outcomes = OUTCOMES

  def __init__(
    self,
    *,
    dataset: str,
    tokenizer_dir: str = "",
    rg_seed: int = 0,
    test_percent: int = 10,
    partial_credit: bool = False,
    system_prompt: str = "default",
    curriculum: bool = False,
    curriculum_up: float = 0.8,
    curriculum_down: float = 0.2,
    curriculum_window: int = 5,
    curriculum_level: int = 0,
    curriculum_eval_level: int = -1,
    **options,
  ):
    if not 0 < test_percent < 100:
      raise ValueError(f"test_percent must be in (0, 100), got {test_percent}.")
    _check_options(dataset, options)
    options = {k: _frozen(v) for k, v in options.items()}
    self.top_level = 0  # The highest level the curriculum may reach (`_levels_that_work`).
    if curriculum:
      _check_curriculum(dataset, curriculum_down, curriculum_up, curriculum_window)
      self.top_level = _levels_that_work(dataset, options, int(rg_seed))
      for key, value in (("curriculum_level", curriculum_level),
                         ("curriculum_eval_level", curriculum_eval_level)):  # fmt: skip
        if not 0 <= value <= self.top_level and (key, value) != ("curriculum_eval_level", -1):
          raise ValueError(
            f"task 'rg:{dataset}' {key}={value}: its levels that build with these options "
            f"are 0 to {self.top_level}{' (or -1: the start level)' if 'eval' in key else ''}."
          )
    prompts = _rg().utils.SYSTEM_PROMPTS
    if tokenizer_dir and system_prompt not in prompts:
      raise ValueError(
        f"task 'rg:{dataset}' system_prompt={system_prompt!r}: one of reasoning-gym's "
        f"{sorted(prompts)}."
      )
    self.name = PREFIX + dataset
    self.dataset = dataset
    self.options = options
    self.tokenizer_dir = str(tokenizer_dir)
    self.rg_seed, self.test_percent = int(rg_seed), test_percent
    self.partial_credit = bool(partial_credit)
    self.system_prompt = prompts[system_prompt] if tokenizer_dir else ""
    self.curriculum = bool(curriculum)
    self.curriculum_up, self.curriculum_down = float(curriculum_up), float(curriculum_down)
    self.curriculum_window = int(curriculum_window)
    self.level, self._recent = int(curriculum_level), []
    self.eval_level = int(
      curriculum_level if curriculum_eval_level == -1 else curriculum_eval_level
    )
    self._tokenizer = None

  def __getstate__(self):  # Reward workers rebuild the dataset and need no tokenizer.
    return {**self.__dict__, "_tokenizer": None}

  def _options(self, level: int | None = None) -> dict:
    """The dataset's options at curriculum `level` (None: the task's own level; without a
    curriculum, the options as given)."""
    if not self.curriculum:
      return self.options
    return _at_level(self.dataset, self.options, self.level if level is None else level)

  # --- Curriculum -------------------------------------------------------------------------

  def state(self) -> dict:
    return {"level": self.level, "recent": list(self._recent)} if self.curriculum else {}

  def load_state(self, state: dict) -> None:
    if self.curriculum and state:
      self.level, self._recent = int(state["level"]), [float(p) for p in state["recent"]]

  def observe(self, pass_rate, *, outcomes: tuple[int, ...] = ()) -> dict:
    """Moves the level by the mean exact-solve rate of the last curriculum_window
    iterations (see the module docstring); logs task/level (after the move) and
    task/level_pass_rate."""
    del pass_rate  # Counts partial credit as a pass: the outcome counts do not.
    if not self.curriculum:
      return {}
    labelled = sum(outcomes)
    exact = outcomes[OUTCOMES.index("exact")] / labelled if labelled else 0.0
    self._recent = [*self._recent, float(exact)][-self.curriculum_window :]
    mean = sum(self._recent) / len(self._recent)
    if len(self._recent) == self.curriculum_window:
      if mean >= self.curriculum_up and self.level < self.top_level:
        self.level, self._recent = self.level + 1, []
      elif mean <= self.curriculum_down and self.level > 0:
        self.level, self._recent = self.level - 1, []
    return {"task/level": self.level, "task/level_pass_rate": mean}

  def tokenizer(self):
    if self._tokenizer is None:
      if self.tokenizer_dir:
        from grpo_jax.models import hf_tokenizer  # noqa: PLC0415

        self._tokenizer = hf_tokenizer.load(self.tokenizer_dir)
      else:
        from grpo_jax.models import tokenizers  # noqa: PLC0415

        self._tokenizer = tokenizers.CharTokenizer(ALPHABET)
    return self._tokenizer

  # --- Problems ---------------------------------------------------------------------------

  def hardest(self):
    if not self.curriculum:
      return None
    top = copy.copy(self)
    top.level, top._recent = self.top_level, []
    return top

  def _draw_for(self, split: str, rng: np.random.Generator) -> tuple[str, base.Example]:
    """Held-out problems at the fixed evaluation level; training ones at the run's."""
    return self._draw(rng, level=self.eval_level if split == "test" else self.level)

  def _draw(self, rng: np.random.Generator, *, level: int | None = None):
    level = self.level if level is None else level
    options = self._options(level)
    j = int(rng.integers(_span(self.dataset, options, self.rg_seed)))
    entry = _dataset(self.dataset, options, self.rg_seed)[j]
    question, answer = str(entry["question"]), str(entry["answer"])
    if self.tokenizer_dir:
      prompt = base.chat_prompt(self.tokenizer(), question, system=self.system_prompt)
      reference = f"<answer>{answer}</answer>"
    else:
      prompt, reference = f"Q:{question}\n", f"A:{answer}."
    return question, _IndexedExample(
      prompt=prompt, reference=reference, answer=answer, index=j, level=level
    )

  def reward_input(self, example: base.Example) -> str:
    """The entry's index and curriculum level (the worker regenerates it for the scorer), as
    JSON."""
    index, level = _index_of(example)
    return json.dumps({"index": index, "level": level})

  # --- Scoring ----------------------------------------------------------------------------

  def extract_answer(self, completion: str) -> str | None:
    if self.tokenizer_dir:
      return _rg().utils.extract_answer(completion)
    m = _TOY_ANSWER.match(completion.strip())
    return None if m is None else m.group(1).strip()

  def score(self, reward_input: str, completion: str) -> tuple[float | None, float]:
    """(the scorer's s in [0, 1], or None when the completion states no answer; the reward)."""
    where = json.loads(reward_input)
    ds = _dataset(self.dataset, self._options(where.get("level", 0)), self.rg_seed)
    entry = ds[where["index"]]
    answer = self.extract_answer(completion)
    if answer is None:
      return None, 0.0
    s = float(ds.score_answer(answer=answer, entry=entry))
    return s, s if self.partial_credit else float(s >= 1.0)

  def reward(self, prompt: str, completion: str) -> float:
    """`prompt` is `reward_input`'s JSON; labelled with the outcome (`OUTCOMES`)."""
    s, r = self.score(prompt, completion)
    label = "no_answer" if s is None else "exact" if s >= 1.0 else "partial" if s > 0 else "wrong"
    return verdicts.Labeled(r, label)

  def format_reward(self, prompt: str, completion: str) -> float:
    del prompt
    return float(self.extract_answer(completion) is not None)


# The entry index rides on the Example (frozen): a subclass field, so examples compare and
# print as before and `reward_input` can read it back.
@dataclasses.dataclass(frozen=True)
class _IndexedExample(base.Example):
  index: int = -1
  level: int = 0


def _index_of(example: base.Example) -> tuple[int, int]:
  if not isinstance(example, _IndexedExample):
    raise ValueError("a reasoning-gym reward needs the Example its task drew (with its index).")
  return example.index, example.level


@functools.cache
def _curriculum(name: str, level: int):
  rg = _rg()
  c = rg.factory.create_curriculum(name)
  c.set_global_level(level)
  return c


def _max_level(name: str) -> int:
  """The highest global level that still moves a knob: the longest attribute's last."""
  return max(len(a.levels) for a in _curriculum(name, 0).attributes.values()) - 1


def _at_level(name: str, options: dict, level: int) -> dict:
  """The options with the curriculum's knobs at global `level`: every field a curriculum
  attribute sets takes the curriculum's value, over the given options."""
  cfg = _curriculum(name, level).generate_configuration()
  knobs = {
    f: getattr(cfg, f)
    for a in _curriculum(name, 0).attributes.values()
    for f in _knob_fields(a)
    if hasattr(cfg, f)
  }
  return {**options, **{k: _frozen(v) for k, v in knobs.items()}}


def _knob_fields(attribute) -> tuple[str, ...]:
  """The config fields a curriculum attribute sets (a range: its lower and upper fields)."""
  names = [
    getattr(attribute, n, None) for n in ("lower_field_name", "upper_field_name", "field_name")
  ]
  return tuple(n for n in names if n) or (attribute.name,)


def _levels_that_work(name: str, options: dict, rg_seed: int) -> int:
  """The highest level L such that the dataset builds and draws a problem at every level
  0..L (some of reasoning-gym's curricula name knob values their own dataset refuses:
  caesar_cipher at 2, jugs at 3; a run must never reach them). Refuses a curriculum that
  does not build at level 0."""
  top = -1
  for level in range(_max_level(name) + 1):
    try:
      _dataset(name, _at_level(name, options, level), rg_seed)[0]
    except Exception:  # noqa: BLE001 -- any failure of reasoning-gym's own code.
      break
    top = level
  if top < 0:
    raise ValueError(
      f"task 'rg:{name}' curriculum=True: reasoning-gym's curriculum does not build its "
      "dataset at level 0 with these options; use curriculum=False."
    )
  return top


def _check_curriculum(name: str, down: float, up: float, window: int) -> None:
  if name not in curricula():
    raise ValueError(
      f"task 'rg:{name}' curriculum=True: reasoning-gym has no curriculum for it; it has one "
      f"for {len(curricula())} datasets (`reasoning_gym_tasks.curricula()`)."
    )
  if not 0 <= down < up <= 1:
    raise ValueError(
      f"task 'rg:{name}' curriculum_down={down}, curriculum_up={up}: need 0 <= down < up <= 1."
    )
  if window < 1:
    raise ValueError(f"task 'rg:{name}' curriculum_window={window}: must be >= 1.")
