"""LoRA's frozen base stored in float32, bfloat16 or int8, on SmolLM2-135M.

  python experiments/lora_base_dtype.py                       # both parts, ~12 minutes
  python experiments/lora_base_dtype.py --parts quality       # the in-process part only

Two parts, written to <out>.json (default experiments/results/lora/base_dtype_<date>):

  quality (one process, not timed): configs/smollm2.py:cpu's base (its GGUF, as the
    trainer loads it) stored each way (`model.cast_base`, model.lora.base_dtype); per way,
    the stored base's bytes and its policy (fresh adapters: B = 0, so the base itself)
    against the float32 base on 32 held-out problems of the config's task, prompt and
    reference completion (`Example.prompt + Example.reference`): the mean over tokens of
    KL(float32 || stored) of the next-token distributions, and the fraction of positions
    whose top-1 token agrees.
  speed (one sitting, the three runs in turn; run it on a quiet machine): per way, the
    trainer's CLI with LoRA rank 16, a KL term (kl_coef 0.01: the reference is the base
    with adapters off), 3 iterations, no export: time/iteration, time/update,
    time/sample of the iterations after the first (which compiles), and the process's
    peak resident memory (/usr/bin/time -f %M).

No rule: a measurement of memory, speed and fidelity, not a claim.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import platform
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

from grpo_jax.infra import config_lib, logs  # noqa: E402
from grpo_jax.models import hf, model, quant  # noqa: E402
from grpo_jax.trainer import build  # noqa: E402

CONFIG = str(ROOT / "configs" / "smollm2.py") + ":cpu"
WAYS = ("float32", "bfloat16", "int8")


def _tree_bytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def quality(*, problems: int = 32) -> dict:
  c = config_lib.load(CONFIG)
  c.model.lora.rank = 16
  setup = build.build(c)
  cfg = setup.model_cfg
  base = hf.load_params(setup.loop.hf_dir, cfg)
  adapters = model.init(cfg, jax.random.key(0))["lora"]
  examples = setup.task.examples("test", seed=0)
  texts = [next(examples) for _ in range(problems)]
  ids = [setup.tokenizer.encode(e.prompt + e.reference) for e in texts]
  T = max(map(len, ids))
  tokens_BT = np.zeros((problems, T), np.int32)
  mask_BT = np.zeros((problems, T), bool)
  for i, row in enumerate(ids):
    tokens_BT[i, : len(row)], mask_BT[i, : len(row)] = row, True
  positions_BT = np.where(mask_BT, np.cumsum(mask_BT, axis=1) - 1, -1)

  def logp(params, c):
    logits, _ = model.apply(params, tokens_BT, positions_BT, None, cfg=c)
    return jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)

  live = mask_BT[:, 1:]
  out, reference = {}, None
  for way in WAYS:
    c_way = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, base_dtype=way))
    stored = model.cast_base({"base": base, "lora": adapters}, c_way)
    lp = np.asarray(jax.jit(logp, static_argnums=1)(stored, c_way))
    row = {"base_bytes": _tree_bytes(stored["base"])}
    if reference is None:
      reference = lp
    p = np.exp(reference)
    kl = (p * (reference - lp)).sum(-1)
    row["kl_vs_float32_mean"] = float(kl[live].mean())
    row["kl_vs_float32_max"] = float(kl[live].max())
    row["top1_agreement"] = float((reference.argmax(-1) == lp.argmax(-1))[live].mean())
    out[way] = row
  out["tokens"] = int(live.sum())
  out["quantized_kernels"] = sum(
    quant.is_quantized(x) for x in jax.tree.leaves(stored["base"], is_leaf=quant.is_quantized)
  )
  return out


def speed_run(way: str) -> dict:
  with tempfile.TemporaryDirectory() as d:
    cmd = [
      "/usr/bin/time", "-f", "maxrss_kb=%M",
      sys.executable, "-m", "grpo_jax.main", f"--config={CONFIG}", f"--workdir={d}",
      "--config.iterations=3", "--config.eval_every=100", "--config.eval_size=8",
      "--config.export_hf=False", "--config.rl.kl_coef=0.01", "--config.progress=False",
      "--config.model.lora.rank=16", "--config.learning_rate=5e-5",
      f"--config.model.lora.base_dtype={way}",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    records = [x for x in logs.read_jsonl(pathlib.Path(d) / "metrics.jsonl") if x["phase"] == "rl"]
  rss = [line for line in r.stderr.splitlines() if line.startswith("maxrss_kb=")]
  figures = {k: [x[k] for x in records] for k in ("time/iteration", "time/update", "time/sample")}
  return {
    **figures,
    "median_after_first": {k: float(np.median(v[1:])) for k, v in figures.items()},
    "max_rss_gb": int(rss[-1].split("=")[1]) / 1e6,
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--parts", default="quality,speed")
  today = datetime.date.today().isoformat()
  p.add_argument("--out", default=str(ROOT / f"experiments/results/lora/base_dtype_{today}"))
  args = p.parse_args(argv)
  parts = args.parts.split(",")
  result = {
    "date": today,
    "config": CONFIG + " with --config.model.lora.rank=16",
    "machine": f"{platform.processor() or platform.machine()}, {jax.devices()[0].platform}, jax {jax.__version__}",
    "rule": "none: a measurement of memory, speed and fidelity, not a claim",
    "seeds": [0],  # The config's seed (the trainer runs); the quality part draws none.
    "verdict": "not judged: a measurement of memory, speed and fidelity, no rule was set",
  }
  if "quality" in parts:
    result["quality"] = quality()
    print(json.dumps(result["quality"]), flush=True)
  if "speed" in parts:
    result["speed"] = {}
    for way in WAYS:
      result["speed"][way] = speed_run(way)
      print(way, json.dumps(result["speed"][way]), flush=True)
  pathlib.Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
  return result


if __name__ == "__main__":
  main()
