"""`grpo-jax eval` (grpo_jax/trainer/eval_command.py): on a trained checkpoint its figures equal the
trainer's in-loop evaluation of that checkpoint; several benchmarks (a task, another task, a
JSONL file) in one call with every problem's verdicts written; a killed eval resumes after
its last whole batch; bad requests are one clear error."""

import json

import pytest
import runs  # tests/ is on sys.path (conftest).

from grpo_jax.infra import config_lib
from grpo_jax.tasks import jsonl as jsonl_task
from grpo_jax.trainer import eval_command, train


def _config(**eval_options):
  c = runs.small_arithmetic()
  c.update(warmstart_steps=120, iterations=2, prompts_per_step=8)
  c.update(eval_every=2, eval_size=16, eval_samples=4, checkpoint_every=2)
  c.update(reward_workers=0, progress=False, tensorboard=False)
  c.eval.update(eval_options)
  return c


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 2-iteration run (checkpoints 0 and 2) whose evaluations used 4 samples per problem:
  (workdir, its metrics.jsonl records by iteration)."""
  workdir = tmp_path_factory.mktemp("eval_run")
  train.run(_config(), workdir, log=lambda _: None)
  lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return workdir, {r["iteration"]: r for r in lines if "eval/greedy_accuracy" in r}


@pytest.mark.parametrize("step", [-1, 0])
def test_the_figures_equal_the_trainers_evaluation_of_the_checkpoint(trained, step, tmp_path):
  """eval.size = eval_size and eval.k = eval_samples: greedy, avg@4 and pass@k of the
  newest checkpoint (iteration 2) and of checkpoint 0 (the warm start's evaluation) are
  the in-loop evaluation's eval/greedy_accuracy, eval/mean@4 and eval/pass@k."""
  workdir, evals = trained
  out = eval_command.run(_config(k=4, step=step, out=str(tmp_path)), workdir, log=lambda _: None)
  iteration = 2 if step == -1 else 0
  assert out["source"] == {"workdir": str(workdir), "step": iteration}
  got = out["figures"]["arithmetic"]
  want = evals[iteration]
  assert want["eval/greedy_accuracy"] > 0  # Not vacuous: the policy solves some.
  assert got["greedy"]["value"] == pytest.approx(want["eval/greedy_accuracy"], abs=1e-12)
  assert got["format_rate"]["value"] == pytest.approx(want["eval/format_rate"], abs=1e-12)
  assert got["avg@4"]["value"] == pytest.approx(want["eval/mean@4"], abs=1e-12)
  for k in (1, 2, 4):
    assert got[f"pass@{k}"]["value"] == pytest.approx(want[f"eval/pass@{k}"], abs=1e-12)
  assert "maj@4" in got


def test_several_benchmarks_write_every_verdict(trained, tmp_path):
  """arithmetic (the config's task), long_addition (another task, its defaults) and a
  2-record JSONL file in one call: eval.json holds every problem with its greedy row and 4
  samples (completion, reward, format, scorable, answer), eval.md the table."""
  workdir, _ = trained
  bench = tmp_path / "bench.jsonl"
  bench.write_text(
    '{"prompt": "Q:2+3\\n", "answer": "A:5."}\n{"prompt": "Q:1+1\\n", "answer": "A:2."}\n'
  )
  names = ("arithmetic", "long_addition", f"jsonl:{bench}")
  c = _config(k=4, benchmarks=",".join(names), out=str(tmp_path / "out"))
  c.progress = True  # Lines here (stderr is no terminal under pytest): the first and last.
  said = []
  out = eval_command.run(c, workdir, log=said.append)
  bars = [x for x in said if x.startswith("eval ")]
  assert len(bars) == 2 and bars[0].startswith("eval 1/3 (33%): arithmetic greedy "), said
  greedy = out["figures"][f"jsonl:{bench}"]["greedy"]["value"]
  assert bars[1].startswith(f"eval 3/3 (100%): jsonl:{bench} greedy {greedy:.3f} on 2 problems")
  assert not any("tok/s" in x or "reward" in x for x in bars)  # Not the trainer's figures.
  report = json.loads((tmp_path / "out" / eval_command.REPORT).read_text())
  assert list(report["benchmarks"]) == list(names) == list(out["figures"])
  sizes = {n: b["problems_scored"] for n, b in report["benchmarks"].items()}
  assert sizes == {"arithmetic": 16, "long_addition": 16, f"jsonl:{bench}": 2}
  # Distinct problems, by each task's problem_key (a drawn split may repeat one).
  for name, b in report["benchmarks"].items():
    assert 1 <= b["distinct_problems"] <= b["problems_scored"], (name, b["distinct_problems"])
  assert report["benchmarks"][f"jsonl:{bench}"]["distinct_problems"] == 2
  problem = report["benchmarks"]["arithmetic"]["problems"][0]
  assert set(problem) == {"index", "prompt", "answer", "greedy", "samples"}
  assert len(problem["samples"]) == 4
  assert set(problem["greedy"]) == {"completion", "reward", "format", "scorable", "answer"}
  assert problem["prompt"].startswith("Q:") and problem["answer"]
  # The exact verifier: 1 where the completion is the answer, as stored.
  for p in report["benchmarks"][f"jsonl:{bench}"]["problems"]:
    for row in (p["greedy"], *p["samples"]):
      assert row["reward"] == float(row["completion"].strip() == p["answer"])
  text = (tmp_path / "out" / eval_command.SUMMARY).read_text()
  assert "| benchmark | greedy |" in text and "| long_addition |" in text


def test_a_killed_eval_resumes_after_its_last_whole_batch(trained, tmp_path, monkeypatch):
  """48 problems in 3 batches of 16: killed in the second batch, the rerun scores batches
  2 and 3 only, and its report equals an uninterrupted eval's."""
  workdir, _ = trained
  whole = eval_command.run(
    _config(k=4, size=48, out=str(tmp_path / "whole")), workdir, log=lambda _: None
  )
  real, calls = eval_command.batch_rows, []

  def dying(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
      raise KeyboardInterrupt
    return real(*args, **kwargs)

  monkeypatch.setattr(eval_command, "batch_rows", dying)
  c = _config(k=4, size=48, out=str(tmp_path / "cut"))
  with pytest.raises(KeyboardInterrupt):
    eval_command.run(c, workdir, log=lambda _: None)
  calls.clear()
  monkeypatch.setattr(
    eval_command, "batch_rows", lambda *a, **k: (calls.append(1), real(*a, **k))[1]
  )
  messages = []
  resumed = eval_command.run(c, workdir, log=messages.append)
  assert len(calls) == 2 and any("1 batch(es) already scored" in m for m in messages)
  assert resumed["figures"] == whole["figures"]
  cut = json.loads((tmp_path / "cut" / eval_command.REPORT).read_text())
  full = json.loads((tmp_path / "whole" / eval_command.REPORT).read_text())
  assert cut["benchmarks"] == full["benchmarks"]
  assert [p["index"] for p in cut["benchmarks"]["arithmetic"]["problems"]] == list(range(48))


def test_bad_requests_are_one_clear_error(trained, tmp_path):
  workdir, _ = trained
  with pytest.raises(
    eval_command.EvalError, match="unknown benchmark 'aritmetic'; allowed: a task"
  ):
    eval_command.run(_config(benchmarks="aritmetic"), workdir, log=lambda _: None)
  with pytest.raises(eval_command.EvalError, match="has no checkpoints and config.hf_dir is empty"):
    eval_command.run(_config(), tmp_path / "empty", log=lambda _: None)
  with pytest.raises(ValueError, match=r"has no checkpoint 5; it has \[0, 2\]"):
    eval_command.run(_config(step=5, out=str(tmp_path)), workdir, log=lambda _: None)
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "Q:1+1\\n", "answer": "A:2."}\n{"prompt": 3}\n')
  with pytest.raises(ValueError, match=r"bad.jsonl: record 2 must be \{\"prompt\": str"):
    jsonl_task.JsonlProblems.benchmark(str(bad))
  with pytest.raises(ValueError, match="jsonl verifier 'fuzzy'; allowed: exact, math"):
    jsonl_task.JsonlProblems.benchmark(str(bad), verifier="fuzzy")


def test_the_jsonl_verifiers(tmp_path):
  path = tmp_path / "b.jsonl"
  path.write_text('{"prompt": "Q:2+3\\n", "answer": "A:5."}\n\n{"prompt": "x", "answer": "1/2"}\n')
  task = jsonl_task.JsonlProblems.benchmark(str(path))
  assert task.test_size == 2 and task.example("test", 1, seed=0).answer == "1/2"
  assert task.reward("A:5.", " A:5.\n") == 1.0 and task.reward("A:5.", "A:6.") == 0.0
  assert task.extract_answer("  A:5. ") == "A:5." and task.extract_answer("  ") is None
  assert task.format_reward("x", "y") == 1.0
  math = jsonl_task.JsonlProblems.benchmark(str(path), verifier="math")
  assert math.reward("1/2", "so \\boxed{0.5}") == 1.0 and math.reward("1/2", "\\boxed{3}") == 0.0
  assert math.extract_answer("so \\boxed{1 / 2}") == "1/2"


def test_the_command_needs_only_the_workdir(trained, tmp_path):
  """`grpo-jax eval --workdir=W --benchmarks=... --k=4` runs on the config the run recorded
  (no --config), here on 4 devices (data 2 × fsdp 2; the run trained on one), prints the
  table and writes eval.json, whose figures are the trainer's evaluation's."""
  import subproc  # noqa: PLC0415 -- tests/ is on sys.path (conftest).

  workdir, evals = trained
  bench = tmp_path / "bench.jsonl"
  bench.write_text('{"prompt": "Q:2+3\\n", "answer": "A:5."}\n')
  args = ["-m", "grpo_jax.main", "eval", f"--workdir={workdir}", f"--out={tmp_path / 'cli'}"]
  args += [f"--benchmarks=arithmetic,long_addition,jsonl:{bench}", "--k=4"]
  args += ["--config.mesh.data=2", "--config.mesh.fsdp=2"]
  r = subproc.run(args, devices=4)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "| benchmark | greedy |" in r.stdout and "| long_addition |" in r.stdout
  report = json.loads((tmp_path / "cli" / eval_command.REPORT).read_text())
  assert report["source"]["step"] == 2 and list(report["benchmarks"]) == [
    "arithmetic", "long_addition", f"jsonl:{bench}",
  ]  # fmt: skip
  figs = report["benchmarks"]["arithmetic"]["figures"]
  assert figs["greedy"]["value"] == pytest.approx(evals[2]["eval/greedy_accuracy"], abs=1e-12)
  assert figs["pass@4"]["value"] == pytest.approx(evals[2]["eval/pass@4"], abs=1e-12)


@pytest.mark.parametrize(
  "spec, benchmarks, hf_dir",
  [
    ("configs/gsm8k_qwen.py:tiny", "gsm8k", "tests/fixtures/hf/qwen2"),  # An HF directory.
    ("configs/smollm2.py:tiny", "", "tests/fixtures/gguf/tiny_llama.gguf"),  # A GGUF file.
  ],
)
def test_a_workdir_without_checkpoints_scores_config_hf_dir(spec, benchmarks, hf_dir, tmp_path):
  """No checkpoint: the weights of config.hf_dir (the committed random Qwen2 directory on
  the GSM8K fixture records as the "gsm8k" dataset benchmark, through its chat template;
  the tiny GGUF on the config's own word problems), every problem scored."""
  c = config_lib.load(spec)
  c.eval.update(benchmarks=benchmarks, k=2)
  c.progress = False
  out = eval_command.run(c, tmp_path / "empty", log=lambda _: None)
  assert out["source"]["step"] == "hf" and out["source"]["hf_dir"].endswith(hf_dir)
  report = json.loads((tmp_path / "empty" / "eval" / "step_hf" / eval_command.REPORT).read_text())
  (bench,) = report["benchmarks"].values()
  assert bench["problems_scored"] == c.eval_size
  assert all(len(p["samples"]) == 2 for p in bench["problems"])
  assert "<|im_start|>" in bench["problems"][0]["prompt"] or spec.startswith("configs/smollm2")


class _WarmStartDone(Exception):
  pass


def test_episodes_are_scored_as_the_trainer_scores_them(tmp_path):
  """configs/calculator.py (multi-turn episodes with a calculator tool), 1-layer model, 40
  warm-start steps: the eval of checkpoint 0 (k = eval_samples = 2) gives the warm-start
  evaluation's greedy accuracy, format rate (episodes that ended), mean@2 and pass@k, and
  each row's greedy completion is the whole episode the trainer showed for that problem."""
  c = config_lib.load("configs/calculator.py:quick")
  c.update(warmstart_steps=40, warmstart_batch=32, iterations=1, prompts_per_step=4)
  c.update(eval_size=8, eval_samples=2)
  c.update(eval_every=1, checkpoint_every=1, reward_workers=0, progress=False)
  c.tensorboard = False

  def stop_after_checkpoint_0(message):
    # Logged once the warm-start evaluation's line, samples and checkpoint 0 are on disk:
    # all this test reads, so the RL iteration's programs are never compiled.
    if message.startswith("warm-start accuracy"):
      raise _WarmStartDone

  with pytest.raises(_WarmStartDone):
    train.run(c, tmp_path, log=stop_after_checkpoint_0)
  first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
  c.eval.update(k=2, step=0)
  got = eval_command.run(c, tmp_path, log=lambda _: None)["figures"]["calculator"]
  assert got["greedy"]["value"] == pytest.approx(first["eval/greedy_accuracy"], abs=1e-12)
  assert got["format_rate"]["value"] == pytest.approx(first["eval/format_rate"], abs=1e-12)
  assert got["avg@2"]["value"] == pytest.approx(first["eval/mean@2"], abs=1e-12)
  assert got["pass@2"]["value"] == pytest.approx(first["eval/pass@2"], abs=1e-12)
  report = json.loads((tmp_path / "eval" / "step_0" / eval_command.REPORT).read_text())
  rows = report["benchmarks"]["calculator"]["problems"]
  assert len(rows) == 8 and all(len(p["samples"]) == 2 for p in rows)
  # Token for token: the greedy episodes the trainer showed (samples.jsonl, iteration 0).
  shown = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
  shown = [r for r in shown if r["iteration"] == 0]
  assert len(shown) >= 2 and "=" in shown[0]["completion"]  # A tool call's result, in it.
  assert [r["completion"] for r in shown] == [p["greedy"]["completion"] for p in rows[: len(shown)]]
