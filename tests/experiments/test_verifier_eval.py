"""The verifier evaluation set (tests/fixtures/verifier) and a smoke run of its benchmark."""

import collections
import json
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
import bench_verifier  # noqa: E402

CATEGORIES = {
  "boxed",
  "text",
  "equation",
  "inequality_interval",
  "set_list",
  "units_percent",
  "decimal_separator",
  "latex_form",
  "matrix",
  "multi_box",
}


@pytest.fixture(scope="module")
def cases():
  return bench_verifier.load_cases()


def test_every_case_is_labelled_and_attributed(cases):
  assert 300 <= len(cases) <= 400
  assert len({c["id"] for c in cases}) == len(cases)
  assert len({(c["gold"], c["prediction"], c["input"]) for c in cases}) == len(cases)
  readme = (bench_verifier.CASES.parent / "README.md").read_text()
  for c in cases:
    assert set(c) <= {"id", "gold", "prediction", "input", "label", "category", "source", "note"}
    assert isinstance(c["gold"], str) and c["gold"].strip(), c["id"]
    assert isinstance(c["prediction"], str), c["id"]
    assert isinstance(c["label"], bool), c["id"]
    assert c["input"] in ("completion", "answer"), c["id"]
    assert c["category"] in CATEGORIES, c["id"]
    assert c["source"]["repo"].count("/") == 1 and c["source"]["path"], c["id"]
    assert c["source"]["repo"] in readme, c["id"]  # Every source is documented.
  labels = collections.Counter(c["label"] for c in cases)
  assert labels[False] >= 0.15 * len(cases)  # Negatives too, not only equivalences.
  assert {c["category"] for c in cases} == CATEGORIES


def test_an_answer_case_is_read_boxed():
  assert bench_verifier.completion_of({"input": "answer", "prediction": "1/2"}) == r"\boxed{1/2}"
  assert bench_verifier.completion_of({"input": "completion", "prediction": "x"}) == "x"


def test_quick_subset_covers_every_category_and_both_labels(cases):
  subset = bench_verifier.quick_subset(cases)
  assert len(subset) == 24
  assert {c["category"] for c in subset} == CATEGORIES
  assert {c["label"] for c in subset} == {True, False}


def test_bench_verifier_quick_writes_every_figure(tmp_path):
  # Figures and schema only: the values are the script's business, not a test's.
  result = bench_verifier.main(["--quick", "--out", str(tmp_path)])
  assert set(result["backends"]) == {"math_verify", "builtin"}
  saved = json.loads((tmp_path / "verifier.json").read_text())
  assert saved["backends"].keys() == result["backends"].keys()
  md = (tmp_path / "verifier.md").read_text()
  assert (tmp_path / "verifier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  for name, f in saved["backends"].items():
    assert f["n"] == 24 and f["positives"] + f["negatives"] == 24
    assert f["agree"] + f["false_accepts"] + f["false_rejects"] + f["unscorable"] == 24
    assert 0 <= f["agreement"] <= 1 and 0 <= f["fa_rate"] <= 1 and 0 <= f["fr_rate"] <= 1
    assert 0 < f["median_ms"] <= f["p95_ms"] and f["pool_wall_s"] > 0
    assert sum(g["n"] for g in f["by_category"].values()) == 24
    assert sum(g["n"] for g in f["by_source"].values()) == 24
    assert f"`{name}` | {100 * f['agreement']:.1f}%" in md
  assert saved["seeds"] == [] and saved["verdict"] in ("supports", "contradicts", "inconclusive")
  assert f"**Verdict: {saved['verdict']}.**" in md


def test_verdict_is_a_paired_interval_over_cases():
  cases = [{"id": f"c{i}"} for i in range(4)]

  def result(mv_wrong, builtin_wrong):
    wrong = {"math_verify": mv_wrong, "builtin": builtin_wrong}
    return {"backends": {b: {"disagreements": [{"id": i} for i in w]} for b, w in wrong.items()}}

  # d = (0, 0, 1, 1): mean 1/2, sd 0.57735, t_{0.975, 3} = 3.182446: half width 0.918693.
  got = bench_verifier.verdict(result([], ["c2", "c3"]), cases)
  assert got["agreement_gain"]["mean"] == 0.5
  np.testing.assert_allclose(
    got["agreement_gain"]["ci"], [0.5 - 0.918693, 0.5 + 0.918693], rtol=1e-5
  )
  assert got["verdict"] == "inconclusive"
  assert (
    bench_verifier.verdict(result([], ["c0", "c1", "c2", "c3"]), cases)["verdict"] == "supports"
  )
  assert (
    bench_verifier.verdict(result(["c0", "c1", "c2", "c3"], []), cases)["verdict"] == "contradicts"
  )
  one = {"backends": {"builtin": {"disagreements": []}}}
  assert bench_verifier.verdict(one, cases) is None
