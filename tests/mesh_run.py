"""Runs one RL iteration of a small config on given meshes; used by test_sharding.py.

  python tests/mesh_run.py OUT --warm BASE 1,1,1     # warm start on 1 device -> BASE
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_run.py OUT --base BASE 8,1,1 2,2,2

`--warm BASE` runs the supervised warm start once and keeps its checkpoint (iteration 0)
in BASE. Every mesh then resumes from a copy of BASE (restored onto that mesh's
shardings) and runs one RL iteration: all meshes start from bit-identical params, so they
sample from the same distribution and differ only by float reduction order. (Separate
100-step warm starts at lr 1e-2 would amplify that order into different rollouts.)
For each mesh (data,fsdp,tensor, or data,fsdp,sequence,tensor) it restores the final train state, samples greedily from
it, and saves to OUT/<mesh>.npz: every param (flattened path -> array), the greedy
tokens, the RL iteration's metrics (non-timing), each param's partition spec and
per-device shard shape, and the mesh axes the samplers split their rows over; on
EPISODE_MESHES also a group of calculator episodes (`episodes`).
"""

import argparse
import contextlib
import json
import pathlib
import shutil
import tempfile

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
import runs  # noqa: E402

from grpo_jax.infra import checkpoint, config_lib, logs  # noqa: E402
from grpo_jax.models import sampling  # noqa: E402
from grpo_jax.trainer import (  # noqa: E402
  build,
  run_state,
  steps,
  train,  # noqa: E402
)


def make_config(mesh):
  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":tiny")
  c.task.kwargs = dict(max_digits=1, ops="+")
  c.model.update(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128)
  c.sampler.group_size = 4
  # A warm start long enough that rewards vary within groups: real policy gradients.
  c.update(prompts_per_step=8, iterations=1, warmstart_steps=100, warmstart_batch=16)
  c.update(warmstart_lr=1e-2)
  c.rl.format_weight = 0.5
  c.update(eval_every=1, eval_size=8, eval_samples=0, checkpoint_every=1, peak_flops=1e11)
  c.update(reward_workers=0, progress=False, tensorboard=False)
  c.rl.num_minibatches = 2
  # Token-budget micro-batches of 192 tokens (16 prompt + 4 or 8 completion columns): on
  # 8 data-parallel devices 8 rows each, whole rows a device; on one, 9 or 8 rows.
  c.rl.update(micro_batch_tokens=192, length_buckets=2)
  c.rl.kl_coef = 0.01  # A reference policy too (sharded like the params).
  axes = ("data", "fsdp", "tensor") if len(mesh) == 3 else ("data", "fsdp", "sequence", "tensor")
  c.mesh.update(dict(zip(axes, mesh, strict=True)))
  return c


class _Stop(Exception):
  pass


def warm_start(base, mesh=(1, 1, 1)):
  """The warm start and its iteration-0 checkpoint in `base` (the run stops before
  iteration 1 is saved)."""

  def stop(it, record):
    raise _Stop

  with contextlib.suppress(_Stop):
    train.run(make_config(mesh), base, log=lambda _: None, on_iteration=stop)
  assert checkpoint.Checkpointer(pathlib.Path(base) / "checkpoints").all_steps() == [0]


# The meshes that also play a group of calculator episodes (`episodes`): data parallel, and
# context parallel, where the runner splits its rows over `sequence` too.
EPISODE_MESHES = ((8, 1, 1), (1, 2, 2, 2))


_CALCULATOR_PARAMS = {}  # The warm-started params, made on the first mesh, on the host.


def _calculator_params(c, setup, fns):
  """configs/calculator.py's supervised warm start (checkpoint 0) on c's mesh, once."""
  if not _CALCULATOR_PARAMS:

    def stop(it, record):
      raise _Stop

    with tempfile.TemporaryDirectory() as tmp:
      with contextlib.suppress(_Stop):
        train.run(c, tmp, log=lambda _: None, on_iteration=stop)
      ckpt = checkpoint.Checkpointer(pathlib.Path(tmp) / "checkpoints")
      tree, _ = ckpt.restore(0, like=run_state.abstract_tree(setup, fns))
      ckpt.close()
    _CALCULATOR_PARAMS["params"] = jax.device_get(tree["train"].params)
  return _CALCULATOR_PARAMS["params"]


