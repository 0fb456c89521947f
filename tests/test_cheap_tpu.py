"""tests/cheap_tpu.py: a TPU program recorded in one session is read back in the next as
the real compile describes it, and a refusal is raised again."""

import cheap_tpu
import jax
import jax.numpy as jnp
import pytest

from grpo_jax.infra import tpu
from grpo_jax.models import sharding
from grpo_jax.trainer import aot


@pytest.fixture(scope="module")
def layout():
  return sharding.Layout.create(
    sharding.MeshConfig(data=1, fsdp=2, tensor=2), devices=tpu.load_topology("v5e:2x2")
  )


def _program(layout):
  """(jitted, args): a step over a dict of sharded params, a PRNG key, and an array it
  does not read (XLA gives no sharding for it)."""
  rows, rep = layout.rows(8), layout.replicated
  w = jax.sharding.NamedSharding(layout.mesh, jax.sharding.PartitionSpec("fsdp", "tensor"))

  def step(params, x_BD, key, unused):
    h = jnp.tanh(x_BD @ params["w"])
    noise = jax.random.normal(key, h.shape)
    return {"w": params["w"] - 0.1 * (x_BD.T @ h), "b": params["b"]}, (h + noise).sum(), key

  jitted = jax.jit(step, donate_argnums=0)
  params = {
    "w": jax.ShapeDtypeStruct((64, 64), jnp.float32, sharding=w),
    "b": jax.ShapeDtypeStruct((64,), jnp.float32, sharding=rep),
  }
  x = jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=rows)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)
  unused = jax.ShapeDtypeStruct((4,), jnp.int32, sharding=rep)
  return jitted, (params, x, key, unused)


def test_a_recorded_program_reads_back_as_compiled(layout, tmp_path, monkeypatch):
  monkeypatch.setattr(cheap_tpu, "RECORDS", tmp_path)
  jitted, args = _program(layout)
  with cheap_tpu.memo() as first:
    real = aot.compile_function(jitted, args, layout=layout)
    assert aot.compile_function(jitted, args, layout=layout) is real  # Within a session.
  assert first == {"compiled": 1, "reused": 1, "loaded": 0}
  assert len(list(tmp_path.iterdir())) == 1
  with cheap_tpu.memo() as second:  # A later session.
    got = aot.compile_function(jitted, args, layout=layout)
  assert second == {"compiled": 0, "reused": 0, "loaded": 1}
  assert isinstance(got, cheap_tpu.Recorded) and got.as_text() == real.as_text()
  mem, want = got.memory_analysis(), real.memory_analysis()
  assert all(getattr(mem, k) == getattr(want, k) for k in cheap_tpu._MEMORY)
  assert mem.temp_size_in_bytes > 0 and got.cost_analysis() == real.cost_analysis()
  assert jax.tree.structure(got.out_info) == jax.tree.structure(real.out_info)
  for a, b in zip(jax.tree.leaves(got.out_info), jax.tree.leaves(real.out_info), strict=True):
    assert (a.shape, a.dtype, a.sharding) == (b.shape, b.dtype, b.sharding)
  assert got.input_shardings == real.input_shardings
  assert got.input_shardings[0][3] is real.input_shardings[0][3] is None  # Not read.
  assert got.output_shardings == real.output_shardings
  assert got.input_shardings[0][0]["w"].spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  # What aot reads of it: the same report.
  report = lambda c: tpu.report(c, chip=tpu.chip_for("v5e:2x2"), mesh=layout.mesh)  # noqa: E731
  assert report(got) == report(real)


def test_another_program_or_compiler_is_compiled_afresh(layout, tmp_path, monkeypatch):
  monkeypatch.setattr(cheap_tpu, "RECORDS", tmp_path)
  jitted, (params, x, key, unused) = _program(layout)
  wider = jax.ShapeDtypeStruct((16, 64), jnp.float32, sharding=layout.rows(16))
  with cheap_tpu.memo():
    aot.compile_function(jitted, (params, x, key, unused), layout=layout)
  with cheap_tpu.memo() as counts:
    aot.compile_function(jitted, (params, wider, key, unused), layout=layout)
  assert counts["compiled"] == 1
  # Another compiler input (libtpu's flags): another key, though this program is the same.
  monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_enable_latency_hiding_scheduler=true")
  cheap_tpu._versions.cache_clear()
  try:
    with cheap_tpu.memo() as counts:
      aot.compile_function(jitted, (params, x, key, unused), layout=layout)
  finally:
    cheap_tpu._versions.cache_clear()
  assert counts == {"compiled": 1, "reused": 0, "loaded": 0}
  assert len(list(tmp_path.iterdir())) == 3


def test_a_refusal_is_recorded_and_raised_again(layout, tmp_path, monkeypatch):
  monkeypatch.setattr(cheap_tpu, "RECORDS", tmp_path)
  jitted, args = _program(layout)
  real = aot.compile_function
  calls = []

  def refusing(jitted, args, *, layout=None):
    calls.append(1)
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm.")

  monkeypatch.setattr(aot, "compile_function", refusing)
  with cheap_tpu.memo(), pytest.raises(jax.errors.JaxRuntimeError, match="Ran out of memory"):
    aot.compile_function(jitted, args, layout=layout)
  refused = pytest.raises(jax.errors.JaxRuntimeError, match="Ran out of memory")
  with cheap_tpu.memo() as counts, refused:
    aot.compile_function(jitted, args, layout=layout)
  assert calls == [1] and counts["loaded"] == 1
  monkeypatch.setattr(aot, "compile_function", real)
  (record,) = tmp_path.iterdir()
  record.write_bytes(b"not a pickle")
  with cheap_tpu.memo() as counts:  # An unreadable record: compiled, and written again.
    aot.compile_function(jitted, args, layout=layout)
  assert counts["compiled"] == 1
  with cheap_tpu.memo() as counts:
    assert isinstance(aot.compile_function(jitted, args, layout=layout), cheap_tpu.Recorded)
  assert counts["loaded"] == 1
