"""Meshes, rules and sharded training: errors before compiling, and one RL iteration on
8 forced CPU devices giving the single-device result on meshes (8,1,1), (2,2,2), (1,4,2)
and (data, fsdp, sequence, tensor) = (1,2,2,2): context parallelism, each row's tokens
split over 2 devices in the update and the π_old and reference forwards."""

import dataclasses
import functools
import gc
import json
import pathlib
import weakref

import jax
import numpy as np
import pytest

from grpo_jax.infra import registry
from grpo_jax.models import model, sharding
from grpo_jax.trainer import build, steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
import mesh_run  # noqa: E402
import subproc  # noqa: E402

MESHES = ("8x1x1", "2x2x2", "1x4x2", "1x2x2x2")


def test_mesh_shape_resolves_minus_one_and_refuses_bad_sizes():
  assert sharding.AXES == ("data", "fsdp", "expert", "sequence", "tensor")
  assert sharding.MeshConfig(data=2, fsdp=-1, tensor=2).shape(8) == (2, 2, 1, 1, 2)
  assert sharding.MeshConfig().shape(8) == (1, 8, 1, 1, 1)
  assert sharding.MeshConfig(sequence=4).shape(8) == (1, 2, 1, 4, 1)
  experts = sharding.MeshConfig(fsdp=-1, expert=4)
  assert experts.sizes(8) == dict(data=1, fsdp=2, expert=4, sequence=1, tensor=1)
  assert experts.batch_split(8) == 8  # The rows split over data × fsdp × expert.
  assert sharding.MeshConfig(data=2, fsdp=1, tensor=4).batch_split(8) == 2
  with pytest.raises(ValueError, match="multiply to the device count"):
    sharding.MeshConfig(data=2, fsdp=2, tensor=1).shape(8)
  with pytest.raises(ValueError, match="does not divide the 8 devices"):
    sharding.MeshConfig(data=3, fsdp=-1).shape(8)
  with pytest.raises(ValueError, match="at most one may be -1"):
    sharding.MeshConfig(data=-1, fsdp=-1)
  with pytest.raises(ValueError, match="unknown mesh axis 'model'"):
    sharding.MeshConfig(rules=(("embed", "model"),))
  with pytest.raises(ValueError, match="allowed: a positive int"):
    sharding.MeshConfig(tensor=0)
  with pytest.raises(ValueError, match=r"mesh.sequence=0; allowed: a positive int"):
    sharding.MeshConfig(sequence=0)
  with pytest.raises(ValueError, match=r"mesh.expert=0; allowed: a positive int"):
    sharding.MeshConfig(expert=0)


def test_spec_needs_a_rule_for_every_name_and_divisible_dimensions():
  rules = sharding.DEFAULT_RULES
  assert sharding.spec(("embed", "mlp"), rules) == sharding.P("fsdp", "tensor")
  with pytest.raises(ValueError, match="'experts' has no rule"):
    sharding.spec(("embed", "experts"), rules, where="params/moe")

  class FakeMesh:
    shape = {"data": 1, "fsdp": 4, "tensor": 2}

  with pytest.raises(ValueError, match=r"dimension 1 \('mlp'\) has size 5, not divisible.*size 2"):
    sharding.spec(("embed", "mlp"), rules, shape=(8, 5), mesh=FakeMesh(), where="params/w")


def test_trainer_refuses_a_mesh_for_other_devices_and_indivisible_batches(monkeypatch):
  c = mesh_run.make_config((1, 1, 1))
  c.rl.micro_batch_tokens = 0  # Micro-batches by rows until the budget's own check below.
  c.mesh.update(data=2, fsdp=1, tensor=1)
  with pytest.raises(ValueError, match="mesh .* has 2 devices but there are 1"):
    build.build(c)
  monkeypatch.setattr(jax, "device_count", lambda: 8)  # Checked before any mesh exists.
  c.mesh.update(data=8)
  build.build(c)  # 32 rollout rows, mini-batches of 16.
  c.rl.num_minibatches = 8
  with pytest.raises(ValueError, match=r"a mini-batch .* has 4 rows, not divisible .* = 8"):
    build.build(c)
  c.rl.num_minibatches, c.rl.micro_batches = 1, 8  # Micro-batches of 4 rows on 8 devices.
  with pytest.raises(ValueError, match=r"a micro-batch .* has 4 rows, not divisible .* = 8"):
    build.build(c)
  c.rl.micro_batches, c.rl.micro_batch_tokens = 1, 8  # Not a full-length row a device.
  with pytest.raises(ValueError, match=r"micro_batch_tokens=8 holds no full-length row.* 8 data"):
    build.build(c)
  c.rl.micro_batch_tokens, c.mesh.data = 0, 1
  c.mesh.fsdp = 32
  with pytest.raises(ValueError, match="mesh .* has 32 devices but there are 8"):
    build.build(c)
  c.mesh.update(data=-1, fsdp=1)
  c.prompts_per_step = 1  # 4 rollout rows on 8 data-parallel devices.
  with pytest.raises(ValueError, match=r"the rollout batch .* has 4 rows, not divisible"):
    build.build(c)


