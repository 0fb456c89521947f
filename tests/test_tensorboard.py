"""TensorBoard event files: CRC32-C vectors, hand-checked protobuf bytes, write/read round
trips, corruption detection, flushing and resume; TensorBoard's own reader if installed."""

import math
import pathlib
import re
import socket
import struct

import numpy as np
import pytest

from grpo_jax import tensorboard

# RFC 3720 appendix B.4 (iSCSI CRC32-C) and the usual check value.
CRC32C_VECTORS = [
  (b"", 0x00000000),
  (b"123456789", 0xE3069283),
  (bytes(32), 0x8A9136AA),
  (b"\xff" * 32, 0x62A8AB43),
  (bytes(range(32)), 0x46DD794E),
  (bytes(range(31, -1, -1)), 0x113FDB5C),
]


class FakeClock:
  """A wall clock that moves only when told to."""

  def __init__(self, now: float = 1_700_000_000.25):
    self.now = now

  def __call__(self) -> float:
    return self.now


def f32(value: float) -> float:
  return float(np.float32(value))


def write_run(logdir, steps_records, **options) -> pathlib.Path:
  with tensorboard.SummaryWriter(logdir, **options) as writer:
    for step, record in steps_records:
      writer.scalars(record, step=step)
  return writer.path


# ----------------------------------------------------------------------------
# Encoding.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "expected"), CRC32C_VECTORS)
def test_crc32c_rfc3720_vectors(data, expected):
  assert tensorboard.crc32c(data) == expected


def test_masked_crc32c():
  # mask(0) = 0xa282ead8; mask(0xE3069283) = rotr15(0xE3069283) + 0xa282ead8 mod 2^32
  # = 0x2507C60D + 0xA282EAD8 = 0xC78AB0E5.
  assert tensorboard.masked_crc32c(b"") == 0xA282EAD8
  assert tensorboard.masked_crc32c(b"123456789") == 0xC78AB0E5


def test_frame_layout():
  data = b"hello"
  framed = tensorboard.frame(data)
  assert len(framed) == 8 + 4 + len(data) + 4
  assert framed[:8] == struct.pack("<Q", 5)
  assert framed[8:12] == struct.pack("<I", tensorboard.masked_crc32c(framed[:8]))
  assert framed[12:17] == data
  assert framed[17:] == struct.pack("<I", tensorboard.masked_crc32c(data))


def test_event_bytes_by_hand():
  value = b"\x0a\x01a" + b"\x15" + struct.pack("<f", 1.0)  # tag = 1, simple_value = 2
  assert tensorboard.encode_value("a", 1.0) == value
  event = tensorboard.encode_event(wall_time=2.5, step=300, scalars=[("a", 1.0)])
  summary = b"\x0a" + bytes([len(value)]) + value  # Summary.value = 1
  expected = (
    b"\x09" + struct.pack("<d", 2.5)  # wall_time = 1, fixed64
    + b"\x10\xac\x02"  # step = 2, varint 300
    + b"\x2a" + bytes([len(summary)]) + summary  # summary = 5
  )  # fmt: skip
  assert event == expected
  header = tensorboard.encode_event(wall_time=2.5, file_version="brain.Event:2")
  assert header == b"\x09" + struct.pack("<d", 2.5) + b"\x1a\x0dbrain.Event:2"


def test_session_start_bytes_by_hand():
  event = tensorboard.encode_event(wall_time=0.0, step=4, session_start=True)
  assert event == b"\x09" + bytes(8) + b"\x10\x04" + b"\x3a\x02\x08\x01"  # session_log = 7
  decoded = tensorboard.decode_event(event)
  assert decoded["session_start"] and decoded["step"] == 4
  assert not tensorboard.decode_event(tensorboard.encode_event(wall_time=0.0))["session_start"]


@pytest.mark.parametrize("step", [0, 1, 127, 128, 2**40, 2**63 - 1, -1, -(2**63)])
def test_event_step_round_trip(step):
  event = tensorboard.decode_event(tensorboard.encode_event(wall_time=1.0, step=step))
  assert event["step"] == step
  assert event["wall_time"] == 1.0


def test_negative_step_is_ten_byte_varint():
  event = tensorboard.encode_event(wall_time=0.0, step=-1)
  assert event[9:] == b"\x10" + b"\xff" * 9 + b"\x01"


def test_float32_overflow_becomes_inf():
  event = tensorboard.decode_event(
    tensorboard.encode_event(wall_time=0.0, scalars=[("big", 1e300), ("small", -1e300)])
  )
  assert event["scalars"] == [("big", math.inf), ("small", -math.inf)]


