"""Multi-turn episodes (`episodes`): the token history a fake model writes, by hand; the
policy's own log-probs at every action token (the teacher-forced forward of the whole
episode agrees); observation tokens never trained (zero gradient, equal losses with and
without one appended, for every aggregation mode); limits and end reasons; planners on
episodes; the calculator environment and its config."""

import dataclasses
import functools
import re
import threading
import time

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import runs  # tests/ is on sys.path (conftest).

from grpo_jax import config, tasks
from grpo_jax.envs import base, calculator, episode_refill, episodes
from grpo_jax.infra import config_lib, metrics
from grpo_jax.models import logprobs, model, sampling
from grpo_jax.rl import advantages, aggregation, learner, planners, preparation, presets, spec
from grpo_jax.trainer import build

# ----------------------------------------------------------------------------
# A fake model (the next token is (token + 1) % 10, by a 30-nat margin), a digit tokenizer
# and a scripted environment: exact histories, written out by hand below.
# ----------------------------------------------------------------------------
V, PAD, EOS, STOP = 10, 0, 9, 5


@flax.struct.dataclass
class FakeCache:
  index: jax.Array

  def repeat(self, n):
    del n
    return self


def fake_model_fn(params, tokens_BT, positions_BT, cache, *, widths=None):
  del params, positions_BT
  if widths is not None:
    jax.debug.callback(lambda t: widths.append(t.shape[1]), tokens_BT)
  return 30.0 * jax.nn.one_hot((tokens_BT + 1) % V, V), cache


class Digits:
  """Token i is the digit i; 9 is EOS (decode stops there), 0 is padding."""

  pad_id, bos_id, eos_id, eos_ids, vocab_size = PAD, 1, EOS, (EOS,), V

  def encode(self, text, *, add_bos=False, add_eos=False):
    return [int(c) for c in text]

  def decode(self, ids):
    ids = [int(i) for i in ids]
    return "".join(str(i) for i in ids[: ids.index(EOS) if EOS in ids else len(ids)])


class Script(base.Environment):
  """Step k sleeps sleep[k] seconds, then returns observation obs[k] with reward
  rewards[k] while k < len(obs), then done with reward rewards[len(obs)]; raises `error`
  at step `raise_at`. `budget` is its step_budget_s. The actions are kept, and `finished`
  is set when a step returns (late ones too)."""

  stop_text = (str(STOP),)

  def reset(self, example):
    self.script, self.k, self.actions = example, 0, []
    self.step_budget_s, self.finished = example.get("budget"), threading.Event()
    return example.get("first", ())

  def step(self, action):
    self.actions.append(action)
    k, self.k = self.k, self.k + 1
    time.sleep(self.script.get("sleep", [0.0] * 9)[k])
    self.label = f"step {k}"  # What a late step would write, after its row ended.
    self.finished.set()
    if self.script.get("raise_at") == k:
      raise RuntimeError(self.script.get("error", "tool crashed"))
    obs, rewards = self.script["obs"], self.script.get("rewards", [0.0] * 9)
    if k < len(obs):
      return base.Step(observation=tuple(obs[k]), reward=rewards[k])
    return base.Step(reward=rewards[k], done=True)


def _fake_runner(
  *, T=10, group=1, max_turns=4, turn_tokens=6, obs_tokens=3, widths=None, workers=None
):
  scfg = sampling.SamplerConfig(
    max_new_tokens=T, eos_ids=(EOS,), pad_id=PAD, group_size=group, prompt_buckets=(4,)
  )
  tok = Digits()
  envs_made = []

  def make_env():
    envs_made.append(Script(tokenizer=tok))
    return envs_made[-1]

  runner = episodes.Runner(
    model_fn=functools.partial(fake_model_fn, widths=widths),
    init_cache=lambda b, s: FakeCache(index=jnp.zeros((), jnp.int32)),
    sampler_cfg=scfg,
    cfg=episodes.EpisodeConfig(
      name="script",
      max_turns=max_turns,
      turn_tokens=turn_tokens,
      observation_tokens=obs_tokens,
      **({} if workers is None else {"step_workers": workers}),
    ),
    tokenizer=tok,
    make_env=make_env,
    env_cls=Script,
  )
  return runner, scfg, envs_made


def _play(runner, scfg, scripts, *, last_prompt_token=3):
  prompts = sampling.prepare_prompts([[1, last_prompt_token]] * len(scripts), cfg=scfg)
  hyper = sampling.sampling_params()
  return runner.run({}, prompts, scripts, jax.random.key(0), hyper)


def test_the_fake_model_writes_the_history_by_hand_and_never_re_encodes_it():
  widths = []
  runner, scfg, made = _fake_runner(widths=widths)
  got = _play(
    runner,
    scfg,
    [
      {"obs": [[1, 2]], "rewards": [0.25, 1.0]},  # 4 5 | 1 2 | 3 4 5, then done.
      {"obs": [[7]]},  # 4 5 | 7 | 8 9 (EOS ends the turn), then done.
      {"obs": [[2, 2, 2, 2]]},  # An observation over O = 3 tokens: token_limit.
    ],
  )
  r = got.rollouts
  np.testing.assert_array_equal(
    r.tokens_NT,
    [
      [4, 5, 1, 2, 3, 4, 5, 0, 0, 0],
      [4, 5, 7, 8, 9, 0, 0, 0, 0, 0],
      [4, 5, 0, 0, 0, 0, 0, 0, 0, 0],
    ],
  )
  np.testing.assert_array_equal(r.mask_NT.sum(axis=1), [7, 5, 2])
  np.testing.assert_array_equal(
    r.action_mask_NT.astype(int)[:, :7],
    [[1, 1, 0, 0, 1, 1, 1], [1, 1, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0]],
  )
  # The observation's last token is fed next (3 follows 2; 8 follows 7).
  assert [e.actions for e in made] == [["45", "345"], ["45", "8"], ["45"]]
  np.testing.assert_array_equal(got.reward_N, [1.25, 0.0, 0.0])
  assert [episodes.END_REASONS[e] for e in got.end_N] == ["done", "done", "token_limit"]
  np.testing.assert_array_equal(got.turns_N, [2, 2, 1])
  np.testing.assert_array_equal(r.truncated_N, [False, False, True])
  assert float(jnp.max(jnp.abs(r.policy_logp_NT))) < 1e-6
  assert bool(jnp.all(jnp.where(r.action_mask_NT, True, r.policy_logp_NT == 0.0)))
  # Prefill (P − 1 = 3 columns), one token per decode step, O = 3 per append: the history
  # is never fed again.
  assert set(widths) == {3, 1} and widths.count(3) == 2  # Prefill and one append.


