"""Claims 10-10g: IBPO against GRPO. 10 and 10b (superseded) measure the first
reconstruction; 10c-10f the leave-one-out prefix baseline of configs/ibpo.py, tuned on their
own seeds (tune_ibpo); 10g the same estimator and GRPO on the same rollouts (tune_ibpo_paired).
claims.py holds their rules and re-exports every name here as claims.<name>."""

from __future__ import annotations

import time

import evidence
import numpy as np
from claims_base import (
  _bar,
  _eval_curve,
  _fig,
  _final_acc,
  _mean_key,
  _measured,
  _paired,
  _ratios,
  _rl_values,
  _v,
)
from evidence import Arm, Outcome

from grpo_jax.infra import config_lib

ibpo_config = config_lib.module(str(evidence.ROOT / "configs" / "ibpo.py"))  # TRIE, BRANCH.

# ----------------------------------------------------------------------------
# 10. IBPO: gradient variance and accuracy at equal generated tokens.
# ----------------------------------------------------------------------------

_IBPO = (
  ("rl.advantage", "ibpo"),
  ("rl.advantage_options", {"base": "grpo", "shrink": 1.0}),
  ("rl.advantage_hyper.ibpo_tau", 0.5),
  ("eval_every", 10),
)
IBPO_ARMS = {
  "grpo": Arm("ibpo_grpo_g10", overrides=(("sampler.group_size", 10), ("eval_every", 10))),
  "branch": Arm(
    "ibpo_branch",
    overrides=(
      *_IBPO,
      ("counterfactual.per_group", 4),
      ("counterfactual.per_rollout", 2),
      ("counterfactual.branch_from", "failed"),
      ("counterfactual.cut", "step"),
      # A plan found biased after this arm's verdict (issue 56; counterfactuals.
      # biased_choices): admitted so that the recorded arm reruns as it ran.
      ("counterfactual.accept_bias", True),
    ),
  ),
  "trie": Arm("ibpo_trie_g10", overrides=(*_IBPO, ("sampler.group_size", 10))),
}


def measure_ibpo_variance(*, seeds, root, quick) -> list[dict]:
  """ibpo_variance.measure per seed (16 prompts × 8 groups), cached."""
  full = dict(prompts=16, groups=8)
  return _measured("ibpo_variance", "ibpo-variance", seeds=seeds, root=root, quick=quick, full=full)


def analyse_ibpo_variance(per_seed: list[dict]) -> Outcome:
  def ratio(arm, what):
    return _ratios(per_seed, arm, "grpo", what)

  figs = {
    "variance_ratio_branch": _fig(
      "gradient variance, IBPO (branches) ÷ GRPO", ratio("branch", "variance")
    ),
    "variance_ratio_trie": _fig(
      "gradient variance, IBPO (trie only) ÷ GRPO", ratio("trie", "variance")
    ),
    "signal_ratio_branch": _fig(
      "‖mean gradient‖², IBPO (branches) ÷ GRPO", ratio("branch", "signal")
    ),
    "token_ratio_branch": _fig(
      "generated tokens per group, IBPO ÷ GRPO", ratio("branch", "tokens_per_group")
    ),
    "residual_corr_branch": _fig(
      "corr(shaping, r − φ), IBPO (branches)",
      [r["branch"].get("ibpo/shaping_residual_corr") for r in per_seed],
    ),
    "kept_pair_frac": _fig(
      "kept counterfactual pairs (τ = 0.5)",
      [r["branch"].get("ibpo/kept_pair_frac") for r in per_seed],
    ),
  }
  verdict = evidence.combine([evidence.below(figs["variance_ratio_branch"], 1.0)])
  reason = (
    f"At {_v(figs['token_ratio_branch'], '.2f')}× GRPO's generated tokens, IBPO with branches "
    f"leaves {_v(figs['variance_ratio_branch'], '.2f')}× GRPO's gradient variance (trie only: "
    f"{_v(figs['variance_ratio_trie'], '.2f')}×); the shaping term correlates "
    f"{_v(figs['residual_corr_branch'], '+.3f')} with the residual r − φ (the paper's argument "
    "wants it negative)."
  )

  def plot(ax):
    _bar(ax, figs, list(figs)[:4])
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--")

  return Outcome(figs, verdict, reason, "variance_ratio_branch", plot)