# ----------------------------------------------------------------------------
# Writing and reading back.
# ----------------------------------------------------------------------------


def test_file_name_and_header(tmp_path):
  clock = FakeClock(1_234_567_890.75)
  with tensorboard.SummaryWriter(tmp_path / "tb", clock=clock) as writer:
    pass
  host = re.escape(socket.gethostname())
  assert re.fullmatch(rf"events\.out\.tfevents\.1234567890\.{host}\.\d+\.\d{{6}}", writer.path.name)
  assert writer.path.parent == tmp_path / "tb"
  [(offset, data)] = tensorboard.read_records(writer.path)
  assert offset == 0
  event = tensorboard.decode_event(data)
  assert event == {
    "wall_time": 1_234_567_890.75,
    "step": 0,
    "file_version": "brain.Event:2",
    "scalars": [],
    "session_start": False,
  }


def test_round_trip(tmp_path):
  records = [
    (0, {"loss": 0.1, "reward": 1.0}),
    (1, {"loss": 1 / 3, "reward": -2.5e-8}),
    (7, {"loss": 123456.789, "kl": 3.4e38}),
    (2**40, {"loss": math.nan, "kl": math.inf, "reward": -math.inf}),
  ]
  path = write_run(tmp_path, records)
  got = tensorboard.read_scalars(path)
  expected = [(step, tag, f32(v)) for step, record in records for tag, v in record.items()]
  assert [(s, t) for s, t, _ in got] == [(s, t) for s, t, _ in expected]
  np.testing.assert_array_equal([v for *_, v in got], [v for *_, v in expected])
  assert got[0][2] != 0.1  # float32 rounding really happened.
  assert repr(tensorboard.read_scalars(tmp_path)) == repr(got)  # Directory and file agree.


def test_wall_times_come_from_clock(tmp_path):
  clock = FakeClock(100.0)
  with tensorboard.SummaryWriter(tmp_path, clock=clock) as writer:
    clock.now = 105.5
    writer.scalar("x", 1.0, step=3)
  events = tensorboard.read_events(writer.path)
  assert [(e["wall_time"], e["step"]) for e in events] == [(100.0, 0), (105.5, 3)]


def test_scalars_keeps_numbers_and_skips_the_rest(tmp_path):
  record = {
    "float": 0.5,
    "int": 7,
    "np_float32": np.float32(2.5),
    "np_int64": np.int64(-3),
    "np_0d": np.array(4.25),
    "nan": math.nan,
    "huge_int": 10**400,
    "phase": "rl",
    "bytes": b"x",
    "flag": True,
    "np_flag": np.bool_(False),
    "none": None,
    "vector": np.zeros(3),
    "complex": 1j,
    "list": [1.0],
  }
  path = write_run(tmp_path, [(5, record)])
  got = {tag: value for _, tag, value in tensorboard.read_scalars(path)}
  assert list(got) == ["float", "int", "np_float32", "np_int64", "np_0d", "nan", "huge_int"]
  assert got["float"] == 0.5 and got["int"] == 7.0 and got["np_0d"] == 4.25
  assert got["np_float32"] == 2.5 and got["np_int64"] == -3.0
  assert math.isnan(got["nan"]) and got["huge_int"] == math.inf
  # One Event per scalars() call; a record with nothing numeric writes no Event.
  with tensorboard.SummaryWriter(tmp_path) as writer:
    writer.scalars({"phase": "rl"}, step=1)
  assert len(tensorboard.read_events(writer.path)) == 1


def test_scalar_rejects_non_numbers(tmp_path):
  with tensorboard.SummaryWriter(tmp_path) as writer:
    with pytest.raises(TypeError, match="'phase'"):
      writer.scalar("phase", "rl", step=0)
    writer.scalar("ok", np.float64(1.5), step=0)
  assert tensorboard.read_scalars(writer.path) == [(0, "ok", 1.5)]


def test_resume_writes_a_new_file_and_keeps_the_old(tmp_path):
  clock = FakeClock()  # Same second for both writers: the suffix keeps them apart.
  first = write_run(tmp_path, [(1, {"loss": 1.0}), (2, {"loss": 2.0})], clock=clock)
  before = first.read_bytes()
  second = write_run(tmp_path, [(3, {"loss": 3.0})], clock=clock)
  assert first != second and first.read_bytes() == before
  assert tensorboard.event_files(tmp_path) == sorted([first, second])
  assert sorted(tensorboard.read_scalars(tmp_path)) == [
    (1, "loss", 1.0),
    (2, "loss", 2.0),
    (3, "loss", 3.0),
  ]


