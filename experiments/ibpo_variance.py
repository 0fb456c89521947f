"""Signal per unit gradient variance of GRPO and IBPO at equal generated tokens (arXiv 2605.16302).

  python experiments/ibpo_variance.py                    # 3 seeds, JSON on stdout
  python experiments/ibpo_variance.py --seeds 1 --quick  # smoke run

For one warm-started policy (configs/ibpo.py's base, long_addition, seed s) and P held-in
prompts, K independent groups are sampled per prompt under each arm:

  grpo    G = 10 samples, GRPO advantages;
  grpo8   G = 8 samples, GRPO (the branch arm's trained rows);
  trie    G = 10 samples (the grpo arm's own, same key), the ibpo estimator with the trie of
          the group alone (no counterfactual rows);
  branch  G = 8 samples (the grpo8 arm's own) + C = 4 branches (2 continuations at each of 2
          uniform cuts of uniformly picked rollouts), the ibpo estimator; the branches inform
          the trie and are not trained.

λ, κ, τ of the ibpo arms are configs/ibpo.py's (TRIE, BRANCH: what the tuning grid of claims
10c-10f chose), or given (`measure_grid`). Each arm runs the trainer's own path
(`rollout.with_counterfactuals`, `rl.finish_prepare`), so its advantages and loss mask are
exactly what training would use. A group's gradient estimate is ĝ = (1/n) ∇ Σ_i Σ_t m_{i,t}
A_{i,t} log π(o_{i,t}) over all parameters, n the group's trained rows. Per prompt, with
ḡ the mean of its K groups' ĝ: variance = (1/(K−1)) Σ_k ‖ĝ_k − ḡ‖² (the trace of the
covariance) and signal = ‖ḡ‖² − variance/K (an unbiased estimate of ‖E ĝ‖²); both are
averaged over prompts, and snr = signal ÷ variance is free of the advantages' scale. Tokens
generated per group are counted (the samples' plus the tokens the branches decoded), and
trained rows per group.

Used by claims 10c/10e of experiments/reproduce.py (`claims.analyse_ibpo_loo_variance`) and
their tuning grid (`claims.tune_ibpo`).
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

ARMS = ("grpo", "grpo8", "trie", "branch")
# The branch arm's plan when claims 10c-10f were judged (configs/ibpo.py:tiny has since
# moved to cut "window"; `counterfactuals.biased_choices`): kept, so that they rerun as judged.
RECORDED_PLAN = dict(cut="uniform", accept_bias=True)
KEEP = ("ibpo/terminal_comparison_corr", "ibpo/comparison_abs_mean", "ibpo/kept_pair_frac")


def make_config(
  arm: str, seed: int, *, prompts: int, groups: int, quick: bool, ibpo_params=None, plan="recorded"
):
  """The arm's config; ibpo_params (lam, shrink[, tau]) override configs/ibpo.py's. plan:
  the branch arm's counterfactual plan, "recorded" (claims 10c-10f's, RECORDED_PLAN) or
  "shipped" (configs/ibpo.py:tiny's own, unbiased: cut "window")."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  variant = {"grpo": "grpo", "grpo8": "grpo", "trie": "trie", "branch": "tiny"}[arm]
  c = config_lib.load(str(ROOT / "configs" / "ibpo.py") + f":{variant}")
  if arm == "grpo8":
    c.sampler.group_size = 8
  if arm == "branch" and plan == "recorded":  # As claims 10c/10e ran: cuts drawn up to the
    c.counterfactual.update(RECORDED_PLAN)  # parent's length, found biased later (issue 56).
  if ibpo_params is not None and arm in ("trie", "branch"):
    lam, shrink, *tau = ibpo_params
    c.rl.advantage_hyper.ibpo_lambda = lam
    c.rl.advantage_options = {**c.rl.advantage_options, "shrink": shrink}
    if tau:
      c.rl.advantage_hyper.ibpo_tau = tau[0]
  c.update(seed=seed, prompts_per_step=prompts * groups, reward_workers=0, progress=False)
  c.rl.old_logp_from = "forward"  # Every arm's π_old by its own forward, as when judged.
  if quick:
    c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
    c.task.kwargs = dict(min_digits=1, max_digits=2)
    c.sampler.update(max_new_tokens=26)
    c.update(warmstart_steps=60, warmstart_batch=32)
    c.rl.format_weight = 0.5  # Rewards vary even when the small model solves nothing.
  import evidence  # noqa: PLC0415

  evidence.apply_model(c)  # reproduce.py --model.
  return c


def sampled(setup, fns, params, examples, key) -> dict:
  """One arm's rollouts on `examples` (with its counterfactual rows), scores and log-probs,
  and the tokens generated per group."""
  from grpo_jax.trainer import rollout  # noqa: PLC0415
  from grpo_jax.verifiers import reward_pool  # noqa: PLC0415

  n, G = setup.loop.prompts_per_step, setup.sampler_cfg.group_size
  prompts = rollout.host_prompts(setup, fns, examples, n)
  rollouts = fns.samplers.train(params, prompts, jax.random.fold_in(key, 1), setup.sampling_hyper)
  tokens = float(jnp.sum(rollouts.mask_NT))
  with reward_pool.RewardPool(setup.task, workers=0, timeout_s=10.0) as pool:
    scores = rollout.score(setup, pool, examples, rollouts.tokens_NT, group=G)
    prov = None
    if setup.counterfactual.enabled:
      drawn = rollout.Drawn(0, examples, prompts)
      rollouts, scores, prov, _ = rollout.with_counterfactuals(
        setup, fns, pool, params, drawn, rollouts, scores, jax.random.fold_in(key, 2)
      )
      cf_N = prov.kind_N != 0
      tokens += float(jnp.sum(prov.own_NT & cf_N[:, None]))
  return dict(
    rollouts=rollouts,
    scores=scores,
    prov=prov,
    lp=fns.rl.logprobs(params, None, rollouts),
    tokens_per_group=tokens / n,
    pass_rate=float(np.mean(np.asarray(scores.correct_N)[: n * G])),
  )


def _with_hyper(rl_cfg, **values):
  """rl_cfg with these estimator hyperparameters (rl.advantage_hyper) replaced."""
  return dataclasses.replace(rl_cfg, advantage_hyper={**rl_cfg.advantage_hyper, **values})


def finished(setup, fns, got: dict, *, lam=None, tau=None):
  """(RolloutBatch, metrics) of `sampled` through the trainer's prepare, with λ and τ
  (arrays of the hyper: no recompile) replacing the config's where given."""
  rl_cfg = setup.rl_cfg
  if lam is not None:
    rl_cfg = _with_hyper(rl_cfg, ibpo_lambda=lam)
  if tau is not None:
    rl_cfg = _with_hyper(rl_cfg, ibpo_tau=tau)
  hyper = rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  s = got["scores"]
  batch, _, stats = fns.rl.finish(
    got["lp"], got["rollouts"], s.correct_N, s.format_N, hyper, s.scorable_N, None, got["prov"]
  )
  return batch, {k: float(v) for k, v in stats.items()}


def group_variance(params, batch, *, model_fn, group_size: int, prompts: int, groups: int):
  """(variance, signal, rows per group) of the per-group gradient estimates (docstring)."""
  import baseline_variance  # noqa: PLC0415

  m_NT = batch.loss_mask_NT
  trained_N = jnp.any(m_NT, axis=1).astype(jnp.float32)
  n_g = jnp.maximum(jax.ops.segment_sum(trained_N, batch.group_ids_N), 1.0)[batch.group_ids_N]
  # group_gradients divides by group_size; rescale so a group's sum is divided by n.
  adv_NT = jnp.where(m_NT, batch.adv_NT, 0.0) * (group_size / n_g)[:, None]
  g = baseline_variance.group_gradients(
    params, batch.replace(mask_NT=m_NT), adv_NT, model_fn=model_fn, group_size=group_size
  )
  g = np.asarray(g, np.float64).reshape(prompts, groups, -1)
  mean = g.mean(axis=1, keepdims=True)
  var = ((g - mean) ** 2).sum(axis=-1).sum(axis=1) / (groups - 1)
  signal = (mean**2).sum(axis=-1)[:, 0] - var / groups
  rows = float(np.asarray(trained_N).sum()) / (prompts * groups)
  return float(var.mean()), float(signal.mean()), rows


def _figures(setup, fns, params, got, batch, metrics, *, prompts, groups) -> dict:
  variance, signal, rows = group_variance(
    params,
    batch,
    model_fn=fns.model_fn,
    group_size=setup.train_group,
    prompts=prompts,
    groups=groups,
  )
  return {
    "variance": variance,
    "signal": signal,
    "snr": signal / variance if variance > 0 else None,
    "tokens_per_group": got["tokens_per_group"],
    "rows_per_group": rows,
    "pass_rate": got["pass_rate"],
    **{k: metrics[k] for k in KEEP if k in metrics},
  }


def _arms(seed, specs: dict, *, prompts: int, groups: int, quick: bool, plan="recorded") -> dict:
  """{name: figures} for specs {name: (arm, [(λ, κ[, τ]), ...] or None)}, one warm start.
  An arm samples once (the same key for every arm: the trie arm sees GRPO G = 10's
  rollouts, the branch arm GRPO G = 8's); each κ builds its own prepare, λ and τ only change
  its hyper."""
  from grpo_jax.trainer import (
    build,
    run_state,
    steps,
    warmstart,  # noqa: PLC0415
  )

  key = jax.random.key(seed)
  out, params = {}, None
  size = dict(prompts=prompts, groups=groups)
  for arm, points in specs.items():
    points = points or [(None, None)]  # (name, params): the config's own.
    got = None
    for shrink in dict.fromkeys(p[2][1] if p[1] else None for p in points):
      first = next(p for p in points if (p[2][1] if p[1] else None) == shrink)
      c = make_config(
        arm, seed, quick=quick, ibpo_params=first[2] if first[1] else None, plan=plan, **size
      )
      setup = build.build(c)
      fns = steps.functions(setup)
      if params is None:  # One warm start per seed, shared by the arms.
        params = run_state.initial_params(setup, fns, jax.random.fold_in(key, 0))
        params = warmstart.run(setup, fns, params, log=lambda *_: None, preempted={"set": False})
      if got is None:
        # Prompt p fills rows p·K .. p·K + K − 1: K independent groups of the same prompt.
        examples = {
          i: setup.task.example("train", i // groups, seed=seed) for i in range(prompts * groups)
        }
        got = sampled(setup, fns, params, examples, jax.random.fold_in(key, 7))
      for name, has, p in points:
        if (p[1] if has else None) != shrink:
          continue
        tau = p[2] if has and len(p) > 2 else None
        batch, metrics = finished(setup, fns, got, lam=p[0] if has else None, tau=tau)
        out[name] = _figures(setup, fns, params, got, batch, metrics, **size)
  return out


def measure(seed: int, *, prompts: int = 8, groups: int = 8, quick: bool = False) -> dict:
  """{arm: {"variance", "signal", "snr", "tokens_per_group", ...}} for one seed, the ibpo
  arms at configs/ibpo.py's tuned λ, κ, τ."""
  specs = {a: [(a, False, None)] for a in ARMS}
  return _arms(seed, specs, prompts=prompts, groups=groups, quick=quick)


def measure_grid(seed: int, *, grid: dict, prompts: int = 8, groups: int = 8, quick=False) -> dict:
  """`measure` for the GRPO G = 10 reference and each grid point {name: (arm, (λ, κ[, τ]))}."""
  specs = {"grpo": [("grpo", False, None)]}
  for name, (arm, params) in grid.items():
    specs.setdefault(arm, []).append((name, True, params))
  return _arms(seed, specs, prompts=prompts, groups=groups, quick=quick)


def measure_paired(
  seed: int, *, points: dict, prompts: int = 8, groups: int = 8, quick: bool = False
) -> dict:
  """{name: figures} of GRPO and IBPO on the same rollouts (the paired design of claim 10g):
  the branch arm samples once, with configs/ibpo.py:tiny's own (unbiased) plan, and every
  point {name: (λ, κ, τ)} is computed on those rows; λ = 0 is GRPO's advantage exactly (no
  counterfactual row counts at the root), so a point at λ = 0 is GRPO on the same samples."""
  specs = {"branch": [(name, True, params) for name, params in points.items()]}
  return _arms(seed, specs, prompts=prompts, groups=groups, quick=quick, plan="shipped")


def main(argv=None) -> list[dict]:
  import baseline_variance  # noqa: PLC0415

  return baseline_variance.cli(measure, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
  main()
