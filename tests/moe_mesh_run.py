"""A tiny mixture-of-experts policy's forward and gradient on one device and with its
experts split over 4 devices; used by test_families.py.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/moe_mesh_run.py [expert|tensor]

"expert" (the default): mesh expert=4 with the default rules table, the experts split over
the `expert` axis and the batch's rows too (expert parallelism). "tensor": mesh tensor=4,
the experts split over `tensor` with heads, MLP and vocabulary whole, the rows on every
device. "megablox": mesh expert=2 × tensor=2 with the experts through the megablox kernel
(interpreted), each device its own 2 of the 8 (`moe._expert_parallel`: the tokens gathered
over `expert` and the outputs reduce-scattered back, summed over `tensor`), against the
same kernel on one device. Prints one JSON line: the largest differences of the logits
and of every gradient leaf between the two, the per-device shape of the experts' gate weights on the mesh, and
the compiled loss's float all-gathers: how many, and how many give a whole expert weight
([X, D, F] or [X, F, D]: the experts gathered rather than split).
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import model, sharding


def main(axis: str):
  impl = "megablox_interpret" if axis == "megablox" else "xla"
  cfg = model.tiny_config(
    64,
    n_experts=8,
    experts_per_token=2,
    expert_mlp_dim=24,
    expert_weights_normalized=True,
    moe_impl=impl,
  )
  params = model.init(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, 64)
  positions = jnp.broadcast_to(jnp.arange(12), (4, 12))

  def loss(p, t, pos):
    logits, _ = model.apply(p, t, pos, cfg=cfg)
    return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 0]), logits

  one = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (_, logits1), grads1 = one(params, tokens, positions)
  if axis == "tensor":  # Expert parallelism on the tensor axis: heads, MLP, vocabulary whole.
    whole = {"vocab", "q_heads", "kv_heads", "mlp", "activation_mlp", "activation_vocab"}
    rules = tuple((k, None if k in whole or k == "activation_kv_heads" else v)
                  for k, v in sharding.DEFAULT_RULES)  # fmt: skip
    mesh_cfg = sharding.MeshConfig(data=1, fsdp=1, tensor=4, rules=rules)
  elif axis == "megablox":
    mesh_cfg = sharding.MeshConfig(data=1, fsdp=1, expert=2, tensor=2)
  else:
    mesh_cfg = sharding.MeshConfig(data=1, fsdp=1, expert=4)
  layout = sharding.Layout.create(mesh_cfg)
  shardings = sharding.param_shardings(layout, cfg)
  placed = jax.tree.map(jax.device_put, params, shardings)
  with layout.context():
    (_, logits4), grads4 = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      placed, tokens, positions
    )
  with layout.context():
    text = jax.jit(loss).lower(placed, tokens, positions).compile().as_text()
  float_gathers = [ln for ln in text.splitlines() if " all-gather(" in ln and "= f" in ln]
  X, D, F = cfg.n_experts, cfg.d_model, cfg.expert_mlp_dim
  whole_weights = [ln for ln in float_gathers if f"[{X},{D},{F}]" in ln or f"[{X},{F},{D}]" in ln]
  gate = placed["layer_0"]["mlp"]["gate"]
  diff = lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max())
  print(
    json.dumps(
      dict(
        devices=len(jax.devices()),
        logits=diff(logits1, logits4),
        grads=max(jax.tree.leaves(jax.tree.map(diff, grads1, grads4))),
        gate_shard=list(gate.addressable_shards[0].data.shape),
        grad_gate_absmax=float(jnp.abs(grads1["layer_0"]["mlp"]["gate"]).max()),
        float_all_gathers=len(float_gathers),
        expert_weight_gathers=len(whole_weights),
        batch_axes=list(layout.batch_axes),
      )
    )
  )


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "expert")
