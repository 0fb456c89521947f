"""A run compiled ahead of time for TPU topologies on this CPU host (`aot`): the tiny
config's functions compile for v5e:2x2 and for two slices, fit, keep the train state
sharded like the parameters, alias the donated state, call no host, and communicate over
the mesh axes they should; each check fails when its property is broken."""

import copy
import dataclasses
import json
import pathlib
import subprocess
import sys

import cheap_plans
import jax
import numpy as np
import pytest
import subproc

from grpo_jax.infra import config_lib, tpu
from grpo_jax.models import model, sharding
from grpo_jax.rewards import reward_model
from grpo_jax.trainer import abstract, aot, memory, steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "arithmetic.py") + ":tiny"
QUICK = str(ROOT / "configs" / "arithmetic.py") + ":quick"


# The module's TPU compiles, each distinct program once (conftest's `tpu_compiled_once`):
# the command compiles one_slice's programs again, as other tests do where their programs
# are the same.
pytestmark = pytest.mark.usefixtures("tpu_compiled_once")


@pytest.fixture(scope="module")
def one_slice():
  return aot.plan(config_lib.load(QUICK), topology="v5e:2x2")


@pytest.fixture(scope="module")
def two_slices():
  return aot.plan(config_lib.load(QUICK), topology="v5e:2x2", num_slices=2)


def _row(got, name):
  return next(r for r in got["rows"] if r["name"] == name)


def test_the_quick_iteration_compiles_for_v5e_2x2_and_fits(one_slice):
  run = one_slice["run"]
  assert [r["name"] for r in one_slice["rows"]] == list(aot.FUNCTIONS)
  assert (run["chip"], run["devices"], run["hosts"]) == ("v5e", 4, 1)
  assert run["mesh"] == {"data": 1, "fsdp": 4, "expert": 1, "sequence": 1, "tensor": 1}
  assert run["fits"] and one_slice["problems"] == []
  for row in one_slice["rows"]:
    assert 0 < row["peak_bytes"] < row["hbm_bytes"] == 16 * 2**30
    assert row["peak_bytes"] == row["total_bytes"] + row["resident_bytes"]
  # The plan's peak and XLA's are the same order of magnitude for this config.
  assert 0.1 < run["plan_peak_bytes"] / run["peak_bytes"] < 10
  assert run["roofline_iteration_s"] == pytest.approx(sum(run["roofline_s"].values()))
  assert "update" in one_slice["table"] and "\n" in one_slice["table"]


def test_fsdp_gradients_reduce_scatter_and_parameters_gather_over_fsdp(one_slice):
  kinds = {(c["kind"], tuple(c["axes"])) for c in _row(one_slice, "update")["collectives"]}
  assert ("all-gather", ("fsdp",)) in kinds  # Parameters gathered for the forward.
  assert ("reduce-scatter", ("fsdp",)) in kinds  # Gradients reduced to their shards.


def test_context_parallelism_compiles_for_tpu_and_its_sampler_splits_rows(one_slice):
  """The quick config on (fsdp, sequence) = (2, 2): every function compiles and fits; the
  sampler splits rows over fsdp × sequence, not tokens (`sharding.Layout.sampling`), so
  its matmul FLOPs a chip equal fsdp = 4's (one_slice: before, the 2 sequence chips of a
  row group repeated its rows, 1.93x the FLOPs on scale.py:tiny); the update's collectives
  run over sequence too (each row's tokens split)."""
  c = config_lib.load(QUICK)
  c.mesh.update(fsdp=2, sequence=2)
  got = aot.plan(c, topology="v5e:2x2")
  assert got["run"]["fits"] and got["problems"] == []
  assert got["run"]["mesh"] == {"data": 1, "fsdp": 2, "expert": 1, "sequence": 2, "tensor": 1}
  assert _row(got, "sample")["matmul_flops"] == _row(one_slice, "sample")["matmul_flops"]
  assert ("sequence",) in {tuple(c["axes"]) for c in _row(got, "update")["collectives"]}


