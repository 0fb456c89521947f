"""Facts about the package's layout a reader can rely on: no import cycle (statically, and
each module importable alone), and short functions in the trainer's modules."""

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "grpo_jax"
# The trainer: one module per phase of the data path (docs/architecture.md).
TRAINER = (
  "config", "trainer/build", "trainer/rollout", "trainer/warmstart", "trainer/heldout",
  "trainer/steps", "trainer/run_state", "trainer/train", "main",
)
# The package's folders, lowest first: a module may import its own folder, the folders
# before it and nothing else of the package (docs/architecture.md). The trainer's modules
# (grpo_jax/*.py) sit on top and may import any of them.
FOLDERS = (
  "infra", "models", "verifiers", "tasks", "rewards", "envs", "rl", "rollouts", "diagnostics",
  "trainer",
)
# The config edge at the package root (what config files import, and the schema the trainer
# validates against) sits between the library folders and trainer/; the command line
# (main, cli, commands, demo) is on top of everything.
EDGE = ("grpo_jax.config", "grpo_jax.config_defaults", "grpo_jax.schema")
MAX_FUNCTION_LINES = 60


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: pathlib.Path, modules) -> set[str]:
  """grpo_jax modules `path` imports anywhere (module level or inside functions)."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name in modules}
    elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("grpo_jax"):
      for a in node.names:
        full = f"{node.module}.{a.name}"
        out.add(full if full in modules else node.module)
  return out - {_module_name(path)} if path.is_relative_to(ROOT) else out


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(path, modules) for name, path in modules.items()}


def _cycle(graph) -> list[str] | None:
  """One import cycle of `graph` (a list of modules, first == last), or None."""
  state, stack = {}, []

  def visit(n):
    state[n] = "open"
    stack.append(n)
    for m in sorted(graph[n]):
      if state.get(m) == "open":
        return [*stack[stack.index(m) :], m]
      if m not in state and (found := visit(m)):
        return found
    stack.pop()
    state[n] = "done"
    return None

  for n in sorted(graph):
    if n not in state and (found := visit(n)):
      return found
  return None


def test_the_import_graph_has_no_cycle():
  graph = _graph()
  assert "grpo_jax.trainer.train" in graph and graph["grpo_jax.config"], "the walk found no imports"
  assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"


def test_the_cycle_check_finds_a_cycle():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None


def _folder(module: str) -> str:
  """The folder of FOLDERS a module sits in; "edge" for the config edge (EDGE), "" for the
  command line's modules at the package root."""
  parts = module.split(".")
  if len(parts) > 1 and parts[1] in FOLDERS:
    return parts[1]
  return "edge" if module in EDGE else ""


def _layer_breaches(graph) -> list[str]:
  """Imports that run up or sideways between folders (FOLDERS, lowest first)."""
  order = (*FOLDERS[:-1], "edge", FOLDERS[-1], "")
  rank = {f: i for i, f in enumerate(order)}
  return [
    f"{a} -> {b}"
    for a, bs in sorted(graph.items())
    for b in sorted(bs)
    if _folder(a) and _folder(a) != _folder(b) and rank[_folder(b)] > rank[_folder(a)]
  ]


def test_folders_import_only_the_folders_below_them():
  graph = _graph()
  folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
  assert folders == set(FOLDERS), f"place each folder in FOLDERS: {sorted(folders ^ set(FOLDERS))}"
  assert not _layer_breaches(graph), f"imports that run up: {_layer_breaches(graph)}"
  nested = [m for m in graph if m.count(".") > 1]
  assert all(_folder(m) in FOLDERS for m in nested), "a nested module outside FOLDERS"


