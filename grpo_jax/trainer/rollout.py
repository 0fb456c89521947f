"""One RL iteration's data: draw prompts, sample rollouts, score them, (dynamically) select.

    drawn = rollout.draw(setup, fns, index)                  # prompts index .. index + B - 1
    got = rollout.collect(setup, fns, pool, params, ref_params, index=index, key=key)
    got.rollouts, got.logprobs, got.correct_N, got.valid_N, got.metrics

Host/device overlap: without dynamic sampling the old/ref log-prob forwards
(`preparation.rollout_logprobs`) are dispatched as soon as the rollouts exist, and run on the
device while the host decodes and scores rewards in the worker pool (`reward_pool.RewardPool`).
With DAPO dynamic sampling (`dynamic_sampling`) generation batches are sampled until B
groups have varying rewards or `rl.max_gen_batches` is reached, and the forwards run once
the kept groups are assembled, so no forward is spent on dropped groups.

Several processes: each encodes, decodes and scores only the rows its devices hold
(`distributed.local_rows`); scores are all-gathered, so every process sees the same
arrays. The prompt stream is the same whatever the number of processes.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import distributed, flops
from grpo_jax.models import sampling
from grpo_jax.rewards import reward_sources
from grpo_jax.rl import counterfactuals, preparation
from grpo_jax.rollouts import counterfactuals as cf_gen
from grpo_jax.rollouts import dynamic_sampling
from grpo_jax.trainer import build
from grpo_jax.verifiers import verdicts


@dataclasses.dataclass(frozen=True)
class Drawn:
  """Train examples index .. index + B - 1: this process's rows ({row: example}) and the
  global prompt batch."""

  index: int
  examples: dict
  prompts: sampling.Prompts


@dataclasses.dataclass(frozen=True)
class Scores:
  """Host scores of a batch's completions, the same on every process."""

  correct_N: np.ndarray
  format_N: np.ndarray
  scorable_N: np.ndarray  # False where the reward failed (raised, timed out, non-finite).
  errors: int
  timeouts: int
  messages: tuple[str, ...] = ()  # This process's first failure messages.
  outcomes: tuple[int, ...] = ()  # Rows per label of `Task.outcomes` (+ "other"), summed.
  completions: tuple[str, ...] = ()  # `score`'s decoded texts of this process's rows.
  parts: dict = dataclasses.field(default_factory=dict)  # Reward source -> SourceScores.
  # Unscorable rows per `verdicts.unscorable_keys(Task.outcomes)` name, summed.
  unscorable: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Collected:
  """A training batch of B·G rows, scored, with its log-prob forwards dispatched."""

  rollouts: sampling.Rollouts
  logprobs: preparation.PolicyLogProbs
  scores: Scores
  valid_N: np.ndarray  # False on dynamic-sampling fill groups: kept for shape, not trained.
  next_index: int
  metrics: dict
  seconds: dict  # "sample", "reward"
  provenance: Any = None  # counterfactuals.Provenance of IBPO's counterfactual rows.


def host_prompts(setup: build.Setup, fns, examples: dict, n: int) -> sampling.Prompts:
  """The n-row prompt batch as global arrays on the layout's row sharding; this process
  encodes only its own rows (`examples` maps row -> example), padded to the bucket of the
  longest prompt of every process."""
  tok, rows = setup.tokenizer, distributed.local_rows(fns.layout.rows(n), n)
  lists = [tok.encode(examples[i].prompt, add_bos=True) for i in range(rows.start, rows.stop)]
  longest = distributed.max_across(max(len(t) for t in lists))
  prompts = sampling.prepare_prompts(lists, cfg=setup.sampler_cfg, min_len=longest)
  return distributed.to_global(prompts, fns.layout.rows(n), n)


