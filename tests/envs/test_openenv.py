"""OpenEnv servers as environments (`envs.openenv_env`), against real servers on loopback
ports started here (`envs.openenv_calculator.serve`, and a slow or failing one defined
below): episodes over WebSocket sessions, the failures a network brings, and a training run
through the server that equals the in-process calculator's bit for bit, across a resume."""

import json
import threading
import time

import pytest
import runs

from grpo_jax import tasks
from grpo_jax.envs import base, calculator
from grpo_jax.infra import config_lib
from grpo_jax.trainer import build, train

openenv_calculator = openenv_env = None  # Set by `_openenv` when this module's tests run.


@pytest.fixture(scope="module", autouse=True)
def _openenv():
  """Imports OpenEnv's modules when these tests run, not when pytest collects them:
  openenv.core loads gradio, about 5 s that every test worker would pay at its start."""
  global openenv_calculator, openenv_env
  from grpo_jax.envs import openenv_calculator, openenv_env  # noqa: PLC0415


@pytest.fixture(scope="module")
def server():
  running = openenv_calculator.serve(max_sessions=64)  # The training test's 8 x 8 episodes.
  yield running
  running.stop()


@pytest.fixture(scope="module")
def task():
  return tasks.get("calculator")


@pytest.fixture(scope="module")
def tok(task):
  return task.tokenizer()


def _env(tok, url, **kwargs):
  return openenv_env.OpenEnv(tokenizer=tok, url=url, stop_text=("=",), **kwargs)


def test_an_episode_over_the_server_is_the_in_process_calculators(server, task, tok):
  example = task.example("train", 3, seed=0)
  remote, local = _env(tok, server.url), calculator.Calculator(tokenizer=tok)
  assert tuple(remote.reset(example)) == tuple(local.reset(example)) == ()
  for action in ("T:12+34=", "T:7/2=", "T:((=", f"A:{example.answer}."):
    assert remote.step(action) == local.step(action), action
  assert remote._client is None  # The answer ended the episode: its session is closed.
  remote.reset(example)
  assert remote.step(f"A:{int(example.answer) + 1}.") == base.Step(reward=0.0, done=True)


def test_a_reset_without_the_prompt_draws_the_problem_from_the_seed(server, task, tok):
  """reset_fields=(): the server draws from the seed (a stable hash of the prompt: the G
  episodes of a group get one problem) and sends the question as the first observation."""
  example, other = task.example("train", 0, seed=0), task.example("train", 1, seed=0)
  envs = [_env(tok, server.url, reset_fields=()) for _ in range(3)]
  first = [tok.decode(env.reset(e)) for env, e in zip(envs, (example, example, other))]
  for env in envs:
    env.close()
  assert first[0] == first[1] != first[2]
  assert first[0].startswith("Q:") and first[0].endswith("\n")
  # sha256("Q:(3*67)+1\n") starts 39 f7 c3 37: little-endian 0x37c3f739, top bit cleared.
  assert openenv_env.seed_of(example) == 0x37C3F739 == 935589689


def test_resets_go_out_at_once_and_come_back_in_order_with_their_errors(server, task, tok):
  examples = [task.example("train", i, seed=0) for i in range(6)]
  envs = [_env(tok, server.url, reset_fields=()) for _ in examples]
  envs[2].observation_field = "question"  # Not a field of this server's observations.
  got = openenv_env.OpenEnv.reset_all(envs, examples)
  assert isinstance(got[2], KeyError) and "has no field 'question'" in str(got[2])
  for env, example, obs in zip(envs, examples, got):
    env.close()
    if env is not envs[2]:
      alone = _env(tok, server.url, reset_fields=())
      assert tok.decode(obs) == tok.decode(alone.reset(example))  # The problem of its seed.
      alone.close()
  # The in-process default: one by one, the same contract.
  local = [calculator.Calculator(tokenizer=tok) for _ in examples]
  assert calculator.Calculator.reset_all(local, examples) == [[] for _ in examples]


