"""The order a split's records are drawn in: seeded, shuffled per epoch, split across hosts.

Iteration (``iterate``) is a pure function of (seed, global index): global index i is
record ``permutation(n, seed, epoch=i // n)[i % n]``, and host h of P takes the global
indices h, h + P, h + 2P, ... so the hosts' streams interleave into the single-host stream
whatever P is, and resuming at a global index is exact. ``record_index`` is one position
of that stream (the ``math`` task draws its examples with it).

The permutation sorts SplitMix64 keys rather than calling ``np.random``/``jax.random``:
the mix is written out here so the data order cannot change with a numpy or jax version.
Nothing here knows about TFDS; ``source`` is any Sequence (``datasets.problems`` gives one).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import jax
import numpy as np

T = TypeVar("T")  # What the source holds: a `problem_records.Problem` for a dataset split.

_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x) -> np.ndarray:
  """SplitMix64's output for state x, elementwise on uint64 (Steele et al. 2014).

  A fixed bijective mix written out here, so the data order cannot change with a numpy
  or jax version. ``splitmix64(0) == 0xE220A8397B1DCDAF`` (Vigna's splitmix64.c).
  """
  z = np.atleast_1d(np.asarray(x, dtype=np.uint64)) + _GAMMA
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
  """The record order of one epoch: indices 0..n-1 sorted by splitmix64 keys of (seed, epoch).

  key_j = splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ j); splitmix64 is a bijection,
  so keys are distinct and the order is a pure function of (n, seed, epoch).
  """
  if not 0 <= seed < 2**64 or epoch < 0:
    raise ValueError(f"Expected 0 <= seed < 2**64 and epoch >= 0, got {seed=}, {epoch=}.")
  stream = splitmix64(splitmix64(seed) ^ np.uint64(epoch))
  keys = splitmix64(stream ^ np.arange(n, dtype=np.uint64))
  return np.argsort(keys, kind="stable")


def record_index(index: int, *, n: int, seed: int, shuffle: bool = True) -> int:
  """The record at global stream position ``index``: ``perm(seed, index // n)[index % n]``."""
  if n <= 0 or index < 0:
    raise ValueError(f"Expected n > 0 and index >= 0, got {n=}, {index=}.")
  epoch, position = divmod(index, n)
  return int(permutation(n, seed=seed, epoch=epoch)[position]) if shuffle else position


def positions(
  n: int,
  *,
  seed: int,
  process_index: int,
  process_count: int,
  start: int = 0,
  num_epochs: int | None = None,
  shuffle: bool = True,
) -> Iterator[tuple[int, int]]:
  """(global index, record index) for this host: global indices i >= start, i % P == h.

  Endless unless ``num_epochs`` is set (then it stops before global index num_epochs * n).
  Equal to ``record_index`` at every position, computing one permutation per epoch.
  """
  if n <= 0:
    raise ValueError(f"Cannot iterate over an empty source (n={n}).")
  if not 0 <= process_index < process_count or start < 0:
    raise ValueError(
      f"Expected 0 <= process_index < process_count and start >= 0, got "
      f"{process_index=}, {process_count=}, {start=}."
    )
  i = start + (process_index - start) % process_count
  perm, perm_epoch = np.arange(n), None
  while num_epochs is None or i < num_epochs * n:
    epoch, position = divmod(i, n)
    if shuffle and epoch != perm_epoch:
      perm, perm_epoch = permutation(n, seed=seed, epoch=epoch), epoch
    yield i, int(perm[position])
    i += process_count


def iterate(
  source: Sequence[T],
  *,
  seed: int,
  start: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
  num_epochs: int | None = None,
  shuffle: bool = True,
) -> Iterator[T]:
  """This host's share of the seeded, epoch-shuffled stream of ``source``, from ``start``.

  ``start`` is a global index (records consumed by all hosts together), so resuming a run
  that has drawn k records in total is ``iterate(..., start=k)``. Hosts default to
  ``jax.process_index()`` of ``jax.process_count()``.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  for _, j in positions(
    len(source),
    seed=seed,
    process_index=process_index,
    process_count=process_count,
    start=start,
    num_epochs=num_epochs,
    shuffle=shuffle,
  ):
    yield source[j]
