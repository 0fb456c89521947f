"""Benchmark figures: maj@k's majority and ties, the bootstrap interval, every figure by
hand on a 3-problem example, the table, and the tasks' answer extraction."""

import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.trainer import eval_figures, heldout


@pytest.mark.parametrize(
  "answers, want",
  [
    (["7", "3", "7", None], 0),  # 7 twice.
    (["3", "7", "7", "3"], 0),  # A tie: 3 is seen first.
    (["5", None, "6"], 0),
    ([None, "6", "5", "5"], 2),  # 5 twice, first at index 2.
    ([None, None], None),  # No answer: no vote.
  ],
)
def test_majority_and_its_ties(answers, want):
  assert eval_figures.majority(answers) == want


def test_maj_at_k_by_hand():
  correct = [[1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 1, 0, 1]]
  answers = [
    ["7", "3", "7", "4"],  # Majority 7 (right).
    ["2", "9", "9", "5"],  # Majority 9 (right), though 2 of 4 samples are wrong.
    [None, None, None, None],  # No answer: wrong.
    ["1", "8", "1", "8"],  # Tie 1 vs 8: 1 first, and 1 is wrong.
  ]
  np.testing.assert_array_equal(eval_figures.maj_at_k(correct, answers), [1, 1, 0, 0])


def test_the_interval_is_a_seeded_percentile_bootstrap():
  mean, ci = heldout.interval([1.0] * 30 + [0.0] * 70)
  # Normal approximation: 0.3 ± 1.96·√(0.3·0.7/100) = [0.210, 0.390].
  assert mean == pytest.approx(0.3)
  assert ci[0] == pytest.approx(0.21, abs=0.015) and ci[1] == pytest.approx(0.39, abs=0.015)
  assert heldout.interval([1.0] * 30 + [0.0] * 70) == (mean, ci)  # Reproducible.
  assert heldout.interval([0.5, 0.5, 0.5]) == (0.5, [0.5, 0.5])
  assert heldout.interval([0.25]) == (0.25, [0.25, 0.25])
  with pytest.raises(ValueError, match=r"non-empty \[P\] array"):
    heldout.interval([])


def _cluster_interval(values_P, keys_P, *, resamples, seed):
  """The alternative heldout.interval's docstring rejects: the distinct problems
  resampled, each with all its copies."""
  _, group_P = np.unique(keys_P, return_inverse=True)
  sum_D, count_D = np.bincount(group_P, weights=values_P), np.bincount(group_P)
  idx = np.random.default_rng(seed).integers(0, sum_D.size, (resamples, sum_D.size))
  means = sum_D[idx].sum(axis=1) / count_D[idx].sum(axis=1)
  return np.percentile(means, [2.5, 97.5])


def test_the_interval_stays_right_when_a_drawn_set_repeats_problems():
  """128 draws from a 150-problem population (draw probabilities ~ Dirichlet(2), 40% of
  problems solved), 400 times: about 40% of each set's draws repeat a problem. The
  bootstrap over draws covers the population's accuracy 95% of the time and its width
  matches the estimate's spread; resampling distinct problems with their copies over-covers
  (heldout.interval's docstring: 95.3% against 99.5%, 48% wider)."""
  rng = np.random.default_rng(0)
  K, P, reps = 150, 128, 400
  prob_K = rng.dirichlet(np.full(K, 2.0))
  solved_K = (rng.random(K) < 0.4).astype(float)
  truth = float(prob_K @ solved_K)
  means, width, cluster_width, covered, cluster_covered, distinct = [], [], [], 0, 0, []
  for r in range(reps):
    k_P = rng.choice(K, P, p=prob_K)
    mean, (low, high) = heldout.interval(solved_K[k_P], resamples=500, seed=r)
    c_low, c_high = _cluster_interval(solved_K[k_P], k_P, resamples=500, seed=r)
    means.append(mean)
    width.append(high - low)
    cluster_width.append(c_high - c_low)
    covered += low <= truth <= high
    cluster_covered += c_low <= truth <= c_high
    distinct.append(len(set(k_P)))
  assert 0.5 < np.mean(distinct) / P < 0.7  # Repeats are common.
  sd = float(np.std(means))
  # Bands, not this stream's figures (95.3%, 99.5%, 1.48×): coverage over 400 reps has a
  # Monte-Carlo standard error of about 1.1 points.
  assert 0.93 <= covered / reps <= 0.97
  assert np.mean(width) / 3.92 == pytest.approx(sd, rel=0.1)
  assert cluster_covered / reps >= 0.98
  assert np.mean(cluster_width) / np.mean(width) > 1.3


