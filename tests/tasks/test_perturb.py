"""Perturbed prompts (IBPO counterfactuals): the same problem and answer, asked another way."""

import pathlib

import numpy as np
import pytest

from grpo_jax import tasks
from grpo_jax.tasks import base, expr, long_addition, math

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
QWEN2 = str(FIXTURES / "hf" / "qwen2")
TOYS = ("long_addition", "arithmetic", "countdown")


def _example(prompt, reference, answer):
  return base.Example(prompt=prompt, reference=reference, answer=answer)


# A long addition, in the module docstring's example.
ADD = _example("Q:478+356\n", "8+6+0=14;7+5+1=13;4+3+1=8;A:834.", "834")


def test_long_addition_perturbations_by_hand():
  t = tasks.get("long_addition")
  assert t.supported_perturbations() == ("hint", "paraphrase", "repair")
  assert t.perturb(ADD, "hint") == "Q:478+356\nS:8+6+0=14;\n"
  assert t.perturb(ADD, "paraphrase") == "Q:356+478\n"
  assert t.perturb(ADD, "repair", attempt="8+6+0=14;A:84.") == "Q:478+356\nN:8+6+0=14;A:84.\n"
  # The paraphrase asks for the same sum: its own worked solution ends with the same answer.
  assert long_addition.solution(356, 478) == "6+8+0=14;5+7+1=13;3+4+1=8;A:834."


def test_long_addition_repair_clips_the_attempt_to_a_full_solution_length():
  t = tasks.get("long_addition", max_digits=3)
  assert t.max_attempt_chars == t.max_completion_len() == 3 * 9 + 3 + 4 == 34
  prompt = t.perturb(ADD, "repair", attempt="9" * 100)
  assert prompt == "Q:478+356\nN:" + "9" * 34 + "\n"


@pytest.mark.parametrize(
  "prompt,hint,paraphrase",
  [
    ("Q:47+85\n", "S:7+5=12;", "Q:85+47\n"),
    ("Q:43-15\n", "S:3-5=-2;", "Q:-15+43\n"),
    ("Q:12*34\n", "S:2*4=8;", "Q:34*12\n"),
  ],
)
def test_arithmetic_perturbations_by_hand(prompt, hint, paraphrase):
  t = tasks.get("arithmetic", ops="+-*")
  ex = _example(prompt, "", "")
  assert t.perturb(ex, "hint") == f"{prompt}{hint}\n"
  assert t.perturb(ex, "paraphrase") == paraphrase
  assert t.perturb(ex, "repair", attempt="A:1.") == f"{prompt}N:A:1.\n"


def test_countdown_perturbations_by_hand():
  t = tasks.get("countdown")
  ex = _example("N:3,7,25 T:82\n", "A:25*3+7.", "82")
  assert t.perturb(ex, "hint") == "N:3,7,25 T:82\nS:25*3=75;\n"
  assert t.perturb(ex, "paraphrase") == "N:7,25,3 T:82\n"  # Rotated left by one.
  assert t.perturb(ex, "repair", attempt="A:25*3+8.") == "N:3,7,25 T:82\nN:A:25*3+8.\n"
  # The first operation of a left-deep reference sits after its opening parentheses.
  nested = _example("N:3,7,2,1,4 T:19\n", "A:((3+7)*2-1)/1.", "19")
  assert t.perturb(nested, "hint") == "N:3,7,2,1,4 T:19\nS:3+7=10;\n"
  # All numbers equal: no other order exists, the paraphrase is the prompt itself.
  same = _example("N:5,5 T:10\n", "A:5+5.", "10")
  assert t.perturb(same, "paraphrase") == same.prompt


def test_countdown_paraphrase_is_deterministic_given_rng_and_never_the_original_order():
  t = tasks.get("countdown", min_numbers=4, max_numbers=4)
  for i in range(50):
    ex = t.example("train", i, seed=1)
    a = t.perturb(ex, "paraphrase", rng=np.random.default_rng([7, i]))
    assert a == t.perturb(ex, "paraphrase", rng=np.random.default_rng([7, i]))
    numbers, target = t.parse_prompt(ex.prompt)
    got_numbers, got_target = t.parse_prompt(a)
    assert sorted(got_numbers) == sorted(numbers) and got_target == target
    assert got_numbers != numbers or len(set(numbers)) == 1


def _attempts(rng):
  """Failed attempts as a caller may pass them: in-format, multi-line, foreign, long."""
  yield "A:12."
  yield "1+2+0=3;\nA:9.\n"
  yield "x\tÄ?"
  yield "".join(rng.choice(list(base.TOY_ALPHABET), size=int(rng.integers(1, 300))))


def _value(question: str) -> object:
  """The value of a toy arithmetic question ("-b+a" read as 0-b+a)."""
  return expr.evaluate("0" + question if question.startswith("-") else question)[0]


