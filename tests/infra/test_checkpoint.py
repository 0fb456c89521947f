"""Checkpointer: round trips of mixed pytrees and JSON meta, retention (latest N plus the
best accuracy), async saves racing buffer donation, shape/structure mismatch errors,
reopening an existing directory (a resumed process), and integrity: every file hashed
before the commit, a changed byte of any file at any offset found, damage set aside and
the previous checkpoint restored, non-finite states refused, the buffer item."""

import contextlib
import json
import pathlib
import shutil

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import xxhash

from grpo_jax.infra import checkpoint


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState
  name: str = flax.struct.field(pytree_node=False, default="policy")


def _params(offset: float = 0.0) -> dict:
  return {
    "w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) + offset,
    "b": jnp.array([0.5, -1.5, 2.25], jnp.float32) + offset,
  }


def _tree(offset: float = 0.0) -> dict:
  params = _params(offset)
  opt_state = optax.adam(1e-2).init(params)
  # One adam update, so mu/nu/count are not all zeros and differ per offset.
  grads = jax.tree.map(lambda p: p * 0.1 + 1.0, params)
  _, opt_state = optax.adam(1e-2).update(grads, opt_state, params)
  return {
    "train": TrainState(step=jnp.int32(7 + offset), params=params, opt_state=opt_state),
    "nothing": None,
    "key_data": jnp.array([0, 1, 2**32 - 1], jnp.uint32),
    "counts": np.array([-5, 0, 2**31 - 1], np.int32),
    "scale": jnp.float32(0.25),
  }


def _leaves_with_paths(tree):
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(p): x for p, x in flat}


def _assert_trees_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  got_leaves, want_leaves = _leaves_with_paths(got), _leaves_with_paths(want)
  assert got_leaves.keys() == want_leaves.keys()
  for path, w in want_leaves.items():
    g = got_leaves[path]
    assert np.asarray(g).dtype == np.asarray(w).dtype, path
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=path)


def _steps_on_disk(directory) -> list[int]:
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


# ----------------------------------------------------------------------------
# Round trips.
# ----------------------------------------------------------------------------


def test_round_trip_mixed_tree_and_meta(tmp_path):
  tree = _tree()
  meta = {
    "iteration": 12,
    "data_index": 384,
    "best_accuracy": 0.4375,
    "warmstart": {"eval/greedy_accuracy": 0.125, "phase": "warmstart"},
    "history": [1, 2.5, "x", None, True],
  }
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt", keep=2)
  ckpt.save(12, tree, meta, accuracy=0.4375)
  ckpt.wait()
  # Restore into a tree of different values: the checkpoint's values must come back.
  got, got_meta = ckpt.restore(12, like=_tree(offset=100.0))
  ckpt.close()
  _assert_trees_equal(got, tree)
  assert isinstance(got["train"], TrainState)
  assert got["train"].name == "policy"
  assert got["nothing"] is None
  adam = got["train"].opt_state[0]
  assert isinstance(adam, optax.ScaleByAdamState)
  assert int(adam.count) == 1
  assert got["key_data"].dtype == np.uint32 and int(got["key_data"][2]) == 2**32 - 1
  assert got["counts"].dtype == np.int32 and int(got["counts"][2]) == 2**31 - 1
  assert got_meta == meta


def test_restore_into_shape_dtype_structs(tmp_path):
  tree = _tree(offset=3.0)
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1)
  ckpt.save(0, tree, {"iteration": 0})
  ckpt.wait()
  like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), tree)
  got, meta = ckpt.restore(0, like=like)
  ckpt.close()
  _assert_trees_equal(got, tree)
  assert meta == {"iteration": 0}


def test_keep_zero_raises(tmp_path):
  with pytest.raises(ValueError, match="keep must be >= 1, got 0"):
    checkpoint.Checkpointer(tmp_path, keep=0)
  with pytest.raises(ValueError, match="got -1"):
    checkpoint.Checkpointer(tmp_path, keep=-1)


