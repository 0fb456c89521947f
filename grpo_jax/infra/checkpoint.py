"""Checkpoints: an orbax CheckpointManager holding a pytree of arrays plus JSON metadata.

    ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=3)
    ckpt.save(step, tree, meta, accuracy=0.41)     # async; returns at once
    tree, meta = ckpt.restore(ckpt.latest_step(), like=tree)
    got = ckpt.restore_latest(like=tree)           # the newest whole one (`Restored`)

Each step directory holds two items: `state` (any pytree of arrays, e.g. the train state,
RNG key data, controller state; written with orbax StandardSave) and `meta` (a JSON dict:
loop counters, data position, best accuracy). Preservation keeps the `keep` most recent
steps plus, when `keep_best`, the step with the highest `accuracy` passed to `save`
(orbax LatestN ∪ BestN). Saves are asynchronous: device arrays are copied to host before
`save` returns, and files are written in a background thread (`wait()` joins it).

Restoring into a pytree whose shapes or structure differ from the checkpoint's (a changed
model config under the same workdir) raises `CheckpointMismatchError`, which names the
differing leaves, before orbax reads any array.

Integrity (`restore_latest`, `damage`, `check`):
- Each step directory holds `grpo_jax_files.json`, the size and the xxh3-128 hash of
  every file of the step (`manifest`). An async save writes it from orbax's
  post-finalization callback, into the step's temporary directory just before orbax
  renames it into place, so a step is never committed without its manifest (a sync save
  writes it right after the commit). Hash: xxh3-128 (the `xxhash` package): it detects
  accidental damage (bit rot, torn or overwritten writes, a file of another step), which
  is all a checksum here is for, at 17 GB/s on one core of this 2-core CPU against
  0.9 GB/s for hashlib's blake2b and 1.1 GB/s for sha256 (blake2b would cost a 6 GB
  checkpoint ~7 s, xxh3 ~0.4 s); it runs in orbax's background thread and releases the
  GIL. Measured per save (experiments/bench_checkpoint_hash.py; docs/reliability.md):
  0.35 ms of a 254 ms save for the tiny config's 1.4 MB checkpoint, 8 ms of 304 ms for
  62 MB.
- On restore the step's files are checked against the manifest first, so damaged bytes
  are found before orbax reads anything (a failed orbax read leaves TensorStore reads in
  flight, which print tracebacks as they land). A step without a manifest (written by an
  older grpo_jax) is restored with one log line saying it was not verified.
- A checkpoint that does not restore, for any reason but one of this machine (out of
  memory, a storage outage: `unreadable`): files missing, of another size or content
  than when written, an empty step directory, missing metadata, any error the storage
  layer raises while reading (whatever its type), non-finite values in the restored
  state, or a `check` of the caller's that fails (the trainer's: the off-policy buffer),
  is named in one log line with the reason, moved out of the way to
  `<directory>.bad/<step>` (never deleted: it may hold what someone wants to inspect),
  and the next older one is tried. Only when no checkpoint restores does restoring fail:
  with the mismatch (a changed config) when every checkpoint disagrees with the config,
  else with each step and its reason.
- A background save that failed (disk full, permissions) is raised by `check()` as one
  `CheckpointSaveError` naming the directory and the cause; orbax finalises a step (and
  only then applies keep-N retention) after all its files are written, so the previous
  checkpoint stays valid.

A step may also hold a third item, `buffer` (any pytree of host numpy arrays, saved with
`save(..., buffer=...)`, restored as written): the trainer keeps the off-policy pipeline's
in-flight rollouts there, so they are committed, hashed, pruned and set aside with the
state they belong to.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
import pathlib
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import xxhash
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


# What a failure of this machine or its storage, not of the checkpoint, says: out of
# memory, a storage service that is down or slow, no permission to read.
_MACHINE_CODES = (
  "RESOURCE_EXHAUSTED",
  "Out of memory",
  "out of memory",
  "UNAVAILABLE",
  "DEADLINE_EXCEEDED",
  "PERMISSION_DENIED",
)


def unreadable(e: BaseException) -> bool:
  """Whether a restore failure is the checkpoint's (its files missing, damaged or not
  matching the config: an older checkpoint is tried) rather than this machine's (out of
  memory, a storage outage, no permission: raised as it is, nothing is set aside). The
  storage layer reports damage with whatever type it likes (TensorStore's ValueError,
  a plain Exception for a decompression error), so every failure is the checkpoint's
  unless it names the machine."""
  if isinstance(e, MemoryError | PermissionError):
    return False
  text = _first_line(e) + str(e)[:2000]
  return not any(code in text for code in _MACHINE_CODES)


def _reason(e: BaseException) -> str:
  return str(e) if isinstance(e, CheckpointDamagedError) else _first_line(e)


MANIFEST = "grpo_jax_files.json"
HASH = "xxh3_128"
_CHUNK = 16 << 20
# Where orbax writes a step before renaming it into place (<step>.orbax-checkpoint-tmp on a
# local or mounted filesystem; object stores write in place and commit with a marker file).
_ORBAX_TMP = ".orbax-checkpoint-tmp"


def file_hash(path: pathlib.Path) -> str:
  """The xxh3-128 hash of a file's bytes, as hex. Read through mmap (no copy: 5x faster
  than chunked reads here), else in chunks (an empty file, a filesystem without mmap)."""
  with open(path, "rb") as f:
    try:
      with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return xxhash.xxh3_128(m).hexdigest()
    except (ValueError, OSError):
      h = xxhash.xxh3_128()
      while chunk := f.read(_CHUNK):
        h.update(chunk)
      return h.hexdigest()


# Top-level files orbax writes or rewrites when it commits a step, after the manifest: its
# step metadata (handler names, metrics, commit time) and the commit marker. They hold no
# state; orbax refuses a step whose metadata does not parse.
_WRITTEN_AT_COMMIT = ("_CHECKPOINT_METADATA", "commit_success.txt")


def _paths(step_dir: pathlib.Path) -> dict[str, pathlib.Path]:
  """{relative path: path} of every file under step_dir but the manifest and the files
  orbax writes at commit."""
  return {
    name: p
    for p in sorted(step_dir.rglob("*"))
    if p.is_file() and (name := str(p.relative_to(step_dir))) not in (MANIFEST, *_WRITTEN_AT_COMMIT)
  }


def manifest(step_dir: pathlib.Path, *, when: str) -> dict:
  """What `grpo_jax_files.json` records: the size and hash of every file of the step, and
  `when` it was written ("before_commit" from orbax's callback, else "after_commit")."""
  files = {
    name: {"bytes": p.stat().st_size, HASH: file_hash(p)} for name, p in _paths(step_dir).items()
  }
  return {"format": 2, "hash": HASH, "written": when, "files": files}


def write_manifest(step_dir: pathlib.Path, *, when: str) -> None:
  (step_dir / MANIFEST).write_text(json.dumps(manifest(step_dir, when=when), indent=1))


def _listed(step_dir: pathlib.Path) -> tuple[dict, bool] | None:
  """({relative path: {"bytes", and with hashes HASH}}, whether hashes are recorded) from
  the step's manifest; None without one. Format 1 (older grpo_jax) recorded sizes only."""
  path = step_dir / MANIFEST
  if not path.exists():
    return None
  written = json.loads(path.read_text())
  if written.get("format") == 2:
    return written["files"], True
  return {name: {"bytes": size} for name, size in written.items()}, False


def damage(step_dir: pathlib.Path) -> str | None:
  """Why step_dir does not hold the checkpoint that was written (files missing, or of
  another size or content than when written; no files at all; a manifest that does not
  parse), or None when nothing is known to be wrong."""
  if not any(p.is_file() for p in step_dir.rglob("*")):
    return "the step directory holds no files"
  try:
    listed = _listed(step_dir)
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    return f"its file manifest {MANIFEST} is unreadable ({type(e).__name__}: {e})"
  if listed is None:
    return None  # Written before manifests (`unverified` says so).
  now = _paths(step_dir)
  for name, want in listed[0].items():
    if name not in now:
      return f"{name} is missing"
    size = now[name].stat().st_size
    if size != want["bytes"]:
      return f"{name} has {size} bytes, {want['bytes']} when written"
    if HASH in want and file_hash(now[name]) != want[HASH]:
      return f"{name} holds other bytes than when written (its {HASH} differs)"
  return None


def unverified(step_dir: pathlib.Path) -> str | None:
  """Why the bytes of an undamaged step could not be checked (no manifest, or one with
  sizes only), or None when every file's hash was."""
  try:
    listed = _listed(step_dir)
  except (ValueError, KeyError, TypeError, AttributeError):
    return None  # `damage` reports it.
  if listed is None:
    return "it has no file manifest (written by an older grpo_jax)"
  return None if listed[1] else "its file manifest records sizes only (an older grpo_jax)"


def nonfinite(tree) -> list[str]:
  """Paths of the floating-point leaves of tree that hold a NaN or an infinity."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [
    _path_str(p)
    for p, x in flat
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact) and not bool(jnp.all(jnp.isfinite(x)))
  ]


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `restore_latest` returns: the step, its state tree and meta, and its buffer
  item (None when the step has none)."""

  step: int
  tree: Any
  meta: dict
  buffer: dict | None = None


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


def _reconcile(saved_meta, *, like: Any, fillable: tuple[str, ...], where) -> tuple[list, list]:
  """(missing, dropped): the leaves under `fillable` keys only `like` has, and those
  only the checkpoint (its state metadata, `saved_meta`, at `where`) has;
  CheckpointMismatchError for any other difference."""
  saved = _metadata_shapes(saved_meta)
  wanted = _shapes(like)
  bad = _mismatches(saved, wanted)
  missing = [k for k in wanted if k not in saved and k.split("/")[0] in fillable]
  dropped = [k for k in saved if k not in wanted and k.split("/")[0] in fillable]
  if bad and len(bad) == len(missing) + len(dropped):
    return missing, dropped
  if bad:
    shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
    raise CheckpointMismatchError(
      f"The checkpoint at {where} does not match this config "
      f"({len(bad)} differences):\n  {shown}\n"
      "It was written by a run with another model/optimizer config. Resume with the same "
      "config, or use a new --workdir."
    )
  return [], []


def _as_saved(saved_meta, *, like) -> Any:
  """The abstract tree of a checkpoint's subtree as its metadata has it (every leaf's
  shape and dtype, empty containers included), on the sharding of `like`'s first leaf
  (hyperparameters: replicated scalars), so a restore reads what it holds."""
  sharding = getattr(jax.tree.leaves(like)[0], "sharding", None)
  return jax.tree.map(
    lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding),
    saved_meta,
    is_leaf=lambda x: hasattr(x, "shape") and not isinstance(x, dict),
  )


