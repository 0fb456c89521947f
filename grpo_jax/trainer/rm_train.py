"""`grpo-jax rm-train`: a config's preference pairs -> a trained reward model in a workdir.

    summary = rm_train.rm_train(config_dict, workdir)   # configs/reward_model.py:tiny

The config's reward_model section (`reward_model.RewardModelConfig`) names the JSONL pairs
and the schedule; its task (for the tokenizer) and model (the architecture), or hf_dir,
build the model as a trainer config would. Each step trains on batch_size pairs (epoch e
visits the train pairs in a permutation fixed by (seed, e)); every eval_every steps the
held-out pair accuracy is logged (metrics.jsonl, TensorBoard); every checkpoint_every
steps the state is checkpointed (workdir/checkpoints, the trainer's `checkpoint`), and a
rerun resumes from the newest. workdir/reward_model.json (`reward_model.record`) is what a
run's "reward_model" source reads back (`reward_model.load`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax

from grpo_jax.infra import checkpoint, config_lib, logs
from grpo_jax.models import hf_tokenizer, model
from grpo_jax.rewards import reward_model
from grpo_jax.trainer import build


@dataclasses.dataclass(frozen=True)
class Built:
  """What rm-train builds from a config: the RM's architecture, tokenizer and settings."""

  cfg: reward_model.RewardModelConfig
  model_cfg: model.ModelConfig
  tokenizer: Any
  hf_dir: str


def built(d: dict) -> Built:
  """The config's reward_model section, tokenizer (the task's, or hf_dir's) and model
  (config.model, or hf_dir's architecture) — the same parts a trainer config builds."""
  rm_cfg = config_lib.from_dict(
    reward_model.RewardModelConfig, d.get("reward_model", {}), where="config.reward_model"
  )
  hf_dir = d.get("hf_dir", "")
  if rm_cfg.init == "hf" and not hf_dir:
    raise ValueError("config.reward_model.init='hf' needs config.hf_dir (the checkpoint).")
  if hf_dir:  # The checkpoint's architecture, config.model's runtime keys (dtypes, remat).
    runtime = {k: v for k, v in d["model"].items() if k in ("param_dtype", "dtype", "remat")}
    model_cfg, _ = reward_model.hf_reward_config(hf_dir, **runtime)
    return Built(rm_cfg, model_cfg, hf_tokenizer.load(hf_dir), hf_dir)
  _, tok = build.task_and_tokenizer(d["task"], hf_dir="")
  return Built(rm_cfg, build.model_config_of(d["model"], tok, hf_dir=""), tok, hf_dir)


# ----------------------------------------------------------------------------
# rm-train: pairs -> a trained reward model in workdir.
# ----------------------------------------------------------------------------


def _pairs(
  cfg: reward_model.RewardModelConfig,
) -> tuple[list[reward_model.Pair], list[reward_model.Pair]]:
  if not cfg.train_path:
    raise ValueError("config.reward_model.train_path is empty; rm-train needs preference pairs.")
  pairs = reward_model.read_pairs(cfg.train_path)
  if cfg.eval_path:
    return pairs, reward_model.read_pairs(cfg.eval_path)
  train, held_out = reward_model.split_pairs(pairs, eval_percent=cfg.eval_percent)
  if not train or not held_out:
    raise reward_model.PairsError(
      f"{cfg.train_path}: {len(pairs)} pairs give {len(train)} train and {len(held_out)} "
      f"held-out pairs at eval_percent={cfg.eval_percent}; give eval_path or more pairs."
    )
  return train, held_out


def _initial_params(rm: Built, key) -> dict:
  if rm.cfg.init == "hf":
    return reward_model.from_hf(rm.hf_dir)[1]
  return reward_model.init(rm.model_cfg, key)


