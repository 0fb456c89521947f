"""Run logs on the host: metrics.jsonl, TensorBoard event files and a progress bar.

    writer = logs.RunLogger(workdir, resume_from=k)   # drops lines with iteration > k
    writer.write(record)                             # one JSON line + TensorBoard scalars
    writer.write_samples(k, samples)                 # samples.jsonl + TensorBoard text
    progress = logs.Progress(total=300, start=k)     # a bar, or periodic lines in a log
    with logs.library_output(workdir / LIBRARY_LOG):  # libraries' tracebacks to a file
      ...

Every key of a record is defined in `grpo_jax.infra.metrics.DEFINITIONS`, and TensorBoard shows
it under the same name (`eval/pass@8`, not a cleaned-up `eval/pass_8`). TensorBoard files are
written with tensorboardX's event writer and protos (no TensorFlow needed), synchronously:
its SummaryWriter hands events to a background thread whose flush() does not wait for
them, so a killed run could lose the last records TensorBoard should show. A resumed
session writes a SessionLog START at the first step it logs again, so TensorBoard hides
what a crashed session logged past the checkpoint (the `purge_step` of SummaryWriter).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import math
import pathlib
import sys
import threading
import time
import traceback
import warnings

import numpy as np
import tqdm

from grpo_jax.infra import jsonl


def _import_tensorboardx():
  """tensorboardX's modules, imported with torch marked absent (unless torch is loaded).

  Its package imports its writer, which imports torch where torch is installed, only to
  accept torch.Tensor values (grpo_jax logs numpy): 1.2 s and 240 MB more in every
  process, measured on a 2-core Xeon with torch 2.13. Marked absent, the import fails
  inside tensorboardX's own try/except; the mark is removed afterwards."""
  marked = "torch" not in sys.modules
  if marked:
    sys.modules["torch"] = None  # `import torch` raises ImportError while this is set.
  try:
    names = ("event_file_writer", "summary", "proto.event_pb2", "proto.summary_pb2")
    return [importlib.import_module(f"tensorboardX.{n}") for n in names]
  finally:
    if marked and sys.modules.get("torch", 0) is None:
      del sys.modules["torch"]


event_file_writer, tb_summary, event_pb2, summary_pb2 = _import_tensorboardx()

LIBRARY_LOG = "grpo_jax.log"
SAMPLES = "samples.jsonl"  # Held-out prompts, completions, rewards, verdicts per evaluation.


def _clean(v):
  if isinstance(v, (str, bool, int)) or v is None:
    return v
  if isinstance(v, (np.bool_, np.integer)):
    return v.item()
  f = float(v)
  return f if math.isfinite(f) else str(f)  # JSON has no NaN/inf: "nan", "inf".


def read_jsonl(path: pathlib.Path) -> list[dict]:
  """The records of a log this package writes (metrics.jsonl, samples, spectra): `jsonl.read`
  with a missing file read as [] and a last line cut by a killed writer dropped."""
  return jsonl.read(path, missing_ok=True, torn_tail=True)


def _cut_back(path: pathlib.Path, resume_from: int | None) -> None:
  """A fresh run starts `path` over; a resumed one drops its lines with iteration >
  resume_from (written after the checkpoint it resumes from)."""
  if resume_from is not None and path.exists():
    kept = [r for r in read_jsonl(path) if r.get("iteration", 0) <= resume_from]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
  elif resume_from is None and path.exists():
    path.unlink()