@pytest.mark.parametrize(
  "kwargs,scripts,reasons,turns",
  [
    # max_turns actions without done.
    (dict(max_turns=2), [{"obs": [[1], [1], [1]]}], ["turn_limit"], [2]),
    # The budget T = 6 runs out inside the second action (4 5 | 1 2 | 3 4: no stop).
    (dict(T=6), [{"obs": [[1, 2]]}], ["token_limit"], [2]),
    # An observation that would fill the budget leaves no column for an action.
    (dict(T=5), [{"obs": [[1, 2, 3]]}], ["token_limit"], [1]),
    # The environment raises: unscorable, reward 0.
    (dict(), [{"obs": [[1]], "rewards": [1.0, 1.0], "raise_at": 1}], ["env_error"], [2]),
    (dict(), [{"obs": [], "rewards": [float("nan")]}], ["env_error"], [1]),
    # turn_tokens = 1: each action is one token (4, then 2 after observation 1) and goes
    # to the environment without a stop token.
    (dict(turn_tokens=1), [{"obs": [[1]]}], ["done"], [2]),
  ],
)
def test_limits_and_end_reasons(kwargs, scripts, reasons, turns):
  runner, scfg, made = _fake_runner(**kwargs)
  got = _play(runner, scfg, scripts)
  assert [episodes.END_REASONS[e] for e in got.end_N] == reasons
  np.testing.assert_array_equal(got.turns_N, turns)
  if reasons == ["env_error"]:
    assert not got.scorable_N[0] and got.reward_N[0] == 0.0
    assert re.search("tool crashed|reward nan", got.messages[0])
  if kwargs.get("turn_tokens") == 1:
    assert made[0].actions == ["4", "2"]
  metrics = got.metrics()
  assert metrics[f"episode/end/{reasons[0]}"] == 1.0
  assert metrics["episode/turns"] == turns[0]


def test_reset_observations_come_before_the_first_action():
  runner, scfg, made = _fake_runner()
  got = _play(runner, scfg, [{"first": [6, 6], "obs": []}])
  np.testing.assert_array_equal(got.rollouts.tokens_NT[0, :3], [6, 6, 7])
  np.testing.assert_array_equal(got.rollouts.action_mask_NT[0, :3], [False, False, True])
  assert made[0].actions == ["78"]  # 7 8 then EOS, decoded without it.


def test_a_stop_text_of_several_tokens_is_refused(tokenizer):
  class Bad(Script):
    stop_text = ("T:",)

  with pytest.raises(ValueError, match="exactly one token"):
    base.stop_ids(Bad, tokenizer)


# ----------------------------------------------------------------------------
# The steps of a turn: concurrent, each within its environment's budget.
# ----------------------------------------------------------------------------

SLEEP_S = 0.3  # One slow step; long enough to stand out of 2 loaded cores' jitter.


def test_the_steps_of_a_turn_run_concurrently_by_default():
  """Four steps of SLEEP_S each: the default config waits about one step, not four."""
  runner, scfg, _ = _fake_runner()
  scripts = [{"obs": [], "rewards": [float(i)], "sleep": [SLEEP_S]} for i in range(4)]
  got = _play(runner, scfg, scripts)
  assert [episodes.END_REASONS[e] for e in got.end_N] == ["done"] * 4
  np.testing.assert_array_equal(got.reward_N, [0.0, 1.0, 2.0, 3.0])
  assert got.seconds["env"] < 0.5 * 4 * SLEEP_S, got.seconds  # Serial: >= 1.2 s.
  assert runner.cfg.step_workers >= 4


@pytest.mark.parametrize("workers", [None, 1])
def test_a_step_past_its_budget_ends_its_episode_with_a_scored_zero(workers):
  """Row 0's second step sleeps 1.2 s against a budget of 0.3 s: step_timeout, scorable,
  with the reward received before it (0.5), never the late step's; the other rows finish
  normally. Concurrent (the default), the trainer stops waiting at the budget; serial (1
  worker), it waits, and the same rule gives the same episodes. The late step's thread,
  when it finally returns, changes nothing of the result."""
  runner, scfg, made = _fake_runner(workers=workers)
  late = {"obs": [[1]], "rewards": [0.5, 1.0], "sleep": [0.0, 1.2], "budget": 0.3}
  fine = {"obs": [[1]], "rewards": [0.25, 1.0], "budget": 0.3}
  got = _play(runner, scfg, [late, fine, {"obs": [[4], [4]], "rewards": [0.0, 0.0, 2.0]}])
  assert [episodes.END_REASONS[e] for e in got.end_N] == ["step_timeout", "done", "done"]
  np.testing.assert_array_equal(got.reward_N, [0.5, 1.25, 2.0])
  assert got.scorable_N.all() and not got.messages
  np.testing.assert_array_equal(got.turns_N, [2, 2, 3])
  assert not bool(got.rollouts.eos_N[0])  # Not ended by the environment: truncated.
  if workers is None:
    assert got.seconds["env"] < 0.3 + 0.6, got.seconds  # Not the late step's 1.2 s.
  snapshot = (got.reward_N.copy(), got.end_N.copy(), got.turns_N.copy(), got.labels)
  assert made[0].finished.wait(5.0)  # The late step returned, after the run.
  time.sleep(0.05)
  np.testing.assert_array_equal(got.reward_N, snapshot[0])
  np.testing.assert_array_equal(got.end_N, snapshot[1])
  np.testing.assert_array_equal(got.turns_N, snapshot[2])
  assert got.labels == snapshot[3] == ("", "step 1", "step 2")  # The dropped env's: none.
  metrics = got.metrics()
  assert metrics["episode/end/step_timeout"] == pytest.approx(1 / 3)


def _variety():
  """Scripts with every end reason; later rows sleep less, so concurrent steps finish in
  the reverse of row order."""
  scripts = [
    {"obs": [[1, 2]], "rewards": [0.25, 1.0]},
    {"obs": [[7]], "rewards": [0.5, 0.0]},
    {"obs": [[2, 2, 2, 2]]},  # Over O = 3: token_limit.
    {"obs": [[1]], "rewards": [1.0, 1.0], "raise_at": 1, "error": "crash in row 3"},
    {"obs": [], "rewards": [float("nan")]},  # A NaN reward: env_error.
    {"obs": [[1]], "raise_at": 0, "error": "crash in row 5"},
    {"obs": [[4]] * 5},  # max_turns: turn_limit.
    {"first": [6, 6], "obs": [], "rewards": [3.0]},
  ]
  for i, s in enumerate(scripts):
    s["sleep"] = [0.01 * (len(scripts) - i)] * 9
  return scripts


