"""The diagnostics in the training loop, and smoke runs of experiments/diagnose.py and
experiments/bench_diagnostics.py (their figures are printed, not tested).

Every run here uses diagnose.py's --quick config (or a variant that keeps the trainer's
compiled functions), so one compile serves the whole module."""

import contextlib
import io
import json
import math
import pathlib

import pytest

from grpo_jax.infra import logs, metrics
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parents[2]
import bench_diagnostics  # noqa: E402
import diagnose  # noqa: E402
import runs  # noqa: E402
import tb_events  # noqa: E402

# Keys that are finite on every diagnostic iteration (others may be NaN: an empty cell).
_FINITE = (
  "flip/all/all/boosted",
  "flip/all/all/count",
  "cancel/gross",
  "coupling/fit/corr",
  "coupling/head_update_fit/corr",
  "tax/learning_tax",
  "drift/solution_logp_token",
  "drift/entropy",
  "drift/kl_init",
  "drift/length_slope",
  "rank/rollout_grads/last_block/stable_rank",
  "sparsity/hoyer",
  "sparsity/minibatch_grad_var",
  "sparsity/minibatch_grad_snr",
  "time/diagnostics",
)


def _is_diag(key):
  return key.split("/")[0] in metrics.DIAGNOSTICS_ROOTS or key == "time/diagnostics"


def _quick_config(**diagnostics):
  c = diagnose.get_config(iterations=4, every=2, quick=True)
  c.update(checkpoint_every=2)
  c.diagnostics.update(**diagnostics)
  return c


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
  """diagnose.py --quick: (workdir, returned result, stdout)."""
  workdir = tmp_path_factory.mktemp("diagnose")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    result = diagnose.main(["--quick", f"--workdir={workdir}"])
  return workdir, result, out.getvalue()


def test_diagnose_quick_writes_the_report_and_plots(quick):
  workdir, result, stdout = quick
  assert json.loads(stdout.strip().splitlines()[-1]) == json.loads(json.dumps(result))
  text = (workdir / "report.md").read_text()
  for section in ("## Token flips", "## Cancellation", "## Coupling", "## Ranks", "## Drift"):
    assert section in text
  for name in ("flips", "coupling", "spectra", "drift"):
    png = workdir / f"{name}.png"
    assert png.read_bytes()[:4] == b"\x89PNG", name
  assert result["diagnostic_iterations"] == [2, 4]
  assert 0 <= result["flip_boosted_pos"] <= 1 and 0 <= result["flip_boosted_neg"] <= 1
  assert set(result["residual_ratio"]) == {"token_mean", *diagnose.COMPARE}


def test_diagnostics_join_the_metrics_of_every_nth_iteration(quick):
  workdir = quick[0]
  lines = runs.lines(workdir)
  assert [x["iteration"] for x in lines] == [0, 1, 2, 3, 4]
  for line in lines:
    for name in line:
      metrics.definition(name)  # Every logged key is documented.
    has = any(_is_diag(k) for k in line)
    assert has == (line["iteration"] in (2, 4)), line["iteration"]
  for it in (2, 4):
    line = lines[it]
    for key in _FINITE:
      assert math.isfinite(line[key]), (it, key)
    for key, v in line.items():  # NaN ("nan": an empty cell) is allowed, infinities are not.
      assert v not in ("inf", "-inf"), key
    assert line["flip/all/all/count"] > 0 and line["drift/kl_init"] > 0
    assert "value/all/value_gap" in line and "cancel/constant_norm/residual_ratio" in line
  tb = set(tb_events.scalars(workdir / "tb"))
  assert (2, "flip/pos/all/boosted") in tb and (3, "flip/pos/all/boosted") not in tb
  d = workdir / "diagnostics"
  assert (d / "probe.npz").exists() and (d / "init_params").is_dir()
  assert [r["iteration"] for r in logs.read_jsonl(d / "spectra.jsonl")] == [2, 4]


def test_resume_reproduces_the_diagnostics(tmp_path):
  """Fixed credit probe: an uninterrupted run vs one that crashes after iteration 3 and
  resumes from the checkpoint at 2 (probe.npz and the saved initial policy are read back)."""
  config = _quick_config(credit_batch="fixed")
  ref = tmp_path / "ref"
  train.run(config, ref, log=lambda _: None)

  def crash(it, record):
    if it == 3:
      raise RuntimeError("simulated crash")

  got = tmp_path / "resumed"
  with pytest.raises(RuntimeError, match="simulated crash"):
    train.run(config, got, log=lambda _: None, on_iteration=crash)
  out = []
  train.run(config, got, log=out.append)
  assert any("resumed from" in x and "iteration 2" in x for x in out)
  strip = runs.untimed
  want, lines = runs.lines(ref), runs.lines(got)
  assert [x["iteration"] for x in lines] == [0, 1, 2, 3, 4]
  assert "flip/all/all/boosted" in lines[4]
  assert [strip(x) for x in lines] == [strip(x) for x in want]
  spectra = logs.read_jsonl(got / "diagnostics" / "spectra.jsonl")
  assert [r["iteration"] for r in spectra] == [2, 4]  # The crashed session's 4 is gone.


def test_off_emits_no_diagnostics(tmp_path):
  config = _quick_config(every=0)
  config.iterations = 2
  train.run(config, tmp_path, log=lambda _: None)
  lines = runs.lines(tmp_path)
  assert len(lines) == 3 and not any(_is_diag(k) for line in lines for k in line)
  assert not (tmp_path / "diagnostics").exists()


def test_bench_diagnostics_quick_reports_every_figure(capsys):
  result = bench_diagnostics.main(["--quick"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == json.loads(
    json.dumps(result)
  )
  for k in ("off_iteration_s", "on_iteration_s", "ratio", "diag_call_s", "diag_first_call_s"):
    assert result[k] > 0, k
  assert result["workload"]["every"] == 2 and result["workload"]["quick"]
