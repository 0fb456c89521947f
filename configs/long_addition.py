"""GRPO on long addition written out column by column (multi-step, fixed template).

  prompt "Q:478+356\n" -> completion "8+6+0=14;7+5+1=13;4+3+1=8;A:834."

Every step must be right for reward 1 (grpo_jax/tasks/long_addition.py); digits are
reasoning tokens and "+=;A:." template tokens, by construction. This is the task of the
seed reproductions (experiments/reproduce.py): its completions have a template that every
rollout shares and several reasoning steps where a wrong one makes the answer wrong.

Command (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/long_addition.py:tiny --workdir=/tmp/long_addition
  grpo-jax --config=configs/long_addition.py:long --workdir=/tmp/long_addition_long
Rerunning a command with the same --workdir resumes from its latest checkpoint.

Variants:
  tiny (default): a ~0.3M-parameter Qwen3-shaped model, 2-3 digit operands (completions
    up to 34 tokens: 3 steps and the answer), 150 supervised warm-start steps, then 60 GRPO
    iterations of 16 prompts x G=8.
  full: a ~40M-parameter model, 3-5 digit operands, 64 prompts x G=8.
  quick: tiny on a 1-layer, d_model 32 model (`config.QUICK_MODEL`), for tests and smoke
    runs.
  long: tiny on 24-digit operands: completions of 244 tokens (24 steps and the answer),
    1,000 warm-start steps, then 10 GRPO iterations of 16 prompts x G=8 (the long-completion
    learning test, tests/learning/test_long_learning.py, runs a smaller twin).

Expected result (long, measured 2026-12-04 on the same CPU, a compile job sharing it): the
warm start learns the 24-column addressing abruptly (per-token loss 0.63 at step 368, 0.30
at 416, 0.01 by 576; about 21 minutes at 1.3 s a step); greedy accuracy 94.5% after it,
98.4% at iteration 5, 96.9% at 10; sampled training accuracy at temperature 1 goes from
68.0% (iteration 1) to 93.8% (10), about 5 s an iteration.

Expected result (tiny, measured on a 2-core AMD EPYC CPU while another job shared it):
greedy accuracy on 128 held-out problems (every step right) goes from 43.0% after the warm
start to 77.3% after 60 GRPO iterations (70.3% at iteration 20, 78.1% at 40), in 109 s
wall. Sampled training accuracy at temperature 1 is lower (30-50%): the warm-started
policy is still spread over wrong carries.
"""

from grpo_jax import config
from grpo_jax.rl import presets

VARIANTS = ("tiny", "full", "quick", "long")


def get_config(arg: str = "tiny"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/long_addition.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  c = config.default_config()
  c.task.name = "long_addition"
  c.task.kwargs = dict(min_digits=2, max_digits=3)
  c.model.update(d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=24, mlp_dim=288)
  c.model.qk_norm = True
  c.sampler.update(max_new_tokens=36, group_size=8, max_prompt_len=12, prompt_buckets=(12,))
  c.rl.update(presets.get("grpo"))
  c.rl.kl_coef = 0.0
  c.rl.aggregation = "token_mean"
  c.update(prompts_per_step=16, iterations=60, learning_rate=1e-4, grad_clip=1.0)
  c.update(warmstart_steps=150, warmstart_batch=64, warmstart_lr=3e-3)
  c.update(eval_every=20, eval_size=128, eval_samples=0, checkpoint_every=20)
  if arg == "quick":
    c.model.update(config.QUICK_MODEL)
  if arg == "long":
    c.task.kwargs.update(min_digits=24, max_digits=24)
    c.sampler.update(max_new_tokens=256, max_prompt_len=56, prompt_buckets=(56,))
    c.update(iterations=10, warmstart_steps=1000, eval_every=5, checkpoint_every=5)
  if arg == "full":
    c.task.kwargs.update(min_digits=3, max_digits=5)
    c.model.update(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64, mlp_dim=1536)
    c.sampler.update(max_new_tokens=56, max_prompt_len=16, prompt_buckets=(16,))
    c.update(prompts_per_step=64, learning_rate=1e-5, warmstart_steps=1500, warmstart_lr=3e-4)
  return c
