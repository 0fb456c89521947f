"""A newcomer's estimator and policy loss, each in this one file: `python
tests/toy_estimator.py` registers them, each with one new array hyperparameter, then
trains with them end to end (test_extending.py runs it).

The estimator is GRPO's advantage times a declared hyperparameter, adv_scale, and the loss
PPO's clipped surrogate times another, loss_scale:

    A_{i,t} = s · (r_i − r̄_g) / (σ_g + eps),   s = config.rl.advantage_hyper.adv_scale,
    ℓ_tok = c · ℓ^ppo_clip_tok,                 c = config.rl.loss_hyper.loss_scale.

Nothing else in the package is edited: the declaration beside each function is what puts
its hyperparameter in the config (its default), validates it, and hands it to the
function as an array (`hyper.adv_scale`, as the shipped variants read theirs). The script runs one RL iteration at s = c = 1,
one at s = 3 and one at c = 3 (set on the command line), and two with a value out of its
range; then, each in a fresh process, `grpo-jax eval --workdir` of the first run (no
--config) and its resume to iteration 2 from the shipped config file: the run's
config.json records that this file registered its variants ("variants_from"), so both
import it and find them. It prints one JSON line.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from grpo_jax import cli
from grpo_jax.infra import config_lib
from grpo_jax.rl import advantages, losses
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parent.parent


@advantages.REGISTRY.register(
  "scaled_grpo", hyper={"adv_scale": advantages.Hyper(1.0, low=0.0, doc="the advantages' scale")}
)
def scaled_grpo(inputs, hyper):
  """A = s · GRPO's A (s: the declared hyperparameter adv_scale)."""
  return hyper.adv_scale * advantages.grpo(inputs, hyper)


@losses.REGISTRY.register(
  "scaled_ppo_clip", hyper={"loss_scale": losses.Hyper(1.0, low=0.0, doc="the loss's scale")}
)
def scaled_ppo_clip(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper):
  """ℓ_tok = c · PPO's ℓ_tok (c: the declared hyperparameter loss_scale)."""
  loss_BT, aux = losses.ppo_clip(logp_BT, old_logp_BT, adv_BT, mask_BT, hyper)
  return hyper.loss_scale * loss_BT, aux


SPEC = str(ROOT / "configs" / "arithmetic.py") + ":quick"
# The toy variants, one step (pg_loss at θ_old), and runs.small_arithmetic's task: it learns
# in ~100 warm-start steps, so a group's rewards differ and the advantages are not all 0.
ARGS = [
  "--config.rl.advantage=scaled_grpo", "--config.rl.policy_loss=scaled_ppo_clip",
  "--config.rl.num_minibatches=1", "--config.rl.ppo_epochs=1", "--config.task.kwargs.max_digits=1",
  "--config.iterations=1", "--config.warmstart_steps=100", "--config.warmstart_batch=16",
  "--config.prompts_per_step=8", "--config.eval_size=8", "--config.eval_samples=0",
  "--config.eval_every=100", "--config.reward_workers=0", "--config.progress=False",
  "--config.sampler.group_size=4",
]  # fmt: skip


def _run(overrides: list[str], workdir: pathlib.Path) -> dict:
  c = cli.parse("train", SPEC, [*ARGS, *overrides]).config
  train.run(c, workdir, log=lambda _: None)
  lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  return next(x for x in lines if "adv_max" in x)


def main():
  out = {}
  with tempfile.TemporaryDirectory() as tmp:
    one = _run([], pathlib.Path(tmp) / "one")
    three = _run(["--config.rl.advantage_hyper.adv_scale=3.0"], pathlib.Path(tmp) / "three")
    loss3 = _run(["--config.rl.loss_hyper.loss_scale=3.0"], pathlib.Path(tmp) / "loss3")
    out["adv_max"] = [one["adv_max"], three["adv_max"], loss3["adv_max"]]
    out["adv_min"] = [one["adv_min"], three["adv_min"], loss3["adv_min"]]
    out["pg_loss"] = [one["pg_loss"], three["pg_loss"], loss3["pg_loss"]]
    out["errors"] = []
    for bad in ("advantage_hyper.adv_scale=-1.0", "loss_hyper.loss_scale=-2.0"):
      try:
        _run([f"--config.rl.{bad}"], pathlib.Path(tmp) / "bad")
      except config_lib.ConfigError as e:
        out["errors"].append(str(e))
    workdir = pathlib.Path(tmp) / "one"
    out["variants_from"] = json.loads((workdir / "config.json").read_text())["variants_from"]
    env = {**os.environ, "PYTHONPATH": ""}  # Nothing of tests/ importable by name.
    cmd = [sys.executable, "-m", "grpo_jax.main", "eval", f"--workdir={workdir}"]
    ran = subprocess.run([*cmd, "--k=0"], capture_output=True, text=True, env=env, cwd=tmp)
    out["eval"] = {"returncode": ran.returncode, "tail": (ran.stdout + ran.stderr)[-1500:]}
    # A resume to iteration 2 from the shipped config file, which registers nothing.
    cmd = [sys.executable, "-m", "grpo_jax.main", f"--config={SPEC}", *ARGS]
    cmd += ["--config.iterations=2", f"--workdir={workdir}"]
    ran = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp)
    done = json.loads((workdir / "summary.json").read_text())["iterations_done"]
    said = ran.stdout + ran.stderr
    out["resume"] = {
      "returncode": ran.returncode,
      "iterations_done": done,
      "tail": said[-1500:],
      "changes_variants_from": "variants_from" in said,
      "resumed_from_1": "resuming from iteration 1" in said,
    }
  print(json.dumps(out))


if __name__ == "__main__":
  sys.exit(main())
