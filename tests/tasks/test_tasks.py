import fractions
import itertools

import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.infra import registry
from grpo_jax.models import tokenizers
from grpo_jax.tasks import arithmetic, countdown, expr


@pytest.mark.parametrize(
  "prompt, completion, reward, fmt",
  [
    ("Q:47+85\n", "A:132.", 1.0, 1.0),
    ("Q:3-45\n", "A:-42.", 1.0, 1.0),
    ("Q:12*11\n", "A:132.", 1.0, 1.0),
    ("Q:47+85\n", "A:131.", 0.0, 1.0),  # Wrong answer, right format.
    ("Q:47+85\n", "132", 0.0, 0.0),  # Right number, no template.
    ("Q:47+85\n", "A:132", 0.0, 0.0),  # Missing terminator.
    ("Q:47+85\n", "A:132.A:1.", 0.0, 0.0),  # Trailing junk.
    ("Q:47+85\n", "A:1 32.", 0.0, 0.0),
    ("Q:47+85\n", "", 0.0, 0.0),
  ],
)
def test_arithmetic_rewards(prompt, completion, reward, fmt):
  task = tasks.get("arithmetic", ops="+-*")
  assert task.reward(prompt, completion) == reward
  assert task.format_reward(prompt, completion) == fmt


def test_arithmetic_rejects_foreign_prompt():
  with pytest.raises(ValueError, match="Not an arithmetic prompt"):
    tasks.get("arithmetic").reward("N:1,2 T:3\n", "A:3.")


@pytest.mark.parametrize(
  "completion, reward, fmt",
  [
    ("A:25*3+7.", 1.0, 1.0),
    ("A:7+3*25.", 1.0, 1.0),
    ("A:(7+25)*3-14.", 0.0, 1.0),  # Uses 14, not given.
    ("A:25*3.", 0.0, 1.0),  # 75: wrong value, and 7 unused.
    ("A:25*3+7+7-7.", 0.0, 1.0),  # Right value, 7 used three times.
    ("A:(25*3)+7.", 1.0, 1.0),
    ("A:25*3+7", 0.0, 0.0),  # No terminator.
    ("A:25*/3+7.", 0.0, 0.0),  # Syntax error.
    ("A:7/(3-3)+25.", 0.0, 0.0),  # Division by zero.
    ("A:__import__('os').", 0.0, 0.0),  # Never evaluated as Python.
    ("82", 0.0, 0.0),
  ],
)
def test_countdown_rewards(completion, reward, fmt):
  task = tasks.get("countdown")
  prompt = "N:3,7,25 T:82\n"
  assert task.reward(prompt, completion) == reward
  assert task.format_reward(prompt, completion) == fmt


def test_countdown_exact_use_switch_and_rational_division():
  loose = tasks.get("countdown", exact_use=False)
  assert loose.reward("N:3,7,25 T:75\n", "A:25*3.") == 1.0
  assert loose.reward("N:3,7,25 T:78\n", "A:25*3+3.") == 0.0  # 3 used twice.
  assert tasks.get("countdown").reward("N:3,7,25 T:75\n", "A:25*3.") == 0.0
  # Division is exact: 7/2*4 = 14 uses a non-integer intermediate and is right.
  assert tasks.get("countdown").reward("N:7,2,4 T:14\n", "A:7/2*4.") == 1.0


def test_expression_parser_pinned_values():
  assert expr.evaluate("2+3*4") == (14, [2, 3, 4])
  assert expr.evaluate("(2+3)*4")[0] == 20
  assert expr.evaluate("8-3-2")[0] == 3  # Left-associative.
  assert expr.evaluate("8/4/2")[0] == 1
  assert expr.evaluate("7/2")[0] == fractions.Fraction(7, 2)
  assert expr.evaluate(" 1 + ( 2 ) ")[0] == 3
  for bad, message in [
    ("", "empty"),
    ("1+", "end of expression"),
    ("(1+2", "missing"),
    ("1)", "unexpected token"),
    ("2**3", "unexpected token"),
    ("1/0", "division by zero"),
    ("1+a", "unexpected character 'a'"),
    ("1234567+1", "more than 6 digits"),
    ("(" * 20 + "1" + ")" * 20, "nested deeper"),
    ("+".join(["1"] * 40), "more than 64 tokens"),
  ]:
    with pytest.raises(expr.ExprError, match=message):
      expr.evaluate(bad)


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "long_addition"])
def test_stream_is_deterministic_and_seeded(name):
  task = tasks.get(name)
  first = list(itertools.islice(task.examples("train", seed=3), 20))
  assert first == list(itertools.islice(task.examples("train", seed=3), 20))
  assert first[5:] == list(
    itertools.islice(task.examples("train", seed=3, start=5), 15)
  )  # Resumable.
  assert first != list(itertools.islice(task.examples("train", seed=4), 20))


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "long_addition"])
def test_train_and_test_are_disjoint_and_references_are_correct(name):
  task = tasks.get(name)
  tok = task.tokenizer()
  train = list(itertools.islice(task.examples("train", seed=0), 400))
  test = list(itertools.islice(task.examples("test", seed=0), 100))
  assert not {e.prompt for e in train} & {e.prompt for e in test}
  for e in train + test:
    assert task.reward(e.prompt, e.reference) == 1.0, e
    assert task.format_reward(e.prompt, e.reference) == 1.0, e
    tok.encode(e.prompt + e.reference)  # Every example fits the alphabet.


