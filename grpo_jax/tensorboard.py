"""Dependency-free TensorBoard scalar logging: an event-file writer and a checking reader.

What it writes. `SummaryWriter(logdir)` creates one new file per writer,
`logdir/events.out.tfevents.<int wall time>.<hostname>.<pid>.<n>` (TensorBoard reads every
file whose name contains "tfevents"; the pid and a zero-padded per-process counter keep two
writers in the same second apart, in creation order). The first record is an `Event` with `file_version: "brain.Event:2"`;
each later record is an `Event` with `wall_time`, `step` and a `Summary` holding one
`simple_value` per scalar. Resuming into an existing directory opens a new file beside the
old ones, which is what TensorBoard itself does. TensorBoard shows the files of a directory
as one run, so a run resumed from an earlier checkpoint would show the steps logged after that
checkpoint twice; `SummaryWriter(logdir, purge_step=s)` writes a SessionLog START event at
step s, which makes TensorBoard drop the old file's events with step >= s (as
`torch.utils.tensorboard.SummaryWriter(purge_step=...)` does).

Format. Records are framed in the TFRecord format
(https://www.tensorflow.org/tutorials/load_data/tfrecord#tfrecords_format_details):

  uint64 length           little-endian
  uint32 masked_crc32c(length bytes)
  byte   data[length]
  uint32 masked_crc32c(data)

with crc32c the Castagnoli CRC (RFC 3720, appendix B.4) and
masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32). The data is a serialized
protobuf, encoded here by hand, following tensorflow/core/util/event.proto and
tensorflow/core/framework/summary.proto:

  Event          wall_time double = 1; step int64 = 2; file_version string = 3;
                 summary Summary = 5
  Summary        repeated Value value = 1
  Summary.Value  tag string = 1; simple_value float = 2
  SessionLog     status SessionStatus = 1 (START = 1); Event.session_log = 7

`simple_value` is a float32, so logged values are rounded to float32.

Reading. `read_scalars(path_or_dir)` returns `[(step, tag, value), ...]` from one event file
or from every event file in a directory (sorted by file name, so by creation second), checking
both CRCs of every record; it raises ValueError naming the file and byte offset of a corrupt
or truncated record. It returns every record as written (no purging at a SessionLog START).
Only `simple_value` scalars are returned (other summaries, such as the tensor summaries of
`tf.summary` v2, are skipped).

Viewing. `pip install tensorboard` (not a dependency of this package), then
`tensorboard --logdir WORKDIR/tb`.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import pathlib
import socket
import struct
import time

FILE_VERSION = "brain.Event:2"
_FILE_MARKER = "tfevents"
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF
_WRITER_IDS = itertools.count()
_SESSION_START = 1  # SessionLog.SessionStatus.START in tensorflow/core/util/event.proto.

# Protobuf wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


# ----------------------------------------------------------------------------
# CRC32-C (Castagnoli), reflected polynomial 0x82F63B78.
# ----------------------------------------------------------------------------


def _crc32c_table() -> tuple[int, ...]:
  """The 256-entry byte-at-a-time table for the reflected Castagnoli polynomial."""
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    table.append(crc)
  return tuple(table)


_CRC32C_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC32-C of `data` (crc32c(b"123456789") == 0xE3069283)."""
  crc = _U32
  table = _CRC32C_TABLE
  for byte in data:
    crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  return crc ^ _U32


def masked_crc32c(data: bytes) -> int:
  """The TFRecord checksum: crc32c rotated right by 15 bits plus 0xa282ead8, mod 2^32."""
  crc = crc32c(data)
  return ((((crc >> 15) | (crc << 17)) & _U32) + _MASK_DELTA) & _U32


# ----------------------------------------------------------------------------
# TFRecord framing.
# ----------------------------------------------------------------------------


