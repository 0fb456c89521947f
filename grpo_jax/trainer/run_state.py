"""The run's state: what the training loop carries from one iteration to the next and a
checkpoint holds (`RunState`), and how it is made, shaped, written and read back.

  Made      a fresh run's: `initial_params` (random, or streamed from config.hf_dir by
            `hf`) and `initial_tree` (train state, reference, controller state, key).
  Shaped    `abstract_tree`: its shapes, dtypes and shardings, without computing it (what
            a restore reads into); `fillable_defaults`: what an older checkpoint lacks.
  Written   `save`: checkpoint st.iteration (device arrays as the orbax "state" item,
            host counters as "meta"); a state that is not finite is never written.
  Read      `restored`: a checkpoint's tree and meta as a RunState (with adapters, the
            frozen base read and checked, `frozen_base`); `read_checkpoint`: one
            checkpoint of a workdir, read-only (`grpo-jax eval`).

`train` decides when: it restores the latest checkpoint or starts (warm start, first
evaluation), and saves every `checkpoint_every` iterations.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax.infra import checkpoint, distributed
from grpo_jax.models import frozen_base, hf, model, sharding, teacher
from grpo_jax.rl import controllers, guards, learner, spec
from grpo_jax.trainer import build, steps


@dataclasses.dataclass
class RunState:
  """What the loop carries from one iteration to the next; a checkpoint holds all of it."""

  # On device: the checkpoint's "state" item.
  train: spec.TrainState
  ref_params: Any  # The reference policy (None without a KL term, or with adapters).
  prep_hyper: spec.PrepareHyper  # Arrays a controller may move between iterations.
  controller: dict
  key: jax.Array  # The run's PRNG key; iteration k uses fold_in(key, k).
  # On the host: the checkpoint's "meta" item.
  warmstart: dict  # Evaluation after the warm start (iteration 0).
  last_eval: dict
  best_accuracy: float
  iteration: int = 0
  data_index: int = 0  # Position in the task's train stream.
  best_iteration: int = 0
  nonfinite_total: int = 0
  nonfinite_run: int = 0  # Consecutive skipped steps so far.
  wall_seconds: float = 0.0  # Of every session of this run, up to the last tick.
  collapse_guard: dict = dataclasses.field(default_factory=dict)  # `collapse.observe`'s.
  task_state: dict = dataclasses.field(default_factory=dict)  # `Task.state`: a curriculum's.
  config: dict | None = None  # `build.as_dict` of the session that wrote the checkpoint.
  # With adapters: where the frozen base comes from and its fingerprint (`frozen_base`);
  # checkpoints hold the adapters only.
  base_identity: dict | None = None

  _DEVICE = ("train", "ref_params", "prep_hyper", "controller", "key")

  def reference(self):
    """The reference policy's params: with adapters, the current base with adapters off
    (`model.reference_part`: the train state's own arrays, never stored apart: the update
    donates them), else `ref_params`."""
    if model.is_adapted(self.train.params):
      return model.reference_part(self.train.params)
    return self.ref_params

  def tree(self) -> dict:
    """What a checkpoint's "state" item holds: with adapters, not the frozen base."""
    out = {k: getattr(self, k) for k in self._DEVICE}
    return frozen_base.stored({**out, "key": jax.random.key_data(self.key)})

  def meta(self) -> dict:
    return {
      f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self._DEVICE
    }

  @classmethod
  def restore(cls, tree: dict, meta: dict) -> RunState:
    return cls(**{**tree, "key": jax.random.wrap_key_data(tree["key"])}, **meta)


def initial_params(setup: build.Setup, fns: steps.Functions, key):
  """The checkpoint's weights streamed onto their shardings (config.hf_dir), else a
  random init created in its shards. With model.lora, a checkpoint is the base and the
  adapters start fresh (B = 0: the policy is the checkpoint's)."""
  if not setup.loop.hf_dir:
    return sharding.init_params(fns.layout, setup.model_cfg, key)
  shardings = fns.param_shardings
  lora = setup.model_cfg.lora.enabled
  base = hf.load_params(
    setup.loop.hf_dir, setup.model_cfg, shardings=shardings["base"] if lora else shardings
  )
  if not lora:
    return base
  return {"base": base, "lora": sharding.init_adapters(fns.layout, setup.model_cfg, key)}


def initial_tree(setup: build.Setup, fns: steps.Functions, params) -> dict:
  """The checkpointed pytree of a fresh run (`RunState.tree`): train state, reference
  params, the hyperparameters controllers move, controller state and the RNG key."""
  rl_cfg = setup.rl_cfg
  return {
    "train": spec.init_state(params, fns.optimizer),
    # A copy: the update donates the policy's buffers, the reference must outlive them.
    # With adapters the reference is the base itself (`RunState.reference`).
    "ref_params": model.reference(params)
    if rl_cfg.use_ref and not model.is_adapted(params)
    else None,
    "prep_hyper": rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens),
    "controller": controllers.init_state(),
    "key": jax.random.key_data(jax.random.key(setup.loop.seed)),
  }


