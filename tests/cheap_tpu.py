"""`memo`: `aot.compile_function` compiling each distinct TPU program once. JAX's persistent
cache never holds a TPU program compiled for an abstract topology (`aot.compile_function`:
a compile-only client cannot load one back), so every test that compiles the same run's
functions again pays libtpu's whole compile again. Under `memo`, a program whose lowered
text and devices equal one already compiled gets that executable: XLA would compile the
same module for the same devices to the same executable."""

import contextlib

import pytest

from grpo_jax.models import sharding
from grpo_jax.trainer import aot


@contextlib.contextmanager
def memo():
  """aot.compile_function (and everything in `aot` that calls it) memoised while open;
  yields the counts {"compiled": n, "reused": n}."""
  real, seen, counts = aot.compile_function, {}, {"compiled": 0, "reused": 0}

  def compile_function(jitted, args, *, layout=None):
    lay, fn = (jitted.layout, jitted.jitted) if isinstance(jitted, sharding.Jitted) else (layout, jitted)  # fmt: skip
    if lay is None:
      return real(jitted, args, layout=layout)  # Its own error.
    placed = jitted.place(args, abstract=True) if isinstance(jitted, sharding.Jitted) else args
    with lay.context():
      text = fn.lower(*placed).as_text()
    key = (text, tuple((d.device_kind, str(d)) for d in lay.mesh.devices.flat))
    if key in seen:
      counts["reused"] += 1
    else:
      counts["compiled"] += 1
      seen[key] = real(jitted, args, layout=layout)
    return seen[key]

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(aot, "compile_function", compile_function)
    yield counts
