"""On-policy distillation: the `distill` estimator's numbers by hand, its refusals, the
teacher's sources (`models/teacher.py`), and a run that distils, resumes and refuses a
teacher that changed under it."""

import json
import math
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import runs

from grpo_jax import config
from grpo_jax.infra import config_lib
from grpo_jax.models import teacher
from grpo_jax.rl import advantages
from grpo_jax.trainer import build, eval_command, rollout, run_state, steps, train

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "warm_starts" / "arithmetic_tiny"  # A warm-started run.
LORA_RUN = ROOT / "tests" / "fixtures" / "warm_starts" / "arithmetic_tiny_gemma2_lora"
QWEN2 = ROOT / "tests" / "fixtures" / "hf" / "qwen2"


def _hyper(coef=1.0, reward_coef=1.0, discount=0.0):
  extra = {"distill_coef": coef, "distill_reward_coef": reward_coef, "distill_discount": discount}
  return advantages.hyper_values(**extra)


def _inputs(old_BT, teacher_BT, mask_BT, *, rewards=None, groups=None, valid=None):
  B = len(old_BT)
  return advantages.AdvantageInputs(
    rewards_B=jnp.asarray(rewards if rewards is not None else [0.0] * B, jnp.float32),
    group_ids_B=jnp.asarray(groups if groups is not None else [0] * B, jnp.int32),
    mask_BT=jnp.asarray(mask_BT, bool),
    valid_B=None if valid is None else jnp.asarray(valid, bool),
    old_logp_BT=jnp.asarray(old_BT, jnp.float32),
    teacher_logp_BT=jnp.asarray(teacher_BT, jnp.float32),
  )


def _distill(inputs, hyper, **options):
  return np.asarray(advantages.REGISTRY.make("distill", **options)(inputs, hyper))


# Row 0: three tokens then padding; row 1: a masked gap at t = 1 (an observation token).
OLD = [[-1.0, -2.0, -0.5, -9.0], [-1.0, -3.0, 0.0, -1.0]]
TEACHER = [[-0.5, -3.0, -0.5, -1.0], [-2.0, 0.0, -1.0, -0.5]]
MASK = [[1, 1, 1, 0], [1, 0, 1, 1]]


def test_alone_it_is_the_teacher_log_ratio_per_token():
  """γ_T = 0: A_t = λ_T·(log π_T − log π_old) on the mask, 0 elsewhere (λ_T = 2)."""
  got = _distill(_inputs(OLD, TEACHER, MASK), _hyper(coef=2.0))
  np.testing.assert_allclose(got, [[1.0, -2.0, 0.0, 0.0], [-2.0, 0.0, -2.0, 1.0]])


def test_the_discount_sums_later_tokens_and_skips_gaps():
  """γ_T = 0.5. Row 0: d = (0.5, −1, 0): A = (0.5 − 0.5, −1, 0). Row 1: d = (−1, ·, −1, 0.5)
  with a gap: A_3 = 0.5, A_2 = −1 + 0.25 = −0.75, A_0 = −1 + 0.5·(−0.75) = −1.375."""
  got = _distill(_inputs(OLD, TEACHER, MASK), _hyper(discount=0.5))
  np.testing.assert_allclose(got, [[0.0, -1.0, 0.0, 0.0], [-1.375, 0.0, -0.75, 0.5]])


def test_undiscounted_first_token_carries_the_sequence_log_ratio():
  """γ_T = 1: A at a row's first token is log π_T(o) − log π_old(o) of the whole
  completion (the sequence's reverse-KL sample), on random rows and masks."""
  rng = np.random.default_rng(0)
  old, tea = rng.normal(size=(2, 6, 9)) - 2.0
  mask = rng.random((6, 9)) < 0.7
  mask[:, 0] = True
  got = _distill(_inputs(old, tea, mask), _hyper(discount=1.0))
  np.testing.assert_allclose(got[:, 0], ((tea - old) * mask).sum(1), rtol=1e-5)
  assert np.all(got[~mask] == 0.0)


