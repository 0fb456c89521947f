"""The config edge: ml-collections ConfigDicts become validated frozen dataclasses once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
  """A config value is wrong (its message names the key, the value and what is allowed):
  the user's error, reported as one line by the command line, never a traceback."""


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
