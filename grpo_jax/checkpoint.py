"""Checkpoints: an orbax CheckpointManager holding a pytree of arrays plus JSON metadata.

    ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=3)
    ckpt.save(step, tree, meta, accuracy=0.41)     # async; returns at once
    tree, meta = ckpt.restore(ckpt.latest_step(), like=tree)

Each step directory holds two items: `state` (any pytree of arrays, e.g. the train state,
RNG key data, controller state; written with orbax StandardSave) and `meta` (a JSON dict:
loop counters, data position, best accuracy). Preservation keeps the `keep` most recent
steps plus, when `keep_best`, the step with the highest `accuracy` passed to `save`
(orbax LatestN ∪ BestN). Saves are asynchronous: device arrays are copied to host before
`save` returns, and files are written in a background thread (`wait()` joins it).

Restoring into a pytree whose shapes or structure differ from the checkpoint's (a changed
model config under the same workdir) raises `CheckpointMismatchError`, which names the
differing leaves, before orbax reads any array.

Faults (`restore_latest`, `check`):
- Once a save has finished, the primary process writes `<step>/grpo_jax_files.json`, the
  size of every file of the step. On restore the files are checked against it first, so a
  truncated or missing file is found before orbax reads anything (a failed orbax read
  leaves TensorStore reads in flight, which print tracebacks as they land).
- A checkpoint that cannot be read (truncated or missing files, an empty step directory,
  missing metadata) is named in one log line with the reason, moved out of the way to
  `<directory>.bad/<step>` (never deleted: it may hold what someone wants to inspect),
  and the next older one is tried. Only when no checkpoint restores does restoring fail:
  with the mismatch (a changed config) when every checkpoint disagrees with the config,
  else with each step and its reason.
- A background save that failed (disk full, permissions) is raised by `check()` as one
  `CheckpointSaveError` naming the directory and the cause; orbax finalises a step (and
  only then applies keep-N retention) after all its files are written, so the previous
  checkpoint stays valid.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import serialization
from jax.experimental import multihost_utils

ACCURACY_KEY = "accuracy"


class CheckpointMismatchError(ValueError):
  """The checkpoint's tree does not match the tree it is restored into."""


class CheckpointDamagedError(RuntimeError):
  """A checkpoint's files are not those that were written."""


class CheckpointSaveError(RuntimeError):
  """A checkpoint could not be written (e.g. disk full); the previous one is intact."""


class NoValidCheckpointError(RuntimeError):
  """Checkpoints exist but none of them can be restored."""


def _first_line(e: BaseException) -> str:
  """The innermost cause of e, as one short line."""
  while e.__cause__ is not None or (e.__context__ is not None and not e.__suppress_context__):
    e = e.__cause__ or e.__context__
  lines = str(e).strip().splitlines()
  text = f"{type(e).__name__}: {lines[0] if lines else ''}"
  # TensorStore puts the cause (e.g. "File too large") at the end of a long line of paths.
  return text if len(text) <= 400 else f"{text[:150]} ... {text[-240:]}"


# What TensorStore/orbax say about files that are missing or not what was written.
_UNREADABLE_CODES = ("NOT_FOUND", "DATA_LOSS", "Encountered error while reading", "corrupt")


def unreadable(e: BaseException) -> bool:
  """Whether a restore failure means the checkpoint's files are missing, damaged or do not
  match the config (then an older checkpoint is tried), as opposed to a failure of this
  machine (out of memory, a storage outage), which is raised as it is."""
  if isinstance(e, CheckpointDamagedError | CheckpointMismatchError | FileNotFoundError):
    return True
  if isinstance(e, KeyError | json.JSONDecodeError):  # Missing or cut metadata.
    return True
  text = _first_line(e) + str(e)[:2000]
  return isinstance(e, ValueError | OSError) and any(c in text for c in _UNREADABLE_CODES)


def _reason(e: BaseException) -> str:
  return str(e) if isinstance(e, CheckpointDamagedError) else _first_line(e)


MANIFEST = "grpo_jax_files.json"


def _files(step_dir: pathlib.Path) -> dict[str, int]:
  """{relative path: size} of every file under step_dir but the manifest."""
  return {
    str(p.relative_to(step_dir)): p.stat().st_size
    for p in sorted(step_dir.rglob("*"))
    if p.is_file() and p.name != MANIFEST
  }


def damage(step_dir: pathlib.Path) -> str | None:
  """Why step_dir cannot hold a whole checkpoint (files missing or of another size than
  when written, or no files at all), or None when nothing is known to be wrong."""
  if not any(p.is_file() for p in step_dir.rglob("*")):
    return "the step directory holds no files"
  manifest = step_dir / MANIFEST
  if not manifest.exists():
    return None  # Written before manifests, or killed between commit and manifest.
  written, now = json.loads(manifest.read_text()), _files(step_dir)
  for name, size in written.items():
    if name not in now:
      return f"{name} is missing"
    if now[name] != size:
      return f"{name} has {now[name]} bytes, {size} when written"
  return None


def _path_str(path) -> str:
  return jax.tree_util.keystr(path, simple=True, separator="/")