def analyse_ibpo_accuracy(runs) -> Outcome:
  arms = {k: runs[a.name] for k, a in IBPO_ARMS.items()}
  final = {k: [_final_acc(r) for r in v] for k, v in arms.items()}
  figs = {f"final_{k}": _fig(f"final greedy accuracy, {k}", v) for k, v in final.items()}
  figs["gap_branch"] = _fig(
    "IBPO (branches) − GRPO, final accuracy", _paired(final["branch"], final["grpo"])
  )
  figs["gap_trie"] = _fig(
    "IBPO (trie) − GRPO, final accuracy", _paired(final["trie"], final["grpo"])
  )
  figs["iteration_seconds_ratio"] = _fig(
    "seconds per iteration, IBPO (branches) ÷ GRPO",
    _paired_ratio(
      [_mean_key(r, "time/iteration") for r in arms["branch"]],
      [_mean_key(r, "time/iteration") for r in arms["grpo"]],
    ),
  )
  figs["token_ratio"] = _fig(
    "generated tokens per iteration, IBPO (branches) ÷ GRPO",
    _paired_ratio(
      [_mean_key(r, "ibpo/generated_tokens") for r in arms["branch"]],
      [_rows_tokens(r) for r in arms["grpo"]],
    ),
  )
  verdict = evidence.combine([evidence.above(figs["gap_branch"], 0.0)])
  reason = (
    f"Final greedy accuracy: GRPO {_v(figs['final_grpo'], '.3f')}, IBPO with branches "
    f"{_v(figs['final_branch'], '.3f')} (gap {_v(figs['gap_branch'], '+.3f')}), trie only "
    f"{_v(figs['final_trie'], '.3f')} (gap {_v(figs['gap_trie'], '+.3f')}); an IBPO "
    f"iteration costs {_v(figs['iteration_seconds_ratio'], '.2f')}× GRPO's."
  )

  def plot(ax):
    curves = {k: [_eval_curve(r) for r in arms[k]] for k in arms}
    its = curves["grpo"][0][0]
    acc = {k: np.array([c[1] for c in v]) for k, v in curves.items()}
    for k, color in (("grpo", "tab:blue"), ("branch", "tab:orange"), ("trie", "tab:green")):
      ax.plot(its, acc[k].mean(axis=0), color=color, label=f"{k}: mean of {len(acc[k])} seeds")
    ax.set_xlabel("iteration")
    ax.set_ylabel("greedy held-out accuracy (mean over seeds)")
    gap = ax.twinx()
    for k, color in (("branch", "tab:orange"), ("trie", "tab:green")):
      d = acc[k] - acc["grpo"]
      mean, half = (
        d.mean(axis=0),
        evidence.t_quantile(len(d)) * d.std(axis=0, ddof=1) / np.sqrt(len(d)),
      )
      gap.plot(its, mean, color=color, ls="--", label=f"{k} − grpo (paired, 95% CI)")
      gap.fill_between(its, mean - half, mean + half, color=color, alpha=0.12)
    gap.axhline(0.0, color="grey", lw=0.6)
    gap.set_ylabel("paired accuracy gap to GRPO (dashed)")
    lines = ax.get_legend_handles_labels()
    more = gap.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")

  return Outcome(figs, verdict, reason, "gap_branch", plot)


def _rows_tokens(records):
  """Generated tokens per iteration of a run without counterfactuals: 16 × 10 rows."""
  length = _mean_key(records, "response_length")
  return None if length is None else length * 16 * 10


def _paired_ratio(a: list, b: list) -> list:
  return [None if x is None or y in (None, 0) else x / y for x, y in zip(a, b, strict=True)]


# ----------------------------------------------------------------------------
# 10c-10f. IBPO re-derived (issue 29): the leave-one-out prefix baseline.
# ----------------------------------------------------------------------------

