"""The manual's examples (README.md and docs/, `manual`) and the colabs run as written (on
their tiny configs)."""

import ast
import json
import pathlib
import re

import pytest

from tests import manual

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(source: str):
  exec(compile(source, "<doc>", "exec"), {"__name__": "__doc__"})


def test_readme_python_example_runs():
  blocks = re.findall(r"```python\n(.*?)```", manual.text(), flags=re.S)
  assert blocks, "the manual has no python example"
  for block in blocks:
    _run(block)


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "colabs").glob("*.ipynb")))
def test_colabs_are_committed_without_outputs(notebook):
  """Notebooks are stored clean; tests/docs/test_notebook.py executes them with nbclient."""
  nb = json.loads((ROOT / "colabs" / notebook).read_text())
  code = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
  assert code and not any(cell.get("outputs") or cell.get("execution_count") for cell in code)


@pytest.mark.parametrize("path", sorted(p.name for p in (ROOT / "configs").glob("*.py")))
def test_every_config_documents_its_command_and_expected_result(path):
  doc = ast.get_docstring(ast.parse((ROOT / "configs" / path).read_text())) or ""
  assert f"--config=configs/{path}" in doc, f"configs/{path}: docstring lacks its command"
  assert "Expected result" in doc, f"configs/{path}: docstring lacks the expected result"


@pytest.mark.parametrize(
  "spec",
  [
    "arithmetic.py:tiny",
    "arithmetic.py:full",
    "countdown.py:tiny",
    "countdown.py:full",
    "long_addition.py:tiny",
    "long_addition.py:full",
    "ibpo.py:tiny",
    "ibpo.py:trie",
    "ibpo.py:grpo",
    "ibpo.py:hint",
  ],
)
def test_trainer_configs_validate(spec):
  from grpo_jax.infra import config_lib  # noqa: PLC0415
  from grpo_jax.trainer import build  # noqa: PLC0415

  c = config_lib.load(str(ROOT / "configs" / spec))
  setup = build.build(c)
  assert setup.loop.iterations >= 1
  with pytest.raises(AttributeError, match="iteratons"):
    c.iteratons = 3  # Locked: a misspelt key fails.


def _variant_registries():
  """Every registry of formula-defined variants (imported here: only these tests need them)."""
  from grpo_jax.rl import advantages, aggregation, losses, masks, planners  # noqa: PLC0415

  return (
    advantages.REGISTRY,
    masks.REGISTRY,
    losses.REGISTRY,
    losses.KL_REGISTRY,
    aggregation.REGISTRY,
    planners.REGISTRY,
  )


def test_readme_tables_name_every_registered_variant():
  from grpo_jax.rl import presets  # noqa: PLC0415

  text = manual.text()
  for reg in (*_variant_registries(), presets.REGISTRY):
    missing = [name for name in reg.names() if f"`{name}`" not in text]
    assert not missing, f"the manual lacks the {reg.kind} names {missing}"


def test_every_registered_function_documents_its_formula_and_source():
  for reg in _variant_registries():
    for name in reg.names():
      doc = reg.get(name).__doc__ or ""
      assert "=" in doc or "≈" in doc, f"{reg.kind} {name!r}: no formula in its docstring"
      assert re.search(r"Source|arXiv|verl|Schulman|\d{4}\.\d{5}", doc), (
        f"{reg.kind} {name!r}: no source"
      )


def test_the_real_models_snippet_runs_on_a_checkpoint_directory():
  """docs/real-models.md's loading snippet, with `d` a small Qwen3 checkpoint directory
  (tests/fixtures/hf/qwen3): the config, params, tokenizer and the verifier it shows."""
  (block,) = [
    b for b in re.findall(r"```py\n(.*?)```", manual.text(), flags=re.S) if "read_config(d)" in b
  ]
  scope = {"__name__": "__doc__", "d": str(ROOT / "tests" / "fixtures" / "hf" / "qwen3")}
  exec(compile(block, "<docs/real-models.md>", "exec"), scope)
  assert scope["cfg"].n_layers >= 1 and scope["params"] and scope["ids"]
  verdict = re.search(r'^math_verify\.verify\((.*)\)\s+# "(\w+)"$', block, flags=re.M)
  assert verdict and eval(f"math_verify.verify({verdict.group(1)})", scope) == verdict.group(2)  # noqa: S307
