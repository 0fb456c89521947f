"""The command line as a new user meets it: --help, one `grpo-jax: error:` line (exit 2)
for every mistake, presets by name, the config command, and plan from a model's shape.

Everything runs in this process (`cli.parse_flags` then `main._main`, as `app.run` calls
them): absl's global flags are reset after each case."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
from absl import flags

from grpo_jax import cli, config, main, tasks
from grpo_jax.infra import config_lib, distributed, registry
from grpo_jax.models import hf, model, shapes
from grpo_jax.rl import spec
from grpo_jax.trainer import build, memory, memory_advice

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY = "--config=configs/arithmetic.py:tiny"


def _run(args, monkeypatch, capsys):
  """(exit status, stdout, stderr) of `grpo-jax *args` from the repo root."""
  monkeypatch.chdir(ROOT)
  status = 0
  try:
    main._main(cli.parse_flags(["grpo-jax", *args]))
  except SystemExit as e:
    status = e.code
  finally:
    flags.FLAGS.unparse_flags()
  out = capsys.readouterr()
  return status, out.out, out.err


# (arguments, what the one line must say): every class of user error.
ERRORS = [
  (
    [TINY, "--config.rl.advantge=rloo"],
    r"unknown config key --config\.rl\.advantge; did you mean --config\.rl\.advantage\b.*"
    r"config\.rl has: advantage, advantage_hyper, advantage_options,",
  ),
  (
    [TINY, "--config.task.kwargs.max_digit=3"],
    r"did you mean --config\.task\.kwargs\.max_digits\?.*task 'arithmetic' also takes: "
    r"min_digits, test_percent",
  ),
  ([TINY, "--config.advantage=rloo"], r"did you mean --config\.rl\.advantage\?"),
  ([TINY, "--config.rl.presett=dapo"], r"did you mean --config\.rl\.preset\b"),
  ([TINY, "--config.rl.advantage.x=1"], r"config\.rl\.advantage is a value \(str\)"),
  (
    ["--config=configs/arithmetic.py:small"],
    r"--config=configs/arithmetic\.py:small: .*variant 'small'; allowed: 'tiny', 'full'",
  ),
  (["--config=configs/nope.py"], r"'configs/nope\.py' not found .*holds arithmetic\.py, "),
  (["--config=README.md"], r"README\.md is not a Python file"),
  (["--workdir=/tmp/x"], r"--config is required, e\.g\. --config=configs/arithmetic\.py:tiny"),
  ([TINY], r"--workdir is required to train"),
  (["trian", TINY], r"'trian' \(to train, give no command\)\. The commands are config, plan"),
  (["plann", TINY], r"\(did you mean 'plan'\?\)"),
  ([TINY, "--workdri=/tmp/x"], r"unknown flag --workdri; did you mean --workdir\?"),
  ([TINY, "--config.iterations=abc"], r"--config\.iterations=abc: invalid literal for int"),
  ([TINY, "--config.rl.preset=dapoo"], r"'dapoo' is not a preset; presets: dapo, dr_grpo"),
  ([TINY, "--config.rl.preset"], r"--config\.rl\.preset needs a name: --config\.rl\.preset=dapo"),
  (
    [TINY, "--config.progress", "False"],
    r"takes no separate value; write --config\.progress=False",
  ),
  (["eval", TINY], r"--workdir is required to eval"),
  (
    ["eval", "--workdir=/nonexistent/eval"],
    r"/nonexistent/eval/config\.json: not found; give --config",
  ),
  (
    ["eval", TINY, "--workdir=/nonexistent/eval", "--config.eval.benchmarks=jsonl:/no.jsonl"],
    r"'jsonl:/no\.jsonl': jsonl file '/no\.jsonl': no such file",
  ),
  (
    ["eval", TINY, "--workdir=/nonexistent/eval"],
    r"has no checkpoints and config\.hf_dir is empty",
  ),
  (["hf-check", TINY], r"hf-check takes no --config"),
  (["hf-check"], r"hf-check needs --hf_dir="),
  (["hf-check", "--hf_dir=/missing"], r"/missing/config\.json: not found"),
  (["hf-check", "--hf_dir=/missing.gguf"], r"/missing\.gguf: no such GGUF file"),
  (
    ["plan", "--config=configs/gsm8k_qwen.py:1.5b"],
    r"Qwen2\.5-1\.5B-Instruct/config\.json: not found.*plan from the shape alone: --model=",
  ),
  (["plan", TINY, "--model=qwen9"], r"built-in shape \(qwen2\.5-0\.5b, .*\), a config\.json"),
  (["plan", TINY, "--device=tpu-v9"], r"--device=tpu-v9: device 'tpu-v9': name one of"),
  (["config", TINY, "--config.sampler.max_prompt_len=4"], r"train prompt 0 has 9 tokens"),
  (
    ["config", TINY, "--config.hf_dir=tests/fixtures/hf/qwen2"],
    r"task 'arithmetic' encodes text with its own tokenizer \(CharTokenizer, 32 ids\), not "
    r"config\.hf_dir's \(tests/fixtures/hf/qwen2/config\.json: [\d,]+ ids\)",
  ),
  (
    ["config", "--config=configs/countdown.py:tiny", "--config.rl.dynamic_sampling=True"],
    r"max_gen_batches=1 never samples a second batch.*--config\.rl\.preset=dapo",
  ),
  (
    ["config", TINY, "--config.rl.preset=dapo"],
    r"rl\.overlong_buffer=4096 is not below config\.sampler\.max_new_tokens=8",
  ),
]


@pytest.mark.parametrize("args, match", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_every_user_error_is_one_line_with_what_is_allowed(args, match, monkeypatch, capsys):
  status, out, err = _run(args, monkeypatch, capsys)
  lines = err.strip().splitlines()
  assert status == 2, err
  assert len(lines) == 1 and lines[0].startswith("grpo-jax: error: "), err
  assert re.search(match, lines[0]), lines[0]
  assert "every key" not in out  # A refused config's error comes alone, not after its dump.


def test_help_shows_the_commands_the_syntax_and_every_config_with_its_variants(capsys):
  with pytest.raises(SystemExit) as e:
    cli.parse_flags(["grpo-jax", "--help"])
  text = capsys.readouterr().out
  assert e.value.code == 0
  for needle in ("grpo-jax config --config=", "grpo-jax plan", "hf-check --hf_dir", "--workdir"):
    assert needle in text
  assert "--config.rl.advantage=rloo" in text and "--config.rl.preset=NAME" in text
  shipped = cli.shipped_configs(ROOT / "configs")
  assert [name for name, _, _ in shipped] == sorted(p.name for p in (ROOT / "configs").glob("*.py"))
  for name, variants, summary in shipped:
    assert f"{name:<18} {', '.join(variants)}" in text and summary in text


# Each command line ends before the command runs: help, a misspelt key, an unknown flag,
# a missing config file, an unknown variant, an unknown preset, a value of the wrong type.
_EDGE_CASES = [
  ["--help"],
  ["config", TINY, "--config.rl.advantag=rloo"],
  ["plan", TINY, "--devics=2"],
  ["--config=configs/no_such.py", "--workdir=/tmp/x"],
  ["config", "--config=configs/arithmetic.py:huge"],
  ["config", TINY, "--config.rl.preset=dapoo"],
  ["config", TINY, "--config.iterations=many"],
]


def test_help_and_command_line_mistakes_are_answered_without_importing_jax():
  """`main` imports no JAX before the command line has parsed (the commands do, in
  `commands`): each case exits at the edge, in a process where jax was never imported."""
  code = (
    "import sys\n"
    "from grpo_jax import main\n"
    "sys.argv = ['grpo-jax', *sys.argv[1:]]\n"
    "try:\n"
    "  main.run()\n"
    "except SystemExit as e:\n"
    "  status = e.code\n"
    "heavy = sorted(m for m in ('jax', 'jaxlib', 'flax', 'optax', 'tensorboardX') if m in sys.modules)\n"
    "print('STATUS', status, 'HEAVY', heavy, file=sys.stderr)\n"
  )
  for args in _EDGE_CASES:
    r = subprocess.run(
      [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    last = r.stderr.strip().splitlines()[-1]
    want = 0 if args == ["--help"] else 2
    assert last == f"STATUS {want} HEAVY []", (args, r.stderr[-2000:])
    if want:
      assert r.stderr.count("grpo-jax: error: ") == 1, (args, r.stderr[-2000:])


def test_the_flags_help_names_the_choices_of_their_sources():
  """main's help choices are written out (no JAX import for --help): they are the lists
  the commands accept."""
  assert main.DISTRIBUTED_MODES == distributed.MODES
  assert tuple(sorted(memory.DEVICE_MEMORY_GIB)) == main.DEVICE_NAMES
  assert tuple(shapes.CONFIGS) == main.MODEL_SHAPES


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs").glob("*.py")))
def test_the_listed_variants_are_the_ones_that_load(name):
  """The help's variants come from reading the file; each loads, the first is the default
  (get_config() without an argument), and a name not listed is refused."""
  variants = dict((n, v) for n, v, _ in cli.shipped_configs(ROOT / "configs"))[name]
  assert variants
  path = ROOT / "configs" / name
  default = config_lib.load(str(path))
  for v in variants:
    config_lib.load(f"{path}:{v}")
  assert config_lib.load(f"{path}:{variants[0]}") == default
  with pytest.raises(config_lib.ConfigError, match="variant"):
    config_lib.load(f"{path}:no_such_variant")


def _invocation(*args) -> cli.Invocation:
  try:
    return cli.invocation(["grpo-jax", *args], flag_values=flags.FlagValues())
  finally:
    flags.FLAGS.unparse_flags()


def test_a_preset_by_name_comes_first_and_the_command_lines_keys_win(monkeypatch):
  monkeypatch.chdir(ROOT)
  plain = _invocation(TINY)
  inv = _invocation(TINY, "--config.rl.kl_coef=0.01", "--config.rl.preset=rloo")
  assert (plain.config.rl.advantage, plain.config.rl.kl_coef) == ("grpo", 0.0)
  assert (inv.config.rl.advantage, inv.config.rl.kl_coef) == ("rloo", 0.01)
  assert inv.preset_changes == (("rl.advantage", "grpo", "rloo"),)  # kl_coef: yours, kept.
  assert cli.preset_note(inv) == (
    "rl.preset=rloo: rl.advantage 'grpo' -> 'rloo'; the command line's rl.kl_coef kept"
  )
  assert "preset" not in inv.config.rl  # Applied, not stored: config.json has the values.


def test_task_keywords_the_config_left_out_bools_and_space_separated_values(monkeypatch):
  monkeypatch.chdir(ROOT)
  inv = _invocation(
    TINY, "--config.task.kwargs.min_digits=2", "--noconfig.progress", "--config.iterations", "7"
  )
  c = inv.config
  assert (c.task.kwargs.min_digits, c.progress, c.iterations) == (2, False, 7)
  assert build.build(c).task.min_digits == 2
  assert _invocation(TINY, "--config.tensorboard").config.tensorboard is True


def test_the_config_command_prints_every_key_marked_and_validates(monkeypatch, capsys):
  status, out, err = _run(
    ["config", TINY, "--config.rl.preset=rloo", "--config.eval_size=16"], monkeypatch, capsys
  )
  assert status == 0, err
  lines = out.splitlines()
  assert "rl.advantage = 'rloo'  # command line (preset rloo)" in lines
  assert "eval_size = 16  # command line" in lines
  assert "iterations = 300  # default: 50" in lines
  assert "task.kwargs.ops = '+'  # set by the config file" in lines
  assert "seed = 0" in lines  # Unchanged keys are listed too.
  assert lines[-1].startswith("valid: build.build accepts it (task Arithmetic; a 0.34M")


def test_plan_reads_a_models_shape_without_its_tokenizer(monkeypatch):
  """gsm8k_qwen's tokenizer lives in hf_dir, which is not on this machine: the plan needs
  the shape only, and the built-in shape agrees with configs/scale.py's Qwen2.5-1.5B."""
  monkeypatch.setattr(tasks, "get", lambda *a, **k: pytest.fail("plan built the task"))
  c = config_lib.load(str(ROOT / "configs/gsm8k_qwen.py:1.5b"))
  setup = build.plan_setup(c, n_devices=8, model_source="qwen2.5-1.5b")
  scale = config_lib.load(str(ROOT / "configs/scale.py:1.5b"))
  want = {k: v for k, v in scale.model.items() if k not in ("remat", "scan_layers", "lora")}
  got = {k: getattr(setup.model_cfg, k) for k in want}
  assert got == {**want, "vocab_size": 151936}
  assert (setup.model_cfg.dtype, setup.model_cfg.remat) == ("bfloat16", "full")  # config.model's.
  assert set(shapes.CONFIGS) >= {"qwen2.5-0.5b", "qwen2.5-7b", "llama-3.2-1b"}
  for name in shapes.CONFIGS:
    assert shapes.model_config(name).n_layers > 0


