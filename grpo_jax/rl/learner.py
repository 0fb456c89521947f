"""The train step and the update phase of one rollout batch: plan, then a `lax.scan` of
train steps (the objective is described in `preparation`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from grpo_jax.infra import config_lib
from grpo_jax.models import logprobs, model
from grpo_jax.rl import (
  advantages,
  aggregation,
  declared,
  importance,
  losses,
  planners,
  spec,
)

_FLIPS = ("routes_replayed", "routes_flipped")  # Counts: additive over micro-batches.


def token_terms(
  params,
  mb: spec.RolloutBatch,
  hyper: spec.StepHyper,
  *,
  cfg: spec.RLConfig,
  model_fn,
  dropout_key=None,
):
  """Per-token objective terms of a (micro-)batch: (total ℓ_NT, dict of per-token arrays).
  dropout_key: the forward's adapter-dropout key (`model.apply`; None: deterministic).
  A forward that replays routes (rl.routing_replay) also counts the routes it replayed and
  how many of them its own router would not have taken (`moe.flip_counts`)."""
  routes = logprobs.replayed(mb)
  logp_NT, stats = logprobs.completion_logprobs(
    params,
    mb.prompt_tokens_NP,
    mb.prompt_mask_NP,
    mb.tokens_NT,
    mb.mask_NT,
    model_fn=model_fn,
    with_stats=True,
    chunk=cfg.logit_chunk,
    dropout_key=dropout_key,
    router_stats=cfg.moe_balance_coef > 0 or routes is not None,
    routes=routes,
  )
  ent_NT = stats["entropy"]
  m_NT = mb.loss_mask_NT
  # π_old: the update's own forward (one optimizer step from the sampled params: exact),
  # or the batch's recomputed log-probs.
  old_NT = jax.lax.stop_gradient(logp_NT) if cfg.old_logp_in_update else mb.old_logp_NT
  pg_NT, aux = losses.REGISTRY.make(cfg.policy_loss)(
    logp_NT, old_NT, mb.adv_NT, m_NT, declared.Values(hyper.loss)
  )
  total_NT = pg_NT - hyper.entropy_coef * ent_NT
  kl_NT = jnp.zeros_like(logp_NT)
  if cfg.use_ref:
    kl_NT = losses.KL_REGISTRY.make(cfg.kl_estimator)(logp_NT, mb.ref_logp_NT)
    total_NT = total_NT + hyper.kl_coef * kl_NT
  total_NT = jnp.where(m_NT, total_NT, 0.0)
  terms = dict(aux, pg_loss=pg_NT, kl=kl_NT, entropy=ent_NT, logp=logp_NT, loss=total_NT)
  terms["old_logp"] = old_NT
  # Scalars of the (micro-)batch, beside the per-token terms.
  terms |= {k: stats[k] for k in ("moe_balance", *_FLIPS) if k in stats}
  return total_NT, terms


def _sums(terms, mb: spec.RolloutBatch, w_NT):
  """Numerators and denominators of the step metrics: additive over micro-batches."""
  m = mb.loss_mask_NT.astype(jnp.float32)
  pos, neg = m * (mb.adv_NT > 0), m * (mb.adv_NT < 0)
  f = lambda x: x.astype(jnp.float32)
  return {
    "loss": jnp.sum(w_NT * terms["loss"]),
    "pg_loss": jnp.sum(w_NT * terms["pg_loss"]),
    "n_tok": jnp.sum(m),
    "n_pos": jnp.sum(pos),
    "n_neg": jnp.sum(neg),
    "clip_high": jnp.sum(pos * f(terms["clip_high"])),
    "clip_low": jnp.sum(neg * f(terms["clip_low"])),
    "dual_clip": jnp.sum(neg * f(terms["dual_clip"])),
    "ppo_kl": jnp.sum(m * (terms["old_logp"] - terms["logp"])),
    "kl_ref": jnp.sum(m * terms["kl"]),
    "entropy": jnp.sum(m * terms["entropy"]),
    "ratio": jnp.sum(m * terms["ratio"]),
  }


def _metrics_from_sums(s, *, cfg: spec.RLConfig):
  d = lambda a, b: s[a] / jnp.maximum(s[b], 1.0)
  out = {
    "loss": s["loss"],
    "pg_loss": s["pg_loss"],
    "pg_clipfrac": (s["clip_high"] + s["clip_low"]) / jnp.maximum(s["n_tok"], 1.0),
    "pg_clipfrac_high": d("clip_high", "n_pos"),
    "pg_clipfrac_low": d("clip_low", "n_neg"),
    "dual_clipfrac": d("dual_clip", "n_neg"),
    "ppo_kl": d("ppo_kl", "n_tok"),
    "entropy": d("entropy", "n_tok"),
    "ratio_mean": d("ratio", "n_tok"),
    "loss_tokens": s["n_tok"],
  }
  if "micro_batches" in s:  # Token-budget micro-batches: how many ran.
    out["micro_batches"] = s["micro_batches"]
  if cfg.use_ref:
    out[f"kl_ref/{cfg.kl_estimator}"] = d("kl_ref", "n_tok")
  if "moe_balance" in s:
    out["moe_balance"] = s["moe_balance"]
  if "routes_replayed" in s:
    out["route_flip_frac"] = d("routes_flipped", "routes_replayed")
  return out


def _split(x, k):
  """[b, ...] -> [k, b/k, ...], slice j holding rows j, j + k, j + 2k, ... (strided: each
  slice keeps the rows' split over the data-parallel devices)."""
  return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def _unsplit(x):
  """The inverse of `_split`: [k, b/k, ...] -> [b, ...] in the original row order."""
  return x.swapaxes(0, 1).reshape(-1, *x.shape[2:])


def _rows_constraint(tree):
  """Rows over the data-parallel axes (the rules' "activation_batch"); a no-op outside a
  mesh context."""
  return jax.tree.map(
    lambda x: nn.with_logical_constraint(x, ("activation_batch",) + (None,) * (x.ndim - 1)), tree
  )


_COMPLETION_FIELDS = (
  "tokens_NT",
  "mask_NT",
  "loss_mask_NT",
  "adv_NT",
  "old_logp_NT",
  "ref_logp_NT",
)


def length_buckets(cfg: spec.RLConfig, T: int) -> tuple[int, ...]:
  """The completion lengths micro-batches are cut to (rl.length_buckets = k > 1: T·j/k
  rounded up, j = 1..k); () when off."""
  k = cfg.length_buckets
  return tuple(sorted({-(-T * j // k) for j in range(1, k + 1)})) if k > 1 else ()


def _cut(micro, Tb: int):
  """A micro-batch (spec.RolloutBatch, w) with its completion columns cut to the first Tb."""
  mbk, wk = micro
  cut = {f: getattr(mbk, f)[:, :Tb] for f in _COMPLETION_FIELDS}
  for f in ("action_mask_NT", "routes_NTLK"):  # Episodes; routing replay.
    if getattr(mbk, f) is not None:
      cut[f] = getattr(mbk, f)[:, :Tb]
  return mbk.replace(**cut), wk[:, :Tb]


def token_budget_rows(
  cfg: spec.RLConfig, *, P: int, T: int, N: int, row_multiple: int = 1
) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """(bucket lengths T_j, rows r_j) of the token-budget micro-batches (rl.micro_batch_tokens
  = B > 0): a micro-batch whose longest row fits T_j completion columns holds

      r_j = min(⌊B / ((P + T_j)·q)⌋·q, N)

  rows of P prompt + T_j completion columns, q = row_multiple (the data-parallel size, so
  every device gets whole rows), N the mini-batch's rows. T_j: `length_buckets`, or T
  alone with rl.length_buckets = 1. Every micro-batch then holds at most B tokens, and its
  activations (linear in tokens) are at most the full-length bucket's."""
  buckets = length_buckets(cfg, T) or (T,)
  B, q = cfg.micro_batch_tokens, row_multiple
  rows = tuple(min(B // ((P + t) * q) * q, N) for t in buckets)
  if rows[-1] < 1:
    raise ValueError(
      f"rl.micro_batch_tokens={B} holds no full-length row: one takes P + T = {P} + {T} "
      f"tokens on each of {q} data-parallel device(s); raise it to at least {(P + T) * q}."
    )
  return buckets, rows


def accumulate_gradients(
  params,
  mb: spec.RolloutBatch,
  w_NT,
  hyper: spec.StepHyper,
  *,
  cfg: spec.RLConfig,
  model_fn,
  token_outputs,
  dropout_key=None,
  row_multiple: int = 1,
):
  """(Σ_k ∇ Σ_{(i,t)∈micro-batch k} w·ℓ, additive metric sums, per-token outputs) over the
  micro-batches of the mini-batch. The weights w are the whole mini-batch's, so the sum
  equals the unsplit gradient, for every aggregation mode.

  Micro-batches:
  - by rows (default): `cfg.micro_batches` slices in a `lax.scan`, strided (rows j, j + k,
    ...). With rl.length_buckets = k > 1 the rows are sorted by length and sliced
    contiguously, and each micro-batch runs at the smallest bucket length
    (`length_buckets`) that holds its longest row (a `lax.switch` over one compiled branch
    per bucket): the padding past it is never computed, and since w = 0 there the sum is
    unchanged.
  - by tokens (rl.micro_batch_tokens > 0, `_by_tokens`): rows longest first, each
    micro-batch the next r_j rows (`token_budget_rows`), in a `lax.while_loop` that ends
    at the last row with a token; row_multiple: the data-parallel size.

  With a dropout_key (adapter dropout), micro-batch k's forward gets fold_in(key, k): the
  masks, so the gradient, then depend on how the rows are split (the expectation does not)."""
  T = mb.tokens_NT.shape[1]
  trainable, join = model.split_trainable(params)  # Gradients of the trainable part only.

  def micro_loss(trainable, micro):
    mbk, wk, k, share = micro
    key = None if dropout_key is None else jax.random.fold_in(dropout_key, k)
    total_NT, terms = token_terms(
      join(trainable), mbk, hyper, cfg=cfg, model_fn=model_fn, dropout_key=key
    )
    loss = jnp.sum(wk * total_NT)
    sums = _sums(terms, mbk, wk)
    if cfg.moe_balance_coef > 0:  # Each micro-batch's balance loss, weighted by its share.
      loss = loss + cfg.moe_balance_coef * terms["moe_balance"] * share
      sums["moe_balance"] = terms["moe_balance"] * share
    sums |= {k: terms[k] for k in _FLIPS if k in terms}
    return loss, (terms, sums)

  grad_fn = jax.grad(micro_loss, has_aux=True)
  keep = ("loss", "ratio", "clip_high", "clip_low", "dual_clip") if token_outputs else ()
  if cfg.old_logp_in_update:  # For `old_logp_metrics`.
    keep = (*keep, "logp", "entropy")

  def at_length(Tb):
    """(grads, sums, kept per-token terms padded back to T) of one micro-batch at Tb."""

    def run(micro):
      micro = (*_rows_constraint(micro[:2]), *micro[2:])
      cut = (*_cut(micro[:2], Tb), *micro[2:]) if Tb < T else micro
      grads, (terms, sums) = grad_fn(trainable, cut)
      pad = lambda x: jnp.pad(x, ((0, 0), (0, T - Tb))) if Tb < T else x
      return grads, sums, {k: pad(terms[k]) for k in keep}

    return run

  if cfg.micro_batch_tokens:
    P, N = mb.prompt_tokens_NP.shape[1], mb.tokens_NT.shape[0]
    plan = token_budget_rows(cfg, P=P, T=T, N=N, row_multiple=row_multiple)
    return _by_tokens(mb, w_NT, at_length=at_length, plan=plan)
  return _by_rows(mb, w_NT, at_length=at_length, cfg=cfg)


def _by_rows(mb: spec.RolloutBatch, w_NT, *, at_length, cfg: spec.RLConfig):
  """`accumulate_gradients` over cfg.micro_batches equal slices of rows (a `lax.scan`)."""
  K, T = cfg.micro_batches, mb.tokens_NT.shape[1]
  buckets = length_buckets(cfg, T)

  def body(acc, micro):
    if buckets:
      longest = jnp.max(jnp.sum(micro[0].mask_NT, axis=1))
      branch = jnp.searchsorted(jnp.asarray(buckets), longest)
      grads, sums, tok = jax.lax.switch(branch, [at_length(b) for b in buckets], micro)
    else:
      grads, sums, tok = at_length(T)(micro)
    return jax.tree.map(jnp.add, acc, (grads, sums)), tok

  order = None
  if buckets:  # Sorted by length, sliced contiguously.
    order = jnp.argsort(jnp.sum(mb.mask_NT, axis=1))
    mb, w_NT = jax.tree.map(lambda x: x[order], mb), w_NT[order]
    split = lambda x: x.reshape(K, x.shape[0] // K, *x.shape[1:])
  else:
    split = functools.partial(_split, k=K)
  micro = (*jax.tree.map(split, (mb, w_NT)), jnp.arange(K), jnp.full((K,), 1.0 / K))
  # The accumulator starts at zeros shaped like one micro-batch's (grads, sums).
  grads_shape, sums_shape, _ = jax.eval_shape(at_length(T), jax.tree.map(lambda x: x[0], micro))
  zeros = jax.tree.map(jnp.zeros_like, (grads_shape, sums_shape))
  (grads, sums), tok = jax.lax.scan(body, zeros, micro)
  if order is None:
    return grads, sums, jax.tree.map(_unsplit, tok)
  inverse = jnp.argsort(order)
  return grads, sums, jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:])[inverse], tok)


def _by_tokens(mb: spec.RolloutBatch, w_NT, *, at_length, plan):
  """`accumulate_gradients` over token-budget micro-batches: the rows sorted longest first
  (stable) and padded with max r_j rows of w = 0; from start = 0, while row `start` has a
  token, the micro-batch is rows [start, start + r_j) at bucket T_j, the smallest that
  holds row `start` (the longest left), then start += r_j. Rows without a token (w = 0
  there) are never computed. sums["micro_batches"] counts the micro-batches run."""
  buckets, rows = plan
  N, T = mb.tokens_NT.shape
  lengths_N = jnp.sum(mb.mask_NT, axis=1, dtype=jnp.int32)
  order = jnp.argsort(-lengths_N, stable=True)
  pad = lambda x: jnp.pad(x[order], [(0, max(rows))] + [(0, 0)] * (x.ndim - 1))
  smb, sw, slen = jax.tree.map(pad, (mb, w_NT, lengths_N))
  live = jnp.sum(lengths_N > 0)

  def branch(j):
    def run(start, k, tok):
      take = lambda x: jax.lax.dynamic_slice_in_dim(x, start, rows[j], axis=0)
      share = (jnp.minimum(start + rows[j], live) - start) / jnp.maximum(live, 1)
      grads, sums, out = at_length(buckets[j])((*jax.tree.map(take, (smb, sw)), k, share))
      put = lambda buf, x: jax.lax.dynamic_update_slice_in_dim(buf, x.astype(buf.dtype), start, 0)
      return grads, sums, jax.tree.map(put, tok, out)

    return run

  first = (*jax.tree.map(lambda x: x[: rows[-1]], (smb, sw)), 0, 1.0)
  grads_shape, sums_shape, tok_shape = jax.eval_shape(at_length(T), first)
  acc = jax.tree.map(jnp.zeros_like, (grads_shape, sums_shape))
  tok = jax.tree.map(lambda x: jnp.zeros((N + max(rows), T), x.dtype), tok_shape)

  def body(carry):
    start, k, acc, tok = carry
    j = jnp.searchsorted(jnp.asarray(buckets), slen[start])
    grads, sums, tok = jax.lax.switch(j, [branch(i) for i in range(len(buckets))], start, k, tok)
    acc = jax.tree.map(jnp.add, acc, (grads, sums))
    return start + jnp.asarray(rows)[j], k + 1, acc, tok

  init = (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), acc, tok)
  _, k, (grads, sums), tok = jax.lax.while_loop(lambda c: c[0] < live, body, init)
  sums = {**sums, "micro_batches": k.astype(jnp.float32)}
  inverse = jnp.argsort(order)
  return grads, sums, jax.tree.map(lambda x: x[:N][inverse], tok)


def all_finite(tree) -> jax.Array:
  """True when every floating-point leaf of `tree` is finite (a jitted-friendly reduction)."""
  leaves = [
    jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)
  ]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def apply_if_finite(
  state: spec.TrainState, grads, finite, optimizer: optax.GradientTransformation, *, part="adapters"
):
  """The optimizer's update, applied only if `finite` and the updated params and optimizer
  state are all finite (a finite gradient can still overflow them, e.g. with a huge
  learning rate); otherwise params and optimizer state stay unchanged. state.step advances
  either way. Returns (state, applied)."""
  trainable, join = model.split_trainable(state.params, part=part)
  updates, opt_state = optimizer.update(grads, state.opt_state, trainable)
  new = optax.apply_updates(trainable, updates)
  applied = finite & all_finite((new, opt_state))
  # A select per leaf, which XLA fuses into that leaf's update, written in place (a
  # lax.cond over the two states materialises both: Qwen2.5-7B full fine-tuning on v6e-8
  # held 4.8 GiB a chip more, experiments/results/tpu_aot/update_regression.md). The
  # scalar goes through a lax.cond of its own, which XLA cannot fuse into its users:
  # otherwise it copies the ~100-leaf finiteness chain into every leaf's select (the tiny
  # update: 36,635 HLO lines against 13,732, its compile 1.2-1.6 times as long).
  applied = jax.lax.cond(applied, lambda: True, lambda: False)
  new, opt_state = jax.tree.map(
    lambda a, b: jnp.where(applied, a, b), (new, opt_state), (trainable, state.opt_state)
  )
  return spec.TrainState(step=state.step + 1, params=join(new), opt_state=opt_state), applied


def train_step(
  state: spec.TrainState,
  mb: spec.RolloutBatch,
  hyper: spec.StepHyper,
  *,
  cfg: spec.RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  token_outputs: bool = False,
  dropout_key: jax.Array | None = None,
  row_multiple: int = 1,
):
  """One optimizer step on one mini-batch: (state, metrics).

  w = aggregation(mini-batch); grads = `accumulate_gradients`; `apply_if_finite`. With
  `token_outputs`, metrics["tokens"] holds the per-token loss, weight, ratio and clip
  flags of the mini-batch ([N, T] each).

  Non-finite guard: a step whose loss, gradient norm or updated state is not finite leaves
  params and optimizer state unchanged (state.step still advances) and reports
  metrics["nonfinite"] = 1; the trainer counts these and stops after `max_nonfinite_steps`
  in a row.

  dropout_key: the step's adapter-dropout key (model.lora.dropout; `update` passes one per
  step); None: a deterministic forward. row_multiple: the data-parallel size, which
  token-budget micro-batches keep whole (`token_budget_rows`).
  """
  w_NT = aggregation.REGISTRY.make(cfg.aggregation)(
    mb.loss_mask_NT, mb.group_ids_N, mb.adv_NT, max_len=cfg.max_len or None
  )
  grads, sums, tok = accumulate_gradients(
    state.params,
    mb,
    w_NT,
    hyper,
    cfg=cfg,
    model_fn=model_fn,
    token_outputs=token_outputs,
    dropout_key=dropout_key,
    row_multiple=row_multiple,
  )
  metrics = _metrics_from_sums(sums, cfg=cfg)
  metrics["grad_norm"] = optax.tree.norm(grads)
  finite = jnp.isfinite(sums["loss"]) & jnp.isfinite(metrics["grad_norm"])
  state, applied = apply_if_finite(state, grads, finite, optimizer)
  metrics["nonfinite"] = 1.0 - applied.astype(jnp.float32)
  if cfg.old_logp_in_update:
    metrics |= old_logp_metrics(tok["logp"], tok["entropy"], mb, cfg=cfg)
  if token_outputs:
    metrics["tokens"] = {"weight": w_NT, **tok}
  return state, metrics


def old_logp_metrics(logp_NT, entropy_NT, mb: spec.RolloutBatch, *, cfg: spec.RLConfig) -> dict:
  """The metrics a forward of π_old of its own would log (`preparation.prepare_metrics`,
  `preparation.behaviour_correction`), from the update's forward when it is π_old
  (rl.old_logp_from="update", one optimizer step: its mini-batch is the batch's rows):
  rollout_entropy and, with a reference, rollout_kl_ref/<estimator> over the rows' own
  tokens, and the sampler–trainer mismatch ("offpolicy/...") over the loss tokens,
  mb.old_logp_NT then holding the sampler's μ."""
  acted_NT = mb.mask_NT if mb.action_mask_NT is None else mb.action_mask_NT & mb.mask_NT
  n_acted = jnp.maximum(jnp.sum(acted_NT.astype(jnp.float32)), 1.0)
  old_NT = jax.lax.stop_gradient(logp_NT)
  out = {"rollout_entropy": jnp.sum(jnp.where(acted_NT, entropy_NT, 0.0)) / n_acted}
  if cfg.use_ref:
    kl_NT = losses.KL_REGISTRY.make(cfg.kl_estimator)(old_NT, mb.ref_logp_NT)
    out[f"rollout_kl_ref/{cfg.kl_estimator}"] = jnp.sum(jnp.where(acted_NT, kl_NT, 0.0)) / n_acted
  ones_NT = jnp.ones(old_NT.shape, jnp.float32)  # rl.is_correction "none" (the only one).
  keep_NT = mb.loss_mask_NT
  return out | importance.mismatch_metrics(old_NT, mb.old_logp_NT, keep_NT, ones_NT, keep_NT)


def make_train_step(
  cfg: spec.RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  *,
  token_outputs: bool = False,
  donate: bool = True,
  row_multiple: int = 1,
):
  """jit(train_step) with everything static bound: fn(state, minibatch, hyper)."""
  fn = functools.partial(
    train_step,
    cfg=cfg,
    model_fn=model_fn,
    optimizer=optimizer,
    token_outputs=token_outputs,
    row_multiple=row_multiple,
  )
  return jax.jit(fn, donate_argnums=(0,) if donate else ())


def gather(batch: spec.RolloutBatch, idx_b) -> spec.RolloutBatch:
  """The rows idx_b of a rollout batch (jittable; on device)."""
  return jax.tree.map(lambda x: jnp.take(x, idx_b, axis=0), batch)


# ----------------------------------------------------------------------------
# The update phase of one rollout batch: plan, then a scan of train steps.
# ----------------------------------------------------------------------------


def make_plan_fn(cfg: spec.RLConfig, *, batch_size: int, group_size: int):
  """The configured planner, validated for this batch shape: fn(key, group_ids_N, adv_N,
  lengths_N) -> idx [ppo_epochs, num_minibatches, batch_size // num_minibatches]."""
  return planners.make_planner(
    cfg.planner,
    num_minibatches=cfg.num_minibatches,
    ppo_epochs=cfg.ppo_epochs,
    batch_size=batch_size,
    group_size=group_size,
    **config_lib.to_dict(cfg.planner_options),
  )


def update(
  state: spec.TrainState,
  batch: spec.RolloutBatch,
  key: jax.Array,
  hyper: spec.StepHyper,
  *,
  cfg: spec.RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  plan_fn: Callable,
  row_multiple: int = 1,
):
  """ppo_epochs × num_minibatches train steps over one rollout batch, as one `lax.scan`.

  plan_fn(key, group_ids_N, adv_N, lengths_N) -> idx [E, M, b] (`make_plan_fn`); step s =
  e·M + m trains on rows idx[e, m]. Pure and jittable. Returns (state, idx_EMb, metrics)
  where every metric is stacked over the E·M steps ([E·M] arrays, step order). Step s's
  adapter-dropout key is split from fold_in(key, 1) (the plan's key is `key` itself).
  row_multiple: the data-parallel size (`token_budget_rows`).
  """
  acted_NT = batch.mask_NT if batch.action_mask_NT is None else batch.action_mask_NT
  adv_N = advantages.sequence_advantage(batch.adv_NT, acted_NT)
  lengths_N = jnp.sum(batch.mask_NT, axis=1, dtype=jnp.int32)  # Compute: the whole context.
  idx_EMb = plan_fn(key, batch.group_ids_N, adv_N, lengths_N)
  E, M, b = idx_EMb.shape

  def step(state, xs):
    idx_b, dropout_key = xs
    mb = _rows_constraint(gather(batch, idx_b))
    return train_step(
      state,
      mb,
      hyper,
      cfg=cfg,
      model_fn=model_fn,
      optimizer=optimizer,
      dropout_key=dropout_key,
      row_multiple=row_multiple,
    )

  keys_S = jax.random.split(jax.random.fold_in(key, 1), E * M)
  state, metrics_S = jax.lax.scan(step, state, (idx_EMb.reshape(E * M, b), keys_S))
  return state, idx_EMb, metrics_S


def make_update(
  cfg: spec.RLConfig,
  model_fn: Callable,
  optimizer: optax.GradientTransformation,
  *,
  batch_size: int,
  group_size: int,
  donate: bool = True,
):
  """jit(update) with the planner for this batch shape bound: fn(state, batch, key, hyper)
  -> (state, idx_EMb, stacked metrics)."""
  fn = functools.partial(
    update,
    cfg=cfg,
    model_fn=model_fn,
    optimizer=optimizer,
    plan_fn=make_plan_fn(cfg, batch_size=batch_size, group_size=group_size),
  )
  return jax.jit(fn, donate_argnums=(0,) if donate else ())
