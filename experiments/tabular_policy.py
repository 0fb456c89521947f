"""A tabular policy with an end token, for measuring estimators against exact gradients.

Tokens {EOS = 0, 1, ..., V − 1}, at most T of them, one softmax per prefix of non-end tokens:
S = (K^T − 1)/(K − 1) states with K = V − 1 (the prefixes of length 0..T − 1), θ of shape
[S, V]. A completion is a body of n < T non-end tokens and EOS, or T non-end tokens, so
lengths vary, which a fixed-length policy (tests/rl/test_ibpo.py's) cannot show.

Used by tests/rollouts/test_counterfactual_bias.py (which plans bias IBPO) and
experiments/ibpo_states.py (how much variance each IBPO state removes). T is read from the
arrays' shapes; V is an argument.
"""

from __future__ import annotations

import itertools

import numpy as np

EOS = 0


def num_states(*, vocab: int, T: int) -> int:
  K = vocab - 1
  return (K**T - 1) // (K - 1)


def states(tokens_RT, *, vocab: int):
  """State of each prefix o_{<t}: (K^t − 1)/(K − 1) + o_{<t} − 1 read in base K (an end
  token, or padding, past the end reads as 1: those positions are never scored)."""
  K, T = vocab - 1, tokens_RT.shape[1]
  body_RT = np.clip(tokens_RT, 1, K) - 1
  out = np.zeros(tokens_RT.shape, np.int64)
  for t in range(1, T):
    out[:, t] = (K**t - 1) // (K - 1) + body_RT[:, :t] @ (K ** np.arange(t - 1, -1, -1))
  return out


def policy(theta_SV):
  p = np.exp(theta_SV - theta_SV.max(axis=1, keepdims=True))
  return p / p.sum(axis=1, keepdims=True)


def sample(rng, pi_SV, prefix_RT, cut_R):
  """(tokens, lengths): o_{<c} = prefix (no end token in it), o_{≥c} ~ π until EOS or T;
  cut 0 samples whole completions."""
  vocab = pi_SV.shape[1]
  out, alive = prefix_RT.copy(), np.ones(len(prefix_RT), bool)
  for t in range(out.shape[1]):
    p = pi_SV[states(out, vocab=vocab)[:, t]]
    a = (rng.random(len(out))[:, None] > np.cumsum(p, axis=1)).sum(axis=1).clip(0, vocab - 1)
    out[:, t] = np.where(t >= cut_R, np.where(alive, a, EOS), out[:, t])
    alive &= out[:, t] != EOS
  length = np.where((out == EOS).any(axis=1), np.argmax(out == EOS, axis=1) + 1, out.shape[1])
  return np.where(np.arange(out.shape[1]) < length[:, None], out, EOS), length


def scores(pi_SV, tokens_RT, length_R):
  """(s_RT, ∇_θ log π(o_t|s_t) per (row, t): e_{o_t} − π(·|s_t) in the row of s_t, zero past
  the end)."""
  s_RT = states(tokens_RT, vocab=pi_SV.shape[1])
  on_RT = np.arange(tokens_RT.shape[1]) < length_R[:, None]
  return s_RT, (np.eye(pi_SV.shape[1])[tokens_RT] - pi_SV[s_RT]) * on_RT[:, :, None]


def completions(*, vocab: int, T: int):
  """(tokens, lengths) of every completion."""
  seqs, lengths = [], []
  for n in range(T + 1):
    for body in itertools.product(range(1, vocab), repeat=n):
      end = [EOS] if n < T else []
      seqs.append(list(body) + end + [EOS] * (T - n - len(end)))
      lengths.append(n + len(end))
  return np.array(seqs), np.array(lengths)


def _probabilities(pi_SV, tokens, length):
  s_RT = states(tokens, vocab=pi_SV.shape[1])
  on_RT = np.arange(tokens.shape[1]) < length[:, None]
  p_R = np.prod(np.where(on_RT, pi_SV[s_RT, tokens], 1.0), axis=1)
  assert abs(p_R.sum() - 1.0) < 1e-9, p_R.sum()
  return p_R


def exact_gradient(theta_SV, reward, *, T: int):
  """∇J = Σ_o π(o) r(o) Σ_t ∇log π(o_t|o_{<t}) over every completion; reward(tokens,
  lengths) -> r per row."""
  pi = policy(theta_SV)
  tokens, length = completions(vocab=theta_SV.shape[1], T=T)
  s_RT, score_RTV = scores(pi, tokens, length)
  p_R = _probabilities(pi, tokens, length)
  g = np.zeros_like(theta_SV)
  np.add.at(g, s_RT, (p_R * reward(tokens, length))[:, None, None] * score_RTV)
  return g


def values(pi_SV, reward, *, T: int):
  """V(s) = E[r | s] of every state: Σ_o π(o) r(o) over the completions through s, over
  π(s)."""
  tokens, length = completions(vocab=pi_SV.shape[1], T=T)
  s_RT = states(tokens, vocab=pi_SV.shape[1])
  on_RT = np.arange(T) < length[:, None]
  p_R = _probabilities(pi_SV, tokens, length)
  r_R = reward(tokens, length)
  S = pi_SV.shape[0]
  num, den = np.zeros(S), np.zeros(S)
  for t in range(T):
    reach = on_RT[:, t]  # Completions with a token at t pass through their state at t.
    np.add.at(num, s_RT[reach, t], (p_R * r_R)[reach])
    np.add.at(den, s_RT[reach, t], p_R[reach])
  return np.where(den > 0, num / np.maximum(den, 1e-300), 0.0)


def group_gradients(pi_SV, tokens_RT, length_R, adv_RT, *, group_size: int):
  """ĝ per group of `group_size` consecutive rows, [groups, S, V]: (1/G) Σ_i Σ_t A_{i,t}
  ∇log π(o_{i,t}|s_{i,t}). Each state's V entries sum to 0 (so do its scores): a test of the
  mean that inverts a covariance keeps V − 1 of them."""
  n = len(tokens_RT) // group_size
  s_RT, score_RTV = scores(pi_SV, tokens_RT, length_R)
  g = np.zeros((n, *pi_SV.shape))
  rows_RT = np.repeat(np.arange(n), group_size)[:, None]
  np.add.at(g, (rows_RT, s_RT), adv_RT[:, :, None] * score_RTV)
  return g / group_size
