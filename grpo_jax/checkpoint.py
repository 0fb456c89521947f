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
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

ACCURACY_KEY = "accuracy"


class CheckpointMismatchError(ValueError):
  """The checkpoint's tree does not match the tree it is restored into."""


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

  def all_steps(self) -> list[int]:
    return sorted(self._mngr.all_steps())

  def save(self, step: int, tree: Any, meta: dict, *, accuracy: float | None = None) -> None:
    """Starts an async save of `tree` (arrays) and `meta` (JSON) as checkpoint `step`."""
    metrics = None if accuracy is None else {ACCURACY_KEY: float(accuracy)}
    self._mngr.save(
      step,
      args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
      metrics=metrics,
      force=True,
    )

  def restore(self, step: int, *, like: Any) -> tuple[Any, dict]:
    """(tree, meta) of checkpoint `step`, restored with the structure, shapes, dtypes and
    shardings of `like` (arrays or jax.ShapeDtypeStruct)."""
    self.check_compatible(step, like=like)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    out = self._mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
      ),
    )
    return out["state"], dict(out["meta"])

  def check_compatible(self, step: int, *, like: Any) -> None:
    """Raises CheckpointMismatchError naming the leaves whose shapes or paths differ."""
    saved = _metadata_shapes(self._mngr.item_metadata(step)["state"])
    bad = _mismatches(saved, _shapes(like))
    if bad:
      shown = "\n  ".join(bad[:10]) + (f"\n  ... and {len(bad) - 10} more" if len(bad) > 10 else "")
      raise CheckpointMismatchError(
        f"The checkpoint at {self.directory / str(step)} does not match this config "
        f"({len(bad)} differences):\n  {shown}\n"
        "It was written by a run with another model/optimizer config. Resume with the same "
        "config, or use a new --workdir."
      )

  def wait(self) -> None:
    self._mngr.wait_until_finished()

  def close(self) -> None:
    self._mngr.wait_until_finished()
    self._mngr.close()
