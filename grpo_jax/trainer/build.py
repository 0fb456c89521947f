"""The run's Setup, built from a config once, at the edge: `build` validates the
ConfigDict of `config.default_config()` and builds the typed pieces (the task and its
tokenizer, the model config, from config.hf_dir when set, the sampler, RL, mesh,
counterfactual, off-policy, episode and reward-source configs) before anything compiles.

    c = config.default_config()       # the schema (configs/*.py import only that)
    setup = build.build(c)            # validated dataclasses + the task and its tokenizer

Where each value is checked: its own range in its dataclass's `__post_init__`; values
that constrain each other (the rollout batch, the mini-batches, the micro-batches, the
planner's groups and the mesh's data-parallel size) in `_check_batch_shapes`, once; an
error names the key, its value and what is allowed (config_lib.ConfigError).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import jax

from grpo_jax import config, envs, schema, tasks
from grpo_jax.envs import base, episodes
from grpo_jax.infra import collapse, config_lib, registry, trackers
from grpo_jax.models import hf, model, sampling, shapes, sharding, teacher
from grpo_jax.rewards import reward_sources
from grpo_jax.rl import (
  advantages,
  alignment,
  counterfactuals,
  learner,
  offpolicy,
  spec,
)
from grpo_jax.trainer import memory


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from a config, once, at the edge (before anything compiles)."""

  loop: schema.LoopConfig
  task: Any
  tokenizer: Any
  model_cfg: model.ModelConfig
  sampler_cfg: sampling.SamplerConfig
  sampling_hyper: sampling.SamplingParams
  rl_cfg: spec.RLConfig
  mesh_cfg: sharding.MeshConfig
  diagnostics: schema.DiagnosticsConfig = schema.DiagnosticsConfig()
  spec: dict = dataclasses.field(default_factory=dict)  # The ConfigDict, as plain data.
  counterfactual: counterfactuals.CounterfactualConfig = counterfactuals.CounterfactualConfig()
  steps: alignment.StepSplitter = alignment.StepSplitter()  # The task's step splitter.
  offpolicy: offpolicy.OffPolicyConfig = offpolicy.OffPolicyConfig()
  episodes: episodes.EpisodeConfig | None = None  # config.env; None: single-turn sampling.
  collapse: collapse.CollapseConfig = collapse.CollapseConfig()
  tracking: trackers.TrackingConfig = trackers.TrackingConfig()  # config.logging.
  eval: schema.EvalConfig = schema.EvalConfig()  # config.eval (`grpo-jax eval`).
  rewards: tuple = ()  # config.rewards: reward_sources.SourceSpec per source; (): the verifier.
  teacher: teacher.TeacherConfig = teacher.TeacherConfig()  # config.teacher (distillation).
  # Its kind, architecture and tokenizer (`teacher.describe`); None without a teacher.
  teacher_source: teacher.Source | None = None

  @property
  def train_group(self) -> int:
    """Rows per group in the training batch: G samples + C counterfactuals."""
    return self.sampler_cfg.group_size + self.counterfactual.per_group

  @property
  def rollout_rows(self) -> int:
    """N = prompts_per_step × train_group rows per rollout batch (before the update)."""
    return self.loop.prompts_per_step * self.train_group

  @property
  def update_group(self) -> int:
    """Rows per group the update trains: counterfactuals that only inform φ
    (counterfactual.train False) leave the batch after prepare."""
    cf = self.counterfactual
    return self.sampler_cfg.group_size + (cf.per_group if cf.train else 0)

  @property
  def update_rows(self) -> int:
    return self.loop.prompts_per_step * self.update_group


def build(c, *, n_devices: int | None = None, teacher: bool = True) -> Setup:
  """Validates the ConfigDict and builds the typed pieces; errors name the bad key.
  `n_devices`: the device count the mesh is checked against (default: this job's).
  `teacher` False: config.teacher is recorded but neither read nor checked (Setup.
  teacher_source None: `grpo-jax eval` of a distilled run needs no teacher).

  Raises config_lib.ConfigError (a ValueError) for any bad value or missing file."""
  try:
    setup = _build(c, n_devices=n_devices, teacher=teacher)
    return dataclasses.replace(setup, episodes=_episode_config(setup))
  except config_lib.ConfigError:
    raise
  except OSError as e:  # A missing or unreadable file the config names.
    raise config_lib.ConfigError(str(e)) from e
  except ValueError as e:  # Our validators' messages; another library's is a bug to show.
    if not _raised_here(e):
      raise
    raise config_lib.ConfigError(str(e)) from e