def test_the_layer_check_finds_an_import_that_runs_up():
  graph = {"grpo_jax.infra.logs": {"grpo_jax.models.model"}, "grpo_jax.rl.losses": set()}
  assert _layer_breaches(graph) == ["grpo_jax.infra.logs -> grpo_jax.models.model"]
  assert not _layer_breaches({"grpo_jax.trainer.train": {"grpo_jax.rl.losses"}})
  # The config edge sits below the trainer and above the library folders.
  assert not _layer_breaches({"grpo_jax.trainer.build": {"grpo_jax.config", "grpo_jax.schema"}})
  assert _layer_breaches({"grpo_jax.schema": {"grpo_jax.trainer.build"}}) == [
    "grpo_jax.schema -> grpo_jax.trainer.build"
  ]
  assert _layer_breaches({"grpo_jax.rl.spec": {"grpo_jax.config"}}) == [
    "grpo_jax.rl.spec -> grpo_jax.config"
  ]


# What a config file may import: the schema and the named RL recipes, never the build or
# the trainer (reading a config stays cheap and does no I/O).
_CONFIG_IMPORTS = {"grpo_jax.config", "grpo_jax.rl.presets"}


def test_configs_import_the_schema_only():
  for path in sorted((ROOT / "configs").glob("*.py")):
    imported = _imports(path, _modules())
    assert imported <= _CONFIG_IMPORTS, f"{path.name}: {sorted(imported - _CONFIG_IMPORTS)}"
  schema = _imports(PACKAGE / "config.py", _modules())
  assert not schema & {f"grpo_jax.{m.replace('/', '.')}" for m in TRAINER}, sorted(schema)


def test_the_old_flat_paths_still_import_with_a_deprecation_warning():
  """0.1's `from grpo_jax import advantages` and `rl.RLConfig` keep working for one
  release: every entry of the move table names a module (and a name) that exists."""
  code = (
    "import importlib, warnings\n"
    "warnings.simplefilter('error')\n"
    "import grpo_jax\n"
    "from grpo_jax import rl, rewards\n"
    "from grpo_jax.infra import moved\n"
    "for old, new in moved.MODULES.items():\n"
    "  assert importlib.import_module(new).__name__ == new, new\n"
    "  try:\n"
    "    getattr(grpo_jax, old)\n"
    "  except DeprecationWarning as w:\n"
    "    assert new in str(w), w\n"
    "  else:\n"
    "    raise AssertionError(old)\n"
    "for table in (moved.RL_NAMES, moved.REWARDS_NAMES, moved.CONFIG_NAMES,\n"
    "              moved.COUNTERFACTUAL_NAMES, moved.OFFPOLICY_NAMES):\n"
    "  for name, new in table.items():\n"
    "    assert hasattr(importlib.import_module(new), name), (name, new)\n"
    "warnings.simplefilter('ignore')\n"
    "from grpo_jax import advantages\n"
    "from grpo_jax.rl import spec\n"
    "assert advantages.__name__ == 'grpo_jax.rl.advantages' and rl.RLConfig is spec.RLConfig\n"
    "assert rewards.RewardPool.__module__ == 'grpo_jax.verifiers.reward_pool'\n"
    "from grpo_jax.rl import dynamic_sampling, counterfactuals, offpolicy\n"
    "assert dynamic_sampling.__name__ == 'grpo_jax.rollouts.dynamic_sampling'\n"
    "assert counterfactuals.plan.__module__ == 'grpo_jax.rollouts.counterfactuals'\n"
    "assert offpolicy.continue_rows.__module__ == 'grpo_jax.rollouts.partial'\n"
    "from grpo_jax import build, config\n"
    "assert config.build is build.build and config.Setup is build.Setup\n"
    "try:\n"
    "  grpo_jax.no_such_module\n"
    "except AttributeError as e:\n"
    "  assert 'no_such_module' in str(e)\n"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]


# Command-line entry points define absl flags: each is imported in a process of its own.
_ENTRY_POINTS = ("grpo_jax.main", "grpo_jax.demo")


