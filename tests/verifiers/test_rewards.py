import multiprocessing
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.verifiers import reward_pool, verdicts

ROOT = pathlib.Path(__file__).resolve().parents[2]

TIMEOUT_S = 0.5
SLACK_S = 4.0  # A loaded 2-core CI machine: a replacement worker may be slow to start.


class FakeTask:
  """reward = len(completion), format = len(prompt); some completions misbehave."""

  def reward(self, prompt, completion):
    if completion == "raise":
      raise RuntimeError("broken verifier")
    if completion == "hang":
      time.sleep(1e6)
    if completion == "die":
      os._exit(3)
    if completion == "nan":
      return float("nan")
    if completion == "text":
      return "not a number"
    return float(len(completion))

  def format_reward(self, prompt, completion):
    return float(len(prompt))


@pytest.fixture(scope="module")
def pool():
  with reward_pool.RewardPool(FakeTask(), workers=2, timeout_s=TIMEOUT_S) as pool:
    yield pool


def _batch(n):
  return [f"p{i}" * (i % 3 + 1) for i in range(n)], ["x" * (i % 7) for i in range(n)]


def _expect(prompts, completions, bad):
  correct_N = np.array([0.0 if i in bad else len(c) for i, c in enumerate(completions)])
  format_N = np.array([0.0 if i in bad else len(p) for i, p in enumerate(prompts)])
  return correct_N, format_N


@pytest.mark.parametrize("n", [0, 1, 3, 101])
def test_scores_in_input_order(pool, n):
  prompts, completions = _batch(n)
  scores = pool.score(prompts, completions)
  correct_N, format_N = _expect(prompts, completions, bad=())
  assert scores.correct_N.dtype == np.float32 and scores.error_N.dtype == bool
  np.testing.assert_array_equal(scores.correct_N, correct_N)
  np.testing.assert_array_equal(scores.format_N, format_N)
  assert scores.errors == 0 and not scores.error_N.any() and scores.error_N.shape == (n,)


def _misbehave(bad: dict[int, str], n=40):
  prompts, completions = _batch(n)
  for i, kind in bad.items():
    completions[i] = kind
  return prompts, completions


@pytest.mark.parametrize("workers", [0, 2])
def test_raising_or_non_numeric_reward_scores_zero_and_counts(pool, workers):
  bad = {0: "raise", 7: "nan", 21: "text", 39: "raise"}
  prompts, completions = _misbehave(bad)
  scorer = pool if workers else reward_pool.RewardPool(FakeTask(), workers=0)
  scores = scorer.score(prompts, completions)
  correct_N, format_N = _expect(prompts, completions, bad)
  np.testing.assert_array_equal(scores.correct_N, correct_N)
  np.testing.assert_array_equal(scores.format_N, format_N)
  assert scores.errors == 4 and scores.timeouts == 0
  assert sorted(np.flatnonzero(scores.error_N)) == sorted(bad)


def test_hanging_reward_times_out_and_the_pool_recovers(pool):
  children = len(multiprocessing.active_children())
  bad = {5: "hang"}
  prompts, completions = _misbehave(bad)
  start = time.monotonic()
  scores = pool.score(prompts, completions)
  assert time.monotonic() - start < TIMEOUT_S + SLACK_S
  correct_N, format_N = _expect(prompts, completions, bad)
  np.testing.assert_array_equal(scores.correct_N, correct_N)
  np.testing.assert_array_equal(scores.format_N, format_N)
  assert scores.errors == 1 and scores.timeouts == 1 and scores.timeout_N[5]
  assert len(multiprocessing.active_children()) == children  # Killed and replaced.
  prompts, completions = _batch(64)
  scores = pool.score(prompts, completions)  # Waits for the replacement if need be.
  np.testing.assert_array_equal(scores.correct_N, _expect(prompts, completions, bad=())[0])
  assert scores.errors == 0


def test_a_reward_that_kills_its_worker_scores_zero(pool):
  bad = {2: "die", 30: "raise"}
  prompts, completions = _misbehave(bad)
  scores = pool.score(prompts, completions)
  np.testing.assert_array_equal(scores.correct_N, _expect(prompts, completions, bad)[0])
  assert scores.errors == 2 and scores.timeouts == 0


def test_arithmetic_references_score_one_through_the_pool():
  task = tasks.get("arithmetic", ops="+-*")
  examples = [task.example("train", i, seed=0) for i in range(50)]
  prompts = [ex.prompt for ex in examples]
  with reward_pool.RewardPool(task, workers=2, timeout_s=5.0) as pool:
    right = pool.score(prompts, [ex.reference for ex in examples])
    wrong = pool.score(prompts, [f"A:{int(ex.answer) + 1}." for ex in examples])
  np.testing.assert_array_equal(right.correct_N, 1.0)
  np.testing.assert_array_equal(right.format_N, 1.0)
  np.testing.assert_array_equal(wrong.correct_N, 0.0)  # Wrong, not an error.
  np.testing.assert_array_equal(wrong.format_N, 1.0)
  assert right.errors == wrong.errors == 0


def test_bad_arguments():
  with pytest.raises(TypeError, match="does not pickle"):
    reward_pool.RewardPool(type("Local", (FakeTask,), {})(), workers=1)
  with pytest.raises(ValueError, match="workers"):
    reward_pool.RewardPool(FakeTask(), workers=-1)
  with pytest.raises(ValueError, match="timeout_s"):
    reward_pool.RewardPool(FakeTask(), workers=0, timeout_s=0)
  inline = reward_pool.RewardPool(FakeTask(), workers=0)
  with pytest.raises(ValueError, match="2 prompts but 1 completions"):
    inline.score(["a", "b"], ["c"])
  inline.close()
  with pytest.raises(RuntimeError, match="closed"):
    inline.score([], [])


