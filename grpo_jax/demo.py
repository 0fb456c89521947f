"""Sampler demo: `python -m grpo_jax.demo [--config=configs/sample_demo.py:tiny]`.

The library calls below are what a notebook would make; see configs/sample_demo.py.
"""

from __future__ import annotations

import pathlib
import time

import jax
import numpy as np
from absl import app, flags, logging

from grpo_jax import cli, tasks
from grpo_jax.infra import config_lib, devices
from grpo_jax.models import model, sampling

_DEFAULT = (
  str(pathlib.Path(__file__).resolve().parent.parent / "configs" / "sample_demo.py") + ":tiny"
)


def run_demo(config) -> dict:
  """Samples groups from a random-init policy and scores them. Returns summary figures."""
  task = tasks.get(config.task.name, **config_lib.to_dict(config.task.kwargs))
  tok = task.tokenizer()
  model_cfg = model.ModelConfig.from_dict(
    {**config_lib.to_dict(config.model), "vocab_size": tok.vocab_size}
  )
  scfg = config_lib.from_dict(
    sampling.SamplerConfig,
    {**config_lib.to_dict(config.sampler), "eos_ids": tok.eos_ids, "pad_id": tok.pad_id},
  )
  hyper = sampling.sampling_params(**config_lib.to_dict(config.sampling))
  examples = [task.example("train", i, seed=config.seed) for i in range(config.num_prompts)]
  prompts = sampling.prepare_prompts(
    [tok.encode(e.prompt, add_bos=True) for e in examples], cfg=scfg
  )

  params = jax.jit(model.init, static_argnums=0)(model_cfg, jax.random.key(config.seed))
  sample_fn = sampling.make_policy_sampler(model_cfg, scfg)
  t0 = time.perf_counter()
  rollouts = jax.block_until_ready(
    sample_fn(params, prompts, jax.random.key(config.seed + 1), hyper)
  )
  first_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  rollouts = jax.block_until_ready(
    sample_fn(params, prompts, jax.random.key(config.seed + 2), hyper)
  )
  steady_s = time.perf_counter() - t0

  # Host side: decode and score.
  groups = np.asarray(rollouts.group_ids_N)
  completions = [tok.decode(row) for row in np.asarray(rollouts.tokens_NT)]
  rewards = np.array([task.reward(examples[g].prompt, c) for g, c in zip(groups, completions)])
  formats = np.array(
    [task.format_reward(examples[g].prompt, c) for g, c in zip(groups, completions)]
  )
  reference = np.array([task.reward(e.prompt, e.reference) for e in examples])

  G = scfg.group_size
  print(f"task={task.name}  params={model.param_count(params):,}  prompts={len(examples)}  G={G}")
  for b, e in enumerate(examples[:4]):
    print(
      f"prompt {e.prompt!r}  reference {e.reference!r} -> reward {task.reward(e.prompt, e.reference)}"
    )
    for n in range(b * G, b * G + min(G, 3)):
      print(f"    sample {completions[n]!r:24}  reward {rewards[n]:.0f}  format {formats[n]:.0f}")
  distinct = np.mean(
    [len(set(completions[b * G : (b + 1) * G])) == G for b in range(len(examples))]
  )
  n_tokens = int(np.asarray(rollouts.mask_NT).sum())
  summary = dict(
    mean_reward=float(rewards.mean()),
    mean_format_reward=float(formats.mean()),
    reference_reward=float(reference.mean()),
    groups_all_distinct=float(distinct),
    first_call_s=first_s,
    tokens_per_s=n_tokens / steady_s,
  )
  print(" ".join(f"{k}={v:.3g}" for k, v in summary.items()))
  return summary


def parse_flags(argv: list[str]):
  """--config (default: configs/sample_demo.py:tiny) and its --config.KEY overrides, read
  as `grpo-jax` reads them (`cli`): a mistake is one line, exit status 2."""
  try:
    spec, config_args, rest = cli.split_config_args(argv)
    try:
      extra = flags.FLAGS(rest)[1:]
    except flags.Error as e:
      raise cli.UsageError(cli.flag_error(e)) from None
    if extra:
      raise cli.UsageError(
        f"unexpected argument(s) {' '.join(extra)!r}; the demo takes flags only."
      )
    return cli.parse("train", spec or _DEFAULT, config_args).config
  except (cli.UsageError, config_lib.ConfigError) as e:
    cli.fail(e)


def main(config):
  logging.set_verbosity(logging.WARNING)  # Quiet JAX's backend probing.
  run_demo(config)


def run():
  if devices.cpu_where_nothing_else():  # jax is imported: its config, not the environment.
    jax.config.update("jax_platforms", "cpu")
  app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
  run()