TUNING_SEEDS = (100, 101, 102)
TUNING_GRID = {"shrink": (1.0, 4.0, 16.0), "lam": (0.5, 1.0), "tau": (0.5, 1.0)}


def _ibpo_arm(name: str, params, *more) -> Arm:
  """configs/ibpo.py's estimator at (λ, κ[, τ]) as overrides of long_addition:tiny."""
  lam, shrink, *tau = params
  return Arm(
    name,
    overrides=(
      ("rl.advantage", "ibpo"),
      ("rl.advantage_options", {"shrink": shrink, "scale": "std"}),
      ("rl.advantage_hyper.ibpo_lambda", lam),
      *((("rl.advantage_hyper.ibpo_tau", tau[0]),) if tau else ()),
      ("eval_every", 10),
      *more,
    ),
  )


LOO_ARMS = {
  "grpo": IBPO_ARMS["grpo"],  # G = 10: about the branch arm's generated tokens.
  "grpo8": Arm("ibpo_grpo_g8", overrides=(("eval_every", 10),)),  # Its trained rows.
  "branch": _ibpo_arm(
    "ibpo_loo_branch",
    ibpo_config.BRANCH,
    ("counterfactual.per_group", 4),
    ("counterfactual.per_rollout", 2),
    ("counterfactual.branch_from", "all"),
    ("counterfactual.cut", "uniform"),
    ("counterfactual.accept_bias", True),  # Biased (issue 56), admitted to rerun as judged.
  ),
  "trie": _ibpo_arm("ibpo_loo_trie", ibpo_config.TRIE, ("sampler.group_size", 10)),
}


def _tuned_tag() -> str:
  import hashlib  # noqa: PLC0415

  blob = repr((ibpo_config.TRIE, ibpo_config.BRANCH)).encode()
  return hashlib.sha256(blob).hexdigest()[:8]


def measure_ibpo_loo_variance(*, seeds, root, quick) -> list[dict]:
  """ibpo_variance.measure per seed (16 prompts × 8 groups) at the tuned λ, κ, τ, cached."""
  cache = f"ibpo-loo-variance-{_tuned_tag()}"
  full = dict(prompts=16, groups=8)
  return _measured("ibpo_variance", cache, seeds=seeds, root=root, quick=quick, full=full)


def _ratio_or_none(per_seed: list[dict], arm: str, base: str, what: str) -> list:
  """Per seed r[arm][what] / r[base][what]; None where either is missing or the base is 0."""
  out = []
  for r in per_seed:
    a, b = r[arm].get(what), r[base].get(what)
    out.append(None if a is None or not b else a / b)
  return out


def _tuned(arm: str) -> str:
  """The tuned estimator of an arm, for its result page."""
  lam, shrink, *tau = ibpo_config.BRANCH if arm == "branch" else ibpo_config.TRIE
  tau = f", τ = {tau[0]:g}" if tau else ""
  return (
    f" (λ = {lam:g}, κ = {shrink:g}{tau}: the grid's best on tuning seeds 100-102, "
    "results/reproductions/tuning/ibpo.md; verdict seeds 10-14.)"
  )


def _snr_figs(per_seed: list[dict], arm: str) -> dict:
  def ratio(what, base="grpo"):
    return _ratio_or_none(per_seed, arm, base, what)

  return {
    f"snr_ratio_{arm}": _fig(f"signal ÷ variance, IBPO ({arm}) ÷ GRPO G = 10", ratio("snr")),
    f"variance_ratio_{arm}": _fig(f"gradient variance, IBPO ({arm}) ÷ GRPO", ratio("variance")),
    f"signal_ratio_{arm}": _fig(f"‖E ĝ‖², IBPO ({arm}) ÷ GRPO", ratio("signal")),
    f"token_ratio_{arm}": _fig(
      f"generated tokens per group, IBPO ({arm}) ÷ GRPO", ratio("tokens_per_group")
    ),
    f"row_ratio_{arm}": _fig(
      f"trained rows per group, IBPO ({arm}) ÷ GRPO", ratio("rows_per_group")
    ),
    f"corr_{arm}": _fig(
      f"terminal–comparison correlation, IBPO ({arm})",
      [r[arm].get("ibpo/terminal_comparison_corr") for r in per_seed],
    ),
  }


