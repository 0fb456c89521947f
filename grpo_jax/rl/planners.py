"""Mini-batch planners: a rollout batch of B rows -> the order of its PPO mini-batches.

  plan = planners.make_planner("query_preserved", num_minibatches=4, ppo_epochs=2,
                               batch_size=64, group_size=8)
  idx_EMb = plan(key, group_ids_B, advantages_B, lengths_B)   # int32 [E, M, b]
  for e, m: train_step(gather(batch, idx_EMb[e, m]))

Every planner is a pure, jit-compatible function
``plan_xxx(key, group_ids_B, advantages_B, lengths_B, *, num_minibatches, ppo_epochs,
group_size=None, **options)`` whose keyword options are static. Randomness: one
``jax.random.bits(key, (E, N))`` draw, row e for epoch e, so epochs are independent (one
PRNG call per planner keeps compiles cheap); random orders are argsorts of these words.
Every epoch is a permutation of the B rows: each row appears exactly once per epoch.
No Python loop runs over rows or groups; all work is sorts, gathers and segment sums.

Shape letters: B rows, E = ppo_epochs, M = num_minibatches, b = B / M rows per
mini-batch, G group size, K = B / G groups, k = K / M groups per mini-batch,
R rounds of dealing, S pairs of rounds.

Balance lemma (behind every tolerance below). Let x_0 >= x_1 >= ... >= x_{N-1} be N = R*M
sorted items, dealt in rounds of M consecutive items so that each of the M bins takes
exactly one item from every round (in any order within the round). Then for every
nondecreasing f,

  max_m sum_{i in bin m} f(x_i) - min_m sum_{i in bin m} f(x_i) <= f(x_0) - f(x_{N-1}),

because each bin sum lies in [sum_r f(x_{rM+M-1}), sum_r f(x_{rM})] and that interval's
width telescopes: f(x_{rM+M-1}) >= f(x_{(r+1)M}). A spread W of bin sums puts every bin
within (M-1)/M * W of the mean bin sum. With f(x) = 1[x > 0] (or -1[x < 0]) the lemma
gives spread <= 1: each bin's count is floor(n/M) or ceil(n/M).

Dealing used here ("randomised snake"): for each pair of rounds (2s, 2s+1) a random
permutation rho_s of the bins (an argsort of random words); bin m takes item rho_s(m) of
round 2s and item M-1-rho_s(m) of round 2s+1. With rho = identity this is the classic
snake (boustrophedon) order; the random rho keeps its pairing of large with small items
and the lemma's bound, and lets the partition change between epochs even when all
scores are distinct (given R >= 3 rounds; with R <= 2 and distinct scores only the
mini-batch order changes, as in verl's deterministic balancing).

Sources: verl ``RayPPOTrainer._balance_batch`` (trainer/ppo/ray_trainer.py) balances
token counts across ranks with ``get_seqlen_balanced_partitions``; "The Cancellation
Hypothesis in Critic-Free RL" (arXiv 2605.08666) proposes query-preserved and
reward-balanced mini-batches.
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.infra import registry
from grpo_jax.models import sharding
from grpo_jax.rl import groups

REGISTRY = registry.Registry("planner")

BALANCE_BY = ("count", "mass")
_COMMON_KWARGS = ("num_minibatches", "ppo_epochs", "group_size")


# ----------------------------------------------------------------------------
# Validation of static arguments (plain Python: runs at trace time and in make_planner).
# ----------------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _check_counts(batch_size: int, *, num_minibatches: int, ppo_epochs: int) -> None:
  """Raises ValueError unless M, E >= 1 and M divides B."""
  for name, value in (("num_minibatches", num_minibatches), ("ppo_epochs", ppo_epochs)):
    if not isinstance(value, numbers.Integral) or value < 1:
      raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
  if batch_size % num_minibatches:
    raise ValueError(
      f"num_minibatches={num_minibatches} does not divide the batch size {batch_size}; "
      f"valid choices: {_divisors(batch_size)}."
    )


def _check_group_split(
  batch_size: int, group_size: int | None, *, num_minibatches: int, planner: str
) -> None:
  """Raises ValueError unless G divides B and M divides the group count K = B / G."""
  if group_size is None:
    raise ValueError(f"Planner {planner!r} keeps groups whole and needs group_size.")
  if not isinstance(group_size, numbers.Integral) or group_size < 1 or batch_size % group_size:
    raise ValueError(
      f"group_size={group_size!r} must be an int >= 1 that divides the batch size "
      f"{batch_size}; valid choices: {_divisors(batch_size)}."
    )
  num_groups = batch_size // group_size
  if num_groups % num_minibatches:
    raise ValueError(
      f"Planner {planner!r} keeps groups whole, but num_minibatches={num_minibatches} does "
      f"not divide the group count {num_groups} (batch {batch_size} / group_size "
      f"{group_size}); valid choices: {_divisors(num_groups)}."
    )


# ----------------------------------------------------------------------------
# Vectorised building blocks.
# ----------------------------------------------------------------------------


def _num_pairs(num_items: int, num_bins: int) -> int:
  """Pairs of dealing rounds S = ceil(R / 2), R = N / M."""
  return (num_items // num_bins + 1) // 2


def _per_epoch(plan_one: Callable[[jax.Array], jax.Array], key, *, ppo_epochs: int, num_bits: int):
  """[E, ...] stack of plan_one(bits_e): one ``jax.random.bits`` draw of shape [E, num_bits]
  gives every epoch its own independent uint32 words (one PRNG call keeps compiles cheap)."""
  bits_EN = jax.random.bits(key, (ppo_epochs, num_bits), jnp.uint32)
  return jax.vmap(plan_one)(bits_EN).astype(jnp.int32)


def _sort_desc_random_ties(score_N, bits_N) -> jax.Array:
  """A permutation o with score[o] nonincreasing; equal scores ordered by random words."""
  return jnp.lexsort((bits_N, -score_N))


def _group_order(group_ids_B, bits_B, score_B=None) -> jax.Array:
  """A row order with every group contiguous and its rows in batch order; groups sorted by
  descending score_B (equal on a group's rows) when given, then by a random word per id.

  Sort keys, most significant first: (-score, bits[g], g, row); g keeps groups whole even
  when two ids draw the same word.
  """
  keys = (group_ids_B, bits_B[group_ids_B])
  return jnp.lexsort(keys if score_B is None else (*keys, -score_B))


def _snake_deal(bits_SM, num_items: int, num_bins: int) -> jax.Array:
  """Randomised snake dealing of N = R*M sorted items into M bins: int32 [M, R], where
  pos[m, r] = r*M + rho_{r//2}(m) for even r and r*M + M-1-rho_{r//2}(m) for odd r,
  rho_s = argsort(bits[s]) a random permutation of the bins.

  Each bin takes exactly one item per round, so the balance lemma (module doc) applies.
  """
  rounds = num_items // num_bins
  rho_RM = jnp.repeat(jnp.argsort(bits_SM, axis=1), 2, axis=0)[:rounds].astype(jnp.int32)
  r_R = jnp.arange(rounds, dtype=jnp.int32)
  even_R1 = (r_R % 2 == 0)[:, None]
  slot_RM = jnp.where(even_R1, rho_RM, num_bins - 1 - rho_RM)
  return (r_R[:, None] * num_bins + slot_RM).T


def _polarity_score(advantages_B, balance_by: str) -> jax.Array:
  """sign(A) for balance_by="count", A for "mass" (float32)."""
  if balance_by not in BALANCE_BY:
    raise ValueError(f"balance_by must be one of {BALANCE_BY}, got {balance_by!r}.")
  a_B = advantages_B.astype(jnp.float32)
  return jnp.sign(a_B) if balance_by == "count" else a_B


# ----------------------------------------------------------------------------
# Planners.
# ----------------------------------------------------------------------------


@REGISTRY.register("random")
def plan_random(
  key,
  group_ids_B,
  advantages_B,
  lengths_B,
  *,
  num_minibatches: int,
  ppo_epochs: int,
  group_size: int | None = None,
) -> jax.Array:
  """Uniform shuffle: idx[e] = pi_e.reshape(M, b), pi_e a uniform permutation of [0, B).

  Guarantees only the permutation property; groups are split freely. This is the
  default of verl, TRL and OpenRLHF (shuffle, then cut into mini-batches).
  """
  del group_ids_B, lengths_B, group_size
  n = advantages_B.shape[0]
  _check_counts(n, num_minibatches=num_minibatches, ppo_epochs=ppo_epochs)
  one = lambda bits_B: jnp.argsort(bits_B).reshape(num_minibatches, n // num_minibatches)
  return _per_epoch(one, key, ppo_epochs=ppo_epochs, num_bits=n)


@REGISTRY.register("query_preserved")
def plan_query_preserved(
  key,
  group_ids_B,
  advantages_B,
  lengths_B,
  *,
  num_minibatches: int,
  ppo_epochs: int,
  group_size: int | None = None,
) -> jax.Array:
  """Whole groups per mini-batch, groups in a fresh random order every epoch.

  Guarantee (equal-size groups of G rows, M | K): for every epoch e and group g,
  |{m : g in group_ids[idx[e, m]]}| = 1, and each mini-batch holds k = K/M whole groups.
  Rows of a group keep their batch order. Ids need not be contiguous; equal group sizes
  are the caller's contract (check with ``groups.validate_group_ids(ids, group_size=G)``).

  Source: query-preserved batching, "The Cancellation Hypothesis in Critic-Free RL"
  (arXiv 2605.08666).
  """
  del advantages_B, lengths_B
  n = group_ids_B.shape[0]
  _check_counts(n, num_minibatches=num_minibatches, ppo_epochs=ppo_epochs)
  _check_group_split(n, group_size, num_minibatches=num_minibatches, planner="query_preserved")
  one = lambda bits_B: _group_order(group_ids_B, bits_B).reshape(
    num_minibatches, n // num_minibatches
  )
  return _per_epoch(one, key, ppo_epochs=ppo_epochs, num_bits=n)


def _plan_balanced_rows(key, score_B, *, num_minibatches: int, ppo_epochs: int) -> jax.Array:
  """Rows sorted by descending score (random ties), dealt by randomised snake: [E, M, b]."""
  n = score_B.shape[0]
  pairs = _num_pairs(n, num_minibatches)

  def one(bits_N):
    order_B = _sort_desc_random_ties(score_B, bits_N[:n])
    deal_SM = bits_N[n:].reshape(pairs, num_minibatches)
    return order_B[_snake_deal(deal_SM, n, num_minibatches)]

  return _per_epoch(one, key, ppo_epochs=ppo_epochs, num_bits=n + pairs * num_minibatches)


def _plan_balanced_groups(
  key, group_ids_B, score_B, *, num_minibatches: int, ppo_epochs: int, group_size: int
) -> jax.Array:
  """Whole groups sorted by descending d_g = sum_{i in g} score_i (random ties), dealt
  by randomised snake: [E, M, b]."""
  n, num_groups = score_B.shape[0], score_B.shape[0] // group_size
  pairs = _num_pairs(num_groups, num_minibatches)
  d_B = groups.group_sum(score_B, group_ids_B)  # d of the row's group, equal on its rows

  def one(bits_N):
    groups_KG = _group_order(group_ids_B, bits_N[:n], d_B).reshape(num_groups, group_size)
    deal_SM = bits_N[n:].reshape(pairs, num_minibatches)
    pos_Mk = _snake_deal(deal_SM, num_groups, num_minibatches)
    return groups_KG[pos_Mk].reshape(num_minibatches, n // num_minibatches)

  return _per_epoch(one, key, ppo_epochs=ppo_epochs, num_bits=n + pairs * num_minibatches)


@REGISTRY.register("reward_balanced")
def plan_reward_balanced(
  key,
  group_ids_B,
  advantages_B,
  lengths_B,
  *,
  num_minibatches: int,
  ppo_epochs: int,
  group_size: int | None = None,
  balance_by: str = "count",
  keep_groups: bool = False,
) -> jax.Array:
  """Mini-batches with (nearly) equal polarity composition.

  Polarity: A > 0 positive, A < 0 negative, A == 0 neutral. Per mini-batch m:
  n+_m, n-_m the counts, P_m = sum max(A, 0), N_m = sum max(-A, 0), and the
  imbalance D_m = n+_m - n-_m (balance_by="count") or D_m = P_m - N_m = sum A ("mass").
  D_bar = (sum_m D_m) / M. Rows (or groups) are sorted by score, ties in random order,
  and dealt by randomised snake (module doc), so the balance lemma gives:

  keep_groups=False (rows dealt; score s_i = sign(A_i) or A_i):
    * n+_m, n-_m in {floor(n+/M), ceil(n+/M)}, {floor(n-/M), ceil(n-/M)} (both modes:
      1[A > 0] and -1[A < 0] are nondecreasing in the score);
    * count: |D_m - D_bar| <= 2 (M-1)/M < 2 (sum of the two count errors);
    * mass:  max_m D_m - min_m D_m <= max_i A_i - min_i A_i, hence
             |D_m - D_bar| <= (M-1)/M (max A - min A); likewise (f = max(A, 0) and
             -max(-A, 0)) P_m spreads by <= max(max A, 0) - max(min A, 0) and N_m by
             <= max(-min A, 0) - max(-max A, 0).
  keep_groups=True (whole groups dealt; also query-preserved; needs group_size, M | K):
    with d_g = n+_g - n-_g (count) or sum_{i in g} A_i (mass),
    max_m D_m - min_m D_m <= max_g d_g - min_g d_g, hence
    |D_m - D_bar| <= (M-1)/M (max_g d_g - min_g d_g). Tight: with k = 1 every mini-batch
    is one group, so no query-preserving plan does better in the worst case.
  Mass bounds hold in exact arithmetic; float32 summation adds rounding error.
  Note: with group-centred advantages (GRPO, RLOO, Dr.GRPO) every d_g (mass) is ~0, so
  keep_groups=True with balance_by="mass" is balanced for free; use "count" there.

  Source: reward-balanced batching, "The Cancellation Hypothesis in Critic-Free RL"
  (arXiv 2605.08666).
  """
  del lengths_B
  n = advantages_B.shape[0]
  _check_counts(n, num_minibatches=num_minibatches, ppo_epochs=ppo_epochs)
  score_B = _polarity_score(advantages_B, balance_by)
  if keep_groups:
    _check_group_split(
      n, group_size, num_minibatches=num_minibatches, planner="reward_balanced(keep_groups)"
    )
    return _plan_balanced_groups(
      key,
      group_ids_B,
      score_B,
      num_minibatches=num_minibatches,
      ppo_epochs=ppo_epochs,
      group_size=group_size,
    )
  return _plan_balanced_rows(key, score_B, num_minibatches=num_minibatches, ppo_epochs=ppo_epochs)


@REGISTRY.register("length_sorted")
def plan_length_sorted(
  key,
  group_ids_B,
  advantages_B,
  lengths_B,
  *,
  num_minibatches: int,
  ppo_epochs: int,
  group_size: int | None = None,
) -> jax.Array:
  """Token-balanced mini-batches: rows sorted by length (random ties), randomised snake.

  Guarantee (balance lemma, f = identity): with T_m = sum_{i in m} L_i,
  max_m T_m - min_m T_m <= max_i L_i - min_i L_i. Splits groups.

  Source: verl ``RayPPOTrainer._balance_batch`` (trainer/ppo/ray_trainer.py), which
  partitions by sequence length into equal-size parts (Karmarkar-Karp,
  ``get_seqlen_balanced_partitions(..., equal_size=True)``) so each rank gets similar
  token totals; this is the vectorised sorted-snake version of it, for ablations.
  """
  del group_ids_B, advantages_B, group_size
  n = lengths_B.shape[0]
  _check_counts(n, num_minibatches=num_minibatches, ppo_epochs=ppo_epochs)
  return _plan_balanced_rows(
    key, lengths_B.astype(jnp.int32), num_minibatches=num_minibatches, ppo_epochs=ppo_epochs
  )


# ----------------------------------------------------------------------------
# Host-side factory and metrics.
# ----------------------------------------------------------------------------


def planner_options(name: str) -> tuple[str, ...]:
  """The planner's own keyword options (beyond num_minibatches, ppo_epochs, group_size)."""
  params = inspect.signature(REGISTRY.get(name)).parameters.values()
  return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in _COMMON_KWARGS)


def make_planner(
  name: str,
  *,
  num_minibatches: int,
  ppo_epochs: int,
  batch_size: int,
  group_size: int,
  **options,
) -> Callable[..., jax.Array]:
  """Validates on the host, then returns jit(plan)(key, group_ids_B, advantages_B,
  lengths_B) -> int32 [ppo_epochs, num_minibatches, batch_size // num_minibatches].

  Raises ValueError for an unknown planner or option, counts < 1, M not dividing B, G
  not dividing B, or (for planners that keep groups whole) M not dividing K = B / G.
  The planner's own checks run once here on abstract inputs (``jax.eval_shape``).
  """
  plan = REGISTRY.get(name)
  unknown = sorted(set(options) - set(planner_options(name)))
  if unknown:
    raise ValueError(
      f"Planner {name!r} has no option(s) {unknown}; its options: {list(planner_options(name))}."
    )
  if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
    raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}.")
  if not isinstance(group_size, numbers.Integral) or group_size < 1 or batch_size % group_size:
    raise ValueError(
      f"group_size={group_size!r} must be an int >= 1 that divides the batch size "
      f"{batch_size}; valid choices: {_divisors(batch_size)}."
    )
  fn = functools.partial(
    plan, num_minibatches=num_minibatches, ppo_epochs=ppo_epochs, group_size=group_size, **options
  )
  ids_B = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
  adv_B = jax.ShapeDtypeStruct((batch_size,), jnp.float32)
  jax.eval_shape(fn, jax.random.key(0), ids_B, adv_B, ids_B)  # runs the checks, no compile
  return sharding.jit(fn)  # One per planner and options: the update that calls it is shared.


def minibatch_balance(idx_EMb, advantages_B) -> dict[str, jax.Array]:
  """Per mini-batch polarity statistics, each shaped like idx without its last axis:

  num_pos = sum 1[A > 0], num_neg = sum 1[A < 0], pos_mass = sum max(A, 0),
  neg_mass = sum max(-A, 0), net_mass = pos_mass - neg_mass = sum A.
  """
  a_EMb = jnp.asarray(advantages_B)[idx_EMb]
  return {
    "num_pos": jnp.sum(a_EMb > 0, axis=-1, dtype=jnp.int32),
    "num_neg": jnp.sum(a_EMb < 0, axis=-1, dtype=jnp.int32),
    "pos_mass": jnp.sum(jnp.maximum(a_EMb, 0.0), axis=-1),
    "neg_mass": jnp.sum(jnp.maximum(-a_EMb, 0.0), axis=-1),
    "net_mass": jnp.sum(a_EMb, axis=-1),
  }
