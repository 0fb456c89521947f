"""The training loop: set up, restore or warm start, iterate, finish.

    summary = train.run(config_dict, workdir)     # a ConfigDict like configs/arithmetic.py

`run` reads top to bottom in phases; each names the module that does the work:

  Set up      `config.build` validates the ConfigDict (before anything compiles);
              `steps.functions` builds the jitted functions with their shardings.
  Restore     the latest checkpoint (`checkpoint`), or a fresh start: params (random, or
              streamed from config.hf_dir by `hf`), the supervised warm start
              (`warmstart`) and the first evaluation (`evaluation`), saved as step 0.
  Iterate     each RL iteration: draw B prompts and sample G rollouts each, dispatch the
              old/ref log-prob forwards and score rewards on the host meanwhile
              (`rollout.collect`, with DAPO dynamic sampling when on) -> advantages and
              token masks (`rl.finish_prepare`) -> plan mini-batches and run
              ppo_epochs × num_minibatches train steps as one jitted scan (`rl.update`),
              while the host draws the next prompts -> one metrics line (`logs`: JSONL
              and TensorBoard; every key defined in `metrics`) -> evaluation every
              `eval_every` iterations -> a checkpoint every `checkpoint_every`.
  Finish      wait for the last checkpoint, plot, summary.json (and `hf.export`).

What the loop carries between iterations is one `RunState`; a checkpoint holds all of it
(device arrays as the orbax "state" item, host counters as "meta"), so rerunning with the
same workdir resumes from the latest one and writes the metrics an uninterrupted run would
have (same machine and config). SIGTERM (a TPU VM preemption notice) finishes the
iteration, saves a checkpoint and returns with summary["preempted"] (the CLI exits 143).

A train step whose loss or gradient is not finite is skipped (`rl.apply_if_finite`); after
`max_nonfinite_steps` consecutive ones the run stops with `NonFiniteError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import (
  checkpoint,
  config,
  config_lib,
  controllers,
  distributed,
  evaluation,
  flops,
  hf,
  logs,
  model,
  rewards,
  rl,
  rollout,
  sharding,
  steps,
  warmstart,
)
from grpo_jax.diagnostics import hook as diagnostics_hook


class NonFiniteError(RuntimeError):
  """Too many consecutive train steps with a non-finite loss or gradient."""


@dataclasses.dataclass
class RunState:
  """What the loop carries from one iteration to the next; a checkpoint holds all of it."""

  # On device: the checkpoint's "state" item.
  train: rl.TrainState
  ref_params: Any  # The reference policy (None without a KL term).
  prep_hyper: rl.PrepareHyper  # Arrays a controller may move between iterations.
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
  wall_seconds: float = 0.0  # Of earlier sessions of this run.

  _DEVICE = ("train", "ref_params", "prep_hyper", "controller", "key")

  def tree(self) -> dict:
    out = {k: getattr(self, k) for k in self._DEVICE}
    return {**out, "key": jax.random.key_data(self.key)}

  def meta(self) -> dict:
    return {
      f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in self._DEVICE
    }

  @classmethod
  def restore(cls, tree: dict, meta: dict) -> RunState:
    return cls(**{**tree, "key": jax.random.wrap_key_data(tree["key"])}, **meta)


def run(config_dict, workdir: str | pathlib.Path, *, log=print, on_iteration=None) -> dict:
  """Warm start (or resume), then RL; writes metrics.jsonl, tb/, checkpoints/ and
  summary.json in workdir. `on_iteration(iteration, record)` is called after each
  iteration's record is written (tests use it to interrupt a run)."""
  t_start = time.perf_counter()
  log = log if distributed.is_primary() else (lambda *_: None)  # One process speaks.
  workdir = _workdir(workdir)

  # --- Set up: the config, the mesh and the compiled functions -------------------------
  setup = config.build(config_dict)
  fns = steps.functions(setup)
  loop = setup.loop
  with contextlib.ExitStack() as stack:  # Closed in reverse order, on errors too.
    ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=loop.keep_checkpoints)
    stack.callback(ckpt.close)
    pool = rewards.RewardPool(
      setup.task, workers=loop.reward_workers, timeout_s=loop.reward_timeout_s
    )
    stack.callback(pool.close)
    preempted = stack.enter_context(_sigterm_flag())

    # --- Restore the latest checkpoint, or start: init, warm start, evaluate ------------
    latest = ckpt.latest_step()
    if latest is None:
      st = _start(setup, fns, pool, log=log, preempted=preempted)
    else:
      st = RunState.restore(*ckpt.restore(latest, like=abstract_tree(setup, fns)))
      log(f"resumed from {ckpt.directory / str(latest)} (iteration {st.iteration})")
    writer = stack.enter_context(contextlib.closing(_logger(workdir, loop, resume_from=latest)))
    if latest is None:
      writer.write({"iteration": 0, "phase": "warmstart", **st.warmstart})
      ckpt.save(0, st.tree(), st.meta(), accuracy=st.warmstart["eval/greedy_accuracy"])
    log(f"warm-start accuracy {st.warmstart['eval/greedy_accuracy']:.3f}")
    if distributed.is_primary():
      (workdir / "config.json").write_text(json.dumps(config.as_dict(setup), indent=2, default=str))

    # --- Iterate -------------------------------------------------------------------------
    it_loop = _Loop.create(setup, fns, pool, workdir, st, resumed_from=latest, log=log)
    progress = stack.enter_context(contextlib.closing(_progress(loop, st)))
    for it in range(st.iteration + 1, loop.iterations + 1):
      record = it_loop.iteration(st, it)
      writer.write(record)
      progress.update(it, record)
      if on_iteration is not None:
        on_iteration(it, record)
      st.wall_seconds += time.perf_counter() - t_start
      t_start = time.perf_counter()
      if preempted["set"] or it % loop.checkpoint_every == 0 or it == loop.iterations:
        ckpt.save(it, st.tree(), st.meta(), accuracy=record.get("eval/greedy_accuracy"))
      if preempted["set"]:
        ckpt.wait()
        log(f"SIGTERM: checkpoint saved at iteration {it}; rerun the same command to resume.")
        break

    # --- Finish: the last checkpoint on disk, plot, summary ------------------------------
    progress.close()
    writer.close()
    ckpt.wait()
    st.wall_seconds += time.perf_counter() - t_start
    return _finish(setup, st, workdir, ckpt, preempted=preempted["set"])


