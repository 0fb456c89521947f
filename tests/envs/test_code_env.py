"""The code environment (`envs.code`): run turns on the visible tests only, the final answer
on all tests, could_not_run unscorable, the run limit, observations clipped and encoded
with the task's tokenizer, hidden tests never in a run or an observation; the episode loop
end to end with a scripted model (exact transcripts) and with a tiny transformer."""

import functools
import json
import pathlib

import flax
import jax
import jax.numpy as jnp
import needs
import numpy as np
import pytest
import tokenizers as hf_tokenizers

from grpo_jax import envs, tasks
from grpo_jax.envs import base, episodes
from grpo_jax.envs import code as code_env
from grpo_jax.infra import config_lib
from grpo_jax.models import model, sampling
from grpo_jax.tasks import code as code_task
from grpo_jax.trainer import build
from grpo_jax.verifiers import sandbox, verdicts

ROOT = pathlib.Path(__file__).resolve().parents[2]
QWEN2 = ROOT / "tests" / "fixtures" / "hf" / "qwen2"
MBPP = str(ROOT / "tests" / "fixtures" / "code" / "mbpp.jsonl")
ISOLATION = "namespaces" if not sandbox.namespaces_unavailable() else "none"

ADD_WRONG = "```python\ndef add(a, b):\n  return a - b\n```\n"
ADD_RIGHT = "```python\ndef add(a, b):\n  return a + b\n```"
ADD_VISIBLE_ONLY = "def add(a, b):\n  return 5\n"  # Passes add(2, 3) == 5 only.
ADD_OUT_OF_MEMORY = "def add(a, b):\n  return len(bytearray(10**10))\n"  # fail (memory).
ADD_HANGS = "def add(a, b):\n  while True:\n    pass\n"  # Until the sandbox's timeout.


@pytest.fixture(scope="module")
def task():
  return tasks.get("code", isolation=ISOLATION)


@pytest.fixture(scope="module")
def problems(task):
  return {p.id: p for split in ("train", "test") for p in task.split_problems(split)}


def make_env(task, **kwargs):
  return code_env.CodeRunner(tokenizer=task.tokenizer(), isolation=ISOLATION, **kwargs)


def started(task, problem, **kwargs):
  env = make_env(task, **kwargs)
  assert tuple(env.reset(task.example_of(problem))) == ()
  return env


def text(env, step) -> str:
  return env.tokenizer.decode(step.observation)


def two_visible():
  """An inline problem with two visible and two hidden tests."""
  return code_task.Problem(
    id="mul",
    description="Multiply a and b.",
    signature="def mul(a, b)",
    solution="def mul(a, b):\n  return a * b\n",
    visible_tests=("assert mul(2, 3) == 6", "assert mul(1, 1) == 1"),
    hidden_tests=("assert mul(7, 0) == 0", "assert mul(-2, 5) == -10"),
  )


# ---------------------------------------------------------------------------------------
# Run turns and the final answer.


def test_a_wrong_run_names_the_failing_visible_test_and_the_episode_goes_on(task):
  env = started(task, two_visible())
  step = env.step("```python\ndef mul(a, b):\n  return a + b if a > 1 else a * b\n```\n$")
  assert text(env, step) == "\nvisible tests: 1/2 passed; assert mul(2, 3) == 6: got 5\n"
  assert step.reward == 0.0 and not step.done and env.outcome == ""
  step = env.step("def mul(a, b):\n  return a / 0\n$")
  assert "0/2 passed; assert mul(2, 3) == 6: raised 'ZeroDivisionError" in text(env, step)
  got = text(env, env.step("```python\ndef mul(a, b):\n  return (\n```\n$"))
  assert got.startswith("\nsyntax error: ") and got.endswith(" (line 2)\n"), got


def test_a_correct_run_says_every_visible_test_passed(task):
  env = started(task, two_visible())
  step = env.step("```python\ndef mul(a, b):\n  return a * b\n```$")
  assert text(env, step) == "\nvisible tests: 2/2 passed\n" and not step.done
  assert text(env, env.step("I will think.$")) == "\nno code found\n"


