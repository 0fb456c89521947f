"""Evaluation estimators from n samples per problem: unbiased pass@k and mean@k.

Notation: a problem has n sampled completions, c of them correct; k <= n.
"""

from __future__ import annotations

import numpy as np


def _as_counts(name: str, x) -> np.ndarray:
  x = np.asarray(x)
  if x.dtype == bool or not np.issubdtype(x.dtype, np.number):
    raise ValueError(f"{name} must be integer counts, got dtype {x.dtype}.")
  if np.any(x < 0) or np.any(x != np.floor(x)):
    raise ValueError(f"{name} must be non-negative integers, got {x}.")
  return x.astype(np.int64)


def pass_at_k(num_samples_n, num_correct_c, k: int) -> np.ndarray:
  """Unbiased pass@k per problem, the chance that k of the n samples hold a correct one.

      pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)

  (1 when n − c < k: every k-subset then holds a correct sample). The product form avoids
  the huge binomials. Averaging it over problems estimates the benchmark pass@k without
  the bias of 1 − (1 − c/n)^k. pass@1 = c/n.

  Source: Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (arXiv
  2107.03374), eq. 1 and its numpy estimator (Fig. 3).

  Args:
    num_samples_n: n per problem (int or int array).
    num_correct_c: c per problem, 0 <= c <= n (broadcasts against n).
    k: the budget, 1 <= k <= n for every problem.

  Returns:
    float64 array of the broadcast shape of n and c: pass@k per problem (caller averages).
  """
  n = _as_counts("num_samples_n", num_samples_n)
  c = _as_counts("num_correct_c", num_correct_c)
  n, c = np.broadcast_arrays(n, c)
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"k must be an integer >= 1, got {k!r}.")
  if np.any(c > n):
    raise ValueError(f"num_correct_c must be <= num_samples_n, got c={c}, n={n}.")
  if np.any(k > n):
    raise ValueError(f"k={k} exceeds num_samples_n={n}: pass@k needs k <= n samples.")
  # Column j of the grid is factor i = n − j, j = 0 .. c−1; unused cells are 1.
  j_J = np.arange(int(c.max(initial=0)))
  i_PJ = n[..., None] - j_J
  factor_PJ = np.where(j_J < c[..., None], 1.0 - k / np.maximum(i_PJ, 1), 1.0)
  return np.where(n - c < k, 1.0, 1.0 - np.prod(factor_PJ, axis=-1))


def mean_at_k(correct_PK) -> float:
  """mean@k: accuracy averaged over k samples per problem, then over the P problems.

      mean@k = (1/P) Σ_p (1/k) Σ_j r_pj

  with r_pj in [0, 1] the correctness of sample j of problem p (K = k samples each). It
  estimates the expected single-sample accuracy, E[r], with less variance than one sample
  per problem; for binary r it is the mean over problems of pass_at_k(k, c_p, 1) = c_p/k.

  Source: DeepSeek-R1 (arXiv 2501.12948, §3.1), which reports it as
  pass@1 = (1/k) Σ_i p_i over k samples; DAPO (arXiv 2503.14476) names it avg@32.
  """
  correct_PK = np.asarray(correct_PK, np.float64)
  if correct_PK.ndim != 2 or correct_PK.size == 0:
    raise ValueError(f"correct_PK must be a non-empty [P, K] array, got shape {correct_PK.shape}.")
  return float(correct_PK.mean(axis=1).mean())
