"""The teacher of on-policy distillation (config.teacher): where it comes from, its
architecture and tokenizer, its weights on the run's mesh, and its fingerprint.

    c.rl.advantage = "distill"                     # advantages.distill reads log π_T
    c.teacher.path = "/runs/teacher"               # a grpo_jax workdir, a HF directory or a GGUF file

A teacher is any model the framework loads (`KINDS`):
  "workdir"  a grpo_jax run's workdir: the architecture and tokenizer from its config.json,
             the policy's params (train.params only: no optimizer state is read) from
             checkpoint `step` (-1: the newest) under workdir/checkpoints, integrity-checked
             like a resume's. A run with adapters (model.lora) keeps its base elsewhere:
             export it (`export_hf`) and name that directory instead.
  "hf"       a Hugging Face checkpoint directory (config.json + safetensors, `hf`).
  "gguf"     a GGUF file (`gguf_import`).

It must read the student's tokens as the same text: the same vocabulary size and the same
ids for the task's first training prompt (`check_tokenizer`), else the run is refused in
one line (log-probs of ids that mean other text would be noise). Its params take the run's
logical→mesh rules (`sharding.param_shardings` of its own ModelConfig), so it is sharded
like the reference; `dtype` casts them (bfloat16 halves a float32 teacher's HBM). It is
never checkpointed: a resume reads it again from `path` and checks its fingerprint
(`frozen_base.fingerprint`) against the one the run recorded in workdir/teacher.json, so a
teacher that changed under a run is an error, not a silent switch.

Hand-written: the loaders are the framework's own (`hf`, `gguf_import`, orbax); what is
here is choosing among them and the checks.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax.infra import checkpoint
from grpo_jax.models import frozen_base, gguf_import, hf, model

KINDS = ("workdir", "hf", "gguf")
DTYPES = ("", "float32", "bfloat16")
RECORD = "teacher.json"  # Under the student's workdir: the teacher's identity.


class TeacherError(ValueError):
  """A teacher that cannot be used: which path, what is wrong, what would do."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherConfig:
  """config.teacher: the model whose per-token log-probs distillation reads ("" : none)."""

  path: str = ""  # A grpo_jax workdir, a HF checkpoint directory or a GGUF file.
  step: int = -1  # A workdir's checkpoint (-1: its newest).
  dtype: str = ""  # Its params on device: "" as stored, "float32" or "bfloat16".

  def __post_init__(self):
    if self.step < -1:
      raise ValueError(f"config.teacher.step must be -1 (the newest) or >= 0, got {self.step}.")
    if self.dtype not in DTYPES:
      raise ValueError(f"config.teacher.dtype must be one of {DTYPES}, got {self.dtype!r}.")

  @property
  def enabled(self) -> bool:
    return bool(self.path)


@dataclasses.dataclass(frozen=True)
class Source:
  """What a teacher is, read without its weights (`describe`): kind, where, architecture,
  tokenizer, and for a workdir the checkpoint step and its recorded config."""

  kind: str
  path: str
  model_cfg: model.ModelConfig
  tokenizer: Any
  step: int | None = None  # A workdir's checkpoint.


def kind_of(path: str) -> str:
  """Which of `KINDS` `path` is, or TeacherError saying what it is not."""
  p = pathlib.Path(path).expanduser()
  if gguf_import.is_source(str(p)):
    return "gguf"
  if p.is_dir() and (p / "checkpoints").is_dir() and (p / "config.json").is_file():
    return "workdir"
  if p.is_dir() and (p / "config.json").is_file():
    return "hf"
  raise TeacherError(
    f"config.teacher.path={path!r} is not a teacher: expected a grpo_jax workdir (config.json "
    "and checkpoints/), a Hugging Face directory (config.json and safetensors) or a .gguf file."
  )


def _recorded(path: pathlib.Path) -> dict:
  d = json.loads((path / "config.json").read_text())
  if not isinstance(d, dict) or "model" not in d or "task" not in d:
    raise TeacherError(f"{path / 'config.json'} is not a grpo_jax run's config (no model or task).")
  return d


def _workdir_step(path: pathlib.Path, step: int) -> int:
  steps = sorted(int(s.name) for s in (path / "checkpoints").iterdir() if s.name.isdigit())
  if not steps:
    raise TeacherError(f"config.teacher.path={str(path)!r} has no checkpoints.")
  if step == -1:
    return steps[-1]
  if step not in steps:
    raise TeacherError(f"config.teacher.step={step}: {path}/checkpoints has {steps}.")
  return step


def describe(cfg: TeacherConfig, *, task_and_tokenizer=None) -> Source:
  """The teacher's kind, architecture and tokenizer, no weights read. `task_and_tokenizer`
  is `build.task_and_tokenizer` (how a workdir's recorded task gives its tokenizer); None:
  no tokenizer is read (Source.tokenizer None: the memory plan and the TPU compile)."""
  kind = kind_of(cfg.path)
  path = pathlib.Path(cfg.path).expanduser()
  if kind != "workdir":
    from grpo_jax.models import hf_tokenizer  # noqa: PLC0415 -- only with a HF teacher.

    mcfg = hf.model_config(hf.read_config(str(path)), where=hf.config_where(str(path)))
    tok = hf_tokenizer.load(str(path)) if task_and_tokenizer is not None else None
    return Source(kind, str(path), _cast(mcfg, cfg.dtype), tok)
  d = _recorded(path)
  mcfg = model.ModelConfig.from_dict(d["model"])
  if mcfg.lora.enabled:
    raise TeacherError(
      f"config.teacher.path={cfg.path!r} is a run with adapters (model.lora): its checkpoints "
      "hold the adapters, not the model. Export it (config.export_hf) and name that directory."
    )
  tok = None
  if task_and_tokenizer is not None:
    hf_dir = d.get("loop", {}).get("hf_dir", "")
    task_d = {"name": d["task"]["name"], "kwargs": dict(d["task"].get("kwargs") or {})}
    _, tok = task_and_tokenizer(task_d, hf_dir=hf_dir)
  step = _workdir_step(path, cfg.step)
  return Source(kind, str(path), _cast(mcfg, cfg.dtype), tok, step=step)