@pytest.mark.parametrize("group", ["library", *_ENTRY_POINTS])
def test_every_module_imports_alone(group):
  """Each module imported first, into a fresh set of grpo_jax modules: an import-order
  dependent cycle fails here even if the static graph missed it."""
  names = (
    [n for n in sorted(_modules()) if n not in _ENTRY_POINTS] if group == "library" else [group]
  )
  code = (
    "import importlib, sys\n"
    f"for name in {names!r}:\n"
    "  for m in [m for m in sys.modules if m == 'grpo_jax' or m.startswith('grpo_jax.')]:\n"
    "    del sys.modules[m]\n"
    "  importlib.import_module(name)\n"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("module", TRAINER)
def test_trainer_functions_are_short(module):
  tree = ast.parse((PACKAGE / f"{module}.py").read_text())
  long = [
    f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
    for node in ast.walk(tree)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
  ]
  assert not long, f"grpo_jax/{module}.py: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _config_module(name: str):
  """configs/<name>, loaded by path as `--config=` loads it."""
  import importlib.util  # noqa: PLC0415

  module_spec = importlib.util.spec_from_file_location(f"_cfg_{name}", ROOT / "configs" / name)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


# Every config file's variants, as it declares them (VARIANTS, beside get_config).
_VARIANTS = {
  p.name: tuple(_config_module(p.name).VARIANTS) for p in sorted((ROOT / "configs").glob("*.py"))
}


def test_no_config_file_shadows_an_importable_module():
  """Tests and experiments put configs/ on sys.path (`import arithmetic`), so a config named
  like a package (configs/reasoning_gym.py did) would replace it for every later import."""
  import importlib.util  # noqa: PLC0415
  import sys  # noqa: PLC0415

  configs = str(ROOT / "configs")
  path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != pathlib.Path(configs)]
  for p in sorted((ROOT / "configs").glob("*.py")):
    spec = importlib.machinery.PathFinder.find_spec(p.stem, path)
    assert spec is None or pathlib.Path(spec.origin or "").parent == pathlib.Path(configs), (
      f"configs/{p.name} shadows {spec.origin}"
    )
    assert p.stem not in sys.stdlib_module_names, p.name
  assert importlib.util.find_spec("reasoning_gym") is not None  # What would be shadowed.


def test_every_config_declares_its_variants_and_refuses_others():
  """The variants come from each file (no list here to keep by hand): get_config takes each
  and refuses any other, naming them all."""
  assert "long" in _VARIANTS["long_addition.py"] and "hint" in _VARIANTS["ibpo.py"]
  for name, variants in _VARIANTS.items():
    assert variants and len(set(variants)) == len(variants), name
    with pytest.raises(ValueError, match="variant 'nope'; allowed: ") as e:
      _config_module(name).get_config("nope")
    assert all(v in str(e.value) for v in variants), (name, str(e.value))


@pytest.mark.parametrize(
  "spec", [f"{name}:{variant}" for name, variants in _VARIANTS.items() for variant in variants]
)
def test_reading_a_config_does_no_io(spec, monkeypatch):
  """get_config builds a ConfigDict and nothing else: no file is opened or listed (I/O
  happens in build.build, at the edge)."""
  import builtins  # noqa: PLC0415
  import os  # noqa: PLC0415

  name, variant = spec.split(":")
  module = _config_module(name)

  def refuse(*args, **kwargs):
    raise AssertionError(f"{spec}: get_config did I/O: {args[:1]}")

  for target, attr in ((builtins, "open"), (os, "listdir"), (os, "scandir"), (os, "stat")):
    monkeypatch.setattr(target, attr, refuse)
  monkeypatch.setattr(pathlib.Path, "exists", refuse)
  try:
    c = module.get_config(variant)
  finally:
    monkeypatch.undo()
  assert c.to_dict()


def test_loading_every_config_starts_no_jax_backend():
  """`grpo-jax` reads --config while parsing flags, before `jax.distributed.initialize`,
  which must come before any backend starts: reading a config may not touch a device."""
  specs = [f"configs/{n}:{v}" for n, vs in _VARIANTS.items() for v in vs]
  code = (
    "from jax._src import xla_bridge\n"
    "from grpo_jax.infra import config_lib\n"
    f"for spec in {specs!r}:\n"
    "  config_lib.load(spec)\n"
    "  assert not xla_bridge.backends_are_initialized(), spec\n"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-3000:]


