"""Writes the preference pairs configs/reward_model.py trains on (committed under
configs/data/): `reward_model.task_pairs` over the arithmetic task of configs/arithmetic.py
(chosen: the reference answer; rejected: another problem's, with a different answer).

  python experiments/make_preference_pairs.py            # rewrites configs/data/arithmetic_prefs_*.jsonl
"""

from __future__ import annotations

import pathlib

from grpo_jax import tasks
from grpo_jax.rewards import reward_model

OUT = pathlib.Path(__file__).resolve().parent.parent / "configs" / "data"
SIZES = {"train": 4000, "test": 400}


def main():
  task = tasks.get("arithmetic", max_digits=2, ops="+")
  OUT.mkdir(parents=True, exist_ok=True)
  for split, n in SIZES.items():
    pairs = reward_model.task_pairs(task, n, split=split, seed=0)
    reward_model.write_pairs(OUT / f"arithmetic_prefs_{split}.jsonl", pairs)
    print(f"{OUT / f'arithmetic_prefs_{split}.jsonl'}: {len(pairs)} pairs")


if __name__ == "__main__":
  main()
