"""Gradient rank and sparsity (arXiv 2606.29238; RESEARCH.md §4.2).

Matrices: (a) per-rollout gradients, one row per rollout, one column per parameter of a
subset (`grads.per_rollout_grads`, optionally projected to k columns); (b) per-layer
update matrices ΔW from two parameter pytrees (`update_matrices`); (c) any stack of rows
the caller builds (e.g. per-step gradients over training).

Effective ranks of M with singular values σ_1 >= σ_2 >= ... >= 0 (the paper does not say
which it uses, so all three are reported, with the normalisation stated):

  entropy rank   exp(H(p)), p_i = σ_i / Σ_j σ_j        (Roy & Vetterli 2007, EUSIPCO;
                 normalised by Σσ, not Σσ²)
  stable rank    Σ σ_i² / σ_1² = ‖M‖_F² / ‖M‖_2²      (Rudelson & Vershynin 2007)
  energy rank_q  min{k : Σ_{i<=k} σ_i² >= q Σ σ_i²}     for q in {0.90, 0.95, 0.99}

For an n×n identity all three are n (energy ranks ⌈q·n⌉). A rank-r matrix has entropy
and stable rank in [1, r] and energy ranks <= r.

Sparsity: zero-variance groups (all rewards equal: the group contributes no gradient
under group-baseline advantages), near-zero coordinates |g_j| <= ε·max|g|, and Hoyer
sparsity (√n − ‖x‖₁/‖x‖₂)/(√n − 1) (Hoyer 2004, JMLR), 0 for a constant vector and 1
for a single non-zero.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.rl import advantages

ENERGY_LEVELS = (0.9, 0.95, 0.99)
# Relative slack when comparing cumulative energy with q·total, so that a cut exactly on a
# level (σ = [3, 1]: 9/10 = 0.9) is not lost to float rounding.
_ENERGY_RTOL = 1e-6


# ----------------------------------------------------------------------------
# Matrices.
# ----------------------------------------------------------------------------


def _path_name(path) -> str:
  return jax.tree_util.keystr(path, simple=True, separator="/")


def as_matrix(x, *, name: str = ""):
  """A parameter (or update) as a 2-D [in, out] matrix: 2-D as is; the attention output
  kernel [H, E, D] as [H·E, D]; other N-D kernels [D, ...] as [D, prod(rest)]; 1-D
  vectors (norm scales, biases) as [1, n]."""
  if x.ndim <= 1:
    return x.reshape(1, -1)
  if x.ndim == 2:
    return x
  if name.endswith("o/kernel"):
    return x.reshape(-1, x.shape[-1])
  return x.reshape(x.shape[0], -1)


def update_matrices(params_before, params_after, *, min_ndim: int = 2) -> dict[str, np.ndarray]:
  """{parameter path: ΔW = after − before as a 2-D float32 matrix} for every leaf with
  ndim >= min_ndim (host, numpy).

  Scanned layers (a leading "layers" axis of size L) are split into one matrix per layer,
  named "layers/<i>/...".
  """
  out = {}
  flat_b = jax.tree_util.tree_flatten_with_path(jax.device_get(params_before))[0]
  flat_a = jax.tree.leaves(jax.device_get(params_after))
  for (path, before), after in zip(flat_b, flat_a):
    name = _path_name(path)
    delta = np.asarray(after, np.float32) - np.asarray(before, np.float32)
    if name.startswith("layers/"):
      for i in range(delta.shape[0]):
        sub = f"layers/{i}{name[len('layers') :]}"
        if delta[i].ndim >= min_ndim:
          out[sub] = as_matrix(delta[i], name=sub)
    elif delta.ndim >= min_ndim:
      out[name] = as_matrix(delta, name=name)
  return out


# ----------------------------------------------------------------------------
# Singular values and effective ranks (jittable).
# ----------------------------------------------------------------------------


def singular_values(m_MQ):
  """σ, descending, in float32 (float64 when x64 is on)."""
  return jnp.linalg.svd(jnp.asarray(m_MQ, jnp.float32), compute_uv=False)


def entropy_rank(sv):
  """exp(−Σ p log p), p_i = σ_i / Σσ (Roy & Vetterli 2007). 0 for a zero matrix."""
  total = jnp.sum(sv)
  p = sv / jnp.where(total > 0, total, 1.0)
  h = -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0))
  return jnp.where(total > 0, jnp.exp(h), 0.0)


def stable_rank(sv):
  """Σσ² / σ_max² (0 for a zero matrix)."""
  top = jnp.max(sv) ** 2
  return jnp.where(top > 0, jnp.sum(sv**2) / jnp.where(top > 0, top, 1.0), 0.0)


def energy_rank(sv, *, q: float):
  """min{k : Σ_{i<=k} σ_i² >= q·Σσ²} for σ sorted descending (0 for a zero matrix)."""
  e = jnp.cumsum(jnp.sort(sv)[::-1] ** 2)
  total = e[-1]
  k = jnp.sum(e < q * total * (1.0 - _ENERGY_RTOL)) + 1
  return jnp.where(total > 0, k, 0).astype(jnp.int32)


def rank_metrics(m_MQ, *, levels: Sequence[float] = ENERGY_LEVELS) -> dict:
  """{"entropy_rank", "stable_rank", "energy_rank_90", ..., "sigma_max", "fro"} of a
  matrix. Jittable (levels static)."""
  sv = singular_values(m_MQ)
  out = {
    "entropy_rank": entropy_rank(sv),
    "stable_rank": stable_rank(sv),
    "sigma_max": jnp.max(sv),
    "fro": jnp.sqrt(jnp.sum(sv**2)),
  }
  for q in levels:
    out[f"energy_rank_{round(q * 100):d}"] = energy_rank(sv, q=q)
  return out


def rank_report(matrices: dict, *, prefix: str = "rank", **options) -> dict[str, float]:
  """Flat {prefix}/{matrix name}/{metric}: `rank_metrics` of each named matrix (host)."""
  out = {}
  for name, m in matrices.items():
    for k, v in jax.device_get(rank_metrics(m, **options)).items():
      out[f"{prefix}/{name}/{k}"] = float(v)
  return out


# ----------------------------------------------------------------------------
# Sparsity.
# ----------------------------------------------------------------------------


def _vector(x):
  leaves = jax.tree.leaves(x)
  return jnp.concatenate([jnp.ravel(jnp.asarray(leaf, jnp.float32)) for leaf in leaves])


def hoyer_sparsity(x):
  """(√n − ‖x‖₁/‖x‖₂)/(√n − 1) over all entries of an array or pytree (Hoyer 2004).
  1 for one non-zero entry, 0 for equal magnitudes; 0 for a zero vector."""
  v = _vector(x)
  n = v.size
  l1, l2 = jnp.sum(jnp.abs(v)), jnp.sqrt(jnp.sum(v * v))
  if n < 2:
    return jnp.float32(0.0)
  return jnp.where(
    l2 > 0, (math.sqrt(n) - l1 / jnp.where(l2 > 0, l2, 1.0)) / (math.sqrt(n) - 1), 0.0
  )


def near_zero_fraction(x, *, eps: float = 1e-3):
  """Fraction of entries with |x_j| <= ε·max|x| (array or pytree)."""
  a = jnp.abs(_vector(x))
  return jnp.mean((a <= eps * jnp.max(a)).astype(jnp.float32))


def zero_variance_groups(rewards_B, group_ids_B):
  """Fraction of groups whose rewards are all equal (`advantages.group_stats`)."""
  return advantages.group_stats(jnp.asarray(rewards_B, jnp.float32), jnp.asarray(group_ids_B))[
    "zero_var_groups"
  ]


# ----------------------------------------------------------------------------
# Mini-batch gradient variance.
# ----------------------------------------------------------------------------


def _units(g_NQ, group_ids_N, num_groups):
  if group_ids_N is None:
    return g_NQ
  return jax.ops.segment_sum(g_NQ, group_ids_N, num_segments=num_groups)


def minibatch_grad_variance(
  g_NQ, *, batch_size: int, num_draws: int, key: jax.Array, group_ids_N=None, num_groups=None
):
  """Monte-Carlo tr Cov[ḡ_b]: ḡ_b the mean of `batch_size` units drawn uniformly without
  replacement, over `num_draws` draws: (1/D) Σ_b ‖ḡ_b − ḡ‖², ḡ the mean of all units (the
  exact expectation of ḡ_b, so the estimate is unbiased). Jittable (sizes static).

  Units are rows (rollouts) or, with group_ids_N, groups (rows summed per group id in
  [0, num_groups)): the variance across resampled groups that IBPO's variance claim and
  group-level planners are about (RESEARCH.md §3.3).
  """
  u_UQ = _units(jnp.asarray(g_NQ, jnp.float32), group_ids_N, num_groups)
  U = u_UQ.shape[0]
  mean_Q = jnp.mean(u_UQ, axis=0)
  keys = jax.random.split(key, num_draws)
  idx_Db = jax.vmap(lambda k: jax.random.choice(k, U, (batch_size,), replace=False))(keys)
  means_DQ = jnp.mean(u_UQ[idx_Db], axis=1)
  return jnp.mean(jnp.sum((means_DQ - mean_Q[None, :]) ** 2, axis=1))


def minibatch_grad_variance_exact(g_NQ, *, batch_size: int, group_ids_N=None, num_groups=None):
  """Closed form of `minibatch_grad_variance`: (U − m)/(m(U − 1)) · (1/U) Σ_u ‖g_u − ḡ‖²
  for m = batch_size units out of U drawn without replacement (finite-population
  correction)."""
  u_UQ = _units(jnp.asarray(g_NQ, jnp.float32), group_ids_N, num_groups)
  U, m = u_UQ.shape[0], batch_size
  pop = jnp.mean(jnp.sum((u_UQ - jnp.mean(u_UQ, axis=0)[None, :]) ** 2, axis=1))
  return (U - m) / (m * max(U - 1, 1)) * pop


def sparsity_report(
  g,
  *,
  rewards_B=None,
  group_ids_B=None,
  eps: float = 1e-3,
  prefix: str = "sparsity",
) -> dict[str, float]:
  """Flat {prefix}/{hoyer, near_zero, zero_var_groups}: Hoyer sparsity and near-zero
  fraction of a gradient (array or pytree), and the zero-variance group fraction when
  rewards are given."""
  out = {
    f"{prefix}/hoyer": float(hoyer_sparsity(g)),
    f"{prefix}/near_zero": float(near_zero_fraction(g, eps=eps)),
  }
  if rewards_B is not None:
    out[f"{prefix}/zero_var_groups"] = float(zero_variance_groups(rewards_B, group_ids_B))
  return out
