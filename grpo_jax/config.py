"""The run's config: one schema, every key with its default, validated once at the edge.

    c = config.default_config()        # configs/*.py start here (no I/O, no trainer import)
    c.rl.advantage = "rloo"             # any key; the locked ConfigDict refuses a misspelt one
    setup = config.build(c)             # validated dataclasses + the task and its tokenizer

Sections of the ConfigDict and the dataclass each becomes:

  top level    LoopConfig            loop sizes, optimizer, evaluation, checkpoints, I/O
  task         tasks.get(name, **kwargs)
  model        model.ModelConfig     (vocab_size 0: the tokenizer's; or from config.hf_dir)
  sampler      sampling.SamplerConfig (eos_ids / pad_id come from the tokenizer)
  sampling     sampling.SamplingParams (arrays: temperature, top_k, top_p, greedy)
  rl           rl.RLConfig           the algorithm, by registry names
  mesh         sharding.MeshConfig   (data, fsdp, tensor) sizes and the logical->mesh rules
  diagnostics  DiagnosticsConfig     token-credit diagnostics (every = 0: off)
  counterfactual counterfactuals.CounterfactualConfig  IBPO's counterfactual rows (per_group
               = 0: off); prepare's groups are then G + C rows (Setup.train_group), the
               update's G + C with counterfactual.train, else G (Setup.update_group)
  offpolicy    offpolicy.OffPolicyConfig  the rollout pipeline: staleness, partial
               rollouts, sampler placement (enabled = False: the synchronous loop)
  env          episodes.EpisodeConfig  multi-turn episodes with an environment (`envs`;
               name "": off, single-turn sampling); Setup.episodes, None when off
  collapse     collapse.CollapseConfig  the guard that stops (or warns) a run whose
               policy visibly collapsed (action "off": no guard)

Where each value is checked: its own range (>= 1, finite, a registered name) in its
dataclass's `__post_init__`; values that constrain each other (the rollout batch, the
mini-batches, the micro-batches, the planner's groups and the mesh's data-parallel size)
in `_check_batch_shapes`, once. Both run in `build`, before anything compiles; an error
names the key, its value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
from typing import Any

import jax
import ml_collections

from grpo_jax import (
  advantages,
  aggregation,
  alignment,
  collapse,
  config_lib,
  counterfactuals,
  envs,
  episodes,
  hf,
  memory,
  model,
  offpolicy,
  presets,
  reward_model,
  reward_sources,
  rl,
  sampling,
  shapes,
  sharding,
  tasks,
  trackers,
)
from grpo_jax.diagnostics import grads

SECTIONS = (
  "task",
  "model",
  "sampler",
  "sampling",
  "rl",
  "mesh",
  "diagnostics",
  "counterfactual",
  "offpolicy",
  "env",
  "collapse",
  "logging",
  "eval",
  "rewards",
  "reward_model",
)
# What config.model may set when the architecture comes from a HF checkpoint.
HF_RUNTIME_KEYS = ("param_dtype", "dtype", "scan_layers", "remat", "lora")


def _check_fields(obj, where: str, *, at_least: dict[str, float], above: dict[str, float] = ()):
  """Every numeric field is finite; `at_least` fields >= their bound, `above` fields > it."""
  for f in dataclasses.fields(obj):
    v = getattr(obj, f.name)
    if isinstance(v, float) and not math.isfinite(v):
      raise ValueError(f"{where}.{f.name}={v}: must be a finite number.")
  for name, low in at_least.items():
    if getattr(obj, name) < low:
      raise ValueError(f"{where}.{name} must be >= {low:g}, got {getattr(obj, name)}.")
  for name, low in dict(above).items():
    if not getattr(obj, name) > low:
      raise ValueError(f"{where}.{name} must be > {low:g}, got {getattr(obj, name)}.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopConfig:
  """Loop sizes, the optimizer, evaluation, checkpoints and output (the top-level keys)."""

  seed: int = 0
  prompts_per_step: int = 16
  iterations: int = 50
  learning_rate: float = 1e-3
  warmup_steps: int = 0
  weight_decay: float = 0.0
  grad_clip: float = 1.0
  warmstart_steps: int = 0
  warmstart_batch: int = 64
  warmstart_lr: float = 3e-3
  eval_every: int = 10
  eval_size: int = 128
  eval_samples: int = 0  # k samples per held-out problem for pass@k / mean@k (0: off).
  checkpoint_every: int = 50  # Iterations between checkpoints (also: end, SIGTERM).
  keep_checkpoints: int = 3  # The latest N are kept, plus the best by eval accuracy.
  max_nonfinite_steps: int = 5  # Consecutive skipped (non-finite) steps before stopping.
  reward_workers: int = 2  # Reward processes; 0 scores inline (no timeout).
  reward_timeout_s: float = 10.0  # Per call; a timeout scores 0 and counts as an error.
  # A batch whose share of failed rewards (raised, timed out, non-finite) exceeds this
  # stops the run (`rewards.RewardFailure`); below it, failed rows follow rl.unscorable.
  max_unscorable_frac: float = 0.9
  peak_flops: float = 0.0  # Device peak FLOP/s for MFU; 0 measures a float32 matmul.
  # Per-device memory the plan must fit (`memory`), GiB; 0: the device's own limit where
  # jax reports one (GPU, TPU), no check where it does not (CPU).
  memory_limit_gib: float = 0.0
  # A Hugging Face checkpoint directory (config.json + safetensors), a GGUF file or
  # "pkg:<package>" (the GGUF a Python package ships: `gguf_import`): the policy's
  # architecture and initial weights come from it (`hf`); config.model then sets only
  # param_dtype, dtype, scan_layers and remat. "": random init from config.model.
  hf_dir: str = ""
  # Write the final policy as a Hugging Face checkpoint to workdir/hf (for transformers
  # or vLLM evaluation), with hf_dir's tokenizer files.
  export_hf: bool = False
  progress: bool = True  # Progress bar (tqdm) on a terminal.
  # Event files under workdir/tb; False drops "tensorboard" from config.logging.trackers.
  tensorboard: bool = True
  # Resuming under a config that differs from the workdir's config.json: "warn" logs the
  # differences; "refuse" stops (changes to the run's extent or logging are allowed).
  on_config_change: str = "warn"

  def __post_init__(self):
    object.__setattr__(self, "hf_dir", os.path.expanduser(self.hf_dir))
    positive = (
      "prompts_per_step",
      "iterations",
      "eval_every",
      "eval_size",
      "warmstart_batch",
      "checkpoint_every",
      "keep_checkpoints",
      "max_nonfinite_steps",
    )
    non_negative = (
      "warmup_steps",
      "weight_decay",
      "grad_clip",
      "warmstart_steps",
      "eval_samples",
      "reward_workers",
      "peak_flops",
      "memory_limit_gib",
    )
    _check_fields(
      self,
      "config",
      at_least={**dict.fromkeys(positive, 1), **dict.fromkeys(non_negative, 0)},
      above=dict.fromkeys(("learning_rate", "warmstart_lr", "reward_timeout_s"), 0),
    )
    if self.on_config_change not in ("warn", "refuse"):
      raise ValueError(
        f"config.on_config_change={self.on_config_change!r}; allowed: 'warn', 'refuse'."
      )
    if not 0 < self.max_unscorable_frac <= 1:
      raise ValueError(
        f"config.max_unscorable_frac={self.max_unscorable_frac}: must be in (0, 1] (1: never stop)."
      )


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
  """config.eval: what `grpo-jax eval` scores (`grpo_jax.evaluate`)."""

  # Benchmark names, comma-separated: a task of grpo_jax.tasks (the config's own with its
  # kwargs, others with their defaults), or "jsonl:PATH[:VERIFIER]" ({"prompt", "answer"}
  # per line; VERIFIER "exact" (default) or "math"). "": the config's own task.
  benchmarks: str = ""
  k: int = 8  # Samples per problem for avg@k, pass@k, maj@k (0: greedy only).
  size: int = 0  # Problems per benchmark (the first of its test split); 0: config.eval_size.
  step: int = -1  # The workdir checkpoint to score; -1: the newest.
  out: str = ""  # Where the report goes; "": workdir/eval/step_<step>.

  def __post_init__(self):
    _check_fields(self, "config.eval", at_least={"k": 0, "size": 0, "step": -1})
    if not isinstance(self.benchmarks, str):
      raise ValueError(
        f"config.eval.benchmarks={self.benchmarks!r}: a comma-separated string, e.g. "
        "'arithmetic,long_addition,jsonl:bench.jsonl'."
      )
    names = self.names
    if len(set(names)) != len(names) or any(not n for n in names):
      raise ValueError(f"config.eval.benchmarks={self.benchmarks!r}: an empty or repeated name.")

  @property
  def names(self) -> tuple[str, ...]:
    """The benchmark names, in order (() for "")."""
    return tuple(n.strip() for n in self.benchmarks.split(",")) if self.benchmarks else ()


CREDIT_BATCHES = ("current", "fixed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DiagnosticsConfig:
  """config.diagnostics: what the periodic token-credit hook (`diagnostics.hook`) measures
  and how much it may cost."""

  every: int = 0  # Run every N RL iterations (k % N == 0); 0: off.
  probe_prompts: int = 4  # Groups (prompts × G rollouts) in the probe batch.
  credit_batch: str = "current"  # Flips/coupling/cancellation on: "current" | "fixed".
  max_tokens: int = 256  # S: target tokens sampled for the coupling kernel [S, rows × T].
  tau: float = 1e-3  # Dead-band of the flip table: |Δlog π| <= τ is "unchanged".
  aggregations: tuple[str, ...] = ()  # Extra aggregation modes for cancel/<mode>/...
  drift_references: int = 32  # Held-out reference solutions for solution-logp drift.
  length_window: int = 0  # Iterations in the response-length slope (0: all so far).
  rank: bool = False  # Per-rollout gradient rank and sparsity.
  rank_subset: str = "last_block"  # Parameter subset (`grads.param_subset`).
  project_dim: int = 256  # Columns of the count-sketch projection of gradient rows.
  value: bool = False  # Monte-Carlo token value (expensive).
  value_samples: int = 8  # K continuations per prefix.
  value_tokens: int = 16  # Probe tokens whose value is estimated.
  seed: int = 0  # Token selection and projection seed.

  def __post_init__(self):
    positive = ("probe_prompts", "max_tokens", "project_dim", "value_samples", "value_tokens")
    non_negative = ("every", "drift_references", "length_window", "tau")
    _check_fields(
      self,
      "config.diagnostics",
      at_least={**dict.fromkeys(positive, 1), **dict.fromkeys(non_negative, 0)},
    )
    if self.credit_batch not in CREDIT_BATCHES:
      raise ValueError(
        f"config.diagnostics.credit_batch={self.credit_batch!r}; allowed: {CREDIT_BATCHES}."
      )
    if isinstance(self.aggregations, str):
      raise ValueError(
        f"config.diagnostics.aggregations must be a tuple of mode names, got the string "
        f"{self.aggregations!r} (write ({self.aggregations!r},))."
      )
    for name in self.aggregations:
      if name not in aggregation.REGISTRY:
        raise ValueError(
          f"config.diagnostics.aggregations names {name!r}, not a registered aggregation "
          f"mode; allowed: {', '.join(aggregation.REGISTRY.names())}."
        )

  @property
  def enabled(self) -> bool:
    return self.every > 0

  @classmethod
  def from_dict(
    cls, d, *, prompts_per_step: int, model_cfg: model.ModelConfig | None = None
  ) -> DiagnosticsConfig:
    """Validated config; checks against the run (probe size, parameter subset) when on."""
    cfg = config_lib.from_dict(cls, d, where="config.diagnostics")
    if not cfg.enabled:
      return cfg
    if model_cfg is not None and model_cfg.lora.enabled:
      raise ValueError(
        f"config.diagnostics.every={cfg.every} with config.model.lora.rank="
        f"{model_cfg.lora.rank}: the diagnostics measure gradients of the full parameter "
        "tree (coupling, rank, drift), not of adapters; set diagnostics.every=0 or "
        "model.lora.rank=0."
      )
    if cfg.probe_prompts > prompts_per_step:
      raise ValueError(
        f"config.diagnostics.probe_prompts={cfg.probe_prompts} exceeds prompts_per_step="
        f"{prompts_per_step}: the probe is taken from one RL batch."
      )
    if cfg.rank and model_cfg is not None:
      shapes = jax.eval_shape(functools.partial(model.init, model_cfg), jax.random.key(0))
      try:
        grads.param_subset(shapes, cfg.rank_subset, cfg=model_cfg)
      except ValueError as e:
        raise ValueError(f"config.diagnostics.rank_subset: {e}") from None
    return cfg


@dataclasses.dataclass(frozen=True)
class Setup:
  """Everything built from a config, once, at the edge (before anything compiles)."""

  loop: LoopConfig
  task: Any
  tokenizer: Any
  model_cfg: model.ModelConfig
  sampler_cfg: sampling.SamplerConfig
  sampling_hyper: sampling.SamplingParams
  rl_cfg: rl.RLConfig
  mesh_cfg: sharding.MeshConfig
  diagnostics: DiagnosticsConfig = DiagnosticsConfig()
  spec: dict = dataclasses.field(default_factory=dict)  # The ConfigDict, as plain data.
  counterfactual: counterfactuals.CounterfactualConfig = counterfactuals.CounterfactualConfig()
  steps: alignment.StepSplitter = alignment.StepSplitter()  # The task's step splitter.
  offpolicy: offpolicy.OffPolicyConfig = offpolicy.OffPolicyConfig()
  episodes: episodes.EpisodeConfig | None = None  # config.env; None: single-turn sampling.
  collapse: collapse.CollapseConfig = collapse.CollapseConfig()
  tracking: trackers.TrackingConfig = trackers.TrackingConfig()  # config.logging.
  eval: EvalConfig = EvalConfig()  # config.eval (`grpo-jax eval`).
  rewards: tuple = ()  # config.rewards: reward_sources.SourceSpec per source; (): the verifier.

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


def _defaults(cls) -> dict:
  """A dataclass's field defaults, without constructing it (RLConfig's validation builds
  jax arrays, and reading a config must not start a backend)."""
  out = {}
  for f in dataclasses.fields(cls):
    if f.default is not dataclasses.MISSING:
      out[f.name] = f.default
    elif f.default_factory is not dataclasses.MISSING:
      out[f.name] = f.default_factory()
  return out


def _section(v):
  if isinstance(v, dict):
    return ml_collections.ConfigDict({k: _section(x) for k, x in v.items()})
  return v


# The `quick` variant's model (configs/arithmetic.py, long_addition.py, calculator.py): a
# 1-layer, d_model 32 Qwen3-shaped model that compiles in a fraction of the tiny one's time,
# for tests, smoke runs and experiments that need many short runs.
QUICK_MODEL = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)


def default_config() -> ml_collections.ConfigDict:
  """Every key a trainer config may set, with its default; configs/*.py start from it.

  Top level: the LoopConfig fields. Sections: task (name, kwargs), model (ModelConfig
  with vocab_size 0: the task's tokenizer's size; the defaults are `model.tiny_config`'s),
  sampler (SamplerConfig without eos_ids/pad_id), sampling (temperature, top_k, top_p,
  greedy), rl (every RLConfig field), mesh (data, fsdp, tensor sizes and the
  logical->mesh rules table, `sharding.MeshConfig`) and diagnostics (DiagnosticsConfig;
  every = 0: off), and logging (`trackers.TrackingConfig`: jsonl, TensorBoard, W&B,
  MLflow). Because every key exists, command-line overrides such as
  `--config.rl.num_minibatches=4` work on the locked config, and a misspelt key fails.
  """
  c = ml_collections.ConfigDict(_defaults(LoopConfig))
  c.task = ml_collections.ConfigDict(dict(name="arithmetic", kwargs=ml_collections.ConfigDict()))
  tiny = dataclasses.asdict(model.tiny_config(vocab_size=2))
  tiny["vocab_size"] = 0
  c.model = ml_collections.ConfigDict(tiny)
  sampler = {
    f.name: f.default
    for f in dataclasses.fields(sampling.SamplerConfig)
    if f.name not in ("eos_ids", "pad_id")
  }
  sampler["max_new_tokens"] = 16
  c.sampler = ml_collections.ConfigDict(sampler)
  c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, greedy=False))
  c.rl = _section(_defaults(rl.RLConfig))
  # Each registered estimator's declared hyperparameters (`advantages.Hyper`) and defaults:
  # --config.rl.advantage_hyper.NAME=VALUE overrides one.
  declared = advantages.declared_hyper().items()
  c.rl.advantage_hyper = ml_collections.ConfigDict({k: h.default for k, h in declared})
  mesh = sharding.MeshConfig()
  c.mesh = ml_collections.ConfigDict(
    dict(data=mesh.data, fsdp=mesh.fsdp, tensor=mesh.tensor, rules=_section(dict(mesh.rules)))
  )
  c.diagnostics = _section(_defaults(DiagnosticsConfig))
  c.counterfactual = _section(_defaults(counterfactuals.CounterfactualConfig))
  c.offpolicy = _section(_defaults(offpolicy.OffPolicyConfig))
  c.env = _section({**_defaults(episodes.EpisodeConfig), "name": "", "kwargs": {}})
  c.collapse = _section(_defaults(collapse.CollapseConfig))
  c.logging = _section(_defaults(trackers.TrackingConfig))
  c.eval = _section(_defaults(EvalConfig))
  # Named reward sources (`reward_sources`); empty: the task's verifier alone.
  c.rewards = ml_collections.ConfigDict()
  c.reward_model = _section(_defaults(reward_model.RewardModelConfig))  # `grpo-jax rm-train`.
  return c


def hf_math_config(
  variant: str,
  *,
  task_kwargs: dict,
  fixture_model: str,
  fixture_data: str,
  mesh: tuple[int, int, int],
  max_new_tokens: int,
  max_prompt_len: int,
  eval_size: int,
  micro_batches: int = 4,
) -> ml_collections.ConfigDict:
  """GRPO on a math dataset from a Qwen2.5 Instruct checkpoint: the recipe that
  configs/gsm8k_qwen.py and configs/math_qwen.py share (task "math", GRPO with KL 0.001
  and token-mean aggregation, no warm start, the policy exported to workdir/hf).

  variant "tiny": the committed random checkpoint `fixture_model` and the fixture records
  in `fixture_data` (manual_dir), with their own TFDS data_dir under $TMPDIR so they never
  stand in for the real dataset; a CPU run of the whole pipeline in about a minute.
  Otherwise Qwen2.5-<variant>-Instruct under ~/models: float32 params and Adam, bfloat16
  compute, scanned + rematerialised layers (configs/scale.py gives the reasons), 64
  prompts × G = 8, lr 1e-6 with 10 warmup steps, 200 iterations, the mesh (data, fsdp,
  tensor) and 4 mini-batches of `micro_batches` micro-batches.
  """
  c = default_config()
  c.task.name = "math"
  c.task.kwargs = dict(manual_dir="", data_dir="", **task_kwargs)
  c.rl.update(presets.get("grpo"))
  c.rl.update(kl_coef=0.001, aggregation="token_mean")
  c.update(warmstart_steps=0, export_hf=True)
  if variant == "tiny":
    c.hf_dir = fixture_model
    tmp = os.environ.get("TMPDIR", "/tmp")  # No I/O here: tempfile.gettempdir() probes.
    c.task.kwargs.update(
      manual_dir=fixture_data, data_dir=os.path.join(tmp, "grpo_jax_fixture_tfds")
    )
    c.sampler.update(max_new_tokens=16, group_size=4, max_prompt_len=384)
    c.sampler.prompt_buckets = (192, 384)
    c.update(prompts_per_step=4, iterations=4, eval_every=2, eval_size=4, eval_samples=0)
    c.update(learning_rate=1e-3, checkpoint_every=2, reward_workers=1, reward_timeout_s=30.0)
    return c
  c.hf_dir = f"~/models/Qwen2.5-{variant.upper()}-Instruct"
  c.model.update(dtype="bfloat16", param_dtype="float32", scan_layers=True, remat="full")
  c.sampler.update(max_new_tokens=max_new_tokens, max_prompt_len=max_prompt_len, group_size=8)
  c.sampler.prompt_buckets = (max_prompt_len // 2, max_prompt_len)
  c.update(prompts_per_step=64, iterations=200, learning_rate=1e-6, warmup_steps=10)
  c.update(eval_every=20, eval_size=eval_size, eval_samples=0, checkpoint_every=20)
  c.update(reward_workers=8, reward_timeout_s=10.0)
  c.rl.update(num_minibatches=4, micro_batches=micro_batches)
  c.mesh.update(dict(zip(("data", "fsdp", "tensor"), mesh, strict=True)))
  return c


def build(config, *, n_devices: int | None = None) -> Setup:
  """Validates the ConfigDict and builds the typed pieces; errors name the bad key.
  `n_devices`: the device count the mesh is checked against (default: this job's).

  Raises config_lib.ConfigError (a ValueError) for any bad value or missing file."""
  try:
    setup = _build(config, n_devices=n_devices)
    return dataclasses.replace(setup, episodes=_episode_config(setup))
  except config_lib.ConfigError:
    raise
  except OSError as e:  # A missing or unreadable file the config names.
    raise config_lib.ConfigError(str(e)) from e
  except ValueError as e:  # Our validators' messages; another library's is a bug to show.
    if not _raised_here(e):
      raise
    raise config_lib.ConfigError(str(e)) from e


def plan_setup(config, *, n_devices: int | None = None, model_source: str = "") -> Setup:
  """What the memory plan reads of a config (`grpo-jax plan`), built without the task's
  tokenizer or the checkpoint's weights. The model: `model_source` (`shapes.read`: a
  built-in shape, a config.json, a checkpoint directory or GGUF), else config.hf_dir's
  config.json alone; config.model sets its dtypes, scan_layers and remat. Without either
  (a model from config.model) this is `build`. The Setup has no task or tokenizer."""
  d = config_lib.to_dict(config)
  source = model_source or d.get("hf_dir", "")
  if not source:
    return build(config, n_devices=n_devices)
  try:
    runtime = {k: d["model"][k] for k in HF_RUNTIME_KEYS if k in d["model"]}
    model_cfg = shapes.model_config(os.path.expanduser(source), **runtime)
  except hf.CheckpointError as e:
    hint = " Or plan from the shape alone: --model=<a config.json or a built-in shape>."
    raise config_lib.ConfigError(f"{e}{'' if model_source else hint}") from None
  try:
    loop = config_lib.from_dict(
      LoopConfig, {k: v for k, v in d.items() if k not in SECTIONS}, where="config"
    )
    sampler_cfg = config_lib.from_dict(
      sampling.SamplerConfig, {**d["sampler"], "eos_ids": (0,), "pad_id": 0}, where="config.sampler"
    )
    rl_cfg = rl.RLConfig.from_dict(_with_mask_vocab(d["rl"], model_cfg), where="config.rl")
    cf_d = d.get("counterfactual", {})
    cf = config_lib.from_dict(
      counterfactuals.CounterfactualConfig, cf_d, where="config.counterfactual"
    )
    mesh_cfg = sharding.MeshConfig.from_dict(d.get("mesh", {}))
    n_devices = n_devices or jax.device_count()
    group = sampler_cfg.group_size + (cf.per_group if cf.train else 0)
    data_parallel = math.prod(mesh_cfg.shape(n_devices)[:2])
    _check_batch_shapes(loop, rl_cfg, group, data_parallel=data_parallel)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from e
  setup = Setup(
    loop=loop, task=None, tokenizer=None, model_cfg=model_cfg, sampler_cfg=sampler_cfg,
    sampling_hyper=sampling.sampling_params(**d["sampling"]), rl_cfg=rl_cfg,
    mesh_cfg=mesh_cfg, spec=d, counterfactual=cf,
  )  # fmt: skip
  return _resolve_remat(setup, n_devices=n_devices)


_PACKAGE = pathlib.Path(__file__).resolve().parent


def _raised_here(e: BaseException) -> bool:
  """Whether e was raised by grpo_jax's own code (its innermost frame is in the package)."""
  tb = e.__traceback__
  while tb is not None and tb.tb_next is not None:
    tb = tb.tb_next
  return tb is not None and _PACKAGE in pathlib.Path(tb.tb_frame.f_code.co_filename).parents


def _build(config, *, n_devices: int | None) -> Setup:
  d = config_lib.to_dict(config)
  loop = config_lib.from_dict(
    LoopConfig, {k: v for k, v in d.items() if k not in SECTIONS}, where="config"
  )
  task, tok = task_and_tokenizer(d["task"], hf_dir=loop.hf_dir)
  model_cfg = model_config_of(d["model"], tok, hf_dir=loop.hf_dir)
  _check_learning_rates(loop, model_cfg)
  sampler_cfg = config_lib.from_dict(
    sampling.SamplerConfig,
    {**d["sampler"], "eos_ids": tok.eos_ids, "pad_id": tok.pad_id},
    where="config.sampler",
  )
  rl_cfg = rl.RLConfig.from_dict(_with_mask_vocab(d["rl"], model_cfg), where="config.rl")
  _check_rl_lengths(rl_cfg, sampler_cfg)
  mesh_cfg = sharding.MeshConfig.from_dict(d.get("mesh", {}))
  cf = config_lib.from_dict(
    counterfactuals.CounterfactualConfig, d.get("counterfactual", {}), where="config.counterfactual"
  )
  op, n_devices = _offpolicy_config(d, rl_cfg, cf, sampler_cfg, n_devices=n_devices)
  data_parallel = math.prod(mesh_cfg.shape(n_devices)[:2])
  steps = _step_splitter(task, tok)
  _check_counterfactuals(cf, rl_cfg, task, steps, diagnostics=d.get("diagnostics", {}))
  update_group = sampler_cfg.group_size + (cf.per_group if cf.train else 0)
  _check_batch_shapes(loop, rl_cfg, update_group, data_parallel=data_parallel)
  _check_group_estimator(rl_cfg, sampler_cfg.group_size)
  _check_prompt_lengths(task, tok, sampler_cfg, loop)
  _check_reward_budget(task, loop)
  rows = loop.prompts_per_step * sampler_cfg.group_size
  if sampler_cfg.refill_slots > rows:
    raise ValueError(
      f"config.sampler.refill_slots={sampler_cfg.refill_slots} exceeds the rows it decodes "
      f"(prompts_per_step × group_size = {rows}); use at most {rows}, or 0 (off)."
    )
  setup = Setup(
    loop=loop,
    task=task,
    tokenizer=tok,
    model_cfg=model_cfg,
    sampler_cfg=sampler_cfg,
    sampling_hyper=sampling.sampling_params(**d["sampling"]),
    rl_cfg=rl_cfg,
    mesh_cfg=mesh_cfg,
    diagnostics=DiagnosticsConfig.from_dict(
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
    eval=config_lib.from_dict(EvalConfig, d.get("eval", {}), where="config.eval"),
    rewards=_reward_sources(d, rl_cfg, cf),
  )
  return _resolve_remat(setup, n_devices=n_devices)


def _reward_sources(d: dict, rl_cfg: rl.RLConfig, cf) -> tuple:
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


def _check_rl_lengths(rl_cfg: rl.RLConfig, sampler_cfg: sampling.SamplerConfig) -> None:
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


def _check_learning_rates(loop: LoopConfig, model_cfg: model.ModelConfig) -> None:
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
  texts. Episodes run their own turn loop on the host, so the features that sample rows
  another way are refused."""
  env_d, tok = setup.spec.get("env", {}), setup.tokenizer
  if not env_d.get("name"):
    return None
  conflicts = {
    "config.counterfactual (per_group > 0)": setup.counterfactual.enabled,
    "config.sampler.refill_slots > 0": setup.sampler_cfg.refill_slots > 0,
    "config.offpolicy.enabled": setup.offpolicy.enabled,
    "config.diagnostics.value": setup.diagnostics.value,
  }
  cfg = config_lib.from_dict(episodes.EpisodeConfig, env_d, where="config.env")
  try:
    env_cls = envs.get(cfg.name)
  except ValueError as e:
    raise ValueError(f"config.env.name: {e}") from None
  try:
    env_cls(tokenizer=tok, **cfg.kwargs)
  except TypeError as e:
    raise ValueError(f"config.env.kwargs for environment {cfg.name!r}: {e}") from None
  episodes.stop_ids(env_cls, tok)
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


def _check_counterfactuals(cf, rl_cfg: rl.RLConfig, task, steps, *, diagnostics) -> None:
  """Counterfactual rows are used by something, can be scored against their prompt's
  example, and their importance weights can be computed."""
  if not cf.enabled:
    return
  where = "config.counterfactual"
  if cf.train and diagnostics.get("every", 0):
    raise ValueError(
      f"{where}.train=True with config.diagnostics.every > 0: the diagnostics probe groups "
      "of G samples, and trained counterfactuals make them G + C rows; switch one off."
    )
  if not (advantages.REGISTRY.traits(rl_cfg.advantage).reads_counterfactuals or cf.train):
    readers = [
      n for n in advantages.REGISTRY if advantages.REGISTRY.traits(n).reads_counterfactuals
    ]
    raise ValueError(
      f"{where}.per_group={cf.per_group} with rl.advantage={rl_cfg.advantage!r} and "
      f"{where}.train=False: the counterfactual rows would be sampled and never used. Use "
      f"rl.advantage={' or '.join(map(repr, readers))} (they inform its potential φ), or "
      "train=True, or per_group=0."
    )
  if rl_cfg.dynamic_sampling:
    raise ValueError(f"{where} does not combine with rl.dynamic_sampling; switch one off.")
  if cf.perturbed:
    supported = task.supported_perturbations()
    if cf.source not in supported:
      raise ValueError(
        f"{where}.source={cf.source!r}: task {type(task).__name__} perturbs its prompts by "
        f"{', '.join(supported) or 'none'}; use one of those or 'branch'."
      )
    if cf.weighting == "truncated_is" and not rl_cfg.recompute_old_logp:
      raise ValueError(
        f"{where}.weighting='truncated_is' needs π(o|q) of rows sampled under a perturbed "
        "prompt: set rl.recompute_old_logp=True (one forward per row), or weighting "
        "'none' / 'drop'."
      )
  if "step" in (cf.cut, cf.distance) and not steps.defined:
    raise ValueError(
      f"{where}: cut or distance 'step' needs the task's step splitter, and task "
      f"{type(task).__name__} defines neither a one-token step_end_text nor a "
      "step_start_text; use 'uniform' / 'token'."
    )


def task_and_tokenizer(d: dict, *, hf_dir: str):
  """The task and its tokenizer; a task that reads a HF tokenizer takes hf_dir's."""
  kwargs = dict(d.get("kwargs", {}))
  if hf_dir and getattr(tasks.REGISTRY.get(d["name"]), "uses_hf_tokenizer", False):
    kwargs.setdefault("tokenizer_dir", hf_dir)
  task = tasks.get(d["name"], **kwargs)
  return task, task.tokenizer()


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
  base = hf.model_config(hf.read_config(hf_dir), where=where)
  default = config_lib.to_dict(default_config().model)
  for key, value in model_d.items():
    if key in HF_RUNTIME_KEYS or value == default.get(key) or value == getattr(base, key):
      continue
    raise ValueError(
      f"config.model.{key}={value!r} conflicts with {where} "
      f"({getattr(base, key)!r}): with config.hf_dir the architecture comes from the "
      f"checkpoint; config.model sets only {list(HF_RUNTIME_KEYS)}."
    )
  if tok.vocab_size > base.vocab_size:
    raise ValueError(
      f"The tokenizer has {tok.vocab_size} tokens but {where} has vocab_size "
      f"{base.vocab_size}: they do not belong together."
    )
  runtime = {k: model_d[k] for k in HF_RUNTIME_KEYS if k in model_d}
  limit = tok.vocab_size if tok.vocab_size < base.vocab_size else 0
  return dataclasses.replace(base, vocab_limit=limit, **runtime)


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


def _check_batch_shapes(loop: LoopConfig, rl_cfg: rl.RLConfig, group_size: int, *, data_parallel):
  """The rollout batch N = prompts_per_step × group_size splits into rl.num_minibatches
  mini-batches of b rows, each into rl.micro_batches micro-batches of b / micro_batches
  rows; every one of them is split over the data × fsdp devices, and the planner must be
  able to honour its guarantee (e.g. whole groups per mini-batch) at this shape."""
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
  for what, r in rows.items():
    if r % data_parallel:
      raise ValueError(
        f"config.mesh: {what} has {r} rows, not divisible by the data-parallel size "
        f"data × fsdp = {data_parallel}. Change prompts_per_step, group_size, "
        "rl.num_minibatches or rl.micro_batches, or the mesh (e.g. put devices on `tensor`)."
      )
  try:
    rl.make_plan_fn(rl_cfg, batch_size=n, group_size=group_size)
  except ValueError as e:
    raise ValueError(f"config.rl.planner={rl_cfg.planner!r}: {e}") from None


def _check_reward_budget(task, loop: LoopConfig) -> None:
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


def _check_group_estimator(rl_cfg: rl.RLConfig, group_size: int) -> None:
  """With one rollout per prompt a group-relative estimator's baseline is the row itself:
  every advantage is 0 and nothing is trained."""
  options = config_lib.to_dict(rl_cfg.advantage_options)
  if group_size == 1 and not advantages.works_without_groups(rl_cfg.advantage, options):
    raise ValueError(
      f"config.rl.advantage={rl_cfg.advantage!r} with config.sampler.group_size=1: a group of "
      "one is its own baseline, so every advantage is 0 and nothing trains. At group_size 1 "
      f"use one of {', '.join(advantages.batch_level_names())}, or raise group_size."
    )


def _check_prompt_lengths(task, tok, cfg: sampling.SamplerConfig, loop: LoopConfig) -> None:
  """The first training batch and the held-out set fit max_prompt_len and the largest
  prompt bucket, so a too-long prompt fails here, not after compiling and warm-starting.
  (Later training prompts are checked when drawn.)"""
  limit = min(cfg.max_prompt_len, max(cfg.prompt_buckets))
  if cfg.truncate_prompts == "left" and max(cfg.prompt_buckets) >= cfg.max_prompt_len:
    return
  for split, n in (("train", loop.prompts_per_step), ("test", loop.eval_size)):
    for i in range(n):
      length = len(tok.encode(task.example(split, i, seed=loop.seed).prompt, add_bos=True))
      if length > limit:
        raise ValueError(
          f"The {split} prompt {i} has {length} tokens, more than config.sampler."
          f"max_prompt_len={cfg.max_prompt_len} / the largest of config.sampler.prompt_buckets="
          f"{tuple(cfg.prompt_buckets)} allow ({limit}). Raise both, or set "
          "config.sampler.truncate_prompts='left' to keep each prompt's last tokens."
        )


def from_recorded(recorded: dict) -> ml_collections.ConfigDict:
  """The ConfigDict that builds the Setup a workdir's config.json (`as_dict`) records, so a
  command that reads a run (`grpo-jax eval --workdir=...`) needs no --config: today's
  defaults (`default_config`), overlaid with the recorded loop keys and each section's
  recorded keys that still exist, less what `build` derives (the task's class, the
  tokenizer's eos/pad ids, and with config.hf_dir the checkpoint's architecture: only
  HF_RUNTIME_KEYS are kept). config.eval is not the run's: it keeps its defaults. Locked,
  like `config_lib.load`'s."""
  d = json.loads(json.dumps(recorded))  # A copy, as plain JSON data.
  rec = {**d.pop("loop", {}), **{k: v for k, v in d.items() if k in SECTIONS and k != "eval"}}
  rec["task"] = {k: v for k, v in rec.get("task", {}).items() if k != "class"}
  rec["sampler"] = {
    k: v for k, v in rec.get("sampler", {}).items() if k not in ("eos_ids", "pad_id")
  }
  if rec.get("hf_dir"):
    rec["model"] = {k: v for k, v in rec.get("model", {}).items() if k in HF_RUNTIME_KEYS}
  out = {}
  for key, default in config_lib.to_dict(default_config()).items():
    if key == "rewards":  # Named by the run: no defaults to overlay.
      out[key] = rec.get(key, {})
    elif key in SECTIONS:
      given = rec.get(key, {})
      out[key] = {**default, **{k: v for k, v in given.items() if k in default}}
    else:
      out[key] = rec.get(key, default)
  c = ml_collections.ConfigDict(out)
  c.lock()
  return c


def as_dict(setup: Setup) -> dict:
  """The validated config as plain data (written to workdir/config.json)."""
  return {
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
  }
