"""Window-sized KV rings for sliding-window layers against full-length buffers: memory,
speed, equality.

  python experiments/window_rings.py            # Gemma-3-shaped tiny model, 2,048 tokens
  python experiments/window_rings.py --quick    # 256 tokens (the test)
  python experiments/window_rings.py --tpu      # Gemma 3 1B compiled for a TPU v5e chip
  python experiments/window_rings.py --paged    # the paged sampler with and without rings

A query of a sliding-window layer sees the last W keys only, so the dense sampler's cache
keeps W slots for those layers (`kv_cache.KVCache.rings`), written by position, instead of
P − 1 + T. Gemma 3 slides in 5 of every 6 layers (window 512 in the 1B model, 1,024 in
the larger ones) and Gemma 2 in every other layer, so at reasoning lengths most of the
cache is gone. Both arms run the same dense sampler (`sampling.sample`) on the same
prompts, keys and limits, one sitting on a quiet machine; the arm without rings builds
its cache with `model.init_cache(..., rings=False)`:

  - memory: XLA's temporary bytes of each compiled sampler (`memory_analysis`);
  - speed: generated tokens / s over calls 2 and 3 (the first compiles);
  - equality: the same tokens, and log-probs within 1e-5 (float32);
  - the memory plan's sampler figure beside XLA's, for each (`memory._sampler_bytes`).

The model: the tiny config with Gemma 3's features (6 layers, 5 sliding : 1 full, window
64, q/k norms, local rope), float32; 4 prompts × 4 rows of 64 prompt tokens and 2,048 new
ones, the EOS logit removed so that every row runs to the end. Writes
experiments/results/long_rollouts/window_rings.json; with --tpu, the Gemma 3 1B sampler
(bfloat16, window 512) of both arms compiled for one v5e chip by libtpu on this host
(nothing runs), experiments/results/long_rollouts/window_rings_tpu_target.json
(TPU_TARGET_CLAIM; window_rings_tpu.json holds TPU_CLAIM's record, of an earlier build).

--paged (PAGED_CLAIM): the same comparison for the paged sampler (`paged.sample`,
sampler.kv_layout="paged"), whose sliding layers keep a window ring per row beside the
full layer's pages (`kv_cache.PagedKVCache.rings`), against the same paged sampler whose
prompt cache has none (every layer paged): pages of 64 slots, a whole pool (no row
starves, so the rollouts can be compared), the same shape, model and calls. Writes
experiments/results/long_rollouts/window_rings_paged.json (--quick: 256 tokens, nothing
written).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import paged_sampler  # experiments/ (run as a script, or on the tests' path).

from grpo_jax.models import model, paged, sampling
from grpo_jax.trainer import memory

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "long_rollouts" / "window_rings.json"

CLAIM = (
  "with Gemma 3's layout (5 sliding layers of window 64 to 1 full), 16 rows of 64 prompt "
  "and 2,048 new tokens, the dense sampler with window rings needs at most 0.4x the XLA "
  "temporary memory of the same sampler without them and generates at least 1.2x its "
  "tokens/s on this CPU, with the same rollouts"
)
RULE = (
  "supports if rings/full temporary bytes <= 0.4, rings/full tokens/s >= 1.2 (the mean of "
  "calls 2 and 3 of each), every row's tokens equal and |d logp| <= 1e-5 on real tokens; "
  "contradicts otherwise (written before any run)"
)
SEEDS = {"params": 0, "prompts": 1, "sampling": 3}
TPU_CLAIM = (
  "on one TPU v5e chip (compiled here by libtpu, not run), the Gemma 3 1B sampler "
  "(bfloat16, window 512 in 22 of 26 layers, 16 rows = 4 prompts x 4, 256-token prompts, "
  "8,192 new tokens) compiles with window rings in at most 0.4x the XLA temporary bytes "
  "of the same sampler without them"
)
TPU_RULE = (
  "supports if both compile and rings/full temporary bytes <= 0.4; contradicts otherwise "
  "(written before any compile)"
)
TPU_SEEDS = "none: compiles of abstract arrays (no values are drawn)"
# TPU_CLAIM's record (window_rings_tpu.json, commit c455ab3) compiled the sampler as this
# CPU host would build it: 4 decode segments whose cache grows by copies, a float32 cache
# traced for the bfloat16 model. Since `kernels.target_platform` the trace builds what a
# TPU host builds (one segment, a bfloat16 cache); this claim is that program's, written
# before it was compiled. Its bound is the cache arithmetic's (3.52 GB of cache without
# rings, 0.75 GB with them, plus the same few hundred MB of other temporaries in both).
TPU_TARGET_CLAIM = (
  "on one TPU v5e chip (compiled here by libtpu for the chip, as a TPU host builds the "
  "sampler: one decode segment, a bfloat16 cache), the Gemma 3 1B sampler (bfloat16, "
  "window 512 in 22 of 26 layers, 16 rows = 4 prompts x 4, 256-token prompts, 8,192 new "
  "tokens) compiles with window rings in at most 0.35x the XLA temporary bytes of the "
  "same sampler without them"
)
TPU_TARGET_RULE = (
  "supports if both compile and rings/full temporary bytes <= 0.35; contradicts "
  "otherwise (written before any compile of this build)"
)
TPU_TARGET_OUT = ROOT / "experiments" / "results" / "long_rollouts" / "window_rings_tpu_target.json"
PAGED_CLAIM = (
  "with Gemma 3's layout (5 sliding layers of window 64 to 1 full), 16 rows of 64 prompt "
  "and 2,048 new tokens on pages of 64 slots (a whole pool), the paged sampler with window "
  "rings needs at most 0.4x the XLA temporary memory of the same paged sampler without "
  "them and generates at least 1.2x its tokens/s on this CPU, with the same rollouts"
)
PAGED_RULE = (
  "supports if rings/full temporary bytes <= 0.4, rings/full tokens/s >= 1.2 (the mean of "
  "calls 2 and 3 of each), every row's tokens equal and |d logp| <= 1e-5 on real tokens; "
  "contradicts otherwise (written before any run of the paged arms at this shape and seeds)"
)
PAGED_OUT = ROOT / "experiments" / "results" / "long_rollouts" / "window_rings_paged.json"
EOS = 1
GEMMA3_TINY = dict(
  n_layers=6, sliding_window=64, qk_norm=True, rope_local_theta=10_000.0, post_norms=True,
  norm_offset=1.0, embed_scale=True, activation="gelu_tanh",
  layer_types=("sliding_attention",) * 5 + ("full_attention",),
)  # fmt: skip


def _arms(cfg, scfg, *, model_fn, sample=sampling.sample):
  """The dense sampler (or `sample`) with and without window rings."""
  return {
    name: functools.partial(
      sample,
      cfg=scfg,
      model_fn=model_fn,
      init_cache=functools.partial(model.init_cache, cfg, rings=rings),
    )
    for name, rings in (("rings", True), ("full", False))
  }


def run(*, B: int, G: int, P: int, T: int, paged_layout: bool = False, seeds=SEEDS) -> dict:
  """Both arms (`_arms`) at this shape: the dense sampler's, or with paged_layout the
  paged sampler's on a whole pool of 64-slot pages."""
  cfg = model.tiny_config(64, **GEMMA3_TINY)
  params = model.init(cfg, jax.random.key(seeds["params"]))
  rng = np.random.RandomState(seeds["prompts"])
  prompts = sampling.Prompts(
    tokens_BP=jnp.asarray(rng.randint(2, 64, size=(B, P)), jnp.int32),
    mask_BP=jnp.ones((B, P), jnp.bool_),
  )
  scfg = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(EOS,), pad_id=0, group_size=G, prompt_buckets=(P,),
    max_prompt_len=P,
  )  # fmt: skip
  hyper = sampling.sampling_params(temperature=1.0)
  args = (params, prompts, jax.random.key(seeds["sampling"]), hyper)
  pages, arm_cfg, sample = None, scfg, sampling.sample
  if paged_layout:
    arm_cfg = dataclasses.replace(scfg, kv_layout="paged", page_size=64, kv_pool_fraction=1.0)
    pages, sample = memory._pool_pages(arm_cfg, prompts=B), paged.sample
  rows, outs = {}, {}
  model_fn = paged_sampler._no_eos(model.make_model_fn(cfg))
  for name, fn in _arms(cfg, arm_cfg, model_fn=model_fn, sample=sample).items():
    rows[name], outs[name] = paged_sampler.sampler_row(fn, args)
  for name, rings in (("rings", True), ("full", False)):
    plan = paged_sampler._plan(cfg, scfg, B=B, P=P, T=T, pages=pages, rings=rings)
    rows[name]["plan_bytes"] = plan
    rows[name]["plan_over_xla"] = round(plan / rows[name]["xla_temp_bytes"], 3)
  r, f = outs["rings"], outs["full"]
  mask = np.asarray(f.mask_NT)
  return {
    "shape": {"prompts": B, "group": G, "rows": B * G, "prompt_tokens": P,
              "max_new_tokens": T, "layers": cfg.n_layers, "sliding_layers": sum(cfg.sliding_layers),
              "window": cfg.sliding_window},
    **rows,
    "temp_ratio": round(rows["rings"]["xla_temp_bytes"] / rows["full"]["xla_temp_bytes"], 3),
    "speed_ratio": round(rows["rings"]["tokens_per_s"] / rows["full"]["tokens_per_s"], 2),
    "tokens_equal": bool(np.array_equal(np.asarray(r.tokens_NT), np.asarray(f.tokens_NT))),
    "max_abs_dlogp": float(np.max(np.abs(np.where(mask, r.logp_NT - f.logp_NT, 0.0)))),
  }  # fmt: skip


