"""What hashing every checkpoint file costs per save (`checkpoint`'s manifest, xxh3-128).

  python experiments/bench_checkpoint_hash.py              # 20 pairs, tiny + 64 MiB
  python experiments/bench_checkpoint_hash.py --pairs 10 --mib 256

Each pair is two blocking saves (`save` + `wait`: the files, the manifest, the commit) of
the same tree into one directory, one with the manifest's hashes and one without (its
`file_hash` replaced by a constant: sizes only), in alternating order, so the machine's
drift and the other processes on it fall on both arms alike. Trees: the checkpointed
state of configs/arithmetic.py:tiny (its RunState tree: params, Adam moments, the
reference-free controller state and key) and a synthetic one of --mib MiB of float32.
Reports, per tree, the step directory's size and the median and range over the pairs
of the ratio (hashed / unhashed save time) and of the difference in ms. On a shared
2-core machine that difference drowns in the save's own jitter, so the hashing itself
is timed too, the same way: the manifest of the step just written, with and without the
hashes, alternating, 20 pairs (`manifest_ms`, `hash_ms`: their difference). In a run the
save is asynchronous (the hashing runs in orbax's background thread, before the commit),
so these blocking figures are an upper bound on what a save costs the loop.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

ROOT = pathlib.Path(__file__).resolve().parent.parent

from grpo_jax.infra import checkpoint, config_lib  # noqa: E402
from grpo_jax.trainer import (  # noqa: E402
  build,
  run_state,
  steps,  # noqa: E402
)


def tiny_tree():
  """The tree a configs/arithmetic.py:tiny run checkpoints (`run_state.initial_tree`)."""
  setup = build.build(config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":tiny"))
  fns = steps.functions(setup)
  params = run_state.initial_params(setup, fns, jax.random.key(0))
  return run_state.initial_tree(setup, fns, params)


def synthetic_tree(mib: int):
  """mib MiB of float32 in 16 arrays of random values (incompressible, like trained params)."""
  n = mib * 2**20 // 4 // 16
  keys = jax.random.split(jax.random.key(0), 16)
  return {f"w{i}": jax.random.normal(k, (n,), jnp.float32) for i, k in enumerate(keys)}


def _save_seconds(ckpt: checkpoint.Checkpointer, step: int, tree, *, hashed: bool) -> float:
  real = checkpoint.file_hash
  if not hashed:
    checkpoint.file_hash = lambda path: ""
  try:
    t0 = time.perf_counter()
    ckpt.save(step, tree, {"step": step})
    ckpt.wait()
    return time.perf_counter() - t0
  finally:
    checkpoint.file_hash = real


def _step_bytes(step_dir: pathlib.Path) -> int:
  return sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file())


def _manifest_seconds(step_dir: pathlib.Path, *, hashed: bool) -> float:
  real = checkpoint.file_hash
  if not hashed:
    checkpoint.file_hash = lambda path: ""
  try:
    t0 = time.perf_counter()
    checkpoint.manifest(step_dir, when="after_commit")
    return time.perf_counter() - t0
  finally:
    checkpoint.file_hash = real


def _pairs(fn, pairs: int) -> dict[bool, list[float]]:
  """fn(hashed) for hashed in alternating order, `pairs` times each."""
  out = {True: [], False: []}
  for i in range(pairs):
    for hashed in (True, False) if i % 2 == 0 else (False, True):
      out[hashed].append(fn(hashed))
  return out


def _summary(got: dict[bool, list[float]], name: str) -> dict:
  ratios = [h / u for h, u in zip(got[True], got[False])]
  deltas = [1e3 * (h - u) for h, u in zip(got[True], got[False])]
  return {
    f"{name}_ms_median": round(1e3 * statistics.median(got[True]), 2),
    f"{name}_ratio_median": round(statistics.median(ratios), 3),
    f"{name}_ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
    f"{name}_hash_ms_median": round(statistics.median(deltas), 2),
    f"{name}_hash_ms_range": [round(min(deltas), 2), round(max(deltas), 2)],
  }


def measure(tree, *, pairs: int) -> dict:
  """Alternating hashed/unhashed saves, then manifests: the step size, the ratios and the
  ms differences."""
  with tempfile.TemporaryDirectory() as d:
    ckpt = checkpoint.Checkpointer(pathlib.Path(d) / "ck", keep=2, keep_best=False)
    _save_seconds(ckpt, 0, tree, hashed=True)  # Warm: orbax's first save sets things up.
    step = iter(range(1, 2 * pairs + 1))
    saves = _pairs(lambda h: _save_seconds(ckpt, next(step), tree, hashed=h), pairs)
    step_dir = ckpt.directory / str(ckpt.latest_step())
    out = {"step_bytes": _step_bytes(step_dir), "files": len(list(step_dir.rglob("*")))}
    out |= _summary(saves, "save")
    out |= _summary(_pairs(lambda h: _manifest_seconds(step_dir, hashed=h), pairs), "manifest")
    ckpt.close()
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--pairs", type=int, default=20)
  parser.add_argument("--mib", type=int, default=64)
  args = parser.parse_args()
  out = {"pairs": args.pairs, "hash": checkpoint.HASH}
  out["tiny"] = measure(tiny_tree(), pairs=args.pairs)
  out[f"synthetic_{args.mib}mib"] = measure(synthetic_tree(args.mib), pairs=args.pairs)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
