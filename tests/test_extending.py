"""Extending grpo_jax from outside the package: a new estimator with its own array
hyperparameter is one file (tests/toy_estimator.py), run in a fresh process so its
registration never reaches the other tests' registries."""

import json

import pytest
import subproc  # tests/ is on sys.path (pytest rootdir conftest).

from grpo_jax import train
from grpo_jax.rl import advantages, losses, spec


def test_an_estimator_and_a_loss_with_new_hyperparameters_are_one_file():
  """One RL iteration (one train step) at adv_scale = loss_scale = 1, at adv_scale 3 and
  at loss_scale 3 (set on the command line) from the same seed: the same rollouts; every
  advantage times 3 in the second, the same advantages in the third, and the policy loss
  at θ_old times 3 in both; a value out of its declared range is a config error naming it."""
  out = json.loads(subproc.run(["tests/toy_estimator.py"]).stdout.splitlines()[-1])
  (one, three, same), (low1, low3, low_same) = out["adv_max"], out["adv_min"]
  assert one > 0 > low1
  assert three == pytest.approx(3 * one, rel=1e-5) and low3 == pytest.approx(3 * low1, rel=1e-5)
  assert (same, low_same) == (one, low1)
  pg1, pg_adv3, pg_loss3 = out["pg_loss"]
  assert pg1 != 0
  assert pg_adv3 == pytest.approx(3 * pg1, rel=1e-4) and pg_loss3 == pytest.approx(
    3 * pg1, rel=1e-5
  )
  assert out["errors"] == [
    "config.rl.advantage_hyper.adv_scale=-1.0: must be a number in [0, inf] (the advantages' "
    "scale).",
    "config.rl.loss_hyper.loss_scale=-2.0: must be a number in [0, inf] (the loss's scale).",
  ]


def test_undeclared_advantage_hyperparameters_are_named():
  with pytest.raises(
    ValueError, match=r"\['tau'\] are declared by no advantage estimator; declared: none"
  ):
    spec.RLConfig(advantage_hyper={"tau": 1.0})
  assert advantages.declared_hyper() == {}  # No shipped estimator declares one yet.
  with pytest.raises(ValueError, match=r"\['cap'\] are declared by no policy loss; declared: none"):
    spec.RLConfig(loss_hyper={"cap": 1.0})
  assert losses.declared_hyper() == {}


def test_a_section_a_later_release_added_empty_is_no_config_change():
  """A checkpoint's recorded config without rl.loss_hyper resumes as unchanged; a value in
  it, or any other difference, is a change."""
  before = {"rl": {"kl_coef": 0.0}}
  assert train.config_changes(before, {"rl": {"kl_coef": 0.0, "loss_hyper": {}}}) == []
  assert train.config_changes(before, {"rl": {"kl_coef": 0.1, "loss_hyper": {"c": 2.0}}}) == [
    ("rl.kl_coef", 0.0, 0.1),
    ("rl.loss_hyper", "<absent>", {"c": 2.0}),
  ]
