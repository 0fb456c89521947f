"""The paged KV cache against the dense one on skewed rollout lengths: memory, speed, equality.

  python experiments/paged_sampler.py            # 40 rows, 10% to 8,192 tokens (minutes)
  python experiments/paged_sampler.py --quick    # 16 rows to 256 tokens (the test)
  python experiments/paged_sampler.py --tpu      # compiled for a TPU v5e chip (libtpu)

Reasoning rollouts are skewed: most end early, a few run to the limit. The dense sampler
(`sampling.sample`) holds a [rows, ..., P − 1 + T] cache per layer and decodes every row
until the longest ends; the paged one (`paged.sample`, sampler.kv_layout="paged") holds a
pool of pages that ended rows give back, and runs each step on the live rows only.

The batch: the tiny model (float32), B prompts × G rows; 90% of the rows are cut by
limit_N at lengths drawn uniformly from [64, 512], 10% run to T = 8,192. The EOS logit
is removed (a random model would end rows at random), so every row's length is its
limit. The pool holds 0.15 of the worst case's completion pages (`sampler.kv_pool_fraction`);
the record checks that no row was starved. Both samplers run the same prompts, keys and
limits in one sitting on a quiet machine:

  - memory: XLA's temporary bytes of each compiled sampler (`memory_analysis`);
  - speed: generated tokens / s over the second and third call (the first compiles);
  - equality: the same tokens, and log-probs within 1e-5 (float32);
  - the memory plan's sampler figure beside XLA's, for each (`memory._sampler_bytes`).

Writes experiments/results/long_rollouts/paged_sampler.json. With --tpu: the dense and
paged samplers of a Qwen2.5-1.5B shape compiled for one TPU v5e chip by libtpu on this
host (XLA's temporary bytes; nothing runs), experiments/results/long_rollouts/
paged_sampler_tpu_target.json (TPU_TARGET_CLAIM; paged_sampler_tpu.json holds
TPU_CLAIM's record, of an earlier build).
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

from grpo_jax.models import model, paged, sampling, sharding
from grpo_jax.trainer import memory

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "long_rollouts" / "paged_sampler.json"

CLAIM = (
  "on skewed lengths (90% of rows end by 512 tokens, 10% run to 8,192) the paged sampler "
  "needs at most 0.35x the dense sampler's XLA temporary memory and generates at least 2x "
  "its tokens/s on this CPU, with the same rollouts"
)
RULE = (
  "supports if paged/dense temporary bytes <= 0.35, paged/dense tokens/s >= 2.0 (the "
  "mean of calls 2 and 3 of each), every row's tokens equal and |d logp| <= 1e-5 on "
  "real tokens, and no row starved; contradicts otherwise (written before any run)"
)
SEEDS = {"params": 0, "prompts": 1, "limits": 2, "sampling": 3}
TPU_CLAIM = (
  "on one TPU v5e chip (compiled here by libtpu, not run), a Qwen2.5-1.5B-shaped sampler "
  "(bfloat16, 16 rows = 4 prompts x 4, 256-token prompts, 8,192 new tokens) with a paged "
  "cache of pages of 128 slots and a pool of 0.25 of the worst case compiles with at most "
  "0.5x the dense sampler's XLA temporary bytes"
)
TPU_RULE = (
  "supports if the paged sampler (page_size 128) compiles and its temporary bytes are "
  "<= 0.5x the dense sampler's; contradicts otherwise. Written after seeing the paged "
  "figure at page_size 64 (2.45 GB: the keys' [E, Z] pages padded to TPU tiles of 128 "
  "lanes, hence 128 here) and before any dense figure"
)
# TPU_CLAIM's record (paged_sampler_tpu.json, commit 5ce80ea) compiled both samplers as
# this CPU host would build them (`kernels.target_platform` came later): the dense one with
# 4 decode segments whose cache grows by copies and a float32 cache traced for the
# bfloat16 model. This claim is the same comparison as a TPU host builds both, written
# before that build was compiled, at TPU_CLAIM's bound.
TPU_TARGET_CLAIM = (
  "on one TPU v5e chip (compiled here by libtpu for the chip, as a TPU host builds the "
  "samplers: one decode segment, a bfloat16 cache), a Qwen2.5-1.5B-shaped sampler "
  "(bfloat16, 16 rows = 4 prompts x 4, 256-token prompts, 8,192 new tokens) with a paged "
  "cache of pages of 128 slots and a pool of 0.25 of the worst case compiles with at most "
  "0.5x the dense sampler's XLA temporary bytes"
)
TPU_TARGET_RULE = (
  "supports if the paged sampler (page_size 128) compiles and its temporary bytes are "
  "<= 0.5x the dense sampler's; contradicts otherwise (written before any compile of "
  "this build)"
)
TPU_TARGET_OUT = (
  ROOT / "experiments" / "results" / "long_rollouts" / "paged_sampler_tpu_target.json"
)
EOS = 1


def _no_eos(model_fn):
  """model_fn with the EOS logit at -1e9: rows end at their limits only."""

  def fn(*args, **kwargs):
    out = model_fn(*args, **kwargs)
    return (out[0].at[..., EOS].set(-1e9), *out[1:])

  return fn


def _limits(N: int, T: int, short: tuple[int, int]) -> np.ndarray:
  """10% of rows (at least one) run to T, the rest to lengths uniform in [short]."""
  rng = np.random.RandomState(SEEDS["limits"])
  limit_N = rng.randint(short[0], short[1] + 1, size=N)
  long_rows = rng.choice(N, size=max(1, N // 10), replace=False)
  limit_N[long_rows] = T
  return limit_N.astype(np.int32)


def measure(fn, args, n_calls: int = 3):
  """(compiled temp bytes, seconds of calls 2..n, the last call's rollouts)."""
  compiled = jax.jit(fn).lower(*args).compile()
  temp = compiled.memory_analysis().temp_size_in_bytes
  out = jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(n_calls - 1):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return temp, times, out


def _plan(cfg, scfg, *, B: int, P: int, T: int, pages, rings: bool = True) -> int:
  """The memory plan's sampler figure (`memory._sampler_bytes`) on one device; rings:
  whether the cache keeps window rings (`model.init_cache`)."""
  boxed = jax.eval_shape(functools.partial(model.init_boxed, cfg), jax.random.key(0))
  return memory._sampler_bytes(
    cfg, boxed, rules=sharding.MeshConfig().rules, sizes=dict(data=1, fsdp=1, sequence=1, tensor=1),
    rows=B * scfg.group_size, prompt_rows=B, P=P, T=T, segments=sampling.segment_count(scfg),
    shared=scfg.shared_prefix and scfg.group_size > 1, pages=pages, rings=rings,
  )  # fmt: skip


def sampler_row(fn, args) -> tuple[dict, object]:
  """(XLA's temporary bytes, the timed calls' seconds, tokens and tokens/s of one compiled
  sampler (`measure`), its last call's rollouts)."""
  temp, times, out = measure(fn, args)
  tokens = int(np.asarray(out.length_N).sum())
  row = {
    "xla_temp_bytes": int(temp),
    "seconds": [round(t, 3) for t in times],
    "tokens": tokens,
    "tokens_per_s": round(tokens / float(np.mean(times)), 1),
  }
  return row, out


def run(*, B: int, G: int, P: int, T: int, short: tuple[int, int], page_size: int,
        pool_fraction: float) -> dict:  # fmt: skip
  cfg = model.tiny_config(vocab_size=64)
  params = model.init(cfg, jax.random.key(SEEDS["params"]))
  N = B * G
  rng = np.random.RandomState(SEEDS["prompts"])
  prompts = sampling.Prompts(
    tokens_BP=jnp.asarray(rng.randint(2, 64, size=(B, P)), jnp.int32),
    mask_BP=jnp.ones((B, P), jnp.bool_),
  )
  limit_N = jnp.asarray(_limits(N, T, short))
  worst = N * -(-T // page_size)
  dense_cfg = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(EOS,), pad_id=0, group_size=G, prompt_buckets=(P,),
    max_prompt_len=P,
  )  # fmt: skip
  paged_cfg = dataclasses.replace(
    dense_cfg, kv_layout="paged", page_size=page_size, kv_pool_fraction=pool_fraction
  )
  kw = dict(
    model_fn=_no_eos(model.make_model_fn(cfg)),
    init_cache=functools.partial(model.init_cache, cfg),
  )
  hyper = sampling.sampling_params(temperature=1.0)
  args = (params, prompts, jax.random.key(SEEDS["sampling"]), hyper, limit_N)
  rows = {}
  outs = {}
  for name, fn in (
    ("dense", functools.partial(sampling.sample, cfg=dense_cfg, **kw)),
    ("paged", functools.partial(paged.sample, cfg=paged_cfg, **kw)),
  ):
    rows[name], outs[name] = sampler_row(fn, args)
  for name, pages in (("dense", None), ("paged", memory._pool_pages(paged_cfg, prompts=B))):
    rows[name]["plan_bytes"] = _plan(cfg, dense_cfg, B=B, P=P, T=T, pages=pages)
    rows[name]["plan_over_xla"] = round(rows[name]["plan_bytes"] / rows[name]["xla_temp_bytes"], 3)
  d, p = outs["dense"], outs["paged"]
  mask = np.asarray(d.mask_NT)
  return {
    "shape": {"prompts": B, "group": G, "rows": N, "prompt_tokens": P, "max_new_tokens": T,
              "short_lengths": list(short), "long_rows": int(np.sum(np.asarray(limit_N) == T)),
              "page_size": page_size, "kv_pool_fraction": pool_fraction,
              "pool_pages": paged.completion_pages(paged_cfg, N), "worst_case_pages": worst},
    **rows,
    "temp_ratio": round(rows["paged"]["xla_temp_bytes"] / rows["dense"]["xla_temp_bytes"], 3),
    "speed_ratio": round(rows["paged"]["tokens_per_s"] / rows["dense"]["tokens_per_s"], 2),
    "tokens_equal": bool(np.array_equal(np.asarray(d.tokens_NT), np.asarray(p.tokens_NT))),
    "max_abs_dlogp": float(np.max(np.abs(np.where(mask, d.logp_NT - p.logp_NT, 0.0)))),
    "starved_rows": int(np.sum(np.asarray(p.length_N) < np.asarray(limit_N))),
  }  # fmt: skip


def tpu_chip_inputs(source: str, *, B: int, P: int):
  """(config, params, (prompts, key, hyper)) of a built-in model shape in bfloat16 with
  unrolled layers, as abstract arrays on one v5e chip of an abstract topology
  (`infra.tpu`): what a sampler is compiled for, nothing allocated."""
  from grpo_jax.infra import tpu  # noqa: PLC0415 -- libtpu's topology, only for --tpu.
  from grpo_jax.models import shapes  # noqa: PLC0415

  device = tpu.load_topology("v5e:2x2")[0]
  mesh = jax.sharding.Mesh(np.array([device]), ("data",))
  one = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one)  # noqa: E731
  cfg = shapes.model_config(source, param_dtype="bfloat16", scan_layers=False)
  cfg = dataclasses.replace(cfg, dtype="bfloat16")
  params = jax.tree.map(spec, jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0)))
  prompts = sampling.Prompts(jnp.zeros((B, P), jnp.int32), jnp.ones((B, P), jnp.bool_))
  hyper = sampling.sampling_params(temperature=1.0)
  return cfg, params, jax.tree.map(spec, (prompts, jax.random.key(0), hyper))


