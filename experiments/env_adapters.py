"""Multi-turn episodes learning through an environment adapter, against the same run in process.

  python experiments/env_adapters.py --adapter openenv      # the calculator on an OpenEnv server
  python experiments/env_adapters.py --adapter verifiers    # the calculator as a verifiers env
  python experiments/env_adapters.py --adapter verifiers --iterations 4 --warmstart_steps 20 --out /tmp/v
  python experiments/env_adapters.py --render experiments/results/openenv/calculator_tiny.json

Trains the calculator twice with the same seed: once with grpo_jax's calculator in process
("in_process") and once through the adapter. openenv: `python -m
grpo_jax.envs.openenv_calculator` in its own process on a free loopback port (a real server,
as a user runs it), configs/calculator.py:tiny against :openenv (one WebSocket session per
episode). verifiers: configs/calculator.py:verifiers, each episode the verifiers
environment's own rollout (grpo_jax/envs/vf_calculator.py), against the same rows played by
the in-process calculator. Reports each arm's held-out greedy accuracy after the warm start
and at every evaluation, whether every logged metric but the timings is identical between
the arms (the adapter's promise: the same rules through it give the same run), and what the
adapter costs: seconds per iteration in environment work (time/env: resets and steps) and in
all. Each full run takes 15-25 minutes on 2 cores.

Writes <out>.json (the summary; both arms' metric lines, with the keys the report reads;
the machine, the date) and <out>.md; --render rewrites an .md from its .json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

from demo_seeds import cpu_model, write_record

from grpo_jax.envs import openenv_env
from grpo_jax.infra import config_lib, logs
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
# Per adapter: its arm's name, the configs/calculator.py variant both arms start from, the
# committed record, and how the report describes the sitting.
ADAPTERS = {
  "openenv": dict(
    variant="tiny", out=RESULTS / "openenv" / "calculator_tiny",
    title="Calculator episodes through an OpenEnv server",
    how="the server in its own process on a loopback port",
  ),
  "verifiers": dict(
    variant="verifiers", out=RESULTS / "verifiers" / "calculator_tiny",
    title="Calculator episodes as a verifiers environment's rollouts",
    how="each episode the verifiers environment's own rollout; the in-process arm plays the "
    "same rows with grpo_jax's calculator",
  ),
}  # fmt: skip
OUT = ADAPTERS["openenv"]["out"]
TIMING = ("time/", "tokens_per_s", "perf/")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
  """The calculator's OpenEnv server in its own process, once it answers /health."""
  cmd = [sys.executable, "-m", "grpo_jax.envs.openenv_calculator", "--port", str(port)]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  openenv_env.health(f"http://127.0.0.1:{port}", timeout_s=2.0, retries=8)
  return proc


def config(adapter: str, arm: str, *, url: str, iterations: int, warmstart_steps: int):
  c = config_lib.load(f"{ROOT}/configs/calculator.py:{ADAPTERS[adapter]['variant']}")
  if arm == "openenv":
    c = config_lib.load(f"{ROOT}/configs/calculator.py:openenv")
    c.env.kwargs.url = url
  if adapter == "verifiers" and arm == "in_process":
    with c.unlocked():
      c.env.name, c.env.kwargs = "calculator", {}
  c.update(progress=False, tensorboard=False, reward_workers=0)
  if iterations:
    c.update(iterations=iterations, eval_every=min(c.eval_every, iterations))
  if warmstart_steps:
    c.warmstart_steps = warmstart_steps
  return c


def untimed(record: dict) -> dict:
  return {k: v for k, v in record.items() if not k.startswith(TIMING)}


def summarise(lines: dict) -> dict:
  """Per arm: the accuracy curve, seconds per iteration; and whether the arms agree."""
  out = {"arms": {}}
  for arm, records in lines.items():
    rl = [r for r in records if r["phase"] == "rl"]
    out["arms"][arm] = {
      "curve": [
        (r["iteration"], r["eval/greedy_accuracy"]) for r in records if "eval/greedy_accuracy" in r
      ],  # fmt: skip
      "env_s_per_iteration": sum(r["time/env"] for r in rl) / len(rl),
      "s_per_iteration": sum(r["time/iteration"] for r in rl) / len(rl),
      "turns": rl[-1]["episode/turns"],
      "env_errors": sum(r["episode/end/env_error"] for r in rl),
    }
  a, b = ([untimed(r) for r in rs] for rs in lines.values())
  out["identical"] = a == b
  out["differing_keys"] = sorted(
    {k for x, y in zip(a, b) for k in {*x, *y} if x.get(k) != y.get(k)}
  )
  return out


