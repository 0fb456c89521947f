"""Extending grpo_jax from outside the package: a new estimator with its own array
hyperparameter is one file (tests/toy_estimator.py), run in a fresh process so its
registration never reaches the other tests' registries."""

import json

import pytest
import subproc  # tests/ is on sys.path (pytest rootdir conftest).

from grpo_jax.rl import advantages, losses, spec
from grpo_jax.trainer import train


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
  # The run records where its variants came from, and eval in a fresh process imports it.
  (origin,) = out["variants_from"]
  assert origin["module"] == "__main__" and origin["file"].endswith("tests/toy_estimator.py")
  assert origin["variants"] == ["advantage estimator:scaled_grpo", "policy loss:scaled_ppo_clip"]
  assert out["eval"]["returncode"] == 0, out["eval"]["tail"]
  assert "| benchmark | greedy |" in out["eval"]["tail"], out["eval"]["tail"]
  assert out["resume"]["returncode"] == 0, out["resume"]["tail"]
  assert out["resume"]["iterations_done"] == 2
  # The file re-imported under its stem is recorded so; that is provenance, not a change.
  assert out["resume"]["resumed_from_1"], out["resume"]["tail"]  # It says what changed...
  assert not out["resume"]["changes_variants_from"], out["resume"]["tail"]  # ...not this.
  assert out["errors"] == [
    "config.rl.advantage_hyper.adv_scale=-1.0: must be a number in [0, inf] (the advantages' "
    "scale).",
    "config.rl.loss_hyper.loss_scale=-2.0: must be a number in [0, inf] (the loss's scale).",
  ]


def test_undeclared_advantage_hyperparameters_are_named():
  with pytest.raises(
    ValueError,
    match=r"\['tau'\] are declared by no advantage estimator; declared: \['distill_coef'",
  ):
    spec.RLConfig(advantage_hyper={"tau": 1.0})
  assert set(advantages.declared_hyper()) == {  # The shipped estimators' declarations.
    "eps",
    "gamma",
    "lambda_s",
    "lambda_f",
    "std_power",
    "focal_gamma",
    "ibpo_lambda",
    "ibpo_tau",
    "ibpo_is_cap",
    "distill_coef",
    "distill_reward_coef",
    "distill_discount",
  }
  with pytest.raises(
    ValueError,
    match=r"\['cap'\] are declared by no policy loss; declared: \['dual_clip_c', 'eps_high'",
  ):
    spec.RLConfig(loss_hyper={"cap": 1.0})
  assert set(losses.declared_hyper()) == {"eps_low", "eps_high", "dual_clip_c"}


def test_a_section_a_later_release_added_empty_is_no_config_change():
  """A checkpoint's recorded config without rl.loss_hyper resumes as unchanged; a value in
  it, or any other difference, is a change."""
  before = {"rl": {"kl_coef": 0.0}}
  assert train.config_changes(before, {"rl": {"kl_coef": 0.0, "loss_hyper": {}}}) == []
  assert train.config_changes(before, {"rl": {"kl_coef": 0.1, "loss_hyper": {"c": 2.0}}}) == [
    ("rl.kl_coef", 0.0, 0.1),
    ("rl.loss_hyper", "<absent>", {"c": 2.0}),
  ]


def test_a_variant_s_home_is_recorded_and_imported_or_named(tmp_path, monkeypatch):
  """registry.outside_variants lists the variants registered outside the package by module
  and file; import_origins imports a module by its file when its name does not import,
  and a missing one is a one-line error of the eval command naming the variants."""
  from grpo_jax import cli  # noqa: PLC0415
  from grpo_jax.infra import registry  # noqa: PLC0415

  monkeypatch.setattr(registry, "_ALL", [])  # This test's registries only.
  reg = registry.Registry("widget")
  home = tmp_path / "my_widgets.py"
  home.write_text(
    "from grpo_jax.infra import registry\n"
    "REG = registry._ALL[0]\n"
    "@REG.register('spinner')\n"
    "def spinner():\n  return 1\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path / "nowhere"))  # my_widgets is not on the path.
  registry.import_origins([{"module": "_my_widgets_by_file", "file": str(home)}])
  assert "spinner" in reg
  got = registry.outside_variants()
  assert got == [
    {"module": "_my_widgets_by_file", "file": str(home), "variants": ["widget:spinner"]}
  ]

  @reg.register("shipped")
  def shipped():
    return 2

  shipped.__module__ = "grpo_jax.rl.advantages"  # As if the package registered it.
  assert registry.outside_variants() == got
  assert registry.outside_variants(used={"other"}) == []  # Only what a config picks.
  # Registered already (the process that made the run, or a notebook): nothing to import.
  registry.import_origins([{"module": "__main__", "file": None, "variants": ["widget:spinner"]}])
  # A module of the recorded name that does not register the variant: the recorded file.
  (tmp_path / "nowhere").mkdir()
  (tmp_path / "nowhere" / "impostor.py").write_text("X = 1\n")
  gadget = tmp_path / "gadget_home.py"
  gadget.write_text(home.read_text().replace("spinner", "gadget"))
  registry.import_origins(
    [{"module": "impostor", "file": str(gadget), "variants": ["widget:gadget"]}]
  )
  assert "gadget" in reg
  workdir = tmp_path / "run"
  workdir.mkdir()
  gone = {"module": "gone_module", "file": str(tmp_path / "gone.py"), "variants": ["widget:x"]}
  (workdir / "config.json").write_text(json.dumps({"variants_from": [gone]}))
  with pytest.raises(
    cli.UsageError,
    match=r"variants widget:x were registered by module 'gone_module' \(file .*gone.py, not found\): put the registration in an importable module",
  ):
    cli.recorded(cli.Invocation("eval"), str(workdir))