def tpu_temp(fn, params, args) -> dict:
  """XLA's temporary bytes of fn compiled for the chip `tpu_chip_inputs` placed its
  arguments on, traced under that chip's mesh (so the trace builds what a TPU host
  builds, `kernels.target_platform`), and the seconds the compile took."""
  t0 = time.perf_counter()
  with jax.set_mesh(jax.tree.leaves(args)[0].sharding.mesh):
    m = jax.jit(fn).lower(params, *args).compile().memory_analysis()
  return {
    "xla_temp_bytes": int(m.temp_size_in_bytes),
    "compile_s": round(time.perf_counter() - t0, 1),
  }


def tpu_rows() -> dict:
  """XLA's TPU memory figures (`memory_analysis`) of the dense and paged samplers of
  TPU_CLAIM's shape, compiled for one v5e chip of an abstract topology (`infra.tpu`)."""
  B, G, P, T = 4, 4, 256, 8192
  cfg, params, args = tpu_chip_inputs("qwen2.5-1.5b", B=B, P=P)
  dense = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(EOS,), pad_id=0, group_size=G, prompt_buckets=(P,),
    max_prompt_len=P,
  )  # fmt: skip
  kw = dict(model_fn=model.make_model_fn(cfg), init_cache=functools.partial(model.init_cache, cfg))
  out = {"model": "qwen2.5-1.5b (bfloat16)", "topology": "v5e:2x2 (one chip of it)",
         "shape": {"prompts": B, "group": G, "prompt_tokens": P, "max_new_tokens": T}}  # fmt: skip
  for name, fn in (
    ("dense", functools.partial(sampling.sample, cfg=dense, **kw)),
    *(
      (
        f"paged_{Z}",
        functools.partial(
          paged.sample,
          cfg=dataclasses.replace(dense, kv_layout="paged", page_size=Z, kv_pool_fraction=0.25),
          **kw,
        ),
      )  # fmt: skip
      for Z in (64, 128)
    ),
  ):
    out[name] = tpu_temp(fn, params, args)
  out["temp_ratio"] = round(out["paged_128"]["xla_temp_bytes"] / out["dense"]["xla_temp_bytes"], 3)
  return out


