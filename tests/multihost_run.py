"""One process of a multi-process run of the tiny config; used by test_multihost.py.

  python tests/multihost_run.py OUT WORKDIR --base BASE --devices 2 --process_id 0 --processes 2

Each process has --devices CPU devices (`jax_num_cpu_devices`); with --processes > 1 they
join through `distributed.initialize` (coordinator on localhost:--port, gloo CPU
collectives). The run trains up to --iterations RL iterations with `train.run` in WORKDIR,
on the mesh --mesh (data,fsdp,tensor), resuming from WORKDIR's latest checkpoint; a new
WORKDIR starts as a copy of --base (a warm start made by `mesh_run.py --warm`). It gathers
the final params to every process and saves OUT/process<id>.npz: every param (path ->
array), the RL iterations' metrics (non-timing), and the rows of the last
prompt batch this process scored.
"""

import argparse
import json
import os
import pathlib
import shutil

import jax
import numpy as np
from jax.experimental import multihost_utils

ROOT = pathlib.Path(__file__).resolve().parent.parent
import mesh_run  # noqa: E402
import runs  # noqa: E402

from grpo_jax.infra import checkpoint, distributed, logs  # noqa: E402
from grpo_jax.trainer import (  # noqa: E402
  build,
  run_state,
  steps,
  train,  # noqa: E402
)


def process_parser() -> argparse.ArgumentParser:
  """The arguments every process of a test's multi-process run takes (`join`)."""
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("workdir")
  parser.add_argument("--devices", type=int, default=2)
  parser.add_argument("--process_id", type=int, default=0)
  parser.add_argument("--processes", type=int, default=1)
  parser.add_argument("--port", type=int, default=12355)
  parser.add_argument("--iterations", type=int, default=2)
  parser.add_argument("--cores", default="", help="comma-separated: the cores this process may use")
  return parser


def join(args) -> None:
  """This process's --devices CPU devices, joined with the others' when --processes > 1
  (their programs then keyed alike in the persistent cache: `_same_cache_keys`), on
  --cores where given (before the CPU backend starts its threads, which inherit them)."""
  if args.cores:
    os.sched_setaffinity(0, {int(c) for c in args.cores.split(",")})
  jax.config.update("jax_num_cpu_devices", args.devices)
  if args.processes > 1:
    distributed.initialize(
      "on",
      coordinator_address=f"localhost:{args.port}",
      num_processes=args.processes,
      process_id=args.process_id,
    )
    _same_cache_keys()


def _same_cache_keys() -> None:
  """Every process keys a program alike in JAX's persistent compilation cache, so that
  process 1 loads what process 0 wrote (only process 0 writes).

  JAX's key hashes the devices' topology fingerprint, and on CPU each process's differs
  (jax 0.10.2: every other part of the key is the same), so process 1 missed every time
  and compiled each program afresh (about 45 CPU-s of a test session). Here the key hashes
  each device's kind, id and process instead: the same on every process, and still apart
  for another device set. A private function of JAX's (`cache_key`), patched in these test
  children only; its name is checked, so a JAX that renames it fails here."""
  from jax._src import cache_key  # noqa: PLC0415

  if not callable(getattr(cache_key, "_hash_accelerator_config", None)):
    raise AssertionError("jax._src.cache_key._hash_accelerator_config is gone: update this patch")

  def devices_of_every_process(hash_obj, accelerators) -> None:
    for d in accelerators.flat:
      hash_obj.update(f"{d.device_kind}:{d.id}:{d.process_index};".encode())

  cache_key._hash_accelerator_config = devices_of_every_process


def main(argv=None):
  parser = process_parser()
  parser.add_argument("--mesh", default="2,2,1")
  parser.add_argument("--base", required=True)
  args = parser.parse_args(argv)
  join(args)
  if jax.process_index() == 0 and not pathlib.Path(args.workdir).exists():
    shutil.copytree(args.base, args.workdir)
  multihost_utils.sync_global_devices("workdir ready")
  c = mesh_run.make_config(tuple(int(n) for n in args.mesh.split(",")))
  c.iterations = args.iterations
  c.update(eval_size=8, eval_samples=2, checkpoint_every=1)
  summary = train.run(c, args.workdir, log=lambda _: None)
  setup = build.build(c)
  fns = steps.functions(setup)
  ckpt = checkpoint.Checkpointer(pathlib.Path(args.workdir) / "checkpoints")
  tree, _ = ckpt.restore(ckpt.latest_step(), like=run_state.abstract_tree(setup, fns))
  ckpt.close()
  params = multihost_utils.process_allgather(tree["train"].params, tiled=True)
  flat = {
    "param" + jax.tree_util.keystr(p): np.asarray(x)
    for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
  }
  metrics = []
  if jax.process_index() == 0:
    records = logs.read_jsonl(pathlib.Path(args.workdir) / "metrics.jsonl")
    metrics = [runs.untimed(r) for r in records if r["phase"] == "rl"]
  n = setup.loop.prompts_per_step * setup.sampler_cfg.group_size
  rows = distributed.local_rows(fns.layout.rows(n), n)
  np.savez(
    pathlib.Path(args.out) / f"process{jax.process_index()}.npz",
    metrics=json.dumps(metrics),
    summary=json.dumps({k: v for k, v in summary.items() if "seconds" not in k}),
    rows=np.array([rows.start, rows.stop]),
    processes=jax.process_count(),
    # Each process offers its own index: all must get the primary's (teacher steps).
    from_primary=distributed.from_primary(10 + jax.process_index()),
    **flat,
  )


if __name__ == "__main__":
  main()
