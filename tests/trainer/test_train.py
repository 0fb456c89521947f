"""The training loop end to end on a very small config: metrics, checkpoints, exact resume,
preemption, the non-finite guard, reward errors and dynamic sampling."""

import dataclasses
import json
import os
import pathlib
import re
import signal
import sys

import arithmetic
import fault_tasks  # noqa: F401
import jax
import numpy as np
import pytest
import runs
import subproc
import tb_events

from grpo_jax import config
from grpo_jax.infra import checkpoint, logs, metrics
from grpo_jax.models import model
from grpo_jax.rl import guards, preparation
from grpo_jax.trainer import build, rollout, steps, train
from grpo_jax.verifiers import reward_pool, verdicts


def _tiny(**loop):
  c = arithmetic.get_config("quick")
  c.sampler.group_size = 4
  c.update(prompts_per_step=4, iterations=4, warmstart_steps=2, warmstart_batch=8)
  c.update(eval_every=2, eval_size=8, eval_samples=4, checkpoint_every=2, peak_flops=1e11)
  c.update(reward_workers=0, progress=False)
  c.update(**loop)
  c.rl.num_minibatches = 2
  # Token-budget micro-batches of 100 tokens: 5 rows at 16 + 4 columns, 4 at 16 + 8.
  c.rl.update(micro_batch_tokens=100, length_buckets=2)
  c.rl.controller = "fade_entropy"
  c.rl.advantage = "fade"
  return c


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  """One uninterrupted run of _tiny(): (workdir, summary, log lines)."""
  workdir = tmp_path_factory.mktemp("reference")
  out = []
  summary = train.run(_tiny(), workdir, log=out.append)
  return workdir, summary, out


def test_run_writes_metrics_tensorboard_checkpoints_and_summary(reference_run):
  workdir, summary, out = reference_run
  lines = runs.lines(workdir)
  assert [x["iteration"] for x in lines] == [0, 1, 2, 3, 4]
  assert lines[0]["phase"] == "warmstart" and lines[1]["phase"] == "rl"
  expected = {"loss", "pg_clipfrac", "pass_rate", "reward_errors", "nonfinite_steps"}
  expected |= {"time/sample", "time/reward", "time/update", "tokens_per_s", "perf/mfu"}
  assert expected <= set(lines[1])
  assert {
    "eval/greedy_accuracy",
    "eval/pass@1",
    "eval/pass@2",
    "eval/pass@4",
    "eval/mean@4",
  } <= set(lines[2])
  assert "eval/greedy_accuracy" not in lines[1]  # eval_every = 2.
  for line in lines:
    for name in line:
      metrics.definition(name)  # Every logged key is documented.
  # pass@k is non-decreasing in k, and pass@1 is mean@k (both estimate one-sample accuracy).
  assert lines[4]["eval/pass@1"] <= lines[4]["eval/pass@2"] <= lines[4]["eval/pass@4"]
  assert lines[4]["eval/pass@1"] == pytest.approx(lines[4]["eval/mean@4"])
  assert 0 < lines[1]["perf/mfu"] < 1
  # 8-row mini-batches in micro-batches of 4 rows (a row over 4 tokens leads) or 5 (none
  # does): 2 per step, every row holding at least its EOS or first token.
  assert all(x["micro_batches"] == 2 for x in lines[1:]), [x["micro_batches"] for x in lines]
  # The iteration's phases: disjoint, so the host glue (time/host) is what they leave.
  for line in lines[1:]:
    phases = [line[f"time/{k}"] for k in ("sample", "reward", "prepare", "update")]
    assert min(phases) > 0 and line["time/host"] >= 0
    assert sum(phases) + line["time/host"] == pytest.approx(line["time/iteration"])
    assert 0 < line["perf/mfu_sample"] < 1 and 0 < line["perf/mfu_update"] < 1

  saved = json.loads((workdir / "summary.json").read_text())
  assert saved["warmstart_accuracy"] == lines[0]["eval/greedy_accuracy"]
  assert saved["final_accuracy"] == summary["final_accuracy"] == lines[4]["eval/greedy_accuracy"]
  assert saved["wall_seconds"] > 0 and saved["iterations_done"] == 4 and not saved["preempted"]
  assert any("warm-start accuracy" in x for x in out)

  # TensorBoard: the same scalars, as TensorBoard itself reads them.
  tb = tb_events.scalars(workdir / "tb")
  assert tb[(3, "loss")] == pytest.approx(lines[3]["loss"], rel=1e-6)
  assert (0, "eval/greedy_accuracy") in tb

  # Checkpoints at 0 (after the warm start), every 2 iterations; latest 3 kept (+ best).
  ckpt = checkpoint.Checkpointer(workdir / "checkpoints")
  assert ckpt.latest_step() == 4
  assert {2, 4} <= set(ckpt.all_steps())
  ckpt.close()


