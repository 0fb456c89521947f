"""Long rollouts: the chunked prefill's memory (experiments/long_prefill.py)."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))

import long_prefill  # noqa: E402


def test_a_chunked_prefill_compiles_with_fewer_temporaries_than_one_call():
  """XLA:CPU, the tiny model, two 1,024-token prompts: 16 calls of 64 tokens need well
  under half the one call's temporary bytes (its causal blocks' scores are [256, 1023]
  per head, the chunks' at most [64, 1023]); the plan prices both as one call."""
  record = long_prefill.main(["--quick"])
  one, chunked = record["cpu"]["rows"]
  assert (one["calls"], chunked["calls"]) == (1, 16)
  assert chunked["xla_temp_bytes"] < 0.5 * one["xla_temp_bytes"], record["cpu"]
  assert chunked["plan_bytes"] == one["plan_bytes"] >= one["xla_temp_bytes"]
  assert record["verdict"] == "supports"


def test_the_committed_prefill_record_carries_its_rule_and_its_verdict_from_its_rows():
  record = json.loads((ROOT / "experiments/results/long_rollouts/prefill.json").read_text())
  assert record["rule"] == long_prefill.RULE
  assert record["verdict"] == long_prefill.verdict(record)
  assert {"cpu", "tpu"} <= set(record) and record["tpu"]["rows"][0]["prompt_tokens"] == 16384


def test_the_committed_long_iteration_ran_every_row_to_the_limit_and_its_ratios_are_its_bytes():
  """experiments/long_iteration.py at 8,192 new tokens (14 minutes here: not in CI)."""
  import long_iteration  # noqa: PLC0415

  r = json.loads((ROOT / "experiments/results/long_rollouts/iteration_8192.json").read_text())
  assert r["new_tokens"] == 8192 and r["finished"] and r["pad_frac"]["pad/sample_frac"] == 0.0
  plan, xla = r["plan_bytes"], r["xla_bytes"]
  assert r["plan_over_xla"]["train_step"] == round(plan["train_step"] / xla["train_step_temp"], 3)
  assert r["plan_over_xla"]["sampler"] == round(plan["kv_cache"] / xla["sample_temp"], 3)
  assert r["claim"] == long_iteration.CLAIM and r["seeds"] == long_iteration.SEEDS
  assert r["verdict"] == long_iteration.verdict(r) == "contradicts"  # 0.73: the plan is short.
  c = long_iteration.config(8192)
  assert (c.sampler.max_new_tokens, c.model.remat, c.rl.micro_batches) == (8192, "full", 8)
