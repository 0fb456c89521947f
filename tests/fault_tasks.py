"""Tasks whose verifier misbehaves, for the fault-injection tests (registered on import)."""

import time
import zlib

from grpo_jax import tasks
from grpo_jax.tasks import arithmetic


class FlakyArithmetic(arithmetic.Arithmetic):
  """Arithmetic whose reward raises on about 1 completion in 5 and hangs on about 1 in 11."""

  name = "flaky_arithmetic"

  def reward(self, prompt, completion):
    h = zlib.crc32(completion.encode())
    if h % 5 == 0:
      raise ValueError("bad completion")
    if h % 11 == 1:
      time.sleep(1e6)
    return super().reward(prompt, completion)


class BrokenArithmetic(arithmetic.Arithmetic):
  """Arithmetic whose verifier raises on every answer."""

  name = "broken_arithmetic"

  def reward(self, prompt, completion):
    raise KeyError("the verifier's lookup table is empty")


for _task in (FlakyArithmetic, BrokenArithmetic):
  if _task.name not in tasks.REGISTRY:
    tasks.REGISTRY.register(_task.name)(_task)
