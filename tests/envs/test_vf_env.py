"""verifiers environments (Prime Intellect's library) as tasks ("vf:<env_id>",
`tasks.vf_tasks`) and episodes ("verifiers", `envs.vf_env`): rows drawn by epoch, each
episode the environment's own rollout through a real OpenAI client, single- and multi-turn,
completion and chat, the failures, and a training run through it that equals the
in-process calculator's bit for bit across a resume."""

import asyncio
import concurrent.futures
import json
import pathlib
import re
import sys
import time
import types

import datasets
import pytest
import runs
import verifiers as vf

from grpo_jax import tasks
from grpo_jax.envs import aio, base, calculator, vf_calculator, vf_env
from grpo_jax.infra import config_lib
from grpo_jax.tasks import vf_tasks
from grpo_jax.trainer import build, train

CALC = "grpo_jax.envs.vf_calculator"  # The calculator as a verifiers MultiTurnEnv.
SMALL = dict(size=64, eval_size=16)
QWEN3 = str(pathlib.Path(__file__).parents[1] / "fixtures" / "hf" / "qwen3")


def _module(name: str, load_environment) -> str:
  """An importable module with `load_environment`, as an installed environment package is
  (verifiers imports the module named by the env_id)."""
  module = types.ModuleType(name)
  module.load_environment = load_environment
  sys.modules[name] = module
  return name


@pytest.fixture(scope="module")
def calc():
  return tasks.get(f"vf:{CALC}", env_args=SMALL)


def test_rows_are_drawn_epoch_by_epoch_from_the_environments_datasets(calc):
  """Training indices 0-63 are the 64 rows of its dataset, each once, then a reshuffled
  epoch; held-out ones come from its eval_dataset; the same (split, index, seed) is the
  same row, and the prompts, answers and references are the rows'."""
  first = [calc.example("train", i, seed=0) for i in range(64)]
  second = [calc.example("train", 64 + i, seed=0) for i in range(64)]
  assert sorted(x.row for x in first) == list(range(64)) == sorted(x.row for x in second)
  assert [x.row for x in first] != [x.row for x in second]
  assert calc.example("train", 5, seed=0) == first[5] != calc.example("train", 5, seed=1)
  held = {calc.example("test", i, seed=0).row for i in range(16)}
  assert held == set(range(16)) and calc.example("test", 0, seed=0).source == "eval_dataset"
  env, x = calc.env(), first[7]
  assert x.source == "dataset" and x.prompt == env.dataset[x.row]["prompt"]
  assert x.answer == str(calculator.Calculator.calculate(x.prompt[2:-1])[:-1])
  assert x.reference == env.dataset[x.row]["info"]["reference"] and x.reference.endswith(
    f"A:{x.answer}."
  )
  assert calc.reward(x.prompt, x.reference) == 1.0 and calc.reward(x.prompt, "A:0.") == 0.0
  assert "64 training rows" in calc.data_notes()[0] and "16 held-out rows" in calc.data_notes()[0]


def _actions(reference: str) -> list[str]:
  return re.findall(r"T:[^=]+=|A:-?\d+\.", reference)


def test_an_episode_is_the_in_process_calculators_step_for_step(calc):
  """The reference transcripts, a wrong answer, an unreadable call and a stray action: the
  environment's own rollout gives the in-process environment's observations, rewards and
  ends, step for step."""
  tok = calc.tokenizer()
  for i in range(12):
    x = calc.example("train", i, seed=3)
    acts = _actions(x.reference)
    plays = [acts, acts[:-1] + [f"A:{int(x.answer) + 1}."], ["T:1/0=", "T:2*3=", "xyz"], ["A:"]]
    for actions in plays:
      ours, theirs = (
        vf_env.VfEnv(tokenizer=tok, stop_text=("=",)),
        calculator.Calculator(tokenizer=tok),
      )
      assert tuple(ours.reset(x)) == tuple(theirs.reset(x)) == ()
      for action in actions:
        a, b = ours.step(action), theirs.step(action)
        assert (a.observation, a.reward, a.done) == (tuple(b.observation), b.reward, b.done), action
        if b.done:
          break