def plan_setup(c, *, n_devices: int | None = None, model_source: str = "") -> Setup:
  """What the memory plan reads of a config (`grpo-jax plan`), built without the task's
  tokenizer or the checkpoint's weights. The model: `model_source` (`shapes.read`: a
  built-in shape, a config.json, a checkpoint directory or GGUF), else config.hf_dir's
  config.json alone; config.model sets its dtypes, scan_layers and remat. Without either
  (a model from config.model) this is `build`. The Setup has no task or tokenizer."""
  d = config_lib.to_dict(c)
  source = model_source or d.get("hf_dir", "")
  if not source:
    return build(c, n_devices=n_devices)
  d = config_lib.upgrade(d)  # Moved keys at their new place (`config_lib.MOVED_KEYS`).
  try:
    runtime = {k: d["model"][k] for k in config.HF_RUNTIME_KEYS if k in d["model"]}
    model_cfg = shapes.model_config(os.path.expanduser(source), **runtime)
  except hf.CheckpointError as e:
    hint = " Or plan from the shape alone: --model=<a config.json or a built-in shape>."
    raise config_lib.ConfigError(f"{e}{'' if model_source else hint}") from None
  try:
    loop = config_lib.from_dict(
      schema.LoopConfig, {k: v for k, v in d.items() if k not in config.SECTIONS}, where="config"
    )
    rl_cfg = _rl_config(d["rl"], model_cfg)
    sampler_cfg = _sampler_config(d, rl_cfg, eos_ids=(0,), pad_id=0)
    cf_d = d.get("counterfactual", {})
    cf = config_lib.from_dict(
      counterfactuals.CounterfactualConfig, cf_d, where="config.counterfactual"
    )
    mesh_cfg = sharding.MeshConfig.from_dict(d.get("mesh", {}))
    n_devices = n_devices or jax.device_count()
    group = sampler_cfg.group_size + (cf.per_group if cf.train else 0)
    data_parallel = mesh_cfg.batch_split(n_devices)
    _check_batch_shapes(loop, rl_cfg, group, data_parallel=data_parallel)
    _check_token_budget(loop, rl_cfg, sampler_cfg, group, data_parallel=data_parallel)
    _check_sequence_split(mesh_cfg, rl_cfg, sampler_cfg, n_devices=n_devices)
    teacher_cfg = config_lib.from_dict(
      teacher.TeacherConfig, d.get("teacher", {}), where="config.teacher"
    )
    source = teacher.describe(teacher_cfg) if teacher_cfg.enabled else None  # No tokenizer.
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e
  setup = Setup(
    loop=loop, task=None, tokenizer=None, model_cfg=model_cfg, sampler_cfg=sampler_cfg,
    sampling_hyper=sampling.sampling_params(**d["sampling"]), rl_cfg=rl_cfg,
    mesh_cfg=mesh_cfg, spec=d, counterfactual=cf, teacher=teacher_cfg, teacher_source=source,
  )  # fmt: skip
  try:
    setup = _resolve_old_logp(dataclasses.replace(setup, episodes=_episode_config(setup)))
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e
  return _resolve_remat(setup, n_devices=n_devices)


_PACKAGE = pathlib.Path(__file__).resolve().parent.parent  # grpo_jax/


def _raised_here(e: BaseException) -> bool:
  """Whether e was raised by grpo_jax's own code (its innermost frame is in the package)."""
  tb = e.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb is not None and _PACKAGE in pathlib.Path(tb.tb_frame.f_code.co_filename).parents


def _build(c, *, n_devices: int | None, teacher: bool = True) -> Setup:
  d = config_lib.upgrade(c)  # Moved keys at their new place (`config_lib.MOVED_KEYS`).
  loop = config_lib.from_dict(
    schema.LoopConfig, {k: v for k, v in d.items() if k not in config.SECTIONS}, where="config"
  )
  task, tok = task_and_tokenizer(d["task"], hf_dir=loop.hf_dir)
  _check_eval_size(loop, task)
  model_cfg = model_config_of(d["model"], tok, hf_dir=loop.hf_dir)
  _check_learning_rates(loop, model_cfg)
  rl_cfg = _rl_config(d["rl"], model_cfg)
  sampler_cfg = _sampler_config(d, rl_cfg, eos_ids=tok.eos_ids, pad_id=tok.pad_id)
  _check_rl_lengths(rl_cfg, sampler_cfg)
  mesh_cfg = sharding.MeshConfig.from_dict(d.get("mesh", {}))
  cf = config_lib.from_dict(
    counterfactuals.CounterfactualConfig, d.get("counterfactual", {}), where="config.counterfactual"
  )
  op, n_devices = _offpolicy_config(d, rl_cfg, cf, sampler_cfg, n_devices=n_devices)
  data_parallel = mesh_cfg.batch_split(n_devices)
  steps = _step_splitter(task, tok)
  counterfactuals.check_config(cf, rl_cfg, task, steps, diagnostics=d.get("diagnostics", {}))
  update_group = sampler_cfg.group_size + (cf.per_group if cf.train else 0)
  _check_batch_shapes(loop, rl_cfg, update_group, data_parallel=data_parallel)
  _check_token_budget(loop, rl_cfg, sampler_cfg, update_group, data_parallel=data_parallel)
  _check_sequence_split(mesh_cfg, rl_cfg, sampler_cfg, n_devices=n_devices)
  _check_group_estimator(rl_cfg, sampler_cfg.group_size)
  _check_prompt_lengths(task, tok, sampler_cfg, loop)
  _check_reward_budget(task, loop)
  _check_task_state(task, op, cf)
  _check_refill(loop, sampler_cfg)
  setup = Setup(
    loop=loop,
    task=task,
    tokenizer=tok,
    model_cfg=model_cfg,
    sampler_cfg=sampler_cfg,
    sampling_hyper=sampling.sampling_params(**d["sampling"]),
    rl_cfg=rl_cfg,
    mesh_cfg=mesh_cfg,
    diagnostics=schema.DiagnosticsConfig.from_dict(
      d.get("diagnostics", {}), prompts_per_step=loop.prompts_per_step, model_cfg=model_cfg
    ),
    spec=d,
    counterfactual=cf,
    steps=steps,
    offpolicy=op,
    collapse=config_lib.from_dict(
      collapse.CollapseConfig, d.get("collapse", {}), where="config.collapse"
    ),
    tracking=config_lib.from_dict(
      trackers.TrackingConfig, d.get("logging", {}), where="config.logging"
    ),
    eval=config_lib.from_dict(schema.EvalConfig, d.get("eval", {}), where="config.eval"),
    rewards=_reward_sources(d, rl_cfg, cf),
  )
  setup = dataclasses.replace(setup, **_teacher(d, rl_cfg, task, tok, read=teacher))
  return _resolve_remat(_resolve_old_logp(setup), n_devices=n_devices)