def test_two_slices_put_data_across_slices_and_fsdp_within(two_slices):
  run = two_slices["run"]
  assert (run["devices"], run["num_slices"]) == (8, 2)
  assert run["mesh"] == {"data": 2, "fsdp": 4, "expert": 1, "sequence": 1, "tensor": 1}
  assert two_slices["notes"] == ["mesh.data 1 -> 2 (data parallelism across slices)"]
  assert run["fits"] and two_slices["problems"] == []
  collectives = _row(two_slices, "update")["collectives"]
  assert any("data" in c["axes"] and c["dcn"] for c in collectives)  # Across slices.
  assert all(not c["dcn"] for c in collectives if tuple(c["axes"]) == ("fsdp",))  # ICI.


# ---------------------------------------------------------------------------------------
# Each property check fails when its property is broken (the quick model: faster compiles).


@pytest.fixture(scope="module")
def quick():
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(config_lib.load(QUICK), target)
  fns = steps.functions_on(setup, target.devices)
  return fns, aot.abstract_arguments(setup, fns)["update"]


def _variant(fns, args, *, out_state=None, donate=True, wrap=None):
  jitted = fns.rl.update
  fn = jitted.jitted.__wrapped__
  if wrap is not None:
    fn = wrap(fn)
  state_out = out_state if out_state is not None else jitted.in_shardings[0]
  rep = fns.layout.replicated
  broken = sharding.Jitted(
    fns.layout,
    fn,
    in_shardings=jitted.in_shardings,
    out_shardings=(state_out, rep, rep),
    donate_argnums=(0,) if donate else (),
  )
  return aot.check_update(aot.compile_function(broken, args[1]), broken, args[1][0])


def test_the_update_checks_pass_on_the_real_update(quick):
  fns, args = quick
  assert _variant(fns, args) == []


def test_a_state_left_replicated_is_found(quick):
  fns, args = quick
  problems = _variant(fns, args, out_state=fns.layout.replicated)
  # A replicated output cannot take the sharded donated buffers either: both are found.
  assert "come out sharded otherwise than they go in" in problems[0], problems
  assert "out P()" in problems[0] and "not aliased" in problems[1], problems


def test_a_state_not_donated_is_found(quick):
  fns, args = quick
  problems = _variant(fns, args, donate=False)
  assert any("not aliased" in p for p in problems), problems


def test_a_host_callback_in_the_step_is_found(quick):
  fns, args = quick

  def wrap(fn):
    def with_print(state, batch, key, hyper):
      jax.debug.print("step {}", key)
      return fn(state, batch, key, hyper)

    return with_print

  problems = _variant(fns, args, wrap=wrap)
  assert any("host callbacks" in p for p in problems), problems


# ---------------------------------------------------------------------------------------
# The command.


def test_plan_topology_prints_a_table_and_one_json_line_and_writes_the_json_file(tmp_path):
  """In this process (`cheap_plans`; test_a_bad_topology_is_one_line runs the command's
  own process)."""
  path = tmp_path / "plan.json"
  stdout = cheap_plans.run([f"--config={QUICK}", "--topology=v5e:2x2", f"--json={path}"])
  lines = stdout.strip().splitlines()
  assert lines[0].startswith("v5e:2x2 x 1 slice(s): 4 v5e devices on 1 host(s)")
  assert lines[-1] == f"wrote {path}"
  out = json.loads(lines[-2])
  assert out["run"]["fits"] and [f["name"] for f in out["functions"]] == list(aot.FUNCTIONS)
  assert out["advice"] is None and list(out["run"]["process_rows"]["prompts"]) == ["0"]
  assert json.loads(path.read_text()) == out


def test_a_function_rejected_with_no_figure_makes_the_peak_a_lower_bound(monkeypatch):
  """The update rejected as "Invalid TPU program" (libtpu, Qwen2.5-7B's full update on
  v5e:2x4): the plan does not fit, its row says "?" and the verdict's peak is a lower
  bound (">=": the update's own need is unknown)."""
  real_compile, real_arguments = aot.compile_function, aot.abstract_arguments
  rejected = object()  # The update, as the TPU compiler sees it.

  def arguments(setup, fns):
    out = real_arguments(setup, fns)
    out["update"] = (rejected, out["update"][1])
    return out

  def compile_function(jitted, args, **kw):
    if jitted is rejected:
      raise jax.errors.JaxRuntimeError("INVALID_ARGUMENT: Invalid TPU program.")
    return real_compile(jitted, args, **kw)

  monkeypatch.setattr(aot, "abstract_arguments", arguments)
  monkeypatch.setattr(aot, "compile_function", compile_function)
  stdout = cheap_plans.run([f"--config={QUICK}", "--topology=v5e:2x2", "--noadvice"])
  (row,) = [x for x in stdout.splitlines() if x.startswith("update ")]
  assert row.split()[1:5] == ["NO", "?", "/", "16"]
  assert "does NOT fit: peak >= " in stdout
  out = json.loads([x for x in stdout.splitlines() if x.startswith("{")][-1])
  assert out["run"]["peak_unknown"] and not out["run"]["fits"]