def frame(data: bytes) -> bytes:
  """One TFRecord: length, masked crc of the length, data, masked crc of the data."""
  length = struct.pack("<Q", len(data))
  return (
    length
    + struct.pack("<I", masked_crc32c(length))
    + data
    + struct.pack("<I", masked_crc32c(data))
  )


def read_records(path: str | os.PathLike) -> list[tuple[int, bytes]]:
  """(byte offset, payload) of every TFRecord in `path`, both CRCs checked: a corrupt or
  truncated record raises ValueError naming the file and the record's offset."""
  buf = pathlib.Path(path).read_bytes()
  records, offset = [], 0
  while offset < len(buf):
    data, end = _unframe(buf, offset, path=path)
    records.append((offset, data))
    offset = end
  return records


def _unframe(buf: bytes, offset: int, *, path) -> tuple[bytes, int]:
  """The record starting at `offset` and the offset just past it."""
  if offset + 12 > len(buf):
    raise ValueError(f"{path}: truncated record header at byte offset {offset}")
  header = buf[offset : offset + 8]
  (length,) = struct.unpack("<Q", header)
  (length_crc,) = struct.unpack("<I", buf[offset + 8 : offset + 12])
  if masked_crc32c(header) != length_crc:
    raise ValueError(f"{path}: length CRC mismatch at byte offset {offset} (corrupt record)")
  start, stop = offset + 12, offset + 12 + length
  if stop + 4 > len(buf):
    raise ValueError(f"{path}: truncated record at byte offset {offset}")
  data = buf[start:stop]
  (data_crc,) = struct.unpack("<I", buf[stop : stop + 4])
  if masked_crc32c(data) != data_crc:
    raise ValueError(f"{path}: data CRC mismatch at byte offset {offset} (corrupt record)")
  return data, stop + 4


# ----------------------------------------------------------------------------
# Protobuf encoding (just the wire types the Event message needs).
# ----------------------------------------------------------------------------


def _varint(value: int) -> bytes:
  """Base-128 varint; negative int64 values as their 64-bit two's complement (10 bytes)."""
  value &= _U64
  out = bytearray()
  while value > 0x7F:
    out.append((value & 0x7F) | 0x80)
    value >>= 7
  out.append(value)
  return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
  return _varint((field << 3) | wire_type)


def _len_field(field: int, payload: bytes) -> bytes:
  return _key(field, _LEN) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
  """Little-endian float32; finite values beyond its range become ±inf (as in NumPy)."""
  try:
    return struct.pack("<f", value)
  except OverflowError:
    return struct.pack("<f", math.copysign(math.inf, value))


def encode_value(tag: str, value: float) -> bytes:
  """A serialized Summary.Value {tag = 1, simple_value = 2 (float32)}."""
  return _len_field(1, tag.encode("utf-8")) + _key(2, _I32) + _float32(value)


def encode_event(
  *,
  wall_time: float,
  step: int = 0,
  file_version: str | None = None,
  scalars=(),
  session_start: bool = False,
) -> bytes:
  """A serialized Event; `scalars` is an iterable of (tag, value) put in its Summary;
  `session_start` adds session_log = 7 {status = 1 (START)}."""
  out = _key(1, _I64) + struct.pack("<d", wall_time)
  if step:
    out += _key(2, _VARINT) + _varint(step)
  if file_version is not None:
    out += _len_field(3, file_version.encode("utf-8"))
  values = b"".join(_len_field(1, encode_value(tag, value)) for tag, value in scalars)
  if values:
    out += _len_field(5, values)
  if session_start:
    out += _len_field(7, _key(1, _VARINT) + _varint(_SESSION_START))
  return out


# ----------------------------------------------------------------------------
# Protobuf decoding.
# ----------------------------------------------------------------------------


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
  result, shift = 0, 0
  while True:
    if pos >= len(buf):
      raise ValueError("truncated varint")
    byte = buf[pos]
    pos += 1
    result |= (byte & 0x7F) << shift
    if not byte & 0x80:
      return result, pos
    shift += 7
    if shift >= 70:
      raise ValueError("varint too long")


