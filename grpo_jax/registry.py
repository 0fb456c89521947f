"""Name -> object registries, so configs pick variants by string."""

from __future__ import annotations

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

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self._items)
