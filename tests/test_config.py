"""The config edge: every bad value fails in `build.build` (before anything compiles or is
written) as a ConfigError that names the key and what is allowed; the command line turns
it into one line on stderr and exit status 2, with no traceback and no workdir."""

import copy
import json
import pathlib
import subprocess
import sys

import pytest
import subproc

from grpo_jax import config
from grpo_jax.infra import config_lib
from grpo_jax.trainer import build

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "arithmetic.py") + ":tiny"
NAN, INF = float("nan"), float("inf")

BAD = [
  # (key, value, what the message must say)
  ("iterations", 0, "config.iterations must be >= 1"),
  ("prompts_per_step", -4, "config.prompts_per_step must be >= 1"),
  ("learning_rate", NAN, "config.learning_rate=nan: must be a finite number"),
  ("learning_rate", INF, "config.learning_rate=inf: must be a finite number"),
  ("learning_rate", 0.0, "config.learning_rate must be > 0"),
  ("weight_decay", NAN, "config.weight_decay=nan"),
  ("grad_clip", -1.0, "config.grad_clip must be >= 0"),
  ("warmstart_lr", INF, "config.warmstart_lr=inf"),
  ("reward_timeout_s", 0.0, "config.reward_timeout_s must be > 0"),
  ("eval_size", 0, "config.eval_size must be >= 1"),
  ("checkpoint_every", 0, "config.checkpoint_every must be >= 1"),
  ("keep_checkpoints", 0, "config.keep_checkpoints must be >= 1"),
  ("max_unscorable_frac", 0.0, r"max_unscorable_frac=0.0: must be in \(0, 1\]"),
  ("on_config_change", "ignore", "on_config_change='ignore'; allowed: 'warn', 'refuse'"),
  ("rl.advantage", "grpoo", "rl.advantage='grpoo' is not a registered advantage estimator"),
  ("rl.planner", "shuffle", "rl.planner='shuffle' is not a registered planner"),
  ("rl.policy_loss", "ppo", "rl.policy_loss='ppo' is not a registered"),
  ("rl.aggregation", "mean", "rl.aggregation='mean' is not a registered"),
  ("rl.kl_estimator", "k4", "rl.kl_estimator='k4' is not a registered"),
  ("rl.kl_in", "advantage", "rl.kl_in='advantage'; allowed"),
  ("rl.truncation", "drop", "rl.truncation='drop'; allowed"),
  (
    "rl.unscorable",
    "ignore",
    "rl.unscorable='ignore'; allowed: \\('mask', 'zero', 'drop_group'\\)",
  ),
  ("rl.advantage_hyper.ibpo_lambda", -0.5, r"ibpo_lambda=-0.5: must be a number in \[0, inf\]"),
  ("rl.mask_hyper.top_k", 0, "rl.mask_hyper.top_k=0: must be an integer >= 1"),
  ("rl.advantage_options", {"scope": "rows"}, "'grpo' has no options \\['scope'\\]"),
  ("rl.loss_hyper.eps_low", NAN, r"rl.loss_hyper.eps_low=nan: must be a number in \[0, inf\]"),
  ("rl.kl_coef", -0.1, "rl.kl_coef must be >= 0"),
  ("rl.kl_coef", INF, "rl.kl_coef=inf"),
  ("rl.num_minibatches", 3, "rl.num_minibatches=3 does not divide the rollout batch of 256"),
  ("rl.micro_batches", 3, "rl.micro_batches=3 does not divide the mini-batch of 256"),
  ("rl.ppo_epochs", 0, "rl.ppo_epochs must be >= 1"),
  ("rl.advantage_hyper.gamma", 1.5, r"advantage_hyper.gamma=1.5: must be a number in \[0, 1\]"),
  ("sampler.group_size", 0, "group_size must be >= 1"),
  ("sampler.group_size", 1, "group_size=1: a group of one is its own baseline"),
  ("sampler.max_new_tokens", 0, "max_new_tokens must be >= 1"),
  (
    "sampler.max_prompt_len",
    4,
    "train prompt 0 has 9 tokens, more than config.sampler.max_prompt_len=4",
  ),
  ("sampler.truncate_prompts", "right", "truncate_prompts='right'; allowed"),
  ("sampling.temperature", 0.0, "temperature must be finite and > 0"),
  ("sampling.temperature", INF, "temperature must be finite and > 0"),
  ("sampling.top_p", 1.5, r"top_p must be in \(0, 1\]"),
  ("sampling.top_k", -1, "top_k must be >= 0"),
  ("model.n_kv_heads", 3, "n_heads \\(4\\) must be a multiple of n_kv_heads \\(3\\)"),
  ("model.head_dim", 23, "head_dim must be even"),
  ("model.rope_theta", NAN, "ModelConfig.rope_theta=nan: must be a finite number"),
  ("model.dtype", "float16", "ModelConfig.dtype='float16'; allowed"),
  ("model.vocab_size", 3, "vocab_size=3 is smaller than the tokenizer's"),
  ("mesh.data", 0, "mesh.data=0; allowed: a positive int, or -1"),
  ("mesh.data", 2, "the fixed sizes multiply to 2, which does not divide the 1 devices"),
  ("task.name", "algebra", "algebra"),
  ("diagnostics.every", -1, "config.diagnostics.every must be >= 0"),
  ("diagnostics.tau", NAN, "config.diagnostics.tau=nan"),
  ("learning_rate", 1e39, "config.learning_rate=1e\\+39 overflows in the parameter dtype float32"),
  ("collapse.action", "exit", "config.collapse.action='exit'; allowed: stop, warn, off"),
  ("collapse.patience", 0, "config.collapse.patience must be >= 1, got 0"),
  ("collapse.expected_correct", NAN, "config.collapse.expected_correct=nan: must be a finite"),
  ("collapse.eval_min_solved", -1, "config.collapse.eval_min_solved must be >= 0"),
  ("collapse.entropy_floor", -0.1, "config.collapse.entropy_floor=-0.1: must be a finite"),
]


