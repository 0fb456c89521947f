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

from grpo_jax import tensorboard


def _clean(v):
  if isinstance(v, (str, bool, int)) or v is None:
    return v
  f = float(v)
  return f if math.isfinite(f) else str(f)  # JSON has no NaN/inf: "nan", "inf".


def read_jsonl(path: pathlib.Path) -> list[dict]:
  path = pathlib.Path(path)
  return (
    [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
  )


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


class Progress:
  """One status line: iteration, reward, last eval accuracy, throughput, ETA.

  On a terminal the line is redrawn in place; elsewhere (logs, notebooks, CI) it is
  printed through `log` about every 5% of the run.
  """

  def __init__(self, *, total: int, start: int = 0, enabled: bool = True, log=print, stream=None):
    self.total, self.start, self.enabled, self.log = total, start, enabled, log
    self.stream = stream or sys.stderr
    self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
    self.every = max(1, total // 20)
    self.t0 = time.perf_counter()
    self.acc = float("nan")
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
