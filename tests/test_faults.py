"""Fault injection through the real command line, each run in a process of its own:
killed runs, preemption, damaged checkpoints (missing, cut or changed bytes), a full disk,
an unwritable workdir, failing verifiers, overflowing learning rates and a collapsing
policy. A fault either ends in a rerun that writes exactly the metrics of an uninterrupted
run, or in one clear error line (the terminal's only one) and a non-zero exit.
(The edited-dataset fault is in test_dataset_faults.py, bad config values in test_config.py.)"""

import contextlib
import json
import pathlib
import resource
import shutil
import signal
import subprocess
import sys

import pytest
import runs  # noqa: E402
import subproc  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "--config=configs/arithmetic.py:tiny"
# A few seconds per run: the smallest model, 4 prompts × G 4, checkpoints every 2 iterations.
SMALL = [
  "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
  "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
  "--config.prompts_per_step=4", "--config.sampler.group_size=4", "--config.warmstart_steps=4",
  "--config.warmstart_batch=8", "--config.eval_every=2", "--config.eval_size=8",
  "--config.eval_samples=0", "--config.reward_workers=0", "--config.peak_flops=1e11",
  "--config.checkpoint_every=2", "--config.rl.num_minibatches=2", "--config.progress=False",
]  # fmt: skip
# Checkpoints 0, 2, 4, 6 and 8: one valid (0) under one of each kind of damage (DAMAGES).
ITERATIONS = 8
KEEP_ALL = [f"--config.keep_checkpoints={ITERATIONS // 2 + 1}"]


def cli(workdir, *flags, fault="none", iterations=ITERATIONS, preexec_fn=None, timeout=300):
  """tests/fault_cli.py (the grpo-jax command line with `fault` injected) on SMALL."""
  args = [sys.executable, str(ROOT / "tests" / "fault_cli.py"), f"--fault={fault}", "--", CONFIG]
  args += [f"--workdir={workdir}", *SMALL, f"--config.iterations={iterations}", *flags]
  return subprocess.run(
    args,
    cwd=ROOT,
    env=subproc.child_env(),
    capture_output=True,
    text=True,
    timeout=timeout,
    preexec_fn=preexec_fn,
  )


def metrics(workdir) -> list[dict]:
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [runs.untimed(json.loads(x)) for x in lines]


def error_lines(r) -> list[str]:
  return [x for x in r.stderr.splitlines() if x.startswith("grpo-jax: error:")]


@pytest.fixture(scope="module")
def reference_workdir(tmp_path_factory) -> pathlib.Path:
  """The workdir of an uninterrupted run, every checkpoint kept (0, 2, ..., ITERATIONS; the
  other runs keep the default 3 latest and the best)."""
  workdir = tmp_path_factory.mktemp("reference")
  r = cli(workdir, *KEEP_ALL)
  assert r.returncode == 0, r.stderr[-3000:]
  return workdir


@pytest.fixture(scope="module")
def reference(reference_workdir) -> list[dict]:
  """The metrics of an uninterrupted run."""
  lines = metrics(reference_workdir)
  assert [x["iteration"] for x in lines] == list(range(ITERATIONS + 1))
  return lines


# ----------------------------------------------------------------------------
# Killed and preempted runs resume exactly.
# ----------------------------------------------------------------------------


