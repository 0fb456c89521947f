"""What a test needs from the machine, and what this run expects to be missing.

    needs_namespaces = pytest.mark.needs("namespaces", sandbox.namespaces_unavailable())
    needs.require("cgroup", "" if cgroup.available() else "no control group")

A mark's second argument (or `require`'s) says why the thing is missing, "" when it is
there. Where it is missing, conftest's `pytest_runtest_setup` decides:

- GRPO_JAX_EXPECT_MISSING names it (comma-separated, from KINDS), or the machine is not
  Linux (the sandbox isolates only there): the test skips, its reason naming both;
- otherwise the test FAILS, saying what is missing and how to say that it is expected. A
  Linux runner that lost user namespaces or its control groups would otherwise pass the
  sandbox's containment tests by skipping them, testing nothing.

`.ci/run` expects nothing missing.
"""

import os
import sys

import pytest

ENV = "GRPO_JAX_EXPECT_MISSING"
KINDS = {
  "namespaces": "user, PID, network and mount namespaces (the sandbox's isolation)",
  "cgroup": "a writable control group for the sandbox's runs (cgroup v2, or v1 memory + pids)",
  "cgroup_v1_memory": "a writable cgroup v1 memory hierarchy as root (the OOM placement tests)",
}


def expected_missing() -> set[str]:
  """The kinds GRPO_JAX_EXPECT_MISSING names; a name not in KINDS is an error."""
  names = {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}
  unknown = sorted(names - set(KINDS))
  if unknown:
    raise pytest.UsageError(f"{ENV}={os.environ[ENV]!r}: unknown {unknown}; known: {sorted(KINDS)}")
  return names


def require(what: str, missing: str) -> None:
  """Returns when `missing` is "" (it is there); skips when the run expects it missing or
  the machine is not Linux; fails otherwise."""
  if what not in KINDS:
    raise ValueError(f"needs {what!r}: unknown; known: {sorted(KINDS)}")
  if not missing:
    return
  if not sys.platform.startswith("linux"):
    pytest.skip(f"needs {what} ({missing}): the sandbox isolates on Linux only")
  if what in expected_missing():
    pytest.skip(f"needs {what} ({missing}), missing as {ENV} expects")
  pytest.fail(
    f"needs {what}, {KINDS[what]}, and this Linux machine has none: {missing}. Skipped, "
    f"the test would check nothing; if this machine is meant to lack it, set {ENV}={what}.",
    pytrace=False,
  )
