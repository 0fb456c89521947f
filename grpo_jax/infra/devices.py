"""What a run computes on, said in its first lines: the backend, the device count and
kind, and a warning when JAX runs on the CPU of a machine whose accelerator it cannot use.

    for line in devices.describe():
      log(line)
    # devices: 8 × TPU v5 lite (tpu), 2 processes; jax 0.10.2
    # devices: 1 × cpu (cpu); jax 0.10.2
    # warning: JAX runs on CPU, but this machine has an NVIDIA GPU (/dev/nvidia0). ...

The warning exists because `pip install jax` (or this package's own install) gives the CPU
build: on a GPU box, without `jax[cuda12]`, a run trains on CPU and says nothing. An
accelerator is "visible" when its device files exist (`ACCELERATOR_FILES`: NVIDIA's
/dev/nvidia<N>, AMD's /dev/kfd, a TPU VM's /dev/accel<N> or /dev/vfio/<N>); no library of
the accelerator is imported or needed. A user who chose the CPU (JAX_PLATFORMS=cpu) gets
no warning.

`cpu_where_nothing_else` is what the command-line entry points call first: on a machine
with no accelerator's device files and no JAX_PLATFORMS, JAX_PLATFORMS=cpu. With libtpu
installed (the `tpu` and `test` extras) JAX otherwise starts by probing for a TPU, and
libtpu prints errors where there is none ("could not determine TPU accelerator type").
This module imports JAX only in `describe`, so the entry points' edge stays JAX-free.
"""

from __future__ import annotations

import os
import pathlib
import re

# (kind, device-file pattern under /dev, what to install): the first match names the kind.
ACCELERATOR_FILES = (
  ("an NVIDIA GPU", r"nvidia\d+", 'pip install -U "jax[cuda12]"'),
  ("an AMD GPU", r"kfd", "JAX's ROCm build (jax-rocm plugins; see JAX's install guide)"),
  ("a TPU", r"accel\d+", 'pip install -U "jax[tpu]"'),
  ("a TPU", r"vfio/\d+", 'pip install -U "jax[tpu]"'),
)


def describe(
  *, devices=None, process_count: int | None = None, dev_root="/dev", env=None
) -> list[str]:
  """The device line, and a warning line when `visible_accelerator` finds one while every
  device is a CPU and the environment did not ask for the CPU (JAX_PLATFORMS). Defaults:
  jax.devices(), jax.process_count(), /dev, os.environ."""
  import jax  # noqa: PLC0415 -- see the module docstring.

  devices = jax.devices() if devices is None else devices
  process_count = jax.process_count() if process_count is None else process_count
  env = os.environ if env is None else env
  kinds = dict.fromkeys((d.device_kind, d.platform) for d in devices)  # In device order.
  what = ", ".join(f"{sum(d.device_kind == k for d in devices)} × {k} ({p})" for k, p in kinds)
  procs = f", {process_count} processes" if process_count > 1 else ""
  lines = [f"devices: {what}{procs}; jax {jax.__version__}"]
  if any(d.platform != "cpu" for d in devices) or "cpu" in env.get("JAX_PLATFORMS", "").lower():
    return lines
  found = visible_accelerator(dev_root)
  if found:
    kind, path, install = found
    lines.append(
      f"warning: JAX runs on CPU, but this machine has {kind} ({path}). Install the JAX "
      f"build for it ({install}), or set JAX_PLATFORMS=cpu to train on the CPU on purpose."
    )
  return lines


def visible_accelerator(dev_root="/dev") -> tuple[str, str, str] | None:
  """(kind, device file, what to install) of the first accelerator whose device file
  exists under dev_root (`ACCELERATOR_FILES`), or None."""
  root = pathlib.Path(dev_root)
  for kind, pattern, install in ACCELERATOR_FILES:
    folder, _, name = pattern.rpartition("/")
    base = root / folder if folder else root
    try:
      names = sorted(p.name for p in base.iterdir())
    except OSError:  # No such folder, or not readable: nothing visible there.
      continue
    for n in names:
      if re.fullmatch(name, n):
        return kind, str(base / n), install
  return None


def cpu_where_nothing_else(env=None, dev_root="/dev") -> bool:
  """Sets env["JAX_PLATFORMS"] = "cpu" when it is unset and `visible_accelerator` finds
  none (default: os.environ, /dev); returns whether it did. Call it before JAX starts."""
  env = os.environ if env is None else env
  if "JAX_PLATFORMS" in env or visible_accelerator(dev_root):
    return False
  env["JAX_PLATFORMS"] = "cpu"
  return True
