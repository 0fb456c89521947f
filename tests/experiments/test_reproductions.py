"""experiments/reproduce.py and evidence.py: the statistics by hand, the verdict rules, the result schema of a
--quick run, and the docs' claims table in sync with the committed JSON."""

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests import subproc

ROOT = pathlib.Path(__file__).resolve().parents[2]
import claims  # noqa: E402
import evidence  # noqa: E402
import reproduce  # noqa: E402


def test_summarize_is_a_t_interval_by_hand():
  # mean 2, sd 1 (ddof 1), n = 3: t_{0.975, 2} = 4.302653, half width 4.302653 / √3.
  got = evidence.summarize([1.0, 2.0, 3.0])
  half = 4.302653 / math.sqrt(3)
  assert got["mean"] == 2.0 and got["n"] == 3
  assert got["ci"] == pytest.approx([2.0 - half, 2.0 + half], rel=1e-6)
  # Missing and non-finite values stay in place as None and leave the statistics;
  # [1, 3]: sd √2, n = 2, t_{0.975, 1} = 12.7062047, half width 12.7062047·√2/√2.
  got = evidence.summarize([1.0, None, math.nan, 3.0])
  assert got["per_seed"] == [1.0, None, None, 3.0] and got["n"] == 2
  assert got["ci"] == pytest.approx([2.0 - 12.7062047, 2.0 + 12.7062047], rel=1e-6)
  # One value: a mean and no interval (None, written as JSON null); none: no mean.
  assert evidence.summarize([5.0])["ci"] == [None, None]
  assert evidence.summarize([None])["mean"] is None


@pytest.mark.parametrize(
  "ci, above0, within, verdict",
  [
    ([0.1, 0.2], "yes", "yes", "supports"),
    ([-0.2, -0.1], "no", "yes", "contradicts"),
    ([-0.1, 0.1], "unclear", "yes", "inconclusive"),
    ([0.3, 0.5], "yes", "no", "supports"),
    ([0.1, 0.4], "yes", "unclear", "supports"),
  ],
)
def test_rules_on_intervals(ci, above0, within, verdict):
  fig = {"mean": sum(ci) / 2, "ci": ci}
  assert evidence.above(fig, 0.0) == above0
  assert evidence.within(fig, -0.25, 0.25) == within
  assert evidence.combine([above0]) == verdict


def test_combine_needs_every_part():
  assert evidence.combine(["yes", "yes"]) == "supports"
  assert evidence.combine(["yes", "unclear"]) == "inconclusive"
  assert evidence.combine(["yes", "no", "unclear"]) == "contradicts"
  assert evidence.combine([]) == "inconclusive"


def test_t_test_p_values_by_hand():
  """One-sample t with 2 degrees of freedom has sf(t) = 1/2 − t/(2√(2 + t²)), so the two-sided
  p is 1 − t/√(2 + t²). [1, 2, 3] against 0: t = 2√3, p = 1 − 2√3/√14."""
  fig = evidence.summarize([1.0, 2.0, 3.0])
  p = evidence.part_p(fig, "above", 0.0)
  assert p["yes"] == pytest.approx(1 - 2 * math.sqrt(3) / math.sqrt(14), rel=1e-6)
  assert p["no"] == 1.0  # The data lean the other way.
  assert evidence.part_p(fig, "below", 0.0) == {"yes": 1.0, "no": p["yes"]}
  # Inside [0, 4]: both ends must hold (the larger p); against 0 and 4, t = ±2√3.
  assert evidence.part_p(fig, "within", 0.0, 4.0)["yes"] == pytest.approx(p["yes"], rel=1e-6)
  # The CI excludes the threshold exactly when p < 0.05.
  assert (evidence.above(fig, 0.0) == "yes") == (p["yes"] < 0.05)


