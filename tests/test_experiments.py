"""Smoke runs of the benchmark scripts in experiments/ (their figures are printed, not tested)."""

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "experiments"))
import bench_overlap  # noqa: E402


def test_bench_overlap_reports_every_figure(monkeypatch):
  monkeypatch.chdir(pathlib.Path(__file__).resolve().parent.parent)
  r = bench_overlap.main(
    ["--prompts", "4", "--repeats", "1", "--workers", "0", "--verifier_ms", "1"]
  )
  assert r["rows"] == 4 * 8
  for k in ("forward_s", "score_s", "sequential_s", "overlapped_s"):
    assert r[k] > 0
  # The sleeping verifier alone takes rows × 1 ms.
  assert r["score_s"] >= r["rows"] * 1e-3
  assert np.isfinite(r["hidden_frac"])
