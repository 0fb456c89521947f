"""Context parallelism: one long row's log-probs and gradients with its tokens split over
4 devices (`mesh.sequence=4`) against the unsharded program on one device.

  python experiments/context_parallel.py               # rows of 4,096 / 8,192 / 16,384 tokens
  python experiments/context_parallel.py --quick       # 512 and 1,024 tokens (the test)

The script gives itself 4 host CPU devices (it adds
--xla_force_host_platform_device_count=4 to XLA_FLAGS unless a count is set). For each
length S it builds one program, the gradient of a loss of the teacher-forced statistics
(`logprobs.completion_logprobs` with the LM head in chunks: Σ_t w_t log π + 0.1·Σ_t H_t),
and compiles it twice: on one device with no mesh (its causal blocks attended whole), and
on a (data, fsdp, sequence, tensor) = (1, 1, 4, 1) mesh under the default rules table,
where "activation_length" goes to `sequence`: each device holds S/4 of the row's tokens
and all-gathers the keys and values (`layers.Attention`). It records the largest
difference of the log-probs, of the entropies and of each parameter's gradient (relative
to that gradient's largest entry), XLA's temporary bytes per device of each compile
(`memory_analysis`), and the wall time of one call of each (a CPU runs the 4 devices on
its own cores: the time is for completeness, not a claim).

Model: the tiny Qwen3-shaped model (float32; 4 query heads over 2 kv heads, q/k norm),
scanned layers with full remat (as a long-row run would be); one row (two in --quick),
the first with 5 left-padded prompt slots and its completion 100 tokens short of the
row, so padding on both sides is covered. Each device attends 512 of its queries at a
time (`model.context_query_block`; 64 in --quick, so its 128 and 256 tokens a device
take the blocked path too). The verdict follows `RULE`, written before the first run.
Writes experiments/results/long_rollouts/context_parallel.json.
"""

from __future__ import annotations

import os

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
  ).strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from grpo_jax.models import logprobs, model, sharding  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "long_rollouts" / "context_parallel.json"
SHARDS = 4
PROMPT = 64
LOGIT_CHUNK = 512
QUERY_BLOCK = 512  # model.context_query_block's default.
RULE = (
  "supports if, at every length, every token's log-prob and entropy is within 1e-5 of the "
  "unsharded program's, every parameter's gradient is within 1e-5 of it relative to that "
  "gradient's largest entry (max|Δg| <= 1e-5 max|g|), and at the longest length XLA's "
  "temporary bytes per device with sequence=4 are at most 0.5x the one-device program's; "
  "contradicts otherwise (float32, 4 host CPU devices; a compile is deterministic and the "
  "inputs are fixed: no seeds; written before the first run)"
)


