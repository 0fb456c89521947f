"""Runs a script of this repository in a fresh Python process on CPU (tests that need a
forced host device count, or several processes, run their work this way).

Tests and their children run at XLA:CPU's default optimisation level. LLVM at level 0
(--xla_backend_optimization_level=0) compiles the tiny programs faster but runs them slower:
same sitting, cold cache, 2 workers, this 2-core AMD EPYC host, the four learning tests
took 1,175 s at level 0 against 760 s at the default, and CI's whole run went from 1,546 s
to 2,471 s with it."""

import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# pyproject.toml's [tool.pytest.ini_options] pythonpath, for child processes.
PYTHONPATH = ("tests", "experiments", "configs")


def child_env(**extra) -> dict:
  """The environment of a child python: this one without XLA_FLAGS, on CPU, with JAX's
  persistent compilation cache (tests run the same small programs in many processes: a
  compile is then paid once per test session, not once per process). Its import path holds
  what pytest's `pythonpath` (pyproject.toml) gives the tests: tests/, experiments/ and
  configs/, so a child imports the same helpers by name."""
  out = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out["JAX_PLATFORMS"] = "cpu"
  paths = [str(ROOT / d) for d in PYTHONPATH] + [p for p in [os.environ.get("PYTHONPATH")] if p]
  out["PYTHONPATH"] = os.pathsep.join(paths)
  out.setdefault("JAX_COMPILATION_CACHE_DIR", str(COMPILATION_CACHE))
  out.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  out.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  return {**out, **extra}


# One directory for every test process of a machine; entries are keyed by the program
# and the compile options, so sharing is safe.
COMPILATION_CACHE = pathlib.Path(tempfile.gettempdir()) / f"grpo_jax_test_xla_cache_{os.getuid()}"


def run(
  args, *, devices: int | None = None, timeout: int = 600, check: bool = True
) -> subprocess.CompletedProcess:
  """`python *args` from the repo root with JAX_PLATFORMS=cpu and, with `devices`, that
  many forced host devices (else XLA_FLAGS is dropped); with `check`, fails the test on a
  non-zero exit."""
  env = child_env()
  if devices:
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  r = subprocess.run(
    [sys.executable, *map(str, args)],
    env=env,
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert r.returncode == 0 or not check, r.stderr[-3000:]
  return r