def test_a_bad_topology_is_one_line(monkeypatch):
  cmd = [sys.executable, "-m", "grpo_jax.main", "plan", f"--config={QUICK}", "--topology=v9x:2"]
  got = subprocess.run(cmd, capture_output=True, text=True, env=subproc.child_env(), timeout=300)
  assert got.returncode == 2
  errors = [line for line in got.stderr.splitlines() if line.startswith("grpo-jax: error:")]
  assert len(errors) == 1 and "--topology=v9x:2" in errors[0], got.stderr[-2000:]


def test_without_libtpu_the_plan_says_what_to_install(monkeypatch):
  def missing(name, *, num_slices=1):
    raise tpu.TpuUnavailable("no libtpu here: pip install -e '.[tpu]'")

  monkeypatch.setattr(tpu, "load_topology", missing)
  with pytest.raises(tpu.TpuUnavailable, match=r"pip install -e '\.\[tpu\]'"):
    aot.plan(config_lib.load(QUICK), topology="v5e:2x2")


# ---------------------------------------------------------------------------------------
# Advice when a config does not fit: the ladder of changes, each checked by compiling.


def _setup(overrides=None, topology="v5e:2x2"):
  target = aot.Target.load(topology)
  config = aot.with_overrides(config_lib.load(TINY), overrides or {})
  return aot.setup_for(config, target)[0], target


def test_the_ladder_adds_one_change_a_rung_cheapest_first():
  setup, target = _setup({"model.remat": "none", "model.scan_layers": False})
  rungs = aot.ladder(setup, target)
  texts = [t for _, t in rungs]
  assert texts[0] == "full remat over scanned layers"
  assert rungs[0][0] == {"model.remat": "full", "model.scan_layers": True}
  # Cumulative: each rung keeps every change before it.
  for (a, _), (b, _) in zip(rungs, rungs[1:]):
    assert set(a) < set(b) or (set(a) == set(b) and a != b)
  rl = setup.rl_cfg
  rows = setup.update_rows // rl.num_minibatches  # 4 devices split the rows.
  mbs = [o["rl.micro_batches"] for o, t in rungs if t.endswith("micro-batches")]
  assert mbs and mbs[-1] == rows // 4 and all(b == 2 * a for a, b in zip(mbs, mbs[1:]))
  # The tiny model has 2 KV heads: tensor parallelism 2 only.
  assert [o["mesh.tensor"] for o, t in rungs if t.startswith("tensor")] == [2]


def test_advice_compiles_rungs_until_one_fits(monkeypatch):
  setup, target = _setup({"model.remat": "none", "model.scan_layers": False})
  compiled = []

  def fake_compile_all(s, t):  # Fits from the third micro-batch rung on.
    if s.rl_cfg.micro_batches == 2:  # A mesh jax cannot lay on the torus: skipped.
      raise NotImplementedError("Failed to find assignment for logical_axis_index 2")
    compiled.append(s.rl_cfg.micro_batches)
    peak = 10 * 2**30 if s.rl_cfg.micro_batches < 4 else 2**30
    return {"rows": [{"peak_bytes": peak, "fits": peak < 2**32}], "problems": []}

  monkeypatch.setattr(aot, "compile_all", fake_compile_all)
  monkeypatch.setattr(aot, "figures", lambda s, t, got: {"run": {"fits": True}})
  got = aot.advise(config_lib.load(TINY), target, max_compiles=5)
  assert got["overrides"]["rl.micro_batches"] == 4 and got["compiled"] == len(compiled)
  assert (
    "--config.rl.micro_batches=4" in got["line"] and "compiled: peak 1.00 of 16.00" in got["line"]
  )
  compiled.clear()
  got = aot.advise(config_lib.load(TINY), target, max_compiles=1)
  assert got["overrides"] is None and len(compiled) == 1
  assert got["line"].startswith("no remat, micro-batch or mesh change fits v5e:2x2")


