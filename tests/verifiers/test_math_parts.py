"""The four parts of the builtin math verifier, each through its own module: extraction
(`math_extract`), normalisation (`math_normalize`), the safe parser (`math_parse`) and
equivalence (`math_equiv`). tests/verifiers/test_math_verify.py checks the verifier end to end
through `math_verify`'s re-exports; these pin the helpers it does not re-export (brace
groups, tag bodies, top-level splits, variable stripping) and the rules at their edges
(the parser's limits, equations, multisets, infinities)."""

import hypothesis
import hypothesis.strategies as st
import pytest
import sympy

from grpo_jax.verifiers import math_equiv, math_extract, math_normalize, math_parse

X = sympy.Symbol("x")

# ------------------------------------------------------------------------- math_extract


@pytest.mark.parametrize(
  ("text", "i", "group"),
  [
    ("a{b{c}d}e", 1, ("b{c}d", 8)),  # Nested braces: the group closes at index 7.
    (r"{a\}b}", 0, (r"a\}b", 6)),  # An escaped brace does not close it.
    (r"{\{}", 0, (r"\{", 4)),  # Nor does an escaped one open another.
    ("{}", 0, ("", 2)),
    ("{a{b}", 0, None),  # Never closed.
    ("{\\", 0, None),  # A trailing backslash skips past the end.
  ],
)
def test_brace_group(text, i, group):
  """(content, index after the closing brace) of the group opening at text[i]."""
  assert math_extract.brace_group(text, i) == group


def test_tag_body_is_the_last_block_and_the_tag_is_literal():
  """The last <tag> block's body, newlines included; the tag name is escaped, so "a.b"
  does not match <axb>."""
  assert math_extract.tag_body("<a>1</a> and <a>2</a>", "a") == "2"
  assert math_extract.tag_body("<a>x\ny</a>", "a") == "x\ny"
  assert math_extract.tag_body("<a.b>1</a.b><axb>2</axb>", "a.b") == "1"
  assert math_extract.tag_body("<a>open only", "a") is None


@pytest.mark.parametrize(
  ("text", "boxed"),
  [
    (r"\boxed {5}", "5"),  # Spaces before the brace.
    (r"\boxed{}", ""),  # An empty box is found (extract_answer then skips it).
    (r"\fbox{1} \boxed 2$", "2"),  # A bare argument stops at '$'.
    (r"\boxed{1}\boxed{2", "1"),
  ],
)
def test_last_boxed_edges(text, boxed):
  """The last box's content: spaces before its brace, an empty box, a bare argument cut at '$', an
  unclosed last box skipped."""
  assert math_extract.last_boxed(text) == boxed


@pytest.mark.parametrize(
  ("text", "answer"),
  [
    (r"\boxed{} The answer is 3.", "3"),  # An empty box falls through to the next rule.
    (r"#### $\frac{1}{2}$", r"$\frac{1}{2}$"),  # A GSM8K answer may start with $\frac.
    ("#### .5", ".5"),
    ("#### -5", "-5"),
    ("#### x = 5", None),  # Not number-like: skipped, and nothing else is marked.
    ("#### 12 apples. Then", None),  # ". " marks a heading, not an answer.
    ("The answer is\n\n  42\n", "42"),  # An empty X takes the next non-empty line.
    ("final answer: 7. Check: 8", "7"),  # X runs to the first ". ".
  ],
)
def test_extract_answer_rules(text, answer):
  """Each extraction rule at its edge (the expected answers are read off the texts)."""
  assert math_extract.extract_answer(text) == answer


def test_an_empty_answer_tag_is_no_answer():
  """With answer_tag, a blank body is None (neither a rule nor the stripped body)."""
  assert math_extract.extract_answer("<answer>  </answer>", answer_tag="answer") is None
  assert math_extract.extract_answer("<answer> x+1 </answer>", answer_tag="answer") == "x+1"


# ----------------------------------------------------------------------- math_normalize


@pytest.mark.parametrize(
  ("s", "sep", "parts"),
  [
    ("(1,2),[3,4],{5,6}", ",", ["(1,2)", "[3,4]", "{5,6}"]),
    (r"(a\cupb)\cupc", r"\cup", [r"(a\cupb)", "c"]),  # A separator of several characters.
    ("1,", ",", ["1", ""]),
    ("", ",", [""]),
    ("((1,2)", ",", ["((1,2)"]),  # Unbalanced: nothing is at depth 0.
  ],
)
def test_split_top(s, sep, parts):
  """Parts at the separator outside every bracket, the separator dropped."""
  assert math_normalize.split_top(s, sep) == parts


