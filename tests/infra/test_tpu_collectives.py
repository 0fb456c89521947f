"""What the update sends between TPU chips under FSDP, compiled from this CPU host (`aot`,
v5e:2x2: fsdp over 4 chips): each micro-batch's parameter gradients are reduce-scattered
to their fsdp shards (no parameter-shaped all-reduce), and what the update moves stays
within FSDP's own traffic (no collective-permute flood).

The model is `configs/scale.py`'s layout (float32 params, bfloat16 compute, scanned
layers, full remat, a tied embedding) at a width that compiles in seconds, with a
vocabulary large enough (8192 x 128: 73% of the weights) that its table is the
largest gradient, as in Qwen2.5-0.5B (151936 x 896: 28%).
"""

import pathlib
import re

import jax
import pytest

from grpo_jax.infra import config_lib, hlo
from grpo_jax.trainer import aot, steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPOLOGY = "v5e:2x2"


def _config():
  c = config_lib.load(str(ROOT / "configs" / "scale.py") + ":tiny")
  c.model.update(vocab_size=8192, d_model=128, n_layers=2, mlp_dim=384)
  c.model.update(dtype="bfloat16", param_dtype="float32")
  c.sampler.update(max_new_tokens=32, max_prompt_len=32, prompt_buckets=(32,), group_size=4)
  c.rl.update(num_minibatches=2, micro_batches=2)  # 16-row mini-batches, 8-row micro-batches.
  return c


# Each distinct TPU program compiled once a machine (conftest's `tpu_compiled_once`).
pytestmark = pytest.mark.usefixtures("tpu_compiled_once")


@pytest.fixture(scope="module")
def update():
  """(setup, the fsdp-split weights' shapes, compiled text, mesh) of the run's update for
  TOPOLOGY."""
  target = aot.Target.load(TOPOLOGY)
  setup, _ = aot.setup_for(_config(), target)
  fns = steps.functions_on(setup, target.devices)
  jitted, args = aot.abstract_arguments(setup, fns)["update"]
  text = aot.compile_function(jitted, args).as_text()
  params = jax.tree_util.tree_leaves_with_path(args[0].params)
  shardings = jax.tree.leaves(fns.state_shardings.params)
  # Weights: split over fsdp, 2-D or more a layer (scanned layers stack [L, ...]). Biases
  # and norm scales are small, some not split, and summed by all-reduces.
  weights = [
    x
    for (path, x), s in zip(params, shardings, strict=True)
    if "fsdp" in jax.tree.leaves(tuple(s.spec)) and x.ndim - ("layers" in str(path)) >= 2
  ]
  return setup, weights, text, fns.layout.mesh


def _micro_batches(setup) -> int:
  """How many micro-batch gradients one update computes."""
  rl = setup.rl_cfg
  return rl.ppo_epochs * rl.num_minibatches * rl.micro_batches


def _key(dims) -> tuple[int, ...]:
  """A shape up to transposition and unit axes (TPU's HLO adds [1, ...] axes)."""
  return tuple(sorted(d for d in dims if d != 1))


def _param_keys(weights) -> set[tuple[int, ...]]:
  """Every weight's shape and, for the scanned layers' [L, ...] stacks, one layer's."""
  return {_key(x.shape) for x in weights} | {_key(x.shape[1:]) for x in weights if x.ndim >= 3}


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(")
_ALL_REDUCE = re.compile(r"^\s*(?:ROOT )?%[\w.\-]+ = (.*?) all-reduce(?:-start)?\(")


def _all_reduced_arrays(text: str) -> list[tuple[int, ...]]:
  """The dims of every array an all-reduce sums, outside TPU's fused reduce-scatters (an
  all-reduce in a computation named all-reduce-scatter*, `hlo`)."""
  out, comp = [], ""
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      comp = header.group(1)
      continue
    m = _ALL_REDUCE.match(line)
    if m and not comp.startswith("all-reduce-scatter"):
      for dims in re.findall(r"\b[a-z][a-z0-9]*\[([\d,]*)\]", m.group(1)):
        out.append(tuple(int(d) for d in dims.split(",") if d))
  return out


def _by_kind(text: str, mesh) -> dict[str, hlo.Collective]:
  found = hlo.collectives(text, mesh)
  assert {c.axes for c in found} == {("fsdp",)}, found  # Mesh data=1, fsdp=4, tensor=1.
  return {c.kind: c for c in found}


def _shard_bytes(weights, mesh) -> int:
  """Float32 bytes of one device's shard of every weight."""
  return sum(x.size * 4 // mesh.shape["fsdp"] for x in weights)


def test_no_parameter_shaped_all_reduce(update):
  """An all-reduce of a gradient lands it whole on every chip (each then keeps its shard):
  twice a reduce-scatter's traffic and a full copy in HBM. On the update of
  configs/scale.py:0.5b for v5e:2x4 the tied table's float32 [151936, 896] gradient was
  all-reduced once a micro-batch (8.7 GB an update). At this size XLA turned that
  all-reduce and the slice after it into a reduce-scatter even then (the next test tells
  the two apart); at Qwen2.5's it does not (above ~0.5 GB a buffer)."""
  setup, weights, text, mesh = update
  keys = _param_keys(weights)
  assert _key((8192, 128)) in keys and _key((128, 384)) in keys
  summed = [d for d in _all_reduced_arrays(text) if _key(d) in keys]
  assert summed == [], f"parameter-shaped all-reduces: {summed}"


def test_each_weight_gradient_is_reduce_scattered_once_a_micro_batch(update):
  """Every weight's gradient reaches its fsdp shard by one reduce-scatter a micro-batch,
  in float32: the reduce-scatters' results come to exactly S x (one device's float32
  shard of every weight) an update (S micro-batches). Less: some gradient was all-reduced
  or left whole; more: one was reduced twice. Before the embedding lookup read the table
  where it lies (`layers._Embed`), the tied table's gradient was reduced twice a
  micro-batch, once for the lookup and once for the LM head: 9,961,472 bytes here
  against 5,767,168."""
  setup, weights, text, mesh = update
  rs = _by_kind(text, mesh)["reduce-scatter"]
  S = _micro_batches(setup)
  assert S == 4 and _shard_bytes(weights, mesh) == 1_441_792
  assert rs.result_bytes == S * _shard_bytes(weights, mesh)


def test_the_update_moves_no_more_than_fsdp_needs(update):
  """FSDP with full remat moves, a micro-batch, at most 10 bytes a weight parameter as
  `hlo` counts bytes (a gather or a reduction: its whole buffer): the weights gathered in
  bfloat16 for the forward, for the rematerialised forward and for the backward (3 x 2
  bytes), and their float32 gradients reduce-scattered (4 bytes). Every collective but
  the all-reduces (the loss sums, norms and biases: < 1% of one gradient) must fit in
  that, so resharding an activation or a gradient in a loop (a collective-permute flood),
  or gathering a weight more often, shows. Measured: 6.6 bytes here (9.5 while the
  table's gradient was reduced twice); 8.3 for the 0.5B update on v5e:2x4, most of it
  XLA's collective matmuls (its gathers and reduce-scatters as collective-permutes, 52 GB
  an update counted once per loop iteration)."""
  setup, weights, text, mesh = update
  kinds = _by_kind(text, mesh)
  S, n = _micro_batches(setup), sum(x.size for x in weights)
  assert kinds["all-reduce"].bytes < 0.01 * S * 4 * n
  moved = sum(c.bytes for kind, c in kinds.items() if kind != "all-reduce")
  assert moved <= S * 10 * n
