"""The `grpo-jax` command line at its edge: help, the --config flag and its overrides,
presets by name, and one `grpo-jax: error:` line for every mistake a user can make.

    grpo-jax --help                                      commands, syntax, shipped configs
    grpo-jax config --config=configs/arithmetic.py:tiny --config.rl.preset=dapo

`parse_flags` is the parser `app.run` calls with argv (`main.py`). It reads
`--config=FILE[:VARIANT]` itself (`config_lib.load`) and checks every `--config.KEY`
against the loaded config: an unknown key is named with the closest existing ones and the
keys allowed where it was looked for. `--config.rl.preset=NAME` applies the preset
(`presets.apply`) before every other override, whatever the order on the command line, so
the command line's own `--config.rl.*` values win over the preset's. The overrides are
then parsed with ml-collections' own parsers (on a private FlagValues, so parsing can be
repeated in one process), and the remaining flags go to absl. A mistake raises
`UsageError` or `config_lib.ConfigError`; `fail` prints it as one line and exits 2.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import os
import pathlib
import sys
from typing import Any

import ml_collections
from absl import flags
from ml_collections import config_flags

from grpo_jax.infra import config_lib, registry
from grpo_jax.rl import presets

PROG = "grpo-jax"
COMMANDS = {
  "train": "train (the default command; rerunning with the same --workdir resumes)",
  "config": "print the resolved config, every key with its value, and validate it",
  "plan": "the per-device memory plan and whether it fits a device (or a TPU topology)",
  "eval": "score a checkpoint (or config.hf_dir) on benchmarks: greedy, avg@k, pass@k, maj@k",
  "hf-check": "import a Hugging Face / GGUF checkpoint and compare its logits with transformers",
  "rm-train": "train a Bradley-Terry reward model on JSONL preference pairs (config.reward_model)",
}
PRESET_KEY = "rl.preset"  # A command-line key only: the preset is applied, not stored.
_REPO = pathlib.Path(__file__).resolve().parent.parent


class UsageError(ValueError):
  """A mistake on the command line (an unknown command, key or flag, a missing flag):
  reported as one line and exit status 2."""


@dataclasses.dataclass(frozen=True)
class Invocation:
  """What the command line asks for, parsed: the command and the config it runs on."""

  command: str  # One of COMMANDS.
  # The ConfigDict with every override applied (None: hf-check, and eval without --config,
  # which reads the workdir's: `recorded`).
  config: Any = None
  spec: str = ""  # FILE[:VARIANT] as given.
  overrides: tuple[str, ...] = ()  # The --config.KEY paths given, in order.
  preset: str = ""
  preset_changes: tuple = ()  # (key, before, after) the preset made and no override undid.
  config_args: tuple[str, ...] = ()  # The --config.KEY arguments as given (for `recorded`).


def one_line(message: object) -> str:
  """A message as one line: its lines joined."""
  return " ".join(part.strip() for part in str(message).strip().splitlines() if part.strip())


def fail(error: object, *, status: int = 2) -> None:
  """Prints `grpo-jax: error: <one line>` on stderr and exits with `status`."""
  print(f"{PROG}: error: {one_line(error)}", file=sys.stderr)
  raise SystemExit(status)


def silence_stdout() -> None:
  """Points stdout at /dev/null: after a reader closed the pipe, Python's own flush at exit
  would raise again."""
  devnull = os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, sys.stdout.fileno())


# ----------------------------------------------------------------------------
# Parsing argv.
# ----------------------------------------------------------------------------


def parse_flags(argv: list[str]) -> Invocation:
  """`app.run`'s flags_parser: --help, the config and its overrides, then absl's flags
  (on the global FLAGS). Every mistake is one line and exit status 2."""
  if wants_help(argv):
    print(help_text())
    raise SystemExit(0)
  try:
    return invocation(argv)
  except (UsageError, config_lib.ConfigError) as e:
    fail(e)


def invocation(argv: list[str], *, flag_values: flags.FlagValues = flags.FLAGS) -> Invocation:
  """argv parsed: the config and its overrides here, the other flags into `flag_values`.
  Raises UsageError or config_lib.ConfigError."""
  spec, config_args, rest = split_config_args(argv)
  try:
    positionals = flag_values(rest)[1:]
  except flags.Error as e:
    raise UsageError(flag_error(e)) from None
  return parse(command_of(positionals), spec, config_args)


def wants_help(argv: list[str]) -> bool:
  args = argv[1 : argv.index("--")] if "--" in argv else argv[1:]
  return any(a in ("-h", "--help", "-help", "--helpshort", "help") for a in args)


def split_config_args(argv: list[str]) -> tuple[str, list[str], list[str]]:
  """(the --config spec or "", the --config.KEY arguments in order, argv without both)."""
  spec, config_args, rest = "", [], [argv[0]]
  i = 1
  while i < len(argv):
    a = argv[i]
    if a == "--":
      rest += argv[i:]
      break
    name = a.lstrip("-").split("=", 1)[0] if a.startswith("-") else ""
    if name == "config":
      if spec:
        raise UsageError(f"--config is given twice ({spec!r} and another); give it once.")
      if "=" in a:
        spec = a.split("=", 1)[1]
      elif i + 1 < len(argv):
        spec, i = argv[i + 1], i + 1
      if not spec:
        raise UsageError("--config needs a value: --config=FILE.py[:VARIANT].")
    elif name.startswith(("config.", "noconfig.")):
      config_args.append(a)
      value = argv[i + 1] if "=" not in a and i + 1 < len(argv) else "-"
      if not value.startswith("-") and value not in COMMANDS:
        config_args.append(value)  # `--config.KEY VALUE`; a bool takes no value (a
        i += 1  # value after one is refused by `_pair_values`).
    else:
      rest.append(a)
    i += 1
  return spec, config_args, rest


def command_of(positionals: list[str]) -> str:
  if not positionals:
    return "train"
  command = positionals[0]
  if command not in COMMANDS or command == "train" or len(positionals) > 1:
    named = [c for c in COMMANDS if c != "train"]
    close = difflib.get_close_matches(command, [*named, "train"], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    hint = " (to train, give no command)" if close == ["train"] else hint
    raise UsageError(
      f"unexpected argument(s) {' '.join(positionals)!r}{hint}. The commands are "
      f"{', '.join(named)}, or none to train; flags are written --name=value "
      f"({PROG} --help)."
    )
  return command


def parse(command: str, spec: str, config_args: list[str]) -> Invocation:
  """The Invocation of `command` on the config `spec` with its --config.KEY arguments."""
  if command == "hf-check":
    if spec or config_args:
      raise UsageError("hf-check takes no --config; it reads --hf_dir.")
    return Invocation(command)
  if command == "eval" and not spec:  # The run's own config (`recorded`), read later.
    return Invocation(command, config_args=tuple(config_args))
  if not spec:
    raise UsageError(
      f"--config is required, e.g. --config=configs/arithmetic.py:tiny ({PROG} --help lists "
      "the shipped configs and their variants)."
    )
  return configured(command, config_lib.load(spec), spec, config_args)


def recorded(inv: Invocation, workdir: str) -> Invocation:
  """`inv` (eval without --config) on the config the run in `workdir` recorded
  (workdir/config.json, `config.from_recorded`), with inv's --config.KEY overrides."""
  from grpo_jax import config as config_schema  # noqa: PLC0415 -- JAX; only here.

  path = pathlib.Path(workdir) / "config.json"
  if not path.is_file():
    raise UsageError(
      f"{path}: not found; give --config=FILE.py[:VARIANT] (the run's config), or a --workdir "
      "that a run wrote."
    )
  recorded_dict = json.loads(path.read_text())
  _import_variants(recorded_dict, path)
  return configured(
    inv.command, config_schema.from_recorded(recorded_dict), str(path), list(inv.config_args)
  )


