"""The training loop: set up, restore or warm start, iterate, finish.

    summary = train.run(config_dict, workdir)     # a ConfigDict like configs/arithmetic.py

`run` reads top to bottom in phases; each names the module that does the work:

  Set up      `build.build` validates the ConfigDict (before anything compiles);
              `steps.functions` builds the jitted functions with their shardings.
  Restore     the latest checkpoint (`checkpoint`, read as a `run_state.RunState`), or a
              fresh start: params (random, or streamed from config.hf_dir by `hf`), the
              supervised warm start (`warmstart`) and the first evaluation
              (`heldout`), saved as step 0.
  Iterate     each RL iteration: draw B prompts and sample G rollouts each, dispatch the
              old/ref log-prob forwards and score rewards on the host meanwhile
              (`rollout.collect`, with DAPO dynamic sampling when on) -> advantages and
              token masks (`preparation.finish_prepare`) -> plan mini-batches and run
              ppo_epochs × num_minibatches train steps as one jitted scan (`learner.update`),
              while the host draws the next prompts -> one metrics line (`logs`: JSONL
              and TensorBoard; every key defined in `metrics`) -> evaluation every
              `eval_every` iterations -> the collapse guard (`collapse`) -> a
              checkpoint every `checkpoint_every`.
  Finish      wait for the last checkpoint, plot, summary.json (and `hf.export`).

What the loop carries between iterations is one `run_state.RunState`; a checkpoint holds all
of it (device arrays as the orbax "state" item, host counters as "meta"), so rerunning with
the same workdir resumes from the latest one and writes the metrics an uninterrupted run
would have (same machine and config). SIGTERM (a TPU VM preemption notice) finishes the
iteration, saves a checkpoint and returns with summary["preempted"] (the CLI exits 143).

A train step whose loss or gradient is not finite is skipped (`learner.apply_if_finite`); after
`max_nonfinite_steps` consecutive ones the run stops with `guards.NonFiniteError`; a state that
is not finite is never checkpointed (`run_state.save`), and a restored one is refused
(`checkpoint`). A policy that visibly collapsed stops the run with `collapse.CollapseError`,
or is logged once (config.collapse). summary["wall_seconds"] counts every session of the
run, a preempted warm start's too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax import config, schema
from grpo_jax.diagnostics import hook as diagnostics_hook
from grpo_jax.infra import (
  checkpoint,
  collapse,
  config_lib,
  devices,
  distributed,
  flops,
  logs,
  trackers,
)
from grpo_jax.models import adapters, frozen_base, hf, model
from grpo_jax.rewards import reward_sources
from grpo_jax.rl import controllers, guards, preparation, spec
from grpo_jax.trainer import build, heldout, pipeline, rollout, run_state, steps, warmstart
from grpo_jax.verifiers import reward_pool, verdicts


def run(config_dict, workdir: str | pathlib.Path, *, log=print, on_iteration=None) -> dict:
  """Warm start (or resume), then RL; writes metrics.jsonl, tb/, checkpoints/ and
  summary.json in workdir. `on_iteration(iteration, record)` is called after each
  iteration's record is written (tests use it to interrupt a run)."""
  t_start = time.perf_counter()
  log = log if distributed.is_primary() else (lambda *_: None)  # One process speaks.
  _check_url(workdir)

  # --- Set up: the config (checked before anything is written), workdir, functions -----
  setup = build.build(config_dict)
  workdir = _workdir(workdir)
  for note in [*setup.task.data_notes(), *_what_runs(setup)]:
    log(note)
  fns = steps.functions(setup)
  with contextlib.ExitStack() as stack:  # Closed in reverse order, on errors too.
    s = _Session.open(setup, fns, workdir, stack, log=log, started=t_start)

    # --- Restore the latest checkpoint, or start: init, warm start, evaluate ------------
    try:
      st, latest, buffer = _restore_or_start(s)
    except warmstart.Preempted as stop:
      return _preempted_in_warm_start(s, stop)
    fns = run_state.with_teacher(setup, fns, workdir, resumed=latest is not None, log=log)
    _record_config(setup, workdir, st, resumed_from=latest, log=log)  # May refuse.
    writer = stack.enter_context(contextlib.closing(_open_logs(s, st, resumed_from=latest)))

    # --- Iterate -------------------------------------------------------------------------
    it_loop = _Loop.create(setup, fns, s, st, resumed_from=latest, buffer=buffer, log=log)
    progress = stack.enter_context(contextlib.closing(_progress(setup.loop, st, log=log)))
    saved, preempted = st.iteration, False
    for it in range(st.iteration + 1, setup.loop.iterations + 1):
      # A failed background save stops the run one iteration after it started, at the latest.
      s.ckpt.check(block=it > saved + 1)
      record = it_loop.iteration(st, it)
      writer.write(record)
      writer.write_samples(it, it_loop.take_samples())
      writer.write_samples(it, it_loop.take_rollouts())
      progress.update(it, record)
      _watch_collapse(s, st, record)  # May stop the run (collapse.CollapseError).
      _watch_unscorable(s, it, record)
      if on_iteration is not None:
        on_iteration(it, record)
      s.tick(st)
      preempted = distributed.any_across(s.preempted["set"])  # Every process, or none.
      if preempted or it % setup.loop.checkpoint_every == 0 or it == setup.loop.iterations:
        run_state.save(
          s.ckpt, st, accuracy=record.get("eval/greedy_accuracy"), buffer=it_loop.buffer(st)
        )
        saved = it
      if preempted:
        s.ckpt.wait()
        log(f"SIGTERM: checkpoint saved at iteration {it}; rerun the same command to resume.")
        break

    # --- Finish: the last checkpoint on disk, plot, summary ------------------------------
    progress.close()
    writer.close()
    s.ckpt.wait()
    s.tick(st)
    return _finish(setup, st, workdir, s.ckpt, preempted=preempted)


