"""GRPO on multi-turn code episodes: the model may run its code on the visible tests, read
the result and revise, before its final answer is judged on the hidden tests too.

  prompt  "Return the sum of two integers a and b. ... assert add(2, 3) == 5 ..."
  episode "```python\\ndef add(a, b):\\n  return a - b\\n```\\n$"
          ["\\nvisible tests: 0/1 passed; assert add(2, 3) == 5: got -1\\n"]
          "```python\\ndef add(a, b):\\n  return a + b\\n```" EOS   -> reward 1

Bracketed text is the code environment's observation (grpo_jax/envs/code.py): in the
context, never trained. "$" ends a run turn; EOS ends the final answer. The problems and
the sandbox are the "code" task's (grpo_jax/tasks/code.py, grpo_jax/verifiers/sandbox.py).

Command (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/code_env.py:tiny --workdir=/tmp/code_env

Variants:
  tiny (default): the shipped problems (41 train, 12 test) with the character tokenizer, a
    ~0.35M-parameter random model, 100 supervised warm-start steps on the reference
    solutions (single-turn answers: it never sees a run turn), then 20 GRPO iterations of
    8 prompts x G=4 episodes (at most 3 actions of at most 128 tokens, 2 runs,
    observations of at most 96 characters, 256 tokens per episode in all).
  qwen: Qwen2.5-0.5B-Instruct from ~/models (config.hf_dir), its chat template with a
    system prompt that explains "$" (`SYSTEM_PROMPT`), bfloat16 compute. Not run here.

Expected result: tiny demonstrates the pipeline (episodes with run turns, sandboxed
observations, rewards, GRPO updates) and nothing more: a model this size trained for
minutes writes no working code. Measured (2-core CPU shared with other jobs, load average
about 4): the warm start reaches loss 0.62 and 0.0% greedy accuracy on the 12 held-out
problems; every GRPO iteration has reward 0 (so zero advantages: nothing to learn from),
episodes take 1.02 actions on average (about 2% make a run turn), about 4 s per iteration
after the first (19 s, compiling), 237 s wall in all; final accuracy 0.0%. Learning to
use the runs needs a pretrained code model: the qwen variant (another checkpoint:
--config.hf_dir=...; the architecture comes from its config.json). No learning result is
claimed for either variant.
"""

from grpo_jax import config
from grpo_jax.rl import presets

SYSTEM_PROMPT = (
  "Answer with the Python function in a ```python code block. Before your final answer "
  "you may test a draft: write the code block, then a line with just $ and stop; you will "
  "see which of the example tests pass. Your final answer is a message without $."
)


VARIANTS = ("tiny", "qwen")


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/code_env.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  c = config.default_config()
  c.task.name = "code"
  c.task.kwargs = dict(visible_tests=1)
  run = dict(max_runs=2, max_chars=96, run_timeout_s=2.0, timeout_s=5.0)
  c.env.update(name="code", kwargs=run, max_turns=3, turn_tokens=128, observation_tokens=96)
  c.rl.update(presets.get("grpo"))
  c.rl.kl_coef = 0.0
  c.rl.aggregation = "token_mean"
  if arg == "tiny":
    c.model.update(d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=24, mlp_dim=288)
    c.sampler.update(max_new_tokens=256, group_size=4, max_prompt_len=320)
    c.sampler.prompt_buckets = (320,)
    c.update(prompts_per_step=8, iterations=20, learning_rate=3e-4, grad_clip=1.0)
    c.update(warmstart_steps=100, warmstart_batch=16, warmstart_lr=3e-3)
    c.update(eval_every=10, eval_size=12, eval_samples=0, checkpoint_every=10)
    return c
  c.hf_dir = "~/models/Qwen2.5-0.5B-Instruct"
  c.task.kwargs.update(system_prompt=SYSTEM_PROMPT)
  c.env.update(turn_tokens=384, observation_tokens=160)
  c.env.kwargs.update(max_chars=160)
  c.model.update(dtype="bfloat16", param_dtype="float32", scan_layers=True, remat="full")
  c.sampler.update(max_new_tokens=1024, group_size=8, max_prompt_len=512)
  c.sampler.prompt_buckets = (256, 512)
  c.update(prompts_per_step=16, iterations=100, learning_rate=1e-6, warmup_steps=10)
  c.update(warmstart_steps=0, eval_every=20, eval_size=12, eval_samples=0, checkpoint_every=20)
  c.rl.kl_coef = 0.001
  return c