def _set(c, key, value):
  *path, last = key.split(".")
  for part in path:
    c = c[part]
  c[last] = value


@pytest.mark.parametrize("key, value, match", BAD, ids=[f"{k}={v}" for k, v, _ in BAD])
def test_every_bad_value_fails_in_build_naming_the_key(key, value, match):
  c = config_lib.load(TINY)
  _set(c, key, value)
  with pytest.raises(config_lib.ConfigError, match=match):
    build.build(c)


@pytest.mark.parametrize(
  "advantage, options, match",
  [
    ("ibpo", {"shrink": -1.0}, "ibpo shrink must be a finite number >= 0"),
    ("ibpo", {"scale": "rank"}, "ibpo scale must be one of std, none"),
    ("optimal_token_baseline", {"scope": "rows"}, "scope must be 'group' or 'batch'"),
  ],
)
def test_bad_estimator_options_fail_in_build(advantage, options, match):
  c = config_lib.load(TINY)
  c.rl.advantage, c.rl.advantage_options = advantage, options
  with pytest.raises(config_lib.ConfigError, match=match):
    build.build(c)


def test_the_unmodified_config_builds():
  """The control for the table above: each row fails because of its one change."""
  assert build.build(config_lib.load(TINY)).loop.iterations == 300


def test_the_defaults_snapshot_is_the_schemas():
  """config.default_config() (no JAX: config_defaults.DEFAULTS) has every key, value and
  type that the dataclasses give (`schema.defaults`): the snapshot is not stale. Checked in
  a fresh process, where only the package's own records are registered."""
  r = subprocess.run(
    [sys.executable, "-m", "grpo_jax.schema", "--check"], cwd=ROOT, capture_output=True, text=True
  )
  assert r.returncode == 0, r.stderr[-2000:]


def test_a_stale_snapshot_is_found_by_key(monkeypatch):
  from grpo_jax import config_defaults, schema  # noqa: PLC0415

  edited = copy.deepcopy(config_defaults.DEFAULTS)
  edited["collapse"]["patience"] = 6
  edited["collapse"]["expected_correct"] = 8  # 8 == 8.0, but an int where it is a float.
  del edited["eval"]["k"]
  monkeypatch.setattr(config_defaults, "DEFAULTS", edited)
  stale = schema.stale_keys()
  assert {"collapse.patience", "collapse.expected_correct", "eval.k"} <= set(stale), stale
  assert "collapse.action" not in stale