def analyse_ibpo_loo_variance(per_seed: list[dict]) -> Outcome:
  figs = _snr_figs(per_seed, "branch")
  figs["snr_ratio_branch_vs_grpo8"] = _fig(
    "signal ÷ variance, IBPO (branch) ÷ GRPO G = 8 (equal trained rows)",
    _ratio_or_none(per_seed, "branch", "grpo8", "snr"),
  )
  figs["snr_ratio_grpo8"] = _fig(
    "signal ÷ variance, GRPO G = 8 ÷ G = 10", _ratio_or_none(per_seed, "grpo8", "grpo", "snr")
  )
  figs["kept_pair_frac"] = _fig(
    "kept branches (edit distance ≤ τ)", [r["branch"].get("ibpo/kept_pair_frac") for r in per_seed]
  )
  verdict = evidence.combine([evidence.above(figs["snr_ratio_branch"], 1.0)])
  s = figs["snr_ratio_branch"]
  reason = (
    f"At {_v(figs['token_ratio_branch'], '.2f')}× GRPO G = 10's generated tokens (and "
    f"{_v(figs['row_ratio_branch'], '.2f')}× its trained rows), IBPO with branches keeps "
    f"{_v(s, '.3f')}× [{_v(s, '.3f', 0)}, {_v(s, '.3f', 1)}] GRPO's signal per unit variance "
    f"({_v(figs['snr_ratio_branch_vs_grpo8'], '.3f')}× GRPO G = 8's, its own samples); the "
    f"comparison term correlates {_v(figs['corr_branch'], '+.3f')} with the terminal term."
    + _tuned("branch")
  )

  def plot(ax):
    _bar(ax, figs, ["snr_ratio_branch", "snr_ratio_branch_vs_grpo8", "snr_ratio_grpo8"])
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--")

  return Outcome(figs, verdict, reason, "snr_ratio_branch", plot)


def analyse_ibpo_trie_variance(per_seed: list[dict]) -> Outcome:
  figs = _snr_figs(per_seed, "trie")
  figs["comparison_abs_mean"] = _fig(
    "mean |A − A^{λ=0}|, IBPO (trie)",
    [r["trie"].get("ibpo/comparison_abs_mean") for r in per_seed],
  )
  verdict = evidence.combine([evidence.above(figs["snr_ratio_trie"], 1.0)])
  s = figs["snr_ratio_trie"]
  reason = (
    f"On GRPO G = 10's own rollouts, the trie's prefix baseline keeps {_v(s, '.3f')}× "
    f"[{_v(s, '.3f', 0)}, {_v(s, '.3f', 1)}] GRPO's signal per unit variance; the comparison "
    f"term correlates {_v(figs['corr_trie'], '+.3f')} with the terminal term." + _tuned("trie")
  )

  def plot(ax):
    _bar(ax, figs, ["snr_ratio_trie", "variance_ratio_trie", "signal_ratio_trie"])
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--")

  return Outcome(figs, verdict, reason, "snr_ratio_trie", plot)


