"""Teacher-forced log-probs of given completions: the loss side of the policy.

    logp_NT, stats = logprobs.completion_logprobs(params, prompt_tokens_NP, prompt_mask_NP,
                                                  tokens_NT, mask_NT, model_fn=model_fn,
                                                  with_stats=True)

One full forward over [left-padded prompt ; right-padded completion], with position ids
that skip both paddings, so the log-probs match the cached decode that produced the
rollout (`sampling`). The LM head runs only at the T slots that predict completion
tokens (`model_fn(..., logits_slice=...)`), and `token_stats` turns their logits into
log π(y), the entropy and Σ π² in one pass over the vocabulary, with a hand-written
backward (a custom VJP) so no [N, T, V] log-softmax is kept for the gradient.

Shape letters: N rows, P prompt tokens, T completion tokens, S = P + T, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from grpo_jax.models import model as model_lib


@jax.custom_vjp
def token_stats(logits_NTV, tokens_NT):
  """(log π(y), H, Σ_v π_v²) per position from logits z, in one pass over the vocabulary.

    lse = log Σ_v e^{z_v},  log π(y) = z_y − lse,  H = lse − Σ_v π_v z_v,  π = e^{z − lse}.

  The backward is written out (a custom VJP), so no [N, T, V] log-softmax is stored:
    ∂/∂z_v = g_lp·(1[v = y] − π_v) − g_H·π_v·(log π_v + H) + 2·g_sq·π_v·(π_v − Σ π²).
  A statistic the loss does not use has a symbolic zero cotangent, and its term is left
  out; g_lp·1[v = y] is added at the N·T target ids alone (a scatter), not through an
  [N, T, V] one-hot. In profiles of the anchor's float32 update, the head's elementwise
  passes went from about 160 to 66 ms of a ~3.4 s micro-batch.
  """
  return _stats(logits_NTV, tokens_NT)[0]


def _stats(z_NTV, y_NT):
  z_NTV = z_NTV.astype(jnp.float32)
  m_NT1 = jax.lax.stop_gradient(jnp.max(z_NTV, axis=-1, keepdims=True))
  e_NTV = jnp.exp(z_NTV - m_NT1)
  se_NT1 = jnp.sum(e_NTV, axis=-1, keepdims=True)
  lse_NT1 = m_NT1 + jnp.log(se_NT1)
  p_NTV = e_NTV / se_NT1
  logp_NT = (jnp.take_along_axis(z_NTV, y_NT[..., None], axis=-1) - lse_NT1)[..., 0]
  ent_NT = lse_NT1[..., 0] - jnp.sum(p_NTV * z_NTV, axis=-1)
  sq_NT = jnp.sum(p_NTV * p_NTV, axis=-1)
  return (logp_NT, ent_NT, sq_NT), (z_NTV, y_NT, lse_NT1, ent_NT, sq_NT)


def _token_stats_fwd(z, y):  # CustomVJPPrimal arguments (symbolic_zeros=True).
  return _stats(z.value, y.value)


def _token_stats_bwd(res, g):
  z_NTV, y_NT, lse_NT1, ent_NT, sq_NT = res
  used = [not isinstance(x, jax.custom_derivatives.SymbolicZero) for x in g]
  if not any(used):
    return jnp.zeros_like(z_NTV), None
  g_lp, g_ent, g_sq = (x[..., None] if u else None for x, u in zip(g, used))
  logp_NTV = z_NTV - lse_NT1
  p_NTV = jnp.exp(logp_NTV)
  terms = []
  if g_lp is not None:
    terms.append(-g_lp * p_NTV)
  if g_ent is not None:
    terms.append(-g_ent * p_NTV * (logp_NTV + ent_NT[..., None]))
  if g_sq is not None:
    terms.append(2.0 * g_sq * p_NTV * (p_NTV - sq_NT[..., None]))
  dz_NTV = sum(terms[1:], terms[0])
  if g_lp is not None:  # + g_lp at v = y.
    N, T = y_NT.shape
    dz_NTV = dz_NTV.at[jnp.arange(N)[:, None], jnp.arange(T)[None, :], y_NT].add(g_lp[..., 0])
  return dz_NTV, None


token_stats.defvjp(_token_stats_fwd, _token_stats_bwd, symbolic_zeros=True)


def completion_logits(
  params,
  prompt_tokens_NP,
  prompt_mask_NP,
  tokens_NT,
  mask_NT,
  *,
  model_fn,
  hidden_only=False,
  dropout_key=None,
  router_stats=False,
  routes=None,
):
  """Logits [N, T, V] at the T slots that predict the completion tokens (the sequence
  [left-padded prompt ; right-padded completion], position ids skipping both paddings;
  `model_fn` must take `logits_slice`). hidden_only: the final-normed hidden states
  [N, T, D] there instead (the model's `hidden_only`), for an LM head run in chunks.
  dropout_key (a training forward, `model.apply`'s) is passed on only when given.
  router_stats: returns (logits, the forward's router statistics) (`model.apply`).
  routes: (prompt [N, P, L, k], completion [N, T, L, k]) experts to replay (a mixture of
  experts, `model.apply(routes=...)`), or None: the model routes itself."""
  P = prompt_tokens_NP.shape[1]
  # Rows over the batch axes and, under context parallelism, tokens over `sequence`, said
  # here: left to itself the partitioner may split the rows over both and then have to
  # replicate the row to re-split it (an "involuntary full rematerialization").
  row_names = ("activation_batch", "activation_length")
  tokens_NS = model_lib.constrain(jnp.concatenate([prompt_tokens_NP, tokens_NT], axis=1), row_names)
  mask_NS = model_lib.constrain(jnp.concatenate([prompt_mask_NP, mask_NT], axis=1), row_names)
  S = tokens_NS.shape[1]
  # Logits at slot s predict the token at slot s + 1: slots P-1 .. S-2.
  extra = {"hidden_only": True} if hidden_only else {}
  if dropout_key is not None:
    extra["dropout_key"] = dropout_key
  if router_stats:
    extra["router_stats"] = True
  if routes is not None:
    extra["routes"] = jnp.concatenate(routes, axis=1)
  logits_NTV, router = model_fn(
    params,
    tokens_NS,
    model_lib.positions_from_mask(mask_NS),
    None,
    logits_slice=(P - 1, S - 1),
    **extra,
  )
  return (logits_NTV, router) if router_stats else logits_NTV


def _stats_of_logits(logits_NTV, tokens_NT, *, with_rank):
  """(log π(y), H, Σ π², rank or None) of one block of logits."""
  logp_NT, ent_NT, sq_NT = token_stats(logits_NTV, tokens_NT)
  rank_NT = None
  if with_rank:
    z_NTV = jax.lax.stop_gradient(logits_NTV)
    z_y_NT1 = jnp.take_along_axis(z_NTV, tokens_NT[..., None], axis=-1)
    rank_NT = jnp.sum(z_NTV > z_y_NT1, axis=-1, dtype=jnp.int32)
  return logp_NT, ent_NT, sq_NT, rank_NT


def chunked_stats(
  params, hidden_NTD, tokens_NT, *, model_fn, chunk: int, with_rank=False, dropout_key=None
):
  """`_stats_of_logits` of the LM head's logits, `chunk` completion positions at a time:
  a `lax.map` over ⌈T / chunk⌉ blocks, each under `jax.checkpoint`, so the forward holds
  [N, chunk, V] logits at once and the backward recomputes each block's logits from its
  hidden states instead of keeping [N, T, V] (the head's matmul runs twice: the price of
  the memory). T is padded to a multiple of the chunk; the padding is cut off. With a
  dropout_key, block c's head forward gets fold_in(key, c) (blocks draw distinct masks).

  Under context parallelism (c = `model.length_shards()` devices split the T positions,
  c | T) the blocks are taken within each device's T/c positions: block j is every
  device's j-th chunk, [N, c, chunk] split over the devices, so no device waits on
  another's tokens and nothing is gathered."""
  N, T, D = hidden_NTD.shape
  c = model_lib.length_shards()
  c = c if c > 1 and T % c == 0 else 1
  local = T // c
  C = -(-local // chunk)
  pad = C * chunk - local
  split = lambda x: x.reshape(N, c, local, *x.shape[2:])  # noqa: E731
  cut = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 3))  # noqa: E731
  # [N, c, C·chunk, ...] -> [C, N, c·chunk, ...]: block j is every device's j-th chunk.
  blocks = (
    lambda x: jnp.moveaxis(x.reshape(N, c, C, chunk, *x.shape[3:]), 2, 0).reshape(  # noqa: E731
      C, N, c * chunk, *x.shape[3:]
    )
  )
  h_CNcD = blocks(cut(split(hidden_NTD)))
  y_CNc = blocks(cut(split(tokens_NT)))
  if c > 1:
    h_CNcD = nn.with_logical_constraint(h_CNcD, (None, *model_lib.ACT_BTD))
    y_CNc = nn.with_logical_constraint(y_CNc, (None, "activation_batch", "activation_length"))

  @jax.checkpoint
  def block(params, h_NcD, y_Nc, j):
    extra = {} if dropout_key is None else {"dropout_key": jax.random.fold_in(dropout_key, j)}
    logits_NcV, _ = model_fn(params, h_NcD, None, None, head_only=True, **extra)
    return _stats_of_logits(logits_NcV, y_Nc, with_rank=with_rank)

  out = jax.lax.map(lambda xs: block(params, *xs), (h_CNcD, y_CNc, jnp.arange(C)))

  def unchunk(x_CNc):  # The inverse of `blocks`, the padding cut off.
    x_NcCk = jnp.moveaxis(x_CNc.reshape(C, N, c, chunk), 0, 2)
    return x_NcCk.reshape(N, c, C * chunk)[:, :, :local].reshape(N, T)

  return tuple(None if x is None else unchunk(x) for x in out)


def completion_logprobs(
  params,
  prompt_tokens_NP,
  prompt_mask_NP,
  tokens_NT,
  mask_NT,
  *,
  model_fn,
  with_stats=False,
  with_rank=False,
  chunk: int = 0,
  dropout_key=None,
  router_stats=False,
  routes=None,
):
  """log π(o_t | q, o_<t) of each completion token in one full forward: [N, T] (0 off mask).

  With `with_stats`, also a dict of per-token statistics of each step's distribution π_t:
  "entropy" H_t = -Σ_v π log π and "sum_sq" Σ_v π_v² (else None); with `with_rank` too,
  "rank": #{v : z_v > z_{o_t}}, how many ids π_t ranks strictly above the token (0 = the
  argmax; one more pass over the logits, no gradient).

  The sequence is [left-padded prompt ; right-padded completion]; position ids skip
  both paddings, so the logits match the cached decode that produced the rollout.
  `model_fn` must take `logits_slice=(start, stop)` (grpo_jax models do): the LM head runs
  only at the T positions that predict completion tokens (`token_stats` does the rest).
  With `chunk` = c (0 < c < T) it runs there c positions at a time (`chunked_stats`): the
  [N, T, V] logits never exist at once, in the forward or the backward (rl.logit_chunk).
  `dropout_key` makes it a training forward (adapter dropout, `model.apply`).
  `router_stats` (a mixture-of-experts model, with_stats): stats also hold "moe_balance",
  the forward's load-balancing loss, and with `routes` the counts "routes_replayed" and
  "routes_flipped" (`model.apply(router_stats=True)`).
  `routes` (routing replay): (prompt, completion) experts the forward replays
  (`completion_logits`); None: it routes itself.
  """
  args = (params, prompt_tokens_NP, prompt_mask_NP, tokens_NT, mask_NT)
  routers = {"router_stats": True} if router_stats else {}
  if routes is not None:
    routers["routes"] = routes
  if 0 < chunk < tokens_NT.shape[1]:
    hidden_NTD = completion_logits(
      *args, model_fn=model_fn, hidden_only=True, dropout_key=dropout_key, **routers
    )
    hidden_NTD, router = hidden_NTD if router_stats else (hidden_NTD, None)
    out = chunked_stats(
      params,
      hidden_NTD,
      tokens_NT,
      model_fn=model_fn,
      chunk=chunk,
      with_rank=with_rank,
      # The head's masks from a key apart from the hidden forward's (which got dropout_key).
      dropout_key=None if dropout_key is None else jax.random.fold_in(dropout_key, 1 << 20),
    )
  else:
    logits_NTV = completion_logits(*args, model_fn=model_fn, dropout_key=dropout_key, **routers)
    logits_NTV, router = logits_NTV if router_stats else (logits_NTV, None)
    out = _stats_of_logits(logits_NTV, tokens_NT, with_rank=with_rank)
  logp_NT, ent_NT, sq_NT, rank_NT = out
  logp_NT = jnp.where(mask_NT, logp_NT, 0.0)
  if not with_stats:
    return logp_NT, None
  stats = {
    "entropy": jnp.where(mask_NT, ent_NT, 0.0),
    "sum_sq": jnp.where(mask_NT, sq_NT, 0.0),
  }
  if with_rank:
    stats["rank"] = jnp.where(mask_NT, rank_NT, 0)
  if router is not None:
    stats |= router
  return logp_NT, stats


def replayed(rows):
  """(prompt routes, completion routes) a forward of these rows (`sampling.Rollouts` or
  a batch with the same fields) replays (rl.routing_replay), or None: none recorded."""
  if getattr(rows, "routes_NTLK", None) is None:
    return None
  return rows.prompt_routes_NPLK, rows.routes_NTLK


def teacher_forced_logprobs(params, rollouts, *, model_fn: Callable):
  """`completion_logprobs` of a `sampling.Rollouts`: [N, T] log-probs, 0 off the completion mask."""
  return completion_logprobs(
    params,
    rollouts.prompt_tokens_NP,
    rollouts.prompt_mask_NP,
    rollouts.tokens_NT,
    rollouts.mask_NT,
    model_fn=model_fn,
  )[0]
