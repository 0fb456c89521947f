"""IBPO's process-level advantage: a leave-one-out prefix baseline read from the group's trie.

Source: IBPO, "Reducing Credit Assignment Variance via Counterfactual Reasoning Paths" (arXiv
2605.16302; RESEARCH.md §3). Confirmed at abstract/summary level [C]: several trajectories of
one input are compared, their differences standing in for alternative decisions, which gives
an implicit process-level advantage; (ii) a negative correlation between the terminal reward
and the comparison signal reduces variance; (iii) local repair beats full rewriting. The
estimator below is our reconstruction [INF] from those principles.

Notation. A group holds rows i: its G samples and any counterfactual rows. s_{i,t} = o_{i,<t}
is the state before token t (s_{i,0} = ∅, the prompt), r_i the terminal reward, w_i the row's
weight (1, or the truncated importance weight of a perturbed-prompt row). A row *counts* at a
state of depth t when what follows that state in the row is a fresh draw from π(·|state):
t ≥ start_i, with start_i = 0 for a sample or a perturbed-prompt row and start_i = c for a
branch o_p[:c] + continuation (its first c tokens are a copy of its parent's). N(s) is the
set of rows that reach s (o_{j,<|s|} = s) and count at depth |s|.

Derivation [INF].
1. Per-state baselines. For o ~ π(·|q), ∇J = E[Σ_t ∇log π(o_t|s_t)·(r − b_t)] for any b_t
   with E[∇log π(o_t|s_t)·b_t] = 0, i.e. any b_t that given s_t does not depend on the token
   o_t being credited (E[∇log π(o_t|s_t) | s_t] = 0). The variance-minimising choice is close
   to the value V(s_t) = E[r | s_t]; GRPO and RLOO use one b for every t, an estimate of V(∅).
2. The comparison. The group's other trajectories through s_t estimate V(s_t): where they
   part from i, their outcomes are the "alternative decisions". Leave-one-out, so the
   baseline never contains the trajectory it credits:
     φ_{−i}(s) = (Σ_{j∈N(s), j≠i} w_j r_j + κ·φ_{−i}(s⁻)) / (Σ_{j∈N(s), j≠i} w_j + κ),
     φ_{−i}(∅) = r̄_{−i}, the mean over the others counted at the root (RLOO's baseline),
   with s⁻ the parent prefix (s minus its last token): a prefix few others reached is shrunk
   toward its parent's value (κ pseudo-counts), and one no other row reached takes its
   parent's value (the κ → 0 limit), so the token where i leaves the others is credited
   against the trajectories that shared its prefix up to there.
3. The advantage, the terminal reward against that baseline:
     b_{i,t} = (1 − λ)·r̄_{−i} + λ·φ_{−i}(s_{i,t}),
     A_{i,t} = (n_g − 1)/n_g · (r_i − b_{i,t}) / (σ_g + ε)      (scale="std"; "none": no σ_g)
   n_g the group's trained rows, σ_g their reward std (ddof 1), or where they all tie that of
   every row of the group's trie (its samples all fail, a branch may still succeed). Since
   r_i − r̄_g = (n_g − 1)/n_g·(r_i − r̄_{−i}), λ = 0 is GRPO's (r_i − r̄_g)/(σ_g + ε) exactly
   (Dr. GRPO's r_i − r̄_g with "none") whenever no counterfactual row counts at the root
   (branches never do); λ = 1 is the full prefix baseline. Any λ keeps the baseline
   independent of the credited token.

Why it is unbiased (scale="none"; σ_g contains r_i, so "std" keeps GRPO's normalisation bias
and adds none). For a sample i, b_{i,t} is a function of s_{i,t} and of the other rows, which
are independent of o_i: given both, o_{i,t} ~ π(·|s_{i,t}), so E[∇log π(o_{i,t}|s_{i,t})·b_{i,t}]
= 0. A branch cut at c from parent p copies o_{p,<c} and draws the rest from π(·|o_{p,<c}): it
is independent of o_{p,≥c} given o_{p,<c}, so it may sit in the baseline of p's tokens at
depths t ≥ c (s_{p,t} contains o_{p,<c}) but not above its cut, where its outcome follows from
the very token being credited. Hence a branch counts only at depths ≥ its cut (counting it
above re-adds the parent's outcome; tests/rl/test_ibpo.py measures that bias). This needs the
plan to choose p, c and whether the branch exists from o_{p,<c} alone, and the other rows
whose baselines the branch enters from nothing of theirs past the state they share with
it. `counterfactuals`' cuts "window", "next_step" and "divergence" with branch_from="all"
do; the parent's outcome (branch_from "failed"/"correct"), its length (cut "uniform"), its
number of steps (cut "step"), its suffix (the full-rewrite filter at τ < 1) or its whole
completion (source "repair") put in p's baseline a row that exists because of p's later
tokens. `counterfactuals.biased_choices` names them and build refuses them with this
estimator; tests/rollouts/test_counterfactual_bias.py measures each on completions of varying
length (Hotelling's T² of the mean gradient against the exact one: p > 1e-4 for every plan
accepted, < 1e-8 for every plan refused but repair, whose prompt is not tabular).
Perturbed-prompt rows are off-policy for q:
their truncated importance weights keep them approximately, not exactly, unbiased.

Zero-sum (κ = 0, λ = 1, unit weights): at every state s with n = |N(s)| ≥ 2,
  Σ_{i∈N(s)} (r_i − φ_{−i}(s)) = Σ_i r_i − Σ_i (S − r_i)/(n − 1) = 0,   S = Σ_{i∈N(s)} r_i:
the advantages of the tokens chosen at s, summed over the rows that count at s, cancel (RLOO
at every node of the trie). With κ > 0 the node's sum is κ/(n − 1 + κ)·Σ_{i∈N(s)} (r_i −
φ_{−i}(s⁻)): what the rows through s won against their parent's value, shrunk.

Variance (principle ii). r_i − b_{i,t} = x + y, with x = r_i − r̄_{−i} the terminal term
against the group and y = r̄_{−i} − b_{i,t} the comparison the prefix adds: Var(x + y) <
Var(x) needs 2 Cov(x, y) < −Var(y), a negative correlation (`comparison_stats` logs it per
batch: 0 in expectation when prefixes say nothing of the outcome). Var(y) is the price: the
leave-one-out mean of the one or two others at a deep prefix is noise, inflated by n/(n − 1)
at every small node. On the tabular policy of tests/rl/test_ibpo.py (G = 8) the estimator keeps
0.88× GRPO's signal per unit variance without shrinkage and 1.02-1.03× with κ = 4 (tested);
the oracle per-state baseline V(s_t) would keep 1.37× (measured while deriving this).

States (option `state`; issue 56). Nothing above needs s_{i,t} to be the whole prefix: any
state whose key is a function of o_{i,<t} alone keeps b_{i,t} independent of the credited
token given s_{i,t}, so the baseline stays unbiased whatever rows it pools. Exact prefixes
pool little: on completions of LLM length few rows share a prefix past the first tokens,
and the estimator falls back to r̄_{−i}. Two coarser keys pool more:
  window  (t, o_{i,t−k..t−1}): the rows at the same depth whose last k = `context` tokens
          match (they may differ anywhere before);
  span    o_{i,t−k..t−1} at any depth (with its length min(t, k)): the rows holding the same
          k tokens anywhere, aligned by content rather than position, each counted once per
          state (φ_{−i} leaves out every occurrence of row i, so no copy of r_i enters).
The price is what the key forgets: φ estimates E[r | key], not V(s), so it reduces variance
only as far as the key predicts the outcome; with κ > 0 each state still shrinks toward i's
previous state's value. The tabular tests (tests/rl/test_ibpo.py, test_counterfactual_bias.py)
measure both unbiased. A branch counts from its cut at its own depth, which a window keeps
and a span does not: a span copied from the parent's prefix would enter the parent's
baseline above the cut, and a row counting from depth c > 0 could keep its own reward in
its baseline at a shallower occurrence of the same state; so build refuses span with
branch rows, whatever accept_bias says (every row then counts from depth 0, where leaving
a row out of its own states is exact). The alignment of `alignment.align` (edit distance over
whole rows) is not a key: it reads the credited row's later tokens, which would bias it.

Two forms we do not implement, and why. The one-step form φ(o_{i,≤t}) − φ_{−i}(o_{i,<t}) gives
the same group gradient as this one when the rows through o_{i,≤t} are all trained: they
share the score ∇log π(o_t|o_{<t}), so averaging their rewards before weighting it changes
nothing. Training the branches themselves (counterfactual.train) adds their own tokens' terms
on top of the samples': the subtrees below the cuts are counted twice, an estimate of a
different sum than ∇J (the mean gradient's direction moved by 15% on the tabular policy,
measured while deriving this); branches should inform the trie only.

The earlier reconstruction (issue 29), A_i + λ·(φ(o_{i,≤t}) − φ(o_{i,<t})) with φ counting i,
telescoped to λ·(r_i − r̄_g) at κ = 0: a second copy of the outcome, not a control variate.

The trie is never built as a tree: each (row, t) gets two 32-bit rolling hashes of o_{≤t};
sorting the keys (group, t, hashes) makes equal prefixes adjacent, and segment sums over the
runs give Σ w and Σ w r. O(BT log BT), static shapes, jittable; the shrinkage recursion is a
scan over t. A hash collision needs two different prefixes of the same length in one group
to agree on 64 bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.rl import groups

_P1, _P2 = 1_000_003, 2_654_435_761  # Odd multipliers of the two rolling hashes (mod 2^32).
SCALES = ("std", "none")
STATES = ("prefix", "window", "span")  # What s_{i,t} is (module docstring, "States").


def prefix_hashes(tokens_BT):
  """(h1_BT, h2_BT) uint32: two rolling hashes of o_{i,≤t} (h_t = h_{t−1}·P + o_t + 1)."""
  x_TB = tokens_BT.T.astype(jnp.uint32) + jnp.uint32(1)

  def step(carry, x_B):
    h1, h2 = carry
    h1 = h1 * jnp.uint32(_P1) + x_B
    h2 = (h2 ^ x_B) * jnp.uint32(_P2) + jnp.uint32(0x9E3779B9)
    return (h1, h2), (h1, h2)

  zeros = jnp.zeros(tokens_BT.shape[:1], jnp.uint32)
  _, (h1_TB, h2_TB) = jax.lax.scan(step, (zeros, zeros), x_TB)
  return h1_TB.T, h2_TB.T


def window_hashes(tokens_BT, *, context: int):
  """(h1_BT, h2_BT) uint32: two polynomial hashes of the last `context` tokens o_{i,u−k+1..u}
  (fewer at u < k − 1; `state_keys` tells those apart by their length), Σ_j x_{u−j}·P^j with
  x = o + 1. O(k·B·T)."""
  x_BT = tokens_BT.astype(jnp.uint32) + jnp.uint32(1)
  h1 = jnp.zeros_like(x_BT)
  h2 = jnp.zeros_like(x_BT)
  p1, p2 = jnp.uint32(1), jnp.uint32(1)
  for j in range(context):
    x_j = jnp.pad(x_BT, ((0, 0), (j, 0)))[:, : x_BT.shape[1]]  # x_{u−j}, 0 before the start.
    h1, h2 = h1 + x_j * p1, h2 + x_j * p2
    p1, p2 = p1 * jnp.uint32(_P1), p2 * jnp.uint32(_P2)
  return h1, h2


def state_keys(tokens_BT, *, state: str = "prefix", context: int = 0):
  """(h1_BT, h2_BT, depth_BT): the key of the state after o_{i,≤u} (`STATES`): the prefix's
  hashes at depth u; the last k = context tokens' at depth u ("window"); or theirs and only
  their length min(u + 1, k) ("span": the same k tokens at any depth are one state)."""
  T = tokens_BT.shape[1]
  t_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), tokens_BT.shape)
  if state == "prefix":
    return (*prefix_hashes(tokens_BT), t_BT)
  h1, h2 = window_hashes(tokens_BT, context=context)
  return h1, h2, t_BT if state == "window" else jnp.minimum(t_BT + 1, context)


def prefix_stats(
  tokens_BT,
  mask_BT,
  rewards_B,
  group_ids_B,
  valid_B=None,
  weights_B=None,
  *,
  count_BT=None,
  state: str = "prefix",
  context: int = 0,
):
  """(n_BT, sum_BT): for each (i, t) on the trie (mask and valid_B), Σ w_j and Σ w_j r_j over
  the rows j of i's group on the trie at the same state after o_{j,≤u} as i after o_{i,≤t}
  (`state_keys`: the same prefix, u = t, by default) that count there (i included when it
  counts); a row counts once per state, however often it reaches it ("span"). 0 off the
  trie. w_j = weights_B[j] (default 1) where count_BT[j, u] (default: everywhere on the
  trie), else 0; a row reads its state's sums whether or not it counts there.

  mask_BT must be a prefix mask per row (right-padded completions): o_{i,≤t} is a real
  prefix exactly where mask_{i,t}.
  """
  B, T = tokens_BT.shape
  valid_B = jnp.ones((B,), bool) if valid_B is None else valid_B
  on_BT = mask_BT & valid_B[:, None]
  h1_BT, h2_BT, d_BT = state_keys(tokens_BT, state=state, context=context)
  g_BT = jnp.where(on_BT, group_ids_B.astype(jnp.int32)[:, None], B)  # B: off, sorted last.
  row_BT = jnp.broadcast_to(jnp.arange(B, dtype=jnp.int32)[:, None], (B, T))
  w_BT = on_BT.astype(jnp.float32)
  if count_BT is not None:
    w_BT = w_BT * count_BT.astype(jnp.float32)
  node = [k.reshape(-1) for k in (h2_BT, h1_BT, d_BT, g_BT)]
  if weights_B is not None:
    w_BT = w_BT * weights_B.astype(jnp.float32)[:, None]
  if state != "span":  # One entry per row and state: the depth is in the key.
    order = jnp.lexsort(node)  # Primary key last: group, then depth, then the hashes.
    w = w_BT.reshape(-1)[order]
  else:  # Within a state, by row, its counted entries first: the first one counts.
    uncounted = (w_BT.reshape(-1) <= 0).astype(jnp.int32)
    order = jnp.lexsort([uncounted, row_BT.reshape(-1), *node])
    first = _changes([k[order] for k in (*node, row_BT.reshape(-1))])
    w = jnp.where(first, w_BT.reshape(-1)[order], 0.0)
  seg = jnp.cumsum(_changes([k[order] for k in node])) - 1
  r = jnp.broadcast_to(rewards_B.astype(jnp.float32)[:, None], (B, T)).reshape(-1)[order]
  n_sorted = jax.ops.segment_sum(w, seg, num_segments=B * T)[seg]
  s_sorted = jax.ops.segment_sum(w * r, seg, num_segments=B * T)[seg]
  inverse = jnp.zeros(B * T, jnp.int32).at[order].set(jnp.arange(B * T, dtype=jnp.int32))
  n_BT = jnp.where(on_BT, n_sorted[inverse].reshape(B, T), 0.0)
  s_BT = jnp.where(on_BT, s_sorted[inverse].reshape(B, T), 0.0)
  return n_BT, s_BT


def _changes(sorted_keys):
  """bool [n]: entries where any of the sorted keys differs from the entry before."""
  n = sorted_keys[0].shape[0]
  new = jnp.zeros(n, bool).at[0].set(True)
  for k in sorted_keys:
    new = new | jnp.concatenate([jnp.ones(1, bool), k[1:] != k[:-1]])
  return new


def state_stats(
  tokens_BT,
  mask_BT,
  rewards_B,
  group_ids_B,
  trie_B,
  *,
  start_B,
  weights_B=None,
  state: str = "prefix",
  context: int = 0,
):
  """(n_BT, sum_BT, own_BT) at the state s_{i,t} = o_{i,<t} (t = 0: the root ∅): Σ w_j and
  Σ w_j r_j over N(s_{i,t}) (the trie rows through it counting at depth t ≥ start_j), and
  row i's own count weight there (w_i if i is on the trie and t ≥ start_i, else 0)."""
  B, T = tokens_BT.shape
  t_BT = jnp.arange(T)[None, :]
  w_B = jnp.ones((B,), jnp.float32) if weights_B is None else weights_B.astype(jnp.float32)
  # prefix_stats at inclusive prefix u = o_{≤u} is the state of depth u + 1.
  n_u, s_u = prefix_stats(
    tokens_BT,
    mask_BT,
    rewards_B,
    group_ids_B,
    trie_B,
    w_B,
    count_BT=t_BT + 1 >= start_B[:, None],
    state=state,
    context=context,
  )
  at_root_B = jnp.where(trie_B & (start_B == 0), w_B, 0.0)
  n0_B = groups.group_sum(at_root_B, group_ids_B)
  s0_B = groups.group_sum(at_root_B * rewards_B.astype(jnp.float32), group_ids_B)
  n_BT = jnp.concatenate([n0_B[:, None], n_u[:, :-1]], axis=1)
  s_BT = jnp.concatenate([s0_B[:, None], s_u[:, :-1]], axis=1)
  # Row i is at its own state of depth t while t ≤ |o_i| (the state before each of its tokens).
  at_BT = jnp.concatenate([trie_B[:, None], mask_BT[:, :-1] & trie_B[:, None]], axis=1)
  own_BT = jnp.where(at_BT & (t_BT >= start_B[:, None]), w_B[:, None], 0.0)
  return n_BT, s_BT, own_BT


