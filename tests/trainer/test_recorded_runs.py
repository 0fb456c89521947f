"""Runs recorded by an earlier release keep working: the hyperparameters that moved into
their variants' declarations (`config_lib.MOVED_KEYS`) are read at their new place from a
config file, the command line and a recorded config.json, and a checkpoint written with
the old pytree resumes with the values it saved.

The fixture tests/fixtures/recorded_runs/v0_2_fade is a real run of grpo_jax 0.2.0,
committed before the move (its RECORDED.txt has the command): fade with the fade_entropy
controller, rl.std_power=0.4, rl.eps_high=0.28, rl.lambda_s=0.8, one iteration; the
controller moved lambda_s to 1.0 and focal_gamma 0.0 -> 1.0 in its checkpoint.
"""

import dataclasses
import json
import pathlib
import shutil
import subprocess
import sys
import warnings

import jax
import pytest
import subproc
import tomllib

from grpo_jax import cli, config
from grpo_jax.infra import config_lib
from grpo_jax.trainer import build, run_state, steps

ROOT = pathlib.Path(__file__).resolve().parents[2]
RECORDED = ROOT / "tests" / "fixtures" / "recorded_runs" / "v0_2_fade"
SPEC = str(ROOT / "configs" / "arithmetic.py") + ":quick"
# The recording's command line less --workdir, with its 0.2 keys.
OLD_FLAGS = [
  "--config.checkpoint_every=1", "--config.warmstart_steps=2", "--config.prompts_per_step=4",
  "--config.sampler.group_size=4", "--config.eval_every=1", "--config.eval_size=8",
  "--config.eval_samples=0", "--config.rl.advantage=fade", "--config.rl.controller=fade_entropy",
  "--config.rl.std_power=0.4", "--config.rl.eps_high=0.28", "--config.rl.lambda_s=0.8",
]  # fmt: skip


def _copy(tmp_path) -> pathlib.Path:
  workdir = tmp_path / "run"
  shutil.copytree(RECORDED, workdir)
  return workdir


def test_upgrade_moves_each_old_key_with_a_warning_naming_the_new_one():
  """rl.std_power -> rl.advantage_hyper.std_power (and so on for every MOVED_KEYS entry):
  the value moves, the old key goes, one FutureWarning each; silent for a recorded run;
  an old key's value replaces the new key's default."""
  d = {"rl": {"std_power": 0.4, "eps_high": 0.28, "advantage_hyper": {"std_power": 0.5}}}
  with pytest.warns(FutureWarning) as caught:
    out = config_lib.upgrade(d)
  assert out == {
    "rl": {"advantage_hyper": {"std_power": 0.4}, "loss_hyper": {"eps_high": 0.28}},
  }
  assert [str(w.message) for w in caught] == [
    config_lib.moved_message("rl.std_power"),
    config_lib.moved_message("rl.eps_high"),
  ]
  assert "use config.rl.loss_hyper.eps_high" in config_lib.moved_message("rl.eps_high")
  assert d["rl"]["std_power"] == 0.4  # The input is not changed.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert config_lib.upgrade(d, warn=False) == out
    assert config_lib.upgrade(out) == out  # Nothing to move: no warning.
  section = config_lib.upgrade({"gamma": 0.9}, warn=False, prefix="rl.")
  assert section == {"advantage_hyper": {"gamma": 0.9}}


def test_every_moved_key_names_a_declared_hyperparameter():
  """Each new key is a declaration of the registry its section belongs to, with the old
  RLConfig field's default; no old key is an RLConfig field any more."""
  from grpo_jax.rl import advantages, importance, losses, masks, spec  # noqa: PLC0415

  fields = {f.name for f in dataclasses.fields(spec.RLConfig)}
  declared = {
    "advantage_hyper": advantages.declared_hyper(),
    "loss_hyper": losses.declared_hyper(),
    "mask_hyper": masks.declared_hyper(),
    "importance_hyper": importance.declared_hyper(),
  }
  for old, new in config_lib.MOVED_KEYS.items():
    _, section, name = new.split(".")
    assert name in declared[section], new
    assert old.removeprefix("rl.") not in fields, old
  assert declared["advantage_hyper"]["eps"].default == 1e-6
  assert declared["advantage_hyper"]["std_power"].default == 0.5
  assert declared["loss_hyper"]["eps_high"].default == 0.2
  assert declared["mask_hyper"]["top_k"].default == 1
  assert declared["importance_hyper"]["is_upper"].default == 2.0


