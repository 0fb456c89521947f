"""The off-policy pipeline (`offpolicy`, `pipeline`): the synchronous schedule at s = 0,
rows s updates stale, stale rows never trained uncorrected, partial rollouts' per-segment
log-probs, async resume (and a damaged, foreign or missing in-flight buffer never
resumed), sampler/trainer device split, and bad configs."""

import functools
import pathlib
import shutil

import arithmetic
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import runs
import subproc

from grpo_jax.infra import checkpoint, config_lib
from grpo_jax.models import logprobs, model
from grpo_jax.rl import offpolicy
from grpo_jax.rollouts import partial
from grpo_jax.trainer import build, pipeline, steps, train

# Keys only the pipeline writes, and the mismatch keys (present in both runs).
PIPELINE_KEYS = (
  "offpolicy/staleness",
  "offpolicy/stale",
  "offpolicy/mixed",
  "offpolicy/segments",
  "offpolicy/in_flight",
)


def _tiny(*, iterations=4, **sections):
  """A run that learns within 4 iterations (so params change and staleness matters)."""
  c = arithmetic.get_config("quick")
  c.sampler.group_size = 4
  c.task.kwargs.max_digits = 1
  c.update(prompts_per_step=4, iterations=iterations, warmstart_steps=120, warmstart_batch=16)
  c.update(eval_every=100, eval_size=8, eval_samples=0, checkpoint_every=2, peak_flops=1e11)
  c.update(reward_workers=0, progress=False, learning_rate=3e-3)
  for key, value in sections.items():
    section, name = key.split("__")
    c[section][name] = value
  return c


def _run(cfg, workdir, **kw):
  train.run(cfg, workdir, log=lambda _: None, **kw)
  return runs.lines(workdir)


def _without_pipeline_keys(line):
  return {k: v for k, v in runs.untimed(line).items() if not k.startswith(PIPELINE_KEYS)}


@pytest.fixture(scope="module")
def sync_run(tmp_path_factory):
  return _run(_tiny(), tmp_path_factory.mktemp("sync"))


def test_async_at_staleness_0_gives_the_synchronous_metrics_bit_for_bit(sync_run, tmp_path):
  got = _run(_tiny(offpolicy__enabled=True), tmp_path)
  assert [_without_pipeline_keys(x) for x in got] == [_without_pipeline_keys(x) for x in sync_run]
  assert [x.get("offpolicy/staleness_max") for x in got[1:]] == [0, 0, 0, 0]
  # The run learns, so later staleness tests see params that change.
  assert sync_run[1]["accuracy"] > 0 and sync_run[1]["grad_norm"] > 0


@pytest.fixture(scope="module")
def stale_run(tmp_path_factory):
  cfg = _tiny(offpolicy__enabled=True, offpolicy__max_staleness=2, rl__is_correction="tis_token")
  return _run(cfg, tmp_path_factory.mktemp("stale"))


def test_rows_are_sampled_s_updates_back_and_the_mismatch_shows(stale_run, sync_run):
  lines = stale_run[1:]
  # Batches 1..3 are sampled by θ_0 (the pipeline's start), batch 4 by θ_1.
  assert [x["offpolicy/staleness_max"] for x in lines] == [0, 1, 2, 2]
  assert [x["offpolicy/stale_frac"] for x in lines] == [0.0] * 4
  assert lines[0]["offpolicy/mismatch_k3"] < 1e-6  # Same params, same numerics.
  assert lines[2]["offpolicy/mismatch_k3"] > 1e-4  # Two updates apart.
  assert lines[2]["offpolicy/ratio_p01"] < 1 < lines[2]["offpolicy/ratio_p99"]
  assert lines[2]["offpolicy/is_weight_mean"] != 1.0
  assert lines[0]["offpolicy/in_flight"] == 2
  # Iteration 1 trains the same batch as the synchronous run, from the same params.
  assert lines[0]["accuracy"] == sync_run[1]["accuracy"]