def test_the_final_answer_is_judged_on_the_hidden_tests_too(task, problems):
  env = started(task, problems["add"])
  assert text(env, env.step(ADD_VISIBLE_ONLY + "$")) == "\nvisible tests: 1/1 passed\n"
  assert env.step(ADD_VISIBLE_ONLY) == base.Step(reward=0.0, done=True)
  assert env.outcome == "fail"
  right = started(task, problems["add"])
  assert right.step(ADD_RIGHT) == base.Step(reward=1.0, done=True)
  assert right.outcome == "pass"
  with pytest.raises(RuntimeError, match="the episode is over"):
    right.step(ADD_RIGHT)
  none = started(task, problems["add"])
  assert none.step("I give up.") == base.Step(reward=0.0, done=True)
  assert none.outcome == "no_code"


def test_an_answer_without_code_submits_the_last_run(task, problems):
  env = started(task, problems["add"])
  env.step(ADD_WRONG + "$")
  env.step(ADD_RIGHT + "\n$")
  env.step("no code here$")  # No code: not a run to submit.
  assert env.step("") == base.Step(reward=1.0, done=True) and env.outcome == "pass"
  env = started(task, problems["add"])
  env.step(ADD_RIGHT + "\n$")
  assert env.step(ADD_WRONG).reward == 0.0  # Code of its own: that code is the answer.


def test_the_codes_own_failures_are_zeros_and_reported(task, problems):
  env = started(task, problems["add"])
  step = env.step(ADD_OUT_OF_MEMORY + "$")
  assert text(env, step) == "\nvisible tests: 0/1 passed; assert add(2, 3) == 5: MemoryError\n"
  assert env.step(ADD_OUT_OF_MEMORY).reward == 0.0
  assert (env.outcome, env.cause) == ("fail", "memory")
  slow = started(task, problems["add"], run_timeout_s=0.5)
  step = slow.step("def add(a, b):\n  while True:\n    pass\n$")
  assert (
    text(slow, step) == "\nvisible tests: 0/1 passed; timed out after 0.5s (0 of 1 tests done)\n"
  )


def test_a_failing_sandbox_is_unscorable_on_the_answer_and_reported_on_a_run(
  task, problems, monkeypatch
):
  needs.require("namespaces", sandbox.namespaces_unavailable())  # The fallback never refuses.
  from grpo_jax.verifiers.sandbox import runner

  env = started(task, problems["add"])
  monkeypatch.setattr(runner, "namespaces_unavailable", lambda: "user namespaces are off")
  step = env.step(ADD_RIGHT + "\n$")
  assert text(env, step).startswith("\ncould not run: sandbox refused") and not step.done
  with pytest.raises(verdicts.Unscorable, match="code add: could not run the tests") as e:
    env.step(ADD_RIGHT)
  assert (env.outcome, env.cause, e.value.label) == ("could_not_run", "sandbox", "sandbox")


def test_runs_past_max_runs_are_not_run_and_the_answer_still_counts(task, problems, monkeypatch):
  calls = []
  real = sandbox.run
  monkeypatch.setattr(sandbox, "run", lambda *a, **k: calls.append(a) or real(*a, **k))
  env = started(task, problems["add"], max_runs=1)
  assert text(env, env.step(ADD_WRONG + "$")).startswith("\nvisible tests: 0/1")
  for _ in range(2):
    step = env.step(ADD_RIGHT + "\n$")
    assert text(env, step) == f"\n{code_env.NO_RUNS_LEFT}\n"
    assert step.reward == 0.0 and not step.done
  assert len(calls) == 1  # Only the first run reached the sandbox.
  assert env.step(ADD_RIGHT).reward == 1.0
  zero = started(task, problems["add"], max_runs=0)
  assert text(zero, zero.step(ADD_RIGHT + "\n$")) == f"\n{code_env.NO_RUNS_LEFT}\n"


# ---------------------------------------------------------------------------------------
# Observations and the hidden tests.


def test_observations_are_clipped_and_in_the_tokenizers_alphabet(task, problems):
  env = started(task, problems["add"], max_chars=40)
  step = env.step("def add(a, b):\n  return 'é' * 100\n$")
  got = text(env, step)
  assert len(step.observation) == len(got) == 40  # The character tokenizer: one per char.
  assert got == "\nvisible tests: 0/1 passed; assert a...\n"
  # A character the tokenizer lacks becomes "?".
  env = started(task, problems["add"])
  got = text(env, env.step("def add(a, b):\n  return 'é'\n$"))
  assert got == "\nvisible tests: 0/1 passed; assert add(2, 3) == 5: got '?'\n"


