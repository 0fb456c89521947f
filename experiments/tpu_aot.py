"""GRPO iterations of 0.5–8B models compiled for TPU topologies on this CPU host (`aot`).

    python experiments/tpu_aot.py                          # every cell not yet in the results
    python experiments/tpu_aot.py --shapes=qwen2.5-0.5b --topologies=v5e-8 --modes=full
    python experiments/tpu_aot.py --table                  # the results as a Markdown table
    python experiments/tpu_aot.py --new_tokens=4096 --shapes=qwen2.5-1.5b --topologies=v5e-8
    python experiments/tpu_aot.py --new_tokens=4096 --screen   # every cell by the memory plan

The workload (the same for every cell): GRPO (`rl.preset=grpo`, KL to a reference 0.001),
32 prompts × G = 8 = 256 rollout rows, 512 prompt + 1,024 new tokens, one update of 4
mini-batches, bfloat16 compute, float32 params and Adam (full) or LoRA rank 16 on every
projection over a bfloat16 base (lora), random weights of the model's published shape
(`models.shapes`). Cells: 4 shapes × 5 topologies × 2 modes; `--new_tokens=4096` the
long-rollout variant of a cell (512 + 4,096 tokens, the rest the same).

Each cell starts from the setting a user would try first (full remat over scanned layers,
fsdp over every chip of a slice, data across slices, 1 micro-batch, the log-prob forwards
one mini-batch at a time: rl.logprob_batches=4) and, when XLA says it
does not fit, takes the first rung of `aot.ladder` that fits, checked by compiling it
(`aot.advise`): the smallest change of remat, micro-batches, log-prob slices and mesh that
fits. Recorded per cell: the setting, XLA's peak bytes per chip of each function (with the
resident arrays it does not take as arguments), the memory plan's figure, and the
model-FLOPs roofline seconds per phase (`aot.model_roofline`: peak bf16 FLOPs and HBM
bandwidth of the chip, `infra.tpu.CHIPS`, no communication, no overlap).

Results: experiments/results/tpu_aot/<shape>__<topology>__<mode>[__<new tokens>].json
(one per cell, the suffix when new tokens is not 1,024, so a
run that stops resumes where it stopped) and README.md there (`--table`). Compiling is
deterministic: the figures do not depend on this machine's load; the compile seconds do.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import pathlib
import platform
import subprocess
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import tpu_aot_tables as tables  # noqa: E402

from grpo_jax.infra import config_lib  # noqa: E402
from grpo_jax.trainer import aot, memory  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


def workload(mode: str, new_tokens: int = tables.NEW_TOKENS):
  """The cell's config before any advice (see the module docstring)."""
  c = config_lib.load(str(ROOT / "configs" / "scale.py") + ":0.5b")
  c.sampler.update(
    max_new_tokens=new_tokens, max_prompt_len=512, prompt_buckets=(512,), group_size=8
  )
  c.update(prompts_per_step=32, eval_size=32)
  c.rl.update(num_minibatches=4, micro_batches=1, logprob_batches=4, kl_coef=0.001)
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  if mode == "lora":
    c.model.lora.update(rank=16, alpha=32.0, base_dtype="bfloat16")
  return c


def cell(shape: str, topology: str, mode: str, new_tokens: int = tables.NEW_TOKENS) -> dict:
  """One cell compiled (with advice when it does not fit): the JSON record."""
  name, slices = tables.TOPOLOGIES[topology]
  config = workload(mode, new_tokens)
  t0 = time.perf_counter()
  got = aot.plan(config, topology=name, num_slices=slices, model_source=shape)
  tip = got["advice"]
  final = tip["plan"] if tip and tip["plan"] else got  # The advised setting, as compiled.
  keep = ("name", "fits", "peak_bytes", "total_bytes", "temp_bytes", "resident_bytes",
          "flops", "matmul_flops", "bytes_accessed", "model_roofline_s", "ici_s", "dcn_s",
          "collectives_by_kind", "refused", "need_unknown")  # fmt: skip
  rows = lambda g: [{k: r[k] for k in keep if k in r} for r in g["rows"]]  # noqa: E731
  return {
    "shape": shape,
    "topology": topology,
    "mode": mode,
    "new_tokens": new_tokens,
    "claim": "the workload fits the topology's HBM as first tried (else: the advice's setting)",
    "verdict": "supports" if got["run"]["fits"] else "contradicts",
    "seeds": "none: a compile is deterministic (random weights are never drawn)",
    "first": {"run": got["run"], "rows": rows(got), "problems": got["problems"]},
    "advice": tip and {k: v for k, v in tip.items() if k != "plan"},
    "final": {"run": final["run"], "rows": rows(final), "problems": final["problems"]},
    "notes": got["notes"],
    "compile_s": round(time.perf_counter() - t0, 1),
    "date": datetime.date.today().isoformat(),
    "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
    "jax": jax.__version__,
    "code": CODE,
  }


