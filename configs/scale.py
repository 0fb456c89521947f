"""Mesh, rules and memory presets for 0.5B, 1.5B and 7B policies (Qwen2.5 shapes).

Commands (the plan runs on any machine; nothing is allocated):
  grpo-jax plan --config=configs/scale.py:0.5b --devices=8 --device=tpu-v5e
  grpo-jax plan --config=configs/scale.py:1.5b --devices=8 --device=tpu-v5e
  grpo-jax plan --config=configs/scale.py:7b --devices=16 --device=tpu-v5e
  grpo-jax plan --config=configs/scale.py:7b --devices=8 --device=h100
  grpo-jax plan --config=configs/scale.py:tiny --compile     # CPU: plan vs XLA's figures
Training on a TPU VM slice (docs/tpu.md, "TPU VM slices"):
  grpo-jax --config=configs/scale.py:1.5b --workdir=$HOME/gcs/runs/qwen1.5b   # a gcsfuse-mounted bucket

The models are the Qwen2.5 architectures (hidden size, layers, heads, KV heads, MLP width,
vocabulary, tied embeddings, attention biases, rope theta 1e6) with random weights until
the Hugging Face import (real-models issue) loads a checkpoint; the task here is the toy
arithmetic task, so these configs are for planning, sharding and throughput, not for
accuracy. Expected result: the plans below (measured with this file, GiB per device);
training accuracy is not measured.

Choices, and why:
- Every size: float32 params and Adam state (bf16 params lose updates smaller than
  2^-8 of a weight; RL updates at lr 1e-6 are), bfloat16 compute, `scan_layers` +
  `remat="full"` (the plan's activations drop 10-30x; compile time stays flat in depth),
  and the batch split over data × fsdp.
- 0.5B (896 wide, 24 layers, 14 heads, 2 KV heads, vocab 151936), v5e-8 or one GPU:
  FSDP over all devices (fsdp=-1), no tensor parallelism. Resident state (params, the
  reference copy, Adam) is 7.4 GiB in all, 0.92 GiB a chip over 8: sharding it costs one
  all-gather per layer. Tensor
  parallelism would split matmuls only 896 wide (the all-reduces after every o and down
  projection would cost more than they save) and 2 KV heads allow at most tensor=2.
  The vocabulary is the memory: a float32 [rows, T, 151936] logits block is 0.6 MB a
  token, so micro_batches=4 keeps it at 4 rows a device.
  Plan, 8 × v5e: peak 8.2 GiB (of 14.4 usable); activations 2.8 GiB with remat, 28.9
  without.
- 1.5B (1536 wide, 28 layers, 12 heads, 2 KV heads), v5e-8: the same layout. Resident
  state 23 GiB in all, 2.9 GiB a chip over 8.
  Plan, 8 × v5e: peak 12.4 GiB; activations 3.2 GiB with remat, 41.2 without.
- 7B (3584 wide, 28 layers, 28 heads, 4 KV heads, vocab 152064, untied): resident state
  (f32 params + Adam, and a reference copy for the KL) 113 GiB, 14.2 GiB a chip on one
  v5e host (8 × 16 GiB, 14.4 usable each): no room left for gradients or activations. tensor=4 inside a host (4 KV heads, 28 heads: 7 a device; the
  vocabulary, and so the logits, split 4 ways), fsdp over the rest (-1), so the
  all-reduces of tensor parallelism stay on the fast intra-host links and FSDP's
  gathers cross hosts once per layer.
  32 micro-batches: 1 row a device per micro-batch.
  Plan, 16 × v5e (v5e-16): peak 13.8 GiB of 14.4 usable; 8 × v5e: does not fit (27.0);
  8 × H100: peak 27.0 GiB of 72 usable.
"""

from grpo_jax import config
from grpo_jax.rl import presets

# Qwen2.5 architectures (the published config.json of each model).
_QWEN25 = {
  "0.5b": dict(d_model=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64, mlp_dim=4864,
               vocab_size=151936, tie_embeddings=True),
  "1.5b": dict(d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128, mlp_dim=8960,
               vocab_size=151936, tie_embeddings=True),
  "7b": dict(d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128, mlp_dim=18944,
             vocab_size=152064, tie_embeddings=False),
}  # fmt: skip

# (data, fsdp, tensor): see the module docstring for each choice.
MESHES = {"0.5b": (1, -1, 1), "1.5b": (1, -1, 1), "7b": (1, -1, 4)}

# The TPU topology each accelerator variant is sized for (the docstring's), compiled for
# it by `python experiments/tpu_aot.py --configs` (experiments/results/tpu_aot/configs/).
TOPOLOGIES = {"0.5b": "v5e:2x4", "1.5b": "v5e:2x4", "7b": "v5e:4x4"}


VARIANTS = ("tiny", *_QWEN25)


def get_config(arg: str = "0.5b"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/scale.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  c = config.default_config()
  c.task.name = "arithmetic"
  c.rl.update(presets.get("grpo"))
  if arg == "tiny":  # The same layout at CPU scale: plan vs XLA in seconds.
    c.model.update(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, mlp_dim=384)
    c.model.update(scan_layers=True, remat="full")
    c.sampler.update(max_new_tokens=64, max_prompt_len=64, prompt_buckets=(64,), group_size=4)
    c.update(prompts_per_step=8, iterations=2, warmstart_steps=0, eval_size=8)
    c.rl.update(num_minibatches=2, micro_batches=2)
    return c
  c.model.update(_QWEN25[arg], attn_bias=True, rope_theta=1e6, qk_norm=False)
  c.model.update(dtype="bfloat16", param_dtype="float32", scan_layers=True, remat="full")
  c.sampler.update(max_new_tokens=1024, max_prompt_len=256, prompt_buckets=(256,))
  c.sampler.group_size = 8
  c.update(prompts_per_step=64, learning_rate=1e-6, warmstart_steps=0, eval_size=128)
  c.rl.update(num_minibatches=4, micro_batches=4, kl_coef=0.001)
  if arg == "7b":  # 1 row a device per micro-batch: fits 16 GiB chips.
    c.rl.micro_batches = 32
  # π_old's and the reference's forwards at the update's micro-batch rows (`aot` found it:
  # all 64 rows a device at once need a 39.8 GB float32 logits buffer on a v5e).
  c.rl.logprob_batches = c.rl.num_minibatches * c.rl.micro_batches
  c.mesh.update(dict(zip(("data", "fsdp", "tensor"), MESHES[arg], strict=True)))
  return c
