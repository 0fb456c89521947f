"""Jitted KV-cache group sampler: prompts -> G completions per prompt with log-probs.

Decoding only; the teacher-forced log-probs of given completions (the loss side) are in
`logprobs`.

  sample_fn = sampling.make_sample_fn(model_fn=..., init_cache=..., cfg=SamplerConfig(...))
  rollouts = sample_fn(params, prompts, key, hyper)

The model is a function ``model_fn(params, tokens_BT, positions_BT, cache) -> (logits_BTV,
cache)`` (``model.make_model_fn``, or a fake in tests) and ``init_cache(batch, length)``
returns a cache with a ``repeat(n)`` method (and, optionally, ``share(n, length)`` and
``grow(length)``). Position ids skip padding; padding is -1.

Algorithm (static shapes, one compile per prompt-length bucket):
  1. ``prefill``: the left-padded prompts minus their last token go into the cache, once
     per prompt (B rows, not B*G). Then ``cache.share(G, length)`` makes it a prefix the
     G rows of the group attend to (``SamplerConfig.shared_prefix``), each row with its
     own slots after it; or ``cache.repeat(G)`` copies it to each row.
  2. ``decode``: a ``lax.while_loop`` feeds one token per row per step (the last prompt token first),
     samples the next token and records its log-probs. It stops once every row has
     emitted an EOS id or after ``max_new_tokens`` steps. In segments
     (``SamplerConfig.decode_segments``): one loop per segment of steps, each over a
     cache just long enough for it, grown between segments (``cache.grow``), so early
     steps do not read the empty slots of late ones.

Shape letters: B prompts, G group size, N = B*G rollout rows, P prompt tokens (bucket),
T = max_new_tokens, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import kernels
from grpo_jax.models import model as model_lib

DEFAULT_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TRUNCATE_MODES = ("error", "left")
KV_LAYOUTS = ("dense", "paged")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerConfig:
  """Static sampler settings (changing one recompiles)."""

  max_new_tokens: int
  eos_ids: tuple[int, ...]
  pad_id: int
  group_size: int = 1
  max_prompt_len: int = 512
  prompt_buckets: tuple[int, ...] = DEFAULT_BUCKETS
  truncate_prompts: str = "error"  # "error" | "left" (keep the last max_prompt_len tokens)
  # The training sampler's decode slots, refilled as rows end (`refill`); 0: the static
  # sampler (every row decoded until the longest ends).
  refill_slots: int = 0
  # The samplers' compute dtype ("": the model's, config.model.dtype), for training rows
  # and evaluation. A bfloat16 sampler with a float32 trainer is a sampler/trainer
  # mismatch (rl.is_correction).
  dtype: str = ""
  # The static sampler's decode loop in this many segments of steps, each attending over
  # a cache as long as its last step needs (`decode`); 0: automatic (`segment_count`).
  decode_segments: int = 0
  # The static sampler's group rows share their prompt's cache slots (`KVCache.share`):
  # each decode step reads a prompt's keys and values once per group, not once per row.
  # False: the prompt's cache is copied to each of its G rows (`KVCache.repeat`).
  shared_prefix: bool = True
  # Routing replay (a mixture of experts, rl.routing_replay, set by the build): the
  # static sampler records the experts every prompt and completion token took, per layer
  # (`Rollouts.routes_NTLK`), for the trainer's forwards to replay.
  record_routes: bool = False
  # Chunked prefill: the prompt goes into the cache this many tokens a call, each call
  # attending to the cache written before it (`prefill_cache`), so a prompt of P tokens
  # needs [chunk, P] attention scores instead of the causal [P, P] ones; 0: one call.
  # Episodes on pages append an observation the same way (`paged.append_block`).
  prefill_chunk: int = 0
  # Every sampler's KV cache: "dense" ([rows, ..., P − 1 + T] per layer) or "paged"
  # (`paged`: pages of page_size slots from one pool, taken as rows grow and returned when
  # they end). kv_pool_fraction: the pool's completion pages as a fraction of the worst
  # case, every row at max_new_tokens (1: no row can run short of pages).
  kv_layout: str = "dense"
  page_size: int = 64
  kv_pool_fraction: float = 1.0

  def __post_init__(self):
    if self.dtype not in ("", "float32", "bfloat16"):
      raise ValueError(
        f"SamplerConfig.dtype={self.dtype!r}; allowed: '' (the model's), 'float32', 'bfloat16'."
      )
    if self.max_new_tokens < 1:
      raise ValueError(f"SamplerConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}.")
    if self.group_size < 1:
      raise ValueError(f"SamplerConfig.group_size must be >= 1, got {self.group_size}.")
    if not self.eos_ids:
      raise ValueError("SamplerConfig.eos_ids must name at least one EOS token id.")
    if self.truncate_prompts not in TRUNCATE_MODES:
      raise ValueError(
        f"SamplerConfig.truncate_prompts={self.truncate_prompts!r}; allowed: {TRUNCATE_MODES}."
      )
    if self.refill_slots < 0:
      raise ValueError(
        f"SamplerConfig.refill_slots must be >= 0 (0: off), got {self.refill_slots}."
      )
    if self.decode_segments < 0:
      raise ValueError(
        f"SamplerConfig.decode_segments must be >= 0 (0: automatic), got {self.decode_segments}."
      )
    if self.prefill_chunk < 0:
      raise ValueError(
        f"SamplerConfig.prefill_chunk must be >= 0 (0: the whole prompt in one call), "
        f"got {self.prefill_chunk}."
      )
    if self.kv_layout not in KV_LAYOUTS:
      raise ValueError(f"SamplerConfig.kv_layout={self.kv_layout!r}; allowed: {KV_LAYOUTS}.")
    if self.page_size < 1 or not 0 < self.kv_pool_fraction <= 1:
      raise ValueError(
        f"SamplerConfig.page_size must be >= 1 and kv_pool_fraction in (0, 1] (1: every "
        f"row can reach max_new_tokens), got page_size={self.page_size}, "
        f"kv_pool_fraction={self.kv_pool_fraction}."
      )
    if self.max_prompt_len < 1:
      raise ValueError(f"SamplerConfig.max_prompt_len must be >= 1, got {self.max_prompt_len}.")
    if (
      list(self.prompt_buckets) != sorted(set(self.prompt_buckets)) or min(self.prompt_buckets) < 2
    ):
      raise ValueError(
        f"SamplerConfig.prompt_buckets must be increasing ints >= 2, got {self.prompt_buckets}."
      )


@flax.struct.dataclass
class SamplingParams:
  """Sampling hyperparameters as arrays: changing them never recompiles.

  temperature > 0 scales logits; top_k = 0 and top_p = 1 switch truncation off;
  greedy picks argmax of the raw logits (and ignores the rest).
  """

  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array
  greedy: jax.Array


def sampling_params(
  *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, greedy: bool = False
):
  if not 0 < temperature < float("inf"):
    raise ValueError(
      f"temperature must be finite and > 0 (use greedy=True for argmax), got {temperature}."
    )
  if top_k < 0:
    raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}.")
  if not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}.")
  return SamplingParams(
    temperature=jnp.asarray(temperature, jnp.float32),
    top_k=jnp.asarray(top_k, jnp.int32),
    top_p=jnp.asarray(top_p, jnp.float32),
    greedy=jnp.asarray(greedy, jnp.bool_),
  )


@flax.struct.dataclass
class Prompts:
  """Left-padded prompt batch: real tokens are right-aligned."""

  tokens_BP: jax.Array  # int32
  mask_BP: jax.Array  # bool


@flax.struct.dataclass
class Rollouts:
  """G completions per prompt. Row n belongs to prompt group_ids_N[n] = n // G.

  logp_NT is log-prob under the sampling distribution (temperature / top-k / top-p
  applied; 0 for greedy, a point mass); policy_logp_NT is log-prob under the raw
  policy (temperature 1, no truncation): the trainer's old log-probs. Both are 0
  where mask_NT is False. The completion includes the EOS token.
  """

  prompt_tokens_NP: jax.Array
  prompt_mask_NP: jax.Array
  tokens_NT: jax.Array
  mask_NT: jax.Array
  logp_NT: jax.Array
  policy_logp_NT: jax.Array
  eos_N: jax.Array  # emitted an EOS id
  truncated_N: jax.Array  # reached max_new_tokens without EOS
  length_N: jax.Array
  group_ids_N: jax.Array
  num_steps: jax.Array  # decode steps actually run (early stop shows here)
  # Multi-turn episodes (`episodes`): the model's own tokens among mask_NT, which also
  # holds the environment's observations (in the context, never trained). None: every
  # token of mask_NT is the model's (single-turn sampling).
  action_mask_NT: jax.Array | None = None
  # Routing replay (SamplerConfig.record_routes): the experts each prompt and completion
  # token took in the sampler's forward, [rows, tokens, L layers, k] (`moe.route_dtype`;
  # -1: none recorded, the trainer's router decides: padding, and the last completion
  # token, which is never fed). None: not recorded.
  prompt_routes_NPLK: jax.Array | None = None
  routes_NTLK: jax.Array | None = None
  # A paged cache (`paged`, sampler.kv_layout="paged"): the rows its pool had no page for,
  # ended there, truncated. None: a dense cache (no row is ever short of one).
  starved_N: jax.Array | None = None


# ----------------------------------------------------------------------------
# Host side: bucketing.
# ----------------------------------------------------------------------------


def bucket_length(n: int, buckets: Sequence[int]) -> int:
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"Prompt length {n} exceeds the largest bucket {buckets[-1]}; add a bucket.")


def prepare_prompts(
  token_lists: Sequence[Sequence[int]], *, cfg: SamplerConfig, min_len: int = 0
) -> Prompts:
  """Left-pads token lists to one length bucket (one compile per bucket): the smallest
  bucket that holds the longest prompt and `min_len` tokens (several hosts padding their
  own rows pass the longest prompt of all of them, so every host picks the same bucket)."""
  if not token_lists:
    raise ValueError("prepare_prompts needs at least one prompt.")
  rows = []
  for i, toks in enumerate(token_lists):
    toks = list(toks)
    if not toks:
      raise ValueError(f"Prompt {i} is empty; every prompt needs at least one token (e.g. BOS).")
    if len(toks) > cfg.max_prompt_len:
      if cfg.truncate_prompts == "error":
        raise ValueError(
          f"Prompt {i} has {len(toks)} tokens > max_prompt_len={cfg.max_prompt_len}. "
          "Shorten it, raise max_prompt_len, or set truncate_prompts='left' to keep the last tokens."
        )
      toks = toks[-cfg.max_prompt_len :]
    rows.append(toks)
  longest = max(max(len(r) for r in rows), min(min_len, cfg.max_prompt_len))
  P = bucket_length(longest, cfg.prompt_buckets)
  tokens = np.full((len(rows), P), cfg.pad_id, np.int32)
  mask = np.zeros((len(rows), P), bool)
  for i, r in enumerate(rows):
    tokens[i, P - len(r) :] = r
    mask[i, P - len(r) :] = True
  return Prompts(tokens_BP=tokens, mask_BP=mask)


# ----------------------------------------------------------------------------
# Jitted core.
# ----------------------------------------------------------------------------


def _order_keys(x):
  """float32 -> uint32 with the same order (for exact bisection on values)."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  negative = (bits >> 31) == 1
  return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _largest_key_where(keys_NV, predicate):
  """Per row, the largest key t with predicate(keys >= t) true; predicate must be monotone.

  32 bisection steps over the uint32 key range give the exact answer (no sort:
  sorting a [N, V] array is very slow on XLA:CPU).
  """
  N = keys_NV.shape[0]

  def step(_, lo_hi):
    lo_N1, hi_N1 = lo_hi
    mid_N1 = lo_N1 + ((hi_N1 - lo_N1) >> 1) + ((hi_N1 - lo_N1) & 1)
    ok_N1 = predicate(keys_NV >= mid_N1)
    return jnp.where(ok_N1, mid_N1, lo_N1), jnp.where(ok_N1, hi_N1, mid_N1 - 1)

  lo = jnp.zeros((N, 1), jnp.uint32)
  hi = jnp.full((N, 1), 0xFFFFFFFF, jnp.uint32)
  return jax.lax.fori_loop(0, 32, step, (lo, hi))[0]