def test_observations_with_a_hugging_face_tokenizer():
  task = tasks.get("code", tokenizer_dir=str(QWEN2), isolation=ISOLATION)
  tok = task.tokenizer()
  assert len(base.stop_ids(code_env.CodeRunner, tok)) == len(set(tok.eos_ids)) + 1
  problem = next(p for p in task.split_problems("train") if p.visible_tests)
  env = code_env.CodeRunner(tokenizer=tok, isolation=ISOLATION)
  env.reset(task.example_of(problem))
  step = env.step(f"```python\n{problem.solution}\n```\n$")
  n = len(problem.visible_tests)
  assert tok.decode(step.observation) == f"\nvisible tests: {n}/{n} passed\n"


@pytest.mark.parametrize("source", ["builtin", "builtin_hf", "mbpp"])
def test_visible_tests_are_those_shown_in_the_prompt(source):
  kwargs = {
    "builtin": {},
    "builtin_hf": dict(tokenizer_dir=str(QWEN2)),
    "mbpp": dict(problems=MBPP, test_percent=0),
  }[source]
  task = tasks.get("code", isolation=ISOLATION, **kwargs)
  problems = task.split_problems("train") + task.split_problems("test")
  assert problems
  for problem in problems:
    visible = code_env.problem_of(task.example_of(problem)).visible
    assert tuple(t.source for t in visible) == problem.visible_tests, problem.id


def test_hidden_tests_never_reach_a_run_or_an_observation(task, problems, monkeypatch):
  ran = []
  real = sandbox.run
  monkeypatch.setattr(
    sandbox, "run", lambda code, tests, **k: ran.append(tests) or real(code, tests, **k)
  )
  for problem in problems.values():
    env = started(task, problem)
    wrong = f"def {problem.entry_point}(*args):\n  return None\n$"
    seen = [text(env, env.step(wrong)), text(env, env.step(problem.solution + "$"))]
    shown = [t.source for t in ran[-1]]
    assert shown == list(problem.visible_tests), problem.id
    for hidden in map(sandbox.parse_test, problem.hidden_tests):
      assert not any(hidden.source in s or hidden.call in s for s in seen), (problem.id, seen)
  assert len(ran) == 2 * len(problems)


def test_a_prompt_that_shows_a_test_differently_keeps_it_hidden(task, problems):
  example = task.example_of(problems["add"])
  shifted = example.prompt.replace("assert add(2, 3) == 5", "assert add(2, 3) == 5  # five")
  assert code_env.problem_of(tasks.Example(shifted, "", example.answer)).visible == ()


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(max_runs=-1), "max_runs must be >= 0"),
    (dict(max_chars=8), "max_chars must be >= 16"),
    (dict(run_timeout_s=0), "timeout_s must be a positive number"),
    (dict(isolation="docker"), "Unknown isolation 'docker'"),
  ],
)
def test_bad_options(task, kwargs, match):
  with pytest.raises(ValueError, match=match):
    code_env.CodeRunner(tokenizer=task.tokenizer(), **{"isolation": ISOLATION, **kwargs})


def test_a_non_code_example_is_an_error_that_says_what_to_use(task):
  example = tasks.get("arithmetic").example("train", 0, seed=0)
  env = make_env(task)
  with pytest.raises(ValueError, match="not a code problem spec.*config.task.name='code'"):
    env.reset(example)
  with pytest.raises(RuntimeError, match=r"step\(\) before reset\(\)"):
    env.step("$")
  assert envs.get("code") is code_env.CodeRunner


# ---------------------------------------------------------------------------------------
# The episode loop end to end.


@flax.struct.dataclass
class NoCache:
  index: jax.Array

  def repeat(self, n):
    del n
    return self


def scripted_model_fn(params, tokens_BT, positions_BT, cache, *, script_NL, vocab):
  """Writes row i's script: the token after position p is script_NL[i, p + 1]."""
  del params
  rows, L = tokens_BT.shape[0], script_NL.shape[1]
  nxt = jnp.clip(positions_BT + 1, 0, L - 1)
  logits = 30.0 * jax.nn.one_hot(script_NL[jnp.arange(rows)[:, None] % len(script_NL), nxt], vocab)
  return logits, cache


