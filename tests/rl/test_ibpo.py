"""IBPO's leave-one-out prefix baseline (grpo_jax/rl/ibpo.py, the `ibpo` estimator): numbers
by hand, a reference trie, the zero-sum at every node, no credit above a branch cut, and on a
tabular policy whose exact gradient is enumerated: unbiasedness and signal ÷ variance."""

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages, ibpo

H = advantages.hyper_values()

# One group of four trajectories (T = 3): rows 0-2 share the first token, rows 0-1 the
# first two; row 3 leaves at once. r = (1, 0, 1, 0).
TOKENS = [[1, 2, 3], [1, 2, 4], [1, 5, 6], [7, 8, 9]]
REWARDS = [1.0, 0.0, 1.0, 0.0]


def _inputs(tokens=TOKENS, rewards=REWARDS, ids=None, *, lengths=None, **extra):
  tokens = np.asarray(tokens, np.int32)
  B, T = tokens.shape
  lengths = [T] * B if lengths is None else lengths
  return advantages.AdvantageInputs(
    rewards_B=jnp.asarray(rewards, jnp.float32),
    group_ids_B=jnp.zeros(B, jnp.int32) if ids is None else jnp.asarray(ids, jnp.int32),
    mask_BT=jnp.arange(T)[None, :] < jnp.asarray(lengths)[:, None],
    tokens_BT=jnp.asarray(tokens),
    **{k: None if v is None else jnp.asarray(v) for k, v in extra.items()},
  )


@functools.cache
def _jitted(name, **options):
  """One compile per estimator, options and input structure (eager runs trace every op)."""
  return jax.jit(advantages.REGISTRY.make(name, **options))


@functools.cache
def _stats(**options):
  return jax.jit(functools.partial(advantages.ibpo_stats, **options))


@functools.cache
def _baseline(shrink):
  return jax.jit(functools.partial(ibpo.baseline, shrink=shrink))


def _adv(inputs, *, lam=1.0, **options):
  hyper = advantages.hyper_values(ibpo_lambda=lam)
  return np.asarray(_jitted("ibpo", **options)(inputs, hyper))


def test_hand_example_four_rollouts():
  """κ = 0, λ = 1, scale "none": A = (3/4)(r_i − φ_{−i}(s_{i,t})). Root: r̄_{−i} = 1/3, 2/3,
  1/3, 2/3. State [1] (rows 0-2, S = 2): φ_{−0} = φ_{−2} = 1/2, φ_{−1} = 1; row 3 alone at
  [7] keeps 2/3. State [1, 2] (rows 0-1): φ_{−0} = 0, φ_{−1} = 1; row 2 alone at [1, 5]
  keeps 1/2."""
  got = _adv(_inputs(), scale="none")
  numerators = [[2 / 3, 1 / 2, 1], [-2 / 3, -1, -1], [2 / 3, 1 / 2, 1 / 2], [-2 / 3] * 3]
  np.testing.assert_allclose(got, 0.75 * np.asarray(numerators), rtol=1e-6)
  # κ = 1 shrinks toward the parent prefix's value, from the root's r̄_{−i}:
  # φ_{−0}([1]) = (1 + 1/3)/3 = 4/9, φ_{−1}([1]) = (2 + 2/3)/3 = 8/9; φ_{−0}([1,2]) =
  # (0 + 4/9)/2 = 2/9, φ_{−1}([1,2]) = (1 + 8/9)/2 = 17/18; rows alone keep their parent's.
  got = _adv(_inputs(), scale="none", shrink=1.0)
  numerators = [[2 / 3, 5 / 9, 7 / 9], [-2 / 3, -8 / 9, -17 / 18], [2 / 3, 5 / 9, 5 / 9]]
  np.testing.assert_allclose(got[:3], 0.75 * np.asarray(numerators), rtol=1e-6)
  np.testing.assert_allclose(got[3], -0.5, rtol=1e-6)
  # λ = 1/2 mixes the root's r̄_{−i} and the prefix's: row 1 at t = 2: 0 − (2/3 + 1)/2.
  half = _adv(_inputs(), scale="none", lam=0.5)
  np.testing.assert_allclose(half[1], 0.75 * np.asarray([-2 / 3, -5 / 6, -5 / 6]), rtol=1e-6)


