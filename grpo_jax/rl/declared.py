"""Array hyperparameters that a variant declares where it is registered.

    @advantages.REGISTRY.register("scaled", hyper={"s": declared.Hyper(1.0, low=0.0)})
    @losses.REGISTRY.register("capped", hyper={"cap": declared.Hyper(2.0, low=1.0)})

A declaration is all a hyperparameter needs, for a shipped variant and a user's alike: the
config gets a key with its default (config.rl.<section>.<name>), the value is checked when
the config is built, and the variant reads it as a float32 array, `hyper.<name>` (or
`hyper["<name>"]`), so a controller or a schedule can move it without recompiling.
Advantage estimators declare into config.rl.advantage_hyper, policy losses into
config.rl.loss_hyper. The arrays a variant receives (`Values`) hold every hyperparameter
its registry declares, so an estimator that calls another (distill's base) hands it on.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Mapping

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Hyper:
  """One declared hyperparameter: its default, its allowed range and what it means.

  valid: a further condition on a value in [low, high] (an open end, a value that means
  "off"), and `rule` says it in words for the error message; None: the range alone."""

  default: float
  low: float = -float("inf")
  high: float = float("inf")
  doc: str = ""
  valid: Callable[[float], bool] | None = None
  rule: str = ""

  def check(self, where: str, value) -> float:
    """`value` as a float; ValueError naming `where` (the config key) and the range."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and self.low <= value <= self.high
    if ok and self.valid is not None:
      ok = bool(self.valid(value))
    if not ok:
      allowed = self.rule or f"a number in [{self.low:g}, {self.high:g}]"
      raise ValueError(
        f"{where}={value!r}: must be {allowed} ({self.doc or 'declared by its variant'})."
      )
    return float(value)


def collect(registry) -> dict[str, Hyper]:
  """Every declaration of a registry's variants (their traits' `hyper`), by name. A name
  means one thing: two variants may share it only with the same declaration."""
  out: dict[str, Hyper] = {}
  for name in registry.names():
    for key, h in registry.traits(name).hyper.items():
      if key in out and out[key] != h:
        raise ValueError(f"{registry.kind} hyperparameter {key!r} is declared twice, differently.")
      out[key] = h
  return out


def values(registry, given: Mapping, *, section: str) -> dict[str, float]:
  """Every hyperparameter the registry's variants declare: `given`'s value (config section
  `section`, checked against its declaration), else the default. A given key that no
  variant declares is an error that lists the declared ones."""
  known = collect(registry)
  unknown = sorted(set(given) - set(known))
  if unknown:
    raise ValueError(
      f"{section}: {unknown} are declared by no {registry.kind}; declared: "
      f"{sorted(known) or 'none'}."
    )
  return {k: h.check(f"{section}.{k}", given.get(k, h.default)) for k, h in known.items()}


def arrays(checked: Mapping[str, float]) -> dict[str, jax.Array]:
  """{name: float32 scalar}: the values as the jitted functions carry them (a plain dict,
  so a checkpoint stores each at prep_hyper/<section>/<name>)."""
  return {k: jnp.asarray(v, jnp.float32) for k, v in checked.items()}


class Values(Mapping):
  """The arrays a variant reads: `hyper.eps` or `hyper["eps"]`. A pytree (the names are
  static), so it crosses jit, vmap and scan like the dict it wraps."""

  def __init__(self, arrays_: Mapping):
    object.__setattr__(self, "_arrays", dict(arrays_))

  def __getitem__(self, name: str):
    try:
      return self._arrays[name]
    except KeyError:
      raise KeyError(self._missing(name)) from None

  def __getattr__(self, name: str):
    if name.startswith("_"):
      raise AttributeError(name)
    try:
      return self._arrays[name]
    except KeyError:
      raise AttributeError(self._missing(name)) from None

  def __setattr__(self, name, value):
    raise AttributeError(f"hyperparameters are read-only; use hyper.replace({name}=...).")

  def __iter__(self) -> Iterator[str]:
    return iter(self._arrays)

  def __len__(self) -> int:
    return len(self._arrays)

  def __repr__(self) -> str:
    return f"Values({self._arrays!r})"

  def _missing(self, name: str) -> str:
    return (
      f"no hyperparameter {name!r} is declared; declared: {sorted(self._arrays) or 'none'} "
      "(declare it where the variant is registered: hyper={name: declared.Hyper(...)})."
    )

  def replace(self, **changes) -> Values:
    """A copy with `changes` (names already declared) set."""
    for name in changes:
      self[name]  # noqa: B018 -- KeyError naming the declared ones.
    return Values({**self._arrays, **changes})

  @property
  def extra(self) -> Values:
    """0.2's `hyper.extra[name]`: the Values themselves now (`hyper[name]`), with a
    DeprecationWarning; goes with 0.1's import paths (`moved.REMOVED_IN`)."""
    warnings.warn(
      "hyper.extra[name] is deprecated: a variant reads its hyperparameters as hyper[name] "
      "or hyper.name; .extra goes in 0.3.",
      DeprecationWarning,
      stacklevel=2,
    )
    return self


jax.tree_util.register_pytree_with_keys(
  Values,
  lambda v: (
    tuple((jax.tree_util.DictKey(k), v._arrays[k]) for k in sorted(v._arrays)),
    tuple(sorted(v._arrays)),
  ),
  lambda names, leaves: Values(dict(zip(names, leaves, strict=True))),
  flatten_func=lambda v: (tuple(v._arrays[k] for k in sorted(v._arrays)), tuple(sorted(v._arrays))),
)