# ----------------------------------------------------------------------------
# Retention.
# ----------------------------------------------------------------------------


def _small(step: int) -> dict:
  return {"x": jnp.full((2,), step, jnp.int32)}


def test_keeps_latest_n_plus_best(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=2)
  for step, acc in enumerate([0.1, 0.9, 0.2, 0.3, 0.4]):
    ckpt.save(step, _small(step), {"step": step}, accuracy=acc)
  ckpt.wait()
  # Latest 2 = {3, 4}; best accuracy 0.9 at step 1.
  assert ckpt.all_steps() == [1, 3, 4]
  assert _steps_on_disk(tmp_path) == [1, 3, 4]
  assert ckpt.latest_step() == 4
  got, meta = ckpt.restore(1, like=_small(0))
  np.testing.assert_array_equal(got["x"], [1, 1])
  assert meta == {"step": 1}
  ckpt.close()


def test_best_moves_when_beaten(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1)
  for step, acc in enumerate([0.5, 0.1, 0.7, 0.2, 0.6]):
    ckpt.save(step, _small(step), {}, accuracy=acc)
  ckpt.wait()
  # Latest 1 = {4}; best 0.7 at step 2 (step 0's 0.5 was beaten and is gone).
  assert ckpt.all_steps() == [2, 4]
  ckpt.close()


def test_saves_without_accuracy_are_not_best_candidates(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1)
  for step, acc in enumerate([None, 0.2, None, None]):
    ckpt.save(step, _small(step), {}, accuracy=acc)
  ckpt.wait()
  # Latest 1 = {3}; the only save with an accuracy is step 1. Step 0 (no metric) is
  # deleted although no save with a metric preceded it.
  assert ckpt.all_steps() == [1, 3]
  ckpt.close()


def test_no_accuracy_anywhere_keeps_latest_only(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=2)
  for step in range(4):
    ckpt.save(step, _small(step), {})
  ckpt.wait()
  assert ckpt.all_steps() == [2, 3]
  ckpt.close()


def test_keep_best_false_keeps_latest_only(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=2, keep_best=False)
  for step, acc in enumerate([0.1, 0.9, 0.2, 0.3, 0.4]):
    ckpt.save(step, _small(step), {}, accuracy=acc)
  ckpt.wait()
  assert ckpt.all_steps() == [3, 4]
  ckpt.close()


# ----------------------------------------------------------------------------
# Async saves and donation.
# ----------------------------------------------------------------------------


def test_async_save_survives_donation(tmp_path):
  """A save returns before the files are written; the caller then donates the saved
  buffers to the next step. The checkpoint must hold the values at save time."""
  bump = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)
  ckpt = checkpoint.Checkpointer(tmp_path, keep=5, keep_best=False, async_save=True)
  tree = {"x": jnp.zeros((128, 128), jnp.float32), "n": jnp.zeros((3,), jnp.uint32)}
  for step in range(4):
    ckpt.save(step, tree, {"step": step})
    tree = bump(tree)  # x + 1: every step saves different values.
  # JAX declines a donation while orbax still holds a host view of the buffer (then there
  # is no race); whether it does depends on timing, so only the values are asserted.
  ckpt.wait()
  for step in range(4):
    got, meta = ckpt.restore(step, like=tree)
    np.testing.assert_array_equal(got["x"], np.full((128, 128), step, np.float32))
    np.testing.assert_array_equal(got["n"], np.full((3,), step, np.uint32))
    assert meta == {"step": step}
  ckpt.close()


def test_sync_save_round_trip(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1, async_save=False)
  ckpt.save(3, _small(3), {"a": [1, 2]}, accuracy=0.5)
  got, meta = ckpt.restore(3, like=_small(0))
  np.testing.assert_array_equal(got["x"], [3, 3])
  assert meta == {"a": [1, 2]}
  ckpt.close()


# ----------------------------------------------------------------------------
# Mismatches.
# ----------------------------------------------------------------------------


