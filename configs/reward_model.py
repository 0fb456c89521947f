"""A Bradley–Terry reward model on arithmetic preference pairs, then GRPO against it.

Commands (from the repo root, after `pip install -e .`), in this order:
  grpo-jax rm-train --config=configs/reward_model.py:tiny --workdir=/tmp/grpo_rm
  grpo-jax --config=configs/reward_model.py:rl --workdir=/tmp/grpo_rm_rl

Variants:
  tiny (default): `rm-train` of a ~0.3M-parameter decoder with a scalar head on
    configs/data/arithmetic_prefs_train.jsonl (4000 pairs: prompt `Q:67+34\\n`, chosen its
    answer `A:101.`, rejected another problem's `A:183.`; experiments/make_preference_pairs.py
    writes them), 600 steps of 32 pairs, held out on arithmetic_prefs_test.jsonl (400
    pairs of test-split problems).
  rl: configs/arithmetic.py:tiny (the same warm start) with its reward replaced by the
    reward model of /tmp/grpo_rm (`config.rewards.rm`, standardized per batch). The task's
    verifier is logged beside it with weight 0 (reward/correct): the reward model never
    sees it, so it says whether the learnt preference carries the true one. Held-out
    evaluation scores with the verifier.

Expected result (measured on a 2-core Intel Xeon, float32, nothing else running):
  tiny: held-out pair accuracy 0.0 -> 0.84 (a zero head ties every pair; ties count as
    wrong) in 28 s.
  rl: the policy games the reward model. Its mean score of the training batches goes
    3.18 -> 3.50 (iterations 1-10 -> 291-300) while their verifier accuracy falls
    0.44 -> 0.18, and held-out greedy accuracy 51.6% -> 25.8%, in 142 s (a negative
    result: an 84%-accurate reward model is not the verifier).
"""

import importlib.util
import pathlib

# The base recipe is configs/arithmetic.py, loaded by path: a config file is loaded by path
# too (--config=...), so its directory is not importable.
_CONFIGS = pathlib.Path(__file__).resolve().parent
_BASE = importlib.util.spec_from_file_location(
  "_grpo_jax_config_arithmetic", _CONFIGS / "arithmetic.py"
)
arithmetic = importlib.util.module_from_spec(_BASE)
_BASE.loader.exec_module(arithmetic)


VARIANTS = ("tiny", "rl")


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/reward_model.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  c = arithmetic.get_config("tiny")
  if arg == "tiny":
    c.reward_model.update(
      train_path=str(_CONFIGS / "data" / "arithmetic_prefs_train.jsonl"),
      eval_path=str(_CONFIGS / "data" / "arithmetic_prefs_test.jsonl"),
      steps=600,
      batch_size=32,
      learning_rate=1e-3,
      max_len=16,
      eval_every=100,
      checkpoint_every=200,
    )
    return c
  c.rewards.rm = dict(
    kind="reward_model", weight=1.0, path="/tmp/grpo_rm", transforms=("standardize",)
  )
  c.rewards.correct = dict(kind="verifier", weight=0.0)
  return c
