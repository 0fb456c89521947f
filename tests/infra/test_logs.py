"""Run logs: metrics.jsonl lines (NaN/inf as strings), resume truncation, TensorBoard scalars
(written by tensorboardX, read back by TensorBoard's own loader) under the metrics' own
names, sampled completions, the curves, and progress (tqdm on a terminal, periodic lines
elsewhere)."""

import json
import math
import pathlib
import sys

import numpy as np
import pytest
import tb_events
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2

from grpo_jax.infra import logs


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


def _event_files(logdir) -> list[pathlib.Path]:
  return sorted(pathlib.Path(logdir).glob("events.out.tfevents.*"))


def _events(path) -> list:
  return list(event_file_loader.LegacyEventFileLoader(str(path)).Load())


def test_tensorboard_scalars(tmp_path):
  writer = logs.RunLogger(tmp_path)
  writer.write({"iteration": 0, "phase": "warmstart", "eval/greedy_accuracy": 0.25})
  writer.write(
    {"iteration": 1, "phase": "train", "loss": 0.1, "kl": float("nan"), "flag": True, "n": 3}
  )
  writer.close()
  scalars = tb_events.scalars(tmp_path / "tb")
  tags = {tag for _, tag in scalars}
  assert "phase" not in tags and "iteration" not in tags and "flag" not in tags
  finite = {k: v for k, v in scalars.items() if not math.isnan(v)}
  assert finite == {
    (0, "eval/greedy_accuracy"): 0.25,
    (1, "loss"): pytest.approx(float(np.float32(0.1))),
    (1, "n"): 3.0,
  }
  assert [k for k, v in scalars.items() if math.isnan(v)] == [(1, "kl")]


def test_tensorboard_events_are_on_disk_before_close(tmp_path):
  """A run killed mid-way keeps what it logged: each record is flushed."""
  writer = logs.RunLogger(tmp_path)
  writer.write({"iteration": 1, "loss": 0.5})
  assert tb_events.scalars(tmp_path / "tb") == {(1, "loss"): 0.5}
  writer.close()


def test_tensorboard_resume_purges_later_steps(tmp_path):
  """A session resumed from the checkpoint at iteration 1 tells TensorBoard to drop what
  the first session logged for iterations >= 2; TensorBoard shows each step once."""
  _write_run(tmp_path, range(4))
  _write_run(tmp_path, [2, 3], resume_from=1)
  files = _event_files(tmp_path / "tb")
  assert len(files) == 2
  first, second = (_events(f) for f in files)
  starts = lambda events: [
    e.step for e in events if e.session_log.status == event_pb2.SessionLog.START
  ]
  assert starts(first) == [] and starts(second) == [2]
  got = tb_events.scalars(tmp_path / "tb")
  # Iterations 2 and 3 come from the resumed session only (loss -it, NaN at 2 either way).
  assert sorted(step for step, tag in got if tag == "accuracy") == [0, 1, 2, 3]
  assert got[(3, "loss")] == -3.0


def test_two_sessions_in_one_second_never_share_a_file(tmp_path):
  for _ in range(3):
    _write_run(tmp_path, [0])
  assert len(_event_files(tmp_path / "tb")) == 3


def test_tensorboard_shows_every_metric_under_its_metrics_jsonl_name(tmp_path):
  """eval/pass@8 in metrics.jsonl is eval/pass@8 in TensorBoard (tensorboardX's own
  scalar() would have cleaned it to eval/pass_8)."""
  writer = logs.RunLogger(tmp_path)
  record = {"iteration": 3, "eval/pass@8": 0.5, "eval/mean@8": 0.25, "kl_ref/k3": 0.125}
  writer.write(record)
  writer.close()
  assert set(tb_events.scalars(tmp_path / "tb")) == {(3, k) for k in record if k != "iteration"}
  assert set(json.loads(_lines(tmp_path)[0])) == set(record)


_SAMPLE = dict(prompt="Q:1+2\n", completion="A:3.", answer="3", reward=1.0, verdict="correct")