def _teacher(d: dict, rl_cfg: spec.RLConfig, task, tok, *, read: bool) -> dict:
  """Setup's teacher and teacher_source: config.teacher and its `teacher.Source`, checked
  (`_teacher_source`); without `read`, the config alone."""
  cfg = config_lib.from_dict(teacher.TeacherConfig, d.get("teacher", {}), where="config.teacher")
  source = _teacher_source(cfg, rl_cfg, task, tok) if read else None
  return {"teacher": cfg, "teacher_source": source}


def _teacher_source(cfg: teacher.TeacherConfig, rl_cfg: spec.RLConfig, task, tok):
  """config.teacher's `teacher.Source`, checked: a teacher exactly when the estimator reads
  one (`advantages.Traits.needs_teacher`), and one that shares the task's tokenizer."""
  needs = advantages.REGISTRY.traits(rl_cfg.advantage).needs_teacher
  if needs and not cfg.enabled:
    raise ValueError(
      f"rl.advantage={rl_cfg.advantage!r} reads a teacher's log-probs: set config.teacher.path "
      "to a grpo_jax workdir, a Hugging Face directory or a GGUF file."
    )
  base = dict(rl_cfg.advantage_options).get("base", "none")
  if needs and base == "none" and rl_cfg.kl_in == "reward" and rl_cfg.kl_coef > 0:
    raise ValueError(
      f"rl.advantage={rl_cfg.advantage!r} with base 'none' reads no reward, so rl.kl_in="
      "'reward' would drop the KL term: use rl.kl_in='loss', or a base estimator."
    )
  if not cfg.enabled:
    return None
  if not needs:
    readers = [
      n for n in advantages.REGISTRY.names() if advantages.REGISTRY.traits(n).needs_teacher
    ]
    raise ValueError(
      f"config.teacher.path={cfg.path!r} is set, but rl.advantage={rl_cfg.advantage!r} reads no "
      f"teacher: use an estimator that does ({', '.join(readers)}), or leave the path empty."
    )
  source = teacher.describe(cfg, task_and_tokenizer=task_and_tokenizer)
  teacher.check_tokenizer(source, tok, task.example("train", 0, seed=0).prompt)
  return teacher.limited(source, tok.vocab_size)


def _reward_sources(d: dict, rl_cfg: spec.RLConfig, cf) -> tuple:
  """config.rewards as specs, refused where the run needs the verifier's own outcome:
  episodes score themselves, counterfactuals branch on correct vs failed rows, and an
  estimator that reads the outcome (`advantages.Traits.reads_outcome`) splits by it."""
  specs = reward_sources.specs_from_dict(d.get("rewards", {}))
  if not specs:
    return specs
  reward_sources.check_format_weight(specs, rl_cfg.format_weight)
  clash = [
    why
    for why, on in (
      ("config.env: an episode's environment scores it", bool(d.get("env", {}).get("name"))),
      ("config.counterfactual: it branches on correct vs failed rows", cf.enabled),
      (
        f"rl.advantage={rl_cfg.advantage!r}: it splits rows by the verifier's outcome",
        advantages.REGISTRY.traits(rl_cfg.advantage).reads_outcome,
      ),
    )
    if on
  ]
  if clash:
    raise ValueError(
      f"config.rewards (a weighted sum of named scores, no verifier outcome) cannot be used "
      f"with {'; '.join(clash)}. Drop config.rewards or that setting."
    )
  return specs


def _rl_config(rl: dict, model_cfg: model.ModelConfig) -> spec.RLConfig:
  """config.rl as RLConfig, checked against the model: a load-balancing loss and routing
  replay need routers (refused on a dense model)."""
  rl_cfg = spec.RLConfig.from_dict(_with_mask_vocab(rl, model_cfg), where="config.rl")
  for name, value, off in (
    ("moe_balance_coef", rl_cfg.moe_balance_coef, 0),
    ("routing_replay", rl_cfg.routing_replay, False),
  ):
    if value != off and not model_cfg.n_experts:
      raise ValueError(
        f"config.rl.{name}={value} needs a mixture-of-experts model (config.model."
        f"n_experts > 0); this model is dense. Set it to {off}."
      )
  return rl_cfg