def test_concurrent_and_serial_steps_give_identical_episodes():
  got = {}
  for workers in (1, 3, 8):
    runner, scfg, made = _fake_runner(workers=workers)
    got[workers] = (_play(runner, scfg, _variety()), [e.actions for e in made])
  (serial, actions), reasons = got[1], set()
  for workers in (3, 8):
    other, other_actions = got[workers]
    assert other_actions == actions
    for field in ("reward_N", "end_N", "turns_N"):
      np.testing.assert_array_equal(getattr(other, field), getattr(serial, field))
    assert (other.messages, other.labels) == (serial.messages, serial.labels)
    for field in ("tokens_NT", "mask_NT", "action_mask_NT", "eos_N", "length_N"):
      np.testing.assert_array_equal(
        getattr(other.rollouts, field), getattr(serial.rollouts, field), err_msg=field
      )
    reasons |= {episodes.END_REASONS[e] for e in other.end_N}
  assert reasons == {"done", "token_limit", "env_error", "turn_limit"}
  assert serial.messages == (
    "ValueError: the environment's step returned reward nan",
    "RuntimeError: crash in row 5",
    "RuntimeError: crash in row 3",
  )


def test_step_workers_must_be_positive():
  with pytest.raises(ValueError, match="config.env.step_workers must be >= 1"):
    episodes.EpisodeConfig(name="script", step_workers=0)


# ----------------------------------------------------------------------------
# The tiny transformer: log-probs of multi-turn episodes.
# ----------------------------------------------------------------------------


class Chatty(base.Environment):
  """Three turns; observations of 1-5 tokens that depend on the action, so rows differ."""

  stop_text = ("=",)

  def reset(self, example):
    self.k = 0
    return ()

  def step(self, action):
    self.k += 1
    text = "7" * ((self.k * len(action)) % 5) + ";"
    return base.Step(self.tokenizer.encode(text), reward=float(self.k), done=self.k >= 3)


def _chatty_run(cfg, params, tokenizer, *, row_keys=False, model_fn=None, env=Chatty,
                env_cfg=None, **sampler):  # fmt: skip
  """Chatty episodes of 4 prompts × G = 4 sampled by the model `cfg` with `params`
  (`sampler`: SamplerConfig fields; `row_keys`: the lockstep turn draws with the refill
  loop's keys; `model_fn`: in place of the model's own; `env`: the environment class,
  `env_cfg`: EpisodeConfig fields)."""
  scfg = sampling.SamplerConfig(
    max_new_tokens=32,
    eos_ids=tokenizer.eos_ids,
    pad_id=tokenizer.pad_id,
    group_size=4,
    prompt_buckets=(8,),
    **sampler,
  )
  model_fn = model_fn or model.make_model_fn(cfg)
  runner = episodes.Runner(
    model_fn=model_fn,
    init_cache=functools.partial(model.init_cache, cfg),
    sampler_cfg=scfg,
    cfg=episodes.EpisodeConfig(
      name="chatty", max_turns=3, turn_tokens=8, observation_tokens=6, **(env_cfg or {})
    ),
    tokenizer=tokenizer,
    make_env=functools.partial(env, tokenizer=tokenizer),
    env_cls=env,
  )
  if row_keys:
    turn = functools.partial(
      episodes.decode_turn, model_fn=model_fn, stop_ids=runner.stop_ids, turn_tokens=8,
      pad_id=scfg.pad_id, kv_layout=scfg.kv_layout, row_keys=True,
    )  # fmt: skip
    runner.pieces["turn"] = jax.jit(turn, donate_argnums=(1,))
  texts = ("Q:12+7\n", "Q:3+45\n", "Q:60+6\n", "Q:8+8\n")
  prompts = sampling.prepare_prompts([tokenizer.encode(p, add_bos=True) for p in texts], cfg=scfg)
  return runner.run(params, prompts, list(texts), jax.random.key(3), sampling.sampling_params())


@pytest.fixture(scope="module")
def chatty_episodes(tiny_cfg, tiny_params, tokenizer):
  return _chatty_run(tiny_cfg, tiny_params, tokenizer)


def test_episode_log_probs_equal_the_teacher_forced_forward_of_the_whole_episode(
  tiny_cfg, tiny_params, chatty_episodes
):
  r = chatty_episodes.rollouts
  mask, action = np.asarray(r.mask_NT), np.asarray(r.action_mask_NT)
  observation = mask & ~action
  # Observations of several lengths sit between actions in most rows (the test bites).
  assert (observation.sum(axis=1) >= 2).sum() >= 8
  assert len(set(observation.sum(axis=1).tolist())) >= 3
  assert (np.diff(mask.astype(int), axis=1) <= 0).all()  # The context is contiguous.
  # The teacher-forced forward of [prompt ; a_1 o_1 a_2 o_2 ...] (what a single-turn
  # sampler would see on the concatenated text) gives the sampler's own log-probs.
  lp, _ = logprobs.completion_logprobs(
    tiny_params,
    r.prompt_tokens_NP,
    r.prompt_mask_NP,
    r.tokens_NT,
    r.mask_NT,
    model_fn=model.make_model_fn(tiny_cfg),
  )
  np.testing.assert_allclose(
    np.where(action, lp, 0.0), np.where(action, r.policy_logp_NT, 0.0), atol=2e-4
  )
  np.testing.assert_allclose(r.logp_NT, r.policy_logp_NT)  # T = 1, no filter.
  assert np.all(np.asarray(r.policy_logp_NT)[~action] == 0.0)


@pytest.mark.parametrize("page_size, shared_prefix, chunk", [(4, True, 0), (3, False, 4)])
def test_episodes_on_pages_equal_the_dense_episodes(
  tiny_cfg, tiny_params, tokenizer, chatty_episodes, page_size, shared_prefix, chunk
):
  """sampler.kv_layout="paged": the same keys give the same episodes (actions, tool
  observations written a block a call across page edges, turns, rewards, ends) and the
  same log-probs up to the order of float32 sums, with the group's prompt pages shared or
  copied (pages of 4 and 3 slots: neither divides the 7 prompt slots before the last
  token, so a prompt's last page is part padding); with sampler.prefill_chunk = 4 the
  prompts and the 6-token observations go in 4 tokens a call."""
  got = _chatty_run(
    tiny_cfg, tiny_params, tokenizer, kv_layout="paged", page_size=page_size,
    shared_prefix=shared_prefix, kv_pool_fraction=0.25,  # Ignored: episodes take a whole pool.
    prefill_chunk=chunk,
  )  # fmt: skip
  want = chatty_episodes
  for k in ("tokens_NT", "mask_NT", "action_mask_NT", "eos_N", "length_N"):
    np.testing.assert_array_equal(getattr(got.rollouts, k), getattr(want.rollouts, k), err_msg=k)
  for k in ("reward_N", "end_N", "turns_N"):
    np.testing.assert_array_equal(getattr(got, k), getattr(want, k), err_msg=k)
  for k in ("logp_NT", "policy_logp_NT"):
    np.testing.assert_allclose(getattr(got.rollouts, k), getattr(want.rollouts, k), atol=1e-5)
  # An append is one call of O columns in both layouts.
  assert got.rollouts.num_steps == want.rollouts.num_steps