def test_purge_step_writes_session_start(tmp_path):
  with tensorboard.SummaryWriter(tmp_path, purge_step=7) as writer:
    writer.scalar("x", 1.0, step=7)
  events = tensorboard.read_events(writer.path)
  assert [(e["step"], e["session_start"], e["scalars"]) for e in events] == [
    (0, False, []),
    (7, True, []),
    (7, False, [("x", 1.0)]),
  ]


def test_same_second_files_sort_in_creation_order(tmp_path):
  clock = FakeClock()
  paths = [write_run(tmp_path, [(i, {"i": i})], clock=clock) for i in range(12)]
  assert tensorboard.event_files(tmp_path) == paths
  assert [v for _, _, v in tensorboard.read_scalars(tmp_path)] == list(range(12))


def test_flush_every(tmp_path):
  writer = tensorboard.SummaryWriter(tmp_path, flush_every=2, flush_secs=math.inf)
  writer.scalar("x", 1.0, step=1)
  assert tensorboard.read_scalars(writer.path) == []  # Buffered: only the header is out.
  writer.scalar("x", 2.0, step=2)
  assert tensorboard.read_scalars(writer.path) == [(1, "x", 1.0), (2, "x", 2.0)]
  writer.scalar("x", 3.0, step=3)
  writer.flush()
  assert len(tensorboard.read_scalars(writer.path)) == 3
  writer.close()
  writer.close()  # Idempotent.
  with pytest.raises(ValueError):
    writer.scalar("x", 4.0, step=4)


def test_flush_secs(tmp_path):
  clock = FakeClock(0.0)
  writer = tensorboard.SummaryWriter(tmp_path, flush_every=100, flush_secs=10.0, clock=clock)
  clock.now = 9.0
  writer.scalar("x", 1.0, step=1)
  assert tensorboard.read_scalars(writer.path) == []
  clock.now = 10.0
  writer.scalar("x", 2.0, step=2)
  assert len(tensorboard.read_scalars(writer.path)) == 2
  writer.close()


def test_context_manager_closes_on_error(tmp_path):
  with pytest.raises(RuntimeError), tensorboard.SummaryWriter(tmp_path, flush_every=100) as w:
    w.scalar("x", 1.0, step=1)
    raise RuntimeError
  assert tensorboard.read_scalars(w.path) == [(1, "x", 1.0)]


def test_bad_options(tmp_path):
  with pytest.raises(ValueError, match="flush_every"):
    tensorboard.SummaryWriter(tmp_path, flush_every=0)


def test_ignores_other_files_in_dir(tmp_path):
  path = write_run(tmp_path, [(1, {"x": 1.0})])
  (tmp_path / "metrics.jsonl").write_text("{}\n")
  (tmp_path / "sub.tfevents.dir").mkdir()
  assert tensorboard.event_files(tmp_path) == [path]


# ----------------------------------------------------------------------------
# Corruption.
# ----------------------------------------------------------------------------


def test_every_single_byte_corruption_is_detected(tmp_path):
  path = write_run(tmp_path, [(1, {"a": 1.0}), (2, {"a": 2.0, "b": 3.0})])
  good = path.read_bytes()
  starts = [offset for offset, _ in tensorboard.read_records(path)]
  assert len(starts) == 3 and starts[0] == 0
  for i in range(len(good)):
    bad = bytearray(good)
    bad[i] ^= 0x5A
    path.write_bytes(bytes(bad))
    record_start = max(s for s in starts if s <= i)
    with pytest.raises(ValueError, match=rf"CRC mismatch at byte offset {record_start}\b") as e:
      tensorboard.read_scalars(path)
    assert str(path) in str(e.value)


def test_truncation_is_detected(tmp_path):
  path = write_run(tmp_path, [(1, {"a": 1.0}), (2, {"a": 2.0})])
  good = path.read_bytes()
  last = tensorboard.read_records(path)[-1][0]
  for cut in [1, 4, len(good) - last - 12, len(good) - last - 1]:
    path.write_bytes(good[:-cut])
    with pytest.raises(ValueError, match=rf"truncated record.* at byte offset {last}\b"):
      tensorboard.read_scalars(path)