def _workdir(workdir) -> pathlib.Path:
  if "://" in str(workdir):  # pathlib would turn gs://b/x into a local gs:/b/x.
    raise ValueError(
      f"workdir {str(workdir)!r}: URL workdirs are not written natively (the logs use "
      "Python's open); mount the bucket (e.g. gcsfuse, README 'TPU VM slices') and pass the "
      "mounted path."
    )
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  return workdir


# ----------------------------------------------------------------------------
# Start: the state of iteration 0.
# ----------------------------------------------------------------------------


def _start(setup: config.Setup, fns: steps.Functions, pool, *, log, preempted) -> RunState:
  """Initial params (random, or from config.hf_dir), the warm start, and the evaluation
  of the warm-started policy, on their shardings."""
  key = jax.random.key(setup.loop.seed)
  params = initial_params(setup, fns, jax.random.fold_in(key, 0))
  if setup.loop.warmstart_steps:
    params = warmstart.run(setup, fns, params, log=log, preempted=preempted)
  tree = jax.device_put(
    initial_tree(setup, fns, params), jax.tree.map(lambda x: x.sharding, abstract_tree(setup, fns))
  )
  eval_key = jax.random.fold_in(key, 2**31 - 1)  # No iteration's key.
  warm = evaluation.evaluate(setup, fns, pool, params, key=eval_key)
  return RunState.restore(
    tree,
    dict(warmstart=warm, last_eval=warm, best_accuracy=warm["eval/greedy_accuracy"]),
  )


def initial_params(setup: config.Setup, fns: steps.Functions, key):
  """The checkpoint's weights streamed onto their shardings (config.hf_dir), else a
  random init created in its shards."""
  if setup.loop.hf_dir:
    return hf.load_params(setup.loop.hf_dir, setup.model_cfg, shardings=fns.param_shardings)
  return sharding.init_params(fns.layout, setup.model_cfg, key)


