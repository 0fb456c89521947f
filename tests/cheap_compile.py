"""`jit`: jax.jit for tests that compile a program to run it once or twice and compare its
result with another program's (equivalence tests), where compiling, not running, is the
cost.

It compiles at LLVM's optimisation level 0 (`xla_backend_optimization_level=0`, for that
program only): XLA's HLO passes, fusion and buffer assignment are the same as ever, only
the machine code is less optimised. A tiny model's gradient compiled in 8 s against 16 s
at the default level (2-core CPU, loaded), and ran in 0.2 s either way. The test
processes compile at that level anyway (`subproc.FAST_COMPILE`, which also turns the
fusion emitters off); this keeps a program's level whatever process compiles it (the
learning tests' children run at the default level: their programs run thousands of
times, where the optimised code wins)."""

import jax

OPTIONS = {"xla_backend_optimization_level": 0}


def jit(fn, **kw):
  """jax.jit(fn, **kw), compiled with `OPTIONS`."""
  return jax.jit(fn, compiler_options=OPTIONS, **kw)