def test_a_row_staler_than_the_bound_is_dropped_or_trained_corrected(tmp_path):
  """A pipeline saved under s = 2 resumes under s = 0: its in-flight batches are 2
  updates stale. 'drop' trains none of their tokens; 'correct' trains them with TIS."""
  base = dict(offpolicy__enabled=True, rl__is_correction="tis_token")
  _run(_tiny(iterations=2, offpolicy__max_staleness=2, **base), tmp_path / "drop")
  shutil.copytree(tmp_path / "drop", tmp_path / "correct")  # The same run: same seed, config.
  assert (tmp_path / "drop" / "checkpoints" / "2" / "buffer").is_dir()
  dropped = _run(_tiny(iterations=3, **base), tmp_path / "drop")[3]
  assert dropped["offpolicy/staleness_max"] == 2 and dropped["offpolicy/stale_frac"] == 1.0
  assert dropped["offpolicy/stale_dropped_frac"] == 1.0
  assert dropped["loss_tokens"] == 0 and dropped["grad_norm"] == 0
  corrected = _run(_tiny(iterations=3, offpolicy__stale="correct", **base), tmp_path / "correct")[3]
  assert corrected["offpolicy/stale_frac"] == 1.0
  assert corrected["offpolicy/stale_dropped_frac"] == 0.0
  assert corrected["loss_tokens"] > 0 and corrected["offpolicy/mismatch_k3"] > 0


def _replace_buffer(step_dir, source):
  """step_dir's in-flight buffer replaced by source's (None: removed), and its manifest
  written anew, as if the checkpoint had been written so: only the buffer's own record
  (its step) or its absence can tell."""
  shutil.rmtree(step_dir / "buffer")
  if source is not None:
    shutil.copytree(source / "buffer", step_dir / "buffer")
  checkpoint.write_manifest(step_dir, when="after_commit")


