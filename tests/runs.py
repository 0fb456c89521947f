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


class _Stop(Exception):
  pass


def warm_started_arms(tmp_path_factory, arms: dict, *, flipped=None) -> dict:
  """{name: run summary} of learning arms that all resume from one warm start (checkpoint 0,
  made with the first arm's config): `arms` maps names to configs; `flipped`, a config,
  adds the arm "flipped", the same run trained on −A (compiled afresh, its collapse guard
  warning instead of stopping). Each summary's "workdir" is its run's folder. The learning
  tests' fixture: same seed, same warm start.

  The arms run in a child process at XLA's default optimisation level (they run their
  programs thousands of times; the tests' own level compiles faster and runs slower:
  tests/subproc.py)."""
  import pickle  # noqa: PLC0415

  import subproc  # noqa: PLC0415

  root = tmp_path_factory.mktemp("arms")
  (root / "arms.pkl").write_bytes(pickle.dumps({"arms": arms, "flipped": flipped}))
  subproc.run([pathlib.Path(__file__), root], optimized=True, timeout=1800)
  return pickle.loads((root / "summaries.pkl").read_bytes())


def _arms(root: pathlib.Path, arms: dict, flipped) -> dict:
  """`warm_started_arms`, in this process, its runs under `root`."""
  import contextlib  # noqa: PLC0415
  import shutil  # noqa: PLC0415

  import pytest  # noqa: PLC0415

  from grpo_jax import steps, train  # noqa: PLC0415
  from grpo_jax.rl import preparation  # noqa: PLC0415

  def stop(it, record):
    raise _Stop

  base = root / "warm"
  with contextlib.suppress(_Stop):  # The warm start, saved as checkpoint 0.
    train.run(next(iter(arms.values())), base, log=lambda _: None, on_iteration=stop)
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
      mp.setattr(steps, "_FUNCTIONS", {})  # Compile the flipped arm afresh (and forget it).
      out["flipped"] = train.run(flipped, workdirs["flipped"], log=lambda _: None)
  return {name: {**summary, "workdir": str(workdirs[name])} for name, summary in out.items()}


if __name__ == "__main__":  # The child of `warm_started_arms`: python tests/runs.py ROOT.
  import pickle
  import sys

  import jax

  jax.config.update("jax_numpy_rank_promotion", "raise")  # As in the tests (conftest).
  root = pathlib.Path(sys.argv[1])
  spec = pickle.loads((root / "arms.pkl").read_bytes())
  summaries = _arms(root, spec["arms"], spec["flipped"])
  (root / "summaries.pkl").write_bytes(pickle.dumps(summaries))