@hypothesis.given(st.text(alphabet="12,()[]{}", max_size=20))
@hypothesis.settings(max_examples=200)
def test_split_top_cuts_only_at_separators(s):
  """Joining the parts with the separator gives s back; without brackets the split is
  str.split's."""
  parts = math_normalize.split_top(s, ",")
  assert ",".join(parts) == s
  if not any(c in s for c in "()[]{}"):
    assert parts == s.split(",")


@pytest.mark.parametrize(
  ("s", "stripped"),
  [
    ("x=5", "5"),
    ("x_1=5", "5"),
    ("x_(12)=3", "3"),
    ("f(x,y)=x+y", "x+y"),
    ("xy=5", "xy=5"),  # Two letters are not one variable.
    ("2x=4", "2x=4"),
    ("x=5=y", "x=5=y"),  # More than one '='.
    ("x==5", "x==5"),
  ],
)
def test_strip_variable(s, stripped):
  """A one-letter (subscripted) variable or function on the left of a single '=' goes."""
  assert math_normalize.strip_variable(s) == stripped


@pytest.mark.parametrize(
  ("answer", "normal"),
  [
    (r"\frac{\sqrt{3}}{2}", "((sqrt(3))/(2))"),
    (r"\sqrt[3]{\frac{1}{8}}", "((((1)/(8)))^(1/(3)))"),  # Nested expansions.
    (r"0.\overline{142857}", "(1/7)"),  # 142857/999999 = 1/7.
    (r"1.\overline{9}", "2"),  # 1 + 9/9: a whole number, no parentheses.
    (r"45^\circ", "45"),
    (r"\$5.00", "5.00"),
    (r"x \le 3", "x<=3"),
    (r"\left\{ 1, 2 \right\}", "{1,2}"),  # Set braces survive as braces.
    (r"3 \div 4", "3/4"),
    (r"\tfrac34", "((3)/(4))"),
    (r"1 \cdot 10^{6}", "1*10^(6)"),
  ],
)
def test_normalize_more_forms(answer, normal):
  """LaTeX forms test_math_verify's table leaves out, normalised by hand."""
  assert math_normalize.normalize(answer) == normal


# --------------------------------------------------------------------------- math_parse


def test_the_token_limit_is_inclusive():
  """'+1' * 200 is exactly MAX_TOKENS = 400 tokens (value 200); one more token fails."""
  assert math_parse.MAX_TOKENS == 400
  assert math_parse.parse("+1" * 200) == 200
  with pytest.raises(math_parse.ParseError, match="more than 400 tokens"):
    math_parse.parse("1" + "+1" * 200)


def test_the_depth_limit_counts_parentheses_and_unary_signs():
  """The top expression is depth 1 and each '(' or unary sign adds 1: 59 of them reach
  MAX_DEPTH = 60, 60 of them pass it. 59 minus signs negate 1 an odd number of times."""
  assert math_parse.MAX_DEPTH == 60
  assert math_parse.parse("(" * 59 + "1" + ")" * 59) == 1
  assert math_parse.parse("-" * 59 + "1") == -1
  for deep in ("(" * 60 + "1" + ")" * 60, "-" * 60 + "1"):
    with pytest.raises(math_parse.ParseError, match="nested deeper than 60"):
      math_parse.parse(deep)


@pytest.mark.parametrize(
  ("text", "value"),
  [
    ("1e-3", sympy.Rational(1, 1000)),  # Exponent notation is exact too.
    ("1.5e2", 150),
    ("0.1+0.2", sympy.Rational(3, 10)),  # Exactly, unlike floats.
    ("3!!", 720),  # (3!)! = 6!.
    ("2^3!", 64),  # '!' binds tighter than '^': 2^(3!).
    ("2^-1", sympy.Rational(1, 2)),
    ("-2^-2", sympy.Rational(-1, 4)),  # -(2^(-2)).
    ("1/2/2", sympy.Rational(1, 4)),  # Left-associative division.
    ("2^2^0", 2),  # Right-associative power: 2^(2^0).
    ("2x^2", 2 * X**2),
    ("(1)(2)(3)", 6),
    ("sin2x", sympy.sin(2) * X),  # A function takes one atom without parentheses.
    ("sqrt4x", 2 * X),
    ("e^(ipi)", -1),  # e and i are constants; ipi is i*pi.
    ("ln(e^2)", 2),
    ("10!/9!", 10),
    ("5.", 5),
  ],
)
def test_parse_values(text, value):
  """Precedence, associativity and exact values, worked out by hand in each comment."""
  assert math_parse.parse(text) == value