def test_context_parallelism_needs_a_sequence_size_dividing_every_row_length(monkeypatch):
  """mesh.sequence splits each row's prompt bucket + completion tokens: 16 + 8 and the
  length bucket's 16 + 4 divide by 2 and 4; 16 + 4 not by 3, and with 5 new tokens
  (length buckets 3 and 5) neither 19 nor 21 by 2."""
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  c = mesh_run.make_config((1, 2, 2, 2))  # Prompt bucket 16, T 8, length buckets (4, 8).
  assert build.build(c).mesh_cfg.shape(8) == (1, 2, 1, 2, 2)
  c.mesh.update(fsdp=2, sequence=4, tensor=1)
  build.build(c)
  c.mesh.update(fsdp=1, sequence=3, tensor=1)
  with pytest.raises(ValueError, match="has 3 devices but there are 8"):
    build.build(c)
  monkeypatch.setattr(jax, "device_count", lambda: 6)
  c.rl.update(micro_batch_tokens=0, num_minibatches=2)
  c.mesh.update(data=2, fsdp=1)
  with pytest.raises(ValueError, match=r"mesh.sequence=3 .* rows of \[20\] tokens"):
    build.build(c)
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  c.mesh.update(data=1, fsdp=4, sequence=2)
  c.sampler.max_new_tokens = 5
  with pytest.raises(ValueError, match=r"rows of \[19, 21\] tokens"):
    build.build(c)


def test_single_device_params_carry_the_rules_specs():
  c = mesh_run.make_config((1, 1, 1))
  setup = build.build(c)
  layout = sharding.Layout.create(setup.mesh_cfg)
  shardings = sharding.param_shardings(layout, setup.model_cfg)
  q = shardings["layer_0"]["attn"]["q"]["kernel"]
  assert q.spec == sharding.P("fsdp", "tensor", None)
  params = sharding.init_params(layout, setup.model_cfg, jax.random.key(0))
  ref = model.init(setup.model_cfg, jax.random.key(0))
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)  # Same draws as model.init.


def test_a_second_init_of_an_equal_layout_and_config_is_not_traced_again():
  """Layouts and configs that are equal (made afresh: a notebook's rerun, the next test)
  share one jitted init: one trace for both calls, each key its own draws."""
  setup = build.build(mesh_run.make_config((1, 1, 1)))
  layout = sharding.Layout.create(setup.mesh_cfg)
  a = sharding.init_params(layout, setup.model_cfg, jax.random.key(3))
  again = sharding.Layout.create(setup.mesh_cfg), build.build(mesh_run.make_config((1, 1, 1)))
  b = sharding.init_params(again[0], again[1].model_cfg, jax.random.key(4))
  assert sharding._init_fn(layout, setup.model_cfg, adapters_only=False)._cache_size() == 1
  ref = model.init(setup.model_cfg, jax.random.key(4))
  for x, y, r in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(ref), strict=True):
    np.testing.assert_array_equal(y, r)
    assert x.shape == y.shape
  assert any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@dataclasses.dataclass(frozen=True)
class _Cfg:
  scale: float
  shift: tuple = (0,)


def _affine(x, *, cfg: _Cfg, bias=0.0):
  return x * cfg.scale + cfg.shift[0] + bias