def _accuracy_outcome(runs, arm: str) -> Outcome:
  arms = {k: runs[LOO_ARMS[k].name] for k in ("grpo", "grpo8", arm)}
  final = {k: [_final_acc(r) for r in v] for k, v in arms.items()}
  figs = {f"final_{k}": _fig(f"final greedy accuracy, {k}", v) for k, v in final.items()}
  figs[f"gap_{arm}"] = _fig(
    f"IBPO ({arm}) − GRPO G = 10, final accuracy", _paired(final[arm], final["grpo"])
  )
  figs[f"gap_{arm}_vs_grpo8"] = _fig(
    f"IBPO ({arm}) − GRPO G = 8, final accuracy", _paired(final[arm], final["grpo8"])
  )
  figs[f"corr_{arm}"] = _fig(
    f"terminal–comparison correlation (mean over iterations), {arm}",
    [_mean_key(r, "ibpo/terminal_comparison_corr") for r in arms[arm]],
  )
  figs[f"seconds_ratio_{arm}"] = _fig(
    f"seconds per iteration, IBPO ({arm}) ÷ GRPO G = 10",
    _paired_ratio(
      [_mean_key(r, "time/iteration") for r in arms[arm]],
      [_mean_key(r, "time/iteration") for r in arms["grpo"]],
    ),
  )
  if arm == "branch":
    figs["token_ratio"] = _fig(
      "generated tokens per iteration, IBPO (branch) ÷ GRPO G = 10",
      _paired_ratio(
        [_mean_key(r, "ibpo/generated_tokens") for r in arms["branch"]],
        [_rows_tokens(r) for r in arms["grpo"]],
      ),
    )
  g = figs[f"gap_{arm}"]
  verdict = evidence.combine([evidence.above(g, 0.0)])
  reason = (
    f"Final greedy accuracy: GRPO G = 10 {_v(figs['final_grpo'], '.3f')}, IBPO ({arm}) "
    f"{_v(figs[f'final_{arm}'], '.3f')}: gap {_v(g, '+.3f')} [{_v(g, '+.3f', 0)}, "
    f"{_v(g, '+.3f', 1)}]; against GRPO G = 8 {_v(figs[f'gap_{arm}_vs_grpo8'], '+.3f')}."
    + _tuned(arm)
  )

  def plot(ax):
    curves = {k: np.array([_eval_curve(r)[1] for r in v]) for k, v in arms.items()}
    its = _eval_curve(arms["grpo"][0])[0]
    for k, color in (("grpo", "tab:blue"), ("grpo8", "tab:purple"), (arm, "tab:orange")):
      ax.plot(
        its, curves[k].mean(axis=0), color=color, label=f"{k}: mean of {len(curves[k])} seeds"
      )
    ax.set_xlabel("iteration")
    ax.set_ylabel("greedy held-out accuracy (mean over seeds)")
    twin = ax.twinx()
    d = curves[arm] - curves["grpo"]
    half = evidence.t_quantile(len(d)) * d.std(axis=0, ddof=1) / np.sqrt(len(d))
    twin.plot(its, d.mean(axis=0), color="tab:orange", ls="--", label=f"{arm} − grpo (95% CI)")
    twin.fill_between(
      its, d.mean(axis=0) - half, d.mean(axis=0) + half, color="tab:orange", alpha=0.12
    )
    twin.axhline(0.0, color="grey", lw=0.6)
    twin.set_ylabel("paired accuracy gap to GRPO G = 10 (dashed)")
    a, b = ax.get_legend_handles_labels(), twin.get_legend_handles_labels()
    ax.legend(a[0] + b[0], a[1] + b[1], fontsize=7, loc="lower right")

  return Outcome(figs, verdict, reason, f"gap_{arm}", plot)


def analyse_ibpo_loo_accuracy(runs) -> Outcome:
  return _accuracy_outcome(runs, "branch")


def analyse_ibpo_trie_accuracy(runs) -> Outcome:
  return _accuracy_outcome(runs, "trie")


