"""The config edge: ml-collections ConfigDicts become validated frozen dataclasses once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def to_dict(d: Any) -> dict:
  """A plain dict from a dict or ConfigDict (nested ConfigDicts included)."""
  return d.to_dict() if hasattr(d, "to_dict") else dict(d)


def from_dict(cls: type[T], d: Mapping[str, Any] | Any, *, where: str = "") -> T:
  """cls(**d), with unknown keys reported by name and the allowed keys listed.

  Tuple-typed fields accept lists (ConfigDicts store sequences as given).
  """
  d = to_dict(d)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  unknown = sorted(set(d) - set(fields))
  prefix = f"{where}: " if where else ""
  if unknown:
    raise ValueError(f"{prefix}unknown {cls.__name__} keys {unknown}; allowed: {sorted(fields)}.")
  kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
  try:
    return cls(**kwargs)
  except TypeError as e:  # Missing required keys.
    raise ValueError(f"{prefix}{cls.__name__}: {e}") from None