def _plan(**gib) -> memory.Plan:
  """A plan with its byte terms given in GiB (2 rows a micro-batch, 64 rollout rows)."""
  terms = dict(
    params=4, ref_params=4, opt_state=8, grads=8, activations=1, activations_no_remat=10,
    activations_remat=1, backward_working=2, kv_cache=3,
  )  # fmt: skip
  terms = {k: v * memory.GIB for k, v in {**terms, **gib}.items()}
  return memory.Plan(mesh=(1, 8, 1, 1, 1), micro_batch_rows=2, rollout_rows=64, **terms)


def test_plan_advice_is_ranked_by_the_peak_each_change_gives():
  """Params + reference + Adam + gradients dominate (16 + 11 of 27 GiB): bfloat16 params
  first, then dropping the reference, then more micro-batches; remat (already on: the
  activations equal the remat figure) and halving the sampler (not the larger phase) lower
  nothing and are left out."""
  p = _plan()
  m = config.default_config()
  model_cfg = model.ModelConfig.from_dict({**m.model.to_dict(), "vocab_size": 8})
  rl_cfg = spec.RLConfig(kl_coef=0.04, micro_batches=2)
  assert p.peak == 27 * memory.GIB
  tips = memory_advice.advice(p, model_cfg, rl_cfg, device_memory=16 * memory.GIB)
  assert [t.split()[0] for t in tips] == [
    "model.param_dtype='bfloat16'",
    "rl.kl_coef=0",
    "rl.micro_batches=4",
  ]
  assert tips[0].endswith("-> peak 15.00 GiB, still over")  # 8 + max(4 + 1 + 2, 3)
  more = _plan(params=1, ref_params=1, opt_state=2, grads=2)  # As a plan on 2x devices.
  first = memory_advice.advice(
    p, model_cfg, rl_cfg, device_memory=16 * memory.GIB, more_devices=more
  )
  assert first[0] == "8 devices (mesh (1, 8, 1, 1, 1)): each holds less -> peak 9.00 GiB, fits"
  why = memory_advice.explain(p, model_cfg, rl_cfg)
  assert why["gradients"].endswith("(rl.micro_batches = 2): 2 x params")
  one = memory_advice.explain(p, model_cfg, spec.RLConfig(micro_batches=1))
  assert "no accumulator" in one["gradients"]


