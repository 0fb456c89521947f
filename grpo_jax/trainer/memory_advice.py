"""What a memory plan (`memory.Plan`) says to a person: the table per device
(`describe`), what each line counts (`explain`), the changes that lower the peak with the
plan each would give (`changes`, `advice`), and the refusal of a config that does not fit
(`check`, `OutOfMemoryPlan`). The plan's arithmetic is `memory`.

  print(memory_advice.describe(plan, device_memory=memory.device_bytes("tpu-v5e")))
"""

from __future__ import annotations

import dataclasses
import math

from grpo_jax.models import model
from grpo_jax.rl import spec
from grpo_jax.trainer import memory


def changes(
  p: memory.Plan,
  model_cfg: model.ModelConfig,
  rl_cfg: spec.RLConfig,
  *,
  more_devices: memory.Plan | None = None,
) -> list[tuple[memory.Plan, str]]:
  """Each change that lowers the peak, with the plan it would give: the terms it moves,
  scaled as the change scales them (a guide: rerun the plan with the change for its own
  figures). `more_devices`: the plan on twice the devices, when the caller made one."""
  out = []
  scaled = lambda keys, f: dataclasses.replace(p, **{k: f(getattr(p, k)) for k in keys})  # noqa: E731
  resident = ("params", "ref_params", "opt_state", "grads")
  if more_devices is not None:
    n = math.prod(more_devices.mesh)
    out.append((more_devices, f"{n} devices (mesh {more_devices.mesh}): each holds less"))
  if p.teacher_params and p.teacher_dtype == "float32":
    out.append((
      scaled(["teacher_params"], lambda n: n // 2),
      "teacher.dtype='bfloat16' halves the teacher's weights (it is never trained)",
    ))  # fmt: skip
  if p.ref_params:
    out.append((
      scaled(["ref_params"], lambda n: 0),
      "rl.kl_coef=0 drops the reference policy (a frozen copy of the params for the KL term)",
    ))  # fmt: skip
  if model_cfg.param_dtype == "float32":
    out.append((
      scaled(resident, lambda n: n // 2),
      "model.param_dtype='bfloat16' halves params, reference, Adam state and gradients (an "
      "update under 2^-8 of a weight is then lost: configs/scale.py keeps float32)",
    ))  # fmt: skip
  if not (model_cfg.remat != "none" and model_cfg.scan_layers):
    out.append((
      dataclasses.replace(p, activations=p.activations_remat),
      "model.remat='full' with model.scan_layers=True: the backward keeps one input a layer",
    ))  # fmt: skip
  if p.micro_batch_rows > 1 and rl_cfg.micro_batch_tokens:
    rows, budget = p.micro_batch_rows, rl_cfg.micro_batch_tokens
    out.append((
      dataclasses.replace(p, activations=p.activations // 2),
      f"rl.micro_batch_tokens={budget // 2} (now {budget}): {rows} -> {rows // 2} "
      "full-length rows per device in a forward and backward",
    ))  # fmt: skip
  elif p.micro_batch_rows > 1:
    rows = p.micro_batch_rows
    out.append((
      dataclasses.replace(p, activations=p.activations // 2, grads=max(p.grads, 2 * p.params)),
      f"rl.micro_batches={2 * rl_cfg.micro_batches} (now {rl_cfg.micro_batches}; or more "
      f"rl.num_minibatches): {rows} -> {rows // 2} rows per device in a forward and backward",
    ))  # fmt: skip
  if p.logprob_forward > max(p.train_step, p.kv_cache) and p.rollout_rows > 1:
    n = 2 * rl_cfg.logprob_batches
    out.append((
      dataclasses.replace(p, logprob_forward=p.logprob_forward // 2),
      f"rl.logprob_batches={n} (now {rl_cfg.logprob_batches}): the π_old and reference "
      f"forwards take {p.rollout_rows} / {n} rows per device at a time",
    ))  # fmt: skip
  out.append((
    scaled(["kv_cache"], lambda n: n // 2),
    "halve prompts_per_step, sampler.group_size or sampler.max_new_tokens: the sampler holds "
    f"{p.sampler_rows or p.rollout_rows} rows per device",
  ))  # fmt: skip
  data, fsdp = p.mesh[:2]
  if data > 1:
    out.append((
      scaled(resident, lambda n: n // data),
      f"mesh.data=1, mesh.fsdp={data * fsdp}: params, gradients and Adam state sharded, not "
      "replicated",
    ))  # fmt: skip
  return [(q, text) for q, text in out if q.peak < p.peak]


def advice(
  p: memory.Plan,
  model_cfg: model.ModelConfig,
  rl_cfg: spec.RLConfig,
  *,
  device_memory: float | None = None,
  more_devices: memory.Plan | None = None,
) -> list[str]:
  """What to change, the change that lowers the peak most first (`changes`), each with the
  peak it would give and, given the device's memory, whether that fits."""
  unit = _unit(p)
  out = []
  for q, text in sorted(changes(p, model_cfg, rl_cfg, more_devices=more_devices), key=_peak):
    verdict = ""
    if device_memory:
      verdict = ", fits" if memory.fits(q, device_memory) else ", still over"
    out.append(f"{text} -> peak {_in(q.peak, unit)} {unit}{verdict}")
  return out


def _peak(change: tuple[memory.Plan, str]) -> int:
  return change[0].peak


def _unit(p: memory.Plan) -> str:
  """GiB, or MiB for a plan whose peak is under 1 GiB (small runs would show zeros)."""
  return "GiB" if p.peak >= memory.GIB else "MiB"


def _in(n: float, unit: str) -> str:
  return f"{n / (memory.GIB if unit == 'GiB' else 2**20):.2f}"


def _gib(n: float) -> str:
  return f"{n / memory.GIB:.2f}"


def explain(p: memory.Plan, model_cfg: model.ModelConfig, rl_cfg: spec.RLConfig) -> dict[str, str]:
  """What each line of `describe` counts, for this config."""
  data, fsdp, expert, cp, tensor = p.mesh
  remat_on = model_cfg.remat != "none" and model_cfg.scan_layers
  grads = (
    f"the micro-batch's gradient + the accumulator it is summed into (rl.micro_batches = "
    f"{rl_cfg.micro_batches}): 2 x params"
    if rl_cfg.micro_batches > 1
    else "the micro-batch's gradient + the accumulator it is summed into (rl.micro_batch_tokens"
    f" = {rl_cfg.micro_batch_tokens}): 2 x params"
    if rl_cfg.micro_batch_tokens
    else "one gradient, params-sized (rl.micro_batches = 1: no accumulator)"
  )
  working = "the float32 logits gradient [rows, T, vocab / tensor]"
  if cp > 1:
    working = f"the float32 logits gradient [rows, T / {cp}, vocab / tensor]"
  if model_cfg.scan_layers:
    working += ", one layer recomputed, the layer scan's stacked gradient"
  if fsdp > 1:
    working += f", weights gathered over fsdp = {fsdp}"
  return {
    "params": f"the policy's weights ({model_cfg.param_dtype}), split over fsdp x tensor = "
    f"{fsdp * tensor}"
    + (", the experts over expert x tensor too" if model_cfg.n_experts and expert > 1 else ""),
    "reference params": "a frozen copy of the weights for the KL term (rl.kl_coef > 0)"
    if p.ref_params
    else "none: rl.kl_coef = 0",
    "optimizer state": "Adam's first and second moments: 2 x params",
    "gradients": grads,
    "activations (this config)": f"what the backward keeps of one micro-batch's forward "
    f"({p.micro_batch_rows} rows per device{', remat' if remat_on else ''}"
    f"{f', each row split over sequence = {cp}' if cp > 1 else ''})",
    "  without remat": "model.remat='none'",
    "  with remat (scanned layers)": "model.remat='full', model.scan_layers=True",
    "backward working set": working,
    "sampler (KV cache, decode)": f"the KV cache and decode buffers of "
    f"{p.sampler_rows or p.rollout_rows} rollout rows per device"
    + (" (split over sequence too)" if 0 < p.sampler_rows < p.rollout_rows else ""),
    "log-prob forwards": f"π_old / reference logits and hidden states of "
    f"{-(-p.rollout_rows // rl_cfg.logprob_batches)} rows per device at once "
    f"(rl.logprob_batches = {rl_cfg.logprob_batches})"
    if p.logprob_forward
    else "none: π_old from the update's forward (rl.old_logp_from), and no reference",
    "teacher params": "distillation's teacher (config.teacher), resident like the reference",
    "teacher forward": "the teacher's logits and hidden states over the same rows",
    "peak": "resident (params, reference, teacher, Adam) + the largest of train step, sampler "
    "and log-prob forwards (they never run at once)",
  }


def describe(
  p: memory.Plan, *, device_memory: float | None = None, name: str = "", why: dict | None = None
) -> str:
  """The plan as a table per device (GiB, or MiB under 1 GiB), each line with what it
  counts when `why` (`explain`) is given, and whether it fits `device_memory` bytes."""
  rows = [
    ("params", p.params),
    ("reference params", p.ref_params),
    ("optimizer state", p.opt_state),
    ("gradients", p.grads),
    ("activations (this config)", p.activations),
    ("  without remat", p.activations_no_remat),
    ("  with remat (scanned layers)", p.activations_remat),
    ("backward working set", p.backward_working),
    ("sampler (KV cache, decode)", p.kv_cache),
    ("log-prob forwards", p.logprob_forward),
    *(
      (("teacher params", p.teacher_params), ("teacher forward", p.teacher_forward))
      if p.teacher_params
      else ()
    ),
    ("peak", p.peak),
  ]
  unit = _unit(p)
  why = why or {}
  lines = [f"mesh (data, fsdp, expert, sequence, tensor) = {p.mesh}; {unit} per device"]
  lines += [f"  {k:<30} {_in(v, unit):>9}" + (f"  {why[k]}" if k in why else "") for k, v in rows]
  if device_memory:
    usable = memory.USABLE_FRACTION * device_memory
    verdict = "fits" if memory.fits(p, device_memory) else "does NOT fit"
    lines.append(
      f"{verdict} {name or ''} ({_gib(device_memory)} GiB, {_gib(usable)} usable): "
      f"{100 * p.peak / usable:.0f}% of usable"
    )
  return "\n".join(lines)


class OutOfMemoryPlan(ValueError):
  """The memory plan of a config exceeds the device memory."""


def check(p: memory.Plan, device_memory: float, model_cfg, rl_cfg) -> None:
  """Raises OutOfMemoryPlan, in one line with the biggest terms and the best changes,
  when p does not fit."""
  if memory.fits(p, device_memory):
    return
  terms = {
    "params": p.params,
    "reference": p.ref_params,
    "Adam state": p.opt_state,
    "gradients": p.grads,
    "activations": p.activations,
    "backward working set": p.backward_working,
    "sampler": p.kv_cache,
    "log-prob forwards": p.logprob_forward,
    "teacher": p.teacher_params,
    "teacher forward": p.teacher_forward,
  }
  biggest = sorted(terms.items(), key=lambda kv: -kv[1])[:3]
  tips = advice(p, model_cfg, rl_cfg, device_memory=device_memory)[:2]
  raise OutOfMemoryPlan(
    f"This config needs {_gib(p.peak)} GiB per device, more than the "
    f"{_gib(memory.USABLE_FRACTION * device_memory)} GiB usable of {_gib(device_memory)} GiB "
    f"(memory_limit_gib or the device's own limit); biggest terms: "
    + ", ".join(f"{k} {_gib(v)}" for k, v in biggest)
    + ". Change: "
    + "; or ".join(tips)
    + ". `grpo-jax plan --config=...` prints the whole plan."
  )
