"""Runs a script of this repository in a fresh Python process on CPU (tests that need a
forced host device count, or several processes, run their work this way)."""

import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# pyproject.toml's [tool.pytest.ini_options] pythonpath, for child processes.
PYTHONPATH = ("tests", "experiments", "configs")


# The tests compile with LLVM's optimisation off (XLA:CPU's backend level 0; HLO passes
# unchanged): their tiny programs take most of their time in compiling, not running. Cold
# cache, 2 workers, this repository's 2-core AMD EPYC host: test_rl + test_packing +
# test_sampling took 232 s at the default level and 148 s at 0, while the LoRA learning
# test, which runs 430 steps, went from 101 s to 136 s. conftest.py sets it for the test
# processes, `child_env` for their children (one flag set: one compilation-cache key).
TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"


def child_env(**extra) -> dict:
  """The environment of a child python: this one with XLA_FLAGS = TEST_XLA_FLAGS, on CPU, with JAX's
  persistent compilation cache (tests run the same small programs in many processes: a
  compile is then paid once per test session, not once per process). Its import path holds
  what pytest's `pythonpath` (pyproject.toml) gives the tests: tests/, experiments/ and
  configs/, so a child imports the same helpers by name."""
  out = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out["XLA_FLAGS"] = TEST_XLA_FLAGS
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
  many forced host devices (XLA_FLAGS: TEST_XLA_FLAGS and the device count); with
  `check`, fails the test on a non-zero exit."""
  env = child_env()
  if devices:
    env["XLA_FLAGS"] += f" --xla_force_host_platform_device_count={devices}"
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