def _flip_buffer_byte(step_dir, source):
  del source
  f = max(
    (p for p in (step_dir / "buffer").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size
  )
  data = bytearray(f.read_bytes())
  data[len(data) // 2] ^= 0xFF
  f.write_bytes(bytes(data))


def test_async_resume_after_a_crash_reproduces_the_uninterrupted_run(tmp_path):
  """Staleness 1 with partial rollouts: the checkpoint at 2 holds an unfinished batch.
  Then the in-flight buffer of checkpoint 4 is damaged (a changed byte), replaced by
  checkpoint 2's, or removed: each time the run names it in one line, falls back to
  checkpoint 2 and its own buffer, and writes the uninterrupted run's metrics again."""
  cfg = _partial_config
  ref = _run(cfg(), tmp_path / "ref")

  def crash(it, record):
    if it == 3:
      raise RuntimeError("simulated crash")

  with pytest.raises(RuntimeError, match="simulated crash"):
    _run(cfg(), tmp_path / "run", on_iteration=crash)
  resumed = _run(cfg(), tmp_path / "run")
  assert [x["iteration"] for x in resumed] == [0, 1, 2, 3, 4]
  assert [runs.untimed(x) for x in resumed] == [runs.untimed(x) for x in ref]
  assert max(x["offpolicy/mixed_version_frac"] for x in ref[1:]) > 0  # Partial rows exist.
  ckpts = tmp_path / "run" / "checkpoints"
  for damage, reason in [
    (_flip_buffer_byte, "holds other bytes than when written"),
    (_replace_buffer, "its in-flight buffer is that of step 2"),
    (lambda d, _: _replace_buffer(d, None), "its off-policy in-flight buffer is missing"),
  ]:
    damage(ckpts / "4", ckpts / "2")
    logged = []
    train.run(cfg(), tmp_path / "run", log=logged.append)
    said = [x for x in logged if "is unreadable" in x]
    assert len(said) == 1 and reason in said[0] and "resuming from step 2" in said[0], logged
    assert [runs.untimed(x) for x in runs.lines(tmp_path / "run")] == [runs.untimed(x) for x in ref]
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints.bad").iterdir()) == [
    "4",
    "4.1",
    "4.2",
  ]


def _partial_config():
  """Staleness 2 with partial rollouts of 3-token segments, corrected by TIS."""
  return _tiny(
    offpolicy__enabled=True,
    offpolicy__max_staleness=2,
    offpolicy__partial="continue",
    offpolicy__segment_tokens=3,
    rl__is_correction="tis_token",
  )


@pytest.fixture(scope="module")
def pieces():
  """The functions of a partial-rollout config (the resume test's: compiled once) and two
  different params."""
  setup = build.build(_partial_config())
  fns = steps.functions(setup)
  a = model.init(setup.model_cfg, jax.random.key(1))
  b = model.init(setup.model_cfg, jax.random.key(2))
  return setup, fns, a, b


def test_partial_rollout_logprobs_are_those_of_the_params_of_each_segment(pieces):
  setup, fns, a, b = pieces
  from grpo_jax.trainer import rollout

  drawn = rollout.draw(setup, fns, 0)
  rows = fns.partial.empty(drawn.prompts)
  hyper = setup.sampling_hyper
  live = lambda r: ~partial.finished(r)  # noqa: E731
  rows_a = fns.partial.cont(a, rows, live(rows), jnp.int32(3), jax.random.key(5), hyper)
  first_NT = np.asarray(rows_a.mask_NT)
  rows_ab = fns.partial.cont(b, rows_a, live(rows_a), jnp.int32(8), jax.random.key(6), hyper)
  mask_NT = np.asarray(rows_ab.mask_NT)
  second_NT = mask_NT & ~first_NT
  assert first_NT.sum() > 0 and second_NT.sum() > 0
  assert first_NT.sum(axis=1).max() <= 3
  # Row tokens are contiguous: the continuation starts where the first segment ended.
  np.testing.assert_array_equal(mask_NT, np.arange(mask_NT.shape[1]) < mask_NT.sum(1)[:, None])

  teacher_forced = jax.jit(functools.partial(logprobs.completion_logprobs, model_fn=fns.model_fn))

  def forced(params):
    return np.asarray(
      teacher_forced(
        params, rows_ab.prompt_tokens_NP, rows_ab.prompt_mask_NP, rows_ab.tokens_NT, rows_ab.mask_NT
      )[0]
    )

  got = np.asarray(rows_ab.policy_logp_NT)
  np.testing.assert_allclose(got[first_NT], forced(a)[first_NT], atol=2e-5)
  np.testing.assert_allclose(got[second_NT], forced(b)[second_NT], atol=2e-5)
  assert np.abs(forced(a)[second_NT] - got[second_NT]).max() > 1e-2  # The params differ.


def test_restart_empties_rows_unfinished_at_a_params_change(pieces):
  setup, fns, a, _ = pieces
  from grpo_jax.trainer import rollout

  rows = fns.partial.empty(rollout.draw(setup, fns, 0).prompts)
  rows = fns.partial.cont(
    a, rows, ~partial.finished(rows), jnp.int32(2), jax.random.key(5), setup.sampling_hyper
  )
  reset_N = ~partial.finished(rows)
  assert bool(jnp.any(reset_N))
  out = partial.restart_rows(rows, reset_N, pad_id=setup.sampler_cfg.pad_id)
  assert int(jnp.sum(out.mask_NT[reset_N])) == 0 and int(jnp.max(out.length_N[reset_N])) == 0
  assert bool(jnp.all(out.tokens_NT[~reset_N] == rows.tokens_NT[~reset_N]))


def test_staleness_of_a_row_is_that_of_its_oldest_token():
  b = pipeline.InFlight(
    it=5,
    index=0,
    drawn=None,
    rollouts=type("R", (), {"mask_NT": np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], bool)})(),
    version_NT=np.array([[2, 3, -1], [-1, -1, -1], [4, 4, 4]], np.int32),
    start_version=3,
  )
  source = pipeline.Source.__new__(pipeline.Source)
  np.testing.assert_array_equal(source.staleness(b, 4), [2, 1, 0])


