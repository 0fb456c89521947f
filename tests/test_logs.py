"""Run logs: metrics.jsonl lines (NaN/inf as strings), resume truncation, TensorBoard scalars,
and the console progress line (every ~5% off a terminal, '\\r' redraws on one)."""

import json
import math
import types

import numpy as np
import pytest

from grpo_jax import logs, tensorboard


def _lines(workdir) -> list[str]:
  return (workdir / "metrics.jsonl").read_text().splitlines(keepends=True)


# ----------------------------------------------------------------------------
# metrics.jsonl.
# ----------------------------------------------------------------------------


def test_one_json_line_per_record_with_nonfinite_as_strings(tmp_path):
  writer = logs.RunLogger(tmp_path, tensorboard_dir=False)
  writer.write({"iteration": 0, "phase": "warmstart", "eval/greedy_accuracy": 0.25})
  writer.write(
    {
      "iteration": 1,
      "loss": float("nan"),
      "kl": float("inf"),
      "grad_norm": -math.inf,
      "accuracy": np.float32(0.5),
      "tokens": 12,
      "flag": True,
      "note": None,
    }
  )
  writer.close()
  assert _lines(tmp_path) == [
    '{"iteration": 0, "phase": "warmstart", "eval/greedy_accuracy": 0.25}\n',
    '{"iteration": 1, "loss": "nan", "kl": "inf", "grad_norm": "-inf", "accuracy": 0.5, '
    '"tokens": 12, "flag": true, "note": null}\n',
  ]
  # Strict JSON: no bare NaN / Infinity tokens.
  for line in _lines(tmp_path):
    json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
  records = logs.read_jsonl(tmp_path / "metrics.jsonl")
  assert records[1]["loss"] == "nan" and records[1]["kl"] == "inf"
  assert not (tmp_path / "tb").exists()


def test_lines_are_flushed_before_close(tmp_path):
  writer = logs.RunLogger(tmp_path, tensorboard_dir=False)
  writer.write({"iteration": 3, "accuracy": 0.125})
  # Readable while the logger is still open (a crash loses no written record).
  assert logs.read_jsonl(tmp_path / "metrics.jsonl") == [{"iteration": 3, "accuracy": 0.125}]
  writer.close()


def test_read_jsonl_missing_file_and_blank_lines(tmp_path):
  assert logs.read_jsonl(tmp_path / "absent.jsonl") == []
  path = tmp_path / "m.jsonl"
  path.write_text('{"a": 1}\n\n  \n{"a": 2}\n')
  assert logs.read_jsonl(path) == [{"a": 1}, {"a": 2}]


def _write_run(workdir, iterations, **options):
  writer = logs.RunLogger(workdir, **options)
  for it in iterations:
    writer.write({"iteration": it, "accuracy": it / 8, "loss": float("nan") if it == 2 else -it})
  writer.close()


def test_resume_drops_later_iterations_and_keeps_earlier_lines(tmp_path):
  _write_run(tmp_path, range(6), tensorboard_dir=False)
  before = _lines(tmp_path)
  assert len(before) == 6

  writer = logs.RunLogger(tmp_path, resume_from=3, tensorboard_dir=False)
  assert _lines(tmp_path) == before[:4]  # Iterations 0..3, byte for byte.
  writer.write({"iteration": 4, "accuracy": 1.0})
  writer.close()
  lines = _lines(tmp_path)
  assert lines[:4] == before[:4]
  assert lines[4:] == ['{"iteration": 4, "accuracy": 1.0}\n']


def test_resume_keeps_records_without_iteration_and_handles_missing_file(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"iteration": 1}\n{"summary": 1}\n{"iteration": 2}\n')
  logs.RunLogger(tmp_path, resume_from=1, tensorboard_dir=False).close()
  assert path.read_text() == '{"iteration": 1}\n{"summary": 1}\n'

  other = tmp_path / "other"
  other.mkdir()
  writer = logs.RunLogger(other, resume_from=5, tensorboard_dir=False)
  writer.write({"iteration": 6})
  writer.close()
  assert (other / "metrics.jsonl").read_text() == '{"iteration": 6}\n'


def test_fresh_logger_starts_over(tmp_path):
  _write_run(tmp_path, range(3), tensorboard_dir=False)
  writer = logs.RunLogger(tmp_path, tensorboard_dir=False)
  assert (tmp_path / "metrics.jsonl").read_text() == ""
  writer.write({"iteration": 0, "phase": "warmstart"})
  writer.close()
  assert _lines(tmp_path) == ['{"iteration": 0, "phase": "warmstart"}\n']


# ----------------------------------------------------------------------------
# TensorBoard.
# ----------------------------------------------------------------------------


def test_tensorboard_scalars(tmp_path):
  writer = logs.RunLogger(tmp_path)
  writer.write({"iteration": 0, "phase": "warmstart", "eval/greedy_accuracy": 0.25})
  writer.write(
    {"iteration": 1, "phase": "train", "loss": 0.1, "kl": float("nan"), "flag": True, "n": 3}
  )
  writer.close()
  scalars = tensorboard.read_scalars(tmp_path / "tb")
  tags = {tag for _, tag, _ in scalars}
  assert "phase" not in tags and "iteration" not in tags and "flag" not in tags
  finite = [(s, t, v) for s, t, v in scalars if not math.isnan(v)]
  assert finite == [
    (0, "eval/greedy_accuracy", 0.25),
    (1, "loss", float(np.float32(0.1))),
    (1, "n", 3.0),
  ]
  assert [(s, t) for s, t, v in scalars if math.isnan(v)] == [(1, "kl")]