def _runner(
  tok,
  *,
  model_fn,
  init_cache,
  T,
  group=1,
  turns=2,
  turn_tokens=64,
  width=96,
  P=8,
  workers=None,
  make=None,
  **kw,
):
  """An episode runner of the code environment (`make`: the envs' factory, default
  CodeRunner with the options); workers: config.env.step_workers (None: the default)."""
  scfg = sampling.SamplerConfig(
    max_new_tokens=T,
    eos_ids=tok.eos_ids,
    pad_id=tok.pad_id,
    group_size=group,
    max_prompt_len=P,
    prompt_buckets=(P,),
  )
  env_kwargs = dict(isolation=ISOLATION, max_chars=width, **kw)
  return episodes.Runner(
    model_fn=model_fn,
    init_cache=init_cache,
    sampler_cfg=scfg,
    cfg=episodes.EpisodeConfig(
      name="code",
      kwargs=env_kwargs,
      max_turns=turns,
      turn_tokens=turn_tokens,
      observation_tokens=width,
      **({} if workers is None else {"step_workers": workers}),
    ),
    tokenizer=tok,
    make_env=make or functools.partial(code_env.CodeRunner, tokenizer=tok, **env_kwargs),
    env_cls=code_env.CodeRunner,
  ), scfg


def _scripted(tok, turns_N, *, prompt=None, **kw):
  """A runner whose model writes row i's completion: its (action, observation) token lists
  in turn order; returns (runner, prompts, completions, action masks)."""
  completions = [sum((a + o for a, o in row), []) for row in turns_N]
  actions = [sum(([1] * len(a) + [0] * len(o) for a, o in row), []) for row in turns_N]
  T = max(map(len, completions)) + 8
  prompt = prompt or [tok.bos_id, tok.encode("\n")[0]]
  script_NL = np.full((len(turns_N), 2 + T), tok.pad_id, np.int32)
  for i, c in enumerate(completions):
    script_NL[i, 2 : 2 + len(c)] = c
  model_fn = functools.partial(
    scripted_model_fn, script_NL=jnp.asarray(script_NL), vocab=tok.vocab_size
  )
  init_cache = lambda b, s: NoCache(index=jnp.zeros((), jnp.int32))
  runner, scfg = _runner(tok, model_fn=model_fn, init_cache=init_cache, T=T, **kw)
  prompts = sampling.prepare_prompts([prompt] * len(turns_N), cfg=scfg)
  return runner, prompts, completions, actions


@pytest.mark.parametrize("workers", [1, 4])
def test_the_episode_loop_with_a_scripted_model(task, problems, workers):
  """Exact transcripts: [action ; observation ; action], the action mask on the model's
  tokens only, and each end case as the loop represents it; the same with the steps of a
  turn on one thread (1 worker) and concurrent (4)."""
  tok, eos = task.tokenizer(), task.tokenizer().eos_id
  enc = tok.encode
  examples = [task.example_of(problems[i]) for i in ("add", "is_even", "add", "add")]
  probe = make_env(task, max_runs=1)
  probe.reset(examples[0])
  obs = list(probe.step(ADD_WRONG + "$").observation)
  assert tok.decode(obs) == "\nvisible tests: 0/1 passed; assert add(2, 3) == 5: got -1\n"
  no_code = enc("\nno code found\n")
  # (action tokens, observation tokens) per turn; the last action has no observation.
  turns = [
    [(enc(ADD_WRONG + "$"), obs), (enc(ADD_RIGHT) + [eos], [])],  # Revised: done, 1.
    [(enc("def is_even(n):\n  return n == 4\n") + [eos], [])],  # Visible only: done, 0.
    [(enc("$"), no_code), (enc("$"), [])],  # Runs until max_turns: turn_limit.
    [(enc(ADD_OUT_OF_MEMORY) + [eos], [])],  # The answer runs out of memory: done, 0.
  ]
  runner, prompts, completions, actions = _scripted(tok, turns, max_runs=1, workers=workers)
  assert runner.cfg.step_workers == workers
  got = runner.run({}, prompts, examples, jax.random.key(0), sampling.sampling_params())

  r = got.rollouts
  for i in range(4):
    n = len(completions[i])
    np.testing.assert_array_equal(r.tokens_NT[i, :n], completions[i])
    np.testing.assert_array_equal(r.action_mask_NT[i, :n], np.array(actions[i], bool))
    assert not np.asarray(r.mask_NT[i, n:]).any() and np.asarray(r.mask_NT[i, :n]).all()
  assert [episodes.END_REASONS[e] for e in got.end_N] == ["done", "done", "turn_limit", "done"]
  np.testing.assert_array_equal(got.reward_N, [1.0, 0.0, 0.0, 0.0])
  np.testing.assert_array_equal(got.scorable_N, [True, True, True, True])
  np.testing.assert_array_equal(got.turns_N, [2, 1, 2, 1])
  assert not got.messages
  assert got.labels == ("pass", "wrong", "", "memory")  # The turn limit judged nothing.
  m = got.metrics()
  assert (m["reward/outcome/pass"], m["reward/outcome/memory"]) == (0.25, 0.25)
  assert (m["reward/outcome/timeout"], m["reward/outcome/other"]) == (0.0, 0.0)


