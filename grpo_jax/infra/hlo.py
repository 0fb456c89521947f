"""Reading a compiled XLA program's text (`compiled.as_text()`): its shapes, while loops
and their trip counts, dot FLOPs, collectives with the mesh axes they run over, host
callbacks and the parameters aliased to outputs. Hand-written: XLA's Python API exposes
the text, not these; what TPU prints (found by compiling, tests/infra/test_tpu.py) is in
`infra.tpu`'s docstring. Everything here is a pure function of the text (and the mesh).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np


def slice_of(device) -> int:
  """The TPU slice a device is in (0 where devices carry no `slice_index`)."""
  return getattr(device, "slice_index", None) or 0


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


def _trip_count(cond: _Computation | None, body: _Computation | None, instr: _Instr) -> int | None:
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
    return -(-constants[operands[1]] // _counter_step(cond, body, operands[0]))
  return None


def _counter_step(cond: _Computation, body: _Computation | None, counter: str) -> int:
  """What the loop body adds to the counter its condition compares (1 when not a constant):
  TPU's windowed einsums count 0, 2 < 4, so run twice, not four times."""
  gte = next((i for i in cond.instrs if i.name == counter), None)
  index = re.search(r"index=(\d+)", gte.rest) if gte and gte.opcode == "get-tuple-element" else None
  if body is None or index is None or not body.instrs or body.instrs[-1].opcode != "tuple":
    return 1
  by_name = {i.name: i for i in body.instrs}
  elements = re.findall(r"%([\w.\-]+)", body.instrs[-1].rest)
  update = (
    by_name.get(elements[int(index.group(1))]) if int(index.group(1)) < len(elements) else None
  )
  if update is None or update.opcode != "add":
    return 1
  for name in re.findall(r"%([\w.\-]+)", update.rest.split(")")[0]):
    c = by_name.get(name)
    step = re.match(r"(\d+)\)", c.rest) if c is not None and c.opcode == "constant" else None
    if step and int(step.group(1)) > 0:
      return int(step.group(1))
  return 1


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
        body = re.search(r"body=%?([\w.\-]+)", instr.rest)
        trip = _trip_count(
          comps.get(cond.group(1)) if cond else None,
          comps.get(body.group(1)) if body else None,
          instr,
        )
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
        macs = _convolution_macs(instr.rest, lhs, rhs, out[0][1])
      total += 2 * macs * runs[comp.name]
  return total


def _convolution_macs(rest: str, lhs, rhs, out) -> int:
  """Multiply-adds of a convolution: batch × output features × input features (a group's)
  × the window taps that land on a real input element, summed over output positions
  (each spatial dimension on its own). TPU writes a batched dot as a convolution whose
  window spans the batch with lhs_dilate (`size=16x2 lhs_dilate=16x2`): one real tap an
  output position, where counting every tap of the window over-counted 16 x 2 times."""
  labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", rest)
  if labels is None:
    return math.prod(out) * math.prod(rhs) // max(rhs[-1], 1)
  lhs_l, rhs_l, out_l = labels.groups()
  window = re.search(r"window=\{([^}]*)\}", rest)
  fields = dict(re.findall(r"(\w+)=(\S+)", window.group(1))) if window else {}

  def per_dim(name, default):
    v = fields.get(name)
    return [default(x) for x in v.split("x")] if v else None

  size = per_dim("size", int) or []
  stride = per_dim("stride", int) or [1] * len(size)
  pad = per_dim("pad", lambda x: tuple(int(n) for n in x.split("_"))) or [(0, 0)] * len(size)
  lhs_dilate = per_dim("lhs_dilate", int) or [1] * len(size)
  rhs_dilate = per_dim("rhs_dilate", int) or [1] * len(size)
  taps = 1
  for d in range(len(size)):
    c = str(d)
    n, o = lhs[lhs_l.index(c)], out[out_l.index(c)]
    lo, span = pad[d][0], (n - 1) * lhs_dilate[d] + 1  # Real elements: lo + j·lhs_dilate.
    taps *= sum(
      1
      for p in range(o)
      for k in range(size[d])
      if 0 <= (x := p * stride[d] + k * rhs_dilate[d] - lo) < span and x % lhs_dilate[d] == 0
    )
  return out[out_l.index("b")] * out[out_l.index("f")] * rhs[rhs_l.index("i")] * taps


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
    return summary([dataclasses.asdict(self)])


def _logical_devices(hlo_text: str, mesh) -> list:
  """The device of each logical id of the program: mesh.devices.flat, or one slice's
  devices in that order for a per-slice (multi-slice) program."""
  flat = list(mesh.devices.flat)
  m = re.search(r"num_partitions=(\d+)", hlo_text)
  n = int(m.group(1)) if m else len(flat)
  if n == len(flat):
    return flat
  first = min(slice_of(d) for d in flat)
  own = [d for d in flat if slice_of(d) == first]
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
    dcn |= len({slice_of(d) for d in group}) > 1
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
      per_slice.setdefault(slice_of(d), []).append(d)
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
  slice_ids = np.vectorize(slice_of, otypes=[int])(mesh.devices)
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


# --- host callbacks and aliasing ----------------------------------------------------

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


def summary(rows: list[dict]) -> str:
  """ "all-gather×22 fsdp, reduce-scatter×1 fsdp" for collectives as dicts."""
  return ", ".join(
    f"{r['kind']}×{r['count']} {'+'.join(r['axes']) or '-'}" + (" DCN" if r["dcn"] else "")
    for r in rows
  )