@pytest.fixture
def saved_small(tmp_path):
  tree = {"params": {"w": jnp.zeros((2, 3)), "b": jnp.zeros((3,))}, "step": jnp.int32(0)}
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1)
  ckpt.save(0, tree, {})
  ckpt.wait()
  yield ckpt, tree
  ckpt.close()


def test_mismatch_changed_shape_names_leaf_and_shapes(saved_small):
  ckpt, tree = saved_small
  like = {**tree, "params": {**tree["params"], "w": jnp.zeros((4, 3))}}
  with pytest.raises(checkpoint.CheckpointMismatchError) as info:
    ckpt.restore(0, like=like)
  message = str(info.value)
  assert "(1 differences)" in message
  assert "params/w: in checkpoint (2, 3), in config (4, 3)" in message
  assert "params/b" not in message and "step" not in message
  assert isinstance(info.value, ValueError)


def test_mismatch_extra_and_missing_leaves(saved_small):
  ckpt, tree = saved_small
  like = {"params": {"w": tree["params"]["w"], "scale": jnp.zeros((3,))}, "step": jnp.int32(0)}
  with pytest.raises(checkpoint.CheckpointMismatchError) as info:
    ckpt.check_compatible(0, like=like)
  message = str(info.value)
  assert "(2 differences)" in message
  assert "params/scale: missing from the checkpoint" in message
  assert "params/b: in the checkpoint only" in message
  # restore refuses too.
  with pytest.raises(checkpoint.CheckpointMismatchError):
    ckpt.restore(0, like=like)


def test_matching_tree_is_compatible(saved_small):
  ckpt, tree = saved_small
  ckpt.check_compatible(0, like=tree)  # No error.
  # A dtype change is not a shape/structure mismatch: values are cast on restore.
  like = jax.tree.map(lambda x: x.astype(jnp.float32), tree)
  got, _ = ckpt.restore(0, like=like)
  assert got["step"].dtype == jnp.float32


def test_mismatch_message_lists_at_most_ten(tmp_path):
  tree = {f"p{i:02d}": jnp.zeros((i + 1,)) for i in range(12)}
  ckpt = checkpoint.Checkpointer(tmp_path, keep=1)
  ckpt.save(0, tree, {})
  ckpt.wait()
  like = {k: jnp.zeros((v.shape[0] + 1,)) for k, v in tree.items()}
  with pytest.raises(checkpoint.CheckpointMismatchError) as info:
    ckpt.restore(0, like=like)
  ckpt.close()
  message = str(info.value)
  assert "(12 differences)" in message
  assert "... and 2 more" in message
  assert "p00: in checkpoint (1,), in config (2,)" in message
  assert "p09: in checkpoint (10,), in config (11,)" in message
  assert "p10:" not in message and "p11:" not in message


# ----------------------------------------------------------------------------
# A new process on an existing directory.
# ----------------------------------------------------------------------------


def test_fresh_checkpointer_reads_existing_directory(tmp_path):
  first = checkpoint.Checkpointer(tmp_path, keep=2)
  first.save(0, _tree(offset=0.0), {"iteration": 0}, accuracy=0.8)
  first.save(1, _tree(offset=1.0), {"iteration": 1}, accuracy=0.1)
  first.close()

  # A resumed run: a new manager that has neither saved nor restored anything yet.
  second = checkpoint.Checkpointer(tmp_path, keep=2)
  assert second.latest_step() == 1
  assert second.all_steps() == [0, 1]
  second.check_compatible(1, like=_tree())
  like = jax.eval_shape(lambda: _tree())
  got, meta = second.restore(second.latest_step(), like=like)
  _assert_trees_equal(got, _tree(offset=1.0))
  assert meta == {"iteration": 1}
  got0, meta0 = second.restore(0, like=_tree(offset=5.0))
  _assert_trees_equal(got0, _tree(offset=0.0))
  assert meta0 == {"iteration": 0}
  with pytest.raises(checkpoint.CheckpointMismatchError, match="train/params/w"):
    second.check_compatible(1, like={**_tree(), "train": _tree()["train"].replace(params={})})
  # It can go on saving after the existing steps.
  second.save(2, _tree(offset=2.0), {"iteration": 2})
  second.close()
  third = checkpoint.Checkpointer(tmp_path, keep=2)
  assert third.latest_step() == 2
  got2, _ = third.restore(2, like=_tree())
  _assert_trees_equal(got2, _tree(offset=2.0))
  third.close()


