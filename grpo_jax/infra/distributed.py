"""Several processes (hosts) as one job: JAX's multi-controller runtime.

Every process runs the same program on the same global arrays; each holds the shards of
its own devices. The host-side work is split by rows:

    rows = distributed.local_rows(sharding, n)             # this process's slice of n rows
    x = distributed.to_global(local_tree, sharding, n)      # host rows -> one global array
    local = distributed.fetch_local(x)                      # global array -> this host's rows
    full = distributed.gather_rows(local, sharding, n)      # every host's rows, on every host

The prompt stream is global: iteration i reads examples index .. index + B - 1 whatever
the process count; process p draws, decodes and scores only the rows its devices hold
(`local_rows`), and the scores are all-gathered (a few floats a row) so that every process
computes the same advantages, metrics and data position. With one process every function
here is the identity or a plain `device_put`, and nothing is communicated.

`initialize(mode)` starts the distributed runtime (`jax.distributed.initialize`) when the
job has several processes; it must run before anything touches a JAX device.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils

MODES = ("auto", "on", "off")


def _env_process_count() -> int:
  """Processes the launcher announces: JAX's own variables, a multi-host TPU VM slice,
  Slurm or Open MPI; 1 when none does."""
  env = os.environ
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return int(env.get("JAX_NUM_PROCESSES", "2"))
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  counts = [
    len(hosts),
    int(env.get("SLURM_NTASKS", "1") or 1),
    int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1),
  ]
  return max(counts)


def initialize(mode: str = "auto", **kwargs) -> bool:
  """Calls `jax.distributed.initialize(**kwargs)` when the job has several processes.

  mode "auto": only when the environment announces several processes (JAX_COORDINATOR_ADDRESS
  with JAX_NUM_PROCESSES / JAX_PROCESS_ID, TPU_WORKER_HOSTNAMES of a multi-host TPU slice,
  SLURM_NTASKS > 1, OMPI_COMM_WORLD_SIZE > 1); "on": always (JAX detects the cluster, or
  kwargs give coordinator_address, num_processes, process_id); "off": never. On CPU the
  cross-process collectives use gloo (`jax_cpu_collectives_implementation`). Returns True
  when the runtime was started here.
  """
  if mode not in MODES:
    raise ValueError(f"distributed mode {mode!r}; allowed: {MODES}.")
  if mode == "off" or (mode == "auto" and _env_process_count() <= 1 and not kwargs):
    return False
  if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  env = os.environ
  if "num_processes" not in kwargs and env.get("JAX_NUM_PROCESSES"):
    kwargs["num_processes"] = int(env["JAX_NUM_PROCESSES"])
  if "process_id" not in kwargs and env.get("JAX_PROCESS_ID"):
    kwargs["process_id"] = int(env["JAX_PROCESS_ID"])
  jax.distributed.initialize(**kwargs)
  _gloo_by_address(kwargs.get("coordinator_address") or env.get("JAX_COORDINATOR_ADDRESS"))
  return True


def _resolves(hostname: str) -> bool:
  try:
    socket.getaddrinfo(hostname, None)
  except OSError:
    return False
  return True


def _local_address(coordinator: str) -> str:
  """This host's address on the route to the coordinator (a UDP connect sends nothing)."""
  host, _, port = coordinator.rpartition(":")
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.connect((host.strip("[]") or "localhost", int(port or 1)))
    return s.getsockname()[0]


def _gloo_by_address(coordinator: str | None) -> None:
  """Gloo's CPU collectives find this host by resolving its hostname, and fail with
  "gloo/transport/tcp/device.cc:99 rv == 0. -2 vs 0" (EAI_NONAME) where the hostname does
  not resolve (containers, CI runners, some VMs). There, the CPU backend is made with gloo
  bound to this host's address on the route to the coordinator instead. jax has no public
  option for it (0.10: `make_gloo_tcp_collectives(hostname=)` is only reachable through
  its backend factory), so this swaps the "cpu" factory before any backend exists.
  """
  if jax.config.jax_cpu_collectives_implementation != "gloo" or not coordinator:
    return
  if _resolves(socket.gethostname()):
    return
  from jax._src import distributed as jax_distributed  # noqa: PLC0415 -- private, see above.
  from jax._src import xla_bridge  # noqa: PLC0415
  from jax._src.lib import _jax  # noqa: PLC0415

  address = _local_address(coordinator)

  def make_cpu_client():
    collectives = _jax.make_gloo_tcp_collectives(
      distributed_client=jax_distributed.global_state.client, hostname=address
    )
    return xla_bridge.make_cpu_client(collectives=collectives)

  xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)
  logging.info(
    "distributed: hostname %r does not resolve; gloo uses %s.", socket.gethostname(), address
  )


def is_primary() -> bool:
  """Process 0: the one that writes logs, summaries and plots."""
  return jax.process_index() == 0


def row_ranges(sharding, n: int) -> dict[int, tuple[int, int]]:
  """process index -> (start, stop) of the rows of an n-row array its devices hold.

  A replicated array: every process holds (0, n). Rows split over devices: a process's
  devices must hold one contiguous block (true of every mesh whose
  devices are ordered by process, which `sharding.make_mesh` ensures for CPU and GPU and
  jax's mesh_utils for TPU); anything else is an error rather than a silent reorder.
  """
  spans: dict[int, list[tuple[int, int]]] = {}
  for device, index in sharding.devices_indices_map((n,)).items():
    rows = index[0]
    start, stop, _ = rows.indices(n)
    spans.setdefault(device.process_index, []).append((start, stop))
  out = {}
  for p, s in spans.items():
    s = sorted(set(s))
    start, stop = s[0][0], s[-1][1]
    covered = sum(b - a for a, b in s)
    if covered != stop - start:
      raise ValueError(
        f"process {p} holds rows {s} of {n}: not one contiguous block; order the mesh's "
        "devices by process (sharding.make_mesh does)."
      )
    out[p] = (start, stop)
  return out


