"""`commands`, the bodies of the grpo-jax commands, called directly (tests/test_cli.py goes
through `main._main`, which turns these errors into one line and an exit status): the
map of user errors to statuses, the commands that refuse to start, hf-check's report
with the import stubbed, and one memory plan that does not fit."""

import json
import pathlib

import pytest
from absl import flags

from grpo_jax import cli, commands, main  # noqa: F401 -- main defines the flags commands read.
from grpo_jax.infra import collapse, config_lib
from grpo_jax.models import hf
from grpo_jax.verifiers import verdicts

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = "--config=configs/arithmetic.py:tiny"


@pytest.fixture
def invoke(monkeypatch):
  """invoke(*args): the Invocation of `grpo-jax *args` from the repo root, flags parsed
  (and reset after the test)."""
  monkeypatch.chdir(ROOT)
  yield lambda *args: cli.parse_flags(["grpo-jax", *args])
  flags.FLAGS.unparse_flags()


def test_user_errors_map_to_statuses_without_shadowing():
  """2: the input; 1: the run stopped. `main._main` takes the first key an error is an
  instance of, so no key may be a subclass of another key with a different status."""
  errors = commands.USER_ERRORS
  assert errors[config_lib.ConfigError] == errors[cli.UsageError] == 2
  assert errors[hf.CheckpointError] == 2
  assert errors[verdicts.RewardFailure] == errors[collapse.CollapseError] == 1
  assert set(errors.values()) == {1, 2}
  for kind in errors:
    assert issubclass(kind, Exception), kind
    for other in errors:
      if kind is not other and issubclass(kind, other):
        assert errors[kind] == errors[other], (kind, other)


@pytest.mark.parametrize(
  ("args", "match"),
  [
    ([TINY], "--workdir is required to train"),
    (["rm-train", TINY], "--workdir is required for rm-train"),
    (["eval"], "--workdir is required to eval"),
    (["hf-check"], "hf-check needs --hf_dir="),
    (["plan", TINY, "--device=tpu-v9"], r"--device=tpu-v9: device 'tpu-v9': name one of \["),
  ],
)
def test_commands_that_cannot_start_are_usage_errors(invoke, args, match):
  """Missing --workdir or --hf_dir, or an unknown --device: a UsageError before any work."""
  with pytest.raises(cli.UsageError, match=match):
    commands.main(invoke(*args))


FIGURES = dict(
  arch="llama", params=1234567, import_seconds=0.125, logits_mean=0.5, logits_std=2.0,
  logits_absmax=7.25, argmax_last=[3], positions=43, tolerance=1e-4,
)  # fmt: skip


def test_hf_check_reports_a_match(invoke, monkeypatch, capsys):
  """hf-check passes its flags to hf.check and prints the figures, the comparison and the JSON it
  returns."""
  asked = []
  monkeypatch.setattr(
    hf,
    "check",
    lambda d, **kw: (
      asked.append((d, kw)) or dict(FIGURES, max_abs_diff=2e-5, greedy_mismatches=0, ok=True)
    ),
  )
  invoke("hf-check", "--hf_dir=/ckpt", "--tolerance=1e-4")
  out = commands.hf_check()
  assert asked == [("/ckpt", dict(tolerance=1e-4, dtype="float32", compare=True))]
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == (
    "llama: 1,234,567 params imported in 0.12 s; logits mean 0.5000, std 2.0000, "
    "max |logit| 7.2500, last-token argmax [3]"
  )
  assert lines[1] == (
    "transformers: max abs logit difference 2e-05 (tolerance 0.0001), greedy ids differing "
    "at 0 of 43 positions: OK"
  )
  assert json.loads(lines[-1]) == out and out["ok"] is True


def test_hf_check_past_the_tolerance_exits_1(invoke, monkeypatch, capsys):
  """A difference past the tolerance prints MISMATCH and exits with status 1."""
  monkeypatch.setattr(
    hf, "check", lambda d, **kw: dict(FIGURES, max_abs_diff=0.002, greedy_mismatches=1, ok=False)
  )
  invoke("hf-check", "--hf_dir=/ckpt")
  with pytest.raises(SystemExit) as e:
    commands.hf_check()
  assert e.value.code == 1
  out = capsys.readouterr().out
  assert "max abs logit difference 0.002 (tolerance 0.0001), greedy ids differing at 1" in out
  assert "of 43 positions: MISMATCH" in out
  assert json.loads(out.splitlines()[-1])["ok"] is False


def test_a_plan_that_does_not_fit_prints_the_changes(invoke, capsys):
  """--device=0.1 (GiB): the tiny config's plan (about 239 MiB) does not fit, the
  changes follow, and the last line is the JSON the call returns, with the device's
  bytes (0.1 * 2^30)."""
  inv = invoke("plan", TINY, "--device=0.1", "--devices=1")
  out = commands.plan(inv.config)
  printed = capsys.readouterr().out
  assert out["fits"] is False and out["device_memory"] == pytest.approx(0.1 * 2**30)
  assert "Change: (the change that lowers the peak most first)\n  - " in printed
  assert json.loads(printed.splitlines()[-1]) == json.loads(json.dumps(out))
  assert out["peak"] > 0.1 * 2**30
