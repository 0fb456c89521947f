"""Collapse detection: a run that has visibly wrecked its policy says so in one line.

config.collapse (`CollapseConfig`) watches each iteration's metrics record (`observe`,
pure; the trainer keeps its state in the checkpoint) for three signals:

  dead_groups    every group's correctness rewards all 0 (all_zero_groups = 1) with a
                 gradient norm of 0, for at least `patience` consecutive iterations,
                 where the run's earlier batches say correct rows were to be expected:
                 at the success rate p̂ of every row sampled before the streak (at least
                 4 of them correct, so that p̂ is not one lucky batch), its R rows would
                 have held p̂·R >= `expected_correct` correct ones. No row has an
                 advantage, so nothing can move the policy back (a learning rate that
                 blew the params up, a flipped advantage sign).
  eval_accuracy  greedy held-out accuracy 0 at an evaluation, after an iteration-0
                 evaluation (the warm-started policy) that solved at least
                 `eval_min_solved` of the held-out problems (0: the signal is off).
  entropy        the mean token entropy of the policy below `entropy_floor` for
                 `patience` consecutive iterations (floor 0, the default: off; a
                 converged policy is nearly deterministic too, so a floor suits only
                 tasks whose answers are not).

Why these bounds: a policy that kept its success rate p̂ would give a streak without one
correct row in R rows with probability (1 − p̂)^R < e^(−p̂R), below e^−8 ≈ 3.4·10^−4 at
the default expected_correct = 8; a weak run (p̂·R small: a random init, a short warm
start) is not called collapsed however long its zero streak. Likewise an unchanged policy
that solved k of n held-out problems solves none of them with probability < e^−k.

`action` decides what a signal does: "stop" (the default) raises `CollapseError`, one
line naming the signal, when it began and the last checkpoint before it (the CLI exits
1); "warn" logs that line once per signal and goes on; "off" watches nothing.
"""

from __future__ import annotations

import dataclasses
import math

ACTIONS = ("stop", "warn", "off")
SIGNALS = ("dead_groups", "eval_accuracy", "entropy")
MIN_CORRECT = 4  # dead_groups: correct rows before the streak that p̂ rests on.