def needed_rows(fns, n_prompts: int, group: int) -> range:
  """Prompt rows this process needs: those its devices hold, and the prompts of the
  n_prompts × group completion rows it decodes and scores."""
  p = distributed.local_rows(fns.layout.rows(n_prompts), n_prompts)
  c = distributed.local_rows(fns.layout.rows(n_prompts * group), n_prompts * group)
  return range(min(p.start, c.start // group), max(p.stop, -(-c.stop // group)))


def draw(setup: build.Setup, fns, index: int) -> Drawn:
  """Train examples index .. index + B - 1 and their prompt batch."""
  loop = setup.loop
  rows = set(needed_rows(fns, loop.prompts_per_step, setup.sampler_cfg.group_size))
  if setup.counterfactual.enabled:  # The prompts of the counterfactual rows it scores.
    rows |= set(needed_rows(fns, loop.prompts_per_step, setup.counterfactual.per_group))
  examples = {i: setup.task.example("train", index + i, seed=loop.seed) for i in sorted(rows)}
  return Drawn(index, examples, host_prompts(setup, fns, examples, loop.prompts_per_step))


def score(setup: build.Setup, pool, examples: dict, tokens_NT, *, group: int) -> Scores:
  """Decodes and scores this process's rows of the completions tokens_NT (n = prompts ×
  group rows, global), then all-gathers the scores. A `reward_sources.Mixture` also gets
  the prompts, and its total is recombined from every process's rows (`combine`)."""
  tok, n = setup.tokenizer, tokens_NT.shape[0]
  rows = distributed.local_rows(tokens_NT.sharding, n)
  completions = [tok.decode(r) for r in distributed.fetch_local(tokens_NT)]
  inputs = [setup.task.reward_input(examples[i // group]) for i in range(rows.start, rows.stop)]
  if isinstance(pool, reward_sources.Mixture):
    prompts = [examples[i // group].prompt for i in range(rows.start, rows.stop)]
    scores = pool.score(inputs, completions, prompts=prompts)
  else:
    scores = pool.score(inputs, completions)
  gather = lambda x: distributed.gather_rows(x, tokens_NT.sharding, n)
  counts = outcome_counts(setup.task.outcomes, scores.label_N)
  failed = verdicts.unscorable_counts(
    setup.task.outcomes, scores.error_N, scores.timeout_N, scores.label_N
  )
  errors, timeouts, *summed = distributed.sum_across(
    np.array([scores.errors, scores.timeouts, *counts, *failed])
  )
  outcomes, unscorable = summed[: len(counts)], summed[len(counts) :]
  correct_N, error_N, parts = gather(scores.correct_N), gather(scores.error_N), {}
  if scores.parts is not None:
    parts = {
      k: verdicts.SourceScores(gather(p.value_N), gather(p.error_N))
      for k, p in scores.parts.items()
    }
    correct_N, error_N = pool.combine(parts)
  return Scores(
    correct_N,
    gather(scores.format_N),
    ~error_N,
    int(errors),
    int(timeouts),
    tuple(scores.messages[:3]),
    tuple(int(c) for c in outcomes),
    tuple(completions),
    parts,
    tuple(int(c) for c in unscorable),
  )


def source_costs(pool) -> dict:
  """reward/<name>/seconds_per_row of a mixture's model sources (none from the pool)."""
  if not isinstance(pool, reward_sources.Mixture):
    return {}
  return {f"reward/{k}/seconds_per_row": v for k, v in pool.cost().items()}


def source_metrics(scores: list[Scores]) -> dict:
  """reward/<name>: each reward source's raw mean over the rows it scored;
  reward/<name>/unscorable: the share of rows it could not score."""
  out = {}
  for name in scores[0].parts:
    value_N = np.concatenate([s.parts[name].value_N for s in scores])
    error_N = np.concatenate([s.parts[name].error_N for s in scores])
    out[f"reward/{name}"] = float(value_N[~error_N].mean()) if (~error_N).any() else float("nan")
    out[f"reward/{name}/unscorable"] = float(error_N.mean())
  return out


def outcome_counts(vocabulary: tuple[str, ...], label_N) -> list[int]:
  """Rows per label of the task's outcome vocabulary, then the rows with any other label
  ([] when the task labels nothing)."""
  if not vocabulary:
    return []
  labels = list(label_N) if label_N is not None else []
  counts = [labels.count(v) for v in vocabulary]
  return [*counts, sum(1 for x in labels if x and x not in vocabulary)]


def unscorable_metrics(vocabulary: tuple[str, ...], scores: list[Scores], *, group: int) -> dict:
  """reward/unscorable_frac: the share of the iteration's rows whose reward failed, and
  reward/unscorable/<name> per `verdicts.unscorable_keys` (not under unscorable_frac/:
  MLflow stores a metric as a file, so a name cannot also be a folder of others);
  reward/unscorable_failure_corr: across its groups, the correlation of that share with
  the failure rate of the scorable rows (`verdicts.unscorable_failure_corr`), where it is
  defined."""
  rows = sum(len(s.correct_N) for s in scores)
  if not rows:
    return {}
  failed = sum(int((~np.asarray(s.scorable_N)).sum()) for s in scores)
  out = {"reward/unscorable_frac": failed / rows}
  counted = [s.unscorable for s in scores if s.unscorable]
  if counted:
    totals = np.sum(counted, axis=0)
    keys = verdicts.unscorable_keys(vocabulary)
    out.update({f"reward/unscorable/{k}": float(c) / rows for k, c in zip(keys, totals)})
  corr = verdicts.unscorable_failure_corr(
    np.concatenate([s.correct_N for s in scores]),
    np.concatenate([s.scorable_N for s in scores]),
    group_size=group,
  )
  if np.isfinite(corr):  # Undefined (no unscorable row, < 2 groups): not logged.
    out["reward/unscorable_failure_corr"] = corr
  return out


def outcome_metrics(vocabulary: tuple[str, ...], scores: list[Scores]) -> dict:
  """reward/outcome/<label>: the share of the scored rows with each label."""
  rows = sum(len(s.correct_N) for s in scores)
  counted = [s.outcomes for s in scores if s.outcomes]
  if not vocabulary or not rows or not counted:
    return {}
  totals, names = np.sum(counted, axis=0), [*vocabulary, "other"]
  return {f"reward/outcome/{k}": float(c) / rows for k, c in zip(names, totals)}


def score_metrics(setup: build.Setup, pool, scores: list[Scores]) -> dict:
  """The iteration's reward metrics over its scored generation batches: accuracy,
  reward_errors, reward_timeouts, reward/outcome/*, reward/unscorable*, and config.rewards'
  sources (`collect`, and the off-policy pipeline's batches)."""
  return {
    "accuracy": float(np.concatenate([s.correct_N for s in scores]).mean()),
    "reward_errors": sum(s.errors for s in scores),
    "reward_timeouts": sum(s.timeouts for s in scores),
    **outcome_metrics(setup.task.outcomes, scores),
    **unscorable_metrics(setup.task.outcomes, scores, group=setup.sampler_cfg.group_size),
    **(source_metrics(scores) if scores[0].parts else {}),
    **source_costs(pool),
  }


def collect(
  setup: build.Setup, fns, pool, params, ref_params, *, index: int, key, prefetched=None
) -> Collected:
  """Samples and scores generation batches (one, or with dynamic sampling up to
  rl.max_gen_batches) from data position `index`; `prefetched` is a `Drawn` made while the
  previous update ran on the device. Shapes are always B·G rows."""
  rl_cfg, G = setup.rl_cfg, setup.sampler_cfg.group_size
  parts, scores, seconds, n_varying = [], [], {"sample": 0.0, "reward": 0.0}, 0
  dispatch, played = not rl_cfg.dynamic_sampling and not setup.counterfactual.enabled, []
  for g in range(rl_cfg.max_gen_batches if rl_cfg.dynamic_sampling else 1):
    drawn = prefetched if prefetched and prefetched.index == index else draw(setup, fns, index)
    index += setup.loop.prompts_per_step
    rollouts, got, logprobs, episode_metrics = sample_and_score(
      setup, fns, pool, params, ref_params, drawn, jax.random.fold_in(key, g), dispatch, seconds
    )
    scores.append(got)
    played.append(episode_metrics)
    parts.append(rollouts)
    last = scores[-1]
    n_varying += int(
      dynamic_sampling.varying_groups(
        last.correct_N, group_size=G, scorable_N=last.scorable_N
      ).sum()
    )
    if n_varying >= setup.loop.prompts_per_step:
      break
  metrics = {
    **score_metrics(setup, pool, scores),
    **{k: float(np.mean([m[k] for m in played])) for k in played[0]},  # Episodes' (means).
  }
  valid_N = np.ones(setup.rollout_rows, bool)
  if setup.counterfactual.enabled:
    cf = with_counterfactuals(setup, fns, pool, params, drawn, parts[0], scores[0], key)
    merged, picked, prov, cf_seconds = cf
    logprobs = fns.rl.logprobs(params, ref_params, merged)
    seconds["counterfactuals"] = cf_seconds
    return Collected(merged, logprobs, picked, valid_N, index, metrics, seconds, prov)
  if not rl_cfg.dynamic_sampling:
    return Collected(parts[0], logprobs, scores[0], valid_N, index, metrics, seconds)
  rollouts, picked, valid_N, dynamic = _select(setup, pool, parts, scores)
  logprobs = fns.rl.logprobs(params, ref_params, rollouts)
  return Collected(rollouts, logprobs, picked, valid_N, index, {**metrics, **dynamic}, seconds)


def sample_and_score(
  setup: build.Setup, fns, pool, params, ref_params, drawn: Drawn, key, dispatch: bool, seconds
):
  """One generation batch: (rollouts, Scores, logprobs, episode metrics). Single-turn: the
  sampler, then (with `dispatch`) the old/ref log-prob forwards dispatched before the host
  scores rewards, so they overlap; logprobs is None without `dispatch`. Episodes
  (config.env): `play`. Adds the phases' seconds to `seconds`."""
  if setup.episodes is not None:
    rollouts, scores, metrics = play(setup, fns, params, drawn, key, seconds)
    logprobs = fns.rl.logprobs(params, ref_params, rollouts) if dispatch else None
    return rollouts, scores, logprobs, metrics
  t0 = time.perf_counter()
  rollouts = fns.samplers.train(params, drawn.prompts, key, setup.sampling_hyper)
  rollouts = jax.block_until_ready(rollouts)
  t1 = time.perf_counter()
  logprobs = fns.rl.logprobs(params, ref_params, rollouts) if dispatch else None  # Async.
  scores = score(
    setup, pool, drawn.examples, rollouts.tokens_NT, group=setup.sampler_cfg.group_size
  )
  seconds["sample"] += t1 - t0
  seconds["reward"] += time.perf_counter() - t1
  return rollouts, scores, logprobs, {}


def play(setup: build.Setup, fns, params, drawn: Drawn, key, seconds: dict):
  """G episodes per drawn prompt with the environment (`episodes`): (rollouts, Scores,
  "episode/..." metrics). The reward is the episode's sum of step rewards; an episode
  whose environment raised is unscorable. Adds "sample" (the jitted pieces) and "env" (the
  host's environment steps) seconds."""
  n = drawn.prompts.tokens_BP.shape[0]
  got = fns.episodes.train.run(  # Prompts this process plays none of: None.
    params, drawn.prompts, [drawn.examples.get(b) for b in range(n)], key, setup.sampling_hyper
  )
  for phase, s in got.seconds.items():
    seconds[phase] = seconds.get(phase, 0.0) + s
  failed_N = ~got.scorable_N
  labels = np.array(got.labels or [""] * len(failed_N), object)
  unscorable = verdicts.unscorable_counts(
    setup.task.outcomes, failed_N, np.zeros_like(failed_N), labels
  )
  scores = Scores(
    got.reward_N.astype(np.float32),
    np.zeros(len(got.reward_N), np.float32),
    got.scorable_N,
    int(failed_N.sum()),
    0,
    got.messages,
    unscorable=tuple(unscorable),
  )
  return got.rollouts, scores, got.metrics()


def with_counterfactuals(
  setup: build.Setup, fns, pool, params, drawn: Drawn, rollouts, scores, key
):
  """IBPO's counterfactual rows (`counterfactuals`) for a scored batch of B·G samples:
  plan the slots, decode and score them, merge. Returns (merged Rollouts of B·(G + C)
  rows, their Scores, Provenance, seconds)."""
  cf, G = setup.counterfactual, setup.sampler_cfg.group_size
  t0 = time.perf_counter()
  key = jax.random.fold_in(key, 1_000_003)
  cf_plan = fns.counterfactual.plan(key, rollouts, scores.correct_N)
  prompts = None
  if cf.perturbed:
    if jax.process_count() > 1:
      raise NotImplementedError("Perturbed-prompt counterfactuals run in one process only.")
    completions = [setup.tokenizer.decode(r) for r in distributed.fetch_local(rollouts.tokens_NT)]
    prompts = cf_gen.perturbed_prompts(
      setup.task,
      setup.tokenizer,
      drawn.examples,
      completions,
      jax.device_get(cf_plan),
      kind=cf.source,
      group_size=G,
      sampler_cfg=setup.sampler_cfg,
      seed=drawn.index,
    )
  cf_rows, own = fns.counterfactual.generate(
    params, rollouts, cf_plan, prompts, jax.random.fold_in(key, 1), setup.sampling_hyper
  )
  merged, prov = fns.counterfactual.merge(rollouts, cf_rows, own, cf_plan)
  cf_scores = score(setup, pool, drawn.examples, cf_rows.tokens_NT, group=cf.per_group)
  B = setup.loop.prompts_per_step
  order = counterfactuals.merge_order(B, G, cf.per_group)

  def join(a, b):
    return np.concatenate([np.asarray(a), np.asarray(b)])[order]

  picked = Scores(
    join(scores.correct_N, cf_scores.correct_N),
    join(scores.format_N, cf_scores.format_N),
    join(scores.scorable_N, cf_scores.scorable_N),
    scores.errors + cf_scores.errors,
    scores.timeouts + cf_scores.timeouts,
    scores.messages + cf_scores.messages,
  )
  return merged, picked, prov, time.perf_counter() - t0


def _select(setup: build.Setup, pool, parts: list, scores: list[Scores]):
  """Dynamic sampling: B groups assembled from the generation batches (varying groups
  first, masked fill groups when the cap was reached); (rollouts, their scores, valid_N,
  dynamic/... metrics). A mixture's total is recombined over the selected rows, so its
  per-batch transforms see the batch the update trains."""
  B, G = setup.loop.prompts_per_step, setup.sampler_cfg.group_size
  varying = [
    dynamic_sampling.varying_groups(s.correct_N, group_size=G, scorable_N=s.scorable_N)
    for s in scores
  ]
  sel = dynamic_sampling.select(varying, num_groups=B)
  rollouts = dynamic_sampling.assemble(parts, sel, group_size=G, pad_id=setup.sampler_cfg.pad_id)
  pick = functools.partial(dynamic_sampling.select_rows, sel=sel, group_size=G)
  correct_N, scorable_N, sources = pick([s.correct_N for s in scores]), None, {}
  if scores[0].parts:
    sources = {
      k: verdicts.SourceScores(
        pick([s.parts[k].value_N for s in scores]), pick([s.parts[k].error_N for s in scores])
      )
      for k in scores[0].parts
    }
    correct_N, error_N = pool.combine(sources)
    scorable_N = ~error_N
  picked = Scores(
    correct_N,
    pick([s.format_N for s in scores]),
    pick([s.scorable_N for s in scores]) if scorable_N is None else scorable_N,
    sum(s.errors for s in scores),
    sum(s.timeouts for s in scores),
    sum((s.messages for s in scores), ()),
    parts=sources,
  )
  metrics = {
    "dynamic/gen_batches": len(parts),
    "dynamic/dropped_groups": sel.dropped,
    "dynamic/fill_groups": sel.fill,
    "dynamic/surplus_groups": sel.surplus,
  }
  return rollouts, picked, np.repeat(sel.valid_B, G), metrics


def padding(rollouts, *, tokens: float, slots: int = 0) -> dict:
  """The share of each phase's computed slots that held no token (`metrics.DEFINITIONS`,
  "pad/...", and "sampler/starved_frac" where the sampler reports starved rows): `tokens` completion tokens; decode row-steps of rows that had already ended (or of idle refill slots:
  `slots` decode rows when the refill sampler ran), and the padded positions of the
  [N, P + T] sequences the log-prob forwards and the update compute."""
  N, T = rollouts.mask_NT.shape
  P = rollouts.prompt_tokens_NP.shape[1]
  # A sum of the global array (a replicated scalar): every process can read it.
  prompt = float(jnp.sum(rollouts.prompt_mask_NP))
  steps = max(int(rollouts.num_steps), 1) * (slots or N) / N
  out = {
    "pad/sample_frac": 1.0 - tokens / (N * steps),
    "pad/update_frac": 1.0 - (prompt + tokens) / (N * (P + T)),
  }
  if rollouts.starved_N is not None:  # A paged sampler (static or refill).
    out["sampler/starved_frac"] = float(jnp.mean(rollouts.starved_N.astype(jnp.float32)))
  return out


def phase_flops(setup: build.Setup, rollouts: Any, *, gen_batches: int) -> dict:
  """Model FLOPs of one iteration's phases (`flops.phase_flops`: the LM head only where
  logits are used): "sample" (every generation batch, the steps the sampler ran),
  "logprobs" (the π_old and reference forwards) and "update" (3 forwards per epoch)."""
  N, P = rollouts.prompt_tokens_NP.shape
  fl = flops.run_phase_flops(
    setup, prompt_len=P, rollout_rows=N, decode_steps=float(rollouts.num_steps)
  )
  return {**fl, "sample": gen_batches * fl["sample"]}
