"""GPU throughput at real model sizes (issue 35): decoding against the HBM roofline, the
update's MFU against the measured bfloat16 peak, and Hugging Face `generate` side by side.

  python experiments/bench_gpu.py --out experiments/results/gpu/2026-11-28_h200.jsonl
  python experiments/bench_gpu.py --quick --no-hf     # CPU smoke run: tiny shapes
  python experiments/bench_gpu.py --sizes 0.5b --no-hf --decode_segments 4 --shared_prefix 0

Workload (issue 35): the Qwen2.5-0.5B and Qwen2.5-1.5B architectures of configs/scale.py
(random weights), bfloat16 compute with float32 params and Adam, 32 prompts x 512 random
tokens, G = 8 (256 rows), 1024 new tokens at temperature 1 (EOS is one id of 151936, so
rows run to the end), β = 0, one update over the whole batch in --micro_batches
micro-batches, model.remat = "auto" (the memory plan picks none / full / full + logit
chunks for the device), π_old = the sampler's log-probs. The functions are the trainer's
own (`steps.functions`), as in bench_rl_iteration.py.

Parts, each in a process of its own (the whole GPU for each; torch and JAX never share one):
  peaks          the bfloat16 matmul peak (8192^3, float32 accumulation), the float32 one
                 (TF32 unless JAX_DEFAULT_MATMUL_PRECISION says otherwise) and the memory
                 bandwidth (`flops.matmul_peak`, `flops.memory_bandwidth`)
  jax:SIZE       one iteration that compiles, then --iterations timed ones (medians)
  hf:SIZE        `Qwen2ForCausalLM.generate` (bfloat16, SDPA attention, the same shapes,
                 num_return_sequences = G): one short warm-up, then one timed call

Figures (one JSON line each: {"figure", "value", "unit", "part", "size", "target"?}):
  sample_s, prepare_s, update_s, iteration_s    wall seconds, outputs ready
  sample_compile_s, update_compile_s            first call minus the timed median
  sample_tokens_per_s                           generated tokens / sample_s (prefill in)
  decode_step_ms                                sample_s / decode steps
  decode_roofline_tokens_per_s                  rows x bandwidth / the bytes a decode step
                                                must read (every weight once in bfloat16,
                                                the filled KV slots at the mean context
                                                P + T/2); decode_of_roofline is the ratio
                                                (target >= 0.5)
  decode_slots_read_ratio                       KV bytes the sampler's attention reads
                                                over the filled ones (P + T/2 a row), at the
                                                mean step: every slot of the step's segment
                                                (`sampling.segment_slots`: all P + T with
                                                one), the prompt's once per group with a
                                                shared prompt cache: what a slot-blind
                                                kernel pays
  update_tokens_per_s, mfu_update               N (P + T) positions / update_s; the update's
                                                model FLOPs (3 forwards, `grpo_jax.infra.flops`)
                                                / update_s / the bfloat16 peak (target >= 0.45)
  mfu_sample, mfu_iteration                     sampling FLOPs / sample_s / peak; sampling +
                                                update FLOPs / iteration_s / peak
  peak_memory_gib                               the device's peak bytes in use
  hf_generate_s, hf_tokens_per_s                Hugging Face, same shapes
  speedup_vs_hf                                 sample_tokens_per_s / hf_tokens_per_s
                                                (target >= 3)
A "context" line per part records the device, versions, the chosen remat / logit chunk and
the flags (XLA_FLAGS, matmul precision, determinism) and the sampler's settings
(--decode_segments: 0 automatic, one on a GPU; --shared_prefix 1 / 0: the G rows of a group
share one copy of their prompt's cache, or each has its own). --budget_s skips the parts
that would start after it (a "skipped" line says so): the whole script fits a short GPU
lease.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIZES = ("0.5b", "1.5b")
# --quick: a CPU smoke test of every figure (tests/experiments/test_experiments.py), not a benchmark.
QUICK_MODEL = dict(
  d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=128, vocab_size=4096
)
TARGETS = {"decode_of_roofline": 0.5, "mfu_update": 0.45, "speedup_vs_hf": 3.0}


def workload(*, quick: bool) -> dict:
  """Prompts B, prompt length P, new tokens T, group size G."""
  return dict(B=4, P=16, T=16, G=8) if quick else dict(B=32, P=512, T=1024, G=8)


def make_config(
  size: str, *, quick: bool, micro_batches: int, decode_segments: int = 0, shared_prefix: int = 1
):
  """configs/scale.py:SIZE's model with the issue-35 workload (module docstring)."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  c = config_lib.load(str(ROOT / "configs" / "scale.py") + f":{size}")
  w = workload(quick=quick)
  if quick:
    c.model.update(QUICK_MODEL)
  c.model.update(dtype="bfloat16", param_dtype="float32", remat="auto")
  c.sampler.update(
    max_new_tokens=w["T"],
    group_size=w["G"],
    max_prompt_len=w["P"],
    prompt_buckets=(w["P"],),
    decode_segments=decode_segments,
    shared_prefix=bool(shared_prefix),
  )
  c.update(prompts_per_step=w["B"], reward_workers=0, progress=False, tensorboard=False)
  c.update(learning_rate=1e-6, warmup_steps=0, weight_decay=0.0, grad_clip=0.0, eval_size=8)
  rows = w["B"] * w["G"]
  c.rl.update(
    advantage="grpo",
    kl_coef=0.0,
    aggregation="token_mean",
    num_minibatches=1,
    micro_batches=min(micro_batches, rows),
    recompute_old_logp=False,
  )
  c.mesh.update(data=1, fsdp=1, tensor=1)
  return c