def _problem_key(name, prompt):
  if name in ("arithmetic", "long_addition"):
    return prompt[2:-1]  # "Q:47+85\n" -> "47+85"
  numbers, target = countdown.Countdown.parse_prompt(prompt)
  return f"{sorted(numbers)}->{target}"  # Countdown: the multiset and target, in any order.


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "long_addition"])
def test_split_is_a_function_of_the_problem_whatever_the_seed(name):
  task = tasks.get(name)
  for split in tasks.SPLITS:
    for seed in (0, 1):
      for e in itertools.islice(task.examples(split, seed=seed), 30):
        assert tasks.split_of(_problem_key(name, e.prompt), test_percent=task.test_percent) == split


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "long_addition", "word_problems"])
def test_problem_key_is_the_split_s_key_and_finds_the_repeats(name):
  """problem_key(split, i) is the key the split hashes (one problem drawn twice shares
  it); an evaluation's interval resamples by it. Arithmetic's 100 held-out draws repeat."""
  import gguf_files  # noqa: PLC0415 -- word problems render through a model's chat template.

  options = {"tokenizer_dir": str(gguf_files.FIXTURE)} if name == "word_problems" else {}
  task = tasks.get(name, **options)
  keys = [task.problem_key("test", i, seed=0) for i in range(100)]
  examples = [task.example("test", i, seed=0) for i in range(100)]
  for key, e in zip(keys, examples, strict=True):
    assert tasks.split_of(key, test_percent=task.test_percent) == "test"
    if name != "word_problems":  # Its key is the arithmetic, not the wording.
      assert key == _problem_key(name, e.prompt)
  by_key = {}
  for key, e in zip(keys, examples, strict=True):
    by_key.setdefault(key, set()).add(e.answer)
  assert all(len(answers) == 1 for answers in by_key.values())  # One key, one problem.
  if name == "arithmetic":
    assert len(by_key) < 100


def test_a_dataset_task_keys_its_problems_by_prompt(tmp_path):
  path = tmp_path / "p.jsonl"
  path.write_text(
    "".join(f'{{"prompt": "Q:{i}+1\\n", "answer": "A:{i + 1}."}}\n' for i in range(6))
  )
  task = tasks.get("jsonl", path=str(path), test_percent=50)
  for i in range(3):
    assert task.problem_key("test", i, seed=0) == task.example("test", i, seed=0).prompt


def test_unknown_task_lists_valid_names():
  # Other test modules register more tasks (fault_tasks); these two are always there.
  with pytest.raises(
    ValueError, match="Unknown task 'arith'; valid names: .*arithmetic.*countdown"
  ):
    tasks.get("arith")


def test_bad_task_options_and_split():
  with pytest.raises(ValueError, match="subset of '\\+-\\*'"):
    arithmetic.Arithmetic(ops="+/")
  with pytest.raises(ValueError, match="valid splits"):
    tasks.get("arithmetic").example("dev", 0, seed=0)


def test_registry_rejects_duplicates():
  reg = registry.Registry("widget")
  reg.register("a")(1)
  with pytest.raises(ValueError, match="widget 'a' is already registered"):
    reg.register("a")(2)
  assert reg.get("a") == 1 and "a" in reg and list(reg) == ["a"]


def test_char_tokenizer_roundtrip_specials_and_errors():
  tok = tokenizers.CharTokenizer("ab:")
  assert isinstance(tok, tokenizers.Tokenizer)
  assert tok.vocab_size == 6 and (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  ids = tok.encode("ba:", add_bos=True, add_eos=True)
  assert ids == [1, 4, 3, 5, 2]
  assert tok.decode(ids + [3, 3]) == "ba:"  # Stops at EOS.
  assert tok.decode([0, 0, 1, 3]) == "a"  # Skips padding and BOS.
  with pytest.raises(
    ValueError, match="Character 'c' at position 1 of 'acb' is not in the tokenizer alphabet"
  ):
    tok.encode("acb")
  with pytest.raises(ValueError, match="outside this tokenizer's vocab"):
    tok.decode([9])
  with pytest.raises(ValueError, match="repeats characters"):
    tokenizers.CharTokenizer("aba")


# ----------------------------------------------------------------------------
# long_addition: the multi-step task.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "completion, reward, fmt",
  [
    ("8+6+0=14;7+5+1=13;4+3+1=8;A:834.", 1.0, 1.0),
    # A wrong carry in step 1 makes it wrong, though the answer line is right.
    ("8+6+0=14;7+5+0=12;4+3+1=8;A:834.", 0.0, 1.0),
    # A wrong column sum, answer right.
    ("8+6+0=14;7+5+1=12;4+3+1=8;A:834.", 0.0, 1.0),
    # Every step right, wrong answer line.
    ("8+6+0=14;7+5+1=13;4+3+1=8;A:833.", 0.0, 1.0),
    # Digits of the wrong column; a missing step; steps in the wrong order.
    ("7+5+0=12;8+6+1=15;4+3+1=8;A:834.", 0.0, 1.0),
    ("8+6+0=14;7+5+1=13;A:834.", 0.0, 1.0),
    # Numbers with a leading zero are not the canonical solution.
    ("8+6+0=14;7+5+1=13;4+3+1=08;A:834.", 0.0, 1.0),
    ("8+6+0=14;7+5+1=13;4+3+1=8;A:0834.", 0.0, 1.0),
    # Off the template: no answer line, trailing text, a 3-digit column sum.
    ("8+6+0=14;7+5+1=13;4+3+1=8;", 0.0, 0.0),
    ("8+6+0=14;7+5+1=13;4+3+1=8;A:834.5", 0.0, 0.0),
    ("8+6+0=140;7+5+1=13;4+3+1=8;A:834.", 0.0, 0.0),
  ],
)
def test_long_addition_rewards_every_step(completion, reward, fmt):
  task = tasks.get("long_addition")
  assert task.reward("Q:478+356\n", completion) == reward
  assert task.format_reward("Q:478+356\n", completion) == fmt