def loo_values(n_BT, s_BT, *, shrink: float):
  """φ_BT = φ_{−i}(s_{i,t}) from the leave-one-out sums at i's states (column 0: the root):
  φ(root) = S/n (0 when n = 0), then φ_t = (S_t + κ φ_{t−1})/(n_t + κ), or φ_{t−1} where
  n_t + κ = 0 (no other row there and κ = 0). The recursion is affine, φ_t = a_t φ_{t−1} +
  c_t, so it runs as an associative scan over t (log T depth, not T steps)."""
  den_BT = n_BT + shrink
  a_BT = jnp.where(den_BT > 0, _safe_div(jnp.full_like(den_BT, shrink), den_BT), 1.0)
  c_BT = jnp.where(den_BT > 0, _safe_div(s_BT, den_BT), 0.0)
  # Column 0 is the root: no parent to shrink toward.
  a_BT = a_BT.at[:, 0].set(0.0)
  c_BT = c_BT.at[:, 0].set(_safe_div(s_BT[:, 0], n_BT[:, 0]))

  def combine(left, right):
    (a1, c1), (a2, c2) = left, right
    return a1 * a2, a2 * c1 + c2

  return jax.lax.associative_scan(combine, (a_BT, c_BT), axis=1)[1]


def _safe_div(num, den):
  return jnp.where(den > 0, num / jnp.where(den > 0, den, 1.0), 0.0)