def test_a_buffer_over_the_whole_hbm_is_a_row_that_does_not_fit():
  mesh = jax.sharding.Mesh(np.array(tpu.load_topology("v5e:2x2")), ("fsdp",))
  error = RuntimeError(
    "RESOURCE_EXHAUSTED: Allocation (size=39829110784) would exceed memory (size=17179869184) "
    ":: %s5 = inlined_call_operand.hbm [shape: f32[64,1024,151936,1]]"
  )
  row = tpu.refused(error, chip=tpu.chip_for("v5e:2x2"), mesh=mesh)
  assert row["total_bytes"] == 39829110784 and not row["fits"]
  assert row["refused"].startswith("RESOURCE_EXHAUSTED: Allocation")
  assert (
    tpu.refused(RuntimeError("something else"), chip=tpu.chip_for("v5e:2x2"), mesh=mesh) is None
  )
  assert tpu.format_table([{**row, "name": "logprobs"}]).splitlines()[1].startswith("logprobs  NO")
  assert not row["need_unknown"]


def test_an_invalid_tpu_program_is_a_refused_row_whose_need_is_unknown():
  """libtpu rejected Qwen2.5-7B's full update for v5e:2x4 past COMPILE_PAST_OOM with this
  line alone (no figure); its row does not fit, says "?", and the sweep's tables say
  "refused" where a peak would stand."""
  import tpu_aot_tables  # noqa: PLC0415

  mesh = jax.sharding.Mesh(np.array(tpu.load_topology("v5e:2x2")), ("fsdp",))
  error = RuntimeError("INVALID_ARGUMENT: Invalid TPU program.")
  row = tpu.refused(error, chip=tpu.chip_for("v5e:2x2"), mesh=mesh)
  assert row["need_unknown"] and not row["fits"] and row["total_bytes"] == 0
  assert row["refused"] == "INVALID_ARGUMENT: Invalid TPU program."
  line = tpu.format_table([{**row, "name": "update"}]).splitlines()[1]
  assert line.split()[:5] == ["update", "NO", "?", "/", "16"]
  assert tpu_aot_tables.peak({**row, "peak_bytes": 2**30}) == "refused"
  assert tpu_aot_tables.peak({"peak_bytes": 3 * 2**30}) == "3.0"


def test_the_memory_plan_screen_table_says_where_the_plan_fits_and_what_compiled(
  tmp_path, monkeypatch
):
  """`tpu_aot_tables.screen_table`: a cell whose plan fits as first tried, one that a rung
  fits (its overrides and plan), one no rung fits; the compiled column reads the cell's
  untagged record at that budget (its advised setting) and "-" where none is."""
  import tpu_aot_tables  # noqa: PLC0415

  monkeypatch.setattr(tpu_aot_tables, "OUT", tmp_path)
  G = 2**30
  cell = lambda shape, first, rung=None, plan=None: dict(  # noqa: E731
    shape=shape, topology="v5e-8", mode="full", limit_bytes=16 * G, first_plan_bytes=first,
    rung=rung, rung_plan_bytes=plan,
  )  # fmt: skip
  rows = [cell("a", 15 * G), cell("b", 40 * G, {"rl.logit_chunk": 256}, 12 * G), cell("c", 90 * G)]
  (tmp_path / "screen__4096.json").write_text(json.dumps({"new_tokens": 4096, "rows": rows}))
  record = {"advice": {"overrides": {"rl.logit_chunk": 256}}}
  (tmp_path / "b__v5e-8__full__4096.json").write_text(json.dumps(record))
  lines = tpu_aot_tables.screen_table(4096).splitlines()[2:]
  assert lines == [
    "| a | v5e-8 | full | 15.0 | 16.0 | as first tried | - | - |",
    "| b | v5e-8 | full | 40.0 | 16.0 | rl.logit_chunk=256 | 12.0 | rl.logit_chunk=256 |",
    "| c | v5e-8 | full | 90.0 | 16.0 | no rung | - | - |",
  ]


def test_counterfactual_rows_decode_compiles_for_tpu_when_the_config_enables_them():
  config = config_lib.load(str(ROOT / "configs" / "ibpo.py") + ":tiny")
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(config, target)
  fns = steps.functions_on(setup, target.devices)
  args = aot.abstract_arguments(setup, fns)
  assert list(args) == [*aot.FUNCTIONS, "counterfactual"]
  jitted, a = args["counterfactual"]
  compiled = aot.compile_function(jitted, a)
  report = tpu.report(compiled, chip=target.chip, mesh=fns.layout.mesh)
  assert report["fits"] and report["host_callbacks"] == []
  M = setup.loop.prompts_per_step * setup.counterfactual.per_group
  assert jax.tree.leaves(compiled.out_info)[0].shape[0] == M  # The M counterfactual rows.