def test_best_of_an_earlier_process_survives_resume(tmp_path):
  first = checkpoint.Checkpointer(tmp_path, keep=2)
  first.save(0, _small(0), {}, accuracy=0.8)
  first.save(1, _small(1), {}, accuracy=0.1)
  first.close()
  second = checkpoint.Checkpointer(tmp_path, keep=2)
  second.save(2, _small(2), {}, accuracy=0.2)
  second.save(3, _small(3), {}, accuracy=0.3)
  second.wait()
  # Latest 2 = {2, 3}; the best accuracy overall is still 0.8 at step 0.
  steps = second.all_steps()
  second.close()
  assert steps == [0, 2, 3]


# ----------------------------------------------------------------------------
# Faults: damaged checkpoints are found, named and set aside; failed saves are reported.
# ----------------------------------------------------------------------------


def _three(tmp_path, **options):
  ckpt = checkpoint.Checkpointer(tmp_path / "ck", keep=5, **options)
  for step in (1, 2, 3):
    ckpt.save(step, _tree(float(step)), {"step": step})
  ckpt.wait()
  return ckpt


@pytest.fixture(scope="module")
def three_steps(tmp_path_factory):
  """Steps 1, 2, 3 written once and closed; tests damage copies of them (`_copy`)."""
  root = tmp_path_factory.mktemp("three")
  _three(root).close()
  return root / "ck"


def _copy(three_steps, tmp_path) -> pathlib.Path:
  return pathlib.Path(shutil.copytree(three_steps, tmp_path / "ck"))


def _flip(path: pathlib.Path, offset: int) -> None:
  """Inverts the bits of one byte: the file keeps its size."""
  data = bytearray(path.read_bytes())
  data[offset] ^= 0xFF
  path.write_bytes(bytes(data))


def _restore(directory, **kw):
  """(restore_latest's result, the lines it logged), on a fresh Checkpointer."""
  logged = []
  with contextlib.closing(checkpoint.Checkpointer(directory)) as ckpt:
    return ckpt.restore_latest(like=_tree(), log=logged.append, **kw), logged


def test_every_save_records_each_files_size_and_hash_before_its_commit(three_steps, tmp_path):
  for step in (1, 2, 3):
    d = three_steps / str(step)
    written = json.loads((d / checkpoint.MANIFEST).read_text())
    # Written by orbax's callback into the temporary directory: never a step without it.
    assert (written["format"], written["hash"], written["written"]) == (
      2,
      "xxh3_128",
      "before_commit",
    )
    files = written["files"]
    assert {"meta/metadata", "state/_METADATA"} <= set(files)
    assert "_CHECKPOINT_METADATA" not in files  # orbax rewrites it at commit.
    for name, entry in files.items():
      data = (d / name).read_bytes()
      assert entry == {"bytes": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}
    assert checkpoint.damage(d) is None and checkpoint.unverified(d) is None
  sync = checkpoint.Checkpointer(tmp_path / "sync", keep=1, async_save=False)
  sync.save(4, _small(4), {})
  sync.close()
  written = json.loads((tmp_path / "sync" / "4" / checkpoint.MANIFEST).read_text())
  assert written["written"] == "after_commit" and checkpoint.damage(tmp_path / "sync" / "4") is None


def test_file_hash_is_the_xxh3_128_of_the_bytes(tmp_path):
  f = tmp_path / "f"
  f.write_bytes(b"")  # mmap refuses an empty file: read instead.
  assert checkpoint.file_hash(f) == "99aa06d3014798d86001c324468d497f"
  f.write_bytes(b"grpo_jax")
  assert checkpoint.file_hash(f) == "97a59ed462a88679db9a842af11a83c1"
  f.write_bytes(bytes(range(256)) * 70_000)  # 17.9 MB: more than one read chunk.
  assert checkpoint.file_hash(f) == xxhash.xxh3_128(f.read_bytes()).hexdigest()