def test_replacing_a_hung_worker_does_not_import_the_task_again(tmp_path):
  """The fork server imports the task's module once; a worker replacing a killed one is a
  fork of it, so a hang costs about timeout / workers, not a fresh import of everything
  the task needs (seconds when it imports jax). Checked by counting imports: the parent's
  and the fork server's, whatever the number of hangs."""
  log = tmp_path / "imports.log"
  code = (
    f"import sys; sys.path.insert(0, {str(ROOT / 'experiments')!r})\n"
    "import hanging_task\n"
    "from grpo_jax.verifiers import reward_pool\n"
    "if __name__ == '__main__':\n"
    "  with reward_pool.RewardPool(hanging_task.HangTask(), workers=2, timeout_s=0.2) as pool:\n"
    "    s = pool.score(['p'] * 12, ['hang' if i % 3 == 0 else 'ok' for i in range(12)])\n"
    "  print(s.timeouts, s.errors, int(s.correct_N.sum()))\n"
  )
  env = {**os.environ, "GRPO_JAX_IMPORT_LOG": str(log)}
  script = tmp_path / "score.py"
  script.write_text(code)
  r = subprocess.run(
    [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["4", "4", "8"]  # 4 hangs killed and replaced; 8 scored.
  assert len(log.read_text().splitlines()) == 2


class SlowTask:
  """reward 1 after sleeping for "slow" items (a slow but correct answer); format_reward
  is the scoring worker's pid."""

  def reward(self, prompt, completion):
    if completion == "slow":
      time.sleep(0.3)
    return verdicts.Labeled(1.0, completion)

  def format_reward(self, prompt, completion):
    return float(os.getpid())


def test_slow_items_hold_one_worker_each_while_the_others_take_the_rest():
  # Four slow items at the head of the batch: with one chunk per worker they would all
  # sit in the first worker's chunk; in chunks of n / (4 workers) they are shared.
  completions = ["slow"] * 4 + ["fast"] * 12
  with reward_pool.RewardPool(SlowTask(), workers=2, timeout_s=10.0) as pool:
    scores = pool.score(["p"] * 16, completions)
  assert scores.correct_N.tolist() == [1.0] * 16 and not scores.error_N.any()
  assert len(set(scores.format_N[:4].tolist())) == 2, scores.format_N
  assert scores.label_N.tolist() == completions  # Labels travel with the scores.
  inline = reward_pool.RewardPool(SlowTask(), workers=0).score(["p"], ["fast"])
  assert inline.label_N.tolist() == ["fast"]


def test_unscorable_carries_its_label_across_processes():
  import pickle

  e = pickle.loads(pickle.dumps(verdicts.Unscorable("no sandbox", label="sandbox")))
  assert (str(e), e.label) == ("no sandbox", "sandbox")
  value = pickle.loads(pickle.dumps(verdicts.Labeled(0.0, "timeout")))
  assert (value, value.label, float(value) + 1) == (0.0, "timeout", 1.0)


_SCRIPT = """
import sys
from grpo_jax import tasks
from grpo_jax.verifiers import reward_pool, verdicts
print("top level", flush=True)
with reward_pool.RewardPool(tasks.get("arithmetic"), workers=2) as pool:
  print("workers", pool.workers, pool.score(["Q:1+2\\n"], ["A:3."]).correct_N.tolist())
"""


def test_a_script_without_a_main_guard_starts_its_workers_without_rerunning(tmp_path):
  script = tmp_path / "train_script.py"
  script.write_text(_SCRIPT.format(root=str(ROOT)))
  r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.splitlines() == ["top level", "workers 2 [1.0]"], r.stdout


_CONFIG_TASK = """
from grpo_jax.tasks import arithmetic

class Doubled(arithmetic.Arithmetic):
  def reward(self, prompt, completion):
    return 2.0 * super().reward(prompt, completion)
"""


def test_a_task_in_a_file_loaded_by_path_scores_in_workers(tmp_path):
  # As a config file holds a task class: loaded from its path under a name no fresh
  # process can import.
  import importlib.util

  path = tmp_path / "my_config.py"
  path.write_text(_CONFIG_TASK)
  spec = importlib.util.spec_from_file_location("_not_importable_config", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module
  try:
    spec.loader.exec_module(module)
    with reward_pool.RewardPool(module.Doubled(), workers=2, timeout_s=30.0) as pool:
      scores = pool.score(["Q:1+2\n", "Q:2+2\n"], ["A:3.", "A:5."])
      assert pool.workers == 2
  finally:
    del sys.modules[spec.name]
  assert scores.correct_N.tolist() == [2.0, 0.0]


def test_a_task_class_in_a_notebooks_main_falls_back_inline_with_one_warning():
  code = (
    f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
    "from grpo_jax.verifiers import reward_pool\n"
    "from grpo_jax.tasks import arithmetic\n"
    "class Mine(arithmetic.Arithmetic):\n  pass\n"
    "pool = reward_pool.RewardPool(Mine(), workers=2)\n"
    "print(pool.workers, pool.score(['Q:1+2\\n'], ['A:3.']).correct_N.tolist())\n"
  )
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "0 [1.0]"
  warned = [line for line in r.stderr.splitlines() if "Reward workers could not start" in line]
  assert len(warned) == 1 and "defined in __main__" in warned[0], r.stderr
