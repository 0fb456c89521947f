"""The manual (README.md and the documentation site's pages, `manual`) as a new user
follows it: every command it shows parses and its config builds, it names only what the
repository has, the notebook snippet runs as a script, and the "Write your own task" file
and command train as written.

The two runs are the manual's own text with smaller sizes appended (one iteration, no
warm start): what a newcomer copies is what runs here."""

import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
from absl import flags

from grpo_jax import cli, main  # noqa: F401 -- main defines the command's flags.
from grpo_jax.envs import openenv_env
from grpo_jax.trainer import build
from tests import manual, subproc

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = manual.text()  # Every page: README.md, then docs/.
GENERATED = re.compile(r"<!-- reproductions:start.*?<!-- reproductions:end -->", re.S)
# A run of the README's configs in seconds: appended to what the README says.
SMALL = dict(
  iterations=1, warmstart_steps=0, prompts_per_step=8, eval_every=1, eval_size=8,
  eval_samples=0, checkpoint_every=1,
)  # fmt: skip


def _blocks(fence: str) -> list[str]:
  return re.findall(rf"```{fence}\n(.*?)```", README, flags=re.S)


def readme_commands() -> list[str]:
  """Every `grpo-jax ...` command of the README's shell blocks, continuations joined and
  comments dropped (inside a gcloud --command='...', the part from grpo-jax on)."""
  out = []
  for block in _blocks("bash") + _blocks("sh"):
    for line in block.replace("\\\n", " ").splitlines():
      if line.lstrip().startswith("#"):
        continue
      line = line.split(" # ")[0].split("   #")[0]
      for part in re.split(r"&&|;", line):
        m = re.search(r"(?:^|\s)(grpo-jax\s.*)", part)
        if m:
          out.append(m.group(1).strip().rstrip("'"))
  return out


def test_the_readme_lists_its_commands():
  commands = readme_commands()
  assert "grpo-jax --config=configs/arithmetic.py:tiny --workdir=/tmp/grpo_demo" in commands
  assert any(c.startswith("grpo-jax plan") for c in commands)
  assert any(c.startswith("grpo-jax hf-check") for c in commands)
  assert "grpo-jax --config=my_task.py --workdir=/tmp/my_task" in commands


def _devices(config_dict) -> int:
  """Devices for a config's mesh: its sizes' product, twice the fixed ones with a -1."""
  sizes = (config_dict.mesh.data, config_dict.mesh.fsdp, config_dict.mesh.tensor)
  known = abs(sizes[0] * sizes[1] * sizes[2])  # One size may be -1 (the rest).
  return 2 * known if -1 in sizes and known > 1 else known


@pytest.mark.parametrize(
  "command", [c for c in readme_commands() if "my_task.py" not in c], ids=lambda c: c[9:70]
)
def test_every_readme_command_parses_and_its_config_builds(command, monkeypatch):
  """Parsed as the command line parses it; then the config is built (validated) on the
  device count its mesh needs, unless it names a checkpoint this machine lacks (config.hf_dir,
  or a distillation teacher: config.teacher.path); an OpenEnv server is not asked."""
  monkeypatch.chdir(ROOT)
  try:
    inv = cli.invocation(shlex.split(command))
    devices = flags.FLAGS.devices
  finally:
    flags.FLAGS.unparse_flags()
  if inv.config is None:  # hf-check: its checkpoint is the user's.
    return
  hf_dir, teacher = inv.config.hf_dir, inv.config.teacher.path
  if any(p and not pathlib.Path(p).expanduser().exists() for p in (hf_dir, teacher)):
    return  # The user's checkpoint: the plan test and the config tests build the rest.
  if inv.config.env.name == "openenv":  # The user's server (tests/envs/test_openenv.py serves one).
    monkeypatch.setattr(openenv_env.OpenEnv, "check", lambda self: None)
  n = devices or _devices(inv.config)
  setup = build.plan_setup(inv.config, n_devices=n) if inv.command == "plan" else None
  setup = setup or build.build(inv.config, n_devices=n)
  assert setup.loop.iterations >= 1