class CollapseError(RuntimeError):
  """The policy collapsed and config.collapse.action is "stop"."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollapseConfig:
  """config.collapse: which collapse signals stop (or warn about) a run."""

  action: str = "stop"  # ACTIONS.
  patience: int = 5  # Consecutive iterations of dead_groups / entropy before either fires.
  expected_correct: float = 8.0  # dead_groups: correct rows the streak should have held.
  eval_min_solved: int = 8  # eval_accuracy: held-out problems solved at iteration 0 (0: off).
  entropy_floor: float = 0.0  # entropy: fires below this (0: off).

  def __post_init__(self):
    if self.action not in ACTIONS:
      raise ValueError(f"config.collapse.action={self.action!r}; allowed: {', '.join(ACTIONS)}.")
    for name, low in (("patience", 1), ("eval_min_solved", 0)):
      if getattr(self, name) < low:
        raise ValueError(f"config.collapse.{name} must be >= {low}, got {getattr(self, name)}.")
    for name, low in (("expected_correct", 1), ("entropy_floor", 0)):
      v = getattr(self, name)
      if not (math.isfinite(v) and v >= low):
        raise ValueError(f"config.collapse.{name}={v}: must be a finite number >= {low}.")


@dataclasses.dataclass(frozen=True)
class Finding:
  """A signal that fired at `iteration`: what it saw, and the newest params version
  (iteration) last seen healthy."""

  signal: str
  iteration: int
  text: str
  healthy: int


def _initial(state: dict) -> dict:
  """The guard's state: the streaks, the rows and correct rows sampled before the
  current dead streak, the newest healthy params version, the signals already fired."""
  keys = ("dead_run", "low_entropy_run", "rows_before", "correct_before", "healthy")
  return {**dict.fromkeys(keys, 0), "fired": [], **state}


def observe(
  state: dict,
  record: dict,
  *,
  cfg: CollapseConfig,
  rows: int,
  solved_at_start: float,
  lag: int = 1,
) -> tuple[dict, Finding | None]:
  """(the guard's new state, the signal that fired at this record's iteration or None).

  state: the previous return's (a JSON dict; {} at the start of a run). record: one
  iteration's metrics line (all_zero_groups, grad_norm, accuracy, entropy and, at an
  evaluation, eval/greedy_accuracy). rows: rows sampled per iteration. solved_at_start:
  held-out problems the iteration-0 evaluation solved. lag: iterations between the
  params that sampled a batch and the iteration that trains it (1; 1 + max_staleness
  off-policy). Each signal fires once per run."""
  st = _initial(state)
  if cfg.action == "off":
    return st, None
  it = record["iteration"]
  if record.get("all_zero_groups") == 1.0 and record.get("grad_norm") == 0.0:
    st["dead_run"] += 1
  else:  # The streak's rows (none correct) and this batch's join the history.
    st["rows_before"] += rows * (st["dead_run"] + 1)
    st["correct_before"] += record.get("accuracy", 0.0) * rows
    st["dead_run"] = 0
    st["healthy"] = max(st["healthy"], it - lag)  # The params that sampled this batch.
  entropy = record.get("entropy")
  low = cfg.entropy_floor > 0 and entropy is not None and entropy < cfg.entropy_floor
  st["low_entropy_run"] = st["low_entropy_run"] + 1 if low else 0
  accuracy = record.get("eval/greedy_accuracy")
  if accuracy is not None and accuracy > 0:
    st["healthy"] = max(st["healthy"], it)
  for found in _signals(st, it, accuracy, entropy, cfg=cfg, rows=rows, solved=solved_at_start):
    if found.signal not in st["fired"]:
      return {**st, "fired": [*st["fired"], found.signal]}, found
  return st, None


def _signals(st: dict, it: int, accuracy, entropy, *, cfg, rows: int, solved: float):
  """The signals whose condition holds at iteration it."""
  n, dead = cfg.patience, st["dead_run"]
  rate = st["correct_before"] / st["rows_before"] if st["rows_before"] else 0.0
  enough = st["correct_before"] >= MIN_CORRECT
  if dead >= n and enough and rate * rows * dead >= cfg.expected_correct:
    yield Finding(
      "dead_groups",
      it,
      f"every group's rewards were all 0 with gradient norm 0 for {dead} iterations (since "
      f"iteration {it - dead + 1}), where the run's earlier success rate {rate:.3g} expected "
      f"{rate * rows * dead:.0f} correct rows",
      st["healthy"],
    )
  if accuracy == 0 and cfg.eval_min_solved and solved >= cfg.eval_min_solved:
    yield Finding(
      "eval_accuracy",
      it,
      f"greedy held-out accuracy fell to 0 from {solved:g} problems solved at iteration 0",
      st["healthy"],
    )
  if st["low_entropy_run"] >= n:
    yield Finding(
      "entropy",
      it,
      f"the policy's entropy stayed below {cfg.entropy_floor:g} for {n} iterations (now "
      f"{entropy:.3g})",
      st["healthy"],
    )


def message(found: Finding, *, checkpoint: str | None, action: str) -> str:
  """The one line a signal gives: what collapsed, since when, the last checkpoint before
  it (`checkpoint`: its path and iteration, or None when none is kept) and what to do."""
  before = (
    f"the last checkpoint before it is {checkpoint}"
    if checkpoint
    else "no checkpoint from before it is kept"
  )
  then = (
    "Lower the learning rate (or fix what moved the policy) and rerun from that "
    "checkpoint; config.collapse.action='warn' goes on instead."
    if action == "stop"
    else "Going on (config.collapse.action='warn')."
  )
  return (
    f"The policy collapsed at iteration {found.iteration} (collapse signal {found.signal}): "
    f"{found.text}; {before}. {then}"
  )