def tune_ibpo(*, root, quick=False, seeds=TUNING_SEEDS) -> dict:
  """The tuning grid of claims 10c-10f on its own seeds (never verdict seeds): for each
  seed, ibpo_variance.measure_grid over κ × λ (trie) and κ × λ × τ (branch), GRPO G = 10 the
  reference; the point with the highest mean SNR ratio over the seeds wins, per arm."""
  import itertools  # noqa: PLC0415
  import json  # noqa: PLC0415

  import ibpo_variance  # noqa: PLC0415

  grid = {}
  for shrink, lam in itertools.product(TUNING_GRID["shrink"], TUNING_GRID["lam"]):
    grid[f"trie/k{shrink:g}_l{lam:g}"] = ("trie", (lam, shrink))
    for tau in TUNING_GRID["tau"]:
      grid[f"branch/k{shrink:g}_l{lam:g}_t{tau:g}"] = ("branch", (lam, shrink, tau))
  per_seed = []
  for s in seeds:
    path = root / f"ibpo-tuning-{'quick' if quick else 'full'}" / f"seed{s}.json"
    if not path.exists():
      size = dict(prompts=4, groups=4) if quick else dict(prompts=16, groups=8)
      got = ibpo_variance.measure_grid(s, grid=grid, quick=quick, **size)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(json.dumps(got))
    per_seed.append(json.loads(path.read_text()))
  table = {}
  for name, (arm, params) in grid.items():
    ratios = [r[name]["snr"] / r["grpo"]["snr"] if r["grpo"]["snr"] else np.nan for r in per_seed]
    table[name] = {
      "arm": arm,
      "params": params,
      "snr_ratio": ratios,
      "mean": float(np.mean(ratios)),
    }
  best = {
    arm: max((n for n in table if table[n]["arm"] == arm), key=lambda n: table[n]["mean"])
    for arm in ("trie", "branch")
  }
  return {
    "seeds": list(seeds),
    "verdict": "not judged: a tuning grid, no rule; it chose λ, κ, τ for claims 10c-10f, "
    "which are judged on verdict seeds 10-14",
    "grid": TUNING_GRID,
    "table": table,
    "best": best,
    "per_seed": per_seed,
  }


# ----------------------------------------------------------------------------
# 10g. IBPO against GRPO on the same rollouts (issue 56: claim 10c's design, paired).
# ----------------------------------------------------------------------------

PAIRED_SEEDS = (30, 31, 32, 33, 34)  # Claim 10g's verdict seeds, fixed with its rule.
# Past the edge of claims 10c-10f's grid (its best, κ = 16 and λ = 0.5, sat on an edge);
# τ = 1 only: a filter at τ < 1 biases the baseline (counterfactuals.biased_choices).
PAIRED_GRID = {"shrink": (16.0, 64.0, 256.0), "lam": (0.25, 0.5, 1.0)}
PAIRED_TUNING = evidence.ROOT / "experiments/results/reproductions/tuning/ibpo_paired.json"


def _paired_cached(seed, points, *, root, cache, quick) -> dict:
  """ibpo_variance.measure_paired of one seed (16 prompts × 8 groups; 4 × 4 with quick),
  cached as JSON under root/<cache>-quick|full/seed<s>.json, with its seconds."""
  import json  # noqa: PLC0415

  import ibpo_variance  # noqa: PLC0415

  model = "" if evidence.model_name() == "tiny" else f"-{evidence.model_name()}"
  path = root / f"{cache}-{'quick' if quick else 'full'}{model}" / f"seed{seed}.json"
  if not path.exists():
    size = dict(prompts=4, groups=4) if quick else dict(prompts=16, groups=8)
    t0 = time.perf_counter()
    got = ibpo_variance.measure_paired(seed, points=points, quick=quick, **size)
    got["seconds"] = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(got))
  return json.loads(path.read_text())


def tune_ibpo_paired(*, root, quick=False, seeds=TUNING_SEEDS) -> dict:
  """Claim 10g's grid on the tuning seeds (never its verdict seeds): per seed, GRPO (λ = 0)
  and each (λ, κ) of PAIRED_GRID on the same rollouts (`ibpo_variance.measure_paired`); the
  point with the highest mean paired SNR ratio wins."""
  import itertools  # noqa: PLC0415

  points = {"grpo": (0.0, PAIRED_GRID["shrink"][0], 1.0)}
  for shrink, lam in itertools.product(PAIRED_GRID["shrink"], PAIRED_GRID["lam"]):
    points[f"k{shrink:g}_l{lam:g}"] = (lam, shrink, 1.0)
  per_seed = [
    _paired_cached(s, points, root=root, cache="ibpo-paired-tuning", quick=quick) for s in seeds
  ]
  table = {}
  for name, params in points.items():
    if name == "grpo":
      continue
    ratios = [r[name]["snr"] / r["grpo"]["snr"] if r["grpo"]["snr"] else np.nan for r in per_seed]
    table[name] = {"params": list(params), "snr_ratio": ratios, "mean": float(np.mean(ratios))}
  best = max(table, key=lambda n: table[n]["mean"])
  return {
    "seeds": list(seeds),
    "verdict": "not judged: a tuning grid, no rule; it chose λ and κ for claim 10g, judged "
    "on verdict seeds 30-34",
    "grid": PAIRED_GRID,
    "table": table,
    "best": best,
    "best_params": table[best]["params"],
    "per_seed_snr": [{k: v["snr"] for k, v in r.items() if k != "seconds"} for r in per_seed],
  }


