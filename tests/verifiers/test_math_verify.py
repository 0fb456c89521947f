"""Math verification: both backends, extraction, normalisation, equivalence, format, timeouts.

The big table pins the builtin backend's rules (the docstrings of math_extract,
math_normalize, math_parse and math_equiv); the math_verify (default) backend has its own
hand-picked cases, its unscorable verdicts and timeouts.
"""

import importlib.util
import pickle
import subprocess
import sys
import threading
import time

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import subproc
import sympy

from grpo_jax.verifiers import math_verify, reward_pool, verdicts

TIMEOUT_S = 1.0
SLACK_S = 4.0  # A loaded 2-core CI machine: a replacement worker may be slow to start.
PATHOLOGICAL = r"so \boxed{9^{9^{9^{9}}}}"  # Eager sympy evaluation never finishes.
SETTINGS = hypothesis.settings(max_examples=60, deadline=None)

# (completion, gold, expected verdict): each row pins one rule of the builtin backend.
CASES = [
  # Equivalent forms.
  (r"So the answer is $\boxed{\frac{1}{2}}$.", "0.5", "correct"),
  (r"\boxed{\dfrac{1}{2}}", r"\frac12", "correct"),
  (r"\boxed{\tfrac{3}{4}}", "0.75", "correct"),
  (r"\boxed{.5}", r"\frac{1}{2}", "correct"),
  (r"\boxed{1/2}", r"\frac{1}{2}", "correct"),
  (r"\boxed{0.50}", "1/2", "correct"),
  (r"\boxed{50\%}", "50", "correct"),
  (r"\boxed{50\%}", "0.5", "correct"),
  (r"\boxed{0.5}", r"50\%", "correct"),
  (r"\boxed{1,234}", "1234", "correct"),
  (r"\boxed{1{,}234{,}567}", "1234567", "correct"),
  ("#### 1,234", "1234", "correct"),
  ("#### -1,000", "-1000", "correct"),
  (r"\boxed{5 \text{ cm}}", "5", "correct"),
  (r"\boxed{12\mbox{ inches}}", "12", "correct"),
  (r"\boxed{30^\circ}", "30", "correct"),
  (r"\boxed{30^{\circ}}", r"30^\circ", "correct"),
  ("The answer is 45 degrees.", "45", "correct"),
  ("The answer is 5 dollars.", "5", "correct"),
  (r"\boxed{\$18.90}", "18.9", "correct"),
  (r"\boxed{\text{Monday}}", "Monday", "correct"),
  (r"\boxed{\textbf{(C)}}", "C", "correct"),
  (r"\boxed{x = 5}", "5", "correct"),
  (r"\boxed{+7}", "7", "correct"),
  (r"\boxed{\left( 3, -\frac{1}{2} \right)}", "(3,-1/2)", "correct"),
  (r"\boxed{\sqrt2}", r"\sqrt{2}", "correct"),
  (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", "correct"),
  (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt2}{2}", "correct"),
  (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", "correct"),
  (r"\boxed{\sqrt[3]{27}}", "3", "correct"),
  (r"\boxed{2\pi}", r"2 \pi", "correct"),
  (r"\boxed{6.2831853}", r"2\pi", "correct"),
  (r"\boxed{\pi r^2}", r"r^{2}\pi", "correct"),
  (r"\boxed{2 \cdot 3}", "6", "correct"),
  (r"\boxed{4 \times 10^{3}}", "4000", "correct"),
  (r"\boxed{2^{10}}", "1024", "correct"),
  (r"\boxed{(x+1)^2}", "x^2+2x+1", "correct"),
  (r"\boxed{3+4i}", "4i+3", "correct"),
  (r"\boxed{[0, 1)}", r"[0,1)", "correct"),
  (r"\boxed{(-\infty, 0) \cup (1, \infty)}", r"(-\infty,0)\cup(1,\infty)", "correct"),
  (r"\boxed{\{3, 1, 2\}}", r"\{1,2,3\}", "correct"),
  (r"\boxed{-2, 3}", "3, -2", "correct"),
  (r"\boxed{y = 2x + 3}", "2x+3", "correct"),
  (r"\boxed{2x + 4y = 12}", "x+2y=6", "correct"),
  (r"\boxed{2\frac{1}{2}}", r"\frac{5}{2}", "correct"),
  (r"\boxed{4\frac12}", "4.5", "correct"),
  (r"\boxed{x \in [0, 1]}", "[0,1]", "correct"),
  (r"\fbox{42}", "42", "correct"),
  (r"\boxed 5", "5", "correct"),
  ("Final Answer: The final answer is $\\frac{3}{5}$. I hope it is correct.", "0.6", "correct"),
  ("**Answer:** 17", "17", "correct"),
  (r"First \boxed{3}, then corrected: \boxed{4}", "4", "correct"),
  (r"\boxed{\boxed{7}}", "7", "correct"),
  (r"\boxed{10,100}", "10100", "correct"),  # A comma group of three, no space: thousands.
  (r"\boxed{10,\!000}", "10000", "correct"),
  (r"\boxed{1 000}", "1000", "correct"),
  (r"\boxed{2 1/2}", "5/2", "correct"),
  (r"\boxed{10, 100}", "100, 10", "correct"),  # A bare list is unordered.
  (r"\boxed{150\%}", "1.5", "correct"),
  (r"\boxed{0.5\%}", "0.005", "correct"),
  (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix}1\\2\end{pmatrix}", "correct"),
  (
    r"\boxed{\begin{pmatrix} 0.5 \\ 2 \end{pmatrix}}",
    r"\begin{pmatrix}\frac12\\2\end{pmatrix}",
    "correct",
  ),
  (
    r"\boxed{\begin{bmatrix}1&0\\0&1\end{bmatrix}}",
    r"\begin{pmatrix}1&0\\0&1\end{pmatrix}",
    "correct",
  ),
  ("#### Step 2: Answer\nThe answer is 7.", "7", "correct"),  # A heading, not an answer.
  ("**Answer**: 42", "42", "correct"),
  ("The answer is **42**.", "42", "correct"),
  ("The answer is 5 apples.", "5", "correct"),
  ("#### 18 eggs", "18", "correct"),
  (r"\boxed{3 cups}", "3", "correct"),
  (r"\boxed{80 \text{ km/h}}", "80", "correct"),
  (r"\boxed{80 \text{ km/hr}}", "80", "correct"),
  (r"\boxed{\$40\text{/hour}}", "40", "correct"),
  (r"\boxed{\pm 2}", "2, -2", "correct"),
  (r"\boxed{-2, 2}", r"\pm 2", "correct"),
  (r"\boxed{2 \pm \sqrt{3}}", r"2+\sqrt3, 2-\sqrt3", "correct"),
  (r"\boxed{x = -1 \pm \sqrt{2}}", r"-1-\sqrt2, -1+\sqrt2", "correct"),
  (r"\boxed{x=3 \text{ or } x=4}", "3, 4", "correct"),
  (r"\boxed{\binom{5}{2}}", "10", "correct"),
  (r"\boxed{{5 \choose 2}}", "10", "correct"),
  (r"\boxed{\log_2 8}", "3", "correct"),
  (r"\boxed{0.\overline{3}}", r"\frac13", "correct"),
  (r"\boxed{0.1\overline{6}}", "1/6", "correct"),
  (r"\boxed{\varnothing}", r"\emptyset", "correct"),
  (r"\boxed{\mathbb{R}}", r"(-\infty, \infty)", "correct"),
  (r"\boxed{f(x)=2x}", "2x", "correct"),
  (r"\boxed{\sin^2 x + \cos^2 x}", "1", "correct"),
  (r"\boxed{(-\infty,-2)\cup(2,\infty)}", r"(2,\infty)\cup(-\infty,-2)", "correct"),
  # Near misses.
  (r"\boxed{0.333}", r"\frac{1}{3}", "wrong"),
  (r"\boxed{0.3333333333}", r"\frac{1}{3}", "wrong"),
  (r"\boxed{1.4142}", r"\sqrt{2}", "wrong"),
  (r"\boxed{1.4142136}", r"\sqrt{2}", "correct"),
  (r"\boxed{12}", "1.2", "wrong"),
  (r"\boxed{123}", "1234", "wrong"),
  ("#### 1,234", "1235", "wrong"),
  (r"\boxed{1234567}", "1234568", "wrong"),
  (r"\boxed{-5}", "5", "wrong"),
  (r"\boxed{(3, -2)}", "(3,2)", "wrong"),
  (r"\boxed{(2, 3)}", "(3,2)", "wrong"),
  (r"\boxed{(0, 1)}", "[0,1)", "wrong"),
  (r"\boxed{[0, 2)}", "[0,1)", "wrong"),
  (r"\boxed{(1,2)}", "1,2", "wrong"),
  (r"\boxed{\{1, 2\}}", r"\{1,2,3\}", "wrong"),
  (r"\boxed{x^2-2x+1}", "(x+1)^2", "wrong"),
  (r"\boxed{50}", "0.5", "wrong"),
  (r"\boxed{2\pi}", r"\pi", "wrong"),
  (r"\boxed{\text{Tuesday}}", "Monday", "wrong"),
  (r"\boxed{\frac{1}{0}}", "1", "wrong"),
  (r"\boxed{)(}", "1", "wrong"),
  (r"\boxed{__import__('os')}", "1", "wrong"),
  (r"\boxed{10, 100}", "10100", "wrong"),  # A comma and a space separate a list.
  (r"\boxed{1, 000}", "1000", "wrong"),
  (r"\boxed{2 3}", "23", "wrong"),  # Spaced digits do not merge.
  (r"\boxed{5000\%}", "50", "wrong"),  # Next to an integer, % is only a unit.
  (r"\boxed{100\%}", "1", "wrong"),
  (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix}1\\3\end{pmatrix}", "wrong"),
  (r"\boxed{\begin{pmatrix} 1 \\ 2 \end{pmatrix}}", r"\begin{pmatrix}1 & 2\end{pmatrix}", "wrong"),
  (
    r"\boxed{\begin{pmatrix}1&2\\3&4\end{pmatrix}}",
    r"\begin{pmatrix}1&2\\4&3\end{pmatrix}",
    "wrong",
  ),
  ("#### Step 2: Answer\nThe answer is 7.", "2", "wrong"),
  ("**Final Answer**: 42", "41", "wrong"),
  ("The answer is 6 apples.", "5", "wrong"),
  (r"\boxed{2 x}", "2", "wrong"),  # A one-letter word is a variable, not a unit.
  (r"\boxed{2 \pi}", "2", "wrong"),
  (r"\boxed{\$40\text{/hour}}", "4", "wrong"),
  (r"\boxed{\pm 2}", "2", "wrong"),
  (r"\boxed{2 + \sqrt{3}}", r"2 \pm \sqrt3", "wrong"),
  (r"\boxed{x=3 \text{ or } x=4}", "3, 5", "wrong"),
  (r"\boxed{\binom{5}{2}}", "20", "wrong"),
  (r"\boxed{\log_2 9}", "3", "wrong"),
  (r"\boxed{\log 8}", "3", "wrong"),  # \log is the natural log.
  (r"\boxed{0.333}", r"0.\overline{3}", "wrong"),
  (r"\boxed{\emptyset}", "0", "wrong"),
  (r"\boxed{f(x)=2x}", "2x+1", "wrong"),
  (r"\boxed{\sin^2 x + \cos^2 x}", "2", "wrong"),
  (r"\boxed{(-\infty,-2)\cup(2,\infty)}", r"(-\infty,-2)\cup(3,\infty)", "wrong"),
  # No answer / malformed.
  ("I think it is 5", "5", "no_answer"),
  ("", "5", "no_answer"),
  (r"\boxed{}", "5", "no_answer"),
  (r"\boxed{5", "5", "no_answer"),
  ("#### Step 2: Answer\nSo it is 7.", "7", "no_answer"),  # A heading, and no answer.
  ("<think>hmm</think>", "5", "no_answer"),
]


@pytest.fixture(scope="module")
def pool():
  """A pool whose timeout never bites here (sympy's first simplify in a worker is slow)."""
  with math_verify.verification_pool(workers=2, timeout_s=60.0, backend="builtin") as pool:
    yield pool


@pytest.fixture(scope="module")
def strict_pool():
  with math_verify.verification_pool(workers=2, timeout_s=TIMEOUT_S, backend="builtin") as pool:
    yield pool


def test_the_table_is_large():
  assert len(CASES) >= 60
  assert {verdict for _, _, verdict in CASES} == {"correct", "wrong", "no_answer"}


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_verify_table(completion, gold, expected):
  assert math_verify.verify(completion, gold, backend="builtin") == expected


def test_the_table_through_the_pool_matches_inline_verify(pool):
  completions, golds, expected = zip(*CASES)
  verdicts = math_verify.verify_batch(completions, golds, pool=pool)
  assert verdicts == list(expected)


# ------------------------------------------------------------------------- Extraction


@pytest.mark.parametrize(
  ("text", "answer"),
  [
    (r"\boxed{1} and \fbox{2}", "2"),  # The last box of either kind.
    (r"#### 3 but \boxed{4}", "4"),  # A box beats ####.
    ("The answer is 5.\n#### 6", "6"),  # #### beats an answer line.
    ("#### 7\nrest\n#### 8", "8"),
    ("Answer: 1\nThe answer is 2. I am sure.", "2"),  # The last answer line.
    ("The answer is 3 and the final answer: 9", "9"),  # The last phrase on that line.
    (r"\boxed{\frac{a}{\sqrt{b}}}", r"\frac{a}{\sqrt{b}}"),  # Nested braces.
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # Escaped braces do not nest.
    (r"\boxed{1} then \boxed{2", "1"),  # An unclosed box is skipped.
    (r"$\boxed -3$", "-3"),
    ("Final Answer\n\nno marker", None),
    ("it is 12", None),  # No last-number fallback.
    ("#### 1. Setup\nThe answer is 4.", "4"),  # Headings are not GSM8K answers,
    ("#### Step 2: Answer\n#### $18 eggs", "$18 eggs"),  # numbers are.
    ("**Final Answer**: 7", "7"),
    ("The **answer is** **7**.", "7"),
  ],
)
def test_extract_answer_precedence(text, answer):
  assert math_verify.extract_answer(text) == answer


def test_extract_answer_from_an_answer_tag():
  text = r"<think>\boxed{1}</think><answer>The answer is \boxed{2}</answer>"
  assert math_verify.extract_answer(text, answer_tag="answer") == "2"
  assert math_verify.extract_answer("<answer> 3/4 </answer>", answer_tag="answer") == "3/4"
  assert math_verify.extract_answer(r"\boxed{5}", answer_tag="answer") is None


# ---------------------------------------------------------------------- Normalisation


@pytest.mark.parametrize(
  ("answer", "normal"),
  [
    (r"\dfrac{1}{2}", "((1)/(2))"),
    (r"\frac12", "((1)/(2))"),
    (r"3\frac{1}{2}", "(3+1/2)"),
    (r"x^2\frac{1}{2}", "x^2((1)/(2))"),  # Not a mixed number after '^'.
    (r"\sqrt[3]{x}", "((x)^(1/(3)))"),
    (r"\frac{3}{2}^2", "((3)/(2))^2"),  # One operand, like the LaTeX group.
    (r"\sqrt[3]{x}^2", "((x)^(1/(3)))^2"),
    (r"$\left( 1, 2 \right)$", "(1,2)"),
    (r"\{1,\! 2\}", "{1,2}"),
    ("1,234,567.5", "1234567.5"),
    ("(1,234)", "(1,234)"),  # A tuple, not a thousands separator.
    ("1,23", "1,23"),
    (r"1\,000", "1000"),
    (r"5\text{ cm}^2", "5"),
    ("3 square feet", "3"),
    (r"\text{(B)}", "B"),
    (r"\mathrm{x}_{1} = 4.", "4"),
    (r"2 \times 10^{-3}", "2*10^(-3)"),
    (r"\infty", "oo"),
    ("-.25%", "-0.25"),
    ("2 ** 3", "2^3"),
    ("10, 100", "10,100"),  # A list: a comma and a space.
    ("10,100", "10100"),
    (r"10,\!000", "10000"),
    ("12 345 678", "12345678"),  # Spaced groups of three join,
    ("2 3", "2 3"),  # other spaced digits do not.
    ("2 1/2", "(2+1/2)"),
    (r"\begin{pmatrix} 1 & \frac12 \\ 3 & 4 \\ \end{pmatrix}", "[[1,((1)/(2))],[3,4]]"),
    (r"x = \pm 2", "2,-2"),
    (r"1 \mp \sqrt2, 5", "1+sqrt(2),1-sqrt(2),5"),
    (r"\dbinom{n}{2}", "((n)!/((2)!*((n)-(2))!))"),
    (r"-1.2\overline{34}", "-(611/495)"),
    (r"\log_{10} 100", "log_(10)100"),
    (r"\varnothing", "{}"),
    (r"\mathbb{R}", "(-oo,oo)"),
    ("f(x) = 2x", "2x"),
    ("5 apples", "5"),
    ("1,000 eggs per day", "1000"),
    ("80 km/h", "80"),
    (r"80\text{ km/hr}", "80"),
    ("2 x", "2x"),
    ("3 sin x", "3sinx"),
    (r"x=3 \text{ or } x=4", "x=3,x=4"),
  ],
)
def test_normalize(answer, normal):
  assert math_verify.normalize(answer) == normal


# --------------------------------------------------------------------------- Parsing


@pytest.mark.parametrize(
  ("text", "value"),
  [
    ("-2^2", -4),  # Unary minus binds looser than '^'.
    ("2^3^2", 512),  # '^' is right-associative.
    ("1/2x", sympy.Symbol("x") / 2),  # Implicit multiplication binds like '*'.
    ("2(3+1)", 8),
    ("sqrt2", sympy.sqrt(2)),
    ("sqrt(8)/2", sympy.sqrt(2)),
    ("3!", 6),
    ("0.25", sympy.Rational(1, 4)),  # Decimals are exact.
    ("i^2", -1),
    ("2pi", 2 * sympy.pi),
    ("sin^2x", sympy.sin(sympy.Symbol("x")) ** 2),  # A power of a function is its value's.
    ("cos^(2)(pi)", 1),
    ("log_(2)8", 3),
    ("log_(b)(x)", sympy.log(sympy.Symbol("x"), sympy.Symbol("b"))),
    ("(5)!/((2)!*((5)-(2))!)", 10),
  ],
)
def test_parse(text, value):
  assert math_verify.parse(text) == value


@pytest.mark.parametrize(
  "text",
  [
    "__import__('os')",
    "().__class__",
    "x.y",
    "a_1",
    "[1]",
    "1+",
    "(1",
    "1)",
    "2**",
    "(" * 70 + "1" + ")" * 70,
    "2 3",
    "sin^(-1)x",  # Ambiguous (arcsin or 1/sin): not read at all.
    "log_8",
  ],
)
def test_parse_rejects_anything_outside_the_grammar(text):
  with pytest.raises(math_verify.ParseError):
    math_verify.parse(text)


# ------------------------------------------------------------------------ Equivalence


def test_the_tolerance_applies_only_to_irrationals_and_the_knob_bites():
  assert not math_verify.is_equiv("3.1416", r"\pi")  # rel error 2.3e-6 > 1e-6.
  assert math_verify.is_equiv("3.1416", r"\pi", rel_tol=1e-5)
  assert math_verify.is_equiv("3.14159265", r"\pi")
  # Two rationals are compared exactly, whatever the tolerance.
  assert not math_verify.is_equiv("0.333", r"\frac13", rel_tol=0.1)
  assert math_verify.is_equiv("1e-12", "0", abs_tol=1e-9) is False  # Rational vs rational.
  assert math_verify.is_equiv(r"\sqrt{2} - 1.41421356237", "0", abs_tol=1e-9)


@pytest.mark.parametrize(
  ("pred", "gold", "equal"),
  [
    (r"50\%", "50", True),  # The percent sign is a unit,
    (r"50\%", r"\frac12", True),  # and on one side only, next to a non-integer,
    ("0.5", r"50\%", True),  # also divided by 100;
    (r"150\%", "1.5", True),
    (r"5000\%", "50", False),  # an integer is a percent without its sign,
    (r"100\%", "1", False),
    ("50", r"5000\%", False),
    ("0.5", "50", False),  # and without a percent sign, nothing is divided.
    ("50 percent", "0.5", True),
    (r"5\%", r"5\%", True),
    (r"0.05\%", "5", False),
  ],
)
def test_percent_rule(pred, gold, equal):
  assert math_verify.is_equiv(pred, gold) is equal


# ---------------------------------------------------------------------- Format reward


@pytest.mark.parametrize(
  ("completion", "tags", "answer_tag", "expected"),
  [
    (r"<think>a</think> so \boxed{5}", ("think",), None, 1.0),
    (r"  <think>a</think>\n#### 5", ("think",), None, 1.0),
    ("<think>a</think> The answer is 5", ("think",), None, 1.0),
    ("<think>a</think> so five", ("think",), None, 0.0),  # No extractable answer.
    (r"<think>a</think>", ("think",), None, 0.0),  # Nothing after the block.
    (r"<think>\boxed{5}</think> ok", ("think",), None, 0.0),  # Answer inside the block only.
    (r"x <think>a</think> \boxed{5}", ("think",), None, 0.0),  # Text before the block.
    (r"<think>a</think><think>b</think> \boxed{5}", ("think",), None, 0.0),  # Two blocks.
    (r"</think>a<think> \boxed{5}", ("think",), None, 0.0),  # Out of order.
    (r"<think>a \boxed{5}", ("think",), None, 0.0),  # Unclosed.
    (r"\boxed{5}", (), None, 1.0),
    ("no answer", (), None, 0.0),
    ("<think>a</think>\n<answer>5</answer>\n", ("think",), "answer", 1.0),
    ("<think>a</think><answer> </answer>", ("think",), "answer", 0.0),  # Blank answer.
    ("<think>a</think><answer>5</answer> more", ("think",), "answer", 0.0),  # Text after.
    ("<plan>p</plan><think>a</think> #### 5", ("plan", "think"), None, 1.0),
    ("<think>a</think><plan>p</plan> #### 5", ("plan", "think"), None, 0.0),  # Wrong order.
  ],
)
def test_format_reward(completion, tags, answer_tag, expected):
  assert math_verify.format_reward(completion, tags=tags, answer_tag=answer_tag) == expected


def test_math_reward_scores_through_a_reward_pool():
  task = pickle.loads(pickle.dumps(math_verify.MathReward()))  # Workers get a pickled copy.
  golds = ["5", r"\frac{1}{2}", "3", "7"]
  completions = [
    r"<think>2+3</think> \boxed{5}",  # Right, well formatted.
    r"\boxed{0.5}",  # Right, no think block.
    r"<think>x</think> \boxed{4}",  # Wrong, well formatted.
    "<think>x</think> seven",  # No answer.
  ]
  with reward_pool.RewardPool(task, workers=0) as pool:
    scores = pool.score(golds, completions)
  np.testing.assert_array_equal(scores.correct_N, [1.0, 1.0, 0.0, 0.0])
  np.testing.assert_array_equal(scores.format_N, [1.0, 0.0, 1.0, 0.0])
  assert scores.errors == 0


# --------------------------------------------------------------- Batches and timeouts


def _batch_with_hangs(hang_at, n=20):
  """Quick items (correct, wrong, no_answer in turn) with PATHOLOGICAL at hang_at."""
  completions = [rf"\boxed{{{i}}}" if i % 3 < 2 else f"{i}" for i in range(n)]
  golds = [str(i + i % 3) for i in range(n)]
  expected = [("correct", "wrong", "no_answer")[i % 3] for i in range(n)]
  for i in hang_at:
    completions[i], golds[i], expected[i] = PATHOLOGICAL, "1", "unscorable"
  return completions, golds, expected


def test_a_pathological_expression_is_unscorable_and_does_not_block_the_batch(strict_pool):
  completions, golds, expected = _batch_with_hangs([3, 15])  # One in each worker's chunk.
  start = time.monotonic()
  scores = strict_pool.score(golds, completions)  # What verify_batch(..., pool=...) does.
  assert time.monotonic() - start < TIMEOUT_S + SLACK_S
  assert scores.timeouts == 2 and list(np.flatnonzero(scores.timeout_N)) == [3, 15]
  verdicts = math_verify.verdicts_from_scores(scores)
  assert verdicts == expected
  assert math_verify.count_verdicts(verdicts) == {
    "correct": 5,
    "wrong": 7,
    "no_answer": 6,
    "unscorable": 2,
  }
  # The pool replaced the killed workers and scores the next batch normally.
  assert math_verify.verify_batch([r"\boxed{2}"], ["2"], pool=strict_pool) == ["correct"]


def test_a_huge_expression_is_a_parse_error_so_wrong_not_slow():
  huge = "+".join(["x"] * (math_verify.MAX_TOKENS // 2 + 1))
  with pytest.raises(math_verify.ParseError, match="tokens"):
    math_verify.parse(huge)
  assert math_verify.verify(rf"\boxed{{{huge}}}", "1", backend="builtin") == "wrong"


def test_verify_batch_works_off_the_main_thread():
  completions, golds, expected = _batch_with_hangs([7])
  result = {}

  def run():
    start = time.monotonic()
    result["verdicts"] = math_verify.verify_batch(
      completions, golds, workers=2, timeout_s=TIMEOUT_S, backend="builtin"
    )
    result["wall_s"] = time.monotonic() - start

  thread = threading.Thread(target=run)
  thread.start()
  thread.join(timeout=60.0)
  assert not thread.is_alive()
  assert result["verdicts"] == expected
  assert result["wall_s"] < TIMEOUT_S + 2 * SLACK_S  # Includes starting the pool.


def test_verify_batch_checks_its_arguments(pool):
  with pytest.raises(ValueError, match="2 completions but 1 gold"):
    math_verify.verify_batch(["a", "b"], ["1"], pool=pool)
  other = reward_pool.RewardPool(math_verify.MathReward(), workers=0)
  with pytest.raises(TypeError, match="verification_pool"):
    math_verify.verify_batch(["a"], ["1"], pool=other)
  assert math_verify.verify_batch([], [], pool=pool) == []


def test_verdicts_from_scores():
  scores = verdicts.Scores(
    correct_N=np.array([1.0, 0.0, 0.0, 0.0], np.float32),
    format_N=np.array([1.0, 1.0, 0.0, 0.0], np.float32),
    error_N=np.array([False, False, False, True]),
    timeout_N=np.array([False, False, False, True]),
  )
  assert math_verify.verdicts_from_scores(scores) == ["correct", "wrong", "no_answer", "unscorable"]


def test_count_verdicts():
  counts = math_verify.count_verdicts(["wrong", "correct", "wrong", "unscorable"])
  assert counts == {"correct": 1, "wrong": 2, "no_answer": 0, "unscorable": 1}
  assert math_verify.count_verdicts([]) == dict.fromkeys(math_verify.VERDICTS, 0)
  with pytest.raises(ValueError, match="Unknown verdict 'right'"):
    math_verify.count_verdicts(["right"])


# ------------------------------------------------------------------------- Properties


@SETTINGS
@hypothesis.given(
  n=st.integers(-(10**12), 10**12),
  template=st.sampled_from(
    [r"\boxed{{{:,}}}", "#### {:,}", "The answer is {:,}.", r"$\boxed{{{}}}$", "Answer: {}"]
  ),
)
def test_integers_in_any_format_verify_and_off_by_one_is_wrong(n, template):
  completion = template.format(n)
  assert math_verify.verify(completion, str(n), backend="builtin") == "correct"
  assert math_verify.verify(completion, str(n + 1), backend="builtin") == "wrong"


@SETTINGS
@hypothesis.given(p=st.integers(-999, 999), q=st.integers(1, 999), k=st.integers(2, 99))
def test_scaled_fractions_are_equal_and_shifted_ones_are_not(p, q, k):
  assert math_verify.is_equiv(rf"\frac{{{k * p}}}{{{k * q}}}", rf"\dfrac{{{p}}}{{{q}}}")
  assert not math_verify.is_equiv(rf"\frac{{{p + 1}}}{{{q}}}", f"{p}/{q}")


@pytest.mark.parametrize(
  "text, answer",
  [
    (r"so $\boxed{12}$.", "12"),
    (r"$\boxed{\dfrac{2}{3}}$", r"\dfrac{2}{3}"),
    (
      r"first \boxed{1}, finally \boxed{\left(\frac{1}{2}, 3\right)}.",
      r"\left(\frac{1}{2}, 3\right)",
    ),
    (r"$\boxed{\{1, 2\}}$", r"\{1, 2\}"),  # Escaped braces do not close the box.
    (r"\boxed{\text{a}\}}", r"\text{a}\}"),
    (r"the answer is $\boxed 5$.", "5"),
    (r"$\fbox{7}$", "7"),
    (r"\boxed{\frac{1}{2}", None),  # Unbalanced.
    (r"\boxedx{3} is not a box", None),
    ("no box at all", None),
  ],
)
def test_last_boxed(text, answer):
  """The box extraction the verifier and the MATH dataset builder share."""
  assert math_verify.last_boxed(text) == answer


# ------------------------------------------------ Precedence of \frac, \sqrt[n], \binom


@pytest.mark.parametrize(
  ("completion", "gold", "expected"),
  [
    # The expansion is one operand: an exponent after it applies to all of it.
    (r"\boxed{\sqrt[3]{x}^2}", "x^(1/9)", "wrong"),  # Was accepted: x^(1/3)^2 = x^(1/9).
    (r"\boxed{\sqrt[3]{x}^2}", "x^(2/3)", "correct"),
    (r"\boxed{\frac{3}{2}^2}", "3/4", "wrong"),  # Was accepted: 3/(2^2).
    (r"\boxed{\frac{3}{2}^2}", r"\frac{9}{4}", "correct"),
    (r"\boxed{\sqrt[3]{8}^2}", "4", "correct"),
    (r"\boxed{\binom{4}{2}^2}", "36", "correct"),
    (r"\boxed{\binom{4}{2}^2}", "3/2", "wrong"),  # Was accepted: 4!/(2!*2!)^2.
  ],
)
def test_frac_root_and_binom_expand_as_one_operand(completion, gold, expected):
  assert math_verify.verify(completion, gold, backend="builtin") == expected


# ------------------------------------------------------------- The math_verify backend


# Hand-picked cases of the default backend: answers the builtin one rejects, and near
# misses it must still reject.
HF_CASES = [
  (r"so $(p,q)=(3,2)$", "(3,2)", "correct"),  # A labelled answer, no box.
  ("The answer is 42", "42", "correct"),
  ("I think it is 5", "5", "correct"),  # Any final number: more lenient than builtin.
  (r"$5 \geq x$", r"x \leq 5", "correct"),  # A flipped inequality.
  (r"The roots are \boxed{1} and \boxed{2}.", "1, 2", "correct"),  # Several boxes.
  ("1,5", "1.5", "correct"),  # A decimal comma.
  ("7,425,000", "7425000", "correct"),  # Thousands separators.
  (r"\boxed{0.333333}", r"\frac{1}{3}", "correct"),  # Floats compared to 6 decimals,
  (r"\boxed{0.333}", r"\frac{1}{3}", "wrong"),  # not to 3.
  (r"\boxed{\text{Evelyn}}", r"\text{Evelyn}", "correct"),  # Needs the boxed gold.
  (r"\boxed{\{3, 2\}}", r"\{2, 3\}", "correct"),
  (r"\boxed{(2, 3)}", "(3, 2)", "wrong"),  # Tuples are ordered.
  (r"$5 \leq x$", r"x \leq 5", "wrong"),
  (r"\boxed{x^2-2x+1}", "(x+1)^2", "wrong"),
  (r"\boxed{\frac{3}{2}^2}", "3/4", "wrong"),
  (r"\boxed{\sqrt[3]{x}^2}", "x^{1/9}", "wrong"),
  ("no number here", "5", "no_answer"),
  ("", "5", "no_answer"),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), HF_CASES)
def test_math_verify_backend(completion, gold, expected):
  assert math_verify.DEFAULT_BACKEND == "math_verify"
  assert math_verify.verify(completion, gold) == expected


def test_math_verify_backend_reads_only_the_answer_tag():
  text = r"<think>\boxed{1}</think><answer>2</answer>"
  assert math_verify.verify(text, "2", answer_tag="answer") == "correct"
  assert math_verify.verify(text, "1", answer_tag="answer") == "wrong"
  assert math_verify.verify(r"\boxed{2}", "2", answer_tag="answer") == "no_answer"


def test_gold_is_boxed_unless_it_holds_a_math_environment():
  assert math_verify.hf_gold_text(r"\text{Evelyn}") == r"\boxed{\text{Evelyn}}"
  assert math_verify.hf_gold_text(r"x \leq 5") == r"\boxed{x \leq 5}"
  assert math_verify.hf_gold_text(r"\$10") == r"\boxed{\$10}"  # An escaped $ is text.
  for gold in ("$5$", r"\boxed{5}", r"\(5\)", r"\[5\]", "$125$ miles"):
    assert math_verify.hf_gold_text(gold) == gold
  # Unboxed, x \leq 5 would parse to the number 5 and accept "5"; boxed, it is a relation.
  assert math_verify.verify(r"\boxed{5}", r"x \leq 5") == "wrong"
  assert math_verify.verify(r"\boxed{\$10}", r"\$10") == "correct"


def test_an_undecidable_item_is_unscorable_and_raises_in_the_reward():
  # "12:00" parses to 12/0 (zoo); math_verify refuses to compare it: nothing decided.
  assert math_verify.verify(r"\boxed{5}", "12:00") == "unscorable"
  task = math_verify.MathReward()
  with pytest.raises(verdicts.Unscorable, match="cannot decide gold '12:00'"):
    task.reward("12:00", r"\boxed{5}")
  assert task.reward("5", r"\boxed{5}") == 1.0
  assert task.reward("5", r"\boxed{6}") == 0.0  # Wrong is 0.0, not an error.
  with reward_pool.RewardPool(task, workers=0) as pool:
    scores = pool.score(["12:00", "5", "5"], [r"\boxed{5}", r"\boxed{5}", "no answer"])
  np.testing.assert_array_equal(scores.error_N, [True, False, False])
  np.testing.assert_array_equal(scores.correct_N, [0.0, 1.0, 0.0])
  assert math_verify.verdicts_from_scores(scores)[0] == "unscorable"


def test_an_exception_inside_the_backend_is_unscorable(monkeypatch):
  def broken(text):
    raise RuntimeError("backend bug")

  monkeypatch.setattr(math_verify, "_hf_parse", broken)
  assert math_verify.verify(r"\boxed{5}", "5") == "unscorable"
  assert not math_verify.has_answer(r"\boxed{5}", backend="math_verify")
  with pytest.raises(verdicts.Unscorable):
    math_verify.MathReward().reward("5", r"\boxed{5}")
  assert math_verify.MathReward(backend="builtin").reward("5", r"\boxed{5}") == 1.0


def test_backend_is_checked_when_the_reward_is_built(monkeypatch):
  with pytest.raises(ValueError, match=r"Unknown math verifier backend 'sympy'"):
    math_verify.MathReward(backend="sympy")
  with pytest.raises(ValueError, match="Unknown math verifier backend"):
    math_verify.verify(r"\boxed{5}", "5", backend="sympy")
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(
    importlib.util,
    "find_spec",
    lambda name, *a: None if name == "math_verify" else real_find_spec(name, *a),
  )
  with pytest.raises(ImportError, match="pip install 'math-verify"):
    math_verify.MathReward()
  assert math_verify.MathReward(backend="builtin").backend == "builtin"


def test_math_verify_backend_works_off_the_main_thread():
  """Its SIGALRM timeouts are off: signal.signal would raise ValueError in a thread."""
  result = {}
  thread = threading.Thread(
    target=lambda: result.update(v=math_verify.verify(r"\boxed{\frac{1}{2}}", "0.5"))
  )
  thread.start()
  thread.join(timeout=60.0)
  assert result == {"v": "correct"}


def test_math_verify_backend_hangs_are_cut_by_the_pool():
  """math_verify hangs on PATHOLOGICAL too; the pool's hard timeout is the only one.

  The timeout is 3 s here: an item's first math_verify call in a worker (its parsers built)
  took over 1 s on a loaded 2-core host, and a correct item then read "unscorable"."""
  golds = ["1", "2", "3", "4"]
  completions = [PATHOLOGICAL, r"\boxed{2}", "The answer is 3.", r"\boxed{5}"]
  timeout_s = 3.0
  with math_verify.verification_pool(workers=2, timeout_s=timeout_s) as pool:
    assert isinstance(pool.task, math_verify.MathReward) and pool.task.backend == "math_verify"
    # Workers import math_verify and parse once before the clock (an item each, or more).
    pool.score(["1", "2", "3", "4"], [r"\boxed{1}", r"\boxed{2}", "3", r"\boxed{4}"])
    start = time.monotonic()
    verdicts = math_verify.verify_batch(completions, golds, pool=pool)
    assert time.monotonic() - start < timeout_s + SLACK_S
  assert verdicts == ["unscorable", "correct", "correct", "wrong"]


def test_sympy_is_imported_at_the_first_parse_not_with_the_tasks():
  """math_parse and math_equiv import sympy when they first parse (math_parse: Import):
  every process that imports the trainer imports them through the task registry, and
  sympy took about 0.4 s of each one's start."""
  script = (
    "import sys\n"
    "import grpo_jax.tasks\n"
    "from grpo_jax.verifiers import math_verify\n"
    "assert 'sympy' not in sys.modules\n"
    "assert math_verify.is_equiv('x+x', '2x')\n"
    "assert 'sympy' in sys.modules\n"
  )
  subprocess.run([sys.executable, "-c", script], check=True, env=subproc.child_env())