@pytest.mark.parametrize(
  "sections,match",
  [
    (dict(offpolicy__max_staleness=-1), "max_staleness=-1: must be >= 0"),
    (
      dict(offpolicy__enabled=True, rl__importance_hyper=dict(is_lower=2.0, is_upper=1.0)),
      "0 <= is_lower < is_upper",
    ),
    (dict(offpolicy__max_staleness=1), "enabled=False"),
    (
      dict(offpolicy__enabled=True, rl__dynamic_sampling=True, rl__max_gen_batches=2),
      "dynamic_sampling",
    ),
    (dict(offpolicy__enabled=True, offpolicy__partial="continue"), "needs max_staleness >= 1"),
    (dict(offpolicy__enabled=True, offpolicy__stale="correct"), "uncorrected"),
    (dict(offpolicy__enabled=True, offpolicy__placement="split"), "placement='split'"),
    (
      dict(offpolicy__enabled=True, offpolicy__partial="later", offpolicy__max_staleness=1),
      "partial='later'",
    ),
  ],
)
def test_bad_offpolicy_configs_fail_before_compiling(sections, match):
  with pytest.raises(config_lib.ConfigError, match=match):
    build.build(_tiny(**sections), n_devices=1)


def test_the_partial_rollout_functions_moved_to_rollouts_keep_their_old_path():
  """The schedule's config stays in rl.offpolicy; 0.2's rl.offpolicy.continue_rows (and
  empty_rollouts, restart_rows, finished) is rollouts.partial's now, with a
  DeprecationWarning naming the new home, for one release."""
  cfg = offpolicy.OffPolicyConfig(enabled=True, max_staleness=1, partial="continue")
  assert (cfg.stale, cfg.placement, cfg.segment_tokens) == ("drop", "shared", 0)
  with pytest.raises(ValueError, match="partial='later'"):
    offpolicy.OffPolicyConfig(partial="later")
  offpolicy.__dict__.pop("restart_rows", None)  # Resolved afresh: the warning each time.
  with pytest.warns(DeprecationWarning, match=r"moved to grpo_jax.rollouts.partial.restart_rows"):
    assert offpolicy.restart_rows is partial.restart_rows


# The arms of the two-device test: (offpolicy.placement, mesh.sequence, offpolicy.partial).
_TWO_DEVICE_ARMS = {
  "shared": ("shared", 1, "off"),  # Both devices on fsdp.
  "split": ("split", 1, "off"),
  "context": ("shared", 2, "off"),  # Both on sequence: tokens split in the update.
  "shared_continue": ("shared", 1, "continue"),
  "context_continue": ("shared", 2, "continue"),
}


def test_the_pipeline_gives_the_same_rows_split_over_devices_or_over_the_sequence(tmp_path):
  """Two host devices, s = 1, the same 2 iterations in each arm (`_TWO_DEVICE_ARMS`): the
  sampler on device 0 and the trainer on device 1 (placement "split"), or context
  parallelism (mesh.sequence = 2: the update splits each row's tokens over both devices,
  the sampler its rows), with whole or partial rollouts (3-token segments continued under
  new params): the metrics are those of the same pipeline with both devices on fsdp, the
  same programs up to the order of float32 sums. Every key is there; ints exactly, floats
  to rel 1e-3. Measured: rewards, accuracies and token counts equal; the largest float
  difference is 2.4e-4 relative (grad_norm)."""
  script = tmp_path / "two_devices.py"
  script.write_text(
    f"""
import json, sys
sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})  # This test file's folder.
import jax, test_offpolicy as t, runs
assert jax.device_count() == 2
out = {{}}
for name, (placement, sequence, partial) in t._TWO_DEVICE_ARMS.items():
  c = t._tiny(iterations=2, offpolicy__enabled=True, offpolicy__max_staleness=1,
              offpolicy__placement=placement, offpolicy__partial=partial)
  if sequence > 1:
    c.mesh.update(fsdp=1, sequence=sequence)
  if partial != "off":
    c.offpolicy.segment_tokens = 3
  out[name] = [runs.untimed(x) for x in t._run(c, {str(tmp_path)!r} + "/" + name)]
print(json.dumps(out))
"""
  )
  r = subproc.run([script], devices=2)
  import json

  out = json.loads(r.stdout.strip().splitlines()[-1])
  assert out["split"][1]["offpolicy/staleness_max"] == 0
  assert out["split"][2]["offpolicy/staleness_max"] == 1
  continued = out["context_continue"][2]
  assert continued["offpolicy/segments"] > 1 and continued["offpolicy/mixed_version_frac"] > 0
  for base, arm in (
    ("shared", "split"),
    ("shared", "context"),
    ("shared_continue", "context_continue"),
  ):
    assert len(out[base]) == len(out[arm]) == 3, arm  # The warm start and 2 iterations.
    for a, b in zip(out[base], out[arm], strict=True):
      assert a.keys() == b.keys(), arm
      for k, v in a.items():
        if isinstance(v, float):
          assert b[k] == pytest.approx(v, rel=1e-3, abs=1e-5), (arm, k)
        else:
          assert b[k] == v, (arm, k)


