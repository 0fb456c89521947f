"""Fault injection through the command line: a problems file edited between two runs.

The bug this guards against: a `problem_files` dataset was cached under its name alone,
so a run after editing the file exited 0 and trained on the old problems.
"""

import json
import pathlib
import re
import textwrap

import tensorflow_datasets as tfds

from grpo_jax.tasks import datasets
from tests import subproc

ROOT = pathlib.Path(__file__).resolve().parents[2]

# A config file in the test's tmp dir: the tiny GSM8K recipe (committed HF fixture model)
# with the math task reading the user's problem file, one RL iteration, no export, the
# rewards scored in the run's own process (no worker process to start).
CONFIG = """
from grpo_jax.infra import config_lib

def get_config():
  c = config_lib.load({gsm8k!r})
  c.unlock()
  c.task.kwargs = dict(
    dataset="problem_files",
    config="mine",
    files=dict(train=[{problems!r}], test=[{problems!r}]),
    fields=dict(question="q", answer="a", id="id"),
  )
  c.update(iterations=1, eval_every=100, eval_size=2, checkpoint_every=100, export_hf=False)
  c.update(progress=False, tensorboard=False, reward_workers=0)
  return c
"""


def _write(path, rows):
  path.write_text("".join(json.dumps({"id": i, "q": q, "a": a}) + "\n" for i, q, a in rows))


def _questions(data_dir) -> set[str]:
  """The questions of a built split, read from its directory."""
  builder = tfds.builder_from_directory(data_dir)
  return {datasets.Problem.from_example(e).question for e in builder.as_data_source("train")}


def _builds(root) -> list[pathlib.Path]:
  """The built problem_files datasets anywhere under root (their version directories)."""
  return sorted(p.parent for p in root.glob("**/problem_files/*/*/dataset_info.json"))


def test_an_edited_problems_file_is_used_by_the_next_run(tmp_path, monkeypatch):
  cache = tmp_path / "cache"
  monkeypatch.setenv("GRPO_JAX_CACHE", str(cache))
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds_global"))  # Never the home's.
  # JAX's compilation cache: the test session's shared one (`subproc.child_env`), so a
  # program the first run (or another test) compiled is loaded, not compiled again.
  problems = tmp_path / "problems.jsonl"
  _write(problems, [("p1", "What is 2 + 3?", "5"), ("p2", "What is 4 + 4?", "8")])
  config = tmp_path / "config.py"
  gsm8k = str(ROOT / "configs" / "gsm8k_qwen.py") + ":tiny"
  config.write_text(textwrap.dedent(CONFIG.format(gsm8k=gsm8k, problems=str(problems))))
  run = lambda workdir: subproc.run(
    ["-m", "grpo_jax.main", f"--config={config}", f"--workdir={tmp_path / workdir}"],
    timeout=240,
  )

  run("first")
  [first] = _builds(tmp_path)
  assert _questions(first) == {"What is 2 + 3?", "What is 4 + 4?"}

  # The fault: the file is edited in place (same path and name), one question changed.
  _write(problems, [("p1", "What is 2 + 3?", "5"), ("p2", "What is 9 + 9?", "18")])
  second = run("second")
  builds = _builds(tmp_path)
  assert len(builds) == 2 and first in builds, f"the edited file was not rebuilt: {builds}"
  [new] = [b for b in builds if b != first]
  # The run's data note (its libraries' log records go to workdir/grpo_jax.log).
  logged = re.search(r"rebuilt in (\S+)", second.stdout)
  assert logged and pathlib.Path(logged.group(1)) == new, second.stdout[-3000:]
  assert _questions(new) == {"What is 2 + 3?", "What is 9 + 9?"}
  assert json.loads((tmp_path / "second" / "summary.json").read_text())["iterations_done"] == 1
  # Both under the project cache ($GRPO_JAX_CACHE here), not TFDS's global data dir.
  assert all(b.is_relative_to(cache / "datasets" / "problem_files") for b in builds), builds