def _sampler_config(d: dict, rl_cfg: spec.RLConfig, *, eos_ids, pad_id) -> sampling.SamplerConfig:
  """config.sampler as SamplerConfig (the ids from the tokenizer), recording routes with
  rl.routing_replay: only the static sampler records them, so the samplers that decode
  otherwise (the refill sampler, episodes, partial rollouts, counterfactual rows) are
  refused with it."""
  cfg = config_lib.from_dict(
    sampling.SamplerConfig,
    {**d["sampler"], "eos_ids": eos_ids, "pad_id": pad_id, "record_routes": rl_cfg.routing_replay},
    where="config.sampler",
  )
  clash = _static_sampler_replaced(d, cfg)
  if rl_cfg.routing_replay and clash:
    raise ValueError(
      "config.rl.routing_replay=True records routes in the static sampler, which these "
      f"settings replace: {'; '.join(clash)}. Turn them off, or routing_replay off."
    )
  return cfg


def _static_sampler_replaced(d: dict, cfg: sampling.SamplerConfig) -> list[str]:
  """The settings under which other samplers decode training rows in place of the static
  one (the refill sampler, episodes, partial rollouts, counterfactual rows); every one of
  them pages its cache with sampler.kv_layout='paged'."""
  op, cf = d.get("offpolicy", {}), d.get("counterfactual", {})
  return [
    why
    for why, on in (
      (f"config.sampler.refill_slots={cfg.refill_slots} (0: off)", cfg.refill_slots > 0),
      ("config.env (episodes)", bool(d.get("env", {}).get("name"))),
      (
        f"config.offpolicy.partial={op.get('partial')!r} (off: 'off')",
        op.get("enabled") and op.get("partial", "off") != "off",
      ),
      ("config.counterfactual.train=True", bool(cf.get("train"))),
    )
    if on
  ]


def _check_rl_lengths(rl_cfg: spec.RLConfig, sampler_cfg: sampling.SamplerConfig) -> None:
  """Settings that do nothing, or the opposite, at this run's lengths: DAPO's overlong
  buffer past max_new_tokens (every row penalised), and dynamic sampling that may never
  sample again (max_gen_batches 1: zero-variance groups are only masked)."""
  T = sampler_cfg.max_new_tokens
  if rl_cfg.overlong_buffer >= T and rl_cfg.overlong_factor > 0:
    raise ValueError(
      f"config.rl.overlong_buffer={rl_cfg.overlong_buffer} is not below "
      f"config.sampler.max_new_tokens={T}: the overlong penalty would start before the first "
      f"token and penalise every row. Use a buffer below {T} (DAPO: 4096 of 20480, a fifth), "
      "or rl.overlong_factor=0 (off)."
    )
  if rl_cfg.dynamic_sampling and rl_cfg.max_gen_batches < 2:
    raise ValueError(
      "config.rl.dynamic_sampling=True with config.rl.max_gen_batches=1 never samples a second "
      "batch: groups whose rewards are all equal are only masked out of the update. Set "
      "rl.max_gen_batches to the batches it may sample (DAPO: 10), or use "
      "--config.rl.preset=dapo."
    )


def _check_learning_rates(loop: schema.LoopConfig, model_cfg: model.ModelConfig) -> None:
  """A learning rate that overflows in the parameter dtype (inf once cast) turns every
  update into inf: refused here, not found after a run of skipped steps."""
  dtype = jax.numpy.dtype(model_cfg.param_dtype)
  largest = float(jax.numpy.finfo(dtype).max)
  for name in ("learning_rate", "warmstart_lr"):
    lr = getattr(loop, name)
    if lr > largest:
      raise ValueError(
        f"config.{name}={lr:g} overflows in the parameter dtype {dtype} (largest finite "
        f"value {largest:.4g}); use a value below that (typical learning rates are 1e-6 to "
        "1e-2)."
      )


