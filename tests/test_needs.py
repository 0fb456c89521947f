"""tests/needs.py: a missing machine feature skips only where the run expects it."""

import needs
import pytest


def test_what_is_there_runs(monkeypatch):
  monkeypatch.delenv(needs.ENV, raising=False)
  assert needs.require("namespaces", "") is None


def test_missing_on_linux_fails_naming_it_and_the_variable(monkeypatch):
  monkeypatch.delenv(needs.ENV, raising=False)
  monkeypatch.setattr(needs.sys, "platform", "linux")
  with pytest.raises(pytest.fail.Exception) as e:
    needs.require("namespaces", "unshare: Operation not permitted")
  message = str(e.value)
  assert "needs namespaces" in message and "unshare: Operation not permitted" in message
  assert "GRPO_JAX_EXPECT_MISSING=namespaces" in message


def test_missing_as_expected_skips(monkeypatch):
  monkeypatch.setenv(needs.ENV, "cgroup, namespaces")
  monkeypatch.setattr(needs.sys, "platform", "linux")
  with pytest.raises(pytest.skip.Exception, match="missing as GRPO_JAX_EXPECT_MISSING expects"):
    needs.require("namespaces", "off")
  with pytest.raises(pytest.fail.Exception):  # Expecting one kind excuses no other.
    needs.require("cgroup_v1_memory", "not root")


def test_off_linux_skips(monkeypatch):
  monkeypatch.delenv(needs.ENV, raising=False)
  monkeypatch.setattr(needs.sys, "platform", "darwin")
  with pytest.raises(pytest.skip.Exception, match="Linux only"):
    needs.require("namespaces", "no unshare")


def test_an_unknown_kind_is_an_error(monkeypatch):
  monkeypatch.setenv(needs.ENV, "namespace")
  with pytest.raises(pytest.UsageError, match=r"unknown \['namespace'\]; known"):
    needs.require("namespaces", "off")
  with pytest.raises(ValueError, match="needs 'gpu': unknown"):
    needs.require("gpu", "")


@pytest.mark.needs("cgroup", "")
def test_the_mark_runs_the_test_where_the_feature_is_there():
  pass
