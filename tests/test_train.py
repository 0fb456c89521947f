"""The training loop, end to end on a very small config (the trainer issue's first step)."""

import json
import pathlib
import sys

import pytest

from grpo_jax import train

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "configs"))
import arithmetic  # noqa: E402


def _tiny():
  c = arithmetic.get_config("tiny")
  c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
  c.sampler.group_size = 4
  c.update(prompts_per_step=4, iterations=2, warmstart_steps=2, warmstart_batch=8)
  c.update(eval_every=2, eval_size=8)
  c.rl.num_minibatches = 2
  c.rl.controller = "fade_entropy"
  c.rl.advantage = "fade"
  return c


def test_tiny_run_writes_metrics_and_summary(tmp_path):
  logs = []
  summary = train.run(_tiny(), tmp_path, log=logs.append)
  lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [x["iteration"] for x in lines] == [0, 1, 2]
  assert {"loss", "pg_clipfrac", "pass_rate", "time/sample", "eval/greedy_accuracy"} <= set(
    lines[2]
  )
  saved = json.loads((tmp_path / "summary.json").read_text())
  assert set(saved) >= {"warmstart_accuracy", "final_accuracy", "wall_seconds"}
  assert saved["final_accuracy"] == summary["final_accuracy"] == lines[2]["eval/greedy_accuracy"]
  assert any("warm-start accuracy" in x for x in logs)


@pytest.mark.parametrize(
  "key,value,match",
  [
    ("iterations", 0, "config.iterations must be >= 1"),
    ("learning_rate", -1.0, "learning_rate must be > 0"),
  ],
)
def test_bad_loop_values_fail_before_compiling(key, value, match):
  c = _tiny()
  c[key] = value
  with pytest.raises(ValueError, match=match):
    train.build(c)


def test_unknown_keys_and_unimplemented_options_are_refused():
  c = _tiny()
  c.unlock()
  c.iteratons = 3
  with pytest.raises(ValueError, match="unknown LoopConfig keys \\['iteratons'\\]"):
    train.build(c)
  c = _tiny()
  c.rl.dynamic_sampling = True
  with pytest.raises(ValueError, match="dynamic_sampling"):
    train.build(c)