def test_resume_after_a_crash_reproduces_the_uninterrupted_run(reference_run, tmp_path):
  """Crash after iteration 3 (the last checkpoint is 2), rerun: 3 and 4 come out the same."""
  ref = runs.lines(reference_run[0])

  def crash(it, record):
    if it == 3:
      raise RuntimeError("simulated crash")

  with pytest.raises(RuntimeError, match="simulated crash"):
    train.run(_tiny(), tmp_path, log=lambda _: None, on_iteration=crash)
  assert [x["iteration"] for x in runs.lines(tmp_path)] == [0, 1, 2, 3]
  out = []
  summary = train.run(_tiny(), tmp_path, log=out.append)
  assert any("resumed from" in x and "iteration 2" in x for x in out)
  lines = runs.lines(tmp_path)
  assert [x["iteration"] for x in lines] == [0, 1, 2, 3, 4]  # Line 3 is not duplicated.
  for got, want in zip(lines, ref):
    assert runs.untimed(got) == runs.untimed(want)
  assert summary["final_accuracy"] == reference_run[1]["final_accuracy"]
  # TensorBoard drops the crashed session's iteration 3 (purge_step) when it reads the dir.
  assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 2


def test_sigterm_saves_a_checkpoint_and_the_rerun_finishes_identically(reference_run, tmp_path):
  ref = runs.lines(reference_run[0])

  def preempt(it, record):
    if it == 1:
      os.kill(os.getpid(), signal.SIGTERM)

  previous = signal.getsignal(signal.SIGTERM)
  summary = train.run(_tiny(), tmp_path, log=lambda _: None, on_iteration=preempt)
  assert signal.getsignal(signal.SIGTERM) == previous  # The handler is restored.
  assert summary["preempted"] and summary["iterations_done"] == 1
  ckpt = checkpoint.Checkpointer(tmp_path / "checkpoints")
  assert ckpt.latest_step() == 1  # Not a checkpoint_every multiple: saved for SIGTERM.
  ckpt.close()
  train.run(_tiny(), tmp_path, log=lambda _: None)
  assert [runs.untimed(x) for x in runs.lines(tmp_path)] == [runs.untimed(x) for x in ref]


def test_restoring_into_a_different_model_is_a_clear_error(reference_run, tmp_path):
  c = _tiny()
  c.model.d_model = 48
  with pytest.raises(checkpoint.CheckpointMismatchError, match=r"params/.*in checkpoint \(.*32"):
    train.run(c, reference_run[0], log=lambda _: None)


