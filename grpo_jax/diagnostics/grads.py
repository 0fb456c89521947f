"""Per-token and per-rollout gradients over a parameter subset, and seeded projections.

A "subset" is a part of the parameter pytree (the LM head, the last block, the final norm,
...) selected by `param_subset`, which returns the subset and a `merge` that puts a
modified subset back into the full pytree, so `fn(sub) = f(merge(sub))` differentiates
f with respect to the subset only.

`jacobian_rows(fn, sub)` returns the Jacobian of a vector-valued fn: one row per output
(a token's log-prob, or a rollout's objective), one column per parameter of the subset,
g_{s,:} = vec(∇_sub fn(sub)_s). It runs one VJP per row (the rows in chunks of
`chunk_size`, vmapped) and never stores more than a chunk of [Q]-sized gradients at once.
With `project_dim = k`, every row is mapped by the same seeded random projection R [Q, k]
(Johnson–Lindenstrauss: E[⟨R^T x, R^T y⟩] = ⟨x, y⟩), which keeps big subsets (a 100M-
parameter block) at [S, k].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from grpo_jax.models import logprobs
from grpo_jax.models import model as model_lib

PROJECTIONS = ("gaussian", "countsketch")


# ----------------------------------------------------------------------------
# Parameter subsets.
# ----------------------------------------------------------------------------


def param_subset(params, name: str, *, cfg: model_lib.ModelConfig):
  """(subset pytree, merge) for a named part of a grpo_jax model's params.

  name: "lm_head" (the untied [D, V] kernel; a tied model has no separate head, see
  `coupling.lm_head_weight` for the output use of the embedding), "last_block" (layer
  L−1, sliced from the stacked "layers" when scan_layers), or any top-level key
  ("embed", "final_norm", "layer_3", ...). merge(sub) returns params with the subset
  replaced and everything else unchanged (differentiable in sub).
  """
  if name == "lm_head" and cfg.tie_embeddings:
    raise ValueError(
      "param_subset('lm_head') needs an untied head (tie_embeddings=False); a tied model's "
      "output projection is the embedding, use 'embed' (input and output use) or the "
      "analytic coupling.head_coupling (output use only)."
    )
  if name == "last_block" and cfg.scan_layers:
    stacked = params["layers"]
    sub = jax.tree.map(lambda x: x[-1], stacked)

    def merge_scanned(s):
      return {**params, "layers": jax.tree.map(lambda full, x: full.at[-1].set(x), stacked, s)}

    return sub, merge_scanned
  key = f"layer_{cfg.n_layers - 1}" if name == "last_block" else name
  if key not in params:
    raise ValueError(f"No parameter subset {name!r}; top-level keys: {sorted(params)}.")
  return params[key], lambda s: {**params, key: s}


def num_params(tree) -> int:
  return sum(x.size for x in jax.tree.leaves(tree))


# ----------------------------------------------------------------------------
# Projections.
# ----------------------------------------------------------------------------


def make_projector(example_tree, *, dim: int, key: jax.Array, kind: str = "gaussian"):
  """A fixed linear map tree -> [dim], y = Σ_leaf R_leaf^T vec(leaf), seeded by `key`.

  gaussian: R entries iid N(0, 1/dim), held as one [q_leaf, dim] matrix per leaf.
  countsketch (sparse JL, Charikar et al. 2002): each coordinate goes to one random bucket
  with a random sign, R_{j, b(j)} = s_j; holds only [Q] ints and signs, for big subsets.
  Both satisfy E[RR^T] = I, so inner products and norms are preserved in expectation.
  """
  if kind not in PROJECTIONS:
    raise ValueError(f"Projection kind {kind!r}; allowed: {PROJECTIONS}.")
  leaves = jax.tree.leaves(example_tree)
  parts = []
  for i, leaf in enumerate(leaves):
    k = jax.random.fold_in(key, i)
    if kind == "gaussian":
      parts.append(jax.random.normal(k, (leaf.size, dim), jnp.float32) / math.sqrt(dim))
    else:
      kb, ks = jax.random.split(k)
      bucket = jax.random.randint(kb, (leaf.size,), 0, dim)
      parts.append((bucket, jax.random.rademacher(ks, (leaf.size,), dtype=jnp.float32)))

  def project(tree):
    y_Q = jnp.zeros((dim,), jnp.float32)
    for leaf, part in zip(jax.tree.leaves(tree), parts):
      x = leaf.reshape(-1).astype(jnp.float32)
      if kind == "gaussian":
        y_Q = y_Q + jnp.dot(x, part, precision=jax.lax.Precision.HIGHEST)
      else:
        y_Q = y_Q + jax.ops.segment_sum(part[1] * x, part[0], num_segments=dim)
    return y_Q

  return project


def _flatten(tree):
  return ravel_pytree(jax.tree.map(lambda x: x.astype(jnp.float32), tree))[0]


# ----------------------------------------------------------------------------
# Jacobian rows.
# ----------------------------------------------------------------------------


def jacobian_rows(
  fn: Callable,
  params_subset,
  *,
  project_dim: int | None = None,
  key: jax.Array | None = None,
  kind: str = "gaussian",
  chunk_size: int | None = None,
):
  """g_SQ: row s = vec(∇_sub fn(sub)_s) for a vector-valued fn(sub) -> [S]. Jittable.

  With project_dim = k the rows are R^T vec(∇) [S, k] (`make_projector`, seeded by key,
  default key 0). chunk_size bounds how many VJPs run vmapped at once (None: all S).
  """
  out_S, vjp_fn = jax.vjp(fn, params_subset)
  if out_S.ndim != 1:
    raise ValueError(f"jacobian_rows needs fn -> a vector [S], got shape {out_S.shape}.")
  flat = _flatten
  if project_dim is not None:
    key = jax.random.key(0) if key is None else key
    flat = make_projector(params_subset, dim=project_dim, key=key, kind=kind)

  def row(e_S):
    return flat(vjp_fn(e_S.astype(out_S.dtype))[0])

  eye_SS = jnp.eye(out_S.shape[0], dtype=jnp.float32)
  if chunk_size is None:
    return jax.vmap(row)(eye_SS)
  return jax.lax.map(row, eye_SS, batch_size=chunk_size)


def per_token_grads(fn: Callable, params_subset, **options):
  """g_SQ = rows ∇_sub log π(y_s) for fn(sub) -> log π of S tokens (`jacobian_rows`).

  The per-token score vectors g_{i,t} of RESEARCH.md notation, restricted to the subset;
  K = g g^T is the empirical NTK block of Ren & Sutherland (arXiv 2407.10490).
  """
  return jacobian_rows(fn, params_subset, **options)


def token_logp_fn(
  merge, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, rows_S, cols_S, *, model_fn
):
  """fn(sub) -> log π(o_{r_s, c_s}) [S], for `per_token_grads` over a subset."""

  def fn(sub):
    logp_BT, _ = logprobs.completion_logprobs(
      merge(sub), prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, model_fn=model_fn
    )
    return logp_BT[rows_S, cols_S]

  return fn


def rollout_objective_fn(
  merge, prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, coef_BT, *, model_fn
):
  """fn(sub) -> J_i = Σ_t c_{i,t}·log π(o_{i,t}) per rollout [B].

  With c = w·A (aggregation weight × advantage) the row gradient ∇J_i is rollout i's
  policy-gradient contribution (the descent direction of −J); the rank analysis of
  arXiv 2606.29238 stacks these rows (RESEARCH.md §4.2 construction (a)).
  """

  def fn(sub):
    logp_BT, _ = logprobs.completion_logprobs(
      merge(sub), prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT, model_fn=model_fn
    )
    return jnp.sum(jnp.where(mask_BT, coef_BT * logp_BT, 0.0), axis=1)

  return fn


def per_rollout_grads(fn: Callable, params_subset, **options):
  """g_BQ = rows ∇_sub J_i for fn(sub) -> [B] per-rollout objectives (`jacobian_rows`)."""
  return jacobian_rows(fn, params_subset, **options)
