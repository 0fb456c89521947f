"""Name -> object registries, so configs pick variants by string."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """A named table of variants; unknown names fail with the list of valid ones."""

  def __init__(self, kind: str):
    self.kind = kind
    self._items: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    def add(obj: T) -> T:
      if name in self._items:
        raise ValueError(f"{self.kind} {name!r} is already registered.")
      self._items[name] = obj
      return obj

    return add

  def get(self, name: str) -> T:
    try:
      return self._items[name]
    except KeyError:
      raise ValueError(
        f"Unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}."
      ) from None

  def bind(self, name: str, **options):
    """The entry `name` with static keyword-only options bound (functools.partial).

    Unknown options fail with the entry's allowed options listed.
    """
    fn = self.get(name)
    allowed = [
      n
      for n, p in inspect.signature(fn).parameters.items()
      if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
      raise ValueError(
        f"{self.kind} {name!r} has no options {unknown}; allowed: {allowed or 'none'}."
      )
    return functools.partial(fn, **options) if options else fn

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self._items)