def _paired_params() -> tuple[float, float]:
  """(λ, κ) claim 10g's tuning chose (PAIRED_TUNING, committed before its verdict runs)."""
  import json  # noqa: PLC0415

  if not PAIRED_TUNING.exists():
    raise FileNotFoundError(
      f"{PAIRED_TUNING} is missing: run `python experiments/reproduce.py --tune_ibpo_paired` "
      "(tuning seeds only) before claim 10g."
    )
  lam, shrink, _ = json.loads(PAIRED_TUNING.read_text())["best_params"]
  return lam, shrink


def measure_ibpo_paired_variance(*, seeds, root, quick) -> list[dict]:
  """GRPO (λ = 0) and IBPO at the tuned (λ, κ) on the same rollouts, per seed, cached."""
  lam, shrink = _paired_params()
  points = {"grpo": (0.0, shrink, 1.0), "ibpo": (lam, shrink, 1.0)}
  cache = f"ibpo-paired-l{lam:g}-k{shrink:g}"
  return [_paired_cached(s, points, root=root, cache=cache, quick=quick) for s in seeds]


def analyse_ibpo_paired_variance(per_seed: list[dict]) -> Outcome:
  def ratio(what):
    return _ratio_or_none(per_seed, "ibpo", "grpo", what)

  figs = {
    "snr_ratio_paired": _fig("signal ÷ variance, IBPO ÷ GRPO on the same rollouts", ratio("snr")),
    "variance_ratio_paired": _fig("gradient variance, IBPO ÷ GRPO", ratio("variance")),
    "signal_ratio_paired": _fig("‖E ĝ‖², IBPO ÷ GRPO", ratio("signal")),
    "corr_paired": _fig(
      "terminal–comparison correlation, IBPO",
      [r["ibpo"].get("ibpo/terminal_comparison_corr") for r in per_seed],
    ),
    "pass_rate": _fig("pass rate of the samples", [r["grpo"]["pass_rate"] for r in per_seed]),
  }
  verdict = evidence.combine([evidence.above(figs["snr_ratio_paired"], 1.0)])
  s = figs["snr_ratio_paired"]
  lam, shrink = _paired_params()
  reason = (
    f"On the same rollouts (G = 8 samples + 4 window-cut branches per group), IBPO at λ = "
    f"{lam:g}, κ = {shrink:g} keeps {_v(s, '.3f')}× [{_v(s, '.3f', 0)}, {_v(s, '.3f', 1)}] "
    f"GRPO's signal per unit variance (variance {_v(figs['variance_ratio_paired'], '.3f')}×); "
    f"the comparison term correlates {_v(figs['corr_paired'], '+.3f')} with the terminal term. "
    "(λ, κ: the paired grid's best on tuning seeds 100-102, tuning/ibpo_paired.md; verdict "
    "seeds 30-34.)"
  )

  def plot(ax):
    _bar(ax, figs, ["snr_ratio_paired", "variance_ratio_paired", "signal_ratio_paired"])
    ax.axhline(1.0, color="tab:red", lw=0.8, ls="--")

  return Outcome(figs, verdict, reason, "snr_ratio_paired", plot)


# ----------------------------------------------------------------------------
# 10h. IBPO as shipped trains more stably than GRPO (issue 56: the paper's stability claim).
# ----------------------------------------------------------------------------