def test_a_users_registered_hyperparameter_is_a_config_key(monkeypatch):
  """A record registered in this process (a user's estimator) declares a key the snapshot
  cannot have: default_config adds it, with its default."""
  from grpo_jax.rl import advantages  # noqa: PLC0415

  assert "toy_scale" not in config.default_config().rl.advantage_hyper
  declared = {**advantages.declared_hyper(), "toy_scale": advantages.Hyper(2.5, low=0.0)}
  monkeypatch.setattr(advantages, "declared_hyper", lambda: declared)
  c = config.default_config()
  assert c.rl.advantage_hyper.toy_scale == 2.5
  assert sorted(c.rl.advantage_hyper.keys()) == sorted(declared)


def test_a_default_that_no_literal_writes_is_refused():
  from grpo_jax import schema  # noqa: PLC0415

  c = config.default_config()
  c.rl.kl_coef = float("inf")
  with pytest.raises(ValueError, match=r"config.rl.kl_coef=inf: a default must be finite"):
    schema.snapshot_text(c)


@pytest.mark.parametrize(
  "flag, match",
  [
    ("--config.rl.loss_hyper.eps_low=nan", r"rl.loss_hyper.eps_low=nan: must be a number in"),
    ("--config.sampler.max_prompt_len=4", "train prompt 0 has 9 tokens"),
  ],
)
def test_the_command_line_reports_one_line_and_leaves_no_workdir(tmp_path, flag, match):
  workdir = tmp_path / "run"
  r = subprocess.run(
    [sys.executable, "-m", "grpo_jax.main", f"--config={TINY}", f"--workdir={workdir}", flag],
    capture_output=True,
    text=True,
    cwd=ROOT,
    env=subproc.child_env(),
  )
  assert r.returncode == 2
  lines = [x for x in r.stderr.splitlines() if x.startswith("grpo-jax: error:")]
  assert len(lines) == 1 and __import__("re").search(match, lines[0]), r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert not workdir.exists()


def test_a_value_error_from_another_library_is_a_bug_not_a_config_error(monkeypatch):
  """Only grpo_jax's own validators speak for the user: a ValueError raised elsewhere keeps
  its type and traceback (the command line then shows it as the bug it is)."""
  import numpy as np  # noqa: PLC0415

  from grpo_jax import tasks  # noqa: PLC0415

  monkeypatch.setattr(tasks, "get", lambda *a, **k: np.zeros(-1))
  with pytest.raises(ValueError, match="negative dimensions") as e:
    build.build(config_lib.load(TINY))
  assert not isinstance(e.value, config_lib.ConfigError)


def test_config_json_records_every_section(tmp_path):
  setup = build.build(config_lib.load(TINY))
  d = build.as_dict(setup)
  assert d["task"] == {
    "class": "Arithmetic",
    "name": "arithmetic",
    "kwargs": {"max_digits": 2, "ops": "+"},
  }
  assert d["sampling"]["temperature"] == 1.0 and d["mesh"]["fsdp"] == -1
  assert set(d) == {
    "loop",
    "task",
    "model",
    "sampler",
    "sampling",
    "rl",
    "offpolicy",
    "mesh",
    "diagnostics",
    "counterfactual",
    "env",
    "collapse",
    "logging",
    "eval",
    "rewards",
  }


@pytest.mark.parametrize(
  "name", sorted(p.stem for p in (ROOT / "configs").glob("*.py") if p.stem != "sample_demo")
)
def test_a_recorded_config_builds_the_same_setup(name):
  """config.json (`as_dict`) read back by `from_recorded` (what `grpo-jax eval --workdir`
  runs on) builds a Setup that records the same config.json, for every shipped config's
  tiny variant (eval aside: it is not the run's)."""
  setup = build.build(config_lib.load(str(ROOT / "configs" / f"{name}.py") + ":tiny"))
  recorded = json.loads(json.dumps(build.as_dict(setup), default=str))
  again = json.loads(
    json.dumps(build.as_dict(build.build(config.from_recorded(recorded))), default=str)
  )
  assert {k: v for k, v in again.items() if k != "eval"} == {
    k: v for k, v in recorded.items() if k != "eval"
  }