def verdict(record: dict) -> str:
  """RULE applied to a record."""
  r = record["result"]
  ok = (
    r["temp_ratio"] <= 0.4
    and r["speed_ratio"] >= 1.2
    and r["tokens_equal"]
    and r["max_abs_dlogp"] <= 1e-5
  )
  return "supports" if ok else "contradicts"


def tpu_rows() -> dict:
  """XLA's TPU memory figures (`memory_analysis`) of both arms at TPU_CLAIM's shape,
  compiled for one v5e chip of an abstract topology (`paged_sampler.tpu_chip_inputs`)."""
  B, G, P, T = 4, 4, 256, 8192
  cfg, params, args = paged_sampler.tpu_chip_inputs("gemma-3-1b", B=B, P=P)
  scfg = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(EOS,), pad_id=0, group_size=G, prompt_buckets=(P,),
    max_prompt_len=P,
  )  # fmt: skip
  out = {"model": "gemma-3-1b (bfloat16)", "topology": "v5e:2x2 (one chip of it)",
         "shape": {"prompts": B, "group": G, "prompt_tokens": P, "max_new_tokens": T,
                   "window": cfg.sliding_window, "sliding_layers": sum(cfg.sliding_layers),
                   "layers": cfg.n_layers}}  # fmt: skip
  for name, fn in _arms(cfg, scfg, model_fn=model.make_model_fn(cfg)).items():
    out[name] = paged_sampler.tpu_temp(fn, params, args)
  out["temp_ratio"] = round(out["rings"]["xla_temp_bytes"] / out["full"]["xla_temp_bytes"], 3)
  return out