def initial_tree(setup: config.Setup, fns: steps.Functions, params) -> dict:
  """The checkpointed pytree of a fresh run (`RunState.tree`): train state, reference
  params, the hyperparameters controllers move, controller state and the RNG key."""
  rl_cfg = setup.rl_cfg
  return {
    "train": rl.init_state(params, fns.optimizer),
    # A copy: the update donates the policy's buffers, the reference must outlive them.
    "ref_params": jax.tree.map(jnp.copy, params) if rl_cfg.use_ref else None,
    "prep_hyper": rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens),
    "controller": controllers.init_state(),
    "key": jax.random.key_data(jax.random.key(setup.loop.seed)),
  }


def abstract_tree(setup: config.Setup, fns: steps.Functions):
  """Shapes, dtypes and shardings of the checkpointed pytree, without computing it: the
  train state and reference params on their shardings, the rest replicated."""
  tree = jax.eval_shape(
    lambda k: initial_tree(setup, fns, model.init(setup.model_cfg, k)), jax.random.key(0)
  )
  shardings = {
    **jax.tree.map(lambda _: fns.layout.replicated, tree),
    "train": fns.state_shardings,
    "ref_params": fns.param_shardings if setup.rl_cfg.use_ref else None,
  }
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


# ----------------------------------------------------------------------------
# Iterate: one RL iteration.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Loop:
  """What every iteration uses and nothing changes: the run's pieces, built once."""

  setup: config.Setup
  fns: steps.Functions
  pool: Any
  diag: diagnostics_hook.Hook | None  # Token-credit diagnostics (None: off).
  controller: Any  # Moves the advantage hyperparameters between iterations.
  step_hyper: rl.StepHyper
  peak_flops: float
  prefetched: rollout.Drawn | None = None  # The next prompts, drawn during the update.

  @classmethod
  def create(cls, setup, fns, pool, workdir, st: RunState, *, resumed_from, log) -> _Loop:
    rl_cfg = setup.rl_cfg
    return cls(
      setup=setup,
      fns=fns,
      pool=pool,
      diag=diagnostics_hook.Hook.create(
        setup,
        workdir,
        params=st.train.params,
        ref_params=st.ref_params,
        resumed_from=resumed_from,
        log=log,
      ),
      controller=controllers.get(
        rl_cfg.controller, **config_lib.to_dict(rl_cfg.controller_options)
      ),
      step_hyper=rl_cfg.step_hyper(),
      peak_flops=setup.loop.peak_flops or flops.matmul_peak(),
    )

  def iteration(self, st: RunState, it: int) -> dict:
    """Collect, prepare, update and (every eval_every) evaluate; updates `st` in place and
    returns the iteration's metrics record."""
    t0 = time.perf_counter()
    it_key, data_start = jax.random.fold_in(st.key, it), st.data_index
    got = rollout.collect(
      self.setup,
      self.fns,
      self.pool,
      st.train.params,
      st.ref_params,
      index=st.data_index,
      key=jax.random.fold_in(it_key, 0),
      prefetched=self.prefetched,
    )
    st.data_index = got.next_index
    t1 = time.perf_counter()
    batch, stats = self._prepare(st, got)
    snapshot = self.diag and self.diag.before_update(
      it, st.train.params, batch, data_range=range(data_start, st.data_index)
    )
    history = self._update(st, batch, jax.random.fold_in(it_key, 1), stats)
    t2 = time.perf_counter()
    skipped = self._count_nonfinite(st, history["nonfinite"] > 0, iteration=it)
    seconds = {**got.seconds, "update": t2 - t1, "iteration": t2 - t0}
    record = self._record(it, got, stats, history, skipped, st, seconds)
    if self.diag:
      record.update(self.diag.after_update(snapshot, st.train.params, record))
    if it % self.setup.loop.eval_every == 0 or it == self.setup.loop.iterations:
      record.update(self._evaluate(st, it, jax.random.fold_in(it_key, 2)))
    st.iteration = it
    return record

  def _prepare(self, st: RunState, got: rollout.Collected):
    """Advantages, token masks and prepare metrics, once the rewards are in."""
    rl.validate_batch(
      rewards_N=got.scores.correct_N + got.scores.format_N,
      group_ids_N=distributed.host_value(got.rollouts.group_ids_N),
      group_size=self.setup.sampler_cfg.group_size,
    )
    batch, _, stats = self.fns.finish(
      got.logprobs, got.rollouts, got.scores.correct_N, got.scores.format_N, st.prep_hyper
    )
    if not got.valid_N.all():  # Dynamic-sampling fill groups: kept for shape, not trained.
      batch = batch.replace(loss_mask_NT=batch.loss_mask_NT & jnp.asarray(got.valid_N)[:, None])
    return batch, stats

  def _update(self, st: RunState, batch: rl.RolloutBatch, key, stats) -> dict:
    """The update phase (one jitted scan); the controller's move; the next prompts drawn
    while the device works. Returns the per-step metrics as host arrays [E·M]."""
    st.train, _, history = self.fns.update(st.train, batch, key, self.step_hyper)
    # The controller moves the advantage hyperparameters (arrays: no recompile).
    adv_hyper, st.controller = self.controller(st.prep_hyper.adv, st.controller, stats)
    st.prep_hyper = st.prep_hyper.replace(adv=adv_hyper)
    self.prefetched = rollout.draw(self.setup, self.fns, st.data_index)
    return jax.device_get(history)  # Blocks until the update is done.

  def _count_nonfinite(self, st: RunState, flags, *, iteration: int) -> int:
    """Skipped steps of this iteration; raises NonFiniteError at max_nonfinite_steps."""
    skipped, st.nonfinite_run = count_nonfinite(
      list(np.asarray(flags)),
      st.nonfinite_run,
      limit=self.setup.loop.max_nonfinite_steps,
      iteration=iteration,
    )
    st.nonfinite_total += skipped
    return skipped

  def _record(self, it, got, stats, history, skipped, st: RunState, seconds) -> dict:
    """The iteration's metrics line (definitions: `metrics.DEFINITIONS`)."""
    gen_batches = got.metrics.get("dynamic/gen_batches", 1)
    fl = rollout.iteration_flops(self.setup, got.rollouts, gen_batches=gen_batches)
    return {
      "iteration": it,
      "phase": "rl",
      **got.metrics,
      **{k: float(v) for k, v in stats.items()},
      **{k: float(v[-1]) for k, v in history.items()},  # The last train step's.
      "nonfinite_steps": skipped,
      "nonfinite_total": st.nonfinite_total,
      **{f"time/{k}": v for k, v in seconds.items()},
      "tokens_per_s": float(jnp.sum(got.rollouts.mask_NT)) / max(seconds["sample"], 1e-9),
      "perf/mfu": fl / seconds["iteration"] / self.peak_flops,
    }

  def _evaluate(self, st: RunState, it: int, key) -> dict:
    t0 = time.perf_counter()
    st.last_eval = evaluation.evaluate(self.setup, self.fns, self.pool, st.train.params, key=key)
    accuracy = st.last_eval["eval/greedy_accuracy"]
    if accuracy > st.best_accuracy:
      st.best_accuracy, st.best_iteration = accuracy, it
    return {**st.last_eval, "time/eval": time.perf_counter() - t0}