def _episode_config(setup: Setup) -> episodes.EpisodeConfig | None:
  """config.env (from setup.spec), or None when its name is "" (single-turn sampling). The
  environment must be registered, build with its kwargs, and end turns with one-token
  texts, and pass its own check (a server's: `Environment.check`; these need the
  tokenizer: not checked for a Setup without one, `plan_setup`). Episodes run their own turn
  loop, so features that sample rows another way are refused (refill: on pages only)."""
  env_d, tok = setup.spec.get("env", {}), setup.tokenizer
  if not env_d.get("name"):
    return None
  conflicts = {
    "config.counterfactual (per_group > 0)": setup.counterfactual.enabled,
    "config.sampler.refill_slots > 0 with config.sampler.kv_layout='dense' (refill needs "
    "'paged')": setup.sampler_cfg.refill_slots > 0 and setup.sampler_cfg.kv_layout == "dense",
    "config.env.overlap_steps > 0 and config.sampler.refill_slots=0 (overlapping needs "
    "slots)": env_d.get("overlap_steps", 0) > 0 and not setup.sampler_cfg.refill_slots,
    # The pipeline plays whole episodes under one params version (`pipeline.Source._play`).
    f"config.offpolicy.partial={setup.offpolicy.partial!r} (episodes are played whole: "
    "'off')": setup.offpolicy.enabled and setup.offpolicy.partial != "off",
    "config.offpolicy.placement='split' (the episode runners sample on the trainer's "
    "devices: 'shared')": setup.offpolicy.enabled and setup.offpolicy.placement == "split",
    "config.diagnostics.value": setup.diagnostics.value,
  }
  cfg = config_lib.from_dict(episodes.EpisodeConfig, env_d, where="config.env")
  try:
    env_cls = envs.get(cfg.name)
  except ValueError as e:
    raise ValueError(f"config.env.name: {e}") from None
  env_cls.check_task(setup.task)  # An environment that cannot play the task's examples.
  if tok is not None:
    try:
      env = env_cls(tokenizer=tok, **cfg.kwargs)
    except (TypeError, ValueError) as e:
      raise ValueError(f"config.env.kwargs for environment {cfg.name!r}: {e}") from None
    base.stop_ids(env_cls, tok, cfg.kwargs)
    env.check()  # A server that does not answer: one line, before anything compiles.
  for what, on in conflicts.items():
    if on:
      raise ValueError(
        f"config.env.name={cfg.name!r} (multi-turn episodes) does not combine with {what}; "
        "switch one off."
      )
  return cfg


def _offpolicy_config(d: dict, rl_cfg, cf, sampler_cfg, *, n_devices: int | None):
  """(config.offpolicy, checked against the rest: `offpolicy.check`; the trainer's device
  count: all of them, or with placement "split" those the sampler leaves)."""
  op = config_lib.from_dict(
    offpolicy.OffPolicyConfig, d.get("offpolicy", {}), where="config.offpolicy"
  )
  n_devices = n_devices or jax.device_count()
  offpolicy.check(
    op,
    rl_cfg=rl_cfg,
    counterfactual_enabled=cf.enabled,
    refill_slots=sampler_cfg.refill_slots,
    n_devices=n_devices,
    process_count=jax.process_count(),
  )
  if op.enabled and op.placement == "split":
    n_devices -= op.sampler_devices
  return op, n_devices


def _resolve_old_logp(setup: Setup) -> Setup:
  """rl.old_logp_from resolved (`spec.RLConfig.resolved_old_logp`), with the blockers only
  the whole config shows: counterfactual rows, whose importance weights read π_old, and
  adapter dropout, which makes the update's forward another policy than π_old."""
  extra = [
    what
    for what, on in (
      ("counterfactual rows (their importance weights read π_old)", setup.counterfactual.per_group),
      ("adapter dropout (model.lora.dropout > 0)", setup.model_cfg.lora.dropout > 0),
    )
    if on
  ]
  return dataclasses.replace(setup, rl_cfg=setup.rl_cfg.resolved_old_logp(extra_blockers=extra))


def _resolve_remat(setup: Setup, *, n_devices: int) -> Setup:
  """model.remat = "auto": the fastest of `memory.AUTO_CANDIDATES` (no remat; full remat
  over scanned layers; that with rl.logit_chunk = 256) whose memory plan
  (`memory.plan_for`) fits the device (memory_limit_gib, else the device's own limit; no
  limit known: no remat)."""
  if setup.model_cfg.remat != "auto":
    return setup

  def with_(m, r):
    return dataclasses.replace(setup, model_cfg=m, rl_cfg=r)

  m, r = memory.resolve_auto(
    setup.model_cfg,
    setup.rl_cfg,
    limit=memory.limit_bytes(setup.loop.memory_limit_gib),
    plan_fn=lambda m, r: memory.plan_for(with_(m, r), n_devices=n_devices),
  )
  return with_(m, r)


def _step_splitter(task, tok) -> alignment.StepSplitter:
  """The task's step splitter in token ids: its step-ending texts (`Task.step_end_text`)
  that are one token, and the tokens of its step-start text (`Task.step_start_text`)."""
  ends = [tok.encode(t, add_bos=False) for t in getattr(task, "step_end_text", ("\n",))]
  start = getattr(task, "step_start_text", "")
  return alignment.StepSplitter(
    end_ids=tuple(sorted({i[0] for i in ends if len(i) == 1})),
    start_pattern=tuple(tok.encode(start, add_bos=False)) if start else (),
  )


def task_and_tokenizer(d: dict, *, hf_dir: str):
  """The task and its tokenizer; a task that reads a HF tokenizer takes hf_dir's. With
  hf_dir, a task whose tokenizer is not hf_dir's (`check_model_tokenizer`) is refused."""
  kwargs = dict(d.get("kwargs", {}))
  if hf_dir and getattr(tasks.task_class(d["name"]), "uses_hf_tokenizer", False):
    kwargs.setdefault("tokenizer_dir", hf_dir)
  task = tasks.get(d["name"], **kwargs)
  tok = task.tokenizer()
  if hf_dir and kwargs.get("tokenizer_dir") != hf_dir:
    check_model_tokenizer(task, tok, hf_dir=hf_dir)
  return task, tok


