"""Name -> object registries, so configs pick variants by string.

A registry may declare a traits record (a frozen dataclass with defaults): what the
trainer asks of a variant (e.g. an estimator's need of π_old), declared beside it at
registration, `@REGISTRY.register("name", needs_old_logp=True)`, and read with
`REGISTRY.traits("name")`, so that no caller compares variant names. Every caller gets a
variant with `REGISTRY.make(name, **options)`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """A named table of variants; unknown names fail with the list of valid ones."""

  def __init__(self, kind: str, *, traits: type | None = None):
    self.kind = kind
    self._items: dict[str, T] = {}
    self._traits_type = traits
    self._traits: dict[str, Any] = {}

  def register(self, name: str, **traits) -> Callable[[T], T]:
    """Decorator: adds `obj` under `name`, with its traits (the registry's traits record;
    an unknown trait fails here, at import)."""
    if traits and self._traits_type is None:
      raise ValueError(f"{self.kind} registry declares no traits; got {sorted(traits)}.")
    record = self._traits_type(**traits) if self._traits_type is not None else None

    def add(obj: T) -> T:
      if name in self._items and not _same_definition(self._items[name], obj):
        raise ValueError(f"{self.kind} {name!r} is already registered.")
      self._items[name] = obj
      self._traits[name] = record
      return obj

    return add

  def traits(self, name: str):
    """The traits record `name` was registered with (defaults where none were given)."""
    self.get(name)  # Unknown names: the list of valid ones.
    return self._traits[name]

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

  def make(self, name: str, **options):
    """The one accessor: variant `name` ready to call, its static options bound (`bind`)
    and checked by its record's `check` trait (fn(**options) that raises on bad values)
    when the registry's traits have one. Unknown names and options fail listing the
    valid ones."""
    fn = self.bind(name, **options)
    check = getattr(self.traits(name), "check", None)
    if check is not None:
      check(**options)
    return fn

  def names(self) -> list[str]:
    return sorted(self._items)

  def __contains__(self, name: object) -> bool:
    return name in self._items

  def __iter__(self) -> Iterator[str]:
    return iter(self.names())

  def __len__(self) -> int:
    return len(self._items)


def _same_definition(a, b) -> bool:
  """Whether b is a re-run of a's definition (a config file or notebook cell executed
  again defines a new class of the same name in the same module): it replaces a."""
  name = lambda x: (getattr(x, "__module__", None), getattr(x, "__qualname__", None))
  return name(a) == name(b) and name(a) != (None, None)
