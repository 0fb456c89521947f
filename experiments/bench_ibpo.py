"""IBPO's extra cost per iteration: counterfactual decoding, alignment and the prefix trie.

  python experiments/bench_ibpo.py                 # configs/ibpo.py:tiny vs GRPO, one JSON line
  python experiments/bench_ibpo.py --iterations 6 --quick

Two parts, printed as one JSON line:

1. Whole iterations, side by side in one process: configs/long_addition.py:tiny (GRPO,
   G = 8) and configs/ibpo.py:tiny (the same G = 8 samples + C = 4 branches per group, the
   ibpo estimator), the same warm start and seed; the median of time/iteration and of its
   phases (time/sample, time/counterfactuals, time/update) over the iterations after the
   first (which compiles). extra_share = (IBPO − GRPO) / IBPO: the share of an IBPO
   iteration that IBPO adds.
2. The pieces IBPO adds to prepare, jitted and timed alone on the merged batch's shape
   (median of --repeats calls after a warm-up): the prefix trie with the leave-one-out
   baseline and the advantage (`ibpo.advantage`), the token-level and step-level
   full-rewrite filter (`counterfactuals.rewrite_filter`: batched Levenshtein on the device, no host loop),
   at the tiny shape and at a long-completion shape (64 prompts × 12 rows × 512 tokens)
   to show how they scale.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _config(name: str, *, iterations: int, quick: bool):
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  config_file = "ibpo.py" if name == "ibpo" else "long_addition.py"
  c = config_lib.load(str(ROOT / "configs" / config_file) + ":tiny")
  c.update(iterations=iterations, eval_every=10_000, checkpoint_every=10_000)
  c.update(reward_workers=0, progress=False, eval_size=8)
  if quick:
    c.update(warmstart_steps=10)
  return c


def iteration_seconds(name: str, *, iterations: int, quick: bool) -> dict:
  """Median seconds per phase over iterations 2.. of a run of `name`."""
  from grpo_jax.infra import logs  # noqa: PLC0415
  from grpo_jax.trainer import train  # noqa: PLC0415

  with tempfile.TemporaryDirectory() as workdir:
    train.run(_config(name, iterations=iterations, quick=quick), workdir, log=lambda *_: None)
    lines = [
      x for x in logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl") if x["phase"] == "rl"
    ]
  later = lines[1:] or lines
  keys = ("time/iteration", "time/sample", "time/reward", "time/update", "time/counterfactuals")
  out = {k: statistics.median(x[k] for x in later) for k in keys if k in later[0]}
  out["generated_tokens"] = statistics.median(
    x.get("ibpo/generated_tokens", x["response_length"] * 16 * 8) for x in later
  )
  return out


def _time(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  return statistics.median(ts)


def piece_seconds(*, B: int, G: int, C: int, T: int, repeats: int) -> dict:
  """Seconds of the trie + baseline + advantage and of the two rewrite filters on a random
  merged batch of B groups × (G + C) rows × T tokens (a vocabulary of 16 ids, step end id 0)."""
  from grpo_jax.rl import alignment, counterfactuals, ibpo  # noqa: PLC0415

  rng = np.random.default_rng(0)
  N = B * (G + C)
  tokens = jnp.asarray(rng.integers(0, 16, size=(N, T)), jnp.int32)
  length = rng.integers(T // 4, T + 1, size=N)
  mask = jnp.asarray(np.arange(T)[None, :] < length[:, None])
  rewards = jnp.asarray(rng.integers(0, 2, size=N), jnp.float32)
  groups = jnp.asarray(np.repeat(np.arange(B), G + C), jnp.int32)
  kind = np.tile(np.r_[np.zeros(G), np.ones(C)], B).astype(np.int32)
  parent = np.repeat(np.arange(B) * (G + C), G + C) + np.tile(np.r_[np.arange(G), np.zeros(C)], B)
  prov = counterfactuals.Provenance(
    kind_N=jnp.asarray(kind),
    parent_N=jnp.asarray(parent, jnp.int32),
    own_NT=mask,
    active_N=jnp.ones(N, bool),
  )
  trie = jax.jit(lambda t, m, r, g: ibpo.advantage(t, m, r, g, lam=1.0, eps=1e-6, shrink=1.0)[0])
  out = {
    "rows": N,
    "tokens": T,
    "trie_advantage": _time(trie, tokens, mask, rewards, groups, repeats=repeats),
  }
  for distance in ("token", "step"):
    f = jax.jit(
      lambda t, m, p, tau, d=distance: counterfactuals.rewrite_filter(
        t,
        m,
        p,
        tau,
        distance=d,
        splitter=alignment.StepSplitter(end_ids=(0,)),
        rows=counterfactuals.counterfactual_rows(N, group_size=G, per_group=C),
      )
    )
    out[f"rewrite_filter_{distance}"] = _time(
      f, tokens, mask, prov, jnp.float32(0.5), repeats=repeats
    )
  return out


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--iterations", type=int, default=12)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args(argv)
  grpo = iteration_seconds("grpo", iterations=args.iterations, quick=args.quick)
  ibpo_ = iteration_seconds("ibpo", iterations=args.iterations, quick=args.quick)
  tiny = piece_seconds(B=16, G=8, C=4, T=36, repeats=args.repeats)
  long_T = 128 if args.quick else 512
  big = piece_seconds(B=64, G=8, C=4, T=long_T, repeats=max(args.repeats // 4, 3))
  it = ibpo_["time/iteration"]
  result = {
    "device": jax.devices()[0].device_kind,
    "dtype": "float32",
    "grpo": grpo,
    "ibpo": ibpo_,
    "extra_share": (it - grpo["time/iteration"]) / it,
    "counterfactuals_share": ibpo_.get("time/counterfactuals", 0.0) / it,
    "pieces_tiny": tiny,
    "pieces_tiny_share": {k: v / it for k, v in tiny.items() if k not in ("rows", "tokens")},
    "pieces_long": big,
  }
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main()
