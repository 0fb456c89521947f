"""The run's schema: the dataclasses a config's top-level, eval and diagnostics keys become,
and every section's defaults read off the dataclass that validates it.

    c = schema.defaults()                # the same keys and values as config.default_config()
    python -m grpo_jax.schema            # rewrites grpo_jax/config_defaults.py from it

Why a snapshot: reading a config file (`--config=configs/arithmetic.py:tiny`) needs every
key's default, and the dataclasses that hold them import JAX, the registries and
tensorboardX (3 s and more, 4 s with torch installed). `config.default_config()` builds
the same ConfigDict from `config_defaults.DEFAULTS`, a literal this module writes, so
`grpo-jax --help` and a misspelt `--config.KEY` answer before JAX is imported.
tests/test_config.py checks the snapshot is today's schema, key for key, value for value
and type for type, and names the command above when it is not.

Where each value is checked: its own range (>= 1, finite, a registered name) in its
dataclass's `__post_init__`; values that constrain each other in `build`, once.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pathlib
import pprint
import sys

import jax
import ml_collections

from grpo_jax import config_defaults
from grpo_jax.diagnostics import grads
from grpo_jax.envs import episodes
from grpo_jax.infra import collapse, config_lib, trackers
from grpo_jax.models import model, sampling, sharding, teacher
from grpo_jax.rewards import reward_model
from grpo_jax.rl import (
  advantages,
  aggregation,
  counterfactuals,
  importance,
  losses,
  masks,
  offpolicy,
  spec,
)


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
  # stops the run (`verdicts.RewardFailure`); below it, failed rows follow rl.unscorable.
  max_unscorable_frac: float = 0.9
  # An iteration whose share of unscorable rows exceeds this logs a warning naming their
  # causes and their correlation with wrong answers (`verdicts.unscorable_warning`):
  # masked rows are where a policy can escape its zeros. 1: never warn.
  warn_unscorable_frac: float = 0.05
  peak_flops: float = 0.0  # Device peak FLOP/s for MFU; 0: a float32 matmul, once a process.
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
    if not 0 <= self.warn_unscorable_frac <= 1:
      raise ValueError(
        f"config.warn_unscorable_frac={self.warn_unscorable_frac}: must be in [0, 1] "
        "(1: never warn)."
      )


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
  """config.eval: what `grpo-jax eval` scores (`grpo_jax.trainer.eval_command`)."""

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


def defaults() -> ml_collections.ConfigDict:
  """Every key a trainer config may set, with its default, read off the dataclasses that
  validate it (`config.default_config` is its committed snapshot).

  Top level: the LoopConfig fields. Sections: task (name, kwargs), model (ModelConfig
  with vocab_size 0: the task's tokenizer's size; the defaults are `model.tiny_config`'s),
  sampler (SamplerConfig without eos_ids/pad_id), sampling (temperature, top_k, top_p,
  greedy), rl (every RLConfig field), mesh (data, fsdp, expert, sequence, tensor sizes and
  the logical->mesh rules table, `sharding.MeshConfig`) and diagnostics (DiagnosticsConfig;
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
    if f.name not in ("eos_ids", "pad_id", "record_routes")  # record_routes: rl.routing_replay.
  }
  sampler["max_new_tokens"] = 16
  c.sampler = ml_collections.ConfigDict(sampler)
  c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, greedy=False))
  c.rl = _section(_defaults(spec.RLConfig))
  # Each registered estimator's declared hyperparameters (`advantages.Hyper`) and defaults:
  # --config.rl.advantage_hyper.NAME=VALUE overrides one.
  declared = advantages.declared_hyper().items()
  c.rl.advantage_hyper = ml_collections.ConfigDict({k: h.default for k, h in declared})
  # The same for the policy losses' (`losses.Traits.hyper`): --config.rl.loss_hyper.NAME=V.
  declared = losses.declared_hyper().items()
  c.rl.loss_hyper = ml_collections.ConfigDict({k: h.default for k, h in declared})
  # The token masks' (rl.mask_hyper) and the importance corrections' (rl.importance_hyper).
  for key, module in (("mask_hyper", masks), ("importance_hyper", importance)):
    declared = module.declared_hyper().items()
    c.rl[key] = ml_collections.ConfigDict({k: h.default for k, h in declared})
  mesh = sharding.MeshConfig()
  c.mesh = ml_collections.ConfigDict(
    dict(
      data=mesh.data,
      fsdp=mesh.fsdp,
      expert=mesh.expert,
      sequence=mesh.sequence,
      tensor=mesh.tensor,
      rules=_section(dict(mesh.rules)),
    )
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
  c.teacher = _section(_defaults(teacher.TeacherConfig))  # On-policy distillation's teacher.
  return c


SNAPSHOT = pathlib.Path(__file__).with_name("config_defaults.py")
_HEADER = '''"""Every config key's default: the snapshot `config.default_config()` builds from.

Written by `python -m grpo_jax.schema` from the dataclasses' own defaults (`schema.defaults`);
do not edit by hand. tests/test_config.py fails, naming that command, when they differ.
"""

# fmt: off
DEFAULTS = '''


def snapshot_text(c: ml_collections.ConfigDict | None = None) -> str:
  """The text of config_defaults.py for the ConfigDict `c` (default: `defaults()`)."""
  d = config_lib.to_dict(defaults() if c is None else c)
  _check_literal(d, "config")
  return _HEADER + pprint.pformat(d, width=100, sort_dicts=False) + "\n"


def _check_literal(v, where: str) -> None:
  """A value a Python literal writes back exactly (no inf, nan or objects)."""
  if isinstance(v, dict):
    for k, x in v.items():
      _check_literal(x, f"{where}.{k}")
  elif isinstance(v, list | tuple):
    for i, x in enumerate(v):
      _check_literal(x, f"{where}[{i}]")
  elif isinstance(v, float) and not math.isfinite(v):
    raise ValueError(f"{where}={v}: a default must be finite to be written as a literal.")
  elif v is not None and not isinstance(v, bool | int | float | str):
    raise ValueError(f"{where}={v!r}: a default must be None, a bool, number or string.")


def stale_keys() -> list[str]:
  """The dotted keys whose value or type differ between the snapshot
  (`config_defaults.DEFAULTS`) and `defaults()`, or that only one of them has."""
  snapshot = _leaves(config_defaults.DEFAULTS)
  live = _leaves(config_lib.to_dict(defaults()))
  return sorted(k for k in snapshot.keys() | live.keys() if snapshot.get(k) != live.get(k))


def _leaves(d: dict, prefix: str = "") -> dict:
  """{dotted key: (type name, value)}: tuples and lists, ints and floats told apart."""
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_leaves(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = (type(v).__name__, v)
  return out


def main(argv: list[str] | None = None) -> int:
  """Rewrites config_defaults.py and says whether it changed; with --check, writes nothing
  and exits 1 when it would change (run it in a fresh process: a record registered by a
  test or a user's module would otherwise count as a default)."""
  argv = sys.argv[1:] if argv is None else argv
  text = snapshot_text()
  old = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
  if argv == ["--check"]:
    stale = stale_keys()
    if stale or text != old:
      where = f" at {', '.join(stale[:8])}" if stale else " (its layout)"
      print(f"{SNAPSHOT} is stale{where}: run `python -m grpo_jax.schema`.", file=sys.stderr)
      return 1
    return 0
  if argv:
    raise SystemExit(f"usage: python -m grpo_jax.schema [--check]; got {argv}")
  SNAPSHOT.write_text(text)
  print(f"{SNAPSHOT}: {'unchanged' if text == old else 'rewritten'}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