def import_run_variants(workdir: str) -> None:
  """Imports the modules that registered the variants of the run in `workdir` outside the
  package (its config.json's "variants_from", `registry.outside_variants`), so that eval
  and a resume in a fresh process find them; a run without any, or none yet, is a no-op."""
  path = pathlib.Path(workdir) / "config.json"
  if "://" not in str(workdir) and path.is_file():
    _import_variants(json.loads(path.read_text()), path)


def _import_variants(recorded: dict, path: pathlib.Path) -> None:
  try:
    registry.import_origins(recorded.get("variants_from", []))
  except ImportError as e:
    raise UsageError(f"{path}: {e}") from None


def configured(command: str, config, spec: str, config_args: list[str]) -> Invocation:
  """The Invocation of `command` on `config` (loaded from `spec`) with its --config.KEY
  arguments applied (a preset first)."""
  pairs = _moved(_pair_values(config, config_args))
  preset = _preset(pairs)
  paths = [path for path, _ in pairs if path != PRESET_KEY]
  for path in paths:
    _check_key(config, path, spec=spec)
  changes = presets.apply(config.rl, preset) if preset else []
  _apply_overrides(config, [arg for path, args in pairs if path != PRESET_KEY for arg in args])
  overridden = {p.removeprefix("rl.") for p in paths if p.startswith("rl.")}
  return Invocation(
    command,
    config,
    spec,
    tuple(paths),
    preset,
    tuple((f"rl.{k}", a, b) for k, a, b in changes if k not in overridden),
  )