def test_damage_names_what_is_wrong(three_steps, tmp_path):
  d = _copy(three_steps, tmp_path) / "3"
  biggest = max(
    (p for p in (d / "state").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
  )
  name, size = biggest.relative_to(d), biggest.stat().st_size
  _flip(biggest, size // 2)
  assert (
    checkpoint.damage(d) == f"{name} holds other bytes than when written (its xxh3_128 differs)"
  )
  biggest.write_bytes(biggest.read_bytes()[:-1])
  assert checkpoint.damage(d) == f"{name} has {size - 1} bytes, {size} when written"
  biggest.unlink()
  assert checkpoint.damage(d) == f"{name} is missing"
  (d / checkpoint.MANIFEST).write_text('{"format": 2, "files": ')
  assert checkpoint.damage(d).startswith(f"its file manifest {checkpoint.MANIFEST} is unreadable")
  empty = d.parent / "9"
  empty.mkdir()
  assert checkpoint.damage(empty) == "the step directory holds no files"


def _data_file(step_dir):
  return max(
    (p for p in (step_dir / "state" / "ocdbt.process_0" / "d").iterdir()),
    key=lambda p: p.stat().st_size,
  )


# Files of several kinds (an array data file, orbax's tree metadata, the OCDBT manifest,
# the JSON meta) and offsets from the first byte to the last: every one is found.
_FILES = {
  "array data": _data_file,
  "tree metadata": lambda d: d / "state" / "_METADATA",
  "ocdbt manifest": lambda d: d / "state" / "ocdbt.process_0" / "manifest.ocdbt",
  "json meta": lambda d: d / "meta" / "metadata",
}


@pytest.mark.parametrize("kind", sorted(_FILES))
def test_a_changed_byte_anywhere_sets_the_step_aside_and_the_previous_restores(
  three_steps, tmp_path, kind
):
  for where in ("first", "middle", "last"):
    directory = _copy(three_steps, tmp_path / where)
    target = _FILES[kind](directory / "3")
    size = target.stat().st_size
    _flip(target, {"first": 0, "middle": size // 2, "last": size - 1}[where])
    got, logged = _restore(directory)
    assert (got.step, got.meta) == (2, {"step": 2}), (kind, where)
    _assert_trees_equal(got.tree, _tree(2.0))
    name = target.relative_to(directory / "3")
    (line,) = logged
    assert f"/3 is unreadable ({name} holds other bytes than when written" in line, line
    assert "resuming from step 2" in line
    assert (tmp_path / where / "ck.bad" / "3" / "state").is_dir()


def test_damage_only_the_storage_layer_can_see_falls_back_too(tmp_path, monkeypatch):
  """Without a manifest (an older grpo_jax) a changed first byte of a compressed chunk
  is found by TensorStore (a ValueError); any other error orbax raises while reading,
  whatever its type (a decompression error is a plain Exception), falls back as well."""

  def tree(step):  # An array large enough to be stored zstd-compressed.
    return {**_tree(float(step)), "big": jnp.arange(20_000, dtype=jnp.float32) + step}

  with contextlib.closing(checkpoint.Checkpointer(tmp_path / "ck", keep=5)) as ckpt:
    for step in (1, 2, 3):
      ckpt.save(step, tree(step), {"step": step})
  directory = tmp_path / "ck"
  (directory / "3" / checkpoint.MANIFEST).unlink()
  _flip(_data_file(directory / "3"), 0)
  logged = []
  with contextlib.closing(checkpoint.Checkpointer(directory)) as ckpt:
    got = ckpt.restore_latest(like=tree(0), log=logged.append)
  assert got.step == 2 and len(logged) == 1 and "ZSTD_decompressStream() failed" in logged[0]
  np.testing.assert_array_equal(got.tree["big"], np.arange(20_000) + 2)
  real = checkpoint.Checkpointer.restore

  def decompression_error(self, step, **kw):
    if step == 2:
      raise Exception("Decompression failed: corrupt block")  # noqa: TRY002
    return real(self, step, **kw)

  monkeypatch.setattr(checkpoint.Checkpointer, "restore", decompression_error)
  logged = []
  with contextlib.closing(checkpoint.Checkpointer(directory)) as ckpt:
    got = ckpt.restore_latest(like=tree(0), log=logged.append)
  assert got.step == 1 and len(logged) == 1
  assert "/2 is unreadable (Exception: Decompression failed: corrupt block)" in logged[0]


def test_a_step_without_a_manifest_restores_with_one_line_saying_so(three_steps, tmp_path):
  directory = _copy(three_steps, tmp_path)
  (directory / "3" / checkpoint.MANIFEST).unlink()
  got, logged = _restore(directory)
  assert got.step == 3
  assert logged == [f"checkpoint {directory}/3: it has no file manifest (written by an older "
                    "grpo_jax); its bytes are not verified."]  # fmt: skip


def test_a_non_finite_state_is_never_restored(tmp_path):
  ckpt = checkpoint.Checkpointer(tmp_path / "ck", keep=5)
  ckpt.save(1, _tree(1.0), {"step": 1})
  bad = _tree(2.0)
  bad["train"] = bad["train"].replace(
    params={**bad["train"].params, "b": jnp.array([1.0, jnp.nan, 2.0])}
  )
  ckpt.save(2, bad, {"step": 2})
  ckpt.close()
  got, logged = _restore(tmp_path / "ck")
  assert got.step == 1
  assert "/2 is unreadable (non-finite values in train/params/b)" in logged[0], logged


def test_a_failure_of_this_machine_is_raised_and_nothing_is_set_aside(
  three_steps, tmp_path, monkeypatch
):
  directory = _copy(three_steps, tmp_path)

  def out_of_memory(self, step, **kw):
    raise ValueError("RESOURCE_EXHAUSTED: Out of memory allocating 1.2GiB")

  monkeypatch.setattr(checkpoint.Checkpointer, "restore", out_of_memory)
  with pytest.raises(ValueError, match="RESOURCE_EXHAUSTED"):
    _restore(directory)

  def no_memory(self, step, **kw):
    raise MemoryError

  monkeypatch.setattr(checkpoint.Checkpointer, "restore", no_memory)
  with pytest.raises(MemoryError):
    _restore(directory)
  assert _steps_on_disk(directory) == [1, 2, 3] and not (tmp_path / "ck.bad").exists()


def test_restore_latest_falls_back_and_sets_the_damaged_aside(three_steps, tmp_path):
  directory = _copy(three_steps, tmp_path)
  (directory / "3" / "state" / "_METADATA").unlink()
  got, logged = _restore(directory)
  assert (got.step, got.meta, got.buffer) == (2, {"step": 2}, None)
  np.testing.assert_array_equal(got.tree["train"].params["w"], _params(2.0)["w"])
  assert len(logged) == 1 and "/ck/3 is unreadable (state/_METADATA is missing)" in logged[0]
  assert (tmp_path / "ck.bad" / "3" / "state").is_dir()
  with contextlib.closing(checkpoint.Checkpointer(directory)) as ckpt:
    assert ckpt.all_steps() == [1, 2]
    ckpt.save(3, _tree(3.0), {"step": 3})  # The step can be written again.


def test_restore_latest_raises_the_mismatch_when_every_checkpoint_disagrees(three_steps, tmp_path):
  ckpt = checkpoint.Checkpointer(_copy(three_steps, tmp_path))
  wrong = {**_tree(), "counts": np.zeros(4, np.int32)}
  with pytest.raises(checkpoint.CheckpointMismatchError, match=r"counts: in checkpoint \(3,\)"):
    ckpt.restore_latest(like=wrong, log=lambda _: None)
  assert ckpt.all_steps() == [1, 2, 3]  # A changed config damages nothing: nothing moved.
  ckpt.close()


def test_restore_latest_with_no_checkpoints_and_with_none_readable(three_steps, tmp_path):
  assert checkpoint.Checkpointer(tmp_path / "empty").restore_latest(like=_tree()) is None
  directory = _copy(three_steps, tmp_path)
  for step in (1, 2, 3):
    (directory / str(step) / "state" / "_METADATA").unlink()
  with pytest.raises(checkpoint.NoValidCheckpointError, match=r"step 3: .*step 1: "):
    checkpoint.Checkpointer(directory).restore_latest(like=_tree(), log=lambda _: None)
  assert _steps_on_disk(directory) == [1, 2, 3]  # None restored: nothing is moved.


def test_a_buffer_is_restored_as_written_and_a_check_can_refuse_its_step(tmp_path):
  """The third item: host arrays of any structure, in the step's manifest. A caller's
  check (the trainer's: the off-policy buffer) refuses a step like damage does."""
  ckpt = checkpoint.Checkpointer(tmp_path / "ck", keep=5)
  buffers = {
    s: {"step": np.asarray(s, np.int64), "rows": {"7": np.arange(6, dtype=np.int32) * s}}
    for s in (1, 2)
  }
  for s, buffer in buffers.items():
    ckpt.save(s, _tree(float(s)), {"step": s}, buffer=buffer)
  ckpt.save(3, _tree(3.0), {"step": 3})  # No buffer.
  ckpt.close()
  assert any(n.startswith("buffer/") for n in json.loads(
    (tmp_path / "ck" / "2" / checkpoint.MANIFEST).read_text())["files"])  # fmt: skip

  def needs_buffer(got):
    return None if got.buffer is not None else "its buffer is missing"

  got, logged = _restore(tmp_path / "ck", check=needs_buffer)
  assert got.step == 2 and "/3 is unreadable (its buffer is missing)" in logged[0]
  assert jax.tree.structure(got.buffer) == jax.tree.structure(buffers[2])
  np.testing.assert_array_equal(got.buffer["rows"]["7"], [0, 2, 4, 6, 8, 10])
  assert got.buffer["rows"]["7"].dtype == np.int32 and int(got.buffer["step"]) == 2
  _flip(tmp_path / "ck" / "2" / "buffer" / "_METADATA", 5)
  got, logged = _restore(tmp_path / "ck", check=needs_buffer)
  assert got.step == 1 and "/2 is unreadable (buffer/_METADATA holds other bytes" in logged[0]


def test_a_failed_save_is_one_error_and_keeps_the_only_valid_checkpoint(tmp_path, monkeypatch):
  """keep=1: the failed save of step 2 must not cost step 1 (retention runs only after a
  save is finalised)."""
  ckpt = checkpoint.Checkpointer(tmp_path / "ck", keep=1, keep_best=False)
  ckpt.save(1, _tree(1.0), {"step": 1})
  ckpt.wait()
  import orbax.checkpoint as ocp  # noqa: PLC0415

  def broken(self, *args, **kwargs):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", broken)
  with pytest.raises(checkpoint.CheckpointSaveError, match="No space left on device"):
    ckpt.save(2, _tree(2.0), {"step": 2})
    ckpt.check(block=True)
  monkeypatch.undo()
  with contextlib.suppress(checkpoint.CheckpointSaveError):
    ckpt.close()
  fresh = checkpoint.Checkpointer(tmp_path / "ck")
  assert fresh.all_steps() == [1]
  assert fresh.restore_latest(like=_tree(), log=lambda _: None).step == 1
  fresh.close()


# ----------------------------------------------------------------------------
# A checkpoint older than a hyperparameter: filled from the config's defaults.
# ----------------------------------------------------------------------------


@flax.struct.dataclass
class _OldHyper:
  eps: jax.Array
  inner: dict


@flax.struct.dataclass
class _NewHyper:  # A field added by a newer version, at the top and inside.
  eps: jax.Array
  inner: dict
  added: jax.Array


def test_leaves_missing_from_an_older_checkpoint_take_the_defaults(tmp_path):
  old = {
    "train": _tree(1.0)["train"],
    "hyper": _OldHyper(eps=jnp.float32(0.5), inner={"a": jnp.float32(2.0)}),
  }
  with contextlib.closing(checkpoint.Checkpointer(tmp_path / "c")) as ckpt:
    ckpt.save(3, old, {"iteration": 3})
    ckpt.wait()
    new_default = _NewHyper(
      eps=jnp.float32(9.0),
      inner={"a": jnp.float32(9.0), "b": jnp.float32(7.0)},
      added=jnp.float32(4.0),
    )
    like = {"train": _tree(0.0)["train"], "hyper": new_default}
    # Without defaults: the usual mismatch, naming both missing leaves.
    with pytest.raises(checkpoint.CheckpointMismatchError, match="hyper/added: missing"):
      ckpt.restore(3, like=like)
    got, meta = ckpt.restore(3, like=like, defaults={"hyper": new_default})
    assert sorted(meta["filled"]) == ["hyper/added", "hyper/inner/b"]
    assert meta["iteration"] == 3
    # Saved leaves come from the checkpoint, the missing ones from the defaults.
    assert isinstance(got["hyper"], _NewHyper)
    assert float(got["hyper"].eps) == 0.5 and float(got["hyper"].inner["a"]) == 2.0
    assert float(got["hyper"].added) == 4.0 and float(got["hyper"].inner["b"]) == 7.0
    _assert_trees_equal(got["train"], old["train"])
    # A leaf missing outside the fillable keys is still a mismatch.
    like_params = {**like, "train": like["train"].replace(params={**_params(), "c": jnp.zeros(2)})}
    with pytest.raises(checkpoint.CheckpointMismatchError, match="train/params/c"):
      ckpt.restore(3, like=like_params, defaults={"hyper": new_default})
    # So is a changed shape under a fillable key.
    wrong = {**like, "hyper": new_default.replace(eps=jnp.zeros(2))}
    with pytest.raises(checkpoint.CheckpointMismatchError, match="hyper/eps"):
      ckpt.restore(3, like=wrong, defaults={"hyper": wrong["hyper"]})


def test_leaves_only_an_older_checkpoint_holds_are_left_out_cast_and_placed(tmp_path):
  """A field a newer version dropped (old "gone", "inner/c") is read and left out, named
  in meta["dropped"]; an int32 the older version stored comes back in the default's
  float32; a default filled in lands on like's sharding (a multi-host save refuses a
  host-local array)."""
  old = {
    "train": _tree(1.0)["train"],
    "hyper": {"k": jnp.int32(3), "gone": jnp.float32(1.5), "inner": {"c": jnp.float32(2.0)}},
  }
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  with contextlib.closing(checkpoint.Checkpointer(tmp_path / "c")) as ckpt:
    ckpt.save(2, old, {"iteration": 2})
    ckpt.wait()
    default = {"k": jnp.float32(1.0), "new": jnp.float32(0.25), "inner": {}}
    like = {
      "train": _tree(0.0)["train"],
      "hyper": jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((), x.dtype, sharding=replicated), default
      ),
    }
    ckpt.check_compatible(2, like=like, fillable=("hyper",))  # Dropped leaves: no difference.
    got, meta = ckpt.restore(2, like=like, defaults={"hyper": default})
    assert sorted(meta["dropped"]) == ["hyper/gone", "hyper/inner/c"]
    assert meta["filled"] == ["hyper/new"]
    assert got["hyper"]["k"].dtype == jnp.float32 and float(got["hyper"]["k"]) == 3.0
    assert float(got["hyper"]["new"]) == 0.25 and set(got["hyper"]) == {"k", "new", "inner"}
    assert got["hyper"]["new"].sharding == replicated
    with pytest.raises(checkpoint.CheckpointMismatchError, match="hyper/gone"):
      ckpt.restore(2, like=like)  # Without defaults for the key: the usual mismatch.
