"""GRPO iterations of 0.5–8B models compiled for TPU topologies on this CPU host (`aot`).

    python experiments/tpu_aot.py                          # every cell not yet in the results
    python experiments/tpu_aot.py --shapes=qwen2.5-0.5b --topologies=v5e-8 --modes=full
    python experiments/tpu_aot.py --table                  # the results as a Markdown table
    python experiments/tpu_aot.py --new_tokens=4096 --shapes=qwen2.5-1.5b --topologies=v5e-8

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

from grpo_jax import aot  # noqa: E402
from grpo_jax.infra import config_lib  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "experiments" / "results" / "tpu_aot"
SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b")
# Name -> (topology, slices). v5p-8 is 4 chips (8 TensorCores, one megacore device each).
TOPOLOGIES = {
  "v5e-8": ("v5e:2x4", 1),
  "v6e-8": ("v6e:2x4", 1),
  "v5p-8": ("v5p:2x2x1", 1),
  "v5e-32": ("v5e:4x8", 1),
  "2xv5e-16": ("v5e:4x4", 2),
}
MODES = ("full", "lora")


NEW_TOKENS = 1024  # The sweep's completion budget; --new_tokens for the long variant.


def workload(mode: str, new_tokens: int = NEW_TOKENS):
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


def cell(shape: str, topology: str, mode: str, new_tokens: int = NEW_TOKENS) -> dict:
  """One cell compiled (with advice when it does not fit): the JSON record."""
  name, slices = TOPOLOGIES[topology]
  config = workload(mode, new_tokens)
  t0 = time.perf_counter()
  got = aot.plan(config, topology=name, num_slices=slices, model_source=shape)
  tip = got["advice"]
  final = tip["plan"] if tip and tip["plan"] else got  # The advised setting, as compiled.
  keep = ("name", "fits", "peak_bytes", "total_bytes", "temp_bytes", "resident_bytes",
          "flops", "matmul_flops", "bytes_accessed", "model_roofline_s", "ici_s", "dcn_s",
          "collectives_by_kind", "refused")  # fmt: skip
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
          "model_roofline_s", "collectives_by_kind", "refused")  # fmt: skip
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


def _gib(n) -> str:
  return "-" if n is None else f"{n / 2**30:.1f}"


def configs_table() -> str:
  """The committed shipped-config records as one Markdown table."""
  lines = [
    "| config | topology | mesh | fits | peak GiB/chip (sample, logprobs, update) | plan GiB "
    "| roofline s/iter (sample, logprobs, update) | code |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for path in sorted((OUT / "configs").glob("*.json")):
    r = json.loads(path.read_text())
    run = r["run"]
    mesh = "x".join(str(run["mesh"][a]) for a in ("data", "fsdp", "tensor"))
    roof = run["roofline_s"]
    lines.append(
      f"| {r['config']} | {r['topology']} | {mesh} | {'yes' if run['fits'] else 'NO'} | "
      f"{', '.join(_gib(x['peak_bytes']) for x in r['rows'])} | {_gib(run['plan_peak_bytes'])} "
      f"| {sum(roof.values()):.2f} ({', '.join(f'{v:.2f}' for v in roof.values())}) | "
      f"{r.get('code', '-')} |"
    )
  return "\n".join(lines)


def cell_path(shape: str, topology: str, mode: str, new_tokens: int = NEW_TOKENS, tag: str = ""):
  suffix = ("" if new_tokens == NEW_TOKENS else f"__{new_tokens}") + (f"__{tag}" if tag else "")
  return OUT / f"{shape}__{topology}__{mode}{suffix}.json"


def tags(new_tokens: int) -> list[str]:
  """The --tag names of the committed cells of one completion budget."""
  budget = [] if new_tokens == NEW_TOKENS else [str(new_tokens)]
  names = [p.stem.split("__") for p in OUT.glob("*.json")]
  return sorted(
    {
      n[-1]
      for n in names
      if len(n) == 4 + len(budget) and n[3:-1] == budget and not n[-1].isdigit()
    }
  )


def table(new_tokens: int = NEW_TOKENS, tag: str = "") -> str:
  """The committed cells of one completion budget (and --tag) as a Markdown table, in the
  order of SHAPES, TOPOLOGIES and MODES."""
  lines = [
    "| shape | topology | mode | fits as first tried | setting that fits | peak GiB/chip "
    "(sample, logprobs, update) | plan GiB | roofline s/iter (sample, logprobs, update) |",
    "|---|---|---|---|---|---|---|---|",
  ]
  cells = [cell_path(*c, new_tokens, tag) for c in itertools.product(SHAPES, TOPOLOGIES, MODES)]
  for path in filter(pathlib.Path.exists, cells):
    r = json.loads(path.read_text())
    fin, tip = r["final"], r["advice"]
    setting = "as first tried" if tip is None else (
      " ".join(f"{k}={v}" for k, v in tip["overrides"].items()) if tip["overrides"] else "none fits"
    )  # fmt: skip
    peaks = ", ".join(_gib(x["peak_bytes"]) for x in fin["rows"])
    roof = fin["run"]["roofline_s"]
    lines.append(
      f"| {r['shape']} | {r['topology']} | {r['mode']} | {'yes' if r['first']['run']['fits'] else 'no'} "
      f"| {setting} | {peaks} | {_gib(fin['run']['plan_peak_bytes'])} | "
      f"{sum(roof.values()):.2f} ({', '.join(f'{v:.2f}' for v in roof.values())}) |"
    )
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--shapes", default=",".join(SHAPES))
  ap.add_argument("--topologies", default=",".join(TOPOLOGIES))
  ap.add_argument("--modes", default=",".join(MODES))
  ap.add_argument("--new_tokens", type=int, default=NEW_TOKENS, help="tokens each row decodes")
  ap.add_argument("--redo", action="store_true", help="recompile cells already recorded")
  ap.add_argument(
    "--tag", default="", help="record the cells under a name of their own (a rerun that keeps "
    "the earlier records): <cell>__<tag>.json"
  )  # fmt: skip
  ap.add_argument("--table", action="store_true", help="print the recorded cells and exit")
  ap.add_argument(
    "--configs", action="store_true", help="compile the shipped accelerator configs instead"
  )
  args = ap.parse_args()
  if args.tag.isdigit() or "__" in args.tag:
    ap.error(f"--tag={args.tag!r}: a name with a letter and no '__' (the cell path's separator).")
  if args.table:
    tables = [configs_table(), table(), *(table(NEW_TOKENS, tag) for tag in tags(NEW_TOKENS))]
    tables += [t for tag in ["", *tags(4096)] if (t := table(4096, tag)).count("\n") > 1]
    print("\n\n".join(tables))
    return
  if args.configs:
    (OUT / "configs").mkdir(parents=True, exist_ok=True)
    for name, variant, topology, shape in shipped():
      path = OUT / "configs" / f"{name.removesuffix('.py')}__{variant}.json"
      if path.exists() and not args.redo:
        continue
      print(f"configs/{name}:{variant} on {topology} ...", flush=True)
      r = config_cell(name, variant, topology, shape)
      path.write_text(json.dumps(r, indent=1, default=str) + "\n")
      print(f"  fits: {r['run']['fits']}; peak {_gib(r['run']['peak_bytes'])} GiB; "
            f"problems {r['problems']}; {r['compile_s']} s", flush=True)  # fmt: skip
    return
  OUT.mkdir(parents=True, exist_ok=True)
  for shape in args.shapes.split(","):
    for topology in args.topologies.split(","):
      for mode in args.modes.split(","):
        path = cell_path(shape, topology, mode, args.new_tokens, args.tag)
        if path.exists() and not args.redo:
          continue
        print(f"{shape} {topology} {mode} {args.new_tokens} ...", flush=True)
        r = cell(shape, topology, mode, args.new_tokens)
        path.write_text(json.dumps(r, indent=1, default=str) + "\n")
        fin = r["final"]["run"]
        print(
          f"  fits first: {r['first']['run']['fits']}; advice: "
          f"{(r['advice'] or {}).get('line', '-')}; final peak {_gib(fin['peak_bytes'])} GiB; "
          f"{r['compile_s']} s",
          flush=True,
        )


if __name__ == "__main__":
  main()