def _key_of(arg: str) -> str:
  """KEY of `--config.KEY[=V]` or `--noconfig.KEY`."""
  name = arg.lstrip("-").split("=", 1)[0]
  return name.removeprefix("no").split(".", 1)[1]


def _pair_values(config, config_args: list[str]) -> list[tuple[str, list[str]]]:
  """[(KEY, its arguments)]: `--config.KEY=V`, `--config.KEY V`, a bool's bare
  `--config.KEY` / `--noconfig.KEY` (a value `split_config_args` took after a bool goes
  back to being an argument of its own: absl then reports it)."""
  out, i = [], 0
  while i < len(config_args):
    arg, key = config_args[i], _key_of(config_args[i])
    takes_value = "=" not in arg and not isinstance(_value_at(config, key), bool)
    if "=" not in arg and arg.lstrip("-").startswith("config.") and not takes_value:
      out.append((key, [arg]))
    elif takes_value and i + 1 < len(config_args) and not config_args[i + 1].startswith("-"):
      out.append((key, [f"{arg}={config_args[i + 1]}"]))
      i += 1
    else:
      out.append((key, [arg]))
    i += 1
    if i < len(config_args) and not config_args[i].startswith("-"):
      raise UsageError(
        f"{arg} {config_args[i]}: a bool key takes no separate value; write "
        f"{arg.split('=')[0]}={config_args[i]}."
      )
  return out


def _moved(pairs: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
  """The pairs with each moved key (`config_lib.MOVED_KEYS`) at its new place, announced
  in one line on stderr."""
  out = []
  for key, args in pairs:
    new = config_lib.MOVED_KEYS.get(key)
    if new is not None:
      print(f"grpo-jax: warning: {config_lib.moved_message(key)}", file=sys.stderr)
      key, args = new, [a.replace(f"config.{key}", f"config.{new}", 1) for a in args]
    out.append((key, args))
  return out


def _value_at(config, path: str):
  node = config
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return None
    node = node[part]
  return node


def _preset(pairs) -> str:
  given = [args[0] for path, args in pairs if path == PRESET_KEY]
  if any("=" not in arg for arg in given):
    raise UsageError(f"--config.{PRESET_KEY} needs a name: --config.{PRESET_KEY}=dapo.")
  values = [arg.split("=", 1)[1] for arg in given]
  if len(values) > 1:
    raise UsageError(f"--config.{PRESET_KEY} is given {len(values)} times; give one preset.")
  if values and values[0] not in presets.REGISTRY:
    raise UsageError(
      f"--config.{PRESET_KEY}={values[0]!r} is not a preset; presets: "
      f"{', '.join(presets.REGISTRY.names())} (grpo_jax/rl/presets.py)."
    )
  return values[0] if values else ""


def _apply_overrides(config, args: list[str]) -> None:
  """ml-collections parses and sets each override, in order, on a private FlagValues."""
  fv = flags.FlagValues()
  argv = [PROG, *args]
  config_flags.DEFINE_config_dict("config", config, flag_values=fv, sys_argv=argv)
  try:
    fv(argv)
  except flags.Error as e:
    raise UsageError(flag_error(e)) from None
  except (TypeError, ValueError, AttributeError, KeyError) as e:
    raise UsageError(f"{' '.join(args)}: {e}") from None


def flag_error(e: flags.Error) -> str:
  """absl's message for a flag it could not parse, with what is allowed."""
  if isinstance(e, flags.UnrecognizedFlagError):
    _, _, guesses = str(e).partition("Did you mean:")
    guess = guesses.strip(" ?").split(",")[0].strip()
    hint = f"; did you mean --{guess}?" if guess else ""
    return f"unknown flag --{e.flagname}{hint} ({PROG} --help lists the commands and flags)."
  return str(e)


# ----------------------------------------------------------------------------
# Unknown keys: what was meant, and what is allowed there.
# ----------------------------------------------------------------------------


def _check_key(config, path: str, *, spec: str) -> None:
  """Raises UsageError unless config has the key `path`; a task's (or environment's)
  keyword argument that the config file did not set is added with its default first."""
  node, where = config, []
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict):
      raise UsageError(
        f"--config.{path}: config.{'.'.join(where)} is a value ({type(node).__name__}), not "
        "a section with keys."
      )
    if part not in node and not _add_constructor_default(config, where, part):
      raise UsageError(unknown_key_message(config, path, where=where, spec=spec))
    node = node[part]
    where.append(part)


