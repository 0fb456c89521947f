"""Name -> object registries, so configs pick variants by string.

A registry may declare a traits record (a frozen dataclass with defaults): what the
trainer asks of a variant (e.g. an estimator's need of π_old), declared beside it at
registration, `@REGISTRY.register("name", needs_old_logp=True)`, and read with
`REGISTRY.traits("name")`, so that no caller compares variant names. Every caller gets a
variant with `REGISTRY.make(name, **options)`.

A variant may be registered outside the package (a user's module, or the --config file).
A run records where (`outside_variants`, config.json's "variants_from"), so that a command
that rebuilds the run in a fresh process (`grpo-jax eval --workdir=RUN`) imports those
modules first (`import_origins`) and finds the variant.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pathlib
import sys
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


_ALL: list[Registry] = []  # Every registry, as its module creates it.
_CHANGES = [0]  # Registrations so far (`changes`).


def changes() -> int:
  """How many registrations every registry has taken (a new name, or a variant replaced
  by a re-run of its definition, `Registry.register`: a notebook cell or config file
  executed again). What is compiled once and kept across runs (`sharding.jit`,
  `steps.functions`) keys on it: a trace looked its variants up by name, so after any
  change a run is traced afresh, not served from before."""
  return _CHANGES[0]


class Registry(Generic[T]):
  """A named table of variants; unknown names fail with the list of valid ones."""

  def __init__(self, kind: str, *, traits: type | None = None):
    self.kind = kind
    self._items: dict[str, T] = {}
    self._traits_type = traits
    self._traits: dict[str, Any] = {}
    _ALL.append(self)

  def register(self, name: str, **traits) -> Callable[[T], T]:
    """Decorator: adds `obj` under `name`, with its traits (the registry's traits record;
    an unknown trait fails here, at import)."""
    if traits and self._traits_type is None:
      raise ValueError(f"{self.kind} registry declares no traits; got {sorted(traits)}.")
    record = self._traits_type(**traits) if self._traits_type is not None else None

    def add(obj: T) -> T:
      if name in self._items and not _same_definition(self._items[name], obj):
        raise ValueError(f"{self.kind} {name!r} is already registered.")
      _CHANGES[0] += 1
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


# ----------------------------------------------------------------------------
# Where variants come from.
# ----------------------------------------------------------------------------


def origin(obj) -> tuple[str, str | None]:
  """(module, file) where `obj` (a function, class or instance) was defined; the file is
  None where the module has none (a notebook's or a REPL's __main__)."""
  module = getattr(obj, "__module__", None) or type(obj).__module__
  return module, getattr(sys.modules.get(module), "__file__", None)


def outside_variants(package: str = "grpo_jax", *, used=None) -> list[dict]:
  """[{"module", "file", "variants": ["<kind>:<name>", ...]}] of the variants registered
  from outside `package`, one entry per module, sorted; with `used` (a set of names), only
  the variants whose names are in it (a config's string values: the ones the run picks)."""
  found: dict[tuple[str, str | None], list[str]] = {}
  for reg in _ALL:
    for name, obj in reg._items.items():
      module, path = origin(obj)
      outside = module != package and not module.startswith(package + ".")
      if outside and (used is None or name in used):
        found.setdefault((module, path), []).append(f"{reg.kind}:{name}")
  return [
    {"module": m, "file": f, "variants": sorted(v)} for (m, f), v in sorted(found.items(), key=str)
  ]


def _registered(variants) -> bool:
  """Whether every "<kind>:<name>" of `variants` is in its registry now."""
  kinds = {reg.kind: reg for reg in _ALL}
  for v in variants:
    kind, _, name = v.rpartition(":")
    if kind not in kinds or name not in kinds[kind]:
      return False
  return True


def import_origin(module: str, path: str | None, *, variants=()) -> None:
  """Imports `module`, unless `variants` ("<kind>:<name>") are all registered already (the
  process that registered them, or a --config file that does): by name when that
  registers them, else from `path` (a config file loaded by path; a script that ran as
  __main__ is loaded under its file's stem, so its main guard stays shut). Raises
  ImportError saying what to do when neither works."""
  if variants and _registered(variants):
    return
  name = pathlib.Path(path).stem if module == "__main__" and path else module
  if module != "__main__":
    try:
      importlib.import_module(name)
      if not variants or _registered(variants):
        return
    except ImportError:
      pass
  if not path or not pathlib.Path(path).is_file():
    where = f"file {path}, not found" if path else "no file: a notebook or an interactive session"
    raise ImportError(
      f"module {module!r} ({where}): put the registration in an importable module and import "
      "it from the --config file, or pass that --config"
    )
  name = name if name not in sys.modules else f"_grpo_jax_variants_{pathlib.Path(path).stem}"
  spec = importlib.util.spec_from_file_location(name, path)
  loaded = importlib.util.module_from_spec(spec)
  sys.modules[name] = loaded
  try:
    spec.loader.exec_module(loaded)
  except BaseException:
    del sys.modules[name]  # No half-made module for a retry to take as imported.
    raise


def import_origins(recorded: list[dict]) -> None:
  """`import_origin` for each entry of a run's "variants_from" (`outside_variants`)."""
  for entry in recorded:
    try:
      import_origin(entry["module"], entry.get("file"), variants=entry.get("variants", ()))
    except ImportError as e:
      raise ImportError(
        f"the run's variants {', '.join(entry.get('variants', []))} were registered by {e}."
      ) from e
