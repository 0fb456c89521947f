"""GRPO on toy arithmetic (`Q:47+85\n` -> `A:132.`), from a supervised warm start.

Command (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/arithmetic.py:tiny --workdir=/tmp/grpo_demo
  grpo-jax --config=configs/arithmetic.py:tiny --workdir=/tmp/rloo --config.rl.advantage=rloo

Variants:
  tiny (default): a ~0.3M-parameter Qwen3-shaped model, 1-2 digit addition/subtraction,
    400 supervised warm-start steps, then 300 GRPO iterations of 32 prompts x G=8.
    About 2.5 minutes on a 2-core CPU.
  full: a ~40M-parameter model, up to 3-digit operands, 64 prompts x G=8.

Expected result (tiny, measured on a 2-core CPU): greedy accuracy on 128 held-out problems
goes from 18.8% after the warm start to 50.0% after GRPO (35.2% at iteration 50, 43.8% at
150), in 146 s wall. summary.json holds warmstart_accuracy, final_accuracy, wall_seconds.
"""

import ml_collections

from grpo_jax import presets


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  if arg not in ("tiny", "full"):
    raise ValueError(f"configs/arithmetic.py variant {arg!r}; allowed: 'tiny', 'full'.")
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = ml_collections.ConfigDict(dict(name="arithmetic", kwargs=dict(max_digits=2, ops="+-")))
  c.model = ml_collections.ConfigDict(
    dict(d_model=96, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=24, mlp_dim=288, qk_norm=True)
  )
  c.sampler = ml_collections.ConfigDict(
    dict(max_new_tokens=8, group_size=8, max_prompt_len=16, prompt_buckets=(16,))
  )
  c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, greedy=False))
  c.rl = presets.get("grpo")
  c.rl.kl_coef = 0.0
  c.rl.aggregation = "token_mean"
  c.prompts_per_step = 32
  c.iterations = 300
  c.learning_rate = 1e-4
  c.warmup_steps = 0
  c.weight_decay = 0.0
  c.grad_clip = 1.0
  c.warmstart_steps = 400
  c.warmstart_batch = 64
  c.warmstart_lr = 3e-3
  c.eval_every = 50
  c.eval_size = 128
  if arg == "full":
    c.task.kwargs.max_digits = 3
    c.model.update(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64, mlp_dim=1536)
    c.sampler.update(max_new_tokens=10)
    c.prompts_per_step = 64
    c.iterations = 300
    c.learning_rate = 1e-5
    c.warmstart_steps = 1000
    c.warmstart_lr = 3e-4
  return c
