"""The verifier of experiments/bench_reward_hangs.py: "hang..." completions never return.

It imports jax and the trainer's modules, as a reward function living next to training code
does, so that importing it costs what such a module costs (seconds)."""

import time

import jax  # noqa: F401

from grpo_jax import train  # noqa: F401


class HangTask:
  def reward(self, prompt, completion):
    if completion.startswith("hang"):
      time.sleep(1e6)
    return 1.0

  def format_reward(self, prompt, completion):
    return 0.0
