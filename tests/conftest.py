"""Shared fixtures: one tiny model and its compiled sampler per test process."""

import fcntl
import functools
import os

# libtpu is installed (the test extra) for the ahead-of-time TPU tests, which load a
# topology themselves (`infra.tpu`); everything runs on CPU, so jax must not try to start
# a TPU backend (libtpu's probe prints errors on a host without one).
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import needs  # noqa: E402 -- tests/ is on sys.path (pytest rootdir conftest).
import subproc  # noqa: E402

# One core per xdist worker where there are as many workers as cores (CI: 2 and 2), set
# before jax sizes its thread pools; the children a test starts inherit it
# (`subproc.pin_worker` has the measurement).
subproc.pin_worker()

# Compile fast (subproc.FAST_COMPILE; its docstring has the measurements), set before jax
# starts its CPU backend, which reads XLA_FLAGS once.
os.environ["XLA_FLAGS"] = subproc.xla_flags()

import compile_profile  # noqa: E402
import hypothesis  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")
# The test processes (and the subprocesses tests start, `subproc.child_env`) share JAX's
# persistent compilation cache: a program compiled by one is loaded by the others.
jax.config.update("jax_compilation_cache_dir", str(subproc.COMPILATION_CACHE))
# Every program, however quick to compile (most tiny-model programs take 0.3-0.7 s, under
# JAX's default 1 s threshold): with two workers and the CLI subprocesses, a cold-cache
# run of test_offpolicy + test_ibpo_train took 112 s against 125 s with the default.
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
# GRPO_JAX_COMPILE_PROFILE=<dir>: JAX's tracing and compiling seconds per test (off: nothing).
PROFILING = compile_profile.install()

# Property tests draw the same examples on every run unless HYPOTHESIS_PROFILE=explore: a
# test that passes once passes in CI (a failure is a bug, not a flake). "explore" draws new
# examples each run and keeps failures in .hypothesis/ (to look for bugs on purpose).
hypothesis.settings.register_profile("ci", derandomize=True, database=None, deadline=None)
hypothesis.settings.register_profile("explore", deadline=None)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from grpo_jax import tasks  # noqa: E402
from grpo_jax.models import model, sampling  # noqa: E402

# Modules, most expensive first (worker seconds, `--durations`, 2-core CPU). pyproject.toml
# runs the tests with `--dist loadscope --no-loadscope-reorder`: each worker takes a whole
# module (a class, for test classes) at a time, in this order, so module fixtures are set up
# once, the long modules start first and the last minutes are short modules on both workers
# (longest first, the makespan is within 4/3 of the best). Modules not named here follow.
MODULE_ORDER = (
  "test_smollm2", "test_lora", "test_episodes", "test_reasoning_gym_learning",
  "test_experiments", "test_faults", "test_aot", "test_families", "test_learning",
  "test_paged", "test_memory", "test_reward_model", "test_long_learning", "test_multihost",
  "test_sharding", "test_sampling", "test_offpolicy", "test_model", "test_kernels",
  "test_moe_learning", "test_lora_learning", "test_reproductions", "test_packing",
  "test_train", "test_hf", "test_ibpo_train", "test_rl", "test_eval_command", "test_readme",
  "test_distill", "test_routing_replay", "test_extending", "test_chunked_logits",
  "test_counterfactual_bias", "test_reasoning_gym", "test_diagnostics_experiments",
)  # fmt: skip


# GRPO_JAX_NO_SKIPS=1 (`.ci/run`): a skipped test fails the run. CI installs what every
# test needs (torch, transformers, peft, SmolLM2's GGUF) and expects every machine feature
# (`needs`), so a skip there means a test that checked nothing.
NO_SKIPS = "GRPO_JAX_NO_SKIPS"


def pytest_configure(config):
  needs.expected_missing()  # A misspelt GRPO_JAX_EXPECT_MISSING fails before any test.


def _skipped(config) -> list:
  reporter = config.pluginmanager.get_plugin("terminalreporter")
  return list(reporter.stats.get("skipped", [])) if reporter else []