def fillable_defaults(setup: build.Setup) -> dict:
  """The checkpointed hyperparameters as this config sets them: a checkpoint written
  before one of them existed (an older grpo_jax) resumes with the config's value."""
  return {"prep_hyper": setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)}


def _stores_ref(setup: build.Setup) -> bool:
  return setup.rl_cfg.use_ref and not setup.model_cfg.lora.enabled


def abstract_tree(setup: build.Setup, fns: steps.Functions):
  """Shapes, dtypes and shardings of the checkpointed pytree, without computing it: the
  train state and reference params on their shardings, the rest replicated."""
  tree = jax.eval_shape(
    lambda k: initial_tree(
      setup, fns, model.cast_base(model.init(setup.model_cfg, k), setup.model_cfg)
    ),
    jax.random.key(0),
  )
  shardings = {
    **jax.tree.map(lambda _: fns.layout.replicated, tree),
    "train": fns.state_shardings,
    "ref_params": fns.param_shardings if _stores_ref(setup) else None,
  }
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


_finite = jax.jit(learner.all_finite)


def save(ckpt: checkpoint.Checkpointer, st: RunState, *, accuracy=None, buffer=None) -> None:
  """Checkpoint st.iteration (with the off-policy pipeline's in-flight `buffer`, in the same
  step: committed, hashed and pruned with it); a state with a non-finite array is never
  written."""
  tree = st.tree()
  if not bool(_finite(tree)):
    bad = [
      jax.tree_util.keystr(path)
      for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
      if jnp.issubdtype(x.dtype, jnp.inexact) and not bool(jnp.all(jnp.isfinite(x)))
    ]
    raise guards.NonFiniteError(
      f"Refusing to checkpoint iteration {st.iteration}: non-finite values in {bad[:5]} (the "
      f"last checkpoint, {ckpt.latest_step()}, is kept). The train step's guard skips "
      "non-finite updates, so look at what else moves the state (an advantage controller)."
    )
  ckpt.save(st.iteration, tree, st.meta(), accuracy=accuracy, buffer=buffer)


def restored(setup, fns, workdir, tree, meta: dict, abstract) -> RunState:
  """The RunState of a restored checkpoint; with adapters, its base read and checked
  against the identity the checkpoint recorded (`frozen_base`)."""
  if identity := meta.get("base_identity"):
    like = abstract["train"].params["base"]
    base = frozen_base.load(
      setup, like, identity, workdir=workdir, load_shardings=fns.param_shardings["base"]
    )
    tree = frozen_base.joined(tree, base)
  return RunState.restore(tree, meta)


def read_checkpoint(setup, fns, workdir, *, step: int | None = None) -> RunState | None:
  """The RunState of checkpoint `step` (None: the newest) under workdir/checkpoints,
  read-only: a damaged checkpoint raises (`checkpoint.Checkpointer.restore_step`) instead
  of being set aside as a resume does. None when the directory holds no checkpoint; a
  missing step raises with the ones there are. For `grpo-jax eval`."""
  directory = pathlib.Path(workdir) / "checkpoints"
  if not directory.is_dir():
    return None
  ckpt = checkpoint.Checkpointer(directory, keep=10**9, async_save=False)
  try:
    steps_there = ckpt.all_steps()
    if not steps_there:
      return None
    step = max(steps_there) if step is None else step
    if step not in steps_there:
      raise checkpoint.CheckpointMismatchError(
        f"{ckpt.directory} has no checkpoint {step}; it has {sorted(steps_there)}."
      )
    abstract = abstract_tree(setup, fns)
    got = ckpt.restore_step(
      step, like=frozen_base.stored(abstract), defaults=fillable_defaults(setup)
    )
    meta = dict(got.meta)
    meta.pop("filled", None)
    meta.pop("dropped", None)
    return restored(setup, fns, workdir, got.tree, meta, abstract)
  finally:
    ckpt.close()


def with_teacher(setup: build.Setup, fns, workdir, *, resumed: bool, log) -> steps.Functions:
  """`fns` with the teacher's log-probs folded into rl.logprobs (config.teacher,
  `steps.with_teacher`): its params read onto their shardings (never checkpointed: read
  again on every resume), and its identity recorded in workdir/teacher.json on a fresh run
  or checked against it on a resume (`teacher`)."""
  source = setup.teacher_source
  if source is None:
    return fns
  source = teacher.recorded_step(source, workdir, setup.teacher, resumed=resumed)
  if source.step is not None:  # A workdir teacher: every process reads the primary's step.
    source = dataclasses.replace(source, step=distributed.from_primary(source.step))
  params = teacher.load_params(source, shardings=fns.teacher_shardings)
  now = teacher.identity(source, params)
  teacher.check_identity(workdir, now, resumed=resumed, write=distributed.is_primary())
  step = f" step {source.step}" if source.step is not None else ""
  log(
    f"teacher: {source.kind} {source.path}{step}, {model.param_count(params):,} params, "
    f"fingerprint {now['fingerprint']}"
  )
  return steps.with_teacher(fns, params)