def _fields(buf: bytes):
  """Yields (field number, wire type, value) of a serialized message; value is an int for
  varints, bytes for the rest (8 bytes, 4 bytes or the length-delimited payload)."""
  pos = 0
  while pos < len(buf):
    key, pos = _read_varint(buf, pos)
    field, wire_type = key >> 3, key & 7
    if wire_type == _VARINT:
      value, pos = _read_varint(buf, pos)
    elif wire_type in (_I64, _I32):
      size = 8 if wire_type == _I64 else 4
      value, pos = buf[pos : pos + size], pos + size
    elif wire_type == _LEN:
      size, pos = _read_varint(buf, pos)
      value, pos = buf[pos : pos + size], pos + size
    else:
      raise ValueError(f"unsupported protobuf wire type {wire_type}")
    if pos > len(buf):
      raise ValueError("truncated protobuf field")
    yield field, wire_type, value


def _as_int64(value: int) -> int:
  return value - (1 << 64) if value >= 1 << 63 else value


def decode_value(buf: bytes) -> tuple[str, float | None]:
  """(tag, simple_value) of a serialized Summary.Value; None if it has no simple_value."""
  tag, value = "", None
  for field, wire_type, payload in _fields(buf):
    if field == 1 and wire_type == _LEN:
      tag = payload.decode("utf-8")
    elif field == 2 and wire_type == _I32:
      (value,) = struct.unpack("<f", payload)
  return tag, value


def decode_event(buf: bytes) -> dict:
  """A serialized Event as {"wall_time", "step", "file_version", "scalars": [(tag, value)],
  "session_start": bool}."""
  event = {
    "wall_time": 0.0,
    "step": 0,
    "file_version": None,
    "scalars": [],
    "session_start": False,
  }
  for field, wire_type, payload in _fields(buf):
    if field == 1 and wire_type == _I64:
      (event["wall_time"],) = struct.unpack("<d", payload)
    elif field == 2 and wire_type == _VARINT:
      event["step"] = _as_int64(payload)
    elif field == 3 and wire_type == _LEN:
      event["file_version"] = payload.decode("utf-8")
    elif field == 5 and wire_type == _LEN:
      values = (decode_value(p) for f, w, p in _fields(payload) if f == 1 and w == _LEN)
      event["scalars"] += [(tag, v) for tag, v in values if v is not None]
    elif field == 7 and wire_type == _LEN:
      status = [v for f, w, v in _fields(payload) if f == 1 and w == _VARINT]
      event["session_start"] = status[-1:] == [_SESSION_START]
  return event


# ----------------------------------------------------------------------------
# Reading.
# ----------------------------------------------------------------------------


def event_files(path_or_dir: str | os.PathLike) -> list[pathlib.Path]:
  """`path_or_dir` itself if a file, else the event files directly in it, sorted by name."""
  path = pathlib.Path(path_or_dir)
  if path.is_file():
    return [path]
  return sorted(p for p in path.iterdir() if _FILE_MARKER in p.name and p.is_file())


def read_events(path_or_dir: str | os.PathLike) -> list[dict]:
  """Every Event (see `decode_event`) of a file or directory, CRCs checked."""
  events = []
  for path in event_files(path_or_dir):
    for offset, data in read_records(path):
      try:
        events.append(decode_event(data))
      except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: bad Event protobuf at byte offset {offset}: {e}") from e
  return events


def read_scalars(path_or_dir: str | os.PathLike) -> list[tuple[int, str, float]]:
  """[(step, tag, value)] of every simple_value in a file or directory, in file order."""
  return [
    (event["step"], tag, value)
    for event in read_events(path_or_dir)
    for tag, value in event["scalars"]
  ]


# ----------------------------------------------------------------------------
# Writing.
# ----------------------------------------------------------------------------