def filter_logits(logits_NV, hyper: SamplingParams):
  """logits / T, then top-k, then top-p (nucleus) on the top-k renormalised distribution.

  Removed tokens get -inf. top-k keeps tokens whose logit is >= the k-th largest;
  top-p keeps the smallest set of most likely tokens whose mass reaches top_p
  (always at least the argmax). Ties with the last kept logit are kept. Both are
  exact thresholds found by bisection, and run only when active.
  """
  scaled_NV = logits_NV.astype(jnp.float32) / hyper.temperature

  def truncate(s_NV):
    keys_NV = _order_keys(s_NV)
    k = jnp.where(hyper.top_k > 0, jnp.minimum(hyper.top_k, s_NV.shape[-1]), s_NV.shape[-1])
    k_key_N1 = _largest_key_where(keys_NV, lambda kept: jnp.sum(kept, axis=-1, keepdims=True) >= k)
    probs_NV = jnp.where(
      keys_NV >= k_key_N1, jnp.exp(s_NV - jnp.max(s_NV, axis=-1, keepdims=True)), 0.0
    )
    target_N1 = hyper.top_p * jnp.sum(probs_NV, axis=-1, keepdims=True)
    p_key_N1 = _largest_key_where(
      keys_NV,
      lambda kept: jnp.sum(jnp.where(kept, probs_NV, 0.0), axis=-1, keepdims=True) >= target_N1,
    )
    return jnp.where(keys_NV >= jnp.maximum(k_key_N1, p_key_N1), s_NV, -jnp.inf)

  active = (hyper.top_k > 0) | (hyper.top_p < 1.0)
  return jax.lax.cond(active, truncate, lambda s: s, scaled_NV)