def _inputs(S: int, *, vocab: int, rows: int):
  """`rows` rows of S tokens: P = PROMPT prompt slots (5 of row 0's left-padded), T = S - P
  completion slots (row 0's last 100 are padding)."""
  P = min(PROMPT, S // 8)
  T = S - P
  rng = np.random.default_rng(0)
  prompt_NP = rng.integers(2, vocab, (rows, P)).astype(np.int32)
  prompt_mask_NP = np.ones((rows, P), bool)
  prompt_mask_NP[0, :5] = False
  tokens_NT = rng.integers(2, vocab, (rows, T)).astype(np.int32)
  mask_NT = np.ones((rows, T), bool)
  mask_NT[0, T - 100 :] = False
  weight_NT = rng.standard_normal((rows, T)).astype(np.float32)
  return tuple(map(jnp.asarray, (prompt_NP, prompt_mask_NP, tokens_NT, mask_NT, weight_NT)))


def _program(cfg):
  model_fn = model.make_model_fn(cfg)

  def loss(params, prompt_NP, prompt_mask_NP, tokens_NT, mask_NT, weight_NT):
    logp_NT, stats = logprobs.completion_logprobs(
      params, prompt_NP, prompt_mask_NP, tokens_NT, mask_NT, model_fn=model_fn,
      with_stats=True, chunk=LOGIT_CHUNK,
    )  # fmt: skip
    value = jnp.sum(weight_NT * logp_NT) + 0.1 * jnp.sum(stats["entropy"])
    return value, (logp_NT, stats["entropy"])

  return jax.value_and_grad(loss, has_aux=True)


def _run(fn, args, layout=None):
  """(outputs, XLA's temporary bytes per device, seconds of one call after compiling)."""
  jitted = jax.jit(fn)
  if layout is None:
    compiled = jitted.lower(*args).compile()
  else:
    with layout.context():
      compiled = jitted.lower(*args).compile()
  out = jax.block_until_ready(compiled(*args))
  start = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  return out, compiled.memory_analysis().temp_size_in_bytes, time.perf_counter() - start


def measure(cfg, S: int, *, rows: int) -> dict:
  """One length: the one-device and the sequence=4 programs, their differences and bytes."""
  params = model.init(cfg, jax.random.key(0))
  args = (params, *_inputs(S, vocab=cfg.vocab_size, rows=rows))
  fn = _program(cfg)
  # The one-device program attends its causal blocks whole (as when the record was made,
  # before one device could step through long blocks: `attention.attend_causal`).
  whole = _program(dataclasses.replace(cfg, context_query_block=0))
  ((_, (lp0, ent0)), g0), temp0, t0 = _run(whole, args)
  layout = sharding.Layout.create(
    sharding.MeshConfig(data=1, fsdp=1, sequence=SHARDS, tensor=1), jax.devices()[:SHARDS]
  )
  ((_, (lp1, ent1)), g1), temp1, t1 = _run(fn, args, layout)
  rel = [
    float(jnp.max(jnp.abs(a - b)) / jnp.maximum(jnp.max(jnp.abs(a)), 1e-30))
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1), strict=True)
  ]
  return {
    "tokens": S,
    "rows": rows,
    "max_abs_logp_diff": float(jnp.max(jnp.abs(lp0 - lp1))),
    "max_abs_entropy_diff": float(jnp.max(jnp.abs(ent0 - ent1))),
    "max_rel_grad_diff": max(rel),
    "temp_bytes_one_device": int(temp0),
    "temp_bytes_per_device_sequence4": int(temp1),
    "temp_ratio": temp1 / temp0,
    "seconds_one_device": round(t0, 3),
    "seconds_sequence4": round(t1, 3),
  }


def verdict(rows: list[dict]) -> str:
  close = all(
    r["max_abs_logp_diff"] <= 1e-5
    and r["max_abs_entropy_diff"] <= 1e-5
    and r["max_rel_grad_diff"] <= 1e-5
    for r in rows
  )
  return "supports" if close and rows[-1]["temp_ratio"] <= 0.5 else "contradicts"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="rows of 512 and 1,024 tokens (the test)")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  if len(jax.devices()) < SHARDS:
    raise SystemExit(
      f"{len(jax.devices())} devices; this needs {SHARDS} (XLA_FLAGS="
      f"--xla_force_host_platform_device_count={SHARDS} on CPU)."
    )
  block = 64 if args.quick else QUERY_BLOCK
  cfg = model.tiny_config(64, scan_layers=True, remat="full", context_query_block=block)
  lengths, n = ((512, 1024), 2) if args.quick else ((4096, 8192, 16384), 1)
  rows = [measure(cfg, S, rows=n) for S in lengths]
  record = {
    "claim": "context parallelism (mesh.sequence) gives the unsharded log-probs and "
    "gradients of long rows, with less memory per device",
    "rule": RULE,
    "date": datetime.date.today().isoformat(),
    "commit": subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip(),  # fmt: skip
    "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
    f"{len(jax.devices())} host devices",
    "model": f"tiny (float32, scanned layers, full remat), {n} row(s), LM head in chunks of "
    f"{LOGIT_CHUNK}, {block} query tokens a device at a time (model.context_query_block)",
    "rows": rows,
  }
  record["verdict"] = verdict(rows)
  out = pathlib.Path(args.out) if args.out else (None if args.quick else OUT)
  if out:
    out.write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps(record, indent=1))
  return record


if __name__ == "__main__":
  main()