# ----------------------------------------------------------------------------
# Slot refill: a turn's actions through S slots (`episode_refill`).
# ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def row_keyed_episodes(tiny_cfg, tiny_params, tokenizer):
  """The lockstep paged run drawing with the refill loop's keys (the reference)."""
  return _chatty_run(tiny_cfg, tiny_params, tokenizer, row_keys=True, kv_layout="paged",
                     page_size=4)  # fmt: skip


def _assert_same_episodes(got, want, *, atol=0.0):
  for k in ("tokens_NT", "mask_NT", "action_mask_NT", "eos_N", "length_N"):
    np.testing.assert_array_equal(getattr(got.rollouts, k), getattr(want.rollouts, k), err_msg=k)
  for k in ("reward_N", "end_N", "turns_N"):
    np.testing.assert_array_equal(getattr(got, k), getattr(want, k), err_msg=k)
  for k in ("logp_NT", "policy_logp_NT"):
    np.testing.assert_allclose(
      getattr(got.rollouts, k), getattr(want.rollouts, k), atol=atol, rtol=0, err_msg=k
    )


def test_idle_slots_take_the_lowest_index_ready_episodes_in_slot_order():
  """N = 5 episodes, 3 slots: slots 0 and 2 are idle, slot 1 runs episode 2 (3 tokens
  into its action); episodes 1, 3 and 4 are ready. Slot 0 takes 1, slot 2 takes 3 (their
  token counts restart), episode 4 waits."""
  ep_S, k_S, ready_N = episode_refill._fill(
    jnp.array([5, 2, 5]), jnp.array([6, 3, 6]), jnp.array([False, True, False, True, True])
  )
  np.testing.assert_array_equal(ep_S, [1, 2, 3])
  np.testing.assert_array_equal(k_S, [0, 3, 0])
  np.testing.assert_array_equal(ready_N, [False, False, False, False, True])
  # Nothing ready: the idle slots stay idle.
  ep_S, _, _ = episode_refill._fill(jnp.array([5, 5]), jnp.array([0, 0]), jnp.zeros(5, bool))
  np.testing.assert_array_equal(ep_S, [5, 5])


def test_row_keyed_draws_do_not_depend_on_the_batch():
  """Each row's token from its own key: a permuted subset of the rows draws the same
  tokens (bit for bit) as the whole batch, under temperature and top-p too."""
  logits_NV = jax.random.normal(jax.random.key(0), (16, 300)) * 3
  keys_N = sampling.keys_by_row(jax.random.key(1), jnp.arange(16), jnp.arange(16) % 5)
  for hyper in (sampling.sampling_params(), sampling.sampling_params(temperature=0.7, top_p=0.9)):
    full = sampling.choose_tokens(logits_NV, keys_N, hyper, row_keys=True)
    idx = jnp.array([11, 3, 7])
    part = sampling.choose_tokens(logits_NV[idx], keys_N[idx], hyper, row_keys=True)
    for a, b in zip(full, part, strict=True):
      np.testing.assert_array_equal(a[idx], b)
  # A key is the row's and the column's: another column, another draw.
  other = sampling.keys_by_row(jax.random.key(1), jnp.arange(16), jnp.arange(16) % 5 + 1)
  tok = lambda k: sampling.choose_tokens(logits_NV, k, sampling.sampling_params(), row_keys=True)[0]
  assert (tok(keys_N) != tok(other)).sum() >= 8


@pytest.mark.parametrize(
  "slots, page_size, shared_prefix, chunk",
  [(1, 4, True, 0), (5, 3, False, 4), (5, 4, True, 0), (16, 4, True, 0)],
)
def test_refill_episodes_equal_the_lockstep_episodes(
  tiny_cfg, tiny_params, tokenizer, row_keyed_episodes, slots, page_size, shared_prefix, chunk
):
  """sampler.refill_slots = S on pages: every action decoded through S slots gives the
  lockstep run's episodes (same keys: `decode_turn(row_keys=True)`): tokens, masks, turns,
  rewards and ends exactly, log-probs to float32 sums, for S = 1 (an episode at a time), 5 and N = 16, pages of 4
  and 3 slots, the prompt's pages shared or copied, observations in chunks. Each decode
  call runs S rows, and with S < N the turns compute fewer row-columns than lockstep."""
  calls = []

  def model_fn(params, tokens_BT, positions_BT, cache, **kw):
    calls.append(tokens_BT.shape)  # At trace time: the call's static shape.
    return model.make_model_fn(tiny_cfg)(params, tokens_BT, positions_BT, cache, **kw)

  got = _chatty_run(
    tiny_cfg, tiny_params, tokenizer, model_fn=model_fn, kv_layout="paged", refill_slots=slots,
    page_size=page_size, shared_prefix=shared_prefix, prefill_chunk=chunk,
  )  # fmt: skip
  want = row_keyed_episodes
  # Log-probs to the order of float32 sums (a matmul of S rows sums as one of N may not:
  # measured 1.9e-6 at S = 1).
  _assert_same_episodes(got, want, atol=1e-5)
  assert {c for c in calls if c[1] == 1} == {(slots, 1)}  # Decode calls: S rows a token.
  steps, lockstep = int(got.rollouts.num_steps), int(want.rollouts.num_steps)
  assert steps < lockstep if slots < 16 else steps == lockstep
  assert float(want.rollouts.action_mask_NT.sum()) >= 40  # Actions of several lengths.
  assert len(set(np.asarray(want.rollouts.action_mask_NT.sum(axis=1)).tolist())) >= 3


@pytest.mark.parametrize("slots, overlap, workers", [(1, 1, 1), (5, 4, 4), (16, 2, 8)])
def test_overlapped_episodes_equal_the_lockstep_episodes(
  tiny_cfg, tiny_params, tokenizer, row_keyed_episodes, slots, overlap, workers
):
  """env.overlap_steps = K: segments of K decode steps, the environment steps of finished
  actions running meanwhile and their observations appended S episodes a call: the same
  episodes as the lockstep turns with the same keys, for S = 1, 5, 16, K = 1, 4, 2, and
  the steps serial or on 4 or 8 threads."""
  got = _chatty_run(
    tiny_cfg, tiny_params, tokenizer, kv_layout="paged", page_size=4, refill_slots=slots,
    env_cfg=dict(overlap_steps=overlap, step_workers=workers),
  )  # fmt: skip
  _assert_same_episodes(got, row_keyed_episodes, atol=1e-5)


