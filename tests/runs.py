"""Runs in tests: the small config they share, a run's metrics lines, and a line without the
keys that measure time (they differ between two otherwise identical runs)."""

import pathlib

from grpo_jax.infra import config_lib, logs

ROOT = pathlib.Path(__file__).resolve().parent.parent


def small_arithmetic():
  """configs/arithmetic.py:quick (a 1-layer model) on 1-digit sums, G = 4, warm-start
  batches of 16: it learns within 120 warm-start steps and compiles in a fraction of the
  tiny config's time."""
  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":quick")
  c.task.kwargs.max_digits = 1
  c.sampler.group_size = 4
  c.warmstart_batch = 16
  return c


TIMING = ("time/", "tokens_per_s", "perf/")


def lines(workdir) -> list[dict]:
  """workdir/metrics.jsonl as records."""
  return logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")


def untimed(record: dict) -> dict:
  """The record without its timing keys."""
  return {k: v for k, v in record.items() if not k.startswith(TIMING)}


def assert_episodes_resume_equal(local, resumed, summaries) -> None:
  """Two 2-iteration episode runs (workdirs) agree on every untimed metric: `local` in one
  session, `resumed` stopped after iteration 1 and resumed. The resumed run's first session
  ended with an evaluation (a run's last iteration is evaluated), which the uninterrupted
  run makes at 2 only; `summaries` are both runs' final summaries."""
  a, b = [untimed(r) for r in lines(local)], [untimed(r) for r in lines(resumed)]
  assert [r["iteration"] for r in b] == [0, 1, 2], b
  assert b[-1]["episode/turns"] > 2 and 0 < b[1]["accuracy"] < 1 and b[1]["loss"] != 0
  no_eval = lambda r: {k: v for k, v in r.items() if not k.startswith("eval/")}
  assert [no_eval(r) for r in a] == [no_eval(r) for r in b]
  assert a[-1] == b[-1] and "eval/greedy_accuracy" in b[-1]
  assert summaries[0]["final_accuracy"] == summaries[1]["final_accuracy"]


class _Stop(Exception):
  pass


# Committed warm starts of the learning tests (`warm_started_arms`): what a run's workdir
# holds after its warm start (checkpoint 0, the config it was made with, its metrics line
# and, with adapters, the frozen base), one folder per fixture name. Rewrite them with
#   GRPO_JAX_WRITE_WARM_STARTS=1 python -m pytest -n 2 -q tests/learning/test_learning.py \
#     tests/learning/test_moe_learning.py tests/learning/test_lora_learning.py tests/learning/test_long_learning.py \
#     tests/envs/test_episodes.py -k learn
# and commit tests/fixtures/warm_starts.
WARM_STARTS = ROOT / "tests" / "fixtures" / "warm_starts"
WRITE_WARM_STARTS = "GRPO_JAX_WRITE_WARM_STARTS"
_WARM_START_FILES = ("checkpoints", "base", "config.json", "metrics.jsonl")
# Greedy accuracy of a fixture re-scored by today's code may differ from the recorded one by
# this many problems (a near-tie that another float32 summation order flips); a fixture the
# code no longer reads as it was written is off by tens.
STALE_PROBLEMS = 2


class StaleWarmStart(AssertionError):
  """A committed warm start made with other config values than a test's, or that today's
  code scores otherwise than when it was made (`_check_warm_start`; a change to the warm
  start's training alone is not seen)."""


