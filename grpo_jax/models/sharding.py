"""Device meshes, the logical->mesh rules table, and the shardings derived from them.

    mesh_cfg = sharding.MeshConfig(data=2, fsdp=2, tensor=2)   # sizes; one may be -1
    layout = sharding.Layout.create(mesh_cfg)                    # the mesh + the rules
    params = sharding.init_params(layout, model_cfg, key)        # born sharded
    step = sharding.Jitted(layout, fn, in_shardings=..., out_shardings=...)

Sharding is declared in three places only: logical axis names on every parameter (and on a
few activations) in the model (`layers`, `kv_cache`); one rules table, `MeshConfig.rules`,
that maps each logical name to mesh axes; and the in/out shardings where `jax.jit` is
called. The partitioner (GSPMD/Shardy) does the rest; there is no hand-written
communication.

Mesh axes:
- ``data``: pure data parallelism; params replicated along it, the batch split.
- ``fsdp``: data parallelism with params, gradients and optimizer state split along it
  (ZeRO-3 / FSDP): the ``embed`` dimension of every weight is sharded over ``fsdp``,
  gathered layer by layer when used.
- ``expert``: expert parallelism for a mixture of experts (`layers.MoeMlp`): the experts
  are split over it (and over ``tensor``: rule ``expert``), and the batch is split over it
  like ``data``, so its devices run different rows through the dense layers and each holds
  1/size of every MoE layer's experts (the partitioner moves the rows to their experts). A
  dense model's params are replicated along it, as along ``data``.
- ``sequence``: context parallelism: the tokens of each row of a teacher-forced forward
  and backward (the update, π_old and the reference) are split over it
  (``activation_length``); each device attends its own queries over the row's keys and
  values, which the partitioner all-gathers (`layers.Attention`). An all-gather and not a
  ring (Liu et al. 2023): with grouped-query attention the keys and values are H/K times
  smaller than the queries (Qwen2.5-1.5B: 12 query heads, 2 kv heads, 1 KB of bfloat16
  K/V a token a layer, so a 32k-token row gathers 32 MB a layer), one all-gather needs no
  hand-written schedule or custom backward, and the mask stays the positions' rule (any
  padding, window or packing). Llama 3's context parallelism made the same choice for
  the same reasons (Dubey et al. 2024, section 3.3.2). The samplers split rows instead
  (`Layout.sampling`): their rows over data × fsdp × expert × sequence, no token split.
- ``tensor``: tensor (Megatron) parallelism: heads, the MLP width and the vocabulary are
  split; activations are reduced across it after the o and down projections.

The batch (prompts, rollouts, mini-batches) is split over ``data`` × ``fsdp`` × ``expert``
(a sampler's rows also over ``sequence``, `Layout.sampling`). A mesh size of -1 takes the
devices the others leave, so the default ``MeshConfig()`` (data 1, fsdp -1, expert 1,
sequence 1, tensor 1) is FSDP over every device, and on one device it is that device.

A rule maps a logical name to one mesh axis, a tuple of mesh axes, or None (replicated).
`spec` refuses a logical name without a rule, and a dimension its mesh axes do not divide,
with the name, the dimension and the rule in the message: both are errors before anything
compiles.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import weakref
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from grpo_jax.infra import config_lib, registry
from grpo_jax.models import model

AXES = ("data", "fsdp", "expert", "sequence", "tensor")
BATCH_AXES = ("data", "fsdp", "expert")
P = jax.sharding.PartitionSpec

# Logical axis name -> mesh axes. Params: the model's names (`model.logical_axes`).
# Activations: the "activation_*" names of the model's constraints (`model_config`).
DEFAULT_RULES = (
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("q_heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),
  # Mixtures of experts (`layers.MoeMlp`): the experts split over `expert` × `tensor`
  # (expert parallelism), each expert's width whole, the router's outputs whole.
  ("expert", ("expert", "tensor")),
  ("expert_mlp", None),
  ("expert_router", None),
  ("layers", None),
  ("lora_rank", None),  # Adapters (`lora`): the rank is small, never split.
  ("activation_batch", BATCH_AXES),
  # Context parallelism: a row's tokens over `sequence` (size 1 unless mesh.sequence > 1).
  ("activation_length", "sequence"),
  ("activation_embed", None),
  ("activation_mlp", "tensor"),
  ("activation_vocab", "tensor"),
  ("activation_kv_heads", "tensor"),
  ("activation_head_dim", None),
  ("activation_cache", None),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
  """Mesh sizes (one may be -1: the rest of the devices) and the rules table."""

  data: int = 1
  fsdp: int = -1
  expert: int = 1
  sequence: int = 1
  tensor: int = 1
  rules: tuple = DEFAULT_RULES

  def __post_init__(self):
    sizes = {a: getattr(self, a) for a in AXES}
    for a, n in sizes.items():
      if not isinstance(n, int) or (n < 1 and n != -1):
        raise ValueError(f"mesh.{a}={n!r}; allowed: a positive int, or -1 (the rest).")
    if sum(n == -1 for n in sizes.values()) > 1:
      raise ValueError(f"mesh sizes {sizes}: at most one may be -1.")
    rules = tuple((str(k), _norm_axes(v, k)) for k, v in _as_pairs(self.rules))
    if len({k for k, _ in rules}) != len(rules):
      raise ValueError(f"mesh.rules names a logical axis twice: {[k for k, _ in rules]}.")
    object.__setattr__(self, "rules", rules)

  @classmethod
  def from_dict(cls, d) -> MeshConfig:
    return config_lib.from_dict(cls, d, where="mesh")

  def shape(self, n_devices: int) -> tuple[int, ...]:
    """The sizes in `AXES` order (data, fsdp, expert, sequence, tensor) for n_devices, -1
    resolved; errors say what would fit."""
    sizes = [getattr(self, a) for a in AXES]
    known = math.prod(n for n in sizes if n != -1)
    if -1 in sizes:
      if n_devices % known:
        raise ValueError(
          f"mesh {dict(zip(AXES, sizes))}: the fixed sizes multiply to {known}, which does "
          f"not divide the {n_devices} devices.{_cpu_hint(known)}"
        )
      sizes = [n_devices // known if n == -1 else n for n in sizes]
    if math.prod(sizes) != n_devices:
      raise ValueError(
        f"mesh {dict(zip(AXES, sizes))} has {math.prod(sizes)} devices but there are "
        f"{n_devices}; the sizes must multiply to the device count (set one to -1 to take "
        f"the rest).{_cpu_hint(math.prod(sizes))}"
      )
    return tuple(sizes)

  def sizes(self, n_devices: int) -> dict[str, int]:
    """{mesh axis: size} for n_devices (`shape`)."""
    return dict(zip(AXES, self.shape(n_devices), strict=True))

  def batch_split(self, n_devices: int) -> int:
    """How many parts a batch's rows are split into: the `BATCH_AXES` sizes' product."""
    sizes = self.sizes(n_devices)
    return math.prod(sizes[a] for a in BATCH_AXES)


def _cpu_hint(needed: int) -> str:
  """On CPU, how to get host devices to try a mesh on."""
  if jax.default_backend() != "cpu":
    return ""
  n = max(8, needed)
  return (
    f" On CPU, XLA_FLAGS=--xla_force_host_platform_device_count={n} before the command "
    f"gives {n} host devices to try the mesh on."
  )


def _as_pairs(rules):
  items = rules.items() if hasattr(rules, "items") else rules
  out = []
  for item in items:
    if len(item) != 2:
      raise ValueError(f"mesh.rules entry {item!r}: expected (logical name, mesh axes).")
    out.append(tuple(item))
  return out


def _norm_axes(v, name):
  if v is None or v == "" or v == ():
    return None
  axes = (v,) if isinstance(v, str) else tuple(v)
  for a in axes:
    if a not in AXES:
      raise ValueError(f"mesh.rules[{name!r}] = {v!r}: unknown mesh axis {a!r}; allowed: {AXES}.")
  return axes[0] if len(axes) == 1 else axes


def make_mesh(cfg: MeshConfig, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
  """A mesh of `AXES` over `devices` (default: all, of every process). Devices of several
  TPU slices (multi-slice) get a hybrid mesh: `data` spans the slices (over the
  data-centre network), fsdp, expert, sequence and tensor stay within each slice (over
  ICI)."""
  devices = list(jax.devices() if devices is None else devices)
  shape = cfg.shape(len(devices))
  auto = (jax.sharding.AxisType.Auto,) * len(AXES)
  n_slices = slices_of(devices)
  if n_slices > 1:
    grid = _hybrid_grid(shape, devices, n_slices)
  else:
    try:  # Physical topology where jax knows it (TPU slices): ICI-friendly order.
      grid = jax.experimental.mesh_utils.create_device_mesh(shape, devices=devices)
    except Exception:  # noqa: BLE001 -- CPU and uncommon topologies: the listed order.
      grid = np.asarray(devices, dtype=object).reshape(shape)
  return jax.sharding.Mesh(process_major(grid), AXES, axis_types=auto)


def process_major(grid: np.ndarray) -> np.ndarray:
  """The grid's devices reordered so that each process's come one after another (in the
  grid's own order among them), same shape. Rows split over the batch axes then give each
  process one contiguous block of rows, as a multi-host launch needs to build a global
  batch from each host's rows (`distributed.local_rows`). jax's TPU mesh follows the
  physical torus, which interleaves hosts: on v5e:4x8 (8 hosts) process 0 held rows 0, 1,
  8 and 9 of 32 (found by compiling for it, `aot.process_rows`). Within a process the
  physical order stays, so a tensor axis of at most a host's chips stays on one host; a
  collective over a whole axis reaches the same devices in either order."""
  flat = list(grid.flat)
  rank = {id(d): i for i, d in enumerate(flat)}
  flat.sort(key=lambda d: (d.process_index, rank[id(d)]))
  return np.asarray(flat, dtype=object).reshape(grid.shape)


def slices_of(devices: Sequence[Any]) -> int:
  """How many TPU slices `devices` span (1 for CPU, GPU and one slice)."""
  return len({getattr(d, "slice_index", 0) for d in devices})


def _hybrid_grid(shape: tuple[int, ...], devices, n_slices: int) -> np.ndarray:
  data, *within = shape
  if data % n_slices:
    raise ValueError(
      f"mesh {dict(zip(AXES, shape))} over {n_slices} slices: data must be a multiple of "
      f"the slices ({n_slices}), since only data parallelism crosses slices (fsdp, "
      "expert, sequence and tensor collectives stay on ICI). Set config.mesh.data to a "
      "multiple of the slices."
    )
  return jax.experimental.mesh_utils.create_hybrid_device_mesh(
    (data // n_slices, *within), (n_slices, *(1,) * len(within)), devices=devices
  )


def spec(names, rules, *, shape=None, mesh: jax.sharding.Mesh | None = None, where: str = "") -> P:
  """PartitionSpec of mesh axes for a tuple of logical names.

  With `shape` and `mesh`, each dimension must be divisible by the product of its mesh
  axes' sizes. A name without a rule is an error (never silently replicated).
  """
  table = dict(rules)
  out = []
  for i, name in enumerate(names):
    if name is None:
      out.append(None)
      continue
    if name not in table:
      raise ValueError(
        f"{where or 'array'}: logical axis {name!r} has no rule in mesh.rules; add "
        f"({name!r}, <mesh axis, tuple of axes, or None>). Rules have: {sorted(table)}."
      )
    axes = table[name]
    if axes is not None and shape is not None and mesh is not None:
      size = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
      if shape[i] % size:
        raise ValueError(
          f"{where or 'array'}: dimension {i} ({name!r}) has size {shape[i]}, not divisible "
          f"by mesh axes {axes} of size {size}. Change the mesh sizes or map {name!r} to "
          "other axes (or None) in mesh.rules."
        )
    out.append(axes)
  return P(*out)


@dataclasses.dataclass(frozen=True)
class Layout:
  """A mesh and its rules: the shardings of everything the trainer puts on devices."""

  mesh: jax.sharding.Mesh
  rules: tuple
  batch_axes: tuple[str, ...] = BATCH_AXES  # The mesh axes a batch's rows are split over.

  @classmethod
  def create(cls, cfg: MeshConfig, devices=None) -> Layout:
    return cls(mesh=make_mesh(cfg, devices), rules=cfg.rules)

  @property
  def batch_size_divisor(self) -> int:
    """Rows of any batch must be a multiple of this (the data × fsdp × expert size)."""
    return math.prod(self.mesh.shape[a] for a in self.batch_axes)

  def rows(self, n: int) -> jax.sharding.NamedSharding:
    """An n-row batch: rows split over data × fsdp × expert, or replicated when n is not a
    multiple of that size (e.g. a held-out set whose size the mesh does not divide)."""
    return self.named(P(self.batch_axes)) if n % self.batch_size_divisor == 0 else self.replicated

  def sampling(self, prompts: int) -> Layout:
    """The layout of a sampler of `prompts` prompts. With context parallelism (mesh axis
    `sequence` of size c > 1) a sampler splits rows, not tokens: its rows over data ×
    fsdp × sequence ("activation_batch") and no activation over `sequence` (a decode step
    has one token a row; a prefill's rows are split instead), so the c devices of a row
    group decode c different rows rather than repeating one row's work. This layout
    itself when c = 1 or when data·fsdp·c does not divide `prompts` (the sequence devices
    then repeat their group's rows)."""
    c = self.mesh.shape["sequence"]
    if c == 1 or "sequence" in self.batch_axes or prompts % (self.batch_size_divisor * c):
      return self
    axes = (*self.batch_axes, "sequence")

    def rule(name, v):
      if name == "activation_batch":
        return axes
      kept = tuple(a for a in ((v,) if isinstance(v, str) else v or ()) if a != "sequence")
      return kept[0] if len(kept) == 1 else kept or None

    rules = tuple((k, rule(k, v)) for k, v in self.rules)
    return dataclasses.replace(self, rules=rules, batch_axes=axes)

  @contextlib.contextmanager
  def context(self):
    """The mesh and rules in scope: activation constraints in the model take effect
    when a function is traced inside."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
      yield

  def named(self, pspec: P) -> jax.sharding.NamedSharding:
    return jax.sharding.NamedSharding(self.mesh, pspec)

  @property
  def replicated(self) -> jax.sharding.NamedSharding:
    return self.named(P())

  def logical(self, logical_tree, abstract_tree, *, where: str = "params"):
    """NamedShardings for a tree of logical PartitionSpecs (e.g. `model.logical_axes`)
    and the matching tree of shapes; validates every rule and divisibility."""

    def one(path, names, x):
      return self.named(
        spec(
          tuple(names),
          self.rules,
          shape=x.shape,
          mesh=self.mesh,
          where=f"{where}/{jax.tree_util.keystr(path, simple=True, separator='/')}",
        )
      )

    return jax.tree_util.tree_map_with_path(
      one, logical_tree, abstract_tree, is_leaf=lambda x: isinstance(x, P)
    )


def param_shardings(layout: Layout, model_cfg: model.ModelConfig, *, stored: bool = False):
  """NamedShardings of the params, from their logical names and the rules: as `model.init`
  makes them, or (stored=True) as a run keeps them (`model.cast_base`: an int8 base's
  kernel is a (Q, s) pair, s unsharded on the axis it reduces)."""
  boxed = _abstract_params(model_cfg)
  if stored:
    boxed = model.cast_base(boxed, model_cfg)
  return layout.logical(nn.get_partition_spec(boxed), nn.unbox(boxed), where="params")


# Traced once per config (and jitted once per layout and config, below), not at every call:
# a process that builds several runs of one model (a notebook, the tests) traced the same
# init each time (the tests: 15.7 of the 74 s that test_lora, test_paged, test_rl,
# test_train and test_episodes spent in one process tracing, lowering and loading programs
# it had built before; 2.5 s after).
@functools.lru_cache(maxsize=16)
def _abstract_params(model_cfg: model.ModelConfig):
  """The boxed params' shapes and logical names (`model.init_boxed`, nothing computed)."""
  return jax.eval_shape(functools.partial(model.init_boxed, model_cfg), jax.random.key(0))


def init_params(layout: Layout, model_cfg: model.ModelConfig, key):
  """Params created directly in their shards: eval_shape -> shardings -> jit(init,
  out_shardings). No device (or host) ever holds the full unsharded tree."""
  # Outside layout.context(): Flax's DenseGeneral initialises a flattened 2-D kernel, to
  # which the boxes' rank-3 constraints could not apply; out_shardings places the result.
  return _init_fn(layout, model_cfg, adapters_only=False)(key)


def init_adapters(layout: Layout, model_cfg: model.ModelConfig, key):
  """Fresh adapters (model.lora) in their shards; the base's init is never computed (the
  jitted function returns only the adapters, so XLA drops the rest)."""
  return _init_fn(layout, model_cfg, adapters_only=True)(key)


@functools.lru_cache(maxsize=16)
def _init_fn(layout: Layout, model_cfg: model.ModelConfig, *, adapters_only: bool):
  """key -> the params (or only the adapters) in their shards, jitted."""
  shardings = param_shardings(layout, model_cfg)
  if adapters_only:
    return jax.jit(lambda k: model.init(model_cfg, k)["lora"], out_shardings=shardings["lora"])
  return jax.jit(functools.partial(model.init, model_cfg), out_shardings=shardings)


def tree_shardings(layout: Layout, build_boxed, *args, where: str = "state"):
  """Shardings of the pytree `build_boxed(*args)` returns when its params come from
  `model.init_boxed`: boxed leaves (params and everything the optimizer derives from
  them: Adam's moments) get their logical names' shardings; other leaves (step
  counters, scalars) are replicated. Nothing is computed (eval_shape)."""
  boxed = jax.eval_shape(build_boxed, *args)
  abstract = nn.unbox(boxed)
  return layout.logical(nn.get_partition_spec(boxed), abstract, where=where)


def _place_abstract(x, s: jax.sharding.Sharding):
  """An abstract leaf takes `s`, as an array would be moved onto it (e.g. a sampler's
  rollouts, split over `sequence` too, `Layout.sampling`, lowered as the arguments of a
  trainer's function); concrete leaves are left as they are (lowering reads their shapes
  only, and a compile-only target such as a TPU topology cannot hold them)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s, weak_type=x.weak_type)
  return x


def _place(x, s: jax.sharding.Sharding):
  """device_put of one leaf (an abstract one takes `s`, `_place_abstract`). Several
  processes: a host value (numpy, or an array on this process's devices, e.g. a key or
  hyperparameters made eagerly) is taken to be the same on every process and becomes the
  global array (each process puts its own shards). An array already on `s` is returned
  as is: device_put would return it too, but at about 40 µs a leaf (a train state of 110
  leaves: ~5 ms a step) against 0.3 µs for the check."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return _place_abstract(x, s)
  if isinstance(x, jax.Array) and x.sharding == s:
    return x
  if isinstance(x, jax.Array) and x.is_fully_addressable and not s.is_fully_addressable:
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = _place(jax.random.key_data(x), s)
      return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    x = np.asarray(x)
  return jax.device_put(x, s)


class _Same:
  """A key part equal only to itself (`_structure`: a value without a by-value key)."""

  __slots__ = ("value",)

  def __init__(self, value):
    self.value = value

  def __eq__(self, other):
    return isinstance(other, _Same) and other.value is self.value

  def __hash__(self):
    return id(self.value)


def _structure(x):
  """A hashable key equal for two values that compute the same when jitted: partials by
  their function and arguments, tuples, frozen dataclasses (configs) by their type and
  fields, lists and dicts (a config's options) by their items, scalars by type and value
  (floats by repr: 1, 1.0 and True differ, so do 0.0 and -0.0), hashable objects (functions,
  shardings, meshes) as they are; anything else (an array, a dataclass without value
  equality) only by identity."""
  if isinstance(x, functools.partial):
    kwargs = tuple(sorted((k, _structure(v)) for k, v in x.keywords.items()))
    return (type(x), _structure(x.func), tuple(map(_structure, x.args)), kwargs)
  if isinstance(x, (tuple, list)):  # NamedTuples too (an optax transformation).
    return (type(x), tuple(map(_structure, x)))
  if type(x) is dict:  # A config's options (`spec.RLConfig.loss_hyper`), in their order.
    return (dict, tuple((repr(k), _structure(v)) for k, v in x.items()))
  if isinstance(x, (float, complex, np.floating, np.complexfloating)):
    return (type(x), repr(x))
  params = getattr(type(x), "__dataclass_params__", None)
  if params is not None and params.frozen and params.eq:
    return (type(x), tuple(_structure(getattr(x, f.name)) for f in dataclasses.fields(x)))
  try:
    hash(x)
  except TypeError:
    return _Same(x)
  return (type(x), x) if params is None else _Same(x)


def _tree_structure(tree):
  """A pytree's key (`_structure`): its structure and each leaf's key (shardings)."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(map(_structure, leaves))


# key -> jax.jit, while something else holds it: a run's functions (`steps.functions` keeps
# the last few runs'), a notebook's variable. Weak, so that sharing never keeps a program
# alive: each loaded XLA:CPU program holds a few memory mappings, and a test process that
# kept 256 jits past their runs neared the kernel's 65,530 (58k after five test modules,
# 35k without) and crashed on its next load.
_JITS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def jit(fn, *, context=None, **options):
  """`jax.jit(fn, **options)`, one object for every equal function, options and
  `context` (`_structure`) while one is alive: a jit is traced, lowered and its program
  loaded once per object, and a run's functions are rebuilt whenever any config field
  differs (a notebook that changes the learning rate rebuilds its sampler), so equal
  pieces of the runs kept share one. `context`: what the trace also reads (the `Layout`
  whose rules the model's constraints follow); in/out shardings are compared leaf by
  leaf. Any registration since (`registry.changes`: a variant redefined) makes new ones.
  Code that patches a module's function between runs (a test's flipped twin) clears
  `_JITS` as well."""
  trees = tuple(sorted((k, _tree_structure(v)) for k, v in options.items()))
  key = (_structure(fn), _structure(context), trees, registry.changes())
  jitted = _JITS.get(key)
  if jitted is None:
    jitted = _JITS[key] = jax.jit(fn, **options)
  return jitted


class Jitted:
  """jax.jit with explicit in/out shardings, traced and run inside the layout's context.

  Arguments are first placed on their in_shardings (a no-op for arrays already there),
  so callers may pass host arrays or arrays with another sharding; trailing arguments
  left out are passed as None. A sharding entry may
  be a pytree prefix: one NamedSharding for a whole RolloutBatch. Equal functions on
  equal shardings share one jax.jit (`jit`).
  """

  def __init__(self, layout: Layout, fn, *, in_shardings, out_shardings, donate_argnums=()):
    self.layout, self.in_shardings = layout, tuple(in_shardings)
    self.jitted = jit(
      fn,
      context=layout,
      in_shardings=self.in_shardings,
      out_shardings=out_shardings,
      donate_argnums=donate_argnums,
    )

  def place(self, args, *, abstract: bool = False):
    """The arguments on the in_shardings (abstract ones too); abstract=True: only those
    (`_place_abstract`: for a compile-only target)."""
    # Trailing arguments left out are None: the wrapped functions' optional inputs
    # (e.g. preparation.finish_prepare's scorable_N, keep_N, prov).
    args = tuple(args) + (None,) * (len(self.in_shardings) - len(args))
    one = _place_abstract if abstract else _place
    return tuple(
      jax.tree.map(one, a, jax.tree.broadcast(s, a))
      for a, s in zip(args, self.in_shardings, strict=True)
    )

  def __call__(self, *args):
    with self.layout.context():
      return self.jitted(*self.place(args))

  def lower(self, *args):
    with self.layout.context():
      return self.jitted.lower(*self.place(args))

  def _cache_size(self) -> int:
    return self.jitted._cache_size()
