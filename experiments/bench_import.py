"""Import time and peak host memory of a Hugging Face checkpoint (`grpo_jax.models.hf`).

  python experiments/bench_import.py                    # synthetic ~1.1B Llama, bfloat16
  python experiments/bench_import.py --size=tiny        # seconds; what the smoke test runs
  python experiments/bench_import.py --hf_dir=DIR       # an existing checkpoint

It writes a random Llama-shaped checkpoint in bfloat16 safetensors (several shards, as
the hub has them; skipped when DIR/config.json exists), then imports it in a fresh
process with bfloat16 params on the default device and measures:
- import_seconds: `hf.load_params` until every param is ready;
- peak_rss_bytes: the process's peak resident memory (VmHWM) after the import;
- baseline_rss_bytes: its resident memory after JAX started, before the import;
- ratio = (peak - baseline) / checkpoint bytes. On CPU the imported params themselves
  live in host memory (1.0×), so the streaming overhead is ratio - 1.0. Target: < 1.3.
The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

SIZES = {
  # ~1.1B: Llama 3.2 1B-like widths with an untied head and a 32K vocabulary.
  "1b": dict(
    hidden_size=2048,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=8192,
    vocab_size=32768,
  ),  # fmt: skip
  "tiny": dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=512,
  ),  # fmt: skip
}


def write_checkpoint(out: pathlib.Path, size: str, *, shard_bytes: int = 1 << 30) -> int:
  """Random bfloat16 Llama checkpoint; returns the tensor bytes. One tensor in memory at
  a time (each is generated when the writer reaches it)."""
  import ml_dtypes

  from grpo_jax.models import hf

  config = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
    rope_theta=500000.0, tie_word_embeddings=False, hidden_act="silu", **SIZES[size],
  )  # fmt: skip
  cfg = hf.model_config(config)
  out.mkdir(parents=True, exist_ok=True)
  (out / "config.json").write_text(json.dumps(config))
  # The layout hf.export writes: its tensor names and shapes, split into files by size.
  shards = hf.shard_files(hf.checkpoint_entries(cfg), itemsize=2, max_shard_bytes=shard_bytes)
  rng = np.random.default_rng(0)

  def tensor(shape):
    return (0.02 * rng.standard_normal(shape, np.float32)).astype(ml_dtypes.bfloat16)

  weight_map, total = {}, 0
  for fname, shard in shards:
    shapes = {e[0]: (e[1], ml_dtypes.bfloat16) for e in shard}
    hf.write_safetensors(out / fname, ((e[0], tensor(e[1])) for e in shard), shapes=shapes)
    total += sum(int(np.prod(e[1])) * 2 for e in shard)
    weight_map.update({e[0]: fname for e in shard})
  (out / "model.safetensors.index.json").write_text(
    json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
  )
  return total


def peak_rss() -> int:
  """This process's peak resident bytes: VmHWM (Linux; unlike ru_maxrss it does not carry
  the parent's peak across fork + exec), else ru_maxrss."""
  try:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
      if line.startswith("VmHWM:"):
        return int(line.split()[1]) * 1024
  except OSError:
    pass
  scale = 1 if sys.platform == "darwin" else 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def measure(hf_dir: str) -> dict:
  """Runs in a fresh process: the peak is a high-water mark."""
  import jax

  from grpo_jax.models import hf, model

  jax.numpy.zeros(1).block_until_ready()  # Start the backend before the baseline.
  baseline = peak_rss()
  cfg = hf.model_config(hf.read_config(hf_dir), param_dtype="bfloat16", dtype="bfloat16")
  t0 = time.perf_counter()
  params = hf.load_params(hf_dir, cfg)
  jax.block_until_ready(params)
  seconds = time.perf_counter() - t0
  peak = peak_rss()
  ckpt = sum(e.stop - e.start for e in hf.tensor_index(hf_dir).values())
  return dict(
    params=model.param_count(params),
    checkpoint_bytes=ckpt,
    import_seconds=round(seconds, 2),
    baseline_rss_bytes=baseline,
    peak_rss_bytes=peak,
    ratio=round((peak - baseline) / ckpt, 3),
    ratio_total=round(peak / ckpt, 3),
  )


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--size", default="1b", choices=sorted(SIZES))
  ap.add_argument("--hf_dir", default=None, help="checkpoint to import (written if absent)")
  ap.add_argument("--measure", default=None, help=argparse.SUPPRESS)  # The child process.
  args = ap.parse_args()
  if args.measure:
    print(json.dumps(measure(args.measure)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    hf_dir = pathlib.Path(args.hf_dir or pathlib.Path(tmp) / f"llama_{args.size}")
    if not (hf_dir / "config.json").exists():
      t0 = time.perf_counter()
      written = write_checkpoint(hf_dir, args.size)
      print(f"wrote {written / 2**30:.2f} GiB to {hf_dir} in {time.perf_counter() - t0:.0f} s")
    child = subprocess.run(
      [sys.executable, __file__, f"--measure={hf_dir}"],
      capture_output=True,
      text=True,
      check=True,
      env={"JAX_PLATFORMS": "cpu", **os.environ},
    )
    out = json.loads(child.stdout.strip().splitlines()[-1])
  gib = 2**30
  print(
    f"{out['params'] / 1e9:.2f}B params, {out['checkpoint_bytes'] / gib:.2f} GiB bfloat16: "
    f"import {out['import_seconds']:.1f} s; peak RSS {out['peak_rss_bytes'] / gib:.2f} GiB "
    f"(after JAX start {out['baseline_rss_bytes'] / gib:.2f} GiB): "
    f"{out['ratio']:.2f}x the checkpoint (target < 1.3x)"
  )
  print(json.dumps(dict(size=args.size, **out)))


if __name__ == "__main__":
  main()