def baseline(
  tokens_BT,
  mask_BT,
  rewards_B,
  group_ids_B,
  trie_B,
  *,
  lam,
  shrink: float = 0.0,
  start_B=None,
  weights_B=None,
  state: str = "prefix",
  context: int = 0,
):
  """(b_BT, root_B): b_{i,t} = (1 − λ)·r̄_{−i} + λ·φ_{−i}(s_{i,t}) and r̄_{−i} = φ_{−i}(∅)
  (module docstring), for the rows on the trie (trie_B). Computed on rewards minus the
  group's largest, so a group whose rewards are all equal gets b = r exactly."""
  B = tokens_BT.shape[0]
  start_B = jnp.zeros((B,), jnp.int32) if start_B is None else start_B.astype(jnp.int32)
  r_B = rewards_B.astype(jnp.float32)
  ref_B = jax.ops.segment_max(jnp.where(trie_B, r_B, -jnp.inf), group_ids_B, num_segments=B)
  ref_B = ref_B[group_ids_B]
  ref_B = jnp.where(jnp.isfinite(ref_B), ref_B, 0.0)
  x_B = r_B - ref_B
  n_BT, s_BT, own_BT = state_stats(
    tokens_BT,
    mask_BT,
    x_B,
    group_ids_B,
    trie_B,
    start_B=start_B,
    weights_B=weights_B,
    state=state,
    context=context,
  )
  phi_BT = loo_values(n_BT - own_BT, s_BT - own_BT * x_B[:, None], shrink=shrink)
  root_B = phi_BT[:, 0]
  b_BT = (1.0 - lam) * root_B[:, None] + lam * phi_BT
  return b_BT + ref_B[:, None], root_B + ref_B