def tpu_verdict(record: dict) -> str:
  """TPU_RULE applied to a record."""
  return "supports" if record["result"]["temp_ratio"] <= 0.5 else "contradicts"


def verdict(record: dict) -> str:
  """RULE applied to a record."""
  r = record["result"]
  ok = (
    r["temp_ratio"] <= 0.35
    and r["speed_ratio"] >= 2.0
    and r["tokens_equal"]
    and r["max_abs_dlogp"] <= 1e-5
    and r["starved_rows"] == 0
  )
  return "supports" if ok else "contradicts"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="16 rows to 256 tokens (the test)")
  ap.add_argument("--tpu", action="store_true", help="TPU_TARGET_CLAIM: compile for a v5e chip")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  if args.tpu:
    return _tpu_main(args)
  if args.quick:
    shape = dict(B=4, G=4, P=16, T=256, short=(8, 32), page_size=16, pool_fraction=0.25)
  else:
    shape = dict(B=10, G=4, P=64, T=8192, short=(64, 512), page_size=64, pool_fraction=0.15)
  host = f"{jax.devices('cpu')[0].device_kind}, {jax.device_count()} device(s), float32"
  record = record_header(CLAIM, RULE, SEEDS, host, run(**shape))
  record["verdict"] = verdict(record)
  out = pathlib.Path(args.out) if args.out else (None if args.quick else OUT)
  if out:
    out.write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps(record["result"]))
  return record


def record_header(claim: str, rule: str, seeds, host: str, result: dict) -> dict:
  """A record's header (claim, rule, seeds, date, commit, host) and its result."""
  commit = subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
  ).stdout.strip()
  return {
    "claim": claim, "rule": rule, "seeds": seeds, "date": datetime.date.today().isoformat(),
    "commit": commit, "host": f"{platform.processor() or platform.machine()}, {host}",
    "result": result,
  }  # fmt: skip


# The TPU record compiles abstract arrays: nothing is drawn, so no seed decides a figure.
TPU_SEEDS = "none: compiles of abstract arrays (no values are drawn)"


def _tpu_main(args) -> dict:
  """TPU_TARGET_CLAIM's record (TPU_CLAIM's build is gone: see TPU_TARGET_CLAIM)."""
  record = record_header(
    TPU_TARGET_CLAIM, TPU_TARGET_RULE, TPU_SEEDS, "compiling for TPU with libtpu", tpu_rows()
  )
  record["verdict"] = tpu_verdict(record)  # TPU_TARGET_RULE's bound is TPU_CLAIM's.
  pathlib.Path(args.out or TPU_TARGET_OUT).write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps(record["result"]))
  return record


if __name__ == "__main__":
  main()
