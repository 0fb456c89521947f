"""Reading a run's metrics in tests: its lines, and a line without the keys that measure time
(they differ between two otherwise identical runs)."""

import pathlib

from grpo_jax import logs

TIMING = ("time/", "tokens_per_s", "perf/")


def lines(workdir) -> list[dict]:
  """workdir/metrics.jsonl as records."""
  return logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")


def untimed(record: dict) -> dict:
  """The record without its timing keys."""
  return {k: v for k, v in record.items() if not k.startswith(TIMING)}
