"""The README's example and the colabs run as written (on their tiny configs)."""

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(source: str):
  exec(compile(source, "<doc>", "exec"), {"__name__": "__doc__"})


def test_readme_python_example_runs():
  blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
  assert blocks, "README.md has no python example"
  for block in blocks:
    _run(block)


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "colabs").glob("*.ipynb")))
def test_colab_code_cells_run(notebook):
  nb = json.loads((ROOT / "colabs" / notebook).read_text())
  code = [
    "".join(line for line in cell["source"] if not line.lstrip().startswith(("!", "%")))
    for cell in nb["cells"]
    if cell["cell_type"] == "code"
  ]
  assert code and not any(
    cell.get("outputs") for cell in nb["cells"] if cell["cell_type"] == "code"
  )
  _run("\n".join(code))
