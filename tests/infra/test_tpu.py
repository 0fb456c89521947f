"""TPU planning (grpo_jax.infra.tpu): the chip table, abstract topologies from libtpu, and
what XLA TPU's compiled programs say, read from hand-written HLO (numbers by hand) and from
real TPU executables compiled on this CPU host for v5e topologies."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import shard_map
from jax._src import xla_bridge
from jax.experimental import mesh_utils, topologies
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from grpo_jax.infra import hlo, tpu

GiB = 2**30


@pytest.fixture(scope="module", autouse=True)
def no_persistent_cache_writes():
  """conftest's persistent compilation cache would store these TPU executables, which a
  compile-only client cannot load back (a warning per program on the next run)."""
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e9)
  yield
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


@pytest.fixture(scope="module")
def v5e_2x2():
  return tpu.load_topology("v5e:2x2")


@pytest.fixture(scope="module")
def v5e_2x2_two_slices():
  return tpu.load_topology("v5e:2x2", num_slices=2)


def _sds(mesh, shape, spec, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))


# --- chips ---------------------------------------------------------------------------


def test_chip_table_pins_the_published_figures():
  v4, v5e, v5p, v6e = (tpu.CHIPS[n] for n in ("v4", "v5e", "v5p", "v6e"))
  assert (v4.hbm_bytes, v4.peak_bf16_flops, v4.hbm_bytes_per_s) == (32 * GiB, 275e12, 1200e9)
  assert (v5e.hbm_bytes, v5e.peak_bf16_flops, v5e.hbm_bytes_per_s) == (16 * GiB, 197e12, 819e9)
  assert (v5p.hbm_bytes, v5p.peak_bf16_flops, v5p.hbm_bytes_per_s) == (95 * GiB, 459e12, 2765e9)
  assert (v6e.hbm_bytes, v6e.peak_bf16_flops, v6e.hbm_bytes_per_s) == (32 * GiB, 918e12, 1640e9)
  # ICI per chip, all links, one direction: the pages' Gbps / 8 (v4: 6 links × 50 GB/s).
  assert [c.ici_bytes_per_s for c in (v4, v5e, v5p, v6e)] == [300e9, 200e9, 600e9, 448e9]
  # DCN per chip: v5e 2 × 100 Gb/s per 8 chips, v6e 4 × 200 Gb/s per 8, v5p 50 Gb/s a chip.
  assert [c.dcn_bytes_per_s for c in (v5e, v5p, v6e)] == [3.125e9, 6.25e9, 12.5e9]
  assert [c.device_kind for c in (v4, v5e, v5p, v6e)] == [
    "TPU v4",
    "TPU v5 lite",
    "TPU v5",
    "TPU v6 lite",
  ]
  for name, chip in tpu.CHIPS.items():
    assert chip.name == name and chip.source == f"https://cloud.google.com/tpu/docs/{name}"


def test_per_device_figures_divide_by_the_cores_a_chip_shows():
  split_v4 = dataclasses.replace(tpu.CHIPS["v4"], cores_per_chip=2)  # v4 without megacore
  one = tpu.per_device(split_v4)
  assert (one.hbm_bytes, one.peak_bf16_flops, one.hbm_bytes_per_s) == (16 * GiB, 137.5e12, 600e9)
  assert (one.ici_bytes_per_s, one.cores_per_chip) == (150e9, 1)
  assert tpu.per_device(tpu.CHIPS["v5e"]) == tpu.CHIPS["v5e"]


def test_chip_for_reads_both_name_forms_and_names_the_known_chips_otherwise():
  assert tpu.chip_for("v5e:2x4") is tpu.CHIPS["v5e"]
  assert tpu.chip_for("v5litepod-8") is tpu.CHIPS["v5e"]
  assert tpu.chip_for("v4:2x2x1") is tpu.CHIPS["v4"]
  assert tpu.chip_for("v6e-4") is tpu.CHIPS["v6e"]
  for bad in ("v7:2x2", "tpu", "v5x:2x2"):
    with pytest.raises(ValueError, match="known chips are v4, v5e, v5p, v6e") as err:
      tpu.chip_for(bad)
    assert "\n" not in str(err.value)


# --- topologies ----------------------------------------------------------------------


@pytest.mark.parametrize(
  "name,chips", [("v4:2x2x1", 4), ("v5e:2x2", 4), ("v5p:2x2x1", 4), ("v6e:2x4", 8)]
)
def test_each_chip_shows_cores_per_chip_devices_per_chip(name, chips):
  chip = tpu.chip_for(name)
  devices = tpu.load_topology(name)
  assert len(devices) == chips * chip.cores_per_chip
  assert {d.device_kind for d in devices} == {chip.device_kind}
  assert {d.core_on_chip for d in devices} == {0}


def test_v4_is_loaded_as_megacore_because_jax_meshes_need_one_device_a_chip():
  split = topologies.get_topology_desc(topology_name="v4:2x2x1", platform="tpu").devices
  assert len(split) == 8  # libtpu's default: each TensorCore a device
  with pytest.raises(AssertionError, match="requires one device per chip"):
    mesh_utils.create_device_mesh((8,), split)
  assert mesh_utils.create_device_mesh((4,), tpu.load_topology("v4:2x2x1")).shape == (4,)


def test_load_topology_counts_devices_hosts_and_slices(v5e_2x2, v5e_2x2_two_slices):
  assert (len(v5e_2x2), tpu.hosts(v5e_2x2), tpu.slices(v5e_2x2)) == (4, 1, 1)
  two = v5e_2x2_two_slices
  assert (len(two), tpu.slices(two), tpu.hosts(two)) == (8, 2, 2)
  assert [d.slice_index for d in two] == [0] * 4 + [1] * 4
  big = tpu.load_topology("v5e:4x8")
  assert (len(big), tpu.hosts(big), tpu.slices(big)) == (32, 8, 1)


@pytest.mark.parametrize(
  "name,match",
  [
    ("v5e:3x3", r"bad TPU topology 'v5e:3x3': Topology layout .* is not divisible"),
    ("v5e-8", r"bad TPU topology 'v5e-8': expected chip:AxB\[xC\]"),
    ("v7:2x2", r"unknown TPU chip in topology 'v7:2x2': known chips are v4, v5e, v5p, v6e"),
  ],
)
def test_a_bad_topology_is_one_line_with_valid_examples(name, match):
  with pytest.raises(ValueError, match=match) as err:
    tpu.load_topology(name)
  assert "\n" not in str(err.value) and "v5e:4x8" in str(err.value)


def test_missing_libtpu_is_one_line_saying_how_to_install_it(monkeypatch):
  # What jax does without the plugin: no libtpu on the path, none loaded.
  monkeypatch.setattr(xla_bridge.xla_client, "pjrt_plugin_loaded", lambda name: False)
  monkeypatch.setattr(xla_bridge, "get_tpu_library_path", lambda: None)
  with pytest.raises(RuntimeError, match="JAX TPU support not installed"):
    xla_bridge.make_pjrt_tpu_topology("v5e:2x2")
  with pytest.raises(tpu.TpuUnavailable) as err:
    tpu.load_topology("v5e:2x2")
  message = str(err.value)
  assert "\n" not in message
  assert "libtpu" in message and 'pip install -e ".[tpu]"' in message


# --- collectives in hand-written HLO -------------------------------------------------

# The printed forms XLA TPU emits (module docstring), on a 2x2 mesh ("data", "fsdp") whose
# logical ids 0..3 are (0,0), (0,1), (1,0), (1,1): {0,1},{2,3} vary fsdp; {0,2},{1,3} data.
HLO = """\
HloModule jit_step, is_scheduled=true, input_output_alias={ {0}: (0, {}, may-alias), {1}: (2, {}, may-alias) }, num_partitions=4

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %sum = f32[] add(%x, %y)
}