def sample_categorical(key, logits_NV, *, block: int = 128):
  """One draw per row from softmax(logits), by two-level inverse-CDF sampling.

  Picks a block of `block` tokens with probability proportional to its mass, then a
  token within it. Exact, and needs 2 uniforms per row instead of V Gumbel draws
  (which dominate decode time on CPU for a 32K vocabulary).
  """
  return _sample_with_lse(key, logits_NV, block=block)[0]


def _uniforms(key, N: int, *, row_keys: bool):
  """[N, 2] uniforms in (0, 1] (a zero-mass prefix is never picked): from one key, or
  with `row_keys` from key[n] for row n (a row's draw then depends on its own key only,
  not on the batch's width or its place in it)."""
  if row_keys:
    return 1.0 - jax.vmap(lambda k: jax.random.uniform(k, (2,)))(key)
  return 1.0 - jax.random.uniform(key, (N, 2))


def keys_by_row(key, n_N, t_N):
  """[N] keys fold_in(fold_in(key, n), t): a draw keyed by its row's index n and column t
  (counter-based: the same for a row wherever and whenever it is decoded; the episode
  refill loop's, `envs.episode_refill`)."""
  return jax.vmap(lambda n, t: jax.random.fold_in(jax.random.fold_in(key, n), t))(n_N, t_N)


