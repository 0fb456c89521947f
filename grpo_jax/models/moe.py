"""A mixture of experts' math (`layers.MoeMlp` holds the weights): top-k routing, the
experts over the rows routed to each (grouped matmuls), and the load-balancing loss.

Grouped matmuls, by `model.moe_impl`:
- "xla" (the default, every backend): `jax.lax.ragged_dot`.
- "megablox": JAX's Pallas TPU grouped matmul (`jax.experimental.pallas.ops.tpu.megablox`,
  MaxText's MoE kernel), forward and custom VJP. TPU only. Why: compiled for TPU (v5e,
  libtpu 0.0.42.1), XLA lowers ragged_dot's weight gradient as a masked dense matmul per
  expert, so its work grows with the expert count X: for [4096, 512] bfloat16 rows into
  width 256 (forward 1.07 GFLOP), XLA counts 9.7 GFLOP for the gradient at X = 8, 70 at
  X = 64 and 139 at X = 128 (Qwen3-30B-A3B's count); megablox's kernels declare 2.15 at
  every X (their Pallas cost estimate: XLA cannot see inside a kernel), twice the
  forward as a dense layer's (`experiments/moe_tpu_cost.py`). On the quick config's
  update (v5e:2x2, 4 experts) the temporaries are 56 MB against 132.
  Under a mesh it runs per device in a `jax.shard_map`:
  - where the rules table splits the experts (its "expert" row, by default `expert` ×
    `tensor`, `sharding.DEFAULT_RULES`; mesh sizes above 1 that divide X), expert
    parallelism (`_expert_parallel`): each device holds X / n of the experts, gathers
    the tokens of the devices that share its experts (the expert-axis rows), runs the
    kernel over its own experts' groups only (megablox's `group_offset`: its grid covers
    those groups' rows, the other rows come back 0), and the partial outputs are summed
    back onto the devices that own the tokens (a reduce-scatter over the axes that split
    the tokens, an all-reduce over the others, in float32). The expert weights are never
    gathered; the collectives move [tokens, D] activations. The kernel's work follows
    the device's own rows, but its buffers hold every gathered row (static shapes: any
    number of them may pick this device's experts, and no token is dropped), so the
    expert activations per device grow with the expert-axis size; a ragged all-to-all
    that sends each row to its experts' device only is not built.
  - else the tokens split over the batch axes, each device routing and sorting its own,
    with every expert's weights gathered to it (as FSDP gathers a dense layer's).
  "xla" leaves the split to XLA's partitioner (ragged_dot over experts split the same
  way).
- "megablox_interpret": that kernel in Pallas's interpreter, any backend (slow: tests).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from grpo_jax.models import kernels

IMPLS = ("xla", "megablox", "megablox_interpret")
_TILE = 128  # megablox's row, contraction and output tiles (at most).


def check_impl(impl: str) -> None:
  """ValueError naming what was given and what is allowed, unless impl is in IMPLS."""
  if impl not in IMPLS:
    raise ValueError(
      f"model.moe_impl={impl!r}; allowed: 'xla' (jax.lax.ragged_dot, every backend, the "
      "default), 'megablox' (a Pallas grouped matmul, TPU only), 'megablox_interpret' "
      "(that kernel interpreted, any backend: slow, for tests)."
    )


def route(logits_NX, *, k: int, normalized: bool, replay_NK=None):
  """(probs p [N, X] float32, top-k weights w [N, k], experts e [N, k]):
  p = softmax(logits), (w, e) = top_k(p, k), w / Σw when `normalized`.

  Routing replay (`replay_NK`, int, -1 where a token routes itself): a token with
  recorded experts r uses e = r and w = p_r (/ Σ_j p_rj when `normalized`): the experts
  the sampler chose, weighted by this forward's router, so the router still gets its
  gradient (R3, "Stabilizing MoE Reinforcement Learning by Aligning Training and
  Inference Routers", Ma et al. 2025). A token replays all k of its experts or none."""
  probs_NX = jax.nn.softmax(logits_NX.astype(jnp.float32), axis=-1)
  w_NK, e_NK = jax.lax.top_k(probs_NX, k)
  if replay_NK is not None:
    replayed_N1 = replay_NK[:, :1] >= 0
    e_NK = jnp.where(replayed_N1, replay_NK.astype(e_NK.dtype), e_NK)
    w_NK = jnp.take_along_axis(probs_NX, e_NK, axis=-1)
  if normalized:
    w_NK = w_NK / w_NK.sum(-1, keepdims=True)
  return probs_NX, w_NK, e_NK


def route_dtype(n_experts: int):
  """The smallest signed integer type holding expert ids and -1: recorded routes are
  [rows, tokens, layers, k] (int8 up to 127 experts: 8 bytes a token a layer at k = 8)."""
  return jnp.int8 if n_experts <= 127 else jnp.int16 if n_experts <= 32767 else jnp.int32


def experts(x_ND, w_NK, e_NK, gate_XDF, up_XDF, down_XFD, *, act, impl: str, dtype):
  """y_n = Σ_j w_nj · down_e(act(gate_e(x_n)) * up_e(x_n)), e = e_nj, over the N·k
  (token, expert) pairs sorted by expert, each expert's matmuls over its rows only."""
  args = (x_ND, w_NK, e_NK, gate_XDF, up_XDF, down_XFD)
  body = functools.partial(_pairs, act=act, impl=impl, dtype=dtype)
  if impl == "xla":
    return body(*args)
  mesh = jax.sharding.get_abstract_mesh()
  interpret = impl == "megablox_interpret"
  kernels.check_platform(mesh, interpret=interpret, setting="moe_impl", impl="megablox")
  if mesh.empty:
    return body(*args)
  P = jax.sharding.PartitionSpec
  # Each device its own tokens (all of them where the batch axes do not divide N).
  tokens, whole = kernels.local_spec(("activation_batch",), x_ND.shape[:1], mesh), P()
  split = _axes(kernels.local_spec(("expert",), gate_XDF.shape[:1], mesh)[0])
  local, weights = body, whole
  if math.prod(mesh.shape[a] for a in split) > 1:
    local = _expert_parallel(body, tokens=tokens, split=split, mesh=mesh, dtype=dtype)
    weights = P(split)
  return jax.shard_map(
    local,
    mesh=mesh,
    in_specs=(tokens, tokens, tokens, weights, weights, weights),
    out_specs=tokens,
    check_vma=False,
  )(*args)


def _axes(entry) -> tuple[str, ...]:
  """A PartitionSpec entry as a tuple of mesh axes."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def _expert_parallel(body, *, tokens, split: tuple[str, ...], mesh, dtype):
  """`experts`' per-device function with the experts split over the mesh axes `split`
  (see the module docstring): device i of the split holds experts [i·X/n, (i+1)·X/n).
  The axes of `split` that also split the tokens gather them (each device then sees
  every token its experts may take) and reduce-scatter the output back; the others hold
  the same tokens already and all-reduce it."""
  gather = tuple(a for a in split if a in _axes(tokens[0]))
  reduce = tuple(a for a in split if a not in gather)
  n = math.prod(mesh.shape[a] for a in split)

  def local(x_ND, w_NK, e_NK, gate_XDF, up_XDF, down_XFD):
    if gather:
      x_ND, w_NK, e_NK = (
        jax.lax.all_gather(a, gather, axis=0, tiled=True) for a in (x_ND, w_NK, e_NK)
      )
    X = gate_XDF.shape[0]
    offset = (jax.lax.axis_index(split) * X).astype(jnp.int32)
    # Summed across devices in float32: a token's k experts may sit on several.
    y_ND = body(x_ND, w_NK, e_NK, gate_XDF, up_XDF, down_XFD, n_experts=X * n,
                group_offset=offset, out_dtype=jnp.float32)  # fmt: skip
    if reduce:
      y_ND = jax.lax.psum(y_ND, reduce)
    if gather:
      y_ND = jax.lax.psum_scatter(y_ND, gather, scatter_dimension=0, tiled=True)
    return y_ND.astype(dtype)

  return local


def _pairs(
  x_ND, w_NK, e_NK, gate_XDF, up_XDF, down_XFD, *, act, impl: str, dtype, n_experts=None,
  group_offset=None, out_dtype=None,
):  # fmt: skip
  """The N·k (token, expert) pairs sorted by expert through the grouped matmuls. With
  `group_offset` (expert parallelism: the weights are experts [offset, offset + X_local)
  of `n_experts`), pairs routed elsewhere come out 0."""
  N, k = e_NK.shape
  X = n_experts or gate_XDF.shape[0]
  e_M = e_NK.reshape(-1)  # Pair m = n·k + j: token n's j-th expert.
  order_M = jnp.argsort(e_M, stable=True)
  sizes_X = jnp.bincount(e_M, length=X).astype(jnp.int32)
  xs_MD = x_ND[order_M // k]
  group = functools.partial(
    _grouped, sizes_X=sizes_X, impl=impl, dtype=dtype, group_offset=group_offset
  )
  h_MF = act(group(xs_MD, gate_XDF)) * group(xs_MD, up_XDF)
  ys_MD = group(h_MF.astype(dtype), down_XFD)
  y_NKD = ys_MD[jnp.argsort(order_M)].reshape(N, k, -1)
  if out_dtype is not None:
    y_NKD = y_NKD.astype(out_dtype)
  return jnp.einsum("nkd,nk->nd", y_NKD, w_NK.astype(y_NKD.dtype)).astype(out_dtype or dtype)


def _grouped(lhs_MK, rhs_XKF, *, sizes_X, impl: str, dtype, group_offset=None):
  """Rows [M, K] times their group's [K, F] (rows sorted by group, sizes_X per group);
  with `group_offset`, rhs holds groups [offset, offset + its X) only and the rows of the
  other groups come out 0 (megablox only)."""
  if impl == "xla":
    assert group_offset is None, "expert parallelism through ragged_dot is XLA's partitioner's"
    return jax.lax.ragged_dot(lhs_MK, rhs_XKF, sizes_X)
  from jax.experimental.pallas.ops.tpu.megablox import ops  # Only when used.

  M, K = lhs_MK.shape
  F = rhs_XKF.shape[-1]
  tm = min(_TILE, -(-M // 8) * 8)
  Mp = -(-M // tm) * tm  # Rows past Σ sizes belong to no group: computed as nothing.
  lhs = jnp.pad(lhs_MK, ((0, Mp - M), (0, 0)))
  out = ops.gmm(
    lhs,
    rhs_XKF,
    sizes_X,
    jnp.float32,
    (tm, min(_TILE, K), min(_TILE, F)),
    group_offset,
    None,
    False,
    impl == "megablox_interpret",
  )
  return out[:M].astype(dtype)


def route_flips(own_NK, replay_NK):
  """(replayed_N, flipped_N), booleans: a token replays recorded experts (replay_NK ≥ 0),
  and of those, the recorded set differs from `own_NK`, the experts this forward's router
  would take (its own top-k). Sets, not orders: top-k lists the same experts in another
  order when two weights tie."""
  replayed_N = replay_NK[:, 0] >= 0
  own_NK, replay_NK = jnp.sort(own_NK, -1), jnp.sort(replay_NK.astype(own_NK.dtype), -1)
  return replayed_N, replayed_N & jnp.any(own_NK != replay_NK, axis=-1)


def _sown_sums(intermediates, keys, *, stacked: bool) -> dict:
  """{key: the sum over the layers of what `MoeMlp` sowed under it} (each value stacked
  over the layers under nn.scan: `stacked`); 0.0 for a key nothing sowed."""
  sums = dict.fromkeys(keys, 0.0)

  def visit(tree):
    for key, value in tree.items():
      if key in sums:
        sums[key] = sums[key] + sum(v.sum(0) if stacked else v for v in value)
      elif isinstance(value, dict):
        visit(value)

  visit(intermediates)
  return sums


def flip_counts(intermediates, *, stacked: bool) -> dict:
  """{"routes_replayed": n_r, "routes_flipped": n_f} of a forward that replayed routes:
  over every layer's real tokens (so (token, layer) pairs), how many replayed recorded
  experts, and how many of those differ from the experts the forward's own router would
  have taken there (`route_flips`), its input being what replay made it. n_f / n_r is the
  trainer's `route_flip_frac`: the share of routing decisions that replay changes.
  `experiments/moe_replay.py`'s route_flip_frac compares the sampler's routes with a
  whole forward that routes itself: the two agree at the first layer (whose input replay
  cannot change) and may differ past it."""
  sums = _sown_sums(intermediates, ("replayed", "flipped"), stacked=stacked)
  return {"routes_replayed": sums["replayed"], "routes_flipped": sums["flipped"]}


def balance_loss(intermediates, *, n_experts: int, stacked: bool):
  """The load-balancing loss of a forward's routers (Switch Transformer, Fedus et al.
  2021, eq. 4; transformers' `load_balancing_loss_func`, over every layer's routing of
  the real tokens at once):

    X · Σ_{j<k, x} f_jx · P_x,   f_jx = #(tokens whose j-th choice is x) / (L·n),
                                 P_x = Σ_tokens p_x / (L·n),

  n real tokens, L layers, X experts: k at its minimum (every expert equally loaded and
  equally probable), larger as routing concentrates. `intermediates`: what `MoeMlp` sows
  per layer (each value stacked over the layers under nn.scan: `stacked`)."""
  sums = _sown_sums(intermediates, ("routed_KX", "probs_X", "tokens"), stacked=stacked)
  n = jnp.maximum(sums["tokens"], 1.0)  # L·n: every layer routes every real token.
  f_KX, p_X = sums["routed_KX"] / n, sums["probs_X"] / n
  return n_experts * jnp.sum(f_KX * p_X[None])