def test_slow_steps_run_at_once_and_a_step_past_its_budget_ends_its_episode(task, problems):
  """Real sandboxes, four rows in one turn (the default step_workers): a run that hangs until its
  sandbox's timeout (1 s) is within the environment's step budget (its largest sandbox
  timeout plus a start margin), so it ends as a run does (the last action: turn_limit);
  an answer that hangs, in an environment whose budget (0.2 s) is below its sandbox's
  timeout (3 s), ends with step_timeout: a scored 0, without the trainer waiting for it.
  Serially the turn would take at least 1 + 3 s."""
  tok, eos = task.tokenizer(), task.tokenizer().eos_id
  enc = tok.encode
  options = dict(isolation=ISOLATION, max_chars=96, run_timeout_s=1.0, timeout_s=3.0)
  made = []

  def make():
    made.append(code_env.CodeRunner(tokenizer=tok, **options))
    if len(made) == 3:
      made[-1].step_budget_s = 0.2
    return made[-1]

  turns = [
    [(enc(ADD_HANGS + "$"), [])],  # A run past 1 s: timed out in the sandbox, observed.
    [(enc(ADD_RIGHT) + [eos], [])],
    [(enc(ADD_HANGS) + [eos], [])],  # Past its 0.2 s budget: step_timeout.
    [(enc(ADD_WRONG) + [eos], [])],
  ]
  runner, prompts, _, _ = _scripted(tok, turns, turns=1, make=make)
  examples = [task.example_of(problems["add"])] * 4
  got = runner.run({}, prompts, examples, jax.random.key(0), sampling.sampling_params())
  reasons = [episodes.END_REASONS[e] for e in got.end_N]
  assert reasons == ["turn_limit", "done", "step_timeout", "done"]
  np.testing.assert_array_equal(got.reward_N, [0.0, 1.0, 0.0, 0.0])
  assert got.scorable_N.all() and not got.messages
  assert got.labels == ("", "pass", "", "wrong")
  assert got.seconds["env"] < 2.5, got.seconds  # About the 1 s run; serially >= 4 s.
  assert made[0].step_budget_s == 3.0 + code_env.STEP_MARGIN_S


def test_end_of_turn_text_in_a_runs_output_does_not_end_the_episode():
  """A run whose output holds ChatML's end-of-turn texts (Qwen's "<|im_end|>" and
  "<|endoftext|>", both EOS ids): the observation encodes them as text (no special id),
  decodes back to the message, and the episode goes on to its answer (done, 1), its
  transcript readable past the observation."""
  task = tasks.get("code", tokenizer_dir=str(QWEN2), isolation=ISOLATION)
  tok = task.tokenizer()
  added = hf_tokenizers.Tokenizer.from_str(tok.files.tokenizer_json).get_added_tokens_decoder()
  special = {i for i, t in added.items() if t.special}
  assert set(tok.eos_ids) <= special
  problem = next(p for p in task.split_problems("train") if p.id == "add")
  example = task.example_of(problem)
  run = "```python\ndef add(a, b):\n  return '<|im_end|><|endoftext|>'\n```\n$"
  env = code_env.CodeRunner(tokenizer=tok, isolation=ISOLATION, max_chars=128)
  env.reset(example)
  step = env.step(run)
  want = "\nvisible tests: 0/1 passed; assert add(2, 3) == 5: got '<|im_end|><|endoftext|>'\n"
  assert tok.decode(step.observation) == want and not step.done
  assert not set(step.observation) & special
  # The model writes the marker's characters (not the token) in its code.
  action = tok.encode(run, special=False)
  turns = [[(action, list(step.observation)), (tok.encode(ADD_RIGHT) + [tok.eos_id], [])]]
  runner, prompts, completions, actions = _scripted(
    tok, turns, prompt=[tok.encode("\n")[0]] * 2, width=128
  )
  got = runner.run({}, prompts, [example], jax.random.key(0), sampling.sampling_params())
  assert [episodes.END_REASONS[e] for e in got.end_N] == ["done"]
  np.testing.assert_array_equal(got.reward_N, [1.0])
  n = len(completions[0])
  np.testing.assert_array_equal(got.rollouts.tokens_NT[0, :n], completions[0])
  np.testing.assert_array_equal(got.rollouts.action_mask_NT[0, :n], np.array(actions[0], bool))
  assert tok.decode(np.asarray(got.rollouts.tokens_NT[0, :n])) == run + want + ADD_RIGHT