def test_every_figure_by_hand():
  """3 problems × 4 samples. Problem 0: 2 of 4 right; 1: 4 of 4; 2: 0 of 4."""
  correct = np.array([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], float)
  answers = [["7", "3", "7", "3"], ["5", "5", "5", "5"], ["1", None, "2", "2"]]
  figs = eval_figures.figures(
    greedy_P=[1.0, 1.0, 0.0],
    format_P=[1.0, 1.0, 1.0],
    scorable_P=[True, True, False],
    correct_PK=correct,
    answers_PK=answers,
    scorable_PK=[[True] * 4, [True] * 4, [True, True, False, False]],
  )
  assert list(figs) == [
    "greedy", "format_rate", "unscorable_greedy", "avg@4", "pass@1", "pass@2", "pass@4",
    "maj@4", "unscorable_sampled",
  ]  # fmt: skip
  value = {k: v["value"] for k, v in figs.items()}
  assert value["greedy"] == pytest.approx(2 / 3)
  assert value["unscorable_greedy"] == pytest.approx(1 / 3)
  assert value["avg@4"] == pytest.approx((0.5 + 1 + 0) / 3)
  assert value["pass@1"] == pytest.approx(value["avg@4"])
  # pass@2 of problem 0: 1 − C(2,2)/C(4,2) = 5/6; problem 1: 1; problem 2: 0.
  assert value["pass@2"] == pytest.approx((5 / 6 + 1 + 0) / 3)
  assert value["pass@4"] == pytest.approx(2 / 3)
  # maj@4: problem 0 ties 7/3, 7 first (right); problem 1 right; problem 2 majority "2"
  # (its first sample at index 2, wrong).
  assert value["maj@4"] == pytest.approx(2 / 3)
  assert value["unscorable_sampled"] == pytest.approx((0 + 0 + 0.5) / 3)
  for fig in figs.values():
    assert fig["ci"][0] <= fig["value"] <= fig["ci"][1]
  assert set(eval_figures.figures(greedy_P=[1.0], format_P=[1.0], scorable_P=[True])) == {
    "greedy", "format_rate", "unscorable_greedy",
  }  # fmt: skip


def test_the_table_shows_percent_and_intervals():
  figs = {"greedy": {"value": 0.5, "ci": [0.25, 0.75]}}
  text = eval_figures.table({"a": figs, "b": {**figs, "maj@8": {"value": 1.0, "ci": [1.0, 1.0]}}})
  assert text.splitlines() == [
    "| benchmark | greedy | maj@8 |",
    "|---|---|---|",
    "| a | 50.0 [25.0, 75.0] | - |",
    "| b | 50.0 [25.0, 75.0] | 100.0 [100.0, 100.0] |",
  ]


@pytest.mark.parametrize(
  "task, completion, want",
  [
    ("arithmetic", "A:07.", "7"),
    ("arithmetic", "A:-3.", "-3"),
    ("arithmetic", "A:3", None),  # No template: no answer.
    ("long_addition", "1+2+0=3;A:13.", "13"),
    ("long_addition", "1+2+0=3;", None),
    ("countdown", "A:(1+2)*3.", None),  # Expressions are not votes.
  ],
)
def test_tasks_extract_their_answers(task, completion, want):
  assert tasks.get(task).extract_answer(completion) == want


def test_math_answers_are_math_verifys_extraction_without_spaces():
  task = tasks.get("word_problems", tokenizer_dir="unused")  # Read only when encoding.
  assert task.extract_answer("So x = 3. The answer is \\boxed{1 / 2}.") == "1/2"
  assert task.extract_answer("#### 42") == "42"
  assert task.extract_answer("no answer here") is None