def test_lambda_zero_is_grpo_and_equal_rewards_give_zero():
  inputs = _inputs()
  for scale, base in (("std", "grpo"), ("none", "dr_grpo")):
    want = np.asarray(_jitted(base)(inputs, H))
    got = _adv(inputs, lam=0.0, scale=scale, shrink=2.0)  # Whatever κ.
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.abs(_adv(inputs, scale=scale, shrink=2.0) - want).max() > 0.1  # λ matters.
  # A group whose rewards are all 0.3 (no exact binary sum): exactly 0 even at eps = 1e-6.
  same = _inputs(rewards=[0.3] * 4)
  assert np.all(_adv(same, shrink=2.0) == 0.0)
  # With branches (never at the root) λ = 0 is still GRPO over the samples; where the samples
  # all tie but a branch differs, σ_g is the trie's (here std(0, 0, 0, 0, 1, 0) = 1/√6).
  branched = _inputs(
    **{**BRANCHED, "rewards": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]}, start_B=[0] * 4 + [2] * 2
  )
  want = np.asarray(_jitted("grpo")(_inputs(), H))
  np.testing.assert_allclose(_adv(branched, lam=0.0, shrink=2.0)[:4], want, rtol=1e-6)
  tied = _inputs(**{**BRANCHED, "rewards": [0.0] * 5 + [1.0]}, start_B=[0] * 4 + [2] * 2)
  got = _adv(tied, shrink=2.0)
  # Row 3 at [7, 8]: φ_{−3} = (0 + 1 + 2·0)/(2 + 2) = 1/4 (κ = 2 toward φ_{−3}([7]) = 0).
  np.testing.assert_allclose(got[3], [0, 0, 0.75 * (0 - 0.25) * np.sqrt(6)], rtol=1e-5, atol=1e-7)


def test_groups_do_not_mix_and_padding_ends_a_trajectory():
  # The same tokens in two groups; row 1 is 2 tokens long. Group 0 (r = 1, 0): the root and
  # [1] and [1, 2] hold both rows: φ_{−0} = 0, φ_{−1} = 1 everywhere (κ = 0); scale 1/2.
  inputs = _inputs(
    [[1, 2, 3], [1, 2, 9], [1, 2, 3], [1, 2, 3]],
    [1.0, 0.0, 0.0, 0.0],
    [0, 0, 1, 1],
    lengths=[3, 2, 3, 3],
  )
  got = _adv(inputs, scale="none")
  np.testing.assert_allclose(got, [[0.5] * 3, [-0.5, -0.5, 0], [0] * 3, [0] * 3], atol=1e-7)


# ----------------------------------------------------------------------------
# A reference trie (Python dicts), the zero-sum per node, branches.
# ----------------------------------------------------------------------------


def _state(row, t, *, state="prefix", context=0):
  """The key of s_{i,t} (ibpo.py, "States"): the prefix; (t, its last k tokens); or the
  last k tokens and their length, at any depth."""
  if state == "prefix":
    return tuple(row[:t])
  last = tuple(row[max(0, t - context) : t])
  return (t, last) if state == "window" else (min(t, context), last)


