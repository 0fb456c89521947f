"""Compile and step time of the trainer's jitted functions on several meshes of host devices.

  python experiments/bench_sharding.py                  # default meshes, d_model 128, 4 layers
  python experiments/bench_sharding.py --meshes 1x1x1,8x1x1,1x1x8 --steps 10
  python experiments/bench_sharding.py --d_model 256 --layers 2 --prompts 32 --group 4
  python experiments/bench_sharding.py --quick          # tiny smoke run: meshes 1x1x1,2x2x2

Devices: the script adds --xla_force_host_platform_device_count=8 to XLA_FLAGS (keeping
any flags already there) before jax starts, unless XLA_FLAGS already sets a device count,
and sets JAX_PLATFORMS=cpu unless it is set. A mesh is data x fsdp x tensor
(`sharding.MeshConfig`); its sizes must multiply to the device count. The trainer builds
its mesh over every device, so the 1x1x1 mesh -- the single-device reference -- is
measured in a subprocess of this script with a host device count of 1 (its stderr is
passed through; its figures come from the last line it prints). It always runs, whether
or not --meshes names 1x1x1.

Workload: configs/arithmetic.py:tiny with the model widened to --d_model, --layers
layers, head_dim 16, d_model / 8 query heads and half as many KV heads (GQA), SwiGLU
width 3 x d_model, random weights; --prompts prompts x --group samples per rollout batch,
rl.num_minibatches 2, kl_coef 0 (no reference policy); prompts left-padded to 16 tokens,
8 new tokens. The functions are the trainer's own (`steps.functions`): `sample` (one
rollout batch) and `update` (the update phase of one rollout batch: the planner, then
num_minibatches GRPO steps in one jitted scan, state donated), with their in/out
shardings on the mesh. The rollout batch is a real one: the trainer's pipeline run once
(the first training prompts -> sample -> `logprobs` -> `finish` with random 0/1
rewards). Arguments are placed on their shardings before any timing, so the times hold
no host -> device transfers.

Figures, per mesh (seconds of wall time; medians over --steps calls after one untimed
warm-up call, each call timed to `jax.block_until_ready` of its outputs):

  sample_compile_s      fns.samplers.train.lower(...).compile(): trace, lower, XLA compile
  update_compile_s      the same for fns.rl.update
  sample_s              one `sample` call: prompts x group rows, up to 8 new tokens
                        (sample_num_steps: decode steps it ran)
  update_s              one `update` call: num_minibatches × (forward, backward, AdamW)
                        on minibatch_rows rows each
  update_vs_single      update_s / the 1x1x1 update_s (< 1: faster than one device)
  sample_vs_single      sample_s / the 1x1x1 sample_s

All forced host devices share this machine's CPU cores, so a mesh adds no compute: the
ratios show what its partitioning costs (collectives, small per-device kernels, work
replicated across `tensor`) against what it gains from running the devices' programs in
parallel threads on every core (one host device's program may leave cores idle). They
are not the speed-up real devices would give. Timings on a shared host are noisy: rerun
with more --steps before reading much into a 10% difference.

Printed: one line per mesh, then one line per mesh with its ratios to the single-device
figures, and last one JSON object with every figure: "meshes" (mesh -> figures, plus the
per-call times), "single_device" (the 1x1x1 figures), "config" (sizes) and the host.
"""

import os
import re
import sys

FORCE_DEVICES = "--xla_force_host_platform_device_count"


def with_device_count(flags: str, *, devices: int) -> str:
  """XLA_FLAGS `flags` with the host device count set to `devices` (others kept)."""
  kept = re.sub(rf"{FORCE_DEVICES}=\S*", "", flags).split()
  return " ".join([*kept, f"{FORCE_DEVICES}={devices}"])


