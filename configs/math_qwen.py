"""GRPO on MATH (Hendrycks) from a Qwen2.5 Instruct checkpoint; held-out: MATH-500.

Commands (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/math_qwen.py:1.5b --workdir=$HOME/gcs/math_15b \\
      --config.hf_dir=/models/Qwen2.5-1.5B-Instruct --config.task.kwargs.manual_dir=/data/math
  grpo-jax --config=configs/math_qwen.py:7b --workdir=$HOME/gcs/math_7b \\
      --config.hf_dir=/models/Qwen2.5-7B-Instruct
  grpo-jax --config=configs/math_qwen.py:tiny --workdir=/tmp/math_tiny     # CPU, ~1 minute
$HOME/gcs is a GCS bucket mounted with gcsfuse on every host (README, "TPU VM
slices"). `manual_dir` holds the official files: MATH/{train,test}/<subject>/*.json (or MATH.tar)
and PRM800K's math_splits/test.jsonl (MATH-500); without them they are downloaded.
Answers are verified by `grpo_jax.math_verify` (\\boxed{...} extraction, LaTeX
normalisation, numeric then sympy equivalence) in worker processes with a hard
timeout: a pathological answer is killed and counted in `reward_timeouts`.

Variants:
  1.5b: Qwen2.5-1.5B-Instruct on a TPU v5e-8: mesh (1, -1, 1), float32 params and Adam,
    bfloat16 compute, scanned + rematerialised layers (configs/scale.py: 12.4 GiB of
    14.4 per chip at 1024 new tokens). 64 prompts × G=8, 1024 new tokens, lr 1e-6.
  7b: Qwen2.5-7B-Instruct on a v5e-16 (two hosts): mesh (1, -1, 4), 32 micro-batches
    (scale.py: 13.8 GiB of 14.4 per chip); 8 × H100 also fits (27.0 of 72 GiB).
  tiny: the committed random Qwen3 fixture and the MATH / MATH-500 fixture records: the
    whole pipeline in about a minute on a 2-core CPU.

Expected results:
  1.5b / 7b: throughput and MATH-500 greedy accuracy after 200 iterations: NOT MEASURED
    YET (no accelerator has run them). Record them here when one has.
  tiny: runs to completion and exports workdir/hf; accuracy 0.0 (plumbing, not learning).
"""

import pathlib
import tempfile

from grpo_jax import presets, train

ROOT = pathlib.Path(__file__).resolve().parent.parent
_MESHES = {"1.5b": (1, -1, 1), "7b": (1, -1, 4)}  # (data, fsdp, tensor), as scale.py.


def get_config(arg: str = "1.5b"):
  if arg not in (*_MESHES, "tiny"):
    raise ValueError(f"configs/math_qwen.py variant {arg!r}; allowed: {[*_MESHES, 'tiny']}.")
  c = train.default_config()
  c.task.name = "math"
  c.task.kwargs = dict(dataset="math", test_split="math500", manual_dir="", data_dir="")
  c.rl.update(presets.get("grpo"))
  c.rl.update(kl_coef=0.001, aggregation="token_mean")
  c.update(warmstart_steps=0, export_hf=True)
  if arg == "tiny":
    fixtures = ROOT / "tests" / "fixtures"
    c.hf_dir = str(fixtures / "hf" / "qwen3")
    # Its own TFDS data_dir: the fixture records must never stand in for real MATH.
    c.task.kwargs.update(
      manual_dir=str(fixtures / "data" / "math"),
      data_dir=str(pathlib.Path(tempfile.gettempdir()) / "grpo_jax_fixture_tfds"),
    )
    c.sampler.update(max_new_tokens=16, group_size=4, max_prompt_len=384)
    c.sampler.prompt_buckets = (192, 384)
    c.update(prompts_per_step=4, iterations=4, eval_every=2, eval_size=4, eval_samples=0)
    c.update(learning_rate=1e-3, checkpoint_every=2, reward_workers=1, reward_timeout_s=30.0)
    return c
  c.hf_dir = f"~/models/Qwen2.5-{arg.upper()}-Instruct"
  c.model.update(dtype="bfloat16", param_dtype="float32", scan_layers=True, remat="full")
  c.sampler.update(max_new_tokens=1024, max_prompt_len=512, group_size=8)
  c.sampler.prompt_buckets = (256, 512)
  c.update(prompts_per_step=64, iterations=200, learning_rate=1e-6, warmup_steps=10)
  c.update(eval_every=20, eval_size=500, eval_samples=0, checkpoint_every=20)
  c.update(reward_workers=8, reward_timeout_s=10.0)
  c.rl.update(num_minibatches=4, micro_batches=32 if arg == "7b" else 4)
  c.mesh.update(dict(zip(("data", "fsdp", "tensor"), _MESHES[arg], strict=True)))
  return c