def test_property_tests_are_derandomized_by_default():
  """conftest loads the "ci" hypothesis profile: the same examples on every run, and the
  per-test settings made at import time inherit it."""
  import hypothesis  # noqa: PLC0415

  if os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci":
    pytest.skip("HYPOTHESIS_PROFILE chose another profile")
  assert hypothesis.settings.default.derandomize
  assert hypothesis.settings(max_examples=5).derandomize


# The RLConfig fields that name a registry record: the trainer asks the record's traits.
_VARIANT_FIELDS = (
  "advantage",
  "policy_loss",
  "kl_estimator",
  "aggregation",
  "planner",
  "controller",
  "is_correction",
)


def _name_checks(tree: ast.AST) -> list[str]:
  """`x.<variant field> ==/!=/in "literal"` comparisons (a trait decided by a name)."""
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Compare):
      continue
    sides = [node.left, *node.comparators]
    names = [s.attr for s in sides if isinstance(s, ast.Attribute) and s.attr in _VARIANT_FIELDS]
    literal = any(
      isinstance(s, ast.Constant | ast.Tuple | ast.List | ast.Set)
      and not (isinstance(s, ast.Constant) and s.value is None)
      for s in sides
    )
    if names and literal:
      found.append(f"line {node.lineno}: {ast.unparse(node)}")
  return found


def test_no_trait_is_decided_by_a_variant_name():
  bad = {
    str(path.relative_to(ROOT)): got
    for path in sorted(PACKAGE.rglob("*.py"))
    if (got := _name_checks(ast.parse(path.read_text())))
  }
  assert not bad, bad
  assert _name_checks(ast.parse('if cfg.advantage == "fade": pass'))  # It can fail.


def test_child_processes_get_the_tests_import_path():
  """A test's child python (tests/subproc.py) imports helpers, experiments and config
  modules by name as the test itself does (pytest's `pythonpath`)."""
  import subproc  # noqa: PLC0415
  import tomllib  # noqa: PLC0415

  toml = tomllib.loads((ROOT / "pyproject.toml").read_text())
  assert tuple(toml["tool"]["pytest"]["ini_options"]["pythonpath"]) == subproc.PYTHONPATH
  paths = subproc.child_env()["PYTHONPATH"].split(os.pathsep)
  assert paths[: len(subproc.PYTHONPATH)] == [str(ROOT / d) for d in subproc.PYTHONPATH]


# Mappings keyed by names that are not families though spelled alike: llama.cpp's
# pre-tokenizer names (GGUF tokenizer.ggml.pre, e.g. "qwen2": Qwen2's split regex).
NOT_FAMILIES = ("PRE_TOKENIZERS",)


# Every family's names (`models/families.py`): model_type and the HF classes.
def _family_names() -> set[str]:
  from grpo_jax.models import families  # noqa: PLC0415

  return {n for f in families.FAMILIES.values() for n in (f.name, f.hf_class, f.seq_cls_class)}


def _family_checks(tree: ast.AST, names: set[str]) -> list[str]:
  """Comparisons against a family's name and dict literals keyed by one: a feature decided
  by name (`arch == "qwen3"`, `arch in ("llama", "qwen3")`, `{"llama": ...}`)."""

  def named(node) -> bool:
    elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return any(isinstance(e, ast.Constant) and e.value in names for e in elts)

  exempt = {
    id(node.value)
    for node in ast.walk(tree)
    if isinstance(node, ast.Assign)
    and any(isinstance(t, ast.Name) and t.id in NOT_FAMILIES for t in node.targets)
  }
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare) and any(map(named, [node.left, *node.comparators])):
      found.append(f"line {node.lineno}: {ast.unparse(node)}")
    elif (
      isinstance(node, ast.Dict)
      and id(node) not in exempt
      and any(k is not None and named(k) for k in node.keys)
    ):
      found.append(f"line {node.lineno}: a mapping keyed by a family name")
  return found


