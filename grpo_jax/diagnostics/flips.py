"""Token flipping (arXiv 2605.08666, claim 1): which tokens an update boosts or suppresses,
split by the polarity of their rollout's advantage and by token category.

On a fixed probe batch with parameters θ before and θ' after an update (one step or a
window), Δ_{i,t} = log π_θ'(o_{i,t} | q, o_{i,<t}) − log π_θ(o_{i,t} | q, o_{i,<t}) on the same
contexts. With a dead-band τ >= 0, a valid token is

  boosted     if Δ >  τ,
  suppressed  if Δ < −τ,
  unchanged   if |Δ| <= τ.

The paper's observation: positive (A > 0) and negative (A < 0) rollouts show similar boosted
fractions, i.e. the sign of a token's change is not the sign of its rollout's advantage.
Its evidence (a) compares where |Δ| mass goes, template/format vs reasoning tokens, so the
table also reports each category's share of Σ|Δ|.

Categories are ints in [0, C); the default two are 0 = reasoning, 1 = template/format
(`template_mask` gives the bool form, `regex_tagger` tags a real tokenizer's vocabulary).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import tokenizers

POLARITIES = ("pos", "neg", "all")  # ā > 0, ā < 0, every row (ā = 0 rows only in "all").
STATES = ("boosted", "suppressed", "unchanged")
DEFAULT_CATEGORIES = ("reasoning", "template")


# ----------------------------------------------------------------------------
# Taggers.
# ----------------------------------------------------------------------------


def template_mask(tokens_BT, *, template_ids: Iterable[int]):
  """True where o_{i,t} is one of `template_ids` (template/format tokens). Jittable."""
  ids = jnp.asarray(sorted({int(i) for i in template_ids}), jnp.int32)
  return jnp.isin(tokens_BT, ids)


def regex_tagger(token_strings: Sequence[str], *, patterns: Iterable[str]) -> np.ndarray:
  """is_template_V: True for vocabulary entries whose decoded string matches any pattern
  (`re.search`; anchor a pattern with ^...$ to match the whole token).

  Index the result with token ids to tag a batch: `is_template_V[tokens_BT]`. Typical
  patterns for chat models: r"^\\s*$" (whitespace), r"^\\s*[\\W_]+\\s*$" (punctuation),
  r"<\\|?\\w+\\|?>" (special markers like <think>), r"\\\\boxed".
  """
  compiled = [re.compile(p) for p in patterns]
  return np.asarray([any(c.search(s) for c in compiled) for s in token_strings], bool)


def vocab_strings(tokenizer) -> list[str]:
  """The decoded string of every token id: `token_str(i)` for the toy CharTokenizer (whose
  decode drops specials), else `decode([i])`."""
  if isinstance(tokenizer, tokenizers.CharTokenizer):
    return [tokenizer.token_str(i) for i in range(tokenizer.vocab_size)]
  return [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]


def task_template_ids(task, tokenizer) -> tuple[int, ...]:
  """Token ids of a toy task's `template_chars` (one character per token)."""
  return tuple(sorted(tokenizer.encode(c)[0] for c in task.template_chars))


# ----------------------------------------------------------------------------
# The flip table.
# ----------------------------------------------------------------------------


def polarity_masks(adv_B):
  """[3, B] bool rows: ā > 0, ā < 0, all (the order of POLARITIES)."""
  return jnp.stack([adv_B > 0, adv_B < 0, jnp.ones(adv_B.shape, bool)])


def flip_table(delta_BT, mask_BT, adv_B, category_BT, *, tau: float, num_categories: int = 2):
  """Counts and |Δ| sums by polarity × category × state. Jittable.

  Args:
    delta_BT: Δ log π per token (after − before).
    mask_BT: valid tokens.
    adv_B: per-row (sequence) advantage ā_i; its sign is the row's polarity.
    category_BT: int (or bool) category per token in [0, num_categories).
    tau: dead-band; |Δ| <= τ counts as unchanged.

  Returns:
    counts_PCS [3, C + 1, 3] and abs_delta_PCS [3, C + 1, 3]: polarity (pos, neg, all),
    category (0..C−1, then all), state (boosted, suppressed, unchanged).
  """
  state_BT = jnp.where(delta_BT > tau, 0, jnp.where(delta_BT < -tau, 1, 2))
  state_oh_BTS = jax.nn.one_hot(state_BT, 3, dtype=jnp.float32)
  cat_oh_BTC = jax.nn.one_hot(category_BT.astype(jnp.int32), num_categories, dtype=jnp.float32)
  cat_oh_BTC = jnp.concatenate([cat_oh_BTC, jnp.ones(cat_oh_BTC.shape[:2] + (1,))], axis=-1)
  pol_PB = polarity_masks(adv_B).astype(jnp.float32)
  m_BT = mask_BT.astype(jnp.float32)
  counts = jnp.einsum("pb,bt,btc,bts->pcs", pol_PB, m_BT, cat_oh_BTC, state_oh_BTS)
  absd = jnp.einsum(
    "pb,bt,btc,bts->pcs", pol_PB, m_BT * jnp.abs(delta_BT), cat_oh_BTC, state_oh_BTS
  )
  return counts, absd


def flip_report(
  delta_BT,
  mask_BT,
  adv_B,
  category_BT=None,
  *,
  tau: float = 0.0,
  categories: Sequence[str] = DEFAULT_CATEGORIES,
  prefix: str = "flip",
) -> dict[str, float]:
  """Flat metrics of `flip_table` (host). Keys, for pol in POLARITIES, cat in categories
  and "all", state in STATES:

    {prefix}/{pol}/{cat}/{state}        fraction of the (pol, cat) tokens in that state
    {prefix}/{pol}/{cat}/count          number of (pol, cat) tokens
    {prefix}/{pol}/{cat}/abs_delta_share  Σ|Δ| over (pol, cat) / Σ|Δ| over (pol, all)

  Fractions of an empty cell are NaN (written "nan" to JSONL).
  """
  if category_BT is None:
    category_BT = jnp.zeros(jnp.shape(delta_BT), jnp.int32)
  counts, absd = jax.device_get(
    flip_table(
      jnp.asarray(delta_BT, jnp.float32),
      jnp.asarray(mask_BT),
      jnp.asarray(adv_B, jnp.float32),
      jnp.asarray(category_BT),
      tau=tau,
      num_categories=len(categories),
    )
  )
  return flip_summary(counts, absd, categories=categories, prefix=prefix)


def flip_summary(
  counts_PCS, abs_delta_PCS, *, categories: Sequence[str] = DEFAULT_CATEGORIES, prefix: str = "flip"
) -> dict[str, float]:
  """`flip_report`'s metrics from the two arrays of `flip_table` (host)."""
  counts, absd = np.asarray(counts_PCS, np.float64), np.asarray(abs_delta_PCS, np.float64)
  out = {}
  for p, pol in enumerate(POLARITIES):
    total_abs = absd[p, -1].sum()
    for c, cat in enumerate((*categories, "all")):
      n = counts[p, c].sum()
      for s, state in enumerate(STATES):
        out[f"{prefix}/{pol}/{cat}/{state}"] = counts[p, c, s] / n if n else float("nan")
      out[f"{prefix}/{pol}/{cat}/count"] = n
      out[f"{prefix}/{pol}/{cat}/abs_delta_share"] = (
        absd[p, c].sum() / total_abs if total_abs > 0 else float("nan")
      )
  return out
