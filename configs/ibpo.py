"""IBPO on long addition: process-level credit from a leave-one-out prefix baseline over the
group's trajectories and counterfactual branches (arXiv 2605.16302; docs/ibpo.md).

  A_{i,t} = (n_g − 1)/n_g · (r_i − b_{i,t}) / (σ_g + ε)        (rl.advantage = "ibpo")
  b_{i,t} = (1 − λ)·r̄_{−i} + λ·φ_{−i}(o_{i,<t})

φ_{−i}(s) is the mean reward of the other rows through the prefix s (a prefix trie of the
group), shrunk toward the parent prefix's value by κ pseudo-counts; the baseline never holds
the credited rollout, so the gradient stays unbiased (grpo_jax/rl/ibpo.py derives it).
Counterfactuals (config.counterfactual) are extra rows per group that inform the trie:
branches re-sampled from a prefix of a rollout, counted only from their cut, or samples under
a perturbed prompt (hint, paraphrase, repair) with truncated importance weights; one farther
than τ (normalised edit distance) from its parent is a full rewrite and is dropped.

Command (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/ibpo.py:tiny --workdir=/tmp/ibpo
  grpo-jax --config=configs/ibpo.py:grpo --workdir=/tmp/ibpo_grpo   # the GRPO arm

Variants (the scale of configs/long_addition.py:tiny, 60 iterations of 16 prompts):
  tiny: G = 8 samples + C = 4 branches per group (2 continuations at each of 2 cuts
    c ~ U{1, …, T − 1} of rollouts picked uniformly, a cut past the parent's end giving no
    branch: a plan that looks at a parent only through the prefix it keeps, so the baseline
    stays unbiased; grpo_jax/rl/counterfactuals.py), informing the trie only; λ, κ, τ =
    BRANCH, chosen by the tuning grid of claims 10c-10f (experiments/claims.py,
    `tune_ibpo`; seeds 100-102, which drew the cut up to the parent's length, a plan since
    found biased).
  trie: the same estimator with G = 10 samples and no counterfactual rows (the group's
    trie alone), at the tiny variant's generated tokens; λ, κ = TRIE (the same grid).
  grpo: GRPO with G = 10, about the tiny variant's generated tokens per group (the 4
    branches regenerate about half a completion each).
  hint: C = 4 rows sampled under the task's hint prompt, weighted by min(π(o|q)/π(o|q~), 2)
    (needs the recomputed π_old forward).

There is no repair variant: a row sampled under the "N:<attempt>" repair prompt holds its
parent's whole completion and counts from the root of the parent's baseline, which biases
it, so IBPO refuses source="repair" (`counterfactuals.biased_choices`). To measure one
knowingly: `:hint --config.counterfactual.source=repair
--config.counterfactual.accept_bias=True`.

Expected result (tiny, 2-core AMD EPYC CPU): greedy accuracy on 128 held-out problems goes
from about 43% after the warm start to 60-75% after 60 iterations, in about 3 minutes;
metrics.jsonl logs ibpo/kept_pair_frac, ibpo/edit_distance_mean, ibpo/distance_frac/<bin>,
ibpo/comparison_abs_mean and ibpo/terminal_comparison_corr each iteration. Whether IBPO
lowers the gradient variance or learns faster than GRPO at equal generated tokens is
measured by `python experiments/reproduce.py --claims ibpo_loo_variance,ibpo_loo_accuracy`
(docs/claims.md): those figures, not this docstring, are the result.
"""

import importlib.util
import pathlib

_BASE = importlib.util.spec_from_file_location(
  "_grpo_jax_config_long_addition", pathlib.Path(__file__).with_name("long_addition.py")
)
long_addition = importlib.util.module_from_spec(_BASE)
_BASE.loader.exec_module(long_addition)

VARIANTS = ("tiny", "trie", "grpo", "hint")
# (λ, κ) of the trie arm and (λ, κ, τ) of the branch arm: the grid points of claims 10c-10f's
# tuning (experiments/claims.py `tune_ibpo`, seeds 100-102; results/reproductions/tuning/ibpo.md)
# with the highest mean signal ÷ variance against GRPO G = 10 (0.90× and 0.68×: both below 1).
TRIE = (0.5, 16.0)
BRANCH = (0.5, 16.0, 1.0)


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(f"configs/ibpo.py variant {arg!r}; allowed: {', '.join(VARIANTS)}.")
  c = long_addition.get_config("tiny")
  if arg == "grpo":
    c.sampler.group_size = 10
    return c
  lam, shrink, tau = (*TRIE, 1.0) if arg == "trie" else BRANCH
  c.rl.advantage = "ibpo"
  c.rl.advantage_hyper.update(ibpo_lambda=lam, ibpo_tau=tau)
  c.rl.advantage_options = {"shrink": shrink, "scale": "std"}
  if arg == "trie":
    c.sampler.group_size = 10
    return c
  c.counterfactual.update(per_group=4, per_rollout=2, branch_from="all", cut="window")
  if arg == "hint":
    c.counterfactual.update(source=arg, per_rollout=1, weighting="truncated_is")
    c.rl.advantage_hyper.ibpo_is_cap = 2.0
    c.sampler.update(max_prompt_len=64, prompt_buckets=(12, 64))  # q~ holds a hint / attempt.
  return c