def _what_runs(setup: build.Setup) -> list[str]:
  """The devices (with a warning when an accelerator is visible but JAX runs on CPU) and
  the parameters the run trains, said before anything is compiled."""
  shapes = jax.eval_shape(lambda k: model.init(setup.model_cfg, k), jax.random.key(0))
  return [*devices.describe(), adapters.parameter_line(shapes, setup.model_cfg)]


def _open_logs(s: _Session, st: run_state.RunState, *, resumed_from: int | None):
  """The metrics writer (cut back to the checkpoint on a resume). A fresh run writes the
  warm-start evaluation line and checkpoint 0, after which the warm start's own SIGTERM
  checkpoint is obsolete."""
  writer = _logger(s.workdir, s.setup, st, resume_from=resumed_from, log=s.log)
  if resumed_from is None:
    writer.write({"iteration": 0, "phase": "warmstart", **st.warmstart})
    writer.write_samples(0, s.samples)
    s.tick(st)
    op = s.setup.offpolicy
    buffer = pipeline.empty_buffer(0, data_index=st.data_index) if op.enabled else None
    run_state.save(s.ckpt, st, accuracy=st.warmstart["eval/greedy_accuracy"], buffer=buffer)
    s.ckpt.wait()
    warmstart.discard(s.workdir)  # Superseded by checkpoint 0, now on disk.
  start = "warm-start" if s.setup.loop.warmstart_steps else "initial (no warm start)"
  s.log(f"{start} accuracy {st.warmstart['eval/greedy_accuracy']:.3f}")
  return writer


class WorkdirError(ValueError):
  """The workdir is a URL or cannot be written."""


def _check_url(workdir) -> None:
  if "://" in str(workdir):  # pathlib would turn gs://b/x into a local gs:/b/x.
    raise WorkdirError(
      f"workdir {str(workdir)!r}: URL workdirs are not written natively (the logs use "
      "Python's open); mount the bucket (e.g. gcsfuse, docs/tpu.md, 'TPU VM slices') and pass the "
      "mounted path."
    )


def _workdir(workdir) -> pathlib.Path:
  """The workdir, created, after checking that files can be written in it."""
  workdir = pathlib.Path(workdir)
  try:
    workdir.mkdir(parents=True, exist_ok=True)
    probe = workdir / f".write_test.{os.getpid()}"
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise WorkdirError(f"workdir {str(workdir)!r} cannot be written: {e}.") from None
  return workdir


