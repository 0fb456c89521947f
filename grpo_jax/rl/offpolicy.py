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

from grpo_jax.infra import moved
from grpo_jax.rl import importance

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


def __getattr__(name: str):
  """0.2's empty_rollouts, continue_rows, restart_rows and finished here -> grpo_jax.rollouts, with a DeprecationWarning; kept for one
  release (`moved.OFFPOLICY_NAMES`)."""
  return moved.resolve(
    "grpo_jax.rl.offpolicy", name, moved.OFFPOLICY_NAMES, attribute=True, namespace=globals()
  )