def screen(new_tokens: int) -> dict:
  """Every cell of one completion budget priced by the memory plan alone (`memory.plan_for`,
  seconds a cell, no compile): the plan's peak a chip as first tried and, when that is
  over the chip's HBM, the first rung of `aot.ladder` whose plan is under it. A guide, not
  a verdict: the plan is within about 20% of XLA's peak, on either side (`aot.PLAN_SLACK`;
  the compiled 4,096-token cells: Qwen2.5-1.5B full on v5e-8 needed micro-batches and
  log-prob slices beside the chunked head the plan named, Qwen2.5-7B LoRA on v5e-32 fit as
  first tried where the plan was over the chip's HBM), so it says which cells to compile
  first; a compile decides (`cell`)."""
  rows = []
  for shape, topology, mode in itertools.product(tables.SHAPES, tables.TOPOLOGIES, tables.MODES):
    name, slices = tables.TOPOLOGIES[topology]
    target = aot.Target.load(name, num_slices=slices)
    config = workload(mode, new_tokens)
    setup, _ = aot.setup_for(config, target, model_source=shape)
    hbm, n = aot.limit_bytes(setup, target), len(target.devices)
    first = memory.plan_for(setup, n_devices=n, platform="tpu").peak
    rungs = aot.planned_rungs(config, setup, target, model_source=shape) if first > hbm else ()
    # Rungs add up, first to last: the first whose plan is under the HBM.
    rung, rung_plan = next(((o, p) for o, _, _, p in rungs if p <= hbm), (None, None))
    rows.append(dict(shape=shape, topology=topology, mode=mode, limit_bytes=hbm,
                     first_plan_bytes=first, rung=rung, rung_plan_bytes=rung_plan))  # fmt: skip
    print(f"  {shape} {topology} {mode}: plan {tables.gib(first)} GiB; rung {rung}", flush=True)
  return {"new_tokens": new_tokens, **SCREEN_CLAIM, "rows": rows,
          "date": datetime.date.today().isoformat(), "jax": jax.__version__, "code": CODE}  # fmt: skip


# A screen prices; it judges nothing (no rule was set before its first run): the cells'
# compiles carry the verdicts.
SCREEN_CLAIM = {
  "claim": "the memory plan's price of every cell: where it fits as first tried, else the "
  "first rung whose plan fits (a guide to which cells to compile, not a fit verdict)",
  "verdict": "inconclusive",
  "seeds": "none: the memory plan is deterministic (random weights are never drawn)",
}


CONFIG_FILES = ("scale.py", "gsm8k_qwen.py", "math_qwen.py")  # Those with TOPOLOGIES.


def shipped() -> list[tuple[str, str, str, str]]:
  """(config file, variant, topology, model shape or "") of every shipped accelerator
  variant: each config module's TOPOLOGIES (and SHAPES for checkpoint configs)."""
  out = []
  for name in CONFIG_FILES:
    module = config_lib.module(str(ROOT / "configs" / name))
    for variant, topology in module.TOPOLOGIES.items():
      out.append((name, variant, topology, getattr(module, "SHAPES", {}).get(variant, "")))
  return out


