"""The one JSONL reader: a file of JSON objects, one per line.

    records = jsonl.read("problems.jsonl")                                  # strict
    records = jsonl.read(workdir / "metrics.jsonl", missing_ok=True, torn_tail=True)

Blank lines are skipped. A line that is not JSON, or not a JSON object, is a ValueError
naming the file and the line (`path:line: ...`), except, with `torn_tail`, the last line:
a process killed mid-write leaves it cut short, and it is dropped. With `missing_ok` a
file that does not exist reads as [] (a run's log before its first record).

Two readers stay their own, each for a reason: the problem files' (`tasks.problem_records`)
turns a bad record into a counted Skip instead of an error, and the judge cache's
(`rewards.judges`) truncates a torn last line away so that appends start clean.
"""

from __future__ import annotations

import json
import os
import pathlib


def read(path, *, missing_ok: bool = False, torn_tail: bool = False) -> list[dict]:
  """The objects of the JSONL file at `path` (see the module docstring)."""
  path = pathlib.Path(path)
  if missing_ok and not path.exists():
    return []
  with open(os.fspath(path), encoding="utf-8") as f:
    lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
  records = []
  for k, (number, line) in enumerate(lines):
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      if torn_tail and k == len(lines) - 1:
        break
      raise ValueError(f"{path}:{number}: not valid JSON ({e}).") from None
    if not isinstance(record, dict):
      raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}.")
    records.append(record)
  return records