def test_nonfinite_steps_are_skipped_counted_and_stop_the_run(monkeypatch, tmp_path):
  """A NaN advantage in iterations 2.. makes every step non-finite: iteration 2's steps are
  skipped and counted (params unchanged), and the run stops at max_nonfinite_steps."""
  real_functions = steps.functions
  seen = {}

  def poisoned_functions(setup):
    fns = real_functions(setup)

    def update(state, batch, key, hyper):
      seen["it"] = seen.get("it", 0) + 1
      if seen["it"] >= 2:
        batch = batch.replace(adv_NT=batch.adv_NT * np.nan)
        seen.setdefault("params_before", jax.tree.map(np.asarray, state.params))
      new_state, idx, history = fns.rl.update(state, batch, key, hyper)
      if seen["it"] == 2:
        seen["params_after"] = jax.tree.map(np.asarray, new_state.params)
      return new_state, idx, history

    return dataclasses.replace(fns, rl=dataclasses.replace(fns.rl, update=update))

  monkeypatch.setattr(steps, "functions", poisoned_functions)
  c = _tiny(max_nonfinite_steps=3, checkpoint_every=1)  # Two train steps per iteration.
  with pytest.raises(guards.NonFiniteError, match="3 consecutive train steps"):
    train.run(c, tmp_path, log=lambda _: None)
  lines = runs.lines(tmp_path)
  assert lines[1]["nonfinite_steps"] == 0
  assert lines[2]["nonfinite_steps"] == 2 and lines[2]["nonfinite_total"] == 2
  assert len(lines) == 3  # Iteration 3 raised at its first skipped step.
  for a, b in zip(jax.tree.leaves(seen["params_before"]), jax.tree.leaves(seen["params_after"])):
    np.testing.assert_array_equal(a, b)


def test_reward_exceptions_and_hangs_are_counted_and_training_continues(tmp_path):
  c = _tiny(iterations=1, reward_workers=2, reward_timeout_s=0.3, eval_samples=0, eval_size=4)
  c.task.name = "flaky_arithmetic"
  c.max_unscorable_frac = 1.0  # The 4 greedy eval answers can all be one failing string.
  logged = []
  summary = train.run(c, tmp_path, log=logged.append)
  lines = runs.lines(tmp_path)
  assert [x["iteration"] for x in lines] == [0, 1]
  assert lines[1]["reward_errors"] > lines[1]["reward_timeouts"] > 0  # Raises and hangs.
  # By cause: the pool's timeouts, and the raises (no label); they add up; a warning names them.
  frac = lines[1]["reward/unscorable_frac"]
  assert frac == lines[1]["reward_errors"] / 16
  assert lines[1]["reward/unscorable/timeout"] == lines[1]["reward_timeouts"] / 16
  parts = [v for k, v in lines[1].items() if k.startswith("reward/unscorable/")]
  assert sum(parts) == pytest.approx(frac)
  warned = [x for x in logged if "were unscorable (more than warn_unscorable_frac=0.05)" in x]
  assert len(warned) == 1 and warned[0].startswith("warning: iteration 1: "), logged
  # Unscorable rows are left out of the loss (rl.unscorable="mask"), never trained as 0.
  assert lines[1]["unscorable_frac"] == lines[1]["reward_errors"] / 16
  assert lines[1]["excluded_frac"] >= lines[1]["unscorable_frac"] > 0
  assert lines[1]["eval/reward_errors"] > 0  # Evaluation scores through the pool too.
  assert summary["iterations_done"] == 1


def test_a_verifier_that_fails_on_every_row_stops_the_run(tmp_path):
  c = _tiny(iterations=2, eval_samples=0)
  c.task.name = "broken_arithmetic"
  with pytest.raises(verdicts.RewardFailure, match=r"failed on 8 of 8 items .*KeyError"):
    train.run(c, tmp_path, log=lambda _: None)


def test_dynamic_sampling_keeps_shapes_static_and_counts_what_it_drops(tmp_path):
  c = _tiny(iterations=3, eval_samples=0)
  c.rl.update(dynamic_sampling=True, max_gen_batches=3)
  train.run(c, tmp_path, log=lambda _: None)
  B = c.prompts_per_step
  for x in runs.lines(tmp_path)[1:]:
    gen, dropped = x["dynamic/gen_batches"], x["dynamic/dropped_groups"]
    fill, surplus = x["dynamic/fill_groups"], x["dynamic/surplus_groups"]
    assert 1 <= gen <= 3
    assert gen * B == (B - fill) + dropped + surplus  # Every sampled group is accounted for.
    assert fill == 0 or gen == 3  # Masked fill only once the cap is reached.
    # The zero-variance groups in the trained batch are exactly the masked fill groups.
    assert x["zero_var_groups"] * B == pytest.approx(fill)
  fns = steps.functions(build.build(c))
  assert fns.rl.update._cache_size() == 1  # One compile: the batch shape never changed.
  assert fns.rl.logprobs._cache_size() == 1 and fns.rl.finish._cache_size() == 1


