"""What the sandbox's new root shows: bound read-only paths, and the directories hidden
inside them.

Bound (read-only): the system directories /usr /bin /sbin /lib /lib32 /lib64 /libx32 that
exist (symlinks among them are recreated as symlinks), /etc/ld.so.cache, /dev/null, zero,
random and urandom, and the Python installation: ``sys.base_prefix``,
``sys.base_exec_prefix`` and the interpreter's directory, wherever they are (under /tmp
too: such a path is bound inside the sandbox's own /tmp).

Hidden (an empty read-only tmpfs over each): every directory Python installs packages
into, so no installed package and no package's data is readable, whatever the install
layout: the site-packages and dist-packages directories of every bound path (found by
name, lib*/python*/{site,dist}-packages, local/lib*/..., lib/python3/dist-packages),
``site.getsitepackages()``, ``sysconfig``'s purelib/platlib, every ``sys.path`` entry
outside the standard library, and grpo_jax's own directory. The code gets the standard
library only (it runs with ``python -I -S`` anyway).

`visible(path)` says whether a path would be readable inside the sandbox: the code task
refuses to run when its problems file would be (tests/verifiers/test_sandbox.py installs the
package into a separate base prefix under /tmp to check that it is not).
"""

from __future__ import annotations

import functools
import glob
import os
import site
import sys
import sysconfig

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = ("/etc/ld.so.cache", "/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # grpo_jax/
_PACKAGE_DIR_PATTERNS = (
  "lib*/python*/site-packages",
  "lib*/python*/dist-packages",
  "local/lib*/python*/site-packages",
  "local/lib*/python*/dist-packages",
  "lib/python3/dist-packages",
)


def python() -> str:
  """The interpreter the sandbox starts (its real path)."""
  if not sys.executable:
    raise RuntimeError("sandbox: sys.executable is empty; cannot start a Python child.")
  return os.path.realpath(sys.executable)


def _under(path: str, root: str) -> bool:
  return path == root or path.startswith(root.rstrip("/") + "/")


@functools.cache
def layout() -> tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, str], ...], tuple[str, ...]]:
  """(binds (path, is_dir), symlinks (path, target), masks (directories to hide)) of the
  sandbox's new root. Every path is real (no symlink in it)."""
  dirs = [p for p in SYSTEM_DIRS if os.path.lexists(p)]
  links = tuple((p, os.readlink(p)) for p in dirs if os.path.islink(p))
  real = [p for p in dirs if not os.path.islink(p)]
  for prefix in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python())):
    path = os.path.realpath(prefix)
    if not any(_under(path, d) for d in real):
      real = [d for d in real if not _under(d, path)] + [path]
  bound_dirs = tuple(dict.fromkeys(real))
  binds = tuple((p, True) for p in bound_dirs)
  binds += tuple((p, False) for p in SYSTEM_FILES if os.path.exists(p))
  return binds, links, _masks(bound_dirs)


def _stdlib() -> set[str]:
  paths = sysconfig.get_paths()
  std = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib") if k in paths}
  return std | {os.path.join(p, "lib-dynload") for p in std}


def _package_dirs(bound: tuple[str, ...]) -> set[str]:
  """Every directory packages may be installed into, or imported from, under `bound`."""
  found = set()
  for root in bound:
    for pattern in _PACKAGE_DIR_PATTERNS:
      found.update(glob.glob(os.path.join(root, pattern)))
  paths = sysconfig.get_paths()
  found.update(paths[k] for k in ("purelib", "platlib") if k in paths)
  with_site = getattr(site, "getsitepackages", lambda: [])()
  found.update(with_site)
  std = _stdlib()
  for entry in sys.path:
    real = os.path.realpath(entry or ".")
    if os.path.isdir(real) and not any(_under(real, s) or _under(s, real) for s in std):
      found.add(real)
  found.add(_PACKAGE)
  return {os.path.realpath(p) for p in found if os.path.isdir(p)}


def _masks(bound: tuple[str, ...]) -> tuple[str, ...]:
  """The package directories that the binds would show, outermost only."""
  inside = sorted(p for p in _package_dirs(bound) if any(_under(p, b) for b in bound))
  outer = []
  for p in inside:
    if not any(_under(p, o) for o in outer):
      outer.append(p)
  return tuple(outer)


def visible(path: str) -> bool:
  """Whether `path` would be readable by the code in the sandbox (namespaces)."""
  real = os.path.realpath(path)
  binds, _, masks = layout()
  shown = any(_under(real, p) if is_dir else real == p for p, is_dir in binds)
  return shown and not any(_under(real, m) for m in masks)
