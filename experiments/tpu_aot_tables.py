"""The committed records of `experiments/tpu_aot.py` as Markdown tables: the shipped
configs, and the sweep's cells of one completion budget. Apart from the compiling script,
so that the documentation site (docs/hooks.py) renders its measurement pages from the
records at each build with nothing but the standard library (no JAX, no libtpu)."""

from __future__ import annotations

import itertools
import json
import pathlib

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


def gib(n) -> str:
  return "-" if n is None else f"{n / 2**30:.1f}"


def peak(row: dict) -> str:
  """A function's peak GiB a chip, or "refused" where the compiler refused it with no
  figure (`infra.tpu.refused`'s "need_unknown")."""
  return "refused" if row.get("need_unknown") else gib(row["peak_bytes"])


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
      f"{', '.join(peak(x) for x in r['rows'])} | {gib(run['plan_peak_bytes'])} "
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


def setting(record: dict) -> str:
  """A compiled cell's setting that fits: "as first tried", the advice's overrides as
  key=value, or "none fits"."""
  tip = record["advice"]
  if tip is None:
    return "as first tried"
  return _flags(tip["overrides"]) if tip["overrides"] else "none fits"


def _flags(overrides: dict) -> str:
  return " ".join(f"{k}={v}" for k, v in overrides.items())


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
    fin = r["final"]
    peaks = ", ".join(peak(x) for x in fin["rows"])
    roof = fin["run"]["roofline_s"]
    lines.append(
      f"| {r['shape']} | {r['topology']} | {r['mode']} | {'yes' if r['first']['run']['fits'] else 'no'} "
      f"| {setting(r)} | {peaks} | {gib(fin['run']['plan_peak_bytes'])} | "
      f"{sum(roof.values()):.2f} ({', '.join(f'{v:.2f}' for v in roof.values())}) |"
    )
  return "\n".join(lines)


def screen_table(new_tokens: int) -> str:
  """The memory-plan screen of one completion budget (`tpu_aot.screen`,
  screen__<new tokens>.json) as a Markdown table, with the setting that fit each cell
  compiled at that budget (its untagged record's `setting`; "-" where none is)."""
  r = json.loads((OUT / f"screen__{new_tokens}.json").read_text())
  lines = [
    "| shape | topology | mode | plan GiB/chip as first tried | HBM GiB | first rung the plan "
    "fits | its plan GiB | compiled: the setting that fits |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for x in r["rows"]:
    rung = x["rung"]
    fit = "as first tried" if x["first_plan_bytes"] <= x["limit_bytes"] else (
      _flags(rung) if rung else "no rung"
    )  # fmt: skip
    path = cell_path(x["shape"], x["topology"], x["mode"], new_tokens)
    got = setting(json.loads(path.read_text())) if path.exists() else "-"
    lines.append(
      f"| {x['shape']} | {x['topology']} | {x['mode']} | {gib(x['first_plan_bytes'])} | "
      f"{gib(x['limit_bytes'])} | {fit} | {gib(x['rung_plan_bytes'])} | {got} |"
    )
  return "\n".join(lines)


def every_table() -> str:
  """`python experiments/tpu_aot.py --table`: the shipped configs, then the sweep at
  NEW_TOKENS, each of its --tag reruns, the 4,096-token cells and their memory-plan screen
  (`screen_table`), as Markdown tables."""
  out = [configs_table(), table(), *(table(NEW_TOKENS, tag) for tag in tags(NEW_TOKENS))]
  out += [t for tag in ["", *tags(4096)] if (t := table(4096, tag)).count("\n") > 1]
  out += [screen_table(4096)] if (OUT / "screen__4096.json").exists() else []
  return "\n\n".join(out)