def _sample_with_lse(key, logits_NV, *, block: int = 128, row_keys: bool = False):
  """(token_N, logsumexp(logits)_N): the draw of `sample_categorical`, plus the normaliser
  computed from the same exp pass (so log pi(token) costs no second pass over V)."""
  N, V = logits_NV.shape
  nb = -(-V // block)
  max_N1 = jnp.max(logits_NV, axis=-1, keepdims=True)
  p_NV = jnp.exp(logits_NV - max_N1)
  p_NCb = jnp.pad(p_NV, ((0, 0), (0, nb * block - V))).reshape(N, nb, block)
  u_N2 = _uniforms(key, N, row_keys=row_keys)
  cum_NC = jnp.cumsum(jnp.sum(p_NCb, axis=-1), axis=-1)
  c_N = jnp.minimum(jnp.sum(cum_NC < u_N2[:, :1] * cum_NC[:, -1:], axis=-1), nb - 1)
  cum_Nb = jnp.cumsum(jnp.take_along_axis(p_NCb, c_N[:, None, None], axis=1)[:, 0], axis=-1)
  t_N = jnp.minimum(jnp.sum(cum_Nb < u_N2[:, 1:] * cum_Nb[:, -1:], axis=-1), block - 1)
  lse_N = max_N1[:, 0] + jnp.log(cum_NC[:, -1])
  return (c_N * block + t_N).astype(jnp.int32), lse_N


def choose_tokens(logits_NV, key, hyper: SamplingParams, *, row_keys: bool = False):
  """Returns (token_N, sampling logp_N, policy logp_N).

  sampling logp = log softmax(filter(logits / T))[token] (0 when greedy); policy logp =
  log softmax(logits)[token]. When T = 1 and no filter is active the two normalisers are
  the same and are computed once, in a branch that neither scales nor filters. With
  `row_keys`, key is [N] keys, one a row (`keys_by_row`); else one key for the batch.
  """
  logits_NV = logits_NV.astype(jnp.float32)
  identity = (hyper.temperature == 1.0) & (hyper.top_k <= 0) & (hyper.top_p >= 1.0)
  at = lambda x_NV, tok_N: jnp.take_along_axis(x_NV, tok_N[:, None], axis=-1)[:, 0]

  def greedy(_):
    tok_N = jnp.argmax(logits_NV, axis=-1).astype(jnp.int32)
    policy_N = at(logits_NV, tok_N) - jax.nn.logsumexp(logits_NV, axis=-1)
    return tok_N, jnp.zeros(tok_N.shape, jnp.float32), policy_N

  def plain(key):  # T = 1, no truncation: one exp pass over the raw logits, no copies.
    tok_N, lse_N = _sample_with_lse(key, logits_NV, row_keys=row_keys)
    logp_N = at(logits_NV, tok_N) - lse_N
    return tok_N, logp_N, logp_N

  def filtered(key):
    filtered_NV = filter_logits(logits_NV, hyper)
    tok_N, lse_N = _sample_with_lse(key, filtered_NV, row_keys=row_keys)
    policy_N = at(logits_NV, tok_N) - jax.nn.logsumexp(logits_NV, axis=-1)
    return tok_N, at(filtered_NV, tok_N) - lse_N, policy_N

  branch = jnp.where(hyper.greedy, 0, jnp.where(identity, 1, 2))
  return jax.lax.switch(branch, (greedy, plain, filtered), key)


@flax.struct.dataclass
class DecodeState:
  """The decode loop's carry: one row per rollout (N = B·G), T completion slots.

  `tok_N` / `pos_N` are the next token to feed and its position id (after `prefill`: the
  last prompt token); the [N, T] buffers fill one column per step.
  """

  step: jax.Array
  cache: Any
  key: jax.Array
  tok_N: jax.Array
  pos_N: jax.Array
  done_N: jax.Array
  tokens_NT: jax.Array
  mask_NT: jax.Array
  logp_NT: jax.Array
  policy_logp_NT: jax.Array
  # Routing replay (SamplerConfig.record_routes): the prompts' recorded experts (all but
  # the last prompt token, [B, P - 1, L, k]) and those of the token fed at each step
  # (column t: the last prompt token at t = 0, completion token t - 1 after), or None.
  prompt_routes_BPLK: jax.Array | None = None
  routes_NTLK: jax.Array | None = None
  # The cache's length in each decode segment (static; the last is P - 1 + T, the cache's
  # full length); one entry: a single loop over the full cache.
  segment_slots: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())