%all-reduce-scatter (input: f32[16,16]) -> f32[8,16] {
  %input = f32[16,16]{1,0:T(8,128)} parameter(0)
  %all-reduce.7 = f32[16,16]{1,0:T(8,128)} all-reduce(%input), channel_id=7, replica_groups={{0,2},{1,3}}, use_global_device_ids=true, to_apply=%add
  ROOT %dynamic-slice = f32[8,16]{1,0:T(8,128)} dynamic-slice(%all-reduce.7, %input, %input), dynamic_slice_sizes={8,16}
}

%start_fusion (param_0: f32[8,16]) -> f32[16,16] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  ROOT %all-gather.33 = f32[16,16]{1,0} all-gather(%param_0), channel_id=10, replica_groups=[2,2]<=[4], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
}

%done_fusion (param_0.1: f32[8,16]) -> f32[16,16] {
  %param_0.1 = f32[8,16]{1,0} parameter(0)
  ROOT %all-gather.37 = f32[16,16]{1,0} all-gather(%param_0.1), channel_id=10, replica_groups=[2,2]<=[4], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
}

%body (state: (s32[], f32[8,16], f32[16,16])) -> (s32[], f32[8,16], f32[16,16]) {
  %state = (s32[], f32[8,16]{1,0}, f32[16,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %h = f32[8,16]{1,0} get-tuple-element(%state), index=1
  %w = f32[16,16]{1,0} get-tuple-element(%state), index=2
  %dot = f32[8,16]{1,0} dot(%h, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ar.loop = f32[8,16]{1,0} all-reduce(%dot), channel_id=8, replica_groups=[2,2]<=[4], use_global_device_ids=true, to_apply=%add
  ROOT %next = (s32[], f32[8,16]{1,0}, f32[16,16]{1,0}) tuple(%i, %ar.loop, %w)
}

%cond (state.1: (s32[], f32[8,16], f32[16,16])) -> pred[] {
  %state.1 = (s32[], f32[8,16]{1,0}, /*index=2*/f32[16,16]{1,0}) parameter(0)
  %limit = s32[]{:T(128)} constant(3)
  %i.1 = s32[] get-tuple-element(%state.1), index=0
  ROOT %lt = pred[] compare(%i.1, %limit), direction=LT
}

ENTRY %main (p0: f32[8,16], p1: bf16[1024,4096], p2: f32[16,16]) -> f32[8,16] {
  %p0 = f32[8,16]{1,0} parameter(0)
  %p1 = bf16[1024,4096]{1,0} parameter(1)
  %p2 = f32[16,16]{1,0} parameter(2)
  %f4 = f32[4]{0} constant({1, 2, 3, 4})
  %ar = f32[8,16]{1,0} all-reduce(%p0), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=%add
  %ag = f32[16,16]{1,0} all-gather(%ar), channel_id=2, replica_groups=[2,2]<=[2,2]T(1,0), dimensions={0}, use_global_device_ids=true
  %ags = (f32[8,16]{1,0}, f32[16,16]{1,0}) all-gather-start(%p0), channel_id=3, replica_groups=[2,2]<=[4], dimensions={0}, use_global_device_ids=true
  %agd = f32[16,16]{1,0} all-gather-done(%ags)
  %cps = (f32[8,16]{1,0}, f32[8,16]{1,0}, u32[], u32[]) collective-permute-start(%p0), channel_id=4, source_target_pairs={{0,2},{2,0},{1,3},{3,1}}
  %cpd = f32[8,16]{1,0} collective-permute-done(%cps)
  %tup = (bf16[1024,4096]{1,0}, f32[4]{0}) all-reduce(%p1, %f4), channel_id=5, replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, use_global_device_ids=true, to_apply=%add
  %ar.ids = f32[8,16]{1,0} all-reduce(%p0), channel_id=6, replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_1'}, use_global_device_ids=true, to_apply=%add
  %ar.sub = f32[8,16]{1,0} all-reduce(%p0), channel_id=9, replica_groups=mesh['a'=4] {'a':(1)2}, use_global_device_ids=true, to_apply=%add
  %rs = f32[8,16]{1,0} fusion(%p2), kind=kCustom, calls=%all-reduce-scatter
  %s1 = f32[16,16]{1,0} fusion(%p0), kind=kCustom, calls=%start_fusion
  %s2 = f32[16,16]{1,0} fusion(%p0), kind=kCustom, calls=%done_fusion
  %c0 = s32[] constant(0)
  %init = (s32[], f32[8,16]{1,0}, f32[16,16]{1,0}) tuple(%c0, %p0, %p2)
  %loop = (s32[], f32[8,16]{1,0}, f32[16,16]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,16]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_collectives_read_every_printed_form_by_hand(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2).reshape(2, 2), ("data", "fsdp"))
  C = hlo.Collective
  assert hlo.collectives(HLO, mesh) == [
    # Channels 5 (mesh form: bf16[1024,4096] + f32[4] = 8388608 + 16 bytes), 6 (mesh form with
    # transposed device_ids [[0,2],[1,3]], grouped along its rows) and 9 (the major half of a
    # flat axis of 4: sub-axis (1)2).
    C("all-reduce", ("data",), 3, 8389648, 8389648, 8389648, 2, False),
    # Channel 1 once, channel 8 in a loop of 3 (condition i < 3): 4 × 512 bytes.
    C("all-reduce", ("fsdp",), 4, 2048, 2048, 2048, 2, False),
    # The all-reduce in the all-reduce-scatter fusion: f32[16,16] in, f32[8,16] out.
    C("reduce-scatter", ("data",), 1, 1024, 1024, 512, 2, False),
    # Iota with transpose [2,2]<=[2,2]T(1,0) -> {0,2},{1,3}.
    C("all-gather", ("data",), 1, 1024, 512, 1024, 2, False),
    # all-gather-start (its done not counted) and channel 10 (start and done fusions, once).
    C("all-gather", ("fsdp",), 2, 2048, 1024, 2048, 2, False),
    C("collective-permute", ("data",), 1, 512, 512, 512, 2, False),
  ]
  assert hlo.while_loops(HLO) == [3]
  assert hlo.matmul_flops(HLO) == 3 * 2 * 8 * 16 * 16  # the loop's dot, 3 times
  assert hlo.aliased_parameters(HLO) == {0, 2}
  assert hlo.host_callbacks(HLO) == []
  assert hlo.collectives(HLO, mesh)[2].summary() == "reduce-scatter×1 data"
  by_kind = hlo.collectives_by_kind(hlo.collectives(HLO, mesh))
  assert by_kind["all-reduce"] == {
    "count": 7,
    "bytes": 8391696,
    "axes": ["data", "fsdp"],
    "dcn_count": 0,
  }


def test_a_loop_without_a_constant_bound_counts_once():
  unbounded = HLO.replace(
    "ROOT %lt = pred[] compare(%i.1, %limit), direction=LT", "ROOT %lt = pred[] and(%i.1, %limit)"
  )
  assert hlo.while_loops(unbounded) == [None]
  assert hlo.matmul_flops(unbounded) == 2 * 8 * 16 * 16


def test_a_loop_whose_counter_steps_by_two_runs_half_its_bound():
  """TPU's windowed einsums (collective matmuls) count 0, 2 < 4: two iterations, not four."""
  stepped = HLO.replace(
    "  ROOT %next = (s32[], f32[8,16]{1,0}, f32[16,16]{1,0}) tuple(%i, %ar.loop, %w)",
    "  %two = s32[] constant(2)\n  %i.next = s32[] add(%i, %two)\n"
    "  ROOT %next = (s32[], f32[8,16]{1,0}, f32[16,16]{1,0}) tuple(%i.next, %ar.loop, %w)",
  ).replace("%limit = s32[]{:T(128)} constant(3)", "%limit = s32[]{:T(128)} constant(4)")
  assert stepped != HLO
  assert hlo.while_loops(stepped) == [2]
  assert hlo.matmul_flops(stepped) == 2 * 2 * 8 * 16 * 16


MEGASCALE = """\
HloModule jit_f, is_scheduled=true, num_partitions=4

ENTRY %main (p: f32[8,128]) -> f32[16,128] {
  %p = f32[8,128]{1,0} parameter(0)
  %after-all = token[] after-all()
  %send = (f32[8,128]{1,0}, u32[], token[]) send(%p, %after-all), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all_gather.3_0",_xla_megascale_target={{100000,200000},{100001,200001},{100002,200002},{100003,200003}},_xla_megascale_transfer_type="ALL_GATHER"}
  %recv = (f32[16,128]{1,0}, u32[], token[]) recv(%after-all), channel_id=1, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="all_gather.3_0",_xla_megascale_target={{100000,200000},{100001,200001},{100002,200002},{100003,200003}},_xla_megascale_transfer_type="ALL_GATHER"}
  %send-done = token[] send-done(%send), channel_id=2, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
  %recv-done = (f32[16,128]{1,0}, token[]) recv-done(%recv), channel_id=1, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime"}
  %send.1 = (f32[8,128]{1,0}, u32[], token[]) send(%p, %after-all), channel_id=4, is_host_transfer=true, frontend_attributes={_xla_host_transfer_handler_name="xla_megascale_runtime",_xla_host_transfer_rendezvous="collective-permute_0",_xla_megascale_target={{100001->200000},{200000->100001}},_xla_megascale_transfer_type="ONE_TO_ONE"}
  ROOT %out = f32[16,128]{1,0} get-tuple-element(%recv-done), index=0
}
"""


def test_cross_slice_transfers_are_dcn_collectives_by_hand(v5e_2x2_two_slices):
  mesh = Mesh(np.array(v5e_2x2_two_slices).reshape(2, 4), ("data", "fsdp"))
  assert hlo.collectives(MEGASCALE, mesh) == [
    # Pairs (10000j, 20000j): the same fsdp position in slices 0 and 1. Sent f32[8,128] (4096
    # bytes), received f32[16,128].
    hlo.Collective("all-gather", ("data",), 1, 8192, 4096, 8192, 2, True),
    # 100001 is (data 0, fsdp 1), 200000 is (data 1, fsdp 0).
    hlo.Collective("collective-permute", ("data", "fsdp"), 1, 4096, 4096, 4096, 2, True),
  ]
  assert hlo.host_callbacks(MEGASCALE) == []  # DCN transfers are not callbacks


# --- compiled for TPU ----------------------------------------------------------------


@pytest.mark.parametrize("axis", ["fsdp", "data"])
def test_a_psum_over_one_axis_maps_to_that_axis_on_a_permuted_mesh(v5e_2x2, axis):
  # Device ids 3,1 / 2,0: read as device ids, {0,1},{2,3} would be the *data* axis.
  mesh = Mesh(np.array([v5e_2x2[i] for i in (3, 1, 2, 0)]).reshape(2, 2), ("data", "fsdp"))
  other = "data" if axis == "fsdp" else "fsdp"
  psum = shard_map(
    lambda b: jax.lax.psum(b, axis), mesh=mesh, in_specs=P("data", "fsdp"), out_specs=P(other)
  )
  compiled = jax.jit(psum).lower(_sds(mesh, (8, 256), P("data", "fsdp"))).compile()
  # Each device holds f32[4,128] (2048 bytes); a pair of devices sums it.
  assert hlo.collectives(compiled.as_text(), mesh) == [
    hlo.Collective("all-reduce", (axis,), 1, 2048, 2048, 2048, 2, False)
  ]


def _fsdp_gradient(mesh):
  def loss(w, x):
    return jnp.mean((x @ w) ** 2)

  w, x = _sds(mesh, (1024, 512), P("fsdp", None)), _sds(mesh, (256, 1024), P(("data", "fsdp")))
  out = NamedSharding(mesh, P("fsdp", None))
  return jax.jit(jax.grad(loss), out_shardings=out).lower(w, x).compile()


def test_an_fsdp_gradient_is_an_all_gather_and_a_reduce_scatter_over_fsdp(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2).reshape(1, 4), ("data", "fsdp"))
  text = _fsdp_gradient(mesh).as_text()
  # XLA TPU prints the reduce-scatter as an all-reduce + dynamic-slice inside a kCustom
  # fusion of a computation named all-reduce-scatter; there is no reduce-scatter op.
  assert " reduce-scatter(" not in text and "kind=kCustom, calls=%all-reduce-scatter" in text
  assert hlo.collectives(text, mesh) == [
    # The f32 gradient [1024,512] (2 MiB) summed over 4 devices, each keeping [256,512].
    hlo.Collective("reduce-scatter", ("fsdp",), 1, 2 * 2**20, 2 * 2**20, 2**19, 4, False),
    # w's rows gathered as bf16 (XLA converts first: the matmul runs at bf16 precision).
    hlo.Collective("all-gather", ("fsdp",), 1, 2**20, 2**18, 2**20, 4, False),
  ]


def test_across_two_slices_the_data_axis_is_dcn_and_fsdp_is_ici(v5e_2x2_two_slices):
  mesh = Mesh(np.array(v5e_2x2_two_slices).reshape(2, 4), ("data", "fsdp"))
  compiled = _fsdp_gradient(mesh)
  text = compiled.as_text()
  assert "num_partitions=4" in text  # one program per slice
  assert hlo.collectives(text, mesh) == [
    hlo.Collective("reduce-scatter", ("fsdp",), 1, 2 * 2**20, 2 * 2**20, 2**19, 4, False),
    hlo.Collective("all-gather", ("fsdp",), 1, 2**20, 2**18, 2**20, 4, False),
    # Then each device's [256,512] f32 shard is summed with its twin in the other slice.
    hlo.Collective("all-reduce", ("data",), 1, 2**19, 2**19, 2**19, 2, True),
  ]
  row = tpu.report(compiled, chip=tpu.CHIPS["v5e"], mesh=mesh)
  assert row["host_callbacks"] == []  # the DCN send/recv are not host callbacks
  # Ring all-reduce over 2: 2·(2−1)/2 of 512 KiB at v5e's 3.125 GB/s of DCN per chip.
  assert row["dcn_s"] == pytest.approx(2**19 / 3.125e9)
  # ICI: (4−1)/4 of the reduce-scatter's 2 MiB and of the all-gather's 1 MiB, at 200 GB/s.
  assert row["ici_s"] == pytest.approx(0.75 * 2 * 2**20 / 200e9 + 0.75 * 2**20 / 200e9)


def test_a_scanned_program_counts_its_loop(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))

  def layers(ws, x):
    h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
    return h

  ws, x = _sds(mesh, (3, 512, 512), P(None, "fsdp")), _sds(mesh, (256, 512), P("fsdp"))
  compiled = jax.jit(layers).lower(ws, x).compile()
  one_layer = 2 * 64 * 512 * 512  # 64 rows a device × [512, 512] weights
  row = tpu.report(compiled, chip=tpu.CHIPS["v5e"], mesh=mesh)
  assert row["loops"] == [3]
  assert row["matmul_flops"] == 3 * one_layer
  # XLA TPU's cost analysis counts the loop body once.
  assert one_layer <= row["flops"] < 2 * one_layer
  assert row["compute_s"] == pytest.approx(3 * one_layer / 197e12)
  # The w's columns are gathered once a layer, each [512, 512] as bf16: 3 all-gathers.
  assert [(c["kind"], tuple(c["axes"]), c["count"]) for c in row["collectives"]] == [
    ("all-gather", ("fsdp",), 3)
  ]
  json.dumps(row)  # a report is plain data


def test_dots_tpu_writes_as_convolutions_count_their_real_taps(v5e_2x2):
  """TPU writes attention's batched dot as a convolution whose window spans the batch with
  lhs_dilate (size=16x2 lhs_dilate=16x2: one real tap an output position) and a
  multi-head projection as one over the heads (size=1x4): both count 2·M·N·K by hand, as
  XLA's own cost analysis does (each window tap counted, the first read 32x that)."""
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))
  B, K, Q, S, E = 64, 2, 128, 128, 32
  scores = jax.jit(lambda q, k: jnp.einsum("bkqe,bkse->bkqs", q, k)).lower(
    _sds(mesh, (B, K, Q, E), P("fsdp")), _sds(mesh, (B, K, S, E), P("fsdp"))
  )
  text = scores.compile().as_text()
  assert "lhs_dilate=16x2" in text
  assert hlo.matmul_flops(text) == 2 * (B // 4) * K * Q * S * E
  heads = jax.jit(lambda x, w: jnp.einsum("btkh,khd->btd", x, w)).lower(
    _sds(mesh, (64, 64, 4, 32), P("fsdp")), _sds(mesh, (4, 32, 128), P())
  )
  text = heads.compile().as_text()
  assert "window={size=1x4}" in text
  assert hlo.matmul_flops(text) == 2 * 16 * 64 * (4 * 32) * 128


# --- report ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def matmul(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))
  a = _sds(mesh, (1024, 2048), P("fsdp", None), jnp.bfloat16)
  b = _sds(mesh, (2048, 512), P(), jnp.bfloat16)
  return mesh, jax.jit(lambda a, b: a @ b).lower(a, b).compile()


def test_report_of_a_sharded_matmul_is_per_device(matmul):
  mesh, compiled = matmul
  row = tpu.report(compiled, chip=tpu.CHIPS["v5e"], mesh=mesh)
  M, K, N = 1024, 2048, 512
  assert row["flops"] == row["matmul_flops"] == 2 * M * N * K / 4  # a quarter of the rows each
  # bf16: a's [256, 2048] rows (1 MiB) and all of b (2 MiB) in; [256, 512] (256 KiB) out.
  assert (row["argument_bytes"], row["output_bytes"], row["alias_bytes"]) == (3 * 2**20, 2**18, 0)
  assert row["temp_bytes"] == 0 and row["code_bytes"] > 0
  total = 3 * 2**20 + 2**18 + row["code_bytes"]
  assert (row["total_bytes"], row["hbm_bytes"]) == (total, 16 * GiB)
  assert row["fits"] and row["headroom_bytes"] == 16 * GiB - total
  # XLA's bytes accessed include the tiled matmul's re-reads: at least every byte once.
  assert row["bytes_accessed"] >= 3 * 2**20 + 2**18
  flops_s, bytes_s = row["flops"] / 197e12, row["bytes_accessed"] / 819e9
  assert (row["compute_s"], row["memory_s"]) == (flops_s, bytes_s)
  assert row["roofline_s"] == max(flops_s, bytes_s) == bytes_s  # memory-bound at this size
  assert row["collectives"] == [] and row["ici_s"] == row["dcn_s"] == 0 and row["loops"] == []
  assert row["host_callbacks"] == [] and row["aliased_parameters"] == []
  assert (row["chip"], row["mesh"], row["devices"]) == ("v5e", {"fsdp": 4}, 4)


def test_report_bytes_of_an_elementwise_program_by_hand(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))
  compiled = jax.jit(lambda x: x * 2).lower(_sds(mesh, (1024, 1024), P("fsdp"))).compile()
  row = tpu.report(compiled, chip=tpu.CHIPS["v5e"], mesh=mesh)
  # [256, 1024] f32 a device: 1 MiB read, 1 MiB written, one multiply an element.
  assert (row["bytes_accessed"], row["flops"]) == (2 * 2**20, 256 * 1024)