def _train_step(rm: Built):
  opt = reward_model.make_optimizer(**reward_model.optimizer_settings(rm.cfg))
  loss_fn = functools.partial(reward_model.pair_loss, cfg=rm.model_cfg, margin=rm.cfg.margin)

  def step(state, tokens_2BT, mask_2BT):
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state["params"], tokens_2BT, mask_2BT)
    updates, opt_state = opt.update(grads, state["opt"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt": opt_state, "step": state["step"] + 1}, metrics

  return jax.jit(step, donate_argnums=0)


@functools.lru_cache(maxsize=4)
def _eval_loss(model_cfg: model.ModelConfig):
  """The jitted held-out loss (margin 0), made once per architecture."""
  return jax.jit(functools.partial(reward_model.pair_loss, cfg=model_cfg, margin=0.0))


def evaluate(params, pairs: Sequence[reward_model.Pair], rm: Built) -> dict:
  """Held-out pair accuracy and mean loss (margin 0) over `pairs`, in batches (read back
  once, after every batch is dispatched)."""
  fn = _eval_loss(rm.model_cfg)
  got = []
  for start in range(0, len(pairs), rm.cfg.batch_size):
    chunk = pairs[start : start + rm.cfg.batch_size]
    tokens, mask = reward_model.pair_rows(chunk, rm.tokenizer, max_len=rm.cfg.max_len)
    value, m = fn(params, tokens, mask)
    got.append((value, m["rm/pair_accuracy"], len(chunk)))
  got = jax.device_get(got)
  n = len(pairs)
  return {
    "rm/eval_pair_accuracy": sum(float(a) * k for _, a, k in got) / n,
    "rm/eval_loss": sum(float(v) * k for v, _, k in got) / n,
  }


def _batch(pairs: Sequence[reward_model.Pair], step: int, rm: Built) -> list[reward_model.Pair]:
  """Step's pairs: epoch e visits the train pairs in a permutation fixed by (seed, e)."""
  B, n = rm.cfg.batch_size, len(pairs)
  out = []
  for k in range(step * B, (step + 1) * B):
    epoch, i = divmod(k, n)
    out.append(pairs[int(_permutation(rm.cfg.seed, epoch, n)[i])])
  return out


@functools.lru_cache(maxsize=4)
def _permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  return np.random.default_rng([seed, epoch]).permutation(n)


def _fit(rm: Built, state, train_pairs, eval_pairs, *, start: int, ckpt, log):
  """Steps start .. steps - 1; returns the held-out metrics at start and at the end. Each
  step's metrics stay on the device until an evaluation or a checkpoint (or the end): then
  they are read back at once and written, one line per step."""
  step_fn = _train_step(rm)
  first = last = evaluate(state["params"], eval_pairs, rm)
  pending = []
  for step in range(start, rm.cfg.steps):
    tokens, mask = reward_model.pair_rows(
      _batch(train_pairs, step, rm), rm.tokenizer, max_len=rm.cfg.max_len
    )
    state, metrics = step_fn(state, tokens, mask)
    pending.append(metrics)
    it, done = step + 1, step + 1 == rm.cfg.steps
    evaluated, saved = it % rm.cfg.eval_every == 0 or done, it % rm.cfg.checkpoint_every == 0
    if not (evaluated or saved):  # `done` is evaluated.
      continue
    first_it = it - len(pending) + 1
    records = [{"iteration": first_it + k, **m} for k, m in enumerate(jax.device_get(pending))]
    pending = []
    if evaluated:
      last = evaluate(state["params"], eval_pairs, rm)
      records[-1].update(last)
    for record in records:
      log.write(record)
    if saved or done:
      ckpt.save(it, state, {"step": it}, accuracy=last["rm/eval_pair_accuracy"])
  return first, last


def rm_train(config_dict, workdir) -> dict:
  """Trains a Bradley–Terry reward model (config.reward_model) and returns its summary:
  held-out pair accuracy where this session started (step resumed_from: 0, or the
  checkpoint it resumed) and at the end, steps, seconds. Rerunning resumes from the newest
  checkpoint in workdir/checkpoints."""
  d = config_lib.to_dict(config_dict)
  rm = built(d)
  train_pairs, eval_pairs = _pairs(rm.cfg)
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  rec = reward_model.record(rm.model_cfg, rm.cfg, task=d["task"], hf_dir=rm.hf_dir)
  (workdir / reward_model.RECORD).write_text(json.dumps(rec, indent=2, default=str))
  (workdir / "config.json").write_text(json.dumps(d, indent=2, sort_keys=True, default=str))
  settings = reward_model.optimizer_settings(rm.cfg)
  key = jax.random.key(rm.cfg.seed)
  like = jax.eval_shape(
    lambda: reward_model.initial_state(reward_model.init(rm.model_cfg, key), settings)
  )
  t0 = time.perf_counter()
  ckpt = checkpoint.Checkpointer(workdir / "checkpoints", keep=2, keep_best=False)
  try:
    restored = ckpt.restore_latest(like=like)
    start = 0 if restored is None else int(restored.tree["step"])
    if restored is None:  # Only a fresh start builds (or reads) the initial params.
      state = reward_model.initial_state(_initial_params(rm, key), settings)
    else:
      state = restored.tree
    log = logs.RunLogger(workdir, resume_from=start if restored else None)
    try:
      first, last = _fit(rm, state, train_pairs, eval_pairs, start=start, ckpt=ckpt, log=log)
    finally:
      log.close()
  finally:
    ckpt.close()
  summary = {
    "train_pairs": len(train_pairs),
    "eval_pairs": len(eval_pairs),
    "start_eval_pair_accuracy": first["rm/eval_pair_accuracy"],
    "final_eval_pair_accuracy": last["rm/eval_pair_accuracy"],
    "steps": rm.cfg.steps,
    "resumed_from": start,
    "seconds": time.perf_counter() - t0,
  }
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
  return summary