def warm_started_arms(tmp_path_factory, arms: dict, *, fixture: str, flipped=None) -> dict:
  """{name: run summary} of learning arms that all resume from one warm start (checkpoint 0
  of the first arm's config): `arms` maps names to configs; `flipped`, a config, adds the
  arm "flipped", the same run trained on −A (compiled afresh, its collapse guard warning
  instead of stopping). Each summary's "workdir" is its run's folder. The learning tests'
  fixture: same seed, same warm start.

  The warm start is the committed one, tests/fixtures/warm_starts/`fixture` (each took 1-2
  minutes of CI time in every run), after two checks that fail with the command that
  rewrites it (`WARM_STARTS`): every config value it was made with is the first arm's
  (keys added since are allowed), and today's code scores its greedy accuracy as recorded
  (`STALE_PROBLEMS`). With GRPO_JAX_WRITE_WARM_STARTS=1 the warm start is trained and
  written there instead.

  The arms run in a child process at XLA's default optimisation level (they run their
  programs thousands of times; the tests' own level compiles faster and runs slower:
  tests/subproc.py)."""
  import pickle  # noqa: PLC0415

  import subproc  # noqa: PLC0415

  root = tmp_path_factory.mktemp("arms")
  spec = {"arms": arms, "flipped": flipped, "fixture": fixture}
  (root / "arms.pkl").write_bytes(pickle.dumps(spec))
  subproc.run([pathlib.Path(__file__), root], optimized=True, timeout=1800)
  return pickle.loads((root / "summaries.pkl").read_bytes())


def _arms(root: pathlib.Path, arms: dict, flipped, fixture: str) -> dict:
  """`warm_started_arms`, in this process, its runs under `root`."""
  import shutil  # noqa: PLC0415
  import weakref  # noqa: PLC0415

  import pytest  # noqa: PLC0415

  from grpo_jax.models import sharding  # noqa: PLC0415
  from grpo_jax.rl import preparation  # noqa: PLC0415
  from grpo_jax.trainer import steps, train  # noqa: PLC0415

  base = root / "warm"
  _warm_start(base, next(iter(arms.values())), fixture)
  names = [*arms, *(["flipped"] if flipped is not None else [])]
  workdirs = {name: root / name / "run" for name in names}
  for workdir in workdirs.values():
    shutil.copytree(base, workdir)
  out = {name: train.run(c, workdirs[name], log=lambda _: None) for name, c in arms.items()}
  if flipped is not None:
    real = preparation.compute_advantages
    flipped.collapse.action = "warn"  # If it collapses, the guard says so and lets it go on.
    with pytest.MonkeyPatch.context() as mp:
      mp.setattr(preparation, "compute_advantages", lambda *a, **k: -real(*a, **k))
      # Compile the flipped arm afresh (and forget it): the run's functions and the jits
      # that equal runs share (`sharding.jit`).
      mp.setattr(steps, "_FUNCTIONS", {})
      mp.setattr(sharding, "_JITS", weakref.WeakValueDictionary())
      out["flipped"] = train.run(flipped, workdirs["flipped"], log=lambda _: None)
  return {name: {**summary, "workdir": str(workdirs[name])} for name, summary in out.items()}


def _warm_start(workdir: pathlib.Path, config, fixture: str) -> None:
  """workdir as the run of `config` leaves it after its warm start: the committed fixture,
  checked (`warm_started_arms`), or with GRPO_JAX_WRITE_WARM_STARTS=1 trained and written
  to the fixture's folder."""
  import contextlib  # noqa: PLC0415
  import os  # noqa: PLC0415

  from grpo_jax.trainer import train  # noqa: PLC0415

  source = WARM_STARTS / fixture
  if os.environ.get(WRITE_WARM_STARTS) == "1":

    def stop(it, record):
      raise _Stop

    with contextlib.suppress(_Stop):  # The warm start, saved as checkpoint 0.
      train.run(config, workdir, log=lambda _: None, on_iteration=stop)
    _copy_warm_start(workdir, source, fresh=True)
    return
  if not (source / "checkpoints" / "0").is_dir():
    raise StaleWarmStart(f"No committed warm start at {source}. {_REWRITE}")
  _copy_warm_start(source, workdir, fresh=False)
  _check_warm_start(workdir, config, fixture)