# The automatic decode segmentation (`segment_count`) on XLA:CPU: at most this many
# segments, each of at least this many steps.
_AUTO_SEGMENTS = 4
_AUTO_SEGMENT_MIN_STEPS = 32


def segment_count(cfg: SamplerConfig, *, platform: str | None = None) -> int:
  """How many decode segments the static sampler runs: cfg.decode_segments (at most one
  per step), or automatically, on XLA:CPU, up to 4 segments of >= 32 steps each, and
  one elsewhere.

  A segment attends over the slots its last step needs, so the mean step reads fewer
  keys and values (with 4 segments of 32 steps after a 63-token prompt: 143 slots on
  average instead of 191); each further segment costs a copy of the cache as it grows
  and one more compiled loop body. Accelerators keep one segment until it is measured
  there (the grown cache briefly coexists with the old one, which costs memory at real
  model sizes). platform: the program's (None: `kernels.target_platform`)."""
  T = cfg.max_new_tokens
  if cfg.decode_segments:
    return min(cfg.decode_segments, T)
  if (platform or kernels.target_platform()) != "cpu":
    return 1
  return max(1, min(_AUTO_SEGMENTS, T // _AUTO_SEGMENT_MIN_STEPS))


def segment_slots(prefix_slots: int, cfg: SamplerConfig) -> tuple[int, ...]:
  """The cache length of each decode segment: prefix_slots + e_j, where segment j ends
  after step e_j = ceil(j·T / n), j = 1..n (`segment_count`)."""
  T, n = cfg.max_new_tokens, segment_count(cfg)
  return tuple(prefix_slots + -(-j * T // n) for j in range(1, n + 1))


def prefill_chunks(length: int, chunk: int) -> tuple[tuple[int, int], ...]:
  """The calls [a, b) that write `length` prompt tokens into a cache, `chunk` tokens a
  call (the last call takes the rest; chunk 0, or chunk >= length: one call)."""
  if chunk <= 0 or chunk >= length:
    return ((0, length),)
  return tuple((a, min(a + chunk, length)) for a in range(0, length, chunk))


def prefill_cache(
  params, tokens_BT, positions_BT, *, init_cache: Callable, length: int, model_fn: Callable,
  chunk: int = 0, record_routes: bool = False,
):  # fmt: skip
  """A cache of `length` slots holding tokens_BT's keys and values in its first T slots,
  written `chunk` tokens a call (`prefill_chunks`; 0: one call).

  The first call attends within itself (causal blocks, or the TPU's flash kernel) and
  writes its keys and values. Each later call [a, b) writes its own, then attends over
  the cache's first b slots (`KVCache.visible`): [B, K, C·R, b] scores, a peak of [C, T]
  for the last call where one call's largest causal block is [T/4, T]
  (`attention.causal_blocks`). The same softmax as one call, up to the order of the
  float32 sums. Returns the cache, and with record_routes the experts every token took,
  [B, T, L, k]."""
  B, T = tokens_BT.shape
  calls = prefill_chunks(T, chunk)
  kw = dict(record_routes=True) if record_routes else {}
  cache, routes = init_cache(B, length), []
  if len(calls) > 1 and not hasattr(cache, "visible"):
    raise ValueError(
      f"SamplerConfig.prefill_chunk={chunk} needs a cache with a `visible` field (a "
      f"call's slots, `KVCache`); {type(cache).__name__} has none (set prefill_chunk=0)."
    )
  for a, b in calls:
    if len(calls) > 1:
      cache = cache.replace(visible=b)
    out = model_fn(params, tokens_BT[:, a:b], positions_BT[:, a:b], cache, **kw)
    cache = out[1]
    routes.extend(out[2:])
  if len(calls) > 1:
    cache = cache.replace(visible=0)
  if not record_routes:
    return cache
  return cache, routes[0] if len(routes) == 1 else jnp.concatenate(routes, axis=1)


def prefill(
  params,
  prompts: Prompts,
  key: jax.Array,
  *,
  model_fn: Callable,
  init_cache: Callable[[int, int], Any],
  cfg: SamplerConfig,
) -> DecodeState:
  """Writes each prompt minus its last token into the cache, once per prompt (B rows, not
  B·G), then shares the cache with the G rows of its group (`KVCache.share`, with
  cfg.shared_prefix and G > 1) or copies it to them (`repeat`): the decode loop's start."""
  tokens_BP = jnp.asarray(prompts.tokens_BP, jnp.int32)
  mask_BP = jnp.asarray(prompts.mask_BP, jnp.bool_)
  B, P = tokens_BP.shape
  G, T = cfg.group_size, cfg.max_new_tokens
  N = B * G
  if P < 2:
    raise ValueError(
      f"Prompt batches need >= 2 slots (left-pad a 1-token prompt), got shape {(B, P)}."
    )
  positions_BP = model_lib.positions_from_mask(mask_BP)
  slots = segment_slots(P - 1, cfg)
  probe = jax.eval_shape(lambda: init_cache(B, P - 1))  # Its methods, allocating nothing.
  share = cfg.shared_prefix and G > 1 and hasattr(probe, "share")
  if len(slots) > 1 and not hasattr(probe, "grow"):
    if cfg.decode_segments > 1:
      raise ValueError(
        f"SamplerConfig.decode_segments={cfg.decode_segments} needs a cache with a "
        f"grow(length) method; {type(probe).__name__} has none (set decode_segments=1)."
      )
    slots = (P - 1 + T,)
  routes = {}
  write_prompt = functools.partial(
    prefill_cache, params, tokens_BP[:, :-1], positions_BP[:, :-1], init_cache=init_cache,
    length=P - 1 if share else slots[0], model_fn=model_fn, chunk=cfg.prefill_chunk,
  )  # fmt: skip
  if cfg.record_routes:
    cache, r_BPLK = write_prompt(record_routes=True)
    routes["prompt_routes_BPLK"] = jnp.where(mask_BP[:, :-1, None, None], r_BPLK, -1)
    routes["routes_NTLK"] = jnp.full((N, T, *r_BPLK.shape[2:]), -1, r_BPLK.dtype)
  else:
    cache = write_prompt()
  return DecodeState(
    step=jnp.zeros((), jnp.int32),
    cache=cache.share(G, slots[0]) if share else cache.repeat(G),
    key=key,
    tok_N=jnp.repeat(tokens_BP[:, -1], G),
    pos_N=jnp.repeat(positions_BP[:, -1], G),
    done_N=jnp.zeros((N,), jnp.bool_),
    tokens_NT=jnp.full((N, T), cfg.pad_id, jnp.int32),
    mask_NT=jnp.zeros((N, T), jnp.bool_),
    logp_NT=jnp.zeros((N, T), jnp.float32),
    policy_logp_NT=jnp.zeros((N, T), jnp.float32),
    segment_slots=slots,
    **routes,
  )


def decode(
  params,
  state: DecodeState,
  hyper: SamplingParams,
  *,
  model_fn: Callable,
  cfg: SamplerConfig,
  limit_N: jax.Array | None = None,
) -> DecodeState:
  """Feeds one token per row per step in a `lax.while_loop` until every row has emitted an
  EOS id or T columns are filled; finished rows emit padding, masked out.

  With several `state.segment_slots` (`prefill`) it runs one loop per segment: segment j
  grows the cache to its slots L_j (`cache.grow`) and runs steps up to e_j = L_j − L_n + T,
  whose writes (slot P − 1 + step) all fall in [0, L_j). Every step attends over all
  the cache's slots, empty ones masked, so the result does not depend on the segments.

  limit_N (int32, optional): row n stops after limit_N[n] tokens (0: it emits none), as if
  its T were limit_N[n]; its done_N then reads True without an EOS. Branches continuing a
  prefix of c tokens use limit T − c.
  """
  T = state.tokens_NT.shape[1]
  eos_ids = jnp.asarray(cfg.eos_ids, jnp.int32)
  if limit_N is not None:
    state = state.replace(done_N=state.done_N | (limit_N <= 0))

  def cond(s: DecodeState, end: int):
    return (s.step < end) & ~jnp.all(s.done_N)

  def body(s: DecodeState):
    routes = {}
    if s.routes_NTLK is None:
      logits_N1V, cache = model_fn(params, s.tok_N[:, None], s.pos_N[:, None], s.cache)
    else:  # The fed token's experts, per layer, into column `step` (-1 once a row ended).
      logits_N1V, cache, r_N1LK = model_fn(
        params, s.tok_N[:, None], s.pos_N[:, None], s.cache, record_routes=True
      )
      r_N1LK = jnp.where(s.done_N[:, None, None, None], -1, r_N1LK)
      routes["routes_NTLK"] = jax.lax.dynamic_update_slice(s.routes_NTLK, r_N1LK, (0, s.step, 0, 0))
    key, step_key = jax.random.split(s.key)
    tok_N, logp_N, policy_logp_N = choose_tokens(logits_N1V[:, -1], step_key, hyper)
    live_N = ~s.done_N
    tok_N = jnp.where(live_N, tok_N, cfg.pad_id)

    def put(buf_NT, col_N):
      return jax.lax.dynamic_update_slice(buf_NT, col_N[:, None].astype(buf_NT.dtype), (0, s.step))

    return s.replace(
      step=s.step + 1,
      cache=cache,
      key=key,
      tok_N=tok_N,
      pos_N=s.pos_N + 1,
      done_N=s.done_N
      | (live_N & jnp.isin(tok_N, eos_ids))
      | (False if limit_N is None else s.step + 1 >= limit_N),
      tokens_NT=put(s.tokens_NT, tok_N),
      mask_NT=put(s.mask_NT, live_N),
      logp_NT=put(s.logp_NT, jnp.where(live_N, logp_N, 0.0)),
      policy_logp_NT=put(s.policy_logp_NT, jnp.where(live_N, policy_logp_N, 0.0)),
      **routes,
    )

  slots = state.segment_slots or (None,)  # `prefill` made the cache slots[0] long.
  for j, length in enumerate(slots):
    if j:
      state = state.replace(cache=state.cache.grow(length))
    end = T if length is None else length - slots[-1] + T
    state = jax.lax.while_loop(functools.partial(cond, end=end), body, state)
  return state


def ended_with_eos(tokens_NT, mask_NT, eos_ids) -> jax.Array:
  """eos_N: whether a row's completion holds an EOS id (rows that stopped at a length
  limit instead are truncated)."""
  return jnp.any(mask_NT & jnp.isin(tokens_NT, jnp.asarray(eos_ids, jnp.int32)), axis=1)


def to_rollouts(prompts: Prompts, state, *, group_size: int, eos_N=None) -> Rollouts:
  """The finished decode state (a `DecodeState`, or any state with its step and [N, T]
  buffers) as Rollouts, with each prompt repeated for its G rows; eos_N defaults to the
  state's done_N (rows stop only at EOS or T)."""
  tokens_BP = jnp.asarray(prompts.tokens_BP, jnp.int32)
  B, G = tokens_BP.shape[0], group_size
  eos_N = state.done_N if eos_N is None else eos_N
  routes = {}
  if getattr(state, "routes_NTLK", None) is not None:
    routes = replay_routes(state.prompt_routes_BPLK, state.routes_NTLK, group_size=G)
  return Rollouts(
    prompt_tokens_NP=jnp.repeat(tokens_BP, G, axis=0),
    prompt_mask_NP=jnp.repeat(jnp.asarray(prompts.mask_BP, jnp.bool_), G, axis=0),
    tokens_NT=state.tokens_NT,
    mask_NT=state.mask_NT,
    logp_NT=state.logp_NT,
    policy_logp_NT=state.policy_logp_NT,
    eos_N=eos_N,
    truncated_N=~eos_N,
    length_N=jnp.sum(state.mask_NT, axis=-1, dtype=jnp.int32),
    group_ids_N=jnp.repeat(jnp.arange(B, dtype=jnp.int32), G),
    num_steps=state.step,
    **routes,
  )


def replay_routes(prompt_routes_BPLK, routes_NTLK, *, group_size: int) -> dict:
  """The decode state's recorded experts laid out as the trainer's forward reads its
  tokens ([left-padded prompt ; completion], `logprobs.completion_logits`): the prompt's
  P - 1 prefilled tokens (per prompt, repeated for its G rows) then the last prompt token
  (decode step 0), and completion token t from step t + 1 (-1 for the last one, never
  fed: its routing changes no completion log-prob)."""
  prompt_NPLK = jnp.concatenate(
    [jnp.repeat(prompt_routes_BPLK, group_size, axis=0), routes_NTLK[:, :1]], axis=1
  )
  completion_NTLK = jnp.concatenate(
    [routes_NTLK[:, 1:], jnp.full_like(routes_NTLK[:, :1], -1)], axis=1
  )
  return {"prompt_routes_NPLK": prompt_NPLK, "routes_NTLK": completion_NTLK}


def sample(
  params,
  prompts: Prompts,
  key: jax.Array,
  hyper: SamplingParams,
  limit_N: jax.Array | None = None,
  *,
  model_fn: Callable,
  init_cache: Callable[[int, int], Any],
  cfg: SamplerConfig,
) -> Rollouts:
  """Samples cfg.group_size completions per prompt: `prefill`, then `decode` (limit_N:
  row n stops after limit_N[n] tokens; see `decode`). Pure and jittable; see the module
  docstring."""
  state = prefill(params, prompts, key, model_fn=model_fn, init_cache=init_cache, cfg=cfg)
  state = decode(params, state, hyper, model_fn=model_fn, cfg=cfg, limit_N=limit_N)
  eos_N = None if limit_N is None else ended_with_eos(state.tokens_NT, state.mask_NT, cfg.eos_ids)
  return to_rollouts(prompts, state, group_size=cfg.group_size, eos_N=eos_N)


def make_sample_fn(
  *, model_fn: Callable, init_cache: Callable, cfg: SamplerConfig, view: Callable | None = None
):
  """jit(sample) with the model and static config bound: fn(params, prompts, key, hyper),
  run on view(params) when a view is given (`viewed`)."""
  fn = functools.partial(sample, model_fn=model_fn, init_cache=init_cache, cfg=cfg)
  return jax.jit(viewed(fn, view))


def make_policy_sampler(model_cfg: model_lib.ModelConfig, cfg: SamplerConfig):
  """The sampler for a grpo_jax transformer policy (adapters merged for sampling when the
  config says so: `model.sampler_view`)."""
  mcfg, view = model_lib.sampler_view(model_cfg)
  return make_sample_fn(
    model_fn=model_lib.make_model_fn(mcfg),
    init_cache=functools.partial(model_lib.init_cache, mcfg),
    cfg=cfg,
    view=view,
  )


def viewed(fn: Callable, view: Callable | None) -> Callable:
  """fn(params, *args) run on view(params) (`model.sampler_view`); fn itself without a
  view."""
  if view is None:
    return fn
  return functools.partial(_on_view, fn=fn, view=view)


def _on_view(params, *args, fn: Callable, view: Callable, **kwargs):
  return fn(view(params), *args, **kwargs)