def test_episodes_with_window_rings_on_pages_and_through_slots_equal_the_dense_ones(
  tiny_cfg, tiny_params, tokenizer
):
  """A sliding first layer of window 4 (a ring per row on pages, `PagedKVCache.rings`;
  episodes of 7 prompt slots and 32 more: the rings wrap): lockstep episodes on pages of
  3 (prompt copied, observations 4 columns a call) equal the dense cache's with the same
  keys, and episodes through 5 refill slots with overlapped environment steps (rings
  moved with their episodes: `PagedKVCache.rows`, `put_rows`) equal the dense lockstep
  run with the refill loop's keys."""
  cfg = dataclasses.replace(
    tiny_cfg, sliding_window=4, layer_types=("sliding_attention", "full_attention")
  )
  run = functools.partial(_chatty_run, cfg, tiny_params, tokenizer)
  on_pages = run(kv_layout="paged", page_size=3, shared_prefix=False, prefill_chunk=4)
  _assert_same_episodes(on_pages, run(), atol=1e-5)
  slots = run(kv_layout="paged", page_size=4, refill_slots=5, env_cfg=dict(overlap_steps=4))
  _assert_same_episodes(slots, run(row_keys=True), atol=1e-5)
  assert int(on_pages.rollouts.length_N.max()) > 3 * 4  # Past three windows.


class SlowChatty(Chatty):
  """Chatty whose first prompt's first tool step waits until another episode's second
  step starts (at most `wait` seconds; `released` records whether one did) or, with a
  step budget (`late`), sleeps 0.5 s, past it."""

  started = threading.Event()
  released: list = []
  wait, late = 0.0, None

  def reset(self, example):
    self.example, self.step_budget_s = example, self.late
    return super().reset(example)

  def step(self, action):
    if self.k == 1:
      SlowChatty.started.set()
    if self.example.startswith("Q:12+7") and self.k == 0:
      if self.late:
        time.sleep(0.5)
      else:
        SlowChatty.released.append(SlowChatty.started.wait(self.wait))
    return super().step(action)


def _slow_run(tiny_cfg, tiny_params, tokenizer, *, wait, late=None, **kw):
  SlowChatty.started, SlowChatty.released = threading.Event(), []
  SlowChatty.wait, SlowChatty.late = wait, late
  got = _chatty_run(tiny_cfg, tiny_params, tokenizer, env=SlowChatty, kv_layout="paged",
                    page_size=4, **kw)  # fmt: skip
  return got, SlowChatty.released


@pytest.mark.parametrize("late", [None, 0.2])
def test_an_episode_waiting_on_its_tool_frees_its_slot(tiny_cfg, tiny_params, tokenizer, late):
  """One prompt's first tool steps block until another episode's second step starts.
  Overlapped (S = 4, K = 2, 8 step workers), the other episodes act again meanwhile and
  release them; in lockstep turns no second step starts before every first step has
  ended, so they wait out their 1 s. Both loops give the same episodes (the tools' timing
  changes no draw). With a step budget of 0.2 s (the slow steps sleep 0.5 s instead) they
  are late: those episodes end as step_timeout in both loops."""
  overlapped = dict(refill_slots=4, env_cfg=dict(overlap_steps=2, step_workers=8))
  over, released = _slow_run(tiny_cfg, tiny_params, tokenizer, wait=60.0, late=late, **overlapped)
  lock, waited = _slow_run(tiny_cfg, tiny_params, tokenizer, wait=1.0, late=late, row_keys=True,
                           env_cfg=dict(step_workers=8))  # fmt: skip
  _assert_same_episodes(over, lock, atol=1e-5)
  if not late:
    assert released == [True] * 4 and waited == [False] * 4
  reasons = [episodes.END_REASONS[e] for e in over.end_N]
  assert reasons[:4] == (["step_timeout"] * 4 if late else ["done"] * 4), reasons


def test_a_ready_episode_with_no_column_left_acts_at_once_with_an_empty_action(
  tiny_cfg, tiny_params, tokenizer
):
  """A segment handed an episode that is ready but has filled all T columns (its last
  action stopped in the last column and its step answered with an empty observation)
  reports it as acted without decoding it, so the host ends it (token_limit) as the
  lockstep loop's next turn would; the other ready episode decodes, and the segment
  returns the tokens it wrote, by episode and column."""
  scfg = sampling.SamplerConfig(max_new_tokens=8, eos_ids=tokenizer.eos_ids,
                                pad_id=tokenizer.pad_id, group_size=2, prompt_buckets=(8,),
                                kv_layout="paged", page_size=4, refill_slots=2)  # fmt: skip
  model_fn = model.make_model_fn(tiny_cfg)
  start = episodes.start(
    tiny_params,
    sampling.prepare_prompts([tokenizer.encode("Q:1+2\n", add_bos=True)], cfg=scfg),
    jax.random.key(0),
    model_fn=model_fn,
    init_cache=functools.partial(model.init_cache, tiny_cfg),
    cfg=scfg,
    observation_tokens=4,
  )
  state = start.replace(t_N=jnp.array([8, 0], jnp.int32))
  out, slots, ready_N, acted_N, written = episode_refill.refill_segment(
    tiny_params, state, episode_refill.Slots.idle(2, 2), sampling.sampling_params(),
    np.array([True, True]), model_fn=model_fn, stop_ids=(), turn_tokens=3, steps=16,
  )  # fmt: skip
  np.testing.assert_array_equal(acted_N, [True, True])
  np.testing.assert_array_equal(out.t_N, [8, 3])  # Row 1 decoded its 3 tokens; row 0 none.
  assert not np.asarray(ready_N).any() and (np.asarray(slots.ep_S) == 2).all()
  # What the host reads of the actions: slot 0 wrote episode 1's columns 0-2, then idled.
  n_KS, t_KS, tok_KS = (np.asarray(x) for x in written)
  assert n_KS.shape == (16, 2) and (n_KS[:, 1] == 2).all() and (n_KS[3:] == 2).all()
  np.testing.assert_array_equal(n_KS[:3, 0], [1, 1, 1])
  np.testing.assert_array_equal(t_KS[:3, 0], [0, 1, 2])
  np.testing.assert_array_equal(tok_KS[:3, 0], np.asarray(out.tokens_NT)[1, :3])


def test_overlap_needs_slots(tiny_cfg, tiny_params, tokenizer):
  with pytest.raises(ValueError, match="overlap_steps=2 needs config.sampler.refill_slots > 0"):
    _chatty_run(tiny_cfg, tiny_params, tokenizer, kv_layout="paged",
                env_cfg=dict(overlap_steps=2))  # fmt: skip
  with pytest.raises(ValueError, match="overlap_steps must be >= 0"):
    episodes.EpisodeConfig(name="chatty", overlap_steps=-1)


def test_refill_episodes_need_pages(tiny_cfg, tiny_params, tokenizer):
  with pytest.raises(ValueError, match='refill_slots=4 need config.sampler.kv_layout="paged"'):
    _chatty_run(tiny_cfg, tiny_params, tokenizer, refill_slots=4)


