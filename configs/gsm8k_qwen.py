"""GRPO on GSM8K from a Qwen2.5 Instruct checkpoint (Hugging Face weights, chat template).

Commands (from the repo root, after `pip install -e .`):
  grpo-jax --config=configs/gsm8k_qwen.py:0.5b --workdir=/tmp/gsm8k_05b \\
      --config.hf_dir=/models/Qwen2.5-0.5B-Instruct --config.task.kwargs.manual_dir=/data/gsm8k
  grpo-jax --config=configs/gsm8k_qwen.py:1.5b --workdir=$HOME/gcs/gsm8k_15b \\
      --config.hf_dir=/models/Qwen2.5-1.5B-Instruct
  grpo-jax --config=configs/gsm8k_qwen.py:tiny --workdir=/tmp/gsm8k_tiny   # CPU, ~1 minute
$HOME/gcs is a GCS bucket mounted with gcsfuse on every host (README, "TPU VM
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
import tempfile

from grpo_jax import presets, train

ROOT = pathlib.Path(__file__).resolve().parent.parent
_MESHES = {"0.5b": (1, -1, 1), "1.5b": (1, -1, 1)}  # (data, fsdp, tensor), as scale.py.


def get_config(arg: str = "0.5b"):
  if arg not in (*_MESHES, "tiny"):
    raise ValueError(f"configs/gsm8k_qwen.py variant {arg!r}; allowed: {[*_MESHES, 'tiny']}.")
  c = train.default_config()
  c.task.name = "math"
  c.task.kwargs = dict(dataset="gsm8k", manual_dir="", data_dir="")
  c.rl.update(presets.get("grpo"))
  c.rl.update(kl_coef=0.001, aggregation="token_mean")
  c.update(warmstart_steps=0, export_hf=True)
  if arg == "tiny":
    fixtures = ROOT / "tests" / "fixtures"
    c.hf_dir = str(fixtures / "hf" / "qwen2")
    # Its own TFDS data_dir: the fixture records must never stand in for real GSM8K.
    c.task.kwargs.update(
      manual_dir=str(fixtures / "data" / "gsm8k"),
      data_dir=str(pathlib.Path(tempfile.gettempdir()) / "grpo_jax_fixture_tfds"),
    )
    c.sampler.update(max_new_tokens=16, group_size=4, max_prompt_len=384)
    c.sampler.prompt_buckets = (192, 384)
    c.update(prompts_per_step=4, iterations=4, eval_every=2, eval_size=4, eval_samples=0)
    c.update(learning_rate=1e-3, checkpoint_every=2, reward_workers=1, reward_timeout_s=30.0)
    return c
  c.hf_dir = f"~/models/Qwen2.5-{arg.upper()}-Instruct"
  c.model.update(dtype="bfloat16", param_dtype="float32", scan_layers=True, remat="full")
  c.sampler.update(max_new_tokens=512, max_prompt_len=256, group_size=8)
  c.sampler.prompt_buckets = (128, 256)
  c.sampling.update(temperature=1.0, top_p=1.0)
  c.update(prompts_per_step=64, iterations=200, learning_rate=1e-6, warmup_steps=10)
  c.update(eval_every=20, eval_size=256, eval_samples=0, checkpoint_every=20)
  c.update(reward_workers=8, reward_timeout_s=10.0)
  c.rl.update(num_minibatches=4, micro_batches=4)
  c.mesh.update(dict(zip(("data", "fsdp", "tensor"), _MESHES[arg], strict=True)))
  return c