@dataclasses.dataclass
class _Session:
  """What one process's run holds open: checkpoints, the reward scorer (`pool`: the
  verifier pool, or the mixture of config.rewards over it; evaluations score with the
  `verifier`), the SIGTERM flag, and the clock of this session (`mark`: when its seconds
  were last added to a state)."""

  setup: build.Setup
  fns: steps.Functions
  workdir: pathlib.Path
  ckpt: checkpoint.Checkpointer
  pool: Any
  verifier: Any
  preempted: dict
  log: Any
  mark: float
  samples: list = dataclasses.field(default_factory=list)  # The first evaluation's.
  warned: dict = dataclasses.field(default_factory=dict)  # Warning kind -> last iteration.

  @classmethod
  def open(
    cls, setup, fns, workdir, stack: contextlib.ExitStack, *, log, started: float
  ) -> _Session:
    loop = setup.loop
    ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=loop.keep_checkpoints)
    stack.callback(ckpt.close)
    verifier = reward_pool.RewardPool(
      setup.task, workers=loop.reward_workers, timeout_s=loop.reward_timeout_s
    )
    stack.callback(verifier.close)
    pool = verifier
    if setup.rewards:
      run = reward_sources.Run(rules=setup.mesh_cfg.rules, hf_dir=loop.hf_dir)
      pool = reward_sources.open_mixture(setup.rewards, verifier, run=run)
      stack.callback(pool.close)
    preempted = stack.enter_context(_sigterm_flag())
    return cls(setup, fns, workdir, ckpt, pool, verifier, preempted, log, started)

  def seconds(self) -> float:
    """Seconds of this session not yet added to the run's state."""
    return time.perf_counter() - self.mark

  def tick(self, st: run_state.RunState) -> None:
    """Adds this session's seconds since the last tick to st.wall_seconds."""
    now = time.perf_counter()
    st.wall_seconds += now - self.mark
    self.mark = now


# ----------------------------------------------------------------------------
# Start: the state of iteration 0, or the latest checkpoint's.
# ----------------------------------------------------------------------------


def _restore_or_start(s: _Session) -> tuple[run_state.RunState, int | None, dict | None]:
  """(state, the checkpoint step it was restored from or None for a fresh start, that
  checkpoint's off-policy in-flight buffer or None). Under config.offpolicy a checkpoint
  whose buffer is missing or not its own is refused like a damaged one
  (`pipeline.buffer_problem`): the newest one whose buffer is whole is used."""
  abstract = run_state.abstract_tree(s.setup, s.fns)
  got = s.ckpt.restore_latest(
    like=frozen_base.stored(abstract),
    defaults=run_state.fillable_defaults(s.setup),
    log=s.log,
    check=functools.partial(pipeline.buffer_problem, enabled=s.setup.offpolicy.enabled),
  )
  if got is None:
    return _start(s), None, None
  meta = dict(got.meta)
  if filled := meta.pop("filled", None):
    s.log(f"checkpoint {got.step} predates {filled}: taken from this config.")
  if dropped := meta.pop("dropped", None):
    s.log(f"checkpoint {got.step} holds {dropped}, which this version has not: left out.")
  st = run_state.restored(s.setup, s.fns, s.workdir, got.tree, meta, abstract)
  s.setup.task.load_state(st.task_state)  # A curriculum's level (`Task.state`).
  s.log(f"resumed from {s.ckpt.directory / str(got.step)} (iteration {st.iteration})")
  return st, got.step, got.buffer


def _start(s: _Session) -> run_state.RunState:
  """Initial params (random, or from config.hf_dir), the warm start (continued from its
  SIGTERM checkpoint when there is one, whose seconds the run's start with), and the
  evaluation of the warm-started policy."""
  setup, fns = s.setup, s.fns
  key = jax.random.key(setup.loop.seed)
  params = run_state.initial_params(setup, fns, jax.random.fold_in(key, 0))
  if setup.model_cfg.lora.warm_start != "base":  # The warm start adapts the stored base.
    params = model.cast_base(params, setup.model_cfg)
  before = warmstart.seconds_before(s.workdir) if setup.loop.warmstart_steps else 0.0
  if setup.loop.warmstart_steps:
    params = warmstart.run(
      setup,
      fns,
      params,
      workdir=s.workdir,
      log=s.log,
      preempted=s.preempted,
      wall_seconds=lambda: before + s.seconds(),
    )
  params = model.cast_base(params, setup.model_cfg)  # A base the warm start trained.
  shardings = jax.tree.map(lambda x: x.sharding, run_state.abstract_tree(setup, fns))
  tree = jax.device_put(run_state.initial_tree(setup, fns, params), shardings)
  eval_key = jax.random.fold_in(key, 2**31 - 1)  # No iteration's key.
  warm, s.samples = heldout.run(setup, fns, s.verifier, params, key=eval_key)
  meta = dict(warmstart=warm, last_eval=warm, best_accuracy=warm["eval/greedy_accuracy"])
  if model.is_adapted(params):  # Kept once (workdir/base) or named (config.hf_dir).
    trained = bool(setup.loop.warmstart_steps) and setup.model_cfg.lora.warm_start == "base"
    meta["base_identity"] = frozen_base.record(
      setup, params["base"], workdir=s.workdir, trained=trained
    )
  return run_state.RunState.restore(tree, {**meta, "wall_seconds": before})