def test_holm_keeps_a_verdict_only_past_its_step():
  """m = 3: thresholds 0.05/3, 0.05/2, 0.05 in p order; the step-down stops at the first
  miss (0.03 > 0.025), so the third is not kept either though 0.04 < 0.05."""
  pv = {"a": {"supports": 0.01}, "b": {"contradicts": 0.03}, "c": {"supports": 0.04}}
  verdicts = {"a": "supports", "b": "contradicts", "c": "supports"}
  got = evidence.holm(verdicts, pv)
  assert got == {"a": "supports", "b": "inconclusive", "c": "inconclusive"}
  pv["b"]["contradicts"] = 0.02
  assert evidence.holm(verdicts, pv) == verdicts


def test_seeds_for_power_by_the_textbook_value():
  """Effect = 1 sd: a two-sided one-sample t test at α = 0.05 needs 10 subjects for 80%
  power (noncentral t); half the effect needs more, the same data twice the same."""
  fig = evidence.summarize([0.0, 1.0, 2.0])  # mean 1, sd 1.
  assert evidence.seeds_for_power(fig, "above", 0.0) == 10
  assert evidence.seeds_for_power(fig, "above", 0.5) > 30
  assert evidence.seeds_for_power(fig, "within", -5.0, 0.0) == 10  # The nearer bound.


def test_rule_parts_reproduce_every_committed_verdict():
  """claims.Claim.tests (read by the Holm adjustment, the power column and extensions)
  restate each rule: recomputed from the committed figures they give the committed verdict."""
  for c in claims.CLAIMS:
    path = reproduce.DEFAULT_OUT / f"{c.key}.json"
    if not path.exists():
      continue
    r = json.loads(path.read_text())
    assert c.tests, c.key
    assert evidence.verdict_from_tests(r["figures"], c.tests) == r["verdict"], c.key


def test_every_claim_is_numbered_sourced_and_ruled():
  assert [c.label for c in claims.CLAIMS if c.number == 7] == ["7", "7b"]
  numbers = [c.number for c in claims.CLAIMS]
  assert sorted(set(numbers)) == list(range(1, 12)) and numbers == sorted(numbers)
  assert len({c.key for c in claims.CLAIMS}) == len(claims.CLAIMS)
  for c in claims.CLAIMS:
    assert c.source and c.statement and c.rule and c.tests, c.key
    # Claims added after the first runs fix their own verdict seeds, apart from tuning's.
    assert not set(c.seeds) & set(claims.TUNING_SEEDS), c.key
    # Something to analyse: trained arms or a measurement.
    assert c.analyse is not None and (c.arms or c.measure is not None), c.key
  names = [a.name for c in claims.CLAIMS for a in c.arms]
  keys = {a.name: a.key(iterations=60, quick=False) for c in claims.CLAIMS for a in c.arms}
  assert len(set(keys.values())) == len(set(names))  # One cache entry per distinct arm.


