"""An episode's observation appended to a paged KV cache: one call for the block
(`paged.append_block`) against a decode call a token (`paged.take` + `paged.forward` per
column, what episodes on pages did before), on the same pages and tokens.

  python experiments/bench_paged_append.py          # the benchmark, one JSON line last
  python experiments/bench_paged_append.py --quick  # a small smoke run (the tests)
  python experiments/bench_paged_append.py --out experiments/results/cpu/DATE_MACHINE_paged_append

Workload: bench_sampler.py's ~40M-parameter Qwen3-shaped model (random weights, float32),
N = 64 rows of 2 prompts × G = 32 whose 128-token prompts share their pages, pages of 64
slots; each row has written `--context` completion tokens already, then appends an
observation of O tokens (every row its full O; O in `--widths`). Both paths run jitted
from the same pages; a figure is the median wall time of `--repeats` calls after one that
compiles. The block's columns are checked equal to the token-by-token logits first.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import pathlib
import platform
import statistics

import bench_sampler
import demo_seeds
import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.models import kv_cache, model, paged, sampling

PROMPTS, GROUP, PROMPT_TOKENS, PAGE = 2, 32, 128, 64


def _pages(cfg, params, *, context: int, width: int, page: int, group: int):
  """Pages of PROMPTS prompts × `group` rows, each row with `context` completion slots
  already taken (their keys left as zeros at position -1: what is read is timed, not
  what it holds) and room for `width` more."""
  scfg = sampling.SamplerConfig(
    max_new_tokens=context + width, eos_ids=(1,), pad_id=0, group_size=group,
    prompt_buckets=(PROMPT_TOKENS,), kv_layout="paged", page_size=page,
  )  # fmt: skip
  tokens = np.random.RandomState(0).randint(3, cfg.vocab_size, (PROMPTS, PROMPT_TOKENS))
  positions = jnp.broadcast_to(jnp.arange(PROMPT_TOKENS), (PROMPTS, PROMPT_TOKENS))
  dense, _ = paged.prefill_prompts(
    params, jnp.asarray(tokens), positions, init_cache=functools.partial(kv_cache.init_cache, cfg),
    model_fn=model.make_model_fn(cfg), cfg=scfg,
  )  # fmt: skip
  pages = paged.group_pool(dense, cfg=scfg)
  rows = PROMPTS * group
  for t in range(0, context, page):
    pages, _ = paged.take(pages, jnp.ones((rows,), bool), jnp.full((rows,), t))
  return pages


def _one_by_one(params, pages, tok_NO, pos_NO, t_N, *, model_fn, page: int):
  """The block a decode call a token: `take` where a column starts a page, then `forward`."""

  def column(j, carry):
    pages, out_NOV = carry
    t = t_N + j
    pages, _ = paged.take(pages, t % page == 0, t)
    tok, pos = tok_NO[:, j], pos_NO[:, j]
    logits_N1V, pages = paged.forward(
      params, pages, tok, pos, t, jnp.ones_like(t, bool), model_fn=model_fn
    )
    return pages, out_NOV.at[:, j].set(logits_N1V[:, 0])

  rows, width = tok_NO.shape
  out = jnp.zeros((rows, width, params["embed"]["embedding"].shape[0]), jnp.float32)
  return jax.lax.fori_loop(0, width, column, (pages, out))[::-1]


def _median_s(fn, repeats: int) -> float:
  """Median wall seconds of `repeats` calls of fn (blocked on), after one that compiles."""
  run = lambda: jax.block_until_ready(fn())  # noqa: E731
  run()
  return statistics.median(bench_sampler.time_calls(run, repeats))


def run(*, quick: bool, widths, context: int, repeats: int) -> dict:
  shape = bench_sampler.QUICK_MODEL if quick else bench_sampler.BENCH_MODEL
  cfg = model.tiny_config(**shape)
  params = model.init(cfg, jax.random.key(0))
  model_fn = model.make_model_fn(cfg)
  page, group = (8, 4) if quick else (PAGE, GROUP)
  rows = PROMPTS * group
  block = jax.jit(functools.partial(paged.append_block, model_fn=model_fn))
  tokens = jax.jit(functools.partial(_one_by_one, model_fn=model_fn, page=page))
  out = []
  for width in widths:
    pages = _pages(cfg, params, context=context, width=width, page=page, group=group)
    t_N = jnp.full((rows,), context, jnp.int32)
    tok_NO = jnp.asarray(np.random.RandomState(1).randint(3, cfg.vocab_size, (rows, width)))
    pos_NO = PROMPT_TOKENS + context + jnp.broadcast_to(jnp.arange(width), (rows, width))
    n_N = jnp.full((rows,), width, jnp.int32)
    got, _ = block(params, pages, tok_NO, pos_NO, t_N, n_N)
    want, _ = tokens(params, pages, tok_NO, pos_NO, t_N)
    err = float(jnp.max(jnp.abs(got - want)))
    assert err < 1e-3, f"O = {width}: the block's logits differ from the token calls' by {err}"
    one = _median_s(lambda: block(params, pages, tok_NO, pos_NO, t_N, n_N)[0], repeats)  # noqa: B023
    each = _median_s(lambda: tokens(params, pages, tok_NO, pos_NO, t_N)[0], repeats)  # noqa: B023
    out.append(
      {
        "observation_tokens": width,
        "block_call_s": round(one, 5),
        "token_calls_s": round(each, 5),
        "speedup": round(each / one, 2),
        "max_abs_logit_diff": err,
      }
    )
    print(json.dumps(out[-1]), flush=True)
  return {
    "claim": None,
    "verdict": "not judged",
    "what": "one observation append on pages: one call for the block vs a decode call a token",
    "date": datetime.date.today().isoformat(),
    "seeds": [0],  # The random weights' key (and the tokens' RandomState 1).
    "machine": f"{os.cpu_count()}-core {demo_seeds.cpu_model()}, {platform.machine()}",
    "dtype": "float32",
    "model": "quick" if quick else "bench_sampler.BENCH_MODEL (~40M parameters)",
    "rows": rows,
    "prompt_tokens": PROMPT_TOKENS,
    "context_tokens": context,
    "page_size": page,
    "repeats": repeats,
    "widths": out,
  }


def markdown(r: dict) -> str:
  lines = [
    "# An observation appended to a paged KV cache: one call against a call a token",
    "",
    f"{r['date']}, {r['machine']}, {r['dtype']}, {r['model']}: {r['rows']} rows, "
    f"{r['prompt_tokens']}-token shared prompts, {r['context_tokens']} completion tokens "
    f"already written, pages of {r['page_size']} slots; median of {r['repeats']} calls "
    "after one that compiles (`python experiments/bench_paged_append.py`).",
    "",
    "| observation tokens O | one call (`paged.append_block`) | O decode calls | speedup |",
    "|---|---|---|---|",
  ]
  for w in r["widths"]:
    lines.append(
      f"| {w['observation_tokens']} | {w['block_call_s'] * 1e3:.1f} ms | "
      f"{w['token_calls_s'] * 1e3:.1f} ms | {w['speedup']:.2f}× |"
    )
  return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--quick", action="store_true", help="a small model, one width: a smoke run")
  p.add_argument("--widths", default="16,64,256", help="observation tokens O, comma-separated")
  p.add_argument("--context", type=int, default=512, help="completion tokens already written")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--out", default="", help="write OUT.json and OUT.md")
  a = p.parse_args(argv)
  widths = (9,) if a.quick else tuple(int(w) for w in a.widths.split(","))  # Quick: past a page.
  context = 16 if a.quick else a.context
  r = run(quick=a.quick, widths=widths, context=context, repeats=2 if a.quick else a.repeats)
  if a.out:
    demo_seeds.write_record(pathlib.Path(a.out), r, markdown)
  print(json.dumps(r))
  return r


if __name__ == "__main__":
  main()