STABILITY_SEEDS = (40, 41, 42, 43, 44)  # Claim 10h's verdict seeds, fixed with its rule.
STABILITY_EVAL_EVERY = 5  # Held-out greedy accuracy at iterations 0, 5, ..., 60.
STABILITY_ARMS = {
  "grpo": Arm(
    "ibpo_stability_grpo_g10",
    overrides=(("sampler.group_size", 10), ("eval_every", STABILITY_EVAL_EVERY)),
  ),
  "ibpo": Arm(  # configs/ibpo.py:tiny's estimator and its unbiased plan, over long_addition.
    "ibpo_stability_branch",
    overrides=(
      ("rl.advantage", "ibpo"),
      ("rl.advantage_options", {"shrink": ibpo_config.BRANCH[1], "scale": "std"}),
      ("rl.advantage_hyper.ibpo_lambda", ibpo_config.BRANCH[0]),
      ("rl.advantage_hyper.ibpo_tau", ibpo_config.BRANCH[2]),
      ("counterfactual.per_group", 4),
      ("counterfactual.per_rollout", 2),
      ("counterfactual.branch_from", "all"),
      ("counterfactual.cut", "window"),
      ("eval_every", STABILITY_EVAL_EVERY),
    ),
  ),
}


def drawdown(accuracies) -> float | None:
  """The largest fall of a held-out accuracy curve below its best so far:
  max_j (max_{i ≤ j} a_i − a_j); 0 for a curve that never falls, None without points."""
  if not accuracies:
    return None
  best, worst = -np.inf, 0.0
  for a in accuracies:
    best = max(best, a)
    worst = max(worst, best - a)
  return float(worst)


def _regressions(accuracies) -> int | None:
  """How many evaluations scored below the one before."""
  if not accuracies:
    return None
  return int(sum(b < a for a, b in zip(accuracies, accuracies[1:])))


def analyse_ibpo_stability(runs) -> Outcome:
  arms = {k: runs[a.name] for k, a in STABILITY_ARMS.items()}
  curves = {k: [_eval_curve(r)[1] for r in v] for k, v in arms.items()}
  down = {k: [drawdown(c) for c in v] for k, v in curves.items()}
  final = {k: [_final_acc(r) for r in v] for k, v in arms.items()}
  figs = {f"drawdown_{k}": _fig(f"largest accuracy drawdown, {k}", v) for k, v in down.items()}
  figs["drawdown_gap"] = _fig(
    "IBPO − GRPO G = 10, largest accuracy drawdown", _paired(down["ibpo"], down["grpo"])
  )
  for k, v in curves.items():
    figs[f"regressions_{k}"] = _fig(
      f"evaluations below the one before, {k}", [_regressions(c) for c in v]
    )
  figs["final_gap"] = _fig(
    "IBPO − GRPO G = 10, final accuracy", _paired(final["ibpo"], final["grpo"])
  )
  figs["grad_norm_cv_gap"] = _fig(
    "IBPO − GRPO G = 10, coefficient of variation of the gradient norm over iterations",
    _paired(*[[_cv(r, "grad_norm") for r in arms[k]] for k in ("ibpo", "grpo")]),
  )
  g = figs["drawdown_gap"]
  verdict = evidence.combine([evidence.below(g, 0.0)])
  reason = (
    f"Largest fall of held-out greedy accuracy below its best so far (every "
    f"{STABILITY_EVAL_EVERY} iterations): GRPO G = 10 {_v(figs['drawdown_grpo'], '.3f')}, "
    f"IBPO {_v(figs['drawdown_ibpo'], '.3f')}: gap {_v(g, '+.3f')} [{_v(g, '+.3f', 0)}, "
    f"{_v(g, '+.3f', 1)}]; final accuracy gap {_v(figs['final_gap'], '+.3f')}."
  )

  def plot(ax):
    its = _eval_curve(arms["grpo"][0])[0]
    for k, color in (("grpo", "tab:blue"), ("ibpo", "tab:orange")):
      for i, c in enumerate(curves[k]):
        ax.plot(its, c, color=color, alpha=0.6, label=f"{k} (one line a seed)" if i == 0 else None)
    ax.set_xlabel("iteration")
    ax.set_ylabel("greedy held-out accuracy")
    ax.legend(fontsize=7, loc="lower right")

  return Outcome(figs, verdict, reason, "drawdown_gap", plot)


def _cv(records, key):
  vals = _rl_values(records, key)
  return float(np.std(vals) / np.mean(vals)) if len(vals) > 1 and np.mean(vals) else None
