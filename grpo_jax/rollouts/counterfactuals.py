"""IBPO's counterfactual trajectories, generated: branches from prefixes of the group's
rollouts and samples under perturbed prompts, merged into the batch with their provenance.

IBPO (arXiv 2605.16302; RESEARCH.md §3.2) credits a decision by comparing trajectories
that share everything but that decision. Stochastic re-decoding (the group itself) gives
such pairs by chance; this module makes them on purpose, on top of the G rollouts:

  branch      o~ = o_i[:c] + a continuation sampled from π(·|q, o_i[:c]): a failed rollout
              gets "local repairs", a correct one near misses. Decoded by the jitted
              sampler from the given prefixes (`branch`), the prefix left-aligned into a
              prompt by a gather, with a per-row limit T − c so |o~| ≤ T.
  hint, paraphrase, repair
              o~ ~ π(·|q~) under a perturbed prompt q~ of the task
              (`tasks.base.Task.perturb`); off-policy for q, so a row carries the original
              prompt q and the weight w = min(π(o~|q)/π(o~|q~), c) (π(o~|q) is the
              trainer's recomputed π_old forward, π(o~|q~) the sampler's log-probs).

Slots: C = config.counterfactual.per_group rows per group, static. `plan` fills them:
C/k (rollout, cut) picks per group among the eligible rollouts (failed, correct or all,
at least 2 tokens long), k = per_rollout continuations from each (k > 1 is the
Monte-Carlo estimate of φ at that prefix: the trie counts all k + 1 trajectories through
it), a cut chosen (W = cut_window, or T − 1 when 0)

  window      c ~ U{1, …, W}; no branch when the parent ended first (c ≥ |o_i|)
  next_step   c = the first step start at or after u ~ U{1, …, W} (a start follows a
              step-ending token; `alignment.step_ids`); no branch when the parent has none
              before its end
  divergence  c = t* + 1, t* the first position where o_i leaves every other trajectory of
              its group (the first prefix the trie has seen once): the Monte-Carlo
              fallback for the prefixes the trie has too few visits of; no branch when o_i
              never leaves them or leaves at its last token
  uniform     c ~ U{1, …, |o_i| − 1}                              (biased for IBPO, below)
  step        uniformly among the step starts in [1, |o_i| − 1], uniform when the rollout
              has none                                            (biased for IBPO, below)

and a total-token budget (config.counterfactual.token_budget, per iteration; 0: none):
slots are granted in a random order while the sum of the most tokens each may decode
stays within it, priced from the draw alone (T − c for window, T − u for next_step, T − 1
for divergence, T for a perturbed sample; T − c for uniform and step); a slot switched
off because its parent ended first still spends its share. Unused slots are inactive: they
decode nothing and are never valid.

The merged batch is group-major: each group's G samples, then its C counterfactuals, so
the trainer sees groups of G + C rows (`build.Setup.train_group`). `Provenance` travels
next to the rollouts: kind (KINDS), the parent row, own_NT (the tokens the row generated
itself: a branch's prefix is its parent's and is never trained twice) and active_N.

What IBPO may read of them (`rl.counterfactuals.biased_choices`), the config
(`rl.counterfactuals.CounterfactualConfig`), the full-rewrite filter and the rows' weights
in prepare are the objective's: grpo_jax/rl/counterfactuals.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import paged, sampling
from grpo_jax.rl import alignment, ibpo
from grpo_jax.rl.counterfactuals import CounterfactualConfig, Plan, Provenance, merge_order

# ----------------------------------------------------------------------------
# Planning the slots (jitted).
# ----------------------------------------------------------------------------


def eligible(correct_N, length_N, *, branch_from: str, needs_prefix: bool = True):
  """Rollouts that may get counterfactuals: by outcome, and for a branch (needs_prefix) at
  least 2 tokens long. A perturbed-prompt row copies nothing of its parent, so its slot
  never waits on the parent's length (which would tie the row to the first token of every
  row of the group, when all but one ended at once)."""
  ok = {"failed": correct_N <= 0, "correct": correct_N > 0, "all": correct_N == correct_N}
  return ok[branch_from] & ((length_N >= 2) | (not needs_prefix))


def first_unique(tokens_NT, mask_NT, group_ids_N):
  """t*_N: the first position where row n's prefix o_{≤t} is shared by no other row of
  its group (the trie's first one-visit prefix); its length when never unique."""
  n_NT, _ = ibpo.prefix_stats(tokens_NT, mask_NT, jnp.zeros(tokens_NT.shape[:1]), group_ids_N)
  unique_NT = mask_NT & (n_NT <= 1)
  length_N = jnp.sum(mask_NT, axis=1, dtype=jnp.int32)
  return jnp.where(jnp.any(unique_NT, axis=1), jnp.argmax(unique_NT, axis=1), length_N)


def _cuts(key, parent_M, rollouts, *, cut: str, window: int, splitter: alignment.StepSplitter):
  """(c_M, ok_M, price_M) for the chosen parents (the module docstring): ok_M False where
  the cut gives no branch (the parent ended first, or has no step start or divergence in
  time); price_M the most tokens the branch may decode, read from nothing but the draw
  (T − c, T − u or T − 1), so that one slot's price never says more of a parent than its
  own prefix to another slot through the token budget."""
  len_M = rollouts.length_N[parent_M]
  T = rollouts.tokens_NT.shape[1]
  W = max(min(window or T - 1, T - 1), 1)
  u_M = jax.random.uniform(key, parent_M.shape)
  everywhere_M = jnp.ones(parent_M.shape, bool)
  uniform_M = 1 + jnp.floor(u_M * jnp.maximum(len_M - 1, 1)).astype(jnp.int32)
  if cut == "uniform":
    return uniform_M, everywhere_M, T - uniform_M
  window_M = 1 + jnp.minimum(jnp.floor(u_M * W).astype(jnp.int32), W - 1)
  if cut == "window":
    return window_M, window_M < len_M, T - window_M
  if cut == "divergence":
    t_N = first_unique(rollouts.tokens_NT, rollouts.mask_NT, rollouts.group_ids_N)
    c_M = t_N[parent_M] + 1
    return jnp.minimum(c_M, T - 1), c_M < len_M, jnp.full_like(c_M, T - 1)
  # step / next_step: cuts at step starts (`alignment.step_ids` changes at c), c ≤ |o| − 1.
  ids_MT = splitter.ids(rollouts.tokens_NT[parent_M], rollouts.mask_NT[parent_M])
  t = jnp.arange(T)[None, :]
  changed_MT = jnp.concatenate(
    [jnp.zeros_like(ids_MT[:, :1], bool), ids_MT[:, 1:] != ids_MT[:, :-1]], axis=1
  )
  starts_MT = changed_MT & (t >= 1) & (t <= len_M[:, None] - 1)
  if cut == "next_step":
    later_MT = starts_MT & (t >= window_M[:, None])
    c_M = jnp.argmax(later_MT, axis=1).astype(jnp.int32)
    return c_M, jnp.any(later_MT, axis=1), T - window_M
  n_M = jnp.sum(starts_MT, axis=1)
  pick_M = jnp.floor(u_M * jnp.maximum(n_M, 1)).astype(jnp.int32)  # The pick_M-th start.
  rank_MT = jnp.cumsum(starts_MT, axis=1) - 1
  step_M = jnp.argmax(starts_MT & (rank_MT == pick_M[:, None]), axis=1).astype(jnp.int32)
  c_M = jnp.where(n_M > 0, step_M, uniform_M)
  return c_M, everywhere_M, T - c_M


def plan(
  key,
  rollouts: sampling.Rollouts,
  correct_N,
  *,
  cfg: CounterfactualConfig,
  group_size: int,
  splitter: alignment.StepSplitter = alignment.NO_STEPS,
) -> Plan:
  """Fills the B·C slots (see the module docstring): parents drawn without replacement
  among each group's eligible rollouts (cycling when C/k exceeds them), k slots per
  parent with the same cut, then the token budget, then the slots whose cut gives no
  branch switched off. Jittable."""
  N, T = rollouts.tokens_NT.shape
  G, C, k = group_size, cfg.per_group, cfg.per_rollout
  B = N // G
  pick_key, cut_key, order_key = jax.random.split(key, 3)
  ok_BG = eligible(
    correct_N, rollouts.length_N, branch_from=cfg.branch_from, needs_prefix=not cfg.perturbed
  ).reshape(B, G)
  score_BG = jnp.where(ok_BG, jax.random.gumbel(pick_key, (B, G)), -jnp.inf)
  order_BG = jnp.argsort(-score_BG, axis=1)
  n_B = jnp.sum(ok_BG, axis=1)
  j = jnp.arange(C // k)
  picks_BJ = jnp.take_along_axis(order_BG, j[None, :] % jnp.maximum(n_B, 1)[:, None], axis=1)
  parent_BJ = picks_BJ + G * jnp.arange(B)[:, None]
  cut_J, ok_J, price_J = _cuts(
    cut_key, parent_BJ.reshape(-1), rollouts, cut=cfg.cut, window=cfg.cut_window, splitter=splitter
  )

  def slots(x_J):  # A pick's value on each of its k slots: [B·C/k] -> [B·C].
    return jnp.repeat(x_J.reshape(B, C // k), k, axis=1).reshape(-1)

  parent_M = slots(parent_BJ).astype(jnp.int32)
  cut_M, ok_M, price_M = slots(cut_J).astype(jnp.int32), slots(ok_J), slots(price_J)
  if cfg.perturbed:
    cut_M, ok_M, price_M = jnp.zeros_like(cut_M), jnp.ones_like(ok_M), jnp.full_like(price_M, T)
  active_M = jnp.repeat(n_B > 0, C)
  if cfg.token_budget:
    cost_M = jnp.where(active_M, price_M, 0)
    prio_M = jax.random.permutation(order_key, parent_M.shape[0])
    spent = jnp.zeros_like(cost_M).at[prio_M].set(jnp.cumsum(cost_M[prio_M]))
    active_M = active_M & (spent <= cfg.token_budget)
  active_M = active_M & ok_M
  return Plan(parent_M=parent_M, cut_M=cut_M, active_M=active_M)


# ----------------------------------------------------------------------------
# Decoding the counterfactuals (jitted).
# ----------------------------------------------------------------------------


def prefix_prompts(
  prompt_tokens_MP, prompt_mask_MP, tokens_MT, cut_M, *, pad_id
) -> sampling.Prompts:
  """Prompt + o[:c] per row as one left-padded prompt of P + T slots: the concatenation
  shifted right by T − c (a gather), so its real tokens end at the last slot."""
  P, T = prompt_tokens_MP.shape[1], tokens_MT.shape[1]
  seq_MS = jnp.concatenate([prompt_tokens_MP, tokens_MT], axis=1)
  on_MS = jnp.concatenate([prompt_mask_MP, jnp.arange(T)[None, :] < cut_M[:, None]], axis=1)
  src_MS = jnp.arange(P + T)[None, :] - (T - cut_M)[:, None]
  inside_MS = src_MS >= 0
  src_MS = jnp.clip(src_MS, 0, P + T - 1)
  tokens = jnp.where(inside_MS, jnp.take_along_axis(seq_MS, src_MS, axis=1), pad_id)
  mask = inside_MS & jnp.take_along_axis(on_MS, src_MS, axis=1)
  return sampling.Prompts(tokens_BP=jnp.where(mask, tokens, pad_id), mask_BP=mask)


def sample_limited(
  params,
  prompts: sampling.Prompts,
  limit_M,
  key,
  hyper: sampling.SamplingParams,
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
):
  """One completion per prompt row, row m stopping after limit_M[m] tokens (0: none):
  the decode state (`sampling.decode` with limit_N), on the cache of cfg.kv_layout
  (`_LIMITED`). On pages (`paged.decode`) each row's prefix (left-padded to P + T slots)
  gets its own prompt pages and its continuation takes pages as it grows, from a pool
  that never runs short (kv_pool_fraction 1): a branch the pool cut would be scored as a
  truncated completion, which biases IBPO's φ, and a cut partial row would be prefilled
  again. So these rows gain little memory from pages; they compose with them. The same
  keys draw the same tokens on both."""
  cfg = dataclasses.replace(cfg, group_size=1, kv_pool_fraction=1.0)
  prefill, decode = _LIMITED[cfg.kv_layout]
  state = prefill(params, prompts, key, model_fn=model_fn, init_cache=init_cache, cfg=cfg)
  return decode(params, state, hyper, model_fn=model_fn, cfg=cfg, limit_N=limit_M)


# The prefill and decode of each sampler.kv_layout (`sampling.KV_LAYOUTS`).
_LIMITED = {"dense": (sampling.prefill, sampling.decode), "paged": (paged.prefill, paged.decode)}


def _rows(rollouts: sampling.Rollouts, parent_M, tokens_MT, mask_MT, logp_MT, policy_MT, eos_ids):
  """Counterfactual Rollouts rows: the parent's prompt and group, the given completion."""
  eos_M = sampling.ended_with_eos(tokens_MT, mask_MT, eos_ids)
  return sampling.Rollouts(
    prompt_tokens_NP=rollouts.prompt_tokens_NP[parent_M],
    prompt_mask_NP=rollouts.prompt_mask_NP[parent_M],
    tokens_NT=tokens_MT,
    mask_NT=mask_MT,
    logp_NT=logp_MT,
    policy_logp_NT=policy_MT,
    eos_N=eos_M,
    truncated_N=~eos_M,
    length_N=jnp.sum(mask_MT, axis=1, dtype=jnp.int32),
    group_ids_N=rollouts.group_ids_N[parent_M],
    num_steps=rollouts.num_steps,
  )


def branch(
  params,
  rollouts: sampling.Rollouts,
  cf_plan: Plan,
  key,
  hyper: sampling.SamplingParams,
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
):
  """(Rollouts of the M branch rows, own_MT): o~_m = o_p[:c] + a continuation sampled
  from the prefix, at most T tokens in all; the prefix keeps its parent's log-probs
  (sampled by the same policy), inactive slots are empty. Jittable."""
  p_M, c_M = cf_plan.parent_M, cf_plan.cut_M
  T = rollouts.tokens_NT.shape[1]
  parent_MT = rollouts.tokens_NT[p_M]
  prompts = prefix_prompts(
    rollouts.prompt_tokens_NP[p_M], rollouts.prompt_mask_NP[p_M], parent_MT, c_M, pad_id=cfg.pad_id
  )
  limit_M = jnp.where(cf_plan.active_M, T - c_M, 0)
  s = sample_limited(
    params, prompts, limit_M, key, hyper, model_fn=model_fn, init_cache=init_cache, cfg=cfg
  )
  t = jnp.arange(T)[None, :]
  src_MT = jnp.clip(t - c_M[:, None], 0, T - 1)
  head_MT = (t < c_M[:, None]) & cf_plan.active_M[:, None]
  own_MT = (t >= c_M[:, None]) & jnp.take_along_axis(s.mask_NT, src_MT, axis=1)

  def join(parent, cont, fill):
    cont = jnp.take_along_axis(cont, src_MT, axis=1)
    return jnp.where(head_MT, parent, jnp.where(own_MT, cont, fill))

  rows = _rows(
    rollouts,
    p_M,
    join(parent_MT, s.tokens_NT, cfg.pad_id),
    head_MT | own_MT,
    join(rollouts.logp_NT[p_M], s.logp_NT, 0.0),
    join(rollouts.policy_logp_NT[p_M], s.policy_logp_NT, 0.0),
    cfg.eos_ids,
  )
  return rows, own_MT


def perturbed(
  params,
  rollouts: sampling.Rollouts,
  cf_plan: Plan,
  prompts: sampling.Prompts,
  key,
  hyper: sampling.SamplingParams,
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
):
  """(Rollouts of the M rows sampled under the perturbed prompts q~ (`perturbed_prompts`),
  carrying the original prompt q; own_MT = their mask). Log-probs are π(·|q~)'s."""
  T = rollouts.tokens_NT.shape[1]
  limit_M = jnp.where(cf_plan.active_M, T, 0)
  s = sample_limited(
    params, prompts, limit_M, key, hyper, model_fn=model_fn, init_cache=init_cache, cfg=cfg
  )
  args = (s.tokens_NT, s.mask_NT, s.logp_NT, s.policy_logp_NT)
  return _rows(rollouts, cf_plan.parent_M, *args, cfg.eos_ids), s.mask_NT


def generate(
  params,
  rollouts: sampling.Rollouts,
  cf_plan: Plan,
  prompts: sampling.Prompts | None,
  key,
  hyper: sampling.SamplingParams,
  *,
  model_fn: Callable,
  init_cache: Callable,
  sampler_cfg: sampling.SamplerConfig,
  cfg: CounterfactualConfig,
):
  """(counterfactual Rollouts [M rows], own_MT): `branch`, or `perturbed` from `prompts`."""
  kw = dict(model_fn=model_fn, init_cache=init_cache, cfg=sampler_cfg)
  if cfg.perturbed:
    return perturbed(params, rollouts, cf_plan, prompts, key, hyper, **kw)
  return branch(params, rollouts, cf_plan, key, hyper, **kw)


def perturbed_prompts(
  task,
  tokenizer,
  examples,
  completions,
  cf_plan,
  *,
  kind: str,
  group_size: int,
  sampler_cfg,
  seed: int,
):
  """Host: the perturbed prompt q~ of each active slot (`Task.perturb`; "repair" seeded
  with the parent's decoded completion), left-padded into one bucket; inactive slots get
  the original prompt (nothing is decoded from them), and so does a repair slot whose
  parent decodes to nothing (an on-policy sample: its weight is 1)."""
  parent_M = np.asarray(cf_plan.parent_M)
  active_M = np.asarray(cf_plan.active_M)
  rng = np.random.default_rng(seed)
  lists = []
  for m, p in enumerate(parent_M):
    example = examples[int(p) // group_size]
    text = example.prompt
    if active_M[m] and (kind != "repair" or completions[int(p)].strip()):
      text = task.perturb(example, kind, attempt=completions[int(p)], rng=rng)
    lists.append(tokenizer.encode(text, add_bos=True))
  return sampling.prepare_prompts(lists, cfg=sampler_cfg)


# ----------------------------------------------------------------------------
# The merged batch.
# ----------------------------------------------------------------------------


def merge(
  rollouts: sampling.Rollouts,
  cf_rows: sampling.Rollouts,
  own_MT,
  cf_plan: Plan,
  *,
  group_size: int,
  kind: int,
):
  """(merged Rollouts of B·(G + C) rows, Provenance): group-major, group ids 0..B−1."""
  N, T = rollouts.tokens_NT.shape
  M = cf_rows.tokens_NT.shape[0]
  G = group_size
  B = N // G
  C = M // B
  order = jnp.asarray(merge_order(B, G, C))
  inverse = np.argsort(merge_order(B, G, C))

  def cat(a, b):
    return jnp.concatenate([a, b], axis=0)[order]

  steps = jnp.maximum(rollouts.num_steps, cf_rows.num_steps)
  merged = jax.tree.map(cat, rollouts.replace(num_steps=None), cf_rows.replace(num_steps=None))
  merged = merged.replace(num_steps=steps)
  kind_N = cat(jnp.zeros(N, jnp.int32), jnp.full(M, kind, jnp.int32))
  parent_N = cat(jnp.arange(N, dtype=jnp.int32), cf_plan.parent_M)
  parent_N = jnp.asarray(inverse, jnp.int32)[parent_N]  # Positions in the merged batch.
  prov = Provenance(
    kind_N=kind_N,
    parent_N=parent_N,
    own_NT=cat(rollouts.mask_NT, own_MT),
    active_N=cat(jnp.ones(N, bool), cf_plan.active_M),
  )
  return merged, prov


def sample_rows(tree, *, group_size: int, per_group: int):
  """The G samples' rows of a group-major merged batch (any pytree of [B·(G + C), ...]
  arrays): the update batch when counterfactuals only inform φ, so no forward or
  backward is spent on rows with no loss token."""
  n = jax.tree.leaves(tree)[0].shape[0]
  B = n // (group_size + per_group)
  rows = np.flatnonzero(merge_order(B, group_size, per_group) < B * group_size)
  return jax.tree.map(lambda x: x[rows], tree)