def test_options_are_checked_in_one_line(tok):
  with pytest.raises(ValueError, match="url='localhost:8000'"):
    openenv_env.OpenEnv(tokenizer=tok, url="localhost:8000")
  with pytest.raises(ValueError, match=r"reset_fields \['question'\]: allowed fields"):
    openenv_env.OpenEnv(tokenizer=tok, url="http://x", reset_fields=("question",))
  with pytest.raises(ValueError, match="timeouts must be > 0"):
    openenv_env.OpenEnv(tokenizer=tok, url="http://x", timeout_s=0)
  assert base.stop_ids(openenv_env.OpenEnv, tok, {"stop_text": ("=",)}) == tuple(
    sorted({*tok.eos_ids, tok.encode("=")[0]})
  )
  with pytest.raises(ValueError, match="turn-end text 'T:' is 2 tokens"):
    base.stop_ids(openenv_env.OpenEnv, tok, {"stop_text": ("T:",)})


def _calculator(url: str, **env_kwargs):
  c = config_lib.load("configs/calculator.py:openenv")
  with c.unlocked():
    c.env.kwargs.update(url=url, **env_kwargs)
  return c


def test_an_unreachable_server_is_one_error_before_anything_compiles(server):
  """build checks GET /health: refused at once, with the URL, the cause and what to do."""
  closed = server.url.rsplit(":", 1)[0] + ":1"
  t0 = time.perf_counter()
  with pytest.raises(config_lib.ConfigError) as e:
    build.build(_calculator(closed, retries=1, connect_timeout_s=2.0))
  message = str(e.value)
  assert "\n" not in message and f"url='{closed}'" in message, message
  assert "Connection refused" in message and "openenv_calculator --port" in message
  assert time.perf_counter() - t0 < 5
  assert build.build(_calculator(server.url)).episodes.name == "openenv"


def _troubled_app():
  """A server whose steps are slow or fail: what the adapter does with them. A step
  "sleep <s>" answers "S:<s>;" after s seconds; "boom" raises on the server."""
  from openenv.core import env_server  # noqa: PLC0415 -- gradio: see `_openenv`.

  from grpo_jax.envs import openenv_calculator  # noqa: PLC0415 -- its text action/observation.

  Observation = openenv_calculator.TextObservation

  class Troubled(env_server.Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed=None, episode_id=None, **kwargs):
      return Observation(text="")

    def step(self, action, timeout_s=None, **kwargs):
      if action.text == "boom":
        raise RuntimeError("the tool exploded")
      seconds = float(action.text.split()[1])
      time.sleep(seconds)
      return Observation(text=f"S:{seconds:g};", reward=0.5)

    @property
    def state(self):
      return env_server.State()

  return env_server.create_app(
    Troubled, openenv_calculator.TextAction, Observation, max_concurrent_envs=4
  )


@pytest.fixture(scope="module")
def troubled():
  import uvicorn  # noqa: PLC0415

  app = _troubled_app()
  srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="critical"))
  thread = threading.Thread(target=srv.run, daemon=True)
  thread.start()
  while not srv.started:
    time.sleep(0.02)
  yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
  srv.should_exit = True
  thread.join(timeout=10)


def test_a_late_reply_closes_the_session_and_a_server_error_is_its_message(troubled, task, tok):
  example = task.example("train", 0, seed=0)
  env = openenv_env.OpenEnv(tokenizer=tok, url=troubled, timeout_s=0.3)
  env.reset(example)
  assert tok.decode(env.step("sleep 0").observation) == "S:0;"
  assert env.step("sleep 0").reward == 0.5
  t0 = time.perf_counter()
  with pytest.raises(TimeoutError, match=r"sent no reply within 0\.3 s"):
    env.step("sleep 1")
  assert time.perf_counter() - t0 < 1.0 and env._client is None
  with pytest.raises(RuntimeError, match="reset first"):  # Never the late reply.
    env.step("sleep 0")
  env.reset(example)
  with pytest.raises(RuntimeError, match="the tool exploded"):
    env.step("boom")
  assert tok.decode(env.step("sleep 0").observation) == "S:0;"  # The session goes on.
  env.close()