def _add_constructor_default(config, where: list[str], name: str) -> bool:
  """`--config.task.kwargs.NAME` (or env.kwargs) for a keyword the task's class takes and
  the config left out: added with its default, so the override can set it."""
  if where not in (["task", "kwargs"], ["env", "kwargs"]):
    return False
  default = _constructor_defaults(config, where[0]).get(name)
  if default is None:  # Not a parameter, or no default to take the type from.
    return False
  with config[where[0]].kwargs.unlocked():
    config[where[0]].kwargs[name] = default
  return True


def _constructor_defaults(config, section: str) -> dict:
  """The keyword parameters of the config's task (or environment) class with defaults."""
  from grpo_jax import envs, tasks  # noqa: PLC0415 -- only for this message.

  registry = tasks.REGISTRY if section == "task" else envs.REGISTRY
  name = config[section].name
  if section == "task" and name and tasks.known(name):
    cls = tasks.task_class(name)
  elif name and name in registry:
    cls = registry.get(name)
  else:
    return {}
  params = inspect.signature(cls).parameters.values()
  return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def unknown_key_message(config, path: str, *, where: list[str], spec: str) -> str:
  node = config
  for part in where:
    node = node[part]
  missing = path.split(".")[len(where)]
  here = ".".join(["config", *where])
  keys = sorted(node.keys())
  close = [".".join([*where, k]) for k in difflib.get_close_matches(missing, keys, n=3)]
  close += [p for p in leaf_paths(config) if p.split(".")[-1] == missing and p not in close]
  if where == ["rl"] and difflib.get_close_matches(missing, ["preset"]):
    close.insert(0, PRESET_KEY)
  meant = f"; did you mean {' or '.join(f'--config.{p}' for p in close[:3])}?" if close else ""
  shown = ", ".join(keys[:80]) + (", ..." if len(keys) > 80 else "")
  extra = ""
  if where in (["task", "kwargs"], ["env", "kwargs"]):
    takes = sorted(set(_constructor_defaults(config, where[0])) - set(keys))
    name = config[where[0]].name
    extra = f" {where[0]} {name!r} also takes: {', '.join(takes) or 'nothing else'}."
  return (
    f"unknown config key --config.{path}{meant} {here} has: {shown or 'no keys'}.{extra} "
    f"({PROG} config --config={spec} prints every key with its value.)"
  )


def leaf_paths(config, prefix: str = "") -> list[str]:
  """Every dotted key of a ConfigDict."""
  out = []
  for key in sorted(config.keys()):
    value = config[key]
    if isinstance(value, ml_collections.ConfigDict):
      out += leaf_paths(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key}")
  return out


# ----------------------------------------------------------------------------
# What the commands print: help, the resolved config, the preset's changes.
# ----------------------------------------------------------------------------