def _placed(value, like):
  """`value` on like's sharding: a default filled in is a host-local array, which a
  multi-host save refuses (and a jitted step would see on the wrong devices)."""
  sharding = getattr(like, "sharding", None)
  if sharding is None or getattr(value, "sharding", None) == sharding:
    return value
  return jax.device_put(np.asarray(value), sharding)


def _merge(base: dict, over: dict) -> dict:
  """base with every leaf that `over` holds replaced by over's (nested state dicts), in
  base's dtype (a hyperparameter an older release stored as an integer)."""
  if not isinstance(base, dict):
    dtype = getattr(base, "dtype", None)
    return over if dtype is None or over.dtype == dtype else over.astype(dtype)
  return {k: _merge(v, over[k]) if k in over else v for k, v in base.items()}


def restore_params(state_dir, *, like, shardings):
  """A run's policy params alone from a step's "state" item (its train.params; no optimizer
  state or reference is read: orbax's partial restore), with like's shapes and dtypes on
  `shardings`. For a checkpoint read as another run's teacher (`teacher`)."""
  item = {"train": {"params": like}}
  args = jax.tree.map(lambda x, s: ocp.ArrayRestoreArgs(sharding=s, dtype=x.dtype), like, shardings)
  try:
    out = ocp.PyTreeCheckpointer().restore(
      pathlib.Path(state_dir).absolute(),
      args=ocp.args.PyTreeRestore(
        item=item, restore_args={"train": {"params": args}}, partial_restore=True
      ),
    )
  except (ValueError, KeyError, FileNotFoundError) as e:
    raise CheckpointMismatchError(
      f"{state_dir} holds no policy params of this architecture: {_first_line(e)}"
    ) from None
  return out["train"]["params"]