def reference_baseline(
  tokens, lengths, rewards, ids, trie, start, weights, *, shrink, lam, state="prefix", context=0
):
  """b[i][t] for t < |o_i| by the module docstring's definition, one row at a time."""
  key = functools.partial(_state, state=state, context=context)
  sums = collections.defaultdict(lambda: np.zeros(2))
  for j in np.flatnonzero(trie):
    # j counts at its states of depth ≥ start_j, once per state.
    for k in {(ids[j], key(tokens[j], t)) for t in range(start[j], lengths[j] + 1)}:
      sums[k] += weights[j] * np.array([1.0, rewards[j]])
  out = {}
  for i in np.flatnonzero(trie):
    phi = []
    for t in range(lengths[i]):
      n, s = sums[(ids[i], key(tokens[i], t))]
      if t >= start[i]:
        n, s = n - weights[i], s - weights[i] * rewards[i]
      if t == 0:
        phi.append(s / n if n > 0 else 0.0)
      else:
        phi.append((s + shrink * phi[-1]) / (n + shrink) if n + shrink > 0 else phi[-1])
    out[i] = [(1 - lam) * phi[0] + lam * p for p in phi]
  return out


def _random_groups(rng, *, groups=10, rows=8, T=5, vocab=3):
  B = groups * rows
  tokens = rng.integers(0, vocab, size=(B, T))
  tokens[:, 0] = rng.integers(0, 2, size=B)  # Shared prefixes are common.
  lengths = rng.integers(1, T + 1, size=B)
  tokens[np.arange(B), lengths - 1] = vocab  # An end token: no row goes on past another's end.
  return dict(
    tokens=tokens,
    lengths=lengths,
    rewards=rng.integers(0, 2, size=B).astype(np.float64),
    ids=np.repeat(np.arange(groups), rows),
  )


@pytest.mark.parametrize("shrink, lam", [(0.0, 1.0), (1.0, 0.3)])
def test_matches_the_reference_trie_with_branches_weights_and_padding(shrink, lam):
  rng = np.random.default_rng(int(10 * shrink + 10 * lam))
  d = _random_groups(rng)  # The zero-sum test's shapes: one compile per κ for both.
  B, T = d["tokens"].shape
  start = np.where(rng.random(B) < 0.3, rng.integers(1, T, size=B), 0)
  start = np.minimum(start, d["lengths"] - 1)
  trie = rng.random(B) < 0.9
  weights = np.where(rng.random(B) < 0.3, 0.5, 1.0)
  _check_against_the_reference(d, trie, start, weights, shrink=shrink, lam=lam)


