"""Policy-gradient variance under the group-mean, Weaver–Tao and per-token optimal baselines.

  python experiments/baseline_variance.py                    # 3 seeds, JSON on stdout
  python experiments/baseline_variance.py --seeds 1 --quick  # smoke run

For one warm-started policy (configs/long_addition.py:tiny, seed s) and P held-in prompts,
K independent groups of G rollouts are sampled per prompt. On the same rollouts, each
baseline gives token advantages A (no std normalisation, so only the baseline differs):
  group_mean              A_i = r_i − r̄_g                      (dr_grpo)
  weaver_tao              A_i = r_i − Σ_j s_j r_j / Σ_j s_j     (optimal_baseline)
  per_token               A_{i,t} = r_i − B_{g,t}               (optimal_token_baseline)
and each group's policy-gradient estimate is ĝ = (1/G) ∇ Σ_i Σ_t A_{i,t} log π(o_{i,t})
over all parameters. The variance of the estimator for a prompt is the trace of the
covariance of ĝ over its K groups, (1/(K−1)) Σ_k ‖ĝ_k − ḡ‖², averaged over prompts; the
figure is each baseline's variance over the group mean's (below 1: less variance). The
signal ‖ḡ‖² is reported too, since a baseline may also change the mean gradient (the
per-token one is not a constant baseline, so it may bias it).

Used by claim 7b of experiments/reproduce.py (`claims.analyse_baselines`).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

BASELINES = {
  "group_mean": ("dr_grpo", {}),
  "weaver_tao": ("optimal_baseline", {}),
  "per_token": ("optimal_token_baseline", {}),
}


def make_config(seed: int, *, prompts: int, groups: int, quick: bool):
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  c = config_lib.load(str(ROOT / "configs" / "long_addition.py") + (":quick" if quick else ":tiny"))
  c.update(seed=seed, prompts_per_step=prompts * groups, reward_workers=0, progress=False)
  c.rl.old_logp_from = "forward"  # The score norms of π_old come from its own forward.
  if quick:
    c.task.kwargs = dict(min_digits=1, max_digits=2)
    c.sampler.update(max_new_tokens=26)
    c.update(warmstart_steps=60, warmstart_batch=32)
  import evidence  # noqa: PLC0415

  evidence.apply_model(c)  # reproduce.py --model.
  return c


@functools.partial(jax.jit, static_argnames=("model_fn", "group_size"))
def group_gradients(params, rollouts, adv_NT, *, model_fn, group_size: int):
  """ĝ per group, flattened: [N / G, P] with ĝ_g = (1/G) ∇ Σ_{i∈g} Σ_t A log π."""
  from grpo_jax.models import logprobs  # noqa: PLC0415

  def one(args):
    pt, pm, t, m, a = args

    def objective(p):
      lp, _ = logprobs.completion_logprobs(p, pt, pm, t, m, model_fn=model_fn)
      return jnp.sum(jnp.where(m, a * lp, 0.0)) / group_size

    g = jax.grad(objective)(params)
    return jnp.concatenate([x.reshape(-1).astype(jnp.float32) for x in jax.tree.leaves(g)])

  def split(x):
    return x.reshape(x.shape[0] // group_size, group_size, *x.shape[1:])

  xs = (
    rollouts.prompt_tokens_NP,
    rollouts.prompt_mask_NP,
    rollouts.tokens_NT,
    rollouts.mask_NT,
    adv_NT,
  )
  return jax.lax.map(one, tuple(split(x) for x in xs))


def measure(seed: int, *, prompts: int = 8, groups: int = 8, quick: bool = False) -> dict:
  """{baseline: {"variance", "signal"}} for one seed (see the module docstring)."""
  from grpo_jax.rl import advantages  # noqa: PLC0415
  from grpo_jax.trainer import (
    build,
    rollout,
    run_state,
    steps,
    warmstart,  # noqa: PLC0415
  )
  from grpo_jax.verifiers import reward_pool

  setup = build.build(make_config(seed, prompts=prompts, groups=groups, quick=quick))
  fns = steps.functions(setup)
  key = jax.random.key(seed)
  params = run_state.initial_params(setup, fns, jax.random.fold_in(key, 0))
  params = warmstart.run(setup, fns, params, log=lambda *_: None, preempted={"set": False})
  G, n = setup.sampler_cfg.group_size, prompts * groups
  # Prompt p fills rows p·K .. p·K + K − 1: K independent groups of the same prompt.
  examples = {i: setup.task.example("train", i // groups, seed=seed) for i in range(n)}
  batch = rollout.host_prompts(setup, fns, examples, n)
  rollouts = fns.samplers.train(params, batch, jax.random.fold_in(key, 1), setup.sampling_hyper)
  with reward_pool.RewardPool(setup.task, workers=0, timeout_s=10.0) as pool:
    scores = rollout.score(setup, pool, examples, rollouts.tokens_NT, group=G)
  lp = fns.rl.logprobs(params, None, rollouts)
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.asarray(scores.correct_N, jnp.float32),
    group_ids_B=rollouts.group_ids_N,
    mask_BT=rollouts.mask_NT,
    score_sq_B=lp.score_sq_N,
    score_sq_BT=lp.score_sq_NT,
  )
  out = {"pass_rate": float(np.mean(scores.correct_N))}
  for name, (estimator, options) in BASELINES.items():
    adv_NT = advantages.REGISTRY.make(estimator, **options)(
      inputs, advantages.hyper_values(**setup.rl_cfg.advantage_values)
    )
    g = np.asarray(group_gradients(params, rollouts, adv_NT, model_fn=fns.model_fn, group_size=G))
    g = g.reshape(prompts, groups, -1).astype(np.float64)
    mean = g.mean(axis=1, keepdims=True)
    var = ((g - mean) ** 2).sum(axis=-1).sum(axis=1) / (groups - 1)
    out[name] = {"variance": float(var.mean()), "signal": float((mean**2).sum(axis=-1).mean())}
  return out


def cli(measure, description: str, argv=None) -> list[dict]:
  """`measure` per seed from the command line (--seeds, --prompts, --groups, --quick);
  prints the list as JSON."""
  parser = argparse.ArgumentParser(description=description)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--prompts", type=int, default=8)
  parser.add_argument("--groups", type=int, default=8)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  got = [
    measure(s, prompts=args.prompts, groups=args.groups, quick=args.quick)
    for s in range(args.seeds)
  ]
  print(json.dumps(got))
  return got


def main(argv=None) -> list[dict]:
  return cli(measure, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
  main()