def test_a_server_at_capacity_refuses_in_words_that_say_what_to_change(task, tok):
  small = openenv_calculator.serve(max_sessions=1)
  try:
    example = task.example("train", 0, seed=0)
    first = openenv_env.OpenEnv(tokenizer=tok, url=small.url)
    first.reset(example)
    second = openenv_env.OpenEnv(tokenizer=tok, url=small.url, retries=1)
    with pytest.raises(ConnectionError, match="max_concurrent_envs >= the episodes in flight"):
      second.reset(example)
    first.close()
    time.sleep(0.2)  # The server frees the first session.
    assert tuple(second.reset(example)) == ()
    second.close()
  finally:
    small.stop()


# A training run through the server equals the in-process environment's, across a resume.
def _run(workdir, *, iterations: int, **env):
  """configs/calculator.py:tiny from its learning test's committed warm start (33.6%
  greedy: real rewards, ~3 turns an episode), 8 prompts × G = 8 an iteration."""
  c = config_lib.load("configs/calculator.py:tiny")
  c.update(prompts_per_step=8, iterations=iterations, eval_every=2, eval_size=16)
  c.update(eval_samples=0, checkpoint_every=1, reward_workers=0, progress=False)
  c.tensorboard = False
  if env:
    with c.unlocked():
      c.env.update(name="openenv", kwargs=env)
  if not (workdir / "checkpoints").exists():
    runs._copy_warm_start(runs.WARM_STARTS / "calculator_tiny", workdir, fresh=True)
  return train.run(c, workdir, log=lambda _: None)


def test_training_through_the_server_equals_the_in_process_run_across_a_resume(
  server, tok, tmp_path
):
  """Same warm start, same seed: the in-process calculator for 2 iterations; the OpenEnv
  server for 1, then resumed to 2. Every metric (timing aside) is equal, float for float:
  the rewards, turns, losses and gradient norms of both updates, and the held-out accuracy
  after the second (read from the params it made)."""
  local = _run(tmp_path / "local", iterations=2)
  url = dict(url=server.url, stop_text=("=",))
  _run(tmp_path / "remote", iterations=1, **url)
  remote = _run(tmp_path / "remote", iterations=2, **url)
  runs.assert_episodes_resume_equal(tmp_path / "local", tmp_path / "remote", (local, remote))
  # The episode loop closed every session it opened: the server (64 at most) has room for
  # 64 new ones, none retried.
  example = tasks.get("calculator").example("train", 0, seed=0)
  fresh = [openenv_env.OpenEnv(tokenizer=tok, url=server.url, retries=0) for _ in range(64)]
  for env in fresh:
    assert tuple(env.reset(example)) == ()
  for env in fresh:
    env.close()


def test_the_committed_learning_record_is_its_json_and_learns_identically():
  """experiments/results/openenv/calculator_tiny (the full run: ~9 minutes, not in CI):
  its markdown is the script's rendering of its JSON, the arms agree on every untimed
  metric, and the run through the server learns."""
  import env_adapters  # noqa: PLC0415 -- experiments/ is on sys.path.

  out = env_adapters.ADAPTERS["openenv"]["out"]
  record = json.loads(out.with_suffix(".json").read_text())
  assert record["verdict"] == "not judged" and record["seeds"] == [record["seed"]] == [0]
  assert out.with_suffix(".md").read_text() == env_adapters.markdown(record)
  summary = record["summary"]
  assert summary["identical"] and summary["differing_keys"] == []
  curve = summary["arms"]["openenv"]["curve"]
  assert curve == summary["arms"]["in_process"]["curve"] and curve[-1][1] - curve[0][1] > 0.2
  assert [r["iteration"] for r in record["lines"]["openenv"]] == list(range(201))
