"""config.diagnostics: defaults (off), command-line style overrides, validation errors that
name the key, and metric definitions of the diagnostics keys. No training runs here
(tests/experiments/test_diagnostics_experiments.py runs the trainer with diagnostics on)."""

import pathlib

import pytest

from grpo_jax import config, schema
from grpo_jax.infra import config_lib, metrics
from grpo_jax.trainer import build

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs" / "arithmetic.py") + ":tiny"


def test_diagnostics_are_off_by_default_and_settable_like_a_flag():
  assert config.default_config().diagnostics.every == 0
  setup = build.build(config_lib.load(TINY))
  assert not setup.diagnostics.enabled
  assert setup.diagnostics == schema.DiagnosticsConfig()
  c = config_lib.load(TINY)  # Locked, as with --config.diagnostics.every=10.
  c.diagnostics.every = 10
  c.diagnostics.aggregations = ("seq_mean_token_mean", "constant_norm")
  c.diagnostics.rank = True
  got = build.build(c).diagnostics
  assert (got.every, got.aggregations, got.rank) == (
    10,
    ("seq_mean_token_mean", "constant_norm"),
    True,
  )
  with pytest.raises(AttributeError, match="evry"):
    c.diagnostics.evry = 3


@pytest.mark.parametrize(
  "overrides, match",
  [
    (dict(every=-1), "config.diagnostics.every must be >= 0"),
    (dict(probe_prompts=0), "config.diagnostics.probe_prompts must be >= 1"),
    (dict(max_tokens=0), "config.diagnostics.max_tokens must be >= 1"),
    (dict(tau=-0.1), "config.diagnostics.tau must be >= 0"),
    (dict(value_samples=0), "config.diagnostics.value_samples must be >= 1"),
    (dict(credit_batch="next"), r"credit_batch='next'; allowed: \('current', 'fixed'\)"),
    (dict(aggregations=("token_mean", "seq_mean")), "'seq_mean', not a registered aggregation"),
    (dict(evry=3), r"config.diagnostics: unknown DiagnosticsConfig keys \['evry'\]"),
  ],
)
def test_bad_values_name_the_key(overrides, match):
  with pytest.raises(ValueError, match=match):
    schema.DiagnosticsConfig.from_dict({"every": 1, **overrides}, prompts_per_step=8)


def test_run_dependent_checks_apply_only_when_on():
  # The probe is part of one RL batch; off, the check does not apply.
  with pytest.raises(ValueError, match="probe_prompts=9 exceeds prompts_per_step=8"):
    schema.DiagnosticsConfig.from_dict(dict(every=5, probe_prompts=9), prompts_per_step=8)
  assert not schema.DiagnosticsConfig.from_dict(dict(probe_prompts=9), prompts_per_step=8).enabled
  c = config_lib.load(TINY)
  c.diagnostics.update(every=5, rank=True, rank_subset="lm_head")  # Tied embeddings.
  with pytest.raises(ValueError, match="config.diagnostics.rank_subset: .*untied head"):
    build.build(c)
  c.diagnostics.rank_subset = "final_norm"
  assert build.build(c).diagnostics.rank_subset == "final_norm"


def test_every_diagnostics_key_resolves_through_metrics():
  """One table holds every definition; the diagnostics section's roots are the ones the
  trainer's tests filter on."""
  start = list(metrics.DEFINITIONS).index("flip/<pol>/<cat>/boosted")
  roots = {name.split("/")[0] for name in list(metrics.DEFINITIONS)[start:]}
  assert roots == set(metrics.DIAGNOSTICS_ROOTS)
  for name in (
    "flip/pos/template/boosted",
    "cancel/seq_mean_token_mean/top0/id",
    "cancel/band2/residual_ratio",
    "coupling/same_id/p0-0.1/p0.1-0.5/abs_share",
    "rank/update/last_block/mlp/up/kernel/stable_rank",
    "drift/length_slope",
    "value/neg/value_gap",
    "time/diagnostics",
  ):
    assert metrics.definition(name)
  assert "(polarity, category)" in metrics.definition("flip/all/all/count")
  with pytest.raises(KeyError, match="grpo_jax.infra.metrics.DEFINITIONS"):
    metrics.definition("flip/sideways")
  with pytest.raises(KeyError, match="grpo_jax.infra.metrics.DEFINITIONS"):
    metrics.definition("flipped")