def _preempted_in_warm_start(s: _Session, stop: warmstart.Preempted) -> dict:
  """SIGTERM during the warm start: its state is in workdir/warmstart (`warmstart.run`)."""
  s.log(str(stop))
  summary = {"preempted": True, "iterations_done": 0, "warmstart_step": stop.step}
  summary |= {"workdir": str(s.workdir), "wall_seconds": stop.wall_seconds}
  if distributed.is_primary():
    (s.workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary


# Loop keys that may change on resume without changing what is trained (the extent of the
# run, logging, resources): `on_config_change = "refuse"` does not refuse these, nor any
# config.collapse key (the guard only watches) nor config.logging key (where metrics go).
HOUSEKEEPING_KEYS = (
  "iterations",
  "eval_every",
  "eval_size",
  "eval_samples",
  "checkpoint_every",
  "keep_checkpoints",
  "reward_workers",
  "reward_timeout_s",
  "peak_flops",
  "memory_limit_gib",
  "export_hf",
  "progress",
  "tensorboard",
  "on_config_change",
)
HOUSEKEEPING_SECTIONS = ("collapse.", "logging.", "eval.")  # Every key under these, too.


def _without(d: dict, key: str) -> dict:
  """`d` less a top-level key (config.json's "variants_from": where the run's variants were
  registered, provenance rather than config: a module re-imported by name is recorded under
  that name, not as __main__)."""
  return {k: v for k, v in d.items() if k != key}


# (dotted key, old, new) of every key two recorded configs differ in (`config.changes`).
config_changes = config.changes


def _record_config(
  setup: build.Setup, workdir: pathlib.Path, st: run_state.RunState, *, resumed_from, log
) -> None:
  """config.json is this session's config and config_history.jsonl keeps every session's
  (the iteration it resumed from, and the config); st.config, saved in each checkpoint,
  becomes this session's. A resume under a config other than the one that wrote the
  checkpoint logs the changes, or refuses with on_config_change = "refuse" (housekeeping
  keys aside), before anything in the workdir is touched."""
  now = json.loads(json.dumps(build.as_dict(setup), default=str))
  previous = workdir / "config.json"
  before = st.config or (json.loads(previous.read_text()) if previous.exists() else None)
  if before is not None:  # Recorded before keys moved: compared at their new place.
    before = config_lib.upgrade(before, warn=False)
  if resumed_from is not None and before is not None:
    changes = config_changes(_without(before, "variants_from"), _without(now, "variants_from"))
    if changes:
      text = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changes)
      real = [
        k
        for k, _, _ in changes
        if k.split(".")[-1] not in HOUSEKEEPING_KEYS and not k.startswith(HOUSEKEEPING_SECTIONS)
      ]
      if real and setup.loop.on_config_change == "refuse":
        raise config_lib.ConfigError(
          f"The checkpoint in {workdir} was made with another config; refusing to resume "
          f"(config.on_config_change='refuse'). Changes: {text}."
        )
      log(f"resuming from iteration {resumed_from} with a changed config: {text}")
  st.config = now
  if distributed.is_primary():
    previous.write_text(json.dumps(now, indent=2))
    with (workdir / "config_history.jsonl").open("a") as f:
      f.write(json.dumps({"from_iteration": resumed_from or 0, "config": now}) + "\n")


# ----------------------------------------------------------------------------
# Iterate: one RL iteration.
# ----------------------------------------------------------------------------


