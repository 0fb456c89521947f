"""grpo_jax: RL of language models from sequence-level rewards, in JAX.

The folders follow the data path (docs/architecture.md): `infra/` at the bottom, then
`models/`, `verifiers/`, `tasks/`, `rewards/`, `envs/`, `rl/`, `rollouts/` and
`diagnostics/`; the config edge (`config`, `schema`) on them, `trainer/` (build, rollout,
steps, train, ...) above, and the command line (`main`, `cli`, `commands`) on top.

Shape suffixes. An array's name ends with one capital letter per axis, in order:
`logp_BT` is [B, T], `k_LBTKE` is [L, B, T, K, E]. The letters, with the meaning most
modules give them; a module that gives one another meaning says so where it shapes the
array (tests/test_architecture.py checks that every letter in use is listed here):

  B  batch rows (prompts, or the rows of any batch)     N  rollout rows (B·G samples, or a
  T  completion tokens (positions after the prompt)        merged batch of them)
  P  prompt tokens; in evaluation, problems             G  rows per group (group size)
  V  vocabulary                                         D  model width
  L  layers                                             F  MLP width
  H  attention heads                                    E  head width
  K  key-value heads; in evaluation, samples per problem; in matmuls, the contracted
     axis; in MoE routing, the experts chosen per token; in planning, mini-batches
  Q  query heads per key-value head (H = K·Q), or a block of query positions
  R  query heads per key-value head where Q means query positions; in paged and
     alignment code, rows of a table
  S  key-value cache slots (keys' positions); in refill, slots; in metrics, series
  X  experts (MoE)                                      Z  slots per KV-cache page
  M  counterfactual slots (B·C), rows of a page table, or a matmul's rows
  A  rows of a group-shared prompt prefix               C  chunks or categories
  O  observation tokens of an episode turn              U  a padded copy of T
  I, J  the two indices of a pairwise table (alignment), or picks per group
"""

from grpo_jax.infra import moved


def __getattr__(name: str):
  """`from grpo_jax import advantages` (0.1's flat path) -> grpo_jax.rl.advantages, with a
  DeprecationWarning; kept for one release."""
  return moved.resolve("grpo_jax", name, moved.MODULES, attribute=False, namespace=globals())
