"""Trackers (config.logging): W&B offline and MLflow on a local file store receive every
record, the config once and the metric definitions; a resumed run continues the same
tracker runs; a missing package, an unreachable server or a tracker failing mid-run is one
warning and the run goes on."""

import json
import socket
import sys

import numpy as np
import pytest
import runs  # tests/ is on sys.path (conftest).
from mlflow import tracking as mlflow_tracking

from grpo_jax.infra import config_lib, logs, metrics, trackers
from grpo_jax.trainer import build


def test_mlflow_names_by_hand():
  assert trackers.mlflow_name("eval/pass@8") == "eval/pass_at_8"
  assert trackers.mlflow_name("time/sample") == "time/sample"
  assert trackers.mlflow_name("dynamic/dropped groups") == "dynamic/dropped groups"
  assert trackers.mlflow_name("flip/Δlogp<0") == "flip/_logp_0"


def test_numbers_and_flatten():
  record = {"iteration": 3, "phase": "rl", "ok": True, "x": np.float32(0.5), "n": None}
  assert trackers.numbers(record) == {"iteration": 3.0, "x": 0.5}
  flat = trackers.flatten({"rl": {"advantage": "grpo", "clip": [0.2, 0.28]}, "seed": 0})
  assert flat == {"rl.advantage": "grpo", "rl.clip": "[0.2, 0.28]", "seed": "0"}


@pytest.mark.parametrize(
  "logging, message",
  [
    (dict(trackers=("jsonl", "neptune")), r"unknown \['neptune'\] or repeated; allowed: jsonl"),
    (dict(trackers=("jsonl", "wandb", "wandb")), "or repeated"),
    (dict(trackers=("tensorboard",)), "leaves out 'jsonl'"),
    (dict(wandb_mode="cloud"), "wandb_mode='cloud'; allowed"),
    (dict(timeout_s=0), r"timeout_s=0(\.0)?: must be a number > 0"),
    (dict(trakers=("jsonl",)), "unknown TrackingConfig keys"),
  ],
)
def test_bad_logging_options_are_one_clear_error(logging, message):
  c = config_lib.load("configs/arithmetic.py:tiny")
  with c.unlocked():
    c.logging = {**c.logging.to_dict(), **logging}
  with pytest.raises(config_lib.ConfigError, match=message) as e:
    build.build(c)
  assert "\n" not in str(e.value)


def _run_config(tmp_path, *, trackers_=("jsonl", "tensorboard", "wandb", "mlflow")):
  c = runs.small_arithmetic()
  c.update(warmstart_steps=20, iterations=2, prompts_per_step=4)
  c.update(eval_every=1, eval_size=8, eval_samples=2, checkpoint_every=1)
  c.update(reward_workers=0, progress=False)
  c.logging.update(
    trackers=trackers_,
    project="grpo_jax_test",
    wandb_mode="offline",
    mlflow_tracking_uri=(tmp_path / "mlruns").as_uri(),
  )
  return c


