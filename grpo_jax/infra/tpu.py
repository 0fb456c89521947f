"""TPU chips, their topologies, and what a compiled TPU executable says about a program:
whether it fits, how it is sharded and what it costs, learned on a CPU host before a chip
is booked (`grpo-jax plan --topology=v5e:2x4`).

    devices = tpu.load_topology("v5e:2x4", num_slices=2)       # abstract TPU devices
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 8), ("data", "fsdp"))
    compiled = jax.jit(step).lower(*shape_dtype_structs_on(mesh)).compile()
    row = tpu.report(compiled, chip=tpu.chip_for("v5e:2x4"), mesh=mesh)
    print(tpu.format_table([{"name": "train_step", **row}]))

libtpu (the `tpu` extra) compiles for a named topology without a TPU: XLA's TPU compiler
runs on the host, so the memory, the collectives and the cost are those of the real
program. Every figure here is per device (one JAX device; per chip on every chip listed:
v4 and v5p run their two TensorCores as one "megacore" device), because an SPMD program
is one program per device: `memory_analysis` and `cost_analysis` describe one device's
share (checked: a matmul sharded 4 ways reports 2·M·N·K/4 flops).

Chips (`CHIPS`): Google Cloud's system architecture pages, https://cloud.google.com/tpu/docs/v4,
.../v5e, .../v5p, .../v6e. ICI bandwidth is per chip, all links, one direction (the pages'
"Interchip Interconnect BW" in Gbps / 8; their "bidirectional" GBps figure is twice this).
v4's page gives none: 6 links × 50 GB/s each way, from the TPU v4 paper (Jouppi et al.,
ISCA 2023). DCN bandwidth is per chip: the host's NICs shared by its chips (v5e 2×100 Gb/s
per 8-chip host, v6e 4×200 Gb/s per 8-chip host, v5p 50 Gb/s per chip as published; v4
unpublished, taken as v5p's, approximate).

Reading a compiled program (what XLA TPU emits, found by compiling; tests/test_tpu.py):
- Collectives (`collectives`): replica groups come in three printed forms (explicit
  `{{0,1},{2,3}}`, iota `[2,2]<=[2,2]T(1,0)`, and the mesh form
  `mesh['axis_0'=4,'axis_1'=2], device_ids=(...) {'axis_1'}`); their ids are logical: the
  position in the jit's device assignment, `mesh.devices.flat`. A reduce-scatter is
  printed as an all-reduce inside a `kCustom` fusion named all-reduce-scatter (TPU's
  all-reduce-scatter emitter); an async collective appears up to three times with one
  channel_id (start, body and done fusions); both are counted once. A program for several
  slices is compiled per slice: ids are positions within one slice, and the cross-slice
  (DCN) collectives are host-transfer send/recv pairs for the "megascale" runtime
  (`_xla_megascale_transfer_type`), one per collective.
- Loops: TPU `cost_analysis` counts a while loop's body once (a scan over 8 layers reports
  the flops of one), so `report` also counts dot/convolution flops itself with each
  loop's trip count (`matmul_flops`) and uses the larger count. A trip count is read from
  the loop condition `i < N` (jax lowers scan/fori_loop from 0 in steps of 1); loops whose
  bound is not a constant (a decode loop until EOS) count once and are listed as None.
  Collective counts are per call of the program, loops included.
- Host callbacks (`host_callbacks`): jax.debug.print and pure_callback are send/recv host
  transfers (handler "pjrt_rendezvous"), not custom-calls, on TPU.
- Out of memory: XLA refuses to compile a program that needs more than the device's HBM
  (RESOURCE_EXHAUSTED, 15.75 GiB available on a v5e of 16 GiB); `out_of_memory` reads that
  error, and compiling with `COMPILE_PAST_OOM` gives an executable to report on anyway.
- JAX's persistent compilation cache stores these executables but a compile-only client
  cannot load them back (a warning per program): compile plans with it off.

The roofline, max(flops / peak, bytes accessed / HBM bandwidth), ignores: collectives
(estimated separately, ring bandwidth terms only, no latency, every ICI link of the chip
usable, so optimistic), overlap of compute with communication, MXU shape and padding
efficiency (flops counted at peak bf16), host transfers and the input pipeline; XLA's bytes
accessed, like its flops, count a loop body once.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

import numpy as np

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One TPU chip's published figures (per chip; `per_device` divides them among the
  `cores_per_chip` JAX devices a chip shows). Bandwidths in bytes/s: `ici_bytes_per_s`
  all links of the chip, one direction; `dcn_bytes_per_s` the chip's share of its host's
  data-center network."""

  name: str
  device_kind: str
  hbm_bytes: int
  peak_bf16_flops: float
  hbm_bytes_per_s: float
  ici_bytes_per_s: float
  dcn_bytes_per_s: float
  cores_per_chip: int
  source: str


