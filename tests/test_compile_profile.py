"""tests/compile_profile.py: the suite's JAX seconds per test and per child process."""

import json

import compile_profile
import subproc


def test_a_child_writes_its_tracing_and_compiling_seconds(tmp_path, monkeypatch):
  monkeypatch.setenv(compile_profile.ENV, str(tmp_path / "prof"))
  script = tmp_path / "child.py"
  script.write_text("import jax\nprint(jax.jit(lambda x: x * 2 + 1)(3.0))\n")
  assert subproc.run([script]).stdout.strip() == "7.0"
  (line,) = [json.loads(x) for p in (tmp_path / "prof").glob("*.jsonl") for x in p.open()]
  assert line["name"] == "child:child.py"
  assert line["trace_s"] > 0 and line["lower_s"] > 0 and line["compile_s"] > 0
  assert line.get("hits", 0) + line.get("misses", 0) >= 1  # The persistent cache was asked.


def test_off_by_default_it_writes_nothing(tmp_path, monkeypatch):
  monkeypatch.delenv(compile_profile.ENV, raising=False)
  assert not compile_profile.install()
  compile_profile.flush("x")
  assert "profile_site" not in subproc.child_env()["PYTHONPATH"]
