"""Runs one RL iteration of a small config on given meshes; used by test_sharding.py.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/mesh_run.py OUT 8,1,1 2,2,2

For each mesh (data,fsdp,tensor) it runs `train.run` in a fresh workdir, restores the
final train state, samples greedily from it, and saves to OUT/<mesh>.npz: every param
(flattened path -> array), the greedy tokens, the RL iteration's metrics (non-timing), and
each param's partition spec and per-device shard shape.
"""

import json
import pathlib
import sys
import tempfile

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "configs"))
import arithmetic  # noqa: E402

from grpo_jax import checkpoint, logs, sampling, train  # noqa: E402

_TIMING = ("time/", "tokens_per_s", "perf/")


def config(mesh):
  c = arithmetic.get_config("tiny")
  c.model.update(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_dim=64)
  c.sampler.group_size = 4
  c.update(prompts_per_step=4, iterations=1, warmstart_steps=2, warmstart_batch=8)
  c.update(eval_every=1, eval_size=8, eval_samples=0, checkpoint_every=1, peak_flops=1e11)
  c.update(reward_workers=0, progress=False, tensorboard=False)
  c.rl.num_minibatches = 2
  c.rl.kl_coef = 0.01  # A reference policy too (sharded like the params).
  c.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  return c


def main(out, meshes):
  out = pathlib.Path(out)
  for mesh in meshes:
    c = config(mesh)
    with tempfile.TemporaryDirectory() as workdir:
      train.run(c, workdir, log=lambda _: None)
      setup = train.build(c)
      fns = train.functions(setup)
      ckpt = checkpoint.Checkpointer(pathlib.Path(workdir) / "checkpoints")
      tree, _ = ckpt.restore(ckpt.latest_step(), like=train._abstract_tree(setup, fns))
      ckpt.close()
      record = [
        r for r in logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl") if r["phase"] == "rl"
      ][-1]
    params = tree["train"].params
    examples = [setup.task.example("test", i, seed=0) for i in range(8)]
    prompts = sampling.prepare_prompts(
      [setup.tokenizer.encode(e.prompt, add_bos=True) for e in examples], cfg=setup.sampler_cfg
    )
    greedy = fns.sample_greedy(
      params, prompts, jax.random.key(0), sampling.sampling_params(greedy=True)
    )
    flat = {}
    specs = {}
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
      name = jax.tree_util.keystr(path)
      flat["param" + name] = np.asarray(x)
      specs[name] = [str(x.sharding.spec), list(x.sharding.shard_shape(x.shape))]
    metrics = {k: v for k, v in record.items() if not k.startswith(_TIMING)}
    np.savez(
      out / f"{'x'.join(map(str, mesh))}.npz",
      greedy=np.asarray(greedy.tokens_NT),
      metrics=json.dumps(metrics),
      specs=json.dumps(specs),
      devices=len(jax.devices()),
      **flat,
    )


if __name__ == "__main__":
  main(sys.argv[1], [tuple(int(n) for n in m.split(",")) for m in sys.argv[2:]])