def _check_eval_size(loop: schema.LoopConfig, task) -> None:
  """A task with a finite test split (`test_size`: a JSONL file's) holds eval_size problems:
  an evaluation past them would score some twice and count them as more problems."""
  limit = getattr(task, "test_size", None)
  if limit is not None and loop.eval_size > limit:
    raise ValueError(
      f"config.eval_size={loop.eval_size} exceeds the {limit} test problems of task "
      f"{task.name!r}: an evaluation would score some of them twice. Use eval_size <= "
      f"{limit}, or give the task more test problems."
    )


def check_model_tokenizer(task, tok, *, hf_dir: str) -> None:
  """Refuses a task tokenizer that is not the pretrained model's: the model would read ids
  that mean other text (a character tokenizer's 58 ids on SmolLM2 trains, and learns
  nothing, without a word). The same tokenizer: the same vocabulary size and the same ids
  for the task's first training prompt."""
  from grpo_jax.models import hf_tokenizer  # noqa: PLC0415 -- only with a checkpoint.

  model_tok = hf_tokenizer.load(hf_dir)
  prompt = task.example("train", 0, seed=0).prompt
  if tok.vocab_size == model_tok.vocab_size and tok.encode(prompt) == model_tok.encode(prompt):
    return
  raise ValueError(
    f"task {task.name!r} encodes text with its own tokenizer ({type(tok).__name__}, "
    f"{tok.vocab_size:,} ids), not config.hf_dir's ({hf.config_where(hf_dir)}: "
    f"{model_tok.vocab_size:,} ids): the model would read ids that mean other text. Give the "
    "task the model's tokenizer: set `uses_hf_tokenizer = True` on its class and take a "
    "`tokenizer_dir` argument (the trainer passes config.hf_dir; tasks/word_problems.py does "
    "this); a task that already takes one reads hf_dir's when config.task.kwargs leaves "
    "tokenizer_dir unset."
  )


def model_config_of(model_d: dict, tok, *, hf_dir: str) -> model.ModelConfig:
  """config.model as a ModelConfig: its own keys (vocab_size 0: the tokenizer's), or
  hf_dir's architecture with config.model's runtime keys."""
  if hf_dir:
    cfg = _hf_model_config(hf_dir, model_d, tok)
  else:
    vocab = model_d.get("vocab_size", 0) or tok.vocab_size
    if vocab < tok.vocab_size:
      raise ValueError(
        f"config.model.vocab_size={vocab} is smaller than the tokenizer's {tok.vocab_size}; "
        "use 0 (the tokenizer's) or a larger size (e.g. a pretrained model's padded vocab)."
      )
    cfg = model.ModelConfig.from_dict({**model_d, "vocab_size": vocab})
  if cfg.lora.enabled and cfg.lora.warm_start == "auto":  # A random init: the warm start
    # pretrains its base. Without adapters nothing reads it (the config stays as given).
    lora = dataclasses.replace(cfg.lora, warm_start="adapters" if hf_dir else "base")
    cfg = dataclasses.replace(cfg, lora=lora)
  return cfg


def _hf_model_config(hf_dir: str, model_d: dict, tok) -> model.ModelConfig:
  """The checkpoint's architecture with config.model's runtime keys. An architecture key
  of config.model that differs from both its default and the checkpoint is an error
  (it would be silently ignored otherwise). A vocabulary padded past the tokenizer's
  size gets `vocab_limit` = the tokenizer's size."""
  where = hf.config_where(hf_dir)
  ckpt = hf.model_config(hf.read_config(hf_dir), where=where)
  default = config_lib.to_dict(config.default_config().model)
  for key, value in model_d.items():
    if key in config.HF_RUNTIME_KEYS or value == default.get(key) or value == getattr(ckpt, key):
      continue
    raise ValueError(
      f"config.model.{key}={value!r} conflicts with {where} "
      f"({getattr(ckpt, key)!r}): with config.hf_dir the architecture comes from the "
      f"checkpoint; config.model sets only {list(config.HF_RUNTIME_KEYS)}."
    )
  if tok.vocab_size > ckpt.vocab_size:
    raise ValueError(
      f"The tokenizer has {tok.vocab_size} tokens but {where} has vocab_size "
      f"{ckpt.vocab_size}: they do not belong together."
    )
  runtime = {k: model_d[k] for k in config.HF_RUNTIME_KEYS if k in model_d}
  limit = tok.vocab_size if tok.vocab_size < ckpt.vocab_size else 0
  return dataclasses.replace(ckpt, vocab_limit=limit, **runtime)


def _with_mask_vocab(rl_d: dict, model_cfg) -> dict:
  """rl_d with negative_token_filter's vocab_size set to the model's when a criterion that
  looks up ids ("shared", "batch_shared") needs it and the config left it 0."""
  options = dict(rl_d.get("mask_options", {}).get("negative_token_filter", {}))
  needs = {"shared", "batch_shared"} & set(options.get("criteria", ()))
  if not needs or options.get("vocab_size", 0):
    return rl_d
  options["vocab_size"] = model_cfg.vocab_size
  mask_options = {**rl_d["mask_options"], "negative_token_filter": options}
  return {**rl_d, "mask_options": mask_options}