def config_cell(name: str, variant: str, topology: str, shape: str) -> dict:
  """A shipped config compiled for the topology its docstring names, as it ships (advice
  only reported)."""
  t0 = time.perf_counter()
  config = config_lib.load(str(ROOT / "configs" / name) + f":{variant}")
  got = aot.plan(
    config,
    topology=topology,
    model_source=shape,
    advice=False,
  )
  keep = ("name", "fits", "peak_bytes", "total_bytes", "temp_bytes", "resident_bytes",
          "model_roofline_s", "collectives_by_kind", "refused", "need_unknown")  # fmt: skip
  return {
    "config": f"configs/{name}:{variant}",
    "fingerprint": aot.fingerprint(config),
    "topology": topology,
    "claim": "the config, as shipped, fits the topology its docstring names",
    "verdict": "supports" if got["run"]["fits"] and not got["problems"] else "contradicts",
    "seeds": "none: a compile is deterministic (random weights are never drawn)",
    "model": shape or "config.model",
    "run": got["run"],
    "rows": [{k: r[k] for k in keep if k in r} for r in got["rows"]],
    "problems": got["problems"],
    "compile_s": round(time.perf_counter() - t0, 1),
    "date": datetime.date.today().isoformat(),
    "jax": jax.__version__,
    "code": CODE,
  }


def code_version() -> str:
  """The commit the figures come from, "+dirty" when the tree differs from it."""
  run = lambda *a: subprocess.run(a, cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
  dirty = run("git", "status", "--porcelain", "--untracked-files=no")
  return run("git", "rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


CODE = code_version()  # At start: the code this process compiles with.


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--shapes", default=",".join(tables.SHAPES))
  ap.add_argument("--topologies", default=",".join(tables.TOPOLOGIES))
  ap.add_argument("--modes", default=",".join(tables.MODES))
  ap.add_argument(
    "--new_tokens", type=int, default=tables.NEW_TOKENS, help="tokens each row decodes"
  )
  ap.add_argument("--redo", action="store_true", help="recompile cells already recorded")
  ap.add_argument(
    "--tag", default="", help="record the cells under a name of their own (a rerun that keeps "
    "the earlier records): <cell>__<tag>.json"
  )  # fmt: skip
  ap.add_argument("--table", action="store_true", help="print the recorded cells and exit")
  ap.add_argument(
    "--screen", action="store_true", help="price every cell of --new_tokens by the memory "
    "plan alone (no compile) and record it: screen__<new tokens>.json"
  )  # fmt: skip
  ap.add_argument(
    "--configs", action="store_true", help="compile the shipped accelerator configs instead"
  )
  args = ap.parse_args()
  if args.tag.isdigit() or "__" in args.tag:
    ap.error(f"--tag={args.tag!r}: a name with a letter and no '__' (the cell path's separator).")
  if args.table:
    print(tables.every_table())
    return
  if args.screen:
    path = tables.OUT / f"screen__{args.new_tokens}.json"
    path.write_text(json.dumps(screen(args.new_tokens), indent=1) + "\n")
    print(tables.screen_table(args.new_tokens))
    return
  if args.configs:
    (tables.OUT / "configs").mkdir(parents=True, exist_ok=True)
    for name, variant, topology, shape in shipped():
      path = tables.OUT / "configs" / f"{name.removesuffix('.py')}__{variant}.json"
      if path.exists() and not args.redo:
        continue
      print(f"configs/{name}:{variant} on {topology} ...", flush=True)
      r = config_cell(name, variant, topology, shape)
      path.write_text(json.dumps(r, indent=1, default=str) + "\n")
      print(f"  fits: {r['run']['fits']}; peak {tables.gib(r['run']['peak_bytes'])} GiB; "
            f"problems {r['problems']}; {r['compile_s']} s", flush=True)  # fmt: skip
    return
  tables.OUT.mkdir(parents=True, exist_ok=True)
  for shape in args.shapes.split(","):
    for topology in args.topologies.split(","):
      for mode in args.modes.split(","):
        path = tables.cell_path(shape, topology, mode, args.new_tokens, args.tag)
        if path.exists() and not args.redo:
          continue
        print(f"{shape} {topology} {mode} {args.new_tokens} ...", flush=True)
        r = cell(shape, topology, mode, args.new_tokens)
        path.write_text(json.dumps(r, indent=1, default=str) + "\n")
        fin = r["final"]["run"]
        print(
          f"  fits first: {r['first']['run']['fits']}; advice: "
          f"{(r['advice'] or {}).get('line', '-')}; final peak {tables.gib(fin['peak_bytes'])} GiB; "
          f"{r['compile_s']} s",
          flush=True,
        )


if __name__ == "__main__":
  main()