@pytest.mark.parametrize("name", TOYS)
def test_toy_perturbations_encode_and_keep_the_problem(name):
  kwargs = dict(ops="+-*") if name == "arithmetic" else {}
  t = tasks.get(name, **kwargs)
  tok = t.tokenizer()
  rng = np.random.default_rng(0)
  for i in range(200):
    ex = t.example("train", i, seed=3)
    assert t.reward(t.reward_input(ex), ex.reference) == 1.0
    hint = t.perturb(ex, "hint")
    para = t.perturb(ex, "paraphrase", rng=np.random.default_rng(i))
    repairs = [t.perturb(ex, "repair", attempt=a) for a in _attempts(rng)]
    for q in [hint, para, *repairs]:
      tok.encode(q)  # Only toy-alphabet characters.
      assert q.endswith("\n") and q.count("\n") == ex.prompt.count("\n") + (q != para)
    for q in [hint, *repairs]:
      assert q.startswith(ex.prompt)
    for q in repairs:
      assert len(q) <= len(ex.prompt) + len("N:\n") + t.max_attempt_chars
    # The same answer: the reference of the original solves the paraphrase too.
    if name == "long_addition":
      a, b = t.operands(para)
      assert str(a + b) == ex.answer and t.operands(ex.prompt) == (b, a)
      assert hint == f"{ex.prompt}S:{ex.reference.split(';')[0]};\n"
    elif name == "arithmetic":
      assert _value(para[2:-1]) == _value(ex.prompt[2:-1]) == int(ex.answer)
      left, right = hint.splitlines()[-1][2:-1].split("=")
      assert _value(left) == int(right)
    else:
      assert t.reward(para, ex.reference) == 1.0
      left, right = hint.splitlines()[-1][2:-1].split("=")
      assert expr.evaluate(left)[0] == expr.evaluate(right)[0]


def test_step_delimiters():
  assert tasks.get("long_addition").step_end_text == (";",)
  assert tasks.get("arithmetic").step_end_text == (".",)
  assert tasks.get("countdown").step_end_text == (".",)
  assert base.Task.step_end_text == ("\n",) and base.Task.step_start_text == ""


class _Plain(base.Task):
  name = "plain"

  def _draw(self, rng):
    return "k", _example("Q:1\n", "A:1.", "1")

  def reward(self, prompt, completion):
    return 0.0

  def format_reward(self, prompt, completion):
    return 0.0


def test_bad_kind_unsupported_kind_and_empty_attempt_are_clear():
  t = tasks.get("long_addition")
  with pytest.raises(ValueError, match=r"'reword'.*\('hint', 'paraphrase', 'repair'\)"):
    t.perturb(ADD, "reword")
  with pytest.raises(ValueError, match="needs a failed attempt"):
    t.perturb(ADD, "repair")
  plain = _Plain()
  assert plain.supported_perturbations() == ()
  with pytest.raises(base.PerturbationUnsupported, match=r"'plain' cannot build a 'hint'.*\(\)"):
    plain.perturb(ADD, "hint")
  assert issubclass(base.PerturbationUnsupported, ValueError)


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory):
  return tasks.get(
    "math",
    dataset="gsm8k",
    tokenizer_dir=QWEN2,
    data_dir=str(tmp_path_factory.mktemp("tfds")),
    manual_dir=str(FIXTURES / "data" / "gsm8k"),
  )


def _chat(user: str) -> str:
  return (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    f"{user}\nPlease reason step by step, and put your final answer within "
    "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n"
  )


def test_math_hint_and_repair_keep_the_chat_template(gsm8k):
  ex = gsm8k.example("test", 1, seed=0)
  question = gsm8k.source("test")[1].question
  assert ex.prompt == _chat(question)
  assert gsm8k.question(ex.prompt) == question
  assert gsm8k.supported_perturbations() == ("hint", "repair")
  assert gsm8k.perturb(ex, "hint") == _chat(f"{question}\nHint: It takes 2/2=1 bolt of white fiber")
  assert gsm8k.perturb(ex, "repair", attempt="It is \\boxed{4}.") == _chat(
    f"{question}\n\nA previous attempt was wrong:\nIt is \\boxed{{4}}.\nSolve it again."
  )
  # Scored against the original example's gold answer, which the prompt does not change.
  assert gsm8k.reward(gsm8k.reward_input(ex), ex.reference) == 1.0
  with pytest.raises(base.PerturbationUnsupported, match=r"'math'.*'paraphrase'.*'hint'"):
    gsm8k.perturb(ex, "paraphrase")
  with pytest.raises(ValueError, match="not a prompt of this task"):
    gsm8k.perturb(_example("Q:1+1\n", "A:2.", "2"), "hint")


def test_math_without_a_step_before_the_answer_gives_the_prompt_unchanged(gsm8k):
  ex = gsm8k.example("test", 0, seed=0)
  bare = _example(ex.prompt, "The answer is \\boxed{18}.", "18")
  assert gsm8k.perturb(bare, "hint") == ex.prompt


def test_math_first_step():
  assert math.first_step("Half is 24. So 72.\nThe answer is \\boxed{72}.") == "Half is 24."
  assert math.first_step("So \\boxed{3}.") == ""
  assert math.first_step("") == ""
  assert math.first_step("aa bb cc dd", max_chars=7) == "aa bb ..."


def test_math_perturbs_base_model_prompts():
  plain = tasks.get(
    "math",
    dataset="gsm8k",
    tokenizer_dir=QWEN2,
    chat=False,
    prompt_template="Problem: {question}\nAnswer:",
  )
  ex = _example("Problem: Two plus two?\nAnswer:", "2+2=4.\nThe answer is \\boxed{4}.", "4")
  assert plain.perturb(ex, "hint") == "Problem: Two plus two?\nHint: 2+2=4.\nAnswer:"
  assert plain.perturb(ex, "repair", attempt="5") == (
    "Problem: Two plus two?\n\nA previous attempt was wrong:\n5\nSolve it again.\nAnswer:"
  )