def test_a_base_estimator_is_added_with_its_weight():
  """base grpo, w_r = 0.5: a group of two with rewards 1 and 0 has GRPO advantages ±1/√2
  (ddof 1); A = 0.5·(±1/√2) + (log π_T − log π_old)."""
  inputs = _inputs(OLD, TEACHER, MASK, rewards=[1.0, 0.0])
  got = _distill(inputs, _hyper(reward_coef=0.5), base="grpo")
  a = 0.5 / math.sqrt(2.0)
  want = np.asarray([[0.5 + a, -1.0 + a, 0.0 + a, 0.0], [-1.0 - a, 0.0, -1.0 - a, 0.5 - a]])
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_rows_left_out_get_nothing():
  got = _distill(_inputs(OLD, TEACHER, MASK, valid=[True, False]), _hyper())
  assert np.all(got[1] == 0.0) and got[0, 0] == 0.5


def test_metrics_are_the_reverse_kl_and_the_teachers_log_prob():
  """Over the 6 trained tokens: Σ(old − teacher) = (−0.5 + 1 + 0) + (1 + 1 − 0.5) = 2, so
  reverse_kl = 1/3; Σ teacher = −4 − 3.5 = −7.5, so teacher_logp = −1.25."""
  m = advantages.distill_stats(_inputs(OLD, TEACHER, MASK), _hyper())
  assert float(m["distill/reverse_kl"]) == pytest.approx(1 / 3)
  assert float(m["distill/teacher_logp"]) == pytest.approx(-1.25)


@pytest.mark.parametrize(
  "options, match",
  [
    ({"base": "ibpo"}, r"base='ibpo': must be 'none' .* an estimator that reads only rewards"),
    ({"base": "fade"}, r"base='fade'"),  # Reads the verifier's outcome.
    ({"base": "distill"}, r"base='distill'"),
    ({"base": "reinforce_pp"}, r"base='reinforce_pp'"),  # Folds the KL per token itself.
    ({"base": "nope"}, r"grpo"),  # The allowed names are listed.
    ({"base_options": {"unbiased_std": False}}, r"base_options=.* base is 'none'"),
  ],
)
def test_a_base_that_reads_more_than_rewards_is_refused(options, match):
  with pytest.raises(ValueError, match=match):
    advantages.REGISTRY.make("distill", **options)


def test_the_hyperparameters_are_declared_config_keys():
  c = config.default_config()
  own = {k: c.rl.advantage_hyper[k] for k in advantages.REGISTRY.traits("distill").hyper}
  assert own == {"distill_coef": 1.0, "distill_reward_coef": 1.0, "distill_discount": 0.0}
  with pytest.raises(ValueError, match=r"distill_discount=2.0: must be a number in \[0, 1\]"):
    advantages.declared_values({"distill_discount": 2.0})
  # At group size 1 the teacher's term trains alone or beside a batch-level base; a group
  # base there adds only zeros (its own baseline), so that mix is refused at build.
  assert advantages.works_without_groups("distill", {})
  assert advantages.works_without_groups("distill", {"base": "batch_mean"})
  assert advantages.works_without_groups("distill", {"base": "batch_mean_std", "base_options": {}})
  assert not advantages.works_without_groups("distill", {"base": "grpo"})
  assert (
    "distill(base='none' or a base that works at group size 1)" in advantages.batch_level_names()
  )


# ----------------------------------------------------------------------------
# The teacher: its sources and the checks at the config's edge.
# ----------------------------------------------------------------------------


def _student(**teacher_keys):
  """configs/arithmetic.py:quick as a distillation student of the committed warm start."""
  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":quick")
  c.rl.advantage = "distill"
  c.teacher.path = str(FIXTURE)
  for k, v in teacher_keys.items():
    c.teacher[k] = v
  return c