def test_no_model_family_is_decided_by_its_name_outside_the_family_records():
  names = _family_names()
  bad = {
    str(path.relative_to(ROOT)): got
    for path in sorted(PACKAGE.rglob("*.py"))
    if path.name != "families.py" and (got := _family_checks(ast.parse(path.read_text()), names))
  }
  assert not bad, bad
  # It can fail: the checks this module's records replaced.
  assert _family_checks(ast.parse('if arch in ("llama", "qwen3"): pass'), names)
  assert _family_checks(ast.parse('X = {"LlamaForCausalLM": "llama"}'), names)


MAX_MODULE_LINES = 800  # Issue 57: a module a reader can hold; split by idea past it.


def test_no_package_module_is_over_800_lines():
  long = {
    str(p.relative_to(ROOT)): n
    for p in sorted(PACKAGE.rglob("*.py"))
    if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
  }
  assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by idea): {long}"


def _path_edits(tree) -> list[str]:
  """Lines of `tree` that change sys.path (insert, append, extend, or an assignment)."""
  found = []
  for node in ast.walk(tree):
    target = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
      target = node.func.value if node.func.attr in ("insert", "append", "extend") else None
    elif isinstance(node, ast.Assign | ast.AugAssign):
      targets = node.targets if isinstance(node, ast.Assign) else [node.target]
      target = next((t for t in targets if ast.unparse(t) == "sys.path"), None)
    if target is not None and ast.unparse(target) == "sys.path":
      found.append(f"line {node.lineno}: {ast.unparse(node)}")
  return found


def test_no_experiment_edits_sys_path():
  """Experiments import each other by name: `python experiments/x.py` puts experiments/ on
  the path, and so do pytest's `pythonpath` and tests/subproc.py for the tests."""
  bad = {
    p.name: got
    for p in sorted((ROOT / "experiments").glob("*.py"))
    if (got := _path_edits(ast.parse(p.read_text())))
  }
  assert not bad, bad
  assert _path_edits(ast.parse("import sys\nsys.path.insert(0, 'x')"))  # It can fail.
  assert _path_edits(ast.parse("import sys\nsys.path += ['x']"))


def _suffix_letters(text: str) -> set[str]:
  """Capital letters of shape suffixes (`logp_BT`: B, T) in names of `text`'s code."""
  return {c for m in re.finditer(r"\b[a-z][a-z0-9_]*?_([A-Z]{1,6})\b", text) for c in m.group(1)}


def test_every_shape_suffix_letter_is_in_the_package_legend():
  """grpo_jax/__init__.py's docstring lists every letter the package's array names use."""
  import grpo_jax  # noqa: PLC0415

  legend = grpo_jax.__doc__.split("Shape suffixes.")[1]
  listed = {
    c for line in legend.splitlines() for c in re.findall(r"(?:^|\s{2,}|, )([A-Z])\b", line)
  }
  used = set()
  for path in PACKAGE.rglob("*.py"):
    used |= _suffix_letters(path.read_text())
  assert used <= listed, f"letters used but not in the legend: {sorted(used - listed)}"
  assert _suffix_letters("logits_NW = f(x)") == {"N", "W"}  # It can fail: W is not listed.
  assert "W" not in listed


def test_the_old_flat_paths_are_removed_when_their_release_comes():
  """The 0.1 spellings (infra/moved.py) go in moved.REMOVED_IN: this fails once pyproject's
  version reaches it, until the tables and the package faces' __getattr__ are deleted."""
  import tomllib  # noqa: PLC0415

  from grpo_jax.infra import moved  # noqa: PLC0415

  version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
  release = tuple(int(x) for x in version.split(".")[:2])
  assert moved.REMOVED_IN == (0, 3)
  assert release < moved.REMOVED_IN, (
    f"grpo_jax {version}: remove the 0.1 import shims (grpo_jax/infra/moved.py, the "
    "__getattr__ of grpo_jax, grpo_jax.rl and grpo_jax.rewards) and this test."
  )