def test_a_program_bigger_than_hbm_does_not_fit(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))
  big = _sds(mesh, (4 * 9 * GiB // 4,), P("fsdp"))  # 9 GiB of f32 a device, nothing allocated
  lowered = jax.jit(lambda x: x * 2).lower(big)
  with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED") as err:
    lowered.compile()
  assert tpu.out_of_memory(err.value) == {
    "required_bytes": 18 * GiB,
    "available_bytes": 15.75 * GiB,
  }
  row = tpu.report(
    lowered.compile(compiler_options=tpu.COMPILE_PAST_OOM), chip=tpu.CHIPS["v5e"], mesh=mesh
  )
  assert (row["argument_bytes"], row["output_bytes"]) == (9 * GiB, 9 * GiB)
  assert not row["fits"] and row["headroom_bytes"] == 16 * GiB - row["total_bytes"] < -2 * GiB


def test_out_of_memory_ignores_other_errors():
  assert tpu.out_of_memory(RuntimeError("INVALID_ARGUMENT: something else")) is None


def test_host_callbacks_are_found_in_tpu_programs(v5e_2x2, matmul):
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))

  def printing(x):
    jax.debug.print("sum {s}", s=x.sum())
    return x * 2

  compiled = jax.jit(printing).lower(_sds(mesh, (64, 128), P("fsdp"))).compile()
  assert hlo.host_callbacks(compiled.as_text()) == ["jit(printing)/debug_print"]
  assert hlo.host_callbacks(matmul[1].as_text()) == []