def test_long_addition_pads_the_shorter_operand_and_writes_the_final_carry():
  from grpo_jax.tasks import long_addition

  assert long_addition.solution(95, 7) == "5+7+0=12;9+0+1=10;A:102."
  assert long_addition.solution(7, 95) == "7+5+0=12;0+9+1=10;A:102."
  assert long_addition.check(95, 7, "5+7+0=12;9+0+0=9;A:102.") == "step 1: carry 0, expected 1"
  task = tasks.get("long_addition", min_digits=1, max_digits=4)
  for i in range(300):
    ex = task.example("train", i, seed=3)
    assert task.reward(ex.prompt, ex.reference) == 1.0
    assert len(ex.reference) <= task.max_completion_len()
    assert set(ex.reference) <= set(tasks.TOY_ALPHABET)


def test_long_addition_draws_operands_past_int64_and_keeps_the_shorter_draws():
  """Up to 64 digits (a 644-character solution): past 18 digits a digit at a time, the
  digit count as asked and no leading zero; draws of up to 18 digits are the int64 ones
  every committed result was made with (pinned)."""
  from grpo_jax.tasks import base, long_addition

  rng = np.random.default_rng(0)
  assert base.random_operand(rng, min_digits=18, max_digits=18) == 673265518589308905
  task = tasks.get("long_addition", min_digits=20, max_digits=64)
  lengths = set()
  for i in range(200):
    ex = task.example("train", i, seed=1)
    a, b = long_addition.LongAddition.operands(ex.prompt)
    lengths |= {len(str(a)), len(str(b))}
    assert task.reward(ex.prompt, ex.reference) == 1.0 and ex.answer == str(a + b)
    assert len(ex.reference) <= task.max_completion_len() == 644
  assert min(lengths) == 20 and max(lengths) == 64 and len(lengths) > 30
  with pytest.raises(ValueError, match="max_digits <= 64, got 1, 65"):
    tasks.get("long_addition", min_digits=1, max_digits=65)


def _corrupt(text: str, rng) -> str:
  """One random edit in the toy alphabet: substitute, insert or delete a character."""
  i = int(rng.integers(len(text) + 1))
  ch = tasks.TOY_ALPHABET[int(rng.integers(len(tasks.TOY_ALPHABET)))]
  kind = int(rng.integers(3))
  if kind == 0 and i < len(text):
    return text[:i] + ch + text[i + 1 :]
  if kind == 1:
    return text[:i] + ch + text[i:]
  return text[:i] + text[i + 1 :]


def test_long_addition_template_tags_are_exact_by_construction():
  """Tags from the grammar's parse: in a worked solution, exactly the characters of the
  number slots (operand digits, carries, sums, the answer) are reasoning. That agrees with
  tagging by `template_chars` at every position, for solutions and for corrupted ones."""
  import numpy as np

  from grpo_jax.tasks import long_addition

  task = tasks.get("long_addition", min_digits=1, max_digits=5)
  # Pinned by hand: "5+7+0=12;A:12." -> R T R T R T R R T T T R R T.
  pinned = long_addition.template_mask("5+7+0=12;A:12.")
  assert "".join("T" if t else "R" for t in pinned) == "RTRTRTRRTTTRRT"
  rng = np.random.default_rng(0)
  for i in range(400):
    ref = task.example("train", i, seed=1).reference
    a, b = task.operands(task.example("train", i, seed=1).prompt)
    for text in (ref, _corrupt(ref, rng)):
      tags = task.template_mask(text)
      by_char = np.array([c in task.template_chars for c in text], bool)
      np.testing.assert_array_equal(tags, by_char, err_msg=text)
    # The reasoning characters of a solution are its numbers, in order.
    digits = "".join(c for c, t in zip(ref, task.template_mask(ref)) if not t)
    assert digits == "".join(c for c in ref if c.isdigit())
    assert digits.endswith(str(a + b))
