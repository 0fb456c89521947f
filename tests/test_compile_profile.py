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


# A child that works 0.3 CPU-s, sleeps 0.3 s and waits on a grandchild that works 0.3 CPU-s,
# between two lines of its own profile.
WORK = """
import subprocess, sys, time
import compile_profile
compile_profile.flush("before")
t = time.process_time()
while time.process_time() - t < 0.3:
  pass
time.sleep(0.3)
spin = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.3: pass"
subprocess.run([sys.executable, "-c", spin], check=True, env={})  # No profile of its own.
compile_profile.flush("work")
"""


def test_a_line_has_its_wall_own_and_childrens_cpu_seconds_and_the_report_its_wait(
  tmp_path, monkeypatch, capsys
):
  monkeypatch.setenv(compile_profile.ENV, str(tmp_path / "prof"))
  script = tmp_path / "work.py"
  script.write_text(WORK)
  subproc.run([script])
  lines = [json.loads(x) for p in (tmp_path / "prof").glob("*.jsonl") for x in p.open()]
  (work,) = [x for x in lines if x["name"] == "work"]
  assert work["cpu_s"] >= 0.3 and work["children_cpu_s"] >= 0.3
  assert work["wall_s"] - work["cpu_s"] - work["children_cpu_s"] >= 0.25  # The sleep.
  assert work["wall_s"] < 30
  compile_profile.report(str(tmp_path / "prof"))
  out = capsys.readouterr().out
  assert out.splitlines()[1].startswith("Test processes: wall_s=") and "Waiting (wall" in out
  assert "  work  wall_s=" in out