def _shapes(tree) -> dict[str, tuple]:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {_path_str(p): tuple(np.shape(x)) for p, x in flat}


def _metadata_shapes(meta_tree) -> dict[str, tuple]:
  flat, _ = jax.tree_util.tree_flatten_with_path(
    meta_tree, is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict)
  )
  return {_path_str(p): tuple(x.shape) for p, x in flat if hasattr(x, "shape")}


def _mismatches(saved: dict[str, tuple], wanted: dict[str, tuple]) -> list[str]:
  out = [
    f"{k}: in checkpoint {saved[k]}, in config {wanted[k]}"
    for k in wanted
    if k in saved and saved[k] != wanted[k]
  ]
  out += [f"{k}: missing from the checkpoint" for k in wanted if k not in saved]
  out += [f"{k}: in the checkpoint only" for k in saved if k not in wanted]
  return out


def _without(tree: dict, paths: list[str]) -> dict:
  """A nested state dict without the leaves at "a/b/c" paths (emptied containers stay)."""
  out = jax.tree.map(lambda x: x, tree)
  for path in paths:
    *parents, leaf = path.split("/")
    node = out
    for p in parents:
      node = node[p]
    del node[leaf]
  return out


def _merge(base: dict, over: dict) -> dict:
  """base with every leaf that `over` holds replaced by over's (nested state dicts)."""
  if not isinstance(base, dict):
    return over
  return {k: _merge(v, over[k]) if k in over else v for k, v in base.items()}