def event_file_name(*, wall_time: float, hostname: str, suffix: str = "") -> str:
  """TensorBoard's convention: events.out.tfevents.<int wall time>.<hostname><suffix>."""
  return f"events.out.{_FILE_MARKER}.{int(wall_time):010d}.{hostname}{suffix}"


def as_scalar(value) -> float | None:
  """`value` as a float if it is a real number (Python, NumPy or a 0-d array), else None.

  Strings, bools, None, complex numbers and arrays with more than one element give None.
  NaN and ±inf are kept (TensorBoard plots them as such)."""
  if isinstance(value, (str, bytes, bool)) or value is None:
    return None
  is_real = isinstance(value, numbers.Real)
  is_0d = getattr(value, "shape", None) == () and "bool" not in str(getattr(value, "dtype", ""))
  if not (is_real or is_0d):
    return None
  try:
    return float(value)
  except OverflowError:  # An int beyond the float range.
    return math.inf if value > 0 else -math.inf
  except (TypeError, ValueError):  # E.g. a complex 0-d array.
    return None


class SummaryWriter:
  """Appends scalar summaries to a new event file in `logdir` (created if missing).

  Records are buffered and flushed after `flush_every` writes or once `flush_secs` have passed
  since the last flush (checked on each write), and on `flush()` and `close()` (also on
  leaving a `with` block). `purge_step` (when resuming from a checkpoint at that step) makes
  TensorBoard hide earlier files' events at steps >= purge_step. `clock` gives the wall time
  in seconds. Not thread-safe."""

  def __init__(
    self,
    logdir: str | os.PathLike,
    *,
    flush_every: int = 20,
    flush_secs: float = 10.0,
    purge_step: int | None = None,
    clock=time.time,
  ):
    if flush_every < 1:
      raise ValueError(f"flush_every must be >= 1, got {flush_every}")
    self.logdir = pathlib.Path(logdir)
    self.logdir.mkdir(parents=True, exist_ok=True)
    self._clock = clock
    self._flush_every = flush_every
    self._flush_secs = flush_secs
    self._pending = 0
    now = clock()
    suffix = f".{os.getpid()}.{next(_WRITER_IDS):06d}"  # Name order = creation order.
    name = event_file_name(wall_time=now, hostname=socket.gethostname(), suffix=suffix)
    self.path = self.logdir / name
    self._f = self.path.open("xb")  # Never clobber another writer's file.
    self._write(encode_event(wall_time=now, file_version=FILE_VERSION))
    if purge_step is not None:
      self._write(encode_event(wall_time=now, step=int(purge_step), session_start=True))
    self.flush()

  def scalar(self, tag: str, value: float, step: int):
    """Logs one scalar; `value` must be a real number (see `as_scalar`)."""
    number = as_scalar(value)
    if number is None:
      raise TypeError(f"scalar {tag!r}: not a real number: {value!r}")
    self._write_scalars([(tag, number)], step)

  def scalars(self, record: dict, step: int):
    """Logs every real-number value of `record` under its key as one Event at `step`;
    other values (strings, bools, None, arrays) are skipped."""
    pairs = [(str(tag), as_scalar(v)) for tag, v in record.items()]
    self._write_scalars([(tag, v) for tag, v in pairs if v is not None], step)

  def flush(self):
    """Writes buffered records to the OS (TensorBoard then sees them)."""
    self._f.flush()
    self._pending = 0
    self._last_flush = self._clock()

  def close(self):
    """Flushes and closes the file; further writes raise ValueError. Idempotent."""
    if not self._f.closed:
      self.flush()
      self._f.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self.close()

  def _write_scalars(self, pairs: list[tuple[str, float]], step: int):
    if not pairs:
      return
    now = self._clock()
    self._write(encode_event(wall_time=now, step=int(step), scalars=pairs))
    self._pending += 1
    if self._pending >= self._flush_every or now - self._last_flush >= self._flush_secs:
      self.flush()

  def _write(self, data: bytes):
    self._f.write(frame(data))