# tests/ mirrors the package: tests/<folder>/ for each package folder, whose files each
# import a module of that folder, and three folders that test across the package:
# learning/ (the learning claims, end to end), experiments/ (the scripts under
# experiments/) and docs/ (the README, the docs site, the notebooks). The files at tests/
# itself are the shared helpers and the tests of the package root (the config edge, the
# command line, the diagnostics section of the config, faults through the command line) and
# of the layout as a whole (this file) and of the suite's own helpers (needs.py's,
# compile_profile.py's, subproc.py's, cheap_tpu.py's).
ACROSS = ("learning", "experiments", "docs")
ROOT_TESTS = (
  "test_architecture", "test_cheap_tpu", "test_cli", "test_commands", "test_compile_profile",
  "test_config", "test_diagnostics_hook", "test_faults", "test_needs", "test_subproc",
)  # fmt: skip


def _folder_misses(tests: pathlib.Path) -> list[str]:
  """What breaks the mirror under `tests`: a folder that is neither a package folder nor
  one of ACROSS, a test file at the top not in ROOT_TESTS, a test file in a package folder
  that imports none of its modules, a test file two folders deep, a name used twice."""
  misses, names, modules = [], [], _modules()
  for path in sorted(tests.rglob("test_*.py")):
    parts = path.relative_to(tests).parts
    if parts[0] == "fixtures":
      continue
    names.append(path.name)
    if len(parts) == 1:
      if path.stem not in ROOT_TESTS:
        misses.append(f"{path.name}: at tests/, not a test of the package root")
    elif len(parts) > 2 or parts[0] not in (*FOLDERS, *ACROSS):
      misses.append(f"{'/'.join(parts)}: no package folder {'/'.join(parts[:-1])}")
    elif parts[0] in FOLDERS and not any(
      f"{m}.".startswith(f"grpo_jax.{parts[0]}.") for m in _imports(path, modules)
    ):
      misses.append(f"{'/'.join(parts)}: imports no module of grpo_jax.{parts[0]}")
  twice = sorted({n for n in names if names.count(n) > 1})
  return misses + [f"{n}: used twice (pytest imports test files by name)" for n in twice]


def test_the_tests_mirror_the_package():
  tests = ROOT / "tests"
  misses = _folder_misses(tests)
  assert not misses, misses
  folders = {p.parent.name for p in tests.glob("*/test_*.py")} - {"fixtures"}
  assert folders == {*FOLDERS, *ACROSS}, folders  # Each package folder has its tests.


def test_the_mirror_check_finds_a_misplaced_test(tmp_path):
  (tmp_path / "rl").mkdir()
  (tmp_path / "rl" / "test_x.py").write_text("from grpo_jax.models import model\n")
  (tmp_path / "test_y.py").write_text("")
  (tmp_path / "widgets").mkdir()
  (tmp_path / "widgets" / "test_y.py").write_text("")
  assert _folder_misses(tmp_path) == [
    "rl/test_x.py: imports no module of grpo_jax.rl",
    "test_y.py: at tests/, not a test of the package root",
    "widgets/test_y.py: no package folder widgets",
    "test_y.py: used twice (pytest imports test files by name)",
  ]


def _tested_modules(modules) -> set[str]:
  """The package modules some file under tests/ imports by their own name (`_imports`)."""
  out = set()
  for path in sorted((ROOT / "tests").rglob("*.py")):
    out |= _imports(path, modules)
  return out


def test_every_package_module_is_imported_by_a_test():
  """Each module has a test that imports it directly, not only through a re-export (a
  module's own tests say what it does; a re-export hides which module a failure is in)."""
  modules = _modules()
  faces = {name for name, path in modules.items() if path.name == "__init__.py"}
  untested = sorted(set(modules) - _tested_modules(modules) - faces)
  assert not untested, f"package modules no test imports directly: {untested}"