def advantage(
  tokens_BT,
  mask_BT,
  rewards_B,
  group_ids_B,
  valid_B=None,
  *,
  lam,
  eps,
  shrink: float = 0.0,
  scale: str = "std",
  start_B=None,
  context_B=None,
  weights_B=None,
  state: str = "prefix",
  context: int = 0,
):
  """(A_BT, parts): A_{i,t} = (n_g − 1)/n_g·(r_i − b_{i,t})/(σ_g + ε) on the valid rows'
  tokens at t ≥ start_i (0 elsewhere); parts = dict(b_BT, root_B, scale_B, on_BT) for the
  metrics. valid_B: trained rows (they count in n_g); context_B: rows that only inform the
  trie (counterfactuals); weights_B: every row's weight in it; start_B: the depth from which
  each row counts (a branch's cut; default 0); state, context: what a state is
  (`STATES`)."""
  B, T = tokens_BT.shape
  valid_B = jnp.ones((B,), bool) if valid_B is None else valid_B
  trie_B = valid_B if context_B is None else valid_B | context_B
  start_B = jnp.zeros((B,), jnp.int32) if start_B is None else start_B.astype(jnp.int32)
  r_B = rewards_B.astype(jnp.float32)
  b_BT, root_B = baseline(
    tokens_BT,
    mask_BT,
    r_B,
    group_ids_B,
    trie_B,
    lam=lam,
    shrink=shrink,
    start_B=start_B,
    weights_B=weights_B,
    state=state,
    context=context,
  )
  n_B = groups.group_size(group_ids_B, valid_B=valid_B)
  scale_B = jnp.where(n_B > 1, (n_B - 1.0) / jnp.maximum(n_B, 1.0), 0.0)
  if scale == "std":  # The trained rows' σ, or the trie's where they all tie (then A^{λ=0} = 0).
    std_B = groups.group_std(r_B, group_ids_B, unbiased=True, valid_B=valid_B)
    trie_std_B = groups.group_std(r_B, group_ids_B, unbiased=True, valid_B=trie_B)
    scale_B = _safe_div(scale_B, jnp.where(std_B > 0, std_B, trie_std_B) + eps)
  on_BT = mask_BT & valid_B[:, None] & (jnp.arange(T)[None, :] >= start_B[:, None])
  adv_BT = jnp.where(on_BT, scale_B[:, None] * (r_B[:, None] - b_BT), 0.0)
  return adv_BT, dict(b_BT=b_BT, root_B=root_B, scale_B=scale_B, on_BT=on_BT)