@pytest.fixture(scope="module")
def episodes_v5e():
  """The calculator's multi-turn config (its 1-layer quick model), compiled for v5e:2x2
  (`aot.compile_all`)."""
  config = config_lib.load(str(ROOT / "configs" / "calculator.py") + ":quick")
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(config, target)
  return setup, target, aot.compile_all(setup, target)


def test_episode_pieces_compile_for_tpu_in_place_of_the_sampler(episodes_v5e):
  setup, _, got = episodes_v5e
  names = [r["name"] for r in got["rows"]]
  assert names == ["logprobs", "update", "episode_start", "episode_turn", "episode_append"]
  assert got["problems"] == []
  rows = {r["name"]: r for r in got["rows"]}
  for name in ("episode_start", "episode_turn", "episode_append"):
    assert rows[name]["fits"] and rows[name]["host_callbacks"] == []
    # The sampler's resident arrays: the optimizer state (no reference: kl_coef 0 here).
    assert rows[name]["resident_bytes"] == rows["logprobs"]["resident_bytes"] > 0
  # The turn and the append take the state and donate it: the cache is not held twice.
  for name in ("episode_turn", "episode_append"):
    assert rows[name]["alias_bytes"] > 0.9 * rows[name]["output_bytes"]


def _cache_specs(compiled):
  state = compiled.out_info
  return {x.sharding.spec for x in jax.tree.leaves((state.cache.k, state.cache.v))}


def test_the_episode_cache_is_split_over_rows_and_a_turn_without_donation_holds_it_twice(
  episodes_v5e,
):
  """The cache comes out of the prefill split over fsdp (each chip holds its rows), and the
  turn aliases it; the same turn jitted without donating its state aliases nothing."""
  setup, target, got = episodes_v5e
  fns = got["fns"]
  state, _, key, prompts = abstract.inputs(setup, fns)
  compiled, _, _ = aot.compile_episodes(setup, fns, state.params, prompts, key)
  assert _cache_specs(compiled["episode_start"]) == {sharding.P("fsdp")}
  # The turn returns the state sharded as it took it (so a run compiles it once), and the
  # append is compiled on the turn's state, as a run chains them.
  turn = compiled["episode_turn"]
  pairs = zip(jax.tree.leaves(turn.input_shardings[0][1]), jax.tree.leaves(turn.output_shardings))
  assert all(a.is_equivalent_to(b, 2) for a, b in pairs)
  assert compiled["episode_append"].input_shardings[0][1] == turn.output_shardings
  runner = copy.copy(fns.episodes.train)
  runner.pieces = {**runner.pieces, "turn": jax.jit(runner.pieces["turn"].__wrapped__)}
  broken = dataclasses.replace(fns, episodes=dataclasses.replace(fns.episodes, train=runner))
  undonated, _, _ = aot.compile_episodes(setup, broken, state.params, prompts, key)
  report = lambda c: tpu.report(c, chip=target.chip, mesh=fns.layout.mesh)  # noqa: E731
  assert report(compiled["episode_turn"])["alias_bytes"] > 0
  assert report(undonated["episode_turn"])["alias_bytes"] == 0


def test_episodes_through_refill_slots_compile_for_tpu_on_pages():
  """sampler.refill_slots with episodes (`episode_refill`): the turn's S-slot loop over the
  episodes' pages compiles for v5e:2x2 beside the paged start and append, and so do the
  overlapped loop's segment and S-row append (env.overlap_steps); each fits, calls
  nothing on the host and donates its state (the pool is not held twice)."""
  config = config_lib.load(str(ROOT / "configs" / "calculator.py") + ":quick")
  config.sampler.update(kv_layout="paged", page_size=8, refill_slots=8)
  config.env.overlap_steps = 4  # The overlapped loop's segment and S-row append too.
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(config, target)
  fns = steps.functions_on(setup, target.devices)
  state, _, key, prompts = abstract.inputs(setup, fns)
  compiled, _, problems = aot.compile_episodes(setup, fns, state.params, prompts, key)
  pieces = ["start", "turn", "append", "segment", "append_rows"]
  assert problems == [] and list(compiled) == [f"episode_{p}" for p in pieces]
  for name, c in compiled.items():
    r = tpu.report(c, chip=target.chip, mesh=fns.layout.mesh)
    assert r["fits"] and r["host_callbacks"] == [], name
    if name != "episode_start":
      assert r["alias_bytes"] > 0.9 * r["output_bytes"], name