CHIPS: dict[str, Chip] = {
  "v4": Chip(
    name="v4",
    device_kind="TPU v4",
    hbm_bytes=32 * GiB,  # "HBM2 capacity and bandwidth: 32 GiB, 1200 GBps"
    peak_bf16_flops=275e12,
    hbm_bytes_per_s=1200e9,
    ici_bytes_per_s=6 * 50e9,  # Not on the page: 6 links × 50 GB/s each way (v4 paper).
    dcn_bytes_per_s=50e9 / 8,  # Unpublished for v4: v5p's 50 Gb/s per chip, approximate.
    cores_per_chip=1,  # Two TensorCores as one megacore device, as on a v4 VM.
    source="https://cloud.google.com/tpu/docs/v4",
  ),
  "v5e": Chip(
    name="v5e",
    device_kind="TPU v5 lite",
    hbm_bytes=16 * GiB,
    peak_bf16_flops=197e12,
    hbm_bytes_per_s=819e9,
    ici_bytes_per_s=1600e9 / 8,  # "Interchip Interconnect BW: 1600 Gbps"
    dcn_bytes_per_s=200e9 / 8 / 8,  # 2 × 100 Gb/s NICs per host of 8 chips
    cores_per_chip=1,
    source="https://cloud.google.com/tpu/docs/v5e",
  ),
  "v5p": Chip(
    name="v5p",
    device_kind="TPU v5",
    hbm_bytes=95 * GiB,
    peak_bf16_flops=459e12,
    hbm_bytes_per_s=2765e9,
    ici_bytes_per_s=4800e9 / 8,  # "Interchip Interconnect BW: 4800 Gbps"
    dcn_bytes_per_s=50e9 / 8,  # "DCN bandwidth per chip: 50 Gbps"
    cores_per_chip=1,  # Two TensorCores as one megacore device.
    source="https://cloud.google.com/tpu/docs/v5p",
  ),
  "v6e": Chip(
    name="v6e",
    device_kind="TPU v6 lite",
    hbm_bytes=32 * GiB,
    peak_bf16_flops=918e12,
    hbm_bytes_per_s=1640e9,
    ici_bytes_per_s=3584e9 / 8,  # "Inter-chip interconnect (ICI) bandwidth: 3584 Gbps"
    dcn_bytes_per_s=800e9 / 8 / 8,  # 4 × 200 Gb/s NICs per host of 8 chips
    cores_per_chip=1,
    source="https://cloud.google.com/tpu/docs/v6e",
  ),
}

# Cloud accelerator-type prefixes ("v5litepod-8") -> chip names.
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}
EXAMPLES = ("v5e:2x2", "v5e:4x8", "v6e:2x4", "v5p:2x2x1", "v4:2x2x1")
# libtpu's compile-only topology gives v4 two devices per chip unless asked for megacore,
# and jax's mesh utilities refuse those ("requires one device per chip").
_CHIP_CONFIG = {"v4": "megacore", "v5p": "megacore"}


def per_device(chip: Chip) -> Chip:
  """The figures of one JAX device: the chip's divided by `cores_per_chip`."""
  n = chip.cores_per_chip
  return dataclasses.replace(
    chip,
    hbm_bytes=chip.hbm_bytes // n,
    peak_bf16_flops=chip.peak_bf16_flops / n,
    hbm_bytes_per_s=chip.hbm_bytes_per_s / n,
    ici_bytes_per_s=chip.ici_bytes_per_s / n,
    dcn_bytes_per_s=chip.dcn_bytes_per_s / n,
    cores_per_chip=1,
  )


def chip_for(topology_name: str) -> Chip:
  """The chip of a topology name: "v5e:2x4" (jax's form) or "v5litepod-8" (Cloud's)."""
  prefix = re.split(r"[:\-_=]", topology_name.strip(), maxsplit=1)[0].lower()
  chip = CHIPS.get(_ALIASES.get(prefix, prefix))
  if chip is None:
    raise ValueError(
      f"unknown TPU chip in topology {topology_name!r}: known chips are "
      f"{', '.join(CHIPS)} (e.g. {', '.join(EXAMPLES)})"
    )
  return chip


# --- topologies ----------------------------------------------------------------------


class TpuUnavailable(RuntimeError):
  """libtpu, JAX's TPU compiler, is not installed: nothing can be compiled for a TPU."""


INSTALL_HINT = 'pip install -e ".[tpu]"'