def count_nonfinite(flags, run: int, *, limit: int, iteration: int) -> tuple[int, int]:
  """(skipped steps among `flags`, consecutive run after them); raises at `limit`."""
  for f in flags:
    run = run + 1 if f else 0
    if run >= limit:
      raise NonFiniteError(
        f"{run} consecutive train steps had a non-finite loss or gradient (iteration "
        f"{iteration}); they were skipped, and the state is that of the last finite step. "
        "Lower learning_rate, check rewards and advantages for NaN/inf, or raise "
        "config.max_nonfinite_steps."
      )
  return int(sum(bool(f) for f in flags)), run


# ----------------------------------------------------------------------------
# Around the loop: logs, progress, signals, the summary.
# ----------------------------------------------------------------------------


def _logger(workdir, loop: config.LoopConfig, *, resume_from=None):
  """metrics.jsonl + TensorBoard on the primary process; a no-op writer elsewhere."""
  if not distributed.is_primary():
    return logs.NullLogger()
  return logs.RunLogger(workdir, resume_from=resume_from, tensorboard_dir=loop.tensorboard)


def _progress(loop: config.LoopConfig, st: RunState) -> logs.Progress:
  return logs.Progress(
    total=loop.iterations,
    start=st.iteration,
    accuracy=st.last_eval["eval/greedy_accuracy"],
    enabled=loop.progress and distributed.is_primary(),
  )


