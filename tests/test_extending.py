"""Extending grpo_jax from outside the package: a new estimator with its own array
hyperparameter is one file (tests/toy_estimator.py), run in a fresh process so its
registration never reaches the other tests' registries."""

import json

import pytest
import subproc  # tests/ is on sys.path (pytest rootdir conftest).

from grpo_jax.rl import advantages, spec


def test_an_estimator_with_a_new_hyperparameter_is_one_file():
  """One RL iteration at adv_scale 1 and at 3 (set on the command line) from the same
  seed: the same rollouts, every advantage times 3; a value out of its declared range is
  a config error naming it."""
  out = json.loads(subproc.run(["tests/toy_estimator.py"]).stdout.splitlines()[-1])
  (one, three), (low1, low3) = out["adv_max"], out["adv_min"]
  assert one > 0 > low1
  assert three == pytest.approx(3 * one, rel=1e-5) and low3 == pytest.approx(3 * low1, rel=1e-5)
  assert out["error"] == (
    "config.rl.advantage_hyper.adv_scale=-1.0: must be a number in [0, inf] (the advantages' "
    "scale)."
  )


def test_undeclared_advantage_hyperparameters_are_named():
  with pytest.raises(ValueError, match=r"\['tau'\] are declared by no estimator; declared: none"):
    spec.RLConfig(advantage_hyper={"tau": 1.0})
  assert advantages.declared_hyper() == {}  # No shipped estimator declares one yet.