class _OrderPool:
  """A reward pool that records, when scoring starts, whether the forwards were dispatched."""

  def __init__(self, task, calls):
    self.inline, self.calls = reward_pool.RewardPool(task, workers=0), calls

  def score(self, prompts, completions):
    self.calls.append("score")
    return self.inline.score(prompts, completions)


@pytest.mark.parametrize("dynamic", [False, True])
def test_log_prob_forwards_are_dispatched_before_rewards_are_scored(dynamic):
  c = _tiny()
  c.rl.update(dynamic_sampling=dynamic, max_gen_batches=2)
  setup = build.build(c)
  fns = steps.functions(setup)
  calls = []

  def logprobs(*args):
    calls.append("logprobs")
    return fns.rl.logprobs(*args)

  params = model.init(setup.model_cfg, jax.random.key(0))
  got = rollout.collect(
    setup,
    dataclasses.replace(fns, rl=dataclasses.replace(fns.rl, logprobs=logprobs)),
    _OrderPool(setup.task, calls),
    params,
    params,
    index=0,
    key=jax.random.key(1),
  )
  rollouts, lp, correct, fmt = got.rollouts, got.logprobs, got.scores.correct_N, got.scores.format_N
  if dynamic:  # On the assembled batch, after every part is scored: no forward is wasted.
    assert calls[-1] == "logprobs" and calls.count("logprobs") == 1
  else:
    assert calls == ["logprobs", "score"]
  # The dispatched forwards are the ones `preparation.prepare` computes in one function.
  hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  fused, _, _ = preparation.make_prepare(setup.rl_cfg, fns.model_fn)(
    params, params, rollouts, correct, fmt, hyper
  )
  np.testing.assert_allclose(lp.old_logp_NT, fused.old_logp_NT, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
  "key,value,match",
  [
    ("iterations", 0, "config.iterations must be >= 1"),
    ("learning_rate", -1.0, "learning_rate must be > 0"),
    ("reward_timeout_s", 0.0, "reward_timeout_s must be > 0"),
    ("checkpoint_every", 0, "checkpoint_every must be >= 1"),
  ],
)
def test_bad_loop_values_fail_before_compiling(key, value, match):
  c = _tiny()
  c[key] = value
  with pytest.raises(ValueError, match=match):
    build.build(c)


def test_unknown_keys_and_inconsistent_batches_are_refused():
  c = _tiny()
  c.unlock()
  c.iteratons = 3
  with pytest.raises(ValueError, match="unknown LoopConfig keys \\['iteratons'\\]"):
    build.build(c)
  c = _tiny()
  c.rl.num_minibatches = 3  # 16 rows do not split into 3 mini-batches.
  with pytest.raises(ValueError, match="num_minibatches=3 does not divide"):
    build.build(c)


def test_nonfinite_counting():
  assert guards.count_nonfinite([False, True, True], 0, limit=3, where="it 1") == (2, 2)
  assert guards.count_nonfinite([True, False], 1, limit=3, where="it 1") == (1, 0)
  with pytest.raises(guards.NonFiniteError, match=r"3 consecutive.*\(it 7\)"):
    guards.count_nonfinite([True, True], 1, limit=3, where="it 7")