def test_the_old_keys_go_when_their_release_comes():
  """MOVED_KEYS and hyper.extra are kept until 0.3: this fails once pyproject's version
  reaches it, until the table, its callers and `declared.Values.extra` are deleted."""
  version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
  release = tuple(int(x) for x in version.split(".")[:2])
  assert config_lib.MOVED_KEYS_REMOVED_IN == (0, 3)
  assert release < config_lib.MOVED_KEYS_REMOVED_IN, (
    f"grpo_jax {version}: remove config_lib.MOVED_KEYS (and upgrade, its callers in build, "
    "config.from_recorded, train._record_config and cli._moved), declared.Values.extra "
    "and this test."
  )


def test_a_config_from_before_the_expert_axis_gets_the_renewed_rules_it_splits_as():
  """config.json written before mesh.expert existed (as the recording's) holds the old
  default rows 'expert': 'tensor' and 'activation_batch': ['data', 'fsdp']: `upgrade`
  gives it today's, which split alike where the expert axis has size 1, so a resume
  reports no change there. A row the run set itself, or a config that has mesh.expert,
  keeps its own; a list equals the tuple it was before JSON."""
  old = json.loads((RECORDED / "config.json").read_text())
  assert "expert" not in old["mesh"] and old["mesh"]["rules"]["expert"] == "tensor"
  rules = config_lib.upgrade(old, warn=False)["mesh"]["rules"]
  assert rules["expert"] == ("expert", "tensor")
  assert rules["activation_batch"] == ["data", "fsdp", "expert"]
  now = json.loads(json.dumps(config.default_config().to_dict()))["mesh"]["rules"]
  assert config.changes(rules, now) == []
  own = {"mesh": {"rules": {"expert": None, "activation_batch": ["data"]}}}
  assert config_lib.upgrade(own, warn=False) == own
  today = {"mesh": {"expert": 1, "rules": {"expert": "tensor"}}}
  assert config_lib.upgrade(today, warn=False) == today
  assert config.changes({"a": [1, 2]}, {"a": (1, 2)}) == []
  assert config.changes({"a": [1, 2]}, {"a": (1, 3)}) == [("a", [1, 2], (1, 3))]


def test_a_config_file_and_the_command_line_with_old_keys_build_the_same_run(tmp_path):
  """An old key set in a config file (an unlocked ConfigDict) and one given on the command
  line both reach the variant: the command line prints one warning line per key."""
  path = tmp_path / "old.py"
  path.write_text(
    "from grpo_jax import config\n\n\ndef get_config():\n"
    "  c = config.default_config()\n  c.rl.advantage = 'fade'\n  c.rl.std_power = 0.4\n"
    "  c.rl.eps_high = 0.28\n  c.sampler.group_size = 4\n  return c\n"
  )
  with pytest.warns(FutureWarning, match=r"config.rl.std_power is deprecated"):
    setup = build.build(config_lib.load(str(path)))
  assert setup.rl_cfg.advantage_values["std_power"] == 0.4
  assert setup.rl_cfg.loss_values["eps_high"] == 0.28
  assert build.as_dict(setup)["rl"]["advantage_hyper"]["std_power"] == 0.4  # config.json.
  inv = cli.configured("train", config_lib.load(SPEC), SPEC, ["--config.rl.std_power=0.3"])
  assert inv.config.rl.advantage_hyper.std_power == 0.3
  assert inv.overrides == ("rl.advantage_hyper.std_power",)


