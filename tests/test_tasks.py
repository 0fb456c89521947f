import fractions
import itertools

import pytest

from grpo_jax import registry, tasks, tokenizers
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


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_stream_is_deterministic_and_seeded(name):
  task = tasks.get(name)
  first = list(itertools.islice(task.examples("train", seed=3), 20))
  assert first == list(itertools.islice(task.examples("train", seed=3), 20))
  assert first[5:] == list(
    itertools.islice(task.examples("train", seed=3, start=5), 15)
  )  # Resumable.
  assert first != list(itertools.islice(task.examples("train", seed=4), 20))


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
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
  if name == "arithmetic":
    return prompt[2:-1]  # "Q:47+85\n" -> "47+85"
  numbers, target = countdown.Countdown.parse_prompt(prompt)
  return f"{sorted(numbers)}->{target}"  # Countdown: the multiset and target, in any order.


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_split_is_a_function_of_the_problem_whatever_the_seed(name):
  task = tasks.get(name)
  for split in tasks.SPLITS:
    for seed in (0, 1):
      for e in itertools.islice(task.examples(split, seed=seed), 30):
        assert tasks.split_of(_problem_key(name, e.prompt), test_percent=task.test_percent) == split


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