@pytest.fixture
def file_stores(monkeypatch):
  """W&B offline, MLflow's file store allowed (MLflow 3 refuses it unless asked)."""
  monkeypatch.setenv("WANDB_MODE", "offline")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def test_wandb_and_mlflow_receive_the_run_and_a_resume_continues_the_same_runs(
  tmp_path, file_stores
):
  """A 2-iteration run stopped after logging iteration 1 (before its checkpoint) and
  resumed from checkpoint 0: W&B's offline files (read as W&B writes them) and MLflow's
  file store (read through its client) hold every metrics.jsonl record under one run id
  each across both sessions (iteration 1 twice, the resumed session's last), the config,
  the held-out samples and the metric definitions; MLflow's names map "@" to "_at_"."""
  import wandb_files  # noqa: PLC0415

  from grpo_jax.trainer import train  # noqa: PLC0415

  workdir = tmp_path / "run"

  class Stop(Exception):
    pass

  def stop(it, record):
    if it == 1:
      raise Stop

  with pytest.raises(Stop):
    train.run(_run_config(tmp_path), workdir, log=lambda _: None, on_iteration=stop)
  messages = []
  train.run(_run_config(tmp_path), workdir, log=messages.append)
  assert not [m for m in messages if "warning" in m], messages
  lines = runs.lines(workdir)
  assert [r["iteration"] for r in lines] == [0, 1, 2]
  ids = json.loads((workdir / trackers.IDS).read_text())
  assert set(ids) == {"wandb", "mlflow"}

  # W&B: two sessions (offline run directories), one run id, every record.
  files = sorted(workdir.glob("wandb/offline-run-*/run-*.wandb"))
  assert len(files) == 2 and {wandb_files.run_id(f) for f in files} == {ids["wandb"]}
  rows = [r for f in files for r in wandb_files.history(f)]
  tables = [r for r in rows if "samples/_type" in r]  # The held-out samples, as tables.
  # The stopped session logged iteration 1 after its last checkpoint (0): the resumed
  # one logs it again, so trackers hold it twice (metrics.jsonl once, cut back).
  assert [(r["iteration"], r["samples/_type"]) for r in tables] == [
    (i, "table-file") for i in (0, 1, 1, 2)
  ]
  rows = [r for r in rows if r not in tables]
  assert [r["iteration"] for r in rows] == [0, 1, 1, 2]
  by_iteration = {r["iteration"]: r for r in rows}  # The later session's, where twice.
  for line in lines:
    got = by_iteration[line["iteration"]]
    for k, v in trackers.numbers(line).items():
      assert got[k] == pytest.approx(v, rel=1e-6), k
  cfg = wandb_files.run_config(files[0])
  recorded = json.loads((workdir / "config.json").read_text())
  assert cfg["rl"] == recorded["rl"] and cfg["logging"] == recorded["logging"]
  (definitions,) = {
    p.read_text() for p in workdir.glob(f"wandb/offline-run-*/files/{trackers.DEFINITIONS_FILE}")
  }
  assert json.loads(definitions)["definitions"]["loss"] == metrics.DEFINITIONS["loss"]

  # MLflow: one run, finished, params = the flattened config, metrics at step = iteration.
  client = mlflow_tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
  run = client.get_run(ids["mlflow"])
  assert run.info.status == "FINISHED" and run.info.run_name == "run"
  assert run.data.params["rl.advantage"] == cfg["rl"]["advantage"]
  loss = client.get_metric_history(ids["mlflow"], "loss")
  assert sorted(m.step for m in loss) == [1, 1, 2]
  last = {m.step: m.value for m in sorted(loss, key=lambda m: m.timestamp)}
  assert last == pytest.approx({r["iteration"]: r["loss"] for r in lines[1:]})
  pass2 = client.get_metric_history(ids["mlflow"], "eval/pass_at_2")
  assert sorted(m.step for m in pass2) == [0, 1, 1, 2]
  artifacts = {a.path for a in client.list_artifacts(ids["mlflow"])}
  assert trackers.DEFINITIONS_FILE in artifacts and "samples" in artifacts


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_a_missing_package_and_an_unreachable_server_are_one_warning_each(
  tmp_path, file_stores, monkeypatch
):
  """wandb not importable, MLflow at a port nobody listens on: each one warning line
  naming the tracker and what to do, no tracker opened, and the logger still writes."""
  monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError.
  cfg = trackers.TrackingConfig(
    trackers=("jsonl", "wandb", "mlflow"),
    mlflow_tracking_uri=f"http://127.0.0.1:{_free_port()}",
    timeout_s=2,
  )
  messages = []
  opened = trackers.open_trackers(
    cfg, tmp_path, config={"seed": 0}, resumed=False, log=messages.append
  )
  assert opened == [] and len(messages) == 2, messages
  assert "'wandb', but wandb is not installed (pip install wandb" in messages[0]
  assert "tracker 'mlflow' did not start (" in messages[1] and "\n" not in messages[1]
  writer = logs.RunLogger(tmp_path, tensorboard_dir=False, trackers=opened)
  writer.write({"iteration": 1, "loss": 0.5})
  writer.close()
  assert logs.read_jsonl(tmp_path / "metrics.jsonl") == [{"iteration": 1, "loss": 0.5}]


def test_a_tracker_failing_mid_run_is_one_warning_and_the_others_go_on(tmp_path, file_stores):
  """MLflow's run directory replaced by a file after the first record: the next write
  fails once, is one warning, and later records still reach metrics.jsonl (and nothing
  else is tried on the failed tracker)."""
  import shutil  # noqa: PLC0415

  cfg = trackers.TrackingConfig(
    trackers=("jsonl", "mlflow"), mlflow_tracking_uri=(tmp_path / "mlruns").as_uri()
  )
  messages = []
  opened = trackers.open_trackers(
    cfg, tmp_path, config={"seed": 0}, resumed=False, log=messages.append
  )
  assert len(opened) == 1 and not messages
  writer = logs.RunLogger(tmp_path, tensorboard_dir=False, trackers=opened)
  writer.write({"iteration": 1, "loss": 0.5})
  (run_dir,) = [p for p in (tmp_path / "mlruns").glob("*/*") if p.name == opened[0].tracker.run_id]
  shutil.rmtree(run_dir / "metrics")
  (run_dir / "metrics").write_text("not a directory")
  for it in (2, 3):
    writer.write({"iteration": it, "loss": 0.5 / it})
  writer.close()
  assert len(messages) == 1 and messages[0].startswith("warning: tracker 'mlflow' failed ("), (
    messages
  )
  assert [r["iteration"] for r in logs.read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]