# --- figures ---------------------------------------------------------------------------


def line(figure: str, value, unit: str, **context) -> dict:
  out = {"figure": figure, "value": value, "unit": unit, **context}
  if figure in TARGETS:
    out["target"] = TARGETS[figure]
  return out


def emit(record: dict) -> None:
  print(json.dumps(record), flush=True)


def flags() -> dict:
  import jax  # noqa: PLC0415

  xla = os.environ.get("XLA_FLAGS", "")
  return {
    "XLA_FLAGS": xla,
    "jax_default_matmul_precision": str(jax.config.jax_default_matmul_precision),
    "deterministic_ops": "--xla_gpu_deterministic_ops=true" in xla,
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "device": jax.devices()[0].device_kind,
  }


def part_peaks(*, quick: bool) -> list[dict]:
  import jax.numpy as jnp  # noqa: PLC0415

  from grpo_jax.infra import flops  # noqa: PLC0415

  n = 512 if quick else 0
  ctx = dict(part="peaks", size="")
  return [
    line("context", flags(), "", **ctx),
    line("matmul_peak_bfloat16", flops.matmul_peak(n, dtype=jnp.bfloat16), "FLOP/s", **ctx),
    line("matmul_peak_float32", flops.matmul_peak(n, dtype=jnp.float32), "FLOP/s", **ctx),
    line("memory_bandwidth", flops.memory_bandwidth(2**25 if quick else 0), "B/s", **ctx),
  ]


def kv_bytes(cfg, *, rows: int, slots: float) -> float:
  width = 2 if cfg.dtype == "bfloat16" else 4
  return rows * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * slots * width


def slots_read_ratio(scfg, *, P: int) -> float:
  """KV slots a decode step's attention reads per row at the mean step, over the filled
  ones (P + T/2, the prompt's P − 1 and the last token's included): segment j's slots L_j
  for its steps e_j − e_{j−1} (`sampling.segment_slots`), the prompt's P − 1 counted once
  per group (1/G a row) with a shared prompt cache."""
  from grpo_jax.models import sampling  # noqa: PLC0415

  T, G = scfg.max_new_tokens, scfg.group_size
  slots = sampling.segment_slots(P - 1, scfg)
  ends = [L - slots[-1] + T for L in slots]
  read = sum((e - b) * L for b, e, L in zip([0, *ends[:-1]], ends, slots, strict=True)) / T
  if scfg.shared_prefix and G > 1:
    read -= (P - 1) * (1 - 1 / G)
  return read / (P + T / 2)