def _refill_run(workdir, *, iterations: int, overlap: int = 0):
  """configs/calculator.py:tiny on pages through 16 refill slots (64 episodes an
  iteration; `overlap`: env.overlap_steps), from its learning test's committed warm start
  (real rewards, ~3 turns)."""
  from grpo_jax.trainer import train  # noqa: PLC0415

  c = config_lib.load("configs/calculator.py:tiny")
  c.update(prompts_per_step=8, iterations=iterations, eval_every=2, eval_size=16)
  c.update(eval_samples=0, checkpoint_every=1, reward_workers=0, progress=False)
  c.update(tensorboard=False)
  c.sampler.update(kv_layout="paged", page_size=8, refill_slots=16)
  c.env.overlap_steps = overlap
  if not (workdir / "checkpoints").exists():
    runs._copy_warm_start(runs.WARM_STARTS / "calculator_tiny", workdir, fresh=True)
  return train.run(c, workdir, log=lambda _: None)


def test_refill_episodes_train_and_resume_to_the_uninterrupted_metrics(tmp_path):
  """Two iterations in one session, and one then resumed to two, the environment steps
  overlapping the decoding (refill turns train in test_multihost): every metric but the
  timing ones is equal (the episodes' draws are keyed by episode and column, so the
  resumed batch replays exactly), and the sampling padding counts the slots' steps."""
  overlap = 4
  local = _refill_run(tmp_path / "local", iterations=2, overlap=overlap)
  _refill_run(tmp_path / "resumed", iterations=1, overlap=overlap)
  resumed = _refill_run(tmp_path / "resumed", iterations=2, overlap=overlap)
  runs.assert_episodes_resume_equal(tmp_path / "local", tmp_path / "resumed", (local, resumed))
  line = runs.lines(tmp_path / "local")[1]
  assert 0.0 <= line["pad/sample_frac"] < 0.5, line["pad/sample_frac"]


# ----------------------------------------------------------------------------
# The action mask in the loss.
# ----------------------------------------------------------------------------

K_OBS = 3  # Observation tokens appended after each row's last action.


@pytest.fixture(scope="module")
def single_turn(tiny_sampler, tiny_params, tokenizer, sampler_cfg):
  prompts = sampling.prepare_prompts(
    [tokenizer.encode(f"Q:{a}+{a + 3}\n", add_bos=True) for a in range(4)], cfg=sampler_cfg
  )
  r = tiny_sampler(tiny_params, prompts, jax.random.key(1), sampling.sampling_params())
  pad = lambda x, v: jnp.pad(x, ((0, 0), (0, K_OBS)), constant_values=v)
  r = r.replace(
    tokens_NT=pad(r.tokens_NT, 0),
    mask_NT=pad(r.mask_NT, False),
    logp_NT=pad(r.logp_NT, 0.0),
    policy_logp_NT=pad(r.policy_logp_NT, 0.0),
  )
  return r.replace(action_mask_NT=r.mask_NT)


def _appended(r, tokenizer):
  """r with K_OBS observation tokens after each row's last token (in context, not acted)."""
  obs = np.array(tokenizer.encode("42;"), np.int32)
  tokens, mask = np.array(r.tokens_NT), np.array(r.mask_NT)
  for i, n in enumerate(np.asarray(r.length_N)):
    tokens[i, n : n + K_OBS], mask[i, n : n + K_OBS] = obs, True
  return r.replace(tokens_NT=jnp.asarray(tokens), mask_NT=jnp.asarray(mask))


def _loss_and_grads(params, rollouts, tiny_cfg, mode):
  cfg = spec.RLConfig(aggregation=mode)
  model_fn = model.make_model_fn(tiny_cfg)
  correct = jnp.asarray([1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1], jnp.float32)
  hyper = cfg.prepare_hyper(max_new_tokens=rollouts.tokens_NT.shape[1])
  batch, _, stats = preparation.prepare(
    params, None, rollouts, correct, jnp.zeros(16), hyper, cfg=cfg, model_fn=model_fn
  )
  w_NT = aggregation.REGISTRY.make(mode)(
    batch.loss_mask_NT, batch.group_ids_N, batch.adv_NT, max_len=None
  )
  grads, sums, _ = learner.accumulate_gradients(
    params, batch, w_NT, cfg.step_hyper(), cfg=cfg, model_fn=model_fn, token_outputs=False
  )
  return sums, grads, stats


@pytest.mark.parametrize("mode", aggregation.REGISTRY.names())
def test_observation_tokens_have_zero_gradient_and_leave_the_loss_unchanged(
  tiny_cfg, tiny_params, tokenizer, single_turn, mode
):
  appended = _appended(single_turn, tokenizer)
  base_sums, base_grads, base_stats = _loss_and_grads(tiny_params, single_turn, tiny_cfg, mode)
  sums, grads, stats = _loss_and_grads(tiny_params, appended, tiny_cfg, mode)
  # An appended observation changes no earlier logit (causal attention), so equal loss and
  # gradient mean its own tokens contribute nothing, and no denominator counts them.
  np.testing.assert_allclose(sums["loss"], base_sums["loss"], rtol=1e-5, atol=1e-7)
  assert float(sums["n_tok"]) == float(base_sums["n_tok"])
  flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
  np.testing.assert_allclose(flat(grads), flat(base_grads), rtol=1e-4, atol=1e-7)
  for key in ("response_length", "adv_mean", "adv_std", "rollout_entropy"):
    np.testing.assert_allclose(stats[key], base_stats[key], rtol=1e-5, atol=1e-7)
  # The same observations trained as actions (no action mask) change the gradient.
  _, wrong_grads, _ = _loss_and_grads(
    tiny_params, appended.replace(action_mask_NT=None), tiny_cfg, mode
  )
  assert np.abs(flat(wrong_grads) - flat(base_grads)).max() > 1e-4


def test_prepare_counts_action_tokens_only(tiny_cfg, tiny_params, chatty_episodes):
  r = chatty_episodes.rollouts
  cfg = spec.RLConfig(aggregation="token_mean")
  correct = jnp.asarray((chatty_episodes.reward_N > 3.5).astype(np.float32))
  hyper = cfg.prepare_hyper(max_new_tokens=r.tokens_NT.shape[1])
  batch, _, stats = preparation.prepare(
    tiny_params,
    None,
    r,
    correct,
    jnp.zeros(16),
    hyper,
    cfg=cfg,
    model_fn=model.make_model_fn(tiny_cfg),
  )
  action = np.asarray(r.action_mask_NT)
  np.testing.assert_array_equal(batch.mask_NT, r.mask_NT)  # The forward sees the context.
  assert not np.asarray(batch.loss_mask_NT)[~action].any()
  assert np.all(np.asarray(batch.adv_NT)[~action] == 0.0)
  assert float(stats["response_length"]) == pytest.approx(action.sum(axis=1).mean())


