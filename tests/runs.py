"""Runs in tests: the small config they share, a run's metrics lines, and a line without the
keys that measure time (they differ between two otherwise identical runs)."""

import pathlib

from grpo_jax.infra import config_lib, logs

ROOT = pathlib.Path(__file__).resolve().parent.parent


def small_arithmetic():
  """configs/arithmetic.py:quick (a 1-layer model) on 1-digit sums, G = 4, warm-start
  batches of 16: it learns within 120 warm-start steps and compiles in a fraction of the
  tiny config's time."""
  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":quick")
  c.task.kwargs.max_digits = 1
  c.sampler.group_size = 4
  c.warmstart_batch = 16
  return c


TIMING = ("time/", "tokens_per_s", "perf/")


def lines(workdir) -> list[dict]:
  """workdir/metrics.jsonl as records."""
  return logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")


def untimed(record: dict) -> dict:
  """The record without its timing keys."""
  return {k: v for k, v in record.items() if not k.startswith(TIMING)}
