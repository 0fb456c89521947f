"""How much of an oracle value baseline's variance reduction each IBPO state captures, on a
tabular policy with long completions (issue 56; grpo_jax/rl/ibpo.py, "States").

  python experiments/ibpo_states.py                 # seeds 0-4, writes the result below
  python experiments/ibpo_states.py --seeds 9 --groups 500 --out /tmp/s   # a smoke run

The policy: tokens {EOS = 0, 1, 2}, at most T = 10 of them, one softmax per prefix of
non-end tokens (1,023 states × 3 logits, θ ~ N(0, 1) with the EOS logit lowered by 1.5, so
completions run about 5-10 tokens). Reward 1 for a completion that ends with EOS and never
holds two 2s in a row (an unrecoverable error): its last token and whether the error has
happened predict the outcome, and exact prefixes are shared by few of a group's rows past
the first tokens, as on LLM completions. Per seed: N = 4,000 groups of G = 8 samples; each
estimator's per-group gradient ĝ = (1/G) Σ_i Σ_t A_{i,t} ∇log π(o_{i,t}|s_{i,t}) on the same
samples (paired); its variance E‖ĝ − E ĝ‖² over the groups. Estimators, all with scale
"none" and the (G − 1)/G factor, so all unbiased:
  leave_one_out   ibpo λ = 0 (Dr. GRPO: r_i − r̄_g);
  prefix          ibpo λ = 1, κ = 4, the exact prefix;
  window k        ibpo λ = 1, κ = 4, the last k tokens at depth t (k = 1, 2, 3);
  span k          ibpo λ = 1, κ = 4, the last k tokens at any depth (k = 1, 2, 3);
  oracle          A = (G − 1)/G·(r_i − V(s_{i,t})), V the exact value of the state.
Share of the oracle's reduction = (Var[leave_one_out] − Var[X]) / (Var[leave_one_out] −
Var[oracle]).

Rule (written before any run of this script): the one comparison decided is span k = 2
against prefix. Supports if span k = 2 captures the larger share on all of seeds 0-4;
contradicts if prefix captures a share at least as large on 3 or more of them; otherwise
inconclusive. The other rows are reported, not judged.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
import tabular_policy as tab

from grpo_jax.rl import advantages

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "ibpo_states"
EOS, V, T = tab.EOS, 3, 10
S = tab.num_states(vocab=V, T=T)
G = 8
KAPPA = 4.0
RULE = (
  "span k = 2 against prefix (both λ = 1, κ = 4): supports if span k = 2 captures the larger "
  "share of the oracle's variance reduction on all of seeds 0-4; contradicts if prefix's "
  "share is at least as large on 3 or more; otherwise inconclusive."
)
ESTIMATORS = (
  ("leave_one_out", dict(lam=0.0)),
  ("prefix", dict(lam=1.0, state="prefix")),
  *((f"window {k}", dict(lam=1.0, state="window", context=k)) for k in (1, 2, 3)),
  *((f"span {k}", dict(lam=1.0, state="span", context=k)) for k in (1, 2, 3)),
)


def reward(tokens_RT, length_R):
  on_RT = np.arange(T) < length_R[:, None]
  twos_RT = (tokens_RT == 2) & on_RT
  error_R = (twos_RT[:, 1:] & twos_RT[:, :-1]).any(axis=1)
  ended_R = (tokens_RT == EOS).any(axis=1) & (length_R <= T)
  ended_R &= np.take_along_axis(tokens_RT, (length_R - 1)[:, None], axis=1)[:, 0] == EOS
  return (ended_R & ~error_R).astype(np.float32)


@functools.cache
def _estimator(state: str, context: int):
  options = {} if state == "prefix" else dict(state=state, context=context)
  return jax.jit(advantages.REGISTRY.make("ibpo", shrink=KAPPA, scale="none", **options))


def measure(seed: int, *, groups: int) -> dict:
  """{estimator: variance} and the shares of one seed (module docstring)."""
  rng = np.random.default_rng(seed)
  theta = rng.normal(0.0, 1.0, (S, V))
  theta[:, EOS] -= 1.5
  pi = tab.policy(theta)
  zeros = np.zeros((groups * G, T), np.int64)
  tokens, length = tab.sample(rng, pi, zeros, np.zeros(groups * G, np.int64))
  r = reward(tokens, length)
  inputs = advantages.AdvantageInputs(
    rewards_B=jnp.asarray(r),
    group_ids_B=jnp.asarray(np.repeat(np.arange(groups), G), jnp.int32),
    mask_BT=jnp.asarray(np.arange(T) < length[:, None]),
    tokens_BT=jnp.asarray(tokens, jnp.int32),
  )
  var = {}
  for name, opts in ESTIMATORS:
    fn = _estimator(opts.get("state", "prefix"), opts.get("context", 0))
    adv = np.asarray(fn(inputs, advantages.hyper_values(ibpo_lambda=opts["lam"])))
    g = tab.group_gradients(pi, tokens, length, adv, group_size=G).reshape(groups, -1)
    var[name] = float(np.sum((g - g.mean(axis=0)) ** 2, axis=1).mean())
  v_S = tab.values(pi, reward, T=T)
  on_RT = np.arange(T) < length[:, None]
  oracle = np.where(on_RT, (G - 1) / G * (r[:, None] - v_S[tab.states(tokens, vocab=V)]), 0.0)
  g = tab.group_gradients(pi, tokens, length, oracle, group_size=G).reshape(groups, -1)
  var["oracle"] = float(np.sum((g - g.mean(axis=0)) ** 2, axis=1).mean())
  gap = var["leave_one_out"] - var["oracle"]
  share = {k: (var["leave_one_out"] - v) / gap for k, v in var.items()}
  shared = _shared_prefix_depth(tokens, length, groups)
  return dict(
    seed=seed,
    variance=var,
    share=share,
    pass_rate=float(r.mean()),
    mean_length=float(length.mean()),
    rows_sharing_prefix_at_depth=shared,
  )


def _shared_prefix_depth(tokens, length, groups) -> list[float]:
  """Per depth t: the mean share of a group's other rows that share a row's prefix o_{<t}."""
  out = []
  for t in range(1, T):
    key = [tuple(row[:t]) for row in tokens]
    share = []
    for b in range(groups):
      rows = range(b * G, (b + 1) * G)
      live = [i for i in rows if length[i] > t]
      share += [sum(key[j] == key[i] for j in live if j != i) / (G - 1) for i in live]
    out.append(float(np.mean(share)) if share else 0.0)
  return out


def verdict(per_seed: list[dict]) -> tuple[str, str]:
  wins = [s["share"]["span 2"] > s["share"]["prefix"] for s in per_seed]
  losses = len(wins) - sum(wins)
  if all(wins) and len(wins) == 5:
    return "supports", f"span k = 2 captured the larger share on {sum(wins)} of 5 seeds."
  if losses >= 3:
    return "contradicts", f"prefix's share was at least as large on {losses} of 5 seeds."
  return "inconclusive", f"span k = 2 won on {sum(wins)} of {len(wins)} seeds."


def markdown(result: dict) -> str:
  names = [n for n, _ in ESTIMATORS] + ["oracle"]
  lines = [
    "# IBPO's states: share of an oracle baseline's variance reduction (tabular policy)",
    "",
    f"Machine: {result['machine']}, {result['date']}. Command: `python experiments/"
    f"ibpo_states.py`. {result['groups']:,} groups of G = {G} per seed, T = {T}, κ = {KAPPA:g}.",
    "",
    "| estimator | " + " | ".join(f"seed {s['seed']}" for s in result["per_seed"]) + " |",
    "|---" * (len(result["per_seed"]) + 1) + "|",
  ]
  for n in names:
    cells = [f"{100 * s['share'][n]:.1f}%" for s in result["per_seed"]]
    lines.append(f"| {n} | " + " | ".join(cells) + " |")
  lines += [
    "",
    "Share of the oracle's variance reduction over the leave-one-out baseline (0%: none, "
    "100%: all of it; negative: more variance than the leave-one-out mean).",
    "",
    f"**Rule (fixed before the runs):** {RULE} **Verdict: {result['verdict']}.** "
    f"{result['reason']}",
    "",
    "Pass rate and mean length per seed: "
    + ", ".join(f"{s['pass_rate']:.2f} / {s['mean_length']:.1f}" for s in result["per_seed"])
    + ". Mean share of a group's other rows sharing a row's exact prefix, depths 1-9 (seed "
    f"{result['per_seed'][0]['seed']}): "
    + ", ".join(f"{x:.2f}" for x in result["per_seed"][0]["rows_sharing_prefix_at_depth"])
    + ".",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--seeds", default="0,1,2,3,4")
  parser.add_argument("--groups", type=int, default=4000)
  parser.add_argument("--out", default=str(OUT))
  args = parser.parse_args(argv)
  import datetime  # noqa: PLC0415

  import demo_seeds  # noqa: PLC0415 -- experiments/ is on sys.path when run as a script.

  t0 = time.perf_counter()
  per_seed = [measure(int(s), groups=args.groups) for s in args.seeds.split(",")]
  kind, reason = verdict(per_seed)
  cpu = demo_seeds.cpu_model()
  result = dict(
    claim="span k = 2 captures more of an oracle baseline's variance reduction than the prefix",
    rule=RULE,
    verdict=kind,
    reason=reason,
    groups=args.groups,
    per_seed=per_seed,
    machine=f"{cpu}, {len(jax.devices())} JAX CPU device(s)",
    date=datetime.date.today().isoformat(),
    seconds=round(time.perf_counter() - t0, 1),
  )
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  (out / "states.json").write_text(json.dumps(result, indent=1) + "\n")
  (out / "states.md").write_text(markdown(result))
  print(markdown(result))
  return result


if __name__ == "__main__":
  main()
