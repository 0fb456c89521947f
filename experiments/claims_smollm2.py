"""Claims 1s and 2s: token flipping (claim 1) and the per-pair coupling kernel (claim 2b) on
a real pretrained model, SmolLM2-135M-Instruct, measured at one GRPO update per seed
(experiments/smollm2_update.py) with claims 1 and 2b's own analyses. claims.py holds
their rules and re-exports every name here as claims.<name>."""

from __future__ import annotations

from claims_base import _measured
from claims_diagnostics import GRPO, analyse_coupling_kernel, analyse_flips
from evidence import Outcome

BASE_CONFIG = "configs/smollm2.py:cpu"


def measure_smollm2_update(*, seeds, root, quick) -> list[dict]:
  """smollm2_update.measure per seed (8 prompts × G = 8; quick: the tiny GGUF, 4 × 4),
  cached."""
  return _measured("smollm2_update", "smollm2-update", seeds=seeds, root=root, quick=quick, full={})


def _as_runs(per_seed: list[dict]) -> dict:
  """The measurements as the GRPO arm's runs, which claims 1 and 2b's analyses read: one
  list of metrics records (the update's) per seed."""
  return {GRPO.name: [r["records"] for r in per_seed]}


def analyse_flips_smollm2(per_seed: list[dict]) -> Outcome:
  return analyse_flips(_as_runs(per_seed))


def analyse_coupling_kernel_smollm2(per_seed: list[dict]) -> Outcome:
  return analyse_coupling_kernel(_as_runs(per_seed))
