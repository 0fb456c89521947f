"""Runs a script of this repository in a fresh Python process on CPU (tests that need a
forced host device count, or several processes, run their work this way).

Tests and their children compile at LLVM's optimisation level 0 (`FAST_COMPILE`): most
tests compile a program to run it a few times, and compiling is then their cost. Same
sitting, quiet 2-core AMD EPYC host, cold cache, one worker: test_rl + test_mixed_precision
took 133 s at the default level (108 s of it XLA compiling) against 85 s at level 0. The
learning tests run their programs thousands of times, where level 0's code is slower (the
four took 1,175 s at level 0 against 760 s at the default): they run in a child at the
default level (`child_env(optimized=True)`, runs.warm_started_arms). XLA's other fast-compile
switches gained nothing here (`--xla_cpu_opt_preset=FAST_COMPILE`: 133 s,
`--xla_llvm_disable_expensive_passes`: 136 s).

Level 0 also turns XLA:CPU's fusion emitters off (`--xla_cpu_use_fusion_emitters=false`:
fusions go through the older loop emitter, which compiles faster). Same sitting, quiet
2-core Intel Xeon @ 2.80GHz, cold cache, two workers: test_rl + test_mixed_precision +
test_sampling + test_model took 183 s at level 0 against 102 s with the emitters off (a
2-iteration tiny run: 10.3-13.2 s of XLA compiling against 6.6-8.3 s). At the learning tests' default level it changes
nothing (test_learning alone: 86.8 s against 87.0 s), so they keep XLA's defaults."""

import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
# pyproject.toml's [tool.pytest.ini_options] pythonpath, for child processes.
PYTHONPATH = ("tests", "experiments", "configs")


# XLA_FLAGS of the test processes and their children (see the module docstring).
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"


def xla_flags(*, devices: int | None = None, optimized: bool = False) -> str:
  """XLA_FLAGS for a test process: `FAST_COMPILE` unless `optimized` (XLA's default level),
  and with `devices`, that many forced host devices."""
  flags = [] if optimized else [FAST_COMPILE]
  if devices:
    flags.append(f"--xla_force_host_platform_device_count={devices}")
  return " ".join(flags)


# The cores this process could use when it started, before `pin_worker`.
CORES = tuple(sorted(os.sched_getaffinity(0)))


def pin_worker() -> int | None:
  """Pins this pytest-xdist worker, and the children it starts, to one core of its own (the
  worker's index among the cores it may use) when there are exactly as many workers as
  such cores; returns that core, or None (not a worker, or another count: no change).

  Why: XLA:CPU sizes its thread pools by the cores a process may use. Two workers on two
  cores each run their programs and compiles over both, and contend for them; pinned, each
  keeps its own core and its caches. Same sitting, quiet 2-core AMD EPYC, cold cache, two
  streams at once (test_model + test_train beside a reasoning-gym learning test), twice
  each: the pair took 93.7 and 97.3 s free against 89.0 and 88.3 s pinned, its CPU
  seconds within 3%: the compile-heavy stream gained its own core, the learning one, done
  first, lost the share of the other core it had borrowed (59.8 and 62.5 s against 62.5
  and 65.3). The whole suite from a cold cache: 1,790 s against 1,902 s (one run each)."""
  worker = os.environ.get("PYTEST_XDIST_WORKER", "")
  count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
  cores = sorted(os.sched_getaffinity(0))
  if not worker.startswith("gw") or count < 2 or count != len(cores):
    return None
  core = cores[int(worker[2:]) % count]
  os.sched_setaffinity(0, {core})
  return core


# glibc's allocator for a child on one core (`malloc_env`).
MALLOC_TUNABLES = ":".join((
  "glibc.malloc.arena_max=1",  # One heap for every thread (a thread's own maps large buffers),
  "glibc.malloc.mmap_max=0",  # large buffers from that heap, not from fresh mappings,
  "glibc.malloc.trim_threshold=4294967296",  # and freed memory kept for the next one.
))  # fmt: skip


