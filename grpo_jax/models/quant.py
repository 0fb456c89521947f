"""The frozen base's storage under low-rank adapters (model.lora.base_dtype).

  "bfloat16": every floating weight cast; cast back to the compute dtype in its matmul.
  "int8":     every Dense kernel (q, k, v, o, gate, up, down, an untied LM head) stored
              as int8 with a float32 scale per output channel,

                W ≈ s · Q,  s = max|W| / 127.5 over the kernel's first input axis,
                Q = clip(round(W / s), -128, 127),  so |W - s·Q| <= s / 2

              dequantized inside the layer that uses it (`dequantized`, applied to one
              Dense's variables as it runs: per layer under nn.scan); the embedding table
              and the norms in bfloat16.

The int8 arrays are qwix's (`qwix.quantize` / `qwix.dequantize`, absmax calibration):
a maintained JAX library, used at the array level. Its model-level interception
(`qwix.quantize_model`) is not used: the adapters, the reference (adapters off) and the
stored base already are our own parameter transforms, and the stored tree must carry
our logical axis names for sharding. NF4 (qwix's "nf4") is not offered: it stores
uint4, which neither our checkpoints' fingerprint (bit checksums of 1/2/4-byte elements)
nor the orbax/tensorstore version pinned here were checked with.

For a stacked (nn.scan) kernel [L, *in, *out] the scale is per layer and per output
channel; for o's kernel [heads, head_dim, d_model] it is per (head_dim, d_model), finer
than per output channel (the reduction runs over the first input axis only).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
QUANTIZED = ("int8",)
# What a quantized base keeps its non-kernel weights (embedding table, norms) in.
_REST_DTYPE = jnp.bfloat16
_LAYERS = "layers"  # The logical name of a stacked kernel's leading axis.


def _qwix():
  import qwix  # noqa: PLC0415 -- 1.7 s to import; only a quantized base needs it.

  return qwix


def is_quantized(x) -> bool:
  """Whether x is a quantized kernel (qwix.QArray), without importing qwix for others."""
  return type(x).__name__ == "QArray" and type(x).__module__.startswith("qwix")


def _reduced_axis(names) -> int:
  """The axis s is reduced over: a kernel's first input axis (after a stacked one's
  leading layer axis)."""
  names = tuple(names)
  return 1 if names and names[0] == _LAYERS else 0


def quantize(x, *, axis: int):
  """int8 Q and float32 s (see the module docstring; 127.5 is qwix's int8 bound, whose
  top bucket [126.5, 127.5] is used in full) of one kernel, as a qwix.QArray;
  a jax.ShapeDtypeStruct gives the QArray of shapes (its sharding kept on Q, and on s
  with the reduced axis unsharded)."""
  if not isinstance(x, jax.ShapeDtypeStruct):
    return _quantized(x, axis=axis)
  q = jax.eval_shape(
    functools.partial(_quantized, axis=axis), jax.ShapeDtypeStruct(x.shape, jnp.float32)
  )
  sharding = getattr(x, "sharding", None)
  if sharding is None:
    return q
  spec = list(sharding.spec) + [None] * (x.ndim - len(sharding.spec))
  spec[axis] = None
  scale_sharding = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
  return q.replace(
    qvalue=jax.ShapeDtypeStruct(q.qvalue.shape, q.qvalue.dtype, sharding=sharding),
    scale=jax.ShapeDtypeStruct(q.scale.shape, q.scale.dtype, sharding=scale_sharding),
  )


@functools.partial(jax.jit, static_argnames="axis")
def _quantized(x, *, axis: int):
  """`quantize` of an array, compiled once per shape and axis (op by op, qwix's absmax and
  rounding dispatch about ten small programs a kernel shape)."""
  channels = tuple(i for i in range(x.ndim) if i != axis)
  return _qwix().quantize(
    x.astype(jnp.float32), qtype=jnp.int8, channelwise_axes=channels, scale_dtype=jnp.float32
  )


def _quantize_box(box: nn.LogicallyPartitioned):
  """A boxed kernel -> a QArray of boxes: Q keeps the kernel's logical names, s the same
  names with its reduced (size-1) axis unnamed."""
  axis = _reduced_axis(box.names)
  q = quantize(box.value, axis=axis)
  names = list(box.names)
  names[axis] = None
  return q.replace(
    qvalue=box.replace(value=q.qvalue), scale=box.replace(value=q.scale, names=tuple(names))
  )


def _cast(x, dtype):
  if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype == dtype:
    return x
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape, dtype, sharding=getattr(x, "sharding", None))
  return x.astype(dtype)


def _is_kernel(path) -> bool:
  return bool(path) and getattr(path[-1], "key", None) == "kernel"


def store(base, base_dtype: str, *, names=None):
  """The base tree (arrays, jax.ShapeDtypeStructs, or either boxed in
  nn.LogicallyPartitioned) in storage dtype `base_dtype` ("" or a key of DTYPES or
  QUANTIZED). Unboxed trees need `names`: the tree of logical PartitionSpecs
  (`model.logical_axes`), which says where a stacked kernel's input axis is. Already
  stored leaves pass unchanged."""
  if not base_dtype:
    return base
  if base_dtype in DTYPES:
    return jax.tree.map(
      lambda x: x if is_quantized(x) else _cast(x, DTYPES[base_dtype]), base, is_leaf=is_quantized
    )
  if base_dtype not in QUANTIZED:
    raise ValueError(
      f"base_dtype={base_dtype!r}; allowed: '', {sorted(DTYPES)}, {list(QUANTIZED)}."
    )

  def is_leaf(x):
    return isinstance(x, nn.LogicallyPartitioned) or is_quantized(x)

  def one(path, x):
    if is_quantized(x):
      return x
    boxed = isinstance(x, nn.LogicallyPartitioned)
    if not _is_kernel(path):
      return x.replace(value=_cast(x.value, _REST_DTYPE)) if boxed else _cast(x, _REST_DTYPE)
    if boxed:
      return _quantize_box(x)
    if names is None:
      raise ValueError("quant.store: an unboxed tree needs names= (model.logical_axes).")
    spec = _lookup(names, path)
    return quantize(x, axis=_reduced_axis(spec))

  return jax.tree_util.tree_map_with_path(one, base, is_leaf=is_leaf)


def _lookup(tree, path):
  for key in path:
    tree = tree[key.key]
  return tree


def dequantized(tree):
  """A Dense's variables with each quantized kernel as a float32 array s · Q (what the
  layer's matmul reads); other leaves unchanged."""
  if not any(is_quantized(x) for x in jax.tree.leaves(tree, is_leaf=is_quantized)):
    return tree
  qwix = _qwix()
  return jax.tree.map(
    lambda x: qwix.dequantize(x) if is_quantized(x) else x, tree, is_leaf=is_quantized
  )
