"""Gradient variance of GRPO and IBPO at equal generated tokens (IBPO, arXiv 2605.16302).

  python experiments/ibpo_variance.py                    # 3 seeds, JSON on stdout
  python experiments/ibpo_variance.py --seeds 1 --quick  # smoke run

For one warm-started policy (configs/ibpo.py's base, long_addition, seed s) and P held-in
prompts, K independent groups are sampled per prompt under each arm of configs/ibpo.py:

  grpo    G = 10 samples, GRPO advantages;
  trie    G = 10 samples, the ibpo estimator with φ from the group alone (no counterfactuals);
  branch  G = 8 samples + C = 4 branches (2 continuations at each of 2 step cuts of failed
          rollouts), the ibpo estimator; the branches inform φ and are not trained.

Each arm runs the trainer's own path (`rollout.with_counterfactuals`, `rl.finish_prepare`),
so its advantages and loss mask are exactly what training would use. A group's gradient
estimate is ĝ = (1/n) ∇ Σ_i Σ_t m_{i,t} A_{i,t} log π(o_{i,t}) over all parameters, n the
group's trained rows (the same per-rollout scale for every arm). For each prompt the
variance is the trace of the covariance of ĝ over its K groups, (1/(K−1)) Σ_k ‖ĝ_k − ḡ‖²,
averaged over prompts; the signal is ‖ḡ‖². Generated tokens per group are counted (the
samples' tokens plus the tokens the branches decoded themselves), so the arms can be
compared at equal cost: G = 10 was chosen so grpo generates about as many tokens as
branch (both are reported).

Used by claim 10 of experiments/reproduce.py (`claims.analyse_ibpo_variance`).
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "configs"))
sys.path.insert(0, str(ROOT / "experiments"))

ARMS = ("grpo", "trie", "branch")


def make_config(arm: str, seed: int, *, prompts: int, groups: int, quick: bool):
  import ibpo  # noqa: PLC0415  (configs/, on sys.path)

  c = ibpo.get_config("tiny" if arm == "branch" else arm)
  c.update(seed=seed, prompts_per_step=prompts * groups, reward_workers=0, progress=False)
  if quick:
    c.model.update(d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, mlp_dim=64)
    c.task.kwargs = dict(min_digits=1, max_digits=2)
    c.sampler.update(max_new_tokens=26)
    c.update(warmstart_steps=60, warmstart_batch=32)
    c.rl.format_weight = 0.5  # Rewards vary even when the small model solves nothing.
  return c


def arm_batch(setup, fns, params, examples, key):
  """(RolloutBatch, metrics, generated tokens per group) of one arm on `examples`."""
  from grpo_jax import rewards, rollout  # noqa: PLC0415

  n, G = setup.loop.prompts_per_step, setup.sampler_cfg.group_size
  prompts = rollout.host_prompts(setup, fns, examples, n)
  rollouts = fns.sample(params, prompts, jax.random.fold_in(key, 1), setup.sampling_hyper)
  tokens = float(jnp.sum(rollouts.mask_NT))
  with rewards.RewardPool(setup.task, workers=0, timeout_s=10.0) as pool:
    scores = rollout.score(setup, pool, examples, rollouts.tokens_NT, group=G)
    prov = None
    if setup.counterfactual.enabled:
      drawn = rollout.Drawn(0, examples, prompts)
      rollouts, scores, prov, _ = rollout.with_counterfactuals(
        setup, fns, pool, params, drawn, rollouts, scores, jax.random.fold_in(key, 2)
      )
      cf_N = prov.kind_N != 0
      tokens += float(jnp.sum(prov.own_NT & cf_N[:, None]))
  lp = fns.logprobs(params, None, rollouts)
  hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  batch, _, stats = fns.finish(
    lp, rollouts, scores.correct_N, scores.format_N, hyper, scores.scorable_N, None, prov
  )
  metrics = {k: float(v) for k, v in stats.items()}
  metrics["pass_rate"] = float(np.mean(np.asarray(scores.correct_N)[: n * G]))
  return batch, metrics, tokens / n


def group_variance(params, batch, *, model_fn, group_size: int, prompts: int, groups: int):
  """(variance, signal) of the per-group gradient estimates (module docstring)."""
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
  return float(var.mean()), float((mean**2).sum(axis=-1).mean())


def measure(seed: int, *, prompts: int = 8, groups: int = 8, quick: bool = False) -> dict:
  """{arm: {"variance", "signal", "tokens_per_group", "pass_rate", ...}} for one seed."""
  from grpo_jax import config, steps, train, warmstart  # noqa: PLC0415

  key = jax.random.key(seed)
  out, params = {}, None
  for arm in ARMS:
    setup = config.build(make_config(arm, seed, prompts=prompts, groups=groups, quick=quick))
    fns = steps.functions(setup)
    if params is None:  # One warm start per seed, shared by the arms.
      params = train.initial_params(setup, fns, jax.random.fold_in(key, 0))
      params = warmstart.run(setup, fns, params, log=lambda *_: None, preempted={"set": False})
    n = prompts * groups
    # Prompt p fills rows p·K .. p·K + K − 1: K independent groups of the same prompt.
    examples = {i: setup.task.example("train", i // groups, seed=seed) for i in range(n)}
    batch, metrics, tokens = arm_batch(setup, fns, params, examples, jax.random.fold_in(key, 7))
    variance, signal = group_variance(
      params,
      batch,
      model_fn=fns.model_fn,
      group_size=setup.train_group,
      prompts=prompts,
      groups=groups,
    )
    keep = ("ibpo/shaping_abs_mean", "ibpo/shaping_residual_corr", "ibpo/kept_pair_frac")
    out[arm] = {
      "variance": variance,
      "signal": signal,
      "tokens_per_group": tokens,
      **{k: metrics[k] for k in ("pass_rate", *keep) if k in metrics},
    }
  return out


def main(argv=None) -> list[dict]:
  import baseline_variance  # noqa: PLC0415

  return baseline_variance.cli(measure, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
  main()