def tpu_verdict(record: dict) -> str:
  """TPU_RULE applied to a record."""
  return "supports" if record["result"]["temp_ratio"] <= 0.4 else "contradicts"


def tpu_target_verdict(record: dict) -> str:
  """TPU_TARGET_RULE applied to a record."""
  return "supports" if record["result"]["temp_ratio"] <= 0.35 else "contradicts"


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  ap.add_argument("--quick", action="store_true", help="256 new tokens (the test)")
  ap.add_argument("--tpu", action="store_true", help="TPU_CLAIM: compile for a v5e chip")
  ap.add_argument("--paged", action="store_true", help="PAGED_CLAIM: the paged sampler's arms")
  ap.add_argument("--out", default="")
  args = ap.parse_args(argv)
  if args.tpu:  # TPU_TARGET_CLAIM (TPU_CLAIM's build is gone: see TPU_TARGET_CLAIM).
    record = paged_sampler.record_header(
      TPU_TARGET_CLAIM, TPU_TARGET_RULE, TPU_SEEDS, "compiling for TPU with libtpu", tpu_rows()
    )
    record["verdict"] = tpu_target_verdict(record)
    pathlib.Path(args.out or TPU_TARGET_OUT).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record["result"]))
    return record
  shape = dict(B=2, G=2, P=16, T=256) if args.quick else dict(B=4, G=4, P=64, T=2048)
  host = f"{jax.devices('cpu')[0].device_kind}, {jax.device_count()} device(s), float32"
  claim, rule = (PAGED_CLAIM, PAGED_RULE) if args.paged else (CLAIM, RULE)
  result = run(**shape, paged_layout=args.paged)
  record = paged_sampler.record_header(claim, rule, SEEDS, host, result)
  record["verdict"] = verdict(record)  # PAGED_RULE's tests are RULE's.
  default = PAGED_OUT if args.paged else OUT
  out = pathlib.Path(args.out) if args.out else (None if args.quick else default)
  if out:
    out.write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps(record["result"]))
  return record


if __name__ == "__main__":
  main()