@contextlib.contextmanager
def _sigterm_flag():
  """Yields a dict whose "set" becomes True on SIGTERM (TPU VM preemption notice)."""
  flag = {"set": False}
  if threading.current_thread() is not threading.main_thread():
    yield flag  # Signal handlers can only be installed from the main thread.
    return

  def handler(signum, frame):
    del signum, frame
    flag["set"] = True

  previous = signal.signal(signal.SIGTERM, handler)
  try:
    yield flag
  finally:
    signal.signal(signal.SIGTERM, previous)


def _finish(setup: config.Setup, st: RunState, workdir, ckpt, *, preempted: bool) -> dict:
  """The plot, summary.json (and the HF export); returns the summary."""
  plot = workdir / "curves.svg"
  if distributed.is_primary():
    records = logs.read_jsonl(workdir / "metrics.jsonl")
    plot = logs.plot_svg(records, plot, title=f"{setup.task.name}: {setup.rl_cfg.advantage}")
  summary = {
    "warmstart_accuracy": st.warmstart["eval/greedy_accuracy"],
    "final_accuracy": st.last_eval["eval/greedy_accuracy"],
    "best_accuracy": st.best_accuracy,
    "best_iteration": st.best_iteration,
    "iterations_done": ckpt.latest_step() or 0,
    "preempted": preempted,
    "wall_seconds": st.wall_seconds,
    "workdir": str(workdir),
    "metrics": str(workdir / "metrics.jsonl"),
    "tensorboard": str(workdir / "tb"),
    "plot": str(plot),
    "checkpoints": str(ckpt.directory),
    **{k: v for k, v in st.last_eval.items() if k.startswith("eval/pass@")},
  }
  if setup.loop.export_hf and not preempted:
    summary["hf_export"] = str(export_hf(setup, st.train.params, workdir / "hf"))
  if distributed.is_primary():
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary


def export_hf(setup: config.Setup, params, out_dir) -> pathlib.Path:
  """The policy as a Hugging Face checkpoint (config.json, safetensors, and hf_dir's
  tokenizer files when the run started from one). Every process calls it."""
  base = hf.read_config(setup.loop.hf_dir) if setup.loop.hf_dir else None
  arch = hf.arch_of(base) if base else hf.arch_for(setup.model_cfg)
  return hf.export(
    params,
    setup.model_cfg,
    out_dir,
    arch=arch,
    dtype=setup.model_cfg.param_dtype,
    base_config=base,
    tokenizer_dir=setup.loop.hf_dir or None,
  )


def describe(summary: dict) -> str:
  """A short human summary of a run (what `grpo-jax` prints last)."""
  before, after = summary["warmstart_accuracy"], summary["final_accuracy"]
  state = "stopped by SIGTERM; rerun to resume" if summary["preempted"] else "done"
  return "\n".join(
    [
      f"{state}: {summary['iterations_done']} iterations in {summary['wall_seconds']:.0f} s.",
      f"held-out greedy accuracy: {100 * before:.1f}% after warm start -> {100 * after:.1f}% "
      f"({100 * (after - before):+.1f} points; best {100 * summary['best_accuracy']:.1f}% at "
      f"iteration {summary['best_iteration']}).",
      f"plot: {summary['plot']}",
      f"metrics: {summary['metrics']}  (definitions: grpo_jax.metrics.DEFINITIONS)",
      f"tensorboard: pip install tensorboard && tensorboard --logdir {summary['tensorboard']}",
    ]
  )