# The timed phases of an iteration, disjoint in time: time/host is time/iteration less
# their sum (the host glue between them; metrics.DEFINITIONS).
PHASES = ("sample", "reward", "counterfactuals", "env", "prepare", "update")


@dataclasses.dataclass
class _Loop:
  """What every iteration uses and nothing changes: the run's pieces, built once."""

  setup: build.Setup
  fns: steps.Functions
  pool: Any  # The training batches' scorer (`_Session.pool`).
  verifier: Any  # The evaluations' (`_Session.verifier`).
  diag: diagnostics_hook.Hook | None  # Token-credit diagnostics (None: off).
  controller: Any  # Moves the advantage hyperparameters between iterations.
  step_hyper: spec.StepHyper
  peak_flops: float
  prefetched: rollout.Drawn | None = None  # The next prompts, drawn during the update.
  source: pipeline.Source | None = None  # The off-policy pipeline (config.offpolicy).
  samples: list = dataclasses.field(default_factory=list)  # The last evaluation's.
  rollout_rows: list = dataclasses.field(default_factory=list)  # The last shown training group.

  @classmethod
  def create(
    cls, setup, fns, s: _Session, st: run_state.RunState, *, resumed_from, buffer, log
  ) -> _Loop:
    rl_cfg = setup.rl_cfg
    return cls(
      setup=setup,
      fns=fns,
      pool=s.pool,
      verifier=s.verifier,
      diag=diagnostics_hook.Hook.create(
        setup,
        s.workdir,
        params=st.train.params,
        ref_params=st.reference(),
        resumed_from=resumed_from,
        log=log,
      ),
      controller=controllers.REGISTRY.make(
        rl_cfg.controller, **config_lib.to_dict(rl_cfg.controller_options)
      ),
      step_hyper=rl_cfg.step_hyper(),
      peak_flops=setup.loop.peak_flops or flops.run_peak(),
      source=pipeline.Source.create(setup, fns, s.pool, buffer=buffer)
      if setup.offpolicy.enabled
      else None,
    )

  def buffer(self, st: run_state.RunState) -> dict | None:
    """The off-policy pipeline's in-flight buffer for checkpoint st.iteration (None without
    the pipeline)."""
    if self.source is None:
      return None
    return self.source.buffer(st.iteration, data_index=st.data_index)

  def iteration(self, st: run_state.RunState, it: int) -> dict:
    """Collect, prepare, update and (every eval_every) evaluate; updates `st` in place and
    returns the iteration's metrics record."""
    t0 = time.perf_counter()
    it_key, data_start = jax.random.fold_in(st.key, it), st.data_index
    got = self._collect(st, it, it_key)
    st.data_index = got.next_index
    t1 = time.perf_counter()
    batch, stats = jax.block_until_ready(self._prepare(st, got))
    t_prepared = time.perf_counter()
    every = self.setup.tracking.rollouts_every
    if every and it % every == 0:
      groups = self.setup.tracking.rollouts_groups
      self.rollout_rows = heldout.training_rows(self.setup, got, batch, groups=groups)
    snapshot = self.diag and self.diag.before_update(
      it, st.train.params, batch, data_range=range(data_start, st.data_index)
    )
    # A curriculum moves after the diagnostics re-drew this batch's problems, and before
    # the update prefetches the next prompts (`Task.observe`).
    task_metrics = self.setup.task.observe(stats["pass_rate"], outcomes=got.scores.outcomes)
    st.task_state = self.setup.task.state()
    history = self._update(st, batch, jax.random.fold_in(it_key, 1), stats)
    t2 = time.perf_counter()
    skipped = self._count_nonfinite(st, history["nonfinite"] > 0, iteration=it)
    seconds = {
      **got.seconds,
      "prepare": t_prepared - t1,
      "update": t2 - t_prepared,
      "iteration": t2 - t0,
    }
    seconds["host"] = seconds["iteration"] - sum(seconds[k] for k in PHASES if k in seconds)
    record = {**self._record(it, got, stats, history, skipped, st, seconds), **task_metrics}
    if self.diag:
      record.update(self.diag.after_update(snapshot, st.train.params, record))
    if it % self.setup.loop.eval_every == 0 or it == self.setup.loop.iterations:
      record.update(self._evaluate(st, it, jax.random.fold_in(it_key, 2)))
    st.iteration = it
    return record

  def _collect(self, st: run_state.RunState, it: int, it_key) -> rollout.Collected:
    """The iteration's scored batch: sampled now by the current params, or taken from the
    off-policy pipeline (sampled by older params while earlier updates ran)."""
    if self.source is not None:
      return self.source.take(st, it)
    return rollout.collect(
      self.setup,
      self.fns,
      self.pool,
      st.train.params,
      st.reference(),
      index=st.data_index,
      key=jax.random.fold_in(it_key, 0),
      prefetched=self.prefetched,
    )

  def _prepare(self, st: run_state.RunState, got: rollout.Collected):
    """Advantages, token masks and prepare metrics, once the rewards are in."""
    verdicts.check_failures(
      ~got.scores.scorable_N,
      got.scores.messages,
      limit=self.setup.loop.max_unscorable_frac,
      where="the training batch",
    )
    guards.validate_batch(
      rewards_N=got.scores.correct_N + got.scores.format_N,
      group_ids_N=distributed.host_value(got.rollouts.group_ids_N),
      group_size=self.setup.train_group,
    )
    s = got.scores
    batch, _, stats = self.fns.rl.finish(
      got.logprobs,
      got.rollouts,
      s.correct_N,
      s.format_N,
      st.prep_hyper,
      s.scorable_N,
      got.valid_N,
      got.provenance,
    )
    cf = self.fns.counterfactual
    if cf is not None and cf.samples is not None:  # Counterfactuals that only informed φ leave.
      batch = cf.samples(batch)
    return batch, stats

  def _update(self, st: run_state.RunState, batch: spec.RolloutBatch, key, stats) -> dict:
    """The update phase (one jitted scan); the controller's move; the next prompts drawn
    while the device works. Returns the per-step metrics as host arrays [E·M]."""
    st.train, _, history = self.fns.rl.update(st.train, batch, key, self.step_hyper)
    # The controller moves the advantage hyperparameters (arrays: no recompile).
    adv_hyper, st.controller = self.controller(st.prep_hyper.adv, st.controller, stats)
    st.prep_hyper = st.prep_hyper.replace(adv=adv_hyper)
    if self.source is not None:  # Score the batches sampled before the update, meanwhile.
      self.source.while_updating()
    else:
      self.prefetched = rollout.draw(self.setup, self.fns, st.data_index)
    return jax.device_get(history)  # Blocks until the update is done.

  def _count_nonfinite(self, st: run_state.RunState, flags, *, iteration: int) -> int:
    """Skipped steps of this iteration; raises guards.NonFiniteError at max_nonfinite_steps."""
    skipped, st.nonfinite_run = guards.count_nonfinite(
      list(np.asarray(flags)),
      st.nonfinite_run,
      limit=self.setup.loop.max_nonfinite_steps,
      where=f"iteration {iteration}",
    )
    st.nonfinite_total += skipped
    return skipped

  def _record(self, it, got, stats, history, skipped, st: run_state.RunState, seconds) -> dict:
    """The iteration's metrics line (definitions: `metrics.DEFINITIONS`)."""
    gen_batches = got.metrics.get("dynamic/gen_batches", 1)
    fl = rollout.phase_flops(self.setup, got.rollouts, gen_batches=gen_batches)
    tokens = float(jnp.sum(got.rollouts.mask_NT))  # Replicated: every process can read it.
    actions = tokens  # The policy's own tokens; episodes leave their observations out.
    if got.rollouts.action_mask_NT is not None:
      actions = float(jnp.sum(preparation.action_view(got.rollouts).mask_NT))
    return {
      "iteration": it,
      "phase": "rl",
      **got.metrics,
      **{k: float(v) for k, v in stats.items()},
      **{k: float(v[-1]) for k, v in history.items()},  # The last train step's.
      "nonfinite_steps": skipped,
      "nonfinite_total": st.nonfinite_total,
      **{f"time/{k}": v for k, v in seconds.items()},
      # Episodes count their refill slots' row-columns in num_steps themselves.
      **rollout.padding(
        got.rollouts,
        tokens=tokens,
        slots=0 if self.setup.episodes else self.setup.sampler_cfg.refill_slots,
      ),
      "tokens_per_s": actions / max(seconds["sample"], 1e-9),
      "perf/mfu": sum(fl.values()) / seconds["iteration"] / self.peak_flops,
      "perf/mfu_sample": fl["sample"] / max(seconds["sample"], 1e-9) / self.peak_flops,
      "perf/mfu_update": fl["update"] / max(seconds["update"], 1e-9) / self.peak_flops,
    }

  def take_samples(self) -> list[dict]:
    """The greedy samples of this iteration's evaluation ([] without one), once."""
    out, self.samples = self.samples, []
    return out

  def take_rollouts(self) -> list[dict]:
    """This iteration's shown training rows (`heldout.training_rows`; [] when it shows
    none: config.logging.rollouts_every), once."""
    out, self.rollout_rows = self.rollout_rows, []
    return out

  def _evaluate(self, st: run_state.RunState, it: int, key) -> dict:
    t0 = time.perf_counter()
    st.last_eval, self.samples = heldout.run(
      self.setup, self.fns, self.verifier, st.train.params, key=key
    )
    accuracy = st.last_eval["eval/greedy_accuracy"]
    if accuracy > st.best_accuracy:
      st.best_accuracy, st.best_iteration = accuracy, it
    return {**st.last_eval, "time/eval": time.perf_counter() - t0}


