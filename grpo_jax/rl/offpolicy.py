"""Off-policy RL: rollouts sampled by older parameters while an update runs.

config.offpolicy (`OffPolicyConfig`) switches the trainer's data source from the
synchronous loop (sample with θ, score, update θ) to a pipeline of in-flight rollout
batches (`pipeline.Source`). Iterations are numbered it = 1, 2, ...; at the start of
iteration it the trainer holds θ_v with v = it − 1 updates applied (the params "version").

Schedule, with s = max_staleness:

* At the start of iteration it the batches it .. it + s are in flight: any not yet
  started is started now, sampled by θ_{it−1}. Batch it + s is thus sampled while the
  update of batch it runs (on one device the two are queued back to back and the host
  scores rewards during the update; with placement "split" the sampler runs on its own
  devices, in parallel with the trainer).
* Batch it is trained at iteration it by θ_{it−1}: its rows were sampled by θ_{it−1−s}
  (the first s + 1 batches by θ_0), so a row's staleness, (it − 1) − the version that
  sampled it, is at most s. s = 0 is the synchronous loop, step for step.
* The policy loss uses π_old = the trainer's recompute under θ_{it−1}
  (rl.recompute_old_logp, the "proximal" policy of AReaL's decoupled objective), and the
  behaviour policy μ (the sampler's log-probs, kept per token) enters through
  rl.is_correction (`importance`): TIS or MIS.
* A row staler than s (a pending buffer restored under a smaller s; a partial rollout's
  oldest token) follows `stale`: "drop" leaves it out of the batch's advantages and loss
  (`rl.trained_rows` keep_N), "correct" trains it with the importance correction (which
  must then be on: the config refuses "correct" with rl.is_correction = "none").

Partial rollouts (`partial`, needs s ≥ 1): each in-flight batch is decoded one segment of
`segment_tokens` steps per iteration (default ⌈T / s⌉), each segment by the newest params.
When the params change while a row is unfinished:

* "continue": the row goes on under the new params: [prompt ; tokens so far] is
  re-prefilled under them (a stale KV cache would mix two policies in one forward) and
  decoding resumes. Each token's sampler log-prob is that of the params that produced
  it, so the importance ratio of every segment is right; the row's version (for
  staleness) is that of its oldest token.
* "restart": the row's tokens are discarded and it starts again from its prompt under
  the new params.

A batch unfinished when its iteration comes is decoded to the end by the current params.
"off" decodes a whole batch when it starts (no row ever sees two versions).

Bad configs are refused before anything compiles (`check`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from grpo_jax.models import sampling
from grpo_jax.rl import counterfactuals, importance

STALE_POLICIES = ("drop", "correct")
PARTIAL = ("off", "continue", "restart")
PLACEMENTS = ("shared", "split")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OffPolicyConfig:
  """config.offpolicy: the rollout pipeline (static: changing one restarts the pipeline)."""

  enabled: bool = False  # The pipelined source (with max_staleness = 0: the sync schedule).
  max_staleness: int = 0  # s: batch it is sampled by θ_{it−1−s}.
  stale: str = "drop"  # STALE_POLICIES: rows staler than s.
  partial: str = "off"  # PARTIAL: rows unfinished when the params change.
  segment_tokens: int = 0  # Decode steps per segment with partial (0: ⌈T / s⌉).
  placement: str = "shared"  # PLACEMENTS: "split" samples on the first sampler_devices.
  sampler_devices: int = 1  # Devices the sampler takes with placement "split".

  def __post_init__(self):
    for name, value, allowed in (
      ("stale", self.stale, STALE_POLICIES),
      ("partial", self.partial, PARTIAL),
      ("placement", self.placement, PLACEMENTS),
    ):
      if value not in allowed:
        raise ValueError(f"offpolicy.{name}={value!r}; allowed: {', '.join(allowed)}.")
    if self.max_staleness < 0:
      raise ValueError(
        f"offpolicy.max_staleness={self.max_staleness}: must be >= 0 (0: every batch is "
        "sampled by the params it is trained from; s: by the params s updates older)."
      )
    if self.segment_tokens < 0:
      raise ValueError(f"offpolicy.segment_tokens must be >= 0, got {self.segment_tokens}.")
    if self.sampler_devices < 1:
      raise ValueError(f"offpolicy.sampler_devices must be >= 1, got {self.sampler_devices}.")

  def segment(self, max_new_tokens: int) -> int:
    """Decode steps per segment: segment_tokens, else ⌈T / s⌉."""
    if self.segment_tokens:
      return self.segment_tokens
    return -(-max_new_tokens // max(self.max_staleness, 1))


def check(
  cfg: OffPolicyConfig,
  *,
  rl_cfg,
  counterfactual_enabled: bool,
  refill_slots: int,
  n_devices: int,
  process_count: int = 1,
) -> None:
  """Refuses, before anything compiles, an off-policy config that cannot run."""
  where = "config.offpolicy"
  defaults = OffPolicyConfig()
  if not cfg.enabled:
    changed = [
      f.name
      for f in dataclasses.fields(cfg)
      if f.name != "enabled" and getattr(cfg, f.name) != getattr(defaults, f.name)
    ]
    if changed:
      raise ValueError(
        f"{where} sets {changed} but enabled=False: they take effect only with "
        f"{where}.enabled=True."
      )
    return
  problems = []
  if rl_cfg.dynamic_sampling:
    problems.append(
      "rl.dynamic_sampling decides whether to sample more from the rewards of the batch "
      "it is about to train, which a pipeline has already sampled"
    )
  if counterfactual_enabled:
    problems.append(
      "config.counterfactual (IBPO) decodes counterfactual rows from the trainer's params "
      "after scoring, inside the iteration"
    )
  if cfg.partial != "off" and cfg.max_staleness == 0:
    problems.append(
      f"partial={cfg.partial!r} needs max_staleness >= 1: with 0 the params never change "
      "while a batch is in flight"
    )
  if cfg.partial != "off" and refill_slots:
    problems.append("partial rollouts continue rows with the static sampler; set refill_slots=0")
  if cfg.stale == "correct" and not importance.REGISTRY.traits(rl_cfg.is_correction).corrects:
    problems.append(
      "stale='correct' would train rows staler than max_staleness uncorrected: set "
      "rl.is_correction (e.g. 'tis_token') or stale='drop'"
    )
  if cfg.placement == "split" and n_devices <= cfg.sampler_devices:
    problems.append(
      f"placement='split' puts the sampler on {cfg.sampler_devices} device(s) and the "
      f"trainer on the rest, but there are {n_devices} (on a CPU host: "
      "XLA_FLAGS=--xla_force_host_platform_device_count=2)"
    )
  if process_count > 1:
    problems.append("the pipeline runs in one process")
  if problems:
    raise ValueError(f"{where}.enabled=True cannot run: " + "; ".join(problems) + ".")


# ----------------------------------------------------------------------------
# Jitted: empty rows and one segment of partial rollouts.
# ----------------------------------------------------------------------------


def empty_rollouts(prompts: sampling.Prompts, *, group_size: int, max_new_tokens: int, pad_id):
  """Rollouts of B·G rows with no completion token yet (a partial batch's start)."""
  B = prompts.tokens_BP.shape[0]
  N, T = B * group_size, max_new_tokens
  state = sampling.DecodeState(
    step=jnp.zeros((), jnp.int32),
    cache=None,
    key=None,
    tok_N=None,
    pos_N=None,
    done_N=jnp.zeros((N,), jnp.bool_),
    tokens_NT=jnp.full((N, T), pad_id, jnp.int32),
    mask_NT=jnp.zeros((N, T), jnp.bool_),
    logp_NT=jnp.zeros((N, T), jnp.float32),
    policy_logp_NT=jnp.zeros((N, T), jnp.float32),
  )
  return sampling.to_rollouts(prompts, state, group_size=group_size)


def finished(rollouts: sampling.Rollouts) -> jax.Array:
  """finished_N: the row emitted EOS or filled its T slots."""
  return rollouts.eos_N | (rollouts.length_N >= rollouts.tokens_NT.shape[1])


def restart_rows(rollouts: sampling.Rollouts, reset_N, *, pad_id) -> sampling.Rollouts:
  """The rows reset_N emptied (their tokens discarded), the others unchanged."""
  keep_NT = ~reset_N[:, None]
  mask_NT = rollouts.mask_NT & keep_NT
  return rollouts.replace(
    tokens_NT=jnp.where(mask_NT, rollouts.tokens_NT, pad_id),
    mask_NT=mask_NT,
    logp_NT=jnp.where(mask_NT, rollouts.logp_NT, 0.0),
    policy_logp_NT=jnp.where(mask_NT, rollouts.policy_logp_NT, 0.0),
    eos_N=rollouts.eos_N & ~reset_N,
    truncated_N=rollouts.truncated_N | reset_N,
    length_N=jnp.sum(mask_NT, axis=1, dtype=jnp.int32),
  )


def continue_rows(
  params,
  rollouts: sampling.Rollouts,
  live_N,
  steps,
  key,
  hyper: sampling.SamplingParams,
  *,
  model_fn: Callable,
  init_cache: Callable,
  cfg: sampling.SamplerConfig,
) -> sampling.Rollouts:
  """Each live row decoded up to `steps` more tokens (at most T in all) under `params`,
  from [prompt ; its tokens so far] prefilled anew (`counterfactuals.prefix_prompts`);
  the new tokens carry these params' log-probs, the old ones keep theirs. Jittable."""
  T = rollouts.tokens_NT.shape[1]
  len_N = rollouts.length_N
  prompts = counterfactuals.prefix_prompts(
    rollouts.prompt_tokens_NP,
    rollouts.prompt_mask_NP,
    rollouts.tokens_NT,
    len_N,
    pad_id=cfg.pad_id,
  )
  limit_N = jnp.where(live_N, jnp.minimum(steps, T - len_N), 0)
  s = counterfactuals.sample_limited(
    params, prompts, limit_N, key, hyper, model_fn=model_fn, init_cache=init_cache, cfg=cfg
  )
  t_T = jnp.arange(T)
  src_NT = jnp.clip(t_T[None, :] - len_N[:, None], 0, T - 1)
  new_NT = (t_T[None, :] >= len_N[:, None]) & jnp.take_along_axis(s.mask_NT, src_NT, axis=1)

  def join(old, cont):
    return jnp.where(new_NT, jnp.take_along_axis(cont, src_NT, axis=1), old)

  mask_NT = rollouts.mask_NT | new_NT
  eos_N = rollouts.eos_N | sampling.ended_with_eos(s.tokens_NT, s.mask_NT, cfg.eos_ids)
  return rollouts.replace(
    tokens_NT=join(rollouts.tokens_NT, s.tokens_NT),
    mask_NT=mask_NT,
    logp_NT=join(rollouts.logp_NT, s.logp_NT),
    policy_logp_NT=join(rollouts.policy_logp_NT, s.policy_logp_NT),
    eos_N=eos_N,
    truncated_N=~eos_N,
    length_N=jnp.sum(mask_NT, axis=1, dtype=jnp.int32),
    num_steps=rollouts.num_steps + s.step,
  )