def test_a_recorded_config_json_rebuilds_with_its_values():
  """config.from_recorded reads 0.2's config.json (eval without --config): the moved
  values at their new place, the rest at today's defaults."""
  recorded = json.loads((RECORDED / "config.json").read_text())
  assert recorded["rl"]["std_power"] == 0.4  # Written by 0.2.0.
  with warnings.catch_warnings():
    warnings.simplefilter("error", FutureWarning)  # A recorded run is read silently.
    c = config.from_recorded(recorded)
  assert c.rl.advantage_hyper.std_power == 0.4 and c.rl.advantage_hyper.lambda_s == 0.8
  assert c.rl.loss_hyper.eps_high == 0.28 and c.rl.advantage_hyper.eps == 1e-6
  assert "std_power" not in c.rl


def test_the_checkpoint_restores_the_values_it_saved(tmp_path):
  """0.2's prep_hyper/adv/<field> leaves are read at today's paths: std_power 0.4 and the
  controller's lambda_s 1.0 and focal_gamma 1.0 (not the config's 0.8 and 0.0); the
  hyperparameters 0.2 had not (distill's, the reward-folded β) come from the config, and
  adv/kl_coef, which moved out of the estimators' arrays, is left out."""
  recorded = json.loads((RECORDED / "config.json").read_text())
  setup = build.build(config.from_recorded(recorded))
  fns = steps.functions(setup)
  st = run_state.read_checkpoint(setup, fns, _copy(tmp_path))
  adv = jax.tree.map(float, st.prep_hyper.adv)
  assert adv["std_power"] == pytest.approx(0.4) and adv["lambda_s"] == 1.0
  assert adv["focal_gamma"] == 1.0 and adv["lambda_f"] == 1.0
  assert adv["distill_coef"] == 1.0 and "kl_coef" not in adv
  assert float(st.prep_hyper.kl_coef) == 0.0 and st.iteration == 1
  # 0.2 stored top_k as an int32; it comes back in today's float32.
  assert st.prep_hyper.mask["top_k"].dtype == jax.numpy.float32
  assert float(st.prep_hyper.mask["top_k"]) == 1.0
  assert jax.tree.map(float, st.prep_hyper.importance) == {"is_lower": 0.5, "is_upper": 2.0}


def test_the_recorded_run_resumes_in_a_fresh_process_with_its_old_command_line(tmp_path):
  """`grpo-jax` with the recording's own flags (0.2 keys) resumes iteration 1 to 2: one
  warning line per old key, the checkpoint's filled and dropped leaves named, and the
  only config change the one given (loop.iterations 1 -> 2)."""
  workdir = _copy(tmp_path)
  r = subprocess.run(
    [
      sys.executable, "-m", "grpo_jax.main", f"--config={SPEC}", f"--workdir={workdir}",
      "--config.iterations=2", *OLD_FLAGS,
    ],
    capture_output=True, text=True, cwd=ROOT, env=subproc.child_env(), timeout=300,
  )  # fmt: skip
  out = r.stdout + r.stderr
  assert r.returncode == 0, out[-3000:]
  for old in ("rl.std_power", "rl.eps_high", "rl.lambda_s"):
    assert f"grpo-jax: warning: {config_lib.moved_message(old)}" in out
  dropped = ["prep_hyper/adv/kl_coef", "prep_hyper/importance/lower", "prep_hyper/importance/upper"]
  assert f"holds {dropped}, which this version has not: left out" in out
  assert f"resumed from {workdir / 'checkpoints' / '1'} (iteration 1)" in out
  assert "with a changed config: loop.iterations: 1 -> 2\n" in out
  rows = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert max(row.get("iteration", 0) for row in rows) == 2
  now = json.loads((workdir / "config.json").read_text())["rl"]
  assert now["advantage_hyper"]["std_power"] == 0.4 and "std_power" not in now