class Checkpointer:
  """Save / restore (pytree, meta[, buffer]) under one directory, keeping last N plus best."""

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
      # On the primary process, after every file of a step is written, before its commit.
      async_options=ocp.AsyncOptions(post_finalization_callback=self._manifest_before_commit)
      if async_save
      else None,
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
        "buffer": ocp.StandardCheckpointHandler(),
      },
      options=options,
    )

  def _manifest_before_commit(self) -> None:
    """Writes the manifest of the step being saved into its temporary directory, which
    orbax renames into place next: no step is committed without one."""
    step = self._unlisted
    if step is None:
      return
    tmp = [p for p in self.directory.glob(f"{step}{_ORBAX_TMP}*") if p.is_dir()]
    target = tmp[0] if len(tmp) == 1 else self.directory / str(step)
    if target.is_dir():
      write_manifest(target, when="before_commit")

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def restore_latest(
    self, *, like: Any, defaults: dict | None = None, log=print, check=None
  ) -> Restored | None:
    """The newest checkpoint that restores whole (`Restored`), or None when there is none
    (`defaults` as in `restore`). Each is checked against its manifest, restored, checked
    for non-finite values and, with `check` (Restored -> None, or a reason to reject it),
    by the caller. Those that fail on the way are logged and moved to `<directory>.bad`;
    a failure of this machine (`unreadable`) is raised as it is."""
    failures: list[tuple[int, BaseException]] = []
    for step in sorted(self.all_steps(), reverse=True):
      try:
        got = self._restore_whole(step, like=like, defaults=defaults, check=check)
      except Exception as e:
        if not unreadable(e):
          raise
        failures.append((step, e))
        continue
      self._set_aside_all(failures, resumed=step, log=log)
      if (why := unverified(self.directory / str(step))) is not None:
        log(f"checkpoint {self.directory / str(step)}: {why}; its bytes are not verified.")
      return got
    if not failures:
      return None
    if all(isinstance(e, CheckpointMismatchError) for _, e in failures):
      raise failures[0][1]  # Every checkpoint disagrees with the config: it changed.
    reasons = "; ".join(f"step {s}: {_reason(e)}" for s, e in failures)
    raise NoValidCheckpointError(
      f"No checkpoint under {self.directory} can be restored ({reasons}). Move the directory "
      "aside to start the run again."
    )

  def restore_step(self, step: int, *, like: Any, defaults: dict | None = None) -> Restored:
    """Checkpoint `step`, checked against its manifest and for non-finite values like
    `restore_latest`'s, but read-only: a damaged one raises CheckpointDamagedError (with
    why) and stays where it is."""
    return self._restore_whole(step, like=like, defaults=defaults, check=None)

  def _restore_whole(self, step: int, *, like, defaults, check) -> Restored:
    """Step's checkpoint, or CheckpointDamagedError (or the storage layer's error) saying
    why it is not the one that was written."""
    if (why := damage(self.directory / str(step))) is not None:
      raise CheckpointDamagedError(why)
    tree, meta = self.restore(step, like=like, defaults=defaults)
    if bad := nonfinite(tree):
      raise CheckpointDamagedError(
        f"non-finite values in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}"
      )
    got = Restored(step, tree, meta, self.restore_buffer(step))
    if check is not None and (why := check(got)) is not None:
      raise CheckpointDamagedError(why)
    return got

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

  def save(
    self, step: int, tree: Any, meta: dict, *, accuracy: float | None = None, buffer=None
  ) -> None:
    """Starts an async save of `tree` (arrays) and `meta` (JSON), and `buffer` (host numpy
    arrays, when given), as checkpoint `step` (after the previous save has finished: its
    failure raises CheckpointSaveError)."""
    self.wait()
    metrics = None if accuracy is None else {ACCURACY_KEY: float(accuracy)}
    items = {"state": ocp.args.StandardSave(tree), "meta": ocp.args.JsonSave(meta)}
    if buffer is not None:
      items["buffer"] = ocp.args.StandardSave(buffer)
    self._unlisted = step
    try:
      self._mngr.save(step, args=ocp.args.Composite(**items), metrics=metrics, force=True)
    except (OSError, ValueError) as e:  # The write failed (TensorStore raises ValueError).
      self._unlisted = None
      raise self._save_error(e) from e

  def read_meta(self, step: int) -> dict:
    """Step's `meta` item alone (no array is read, nothing is verified)."""
    args = ocp.args.Composite(meta=ocp.args.JsonRestore())
    return dict(self._mngr.restore(step, args=args)["meta"])

  def restore_buffer(self, step: int) -> dict | None:
    """Step's `buffer` item as written (numpy arrays), or None when it has none."""
    if not (self.directory / str(step) / "buffer").is_dir():
      return None
    args = ocp.args.Composite(buffer=ocp.args.StandardRestore())
    return self._mngr.restore(step, args=args)["buffer"]

  def restore(self, step: int, *, like: Any, defaults: dict | None = None) -> tuple[Any, dict]:
    """(tree, meta) of checkpoint `step`, restored with the structure, shapes, dtypes and
    shardings of `like` (arrays or jax.ShapeDtypeStruct).

    `defaults` ({top-level key of like: a subtree holding values}) reconciles the leaves
    under those keys (the hyperparameters, whose set changes between releases): a leaf
    the checkpoint lacks (added by a newer grpo_jax, or declared by a variant registered
    since) takes the default's value, and one only the checkpoint holds (a field a newer
    grpo_jax dropped) is read and left out; they are listed in meta["filled"] and
    meta["dropped"]. Any other difference is a CheckpointMismatchError."""
    fillable = tuple(defaults or ())
    saved = self._mngr.item_metadata(step)["state"]
    missing, dropped = _reconcile(saved, like=like, fillable=fillable, where=self._at(step))
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    changed = {m.split("/")[0] for m in missing + dropped}
    for key in changed:  # Those subtrees read as the checkpoint holds them.
      abstract = {**abstract, key: _as_saved(saved[key], like=abstract[key])}
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    tree, meta = out["state"], dict(out["meta"])
    for key in changed:  # The defaults, with every leaf the checkpoint holds, on like's.
      merged = _merge(serialization.to_state_dict(defaults[key]), tree[key])
      value = serialization.from_state_dict(defaults[key], merged)
      tree = {**tree, key: jax.tree.map(_placed, value, like[key])}
    if missing:
      meta["filled"] = missing
    if dropped:
      meta["dropped"] = dropped
    return tree, meta

  def check_compatible(self, step: int, *, like: Any, fillable: tuple[str, ...] = ()) -> list[str]:
    """Raises CheckpointMismatchError naming the leaves whose shapes or paths differ. Leaves
    only missing from the checkpoint under a `fillable` top-level key are returned instead
    (to be filled from defaults), as long as nothing else differs; leaves only in the
    checkpoint under such a key are no difference (`restore` drops them)."""
    saved = self._mngr.item_metadata(step)["state"]
    return _reconcile(saved, like=like, fillable=fillable, where=self._at(step))[0]

  def _at(self, step: int) -> pathlib.Path:
    return self.directory / str(step)

  def wait(self) -> None:
    """Waits for the background save; raises CheckpointSaveError if it failed. A step
    whose manifest orbax's callback did not write (a sync save) gets it now."""
    try:
      self._mngr.wait_until_finished()
    except (OSError, ValueError) as e:  # The write failed (TensorStore raises ValueError).
      self._unlisted = None
      raise self._save_error(e) from e
    step, self._unlisted = self._unlisted, None
    step_dir = self.directory / str(step)
    primary = jax.process_index() == 0
    if step is not None and primary and step_dir.is_dir() and not (step_dir / MANIFEST).exists():
      write_manifest(step_dir, when="after_commit")

  def close(self) -> None:
    """Waits for the last save (CheckpointSaveError if it failed), then closes orbax."""
    try:
      self.wait()
    except CheckpointSaveError:
      with contextlib.suppress(Exception):  # The failure is the one just raised.
        self._mngr.close()
      raise
    self._mngr.close()