def test_episode_pieces_are_compiled_on_the_runner_s_own_layout(episodes_v5e, monkeypatch):
  """`aot.compile_episodes` compiles each piece on the layout the runner runs on
  (`Layout.sampling` of its prompts: under context parallelism its rows split over
  `sequence` too), not the trainer's."""
  setup, _, got = episodes_v5e
  fns = got["fns"]
  state, _, key, prompts = abstract.inputs(setup, fns)
  runner = copy.copy(fns.episodes.train)
  runner.layout = dataclasses.replace(fns.layout)  # Equal, but not the trainer's object.
  other = dataclasses.replace(fns, episodes=dataclasses.replace(fns.episodes, train=runner))
  seen = []

  def record(fn, args, *, layout):
    seen.append(layout)
    raise jax.errors.JaxRuntimeError("recorded")

  monkeypatch.setattr(aot, "compile_function", record)
  aot.compile_episodes(setup, other, state.params, prompts, key)
  assert seen and all(layout is runner.layout for layout in seen)


def test_a_reward_model_source_compiles_its_scorer_and_stays_resident(tmp_path, one_slice):
  """A config.rewards source of kind reward_model: its scorer is a row, its params (fsdp
  over the host's 4 chips) are added to every row's resident bytes; a path this host
  does not have is a problem, not a row."""
  rm_cfg = model.ModelConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                             head_dim=16, mlp_dim=128)  # fmt: skip
  rm_cfg_d = {"model": dataclasses.asdict(rm_cfg), "max_len": 48, "optimizer": {}}
  (tmp_path / reward_model.RECORD).write_text(json.dumps(rm_cfg_d))
  config = config_lib.load(QUICK)
  config.rewards = {
    "correct": {"kind": "verifier", "weight": 1.0},
    "rm": {"kind": "reward_model", "weight": 0.5, "path": str(tmp_path), "batch_size": 6},
    "gone": {"kind": "reward_model", "weight": 0.5, "path": str(tmp_path / "nothing")},
  }
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(config, target)
  compiled = aot.compile_all(setup, target)
  got = aot.figures(setup, target, compiled)
  rows = {r["name"]: r for r in got["rows"]}
  assert list(rows) == [*aot.FUNCTIONS, "reward_model:rm"]
  scorer = rows["reward_model:rm"]
  assert scorer["fits"] and scorer["model_roofline_s"] > 0
  params = jax.eval_shape(lambda: reward_model.init(rm_cfg, jax.random.key(0)))
  held = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params["model"])) // 4
  held += sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params["head"]))
  before = {r["name"]: r["resident_bytes"] for r in one_slice["rows"]}
  for name in aot.FUNCTIONS:
    assert rows[name]["resident_bytes"] - before[name] == pytest.approx(held, rel=0.05)
  assert len(got["problems"]) == 1 and "'gone' not compiled" in got["problems"][0]
  # While it scores, the policy's train state (params and Adam) and the reference are held
  # beside it; its own params are its arguments, not resident.
  res = aot.resident(setup, compiled["fns"], compiled["args"])
  assert scorer["resident_bytes"] == res["logprobs"] + res["params"] + res["ref"]
  assert res["logprobs"] > 0 and res["params"] > 0
  assert scorer["peak_bytes"] == scorer["total_bytes"] + scorer["resident_bytes"]


