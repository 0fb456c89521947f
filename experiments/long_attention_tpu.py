"""Teacher-forced attention of one long row on a TPU chip: whole causal blocks against query
steps (`attention.attend_causal`, `model.context_query_block`), compiled here by libtpu.

  python experiments/long_attention_tpu.py            # 4,352, 8,448 and 16,640 tokens

A Qwen2.5-1.5B-shaped model (`shapes.model_config`, bfloat16 parameters and compute),
layers scanned and fully rematerialised, one row of 256 prompt and T completion tokens:
the gradient of Σ_t w_t log π (`logprobs.completion_logprobs`, the LM head in chunks of
1,024), compiled for one chip of an abstract TPU v5e topology (`infra.tpu`; 16 GiB of HBM)
twice: with the causal blocks attended whole (context_query_block=0) and in steps of at
most 512 tokens (the default). Nothing runs: it records XLA's temporary bytes
(`memory_analysis`), or the compiler's refusal (RESOURCE_EXHAUSTED) with the figure it
names, and the compile time on this host. The verdict follows `RULE`, written before the
first run. Writes experiments/results/long_rollouts/attention_tpu.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import pathlib
import re
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import logprobs, model, shapes

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "long_rollouts" / "attention_tpu.json"
PROMPT = 256
LOGIT_CHUNK = 1024
CLAIM = (
  "on one TPU v5e chip (compiled here by libtpu, not run), the gradient of one long row's "
  "teacher-forced log-probs through a Qwen2.5-1.5B-shaped model (bfloat16, scanned and "
  "rematerialised layers) needs at most a quarter of the temporary memory with attention "
  "in query steps of 512 tokens that it needs with whole causal blocks"
)
RULE = (
  "supports if, at the longest length, the stepped program compiles and its temporary bytes "
  "are <= 0.25x the whole-block program's (a whole-block program the compiler refuses "
  "counts with the bytes its RESOURCE_EXHAUSTED message names); contradicts otherwise "
  "(a compile is deterministic: no seeds; written before the first run)"
)
_NEEDED = re.compile(r"total memory required for HLO temporaries \(([\d.]+)([KMG])\)")


def _compile(cfg, S: int, device) -> dict:
  """XLA's figures for one row of S tokens on `device`, or the compiler's refusal."""
  mesh = jax.sharding.Mesh(np.array([device]), ("data",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one)  # noqa: E731
  params = jax.tree.map(spec, jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0)))
  T = S - PROMPT
  args = (
    spec(jax.ShapeDtypeStruct((1, PROMPT), jnp.int32)),
    spec(jax.ShapeDtypeStruct((1, PROMPT), jnp.bool_)),
    spec(jax.ShapeDtypeStruct((1, T), jnp.int32)),
    spec(jax.ShapeDtypeStruct((1, T), jnp.bool_)),
    spec(jax.ShapeDtypeStruct((1, T), jnp.float32)),
  )
  model_fn = model.make_model_fn(cfg)

  def loss(params, prompt_NP, prompt_mask_NP, tokens_NT, mask_NT, weight_NT):
    logp_NT = logprobs.completion_logprobs(
      params, prompt_NP, prompt_mask_NP, tokens_NT, mask_NT, model_fn=model_fn, chunk=LOGIT_CHUNK
    )[0]
    return jnp.sum(weight_NT * logp_NT)

  t0 = time.perf_counter()
  try:
    m = jax.jit(jax.grad(loss)).lower(params, *args).compile().memory_analysis()
  except Exception as err:  # noqa: BLE001 -- the compiler's refusal is the measurement.
    found = _NEEDED.search(str(err))
    if "RESOURCE_EXHAUSTED" not in str(err) or not found:
      raise
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}[found.group(2)]
    return {"fits": False, "temp_bytes": int(float(found.group(1)) * scale),
            "compile_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
  return {"fits": True, "temp_bytes": int(m.temp_size_in_bytes),
          "compile_s": round(time.perf_counter() - t0, 1)}  # fmt: skip


def measure(S: int, device) -> dict:
  cfg = shapes.model_config("qwen2.5-1.5b", param_dtype="bfloat16", scan_layers=True)
  cfg = dataclasses.replace(cfg, dtype="bfloat16", remat="full")
  whole = _compile(dataclasses.replace(cfg, context_query_block=0), S, device)
  steps = _compile(dataclasses.replace(cfg, context_query_block=512), S, device)
  return {"tokens": S, "whole_blocks": whole, "query_steps_512": steps,
          "temp_ratio": round(steps["temp_bytes"] / whole["temp_bytes"], 4)}  # fmt: skip


def verdict(rows: list[dict]) -> str:
  last = rows[-1]
  ok = last["query_steps_512"]["fits"] and last["temp_ratio"] <= 0.25
  return "supports" if ok else "contradicts"


def main(argv=None) -> dict:
  from grpo_jax.infra import tpu  # noqa: PLC0415 -- libtpu's topology.

  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  device = tpu.load_topology("v5e:2x2")[0]
  lengths = (PROMPT + 4096, PROMPT + 8192, PROMPT + 16384)
  rows = [measure(S, device) for S in lengths]
  record = {
    "claim": CLAIM,
    "rule": RULE,
    "date": datetime.date.today().isoformat(),
    "commit": subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip(),  # fmt: skip
    "host": "compiled by libtpu on a 2-core AMD EPYC VM for one chip of v5e:2x2 (16 GiB HBM)",
    "model": f"qwen2.5-1.5b (bfloat16), scanned layers, full remat, one row of {PROMPT} "
    f"prompt tokens and the rest completion, LM head in chunks of {LOGIT_CHUNK}",
    "rows": rows,
  }
  record["verdict"] = verdict(rows)
  (pathlib.Path(args.out) if args.out else OUT).write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps(record, indent=1))
  return record


if __name__ == "__main__":
  jax.config.update("jax_platforms", "cpu")
  main()
