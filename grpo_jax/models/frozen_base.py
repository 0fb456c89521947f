"""The frozen base of an adapter run (model.lora): kept once, checked on every resume.

With adapters the base never changes during RL, so a checkpoint holds the adapters and
their optimizer state only (`stored`), and the run records where its base comes from and
its fingerprint (`record`):

    identity = frozen_base.record(setup, base, workdir=workdir, trained=True)
    tree = frozen_base.stored(run_state_tree)            # what a checkpoint writes
    base = frozen_base.load(setup, fns, identity, workdir=workdir)   # on resume, checked
    full = frozen_base.joined(tree, base)

Where the base comes from:
- "hf_dir": the checkpoint the run started from (config.hf_dir), untouched by the warm
  start; it is read again from there on resume (no copy of a 7B base per run).
- "workdir": a random init, or a base the supervised warm start trained
  (model.lora.warm_start="base"); it is written once to workdir/base (an integrity-checked
  orbax checkpoint, like the run's own) before checkpoint 0.

The fingerprint is a checksum of every leaf's bits computed where the arrays live (two
position-weighted uint32 sums per leaf, jitted, so a sharded or multi-host base is never
gathered), hashed on the host with the leaf's path, shape and dtype. It detects a changed,
reordered or re-typed weight; it is an identity check, not a defence against a forged
file (the checkpoint manifests' sha256 are that).
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import checkpoint
from grpo_jax.models import hf, model

BASE_DIR = "base"  # Under the workdir: the base of a run whose base is not a checkpoint.
_GOLDEN = np.uint32(0x9E3779B9)


def _bits_u32(x):
  """The raw bits of x as uint32 (1, 2 or 4 bytes per element)."""
  width = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}.get(x.dtype.itemsize)
  if width is None:
    raise ValueError(f"fingerprint: {x.dtype} leaves are not supported (1, 2 or 4 bytes).")
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint8)
  return jax.lax.bitcast_convert_type(x, width).astype(jnp.uint32).ravel()


@jax.jit
def _checksums(leaves):
  """[n_leaves, 2] uint32: Σ bits·(2i+1) and Σ rotl(bits ^ i·φ, 13), both mod 2^32."""
  out = []
  for x in leaves:
    bits = _bits_u32(x)
    i = jnp.arange(bits.size, dtype=jnp.uint32)
    mixed = bits ^ (i * _GOLDEN)
    rotated = (mixed << 13) | (mixed >> 19)
    out.append(
      jnp.stack([jnp.sum(bits * (2 * i + 1), dtype=jnp.uint32), jnp.sum(rotated, dtype=jnp.uint32)])
    )
  return jnp.stack(out)


def fingerprint(tree) -> str:
  """A 16-hex-digit identity of a pytree of arrays: equal trees give equal strings; a
  changed bit, shape, dtype or path gives another (see the module docstring)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  sums = np.asarray(_checksums([x for _, x in flat]))
  h = hashlib.sha256()
  for (path, x), (a, b) in zip(flat, sums, strict=True):
    h.update(f"{jax.tree_util.keystr(path)}|{tuple(x.shape)}|{x.dtype}|{a}|{b};".encode())
  return h.hexdigest()[:16]


# ----------------------------------------------------------------------------
# What a checkpoint holds: the run state's tree without the base.
# ----------------------------------------------------------------------------


def stored(tree: dict) -> dict:
  """The checkpointed tree (`RunState.tree`, or its abstract twin) without the frozen base:
  train.params is {"lora": ...} when the params hold adapters; otherwise unchanged."""
  train = tree["train"]
  if not model.is_adapted(train.params):
    return tree
  return {**tree, "train": dataclasses.replace(train, params={"lora": train.params["lora"]})}


def joined(tree: dict, base) -> dict:
  """`stored`'s inverse: the restored tree with the base put back beside the adapters."""
  train = tree["train"]
  params = {"base": base, "lora": train.params["lora"]}
  return {**tree, "train": dataclasses.replace(train, params=params)}


# ----------------------------------------------------------------------------
# Where the base comes from, recorded at the start and checked on resume.
# ----------------------------------------------------------------------------


def record(setup, base, *, workdir: pathlib.Path, trained: bool) -> dict:
  """The base's identity for the run's meta: {"source", "path", "fingerprint"}. A base
  that is not config.hf_dir's as loaded (a random init, or `trained` by the warm start)
  is written to workdir/base first, so that a resume finds it."""
  identity = {"fingerprint": fingerprint(base)}
  if setup.loop.hf_dir and not trained:
    return {**identity, "source": "hf_dir", "path": str(setup.loop.hf_dir)}
  directory = pathlib.Path(workdir) / BASE_DIR
  keeper = checkpoint.Checkpointer(directory, keep=1, keep_best=False, async_save=False)
  try:
    keeper.save(0, base, {"fingerprint": identity["fingerprint"]})
    keeper.wait()
  finally:
    keeper.close()
  return {**identity, "source": "workdir", "path": str(directory)}


def load(setup, abstract_base, identity: dict, *, workdir: pathlib.Path, load_shardings):
  """The base recorded in `identity`, as stored (`abstract_base`: a tree of
  jax.ShapeDtypeStruct), after checking its fingerprint; a checkpoint's weights are read
  onto `load_shardings` (the base as `model.init` makes it) and stored again. A base that
  is missing or is not the one the adapters were trained on is a CheckpointMismatchError
  that says which."""
  if identity["source"] == "hf_dir":
    where = setup.loop.hf_dir or identity["path"]
    base = hf.load_params(where, setup.model_cfg, shardings=load_shardings)
    base = model.store_base(base, setup.model_cfg)
  else:
    where = pathlib.Path(workdir) / BASE_DIR
    if not where.is_dir():
      raise checkpoint.CheckpointMismatchError(
        f"This run trains adapters on a base kept in {where}, which is missing: its "
        "checkpoints hold the adapters only. Restore that directory, or use a new --workdir."
      )
    keeper = checkpoint.Checkpointer(where, keep=1, keep_best=False, async_save=False)
    try:
      base, _ = keeper.restore(0, like=abstract_base)
    finally:
      keeper.close()
  base = jax.tree.map(lambda x, a: x.astype(a.dtype), base, abstract_base)
  got = fingerprint(base)
  if got != identity["fingerprint"]:
    raise checkpoint.CheckpointMismatchError(
      f"The base model read from {where} (fingerprint {got}) is not the one this run's "
      f"adapters were trained on (fingerprint {identity['fingerprint']}, from "
      f"{identity['source']} {identity['path']}). Point config.hf_dir at that base, or "
      "use a new --workdir."
    )
  return base