if FORCE_DEVICES not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = with_device_count(os.environ.get("XLA_FLAGS", ""), devices=8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from grpo_jax import tasks  # noqa: E402
from grpo_jax.infra import config_lib  # noqa: E402
from grpo_jax.models import model, sampling, sharding  # noqa: E402
from grpo_jax.rl import spec  # noqa: E402
from grpo_jax.trainer import build  # noqa: E402
from grpo_jax.trainer import steps as steps_lib  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent

DEFAULT_MESHES = "1x1x1,8x1x1,2x2x2,1x4x2,1x8x1,1x1x8"
SINGLE = "1x1x1"


def parse_mesh(text: str) -> tuple[int, int, int]:
  """'2x2x2' -> (data, fsdp, tensor)."""
  sizes = tuple(int(n) for n in text.split("x"))
  if len(sizes) != 3 or min(sizes) < 1:
    raise ValueError(f"mesh {text!r}: expected data x fsdp x tensor, e.g. 2x2x2.")
  return sizes


def make_config(mesh, *, d_model: int, layers: int, prompts: int, group: int):
  """The benchmark's trainer config (see the module docstring) on mesh (data, fsdp, tensor)."""
  c = config_lib.load(str(ROOT / "configs" / "arithmetic.py") + ":tiny")
  heads = d_model // 8
  c.model.update(
    d_model=d_model,
    n_layers=layers,
    n_heads=heads,
    n_kv_heads=max(heads // 2, 1),
    head_dim=16,
    mlp_dim=3 * d_model,
  )
  c.sampler.group_size = group
  c.update(prompts_per_step=prompts, reward_workers=0, progress=False, tensorboard=False)
  c.rl.update(num_minibatches=2, kl_coef=0.0)
  c.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
  return c


def timed(fn):
  """(wall seconds of fn() with its outputs ready, its outputs)."""
  t = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - t, out


def first_prompts(setup) -> sampling.Prompts:
  """The left-padded prompts of the first training batch (train examples 0 .. B - 1)."""
  loop, tok = setup.loop, setup.tokenizer
  examples = [setup.task.example("train", i, seed=loop.seed) for i in range(loop.prompts_per_step)]
  tokens = [tok.encode(e.prompt, add_bos=True) for e in examples]
  return sampling.prepare_prompts(tokens, cfg=setup.sampler_cfg)


def rollout_batch(setup, fns, params, rollouts):
  """The trainer's pipeline on one rollout batch with random 0/1 rewards: the
  `spec.RolloutBatch` its update phase takes."""
  n = rollouts.tokens_NT.shape[0]
  correct_N = np.random.default_rng(0).integers(0, 2, n).astype(np.float32)
  prep_hyper = setup.rl_cfg.prepare_hyper(max_new_tokens=setup.sampler_cfg.max_new_tokens)
  logprobs = fns.rl.logprobs(params, None, rollouts)
  ones = np.ones(n, bool)  # Every reward scored, every row kept.
  batch, _, _ = fns.rl.finish(
    logprobs, rollouts, correct_N, np.zeros(n, np.float32), prep_hyper, ones, ones
  )
  return batch


def measure(c, *, steps: int) -> dict:
  """Compile and call times of `sample` and `update` (the planned num_minibatches train
  steps over one rollout batch, one jitted scan) for trainer config c."""
  setup = build.build(c)
  fns = steps_lib.functions(setup)
  params = sharding.init_params(fns.layout, setup.model_cfg, jax.random.key(0))
  hyper = setup.sampling_hyper
  sample_args = fns.samplers.train.place((params, first_prompts(setup), jax.random.key(1), hyper))
  sample_compile_s, _ = timed(lambda: fns.samplers.train.lower(*sample_args).compile())
  _, rollouts = timed(lambda: fns.samplers.train(*sample_args))  # Warm-up.
  sample_times = [timed(lambda: fns.samplers.train(*sample_args))[0] for _ in range(steps)]
  batch = rollout_batch(setup, fns, params, rollouts)
  state = jax.device_put(spec.init_state(params, fns.optimizer), fns.state_shardings)
  args = fns.rl.update.place((state, batch, jax.random.key(2), setup.rl_cfg.step_hyper()))
  update_compile_s, _ = timed(lambda: fns.rl.update.lower(*args).compile())
  holder = [args[0]]

  def update():
    holder[0], _, metrics = fns.rl.update(holder[0], *args[1:])
    return holder[0], metrics

  timed(update)  # Warm-up (also allocates the donated buffers).
  update_times = [timed(update)[0] for _ in range(steps)]
  return {
    "devices": len(jax.devices()),
    "sample_compile_s": sample_compile_s,
    "update_compile_s": update_compile_s,
    "sample_s": statistics.median(sample_times),
    "update_s": statistics.median(update_times),
    "sample_times_s": sample_times,
    "update_times_s": update_times,
    "sample_num_steps": int(rollouts.num_steps),
    "minibatch_rows": int(batch.tokens_NT.shape[0]) // setup.rl_cfg.num_minibatches,
    "params": model.param_count(params),
  }


def sizes(args) -> dict:
  """The config sizes the figures were measured with."""
  c = make_config((1, 1, 1), **model_flags(args))
  m = c.model
  return {
    **{k: m[k] for k in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim")},
    "vocab_size": tasks.get(c.task.name, **c.task.kwargs).tokenizer().vocab_size,
    "prompts": c.prompts_per_step,
    "group": c.sampler.group_size,
    "rollout_rows": c.prompts_per_step * c.sampler.group_size,
    "num_minibatches": c.rl.num_minibatches,
    "prompt_len": max(c.sampler.prompt_buckets),
    "max_new_tokens": c.sampler.max_new_tokens,
    "steps": args.steps,
    "quick": args.quick,
  }


def model_flags(args) -> dict:
  return dict(d_model=args.d_model, layers=args.layers, prompts=args.prompts, group=args.group)


def single_device(args) -> dict:
  """The 1x1x1 figures, from this script run in a subprocess on one host device."""
  env = dict(os.environ, XLA_FLAGS=with_device_count(os.environ["XLA_FLAGS"], devices=1))
  flags = [f"--{k}={v}" for k, v in model_flags(args).items()]
  r = subprocess.run(
    [sys.executable, __file__, f"--meshes={SINGLE}", f"--steps={args.steps}", "--_child", *flags],
    env=env,
    stdout=subprocess.PIPE,
    text=True,
    check=True,
  )
  return json.loads(r.stdout.strip().splitlines()[-1])["meshes"][SINGLE]


def describe(name: str, r: dict) -> str:
  return (
    f"{name:>6} ({r['devices']} dev): compile update {r['update_compile_s']:.1f} s, "
    f"sample {r['sample_compile_s']:.1f} s; update {r['update_s'] * 1e3:.1f} ms, "
    f"sample {r['sample_s'] * 1e3:.1f} ms (medians of {len(r['update_times_s'])})"
  )


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--meshes", default=DEFAULT_MESHES, help="comma-separated data x fsdp x tensor")
  p.add_argument("--d_model", type=int, default=128)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--prompts", type=int, default=16, help="prompts per rollout batch")
  p.add_argument("--group", type=int, default=8, help="samples per prompt")
  p.add_argument("--steps", type=int, default=5, help="timed calls (after 1 warm-up)")
  p.add_argument("--quick", action="store_true", help="tiny smoke run")
  p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.quick:
    args.d_model, args.layers, args.prompts, args.group, args.steps = 32, 1, 4, 4, 1
    args.meshes = f"{SINGLE},2x2x2"
  names = args.meshes.split(",")
  meshes = {}
  if not args._child:
    meshes[SINGLE] = single_device(args)
    print(describe(SINGLE, meshes[SINGLE]), flush=True)
  for name in names:
    if name in meshes:
      continue
    meshes[name] = measure(make_config(parse_mesh(name), **model_flags(args)), steps=args.steps)
    print(describe(name, meshes[name]), flush=True)
  if args._child:
    print(json.dumps({"meshes": meshes}))
    return {"meshes": meshes}
  ref = meshes[SINGLE]
  for name, r in meshes.items():
    r["update_vs_single"] = r["update_s"] / ref["update_s"]
    r["sample_vs_single"] = r["sample_s"] / ref["sample_s"]
    print(
      f"{name:>6} / 1x1x1: update {r['update_vs_single']:.2f}x, sample {r['sample_vs_single']:.2f}x"
    )
  result = {
    "meshes": {n: meshes[n] for n in names},
    "single_device": ref,
    "config": sizes(args),
    "backend": jax.default_backend(),
    "host_devices": len(jax.devices()),
    "cpu_count": os.cpu_count(),
  }
  print(json.dumps(result))
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
