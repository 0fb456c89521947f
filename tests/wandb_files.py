"""Read back what an offline W&B run wrote: its run-<id>.wandb transaction log.

wandb 0.31 no longer ships a Python reader for these files (its Go core writes and syncs
them). The format is LevelDB's log: a 7-byte header (":W&B", magic 0xBEE1, version 0),
then 32 KiB blocks of records, each a 7-byte header (CRC32, length u16, type u8: 1 full,
2 first, 3 middle, 4 last) and its bytes; a record is a `wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import pathlib
import struct

_BLOCK = 32 * 1024
_HEADER = 7


def records(path: pathlib.Path) -> list:
  """Every Record of one .wandb file, in order."""
  from wandb.proto import wandb_internal_pb2  # noqa: PLC0415

  data = pathlib.Path(path).read_bytes()
  assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
  out, pos, pending = [], _HEADER, b""
  while pos + _HEADER <= len(data):
    left = _BLOCK - pos % _BLOCK
    if left < _HEADER:  # Block trailer: zero padding.
      pos += left
      continue
    _, n, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
    if n == 0 and kind == 0:  # Zero-filled rest of a block.
      pos += left
      continue
    chunk = data[pos + _HEADER : pos + _HEADER + n]
    pos += _HEADER + n
    pending = chunk if kind in (1, 2) else pending + chunk
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      out.append(record)
      pending = b""
  return out


def history(path: pathlib.Path) -> list[dict]:
  """The logged rows (`run.log` calls): {key: value}, W&B's own keys (_step, ...) left out."""
  rows = []
  for r in records(path):
    if r.WhichOneof("record_type") == "history":
      row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
      rows.append({k: v for k, v in row.items() if not k.startswith("_")})
  return rows


def run_config(path: pathlib.Path) -> dict:
  """The run's config as its first "run" record holds it."""
  for r in records(path):
    if r.WhichOneof("record_type") == "run":
      return {u.key: json.loads(u.value_json) for u in r.run.config.update}
  return {}


def run_id(path: pathlib.Path) -> str:
  for r in records(path):
    if r.WhichOneof("record_type") == "run":
      return r.run.run_id
  return ""
