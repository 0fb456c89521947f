"""`memo`: `aot.compile_function` compiling each distinct TPU program once per machine.

JAX's persistent cache never holds a TPU program compiled for an abstract topology
(`aot.compile_function`: a compile-only client cannot load one back), so every test that
compiles the same run's functions again pays libtpu's whole compile again, and so does
every later test session: about 190 CPU-seconds of XLA compiling in a full run whose CPU
programs all came from JAX's cache (test_aot, test_families, test_kernels,
test_tpu_collectives; 2026-12-07, the 2-core AMD EPYC).

Under `memo`, a program whose lowered text and devices equal one already compiled in this
process gets that executable (XLA would compile the same module for the same devices to
the same executable), and one compiled in an earlier session of this machine gets a
`Recorded` stand-in: what the tests and `aot` read of an executable (its text, memory and
cost analyses, argument and output shardings), written after the real compile next to
JAX's cache (`RECORDS`). A record's key adds the versions of jax, jaxlib and libtpu and
the compiler's flags to the program, so another compiler compiles afresh; a program XLA
refused is recorded as its error, raised again. Shardings other than `NamedSharding`
(none today) are not recorded: such a program compiles in every session.

Measured (those four modules, one worker, one sitting on the quiet 2-core AMD EPYC,
2026-12-07): 298 s and 378 CPU-s without records, 139 s and 146 CPU-s with them."""

import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import os
import pickle
import types

import jax
import numpy as np
import pytest
import subproc

from grpo_jax.models import sharding
from grpo_jax.trainer import aot

RECORDS = subproc.COMPILATION_CACHE / "tpu_records"


@contextlib.contextmanager
def memo():
  """aot.compile_function (and everything in `aot` that calls it) memoised while open;
  yields the counts {"compiled": n, "reused": n, "loaded": n} (compiled by libtpu, reused
  within this process, loaded from an earlier session's record)."""
  real, seen = aot.compile_function, {}
  counts = {"compiled": 0, "reused": 0, "loaded": 0}

  def compile_function(jitted, args, *, layout=None):
    lay, fn = (jitted.layout, jitted.jitted) if isinstance(jitted, sharding.Jitted) else (layout, jitted)  # fmt: skip
    if lay is None:
      return real(jitted, args, layout=layout)  # Its own error.
    placed = jitted.place(args, abstract=True) if isinstance(jitted, sharding.Jitted) else args
    with lay.context():
      lowered = fn.lower(*placed)
    key = (lowered.as_text(), tuple((d.device_kind, str(d)) for d in lay.mesh.devices.flat))
    if key in seen:
      counts["reused"] += 1
    else:
      digest = _digest(key)
      seen[key] = _load(digest, lowered, lay.mesh)
      if seen[key] is None:
        counts["compiled"] += 1
        seen[key] = _compiled(real, jitted, args, layout, lowered, digest=digest)
      else:
        counts["loaded"] += 1
    if isinstance(seen[key], Exception):
      raise seen[key]
    return seen[key]

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(aot, "compile_function", compile_function)
    yield counts


@functools.cache
def _versions() -> str:
  """The compiler's versions and flags, as a record's key holds them."""
  found = [_version(n) for n in ("jax", "jaxlib", "libtpu")]
  flags = [os.environ.get(k, "") for k in ("XLA_FLAGS", "LIBTPU_INIT_ARGS")]
  return repr((found, flags))


def _version(name: str) -> str:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return "-"


def _digest(key) -> str:
  return hashlib.sha256(repr((key, _versions())).encode()).hexdigest()


def _compiled(real, jitted, args, layout, lowered, *, digest: str):
  """The real compile (or the error XLA raised), written to RECORDS where it can be."""
  try:
    got = real(jitted, args, layout=layout)
  except jax.errors.JaxRuntimeError as e:
    _write(digest, {"error": str(e)})
    return e
  record = _record(got, lowered)
  if record is not None:
    _write(digest, record)
  return got


def _write(digest: str, record: dict) -> None:
  RECORDS.mkdir(parents=True, exist_ok=True)
  tmp = RECORDS / f"{digest}.{os.getpid()}.tmp"
  tmp.write_bytes(pickle.dumps(record))
  tmp.replace(RECORDS / digest)  # Whole or absent: two workers may write the same one.