def local_rows(sharding, n: int) -> slice:
  """The rows of an n-row array (sharded by `sharding` on its first axis) that this
  process's devices hold; all n with one process or a replicated sharding."""
  if jax.process_count() == 1:
    return slice(0, n)
  start, stop = row_ranges(sharding, n)[jax.process_index()]
  return slice(start, stop)


def to_global(local_tree, sharding, n: int):
  """A pytree of host arrays holding this process's rows (`local_rows(sharding, n)`) ->
  global jax Arrays of n rows on `sharding`. One process: a plain device_put."""
  if jax.process_count() == 1:
    return jax.device_put(local_tree, sharding)
  return jax.tree.map(
    lambda x: jax.make_array_from_process_local_data(
      sharding, np.asarray(x), (n, *np.shape(x)[1:])
    ),
    local_tree,
  )


def fetch_local(x: jax.Array) -> np.ndarray:
  """This process's rows of a global array (first axis), as numpy: its addressable
  shards in row order, replicas dropped. One process: the whole array."""
  if x.is_fully_addressable:
    return np.asarray(x)
  n = x.shape[0]
  rows = local_rows(x.sharding, n)
  out = np.empty((rows.stop - rows.start, *x.shape[1:]), x.dtype)
  for shard in x.addressable_shards:
    start, stop, _ = shard.index[0].indices(n) if shard.index else (0, n, 1)
    out[start - rows.start : stop - rows.start] = np.asarray(shard.data)
  return out


def gather_rows(local: np.ndarray, sharding, n: int) -> np.ndarray:
  """Every process's rows (`local_rows`) joined into the full n-row numpy array, on every
  process (an all-gather of host data). One process, or rows already replicated: `local`."""
  local = np.asarray(local)
  if jax.process_count() == 1:
    return local
  ranges = row_ranges(sharding, n)
  if all(r == (0, n) for r in ranges.values()):
    return local
  stacked = multihost_utils.process_allgather(local, tiled=False)  # [processes, rows, ...]
  out = np.empty((n, *local.shape[1:]), local.dtype)
  for p, (start, stop) in ranges.items():
    out[start:stop] = stacked[p]
  return out


def host_value(x: jax.Array) -> np.ndarray:
  """The whole value of a global array as numpy on every process (an all-gather when
  other processes hold part of it; a local read when it is replicated; np.asarray with
  one process)."""
  return host_values(x)[0]


def host_values(*xs: jax.Array) -> tuple[np.ndarray, ...]:
  """`host_value` of several global arrays, with one program gathering all those that
  other processes hold part of (a host loop reading a step's outputs pays one round of
  collectives, not one per array)."""
  out: list = [None] * len(xs)
  far = []
  for i, x in enumerate(xs):
    if x.is_fully_addressable:
      out[i] = np.asarray(x)
    elif x.is_fully_replicated:  # Every process holds all of it.
      out[i] = np.asarray(x.addressable_data(0))
    elif isinstance(x.sharding, jax.sharding.NamedSharding):
      far.append(i)
    else:
      out[i] = np.asarray(multihost_utils.process_allgather(x, tiled=True))
  if far:
    shardings = tuple(
      jax.sharding.NamedSharding(xs[i].sharding.mesh, jax.sharding.PartitionSpec()) for i in far
    )
    got = _replicator(shardings)(*(xs[i] for i in far))
    for i, g in zip(far, got, strict=True):
      out[i] = np.asarray(g.addressable_data(0))
  return tuple(out)


@functools.lru_cache(maxsize=64)
def _replicator(shardings: tuple) -> Callable:
  """An identity whose outputs are replicated on `shardings` (an all-gather of each input
  in one program), kept per shardings so that it compiles once."""
  return jax.jit(lambda *xs: xs, out_shardings=shardings)


def sum_across(x) -> np.ndarray:
  """Elementwise sum of a host number or array over processes (counts, e.g. reward
  errors). One process: x."""
  x = np.asarray(x)
  if jax.process_count() == 1:
    return x
  return multihost_utils.process_allgather(x, tiled=False).sum(axis=0)


def max_across(x: int) -> int:
  """Largest of a host integer over processes (e.g. the longest prompt: every process
  must pad its rows to the same bucket)."""
  if jax.process_count() == 1:
    return int(x)
  return int(multihost_utils.process_allgather(np.asarray(x, np.int64)).max())


def any_across(flag: bool) -> bool:
  """True on every process when it is True on any (e.g. a SIGTERM one host received: all
  must save and stop at the same step, or a collective deadlocks). One process: flag."""
  return bool(max_across(int(bool(flag))))


def from_primary(x: int) -> int:
  """The primary process's value of a host integer, on every process (e.g. the teacher
  checkpoint step each process found on its own: a teacher run that saves a newer one
  between two processes' reads must not give them different teachers). One process: x."""
  if jax.process_count() == 1:
    return int(x)
  return int(multihost_utils.broadcast_one_to_all(np.asarray(x, np.int64)))