def load_topology(name: str, *, num_slices: int = 1) -> list:
  """The abstract devices of topology `name` ("v5e:2x4"), `num_slices` copies of it joined
  by DCN when > 1: compile-only devices with `process_index` (host), `coords`,
  `core_on_chip` and, for several slices, `slice_index`."""
  chip = chip_for(name)
  if not re.fullmatch(r"[a-z0-9]+:\d+(x\d+)*", name.strip()):
    raise ValueError(
      f"bad TPU topology {name!r}: expected chip:AxB[xC], e.g. {', '.join(EXAMPLES)}"
    )
  if num_slices < 1:
    raise ValueError(f"num_slices must be >= 1, got {num_slices}")
  options = {"num_slices": num_slices} if num_slices > 1 else {}
  if chip.name in _CHIP_CONFIG:
    options["chip_config_name"] = _CHIP_CONFIG[chip.name]
  try:
    from jax.experimental import topologies

    _quiet_libtpu()
    return list(topologies.get_topology_desc(topology_name=name, platform="tpu", **options).devices)
  except ImportError as e:
    raise TpuUnavailable(
      f"JAX's TPU support is missing ({e}); install it: {INSTALL_HINT}"
    ) from None
  except RuntimeError as e:
    message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if "INVALID_ARGUMENT" in message:
      reason = message.replace("INVALID_ARGUMENT: ", "")
      raise ValueError(
        f"bad TPU topology {name!r}: {reason} (valid examples: {', '.join(EXAMPLES)})"
      ) from None
    if "not installed" in message:  # jax: "JAX TPU support not installed; ..."
      raise TpuUnavailable(
        f"libtpu (JAX's TPU compiler) is not installed, so nothing can be compiled for "
        f"{name}; install it: {INSTALL_HINT}"
      ) from None
    raise


def _quiet_libtpu() -> None:
  """libtpu, started on a host without TPUs, prints five lines of warnings about the
  accelerator type and worker hostnames it cannot find; naming them silences it (only
  where no TPU chip is attached, where nothing else reads them)."""
  try:
    from jax._src import hardware_utils

    chips, _ = hardware_utils.num_available_tpu_chips_and_device_id()
  except Exception:  # A private jax helper: quieter output is not worth a failure.
    return
  if chips == 0:
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    # libtpu takes /tmp/libtpu_lockfile so that one process owns the chips; with none to
    # own, several processes (test workers, a plan beside a notebook) may compile at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def hosts(devices) -> int:
  """How many hosts (processes) the devices span."""
  return len({d.process_index for d in devices})


def _slice_of(device) -> int:
  return getattr(device, "slice_index", None) or 0


def slices(devices) -> int:
  """How many slices the devices span (1 where devices carry no `slice_index`)."""
  return len({_slice_of(d) for d in devices})


# --- compile-time memory -------------------------------------------------------------

# compiler_options for `lowered.compile(...)`: a program needing more HBM than the device
# has compiles anyway (XLA otherwise raises RESOURCE_EXHAUSTED), so `report` can say by how
# much it does not fit.
COMPILE_PAST_OOM = {"xla_tpu_no_crash_on_oom": True}

_OOM = re.compile(
  r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"
)


def out_of_memory(error: BaseException) -> dict | None:
  """{"required_bytes", "available_bytes"} from XLA TPU's compile-time out-of-memory error
  ("Ran out of memory on HBM, ... (20.00G) exceeds available HBM (15.75G)"), else None."""
  m = _OOM.search(str(error))
  if m is None:
    return None
  scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
  return {
    "required_bytes": round(float(m.group(1)) * scale[m.group(2)]),
    "available_bytes": round(float(m.group(3)) * scale[m.group(4)]),
  }


# --- HLO text ------------------------------------------------------------------------

_DTYPE_BITS = {
  "pred": 8, "s2": 2, "u2": 2, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16,
  "f16": 16, "bf16": 16, "s32": 32, "u32": 32, "f32": 32, "s64": 64, "u64": 64, "f64": 64,
  "c64": 64, "c128": 128, "token": 0,
}  # fmt: skip


def _array_shapes(shape: str) -> list[tuple[str, tuple[int, ...]]]:
  """The (dtype, dims) leaves of a printed HLO shape: "bf16[8,128]{1,0}" or a tuple."""
  leaves = re.findall(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]", shape)
  out = []
  for dtype, dims in leaves:
    sizes = tuple(int(d.replace("<=", "")) for d in dims.split(",") if d.strip())
    out.append((dtype, sizes))
  return out


def shape_bytes(shape: str) -> int:
  """Bytes of a printed HLO shape (a tuple: the sum of its arrays), unpadded."""
  total = 0
  for dtype, dims in _array_shapes(shape):
    bits = _DTYPE_BITS.get(dtype, 8 if dtype.startswith("f8") else 32)
    total += math.prod(dims) * bits // 8
  return total


def _tuple_elements(shape: str) -> list[str]:
  """The top-level elements of a tuple shape "(a, (b, c), d)"; [shape] if not a tuple."""
  shape = shape.strip()
  if not shape.startswith("("):
    return [shape]
  parts, depth, start = [], 0, 1
  for i, ch in enumerate(shape):
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
      parts.append(shape[start:i].strip())
      start = i + 1
  return [p for p in parts if p]


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  return len(text)


@dataclasses.dataclass
class _Instr:
  name: str
  shape: str
  opcode: str
  rest: str  # operands and attributes


@dataclasses.dataclass
class _Computation:
  name: str
  entry: bool
  params: dict[str, str]
  result: str
  instrs: list[_Instr]