def _cli(*args, cwd):
  import subprocess  # noqa: PLC0415

  return subprocess.run(
    [sys.executable, "-m", "grpo_jax.main", *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    env=subproc.child_env(),
  )


def test_cli_runs_with_overrides_and_rejects_misspelt_keys(tmp_path):
  root = pathlib.Path(__file__).resolve().parents[2]
  bad = _cli(
    "--config=configs/arithmetic.py:tiny",
    "--workdir",
    str(tmp_path),
    "--config.rl.advantge=rloo",
    cwd=root,
  )
  assert bad.returncode != 0 and "advantge" in bad.stderr
  small = [
    "--config.model.d_model=32", "--config.model.n_layers=1", "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1", "--config.model.head_dim=16", "--config.model.mlp_dim=64",
    "--config.prompts_per_step=4", "--config.sampler.group_size=4", "--config.iterations=2",
    "--config.warmstart_steps=2", "--config.eval_every=2", "--config.eval_size=8",
    "--config.eval_samples=0", "--config.reward_workers=0", "--config.peak_flops=1e11",
    "--config.rl.advantage=rloo", "--config.rl.num_minibatches=2",
  ]  # fmt: skip
  ok = _cli("--config=configs/arithmetic.py:tiny", f"--workdir={tmp_path}", *small, cwd=root)
  assert ok.returncode == 0, ok.stderr[-2000:]
  # It says what it runs on and trains before compiling, and ends with the accuracies,
  # their problem count and 95% intervals (issue 58).
  lines = ok.stdout.splitlines()
  assert lines[0].startswith("devices: 1 × cpu (cpu); jax ")
  # One layer: q and o 32·32, k and v 32·16, q/k norms 2·16, two norms 2·32, MLP 3·32·64
  # (9,312); a final norm 32; the tied embedding of the 32-id tokenizer, 32·32.
  assert lines[1] == "parameters: 10,368 (float32), all trained"
  # Arithmetic draws its held-out problems, so the 8 may hold one twice (issue 56).
  setup = build.build(arithmetic.get_config("tiny"))  # The run's task and seed.
  distinct = len({setup.task.problem_key("test", i, seed=setup.loop.seed) for i in range(8)})
  on = "8 problems" + (f" ({distinct} distinct)" if distinct < 8 else "")
  assert re.search(on + r": [\d.]+% \(95% CI [\d.]+-[\d.]+\)", ok.stdout), ok.stdout[-800:]
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert saved["iterations_done"] == 2 and saved["final_problems"] == 8
  assert saved["final_distinct_problems"] == distinct
  evals = [r for r in logs.read_jsonl(tmp_path / "metrics.jsonl") if "eval/greedy_accuracy" in r]
  assert len(evals) == 2 and all(r["eval/problems"] == 8 for r in evals)
  assert all(r["eval/distinct_problems"] == distinct for r in evals)
  for r in evals:
    assert r["eval/greedy_accuracy_low"] <= r["eval/greedy_accuracy"] <= r["eval/greedy_accuracy_high"]  # fmt: skip
  last = evals[-1]
  assert saved["final_accuracy_ci"] == [last["eval/greedy_accuracy_low"], last["eval/greedy_accuracy_high"]]  # fmt: skip
  written = json.loads((tmp_path / "config.json").read_text())
  assert written["rl"]["advantage"] == "rloo" and written["rl"]["num_minibatches"] == 2


def test_resuming_under_a_changed_config_warns_keeps_every_config_or_refuses(
  reference_run, tmp_path
):
  import shutil  # noqa: PLC0415

  workdir = tmp_path / "run"
  shutil.copytree(reference_run[0], workdir)
  refuse = _tiny(iterations=5, learning_rate=0.05, on_config_change="refuse")
  with pytest.raises(config.config_lib.ConfigError, match=r"refusing to resume.*learning_rate"):
    train.run(refuse, workdir, log=lambda _: None)
  # The run's extent may change under "refuse"; the history keeps each session's config.
  out = []
  train.run(_tiny(iterations=5, on_config_change="refuse"), workdir, log=out.append)
  out = []
  train.run(_tiny(iterations=6, learning_rate=0.05), workdir, log=out.append)
  (said,) = [x for x in out if "changed config" in x]
  assert "loop.learning_rate: 0.0001 -> 0.05" in said and "resuming from iteration 5" in said
  history = [json.loads(x) for x in (workdir / "config_history.jsonl").read_text().splitlines()]
  assert [h["from_iteration"] for h in history] == [0, 4, 5]
  assert [h["config"]["loop"]["learning_rate"] for h in history] == [1e-4, 1e-4, 0.05]
  assert json.loads((workdir / "config.json").read_text())["loop"]["learning_rate"] == 0.05


def test_the_summary_gives_accuracies_with_their_problems_and_intervals():
  summary = dict(
    warmstart_accuracy=0.515625, final_accuracy=0.65625, warmstart_accuracy_ci=[0.43, 0.6015625],
    final_accuracy_ci=[0.5703125, 0.7421875], final_problems=128, best_accuracy=0.671875,
    best_iteration=40, iterations_done=50, wall_seconds=61.4, preempted=False, plot="p.svg",
    metrics="m.jsonl", tensorboard="tb",
  )  # fmt: skip
  text = train.describe(summary)
  assert (
    "held-out greedy accuracy on 128 problems: 51.6% (95% CI 43.0-60.2) after warm start -> "
    "65.6% (95% CI 57.0-74.2) (+14.1 points; best 67.2% at iteration 40)."
  ) in text
  repeats = dict(summary, final_distinct_problems=77)  # A drawn split holds repeats.
  assert "accuracy on 128 problems (77 distinct): 51.6%" in train.describe(repeats)
  old = {k: v for k, v in summary.items() if not k.endswith(("_ci", "_problems"))}  # Resumed.
  assert "held-out greedy accuracy: 51.6% after warm start -> 65.6% (+14.1" in train.describe(old)


def test_training_groups_are_shown_with_rewards_advantages_and_verdicts(tmp_path):
  """config.logging.rollouts_every = 1, rollouts_groups = 2: every iteration writes its
  batch's first 2 groups (G = 4 rows each) to samples.jsonl with "kind": "train", beside
  the evaluation's rows, and to TensorBoard's "rollouts" text. GRPO's advantage of a row is
  (r − mean of its group) / (std + eps), so within a group it sums to 0 and orders the
  rows as their rewards do."""
  from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415

  c = _tiny(iterations=2)
  c.rl.update(advantage="grpo", controller="none")
  c.logging.update(rollouts_every=1, rollouts_groups=2)
  train.run(c, tmp_path, log=lambda _: None)
  shown = logs.read_jsonl(tmp_path / logs.SAMPLES)
  rows = [r for r in shown if r.get("kind") == "train"]
  assert [r["iteration"] for r in rows] == [1] * 8 + [2] * 8
  assert [r["group"] for r in rows[:8]] == [0] * 4 + [1] * 4
  assert {r["kind"] for r in shown if r not in rows} == {"eval"}  # The evaluations' rows.
  for r in rows:
    assert r["prompt"].startswith("Q:") and r["verdict"] in ("correct", "partial", "wrong", "wrong format")  # fmt: skip
  for it in (1, 2):
    for g in (0, 1):
      group = [r for r in rows if r["iteration"] == it and r["group"] == g]
      total = [r["reward"] + c.rl.format_weight * r["format_reward"] for r in group]
      assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-5)
      for a, b in zip(group, total):
        for a2, b2 in zip(group, total):
          assert (b > b2) <= (a["advantage"] > a2["advantage"])
  acc = event_accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
  acc.Reload()
  assert {"rollouts/text_summary", "samples/text_summary"} <= set(acc.Tags()["tensors"])
  c.logging.rollouts_groups = 0
  with pytest.raises(ValueError, match=r"config.logging.rollouts_groups=0: must be an int >= 1"):
    train.run(c, tmp_path / "bad", log=lambda _: None)