@pytest.mark.parametrize(
  "change, match",
  [
    (
      dict(teacher_path=""),
      r"rl.advantage='distill' reads a teacher's log-probs: set config.teacher.path",
    ),
    (
      dict(advantage="grpo"),
      r"config.teacher.path=.* rl.advantage='grpo' reads no teacher: .*distill",
    ),
    (dict(teacher_path="/nowhere"), r"config.teacher.path='/nowhere' is not a teacher: expected"),
    (dict(teacher_path=str(QWEN2)), r"reads text with another tokenizer .* than the student's"),
    (dict(teacher_path=str(LORA_RUN)), r"is a run with adapters .* Export it"),
    (dict(step=7), r"config.teacher.step=7: .*checkpoints has \[0\]"),
    (dict(dtype="float16"), r"config.teacher.dtype must be one of"),
    (dict(kl_in="reward"), r"with base 'none' reads no reward, so rl.kl_in='reward' would drop"),
  ],
)
def test_a_teacher_that_cannot_serve_is_refused_in_one_line(change, match):
  c = _student()
  if "teacher_path" in change:
    c.teacher.path = change["teacher_path"]
  if "advantage" in change:
    c.rl.advantage = change["advantage"]
  for k in ("step", "dtype"):
    if k in change:
      c.teacher[k] = change[k]
  if "kl_in" in change:
    c.rl.update(kl_in=change["kl_in"], kl_coef=0.01)
  with pytest.raises(config_lib.ConfigError, match=match) as e:
    build.build(c)
  assert "\n" not in str(e.value)


def test_a_workdir_teacher_is_its_checkpoints_policy():
  """The partial restore reads exactly the params a whole restore of the run gives, in the
  requested dtype; the fingerprint is of those params."""
  setup = build.build(_student())
  src = setup.teacher_source
  assert (src.kind, src.step, src.model_cfg.n_layers) == ("workdir", 0, 3)
  fns = steps.functions(setup)
  got = teacher.load_params(src, shardings=fns.teacher_shardings)
  recorded = config.from_recorded(json.loads((FIXTURE / "config.json").read_text()))
  own = build.build(recorded)
  whole = run_state.read_checkpoint(own, steps.functions(own), FIXTURE).train.params
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), got, whole))
  half = build.build(_student(dtype="bfloat16")).teacher_source
  assert half.model_cfg.param_dtype == "bfloat16"
  low = teacher.load_params(half, shardings=fns.teacher_shardings)
  assert {x.dtype for x in jax.tree.leaves(low)} == {jnp.dtype(jnp.bfloat16)}


def test_a_hf_teacher_that_is_the_students_checkpoint_agrees_token_for_token():
  """Student and teacher both the committed Qwen2 directory: the teacher's log-probs of the
  student's samples equal π_old's, so the reverse KL is 0 (and the dense advantage too)."""
  c = config_lib.load(str(ROOT / "configs" / "gsm8k_qwen.py") + ":tiny")
  c.rl.advantage = "distill"
  c.teacher.path = str(QWEN2)
  setup = build.build(c)
  assert setup.teacher_source.kind == "hf"
  fns = steps.functions(setup)
  params = run_state.initial_params(setup, fns, jax.random.key(0))
  tparams = teacher.load_params(setup.teacher_source, shardings=fns.teacher_shardings)
  drawn = rollout.draw(setup, fns, 0)
  rolls = fns.samplers.train(params, drawn.prompts, jax.random.key(1), setup.sampling_hyper)
  ref = params if setup.rl_cfg.use_ref else None
  lp = steps.with_teacher(fns, tparams).rl.logprobs(params, ref, rolls)
  mask = np.asarray(rolls.mask_NT)
  assert mask.sum() > 0
  np.testing.assert_allclose(np.asarray(lp.teacher_logp_NT), np.asarray(lp.old_logp_NT), atol=2e-5)
  assert np.all(np.asarray(lp.teacher_logp_NT)[~mask] == 0.0)