def test_the_readme_names_only_what_the_repository_has():
  """No page names a path the repository lacks, an internal issue number or the research
  notes (the claims table, generated from experiments/, is left out)."""
  for page in manual.pages():
    text = GENERATED.sub("", page.read_text())
    where = page.relative_to(ROOT)
    assert "RESEARCH.md" not in text and "REPO_URL" not in text, where
    assert not re.findall(r"\bissue \d+", text, flags=re.I), where
    paths = set(
      re.findall(
        r"(?<![\w/.])((?:grpo_jax|configs|experiments|tests|colabs|docs)/[\w./-]*\w)", text
      )
    )
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"{where} names paths the repository lacks: {missing}"


def _run_python(script: pathlib.Path, *args, cwd) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, str(script), *args],
    cwd=cwd,
    env=subproc.child_env(),
    capture_output=True,
    text=True,
    timeout=600,
  )


def test_the_notebook_snippet_runs_as_a_script_with_reward_workers(tmp_path):
  """Pasted into a file without `if __name__ == "__main__":`, the snippet trains with its
  reward workers (they never re-run the script) and writes its samples."""
  (block,) = [b for b in _blocks("py") if "The same run from a notebook" in b]
  small = ", ".join(f"{k}={v}" for k, v in SMALL.items())
  code = block.replace("iterations=50", small).replace('"/tmp/run"', repr(str(tmp_path / "run")))
  assert code != block and "reward_workers" not in code  # The default: 2 workers.
  script = tmp_path / "snippet.py"
  script.write_text(code.replace("from grpo_jax", "print('top level')\nfrom grpo_jax", 1))
  r = _run_python(script, cwd=ROOT)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.count("top level") == 1  # The workers did not run the script again.
  assert "could not start" not in r.stderr, r.stderr[-2000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["iterations_done"] == 1
  samples = [json.loads(x) for x in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
  assert {s["iteration"] for s in samples} == {0, 1}
  assert all(s["verdict"] in ("correct", "partial", "wrong", "wrong format") for s in samples)


def test_the_write_your_own_task_section_trains_as_written(tmp_path):
  """The section's file, saved as my_task.py, and its command: the task class lives in
  the config file, and the reward workers import it from there."""
  section = manual.page("own-task.md")
  (task_file,) = re.findall(r"```py\n(.*?)```", section, flags=re.S)
  (command,) = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
  (tmp_path / "my_task.py").write_text(task_file)
  argv = shlex.split(command.strip().replace("/tmp/my_task", str(tmp_path / "run")))
  assert argv[:2] == ["grpo-jax", "--config=my_task.py"]
  small = [f"--config.{k}={v}" for k, v in SMALL.items()]
  runner = tmp_path / "grpo_jax_cli.py"
  runner.write_text("from grpo_jax import main\nmain.run()\n")
  r = _run_python(runner, *argv[1:], *small, "--config.progress=False", cwd=tmp_path)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "could not start" not in r.stderr, r.stderr[-2000:]
  summary = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert summary["iterations_done"] == 1 and 0.0 <= summary["final_accuracy"] <= 1.0
  samples = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
  assert json.loads(samples[0])["prompt"].startswith("Q:")


def test_every_extra_the_readme_installs_exists_and_pins_one_jax():
  """`pip install -e ".[NAME]"` in the README names an extra of pyproject.toml, and the
  accelerator extras (tpu, cuda) pin the same jax release."""
  import tomllib  # noqa: PLC0415

  extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  named = set(re.findall(r'pip install -e "\.\[([a-z_,]+)\]"', README))
  named = {n for group in named for n in group.split(",")}
  assert {"test", "cuda", "tpu"} <= named, named
  assert named <= extras.keys(), named - extras.keys()
  jax_pins = {re.sub(r"\[.*?\]", "", d) for name in ("tpu", "cuda") for d in extras[name]}
  assert jax_pins == {"jax==0.10.2"}, jax_pins