def test_a_killed_run_reruns_to_the_uninterrupted_metrics(reference, tmp_path):
  """Killed in the warm start, after an iteration's metrics line (before its checkpoint) and
  right after a checkpoint's background save started: each rerun resumes the workdir the
  kill left, and the last one ends with the uninterrupted metrics (one workdir, killed three
  times: each kill's leftovers are what the next session starts from)."""
  for fault in ("kill_in_warmstart:2", "kill_after_iteration:3", "kill_mid_save:4"):
    r = cli(tmp_path, fault=fault)
    assert r.returncode == -signal.SIGKILL, (fault, r.stderr[-2000:])
  r = cli(tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert metrics(tmp_path) == reference


def _summary(workdir) -> dict:
  return json.loads((pathlib.Path(workdir) / "summary.json").read_text())


def test_sigterm_saves_and_exits_143_in_the_warm_start_and_in_training(reference, tmp_path):
  """A preemption in the warm start keeps its state (workdir/warmstart); the rerun continues
  it, and a second preemption, after iteration 3, saves checkpoint 3 (not a checkpoint_every
  multiple); the third session ends with the uninterrupted metrics."""
  from grpo_jax.infra import checkpoint  # noqa: PLC0415

  r = cli(tmp_path, fault="term_in_warmstart:2")
  assert r.returncode == 143, r.stderr[-3000:]
  assert "stopped by SIGTERM during the warm start at step 3" in r.stdout
  assert (tmp_path / "warmstart").is_dir() and not (tmp_path / "checkpoints" / "0").exists()
  # The session's seconds are kept with the warm start's state, for the run's total.
  first = _summary(tmp_path)["wall_seconds"]
  with contextlib.closing(checkpoint.Checkpointer(tmp_path / "warmstart")) as ckpt:
    assert ckpt.read_meta(3) == {"warmstart_step": 3, "wall_seconds": first} and first > 0
  r = cli(tmp_path, fault="term_after_iteration:3")
  assert r.returncode == 143, r.stderr[-3000:]
  assert "continuing from step 3" in r.stdout + r.stderr
  assert not (tmp_path / "warmstart").exists()  # Superseded by checkpoint 0.
  assert (tmp_path / "checkpoints" / "3").is_dir()  # Not a checkpoint_every multiple.
  r = cli(tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert metrics(tmp_path) == reference
  raw = (tmp_path / "metrics.jsonl").read_text().splitlines()
  rl_seconds = sum(json.loads(x)["time/iteration"] for x in raw[1:])
  assert _summary(tmp_path)["wall_seconds"] >= first + rl_seconds


# ----------------------------------------------------------------------------
# Damaged checkpoints: named, set aside, the newest valid one used.
# ----------------------------------------------------------------------------


def _largest_file(d: pathlib.Path) -> pathlib.Path:
  return max((p for p in d.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(step_dir: pathlib.Path):
  f = _largest_file(step_dir / "state")
  f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _empty(step_dir: pathlib.Path):
  shutil.rmtree(step_dir)
  step_dir.mkdir()


def _no_metadata(step_dir: pathlib.Path):
  (step_dir / "state" / "_METADATA").unlink()


def _overwrite(step_dir: pathlib.Path):
  """4 KB of the largest file's middle inverted: the size stays, the bytes do not (the
  damage a size check misses; here the values would stay finite, so only the hash sees it)."""
  f = _largest_file(step_dir / "state")
  data = bytearray(f.read_bytes())
  middle = len(data) // 2
  data[middle : middle + 4096] = bytes(b ^ 0xFF for b in data[middle : middle + 4096])
  f.write_bytes(bytes(data))


DAMAGES = (_truncate, _empty, _no_metadata, _overwrite)


def test_damaged_checkpoints_are_set_aside_and_the_newest_valid_one_is_used(
  reference_workdir, reference, tmp_path
):
  """The uninterrupted run's workdir (checkpoints 0, 2, ..., ITERATIONS) with every checkpoint
  after 0 damaged, each in its own way: the rerun names each one in a line of its own, newest
  first, moves it aside and resumes from step 0, to the uninterrupted metrics."""
  shutil.copytree(reference_workdir, tmp_path / "run")
  tmp_path = tmp_path / "run"
  damaged = {ITERATIONS - 2 * i: damage for i, damage in enumerate(DAMAGES)}
  for step, damage in damaged.items():
    damage(tmp_path / "checkpoints" / str(step))
  r = cli(tmp_path, *KEEP_ALL)
  assert r.returncode == 0, r.stderr[-3000:]
  said = [x for x in (r.stdout + r.stderr).splitlines() if "is unreadable" in x]
  assert len(said) == len(DAMAGES), said
  for line, step in zip(said, damaged):
    assert f"checkpoints/{step} is unreadable" in line and "resuming from step 0" in line, line
  assert r.stderr == ""  # The lines are the run's own output; no library traceback.
  for step in damaged:
    assert (tmp_path / "checkpoints.bad" / str(step)).exists()  # Set aside, not deleted.
  assert metrics(tmp_path) == reference


# ----------------------------------------------------------------------------
# A full disk and an unwritable workdir.
# ----------------------------------------------------------------------------


def _file_size_limit(nbytes: int):
  """preexec_fn: files may not grow past nbytes (writes then fail with EFBIG, as on a full
  disk; SIGXFSZ is ignored so the process sees the error instead of dying)."""

  def limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.RLIM_INFINITY))

  return limit


def test_a_failed_save_stops_the_run_in_one_line_and_the_last_checkpoint_stays(reference, tmp_path):
  assert cli(tmp_path, iterations=2).returncode == 0
  r = cli(tmp_path, preexec_fn=_file_size_limit(16 * 1024))  # Checkpoints no longer fit.
  assert r.returncode == 1, r.stderr[-3000:]
  lines = r.stderr.splitlines()
  assert len(lines) == 1, r.stderr[-3000:]  # The terminal's only line: orbax's tracebacks
  (line,) = lines  # went to the log.
  assert line.startswith("grpo-jax: error: Saving a checkpoint under"), line
  assert "File too large" in line and "previous checkpoint is intact" in line, line
  library = (tmp_path / "grpo_jax.log").read_text()
  # The log is under the same 16 KB file-size limit: which background failure fills it
  # first (orbax's write error, or an event loop's report after it) depends on timing.
  assert "Traceback" in library
  assert "File too large" in library or len(library.encode()) >= 16 * 1024, library[-2000:]
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [0, 2]  # 4 failed; 2 (and 0) intact.
  assert metrics(tmp_path)[-1]["iteration"] <= 5  # Stopped at the next iteration at the latest.
  r = cli(tmp_path)  # Space again: resumes from checkpoint 2.
  assert r.returncode == 0, r.stderr[-3000:]
  assert metrics(tmp_path) == reference


def test_an_unwritable_workdir_is_one_line(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  r = cli(blocker / "run")
  assert r.returncode == 2
  (line,) = error_lines(r)
  assert "cannot be written" in line and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------
# Verifiers that raise or hang; updates that overflow.
# ----------------------------------------------------------------------------


def test_raising_and_hanging_rewards_are_excluded_and_training_goes_on(tmp_path):
  r = cli(
    tmp_path,
    "--config.task.name=flaky_arithmetic",
    "--config.reward_workers=2",
    "--config.reward_timeout_s=0.3",
    "--config.max_unscorable_frac=1.0",
    iterations=2,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  rl = [x for x in metrics(tmp_path) if x["phase"] == "rl"]
  assert sum(x["reward_errors"] for x in rl) > sum(x["reward_timeouts"] for x in rl) > 0
  assert all(x["excluded_frac"] >= x["unscorable_frac"] for x in rl)


def test_a_verifier_failing_on_every_row_stops_the_run(tmp_path):
  r = cli(tmp_path, "--config.task.name=broken_arithmetic", iterations=2)
  assert r.returncode == 1
  (line,) = error_lines(r)
  assert "failed on 8 of 8 items" in line and "KeyError" in line, line


@pytest.mark.parametrize("key", ["learning_rate", "warmstart_lr"])
def test_a_learning_rate_that_overflows_in_the_param_dtype_is_refused_in_one_line(tmp_path, key):
  """1e39 is inf in float32 (every update would be inf): a config error before anything
  compiles or is written."""
  r = cli(tmp_path / "run", f"--config.{key}=1e39")
  assert r.returncode == 2, r.stderr[-3000:]
  (line,) = r.stderr.splitlines()
  assert line == (
    f"grpo-jax: error: config.{key}=1e+39 overflows in the parameter dtype float32 (largest "
    "finite value 3.403e+38); use a value below that (typical learning rates are 1e-6 to 1e-2)."
  )
  assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_warm_start_that_overflows_is_refused_before_any_checkpoint(tmp_path):
  """lr 1e38 is finite, the params it makes are not: the skipped steps stop the run."""
  r = cli(tmp_path, "--config.warmstart_lr=1e38", "--config.max_nonfinite_steps=3")
  assert r.returncode == 1, r.stderr[-3000:]
  (line,) = error_lines(r)
  assert "consecutive train steps" in line and "warm start" in line, line
  assert not (tmp_path / "checkpoints" / "0").exists()


# ----------------------------------------------------------------------------
# A policy that collapses: one line and exit 1, or (action "warn") a warning.
# ----------------------------------------------------------------------------

# A warm start whose samples solve some of the one-digit sums (16 prompts × G 4: about
# 10 correct rows in iteration 1, so that dead batches after it are a collapse), and a
# learning rate that wrecks the policy in one update.
COLLAPSING = [
  "--config.task.kwargs.max_digits=1", "--config.warmstart_steps=120",
  "--config.warmstart_batch=16", "--config.prompts_per_step=16", "--config.eval_every=100",
  "--config.learning_rate=1e30",
]  # fmt: skip


def test_a_collapsing_policy_stops_the_run_in_one_line_and_warn_goes_on(tmp_path):
  r = cli(tmp_path, *COLLAPSING, iterations=8)
  assert r.returncode == 1, r.stderr[-3000:]
  (line,) = r.stderr.splitlines()
  assert line.startswith(
    "grpo-jax: error: The policy collapsed at iteration 6 (collapse signal dead_groups): "
    "every group's rewards were all 0 with gradient norm 0 for 5 iterations (since "
    "iteration 2)"
  ), line
  # Iteration 1 trained on θ_0's samples (some correct): θ_0 is the last healthy policy.
  assert f"the last checkpoint before it is {tmp_path}/checkpoints/0 (iteration 0)" in line
  lines = metrics(tmp_path)
  assert lines[1]["accuracy"] * 64 >= 4 and [x["iteration"] for x in lines] == list(range(7))
  assert all(x["all_zero_groups"] == 1 and x["grad_norm"] == 0 for x in lines[2:])
  steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  assert steps == [0, 2, 4]  # Stopped before checkpoint 6.
  r = cli(tmp_path, *COLLAPSING, "--config.collapse.action=warn", iterations=6)
  assert r.returncode == 0, r.stderr[-3000:]  # Resumed from 4: fires again at 6, goes on.
  warned = [x for x in r.stdout.splitlines() if x.startswith("warning: The policy collapsed")]
  assert len(warned) == 2 and warned[0].endswith("Going on (config.collapse.action='warn').")
  assert _summary(tmp_path)["collapse_warnings"] == [warned[0].removeprefix("warning: ")]
