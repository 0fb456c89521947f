"""GRPO on MATH (Hendrycks) from a Qwen2.5 Instruct checkpoint; held-out: MATH-500.

Commands (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/math_qwen.py:1.5b --workdir=$HOME/gcs/math_15b \\
      --config.hf_dir=/models/Qwen2.5-1.5B-Instruct --config.task.kwargs.manual_dir=/data/math
  grpo-jax --config=configs/math_qwen.py:7b --workdir=$HOME/gcs/math_7b \\
      --config.hf_dir=/models/Qwen2.5-7B-Instruct
  grpo-jax --config=configs/math_qwen.py:tiny --workdir=/tmp/math_tiny     # CPU, ~1 minute
$HOME/gcs is a GCS bucket mounted with gcsfuse on every host (docs/tpu.md, "TPU VM
slices"). `manual_dir` holds the official files: MATH/{train,test}/<subject>/*.json (or MATH.tar)
and PRM800K's math_splits/test.jsonl (MATH-500); without them they are downloaded.
Answers are verified by `grpo_jax.verifiers.math_verify` (\\boxed{...} extraction, LaTeX
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

from grpo_jax import config

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
_MESHES = {"1.5b": (1, -1, 1), "7b": (1, -1, 4)}  # (data, fsdp, tensor), as scale.py.

# The TPU topology each accelerator variant is sized for (the docstring's), compiled for
# it by `python experiments/tpu_aot.py --configs` (experiments/results/tpu_aot/configs/).
TOPOLOGIES = {"1.5b": "v5e:2x4", "7b": "v5e:4x4"}
SHAPES = {
  "1.5b": "qwen2.5-1.5b",
  "7b": "qwen2.5-7b",
}  # The checkpoints' shapes (`models.shapes`), to plan without them.


VARIANTS = ("tiny", *_MESHES)


def get_config(arg: str = "1.5b"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/math_qwen.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  return config.hf_math_config(
    arg,
    task_kwargs=dict(dataset="math", test_split="math500"),
    fixture_model=str(FIXTURES / "hf" / "qwen3"),
    fixture_data=str(FIXTURES / "data" / "math"),
    mesh=_MESHES.get(arg, (1, -1, 1)),
    max_new_tokens=1024,
    max_prompt_len=512,
    eval_size=500,
    micro_batches=32 if arg == "7b" else 4,
  )
