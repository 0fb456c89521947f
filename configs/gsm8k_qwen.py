"""GRPO on GSM8K from a Qwen2.5 Instruct checkpoint (Hugging Face weights, chat template).

Commands (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/gsm8k_qwen.py:0.5b --workdir=/tmp/gsm8k_05b \\
      --config.hf_dir=/models/Qwen2.5-0.5B-Instruct --config.task.kwargs.manual_dir=/data/gsm8k
  grpo-jax --config=configs/gsm8k_qwen.py:1.5b --workdir=$HOME/gcs/gsm8k_15b \\
      --config.hf_dir=/models/Qwen2.5-1.5B-Instruct
  grpo-jax --config=configs/gsm8k_qwen.py:tiny --workdir=/tmp/gsm8k_tiny   # CPU, ~1 minute
$HOME/gcs is a GCS bucket mounted with gcsfuse on every host (docs/tpu.md, "TPU VM
slices"). `hf_dir` is a local directory with config.json, *.safetensors and tokenizer files
(e.g. `huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct --local-dir /models/...`).
`manual_dir` holds GSM8K's official train.jsonl and test.jsonl; without it they are
downloaded. The dataset is built once into TFDS's data_dir (array_record).
Check a checkpoint first: `grpo-jax hf-check --hf_dir=/models/Qwen2.5-0.5B-Instruct`.

Variants:
  0.5b: Qwen2.5-0.5B-Instruct on a TPU v5e-8 (or one GPU): mesh (data 1, fsdp -1,
    tensor 1), float32 params and Adam, bfloat16 compute, scanned + rematerialised
    layers (the reasons are in configs/scale.py; its 0.5b plan: peak 8.2 GiB of 14.4 per
    v5e chip). 64 prompts × G=8, 512 new tokens, lr 1e-6, KL 0.001, 200 iterations.
  1.5b: Qwen2.5-1.5B-Instruct, the same layout (scale.py plan: 12.4 GiB of 14.4).
  tiny: the committed 28K-parameter random Qwen2 fixture and four GSM8K fixture records
    (tests/fixtures/): the whole pipeline (HF import, chat template, TFDS build, math
    verifier in worker processes, export to HF) in about a minute on a 2-core CPU.

Expected results:
  0.5b / 1.5b: throughput (tokens/s per chip) and held-out greedy accuracy on GSM8K test
    after 200 iterations: NOT MEASURED YET (no accelerator has run them). Record them
    here when one has.
  tiny: runs to completion and exports workdir/hf; accuracy 0.0 (a random 28K-parameter
    model solves nothing; the variant checks plumbing, not learning).
"""

import pathlib

from grpo_jax import config

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
_MESHES = {"0.5b": (1, -1, 1), "1.5b": (1, -1, 1)}  # (data, fsdp, tensor), as scale.py.

# The TPU topology each accelerator variant is sized for (the docstring's), compiled for
# it by `python experiments/tpu_aot.py --configs` (experiments/results/tpu_aot/configs/).
TOPOLOGIES = {"0.5b": "v5e:2x4", "1.5b": "v5e:2x4"}
SHAPES = {
  "0.5b": "qwen2.5-0.5b",
  "1.5b": "qwen2.5-1.5b",
}  # The checkpoints' shapes (`models.shapes`), to plan without them.


VARIANTS = ("tiny", *_MESHES)


def get_config(arg: str = "0.5b"):
  if arg not in VARIANTS:
    raise ValueError(
      f"configs/gsm8k_qwen.py variant {arg!r}; allowed: {', '.join(map(repr, VARIANTS))}."
    )
  return config.hf_math_config(
    arg,
    task_kwargs=dict(dataset="gsm8k"),
    fixture_model=str(FIXTURES / "hf" / "qwen2"),
    fixture_data=str(FIXTURES / "data" / "gsm8k"),
    mesh=_MESHES.get(arg, (1, -1, 1)),
    max_new_tokens=512,
    max_prompt_len=256,
    eval_size=256,
  )
