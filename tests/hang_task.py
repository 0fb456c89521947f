"""A reward task whose module records each import (for test_rewards): a completion starting
with "hang" never returns. GRPO_JAX_IMPORT_LOG names the file that gets a line per import."""

import os
import time

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