def preset_note(inv: Invocation) -> str:
  """One line: what --config.rl.preset changed (the command line's own keys kept)."""
  if not inv.preset:
    return ""
  kept = [p for p in inv.overrides if p.startswith("rl.")]
  changes = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in inv.preset_changes)
  note = f"rl.preset={inv.preset}: " + (changes or f"{inv.spec} already matches it")
  return note + (f"; the command line's {', '.join(kept)} kept" if kept else "")


def describe_config(inv: Invocation) -> str:
  """Every key of the resolved config, one per line (`key = value`), each marked where it
  differs from `config.default_config()` or was set on the command line."""
  from grpo_jax import config  # noqa: PLC0415 -- the trainer's schema, only here.

  base = config.default_config()
  lines = [
    f"# {inv.spec}: every key (`{PROG} --config.KEY=VALUE` sets one); '# default: X' marks "
    "a value the config file changed, '# command line' one you set."
  ]
  if inv.preset:
    lines.append(f"# {preset_note(inv)}")
  set_here = set(inv.overrides) | {k for k, _, _ in inv.preset_changes}
  paths = leaf_paths(inv.config)
  for path in sorted(paths, key=lambda p: ("." in p, p)):  # The top-level keys first.
    value = _value_at(inv.config, path)
    mark = ""
    if path in set_here:
      mark = "  # command line" + (f" (preset {inv.preset})" if path not in inv.overrides else "")
    elif not _has(base, path):
      mark = "  # set by the config file"
    elif _value_at(base, path) != value:
      mark = f"  # default: {_value_at(base, path)!r}"
    lines.append(f"{path} = {value!r}{mark}")
  return "\n".join(lines)


def validate(config_dict) -> str:
  """`build.build` on a config (a ConfigError if it refuses it): one line saying what it
  builds."""
  import functools  # noqa: PLC0415

  import jax  # noqa: PLC0415

  from grpo_jax.models import model  # noqa: PLC0415
  from grpo_jax.trainer import build  # noqa: PLC0415

  setup = build.build(config_dict)
  m, loop = setup.model_cfg, setup.loop
  shapes = jax.eval_shape(functools.partial(model.init, m), jax.random.key(0))
  n = sum(x.size for x in jax.tree.leaves(shapes))
  return (
    f"valid: build.build accepts it (task {type(setup.task).__name__}; a {n / 1e6:.2f}M-parameter "
    f"policy, d_model {m.d_model} x {m.n_layers} layers, vocab {m.vocab_size}; "
    f"{loop.prompts_per_step} prompts x G = {setup.sampler_cfg.group_size} per iteration, "
    f"{loop.iterations} iterations)."
  )


def _has(config, path: str) -> bool:
  node = config
  for part in path.split("."):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    node = node[part]
  return True


def help_text(configs_dir: pathlib.Path | None = None) -> str:
  """What `grpo-jax --help` prints: the commands, the config syntax, the shipped configs."""
  names = [c for c in COMMANDS if c != "train"]
  lines = [
    f"{PROG}: GRPO-family RL of language models in JAX (the manual: README.md and docs/).",
    "",
    "Commands:",
    f"  {PROG} --config=FILE.py[:VARIANT] --workdir=DIR [--config.KEY=VALUE ...]",
    f"      {COMMANDS['train']}",
    f"  {PROG} config --config=FILE.py[:VARIANT] [--config.KEY=VALUE ...]",
    f"      {COMMANDS['config']}",
    f"  {PROG} plan --config=FILE.py[:VARIANT] [--devices=N] [--device=NAME|GiB] [--compile]",
    "      [--model=config.json|SHAPE] [--topology=v5e:2x4 [--num_slices=N] [--json=F] [--noadvice]]",
    f"      {COMMANDS['plan']}",
    f"  {PROG} eval --workdir=DIR [--config=FILE.py[:VARIANT]] [--benchmarks=a,b,jsonl:F] [--k=8]",
    "      [--size=N] [--step=S] [--out=DIR]   (each sets its config.eval.KEY)",
    f"      {COMMANDS['eval']}",
    f"  {PROG} hf-check --hf_dir=DIR|FILE.gguf [--tolerance=1e-4] [--dtype=float32] [--nocompare]",
    f"      {COMMANDS['hf-check']}",
    f"  {PROG} rm-train --config=FILE.py[:VARIANT] --workdir=DIR [--config.reward_model.KEY=V]",
    f"      {COMMANDS['rm-train']}",
    "",
    "Config overrides (ml-collections syntax; the config is locked, so a misspelt key fails):",
    "  --config.rl.advantage=rloo   --config.sampler.group_size=16   --config.iterations=100",
    "  --config.task.kwargs.max_digits=3   --config.rl.token_masks=\"('positive_only',)\"",
    "  --config.rl.preset=NAME      a named recipe, applied before the other overrides (which",
    f"                               win over it): {', '.join(presets.REGISTRY.names()[:4])},",
    f"                               {', '.join(presets.REGISTRY.names()[4:])}",
    f"  Every key and its value: {PROG} config --config=configs/arithmetic.py:tiny",
    "",
    "Shipped configs (--config=configs/FILE:VARIANT; the first variant is the default):",
  ]
  for name, variants, summary in shipped_configs(configs_dir):
    lines.append(f"  {name:<18} {', '.join(variants)}")
    lines.append(f"  {'':<18} {summary}")
  lines += [
    "",
    "Other flags: --distributed=auto|on|off (several hosts). "
    f"{PROG} --helpfull lists every absl flag. Commands: {', '.join(names)}.",
  ]
  return "\n".join(lines)


