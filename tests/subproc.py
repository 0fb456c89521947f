"""Runs a script of this repository in a fresh Python process on CPU (tests that need a
forced host device count, or several processes, run their work this way)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(
  args, *, devices: int | None = None, timeout: int = 600, check: bool = True
) -> subprocess.CompletedProcess:
  """`python *args` from the repo root with JAX_PLATFORMS=cpu and, with `devices`, that
  many forced host devices (else XLA_FLAGS is dropped); with `check`, fails the test on a
  non-zero exit."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["JAX_PLATFORMS"] = "cpu"
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