def test_valid_frame_with_bad_protobuf(tmp_path):
  path = tmp_path / "events.out.tfevents.0.host"
  path.write_bytes(
    tensorboard.frame(tensorboard.encode_event(wall_time=0.0)) + tensorboard.frame(b"\xff")
  )
  first_len = len(tensorboard.frame(tensorboard.encode_event(wall_time=0.0)))
  with pytest.raises(ValueError, match=rf"bad Event protobuf at byte offset {first_len}\b"):
    tensorboard.read_scalars(tmp_path)


# ----------------------------------------------------------------------------
# TensorBoard's own reader (only if the optional `tensorboard` package is installed).
# ----------------------------------------------------------------------------


def test_tensorboard_reads_our_files(tmp_path):
  pytest.importorskip("tensorboard")
  from tensorboard.backend.event_processing import (
    event_accumulator,
    event_file_loader,
    plugin_event_accumulator,
  )
  from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
  from tensorboard.util import tensor_util

  for data, _ in CRC32C_VECTORS:
    assert tensorboard.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)
  records = [(step, {"loss": 1 / (step + 1), "reward": step * 0.25}) for step in range(5)]
  path = write_run(tmp_path, records)
  write_run(tmp_path, [(5, {"loss": 0.125})])  # A resumed run: a second file.
  ours = tensorboard.read_scalars(path)

  # Raw events (TensorBoard's record reader checks both CRCs too).
  events = list(event_file_loader.LegacyEventFileLoader(str(path)).Load())
  assert events[0].file_version == "brain.Event:2"
  theirs = [(e.step, v.tag, v.simple_value) for e in events[1:] for v in e.summary.value]
  assert theirs == ours
  # What the TensorBoard server uses: simple_value migrated to scalar tensors.
  events = list(event_file_loader.EventFileLoader(str(path)).Load())
  theirs = [
    (e.step, v.tag, float(tensor_util.make_ndarray(v.tensor)))
    for e in events
    for v in e.summary.value
  ]
  assert theirs == ours

  acc = event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  assert sorted(acc.Tags()["scalars"]) == ["loss", "reward"]
  loss = [(s.step, s.value) for s in acc.Scalars("loss")]
  assert loss == [(step, f32(1 / (step + 1))) for step in range(5)] + [(5, 0.125)]
  assert [s.value for s in acc.Scalars("reward")] == [f32(step * 0.25) for step in range(5)]

  acc = plugin_event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  loss = [(t.step, float(tensor_util.make_ndarray(t.tensor_proto))) for t in acc.Tensors("loss")]
  assert loss == [(step, f32(1 / (step + 1))) for step in range(5)] + [(5, 0.125)]


def test_we_read_tensorboards_files(tmp_path):
  pytest.importorskip("tensorboard")
  from tensorboard.compat.proto import event_pb2, summary_pb2
  from tensorboard.summary.writer import event_file_writer

  writer = event_file_writer.EventFileWriter(str(tmp_path))
  for step in [1, 2, -3]:
    value = summary_pb2.Summary.Value(tag="x", simple_value=step / 3)
    summary = summary_pb2.Summary(value=[value])
    writer.add_event(event_pb2.Event(wall_time=1.5, step=step, summary=summary))
  writer.close()
  assert tensorboard.read_scalars(tmp_path) == [(s, "x", f32(s / 3)) for s in [1, 2, -3]]
  assert tensorboard.read_events(tmp_path)[0]["file_version"] == "brain.Event:2"


def test_tensorboard_purges_at_purge_step(tmp_path):
  pytest.importorskip("tensorboard")
  from tensorboard.backend.event_processing import event_accumulator, event_file_loader
  from tensorboard.compat.proto import event_pb2

  clock = FakeClock()
  write_run(tmp_path, [(step, {"x": float(step)}) for step in range(10)], clock=clock)
  # Resumed from the step-6 checkpoint: steps 6.. are logged again with new values.
  resumed = [(step, {"x": step + 0.5}) for step in range(6, 12)]
  path = write_run(tmp_path, resumed, purge_step=6, clock=clock)
  start = list(event_file_loader.LegacyEventFileLoader(str(path)).Load())[1]
  assert start.step == 6 and start.session_log.status == event_pb2.SessionLog.START
  acc = event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  got = [(s.step, s.value) for s in acc.Scalars("x")]
  assert got == [(step, float(step)) for step in range(6)] + [(s, s + 0.5) for s in range(6, 12)]
  # Our reader returns the raw records: both files in full.
  assert len(tensorboard.read_scalars(tmp_path)) == 10 + 6