# Multi-turn episodes through the pipeline: configs/calculator.py:tiny from its learning
# test's committed warm start (33.6% greedy: real rewards and gradients), 8 prompts × 8.
def _episodes(workdir, *, iterations=3, **sections):
  c = config_lib.load("configs/calculator.py:tiny")
  c.update(prompts_per_step=8, iterations=iterations, eval_every=100, eval_size=16)
  c.update(eval_samples=0, checkpoint_every=1, reward_workers=0, progress=False)
  c.tensorboard = False
  for key, value in sections.items():
    section, name = key.split("__")
    c[section][name] = value
  if not (workdir / "checkpoints").exists():
    runs._copy_warm_start(runs.WARM_STARTS / "calculator_tiny", workdir, fresh=True)
  return c


def test_episodes_through_the_pipeline_at_staleness_0_are_the_synchronous_run(tmp_path):
  sync = _run(_episodes(tmp_path / "sync"), tmp_path / "sync")
  got = _run(_episodes(tmp_path / "async", offpolicy__enabled=True), tmp_path / "async")
  assert [_without_pipeline_keys(x) for x in got] == [_without_pipeline_keys(x) for x in sync]
  assert [x["offpolicy/staleness_max"] for x in got[1:]] == [0, 0, 0]
  assert sync[1]["episode/turns"] > 2 and sync[1]["grad_norm"] > 0


def test_stale_episodes_log_their_mismatch_and_resume_from_the_buffer(tmp_path):
  """s = 2 with token-level TIS: batches 1-3 are played by θ_0, so batch 3 is two updates
  stale and its π_old differs from the behaviour policy on action tokens. A run that
  crashes in iteration 3 (its line written, its checkpoint not) resumes from checkpoint 2
  with batches 3 and 4 in flight (saved whole, with their scores and episode metrics) and
  ends with the uninterrupted run's metrics."""
  sections = dict(
    offpolicy__enabled=True, offpolicy__max_staleness=2, rl__is_correction="tis_token"
  )
  ref = _run(_episodes(tmp_path / "ref", **sections), tmp_path / "ref")
  lines = ref[1:]
  assert [x["offpolicy/staleness_max"] for x in lines] == [0, 1, 2]
  assert lines[0]["offpolicy/mismatch_k3"] < 1e-6 < lines[2]["offpolicy/mismatch_k3"]
  assert lines[2]["offpolicy/is_weight_mean"] != 1.0 and lines[2]["episode/turns"] > 2

  def crash(it, record):
    if it == 3:
      raise RuntimeError("simulated crash")

  with pytest.raises(RuntimeError, match="simulated crash"):
    _run(_episodes(tmp_path / "run", **sections), tmp_path / "run", on_iteration=crash)
  assert (tmp_path / "run" / "checkpoints" / "2" / "buffer").is_dir()
  assert not (tmp_path / "run" / "checkpoints" / "3").exists()
  resumed = _run(_episodes(tmp_path / "run", **sections), tmp_path / "run")
  assert [runs.untimed(x) for x in resumed] == [runs.untimed(x) for x in ref]