@pytest.mark.parametrize(
  ("text", "match"),
  [
    ("1 2", "unexpected character ' '"),
    ("sin^0x", "only a positive integer power"),
    ("()", r"unexpected '\)'"),
    ("", "expected a token, got None"),
    ("1)", r"unexpected '\)' after a complete expression"),
  ],
)
def test_parse_errors_say_what_is_wrong(text, match):
  """ParseError (a ValueError) names the offending token."""
  with pytest.raises(math_parse.ParseError, match=match):
    math_parse.parse(text)
  assert issubclass(math_parse.ParseError, ValueError)


@hypothesis.given(st.integers(-(10**6), 10**6), st.integers(1, 10**6))
@hypothesis.settings(max_examples=100)
def test_a_fraction_parses_to_its_exact_rational(p, q):
  """(p)/(q) is exactly p/q, never a float."""
  assert math_parse.parse(f"({p})/({q})") == sympy.Rational(p, q)


# --------------------------------------------------------------------------- math_equiv


def test_the_tolerances():
  """The default tolerances, and abs_tol deciding an irrational against a decimal."""
  assert (math_equiv.REL_TOL, math_equiv.ABS_TOL) == (1e-6, 1e-9)
  # |sqrt(2) - 1.41421356| = 2.4e-9: inside abs_tol 1e-8, outside 1e-12 (rel_tol 0).
  assert math_equiv.is_equiv(r"\sqrt{2}", "1.41421356", rel_tol=0.0, abs_tol=1e-8)
  assert not math_equiv.is_equiv(r"\sqrt{2}", "1.41421356", rel_tol=0.0, abs_tol=1e-12)


@pytest.mark.parametrize(
  ("a", "b", "equal"),
  [
    ("monday", "Monday", True),  # Words compare case-insensitively,
    ("x", "X", False),  # one letter is a variable, case-sensitive.
    ("x+y=1", "2=2x+2y", True),  # (x+y-1)/(2-2x-2y) = -1/2, a nonzero constant.
    ("x+y=1", "x+y=2", False),  # The ratio depends on x and y.
    ("x+y=1", "x+y", False),  # An equation is not an expression.
    ("y=2x+1", "2y=4x+2", True),  # (y-2x-1)/(2y-4x-2) = 1/2, before y= is dropped,
    ("x=2", "2x=4", True),  # (x-2)/(2x-4) = 1/2;
    ("x=5", "y=5", True),  # and a one-letter left side still goes: 5 and 5.
    ("y=2x+1", "2x+1", True),
    ("y=2x+1", "2y=4x+3", False),
    ("[1,2]", "(1,2)", False),  # Brackets must match,
    ("[1,2]", "[1, 2]", True),
    (r"(1/2, \sqrt{4})", "(0.5, 2)", True),  # elements compare as values, in order.
    (r"\{1,1,2\}", r"\{1,2,2\}", False),  # Each element is matched once.
    (r"\{2,1\}", "1,2", True),  # A set and a bare list are both unordered.
    ("1,2", "(1,2)", False),
    (r"(0,1)\cup(2,3)", r"(2,3)\cup(0,1)", True),
    ("oo", r"\infty", True),
    ("1/0", "oo", False),  # 1/0 is complex infinity, not +oo.
    ("i^2", "-1", True),
    (r"\frac{x^2-1}{x-1}", "x+1", True),  # Simplified symbolically.
    ("x^2", "x*x", True),
    ("2", "2.0", True),
    ("1e3", "1000", True),
  ],
)
def test_is_equiv_and_it_is_symmetric(a, b, equal):
  """Each pair in both orders: the rules treat prediction and gold alike."""
  assert math_equiv.is_equiv(a, b) is equal
  assert math_equiv.is_equiv(b, a) is equal


@hypothesis.given(st.integers(1, 999), st.integers(1, 999))
@hypothesis.settings(max_examples=50)
def test_an_ordered_pair_needs_its_order(p, q):
  """(p, q) equals itself written with a space and equals (q, p) only when p == q."""
  assert math_equiv.is_equiv(f"({p},{q})", f"({p}, {q})")
  assert math_equiv.is_equiv(f"({p},{q})", f"({q},{p})") is (p == q)