def _check_against_the_reference(d, trie, start, weights, *, shrink, lam, **state):
  """ibpo.baseline (jitted) equals reference_baseline on `_random_groups` data."""
  T = d["tokens"].shape[1]
  fn = _baseline(shrink) if not state else jax.jit(
    functools.partial(ibpo.baseline, shrink=shrink, **state)
  )  # fmt: skip
  b_BT, _ = fn(
    jnp.asarray(d["tokens"], jnp.int32),
    jnp.arange(T)[None, :] < jnp.asarray(d["lengths"])[:, None],
    jnp.asarray(d["rewards"], jnp.float32),
    jnp.asarray(d["ids"], jnp.int32),
    jnp.asarray(trie),
    lam=jnp.float32(lam),
    start_B=jnp.asarray(start, jnp.int32),
    weights_B=jnp.asarray(weights, jnp.float32),
  )
  want = reference_baseline(
    **d, trie=trie, start=start, weights=weights, shrink=shrink, lam=lam, **state
  )
  for i, b in want.items():
    np.testing.assert_allclose(np.asarray(b_BT)[i, : len(b)], b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("state, context", [("window", 2), ("span", 2), ("span", 1)])
def test_window_and_span_states_match_the_reference(state, context):
  """The coarser states (ibpo.py, "States") against the reference's keys: rows that pool by
  their last k tokens at one depth, or anywhere, each row once per state; weights, a trie
  mask and padding as above; branches (start > 0) with the window only (a span refuses
  them)."""
  rng = np.random.default_rng(7 + context)
  d = _random_groups(rng)
  B, T = d["tokens"].shape
  start = np.zeros(B, np.int64)
  if state == "window":
    start = np.minimum(
      np.where(rng.random(B) < 0.3, rng.integers(1, T, size=B), 0), d["lengths"] - 1
    )
  trie = rng.random(B) < 0.9
  weights = np.where(rng.random(B) < 0.3, 0.5, 1.0)
  for shrink, lam in ((0.0, 1.0), (1.0, 0.3)):
    _check_against_the_reference(
      d, trie, start, weights, shrink=shrink, lam=lam, state=state, context=context
    )


def test_a_span_counts_a_row_once_and_leaves_all_its_copies_out():
  """One group, κ = 0, λ = 1, k = 1. Row 0 = [5, 5, 5] (r 1) reaches the state "last token
  5" at depths 1, 2 and 3; row 1 = [5, 7, 7] (r 0) at depth 1; row 2 = [7, 5, 9] (r 1) at
  depth 2. Row 1's token at t = 1 (state "5"): the others there are rows 0 and 2, once each:
  φ = 1. Row 0's tokens at t = 1, 2: rows 1 and 2: φ = 1/2, none of row 0's three copies in."""
  inputs = _inputs([[5, 5, 5], [5, 7, 7], [7, 5, 9]], [1.0, 0.0, 1.0])
  adv = _adv(inputs, scale="none", state="span", context=1)
  # A = (2/3)(r − b); root: r̄_{−0} = 1/2, r̄_{−1} = 1, r̄_{−2} = 1/2.
  np.testing.assert_allclose(adv[0], [2 / 3 * 0.5, 2 / 3 * 0.5, 2 / 3 * 0.5], atol=1e-6)
  np.testing.assert_allclose(adv[1][:2], [2 / 3 * -1.0, 2 / 3 * -1.0], atol=1e-6)
  # Row 1 at t = 2 (state "7"): row 2 holds 7 at depth 1 → φ = 1.
  np.testing.assert_allclose(adv[1][2], 2 / 3 * -1.0, atol=1e-6)


@pytest.mark.parametrize("shrink", [0.0, 1.0])
def test_zero_sum_at_every_trie_node(shrink):
  """λ = 1, unit weights. At every state s where n ≥ 2 rows choose a token (rows end with an
  end token, so every row counting at s chooses one), their advantages for it sum to
  Σ_{i∈N(s)} (r_i − φ_{−i}(s)) = 0 when κ = 0; with κ > 0 to κ/(n − 1 + κ)·Σ_{i∈N(s)}
  (r_i − φ_{−i}(s⁻)), s⁻ the parent state."""
  d = _random_groups(np.random.default_rng(3), vocab=2)
  B, T = d["tokens"].shape
  b_BT, _ = _baseline(shrink)(
    jnp.asarray(d["tokens"], jnp.int32),
    jnp.arange(T)[None, :] < jnp.asarray(d["lengths"])[:, None],
    jnp.asarray(d["rewards"], jnp.float32),
    jnp.asarray(d["ids"], jnp.int32),
    jnp.ones(B, bool),
    lam=jnp.float32(1.0),
    start_B=jnp.zeros(B, jnp.int32),
    weights_B=jnp.ones(B, jnp.float32),
  )
  b = np.asarray(b_BT, np.float64)
  nodes = collections.defaultdict(list)
  for i in range(B):
    for t in range(d["lengths"][i]):
      nodes[(d["ids"][i], tuple(d["tokens"][i][:t]))].append((i, t))
  checked = 0
  for members in nodes.values():
    n = len(members)
    if n < 2:
      continue
    total = sum(d["rewards"][i] - b[i, t] for i, t in members)
    if shrink == 0.0 or members[0][1] == 0:  # The root is never shrunk: RLOO exactly.
      want = 0.0
    else:
      want = shrink / (n - 1 + shrink) * sum(d["rewards"][i] - b[i, t - 1] for i, t in members)
    assert total == pytest.approx(want, abs=1e-5)
    checked += 1
  assert checked > 40  # Inner nodes, not just the roots.


# A group of the four trajectories plus two branches of row 3 ([7, 8, 9], r = 0) cut at
# c = 2: [7, 8, 5] (r = 1) and [7, 8, 6] (r = 0), informing the trie only.
BRANCHED = dict(
  tokens=TOKENS + [[7, 8, 5], [7, 8, 6]],
  rewards=REWARDS + [1.0, 0.0],
  valid_B=[True] * 4 + [False] * 2,
  context_B=[False] * 4 + [True] * 2,
)


def test_branches_count_only_below_their_cut():
  """Row 3 at its state [7, 8] (t = 2) is compared with the two branches: φ_{−3} = 1/2, so
  (3/4)(0 − 1/2); every token above the cut keeps its branch-free advantage."""
  plain = _adv(_inputs(), scale="none")
  got = _adv(_inputs(**BRANCHED, start_B=[0, 0, 0, 0, 2, 2]), scale="none")
  want = plain.copy()
  want[3, 2] = 0.75 * (0.0 - 0.5)
  np.testing.assert_allclose(got[:4], want, rtol=1e-6)
  assert np.all(got[4:] == 0)  # Context rows are never trained.
  # κ = 1: φ_{−3}([7]) = 2/3 (no other row), φ_{−3}([7, 8]) = (1 + 2/3)/(2 + 1) = 5/9.
  got = _adv(_inputs(**BRANCHED, start_B=[0, 0, 0, 0, 2, 2]), scale="none", shrink=1.0)
  np.testing.assert_allclose(got[3], 0.75 * np.asarray([-2 / 3, -2 / 3, -5 / 9]), rtol=1e-6)
  # Counted above their cut (start 0, issue 29's bug), the branches would move every row's
  # credit on tokens they only copied: row 3's first token now meets [7, 8, 5]'s success.
  above = _adv(_inputs(**BRANCHED, start_B=[0] * 6), scale="none")
  assert np.abs(above[:4, :2] - plain[:, :2]).max() > 0.1


def test_trained_branches_get_credit_only_on_their_own_tokens():
  """Trained (valid) branch rows: 0 above their cut; at t = 2 the first branch meets row 3
  and the other branch (both r = 0): (5/6)(1 − 0); n_g = 6."""
  inputs = _inputs(
    **{**BRANCHED, "valid_B": [True] * 6, "context_B": None}, start_B=[0] * 4 + [2] * 2
  )
  got = _adv(inputs, scale="none")
  np.testing.assert_allclose(got[4], [0, 0, 5 / 6], rtol=1e-6)
  np.testing.assert_allclose(got[5], [0, 0, 5 / 6 * (0 - 0.5)], rtol=1e-6)


def test_counterfactual_weights_count_in_the_trie_not_in_n_g():
  """Samples o0 = [1, 2] (r 0), o1 = [1, 3] (r 1); a perturbed-prompt row o2 = [1, 2] (r 1,
  weight 1/2, start 0). Root and [1] hold all three: φ_{−0} = (1 + 1/2)/(3/2) = 1, φ_{−1} =
  (0 + 1/2)/(3/2) = 1/3; scale (n_g − 1)/n_g = 1/2 over the two samples."""
  inputs = _inputs(
    [[1, 2], [1, 3], [1, 2]],
    [0.0, 1.0, 1.0],
    valid_B=[True, True, False],
    context_B=[False, False, True],
    weights_B=[1.0, 1.0, 0.5],
  )
  got = _adv(inputs, scale="none")
  np.testing.assert_allclose(got, [[-0.5, -0.5], [1 / 3, 1 / 3], [0, 0]], rtol=1e-6)
  # Weight 0: as if the row were absent.
  zero = _adv(inputs.replace(weights_B=jnp.asarray([1.0, 1.0, 0.0])), scale="none")
  np.testing.assert_allclose(zero[:2], [[-0.5, -0.5], [0.5, 0.5]], rtol=1e-6)


def test_options_are_checked_at_config_time():
  with pytest.raises(ValueError, match="shrink must be a finite number >= 0"):
    advantages.REGISTRY.make("ibpo", shrink=-1.0)
  with pytest.raises(ValueError, match="ibpo scale must be one of std, none"):
    advantages.REGISTRY.make("ibpo", scale="rank")
  with pytest.raises(ValueError, match="unknown option|base"):
    advantages.REGISTRY.make("ibpo", base="grpo")  # The additive form's option is gone.
  with pytest.raises(ValueError, match="needs AdvantageInputs.tokens_BT"):
    advantages.REGISTRY.make("ibpo")(_inputs().replace(tokens_BT=None), H)


def test_metrics_by_hand():
  """Hand example, κ = 0, λ = 1, scale "none". Terminal term x = r_i − r̄_{−i} = ±2/3;
  comparison term y = r̄_{−i} − φ_{−i}: row 0 (0, −1/6, 1/3), row 1 (0, −1/3, −1/3), row 2
  (0, −1/6, −1/6), row 3 0. |A − A^{λ=0}| = (3/4)|y| sums to 9/8 over 12 tokens; no sign
  flips; Σxy = 1/3, Σx² = 16/3, Σy² = 5/12: corr = 2/√80."""
  inputs = _inputs()
  got = _stats(scale="none")(inputs, H)
  np.testing.assert_allclose(got["ibpo/comparison_abs_mean"], (9 / 8) / 12, rtol=1e-6)
  assert float(got["ibpo/sign_flip_frac"]) == 0.0
  np.testing.assert_allclose(got["ibpo/terminal_comparison_corr"], 2 / np.sqrt(80), rtol=1e-5)
  # λ = 0: no comparison beyond the group's.
  zero = _stats(scale="none")(inputs, advantages.hyper_values(ibpo_lambda=0.0))
  assert float(zero["ibpo/terminal_comparison_corr"]) == 0.0
  assert float(zero["ibpo/comparison_abs_mean"]) == pytest.approx(0.0, abs=1e-7)


# ----------------------------------------------------------------------------
# A tabular policy: 3 tokens, 3 steps, one softmax per prefix (13 states × 3 logits). Its
# exact policy gradient is a sum over the 27 sequences.
# ----------------------------------------------------------------------------

V, T = 3, 3
SEQS = np.array(list(itertools.product(range(V), repeat=T)))


def _states(tokens_RT):
  """State index of each prefix o_{<t}: (V^t − 1)/(V − 1) + o_{<t} read in base V."""
  out = np.zeros(tokens_RT.shape, np.int64)
  for t in range(1, T):
    out[:, t] = (V**t - 1) // (V - 1) + tokens_RT[:, :t] @ (V ** np.arange(t - 1, -1, -1))
  return out


def _reward(tokens_RT):
  """1 unless the sequence holds token 2 (an unrecoverable error): prefixes predict it."""
  return (tokens_RT != 2).all(axis=1).astype(np.float32)


def _policy(theta_SV):
  p = np.exp(theta_SV - theta_SV.max(axis=1, keepdims=True))
  return p / p.sum(axis=1, keepdims=True)


def _score(pi_SV, tokens_RT):
  """∇_θ log π(o_t | o_{<t}) per (row, t): e_{o_t} − π(·|s_t) in the row of state s_t."""
  s_RT = _states(tokens_RT)
  return s_RT, np.eye(V)[tokens_RT] - pi_SV[s_RT]


def exact_gradient(theta_SV):
  """∇J = Σ_o π(o) r(o) Σ_t ∇log π(o_t|o_{<t}), by enumeration."""
  pi = _policy(theta_SV)
  s_RT, score_RTV = _score(pi, SEQS)
  p_R = np.prod(pi[s_RT, SEQS], axis=1)
  g = np.zeros_like(theta_SV)
  np.add.at(g, s_RT, (p_R * _reward(SEQS))[:, None, None] * score_RTV)
  return g


def _sample(rng, pi_SV, prefix_RT, cut_R):
  """o_{<c} = prefix, o_{≥c} ~ π: c = 0 for samples, the cut for branches."""
  out = prefix_RT.copy()
  for t in range(T):
    p = pi_SV[_states(out)[:, t]]
    a = (rng.random(len(out))[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, V - 1)
    out[:, t] = np.where(t >= cut_R, a, out[:, t])
  return out


N_GROUPS, G, C = 24_000, 8, 4  # G samples + C branch rows (2 parents × 2 continuations).


@pytest.fixture(scope="module")
def tabular():
  """N groups of G samples and C branches, parent uniform among the G and cut uniform in
  {1, 2}: a plan that looks only at the prefix it keeps. Rows group-major [N·(G + C), T]."""
  rng = np.random.default_rng(1)
  theta = rng.normal(0.0, 1.0, (13, V))
  pi = _policy(theta)
  samples = _sample(rng, pi, np.zeros((N_GROUPS * G, T), np.int64), 0).reshape(N_GROUPS, G, T)
  parent = np.repeat(np.argsort(rng.random((N_GROUPS, G)), axis=1)[:, :2], 2, axis=1)
  cut = np.repeat(rng.integers(1, T, size=(N_GROUPS, 2)), 2, axis=1)
  prefix = samples[np.arange(N_GROUPS)[:, None], parent].reshape(-1, T)
  branches = _sample(rng, pi, prefix, cut.reshape(-1)).reshape(N_GROUPS, C, T)
  tokens = np.concatenate([samples, branches], axis=1).reshape(-1, T)
  sample_R = np.tile(np.r_[np.ones(G, bool), np.zeros(C, bool)], N_GROUPS)
  start = np.concatenate([np.zeros((N_GROUPS, G), np.int64), cut], axis=1).reshape(-1)
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.asarray(_reward(tokens)),
    group_ids_B=jnp.asarray(np.repeat(np.arange(N_GROUPS), G + C), jnp.int32),
    mask_BT=jnp.ones(tokens.shape, bool),
    tokens_BT=jnp.asarray(tokens, jnp.int32),
    valid_B=jnp.asarray(sample_R),
    context_B=jnp.zeros(len(tokens), bool),  # Branches off the trie unless a test says so.
    start_B=jnp.asarray(start, jnp.int32),
  )
  return dict(theta=theta, pi=pi, tokens=tokens, sample_R=sample_R, inputs=inputs)


def _group_gradients(tab, adv_RT):
  """ĝ per group: (1/G) Σ_{samples i} Σ_t A_{i,t} ∇log π(o_{i,t}|s_{i,t}), flattened [N, 39]."""
  rows = tab["sample_R"]
  s_RT, score_RTV = _score(tab["pi"], tab["tokens"][rows])
  g = np.zeros((N_GROUPS, 13, V))
  n_RT = np.repeat(np.arange(N_GROUPS), G)[:, None].repeat(T, axis=1)
  np.add.at(g, (n_RT, s_RT), adv_RT[rows][:, :, None] * score_RTV)
  return g.reshape(N_GROUPS, -1) / G


def _estimate(tab, name, *, lam=1.0, branches=None, **options):
  inputs = tab["inputs"]
  if branches is not None:  # "cut": count from their cut; "above": from depth 0 (biased).
    inputs = inputs.replace(context_B=jnp.asarray(~tab["sample_R"]))
    if branches == "above":
      inputs = inputs.replace(start_B=jnp.zeros_like(inputs.start_B))
  hyper = advantages.hyper_values(ibpo_lambda=lam)
  return _group_gradients(tab, np.asarray(_jitted(name, **options)(inputs, hyper)))


def _max_z(g_NP, want_P):
  se_P = g_NP.std(axis=0, ddof=1) / np.sqrt(len(g_NP))
  return float(np.max(np.abs(g_NP.mean(axis=0) - want_P) / np.maximum(se_P, 1e-12)))


def test_unbiased_on_a_tabular_policy(tabular):
  """scale "none": E[ĝ] = (G − 1)/G·∇J exactly (the (n_g − 1)/n_g factor). Tolerance: each
  of the 39 coordinates within 4 Monte-Carlo standard errors of it (under unbiasedness
  P(max |z| > 4) ≈ 39 × 6e-5 = 0.25%; the seeds are fixed). The same check catches the
  bias of branches counted above their cut (|z| > 6 at these 12,000 groups)."""
  want = (G - 1) / G * exact_gradient(tabular["theta"]).ravel()
  assert _max_z(_estimate(tabular, "dr_grpo"), want) < 4.0  # The check's own control.
  for lam, shrink, branches in ((1.0, 0.0, None), (0.5, 4.0, None), (1.0, 4.0, "cut")):
    g = _estimate(tabular, "ibpo", lam=lam, shrink=shrink, scale="none", branches=branches)
    assert _max_z(g, want) < 4.0, (lam, shrink, branches)
  for state, branches in (("window", "cut"), ("span", None)):  # ibpo.py, "States".
    g = _estimate(tabular, "ibpo", scale="none", state=state, context=1, branches=branches)
    assert _max_z(g, want) < 4.0, state
  above = _estimate(tabular, "ibpo", shrink=4.0, scale="none", branches="above")
  assert _max_z(above, want) > 6.0


def _signal_to_variance(g_NP):
  """‖E ĝ‖² / E‖ĝ − E ĝ‖², scale-free; ‖mean‖² less its own sampling part tr Σ/N."""
  mean = g_NP.mean(axis=0)
  var = float(np.sum((g_NP - mean) ** 2, axis=1).mean())
  return (float(mean @ mean) - var / len(g_NP)) / var


def test_signal_to_variance_at_least_the_group_baselines(tabular):
  """Same samples, G = 8: with shrinkage toward the parent prefix (κ = 4) the prefix
  baseline keeps more signal per unit variance than GRPO (scale "std") and Dr. GRPO
  ("none"); without it (κ = 0) the leave-one-out mean of the one or two other rows at a
  deep prefix is noise, and it keeps less (n/(n − 1) inflation at every small node)."""
  ratio = {name: _signal_to_variance(_estimate(tabular, name)) for name in ("grpo", "dr_grpo")}
  std4 = _signal_to_variance(_estimate(tabular, "ibpo", shrink=4.0, scale="std"))
  none4 = _signal_to_variance(_estimate(tabular, "ibpo", shrink=4.0, scale="none"))
  none0 = _signal_to_variance(_estimate(tabular, "ibpo", shrink=0.0, scale="none"))
  assert std4 / ratio["grpo"] > 1.005, (std4, ratio)
  assert none4 / ratio["dr_grpo"] > 1.01, (none4, ratio)
  assert none0 / ratio["dr_grpo"] < 0.95, (none0, ratio)


def test_comparison_term_is_a_control_variate_on_the_tabular_batch(tabular):
  """Prefixes predict the outcome (an error token is fatal): the comparison term correlates
  negatively with the terminal term. Rewards shuffled within each group (so no prefix says
  anything of its row's reward): about 0."""
  inputs = tabular["inputs"]
  stats = functools.partial(_stats(shrink=4.0), hyper=H)
  got = float(stats(inputs)["ibpo/terminal_comparison_corr"])
  assert got < -0.2, got
  rng = np.random.default_rng(0)
  r_NR = np.asarray(inputs.rewards_B).reshape(N_GROUPS, G + C)
  shuffled = rng.permuted(r_NR[:, :G], axis=1)
  r_NR = np.concatenate([shuffled, r_NR[:, G:]], axis=1).reshape(-1)
  null = float(stats(inputs.replace(rewards_B=jnp.asarray(r_NR)))["ibpo/terminal_comparison_corr"])
  assert abs(null) < 0.02, null
