"""The trainer's periodic token-credit diagnostics: one config block, off by default.

    --config.diagnostics.every=10        # 0 (default): off; nothing is built or compiled

What runs, and when (iteration k of `train.run`):

* Probe capture, once. The first RL iteration of the run keeps the first `probe_prompts`
  groups of its prepared batch (`spec.RolloutBatch`) on the host: the *fixed probe*, written
  to workdir/diagnostics/probe.npz and read back on resume, so a resumed run measures the
  same contexts (a run that switches diagnostics on at a resume captures it then).
* Initial policy, once. KL-to-init needs π_0, the policy at iteration 0 (after the warm
  start). A run with a reference model (rl.kl_coef > 0) already holds it: its reference
  params are that policy. Otherwise the hook keeps a device copy and writes it to
  workdir/diagnostics/init_params (orbax, restored on resume); this costs one more copy of
  the parameters in device memory for the whole run.
* Every `every` iterations (k % every == 0): the params are copied before the update
  phase (the train step donates its buffers, so the copy is a real one) and, after the
  update, `report.token_credit_report(before, after, credit probe)` measures that
  iteration's update: token flips by polarity × category, the cancellation residual
  (and, with `aggregations`, the residual under other aggregation modes: cancel/<mode>/...),
  the LM-head coupling fit and the learning tax. The credit probe is the first
  `probe_prompts` groups of the iteration's own batch (credit_batch="current": the update
  was computed from those rollouts, so the first-order coupling prediction c = w·A is the
  one that drove it) or the fixed probe (credit_batch="fixed": the same tokens every time,
  a generalisation view). Drift monitors always use fixed data: the log-prob of
  `drift_references` reference solutions of held-out problems
  (`task.example("test", i).reference`), entropy and exact KL to π_0 on the fixed probe's
  contexts, and the slope of the response length over the logged history. Optional:
  `rank` (per-rollout gradient matrix of a parameter subset, count-sketch projected to
  `project_dim` columns, its effective ranks, the ranks of the subset's update matrices,
  gradient sparsity; singular values appended to workdir/diagnostics/spectra.jsonl) and
  `value` (Monte-Carlo token value with `value_samples` continuations at `value_tokens`
  sampled probe tokens, boosted vs suppressed; expensive).

The metrics join that iteration's metrics.jsonl line and TensorBoard step (definitions:
`report.DEFINITIONS`, resolved by `grpo_jax.infra.metrics.definition`), with `time/diagnostics`,
the seconds they took. The jitted pieces are built once per model config and reused.

Cost: about 6 forwards of the probe batch (probe_prompts × G rows) plus the reference
solutions every `every` iterations, a [max_tokens, probe rows × T] kernel, and one copy of
the params. `rank` adds one forward + backward per probe row; `value` samples
2 · value_tokens · value_samples continuations.

Multi-process runs: every process runs the hook (the forwards are global computations);
only the primary process writes the diagnostics files, and a resumed job reads them back
from the shared workdir.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.diagnostics import cancellation, coupling, drift, flips, grads, rank, report, value
from grpo_jax.infra import checkpoint, distributed, logs
from grpo_jax.models import logprobs, sampling, tokenizers
from grpo_jax.models import model as model_lib

# Template/format tokens of a non-toy tokenizer: whitespace, punctuation, <|markers|>, \boxed.
TEMPLATE_PATTERNS = (r"^\s*$", r"^\s*[\W_]+\s*$", r"<\|?[\w/]+\|?>", r"\\boxed")

# ----------------------------------------------------------------------------
# Jitted pieces, built once per configuration.
# ----------------------------------------------------------------------------


@functools.cache
def _logp_fn(model_cfg: model_lib.ModelConfig):
  model_fn = model_lib.make_model_fn(model_cfg)
  return jax.jit(lambda p, *inputs: logprobs.completion_logprobs(p, *inputs, model_fn=model_fn)[0])


def _mode_residuals(tokens_BT, adv_BT, mask_BT, group_ids_B, *, modes, vocab_size, max_len):
  """{mode: `cancellation.residual_arrays` under that aggregation mode's weights}."""
  out = {}
  for mode in modes:
    w_BT = cancellation.aggregation_weights(mode, mask_BT, group_ids_B, adv_BT, max_len=max_len)
    out[mode] = cancellation.residual_arrays(
      tokens_BT, w_BT, adv_BT, mask_BT, group_ids_B, vocab_size=vocab_size
    )
  return out


_mode_residuals_jit = jax.jit(_mode_residuals, static_argnames=("modes", "vocab_size", "max_len"))


@functools.cache
def _solution_fn(model_cfg: model_lib.ModelConfig):
  model_fn = model_lib.make_model_fn(model_cfg)
  return jax.jit(lambda p, *inputs: drift.solution_drift(p, *inputs, model_fn=model_fn))


@functools.cache
def _rank_fn(model_cfg: model_lib.ModelConfig, subset: str, dim: int, seed: int):
  """One jitted fn(before, after, pt, pm, t, m, coef) -> {"metrics": {matrix: rank
  metrics}, "sv": {matrix: σ}, "sparsity": {...}} for the parameter subset.

  Matrices: "rollout_grads/<subset>", rows ∇_sub J_i of the per-rollout objectives
  J_i = Σ_t c_it log π at `before` (`grads.rollout_objective_fn`; one forward + backward
  per row, vmapped in chunks of 8, each row count-sketch projected to `dim` columns when
  the subset is larger, `grads.make_projector`), and "update/<subset>/<path>", the
  subset's update after − before of every leaf with ndim >= 2 (`rank.as_matrix`).
  Sparsity: Hoyer and near-zero fraction of ∇_sub Σ_i J_i (unprojected); the variance of
  the mini-batch gradient over resampled half-size mini-batches of the probe's rollouts
  (exact, `rank.minibatch_grad_variance_exact`, in the projected space) and its
  signal-to-noise ratio ‖ḡ‖² / variance.
  """
  model_fn = model_lib.make_model_fn(model_cfg)

  def objective(merge, sub, pt, pm, t, m, c):
    logp, _ = logprobs.completion_logprobs(merge(sub), pt, pm, t, m, model_fn=model_fn)
    return jnp.sum(jnp.where(m, c * logp, 0.0))

  def fn(before, after, pt, pm, t, m, coef):
    sub, merge = grads.param_subset(before, subset, cfg=model_cfg)
    if grads.num_params(sub) > dim:
      flat = grads.make_projector(sub, dim=dim, key=jax.random.key(seed), kind="countsketch")
    else:
      flat = grads._flatten

    def row(x):
      return flat(jax.grad(lambda s: objective(merge, s, *(y[None] for y in x)))(sub))

    g_NQ = jax.lax.map(row, (pt, pm, t, m, coef), batch_size=8)
    mats = {f"rollout_grads/{subset}": g_NQ}
    half = max(g_NQ.shape[0] // 2, 1)
    var = rank.minibatch_grad_variance_exact(g_NQ, batch_size=half)
    mean_sq = jnp.sum(jnp.mean(g_NQ, axis=0) ** 2)
    total = jax.grad(lambda s: objective(merge, s, pt, pm, t, m, coef))(sub)
    sub_after = grads.param_subset(after, subset, cfg=model_cfg)[0]
    paths = jax.tree_util.tree_flatten_with_path(sub)[0]
    for (path, b), a in zip(paths, jax.tree.leaves(sub_after)):
      if b.ndim >= 2:
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        mats[f"update/{subset}/{name}"] = rank.as_matrix(
          a.astype(jnp.float32) - b.astype(jnp.float32), name=name
        )
    return {
      "metrics": {k: rank.rank_metrics(x) for k, x in mats.items()},
      "sv": {k: rank.singular_values(x) for k, x in mats.items()},
      "sparsity": {
        "sparsity/hoyer": rank.hoyer_sparsity(total),
        "sparsity/near_zero": rank.near_zero_fraction(total),
        "sparsity/minibatch_grad_var": var,
        "sparsity/minibatch_grad_snr": mean_sq / jnp.maximum(var, 1e-30),
      },
    }

  return jax.jit(fn)


@functools.cache
def _value_sampler(model_cfg: model_lib.ModelConfig, cfg: sampling.SamplerConfig):
  return sampling.make_policy_sampler(model_cfg, cfg)


# ----------------------------------------------------------------------------
# Host helpers.
# ----------------------------------------------------------------------------


def template_ids(task, tokenizer) -> tuple[int, ...]:
  """Template/format token ids: a toy task's `template_chars` and the EOS that ends every
  completion, else `TEMPLATE_PATTERNS` over the decoded vocabulary of a real tokenizer."""
  if isinstance(tokenizer, tokenizers.CharTokenizer):
    if not task.template_chars:
      return ()
    return tuple(sorted({*flips.task_template_ids(task, tokenizer), *tokenizer.eos_ids}))
  tagged = flips.regex_tagger(flips.vocab_strings(tokenizer), patterns=TEMPLATE_PATTERNS)
  return tuple(int(i) for i in np.flatnonzero(tagged))


def probe_from_batch(batch, n_rows: int) -> report.Probe:
  """The first n_rows of a (sharded) RolloutBatch as a host Probe, its group ids
  renumbered 0 .. groups − 1 (in sorted order)."""
  rows = jax.tree.map(lambda x: distributed.host_value(x[:n_rows]), batch)
  probe = report.Probe.from_batch(rows)
  _, ids = np.unique(np.asarray(probe.group_ids_B), return_inverse=True)
  return probe.replace(group_ids_B=ids.astype(np.int32))


def _probe_arrays(probe: report.Probe) -> dict[str, np.ndarray]:
  return {f.name: np.asarray(getattr(probe, f.name)) for f in dataclasses.fields(probe)}


def reference_batch(setup, n: int):
  """(prompt_tokens_BP, prompt_mask_BP, tokens_BT, mask_BT) of the first n held-out
  problems' reference solutions (+ EOS, cut to max_new_tokens), prompts padded to their
  bucket; None when n = 0."""
  if n == 0:
    return None
  tok, scfg = setup.tokenizer, setup.sampler_cfg
  examples = [setup.task.example("test", i, seed=setup.loop.seed) for i in range(n)]
  prompts = [tok.encode(e.prompt, add_bos=True) for e in examples]
  completions = [tok.encode(e.reference, add_eos=True)[: scfg.max_new_tokens] for e in examples]
  P = sampling.bucket_length(max(len(p) for p in prompts), scfg.prompt_buckets)
  return drift.pad_references(
    prompts, completions, pad_id=tok.pad_id, prompt_len=P, completion_len=scfg.max_new_tokens
  )


def _prompt_key(prompt_BP, mask_BP, row: int) -> tuple[int, ...]:
  return tuple(int(x) for x in np.asarray(prompt_BP)[row][np.asarray(mask_BP)[row]])


@dataclasses.dataclass
class Snapshot:
  """What a diagnostic iteration keeps from before its update."""

  iteration: int
  params: Any  # A copy of the params before the update.
  probe: report.Probe  # The credit probe (host arrays).
  reward_inputs: dict | None  # Prompt ids -> the task's reward input (for `value`).
  t_copy: float  # Seconds spent on the snapshot.


class Hook:
  """The diagnostics of one run (`create` returns None when config.diagnostics is off).

  The trainer calls `before_update` and `after_update` once per RL iteration; only
  iterations k with k % every == 0 do any device work beyond the first iteration's
  probe capture.
  """

  def __init__(self, setup, workdir, *, params, ref_params, resumed_from: int | None, log=print):
    resumed = resumed_from is not None
    self.setup, self.cfg = setup, setup.diagnostics
    self.dir = pathlib.Path(workdir) / "diagnostics"
    self.log = log
    if distributed.is_primary():
      self.dir.mkdir(parents=True, exist_ok=True)
    self.template_ids = template_ids(setup.task, setup.tokenizer)
    self.references = reference_batch(setup, self.cfg.drift_references)
    self.fixed: report.Probe | None = None
    self.fixed_range: range | None = None  # The train examples its iteration drew.
    self.fixed_inputs: dict | None = None  # Prompt ids -> reward input (`value`), lazily.
    if resumed and (self.dir / "probe.npz").exists():
      with np.load(self.dir / "probe.npz", allow_pickle=False) as f:
        self.fixed = report.Probe(**{k: f[k] for k in f.files if k != "data_range"})
        self.fixed_range = range(*(int(x) for x in f["data_range"]))
    self.init_params = self._initial_params(params, ref_params, resumed=resumed)
    self.lengths = self._logged_lengths(workdir) if resumed else []
    if distributed.is_primary():  # Spectra past the checkpoint (or of an earlier run) go.
      self._truncate_spectra(last=resumed_from if resumed else 0)

  @classmethod
  def create(
    cls, setup, workdir, *, params, ref_params, resumed_from: int | None, log=print
  ) -> Hook | None:
    """The run's hook (`resumed_from`: the checkpoint step a resumed run starts from), or
    None when config.diagnostics.every == 0."""
    if not setup.diagnostics.every:
      return None
    return cls(
      setup, workdir, params=params, ref_params=ref_params, resumed_from=resumed_from, log=log
    )

  # --- state that outlives a session -------------------------------------------------

  def _initial_params(self, params, ref_params, *, resumed: bool):
    """π_0: the reference params when the run has them, else a copy kept in device
    memory and in workdir/diagnostics/init_params (module docstring)."""
    if ref_params is not None:
      return ref_params
    ckpt = checkpoint.Checkpointer(
      self.dir / "init_params", keep=1, keep_best=False, async_save=False
    )
    try:
      if resumed and ckpt.latest_step() is not None:
        like = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params
        )
        return ckpt.restore(ckpt.latest_step(), like=like)[0]
      if resumed:
        self.log(
          "diagnostics: no saved initial policy; KL-to-init is measured from this session's start."
        )
      params = jax.tree.map(jnp.copy, params)  # The train step donates the original buffers.
      ckpt.save(0, params, {"what": "policy at the start of the diagnostics (iteration 0)"})
      ckpt.wait()
      return params
    finally:
      ckpt.close()

  def _logged_lengths(self, workdir) -> list[float]:
    """Response lengths of the RL iterations metrics.jsonl already holds (the logger has
    dropped lines past the checkpoint the run resumes from)."""
    records = logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")
    return [float(r["response_length"]) for r in records if r.get("phase") == "rl"]

  def _truncate_spectra(self, *, last: int) -> None:
    path = self.dir / "spectra.jsonl"
    if path.exists():
      kept = [r for r in logs.read_jsonl(path) if r["iteration"] <= last]
      path.write_text("".join(json.dumps(r) + "\n" for r in kept))

  def _probe_rows(self) -> int:
    return self.cfg.probe_prompts * self.setup.sampler_cfg.group_size

  def _capture_fixed(self, batch, data_range: range) -> None:
    self.fixed, self.fixed_range = probe_from_batch(batch, self._probe_rows()), data_range
    if distributed.is_primary():
      bounds = np.asarray([data_range.start, data_range.stop], np.int64)
      np.savez(self.dir / "probe.npz", data_range=bounds, **_probe_arrays(self.fixed))

  def _reward_inputs(self, probe: report.Probe, data_range: range) -> dict:
    """{str(prompt ids): reward input} for the probe's prompts, found among the train
    examples of data_range (the iteration's draws; dynamic sampling may draw several
    batches)."""
    task, tok, seed = self.setup.task, self.setup.tokenizer, self.setup.loop.seed
    wanted = {
      _prompt_key(probe.prompt_tokens_BP, probe.prompt_mask_BP, r)
      for r in range(probe.tokens_BT.shape[0])
    }
    out = {}
    for i in data_range:
      ex = task.example("train", i, seed=seed)
      key = tuple(tok.encode(ex.prompt, add_bos=True))
      if key in wanted:
        out[json.dumps(list(key))] = task.reward_input(ex)
    return out

  # --- the two calls of the training loop --------------------------------------------

  def due(self, iteration: int) -> bool:
    return iteration % self.cfg.every == 0

  def before_update(self, iteration: int, params, batch, *, data_range: range) -> Snapshot | None:
    """Captures the fixed probe (first call of a run); on a due iteration returns a
    snapshot: a copy of the params and the credit probe."""
    if self.fixed is None:
      self._capture_fixed(batch, data_range)
    if not self.due(iteration):
      return None
    t0 = time.perf_counter()
    inputs = None
    if self.cfg.credit_batch == "fixed":
      probe = self.fixed
      if self.cfg.value and self.fixed_inputs is None:
        self.fixed_inputs = self._reward_inputs(probe, self.fixed_range)
      inputs = self.fixed_inputs
    else:
      probe = probe_from_batch(batch, self._probe_rows())
      if self.cfg.value:
        inputs = self._reward_inputs(probe, data_range)
    before = jax.tree.map(jnp.copy, params)  # The train step donates params' buffers.
    return Snapshot(iteration, before, probe, inputs, time.perf_counter() - t0)

  def after_update(self, snapshot: Snapshot | None, params, record: dict) -> dict[str, float]:
    """Records the iteration's response length; on a due iteration returns the
    diagnostics metrics of its update (before: the snapshot, after: params)."""
    if "response_length" in record:
      self.lengths.append(float(record["response_length"]))
    if snapshot is None:
      return {}
    t0 = time.perf_counter()
    out = self._credit(snapshot, params)
    out.update(self._drift(params))
    if self.cfg.rank:
      out.update(self._rank(snapshot, params))
    if self.cfg.value:
      out.update(self._value(snapshot, params))
    out["time/diagnostics"] = snapshot.t_copy + time.perf_counter() - t0
    return out

  # --- the measurements --------------------------------------------------------------

  def _max_len(self):
    return self.setup.rl_cfg.max_len or None

  def _credit(self, snap: Snapshot, params) -> dict[str, float]:
    cfg, rl_cfg, mcfg = self.cfg, self.setup.rl_cfg, self.setup.model_cfg
    out = report.token_credit_report(
      snap.params,
      params,
      snap.probe,
      model_cfg=mcfg,
      aggregation=rl_cfg.aggregation,
      max_len=self._max_len(),
      template_ids=self.template_ids,
      tau=cfg.tau,
      sgd_lr=self.setup.loop.learning_rate,
      max_tokens=cfg.max_tokens,
      seed=cfg.seed,
      policy_loss=rl_cfg.policy_loss,
      loss_hyper=rl_cfg.step_hyper().loss,
    )
    if cfg.aggregations:  # The run's mode and the others, on the same probe.
      p = snap.probe
      got = jax.device_get(
        _mode_residuals_jit(
          jnp.asarray(p.tokens_BT),
          jnp.asarray(p.adv_BT, jnp.float32),
          jnp.asarray(p.loss_mask_BT),
          jnp.asarray(p.group_ids_B, jnp.int32),
          modes=tuple(dict.fromkeys((rl_cfg.aggregation, *cfg.aggregations))),
          vocab_size=mcfg.vocab_size,
          max_len=self._max_len(),
        )
      )
      is_template_V = np.isin(np.arange(mcfg.vocab_size), self.template_ids)
      for mode, arrays in got.items():
        out.update(
          cancellation.residual_summary(arrays, category_V=is_template_V, prefix=f"cancel/{mode}")
        )
    return out

  def _drift(self, params) -> dict[str, float]:
    mcfg = self.setup.model_cfg
    out = {}
    _, stats = report._compiled(mcfg)
    inputs = tuple(jnp.asarray(x) for x in self.fixed.inputs)
    got = stats(params, self.init_params, *inputs)
    out.update({k: float(v) for k, v in jax.device_get(got).items()})
    if self.references is not None:
      refs = tuple(jnp.asarray(x) for x in self.references)
      out.update(
        {k: float(v) for k, v in jax.device_get(_solution_fn(mcfg)(params, *refs)).items()}
      )
    window = self.cfg.length_window or None
    out["drift/length_slope"] = drift.length_trend(self.lengths, window=window)
    return out

  def _rank(self, snap: Snapshot, params) -> dict[str, float]:
    cfg, p = self.cfg, snap.probe
    mask, adv = jnp.asarray(p.loss_mask_BT), jnp.asarray(p.adv_BT)
    w_BT = cancellation.aggregation_weights(
      self.setup.rl_cfg.aggregation, mask, jnp.asarray(p.group_ids_B), adv, max_len=self._max_len()
    )
    coef_BT = cancellation.coefficients(adv, w_BT, mask)
    fn = _rank_fn(self.setup.model_cfg, cfg.rank_subset, cfg.project_dim, cfg.seed)
    got = jax.device_get(fn(snap.params, params, *(jnp.asarray(x) for x in p.inputs), coef_BT))
    out = {f"rank/{name}/{k}": float(v) for name, m in got["metrics"].items() for k, v in m.items()}
    out.update({k: float(v) for k, v in got["sparsity"].items()})
    if distributed.is_primary():
      spectra = {k: [float(x) for x in np.asarray(v)] for k, v in got["sv"].items()}
      with (self.dir / "spectra.jsonl").open("a") as f:
        f.write(json.dumps({"iteration": snap.iteration, **spectra}) + "\n")
    return out

  def _value(self, snap: Snapshot, params) -> dict[str, float]:
    cfg, setup, p = self.cfg, self.setup, snap.probe
    task, tok = setup.task, setup.tokenizer
    rows, cols, valid = coupling.select_tokens(
      p.mask_BT, max_tokens=cfg.value_tokens, seed=cfg.seed + 1
    )
    rows, cols = rows[valid], cols[valid]
    P, T = p.prompt_tokens_BP.shape[1], p.tokens_BT.shape[1]
    vcfg = dataclasses.replace(
      setup.sampler_cfg, group_size=cfg.value_samples, max_prompt_len=P + T, prompt_buckets=(P + T,)
    )
    sampler = _value_sampler(setup.model_cfg, vcfg)
    sample_fn = lambda q, prompts, key: sampler(q, prompts, key, setup.sampling_hyper)  # noqa: E731
    inputs = snap.reward_inputs

    def reward_fn(prompt_ids, completion_ids):
      given = inputs.get(json.dumps(list(prompt_ids)))
      if given is None:  # A prompt not among the drawn examples (e.g. truncated): no value.
        return float("nan")
      return float(task.reward(given, tok.decode(completion_ids)))

    vals = value.token_values(
      sample_fn,
      snap.params,
      p.prompt_tokens_BP,
      p.prompt_mask_BP,
      p.tokens_BT,
      rows,
      cols,
      jax.random.fold_in(jax.random.key(cfg.seed), snap.iteration),
      reward_fn=reward_fn,
      sampler_cfg=vcfg,
      max_completion_len=T,
    )
    logp = _logp_fn(setup.model_cfg)
    ins = tuple(jnp.asarray(x) for x in p.inputs)
    delta_BT = np.asarray(logp(params, *ins) - logp(snap.params, *ins))
    m_BT = np.asarray(p.mask_BT, np.float32)
    adv_B = (np.asarray(p.adv_BT) * m_BT).sum(1) / np.maximum(m_BT.sum(1), 1.0)  # ā_i
    return value.value_by_flip(
      vals["after"], vals["gain"], delta_BT[rows, cols], adv_B[rows], tau=cfg.tau
    )