# --- a record: what is read of an executable ---------------------------------------


@dataclasses.dataclass(frozen=True)
class Recorded:
  """An executable as its record describes it: `as_text`, `memory_analysis`,
  `cost_analysis`, `out_info`, `input_shardings` and `output_shardings`, as
  `jax.stages.Compiled` gives them."""

  text: str
  memory: dict
  cost: object
  out_info: object
  input_shardings: object
  output_shardings: object

  def as_text(self) -> str:
    return self.text

  def memory_analysis(self):
    return types.SimpleNamespace(**self.memory)

  def cost_analysis(self):
    return self.cost


_MEMORY = (
  "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
  "temp_size_in_bytes", "generated_code_size_in_bytes", "host_argument_size_in_bytes",
  "host_output_size_in_bytes", "host_alias_size_in_bytes", "host_temp_size_in_bytes",
  "host_generated_code_size_in_bytes", "peak_memory_in_bytes",
)  # fmt: skip


# An argument without a sharding (one the program does not read), as `_sharding` writes it.
_UNREAD = "unread"


def _sharding(s):
  """A NamedSharding as plain values (its mesh by device ids), `_UNREAD` for None, or None
  (another kind: not recorded)."""
  if s is None:
    return _UNREAD
  if not isinstance(s, jax.sharding.NamedSharding) or not isinstance(s.mesh, jax.sharding.Mesh):
    return None
  m = s.mesh
  ids = tuple(int(d.id) for d in m.devices.flat)
  return (m.axis_names, m.devices.shape, ids, tuple(m.axis_types), s.spec, s.memory_kind)


def _record(compiled, lowered) -> dict | None:
  """What `Recorded` needs of a compiled program (its shardings flattened as the lowered
  program's trees; out_info's are the output shardings), or None when a sharding is not
  one of `_sharding`'s."""
  out = [(o.shape, o.dtype) for o in lowered.out_tree.flatten_up_to(compiled.out_info)]
  ins = [_sharding(s) for s in lowered.in_tree.flatten_up_to(compiled.input_shardings)]
  outs = [_sharding(s) for s in lowered.out_tree.flatten_up_to(compiled.output_shardings)]
  if any(x is None for x in [*ins, *outs]):
    return None
  mem = compiled.memory_analysis()
  memory = {name: int(getattr(mem, name)) for name in _MEMORY}
  return {"text": compiled.as_text(), "memory": memory, "cost": compiled.cost_analysis(),
          "out": out, "in_shardings": ins, "out_shardings": outs}  # fmt: skip


def _load(digest: str, lowered, mesh):
  """The record of `digest` as a `Recorded` (or the error it holds), or None: none, or
  one naming a device `mesh` lacks, or whose trees are not the lowered program's."""
  path = RECORDS / digest
  if not path.exists():
    return None
  try:
    record = pickle.loads(path.read_bytes())
  except (OSError, EOFError, pickle.UnpicklingError):  # Unreadable: compile, and rewrite it.
    return None
  if "error" in record:
    return jax.errors.JaxRuntimeError(record["error"])
  devices = {int(d.id): d for d in mesh.devices.flat}
  meshes = {}

  def named(desc):
    if desc == _UNREAD:
      return None
    names, shape, ids, axis_types, spec, memory_kind = desc
    if (names, shape, ids) not in meshes:
      grid = np.array([devices[i] for i in ids], dtype=object).reshape(shape)
      meshes[names, shape, ids] = jax.sharding.Mesh(grid, names, axis_types=axis_types)
    return jax.sharding.NamedSharding(meshes[names, shape, ids], spec, memory_kind=memory_kind)

  try:
    ins = [named(x) for x in record["in_shardings"]]
    outs = [named(x) for x in record["out_shardings"]]
    out = [jax.ShapeDtypeStruct(s, d, sharding=x) for (s, d), x in zip(record["out"], outs, strict=True)]  # fmt: skip
    return Recorded(
      text=record["text"],
      memory=record["memory"],
      cost=record["cost"],
      out_info=jax.tree.unflatten(lowered.out_tree, out),
      input_shardings=jax.tree.unflatten(lowered.in_tree, ins),
      output_shardings=jax.tree.unflatten(lowered.out_tree, outs),
    )
  except (KeyError, ValueError):  # A device this mesh lacks, or other trees: compile.
    return None