def episodes(mesh) -> dict:
  """One training group of calculator episodes (configs/calculator.py:quick on make_config's
  model after a 30-step warm start made once, 8 prompts × 4, same key) on `mesh`: its
  tokens, mask and turns, and the mesh axes the train runner splits its rows over."""
  c = config_lib.load(str(ROOT / "configs" / "calculator.py") + ":quick")
  c.model.update(make_config(mesh).model)
  c.sampler.group_size = 4
  c.update(prompts_per_step=8, eval_size=8, eval_samples=0, reward_workers=0, progress=False)
  c.update(warmstart_steps=30, warmstart_batch=32, tensorboard=False)
  c.mesh.update(make_config(mesh).mesh)
  setup = build.build(c)
  fns = steps.functions(setup)
  params = jax.device_put(_calculator_params(c, setup, fns), fns.param_shardings)
  examples = [setup.task.example("train", i, seed=0) for i in range(8)]
  prompts = sampling.prepare_prompts(
    [setup.tokenizer.encode(e.prompt, add_bos=True) for e in examples], cfg=setup.sampler_cfg
  )
  played = fns.episodes.train.run(params, prompts, examples, jax.random.key(4), setup.sampling_hyper)  # fmt: skip
  return {
    "episode_tokens": np.asarray(played.rollouts.tokens_NT),
    "episode_mask": np.asarray(played.rollouts.mask_NT),
    "episode_turns": played.turns_N,
    "episode_rows": json.dumps(list(fns.episodes.train.layout.batch_axes)),
  }


def main(out, meshes, *, base):
  out = pathlib.Path(out)
  for mesh in meshes:
    c = make_config(mesh)
    with tempfile.TemporaryDirectory() as tmp:
      workdir = pathlib.Path(tmp) / "run"
      shutil.copytree(base, workdir)
      train.run(c, workdir, log=lambda _: None)
      setup = build.build(c)
      fns = steps.functions(setup)
      ckpt = checkpoint.Checkpointer(pathlib.Path(workdir) / "checkpoints")
      tree, _ = ckpt.restore(ckpt.latest_step(), like=run_state.abstract_tree(setup, fns))
      ckpt.close()
      record = [
        r for r in logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl") if r["phase"] == "rl"
      ][-1]
    params = tree["train"].params
    examples = [setup.task.example("test", i, seed=0) for i in range(8)]
    prompts = sampling.prepare_prompts(
      [setup.tokenizer.encode(e.prompt, add_bos=True) for e in examples], cfg=setup.sampler_cfg
    )
    greedy = fns.samplers.greedy(
      params, prompts, jax.random.key(0), sampling.sampling_params(greedy=True)
    )
    flat = {}
    specs = {}
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
      name = jax.tree_util.keystr(path)
      flat["param" + name] = np.asarray(x)
      specs[name] = [str(x.sharding.spec), list(x.sharding.shard_shape(x.shape))]
    metrics = runs.untimed(record)
    rows = {  # The mesh axes the samplers split rows over (their prompts' and outputs').
      "train": fns.samplers.train.in_shardings[1].spec,
      "greedy": fns.samplers.greedy.in_shardings[1].spec,
      "greedy_out": greedy.tokens_NT.sharding.spec,
    }
    np.savez(
      out / f"{'x'.join(map(str, mesh))}.npz",
      greedy=np.asarray(greedy.tokens_NT),
      metrics=json.dumps(metrics),
      specs=json.dumps(specs),
      sampler_rows=json.dumps({k: list(v) for k, v in rows.items()}),
      devices=len(jax.devices()),
      **flat,
      **(episodes(mesh) if mesh in EPISODE_MESHES else {}),
    )


if __name__ == "__main__":
  parser = argparse.ArgumentParser()
  parser.add_argument("out")
  parser.add_argument("meshes", nargs="*")
  parser.add_argument("--warm", help="Run the warm start into this directory first.")
  parser.add_argument("--base", help="Resume every mesh from a copy of this warm start.")
  args = parser.parse_args()
  if args.warm:
    warm_start(args.warm)
  meshes = [tuple(int(n) for n in m.split(",")) for m in args.meshes]
  main(args.out, meshes, base=args.warm or args.base)