class RunLogger:
  """Appends records to workdir/metrics.jsonl and workdir/tb (TensorBoard scalars), and
  sampled completions to workdir/samples.jsonl and TensorBoard's text tab.

  On resume from iteration k, lines with iteration > k (written after the checkpoint the
  run resumes from) are dropped first, and TensorBoard is told to purge steps > k, so
  every iteration appears once. Strings and booleans are not sent to TensorBoard.
  Each record and sample batch also goes to every tracker in `trackers` (`grpo_jax.infra.trackers`:
  W&B, MLflow; each its own write / write_samples / close), after the local files.
  """

  def __init__(
    self,
    workdir: pathlib.Path,
    *,
    resume_from: int | None = None,
    tensorboard_dir=True,
    trackers=(),
  ):
    self.trackers = list(trackers)
    self.path = pathlib.Path(workdir) / "metrics.jsonl"
    self.samples_path = pathlib.Path(workdir) / SAMPLES
    for path in (self.path, self.samples_path):
      _cut_back(path, resume_from)
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
    for tracker in self.trackers:
      tracker.write(record)
    if self._tb is None:
      return
    values = [  # The record's own names (tensorboardX's scalar() would rewrite "@").
      summary_pb2.Summary.Value(tag=k, simple_value=float(v))
      for k, v in record.items()
      if k != "iteration" and not isinstance(v, (str, bool, np.bool_)) and v is not None
    ]
    self._event(step=record["iteration"], summary=summary_pb2.Summary(value=values))

  def write_samples(self, iteration: int, samples: list[dict]) -> None:
    """One JSON line per sample (with its iteration) and a markdown table of them in
    TensorBoard's text tab, under "samples" (held-out evaluation rows) or "rollouts"
    (training rows: their "kind" is "train")."""
    if not samples:
      return
    with self.samples_path.open("a") as f:
      f.writelines(json.dumps({"iteration": iteration, **s}) + "\n" for s in samples)
    for tracker in self.trackers:
      tracker.write_samples(iteration, samples)
    if self._tb is not None:
      tag = "rollouts" if samples[0].get("kind") == "train" else "samples"
      text = tb_summary.text(tag, samples_markdown(samples))
      self._event(step=iteration, summary=text)

  def _event(self, *, step: int, **fields) -> None:
    self._tb.write_event(event_pb2.Event(wall_time=time.time(), step=step, **fields))
    self._tb.flush()

  def close(self) -> None:
    if not self._f.closed:
      self._f.close()
    for tracker in self.trackers:
      tracker.close()
    self.trackers = []
    if self._tb is not None:
      self._tb.close()
      self._tb = None


# The columns a samples table shows, in this order, where its rows have them.
SAMPLE_COLUMNS = ("group", "prompt", "completion", "answer", "reward", "advantage", "verdict")


def samples_markdown(samples: list[dict]) -> str:
  """A markdown table of samples (TensorBoard's text tab renders markdown): the
  `SAMPLE_COLUMNS` its rows have."""
  cell = lambda v: json.dumps(v)[1:-1].replace("|", "\\|") if isinstance(v, str) else f"{v:g}"  # noqa: E731
  columns = [c for c in SAMPLE_COLUMNS if any(c in s for s in samples)]
  rows = ["| " + " | ".join(cell(s.get(c, "")) for c in columns) + " |" for s in samples]
  head = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  return "\n".join([*head, *rows])


class NullLogger:
  """RunLogger's interface, writing nothing (the non-primary processes of a job)."""

  def write(self, record: dict) -> None:
    del record

  def write_samples(self, iteration: int, samples: list[dict]) -> None:
    del iteration, samples

  def close(self) -> None:
    pass


