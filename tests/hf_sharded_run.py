"""Imports the qwen2 fixture onto a (1, 4, 2) mesh of forced CPU devices; used by test_hf.py.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/hf_sharded_run.py

Prints one JSON line: the per-device shard shape of every param and the max abs logit
difference to the transformers reference.
"""

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
from grpo_jax.models import hf, model, sharding  # noqa: E402

d = ROOT / "tests" / "fixtures" / "hf" / "qwen2"
cfg = hf.model_config(hf.read_config(d))
layout = sharding.Layout.create(sharding.MeshConfig(data=1, fsdp=4, tensor=2))
params = hf.load_params(d, cfg, shardings=sharding.param_shardings(layout, cfg))
shapes = {
  jax.tree_util.keystr(p, simple=True, separator="/"): list(x.addressable_shards[0].data.shape)
  for p, x in jax.tree_util.tree_flatten_with_path(params)[0]
}
ref = np.load(d / "expected.npz")
mask = jnp.asarray(ref["attention_mask"])
with layout.context():
  logits, _ = jax.jit(lambda p, t, pos: model.apply(p, t, pos, cfg=cfg))(
    params, jnp.asarray(ref["input_ids"]), model.positions_from_mask(mask)
  )
keep = ref["attention_mask"].astype(bool)
diff = float(np.abs(np.asarray(logits)[keep] - ref["logits"][keep]).max())
print(json.dumps({"shard_shapes": shapes, "max_abs_diff": diff}))