# ----------------------------------------------------------------------------
# Around the loop: the collapse guard, logs, progress, signals, the summary.
# ----------------------------------------------------------------------------


def _watch_collapse(s: _Session, st: run_state.RunState, record: dict) -> None:
  """`collapse.observe` on the iteration's record. A signal raises collapse.CollapseError
  (action "stop") or is logged once and kept for the summary (action "warn"); its line
  names the newest checkpoint on disk from before the collapse began."""
  setup = s.setup
  op = setup.offpolicy
  st.collapse_guard, found = collapse.observe(
    st.collapse_guard,
    record,
    cfg=setup.collapse,
    rows=setup.loop.prompts_per_step * setup.sampler_cfg.group_size,
    solved_at_start=st.warmstart["eval/greedy_accuracy"] * setup.loop.eval_size,
    lag=1 + (op.max_staleness if op.enabled else 0),
  )
  if found is None:
    return
  before = [k for k in s.ckpt.all_steps() if k <= found.healthy]
  where = f"{s.ckpt.directory / str(before[-1])} (iteration {before[-1]})" if before else None
  line = collapse.message(found, checkpoint=where, action=setup.collapse.action)
  if setup.collapse.action == "stop":
    raise collapse.CollapseError(line)
  s.log(f"warning: {line}")
  warnings = st.collapse_guard.get("warnings", [])
  st.collapse_guard = {**st.collapse_guard, "warnings": [*warnings, line]}