def test_samples_go_to_samples_jsonl_and_tensorboards_text_tab_and_resume_cuts_them(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415

  for it in (0, 10, 20):
    writer = logs.RunLogger(tmp_path, resume_from=None if it == 0 else it - 10)
    writer.write_samples(it, [dict(_SAMPLE, index=0), dict(_SAMPLE, index=1, verdict="wrong")])
    writer.close()
  writer = logs.RunLogger(tmp_path, resume_from=10)  # Drops what iteration 20 wrote.
  writer.close()
  lines = logs.read_jsonl(tmp_path / logs.SAMPLES)
  assert [(r["iteration"], r["index"], r["verdict"]) for r in lines] == [
    (0, 0, "correct"), (0, 1, "wrong"), (10, 0, "correct"), (10, 1, "wrong")
  ]  # fmt: skip
  acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
  acc.Reload()
  assert "samples/text_summary" in acc.Tags()["tensors"]
  table = logs.samples_markdown([dict(_SAMPLE, completion="a|b")])
  assert table.splitlines()[2] == "| Q:1+2\\n | a\\|b | 3 | 1 | correct |"


def test_verdicts_and_the_samples_an_evaluation_shows():
  from grpo_jax import tasks  # noqa: PLC0415
  from grpo_jax.trainer import heldout

  assert [heldout.verdict(*x) for x in [(1, 1, True), (0.5, 1, True), (0, 1, True)]] == [
    "correct", "partial", "wrong"
  ]  # fmt: skip
  assert heldout.verdict(0, 0, True) == "wrong format"
  assert heldout.verdict(1, 1, False) == "unscorable"
  task = tasks.get("arithmetic")
  tok = task.tokenizer()
  examples = {i: task.example("test", i, seed=0) for i in range(3)}
  rows = [examples[0].reference, "A:1.", "11"]
  width = max(len(r) for r in rows) + 1
  tokens_NT = np.zeros((3, width), np.int32)
  for i, r in enumerate(rows):
    ids = tok.encode(r, add_eos=True)
    tokens_NT[i, : len(ids)] = ids
  shown = heldout.sample_records(
    tok, examples, tokens_NT, reward_N=[1.0, 0.0, 0.0], format_N=[1.0, 1.0, 0.0],
    scorable_N=[True, True, True], show=2,
  )  # fmt: skip
  assert [(s["completion"], s["verdict"]) for s in shown] == [
    (examples[0].reference, "correct"), ("A:1.", "wrong")
  ]  # fmt: skip
  assert shown[0]["prompt"] == examples[0].prompt and shown[0]["answer"] == examples[0].answer


def test_the_curves_have_a_panel_per_quantity_the_run_logged(tmp_path):
  records = [{"iteration": 0, "phase": "warmstart", "eval/greedy_accuracy": 0.25}]
  records += [
    {"iteration": i, "accuracy": 0.1 * i, "entropy": 1.0 / i, "kl_ref/k3": 0.01 * i,
     "response_length": 5.0 + i, "loss": -0.1, "grad_norm": 2.0}
    for i in range(1, 5)
  ]  # fmt: skip
  records[-1].update({"eval/greedy_accuracy": 0.5, "eval/pass@1": 0.4, "eval/pass@8": 0.75})
  panels = logs.curve_panels(records)
  assert [t for t, _, _ in panels] == [
    "accuracy", "entropy", "KL", "response length (tokens)", "loss", "gradient norm"
  ]  # fmt: skip
  labels = [label for label, _, _ in panels[0][1]]
  assert labels[2:] == ["held-out greedy accuracy", "pass@1", "pass@8"]
  assert panels[0][1][2][1] == [(0, 0.25), (4, 0.5)]
  assert [t for t, _, _ in logs.curve_panels(records[:1])] == ["accuracy"]  # Nothing else yet.
  svg = logs.plot_svg(records, tmp_path / "curves.svg", title="t").read_text()
  assert svg.count("<rect") == 6 and "pass@8" in svg and "kl_ref/k3" in svg


# ----------------------------------------------------------------------------
# Progress.
# ----------------------------------------------------------------------------


class FakeStream:
  def __init__(self, *, tty: bool):
    self.tty = tty
    self.writes: list[str] = []

  def isatty(self) -> bool:
    return self.tty

  def write(self, text: str) -> None:
    self.writes.append(text)

  def flush(self) -> None:
    pass


def test_progress_on_a_terminal_shows_reward_accuracy_and_throughput():
  stream = FakeStream(tty=True)
  progress = logs.Progress(total=100, start=40, accuracy=0.25, stream=stream)
  assert progress.enabled
  progress.update(41, {"accuracy": 0.5, "tokens_per_s": 12345.6})
  progress.update(50, {"accuracy": 0.75, "eval/greedy_accuracy": 0.375, "tokens_per_s": 10.0})
  progress.close()
  text = "".join(stream.writes)
  assert "50/100" in text and "reward=0.750" in text and "eval acc=0.375" in text
  assert "tok/s=10" in text and text.endswith("\n")  # The last record's; closed once.
  progress.close()  # Idempotent.


def test_progress_carries_the_last_eval_accuracy():
  progress = logs.Progress(total=10, stream=FakeStream(tty=False))
  assert progress.postfix({"accuracy": 0.5, "tokens_per_s": 1234.0}) == {
    "reward": "0.500",
    "eval acc": "nan",
    "tok/s": "1,234",
  }
  progress.postfix({"eval/greedy_accuracy": 0.375})
  assert progress.postfix({"accuracy": 0.25})["eval acc"] == "0.375"


@pytest.mark.parametrize("tty", [True, False])
def test_progress_is_quiet_when_disabled(tty):
  stream, lines = FakeStream(tty=tty), []
  progress = logs.Progress(total=4, enabled=False, stream=stream, log=lines.append)
  for it in range(1, 5):
    progress.update(it, {"accuracy": 0.5})
  progress.close()
  assert stream.writes == [] and lines == [] and not progress.enabled


def test_progress_off_a_terminal_is_a_line_every_interval_and_at_the_end():
  """A log file or CI sees the first update, then one line per `every_s` seconds, and the
  last; each with the figures, the pace and the time left (a fake clock: 2 s a step)."""
  stream, lines, now = FakeStream(tty=False), [], [100.0]
  progress = logs.Progress(
    total=10, start=2, stream=stream, log=lines.append, every_s=5.0, clock=lambda: now[0]
  )
  assert progress.enabled
  for it in range(3, 11):
    now[0] += 2.0
    progress.update(it, {"accuracy": 0.5, "tokens_per_s": 1500.0})
  progress.close()
  assert stream.writes == []
  assert [line.split(" (")[0] for line in lines] == [
    "RL 3/10", "RL 6/10", "RL 9/10", "RL 10/10"
  ]  # fmt: skip
  assert lines[0] == "RL 3/10 (30%): reward 0.500, eval acc nan, tok/s 1,500"  # No pace yet.
  assert lines[1] == "RL 6/10 (60%): reward 0.500, eval acc nan, tok/s 1,500; 2.00 s/it, 8s left"
  assert lines[-1].endswith("; 2.00 s/it, 0s left")


def test_only_a_running_kernel_makes_progress_a_notebook_widget(monkeypatch):
  # A process that started a notebook (nbclient imports ipykernel for its kernelspec) is
  # no kernel itself: its progress stays lines (a CI run failed on this test order).
  import types  # noqa: PLC0415

  monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
  fake = types.ModuleType("IPython")
  fake.get_ipython = lambda: None
  monkeypatch.setitem(sys.modules, "IPython", fake)
  assert not logs._in_notebook()
  fake.get_ipython = lambda: types.SimpleNamespace(kernel=object())  # A Jupyter kernel.
  assert logs._in_notebook()
  fake.get_ipython = lambda: types.SimpleNamespace()  # A terminal IPython.
  assert not logs._in_notebook()


def test_the_warm_starts_progress_shows_its_loss_a_few_steps_late():
  from grpo_jax.trainer import warmstart  # noqa: PLC0415

  history = [{"loss": float(i)} for i in range(40)]
  assert warmstart._lagged_loss(history[:15], 15) == {}
  assert warmstart._lagged_loss(history[:32], 32) == {"loss": 16.0}  # Step 17's, 16 back.
  assert warmstart._lagged_loss(history[:33], 33) == {}


# ----------------------------------------------------------------------------
# Libraries' own output: to a file, not the terminal.
# ----------------------------------------------------------------------------


def test_library_warnings_go_to_the_log_and_grpo_jax_s_own_stay_on_the_terminal(tmp_path):
  import warnings  # noqa: PLC0415

  path, shown = tmp_path / logs.LIBRARY_LOG, []
  with warnings.catch_warnings():
    warnings.simplefilter("always")
    warnings.showwarning = lambda message, *_, **__: shown.append(str(message))
    with logs.library_output(path):
      warnings.warn_explicit(
        "coroutine 'JsonCheckpointHandler.async_save' was never awaited",
        RuntimeWarning, "/site-packages/orbax/handler.py", 7,
      )  # fmt: skip
      warnings.warn_explicit("isolation='none'", RuntimeWarning, logs.__file__, 9)
  text = path.read_text()
  assert "orbax/handler.py:7: RuntimeWarning: coroutine" in text and "isolation" not in text
  assert shown == ["isolation='none'"]


def test_library_output_left_in_place_stays_redirected_after_it_is_collected(tmp_path):
  """The command line leaves it in place when a run fails; when the abandoned generator is
  garbage-collected (the failed frame is gone) it must not hand the terminal back: orbax's
  event loops still report ("Task exception was never retrieved") until the process exits
  (CI saw 264 such lines after the error line)."""
  import gc  # noqa: PLC0415
  import logging  # noqa: PLC0415
  import threading  # noqa: PLC0415
  import warnings  # noqa: PLC0415

  terminal = logging.StreamHandler(sys.stderr)
  logging.getLogger().addHandler(terminal)
  saved = (logging.lastResort, threading.excepthook, sys.unraisablehook, warnings.showwarning)
  stream = terminal.stream
  path = tmp_path / logs.LIBRARY_LOG
  try:
    cm = logs.library_output(path)
    cm.__enter__()
    del cm
    gc.collect()  # The generator is closed (GeneratorExit), as when main()'s frame goes.
    logging.getLogger("asyncio").error("Task exception was never retrieved")
    assert "Task exception was never retrieved" in path.read_text()
    assert terminal.stream is not stream
  finally:
    terminal.stream = stream
    logging.getLogger().removeHandler(terminal)
    logging.lastResort, threading.excepthook, sys.unraisablehook, warnings.showwarning = saved


def test_library_output_goes_to_the_log_file_and_the_hooks_come_back(tmp_path, capsys):
  import logging  # noqa: PLC0415
  import threading  # noqa: PLC0415

  terminal = logging.StreamHandler(sys.stderr)  # As absl's app.run installs one.
  logging.getLogger().addHandler(terminal)
  import warnings  # noqa: PLC0415

  hooks = (threading.excepthook, sys.unraisablehook, warnings.showwarning)
  path = tmp_path / "run" / logs.LIBRARY_LOG
  try:
    with logs.library_output(path) as out:
      assert not path.exists()  # Opened at the first line only.

      def fail():
        raise OSError(27, "File too large")

      t = threading.Thread(target=fail, name="finalize")
      t.start()
      t.join()
      logging.getLogger("absl").error("orbax: failed to run 5 Handler Commit operations")
      sys.unraisablehook(
        type("U", (), dict(exc_type=RuntimeError, exc_value=RuntimeError("Event loop is closed"),
                           exc_traceback=None, err_msg=None, object="<future>"))()
      )  # fmt: skip
    logging.getLogger("absl").error("after the block: the terminal again")
  finally:
    logging.getLogger().removeHandler(terminal)
  text = path.read_text()
  assert out.written and "Exception in thread finalize:" in text and "File too large" in text
  assert "Handler Commit operations" in text and "terminal again" not in text
  assert "Exception ignored in: '<future>'" in text and "Event loop is closed" in text
  assert capsys.readouterr().err == "after the block: the terminal again\n"
  assert (threading.excepthook, sys.unraisablehook, warnings.showwarning) == hooks


def test_the_tensorboard_writer_does_not_import_torch():
  """tensorboardX imports torch where it is installed (1.2 s, 240 MB a process); logs
  imports it with torch marked absent, and torch still imports afterwards. CI installs
  torch (`.ci/run`), so the first assertion can fail there."""
  import importlib.util  # noqa: PLC0415
  import subprocess  # noqa: PLC0415

  code = (
    "import sys\n"
    "from grpo_jax.infra import logs\n"
    "assert 'torch' not in sys.modules, 'tensorboardX imported torch'\n"
    "import torch\n"
    "print(torch.Tensor.__name__)\n"
  )
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  if importlib.util.find_spec("torch") is None:
    assert "No module named 'torch'" in r.stderr, r.stderr[-2000:]
  else:
    assert r.returncode == 0 and r.stdout == "Tensor\n", r.stderr[-2000:]