def _cast(mcfg: model.ModelConfig, dtype: str) -> model.ModelConfig:
  """The teacher's ModelConfig with dtype set: its params' and its compute dtype; no
  dropout or remat (it is never trained)."""
  lora = dataclasses.replace(mcfg.lora, rank=0)
  out = dataclasses.replace(mcfg, remat="none", lora=lora)
  if dtype:
    out = dataclasses.replace(out, param_dtype=dtype, dtype=dtype)
  return out


def check_tokenizer(source: Source, tok, prompt: str) -> None:
  """Refuses a teacher whose tokenizer is not the student's: another vocabulary size, or
  other ids for `prompt` (the task's first training prompt)."""
  mine = source.tokenizer
  if tok.vocab_size == mine.vocab_size and tok.encode(prompt) == mine.encode(prompt):
    if source.model_cfg.vocab_size >= tok.vocab_size:
      return
    raise TeacherError(
      f"the teacher ({source.path}) has {source.model_cfg.vocab_size:,} embedding rows, fewer "
      f"than the student's tokenizer's {tok.vocab_size:,} ids."
    )
  raise TeacherError(
    f"the teacher ({source.kind} {source.path}) reads text with another tokenizer "
    f"({type(mine).__name__}, {mine.vocab_size:,} ids) than the student's "
    f"({type(tok).__name__}, {tok.vocab_size:,} ids): its log-probs would score ids that mean "
    "other text. Distil from a teacher that shares the student's tokenizer (cross-tokenizer "
    "distillation is not supported)."
  )


def limited(source: Source, vocab: int) -> Source:
  """The source with its softmax over the student's `vocab` ids only (`vocab_limit`, as the
  student's own config has past a padded vocabulary): π_T then spreads no mass over ids the
  student can never sample, and log π_T is comparable with log π_old."""
  limit = vocab if vocab < source.model_cfg.vocab_size else 0
  return dataclasses.replace(
    source, model_cfg=dataclasses.replace(source.model_cfg, vocab_limit=limit)
  )


def load_params(source: Source, *, shardings):
  """The teacher's params on `shardings` (`sharding.param_shardings(layout,
  source.model_cfg)`), in source.model_cfg.param_dtype."""
  mcfg = source.model_cfg
  if source.kind in ("hf", "gguf"):
    return hf.load_params(source.path, mcfg, shardings=shardings)
  step_dir = pathlib.Path(source.path) / "checkpoints" / str(source.step)
  if (why := checkpoint.damage(step_dir)) is not None:
    raise TeacherError(f"the teacher's checkpoint {step_dir} is damaged: {why}")
  like = jax.eval_shape(lambda k: model.init(mcfg, k), jax.random.key(0))
  params = checkpoint.restore_params(step_dir / "state", like=like, shardings=shardings)
  dtype = jnp.dtype(mcfg.param_dtype)
  return jax.tree.map(lambda x: x.astype(dtype) if x.dtype != dtype else x, params)


def identity(source: Source, params) -> dict:
  """What workdir/teacher.json records: kind, path, step and the params' fingerprint."""
  return {
    "kind": source.kind,
    "path": source.path,
    "step": source.step,
    "fingerprint": frozen_base.fingerprint(params),
  }


def recorded_step(source: Source, workdir, cfg: TeacherConfig, *, resumed: bool) -> Source:
  """On a resume, a workdir teacher named by its newest checkpoint (step -1) is the step the
  run recorded in workdir/teacher.json, not the newest now: a teacher run still training,
  or rotating its checkpoints, does not switch the teacher under the student."""
  path = pathlib.Path(workdir) / RECORD
  if not (resumed and source.kind == "workdir" and cfg.step == -1 and path.is_file()):
    return source
  step = json.loads(path.read_text()).get("step")
  if step is None or step == source.step:
    return source
  step_dir = pathlib.Path(source.path) / "checkpoints" / str(step)
  if not step_dir.is_dir():
    raise TeacherError(
      f"the teacher's checkpoint {step} that this run recorded ({path}) is gone from "
      f"{source.path}/checkpoints; set config.teacher.step to one it has to go on with another."
    )
  return dataclasses.replace(source, step=int(step))


def check_identity(workdir, now: dict, *, resumed: bool, write: bool = True) -> None:
  """Records the teacher's identity in workdir/teacher.json on a fresh run (where `write`:
  the primary process); on a resume, refuses a teacher whose fingerprint differs from the
  recorded one (`identity`)."""
  path = pathlib.Path(workdir) / RECORD
  if resumed and path.is_file():
    before = json.loads(path.read_text())
    if before.get("fingerprint") != now["fingerprint"]:
      raise TeacherError(
        f"the teacher changed under this run: {path} records {before.get('kind')} "
        f"{before.get('path')} (step {before.get('step')}) with fingerprint "
        f"{before.get('fingerprint')}, but config.teacher now gives {now['kind']} "
        f"{now['path']} (step {now['step']}) with {now['fingerprint']}. Resume with the "
        "recorded teacher, or start a new workdir."
      )
    return
  if write:
    path.write_text(json.dumps(now, indent=2))
