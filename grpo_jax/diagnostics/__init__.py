"""Token-credit diagnostics (issue 7): pure functions that measure how sequence-level
rewards turn into token-level updates.

  flips         token flipping: boosted / suppressed / unchanged fractions of Δlog π by
                rollout polarity × token category; template/format taggers.
  grads         parameter subsets, per-token and per-rollout gradients (vmapped VJPs),
                seeded random projections.
  coupling      analytic LM-head coupling ⟨e_y − π, e_y' − π'⟩·⟨h, h'⟩, the first-order
                (self + coupling) prediction of Δlog π and how well it fits the measurement.
  cancellation  the cancellation residual r_v = Σ_{i,t: o_it = v} w_it·A_it per token id,
                per group and per batch, by frequency band, across aggregation modes.
  rank          effective ranks (entropy, stable, energy) of per-rollout gradient matrices
                and update matrices; gradient sparsity; mini-batch gradient variance.
  drift         reference-solution log-prob drift, entropy and exact KL to the initial
                policy on a probe batch, response-length trend, learning tax.
  value         Monte-Carlo prefix values V(prompt + o_<t) with K continuations per prefix,
                and value at boosted vs suppressed tokens.
  report        `DEFINITIONS` of every metric key the diagnostics emit.

Array math is jnp and jittable (static options are keyword-only); summaries that produce
metric dicts run on the host in numpy and return flat {str: float} dicts for metrics.jsonl.

Shape letters: B rollout rows, T completion tokens, P prompt tokens, D d_model, V vocab,
S selected (target) tokens, N source tokens (all B·T positions, flattened), Q parameters
of a subset (or the projected dimension), M rows of a matrix.

Sources: RESEARCH.md §1 (arXiv 2604.13088, token gradient cancellation), §2 (arXiv
2605.08666, the cancellation hypothesis: flipping, coupling, token value), §4 (arXiv
2606.29238, gradient sparsity and rank collapse).
"""

from grpo_jax.diagnostics import (  # noqa: F401
  cancellation,
  coupling,
  drift,
  flips,
  grads,
  rank,
  report,
  value,
)