@pytest.mark.parametrize("estimator", advantages.REGISTRY.names())
def test_every_advantage_estimator_sees_actions_only(
  tiny_cfg, tiny_params, chatty_episodes, estimator
):
  """Every estimator runs on episode rows: finite advantages on action tokens only, and a
  sequence estimator's one value per row on all of its actions (observations between them
  split nothing)."""
  r = chatty_episodes.rollouts
  cfg = spec.RLConfig(advantage=estimator)
  correct = jnp.asarray(np.arange(16) % 3 == 0, jnp.float32)
  hyper = cfg.prepare_hyper(max_new_tokens=r.tokens_NT.shape[1])
  model_fn = model.make_model_fn(tiny_cfg)
  teacher = None  # A distillation teacher: the policy with its weights scaled (another π).
  if advantages.REGISTRY.traits(estimator).needs_teacher:
    teacher = (jax.tree.map(lambda x: 1.5 * x, tiny_params), model_fn)
  prepare = functools.partial(preparation.prepare, cfg=cfg, model_fn=model_fn, teacher=teacher)
  batch, _, stats = prepare(tiny_params, None, r, correct, jnp.zeros(16), hyper)
  action = np.asarray(r.action_mask_NT)
  adv = np.asarray(batch.adv_NT)
  assert np.isfinite(adv).all() and np.all(adv[~action] == 0.0)
  assert np.abs(adv[action]).max() > 0  # Mixed groups: something to learn.
  if estimator in ("grpo", "dr_grpo", "rloo", "batch_mean", "batch_mean_std", "positive_only"):
    # Sequence estimators: A_i = f(rewards) on every action token of row i.
    a_N = np.where(action, adv, np.nan)
    np.testing.assert_allclose(np.nanmin(a_N, axis=1), np.nanmax(a_N, axis=1), rtol=1e-6)


@pytest.mark.parametrize("planner", planners.REGISTRY.names())
def test_every_planner_updates_on_episodes(tiny_cfg, tiny_params, chatty_episodes, planner):
  r = chatty_episodes.rollouts
  base = config_lib.to_dict(presets.get("grpo"))
  cfg = spec.RLConfig.from_dict({**base, "planner": planner, "num_minibatches": 2, "kl_coef": 0.0})
  model_fn = model.make_model_fn(tiny_cfg)
  correct = jnp.asarray(np.arange(16) % 3 == 0, jnp.float32)
  hyper = cfg.prepare_hyper(max_new_tokens=r.tokens_NT.shape[1])
  batch, _, _ = preparation.prepare(
    tiny_params, None, r, correct, jnp.zeros(16), hyper, cfg=cfg, model_fn=model_fn
  )
  optimizer = spec.make_optimizer(lr=1e-3)
  update = learner.make_update(cfg, model_fn, optimizer, batch_size=16, group_size=4, donate=False)
  state = spec.init_state(tiny_params, optimizer)
  _, idx_EMb, history = update(state, batch, jax.random.key(0), cfg.step_hyper())
  assert sorted(np.ravel(idx_EMb).tolist()) == list(range(16))
  assert np.isfinite(history["loss"]).all()
  action_tokens = np.asarray(r.action_mask_NT).sum(axis=1)
  loss_tokens = [action_tokens[np.asarray(idx)].sum() for idx in np.asarray(idx_EMb)[0]]
  np.testing.assert_array_equal(history["loss_tokens"], loss_tokens)


def test_lora_episodes_train_the_adapters_on_actions_only(tokenizer):
  """Multi-turn episodes with adapters (rank 4, dropout 0.1, a KL term): the runner samples
  the adapted policy; prepare's reference log-probs are the base model's own forward of the
  whole episode (to float rounding); the update moves the adapters, never the base, and
  counts action tokens only."""
  cfg = model.tiny_config(
    tokenizer.vocab_size, n_layers=1, d_model=32, mlp_dim=64, lora=dict(rank=4, dropout=0.1)
  )
  params = model.init(cfg, jax.random.key(0))
  keys = jax.random.split(jax.random.key(1), len(jax.tree.leaves(params["lora"])))
  leaves, tree = jax.tree.flatten(params["lora"])
  params["lora"] = jax.tree.unflatten(
    tree, [jax.random.normal(k, x.shape) * 0.1 for k, x in zip(keys, leaves)]
  )
  r = _chatty_run(cfg, params, tokenizer).rollouts
  assert int(np.asarray(r.mask_NT).sum()) > int(np.asarray(r.action_mask_NT).sum())  # Tools.
  rl_cfg = spec.RLConfig(kl_coef=0.05, num_minibatches=2)
  model_fn = model.make_model_fn(cfg)
  hyper = rl_cfg.prepare_hyper(max_new_tokens=r.tokens_NT.shape[1])
  correct = jnp.asarray(np.arange(16) % 3 == 0, jnp.float32)
  batch, _, _ = jax.jit(functools.partial(preparation.prepare, cfg=rl_cfg, model_fn=model_fn))(
    params, model.reference(params), r, correct, jnp.zeros(16), hyper
  )
  base_fn = model.make_model_fn(model.base_config(cfg))
  want = jax.jit(
    functools.partial(preparation.rollout_logprobs, cfg=spec.RLConfig(), model_fn=base_fn)
  )(params["base"], None, r)
  # Equal to float rounding (another fusion of the same forward; test_lora pins the bits).
  np.testing.assert_allclose(batch.ref_logp_NT, want.old_logp_NT, rtol=1e-6, atol=1e-6)
  optimizer = spec.make_optimizer(lr=1e-2)
  update = learner.make_update(
    rl_cfg, model_fn, optimizer, batch_size=16, group_size=4, donate=False
  )
  state, idx_EMb, history = update(
    spec.init_state(params, optimizer), batch, jax.random.key(0), rl_cfg.step_hyper()
  )
  assert np.isfinite(np.asarray(history["loss"])).all()
  jax.tree.map(np.testing.assert_array_equal, state.params["base"], params["base"])
  moved = jax.tree.map(
    lambda a, b: float(jnp.abs(a - b).max()), state.params["lora"], params["lora"]
  )
  assert max(jax.tree.leaves(moved)) > 1e-4
  action_tokens = np.asarray(r.action_mask_NT).sum(axis=1)
  loss_tokens = [action_tokens[np.asarray(idx)].sum() for idx in np.asarray(idx_EMb)[0]]
  np.testing.assert_array_equal(history["loss_tokens"], loss_tokens)


# ----------------------------------------------------------------------------
# The calculator environment, its task and config.
# ----------------------------------------------------------------------------


def test_the_calculator_answers_tool_calls_and_checks_the_answer(tokenizer):
  task = tasks.get("calculator")
  example = task.example("train", 0, seed=0)
  env = calculator.Calculator(tokenizer=tokenizer)
  assert list(env.reset(example)) == []
  for action, observation in (("T:12+34=", "46;"), ("T:(1+2)*3=", "9;"), ("T:7/2=", "?;")):
    step = env.step(action)
    assert tokenizer.decode(step.observation) == observation and not step.done
    assert step.reward == 0.0
  assert env.step(f"A:{example.answer}.") == base.Step(reward=1.0, done=True)
  assert env.step(f"A:{int(example.answer) + 1}.").reward == 0.0
  assert env.step("T:12+34").done  # Not a call (no "="), not an answer: ends, reward 0.
  # The reference transcript is what the environment would say.
  assert task.reward(example.prompt, example.reference) == 1.0
  assert task.format_reward(example.prompt, example.reference) == 1.0