def test_aliased_parameters_show_whether_a_donation_was_taken(v5e_2x2):
  mesh = Mesh(np.array(v5e_2x2), ("fsdp",))
  x = _sds(mesh, (64, 128), P("fsdp"))
  donated = jax.jit(lambda x: x * 2, donate_argnums=(0,)).lower(x).compile()
  assert hlo.aliased_parameters(donated.as_text()) == {0}
  kept = jax.jit(lambda x: x * 2).lower(x).compile()
  assert hlo.aliased_parameters(kept.as_text()) == set()


def test_format_table_by_hand():
  rows = [
    {
      "name": "train_step",
      "fits": True,
      "total_bytes": 3 * GiB,
      "hbm_bytes": 16 * GiB,
      "temp_bytes": GiB // 2,
      "flops": 1.5e12,
      "matmul_flops": 2.0e12,
      "roofline_s": 0.0125,
      "ici_s": 0.002,
      "dcn_s": 0.0,
      "collectives": [
        {"kind": "reduce-scatter", "axes": ["fsdp"], "count": 12, "dcn": False},
        {"kind": "all-gather", "axes": ["fsdp"], "count": 24, "dcn": False},
      ],
    },
    {
      "name": "rollout",
      "fits": False,
      "total_bytes": 20 * GiB,
      "hbm_bytes": 16 * GiB,
      "temp_bytes": 12 * GiB,
      "flops": 3e9,
      "roofline_s": 0.5,
      "ici_s": 0.0,
      "dcn_s": 0.004,
      "collectives": [{"kind": "all-reduce", "axes": ["data"], "count": 1, "dcn": True}],
    },
  ]
  assert tpu.format_table(rows) == (
    "name        fits     HBM GiB  temp GiB   GFLOP  roofline ms            ICI ms  collectives\n"
    "train_step  yes    3.00 / 16      0.50  2000.0       12.500             2.000  "
    "reduce-scatter×12 fsdp, all-gather×24 fsdp\n"
    "rollout     NO    20.00 / 16     12.00     3.0      500.000  0.000 +DCN 4.000  "
    "all-reduce×1 data DCN"
  )


def test_an_8_chip_v5e_or_v6e_slice_is_one_host_and_v5e_32_is_eight():
  """As Google sells them: v5litepod-8 and v6e-8 are one VM of 8 chips; larger v5e slices
  hosts of 4 chips (libtpu's default would make 2x4 two hosts)."""
  for name in ("v5e:2x4", "v6e:2x4"):
    devices = tpu.load_topology(name)
    assert (len(devices), tpu.hosts(devices)) == (8, 1), name
  assert tpu.hosts(tpu.load_topology("v5e:4x4")) == 4
