"""Run logs on the host: metrics.jsonl, TensorBoard event files and a progress bar.

    writer = logs.RunLogger(workdir, resume_from=k)   # drops lines with iteration > k
    writer.write(record)                             # one JSON line + TensorBoard scalars
    progress = logs.Progress(total=300, start=k)     # a tqdm bar on a terminal
    with logs.library_output(workdir / LIBRARY_LOG):  # libraries' tracebacks to a file
      ...

Every key of a record is defined in `grpo_jax.metrics.DEFINITIONS`. TensorBoard files are
written with tensorboardX's event writer and protos (no TensorFlow needed), synchronously:
its SummaryWriter hands events to a background thread whose flush() does not wait for
them, so a killed run could lose the last records TensorBoard should show. A resumed
session writes a SessionLog START at the first step it logs again, so TensorBoard hides
what a crashed session logged past the checkpoint (the `purge_step` of SummaryWriter).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import pathlib
import sys
import threading
import time
import traceback

import numpy as np
import tqdm
from tensorboardX import event_file_writer
from tensorboardX import summary as tb_summary
from tensorboardX.proto import event_pb2, summary_pb2

LIBRARY_LOG = "grpo_jax.log"


def _clean(v):
  if isinstance(v, (str, bool, int)) or v is None:
    return v
  if isinstance(v, (np.bool_, np.integer)):
    return v.item()
  f = float(v)
  return f if math.isfinite(f) else str(f)  # JSON has no NaN/inf: "nan", "inf".


def read_jsonl(path: pathlib.Path) -> list[dict]:
  """The records of a metrics.jsonl ([] if absent). A partial last line, left by a process
  killed mid-write, is dropped; a bad line elsewhere is an error naming the line."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  lines = [x for x in path.read_text().splitlines() if x.strip()]
  out = []
  for i, line in enumerate(lines):
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError as e:
      if i == len(lines) - 1:
        break
      raise ValueError(f"{path}: line {i + 1} is not JSON ({e}).") from None
  return out


class RunLogger:
  """Appends records to workdir/metrics.jsonl and workdir/tb (TensorBoard scalars).

  On resume from iteration k, lines with iteration > k (written after the checkpoint the
  run resumes from) are dropped first, and TensorBoard is told to purge steps > k, so
  every iteration appears once. Strings and booleans are not sent to TensorBoard.
  """

  def __init__(
    self, workdir: pathlib.Path, *, resume_from: int | None = None, tensorboard_dir=True
  ):
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    if resume_from is not None and self.path.exists():
      kept = [r for r in read_jsonl(self.path) if r.get("iteration", 0) <= resume_from]
      self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    elif resume_from is None and self.path.exists():
      self.path.unlink()
    self._f = self.path.open("a")
    self._tb = None
    if tensorboard_dir:
      tb = pathlib.Path(workdir) / "tb"
      tb.mkdir(parents=True, exist_ok=True)
      # Unique and increasing within a second: two sessions never share a file.
      self._tb = event_file_writer.EventsWriter(str(tb / "events"), f".{time.time_ns()}")
      if resume_from is not None:  # TensorBoard drops earlier files' steps >= this one.
        start = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
        self._event(step=resume_from + 1, session_log=start)

  def write(self, record: dict) -> None:
    self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
    self._f.flush()
    if self._tb is None:
      return
    values = [
      tb_summary.scalar(k, float(v)).value[0]
      for k, v in record.items()
      if k != "iteration" and not isinstance(v, (str, bool, np.bool_)) and v is not None
    ]
    self._event(step=record["iteration"], summary=summary_pb2.Summary(value=values))

  def _event(self, *, step: int, **fields) -> None:
    self._tb.write_event(event_pb2.Event(wall_time=time.time(), step=step, **fields))
    self._tb.flush()

  def close(self) -> None:
    if not self._f.closed:
      self._f.close()
    if self._tb is not None:
      self._tb.close()
      self._tb = None


class NullLogger:
  """RunLogger's interface, writing nothing (the non-primary processes of a job)."""

  def write(self, record: dict) -> None:
    del record

  def close(self) -> None:
    pass


class Progress:
  """A tqdm progress bar of the RL iterations, with the latest training reward, held-out
  accuracy and sampling throughput in its postfix. Quiet when the stream is not a
  terminal (logs, CI, notebooks: metrics.jsonl has every figure) or when disabled."""

  def __init__(
    self,
    *,
    total: int,
    start: int = 0,
    accuracy: float = float("nan"),
    enabled: bool = True,
    stream=None,
  ):
    stream = stream or sys.stderr
    self.acc = accuracy  # The latest held-out accuracy, shown until the next evaluation.
    tty = bool(getattr(stream, "isatty", lambda: False)())
    self._bar = None
    if enabled and tty:
      self._bar = tqdm.tqdm(
        total=total, initial=start, file=stream, unit="it", dynamic_ncols=True, leave=True
      )

  @property
  def enabled(self) -> bool:
    return self._bar is not None

  def postfix(self, record: dict) -> dict[str, str]:
    """The figures shown beside the bar."""
    if "eval/greedy_accuracy" in record:
      self.acc = record["eval/greedy_accuracy"]
    return {
      "reward": f"{record.get('accuracy', float('nan')):.3f}",
      "eval acc": f"{self.acc:.3f}",
      "tok/s": f"{record.get('tokens_per_s', 0.0):,.0f}",
    }

  def update(self, it: int, record: dict) -> None:
    postfix = self.postfix(record)
    if self._bar is None:
      return
    self._bar.set_postfix(postfix, refresh=False)
    self._bar.update(it - self._bar.n)

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None


