"""Where unscorable rows fall: counts by cause, their correlation with wrong answers, and
the trainer's warning (`verdicts.unscorable_*`, `rollout.unscorable_metrics`)."""

import numpy as np
import pytest

from grpo_jax.trainer import rollout
from grpo_jax.verifiers import verdicts


def test_unscorable_rows_are_counted_by_cause():
  vocab = ("pass", "wrong", "sandbox")
  assert verdicts.unscorable_keys(vocab) == (
    "pass",
    "wrong",
    "sandbox",
    "timeout",
    "error",
    "other",
  )
  error_N = np.array([True, True, True, True, False, True])
  timeout_N = np.array([False, True, False, False, False, False])
  label_N = np.array(["sandbox", "", "", "odd", "sandbox", "wrong"], object)
  counts = verdicts.unscorable_counts(vocab, error_N, timeout_N, label_N)
  assert counts == [0, 1, 1, 1, 1, 1]  # wrong, sandbox, timeout, error, other.
  assert sum(counts) == error_N.sum()
  # A vocabulary that has "timeout" itself counts a labelled row there once.
  assert verdicts.unscorable_keys(("timeout",)) == ("timeout", "error", "other")


def test_the_failure_correlation_by_hand():
  # Groups of 4. A: all scorable, c = 1 1 0 0 (u 0, f 1/2). B: one unscorable, the rest
  # wrong (u 1/4, f 1). C: two unscorable, the rest wrong (u 1/2, f 1). r = √3/2.
  correct_N = np.array([1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], np.float32)
  scorable_N = np.array([1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0, 0], bool)
  r = verdicts.unscorable_failure_corr(correct_N, scorable_N, group_size=4)
  assert r == pytest.approx(np.sqrt(3) / 2, abs=1e-9)
  # Rewards that fail in every group alike carry no signal: nan, not 0.
  flat_N = np.array([1, 1, 1, 0] * 3, bool)
  assert np.isnan(verdicts.unscorable_failure_corr(correct_N, flat_N, group_size=4))
  # A group with no scorable row is left out; one group left is too few.
  one_N = np.array([1] * 4 + [0] * 8, bool)
  assert np.isnan(verdicts.unscorable_failure_corr(correct_N, one_N, group_size=4))


def _simulated(kappa: float, *, escape: bool, seed: int, groups: int = 256, size: int = 8):
  """Rows of groups with varied true pass rates; a share of rows is unscorable, either
  the wrong answers at rate kappa (escape) or any row at the same overall rate."""
  rng = np.random.default_rng(seed)
  p_G = rng.uniform(0.05, 0.95, groups)
  correct_GK = rng.random((groups, size)) < p_G[:, None]
  if escape:
    failed_GK = ~correct_GK & (rng.random((groups, size)) < kappa)
  else:
    failed_GK = rng.random((groups, size)) < kappa * (1 - p_G.mean())
  return correct_GK.ravel().astype(np.float32), ~failed_GK.ravel()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_correlation_sees_wrong_answers_escaping_and_not_random_failures(seed):
  escaping = verdicts.unscorable_failure_corr(
    *_simulated(0.5, escape=True, seed=seed), group_size=8
  )
  random = verdicts.unscorable_failure_corr(*_simulated(0.5, escape=False, seed=seed), group_size=8)
  assert escaping > 0.4, escaping
  assert abs(random) < 0.2, random


def _scores(correct, scorable, unscorable=()):
  n = len(correct)
  return rollout.Scores(
    np.asarray(correct, np.float32), np.zeros(n, np.float32), np.asarray(scorable, bool),
    0, 0, unscorable=unscorable,
  )  # fmt: skip


def test_unscorable_metrics_of_an_iteration():
  vocab = ("pass", "sandbox")  # Keys: pass, sandbox, timeout, error, other.
  a = _scores([1, 0, 0, 0], [1, 1, 0, 0], unscorable=(0, 1, 1, 0, 0))
  b = _scores([1, 1, 0, 0], [1, 1, 1, 1], unscorable=(0, 0, 0, 0, 0))
  got = rollout.unscorable_metrics(vocab, [a, b], group=2)
  assert got["reward/unscorable_frac"] == 2 / 8
  assert got["reward/unscorable/sandbox"] == got["reward/unscorable/timeout"] == 1 / 8
  assert got["reward/unscorable/pass"] == got["reward/unscorable/other"] == 0.0
  # Groups (1, 0) u 0 f 1/2; (0, 0) left out; (1, 1) u 0 f 0; (0, 0) u 0 f 1: no u variation.
  assert "reward/unscorable_failure_corr" not in got  # Undefined: not logged (never nan).
  parts = [v for k, v in got.items() if k.startswith("reward/unscorable/")]
  assert sum(parts) == got["reward/unscorable_frac"]


def test_the_warning_names_causes_and_the_correlation_only_past_its_limit():
  metrics = {
    "reward/unscorable_frac": 0.25,
    "reward/unscorable/sandbox": 0.05,
    "reward/unscorable/timeout": 0.20,
    "reward/unscorable/error": 0.0,
    "reward/unscorable_failure_corr": 0.61,
  }
  line = verdicts.unscorable_warning(metrics, limit=0.05)
  assert line.startswith("25.0% of this iteration's rows were unscorable")
  assert "timeout 20.0%, sandbox 5.0%" in line and "r = 0.61" in line and "error" not in line
  assert "\n" not in line
  assert verdicts.unscorable_warning(metrics, limit=0.25) == ""
  del metrics["reward/unscorable_failure_corr"]
  assert "undefined this iteration" in verdicts.unscorable_warning(metrics, limit=0.05)
  assert verdicts.unscorable_warning({}, limit=0.0) == ""
