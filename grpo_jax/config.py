"""The run's config: one schema, every key with its default, validated once at the edge.

    c = config.default_config()        # configs/*.py start here (no I/O, no JAX import)
    c.rl.advantage = "rloo"             # any key; the locked ConfigDict refuses a misspelt one
    setup = build.build(c)              # (grpo_jax.trainer.build) validated dataclasses + the task and its tokenizer

Sections of the ConfigDict and the dataclass each becomes:

  top level    schema.LoopConfig     loop sizes, optimizer, evaluation, checkpoints, I/O
  task         tasks.get(name, **kwargs)
  model        model.ModelConfig     (vocab_size 0: the tokenizer's; or from config.hf_dir)
  sampler      sampling.SamplerConfig (eos_ids / pad_id come from the tokenizer)
  sampling     sampling.SamplingParams (arrays: temperature, top_k, top_p, greedy)
  rl           spec.RLConfig           the algorithm, by registry names
  mesh         sharding.MeshConfig   (data, fsdp, expert, sequence, tensor) sizes and the rules
  diagnostics  schema.DiagnosticsConfig  token-credit diagnostics (every = 0: off)
  counterfactual counterfactuals.CounterfactualConfig  IBPO's counterfactual rows (per_group
               = 0: off); prepare's groups are then G + C rows (Setup.train_group), the
               update's G + C with counterfactual.train, else G (Setup.update_group)
  offpolicy    offpolicy.OffPolicyConfig  the rollout pipeline: staleness, partial
               rollouts, sampler placement (enabled = False: the synchronous loop)
  env          episodes.EpisodeConfig  multi-turn episodes with an environment (`envs`;
               name "": off, single-turn sampling); Setup.episodes, None when off
  collapse     collapse.CollapseConfig  the guard that stops (or warns) a run whose
               policy visibly collapsed (action "off": no guard)
  teacher      teacher.TeacherConfig  the teacher on-policy distillation reads (rl.advantage
               "distill"; path "": none); Setup.teacher_source its architecture and tokenizer

This module imports no JAX: `default_config()` builds from `config_defaults.DEFAULTS`, the
snapshot `python -m grpo_jax.schema` writes from the dataclasses (`schema`: LoopConfig,
EvalConfig, DiagnosticsConfig and each section's own), so a config file loads, and a
misspelt key fails, in a fraction of a second.

Where each value is checked: its own range (>= 1, finite, a registered name) in its
dataclass's `__post_init__`; values that constrain each other (the rollout batch, the
mini-batches, the micro-batches, the planner's groups and the mesh's data-parallel size)
in `build._check_batch_shapes`, once. Both run in `build`, before anything compiles; an
error names the key, its value and what is allowed.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from typing import Any

import ml_collections

from grpo_jax import config_defaults
from grpo_jax.infra import config_lib, moved
from grpo_jax.rl import presets

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
  "teacher",
)
# What config.model may set when the architecture comes from a HF checkpoint.
HF_RUNTIME_KEYS = (
  "param_dtype", "dtype", "scan_layers", "remat", "attention_impl", "context_query_block", "lora",
)  # fmt: skip


# The `quick` variant's model (configs/arithmetic.py, long_addition.py, calculator.py): a
# 1-layer, d_model 32 Qwen3-shaped model that compiles in a fraction of the tiny one's time,
# for tests, smoke runs and experiments that need many short runs.
QUICK_MODEL = dict(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)


def default_config() -> ml_collections.ConfigDict:
  """Every key a trainer config may set, with its default; configs/*.py start from it.

  Top level: the LoopConfig fields. Sections: task (name, kwargs), model (ModelConfig
  with vocab_size 0: the task's tokenizer's size; the defaults are `model.tiny_config`'s),
  sampler (SamplerConfig without eos_ids/pad_id), sampling (temperature, top_k, top_p,
  greedy), rl (every RLConfig field, with the declared hyperparameters of the
  estimators, losses, masks and importance corrections under advantage_hyper, loss_hyper,
  mask_hyper and importance_hyper), mesh (data, fsdp, expert, sequence,
  tensor sizes and the logical->mesh rules table, `sharding.MeshConfig`), diagnostics
  (DiagnosticsConfig; every = 0: off), and logging (`trackers.TrackingConfig`: jsonl,
  TensorBoard, W&B, MLflow). Because every key exists, command-line overrides such as
  `--config.rl.num_minibatches=4` work on the locked config, and a misspelt key fails.
  Built from the committed snapshot `config_defaults.DEFAULTS` (`schema.defaults()` reads
  the same off the dataclasses, with JAX imported).
  """
  c = ml_collections.ConfigDict(copy.deepcopy(config_defaults.DEFAULTS))  # Nested too.
  _add_registered_hyper(c)
  return c


# The registries whose records declare config keys: (module, rl key). A user's own estimator
# or loss (`tests/toy_estimator.py`) declares hyperparameters the snapshot cannot know.
_DECLARING = (
  ("grpo_jax.rl.advantages", "advantage_hyper"),
  ("grpo_jax.rl.losses", "loss_hyper"),
  ("grpo_jax.rl.masks", "mask_hyper"),
  ("grpo_jax.rl.importance", "importance_hyper"),
)


def _add_registered_hyper(c: ml_collections.ConfigDict) -> None:
  """Adds the declared hyperparameters of every record registered in this process that the
  snapshot lacks. Registering needs the registry's module imported, so where it is not
  imported the snapshot already has every key (and reading it costs no JAX import)."""
  for module_name, key in _DECLARING:
    module = sys.modules.get(module_name)
    if module is None:
      continue
    section = c.rl[key]
    for name, h in module.declared_hyper().items():
      if name not in section:
        section[name] = h.default


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
  tensor) and 4 mini-batches of `micro_batches` micro-batches (the log-prob forwards in
  as many slices: rl.logprob_batches).
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
  # The π_old and reference forwards at the update's micro-batch rows (all 512 rows at
  # once would need a float32 [rows, T, vocab] logits buffer over any chip's HBM).
  c.rl.update(num_minibatches=4, micro_batches=micro_batches, logprob_batches=4 * micro_batches)
  c.mesh.update(dict(zip(("data", "fsdp", "tensor"), mesh, strict=True)))
  return c


def from_recorded(recorded: dict) -> ml_collections.ConfigDict:
  """The ConfigDict that builds the Setup a workdir's config.json (`as_dict`) records, so a
  command that reads a run (`grpo-jax eval --workdir=...`) needs no --config: today's
  defaults (`default_config`), overlaid with the recorded loop keys and each section's
  recorded keys that still exist, less what `build` derives (the task's class, the
  tokenizer's eos/pad ids, and with config.hf_dir the checkpoint's architecture: only
  HF_RUNTIME_KEYS are kept). config.eval is not the run's: it keeps its defaults. Locked,
  like `config_lib.load`'s."""
  d = json.loads(json.dumps(recorded))  # A copy, as plain JSON data.
  d = config_lib.upgrade(d, warn=False)  # A run recorded before keys moved (MOVED_KEYS).
  rec = {**d.pop("loop", {}), **{k: v for k, v in d.items() if k in SECTIONS and k != "eval"}}
  rec["task"] = {k: v for k, v in rec.get("task", {}).items() if k != "class"}
  rec["sampler"] = {
    k: v
    for k, v in rec.get("sampler", {}).items()
    if k not in ("eos_ids", "pad_id", "record_routes")
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


_ABSENT = "<absent>"


def _default_at(dotted: str):
  """Today's default of a recorded config's key (`build.as_dict` layout: "loop." keys are
  top-level), or _ABSENT where the schema has none."""
  node: Any = config_defaults.DEFAULTS
  for part in dotted.removeprefix("loop.").split("."):
    if not isinstance(node, dict) or part not in node:
      return _ABSENT
    node = node[part]
  return node


def _same_value(a, b) -> bool:
  """a == b, with a list equal to the tuple it was before JSON (config.json holds lists)."""
  if isinstance(a, list | tuple) and isinstance(b, list | tuple):
    return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
  if isinstance(a, dict) and isinstance(b, dict):
    return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
  return a == b


def changes(before: dict, after: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
  """(dotted key, old value, new value) for every leaf that differs between two configs.
  A key on one side only is no change when the other side's value is today's default or
  an empty section: a key or section a later release added, at the value it behaves as
  when absent (a checkpoint written before it existed reads the same)."""
  out = []
  for k in sorted(set(before) | set(after)):
    a, b = before.get(k, _ABSENT), after.get(k, _ABSENT)
    if _ABSENT in (a, b):
      there = b if a is _ABSENT else a
      if there == {} or _same_value(there, _default_at(f"{prefix}{k}")):
        continue
    if isinstance(a, dict) and isinstance(b, dict):
      out += changes(a, b, f"{prefix}{k}.")
    elif not _same_value(a, b):
      out.append((f"{prefix}{k}", a, b))
  return out


def __getattr__(name: str):
  """`config.build(c)` and the rest of 0.1's Setup builders (now `grpo_jax.trainer.build`), with a
  DeprecationWarning; kept for one release."""
  return moved.resolve(
    "grpo_jax.config", name, moved.CONFIG_NAMES, attribute=True, namespace=globals()
  )