def part_jax(
  size: str, *, quick: bool, iterations: int, micro_batches: int, peaks: dict, **sampler
):
  import bench_rl_iteration  # noqa: PLC0415
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415

  from grpo_jax.models import sampling  # noqa: PLC0415
  from grpo_jax.rl import spec  # noqa: PLC0415
  from grpo_jax.trainer import build, run_state, steps  # noqa: PLC0415

  setup = build.build(make_config(size, quick=quick, micro_batches=micro_batches, **sampler))
  cfg, w = setup.model_cfg, workload(quick=quick)
  ctx = dict(part=f"jax:{size}", size=size)
  context = dict(
    flags(),
    remat=cfg.remat,
    scan_layers=cfg.scan_layers,
    logit_chunk=setup.rl_cfg.logit_chunk,
    micro_batches=setup.rl_cfg.micro_batches,
    decode_segments=sampling.segment_count(setup.sampler_cfg),
    shared_prefix=setup.sampler_cfg.shared_prefix,
    workload=w,
    model=dict(
      d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
      head_dim=cfg.head_dim, mlp_dim=cfg.mlp_dim, vocab_size=cfg.vocab_size,
    ),
  )  # fmt: skip
  emit(line("context", context, "", **ctx))
  fns = steps.functions(setup)
  key = jax.random.key(0)
  state = spec.init_state(
    run_state.initial_params(setup, fns, jax.random.fold_in(key, 0)), fns.optimizer
  )
  prompts = bench_rl_iteration.random_prompts(setup, seed=0)
  runs = []
  for it in range(1 + iterations):
    state, times, rollouts = bench_rl_iteration.timed_iteration(fns, setup, state, prompts, key, it)
    runs.append(times)
    print(f"jax:{size} iteration {it}: {json.dumps(times)}", file=sys.stderr, flush=True)
  med = {k: statistics.median(r[k] for r in runs[1:]) for k in runs[0]}
  N, P, T = setup.rollout_rows, w["P"], w["T"]
  steps_run = int(rollouts.num_steps)
  generated = float(np.asarray(rollouts.mask_NT).sum())
  fl = bench_rl_iteration.iteration_flops(setup, P=P, T=T, N=N)
  weights = sum(x.size for x in jax.tree.leaves(state.params)) * 2  # bfloat16 reads.
  filled = kv_bytes(cfg, rows=N, slots=P + T / 2)
  roofline = N * peaks["memory_bandwidth"] / (weights + filled)
  tokens_per_s = generated / med["sample_s"]
  bf16 = peaks["matmul_peak_bfloat16"]
  stats = jax.devices()[0].memory_stats() or {}
  out = [line(k, v, "s", **ctx) for k, v in med.items()]
  out += [
    line("sample_compile_s", runs[0]["sample_s"] - med["sample_s"], "s", **ctx),
    line("update_compile_s", runs[0]["update_s"] - med["update_s"], "s", **ctx),
    line("sample_tokens_per_s", tokens_per_s, "tok/s", **ctx),
    line("decode_step_ms", 1e3 * med["sample_s"] / max(steps_run, 1), "ms", **ctx),
    line("decode_roofline_tokens_per_s", roofline, "tok/s", **ctx),
    line("decode_of_roofline", tokens_per_s / roofline, "", **ctx),
    line("decode_slots_read_ratio", slots_read_ratio(setup.sampler_cfg, P=P), "", **ctx),
    line("update_tokens_per_s", N * (P + T) / med["update_s"], "tok/s", **ctx),
    line("mfu_sample", fl["sample"] / med["sample_s"] / bf16, "", **ctx),
    line("mfu_update", fl["update"] / med["update_s"] / bf16, "", **ctx),
    line("mfu_iteration", (fl["sample"] + fl["update"]) / med["iteration_s"] / bf16, "", **ctx),
  ]
  if "peak_bytes_in_use" in stats:
    out.append(line("peak_memory_gib", stats["peak_bytes_in_use"] / 2**30, "GiB", **ctx))
  return out


def part_hf(size: str, *, quick: bool) -> list[dict]:
  ctx = dict(part=f"hf:{size}", size=size)
  try:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
  except ImportError as e:
    return [line("skipped", f"torch/transformers not installed ({e})", "", **ctx)]
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  m = config_lib.load(str(ROOT / "configs" / "scale.py") + f":{size}").model
  if quick:
    m.update(QUICK_MODEL)
  w = workload(quick=quick)
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  hf_cfg = transformers.Qwen2Config(
    vocab_size=m.vocab_size, hidden_size=m.d_model, intermediate_size=m.mlp_dim,
    num_hidden_layers=m.n_layers, num_attention_heads=m.n_heads, num_key_value_heads=m.n_kv_heads,
    tie_word_embeddings=True, rope_theta=1e6, max_position_embeddings=w["P"] + w["T"],
    attn_implementation="sdpa",
  )  # fmt: skip
  assert hf_cfg.hidden_size // hf_cfg.num_attention_heads == m.head_dim, "Qwen2: D = H·E"
  torch.manual_seed(0)
  with torch.device(dev):
    hf = transformers.Qwen2ForCausalLM(hf_cfg)
  hf = hf.to(torch.bfloat16).eval()
  ids = torch.randint(10, m.vocab_size, (w["B"], w["P"]), device=dev)
  kwargs = dict(
    attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
    num_return_sequences=w["G"], pad_token_id=0, eos_token_id=None,
  )  # fmt: skip

  def generate(new_tokens: int) -> float:
    sync = torch.cuda.synchronize if dev == "cuda" else lambda: None
    sync()
    t = time.perf_counter()
    with torch.inference_mode():
      out = hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs)
    sync()
    assert out.shape == (w["B"] * w["G"], w["P"] + new_tokens), out.shape
    return time.perf_counter() - t

  generate(4)  # Warm-up: kernels, allocator.
  seconds = generate(w["T"])
  context = dict(torch=torch.__version__, transformers=transformers.__version__, device=dev)
  if dev == "cuda":
    context["gpu"] = torch.cuda.get_device_name()
  return [
    line("context", context, "", **ctx),
    line("hf_generate_s", seconds, "s", **ctx),
    line("hf_tokens_per_s", w["B"] * w["G"] * w["T"] / seconds, "tok/s", **ctx),
  ]


