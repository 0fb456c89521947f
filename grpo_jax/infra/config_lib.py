"""The config edge: ml-collections ConfigDicts become validated frozen dataclasses once."""

from __future__ import annotations

import copy
import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

# Keys that moved, old -> new (dotted from the config's top level): the hyperparameters
# that were RLConfig fields and are now declared by the variants that read them
# (`rl.declared`). The old spelling still works in a config file, on the command line
# and in a recorded run's config.json, with a FutureWarning naming the new key, until the
# version in MOVED_KEYS_REMOVED_IN (a test fails once the package reaches it).
MOVED_KEYS = {
  "rl.adv_eps": "rl.advantage_hyper.eps",
  "rl.gamma": "rl.advantage_hyper.gamma",
  "rl.lambda_s": "rl.advantage_hyper.lambda_s",
  "rl.lambda_f": "rl.advantage_hyper.lambda_f",
  "rl.std_power": "rl.advantage_hyper.std_power",
  "rl.focal_gamma": "rl.advantage_hyper.focal_gamma",
  "rl.ibpo_lambda": "rl.advantage_hyper.ibpo_lambda",
  "rl.ibpo_tau": "rl.advantage_hyper.ibpo_tau",
  "rl.ibpo_is_cap": "rl.advantage_hyper.ibpo_is_cap",
  "rl.eps_low": "rl.loss_hyper.eps_low",
  "rl.eps_high": "rl.loss_hyper.eps_high",
  "rl.dual_clip_c": "rl.loss_hyper.dual_clip_c",
  "rl.prob_threshold": "rl.mask_hyper.prob_threshold",
  "rl.entropy_threshold": "rl.mask_hyper.entropy_threshold",
  "rl.top_k": "rl.mask_hyper.top_k",
  "rl.is_lower": "rl.importance_hyper.is_lower",
  "rl.is_upper": "rl.importance_hyper.is_upper",
}
MOVED_KEYS_REMOVED_IN = (0, 3)
# Defaults renewed together with a key that came in with them: {new key: {key: (old default,
# new default)}}. A config without the new key was written before it; where it holds an
# old default, `upgrade` gives it the new one, which means the same there.
RENEWED_DEFAULTS = {
  # The `expert` mesh axis: absent, its size is 1, and these rows split as the old ones did.
  "mesh.expert": {
    "mesh.rules.expert": ("tensor", ("expert", "tensor")),
    "mesh.rules.activation_batch": (("data", "fsdp"), ("data", "fsdp", "expert")),
  },
}


class ConfigError(ValueError):
  """A config value is wrong (its message names the key, the value and what is allowed):
  the user's error, reported as one line by the command line, never a traceback."""


def moved_message(old: str) -> str:
  """The one-line deprecation of MOVED_KEYS[old]."""
  return (
    f"config.{old} is deprecated: use config.{MOVED_KEYS[old]} (the hyperparameter is "
    "declared by the variants that read it); the old key stops working in 0.3."
  )


def upgrade(d: Mapping, *, warn: bool = True, prefix: str = "") -> dict:
  """A config as a nested dict (a ConfigDict's `to_dict`, or a section of one at `prefix`,
  e.g. "rl."; config.json's layout alike) with every MOVED_KEYS key at its new place,
  each announced with a FutureWarning when `warn` (a recorded run's config is upgraded
  silently). An old key is only there because something set it, so its value replaces
  the new key's (which a full config always has, at its default). A whole config written
  before a RENEWED_DEFAULTS key existed gets that key's renewed defaults where it holds
  the old ones."""
  out = copy.deepcopy(to_dict(d))
  for old, new in MOVED_KEYS.items():
    if not old.startswith(prefix):
      continue
    node, leaf = _parent(out, old.removeprefix(prefix))
    if node is None or leaf not in node:
      continue
    value = node.pop(leaf)
    *new_parents, new_leaf = new.removeprefix(prefix).split(".")
    target = out
    for p in new_parents:
      target = target.setdefault(p, {})
    target[new_leaf] = value
    if warn:
      warnings.warn(moved_message(old), FutureWarning, stacklevel=2)
  if not prefix:
    for key, renewed in RENEWED_DEFAULTS.items():
      if not _has(out, key):
        for k, (was, now) in renewed.items():
          _renew(out, k, was, now)
  return out