def _single_turn():
  rows = [{"prompt": f"Q:{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]

  def exact(completion, answer, **kwargs) -> float:
    return float(completion.strip() == answer)

  return vf.SingleTurnEnv(
    dataset=datasets.Dataset.from_list(rows), message_type="completion",
    rubric=vf.Rubric(funcs=[exact]),
  )  # fmt: skip


def test_a_single_turn_environment_is_one_action_scored_by_its_rubric():
  """A SingleTurnEnv without an eval_dataset: its rows split by prompt hash (disjoint, all
  used), and an episode is one action that its rubric scores."""
  task = tasks.get("vf:" + _module("vf_test_single", lambda: _single_turn()), test_percent=20)
  train_rows = {task.example("train", i, seed=0).row for i in range(200)}
  test_rows = {task.example("test", i, seed=0).row for i in range(200)}
  assert not train_rows & test_rows and len(train_rows | test_rows) == 100
  assert 8 <= len(test_rows) <= 35
  x = task.example("test", 0, seed=0)
  for action, reward in ((x.answer, 1.0), (x.answer + "0", 0.0)):
    env = vf_env.VfEnv(tokenizer=task.tokenizer())
    assert env.reset(x) == ()
    assert env.step(action) == base.Step(reward=reward, done=True)
    assert task.reward(x.prompt, action) == reward


class _Echo(vf.MultiTurnEnv):
  """Chat: the environment answers each assistant turn with a user turn quoting it, twice."""

  async def is_completed(self, messages, state, **kwargs) -> bool:
    return state["turn"] >= 3

  async def env_response(self, messages, state, **kwargs):
    return [{"role": "user", "content": _said(messages[-1]["content"])}], state


def _said(action: str) -> str:
  return f"You said {action!r}."


def _echo():
  def turns(completion, **kwargs) -> float:
    return float(sum(m["role"] == "assistant" for m in completion))

  rows = datasets.Dataset.from_list(
    [{"question": f"Say {w}.", "answer": w} for w in ("hi", "yes", "no")]
  )
  return _Echo(
    dataset=rows, eval_dataset=rows, system_prompt="Be brief.", rubric=vf.Rubric(funcs=[turns])
  )


def _chat_task(tokenizer_dir: str):
  return tasks.get("vf:" + _module("vf_test_echo", _echo), tokenizer_dir=tokenizer_dir)


def test_a_chat_environment_reads_as_the_chat_template_renders_the_conversation():
  """With a ChatML template: the prompt is the row's messages rendered with the generation
  prompt, and after each action ended by EOS (<|im_end|>) the context's ids are exactly
  the template's rendering of the conversation so far, its special tokens as their ids;
  the environment's text (which quotes the action, "<|im_end|>" included) stays text."""
  task = _chat_task(QWEN3)
  tok = task.tokenizer()
  x = task.example("train", 0, seed=0)
  messages = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": f"Say {x.answer}."},
  ]
  assert x.prompt == tok.apply_chat_template(messages, add_generation_prompt=True)
  (start,), (end,) = tok.encode("<|im_start|>"), tok.encode("<|im_end|>")
  assert end in tok.eos_ids
  env, context = vf_env.VfEnv(tokenizer=tok), tok.encode(x.prompt)
  assert env.reset(x) == ()
  for turn, action in enumerate(("Hello there", "a<|im_end|>b", "Done")):
    env.action_eos = True  # As the episode loop sets it: the action ended with <|im_end|>.
    step = env.step(action)
    messages.append({"role": "assistant", "content": action})
    if step.done:
      assert turn == 2 and step.reward == 3.0
      break
    messages.append({"role": "user", "content": _said(action)})
    context += tok.encode(action, special=False) + [end] + list(step.observation)
    assert tok.decode_all(context) == tok.apply_chat_template(messages, add_generation_prompt=True)
    assert [t for t in step.observation if t in (start, end)] == [start, end, start]
  else:
    pytest.fail("the rollout did not end after three actions")


def test_a_turn_cut_before_its_eos_gets_the_end_of_turn_and_real_templates_work(tmp_path):
  """An action cut before its EOS (turn_tokens, or a stop text): the observation starts
  with the template's end-of-turn token. With the real Qwen3 template, which renders a
  past assistant turn differently from the last one, every turn still continues."""
  from tests.models import test_chat_templates  # noqa: PLC0415 -- the real templates' tokenizer directories.

  test_chat_templates.make_dir(tmp_path / "qwen3", "qwen3")
  for tokenizer_dir in (QWEN3, str(tmp_path / "qwen3")):
    task = _chat_task(tokenizer_dir)
    tok, x = task.tokenizer(), task.example("train", 1, seed=0)
    (end,) = tok.encode("<|im_end|>")
    env = vf_env.VfEnv(tokenizer=tok)
    env.reset(x)
    env.action_eos = False
    cut = env.step("Hello the")
    assert cut.observation[0] == end and not cut.done
    assert tok.decode_all(cut.observation).startswith(
      "<|im_end|>\n<|im_start|>user\nYou said 'Hello the'.<|im_end|>\n<|im_start|>assistant\n"
    )
    env.action_eos = True
    again = env.step("<think>\nShort.\n</think>\n\nOK")
    assert tok.decode_all(again.observation).startswith("\n<|im_start|>user\nYou said ")
    assert env.step("Bye") == base.Step(reward=3.0, done=True)


class _Broken(vf.MultiTurnEnv):
  """A tool that raises, or (actions "slow..."/"wait...") sleeps first: 3 s, or 0.3 s."""

  async def setup_state(self, state, **kwargs):
    await asyncio.sleep(float(state["info"].get("setup_s", 0.0)))
    return state

  async def is_completed(self, messages, state, **kwargs):
    return False

  async def env_response(self, messages, state, **kwargs):
    action = messages[len(state["prompt"]) :].rsplit("\n", 1)[-1]
    await asyncio.sleep(
      3.0 if action.startswith("slow") else 0.3 if action.startswith("wait") else 0.0
    )
    if action.startswith("wait"):
      return "0;", state
    raise RuntimeError("the tool crashed")


def _raising(setup_s: float = 0.0):
  rows = [{"prompt": f"Q:{i}\n", "answer": "0", "info": {"setup_s": setup_s}} for i in range(40)]
  return _Broken(dataset=datasets.Dataset.from_list(rows), message_type="completion")


def test_failures_are_one_clear_error(calc):
  """An environment that is not installed, a chat environment without a chat template, a
  rollout of another verifiers interface, a task the environment cannot play, a tool that
  raises or hangs: each says what is wrong."""
  with pytest.raises(ValueError, match="vf:no_such_env_module.*Could not import"):
    tasks.get("vf:no_such_env_module")
  with pytest.raises(ValueError, match="chat environment: set config.hf_dir"):
    tasks.get("vf:" + _module("vf_test_echo2", _echo))

  class Newer(vf.SingleTurnEnv):  # verifiers 0.1.8's interface.
    async def rollout(self, input, client, model, sampling_args=None):
      raise AssertionError

  newer = lambda: Newer(dataset=_single_turn().dataset, message_type="completion")
  with pytest.raises(ValueError, match=r"not verifiers 0.1.x's \(client, model, prompt, answer"):
    tasks.get("vf:" + _module("vf_test_newer", newer))
  with pytest.raises(
    ValueError, match="plays the rows of a verifiers environment's task, not task 'calculator'"
  ):
    vf_env.VfEnv.check_task(tasks.get("calculator"))
  vf_env.VfEnv.check_task(calc)
  with pytest.raises(TypeError, match="set config.task.name = 'vf:<env_id>'"):
    vf_env.VfEnv(tokenizer=calc.tokenizer()).reset(
      tasks.get("calculator").example("train", 0, seed=0)
    )
  with pytest.raises(ValueError, match="timeout_s=0"):
    vf_env.VfEnv(tokenizer=calc.tokenizer(), timeout_s=0)

  task = tasks.get("vf:" + _module("vf_test_broken", _raising))
  x = task.example("train", 0, seed=0)
  env = vf_env.VfEnv(tokenizer=task.tokenizer(), timeout_s=0.5)
  env.reset(x)
  with pytest.raises(RuntimeError, match="the tool crashed"):
    env.step("7")
  env.reset(x)
  with pytest.raises(TimeoutError, match="did not answer within 0.5 s"):
    env.step("slow")
  with pytest.raises(RuntimeError, match="no pending model turn"):
    env.step("7")  # The timed-out episode was stopped.

  def tools(**kwargs):
    return vf.ToolEnv(dataset=_single_turn().dataset, tools=[len], message_type="chat")

  with pytest.raises(ValueError, match=r"offers tools \(oai_tools: a ToolEnv\)"):
    tasks.get("vf:" + _module("vf_test_tools", tools), tokenizer_dir=QWEN3)


def test_episodes_wait_on_the_loop_each_under_its_own_timeout():
  """Resets start every rollout at once (16 setups of 0.3 s each take well under 16 x
  0.3 s); a slow tool times out its own episode, not one stepping beside it; closing an
  episode wakes the step waiting on it at once."""
  task = tasks.get("vf:" + _module("vf_test_slow_setup", lambda: _raising(0.3)))
  xs = [task.example("train", i, seed=0) for i in range(16)]
  envs = [vf_env.VfEnv(tokenizer=task.tokenizer(), timeout_s=2.0) for _ in xs]
  t0 = time.perf_counter()
  assert vf_env.VfEnv.reset_all(envs, xs) == [()] * 16
  assert time.perf_counter() - t0 < 2.0
  slow, quick = envs[0], envs[1]
  slow.timeout_s = 1.0
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    a, b = pool.submit(slow.step, "slow"), pool.submit(quick.step, "wait")
    assert b.result(timeout=5) == base.Step(observation=tuple(task.tokenizer().encode("0;")))
    with pytest.raises(TimeoutError, match="within 1 s"):
      a.result(timeout=5)
    waiting = pool.submit(quick.step, "slow")
    time.sleep(0.2)
    t0 = time.perf_counter()
    quick.close()
    with pytest.raises(RuntimeError, match="was closed"):
      waiting.result(timeout=5)
    assert time.perf_counter() - t0 < 0.5
  for env in envs:
    env.close()


def test_a_task_reward_works_inside_a_running_event_loop(calc):
  """A notebook runs an event loop: the rubric then runs on a loop of its own thread."""
  x = calc.example("test", 0, seed=0)

  async def inside():
    return calc.reward(x.prompt, x.reference)

  assert asyncio.run(inside()) == 1.0


def test_a_config_pairing_verifiers_with_another_task_is_refused_at_build():
  c = config_lib.load("configs/calculator.py:tiny")
  with c.unlocked():
    c.env.update(name="verifiers", kwargs=dict(stop_text=("=",)))
  with pytest.raises(ValueError, match="config.env.name='verifiers' plays the rows"):
    build.build(c)


# Training through the verifiers environment equals the in-process calculator's.
def _run(workdir, *, iterations: int, env: str):
  """configs/calculator.py:verifiers (env "verifiers") or the same rows played by the
  in-process calculator (env "calculator"), from the calculator's committed warm start
  (33.6% greedy), 8 prompts × G = 8 an iteration."""
  c = config_lib.load("configs/calculator.py:verifiers")
  with c.unlocked():
    c.task.kwargs.env_args.update(SMALL)
  c.update(prompts_per_step=8, iterations=iterations, eval_every=2, eval_size=16)
  c.update(eval_samples=0, checkpoint_every=1, reward_workers=0, progress=False)
  c.tensorboard = False
  if env == "calculator":
    with c.unlocked():
      c.env.name, c.env.kwargs = "calculator", {}
  if not (workdir / "checkpoints").exists():
    runs._copy_warm_start(runs.WARM_STARTS / "calculator_tiny", workdir, fresh=True)
  return train.run(c, workdir, log=lambda _: None)


def test_training_through_verifiers_equals_the_in_process_run_across_a_resume(tmp_path):
  """Same rows, same warm start, same seed: the in-process calculator for 2 iterations;
  the verifiers environment's rollouts for 1, then resumed to 2. Every untimed metric is
  equal, float for float (rewards, turns, losses, the held-out accuracy after the second)."""
  local = _run(tmp_path / "local", iterations=2, env="calculator")
  _run(tmp_path / "vf", iterations=1, env="verifiers")
  remote = _run(tmp_path / "vf", iterations=2, env="verifiers")
  runs.assert_episodes_resume_equal(tmp_path / "local", tmp_path / "vf", (local, remote))


def test_the_committed_learning_record_is_its_json_and_learns_identically():
  """experiments/results/verifiers/calculator_tiny (`experiments/env_adapters.py --adapter
  verifiers`, the full run: not in CI): its markdown is the script's rendering of its JSON,
  the arms agree on every untimed metric, and the run through verifiers learns."""
  import env_adapters  # noqa: PLC0415 -- experiments/ is on sys.path.

  out = env_adapters.ADAPTERS["verifiers"]["out"]
  record = json.loads(out.with_suffix(".json").read_text())
  assert record["adapter"] == "verifiers" and record["verdict"] == "not judged"
  assert record["seeds"] == [record["seed"]] == [0]
  assert out.with_suffix(".md").read_text() == env_adapters.markdown(record)
  summary = record["summary"]
  assert summary["identical"] and summary["differing_keys"] == []
  curve = summary["arms"]["verifiers"]["curve"]
  assert curve == summary["arms"]["in_process"]["curve"] and curve[-1][1] > curve[0][1]
  assert [r["iteration"] for r in record["lines"]["verifiers"]] == list(range(201))


def test_the_shared_loop_runs_coroutines_and_times_them_out():
  """envs.aio: one loop thread for every environment; a result, an exception, and a
  timeout that cancels the coroutine and says so (the same class on every Python)."""
  assert aio.loop() is aio.loop() and aio.loop().is_running()

  async def twice(x):
    return 2 * x

  async def fail():
    raise KeyError("boom")

  cancelled = []

  async def forever():
    try:
      await asyncio.sleep(60)
    except asyncio.CancelledError:
      cancelled.append(True)
      raise

  assert aio.call(twice(21), 5.0) == 42
  with pytest.raises(KeyError, match="boom"):
    aio.call(fail(), 5.0)
  with pytest.raises(TimeoutError, match="no result within 0.2 s"):
    aio.call(forever(), 0.2)
  time.sleep(0.1)
  assert cancelled == [True]


def test_rows_carry_their_fields_and_arguments_are_canonical():
  """vf_tasks: env_args as sorted JSON (one cache entry per set of arguments), a row's
  missing task and info filled in and JSON info read; vf_calculator's rubric scores a bare
  transcript by its last action."""
  assert (
    vf_tasks.args_json({"b": 1, "a": [2]})
    == '{"a": [2], "b": 1}'
    == vf_tasks.args_json({"a": [2], "b": 1})
  )
  with pytest.raises(ValueError, match="must be JSON values"):
    vf_tasks.args_json({"f": len})

  class Rows:
    dataset = [
      {"prompt": "Q:1\n", "answer": 7, "info": '{"reference": "A:7."}'},
      {"prompt": "Q:2\n"},
    ]

  assert vf_tasks.row(Rows, "dataset", 0) == {
    "prompt": "Q:1\n", "answer": "7", "task": "default", "info": {"reference": "A:7."}
  }  # fmt: skip
  assert (
    vf_tasks.row(Rows, "dataset", 1)["info"] == {}
    and vf_tasks.row(Rows, "dataset", 1)["answer"] == ""
  )
  state = vf_tasks._score_state()
  assert vf_calculator.correct_answer("T:2+3=5;A:5.", "5", state) == 1.0
  assert vf_calculator.correct_answer("T:2+3=5;A:6.", "5", state) == 0.0
  assert vf_calculator.correct_answer("A:5. and more", "5", state) == 0.0
  env = vf_calculator.load_environment(size=8, eval_size=4)
  assert (len(env.dataset), len(env.eval_dataset), env.message_type) == (8, 4, "completion")