def _watch_unscorable(s: _Session, it: int, record: dict) -> None:
  """Logs `verdicts.unscorable_warning` when the iteration's unscorable share passes
  config.warn_unscorable_frac: on the first such iteration, then at most every 10th."""
  line = verdicts.unscorable_warning(record, limit=s.setup.loop.warn_unscorable_frac)
  last = s.warned.get("unscorable")
  if line and (last is None or it - last >= _WARN_EVERY):
    s.log(f"warning: iteration {it}: {line}")
    s.warned["unscorable"] = it


_WARN_EVERY = 10  # Iterations between two warnings of the same kind.


def _logger(workdir, setup: build.Setup, st: run_state.RunState, *, resume_from=None, log=print):
  """metrics.jsonl, TensorBoard and the trackers of config.logging (W&B, MLflow, which log
  the run's config once) on the primary process; a no-op writer elsewhere."""
  if not distributed.is_primary():
    return logs.NullLogger()
  tracking = setup.tracking
  external = trackers.open_trackers(
    tracking, workdir, config=st.config, resumed=resume_from is not None, log=log
  )
  return logs.RunLogger(
    workdir,
    resume_from=resume_from,
    tensorboard_dir=setup.loop.tensorboard and "tensorboard" in tracking.trackers,
    trackers=external,
  )