def test_quick_run_writes_the_result_schema(tmp_path):
  """The pipeline end to end on two claims that share an arm (its verdicts mean nothing)."""
  out, work = tmp_path / "out", tmp_path / "work"
  proc = subprocess.run(
    [
      sys.executable,
      "experiments/reproduce.py",
      "--quick",
      "--claims",
      "flips,template_shift",
      "--out",
      str(out),
      "--workdir",
      str(work),
    ],
    cwd=ROOT,
    env=subproc.child_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert json.loads(proc.stdout.strip().splitlines()[-1]).keys() == {"flips", "template_shift"}
  # The shared GRPO arm trained once per seed.
  assert sorted(p.name for p in work.iterdir())[0].startswith("grpo-")
  assert len(list(work.glob("grpo-*/seed*"))) == 2
  for key in ("flips", "template_shift"):
    r = json.loads((out / f"{key}.json").read_text())
    assert r["verdict"] in reproduce.VERDICTS and r["reason"] and r["rule"]
    assert r["seeds"] == [0, 1] and r["quick"] is True
    assert r["headline"] in r["figures"]
    for name, fig in r["figures"].items():
      assert set(fig) >= {"label", "per_seed", "mean", "ci", "n"}, name
      assert len(fig["per_seed"]) == 2 and len(fig["ci"]) == 2  # One entry per seed.
      assert fig["n"] == sum(x is not None for x in fig["per_seed"])
    md = (out / f"{key}.md").read_text()
    assert f"**Verdict: {r['verdict']}**" in md
    # Every figure of the markdown is in the JSON.
    for name in r["figures"]:
      assert f"`{name}`" in md
    assert (out / f"{key}.png").stat().st_size > 1000
  index = (out / "index.md").read_text()
  assert index.count("| not measured yet |") == len(claims.CLAIMS) - 2


def test_ibpo_variance_measures_every_arm_on_the_trainer_path():
  """experiments/ibpo_variance.py at smoke size: every arm gives a finite variance and
  signal, the trie arm reuses GRPO G = 10's rollouts and the branch arm G = 8's (the same
  tokens), and the branch arm generated tokens of its counterfactuals too."""
  import ibpo_variance  # noqa: PLC0415

  got = ibpo_variance.measure(0, prompts=2, groups=3, quick=True)
  assert set(got) == set(ibpo_variance.ARMS)
  for arm, r in got.items():
    assert np.isfinite(r["variance"]) and r["variance"] >= 0 and np.isfinite(r["signal"]), arm
    assert r["tokens_per_group"] > 0
  assert got["trie"]["tokens_per_group"] == got["grpo"]["tokens_per_group"]
  assert got["branch"]["tokens_per_group"] > got["grpo8"]["tokens_per_group"]
  assert got["branch"]["rows_per_group"] == got["grpo8"]["rows_per_group"] == 8
  assert "ibpo/kept_pair_frac" in got["branch"] and "ibpo/kept_pair_frac" not in got["trie"]
  for analyse in (claims.analyse_ibpo_loo_variance, claims.analyse_ibpo_trie_variance):
    outcome = analyse([got, got])
    assert outcome.verdict in reproduce.VERDICTS and outcome.headline in outcome.figures


def test_readme_table_is_generated_from_the_committed_json():
  page = reproduce.TABLE_PAGE.read_text()
  start = page.index(reproduce.TABLE_START) + len(reproduce.TABLE_START)
  section = page[start : page.index(reproduce.TABLE_END)]
  prefix = reproduce.DEFAULT_OUT.relative_to(ROOT).as_posix() + "/"
  assert section == "\n" + reproduce.table(reproduce.DEFAULT_OUT, link_prefix=prefix)
  committed = list(reproduce.DEFAULT_OUT.glob("*.json"))
  assert committed, "no committed reproduction results"
  for path in committed:
    r = json.loads(path.read_text())
    assert not r["quick"] and len(r["seeds"]) >= 3, path.name
    assert (path.with_suffix(".md")).exists() and (path.with_suffix(".png")).exists()


def test_claim_10g_tunes_on_its_own_seeds_and_judges_the_paired_ratio(tmp_path, monkeypatch):
  """The paired grid and claim 10g on made-up measurements: GRPO and every point come from
  one sampling per seed (`ibpo_variance.measure_paired`), the best mean ratio wins, and the
  verdict reads the per-seed ratio SNR(IBPO) ÷ SNR(GRPO) on the same rows."""
  import claims_ibpo  # noqa: PLC0415
  import ibpo_variance  # noqa: PLC0415

  calls = []

  def fake(seed, *, points, prompts, groups, quick):
    calls.append((seed, tuple(points)))
    snr = {name: 1.0 + 0.1 * lam * (shrink == 64.0) for name, (lam, shrink, _) in points.items()}
    return {name: {"snr": v, "variance": 1.0 / v, "signal": 1.0, "pass_rate": 0.4} for name, v in snr.items()}  # fmt: skip

  monkeypatch.setattr(ibpo_variance, "measure_paired", fake)
  tuned = claims.tune_ibpo_paired(root=tmp_path, quick=True)
  assert [s for s, _ in calls] == list(claims.TUNING_SEEDS)  # Never a verdict seed.
  assert tuned["best"] == "k64_l1" and tuned["best_params"] == [1.0, 64.0, 1.0]
  assert tuned["table"]["k64_l1"]["snr_ratio"] == pytest.approx([1.1, 1.1, 1.1])
  claims.tune_ibpo_paired(root=tmp_path, quick=True)  # Cached: no new measurement.
  assert len(calls) == 3
  path = tmp_path / "ibpo_paired.json"
  path.write_text(json.dumps(tuned))
  monkeypatch.setattr(claims_ibpo, "PAIRED_TUNING", path)  # Read there (claims re-exports it).
  per_seed = claims.measure_ibpo_paired_variance(seeds=(30, 31, 32), root=tmp_path, quick=True)
  assert calls[-1] == (32, ("grpo", "ibpo"))
  outcome = claims.analyse_ibpo_paired_variance(per_seed)
  assert outcome.figures["snr_ratio_paired"]["per_seed"] == pytest.approx([1.1] * 3)
  assert outcome.verdict == "supports"
  assert "λ = 1, κ = 64" in outcome.reason


def test_claim_10h_judges_the_drawdown_gap_of_made_up_curves():
  """Claim 10h on made-up runs: per run, the largest fall of the held-out accuracy curve
  below its best so far (by hand), paired by seed; IBPO's arm is configs/ibpo.py:tiny's
  estimator and plan, every 5 iterations, on seeds apart from every tuning seed."""
  import claims_ibpo  # noqa: PLC0415

  from grpo_jax.infra import config_lib  # noqa: PLC0415

  assert claims_ibpo.drawdown([0.5, 0.6, 0.55, 0.7, 0.4, 0.8]) == pytest.approx(0.3)
  assert claims_ibpo.drawdown([0.1, 0.2, 0.2]) == 0.0 and claims_ibpo.drawdown([]) is None

  def run(curve, grad_norms=(1.0, 2.0)):
    evals = [{"iteration": 5 * i, "eval/greedy_accuracy": a} for i, a in enumerate(curve)]
    return evals + [{"phase": "rl", "grad_norm": g} for g in grad_norms]

  grpo = [run([0.5, 0.7, 0.5, 0.8]), run([0.4, 0.6, 0.3, 0.7]), run([0.5, 0.5, 0.6, 0.6])]
  ibpo = [run([0.5, 0.7, 0.6, 0.8]), run([0.4, 0.6, 0.4, 0.7]), run([0.5, 0.5, 0.6, 0.6])]
  arms = claims_ibpo.STABILITY_ARMS
  out = claims.analyse_ibpo_stability({arms["grpo"].name: grpo, arms["ibpo"].name: ibpo})
  assert out.figures["drawdown_grpo"]["per_seed"] == pytest.approx([0.2, 0.3, 0.0])
  assert out.figures["drawdown_gap"]["per_seed"] == pytest.approx([-0.1, -0.1, 0.0])
  assert out.figures["regressions_grpo"]["per_seed"] == [1, 1, 0]
  assert out.verdict == "inconclusive"  # Mean −0.067, its CI across 0 with three seeds.
  ibpo[2] = run([0.5, 0.45, 0.6, 0.6])  # Now IBPO falls 0.1 less on every seed.
  grpo[2] = run([0.5, 0.35, 0.6, 0.6])
  out = claims.analyse_ibpo_stability({arms["grpo"].name: grpo, arms["ibpo"].name: ibpo})
  assert out.verdict == "supports"
  claim = next(c for c in claims.CLAIMS if c.key == "ibpo_stability")
  assert claim.label == "10h" and claim.seeds == claims_ibpo.STABILITY_SEEDS
  shipped = config_lib.load(str(ROOT / "configs" / "ibpo.py") + ":tiny")
  got = dict(arms["ibpo"].overrides)
  assert got["rl.advantage_hyper.ibpo_lambda"] == shipped.rl.advantage_hyper.ibpo_lambda
  assert got["rl.advantage_hyper.ibpo_tau"] == shipped.rl.advantage_hyper.ibpo_tau
  assert got["rl.advantage_options"] == dict(shipped.rl.advantage_options)
  for key in ("per_group", "per_rollout", "branch_from", "cut"):
    assert got[f"counterfactual.{key}"] == shipped.counterfactual[key], key