def test_calculator_problems_stay_in_range_and_splits_are_disjoint():
  task = tasks.get("calculator", steps=2, ops="+-*", max_digits=2)
  train = {task.example("train", i, seed=0).prompt for i in range(300)}
  test = {task.example("test", i, seed=0).prompt for i in range(60)}
  assert not train & test
  for i in range(300):
    e = task.example("train", i, seed=0)
    assert 0 <= int(e.answer) < 10**6 and e.reference.count("T:") == 2
    assert task.solve(e.prompt) == int(e.answer)


def test_the_config_builds_episodes_and_refuses_what_does_not_combine():
  c = config_lib.load("configs/calculator.py:tiny")
  setup = build.build(c)
  assert setup.episodes.name == "calculator" and setup.episodes.max_turns == 4
  assert build.as_dict(setup)["env"]["name"] == "calculator"
  for key, value, match in (
    ("env.name", "abacus", "config.env.name: Unknown environment 'abacus'"),
    ("env.max_turns", 0, "config.env.max_turns must be >= 1"),
    ("env.kwargs", {"base": 2}, "config.env.kwargs for environment 'calculator'"),
    ("sampler.refill_slots", 8, "with config.sampler.kv_layout='dense' \\(refill needs"),
    ("offpolicy.partial", "continue", r"partial='continue' \(episodes are played whole"),
    ("offpolicy.placement", "split", r"placement='split' \(the episode runners sample"),
  ):
    bad = config_lib.load("configs/calculator.py:tiny")
    section, _, field = key.partition(".")
    bad[section][field] = value
    if section == "offpolicy":
      bad.offpolicy.update(enabled=True, max_staleness=1)
    with pytest.raises(config_lib.ConfigError, match=match):
      build.build(bad, n_devices=2)
  refill = config_lib.load("configs/calculator.py:tiny")
  refill.sampler.update(kv_layout="paged", refill_slots=8)
  assert build.build(refill).sampler_cfg.refill_slots == 8  # Episodes through slots, paged.
  refill.env.overlap_steps = 4
  assert build.build(refill).episodes.overlap_steps == 4
  no_slots = config_lib.load("configs/calculator.py:tiny")
  no_slots.env.overlap_steps = 4
  with pytest.raises(config_lib.ConfigError, match=r"overlap_steps > 0 and config.sampler.refill"):
    build.build(no_slots)
  pipelined = config_lib.load("configs/calculator.py:tiny")
  pipelined.offpolicy.update(enabled=True, max_staleness=2)
  assert build.build(pipelined).episodes.name == "calculator"  # Whole episodes, shared.
  plain = config.default_config()
  plain.sampler.group_size = 4
  assert build.build(plain).episodes is None  # No environment: single-turn sampling.


# ----------------------------------------------------------------------------
# The calculator config learns (reduced size), and the benchmark reports its figures.
# ----------------------------------------------------------------------------

# Measured (eval every 10): 33.6% -> 43.0% (20), 43.8% (30), 48.4% (40), 50.8% (80); the
# flipped arm is at 5.5% after 5 iterations and 0.0% from 10 on (5 are enough: CI time).
# At 30 iterations the gain is within the 128-problem eval's noise (about 4 points a
# reading): after a change that only reordered float32 sums (Dense rows flattened) the same
# seed read 39.8% -> 43.0% (10), 43.0% (20), 40.6% (30), 42.2% (40), 44.5% (50), 46.9% (60),
# 48.4% (80), and seed 1 read +4.7 points at 30 (+7.8 at 60), with the code before that
# change -1.6 at 30 (+3.1 at 60). Hence 60 iterations: a single-seed smoke check of
# learning, not a measurement of its size. Over seeds fixed in advance
# (experiments/calculator_seeds.py) 24 of the seeds 11-36 gained (mean +9.3 points, 95% CI
# [+5.1, +13.4]) and 16 of the 26 reached +5. From the committed warm start
# (tests/fixtures/warm_starts, made 2026-12-04 by today's code): 33.6% -> 44.5% at 60,
# flipped 7.8% at 5.
LEARN_ITERATIONS = 60
FLIPPED_ITERATIONS = 5


def _calculator_config(iterations=LEARN_ITERATIONS):
  c = config_lib.load("configs/calculator.py:tiny")
  c.update(iterations=iterations, eval_every=iterations, checkpoint_every=LEARN_ITERATIONS)
  c.update(reward_workers=0, progress=False, tensorboard=False)
  return c


@pytest.fixture(scope="module")
def calculator_runs(tmp_path_factory):
  """{"grpo": (summary, records), "flipped": ...}: both resume from one warm start
  (checkpoint 0); the flipped arm trains on −A."""
  out = runs.warm_started_arms(
    tmp_path_factory,
    {"grpo": _calculator_config()},
    fixture="calculator_tiny",
    flipped=_calculator_config(FLIPPED_ITERATIONS),
  )
  return {k: (v, runs.lines(v["workdir"])) for k, v in out.items()}


def test_the_calculator_config_learns_with_its_tool(calculator_runs):
  (grpo, records), (flipped, _) = calculator_runs["grpo"], calculator_runs["flipped"]
  assert grpo["warmstart_accuracy"] == flipped["warmstart_accuracy"]  # One warm start.
  gain = grpo["final_accuracy"] - grpo["warmstart_accuracy"]
  flipped_gain = flipped["final_accuracy"] - flipped["warmstart_accuracy"]
  assert gain >= 0.05, (gain, grpo)  # Measured: +7.0 points at 60 iterations (see above).
  # The flipped arm (5 iterations on −A) collapses (33.6% -> 5.5%): a margin no noise
  # could fake.
  assert gain - flipped_gain >= 0.15, (gain, flipped_gain)
  rl_lines = [r for r in records if r["phase"] == "rl"]
  assert rl_lines[-1]["episode/turns"] > 2.5  # Two tool calls and the answer.
  for key in rl_lines[-1]:
    metrics.definition(key)


def test_bench_episodes_reports_its_figures():
  import bench_episodes  # noqa: PLC0415

  # Its slot-refill options (the lockstep default differs only by the config it builds).
  args = ["--quick", "--kv_layout=paged", "--refill_slots=4", "--overlap_steps=4", "--tool_ms=1"]
  step = calculator.Calculator.step
  r = bench_episodes.main(args)
  assert calculator.Calculator.step is step  # --tool_ms's slow step is undone after.
  assert r["episodes_per_s"] > 0 and r["episodes"] == 16 and r["refill_slots"] == 4
  assert 0 < r["sample_share"] < 1 and 0 < r["env_share"] < 1
  assert r["row_steps"] > 0
