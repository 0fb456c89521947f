"""Every shipped training config's tiny variant, trained with LoRA rank 16.

  python experiments/lora_every_config.py                 # ~20 minutes on 2 CPU cores
  python experiments/lora_every_config.py --configs arithmetic,calculator
  python experiments/lora_every_config.py --warmstart 20  # the first protocol (~10 min)

Per config (configs/*.py with a "tiny" variant, sample_demo excepted: it samples, it does
not train), the trainer's CLI in a fresh process with

  --config.model.lora.rank=16 --config.model.lora.dropout=0.05 --config.iterations=2
  --config.eval_every=2 --config.eval_size=8

and the config's own everything else (task, estimator, episodes, counterfactuals, GGUF
import, ...). Rule, fixed before the runs: a config passes when the process exits 0 and
each of its 2 RL iterations logs a finite loss, a gradient norm > 0 and no skipped
(non-finite) step. A run that fails is reported with the last lines of its output.

Protocols (the rule is the same):
  --warmstart 20 (the first, run 2026-11-27/28 and judged: 4 of 11 pass, results/lora/
    every_config_ws20_2026-11-27.json): 20 warm-start steps. The 7 failures are all
    grad_norm 0 at iteration 1: no group with varied rewards after 20 steps, so no
    advantage and no gradient, a property of the protocol, not of LoRA.
  --warmstart own (registered after that verdict and before its own runs): each config's
    own warm start (warmstart_steps as shipped). Expected beforehand to fail by
    construction: smollm2 (its tiny variant is a random 2-layer GGUF, accuracy 0 by
    design, so every reward is 0); the SmolLM2 config proper trains with LoRA in
    results/lora/smollm2_vs_full.md.

  --warmstart own, judged 2026-11-28: 8 of 11 pass. The 3 failures (code_env, gsm8k_qwen,
    smollm2) earn no reward in either iteration (reward_mean 0, adv_std 0): two of them
    were not foreseen above. A control registered after that verdict and before its runs
    (--rank 0: full fine-tuning, the same protocol, those 3 configs): if full fine-tuning
    also has grad_norm 0 in every iteration there, the 3 failures belong to the configs'
    tiny variants (no reward to learn from), not to LoRA; if it has a gradient, to LoRA.

Written to experiments/results/lora/every_config_<protocol>_<date>.json: per config, the
verdict, the exit status, the wall seconds (context only: not a quiet-machine timing), and
each iteration's loss, grad_norm, adv_std, reward_mean and kl_ref/k3 where logged.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

from grpo_jax.infra import logs

ROOT = pathlib.Path(__file__).resolve().parent.parent
SKIP = ("sample_demo",)  # Samples only: no trainer.
OVERRIDES = (
  "--config.iterations=2",
  "--config.eval_every=2",
  "--config.eval_size=8",
  "--config.progress=False",
)
KEPT = ("loss", "grad_norm", "adv_std", "reward_mean", "kl_ref/k3", "nonfinite_steps")


def configs() -> list[str]:
  return [p.stem for p in sorted((ROOT / "configs").glob("*.py")) if p.stem not in SKIP]


def judge(returncode: int, rl_lines: list[dict]) -> str:
  """The rule (module docstring): "passes" or "fails: <why>"."""
  if returncode != 0:
    return f"fails: exit status {returncode}"
  if len(rl_lines) != 2:
    return f"fails: {len(rl_lines)} RL iterations logged, 2 expected"
  for r in rl_lines:
    if not math.isfinite(r.get("loss", math.nan)):
      return f"fails: loss {r.get('loss')!r} at iteration {r.get('iteration')}"
    if not r.get("grad_norm", 0.0) > 0:
      return f"fails: grad_norm {r.get('grad_norm')!r} at iteration {r.get('iteration')}"
    if r.get("nonfinite_steps", 0) != 0:
      return f"fails: {r['nonfinite_steps']} skipped steps at iteration {r.get('iteration')}"
  return "passes"


def lora_overrides(rank: int) -> list[str]:
  """rank 16 with dropout 0.05 (the check); rank 0: no adapters (the control)."""
  if not rank:
    return ["--config.model.lora.rank=0"]
  return [f"--config.model.lora.rank={rank}", "--config.model.lora.dropout=0.05"]


def claim_and_verdict(passed: int, n: int, *, rank: int) -> tuple[str, str]:
  """(the claim a file tests, its verdict under the rule). rank > 0: LoRA trains every
  listed config (supports iff all pass). rank 0, the control: full fine-tuning fails the
  listed configs the same way (supports iff none passes, contradicts iff all pass)."""
  if rank:
    claim = f"LoRA rank {rank} trains every listed config under this protocol"
    return claim, "supports" if passed == n else "contradicts"
  claim = "full fine-tuning also fails the listed configs (their failures are not LoRA's)"
  return claim, "supports" if passed == 0 else "contradicts" if passed == n else "inconclusive"


def run_one(name: str, workdir: pathlib.Path, *, warmstart: str, rank: int = 16) -> dict:
  cmd = [sys.executable, "-m", "grpo_jax.main", f"--config=configs/{name}.py:tiny"]
  cmd += [f"--workdir={workdir}", *lora_overrides(rank), *OVERRIDES]
  if warmstart != "own":
    cmd.append(f"--config.warmstart_steps={int(warmstart)}")
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - t0
  rl_lines = [r for r in logs.read_jsonl(workdir / "metrics.jsonl") if r.get("phase") == "rl"]
  out = {
    "config": f"configs/{name}.py:tiny",
    "verdict": judge(proc.returncode, rl_lines),
    "returncode": proc.returncode,
    "wall_seconds": round(seconds, 1),
    "iterations": [{k: r[k] for k in KEPT if k in r} for r in rl_lines],
  }
  if out["verdict"] != "passes":
    out["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
  return out


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--configs", default=",".join(configs()), help="comma-separated names")
  parser.add_argument(
    "--warmstart", default="own", help="'own' (each config's) or a number of steps"
  )
  parser.add_argument("--rank", type=int, default=16, help="16: the check; 0: the control")
  parser.add_argument("--out", default="", help="default: results/lora/every_config_...")
  args = parser.parse_args(argv)
  if not (args.warmstart == "own" or args.warmstart.isdigit()):
    parser.error(f"--warmstart={args.warmstart!r}; allowed: 'own' or a number of steps")
  today = datetime.date.today().isoformat()
  protocol = "own" if args.warmstart == "own" else f"ws{args.warmstart}"
  protocol += "" if args.rank == 16 else f"_rank{args.rank}"
  out = args.out or str(ROOT / "experiments/results/lora" / f"every_config_{protocol}_{today}.json")
  names = [n for n in args.configs.split(",") if n]
  unknown = sorted(set(names) - set(configs()))
  if unknown:
    parser.error(f"--configs: unknown {unknown}; allowed: {', '.join(configs())}")
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in names:
      r = run_one(name, pathlib.Path(tmp) / name, warmstart=args.warmstart, rank=args.rank)
      print(f"{name:16s} {r['verdict']:40s} {r['wall_seconds']:7.1f} s", flush=True)
      results.append(r)
  doc = {
    "date": today,
    "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    "overrides": [*lora_overrides(args.rank), *OVERRIDES],
    "warmstart": args.warmstart,
    "seeds": [0],  # Every config's own seed (config.seed); none is overridden.
    "rule": "exit 0; 2 RL iterations each with a finite loss, grad_norm > 0, 0 skipped steps",
    "passed": sum(r["verdict"] == "passes" for r in results),
    "configs": results,
  }
  doc["claim"], doc["verdict"] = claim_and_verdict(doc["passed"], len(results), rank=args.rank)
  pathlib.Path(out).write_text(json.dumps(doc, indent=1) + "\n")
  print(f"{doc['passed']}/{len(results)} pass; wrote {out}")
  return 0 if doc["passed"] == len(results) else 1


if __name__ == "__main__":
  sys.exit(main())
