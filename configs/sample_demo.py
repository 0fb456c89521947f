"""Sampler demo: a random-init policy samples G completions per toy-task prompt, scored on the host.

Command (from the repo root):
  python -m grpo_jax.demo --config=configs/sample_demo.py:tiny
  python -m grpo_jax.demo --config=configs/sample_demo.py:tiny --config.task.name=countdown

Variants:
  tiny (default): ~100K-parameter Qwen3-shaped model, 8 prompts x G=4, 16 new tokens.
    Runtime: ~10 s on a 2-core CPU, most of it compilation.
  full: the ~40M-parameter benchmark model, 32 prompts x G=8, 128 new tokens. ~1 min on CPU.

Expected result: the untrained policy emits random characters, so the mean reward and
format reward are 0.0, while every reference solution scores 1.0 (the verifier is
right); every row of a group differs (distinct randomness); prefill runs once per prompt.
Training comes with the trainer (configs for `grpo-jax`).
"""

import ml_collections

VARIANTS = ("tiny", "full")


def get_config(arg: str = "tiny") -> ml_collections.ConfigDict:
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/sample_demo.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.task = ml_collections.ConfigDict(dict(name="arithmetic", kwargs={}))
  c.num_prompts = 8
  c.model = ml_collections.ConfigDict(
    dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, mlp_dim=192, qk_norm=True)
  )
  c.sampler = ml_collections.ConfigDict(dict(max_new_tokens=16, group_size=4, max_prompt_len=64))
  c.sampling = ml_collections.ConfigDict(dict(temperature=1.0, top_k=0, top_p=1.0, greedy=False))
  if arg == "full":
    c.num_prompts = 32
    c.model.update(d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, head_dim=64, mlp_dim=1536)
    c.sampler.update(max_new_tokens=128, group_size=8)
  return c
