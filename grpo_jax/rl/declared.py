"""Array hyperparameters that a variant declares where it is registered.

    @advantages.REGISTRY.register("scaled", hyper={"s": declared.Hyper(1.0, low=0.0)})
    @losses.REGISTRY.register("capped", hyper={"cap": declared.Hyper(2.0, low=1.0)})

A declaration is all a new hyperparameter needs: the config gets a key with its default
(config.rl.<section>.<name>), the value is checked against [low, high] when the config is
built, and the variant receives it as a float32 array (`hyper.extra[<name>]`), so a
controller or a schedule can move it without recompiling. Advantage estimators declare
into config.rl.advantage_hyper, policy losses into config.rl.loss_hyper.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Hyper:
  """One declared hyperparameter: its default, its allowed range and what it means."""

  default: float
  low: float = -float("inf")
  high: float = float("inf")
  doc: str = ""

  def check(self, where: str, value) -> float:
    """`value` as a float; ValueError naming `where` (the config key) and the range."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not self.low <= value <= self.high:
      raise ValueError(
        f"{where}={value!r}: must be a number in [{self.low:g}, {self.high:g}] "
        f"({self.doc or 'declared by its variant'})."
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


def values(registry, name: str, given: dict, *, section: str) -> dict[str, float]:
  """The values of variant `name`'s declared hyperparameters: `given`'s (config section
  `section`, checked against each declaration), else the defaults. A given key that no
  variant of the registry declares is an error that lists the declared ones."""
  known = collect(registry)
  unknown = sorted(set(given) - set(known))
  if unknown:
    raise ValueError(
      f"{section}: {unknown} are declared by no {registry.kind}; declared: "
      f"{sorted(known) or 'none'}."
    )
  own = registry.traits(name).hyper
  return {k: h.check(f"{section}.{k}", given.get(k, h.default)) for k, h in own.items()}