class Checkpointer:
  """Save / restore (pytree, meta) pairs under one directory, keeping last N plus best."""

  def __init__(
    self,
    directory: str | pathlib.Path,
    *,
    keep: int = 3,
    keep_best: bool = True,
    async_save: bool = True,
  ):
    if keep < 1:
      raise ValueError(f"checkpoint keep must be >= 1, got {keep}.")
    policies = [ocp.checkpoint_managers.LatestN(n=keep)]
    if keep_best:
      policies.append(
        ocp.checkpoint_managers.BestN(
          get_metric_fn=lambda m: m[ACCURACY_KEY], n=1, keep_checkpoints_without_metrics=False
        )
      )
    options = ocp.CheckpointManagerOptions(
      # best_fn makes orbax write each step's metrics to disk, so a resumed process still
      # knows which earlier step is best (the preservation policy alone keeps them in memory).
      best_fn=(lambda m: m[ACCURACY_KEY]) if keep_best else None,
      preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
      enable_async_checkpointing=async_save,
      create=True,
    )
    self.directory = pathlib.Path(directory).absolute()
    self._unlisted: int | None = None  # A step saved whose file manifest is not written yet.
    # Handlers are named up front so that a fresh manager (a resumed run) can read the
    # metadata of existing steps before any save or restore.
    self._mngr = ocp.CheckpointManager(
      self.directory,
      item_handlers={
        "state": ocp.StandardCheckpointHandler(),
        "meta": ocp.JsonCheckpointHandler(),
      },
      options=options,
    )

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def restore_latest(
    self, *, like: Any, defaults: dict | None = None, log=print
  ) -> tuple[int, Any, dict] | None:
    """(step, tree, meta) of the newest checkpoint that restores, or None when there is
    none (`defaults` as in `restore`). Unreadable checkpoints on the way (`unreadable`) are logged and moved to
    `<directory>.bad`; any other failure (e.g. out of memory) is raised as it is."""
    failures: list[tuple[int, BaseException]] = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        if (why := damage(self.directory / str(step))) is not None:
          raise CheckpointDamagedError(why)
        tree, meta = self.restore(step, like=like, defaults=defaults)
      except Exception as e:
        if not unreadable(e):
          raise
        failures.append((step, e))
        continue
      self._set_aside_all(failures, resumed=step, log=log)
      return step, tree, meta
    if not failures:
      return None
    if all(isinstance(e, CheckpointMismatchError) for _, e in failures):
      raise failures[0][1]  # Every checkpoint disagrees with the config: it changed.
    reasons = "; ".join(f"step {s}: {_reason(e)}" for s, e in failures)
    raise NoValidCheckpointError(
      f"No checkpoint under {self.directory} can be restored ({reasons}). Move the directory "
      "aside to start the run again."
    )

  def _set_aside_all(self, failures, *, resumed: int, log) -> None:
    """Moves the unreadable steps aside: the primary process moves, every process waits
    for it (the directory is shared) and then rereads the step list."""
    if not failures:
      return
    for bad, e in failures:
      moved = self._set_aside(bad) if jax.process_index() == 0 else None
      log(
        f"checkpoint {self.directory / str(bad)} is unreadable ({_reason(e)}); moved to "
        f"{moved or self.directory.name + '.bad'}; resuming from step {resumed}."
      )
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("grpo_jax_checkpoint_set_aside")
    self._mngr.reload()

  def _set_aside(self, step: int) -> pathlib.Path | None:
    """Moves step's directory to <directory>.bad/<step>[.k] and returns the new path (None
    if it is gone already)."""
    source = self.directory / str(step)
    if not source.exists():
      return None
    bad_dir = self.directory.with_name(self.directory.name + ".bad")
    bad_dir.mkdir(parents=True, exist_ok=True)
    target, k = bad_dir / str(step), 0
    while target.exists():
      k += 1
      target = bad_dir / f"{step}.{k}"
    shutil.move(str(source), str(target))
    return target

  def _save_error(self, e: BaseException) -> CheckpointSaveError:
    return CheckpointSaveError(
      f"Saving a checkpoint under {self.directory} failed ({_first_line(e)}). The previous "
      "checkpoint is intact: fix the cause (e.g. free disk space) and rerun to resume from it."
    )

  def check(self, *, block: bool = False) -> None:
    """Raises CheckpointSaveError if the last background save failed. While one is still
    being written it returns at once, or with `block` waits for it first."""
    if block or not self._save_running():
      self.wait()

  def _save_running(self) -> bool:
    """Whether orbax's background save (its finalize thread) is still running. Its
    `is_saving_in_progress` stays True after a failed save, so the thread is asked."""
    thread = getattr(self._mngr, "_finalize_thread", None)
    if thread is None or not hasattr(thread, "map"):  # Another orbax version.
      return self._mngr.is_saving_in_progress()
    return bool(thread.map(lambda t: t is not None and t.is_alive()))

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, tree: Any, meta: dict, *, accuracy: float | None = None) -> None:
    """Starts an async save of `tree` (arrays) and `meta` (JSON) as checkpoint `step`
    (after the previous save has finished: its failure raises CheckpointSaveError)."""
    self.wait()
    metrics = None if accuracy is None else {ACCURACY_KEY: float(accuracy)}
    self._unlisted = step
    try:
      self._mngr.save(
        step,
        args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
        metrics=metrics,
        force=True,
      )
    except (OSError, ValueError) as e:  # The write failed (TensorStore raises ValueError).
      self._unlisted = None
      raise self._save_error(e) from e

  def restore(self, step: int, *, like: Any, defaults: dict | None = None) -> tuple[Any, dict]:
    """(tree, meta) of checkpoint `step`, restored with the structure, shapes, dtypes and
    shardings of `like` (arrays or jax.ShapeDtypeStruct).

    `defaults` ({top-level key of like: a subtree holding values}) fills the leaves under
    those keys that a checkpoint lacks because it was written before they existed (a
    hyperparameter added by a newer grpo_jax): they take the default's value and are
    listed in meta["filled"]. Any other difference is a CheckpointMismatchError."""
    missing = self.check_compatible(step, like=like, fillable=tuple(defaults or ()))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    for key in {m.split("/")[0] for m in missing}:  # Those subtrees as dicts, less the missing.
      inner = [m.split("/", 1)[1] for m in missing if m.startswith(key + "/")]
      abstract = {**abstract, key: _without(serialization.to_state_dict(abstract[key]), inner)}
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    tree, meta = out["state"], dict(out["meta"])
    for key in {m.split("/")[0] for m in missing}:
      merged = _merge(serialization.to_state_dict(defaults[key]), tree[key])
      tree = {**tree, key: serialization.from_state_dict(defaults[key], merged)}
    if missing:
      meta["filled"] = missing
    return tree, meta

  def check_compatible(self, step: int, *, like: Any, fillable: tuple[str, ...] = ()) -> list[str]:
    """Raises CheckpointMismatchError naming the leaves whose shapes or paths differ. Leaves
    only missing from the checkpoint under a `fillable` top-level key are returned instead
    (to be filled from defaults), as long as nothing else differs."""
    saved = _metadata_shapes(self._mngr.item_metadata(step)["state"])
    wanted = _shapes(like)
    bad = _mismatches(saved, wanted)
    missing = [k for k in wanted if k not in saved and k.split("/")[0] in fillable]
    if missing and len(bad) == len(missing):
      return missing
    if bad:
      shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
      raise CheckpointMismatchError(
        f"The checkpoint at {self.directory / str(step)} does not match this config "
        f"({len(bad)} differences):\n  {shown}\n"
        "It was written by a run with another model/optimizer config. Resume with the same "
        "config, or use a new --workdir."
      )
    return []

  def wait(self) -> None:
    """Waits for the background save; raises CheckpointSaveError if it failed."""
    try:
      self._mngr.wait_until_finished()
    except (OSError, ValueError) as e:  # The write failed (TensorStore raises ValueError).
      self._unlisted = None
      raise self._save_error(e) from e
    step, self._unlisted = self._unlisted, None
    step_dir = self.directory / str(step)
    if step is not None and step_dir.is_dir() and jax.process_index() == 0:
      (step_dir / MANIFEST).write_text(json.dumps(_files(step_dir), indent=1))

  def close(self) -> None:
    """Waits for the last save (CheckpointSaveError if it failed), then closes orbax."""
    try:
      self.wait()
    except CheckpointSaveError:
      with contextlib.suppress(Exception):  # The failure is the one just raised.
        self._mngr.close()
      raise
    self._mngr.close()