def test_jit_is_one_object_for_equal_functions_options_and_context(monkeypatch):
  """`sharding.jit`: partials of equal configs made afresh share one jax.jit (traced once);
  a field, a scalar's type (2 vs 2.0), an array argument (by identity), the shardings or
  the context make another; a jit that nothing holds any more is not kept."""
  monkeypatch.setattr(sharding, "_JITS", weakref.WeakValueDictionary())
  layout = sharding.Layout.create(sharding.MeshConfig())
  rep = layout.replicated
  make = lambda fn, **kw: sharding.jit(fn, context=layout, in_shardings=(rep,), **kw)
  fn = lambda **kw: functools.partial(_affine, cfg=_Cfg(scale=2.0), **kw)
  a = make(fn())
  assert make(fn()) is a
  np.testing.assert_array_equal(a(np.arange(3.0)), [0.0, 2.0, 4.0])
  np.testing.assert_array_equal(make(fn())(np.ones(3)), [2.0, 2.0, 2.0])
  assert a._cache_size() == 1  # One trace for both calls.
  bias = np.ones(3)
  others = [
    make(functools.partial(_affine, cfg=_Cfg(scale=3.0))),  # A field.
    make(functools.partial(_affine, cfg=_Cfg(scale=2.0, shift=(1,)))),  # A nested field.
    make(fn(bias=1)),  # An int where a float was: another trace (weak types).
    make(fn(bias=bias)),  # An array: only itself.
    make(fn(), out_shardings=rep),  # Other options.
    sharding.jit(fn(), context=None, in_shardings=(rep,)),  # Another context.
  ]
  assert len({id(x) for x in [a, *others]}) == 7
  assert make(fn(bias=1.0)) is not others[2]
  assert make(fn(bias=bias)) is others[3]
  assert make(fn(bias=np.ones(3))) is not others[3]  # Equal values, another array.
  assert make(fn(bias=True)) is not make(fn(bias=1))  # True == 1, another trace.
  assert make(fn(bias=np.float32(0.0))) is not make(fn(bias=np.float32(-0.0)))
  gc.collect()
  assert len(sharding._JITS) == 7  # `a` and the six others; the ones made and let go are gone.
  del a, others
  gc.collect()
  assert len(sharding._JITS) == 0


def _registered(x, *, table):
  return table.get("v")(x)


def test_a_variant_redefined_by_a_rerun_cell_is_traced_afresh(monkeypatch):
  """A trace looks variants up by name: a definition run again (a notebook cell) replaces
  the variant (`registry.changes`), and `sharding.jit` makes a new jit for it."""
  monkeypatch.setattr(sharding, "_JITS", weakref.WeakValueDictionary())
  monkeypatch.setattr(registry, "_ALL", [])
  monkeypatch.setattr(registry, "_CHANGES", [0])
  table = registry.Registry("test variant")

  def define(value):
    def variant(x):
      return x + value

    return variant

  # A partial made afresh each time, as a run's are (jax.jit keeps one trace per function
  # object: the same object would be its trace, whatever the registry holds now).
  fn = lambda: functools.partial(_registered, table=table)
  table.register("v")(define(1.0))
  first = sharding.jit(fn())
  assert float(first(0.0)) == 1.0
  assert sharding.jit(fn()) is first
  table.register("v")(define(1.0))  # The cell run again: another object, the same name.
  assert registry.changes() == 2
  again = sharding.jit(fn())
  assert again is not first
  table.register("v")(define(2.0))
  assert float(sharding.jit(fn())(0.0)) == 2.0
  assert sharding.jit(fn()) is not again


def test_a_run_rebuilt_with_another_learning_rate_shares_its_samplers():
  """Two runs that differ in the learning rate only: the samplers, the log-prob forward
  and the preparation are the same jits (nothing traced again); the updates and the
  warm-start step (their optimizers' rates) are not."""
  config = mesh_run.make_config((1, 1, 1))
  first = steps.functions(build.build(config))
  config.learning_rate *= 2
  second = steps.functions(build.build(config))
  assert first is not second
  for get in (
    lambda f: f.samplers.train,
    lambda f: f.samplers.greedy,
    lambda f: f.rl.logprobs,
    lambda f: f.rl.finish,
    lambda f: f.warmstart.step,  # Its own learning rate (warmstart_lr) is the same.
  ):
    assert get(first).jitted is get(second).jitted
  assert first.rl.update.jitted is not second.rl.update.jitted


def _run(out, meshes, devices, *flags):
  return subproc.run([ROOT / "tests" / "mesh_run.py", out, *meshes, *flags], devices=devices).stderr