def test_a_resume_keeps_the_teacher_step_it_recorded(tmp_path):
  """teacher.step -1 names the newest checkpoint when the run starts; a resume reads the
  step recorded in teacher.json (a teacher run that went on training does not switch the
  teacher), and one whose recorded checkpoint is gone is refused."""
  work = tmp_path / "teacher"
  shutil.copytree(FIXTURE, work)
  src = teacher.Source("workdir", str(work), None, None, step=7)  # "Newest" today.
  cfg = teacher.TeacherConfig(path=str(work))
  (tmp_path / teacher.RECORD).write_text(json.dumps({"kind": "workdir", "step": 0}))
  assert teacher.recorded_step(src, tmp_path, cfg, resumed=True).step == 0
  assert teacher.recorded_step(src, tmp_path, cfg, resumed=False).step == 7
  pinned = teacher.TeacherConfig(path=str(work), step=7)
  assert teacher.recorded_step(src, tmp_path, pinned, resumed=True).step == 7
  (tmp_path / teacher.RECORD).write_text(json.dumps({"kind": "workdir", "step": 3}))
  with pytest.raises(teacher.TeacherError, match=r"checkpoint 3 that this run recorded .* is gone"):
    teacher.recorded_step(src, tmp_path, cfg, resumed=True)


def test_a_changed_teacher_is_refused_on_resume(tmp_path):
  now = {"kind": "hf", "path": "/t", "step": None, "fingerprint": "aa"}
  teacher.check_identity(tmp_path, now, resumed=False)
  teacher.check_identity(tmp_path, now, resumed=True)  # The same: fine.
  with pytest.raises(teacher.TeacherError, match="the teacher changed under this run: .* aa"):
    teacher.check_identity(tmp_path, {**now, "fingerprint": "bb"}, resumed=True)


def test_a_run_distils_resumes_and_records_its_teacher(tmp_path):
  """A random 1-layer student of the warm-started 3-layer teacher: the reverse KL on its
  own samples falls over 30 iterations (6.7 nats to about 4.9 at lr 1e-2), with a resume at
  iteration 15 that reads the same teacher again; a teacher.json of another teacher makes
  the resume refuse."""
  shutil.copytree(FIXTURE, tmp_path / "teacher")
  c = _student()
  c.teacher.path = str(tmp_path / "teacher")
  c.update(warmstart_steps=0, eval_every=15, eval_size=16, eval_samples=0, learning_rate=1e-2)
  c.update(checkpoint_every=15, iterations=15, progress=False)
  logs = []
  train.run(c, tmp_path, log=logs.append)
  recorded = json.loads((tmp_path / teacher.RECORD).read_text())
  assert recorded["kind"] == "workdir" and recorded["step"] == 0
  assert json.loads((tmp_path / "config.json").read_text())["teacher"]["path"] == c.teacher.path
  c.iterations = 30
  train.run(c, tmp_path, log=logs.append)
  assert sum(line.startswith("teacher: workdir") for line in logs) == 2
  records = runs.lines(tmp_path)
  kl = [r["distill/reverse_kl"] for r in records if "distill/reverse_kl" in r]
  assert len(kl) == 30 and all(math.isfinite(x) for x in kl)
  assert np.mean(kl[-5:]) < 0.9 * np.mean(kl[:5])
  other = tmp_path / "other"
  shutil.copytree(tmp_path, other, ignore=shutil.ignore_patterns("other", "teacher"))
  (other / teacher.RECORD).write_text(json.dumps({**recorded, "fingerprint": "0" * 16}))
  c.iterations = 31
  with pytest.raises(teacher.TeacherError, match="the teacher changed under this run"):
    train.run(c, other, log=logs.append)
  # `grpo-jax eval` of the student needs no teacher: it evaluates with the teacher gone.
  shutil.rmtree(tmp_path / "teacher")
  recorded = config.from_recorded(json.loads((tmp_path / "config.json").read_text()))
  recorded.eval.size, recorded.eval.k = 8, 1
  report = eval_command.run(recorded, tmp_path, log=lambda _: None)
  assert report["source"]["step"] == 30
