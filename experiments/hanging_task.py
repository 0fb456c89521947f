"""A verifier whose "hang..." completions never return (experiments/bench_reward_hangs.py,
tests/verifiers/test_rewards.py).

It imports jax and the trainer's modules, as a reward function living next to training code
does, so that importing it costs what such a module costs (seconds): a worker replacing a
killed one must not import it afresh. GRPO_JAX_IMPORT_LOG, when set, names a file that gets
one line (the pid) per import of this module, for the test that counts them."""

import os
import time

import jax  # noqa: F401

from grpo_jax.trainer import train  # noqa: F401

if os.environ.get("GRPO_JAX_IMPORT_LOG"):
  with open(os.environ["GRPO_JAX_IMPORT_LOG"], "a") as f:
    f.write(f"{os.getpid()}\n")


class HangTask:
  def reward(self, prompt, completion):
    if completion.startswith("hang"):
      time.sleep(1e6)
    return 1.0

  def format_reward(self, prompt, completion):
    return 0.0