def _polyline(xs, ys, *, x_range, y_range, box, color) -> str:
  (x0, x1), (y0, y1), (left, top, width, height) = x_range, y_range, box
  pts = [
    f"{left + width * (x - x0) / max(x1 - x0, 1e-9):.1f},"
    f"{top + height * (1 - (y - y0) / max(y1 - y0, 1e-9)):.1f}"
    for x, y in zip(xs, ys)
    if y is not None and math.isfinite(y)
  ]
  return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{" ".join(pts)}"/>'


def plot_svg(records: list[dict], path: pathlib.Path, *, title: str = "") -> pathlib.Path:
  """Writes a dependency-free SVG of the training reward and held-out accuracy curves.

  Lines: `accuracy` (mean training reward per iteration, thin), its moving average over
  ~5% of the run, and `eval/greedy_accuracy` at each evaluation (thick, with points).
  """
  W, H, pad = 640, 360, 48
  box = (pad, pad / 2, W - 1.5 * pad, H - 1.5 * pad)
  train = [(r["iteration"], r["accuracy"]) for r in records if "accuracy" in r]
  evals = [
    (r["iteration"], r["eval/greedy_accuracy"]) for r in records if "eval/greedy_accuracy" in r
  ]
  x_max = max([1] + [i for i, _ in train + evals])
  xr, yr = (0, x_max), (0.0, 1.0)
  window = max(1, len(train) // 20)
  smooth = [
    (train[i][0], sum(v for _, v in train[max(0, i - window + 1) : i + 1]) / min(window, i + 1))
    for i in range(len(train))
  ]
  left, top, width, height = box
  parts = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
    f'<rect x="{left}" y="{top}" width="{width}" height="{height}" fill="none" stroke="#999"/>',
    f'<text x="{W / 2}" y="14" text-anchor="middle">{title}</text>',
  ]
  for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
    y = top + height * (1 - frac)
    parts.append(f'<line x1="{left}" x2="{left + width}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{frac:.2f}</text>')
  for frac in (0.0, 0.5, 1.0):
    x = left + width * frac
    parts.append(
      f'<text x="{x:.1f}" y="{top + height + 14}" text-anchor="middle">{round(x_max * frac)}</text>'
    )
  parts.append(f'<text x="{left + width / 2}" y="{H - 4}" text-anchor="middle">iteration</text>')
  for xs_ys, color in ((train, "#bbd"), (smooth, "#35a"), (evals, "#d62")):
    xs, ys = [x for x, _ in xs_ys], [y for _, y in xs_ys]
    parts.append(_polyline(xs, ys, x_range=xr, y_range=yr, box=box, color=color))
  for x, y in evals:
    cx = left + width * x / x_max
    cy = top + height * (1 - y)
    parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="#d62"/>')
  legend = (("#35a", "training reward (moving avg)"), ("#d62", "held-out greedy accuracy"))
  for i, (color, text) in enumerate(legend):
    y = top + 14 + 14 * i
    parts.append(
      f'<line x1="{left + 8}" x2="{left + 24}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2"/>'
    )
    parts.append(f'<text x="{left + 28}" y="{y}">{text}</text>')
  parts.append("</svg>")
  path = pathlib.Path(path)
  path.write_text("\n".join(parts) + "\n")
  return path


class _LazyLog:
  """A text stream appending to `path`, opened at the first write. Text that cannot be
  written (a full disk) is dropped: a log must not add errors of its own."""

  def __init__(self, path: pathlib.Path):
    self.path, self._f, self.written = pathlib.Path(path), None, False

  def write(self, text: str) -> int:
    try:
      if self._f is None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a")
      self._f.write(text)
      self._f.flush()
      self.written = True
    except OSError:
      pass
    return len(text)

  def flush(self) -> None:
    pass

  def close(self) -> None:
    if self._f is not None:
      with contextlib.suppress(OSError):
        self._f.close()


def _terminal_handlers() -> list[logging.StreamHandler]:
  """The root logger's handlers that write to the terminal (absl's handler, which the
  command line's app.run installs, wraps one: its `python_handler`)."""
  terminal = {id(x) for x in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__)}
  out = []
  for h in logging.getLogger().handlers:
    inner = getattr(h, "python_handler", h)
    if isinstance(inner, logging.StreamHandler) and id(inner.stream) in terminal:
      out.append(inner)
  return out


@contextlib.contextmanager
def library_output(path: pathlib.Path):
  """While the block runs, what libraries print on their own goes to `path` (created at
  its first line), not to the terminal: log records (orbax's, JAX's: the root logger's
  terminal handlers and Python's last-resort one), tracebacks of exceptions in background
  threads, and "exception ignored" reports (TensorStore reads landing after a failed
  checkpoint write or read closed their event loop). A failed save prints hundreds of
  such lines before the one line that says what happened; the terminal keeps grpo_jax's
  own output. Yields the stream (its `written` says whether anything went there)."""
  out = _LazyLog(path)
  handlers = _terminal_handlers()
  streams = [h.stream for h in handlers]
  saved = (logging.lastResort, threading.excepthook, sys.unraisablehook)

  def thread_hook(args):
    name = args.thread.name if args.thread is not None else "?"
    out.write(f"Exception in thread {name}:\n")
    traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=out)

  def unraisable_hook(u):
    out.write(f"{u.err_msg or 'Exception ignored in'}: {u.object!r}\n")
    traceback.print_exception(u.exc_type, u.exc_value, u.exc_traceback, file=out)

  for h in handlers:
    h.stream = out
  logging.lastResort = logging.StreamHandler(out)
  threading.excepthook, sys.unraisablehook = thread_hook, unraisable_hook
  try:
    yield out
  finally:
    for h, stream in zip(handlers, streams, strict=True):
      h.stream = stream
    logging.lastResort, threading.excepthook, sys.unraisablehook = saved
    out.close()
