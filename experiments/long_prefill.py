"""Chunked prefill: the sampler's prefill memory for long prompts, one call against chunks.

  python experiments/long_prefill.py                      # TPU (libtpu, compiled here) and CPU
  python experiments/long_prefill.py --quick              # small shapes (the test)

A prompt of P tokens prefilled in one call computes causal attention scores in at most 4
query blocks (`attention.causal_blocks`), the largest [P/4, P] per head; prefilled
`prefill_chunk` = C tokens a call (`sampling.prefill_cache`), each call attends over the
slots written so far, at most [C, P]. This compiles `sampling.prefill` (the prompts'
prefix into the shared cache) for each chunk and reads XLA's temporary bytes:

  - TPU: a Qwen2.5-1.5B-shaped model (bfloat16, scanned layers, the XLA attention path)
    with one 16,384-token prompt, on one v5e chip of an abstract topology, compiled by
    libtpu on this host (`infra.tpu`); nothing runs, so the figures need no chip.
  - CPU: the tiny model, compiled and measured the same way on this host's XLA:CPU.

Beside each, the memory plan's sampler figure (`memory._sampler_bytes`), which prices a
chunked prefill as one call. A compile the TPU compiler refuses is recorded with its error. Writes experiments/results/long_rollouts/prefill.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import pathlib
import platform
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.infra import tpu
from grpo_jax.models import model, sampling, shapes, sharding
from grpo_jax.trainer import memory

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "long_rollouts" / "prefill.json"


def _prefill_temp(cfg, *, rows: int, P: int, chunk: int, device) -> int:
  """XLA's temporary bytes of `sampling.prefill` for `rows` prompts of P tokens."""
  params = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  mesh = jax.sharding.Mesh(np.array([device]), ("data",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=one)  # noqa: E731
  params = jax.tree.map(lambda x: spec(x.shape, x.dtype), params)
  prompts = sampling.Prompts(
    tokens_BP=spec((rows, P), jnp.int32), mask_BP=spec((rows, P), jnp.bool_)
  )
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=one)
  scfg = sampling.SamplerConfig(
    max_new_tokens=16, eos_ids=(1,), pad_id=0, group_size=4, prompt_buckets=(P,),
    max_prompt_len=P, prefill_chunk=chunk,
  )  # fmt: skip
  fn = functools.partial(
    sampling.prefill, model_fn=model.make_model_fn(cfg),
    init_cache=functools.partial(model.init_cache, cfg), cfg=scfg,
  )  # fmt: skip
  compiled = jax.jit(fn).lower(params, prompts, key).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def _plan_prefill(cfg, *, rows: int, P: int) -> int:
  """The memory plan's sampler figure (its prefill phase here), which prices a chunked
  prefill as one call (`memory._sampler_bytes`)."""
  boxed = jax.eval_shape(functools.partial(model.init_boxed, cfg), jax.random.key(0))
  return memory._sampler_bytes(
    cfg, boxed, rules=sharding.MeshConfig().rules, sizes=dict(data=1, fsdp=1, sequence=1, tensor=1),
    rows=4 * rows, prompt_rows=rows, P=P, T=16, shared=True,
  )  # fmt: skip


def _rows(cfg, *, rows, P, chunks, device) -> list[dict]:
  """One row per chunk; a compile the compiler refuses is a row with its first line."""
  out = []
  for chunk in chunks:
    t0 = time.perf_counter()
    row = dict(
      prompt_tokens=P, rows=rows, chunk=chunk, calls=len(sampling.prefill_chunks(P - 1, chunk))
    )
    try:
      row["xla_temp_bytes"] = _prefill_temp(cfg, rows=rows, P=P, chunk=chunk, device=device)
    except jax.errors.JaxRuntimeError as e:
      row["refused"] = " ".join(str(e).strip().splitlines()[:2])[:400]
    row |= dict(
      plan_bytes=_plan_prefill(cfg, rows=rows, P=P), compile_s=round(time.perf_counter() - t0, 1)
    )
    out.append(row)
    print(json.dumps(row), flush=True)
  for row in out:
    if "xla_temp_bytes" in row:
      row["xla_temp_vs_one_call"] = round(row["xla_temp_bytes"] / out[0]["xla_temp_bytes"], 3)
  return out


RULE = (
  "supports if, on every backend measured, some chunked prefill compiles with fewer "
  "temporary bytes than the one-call prefill; contradicts otherwise (a compile is "
  "deterministic: no seeds; the rule was written after a first look at these figures)"
)


def verdict(record: dict) -> str:
  """RULE applied to a record's rows."""
  for backend in ("cpu", "tpu"):
    if backend not in record:
      continue
    one, *chunked = record[backend]["rows"]
    temps = [r["xla_temp_bytes"] for r in chunked if "xla_temp_bytes" in r]
    if not temps or min(temps) >= one["xla_temp_bytes"]:
      return "contradicts"
  return "supports"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="a small CPU shape only (the test)")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  cpu_cfg = model.tiny_config(vocab_size=64)
  if args.quick:  # CPU only: the TPU compile of a real shape takes minutes.
    cpu_P, cpu_chunks = 1024, (0, 64)
  else:
    cpu_P, cpu_chunks = 4096, (0, 1024, 256, 64)
    # Scanned layers: one layer's compile (the prefill's peak is one layer's attention).
    tpu_cfg = shapes.model_config("qwen2.5-1.5b", param_dtype="bfloat16", scan_layers=True)
    tpu_cfg = dataclasses.replace(tpu_cfg, dtype="bfloat16")
  record = {
    "claim": "prefilling a long prompt in chunks lowers the prefill's peak temporary memory",
    "rule": RULE,
    "date": datetime.date.today().isoformat(),
    "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip(),  # fmt: skip
    "host": f"{platform.processor() or platform.machine()}, {jax.devices('cpu')[0].device_kind}",
    "cpu": {"model": "tiny (float32)",
            "rows": _rows(cpu_cfg, rows=2, P=cpu_P, chunks=cpu_chunks,
                          device=jax.devices("cpu")[0])},
  }  # fmt: skip
  if not args.quick:
    record["tpu"] = {
      "topology": "v5e:2x2 (one chip of it)", "model": "qwen2.5-1.5b (bfloat16, scanned layers)",
      "rows": _rows(tpu_cfg, rows=1, P=16384, chunks=(0, 4096, 2048, 1024),
                    device=tpu.load_topology("v5e:2x2")[0]),
    }  # fmt: skip
  record["verdict"] = verdict(record)
  out = pathlib.Path(args.out) if args.out else (None if args.quick else OUT)
  if out:
    out.write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps({k: record[k] for k in ("tpu", "cpu") if k in record}))
  return record


if __name__ == "__main__":
  main()