def malloc_env() -> dict:
  """{"GLIBC_TUNABLES": `MALLOC_TUNABLES`} for a child of a process on one core (an xdist
  worker that `pin_worker` gave its core: the child inherits it), where GLIBC_TUNABLES is
  unset; else {}. glibc reads the variable only as a process starts.

  Why: XLA:CPU allocates an executable's large buffers at every run and frees them after;
  with glibc's defaults a buffer over the mmap threshold (32 MiB at most) is mapped afresh
  and unmapped on free, and the runtime threads' own heaps give freed memory back, so every
  run of a training step takes a page fault per 4 KiB page it writes: a whole suite took
  74 million of them, 330 of its 2,412 CPU-s in the kernel. With the tunables the memory
  stays in one heap for reuse. One process on one core, one sitting on the quiet 2-core
  AMD EPYC (2026-12-07): test_learning + test_reasoning_gym_learning (their runs are
  children) took 234.4 s (54.8 s in the kernel, 27.5 million faults) with glibc's defaults
  and 180.3 s (4.7 s, 1.1 million) with them.

  Children only: in two full runs with the workers started with the tunables too, the
  learning modules took 115 s less but the long-lived workers' compile-bound modules
  more (test_train 32 s -> 47-49 s, test_offpolicy 67 s -> 76-98 s; the same modules in
  a two-minute run did not change), and the whole run no less (1,261 s without, 1,265 and
  1,313 s with). On two cores the one heap is contended: the demo (`grpo-jax
  --config=configs/arithmetic.py:tiny`, unpinned) took 129.2 and 131.1 s without against
  133.9 and 124.0 s with, 163-165 CPU-s of user time against 183-197."""
  if "GLIBC_TUNABLES" in os.environ or len(os.sched_getaffinity(0)) != 1:
    return {}
  return {"GLIBC_TUNABLES": MALLOC_TUNABLES}


def child_env(*, optimized: bool = False, **extra) -> dict:
  """The environment of a child python: this one with XLA_FLAGS = `xla_flags(optimized=)`
  (the parent's device count is not inherited), on CPU, with JAX's persistent compilation
  cache (tests run the same small programs in many processes: a compile is then paid once
  per test session, not once per process). Its import path holds what pytest's
  `pythonpath` (pyproject.toml) gives the tests: tests/, experiments/ and configs/, so a
  child imports the same helpers by name. On one core (an xdist worker's), glibc keeps
  the child's freed memory (`malloc_env`)."""
  out = dict(os.environ, XLA_FLAGS=xla_flags(optimized=optimized))
  out["JAX_PLATFORMS"] = "cpu"
  paths = [str(ROOT / d) for d in PYTHONPATH] + [p for p in [os.environ.get("PYTHONPATH")] if p]
  if os.environ.get("GRPO_JAX_COMPILE_PROFILE"):  # tests/compile_profile.py, in the child too.
    paths.append(str(ROOT / "tests" / "profile_site"))
  out["PYTHONPATH"] = os.pathsep.join(paths)
  out.setdefault("JAX_COMPILATION_CACHE_DIR", str(COMPILATION_CACHE))
  out.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  out.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
  return {**out, **malloc_env(), **extra}


def cache_env() -> dict:
  """`child_env`'s persistent-cache variables, for a process that inherits a test's own
  environment (a notebook's kernel): it compiles into the tests' cache, as children do."""
  prefixes = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")
  return {k: v for k, v in child_env().items() if k.startswith(prefixes)}


# One directory for every test process of a machine; entries are keyed by the program
# and the compile options, so sharing is safe.
COMPILATION_CACHE = pathlib.Path(tempfile.gettempdir()) / f"grpo_jax_test_xla_cache_{os.getuid()}"


def run(
  args,
  *,
  devices: int | None = None,
  optimized: bool = False,
  timeout: int = 600,
  check: bool = True,
) -> subprocess.CompletedProcess:
  """`python *args` from the repo root with JAX_PLATFORMS=cpu and XLA_FLAGS =
  `xla_flags(devices=, optimized=)`; with `check`, fails the test on a non-zero exit."""
  env = child_env(XLA_FLAGS=xla_flags(devices=devices, optimized=optimized))
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