def configs_directory() -> pathlib.Path:
  """configs/ of the working directory, else of the repository grpo_jax was installed from."""
  here = pathlib.Path("configs")
  return here if here.is_dir() else _REPO / "configs"


def shipped_configs(directory: pathlib.Path | None = None) -> list[tuple[str, list[str], str]]:
  """(file name, its variants with the default first, its docstring's first line) for each
  config file, read without running it."""
  directory = pathlib.Path(directory or configs_directory())
  out = []
  for path in sorted(directory.glob("*.py")):
    text = path.read_text()
    tree = ast.parse(text)
    out.append((path.name, variants_of(tree, path.name), _first_line(text, tree)))
  return out


def _first_line(text: str, tree: ast.Module) -> str:
  """The docstring's first line as written in the source (escapes such as \\n kept)."""
  if ast.get_docstring(tree) is None:
    return ""
  line = text.lstrip().removeprefix('r"""').removeprefix('"""').splitlines()[0].strip()
  return line if len(line) <= 96 else line[:95] + "…"


def variants_of(tree: ast.Module, name: str) -> list[str]:
  """A config file's variants: its VARIANTS, else the names get_config compares `arg`
  with, else the `:variant`s its docstring's commands use; get_config's default first."""
  literals = {}
  for node in tree.body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
      target = node.targets[0]
      if isinstance(target, ast.Name):
        literals[target.id] = _strings(node.value, {})
  found = list(literals.get("VARIANTS", []))
  get_config = next(
    (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "get_config"), None
  )
  default = ""
  if get_config is not None:
    defaults = get_config.args.defaults
    if defaults and isinstance(defaults[-1], ast.Constant):
      default = str(defaults[-1].value)
    if not found:
      for node in ast.walk(get_config):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name):
          for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.NotIn, ast.In, ast.NotEq, ast.Eq)):
              found += [s for s in _strings(right, literals) if s not in found]
  if not found:
    doc = ast.get_docstring(tree) or ""
    for part in doc.split(f"configs/{name}:")[1:]:
      variant = part.split()[0].rstrip("`'\".,)")
      if variant and variant not in found:
        found.append(variant)
  return [default] + [v for v in found if v != default] if default else found


def _strings(node: ast.AST, literals: dict) -> list[str]:
  """The string constants of a literal (tuple, list, dict keys, a name bound to one)."""
  if isinstance(node, ast.Constant) and isinstance(node.value, str):
    return [node.value]
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return [s for e in node.elts for s in _strings(e, literals)]
  if isinstance(node, ast.Dict):
    return [s for k in node.keys if k is not None for s in _strings(k, literals)]
  if isinstance(node, ast.Starred):
    return _strings(node.value, literals)
  if isinstance(node, ast.Name):
    return list(literals.get(node.id, []))
  return []