def test_the_episode_loop_with_a_tiny_transformer(task, problems):
  """A tiny random transformer on real prompts, steered to "$" (rows of the first problem)
  or EOS (the second): run, observation, run -> turn_limit; an empty answer -> done, 0."""
  tok = task.tokenizer()
  cfg = model.tiny_config(tok.vocab_size)
  params = model.init(cfg, jax.random.key(0))
  run_id, eos = tok.encode(code_env.RUN_TEXT)[0], tok.eos_id
  bias_NV = 30.0 * jax.nn.one_hot(jnp.asarray([run_id, run_id, eos, eos]), tok.vocab_size)
  real = model.make_model_fn(cfg)

  def steered(params, tokens_BT, positions_BT, cache, **kw):
    logits, cache = real(params, tokens_BT, positions_BT, cache, **kw)
    if logits.shape[0] == bias_NV.shape[0]:  # Decode and append (prefill logits unused).
      logits = logits + bias_NV[:, None, :]
    return logits, cache

  examples = [task.example_of(problems[i]) for i in ("add", "is_even")]
  runner, scfg = _runner(
    tok,
    model_fn=steered,
    init_cache=functools.partial(model.init_cache, cfg),
    T=24,
    group=2,
    turn_tokens=4,
    width=16,
    P=256,
    max_runs=3,
  )
  prompts = sampling.prepare_prompts(
    [tok.encode(e.prompt, add_bos=True) for e in examples], cfg=scfg
  )
  got = runner.run(params, prompts, examples, jax.random.key(1), sampling.sampling_params())
  r = got.rollouts
  no_code = tok.encode("\nno code found\n")
  run_row = [run_id] + no_code + [run_id]
  for i in (0, 1):
    np.testing.assert_array_equal(r.tokens_NT[i, : len(run_row)], run_row)
    np.testing.assert_array_equal(
      r.action_mask_NT[i, : len(run_row)], [True] + [False] * len(no_code) + [True]
    )
  for i in (2, 3):
    assert int(r.tokens_NT[i, 0]) == eos and bool(r.action_mask_NT[i, 0])
    assert int(np.asarray(r.mask_NT[i]).sum()) == 1
  assert [episodes.END_REASONS[e] for e in got.end_N] == ["turn_limit"] * 2 + ["done"] * 2
  np.testing.assert_array_equal(got.reward_N, 0.0)
  assert got.scorable_N.all()
  assert got.metrics()["episode/end/turn_limit"] == 0.5


# ---------------------------------------------------------------------------------------
# The config.


def test_the_config_builds_code_episodes():
  c = config_lib.load("configs/code_env.py:tiny")
  setup = build.build(c)
  assert setup.episodes.name == "code" and setup.task.name == "code"
  assert setup.episodes.observation_tokens >= setup.episodes.kwargs["max_chars"]
  example = setup.task.example("train", 0, seed=0)
  assert json.loads(example.answer)["tests"]
  bad = config_lib.load("configs/code_env.py:tiny")
  bad.env.kwargs = {"max_turns": 3}
  with pytest.raises(config_lib.ConfigError, match="config.env.kwargs for environment 'code'"):
    build.build(bad)
  qwen = config_lib.load("configs/code_env.py:qwen")
  qwen.hf_dir = str(QWEN2)  # The committed random checkpoint, for its tokenizer and shape.
  setup = build.build(qwen)
  assert setup.episodes.name == "code" and setup.task.tokenizer_dir == str(QWEN2)
  assert "$" in setup.task.example("train", 0, seed=0).prompt  # The system prompt.


def test_bench_env_steps_reports_its_figures():
  import bench_env_steps  # noqa: PLC0415

  r = bench_env_steps.main(["--episodes=3", "--workers", "1", "3", "--repeats=1", "--slow-s=0.3"])
  serial, concurrent = r["by_workers"]["1"], r["by_workers"]["3"]
  assert serial["one_slow_s"] >= 0.3 and concurrent["one_slow_s"] >= 0.3
  assert serial["plain_s"] > 0 and serial["speedup_vs_serial"] == 1.0