@pytest.fixture(scope="module")
def mesh_results(tmp_path_factory, mesh_warm_start):
  warm, base = mesh_warm_start  # The warm start and its 1x1x1 run (conftest), shared.
  out = tmp_path_factory.mktemp("meshes")
  log = _run(out, [m.replace("x", ",") for m in MESHES], 8, "--base", str(base))
  return {
    "log": log,
    "1x1x1": np.load(warm / "1x1x1.npz"),
    **{p.stem: np.load(p) for p in out.glob("*.npz")},
  }


def test_no_involuntary_full_rematerialization(mesh_results):
  """XLA's SPMD partitioner found a resharding for every activation on every mesh (it
  logs this warning when it must replicate a tensor to re-split it)."""
  assert "Involuntary full rematerialization" not in mesh_results["log"]


# The update's metrics (`learner`): means over its steps, the later ones after params moved.
_AFTER_A_STEP = {
  "loss", "pg_loss", "pg_clipfrac", "pg_clipfrac_high", "pg_clipfrac_low", "dual_clipfrac",
  "ppo_kl", "entropy", "ratio_mean", "grad_norm",
}  # fmt: skip


def test_one_rl_iteration_matches_the_single_device_run_on_every_mesh(mesh_results):
  """Every mesh resumes from the same warm-start checkpoint (restored onto its shardings)
  and runs one RL iteration with real rewards (varying within groups).

  Tolerance (float32): params to |Δ| <= 3e-4 (three RL learning rates) and per-leaf
  ‖Δ‖/‖θ‖ <= 1e-2. Gradients agree to ~1e-6 relative; Adam's normalised first steps turn
  that into moves of up to the learning rate on coordinates whose gradient is ~0
  (measured: 1.5e-4 on every mesh, 8x1x1 too). Metrics of the rollout, rewards and
  advantages (before any step) to rtol 1e-4 (atol 1e-5, for ~0 ones); the update's
  (`_AFTER_A_STEP`: means over its 2 mini-batch steps, the second of which reads the
  params the first moved) to rtol 1e-3 (atol 1e-4). Measured with the tests' XLA flags
  (`subproc.FAST_COMPILE`), on the tensor-parallel meshes: entropy 2.4e-4 and grad_norm
  1.4e-4 relative, ppo_kl 4.2e-5 absolute from the one-device run."""
  base = mesh_results["1x1x1"]
  assert int(base["devices"]) == 1
  base_metrics = json.loads(str(base["metrics"]))
  assert base_metrics["loss"] != 0 and base_metrics["grad_norm"] > 0.1
  assert 0 < base_metrics["accuracy"] < 1  # Rewards vary: a real policy gradient.
  assert base_metrics["micro_batches"] == 2  # Token budgets (mesh_run.make_config).
  for m in MESHES:
    got = mesh_results[m]
    assert int(got["devices"]) == 8
    metrics = json.loads(str(got["metrics"]))
    assert metrics.keys() == base_metrics.keys()
    for k, v in base_metrics.items():
      if isinstance(v, float):
        loose = k in _AFTER_A_STEP or k.startswith("kl_ref/")
        tol = dict(rel=1e-3, abs=1e-4) if loose else dict(rel=1e-4, abs=1e-5)
        assert metrics[k] == pytest.approx(v, **tol), (m, k)
      else:
        assert metrics[k] == v, (m, k)
    names = [k for k in base.files if k.startswith("param")]
    assert len(names) > 20
    for k in names:
      np.testing.assert_allclose(got[k], base[k], rtol=0, atol=3e-4, err_msg=f"{m} {k}")
      assert np.linalg.norm(got[k] - base[k]) <= 1e-2 * np.linalg.norm(base[k]), (m, k)


def test_greedy_sampling_is_identical_on_every_mesh(mesh_results):
  base = mesh_results["1x1x1"]["greedy"]
  assert base.shape == (8, 8) and (base != 0).any()
  for m in MESHES:
    np.testing.assert_array_equal(mesh_results[m]["greedy"], base, err_msg=m)


