"""The collapse guard (`collapse.observe`) on hand-written metrics records: each signal
fires when its condition holds and only then (a weak run's zero streak, a small
held-out start, a low entropy with the floor off), once per run, with the newest healthy
params version; action "off" watches nothing."""

import pytest

from grpo_jax.infra import collapse

CFG = collapse.CollapseConfig()  # patience 5, expected_correct 8, eval_min_solved 8.


def _dead(it, **extra):
  return {"iteration": it, "all_zero_groups": 1.0, "grad_norm": 0.0, "accuracy": 0.0, **extra}


def _alive(it, accuracy, **extra):
  return {"iteration": it, "all_zero_groups": 0.5, "grad_norm": 0.3, "accuracy": accuracy, **extra}


def _feed(records, *, cfg=CFG, rows=16, solved=0, lag=1):
  """[(iteration, finding)] for the findings, and the last state."""
  state, found = {}, []
  for r in records:
    state, f = collapse.observe(state, r, cfg=cfg, rows=rows, solved_at_start=solved, lag=lag)
    if f is not None:
      found.append((r["iteration"], f))
  return found, state


def test_dead_groups_fires_after_patience_once_correct_rows_were_expected():
  # Iteration 1: 4 of 16 rows correct (p̂ = 1/4); dead from 2: after 5 dead iterations
  # the 80 rows should have held 20 correct ones.
  found, state = _feed([_alive(1, 0.25)] + [_dead(it) for it in range(2, 12)])
  ((it, f),) = found  # Once, although the streak goes on.
  assert (it, f.signal, f.healthy) == (6, "dead_groups", 0)  # θ_0 sampled iteration 1.
  assert "for 5 iterations (since iteration 2)" in f.text and "expected 20 correct" in f.text
  assert state["dead_run"] == 10 and state["fired"] == ["dead_groups"]
  # Off-policy with staleness 2: iteration 1's rows came from θ_{−2}, the newest healthy
  # params the guard can vouch for are then those of iteration 4 − 3 = 1.
  found, _ = _feed([_alive(1, 0.25), _alive(4, 0.25)] + [_dead(it) for it in range(5, 10)], lag=3)
  assert found[0][1].healthy == 1


def test_a_weak_runs_zero_streak_is_not_a_collapse():
  # 3 correct rows before the streak: p̂ rests on too few (a lucky batch) however long.
  found, _ = _feed([_alive(1, 3 / 16)] + [_dead(it) for it in range(2, 60)])
  assert found == []
  # 4 correct rows over 64: p̂ = 1/16 expects 1 per dead iteration, so 8 are needed.
  records = [_alive(it, 1 / 16) for it in range(1, 5)] + [_dead(it) for it in range(5, 20)]
  found, _ = _feed(records)
  assert [(it, f.signal) for it, f in found] == [(12, "dead_groups")]
  # A live batch ends the streak (its dead rows join the history, diluting p̂).
  records = [_alive(1, 0.5)] + [_dead(it) for it in range(2, 6)] + [_alive(6, 0.5), _dead(7)]
  found, state = _feed(records)
  assert found == [] and state["dead_run"] == 1
  assert (state["rows_before"], state["correct_before"]) == (16 * 6, 16)  # 1 + 4 dead + 1.


def test_eval_accuracy_fires_at_zero_only_after_a_start_that_solved_enough():
  records = [_alive(1, 0.5, **{"eval/greedy_accuracy": 0.25}), _alive(2, 0.5)]
  records.append(_alive(3, 0.1, **{"eval/greedy_accuracy": 0.0}))
  found, _ = _feed(records, solved=8)
  ((it, f),) = found
  # θ_3 (evaluated at 3) solves nothing; θ_2 sampled iteration 3's batch, some correct.
  assert (it, f.signal, f.healthy) == (3, "eval_accuracy", 2)
  assert _feed(records, solved=7)[0] == []
  off = collapse.CollapseConfig(eval_min_solved=0)
  assert _feed(records, solved=100, cfg=off)[0] == []


def test_entropy_fires_only_with_a_floor():
  records = [_alive(it, 0.9, entropy=1e-4) for it in range(1, 8)]
  assert _feed(records)[0] == []  # Floor 0: off (a converged policy is deterministic too).
  found, _ = _feed(records, cfg=collapse.CollapseConfig(entropy_floor=1e-3))
  assert [(it, f.signal) for it, f in found] == [(5, "entropy")]


def test_action_off_watches_nothing_and_the_message_names_the_checkpoint():
  records = [_alive(1, 0.5)] + [_dead(it) for it in range(2, 12)]
  assert _feed(records, cfg=collapse.CollapseConfig(action="off"))[0] == []
  ((_, f),) = _feed(records)[0]
  line = collapse.message(f, checkpoint="/w/checkpoints/0 (iteration 0)", action="stop")
  assert line.startswith("The policy collapsed at iteration 6 (collapse signal dead_groups): ")
  assert "; the last checkpoint before it is /w/checkpoints/0 (iteration 0). Lower" in line
  assert "\n" not in line
  line = collapse.message(f, checkpoint=None, action="warn")
  assert "no checkpoint from before it is kept. Going on" in line


@pytest.mark.parametrize(
  "options, match",
  [
    ({"action": "exit"}, "action='exit'; allowed: stop, warn, off"),
    ({"patience": 0}, "patience must be >= 1"),
    ({"expected_correct": 0.5}, "expected_correct=0.5: must be a finite number >= 1"),
    ({"entropy_floor": float("inf")}, "entropy_floor=inf: must be a finite"),
  ],
)
def test_bad_options_are_refused(options, match):
  with pytest.raises(ValueError, match=match):
    collapse.CollapseConfig(**options)