# Config sections the warm start (supervised steps, then checkpoint 0's evaluation) never
# reads, so a default changed there cannot make a fixture stale: the counterfactual plan
# (its defaults moved to an unbiased plan after the fixtures were written).
NOT_READ_BY_THE_WARM_START = ("counterfactual.",)
_REWRITE = f"Rewrite it with {WRITE_WARM_STARTS}=1 (tests/runs.py, WARM_STARTS) and commit it."


def _copy_warm_start(src: pathlib.Path, dst: pathlib.Path, *, fresh: bool) -> None:
  import shutil  # noqa: PLC0415

  if fresh:
    shutil.rmtree(dst, ignore_errors=True)
  dst.mkdir(parents=True, exist_ok=True)
  for name in _WARM_START_FILES:
    if (src / name).is_dir():
      shutil.copytree(src / name, dst / name)
    elif (src / name).exists():
      shutil.copyfile(src / name, dst / name)


def _check_warm_start(workdir: pathlib.Path, config, fixture: str) -> None:
  """Raises StaleWarmStart when a config value the fixture was made with differs from
  `config`'s (housekeeping keys aside: train.HOUSEKEEPING_KEYS), or when `grpo-jax eval`
  of its checkpoint 0 (the warm start's own evaluation: same problems, same key) scores a
  greedy accuracy more than STALE_PROBLEMS problems from the recorded one."""
  import json  # noqa: PLC0415
  import shutil  # noqa: PLC0415

  from grpo_jax.trainer import build, eval_command, train  # noqa: PLC0415

  # A fixture written before keys moved (config_lib.MOVED_KEYS) is compared at their new place.
  made = config_lib.upgrade(json.loads((workdir / "config.json").read_text()), warn=False)
  now = json.loads(json.dumps(build.as_dict(build.build(config)), default=str))
  changed = [
    f"{key}: {a!r} -> {b!r}"
    for key, a, b in train.config_changes(made, now)
    if "<absent>" not in (a, b)  # A key added (or dropped) since: checked by the score.
    and key.split(".")[-1] not in train.HOUSEKEEPING_KEYS
    and not key.startswith(train.HOUSEKEEPING_SECTIONS + NOT_READ_BY_THE_WARM_START)
  ]
  if changed:
    raise StaleWarmStart(
      f"Warm start {fixture!r} was made with another config: {changed}. {_REWRITE}"
    )
  (recorded,) = [r for r in lines(workdir) if r.get("phase") == "warmstart"]
  out = workdir.parent / "warm_eval"
  shutil.rmtree(out, ignore_errors=True)  # `grpo-jax eval` would resume from what is there.
  c = config.copy_and_resolve_references()  # Scored on the problems and samples it was.
  c.update(eval_size=made["loop"]["eval_size"], eval_samples=made["loop"]["eval_samples"])
  c.eval.update(step=0, k=c.eval_samples, size=0, out=str(out))
  (figures,) = eval_command.run(c, workdir, log=lambda _: None)["figures"].values()
  got, want = figures["greedy"]["value"], recorded["eval/greedy_accuracy"]
  if abs(got - want) * c.eval_size > STALE_PROBLEMS:
    raise StaleWarmStart(
      f"Warm start {fixture!r}: today's code scores its greedy accuracy {got:.4f}, against "
      f"{want:.4f} when it was made (more than {STALE_PROBLEMS} of {c.eval_size} problems "
      f"apart). {_REWRITE}"
    )


if __name__ == "__main__":  # The child of `warm_started_arms`: python tests/runs.py ROOT.
  import pickle
  import sys

  import jax

  jax.config.update("jax_numpy_rank_promotion", "raise")  # As in the tests (conftest).
  root = pathlib.Path(sys.argv[1])
  spec = pickle.loads((root / "arms.pkl").read_bytes())
  summaries = _arms(root, spec["arms"], spec["flipped"], spec["fixture"])
  (root / "summaries.pkl").write_bytes(pickle.dumps(summaries))