_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \((.*)\) -> (.*) \{$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def _parse(hlo_text: str) -> dict[str, _Computation]:
  text = re.sub(r"/\*.*?\*/", "", hlo_text)
  comps: dict[str, _Computation] = {}
  current = None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header:
      params = {}
      for part in _tuple_elements(f"({header.group(3)})"):
        if ": " in part:
          pname, pshape = part.split(": ", 1)
          params[pname.lstrip("%")] = pshape
      current = _Computation(header.group(2), bool(header.group(1)), params, header.group(4), [])
      comps[current.name] = current
      continue
    if current is None or line.strip() == "}":
      continue
    m = _INSTR.match(line)
    if not m:
      continue
    body = m.group(2)
    end = _balanced(body, 0) if body.startswith("(") else body.find(" ")
    shape, tail = body[:end], body[end:].strip()
    op = re.match(r"([\w\-]+)\((.*)$", tail)
    if op:
      current.instrs.append(_Instr(m.group(1), shape, op.group(1), op.group(2)))
  return comps


_CALLS = re.compile(
  r"\b(calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
)
_CALL_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")


def _trip_count(cond: _Computation | None, instr: _Instr) -> int | None:
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', instr.rest)
  if known:
    return int(known.group(1))
  if cond is None or not cond.instrs:
    return None
  root = cond.instrs[-1]
  if root.opcode != "compare" or "direction=LT" not in root.rest:
    return None
  operands = re.findall(r"%([\w.\-]+)", root.rest.split(")")[0])
  constants = {
    i.name: int(c.group(1))
    for i in cond.instrs
    if i.opcode == "constant" and (c := re.match(r"(-?\d+)\)", i.rest))
  }
  if len(operands) == 2 and operands[1] in constants:
    return constants[operands[1]]
  return None


def _multipliers(comps: dict[str, _Computation]) -> tuple[dict[str, int], list[int | None]]:
  """How many times each computation runs per call of the entry (while bodies times their
  trip counts), and the trip counts of the while loops (None: not a constant bound)."""
  callers: dict[str, list[tuple[str, int]]] = {}
  trips = []
  for comp in comps.values():
    for instr in comp.instrs:
      factor = 1
      if instr.opcode == "while":
        cond = re.search(r"condition=%?([\w.\-]+)", instr.rest)
        trip = _trip_count(comps.get(cond.group(1)) if cond else None, instr)
        trips.append(trip)
        factor = 1 if trip is None else trip
      for kind, callee in _CALLS.findall(instr.rest):
        callers.setdefault(callee, []).append((comp.name, factor if kind == "body" else 1))
      for group in _CALL_LISTS.findall(instr.rest):
        for callee in re.findall(r"%?([\w.\-]+)", group):
          callers.setdefault(callee, []).append((comp.name, 1))
  memo: dict[str, int] = {}

  def runs(name: str) -> int:
    if name not in memo:
      comp = comps[name]
      sites = [(c, f) for c, f in callers.get(name, []) if c in comps and c != name]
      memo[name] = 1 if comp.entry or not sites else sum(runs(c) * f for c, f in sites)
    return memo[name]

  return {name: runs(name) for name in comps}, trips


def while_loops(hlo_text: str) -> list[int | None]:
  """The trip count of every while loop in the program (None where it is not constant)."""
  return _multipliers(_parse(hlo_text))[1]


def matmul_flops(hlo_text: str) -> int:
  """2 × multiply-adds of every dot and convolution, each loop body times its trip count."""
  comps = _parse(hlo_text)
  runs, _ = _multipliers(comps)
  total = 0
  for comp in comps.values():
    shapes = dict(comp.params) | {i.name: i.shape for i in comp.instrs}
    for instr in comp.instrs:
      if instr.opcode not in ("dot", "convolution"):
        continue
      operands = re.findall(r"%([\w.\-]+)", instr.rest.split(")")[0])
      arrays = [_array_shapes(shapes.get(o, "")) for o in operands[:2]]
      out = _array_shapes(instr.shape)
      if len(arrays) < 2 or not all(arrays) or not out:
        continue
      lhs, rhs = arrays[0][0][1], arrays[1][0][1]
      if instr.opcode == "dot":
        dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", instr.rest)
        contracted = [lhs[int(d)] for d in dims.group(1).split(",") if d] if dims else []
        macs = math.prod(out[0][1]) * math.prod(contracted)
      else:
        labels = re.search(r"dim_labels=\w*_(\w+)->", instr.rest)
        o = labels.group(1).index("o") if labels else len(rhs) - 1
        macs = math.prod(out[0][1]) * math.prod(rhs) // max(rhs[o], 1)
      total += 2 * macs * runs[comp.name]
  return total


# --- replica groups ------------------------------------------------------------------


def _iota(spec: str) -> np.ndarray:
  """An iota tile assignment "[4,2]T(1,0)" (reshape dims, transpose): flat device ids."""
  m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", spec.strip())
  if m is None:
    raise ValueError(f"unparsed iota device list {spec!r}")
  dims = [int(d) for d in m.group(1).split(",")]
  perm = [int(p) for p in m.group(2).split(",")] if m.group(2) else list(range(len(dims)))
  return np.arange(math.prod(dims)).reshape(dims).transpose(perm).reshape(-1)


def _device_ids(spec: str) -> np.ndarray:
  """A mesh's `device_ids=(...)`: iota "[2,4]T(1,0)", "[8]<=[2,4]T(1,0)", or a list."""
  spec = spec.strip()
  m = re.match(r"\[[\d,]+\]<=(.*)$", spec)
  if m:
    return _iota(m.group(1))
  if re.fullmatch(r"\[[\d,]+\](T\([\d,]+\))?", spec):
    return _iota(spec)
  values = re.sub(r"^\[[\d,]+\]", "", spec)
  return np.array([int(v) for v in values.split(",") if v.strip()])


def _split_axis(full: int, subs: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
  """An axis of size `full` cut at its sub-axes (pre-size, size), major first, as XLA
  does: the sizes of the pieces, and which pieces are the sub-axes."""
  dims, grouped, prefix = [], [], 1
  for pre, size in sorted(subs):
    if pre != prefix:
      dims.append(pre // prefix)
      prefix = pre
    grouped.append(len(dims))
    dims.append(size)
    prefix *= size
  if prefix != full:
    dims.append(full // prefix)
  return dims, grouped


def _mesh_groups(axes_spec: str, ids_spec: str | None, grouped: str) -> list[list[int]]:
  """Groups of XLA's mesh form: mesh['a'=4,'b'=2], device_ids=(...) {'b'} or {'a':(1)2}."""
  axes = [(name, int(size)) for name, size in re.findall(r"'?([\w.\-]+)'?=(\d+)", axes_spec)]
  names = [name for name, _ in axes]
  devices = np.arange(math.prod(n for _, n in axes)) if ids_spec is None else _device_ids(ids_spec)
  refs: dict[int, list[tuple[int, int] | None]] = {}
  for name, pre, size in re.findall(r"'?([\w.\-]+)'?(?::\((\d+)\)(\d+))?", grouped):
    refs.setdefault(names.index(name), []).append((int(pre), int(size)) if pre else None)
  dims, grouped_dims = [], []
  for axis, (_, full) in enumerate(axes):
    subs = refs.get(axis, [])
    pieces, chosen = _split_axis(full, subs) if subs and None not in subs else ([full], [0])
    grouped_dims += [len(dims) + c for c in chosen] if subs else []
    dims += pieces
  rest = [d for d in range(len(dims)) if d not in grouped_dims]
  arranged = devices.reshape(dims).transpose(rest + grouped_dims)
  return arranged.reshape(-1, math.prod(dims[d] for d in grouped_dims)).tolist()


def _groups(rest: str, n: int) -> list[list[int]] | None:
  """The logical-id groups of a collective's attributes (None: no groups printed)."""
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]", rest)
  if m:
    tail = rest[m.end() :]
    ids = None
    if tail.startswith(", device_ids=("):
      start = len(", device_ids=")
      end = _balanced(tail, start)
      ids, tail = tail[start + 1 : end - 1], tail[end:]
    grouped = re.match(r"\s*\{([^}]*)\}", tail)
    return _mesh_groups(m.group(1), ids, grouped.group(1) if grouped else "")
  m = re.search(r"replica_groups=\[([\d,]+)\]<=(\[[\d,]+\](?:T\([\d,]+\))?)", rest)
  if m:
    shape = [int(d) for d in m.group(1).split(",")]
    return _iota(m.group(2)).reshape(shape[0], -1).tolist()
  m = re.search(r"(?:replica_groups|source_target_pairs)=\{", rest)
  if m:
    body = rest[m.end() - 1 : _balanced(rest, m.end() - 1)]
    groups = [[int(v) for v in g.split(",") if v] for g in re.findall(r"\{([\d,]*)\}", body)]
    return groups or [list(range(n))]
  return None


# --- collectives ---------------------------------------------------------------------

KINDS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all", "collective-permute")
_MEGASCALE = {
  "ALL_REDUCE": "all-reduce",
  "REDUCE_SCATTER": "reduce-scatter",
  "ALL_GATHER": "all-gather",
  "ALL_TO_ALL": "all-to-all",
  "ONE_TO_ONE": "collective-permute",
}


@dataclasses.dataclass(frozen=True)
class Collective:
  """The collectives of one kind over one set of mesh axes, per device and per call of the
  program (ops in a loop counted once per iteration). `bytes` sums, per execution, the
  larger of the op's operand and result (the whole buffer its group reduces, gathers or
  exchanges); `dcn` whether its groups span slices (data-center network, else ICI)."""

  kind: str
  axes: tuple[str, ...]
  count: int
  bytes: int
  operand_bytes: int
  result_bytes: int
  group_size: int
  dcn: bool

  def summary(self) -> str:
    """ "reduce-scatter×12 fsdp" (" DCN" when it crosses slices)."""
    return _summary([dataclasses.asdict(self)])


def _logical_devices(hlo_text: str, mesh) -> list:
  """The device of each logical id of the program: mesh.devices.flat, or one slice's
  devices in that order for a per-slice (multi-slice) program."""
  flat = list(mesh.devices.flat)
  m = re.search(r"num_partitions=(\d+)", hlo_text)
  n = int(m.group(1)) if m else len(flat)
  if n == len(flat):
    return flat
  first = min(_slice_of(d) for d in flat)
  own = [d for d in flat if _slice_of(d) == first]
  if len(own) != n:
    raise ValueError(f"the program is for {n} devices, the mesh {dict(mesh.shape)} has {len(flat)}")
  return own


def _axes_of(groups: list[list], mesh, coords: dict) -> tuple[tuple[str, ...], bool]:
  """The mesh axes along which members of some group differ, and whether a group spans
  slices."""
  varying, dcn = set(), False
  for group in groups:
    points = np.array([coords[d.id] for d in group])
    if len(points):
      varying |= {i for i in range(points.shape[1]) if len(set(points[:, i])) > 1}
    dcn |= len({_slice_of(d) for d in group}) > 1
  return tuple(mesh.axis_names[i] for i in sorted(varying)), dcn


def _megascale_groups(attrs: str, mesh, by_id: dict) -> list[list] | None:
  """Device groups of a cross-slice transfer's `_xla_megascale_target`: "{1,2}x{0:3}"
  (slices 1 and 2, counted from 1, × the same ranks 0..3 within each) or explicit global
  device ids {{100000,200000},...} / {{100000->200000},...}."""
  m = re.search(r'_xla_megascale_target="\{([\d,]+)\}x\{(\d+):(\d+)\}"', attrs)
  if m:
    flat = list(mesh.devices.flat)
    per_slice = {}
    for d in flat:
      per_slice.setdefault(_slice_of(d), []).append(d)
    chosen = [per_slice.get(int(k) - 1, []) for k in m.group(1).split(",")]
    ranks = range(int(m.group(2)), int(m.group(3)) + 1)
    return [[s[r] for s in chosen if r < len(s)] for r in ranks]
  m = re.search(r"_xla_megascale_target=(\{(?:\{[\d,>\- ]*\},?)*\})", attrs)
  if m:
    pairs = re.findall(r"\{([\d,>\- ]*)\}", m.group(1))
    ids = [[int(v) for v in re.split(r"->|,", p) if v.strip()] for p in pairs]
    return [[by_id[i] for i in g if i in by_id] for g in ids]
  return None


def _ici_op(comp: _Computation, instr: _Instr, logical: list) -> tuple | None:
  """(kind, device groups, operand bytes, result bytes) of an XLA collective op, or None."""
  op = instr.opcode
  kind = op.removesuffix("-start")
  if kind not in KINDS or op.endswith("-done"):
    return None
  if op.endswith("-start") and kind != "all-reduce" and instr.shape.startswith("("):
    elements = _tuple_elements(instr.shape)  # (operands, results, [context])
    operand, result = shape_bytes(elements[0]), shape_bytes(elements[1])
  else:
    operand = result = shape_bytes(instr.shape)
  if kind == "all-reduce" and comp.name.startswith("all-reduce-scatter"):
    kind, result = "reduce-scatter", shape_bytes(comp.result)  # TPU's fused reduce-scatter
  ids = _groups(instr.rest, len(logical)) or [list(range(len(logical)))]
  groups = [[logical[i] for i in g] for g in ids]
  n = max(len(g) for g in groups)
  if kind == "all-gather" and not op.endswith("-start"):
    operand = result // n
  if kind == "reduce-scatter" and operand == result:
    operand = result * n
  return kind, groups, operand, result


def _dcn_op(instr: _Instr, mesh, by_id: dict) -> tuple[str, str, list[list] | None, int]:
  """(rendezvous, kind, device groups, bytes sent or received) of a megascale send/recv."""
  key = re.search(r'_xla_host_transfer_rendezvous="([^"]*)"', instr.rest)
  kind = re.search(r'_xla_megascale_transfer_type="(\w+)"', instr.rest)
  return (
    key.group(1) if key else instr.name,
    _MEGASCALE.get(kind.group(1) if kind else "", "other"),
    _megascale_groups(instr.rest, mesh, by_id),
    shape_bytes(_tuple_elements(instr.shape)[0]),
  )


def _merge(ops, mesh) -> list[Collective]:
  """Collectives from (kind, groups, operand, result, runs) ops, by (kind, axes, DCN)."""
  coords = {d.id: np.unravel_index(i, mesh.devices.shape) for i, d in enumerate(mesh.devices.flat)}
  slice_ids = np.vectorize(_slice_of, otypes=[int])(mesh.devices)
  slice_axes = tuple(  # The axes along which the slice changes: where DCN groups lie.
    name for i, name in enumerate(mesh.axis_names) if np.any(np.diff(slice_ids, axis=i) != 0)
  )
  merged: dict[tuple, list[int]] = {}
  for kind, groups, operand, result, runs in ops:
    if groups is None:  # An unread target: across all slices.
      axes, dcn, size = slice_axes, True, len(set(slice_ids.flat))
    else:
      axes, dcn = _axes_of(groups, mesh, coords)
      size = max((len(g) for g in groups), default=0)
    slot = merged.setdefault((kind, axes, dcn), [0, 0, 0, 0, 0])
    slot[0] += runs
    slot[1] += runs * max(operand, result)
    slot[2] += runs * operand
    slot[3] += runs * result
    slot[4] = max(slot[4], size)
  found = [Collective(kind, axes, *s, dcn) for (kind, axes, dcn), s in merged.items()]
  order = {kind: i for i, kind in enumerate(KINDS)}
  return sorted(found, key=lambda c: (c.dcn, order.get(c.kind, len(KINDS)), c.axes))


def collectives(hlo_text: str, mesh) -> list[Collective]:
  """The collectives of a compiled program (`compiled.as_text()`) on `mesh`, merged by
  (kind, mesh axes, ICI/DCN), in that order. See the module docstring for the forms read."""
  comps = _parse(hlo_text)
  runs, _ = _multipliers(comps)
  logical = _logical_devices(hlo_text, mesh)
  by_id = {d.id: d for d in mesh.devices.flat}
  ops, received = {}, {}
  for comp in comps.values():
    for instr in comp.instrs:
      if instr.opcode in ("send", "recv") and "_xla_megascale_transfer_type" in instr.rest:
        key, kind, groups, data = _dcn_op(instr, mesh, by_id)
        if instr.opcode == "recv":
          received[key] = data
        else:
          ops[("dcn", key)] = [kind, groups, data, data, runs[comp.name]]
        continue
      op = _ici_op(comp, instr, logical)
      if op is not None:  # An async collective's clones share their channel_id: once.
        channel = re.search(r"channel_id=(\d+)", instr.rest)
        key = ("ici", channel.group(1)) if channel else ("ici", comp.name, instr.name)
        ops.setdefault(key, [*op, runs[comp.name]])
  for key, op in ops.items():
    if key[0] == "dcn":
      op[3] = received.get(key[1], op[3])
  return _merge(ops.values(), mesh)


def collectives_by_kind(found: list[Collective]) -> dict[str, dict]:
  """{kind: {"count", "bytes", "axes", "dcn_count"}} over a program's collectives."""
  out: dict[str, dict] = {}
  for c in found:
    row = out.setdefault(c.kind, {"count": 0, "bytes": 0, "axes": [], "dcn_count": 0})
    row["count"] += c.count
    row["bytes"] += c.bytes
    row["axes"] = sorted(set(row["axes"]) | set(c.axes))
    row["dcn_count"] += c.count if c.dcn else 0
  return out


def collective_seconds(c: Collective, chip: Chip) -> float:
  """Bandwidth time of the collectives `c` on one device: ring algorithms over n devices
  move 2(n−1)/n of the buffer per device for an all-reduce, (n−1)/n for a reduce-scatter,
  all-gather or all-to-all, all of it for a permute; at the device's ICI bandwidth (every
  link, so a lower bound) or its DCN share. No latency, no overlap."""
  device = per_device(chip)
  n = max(c.group_size, 1)
  share = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(c.kind, (n - 1) / n)
  bandwidth = device.dcn_bytes_per_s if c.dcn else device.ici_bytes_per_s
  return share * c.bytes / bandwidth


# --- the rest of the program ---------------------------------------------------------

# xla_python_cpu_callback, xla_ffi_python_gpu_callback, ... (not MoveToHost: an offload).
_CALLBACK_TARGETS = re.compile(r'custom_call_target="([^"]*callback[^"]*)"', re.I)


def host_callbacks(hlo_text: str) -> list[str]:
  """Where the program calls back to the host (jax.debug.print, pure_callback, io_callback:
  send/recv host transfers on TPU; python callback custom-calls elsewhere; outfeeds), one
  entry per call site, named by its op_name. [] means none."""
  sites = {}
  for comp in _parse(hlo_text).values():
    for instr in comp.instrs:
      target = _CALLBACK_TARGETS.search(instr.rest)
      host_transfer = (  # Not a cross-slice transfer for the megascale (DCN) runtime.
        instr.opcode in ("send", "recv")
        and "is_host_transfer=true" in instr.rest
        and "megascale" not in instr.rest
      )
      if not (target or host_transfer or instr.opcode in ("outfeed", "infeed")):
        continue
      where = re.search(r'op_name="([^"]*)"(?: stack_frame_id=(\d+))?', instr.rest)
      name = where.group(1) if where else f"%{instr.name}"
      if target and instr.opcode == "custom-call":
        name = f"{name} ({target.group(1)})"
      sites.setdefault((name, where.group(2) if where else instr.name), name)
  return list(sites.values())


def aliased_parameters(hlo_text: str) -> set[int]:
  """Parameter numbers that share a buffer with an output (the module's
  input_output_alias): a donated argument that is not here was copied, not reused."""
  m = re.search(r"input_output_alias=\{", hlo_text)
  if m is None:
    return set()
  body = hlo_text[m.end() - 1 : _balanced(hlo_text, m.end() - 1)]
  return {int(p) for p in re.findall(r":\s*\(\s*(\d+)\s*,", body)}


def _memory(compiled, hbm_bytes: int) -> dict:
  """memory_analysis per device, its total and the fit against `hbm_bytes`."""
  mem = compiled.memory_analysis()
  row = {
    "argument_bytes": int(mem.argument_size_in_bytes),
    "output_bytes": int(mem.output_size_in_bytes),
    "alias_bytes": int(mem.alias_size_in_bytes),
    "temp_bytes": int(mem.temp_size_in_bytes),
    "code_bytes": int(mem.generated_code_size_in_bytes),
  }
  total = sum(row.values()) - 2 * row["alias_bytes"]  # argument + output − alias + temp + code
  return row | {
    "total_bytes": total,
    "hbm_bytes": hbm_bytes,
    "headroom_bytes": hbm_bytes - total,
    "fits": total <= hbm_bytes,
  }


def _cost(compiled, text: str, device: Chip) -> dict:
  """cost_analysis (a dict, or a list of one on some jax versions), our loop-aware matmul
  count and the roofline terms."""
  cost = compiled.cost_analysis()
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else {}
  cost = dict(cost or {})
  flops, matmul = float(cost.get("flops", 0.0)), float(matmul_flops(text))
  accessed = float(cost.get("bytes accessed", 0.0))
  compute_s = max(flops, matmul) / device.peak_bf16_flops
  memory_s = accessed / device.hbm_bytes_per_s
  return {
    "flops": flops,
    "matmul_flops": matmul,
    "bytes_accessed": accessed,
    "compute_s": compute_s,
    "memory_s": memory_s,
    "roofline_s": max(compute_s, memory_s),
    "xla_optimal_s": float(cost.get("optimal_seconds", 0.0)),
    "loops": while_loops(text),
  }


def report(compiled, *, chip: Chip, mesh) -> dict:
  """Per-device memory and fit (`*_bytes`, `fits`), cost (`flops` from XLA, loop bodies
  once; `matmul_flops` ours, loops included; `bytes_accessed`), roofline (`compute_s` from
  the larger flop count, `memory_s`, `roofline_s`), collectives with their bandwidth times
  (`ici_s`, `dcn_s`: not in the roofline), host callbacks and aliased parameters of a
  compiled TPU executable on `mesh` of `chip`s. Plain numbers, strings and lists: JSON."""
  text = compiled.as_text()
  found = collectives(text, mesh)
  rows = [dataclasses.asdict(c) | {"seconds": collective_seconds(c, chip)} for c in found]
  return {
    "chip": chip.name,
    "mesh": {name: int(size) for name, size in mesh.shape.items()},
    "devices": int(mesh.devices.size),
    **_memory(compiled, per_device(chip).hbm_bytes),
    **_cost(compiled, text, per_device(chip)),
    "ici_s": sum(r["seconds"] for r in rows if not r["dcn"]),
    "dcn_s": sum(r["seconds"] for r in rows if r["dcn"]),
    "collectives": rows,
    "collectives_by_kind": collectives_by_kind(found),
    "host_callbacks": host_callbacks(text),
    "aliased_parameters": sorted(aliased_parameters(text)),
  }


def _summary(rows: list[dict]) -> str:
  return ", ".join(
    f"{r['kind']}×{r['count']} {'+'.join(r['axes']) or '-'}" + (" DCN" if r["dcn"] else "")
    for r in rows
  )


def format_table(rows: list[dict]) -> str:
  """One terminal table of several reports, each with a "name": fit, HBM per device,
  temporaries, GFLOP (the larger count, loops included), roofline and collectives."""
  header = ("name", "fits", "HBM GiB", "temp GiB", "GFLOP", "roofline ms", "ICI ms", "collectives")
  lines = [header]
  for r in rows:
    lines.append(
      (
        str(r["name"]),
        "yes" if r["fits"] else "NO",
        f"{r['total_bytes'] / GiB:.2f} / {r['hbm_bytes'] / GiB:.0f}",
        f"{r['temp_bytes'] / GiB:.2f}",
        f"{max(r['flops'], r.get('matmul_flops', 0.0)) / 1e9:.1f}",
        f"{r['roofline_s'] * 1e3:.3f}",
        f"{r.get('ici_s', 0.0) * 1e3:.3f}"
        + (f" +DCN {r['dcn_s'] * 1e3:.3f}" if r.get("dcn_s") else ""),
        _summary(r.get("collectives", [])) or "none",
      )
    )
  widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
  right = {2, 3, 4, 5, 6}
  out = []
  for line in lines:
    cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
    out.append("  ".join(cells).rstrip())
  return "\n".join(out)