class Progress:
  """Progress of a loop wherever it runs: a tqdm bar on a terminal, `tqdm.auto`'s bar in a
  notebook (a widget where ipywidgets is installed), and elsewhere (a log file, CI, a
  script piped to a file) one line every `every_s` seconds, at the first update and at the
  end, through `log`. Nothing when disabled.

  Beside the bar: `fields(record)`, by default the RL figures (`postfix`: the latest
  training reward, held-out accuracy and sampling throughput).
  """

  def __init__(
    self,
    *,
    total: int,
    start: int = 0,
    accuracy: float = float("nan"),
    enabled: bool = True,
    stream=None,
    desc: str = "RL",
    unit: str = "it",
    every_s: float = 30.0,
    log=print,
    fields=None,
    clock=time.monotonic,
  ):
    stream = stream or sys.stderr
    self.acc = accuracy  # The latest held-out accuracy, shown until the next evaluation.
    self.total, self.desc, self.unit, self.every_s = total, desc, unit, every_s
    self._fields, self._log, self._clock = fields or self.postfix, log, clock
    self._bar, self._lines = None, False
    self._start = (start, clock())
    self._last_line, self._lines_written = None, 0  # The first line's pace would be a compile's.
    if not enabled:
      return
    if bool(getattr(stream, "isatty", lambda: False)()):
      self._bar = tqdm.tqdm(
        total=total, initial=start, file=stream, unit=unit, desc=desc, dynamic_ncols=True,
        leave=True,
      )  # fmt: skip
    elif _in_notebook():
      from tqdm import auto  # noqa: PLC0415 -- picks the notebook's widget.

      self._bar = auto.tqdm(total=total, initial=start, unit=unit, desc=desc, leave=True)
    else:
      self._lines = True

  @property
  def enabled(self) -> bool:
    return self._bar is not None or self._lines

  def postfix(self, record: dict) -> dict[str, str]:
    """The RL figures shown beside the bar."""
    if "eval/greedy_accuracy" in record:
      self.acc = record["eval/greedy_accuracy"]
    return {
      "reward": f"{record.get('accuracy', float('nan')):.3f}",
      "eval acc": f"{self.acc:.3f}",
      "tok/s": f"{record.get('tokens_per_s', 0.0):,.0f}",
    }

  def update(self, n: int, record: dict | None = None) -> None:
    fields = self._fields(record or {})
    if self._bar is not None:
      self._bar.set_postfix(fields, refresh=False)
      self._bar.update(n - self._bar.n)
    elif self._lines:
      now = self._clock()
      due = self._last_line is None or now - self._last_line >= self.every_s
      if due or n >= self.total:
        self._last_line = now
        self._log(self.line(n, fields, now=now))
        self._lines_written += 1

  def line(self, n: int, fields: dict[str, str], *, now: float) -> str:
    """One summary line: where the loop is, its figures, its pace and the time left."""
    n0, t0 = self._start
    rate = (n - n0) / max(now - t0, 1e-9)
    pace = f"{1 / rate:.2f} s/{self.unit}" if 0 < rate < 1 else f"{rate:.1f} {self.unit}/s"
    left = (self.total - n) / rate if rate > 0 else float("nan")
    shown = ", ".join(f"{k} {v}" for k, v in fields.items())
    return (
      f"{self.desc} {n}/{self.total} ({100 * n / max(self.total, 1):.0f}%)"
      + (f": {shown}" if shown else "")
      + (f"; {pace}, {_duration(left)} left" if self._lines_written else "")
    )

  def close(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None
    self._lines = False


def _in_notebook() -> bool:
  """Whether this process is a Jupyter / Colab kernel (its stderr is not a terminal): an
  IPython shell with a kernel is running. Not merely ipykernel imported: jupyter_client
  imports it to find its kernelspec when a process starts a notebook (a test, a script
  running one), and that process's own progress must stay lines."""
  if "google.colab" in sys.modules:
    return True
  ipython = sys.modules.get("IPython")
  shell = ipython.get_ipython() if ipython is not None else None
  return getattr(shell, "kernel", None) is not None


def _duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return "?"
  m, s = divmod(int(round(seconds)), 60)
  h, m = divmod(m, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _polyline(xs, ys, *, x_range, y_range, box, color, width=1.5, dash="") -> str:
  (x0, x1), (y0, y1), (left, top, w, h) = x_range, y_range, box
  pts = [
    f"{left + w * (x - x0) / max(x1 - x0, 1e-9):.1f},"
    f"{top + h * (1 - (y - y0) / max(y1 - y0, 1e-9)):.1f}"
    for x, y in zip(xs, ys)
    if y is not None and math.isfinite(y)
  ]
  dashed = f' stroke-dasharray="{dash}"' if dash else ""
  return (
    f'<polyline fill="none" stroke="{color}" stroke-width="{width}"{dashed} '
    f'points="{" ".join(pts)}"/>'
  )


def _series(records: list[dict], key: str) -> list[tuple[int, float]]:
  return [
    (r["iteration"], float(r[key]))
    for r in records
    if isinstance(r.get(key), (int, float)) and math.isfinite(float(r[key]))
  ]


def _smooth(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
  """The moving average over ~5% of the run."""
  w = max(1, len(points) // 20)
  return [
    (points[i][0], sum(v for _, v in points[max(0, i - w + 1) : i + 1]) / min(w, i + 1))
    for i in range(len(points))
  ]


_COLORS = ("#d62", "#2a7", "#a3c", "#c90", "#39c", "#777")


def curve_panels(records: list[dict]) -> list[tuple[str, list[tuple[str, list, str]], bool]]:
  """(title, [(label, points, style)], y from 0 to 1) per panel of `plot_svg`: the
  accuracies, then entropy, KL to the reference, response length, loss and gradient norm
  where the records hold them. Styles: "thin", "line", "thick" (with points), "dashed"."""
  reward = _series(records, "accuracy")
  acc = [
    ("training reward", reward, "thin"),
    ("training reward (moving avg)", _smooth(reward), "line"),
  ]
  acc.append(("held-out greedy accuracy", _series(records, "eval/greedy_accuracy"), "thick"))
  passes = sorted(
    {k for r in records for k in r if k.startswith("eval/pass@")}, key=lambda k: int(k[10:])
  )
  acc += [(k.removeprefix("eval/"), _series(records, k), "dashed") for k in passes]
  kl_keys = sorted({k for r in records for k in r if k.startswith("kl_ref/")}) or ["ppo_kl"]
  panels = [
    ("accuracy", acc, True),
    ("entropy", [("entropy", _series(records, "entropy"), "line")], False),
  ]
  panels.append(("KL", [(k, _series(records, k), "line") for k in kl_keys], False))
  for key, title in (
    ("response_length", "response length (tokens)"),
    ("loss", "loss"),
    ("grad_norm", "gradient norm"),
  ):
    panels.append((title, [(key, _series(records, key), "line")], False))
  return [
    (t, [x for x in lines if x[1]], unit) for t, lines, unit in panels if any(x[1] for x in lines)
  ]


def _panel(title, lines, *, box, x_max: int, unit: bool) -> list[str]:
  """One panel of `plot_svg`: a frame, its title, y ticks, and its lines with a legend."""
  left, top, w, h = box
  ys = [y for _, pts, _ in lines for _, y in pts]
  y0, y1 = (0.0, 1.0) if unit else (min(ys), max(ys))
  if y1 - y0 < 1e-12:
    y0, y1 = y0 - 0.5, y1 + 0.5
  xr, yr = (0, x_max), (y0, y1)
  parts = [
    f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>',
    f'<text x="{left + w / 2}" y="{top - 6}" text-anchor="middle">{title}</text>',
  ]
  for frac in (0.0, 0.5, 1.0):
    y = top + h * (1 - frac)
    parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
    parts.append(
      f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{y0 + frac * (y1 - y0):.3g}</text>'
    )
  parts.append(f'<text x="{left}" y="{top + h + 12}" text-anchor="start">0</text>')
  parts.append(f'<text x="{left + w}" y="{top + h + 12}" text-anchor="end">{x_max}</text>')
  styles = {"thin": ("#bbd", 1.0, ""), "line": ("#35a", 1.5, ""), "thick": ("#d62", 2.0, "")}
  extra = iter(_COLORS[1:])
  for i, (label, pts, style) in enumerate(lines):
    color, width, dash = styles.get(style) or (next(extra, "#777"), 1.2, "4,3")
    xs, vals = [x for x, _ in pts], [y for _, y in pts]
    parts.append(
      _polyline(xs, vals, x_range=xr, y_range=yr, box=box, color=color, width=width, dash=dash)
    )
    if style == "thick":
      parts += [
        f'<circle cx="{left + w * x / x_max:.1f}" cy="{top + h * (1 - (y - y0) / (y1 - y0)):.1f}" r="2.5" fill="{color}"/>'
        for x, y in pts
      ]
    if style != "thin":
      y = top + 12 + 12 * i
      parts.append(
        f'<line x1="{left + 6}" x2="{left + 20}" y1="{y - 4}" y2="{y - 4}" stroke="{color}" stroke-width="2"/>'
      )
      parts.append(f'<text x="{left + 24}" y="{y}">{label}</text>')
  return parts


def plot_svg(records: list[dict], path: pathlib.Path, *, title: str = "") -> pathlib.Path:
  """Writes a dependency-free SVG of the run's curves, one panel each (`curve_panels`):
  training reward (thin, and its moving average), held-out greedy accuracy (thick, with
  points) and pass@k (dashed); entropy; KL to the reference; response length; loss;
  gradient norm."""
  panels = curve_panels(records)
  x_max = max([1] + [r["iteration"] for r in records if "iteration" in r])
  cols, pw, ph, pad = 2, 400, 190, 56
  rows = max(1, math.ceil(len(panels) / cols))
  W, H = cols * (pw + pad) + pad / 2, rows * (ph + pad) + 28
  parts = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{W:.0f}" height="{H:.0f}" font-family="sans-serif" font-size="10">',
    f'<text x="{W / 2}" y="14" font-size="12" text-anchor="middle">{title} (x: iteration)</text>',
  ]
  for i, (name, lines, unit) in enumerate(panels):
    box = (pad + (i % cols) * (pw + pad), 40 + (i // cols) * (ph + pad), pw, ph)
    parts += _panel(name, lines, box=box, x_max=x_max, unit=unit)
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
    except (OSError, ValueError):  # ValueError: closed (at interpreter exit).
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
  threads, "exception ignored" reports (TensorStore reads landing after a failed
  checkpoint write or read closed their event loop) and libraries' warnings ("coroutine
  ... was never awaited" from orbax's abandoned saves); grpo_jax's own warnings stay on
  the terminal. A failed save prints hundreds of such lines before the one line that says
  what happened; the terminal keeps grpo_jax's own output. Before the hooks come back,
  a garbage collection reports what the block left unreferenced (those coroutines) while
  it is still redirected. Yields the stream (its `written` says whether anything went
  there)."""
  out = _LazyLog(path)
  handlers = _terminal_handlers()
  streams = [h.stream for h in handlers]
  saved = (logging.lastResort, threading.excepthook, sys.unraisablehook, warnings.showwarning)
  ours = str(pathlib.Path(__file__).resolve().parent.parent)  # grpo_jax/

  def thread_hook(args):
    name = args.thread.name if args.thread is not None else "?"
    out.write(f"Exception in thread {name}:\n")
    traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=out)

  def unraisable_hook(u):
    out.write(f"{u.err_msg or 'Exception ignored in'}: {u.object!r}\n")
    traceback.print_exception(u.exc_type, u.exc_value, u.exc_traceback, file=out)

  def show_warning(message, category, filename, lineno, file=None, line=None):
    if str(filename).startswith(ours):  # grpo_jax's own: the user should see it.
      saved[3](message, category, filename, lineno, file, line)
    else:
      out.write(warnings.formatwarning(message, category, filename, lineno, line))

  for h in handlers:
    h.stream = out
  logging.lastResort = logging.StreamHandler(out)
  threading.excepthook, sys.unraisablehook = thread_hook, unraisable_hook
  warnings.showwarning = show_warning
  abandoned = False
  try:
    yield out
  except GeneratorExit:
    # Never exited, only dropped: the command line leaves the redirection in place when a
    # run fails (`main`), and once its frame is gone the generator is collected. Orbax's
    # event loops report until the process exits ("Task exception was never retrieved"):
    # that stays in the log, not after the error line.
    abandoned = True
    raise
  finally:
    if not abandoned:
      gc.collect()
      for h, stream in zip(handlers, streams, strict=True):
        h.stream = stream
      logging.lastResort, threading.excepthook, sys.unraisablehook, warnings.showwarning = saved
      out.close()