def test_tensorboard_resume_purges_later_steps(tmp_path):
  _write_run(tmp_path, range(4))
  _write_run(tmp_path, [2, 3], resume_from=1)
  files = tensorboard.event_files(tmp_path / "tb")
  assert len(files) == 2
  first, second = (tensorboard.read_events(f) for f in files)
  assert not any(e["session_start"] for e in first)
  # The resumed writer tells TensorBoard to drop steps >= 2 of the earlier file.
  assert [e["step"] for e in second if e["session_start"]] == [2]
  assert sorted({e["step"] for e in second if e["scalars"]}) == [2, 3]


def test_fresh_logger_writes_no_purge_event(tmp_path):
  _write_run(tmp_path, [0])
  (events,) = [tensorboard.read_events(f) for f in tensorboard.event_files(tmp_path / "tb")]
  assert not any(e["session_start"] for e in events)


# ----------------------------------------------------------------------------
# Progress.
# ----------------------------------------------------------------------------


class FakeStream:
  def __init__(self, *, tty: bool):
    self.tty = tty
    self.writes: list[str] = []
    self.flushes = 0

  def isatty(self) -> bool:
    return self.tty

  def write(self, text: str) -> None:
    self.writes.append(text)

  def flush(self) -> None:
    self.flushes += 1


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


@pytest.fixture
def clock(monkeypatch):
  clock = FakeClock()
  # Only the logs module sees the fake clock.
  monkeypatch.setattr(logs, "time", types.SimpleNamespace(perf_counter=clock))
  return clock


@pytest.mark.parametrize(
  ("total", "expected"),
  [
    (100, list(range(5, 101, 5))),  # every 5
    (45, [*range(2, 45, 2), 45]),  # every 2, plus the last iteration
    (10, list(range(1, 11))),  # total // 20 == 0 -> every iteration
    (41, [*range(2, 41, 2), 41]),
  ],
)
def test_progress_off_terminal_logs_about_every_five_percent(total, expected):
  logged = []
  stream = FakeStream(tty=False)
  progress = logs.Progress(total=total, log=logged.append, stream=stream)
  for it in range(1, total + 1):
    progress.update(it, {"accuracy": 0.5})
  progress.close()
  assert [int(line[1:].split("/")[0]) for line in logged] == expected
  assert stream.writes == []


def test_progress_resumed_counts_from_start():
  logged = []
  progress = logs.Progress(total=100, start=40, log=logged.append, stream=FakeStream(tty=False))
  for it in range(41, 101):
    progress.update(it, {})
  assert len(logged) == 12  # 45, 50, ..., 100
  assert logged[0].startswith("[ 45/100]")


def test_progress_line_text(clock):
  progress = logs.Progress(total=100, log=None, stream=FakeStream(tty=False))
  clock.now = 10.0
  line = progress.line(5, {"accuracy": 0.5, "tokens_per_s": 12345.6})
  # 10 s over 5 iterations: 2.00 s/it, 95 left: ETA 190 s; no eval yet.
  assert line == "[  5/100] reward 0.500  eval acc nan  12,346 tok/s  2.00 s/it  ETA 190s"
  clock.now = 20.0
  line = progress.line(10, {"eval/greedy_accuracy": 0.375})
  assert line == "[ 10/100] reward nan  eval acc 0.375  0 tok/s  2.00 s/it  ETA 180s"
  # The last eval accuracy is carried into later lines.
  assert "eval acc 0.375" in progress.line(11, {"accuracy": 0.25})


def test_progress_rate_counts_only_this_session(clock):
  progress = logs.Progress(total=50, start=20, log=None, stream=FakeStream(tty=False))
  clock.now = 30.0
  # 10 iterations (21..30) in 30 s: 3.00 s/it, 20 left: ETA 60 s.
  assert progress.line(30, {}).endswith("3.00 s/it  ETA 60s")


def test_progress_on_terminal_redraws_and_ends_with_one_newline():
  logged = []
  stream = FakeStream(tty=True)
  progress = logs.Progress(total=3, log=logged.append, stream=stream)
  for it in range(1, 4):
    progress.update(it, {"accuracy": 0.5})
  assert logged == []
  assert len(stream.writes) == 3
  assert all(w.startswith("\r[") and "\n" not in w for w in stream.writes)
  assert [w[1:4] for w in stream.writes] == ["[1/", "[2/", "[3/"]
  progress.close()
  assert stream.writes[3:] == ["\n"]
  progress.close()  # Idempotent: no second newline.
  assert stream.writes.count("\n") == 1
  assert stream.flushes == 4


def test_progress_close_without_updates_writes_nothing():
  stream = FakeStream(tty=True)
  logs.Progress(total=3, stream=stream).close()
  assert stream.writes == []


def test_progress_disabled_is_silent():
  logged = []
  stream = FakeStream(tty=True)
  progress = logs.Progress(total=4, enabled=False, log=logged.append, stream=stream)
  for it in range(1, 5):
    progress.update(it, {})
  progress.close()
  assert logged == [] and stream.writes == []
  quiet = logs.Progress(total=4, enabled=False, log=logged.append, stream=FakeStream(tty=False))
  for it in range(1, 5):
    quiet.update(it, {})
  assert logged == []