def _check_batch_shapes(
  loop: schema.LoopConfig, rl_cfg: spec.RLConfig, group_size: int, *, data_parallel
):
  """The rollout batch N = prompts_per_step × group_size splits into rl.num_minibatches
  mini-batches of b rows, each into rl.micro_batches micro-batches of b / micro_batches
  rows; every one of them is split over the data × fsdp × expert devices, and the planner
  must be able to honour its guarantee (e.g. whole groups per mini-batch) at this shape."""
  n = loop.prompts_per_step * group_size
  M, K = rl_cfg.num_minibatches, rl_cfg.micro_batches
  if n % M:
    raise ValueError(
      f"config.rl.num_minibatches={M} does not divide the rollout batch of {n} rows "
      f"(prompts_per_step {loop.prompts_per_step} × group_size {group_size})."
    )
  if (n // M) % K:
    raise ValueError(
      f"config.rl.micro_batches={K} does not divide the mini-batch of {n // M} rows "
      f"(rollout batch {n} / num_minibatches {M})."
    )
  rows = {
    "the rollout batch (prompts_per_step × group_size)": n,
    "a mini-batch (rollout batch / rl.num_minibatches)": n // M,
    "a micro-batch (mini-batch / rl.micro_batches)": n // M // K,
  }
  L = rl_cfg.logprob_batches
  if n % L:
    raise ValueError(
      f"config.rl.logprob_batches={L} does not divide the rollout batch of {n} rows "
      f"(prompts_per_step {loop.prompts_per_step} × group_size {group_size})."
    )
  rows["a log-prob slice (rollout batch / rl.logprob_batches)"] = n // L
  for what, r in rows.items():
    if r % data_parallel:
      raise ValueError(
        f"config.mesh: {what} has {r} rows, not divisible by the data-parallel size "
        f"data × fsdp × expert = {data_parallel}. Change prompts_per_step, group_size, "
        "rl.num_minibatches, rl.micro_batches or rl.logprob_batches, or the mesh (e.g. put "
        "devices on `tensor`)."
      )
  try:
    learner.make_plan_fn(rl_cfg, batch_size=n, group_size=group_size)
  except ValueError as e:
    raise ValueError(f"config.rl.planner={rl_cfg.planner!r}: {e}") from None


def _check_sequence_split(mesh_cfg, rl_cfg, sampler_cfg, *, n_devices: int) -> None:
  """Context parallelism (mesh.sequence = c > 1) splits each row's S = prompt bucket + T
  tokens over c devices (`layers.length_shards`), so c must divide every S the update
  and the log-prob forwards see: each prompt bucket with max_new_tokens and with each
  length bucket's T (`learner.length_buckets`)."""
  c = mesh_cfg.sizes(n_devices)["sequence"]
  if c == 1:
    return
  T = sampler_cfg.max_new_tokens
  lengths = sorted(
    {p + t for p in sampler_cfg.prompt_buckets for t in (T, *learner.length_buckets(rl_cfg, T))}
  )
  bad = [S for S in lengths if S % c]
  if bad:
    raise ValueError(
      f"config.mesh.sequence={c} splits each row's tokens over {c} devices, but rows of "
      f"{bad} tokens (prompt buckets {list(sampler_cfg.prompt_buckets)} + completion "
      f"lengths {sorted({T, *learner.length_buckets(rl_cfg, T)})}) do not divide by {c}. "
      f"Use prompt buckets, sampler.max_new_tokens and rl.length_buckets whose sums are "
      f"multiples of {c}, or mesh.sequence=1."
    )


def _check_token_budget(
  loop: schema.LoopConfig,
  rl_cfg: spec.RLConfig,
  sampler_cfg: sampling.SamplerConfig,
  group_size: int,
  *,
  data_parallel: int,
) -> None:
  """Token-budget micro-batches (rl.micro_batch_tokens) must hold a full-length row (the
  longest prompt bucket plus max_new_tokens) on every data-parallel device."""
  if rl_cfg.micro_batch_tokens:
    learner.token_budget_rows(
      rl_cfg,
      P=max(sampler_cfg.prompt_buckets),
      T=sampler_cfg.max_new_tokens,
      N=loop.prompts_per_step * group_size // rl_cfg.num_minibatches,
      row_multiple=data_parallel,
    )


def _check_refill(loop: schema.LoopConfig, sampler_cfg: sampling.SamplerConfig) -> None:
  rows = loop.prompts_per_step * sampler_cfg.group_size
  if sampler_cfg.refill_slots > rows:
    raise ValueError(
      f"config.sampler.refill_slots={sampler_cfg.refill_slots} exceeds the rows it decodes "
      f"(prompts_per_step × group_size = {rows}); use at most {rows}, or 0 (off)."
    )


def _check_task_state(task, op, cf) -> None:
  """A task whose problem stream moves with the run (a curriculum: `Task.state`) needs every
  prompt drawn after the batch before it is scored (the off-policy pipeline draws ahead),
  and the rows it reads sampled by the policy (not counterfactual ones)."""
  if task.state() and op.enabled:
    raise ValueError(
      f"task {task.name!r} has a curriculum (its level moves with each batch's pass rate), "
      "and config.offpolicy draws prompts before the batches before them are scored: switch "
      "one off."
    )
  if task.state() and cf.enabled:
    raise ValueError(
      f"task {task.name!r} has a curriculum (its level moves with each batch's solve rate), "
      "and config.counterfactual adds rows the policy did not sample, which would move it: "
      "switch one off."
    )


def _check_reward_budget(task, loop: schema.LoopConfig) -> None:
  """A reward call that ends within its task's budget must not be killed by the pool's
  timeout first: a slow answer would turn from a judged zero into an unscorable row that
  `rl.unscorable` may drop (an opt-out of the zero)."""
  budget = task.reward_budget_s
  if loop.reward_workers and budget is not None and loop.reward_timeout_s <= budget:
    raise ValueError(
      f"config.reward_timeout_s={loop.reward_timeout_s:g} must exceed the task's reward "
      f"budget ({budget:g} s: its sandbox's timeout_s plus the interpreter's start), so a "
      f"slow answer is judged (a timeout is a zero) rather than killed by the pool; raise "
      f"reward_timeout_s above {budget:g} or lower the task's timeout_s."
    )


def _check_group_estimator(rl_cfg: spec.RLConfig, group_size: int) -> None:
  """With one rollout per prompt a group-relative estimator's baseline is the row itself:
  every advantage is 0 and nothing is trained."""
  options = config_lib.to_dict(rl_cfg.advantage_options)
  if group_size == 1 and not advantages.works_without_groups(rl_cfg.advantage, options):
    raise ValueError(
      f"config.rl.advantage={rl_cfg.advantage!r} with config.sampler.group_size=1: a group of "
      "one is its own baseline, so every advantage is 0 and nothing trains. At group_size 1 "
      f"use one of {', '.join(advantages.batch_level_names())}, or raise group_size."
    )


def _check_prompt_lengths(task, tok, cfg: sampling.SamplerConfig, loop: schema.LoopConfig) -> None:
  """The first training batch and the held-out set fit max_prompt_len and the largest
  prompt bucket, so a too-long prompt fails here, not after compiling and warm-starting;
  with a curriculum, the first batch at its top level too (`Task.hardest`). (Later
  training prompts are checked when drawn.)"""
  limit = min(cfg.max_prompt_len, max(cfg.prompt_buckets))
  if cfg.truncate_prompts == "left" and max(cfg.prompt_buckets) >= cfg.max_prompt_len:
    return
  hardest = task.hardest()  # A curriculum's top level: its prompts must fit as well.
  checks = [(task, "train", loop.prompts_per_step), (task, "test", loop.eval_size)]
  for source, split, n in [*checks, *([(hardest, "train", loop.prompts_per_step)] * bool(hardest))]:
    for i in range(n):
      length = len(tok.encode(source.example(split, i, seed=loop.seed).prompt, add_bos=True))
      if length > limit:
        where = f" at the curriculum's top level {hardest.level}" if source is hardest else ""
        raise ValueError(
          f"The {split} prompt {i}{where} has {length} tokens, more than config.sampler."
          f"max_prompt_len={cfg.max_prompt_len} / the largest of config.sampler.prompt_buckets="
          f"{tuple(cfg.prompt_buckets)} allow ({limit}). Raise both, or set "
          "config.sampler.truncate_prompts='left' to keep each prompt's last tokens."
        )


def as_dict(setup: Setup) -> dict:
  """The validated config as plain data (written to workdir/config.json), with
  "variants_from" where variants were registered outside the package (their modules and
  files, `registry.outside_variants`): a command that rebuilds the run imports them."""
  d = {
    "loop": dataclasses.asdict(setup.loop),
    "task": {"class": type(setup.task).__name__, **setup.spec.get("task", {})},
    "model": dataclasses.asdict(setup.model_cfg),
    "sampler": dataclasses.asdict(setup.sampler_cfg),
    "sampling": setup.spec.get("sampling", {}),
    "rl": dataclasses.asdict(setup.rl_cfg),
    "mesh": {**dataclasses.asdict(setup.mesh_cfg), "rules": dict(setup.mesh_cfg.rules)},
    "diagnostics": dataclasses.asdict(setup.diagnostics),
    "counterfactual": dataclasses.asdict(setup.counterfactual),
    "offpolicy": dataclasses.asdict(setup.offpolicy),
    "env": dataclasses.asdict(setup.episodes) if setup.episodes else {"name": ""},
    "collapse": dataclasses.asdict(setup.collapse),
    "logging": dataclasses.asdict(setup.tracking),
    "eval": dataclasses.asdict(setup.eval),
    "rewards": setup.spec.get("rewards", {}),
    **({"teacher": dataclasses.asdict(setup.teacher)} if setup.teacher.enabled else {}),
  }
  outside = registry.outside_variants(used=_strings(d))  # The ones this config picks.
  return {"variants_from": outside, **d} if outside else d


def _strings(tree) -> set[str]:
  """Every string value in a nested dict/list/tuple (the names a config picks variants by)."""
  if isinstance(tree, str):
    return {tree}
  if isinstance(tree, dict):
    return set().union(*map(_strings, tree.values()), set())
  if isinstance(tree, list | tuple):
    return set().union(*map(_strings, tree), set())
  return set()
