"""Views of a params tree: the trainable part and the frozen base, the reference, the
stored base dtype, adapters merged into their kernels, and scanned layers unstacked for the
samplers (`sampler_view`)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models import layers, model_config, quant

Params = Any


def split_trainable(params: Params, *, part: str = "adapters"):
  """(trainable, join): the part of a params tree the optimizer owns, and join(trainable)
  -> the whole tree. With adapters ({"base": ..., "lora": ...}) the adapters are trainable
  (part="adapters": the base is never differentiated nor in the optimizer state), or the
  base (part="base", the warm start of a randomly initialised model: adapters untouched).
  Without adapters, the whole tree."""
  if is_adapted(params):
    if part == "base":
      lora = params["lora"]
      return params["base"], lambda base: {"base": base, "lora": lora}
    base = params["base"]
    return params["lora"], lambda lora: {"base": base, "lora": lora}
  return params, lambda trainable: trainable


def parameter_line(params, cfg: model_config.ModelConfig) -> str:
  """What a run trains, in one line: the model's parameter count and how many of them the
  optimizer updates (with adapters: the adapters alone, their rank, alpha and targets, and
  the base's storage dtype). `params` may hold arrays or shapes (`jax.eval_shape`)."""
  trainable, _ = split_trainable(params)
  n_all, n_train = _count(params), _count(trainable)
  lora = cfg.lora
  if not is_adapted(params):
    return f"parameters: {n_all:,} ({cfg.param_dtype}), all trained"
  base = lora.base_dtype or cfg.param_dtype
  return (
    f"parameters: {n_all:,} ({base} base); training {n_train:,} LoRA adapter parameters "
    f"({100 * n_train / n_all:.2f}%: rank {lora.rank}, alpha {lora.alpha:g}, on "
    f"{', '.join(lora.targets)})"
  )


def _count(tree) -> int:
  return sum(int(math.prod(x.shape)) for x in jax.tree.leaves(tree))


def is_adapted(tree) -> bool:
  """Whether a params-shaped tree holds adapters ({"base": ..., "lora": ...})."""
  return isinstance(tree, dict) and set(tree) == {"base", "lora"}


def reference_part(tree):
  """The part of a params-shaped tree (params, shardings, shapes) the reference policy
  reads: with adapters, {"base": ...} (adapters off); else the whole tree."""
  return {"base": tree["base"]} if is_adapted(tree) else tree


def reference(params: Params) -> Params:
  """The reference policy of a params tree: with adapters, the base with adapters off (the
  same arrays: no second copy of the weights); else a copy of the params (the trainer
  updates them in place)."""
  part = reference_part(params)
  return part if part is not params else jax.tree.map(jnp.copy, params)


def cast_base(tree, cfg: model_config.ModelConfig):
  """A params-shaped tree (arrays or jax.ShapeDtypeStructs, boxed or not) with the frozen
  base stored in model.lora.base_dtype (`quant.store`); adapters, integer leaves, a base
  already stored and trees without adapters unchanged."""
  if not (is_adapted(tree) and cfg.lora.enabled and cfg.lora.base_dtype):
    return tree
  return {"base": store_base(tree["base"], cfg), "lora": tree["lora"]}


def store_base(base, cfg: model_config.ModelConfig):
  """The base alone (`cast_base`'s "base"), e.g. a checkpoint's weights read again."""
  names = None
  if cfg.lora.base_dtype in quant.QUANTIZED and not _boxed(base):
    names = layers.logical_axes(cfg)["base"]
  return quant.store(base, cfg.lora.base_dtype, names=names)


def _boxed(tree) -> bool:
  return any(
    isinstance(x, nn.LogicallyPartitioned)
    for x in jax.tree.leaves(tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  )


def base_config(cfg: model_config.ModelConfig) -> model_config.ModelConfig:
  """The config of the base model alone (adapters off): what checkpoints hold."""
  return dataclasses.replace(cfg, lora=model_config.LoraConfig()) if cfg.lora.enabled else cfg


def merge_adapters(params: Params, cfg: model_config.ModelConfig) -> Params:
  """The base weights with each adapter folded in, W + (alpha/r)·A·B (the same policy
  without adapters: export it as a plain checkpoint). Params without adapters: as they
  are."""
  if not (cfg.lora.enabled and isinstance(params, dict) and set(params) == {"base", "lora"}):
    return params
  merged = jax.tree.map(lambda x: x, params["base"])  # A new dict structure.
  scale = cfg.lora.scale

  def fold(base_node, lora_node):
    for key, value in lora_node.items():
      if key.endswith("_lora"):  # The adapter of projection `name`, beside its kernel.
        name = key[: -len("_lora")]
        kernel = _fold(base_node[name]["kernel"], value["a"], value["b"], scale)
        base_node[name] = {**base_node[name], "kernel": kernel}
      else:
        fold(base_node[key], value)

  fold(merged, params["lora"])
  return quant.dequantized(merged)  # An int8 base's kernels without adapters, too.


def sampler_view(
  cfg: model_config.ModelConfig, *, fsdp: int = 1
) -> tuple[model_config.ModelConfig, Callable[[Params], Params] | None]:
  """(config, view) of the model the samplers run: `view(params)` is what that config's
  model reads (None: the params as given).

  - With model.lora.merge_for_sampling, the base model on `merge_adapters(params)`: the
    fold, (L·)r·in·out multiply-adds per projection, runs once per sampler call inside
    its jit, and each decode step then does one matmul per projection instead of
    x·W + (x·A)·B. The policy is the same up to float rounding (W + s·A·B rounded once
    to the kernel's dtype: in float32 the same tokens, in bfloat16 the trajectories part
    where a rounding tips a draw); the sampler's log-probs already differ from the
    trainer's by op order.
  - With scanned layers (model.scan_layers) and no fsdp sharding (fsdp == 1), the
    unrolled model on `unstack_layers(params)`: every layer keeps its own cache buffers,
    which the decode loop updates in place. A layer scan reads the stacked [L, ...] cache
    and writes a new one at every decode step (plus one layer's slices and weights), so
    each step moves the whole cache several times: on an H200 a Qwen2.5-0.5B-shaped
    decode step of 256 rows took 18 ms scanned against a ~2 ms roofline, and on a 2-core
    CPU an 8-layer model decoded 3.6x faster unrolled. The slices are one copy of the
    weights, made once per sampler call. Over fsdp the unrolled loop would gather the
    whole model onto every device (`memory`), so sharded weights stay scanned.
  The model otherwise: as it is, and None."""
  view = None
  if cfg.lora.enabled and cfg.lora.merge_for_sampling:
    view = functools.partial(merge_adapters, cfg=cfg)
    cfg = base_config(cfg)
  if cfg.scan_layers and fsdp == 1:
    unstack = functools.partial(unstack_layers, n_layers=cfg.n_layers)
    view = unstack if view is None else functools.partial(_then, first=view, second=unstack)
    cfg = dataclasses.replace(cfg, scan_layers=False, remat="none")
  return cfg, view


def _then(params: Params, *, first: Callable, second: Callable) -> Params:
  return second(first(params))


def unstack_layers(params: Params, *, n_layers: int) -> Params:
  """A scanned model's params as the unrolled model reads them: in every collection of
  the tree (params; base and adapters), {"layers": leaves [L, ...]} becomes {"layer_0":
  leaves [...], ..., "layer_{L-1}": ...}; everything else as it is."""
  if not isinstance(params, dict):
    return params
  out = {}
  for name, sub in params.items():
    if name == "layers":
      out.update({f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], sub) for i in range(n_layers)})
    else:
      out[name] = unstack_layers(sub, n_layers=n_layers)
  return out


def _fold(kernel, a, b, scale):
  """kernel [(L,) *in, *out] + scale·A [(L,) *in, r] · B [(L,) r, *out], in float32 (an
  int8 kernel: dequantized first, merged in float32)."""
  kernel = quant.dequantized(kernel)
  stacked = kernel.ndim == (a.ndim - 1) + (b.ndim - 1) - 1  # Both carry a layer axis.
  if stacked:
    delta = jax.vmap(lambda a1, b1: jnp.tensordot(a1, b1, axes=1))(a, b)
  else:
    delta = jnp.tensordot(a, b, axes=1)
  return (kernel.astype(jnp.float32) + scale * delta).astype(kernel.dtype)
