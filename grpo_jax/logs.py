"""Run logs on the host: metrics.jsonl, TensorBoard event files and a console progress line.

    writer = logs.RunLogger(workdir, resume_from=k)   # drops lines with iteration > k
    writer.write(record)                             # one JSON line + TensorBoard scalars
    progress = logs.Progress(total=300, start=k)     # '\r' line on a TTY, else every ~5%

Every key of a record is defined in `grpo_jax.metrics.DEFINITIONS`.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import numpy as np

from grpo_jax import tensorboard


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
  """Appends records to workdir/metrics.jsonl and workdir/tb (TensorBoard, no TF needed).

  On resume from iteration k, lines with iteration > k (written after the checkpoint the
  run resumes from) are dropped first, and TensorBoard is told to purge steps > k, so
  every iteration appears once.
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
      purge = None if resume_from is None else resume_from + 1
      self._tb = tensorboard.SummaryWriter(pathlib.Path(workdir) / "tb", purge_step=purge)

  def write(self, record: dict) -> None:
    self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
    self._f.flush()
    if self._tb is not None:
      self._tb.scalars({k: v for k, v in record.items() if k != "iteration"}, record["iteration"])

  def close(self) -> None:
    self._f.close()
    if self._tb is not None:
      self._tb.close()


class NullLogger:
  """RunLogger's interface, writing nothing (the non-primary processes of a job)."""

  def write(self, record: dict) -> None:
    del record

  def close(self) -> None:
    pass


class Progress:
  """One status line: iteration, reward, last eval accuracy, throughput, ETA.

  On a terminal the line is redrawn in place; elsewhere (logs, notebooks, CI) it is
  printed through `log` about every 5% of the run.
  """

  def __init__(
    self,
    *,
    total: int,
    start: int = 0,
    accuracy: float = float("nan"),
    enabled: bool = True,
    log=print,
    stream=None,
  ):
    self.total, self.start, self.enabled, self.log = total, start, enabled, log
    self.stream = stream or sys.stderr
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.every = max(1, total // 20)
    self.t0 = time.perf_counter()
    self.acc = accuracy  # The latest held-out accuracy, shown until the next evaluation.
    self._open_line = False

  def line(self, it: int, record: dict) -> str:
    if "eval/greedy_accuracy" in record:
      self.acc = record["eval/greedy_accuracy"]
    done = it - self.start
    rate = (time.perf_counter() - self.t0) / max(done, 1)
    eta = rate * (self.total - it)
    return (
      f"[{it:>{len(str(self.total))}}/{self.total}] reward {record.get('accuracy', float('nan')):.3f}"
      f"  eval acc {self.acc:.3f}  {record.get('tokens_per_s', 0.0):,.0f} tok/s"
      f"  {rate:.2f} s/it  ETA {eta:.0f}s"
    )

  def update(self, it: int, record: dict) -> None:
    if not self.enabled:
      return
    text = self.line(it, record)
    if self.tty:
      self.stream.write("\r" + text)
      self.stream.flush()
      self._open_line = True
    elif it % self.every == 0 or it == self.total:
      self.log(text)

  def close(self) -> None:
    if self._open_line:
      self.stream.write("\n")
      self.stream.flush()
      self._open_line = False


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