def test_a_distillation_teacher_compiles_its_forward_and_stays_resident(one_slice):
  """config.teacher (the committed warm start, a 3-layer model beside the 1-layer student):
  its log-prob forward is a row, its params (fsdp over the host's 4 chips) are added to
  every other row's resident bytes, and the memory plan counts them."""
  config = config_lib.load(QUICK)
  config.rl.advantage = "distill"
  config.teacher.path = str(ROOT / "tests" / "fixtures" / "warm_starts" / "arithmetic_tiny")
  target = aot.Target.load("v5e:2x2")
  setup, _ = aot.setup_for(config, target)
  assert setup.teacher_source.model_cfg.n_layers == 3
  compiled = aot.compile_all(setup, target)
  got = aot.figures(setup, target, compiled)
  rows = {r["name"]: r for r in got["rows"]}
  assert list(rows) == [*aot.FUNCTIONS, "teacher"] and got["problems"] == []
  row = rows["teacher"]
  assert row["fits"] and row["model_roofline_s"] > 0
  params = jax.eval_shape(lambda: model.init(setup.teacher_source.model_cfg, jax.random.key(0)))
  full = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  res = aot.resident(setup, compiled["fns"], compiled["args"])
  assert full // 4 <= res["teacher_params"] <= full  # Split over fsdp where it divides.
  before = {r["name"]: r["resident_bytes"] for r in one_slice["rows"]}
  for name in aot.FUNCTIONS:
    assert rows[name]["resident_bytes"] - before[name] == res["teacher_params"]
  assert row["resident_bytes"] == res["logprobs"] - res["teacher_params"] + res["params"]
  plan = memory.plan_for(setup, n_devices=4)
  assert plan.teacher_params == res["teacher_params"] and plan.teacher_forward > 0


def test_episodes_on_several_hosts_play_one_block_of_rows_each():
  """Each process plays the episodes of the rows its devices hold (`episodes._Rows`): on
  v5e:4x8 (8 hosts) the calculator's training rows are one contiguous block a process,
  and nothing is refused (tests/infra/test_multihost.py runs it on two processes)."""
  config = config_lib.load(str(ROOT / "configs" / "calculator.py") + ":tiny")
  target = aot.Target.load("v5e:4x8")
  setup, _ = aot.setup_for(config, target)
  fns = steps.functions_on(setup, target.devices)
  rows, problems = aot.process_rows(fns, setup)
  assert problems == [] and fns.episodes is not None
  blocks = sorted(rows["rollouts"].values())
  assert len(blocks) == 8 and all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))


def test_a_multi_host_slice_feeds_each_process_one_contiguous_block_of_rows():
  """v5e:4x8 is 32 chips on 8 hosts: the launch builds each global batch from the rows each
  process's devices hold (`distributed.to_global`), which must be one block per process."""
  target = aot.Target.load("v5e:4x8")
  assert tpu.hosts(target.devices) == 8
  setup, _ = aot.setup_for(config_lib.load(TINY), target)
  fns = steps.functions_on(setup, target.devices)
  rows, problems = aot.process_rows(fns, setup)
  assert problems == []
  for what, n in (("prompts", setup.loop.prompts_per_step), ("rollouts", setup.update_rows)):
    blocks = sorted(rows[what].values())
    assert len(blocks) == 8 and blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))  # Contiguous, tiling n.


# ---------------------------------------------------------------------------------------
# Every shipped accelerator config fits the topology its docstring names.


def _shipped():
  for name in ("scale.py", "gsm8k_qwen.py", "math_qwen.py"):
    module = config_lib.module(str(ROOT / "configs" / name))
    for variant, topology in module.TOPOLOGIES.items():
      yield name, variant, topology, getattr(module, "SHAPES", {}).get(variant, "")


@pytest.mark.parametrize("name,variant,topology,shape", list(_shipped()))
def test_every_shipped_accelerator_config_fits_the_topology_it_names(
  name, variant, topology, shape
):
  """Its docstring names the chip, and XLA's TPU compile of every step, committed by
  `python experiments/tpu_aot.py --configs` (minutes a config: not in CI; each record
  names its commit), fits that topology with no problem found, at the config as it ships
  (its mesh, micro-batches and log-prob slices)."""
  module = config_lib.module(str(ROOT / "configs" / name))
  assert f"{tpu.chip_for(topology).name}-" in module.__doc__
  config = config_lib.load(str(ROOT / "configs" / name) + f":{variant}")
  record = ROOT / "experiments" / "results" / "tpu_aot" / "configs" / f"{name[:-3]}__{variant}.json"
  got = json.loads(record.read_text())
  assert (got["config"], got["topology"]) == (f"configs/{name}:{variant}", topology)
  assert got["fingerprint"] == aot.fingerprint(config), "changed since compiled: rerun it"
  assert got["run"]["fits"] and got["problems"] == [] and got["verdict"] == "supports", got["rows"]
  assert got["run"]["mesh"]["tensor"] == max(1, config.mesh.tensor)
  assert got["run"]["chip"] == tpu.chip_for(topology).name