def _progress(loop: schema.LoopConfig, st: run_state.RunState, *, log) -> logs.Progress:
  """A bar on a terminal or in a notebook; elsewhere a line every 30 s through `log`."""
  return logs.Progress(
    total=loop.iterations,
    start=st.iteration,
    accuracy=st.last_eval["eval/greedy_accuracy"],
    enabled=loop.progress and distributed.is_primary(),
    desc="RL iteration",
    log=log,
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


def _finish(setup: build.Setup, st: run_state.RunState, workdir, ckpt, *, preempted: bool) -> dict:
  """The plot, summary.json (and the HF export); returns the summary."""
  plot = workdir / "curves.svg"
  if distributed.is_primary():
    records = logs.read_jsonl(workdir / "metrics.jsonl")
    plot = logs.plot_svg(records, plot, title=f"{setup.task.name}: {setup.rl_cfg.advantage}")
  summary = {
    "warmstart_steps": setup.loop.warmstart_steps,
    "warmstart_accuracy": st.warmstart["eval/greedy_accuracy"],
    "final_accuracy": st.last_eval["eval/greedy_accuracy"],
    **_with_interval("warmstart", st.warmstart),
    **_with_interval("final", st.last_eval),
    "best_accuracy": st.best_accuracy,
    "best_iteration": st.best_iteration,
    "iterations_done": ckpt.latest_step() or 0,
    "preempted": preempted,
    "wall_seconds": st.wall_seconds,
    "workdir": str(workdir),
    "metrics": str(workdir / "metrics.jsonl"),
    "tensorboard": str(workdir / "tb"),
    "samples": str(workdir / logs.SAMPLES),
    "plot": str(plot),
    "checkpoints": str(ckpt.directory),
    "collapse_warnings": st.collapse_guard.get("warnings", []),
    **{k: v for k, v in st.last_eval.items() if k.startswith("eval/pass@")},
  }
  if setup.loop.export_hf and not preempted:
    summary["hf_export"] = str(export_hf(setup, st.train.params, workdir / "hf"))
  if distributed.is_primary():
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary


def _with_interval(name: str, record: dict) -> dict:
  """{name_accuracy_ci: [low, high], name_problems: n} of an evaluation record; {} for a
  record written before evaluations carried them (a resumed older run)."""
  keys = ("eval/greedy_accuracy_low", "eval/greedy_accuracy_high", "eval/problems")
  if not all(k in record for k in keys):
    return {}
  low, high, n = (record[k] for k in keys)
  out = {f"{name}_accuracy_ci": [low, high], f"{name}_problems": n}
  if "eval/distinct_problems" in record:
    out[f"{name}_distinct_problems"] = record["eval/distinct_problems"]
  return out


def export_hf(setup: build.Setup, params, out_dir) -> pathlib.Path:
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
  if "warmstart_step" in summary:
    return (
      f"stopped by SIGTERM during the warm start at step {summary['warmstart_step']} (saved "
      f"under {summary['workdir']}/warmstart); rerun the same command to continue."
    )
  before, after = summary["warmstart_accuracy"], summary["final_accuracy"]
  state = "stopped by SIGTERM; rerun to resume" if summary["preempted"] else "done"
  start = "after warm start" if summary.get("warmstart_steps", 1) else "at the start"
  n, d = summary.get("final_problems"), summary.get("final_distinct_problems")
  on = f" on {n} problems" if n else ""
  on += f" ({d} distinct)" if n and d and d < n else ""
  return "\n".join(
    [
      f"{state}: {summary['iterations_done']} iterations in {summary['wall_seconds']:.0f} s.",
      *(f"warning: {line}" for line in summary.get("collapse_warnings", [])),
      f"held-out greedy accuracy{on}: {_percent(before, summary.get('warmstart_accuracy_ci'))} "
      f"{start} -> {_percent(after, summary.get('final_accuracy_ci'))} "
      f"({100 * (after - before):+.1f} points; best {100 * summary['best_accuracy']:.1f}% at "
      f"iteration {summary['best_iteration']}).",
      f"plot: {summary['plot']}",
      *([f"samples: {summary['samples']}"] if "samples" in summary else []),
      f"metrics: {summary['metrics']}  (definitions: grpo_jax.infra.metrics.DEFINITIONS)",
      f"tensorboard: pip install tensorboard && tensorboard --logdir {summary['tensorboard']}",
    ]
  )


def _percent(value: float, ci=None) -> str:
  """'51.6%', or with an interval '51.6% (95% CI 43.0-60.2)'."""
  text = f"{100 * value:.1f}%"
  return text if ci is None else f"{text} (95% CI {100 * ci[0]:.1f}-{100 * ci[1]:.1f})"