def test_a_small_plan_shows_mib_and_an_unfit_one_is_one_line():
  small = memory.Plan(
    (1, 1, 1, 1, 1), 2**20, 0, 2**21, 2**20, 5 * 2**20, 5 * 2**20, 2**20, 0, 0, 4, 8
  )
  text = memory_advice.describe(small)
  assert "MiB per device" in text and "  peak                                9.00" in text
  m = config.default_config()
  model_cfg = model.ModelConfig.from_dict({**m.model.to_dict(), "vocab_size": 8})
  with pytest.raises(memory_advice.OutOfMemoryPlan) as e:
    memory_advice.check(_plan(), 16 * memory.GIB, model_cfg, spec.RLConfig(kl_coef=0.04))
  assert "\n" not in str(e.value) and "biggest terms: Adam state 8.00, gradients 8.00" in str(
    e.value
  )


def test_hf_check_that_compared_nothing_is_an_error_unless_nocompare(monkeypatch, capsys):
  figures = dict(
    arch="qwen3", params=1, import_seconds=0.1, logits_mean=0.0, logits_std=1.0,
    logits_absmax=2.0, argmax_last=[0], positions=43, max_abs_diff=None, greedy_mismatches=None,
    tolerance=1e-4, ok=True,
  )  # fmt: skip
  monkeypatch.setattr(hf, "check", lambda *a, **k: dict(figures))
  status, out, err = _run(["hf-check", "--hf_dir=/x"], monkeypatch, capsys)
  assert status == 2 and "compared nothing: transformers and torch are not installed" in err
  assert json.loads(out.splitlines()[-1])["ok"] is None
  status, out, _ = _run(["hf-check", "--hf_dir=/x", "--nocompare"], monkeypatch, capsys)
  assert status == 0 and json.loads(out.splitlines()[-1])["ok"] is True


def test_a_definition_run_again_replaces_its_registration():
  """A config file or notebook cell executed twice registers a new class of the same name;
  another object under a taken name is still refused."""
  reg = registry.Registry("task")
  for _ in range(2):

    class Mine:
      pass

    reg.register("mine")(Mine)
  assert reg.get("mine") is Mine
  with pytest.raises(ValueError, match="already registered"):
    reg.register("mine")(tasks.arithmetic.Arithmetic)


def test_the_sampler_demo_reads_its_flags_the_same_way(monkeypatch, capsys):
  from grpo_jax import demo  # noqa: PLC0415

  monkeypatch.chdir(ROOT)
  try:
    config = demo.parse_flags(["grpo-jax-demo", "--config.num_prompts=3"])
    with pytest.raises(SystemExit) as e:
      demo.parse_flags(["grpo-jax-demo", "--config.num_prompt=3"])
  finally:
    flags.FLAGS.unparse_flags()
  assert config.num_prompts == 3 and e.value.code == 2
  (line,) = capsys.readouterr().err.splitlines()
  assert "did you mean --config.num_prompts?" in line