def _parent(d: dict, key: str) -> tuple[dict | None, str]:
  """(the nested dict that holds the dotted key's last part, or None; that part)."""
  *parents, leaf = key.split(".")
  for p in parents:
    d = d.get(p) if isinstance(d, dict) else None
  return (d if isinstance(d, dict) else None), leaf


def _has(d: dict, key: str) -> bool:
  """Whether the nested dict d holds the dotted key."""
  node, leaf = _parent(d, key)
  return node is not None and leaf in node


def _renew(d: dict, key: str, was, now) -> None:
  """d's dotted key set to `now` where it holds `was` (a list, as config.json holds a
  tuple, counts as its tuple and gets `now` as a list)."""
  d, leaf = _parent(d, key)
  if d is None or leaf not in d:
    return
  listed = isinstance(d[leaf], list)
  if (tuple(d[leaf]) if listed else d[leaf]) == was:
    d[leaf] = list(now) if listed and isinstance(now, tuple) else now


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


def load(spec: str, **overrides):
  """The ConfigDict of a config file, as `--config=path.py:variant` would give it.

      config = config_lib.load("configs/arithmetic.py:tiny", iterations=50)

  `overrides` set top-level keys (use `config.rl.advantage = ...` for nested ones). The
  returned ConfigDict is locked, so a misspelt key fails as it does on the command line.
  A file that is missing, has no get_config, or fails to run (an unknown variant raises
  in get_config) is a ConfigError naming the file and what went wrong.
  """
  path, _, arg = spec.partition(":")

  def make():
    loaded = _exec_config_file(path, spec=spec)
    if not callable(getattr(loaded, "get_config", None)):
      raise ConfigError(f"{path} has no get_config(); a config file defines get_config(arg).")
    return loaded.get_config(arg) if arg else loaded.get_config()

  config = _config_errors(make, path=path, spec=spec)
  config.lock()
  for key, value in overrides.items():
    config[key] = value
  return config


def module(path: str):
  """A config file's module, run as `load` runs it (its constants: configs/ibpo.py's TRIE,
  ...), for experiments that read more than get_config. Errors as `load`'s."""
  return _config_errors(lambda: _exec_config_file(path, spec=path), path=path, spec=path)


def _exec_config_file(path: str, *, spec: str):
  import importlib.util
  import pathlib
  import sys

  file = pathlib.Path(path)
  if not file.is_file():
    shipped = sorted(p.name for p in file.parent.glob("*.py")) if file.parent.is_dir() else []
    listed = f"; {file.parent}/ holds {', '.join(shipped)}" if shipped else ""
    raise ConfigError(f"Config file {path!r} not found (--config=FILE.py[:VARIANT]){listed}.")
  module_spec = importlib.util.spec_from_file_location(f"_grpo_jax_config_{file.stem}", file)
  if module_spec is None or file.suffix != ".py":
    raise ConfigError(f"--config={spec}: {path} is not a Python file (--config=FILE.py[:VARIANT]).")
  loaded = importlib.util.module_from_spec(module_spec)
  # In sys.modules, as an import would put it: a task class the file defines then pickles
  # by reference, and reward workers import it from the file (`rewards`).
  sys.modules[module_spec.name] = loaded
  module_spec.loader.exec_module(loaded)
  return loaded


def _config_errors(fn, *, path: str, spec: str):
  """fn(), with the config file's own errors as one ConfigError line naming the file (a
  bad variant's ValueError as its message; anything else with its type and line)."""
  import pathlib
  import traceback

  try:
    return fn()
  except ConfigError:
    raise
  except Exception as e:  # The config file's own error (a bad variant raises ValueError).
    frames = traceback.extract_tb(e.__traceback__)
    file = pathlib.Path(path).resolve()
    lines = [f.lineno for f in frames if pathlib.Path(f.filename).resolve() == file]
    at = f" ({path}, line {lines[-1]})" if lines and not isinstance(e, ValueError) else ""
    what = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
    raise ConfigError(f"--config={spec}: {what}{at}") from e