def test_samplers_split_rows_over_sequence_and_trainers_tokens(mesh_results):
  """Context parallelism splits tokens in the teacher-forced forwards only: the samplers'
  8 prompts (32 rows) go over data × fsdp × expert × sequence on (1,2,2,2), 2 prompts a
  device (`Layout.sampling`), and over data × fsdp × expert elsewhere (expert size 1); the greedy rollouts come back split
  the same way (and equal the one-device ones: the test above)."""
  for m in MESHES:
    rows = json.loads(str(mesh_results[m]["sampler_rows"]))
    want = ["data", "fsdp", "expert"] + (["sequence"] if m == "1x2x2x2" else [])
    assert rows == {"train": [want], "greedy": [want], "greedy_out": [want]}, m


def test_episodes_split_rows_over_sequence_and_play_as_on_a_data_parallel_mesh(mesh_results):
  """A group of calculator episodes (8 prompts × 4 after a short warm start, same key;
  `mesh_run.episodes`) under context parallelism (1,2,2,2): the runner's rows go over data
  × fsdp × expert × sequence, and the episodes (actions, tool observations, turns) are those of
  8-way data parallelism."""
  dp, cp = mesh_results["8x1x1"], mesh_results["1x2x2x2"]
  assert json.loads(str(dp["episode_rows"])) == ["data", "fsdp", "expert"]
  assert json.loads(str(cp["episode_rows"])) == ["data", "fsdp", "expert", "sequence"]
  for k in ("episode_tokens", "episode_mask", "episode_turns"):
    np.testing.assert_array_equal(cp[k], dp[k], err_msg=k)
  assert dp["episode_mask"].sum() > 400 and dp["episode_turns"].max() >= 3  # Tool calls.


class _FakeMesh:
  def __init__(self, **sizes):
    self.shape = {a: sizes.get(a, 1) for a in sharding.AXES}


def test_sampling_layout_moves_the_sequence_axis_from_tokens_to_rows():
  """`Layout.sampling`: with mesh.sequence = 2 and data × fsdp = 4, a sampler of 8 prompts
  splits rows over the 8 devices and no activation over `sequence` (a rule a user pointed
  at it too loses it); 4 or 6 prompts (not a multiple of 8), or sequence = 1, keep the
  trainer's layout. Idempotent."""
  rules = (*sharding.DEFAULT_RULES[:-1], ("activation_cache", ("sequence", "tensor")))
  cp = sharding.Layout(mesh=_FakeMesh(data=2, fsdp=2, sequence=2), rules=rules)
  assert cp.batch_size_divisor == 4
  s = cp.sampling(8)
  assert s.batch_axes == ("data", "fsdp", "expert", "sequence") and s.batch_size_divisor == 8
  table = dict(s.rules)
  assert table["activation_batch"] == ("data", "fsdp", "expert", "sequence")
  assert table["activation_length"] is None
  assert table["activation_cache"] == "tensor"
  assert {k: v for k, v in s.rules if k not in ("activation_batch", "activation_length",
    "activation_cache")} == {k: v for k, v in rules if k not in ("activation_batch",
    "activation_length", "activation_cache")}  # fmt: skip
  assert s.sampling(8) is s
  assert cp.sampling(4) is cp and cp.sampling(6) is cp
  flat = sharding.Layout(mesh=_FakeMesh(data=2, fsdp=4), rules=sharding.DEFAULT_RULES)
  assert flat.sampling(8) is flat


@pytest.mark.parametrize(
  "mesh,embed,q,gate",
  [
    ("8x1x1", [32, 64], [64, 4, 16], [64, 128]),  # Pure data parallel: replicated params.
    ("2x2x2", [16, 32], [32, 2, 16], [32, 64]),  # vocab/heads/mlp over tensor 2, embed over fsdp 2.
    ("1x4x2", [16, 16], [16, 2, 16], [16, 64]),  # embed over fsdp 4.
    ("1x2x2x2", [16, 32], [32, 2, 16], [32, 64]),  # As 2x2x2: nothing is split over sequence.
  ],
)
def test_params_are_really_sharded(mesh_results, mesh, embed, q, gate):
  specs = json.loads(str(mesh_results[mesh]["specs"]))
  assert specs["['embed']['embedding']"] == ["P('tensor', 'fsdp')", embed]
  assert specs["['layer_0']['attn']['q']['kernel']"] == ["P('fsdp', 'tensor', None)", q]
  assert specs["['layer_1']['mlp']['gate']['kernel']"] == ["P('fsdp', 'tensor')", gate]