def comparison_stats(adv_BT, rewards_B, *, b_BT, root_B, scale_B, on_BT):
  """IBPO's metrics (`metrics.DEFINITIONS`, "ibpo/..."), over the advantaged tokens m, with
  A ∝ r_i − b_{i,t} = x + y: the terminal term x = r_i − r̄_{−i} (the group's leave-one-out
  advantage, GRPO's up to (n − 1)/n) and the comparison term y = r̄_{−i} − b_{i,t} (what the
  prefix baseline adds):

  comparison_abs_mean          mean |A_{i,t} − A^{λ=0}_i| = mean |scale·y|;
  sign_flip_frac               share of tokens whose advantage has the opposite sign of
                               A^{λ=0}_i (where that is non-zero);
  terminal_comparison_corr     Σ x y / √(Σ x² Σ y²) (0 when y ≡ 0, e.g. λ = 0).

  Both terms have mean 0 given the prompt, and if a row's prefixes say nothing of its
  reward E[x y] = 0 exactly (y is then a function of the other rows, whose mean r̄_{−i}
  covaries with any subset mean of them by the same σ²/(n − 1)); it is negative where the
  prefix predicts the outcome, the control variate of principle (ii). No centring: centring
  within a group would anti-correlate r_i with the others' mean by construction, and across
  the batch the groups' pass rates would correlate any pair of terms.
  """
  m = on_BT.astype(jnp.float32)
  n = jnp.maximum(jnp.sum(m), 1.0)
  r_B = rewards_B.astype(jnp.float32)
  x_BT = m * (r_B - root_B)[:, None]
  y_BT = m * (root_B[:, None] - b_BT)
  group_adv_BT = scale_B[:, None] * x_BT
  sign = jnp.sign(group_adv_BT)
  flipped = (sign != 0) & (jnp.sign(adv_BT) == -sign)
  denom = jnp.sqrt(jnp.sum(x_BT * x_BT) * jnp.sum(y_BT * y_BT))
  return {
    "ibpo/comparison_abs_mean": jnp.sum(jnp.abs(scale_B[:, None] * y_BT)) / n,
    "ibpo/sign_flip_frac": jnp.sum(flipped * m) / n,
    "ibpo/terminal_comparison_corr": _safe_div(jnp.sum(x_BT * y_BT), denom),
  }