def test_every_committed_sweep_cell_carries_the_verdict_of_its_first_compile():
  """experiments/results/tpu_aot/<shape>__<topology>__<mode>[__<tokens>][__<tag>].json
  (`experiments/tpu_aot.py`, not in CI): the claim (the workload fits as first tried) is
  judged by the first compile; when it does not fit, the advice names a setting XLA
  compiled and found fitting, and that is the final setting."""
  cells = sorted((ROOT / "experiments" / "results" / "tpu_aot").glob("*__*__*.json"))
  # 40 cells and their `target` rerun, 14 cells at 4,096 tokens, 3 of them rerun (`steps`),
  # and Qwen2.5-7B full on v6e-8 again at the update's fix (`update_fix`).
  assert len(cells) >= 98
  for path in cells:
    r = json.loads(path.read_text())
    fits = r["first"]["run"]["fits"]
    assert r["claim"].startswith("the workload fits the topology's HBM as first tried"), path
    assert r["verdict"] == ("supports" if fits else "contradicts"), path
    if not fits and r["advice"]["overrides"]:
      assert r["final"]["run"]["fits"], path


def test_the_committed_4096_screen_prices_every_cell_and_its_rungs_fit_the_plan():
  """experiments/results/tpu_aot/screen__4096.json (`tpu_aot.py --screen`, not in CI): one
  row per sweep cell; a rung only where the first-tried plan is over the chip's HBM, and
  its plan under it."""
  import itertools  # noqa: PLC0415

  import tpu_aot_tables  # noqa: PLC0415

  r = json.loads((tpu_aot_tables.OUT / "screen__4096.json").read_text())
  keys = [(x["shape"], x["topology"], x["mode"]) for x in r["rows"]]
  cells = itertools.product(tpu_aot_tables.SHAPES, tpu_aot_tables.TOPOLOGIES, tpu_aot_tables.MODES)
  assert r["new_tokens"] == 4096 and keys == list(cells)
  assert r["verdict"] == "inconclusive" and r["claim"] and r["seeds"].startswith("none")
  for x in r["rows"]:
    over = x["first_plan_bytes"] > x["limit_bytes"]
    assert (x["rung"] is None) == (x["rung_plan_bytes"] is None), x
    assert x["rung"] is None or (over and x["rung_plan_bytes"] <= x["limit_bytes"]), x


def _tables(text: str) -> list[str]:
  """The Markdown tables of a text, each as its lines joined."""
  out, rows = [], []
  for line in [*text.splitlines(), ""]:
    if line.startswith("|"):
      rows.append(line)
    elif rows:
      out, rows = [*out, "\n".join(rows)], []
  return out


def test_the_committed_report_shows_the_records_tables():
  """experiments/results/tpu_aot/README.md (the site's page of these results) holds the
  tables `python experiments/tpu_aot.py --table` renders from the committed records, in
  order, and nothing else: a record added or rerun without its page fails here."""
  import tpu_aot_tables  # noqa: PLC0415 -- the standard library only: no libtpu.

  report = (ROOT / "experiments" / "results" / "tpu_aot" / "README.md").read_text()
  assert _tables(report) == _tables(tpu_aot_tables.every_table())


def test_a_fingerprint_names_the_keys_set_away_from_their_defaults():
  """A key at its default (the way a key added to the defaults later reads in every
  shipped config) leaves the fingerprint as it was; any key moved from its default, or
  a task kwarg, changes it."""
  base = config_lib.load(str(ROOT / "configs" / "scale.py") + ":0.5b")
  same = aot.with_overrides(
    base, {"sampler.decode_segments": 0, "rl.micro_batches": base.rl.micro_batches}
  )
  assert aot.fingerprint(same) == aot.fingerprint(base)
  prints = {aot.fingerprint(base)}
  for dotted, value in (("sampler.decode_segments", 3), ("rl.micro_batches", 7), ("seed", 1)):
    prints.add(aot.fingerprint(aot.with_overrides(base, {dotted: value})))
  kwargs = aot.with_overrides(base, {})
  kwargs.task.kwargs.extra = 1
  prints.add(aot.fingerprint(kwargs))
  assert len(prints) == 5