def pytest_terminal_summary(terminalreporter, config):
  skipped = _skipped(config)
  if os.environ.get(NO_SKIPS) == "1" and skipped:
    terminalreporter.write_sep("=", f"{NO_SKIPS}=1 and {len(skipped)} tests skipped", red=True)
    for report in skipped:
      terminalreporter.write_line(f"  {report.nodeid}: {report.longrepr[-1]}")


def pytest_sessionfinish(session):
  if os.environ.get(NO_SKIPS) == "1" and _skipped(session.config) and session.exitstatus == 0:
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  """GRPO_JAX_COMPILE_PROFILE: a line per test, in the process that ran it (xdist's
  controller also sees each test's reports, and would write lines of its own)."""
  if PROFILING:
    compile_profile.first_test()
  yield
  if PROFILING:
    compile_profile.flush(item.nodeid)


def pytest_runtest_setup(item):
  """`pytest.mark.needs(what, missing)`: skip or fail where the machine lacks it (`needs`)."""
  for mark in item.iter_markers("needs"):
    needs.require(*mark.args)


def pytest_collection_modifyitems(config, items):
  """The tests of MODULE_ORDER first, module by module in that order; the rest keep
  theirs."""
  rank = {name: i for i, name in enumerate(MODULE_ORDER)}
  items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))


@pytest.fixture(scope="session")
def tokenizer():
  return tasks.get("arithmetic").tokenizer()


@pytest.fixture(scope="session")
def tiny_cfg(tokenizer):
  return model.tiny_config(tokenizer.vocab_size)


@pytest.fixture(scope="session")
def tiny_params(tiny_cfg):
  # Scaled-up embeddings give peaked, input-dependent logits, so equality tests bite.
  params = model.init(tiny_cfg, jax.random.key(0))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0
  return params


@pytest.fixture(scope="session")
def sampler_cfg(tokenizer):
  return sampling.SamplerConfig(
    max_new_tokens=10,
    eos_ids=tokenizer.eos_ids,
    pad_id=tokenizer.pad_id,
    group_size=4,
    prompt_buckets=(8, 16),
  )


@pytest.fixture(scope="session")
def tiny_sampler(tiny_cfg, sampler_cfg):
  return sampling.make_policy_sampler(tiny_cfg, sampler_cfg)


@pytest.fixture(scope="session")
def tiny_model_fn(tiny_cfg):
  return jax.jit(model.make_model_fn(tiny_cfg), static_argnames="logits_slice")


@pytest.fixture(scope="session")
def init_cache(tiny_cfg):
  return functools.partial(model.init_cache, tiny_cfg)


@pytest.fixture(scope="module")
def tpu_compiled_once():
  """The module's TPU compiles, each distinct program once a machine (`cheap_tpu.memo`:
  within the module, and from an earlier session's records); yields its counts."""
  import cheap_tpu  # noqa: PLC0415 -- imports the trainer's aot, for the modules that use it.

  with cheap_tpu.memo() as counts:
    yield counts


@pytest.fixture(scope="session")
def mesh_warm_start(tmp_path_factory):
  """(directory, base): tests/mesh_run.py's warm start (one device, checkpoint 0) in
  `base`, and its one-device RL iteration in directory/1x1x1.npz, made once per test
  session: test_sharding and test_multihost resume from copies of it. xdist's workers
  share it: the first to ask makes it under a lock, the others wait for it."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # The session's directory, above each worker's own.
  out = root / "mesh_warm"
  with open(root / "mesh_warm.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (out / "done").exists():
      out.mkdir(exist_ok=True)
      script = subproc.ROOT / "tests" / "mesh_run.py"
      subproc.run([script, out, "1,1,1", "--warm", out / "base"], devices=1)
      (out / "done").touch()
  return out, out / "base"


@pytest.fixture
def server(monkeypatch):
  """A scripted OpenAI-compatible judge on 127.0.0.1 (`judge_server`), proxies unset."""
  import judge_server  # noqa: PLC0415 -- only the judge tests start one.

  for name in judge_server.PROXY_VARIABLES:
    monkeypatch.delenv(name, raising=False)
  with judge_server.serving() as srv:
    yield srv