KEPT = ("iteration", "phase", "accuracy", "eval/greedy_accuracy", "episode/turns", "loss",
        "time/env", "time/iteration")  # fmt: skip


def slim(lines: dict) -> dict:
  """Per arm, the metric lines with the keys the report reads (`KEPT`): the whole lines
  were compared in `summarise`."""
  return {arm: [{k: r[k] for k in KEPT if k in r} for r in rs] for arm, rs in lines.items()}


def markdown(record: dict) -> str:
  s, arms = record["summary"], record["summary"]["arms"]
  adapter = record.get("adapter", "openenv")
  spec = ADAPTERS[adapter]
  rows = [
    f"| {arm} | {a['curve'][0][1]:.1%} | {a['curve'][-1][1]:.1%} | "
    f"{100 * (a['curve'][-1][1] - a['curve'][0][1]):+.1f} pts | {a['turns']:.2f} | {a['env_errors']:g} | "
    f"{a['env_s_per_iteration']:.3f} | {a['s_per_iteration']:.3f} |"
    for arm, a in arms.items()
  ]
  curve = " · ".join(f"{it}: {acc:.1%}" for it, acc in arms[adapter]["curve"])
  return "\n".join(
    [
      f"# {spec['title']} ({record['date']})",
      "",
      f"`python experiments/env_adapters.py --adapter {adapter}` on {record['machine']} "
      f"(float32), one sitting, nothing else running; configs/calculator.py:"
      f"{spec['variant']}, seed {record['seed']}, {record['iterations']} iterations of 32 "
      f"prompts x G = 8 episodes after a {record['warmstart_steps']}-step warm start; "
      f"{spec['how']}.",
      "",
      "| arm | warm start | final | gain | turns | env errors | time/env s/it | s/it |",
      "|---|---|---|---|---|---|---|---|",
      *rows,
      "",
      f"Held-out greedy accuracy through the adapter: {curve}.",
      "",
      "Every logged metric but the timings is identical between the arms: "
      f"**{'yes' if s['identical'] else 'no'}**"
      + (f" (differing: {', '.join(s['differing_keys'])})" if s["differing_keys"] else "")
      + ".",
      "",
    ]
  )


def _train_arms(adapter: str, url: str, args) -> dict:
  """Both arms' metric lines (the in-process arm first), trained one after the other."""
  lines = {}
  with tempfile.TemporaryDirectory() as tmp:
    for arm in ("in_process", adapter):
      c = config(adapter, arm, url=url, iterations=args.iterations,
                 warmstart_steps=args.warmstart_steps)  # fmt: skip
      t0 = time.perf_counter()
      train.run(c, pathlib.Path(tmp) / arm, log=lambda _: None)
      print(f"{arm}: {time.perf_counter() - t0:.0f} s", flush=True)
      lines[arm] = logs.read_jsonl(pathlib.Path(tmp) / arm / "metrics.jsonl")
  return lines


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--adapter", choices=sorted(ADAPTERS), default="openenv")
  p.add_argument("--iterations", type=int, default=0, help="0: the config's (200)")
  p.add_argument("--warmstart_steps", type=int, default=0, help="0: the config's (200)")
  p.add_argument("--out", default="", help="default: the adapter's committed record")
  p.add_argument("--render", default="", help="an existing record's .json: rewrite its .md")
  args = p.parse_args(argv)
  if args.render:
    path = pathlib.Path(args.render)
    record = json.loads(path.read_text())
    path.with_suffix(".md").write_text(markdown(record))
    return record
  server = None
  if args.adapter == "openenv":
    port = _free_port()
    server, url = start_server(port), f"http://127.0.0.1:{port}"
  try:
    lines = _train_arms(args.adapter, url if server else "", args)
  finally:
    if server is not None:
      server.terminate()
      server.wait(timeout=30)
  c = config(args.adapter, "in_process", url="", iterations=args.iterations,
             warmstart_steps=args.warmstart_steps)  # fmt: skip
  record = {
    # A description of one seed's run (the adapter's promise is checked as identity of the
    # arms' metrics, `summary.identical`): no rule was written before it, none is judged.
    "claim": None,
    "verdict": "not judged",
    "seeds": [c.seed],
    "adapter": args.adapter,
    "date": datetime.date.today().isoformat(),
    "machine": cpu_model(),
    "seed": c.seed,
    "iterations": c.iterations,
    "warmstart_steps": c.warmstart_steps,
    "summary": summarise(lines),
    "lines": slim(lines),
  }
  out = pathlib.Path(args.out or ADAPTERS[args.adapter]["out"])
  write_record(out, record, markdown)
  return record


if __name__ == "__main__":
  main()
