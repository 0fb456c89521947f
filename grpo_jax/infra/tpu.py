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

Reading a compiled program (`infra.hlo`; what XLA TPU emits, found by compiling; tests/infra/test_tpu.py):
- Collectives (`hlo.collectives`): replica groups come in three printed forms (explicit
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
  loop's trip count (`hlo.matmul_flops`) and uses the larger count. A trip count is read from
  the loop condition `i < N` and the step the body adds to i (jax lowers scan/fori_loop
  from 0 in steps of 1; TPU's windowed einsums, its collective matmuls, step by 2); loops whose
  bound is not a constant (a decode loop until EOS) count once and are listed as None.
  Collective counts are per call of the program, loops included. TPU writes a batched dot
  (attention's scores) as a convolution whose window spans the batch with lhs_dilate, and
  a multi-head projection as one whose window spans the heads: a convolution counts the
  window taps that land on real input elements (`hlo._convolution_macs`; every tap of the
  window counted the scores of 16 rows a chip 32 times).
- Host callbacks (`hlo.host_callbacks`): jax.debug.print and pure_callback are send/recv host
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
import os
import re

from grpo_jax.infra import hlo

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
# 8-chip v5e and v6e slices are one host of 8 chips (v5litepod-8: ct5lp-hightpu-8t;
# v6e-8: ct6e-standard-8t, cloud.google.com/tpu/docs/v5e and /v6e); larger slices have
# hosts of 4 chips, as libtpu describes them by default.
_ONE_HOST_8 = ("v5e", "v6e")


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
  dims = [int(x) for x in name.split(":")[1].split("x")]
  if chip.name in _ONE_HOST_8 and sorted(dims) == [2, 4]:  # libtpu's default: 2 hosts of 4.
    options["chips_per_host_bounds"] = [*dims, 1]
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


def slices(devices) -> int:
  """How many slices the devices span (1 where devices carry no `slice_index`)."""
  return len({hlo.slice_of(d) for d in devices})


# --- compile-time memory -------------------------------------------------------------

# compiler_options for `lowered.compile(...)`: a program needing more HBM than the device
# has compiles anyway (XLA otherwise raises RESOURCE_EXHAUSTED), so `report` can say by how
# much it does not fit.
COMPILE_PAST_OOM = {"xla_tpu_no_crash_on_oom": True}

_OOM = re.compile(
  r"required for HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM \(([\d.]+)([KMGT]?)\)"
)
# One buffer larger than the whole HBM: refused even with COMPILE_PAST_OOM.
_OOM_BUFFER = re.compile(r"Allocation \(size=(\d+)\) would exceed memory \(size=(\d+)\)")
# A program past COMPILE_PAST_OOM that the TPU compiler rejects without a figure. Seen on
# Qwen2.5-7B's full update for v5e:2x4 (libtpu 0.0.42.1, 2026-12-06): an earlier record
# of the same cell compiled, needing 33.5 GiB a chip against 16, and the advice's rungs
# compile; so read as refused for its size, with its need unknown.
_INVALID = re.compile(r"Invalid TPU program")


def out_of_memory(error: BaseException) -> dict | None:
  """{"required_bytes", "available_bytes"} from XLA TPU's compile-time out-of-memory error
  ("Ran out of memory on HBM, ... (20.00G) exceeds available HBM (15.75G)", or one buffer
  over the whole HBM: "Allocation (size=39829110784) would exceed memory (size=17179869184)",
  a lower bound of the need), else None."""
  m = _OOM.search(str(error))
  if m is None:
    b = _OOM_BUFFER.search(str(error))
    if b is None:
      return None
    return {"required_bytes": int(b.group(1)), "available_bytes": int(b.group(2))}
  scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
  return {
    "required_bytes": round(float(m.group(1)) * scale[m.group(2)]),
    "available_bytes": round(float(m.group(3)) * scale[m.group(4)]),
  }


# --- what a compiled program costs -----------------------------------------------


def collective_seconds(c: hlo.Collective, chip: Chip) -> float:
  """Bandwidth time of the collectives `c` on one device: ring algorithms over n devices
  move 2(n−1)/n of the buffer per device for an all-reduce, (n−1)/n for a reduce-scatter,
  all-gather or all-to-all, all of it for a permute; at the device's ICI bandwidth (every
  link, so a lower bound) or its DCN share. No latency, no overlap."""
  device = per_device(chip)
  n = max(c.group_size, 1)
  share = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(c.kind, (n - 1) / n)
  bandwidth = device.dcn_bytes_per_s if c.dcn else device.ici_bytes_per_s
  return share * c.bytes / bandwidth


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
  flops, matmul = float(cost.get("flops", 0.0)), float(hlo.matmul_flops(text))
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
    "loops": hlo.while_loops(text),
  }


def report(compiled, *, chip: Chip, mesh) -> dict:
  """Per-device memory and fit (`*_bytes`, `fits`), cost (`flops` from XLA, loop bodies
  once; `matmul_flops` ours, loops included; `bytes_accessed`), roofline (`compute_s` from
  the larger flop count, `memory_s`, `roofline_s`), collectives with their bandwidth times
  (`ici_s`, `dcn_s`: not in the roofline), host callbacks and aliased parameters of a
  compiled TPU executable on `mesh` of `chip`s. Plain numbers, strings and lists: JSON."""
  text = compiled.as_text()
  found = hlo.collectives(text, mesh)
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
    "collectives_by_kind": hlo.collectives_by_kind(found),
    "host_callbacks": hlo.host_callbacks(text),
    "aliased_parameters": sorted(hlo.aliased_parameters(text)),
  }


def refused(error: BaseException, *, chip: Chip, mesh) -> dict | None:
  """A `report`-shaped row for a program XLA refused to compile for lack of memory (even
  past COMPILE_PAST_OOM: one buffer over the whole HBM): its need as total and temporary
  bytes (a lower bound), no cost, `refused` the error's first line; None when `error` is
  not an out-of-memory error. An "Invalid TPU program" (`_INVALID`) is a refusal whose need
  is unknown: 0 bytes, "need_unknown" True (`format_table` shows "?")."""
  oom = out_of_memory(error)
  unknown = oom is None and _INVALID.search(str(error)) is not None
  if oom is None and not unknown:
    return None
  hbm = per_device(chip).hbm_bytes
  need = 0 if unknown else oom["required_bytes"]
  zero = ("argument_bytes", "output_bytes", "alias_bytes", "code_bytes", "flops", "matmul_flops")
  return {
    "chip": chip.name,
    "mesh": {name: int(size) for name, size in mesh.shape.items()},
    "devices": int(mesh.devices.size),
    **dict.fromkeys(zero, 0),
    "temp_bytes": need,
    "total_bytes": need,
    "hbm_bytes": hbm,
    "headroom_bytes": hbm - need,
    "fits": False,
    "bytes_accessed": 0.0,
    "compute_s": 0.0,
    "memory_s": 0.0,
    "roofline_s": 0.0,
    "xla_optimal_s": 0.0,
    "loops": [],
    "ici_s": 0.0,
    "dcn_s": 0.0,
    "collectives": [],
    "collectives_by_kind": {},
    "host_callbacks": [],
    "aliased_parameters": [],
    "refused": str(error).strip().splitlines()[0][:300],
    "need_unknown": unknown,
  }


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
        ("?" if r.get("need_unknown") else f"{r['total_bytes'] / GiB:.2f}")
        + f" / {r['hbm_bytes'] / GiB:.0f}",
        f"{r['temp_bytes'] / GiB:.2f}",
        f"{max(r['flops'], r.get('matmul_flops', 0.0)) / 1e9:.1f}",
        f"{r['roofline_s'] * 1e3:.3f}",
        f"{r.get('ici_s', 0.0) * 1e3:.3f}"
        + (f" +DCN {r['dcn_s'] * 1e3:.3f}" if r.get("dcn_s") else ""),
        hlo.summary(r.get("collectives", [])) or "none",
      )
    )
  widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
  right = {2, 3, 4, 5, 6}
  out = []
  for line in lines:
    cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))]
    out.append("  ".join(cells).rstrip())
  return "\n".join(out)