# --- driver ----------------------------------------------------------------------------


def run_part(part: str, args, *, peaks: dict, timeout: float) -> list[dict]:
  """The part in a process of its own; its JSON lines (or one "failed" line)."""
  cmd = [sys.executable, __file__, "--part", part, "--iterations", str(args.iterations)]
  cmd += ["--micro_batches", str(args.micro_batches), "--peaks", json.dumps(peaks)]
  cmd += ["--decode_segments", str(args.decode_segments)]
  cmd += ["--shared_prefix", str(args.shared_prefix)]
  cmd += ["--quick"] if args.quick else []
  size = part.partition(":")[2]
  try:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired as e:
    return [line("failed", f"timed out after {timeout:.0f} s", "", part=part, size=size)] + [
      json.loads(x) for x in (e.stdout or b"").decode().splitlines() if x.startswith("{")
    ]
  sys.stderr.write(r.stderr[-4000:])
  records = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
  if r.returncode:
    tail = r.stderr.strip().splitlines()[-1:] or ["(no output)"]
    records.append(line("failed", f"exit {r.returncode}: {tail[0]}", "", part=part, size=size))
  return records


def drive(args) -> list[dict]:
  start = time.perf_counter()
  date = datetime.date.today().isoformat()
  out_file = open(args.out, "a") if args.out else None  # noqa: SIM115
  records, peaks = [], {}

  def keep(rs):
    for r in rs:
      r.setdefault("date", date)
      records.append(r)
      print(json.dumps(r), flush=True)
      if out_file:
        out_file.write(json.dumps(r) + "\n")
        out_file.flush()

  parts = ["peaks"]
  hf_sizes = (args.hf_sizes or args.sizes).split(",")
  for size in args.sizes.split(","):
    parts += [f"jax:{size}"] + ([f"hf:{size}"] if size in hf_sizes and not args.no_hf else [])
  for part in parts:
    left = args.budget_s - (time.perf_counter() - start)
    if left <= 0:
      keep([line("skipped", f"--budget_s={args.budget_s} spent", "", part=part, size="")])
      continue
    got = run_part(part, args, peaks=peaks, timeout=max(left, 30.0))
    keep(got)
    if part == "peaks":
      peaks = {r["figure"]: r["value"] for r in got if r["unit"] in ("FLOP/s", "B/s")}
  keep(speedups(records))
  if out_file:
    out_file.close()
  return records


def speedups(records: list[dict]) -> list[dict]:
  by = {(r["part"], r["figure"]): r["value"] for r in records}
  out = []
  for size in SIZES:
    ours, theirs = (
      by.get((f"jax:{size}", "sample_tokens_per_s")),
      by.get((f"hf:{size}", "hf_tokens_per_s")),
    )
    if ours and theirs:
      out.append(line("speedup_vs_hf", ours / theirs, "", part=f"jax:{size}", size=size))
  return out


def main(argv=None) -> list[dict]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--sizes", default=",".join(SIZES))
  parser.add_argument("--hf_sizes", default="", help="sizes with the HF baseline ('': --sizes)")
  parser.add_argument("--iterations", type=int, default=1, help="timed, after the compiling one")
  parser.add_argument("--micro_batches", type=int, default=16)
  parser.add_argument("--budget_s", type=float, default=420.0)
  parser.add_argument("--out", default="", help="append the JSON lines to this file")
  parser.add_argument("--no-hf", dest="no_hf", action="store_true")
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--decode_segments", type=int, default=0, help="0: automatic")
  parser.add_argument("--shared_prefix", type=int, default=1, choices=(0, 1))
  parser.add_argument("--part", default="", help=argparse.SUPPRESS)
  parser.add_argument("--peaks", default="{}", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if not args.part:
    return drive(args)
  kind, _, size = args.part.partition(":")
  if kind == "peaks":
    records = part_peaks(quick=args.quick)
  elif kind == "jax":
    records = part_jax(
      size,
      quick=args.quick,
      iterations=args.iterations,
      micro_batches=args.micro_batches,
      peaks=json.loads(args.peaks),
      decode_segments=args.decode_segments,
      shared_prefix=args.shared_prefix,
    )
  else:
    records = part_hf(size, quick=args.quick)
  for r in records:
    emit(r)
  return records


if __name__ == "__main__":
  main()
