"""Math answer verification: extract a final answer, compare it with the gold answer.

    verdict = math_verify.verify(completion, gold)       # "correct" | "wrong" | "no_answer" | ...
    verdicts = math_verify.verify_batch(completions, golds, workers=2, timeout_s=5.0)
    math_verify.count_verdicts(verdicts)                 # {"correct": 3, "wrong": 1, ...}
    math_verify.verify(completion, gold, backend="builtin")   # the hand-written verifier

Verdicts. "correct": an answer was extracted and is equivalent to the gold. "wrong": one
was extracted and was not shown equivalent. "no_answer": nothing could be extracted.
"unscorable": the verifier could not decide: it raised, the gold answer does not parse
(``math_verify`` backend), or (``verify_batch``) it timed out or died. It is counted apart
from "wrong", so a broken or hanging verifier never reads as a bad policy; in training,
``MathReward.reward`` raises ``verdicts.Unscorable`` for it and the item is a reward error.

Backends (``backend=``, on ``verify``, ``verify_batch``, ``verification_pool`` and
``MathReward``):

* ``"math_verify"`` (default): Hugging Face's Math-Verify (PyPI ``math-verify``, imported
  as the top-level package ``math_verify``; this module is ``grpo_jax.verifiers.math_verify``). The
  completion is read by ``math_verify.parse`` with its default targets (LaTeX, boxed
  answers and plain numbers/expressions, with or without an "answer" anchor), the gold by
  the same parser from ``\\boxed{gold}`` (``hf_gold_text``: a gold that already holds
  ``$``, ``\\boxed``, ``\\(`` or ``\\[`` is parsed as is), and each (gold, prediction)
  pair is compared by ``math_verify.verify`` with its defaults (float_rounding=6,
  numeric_precision=15, strict=True). Its own timeouts (SIGALRM, which fail off the main
  thread and would fight the pool's) are off (``parsing_timeout=None``,
  ``timeout_seconds=None``), so the reward pool's hard kill is the only timeout; its errors
  are raised (``raise_on_error=True``) and become "unscorable", as does a gold it cannot
  parse. The prediction parses to nothing: "no_answer".
* ``"builtin"``: the hand-written verifier below (extraction, normalisation, exact
  rational / tolerance / sympy equivalence through its own safe parser). Measured on 348
  labelled pairs (``experiments/results/verifier/verifier.md``) it made no false accept
  (math_verify: 3 of 69) and is two orders of magnitude faster per item, and it is exact
  on rationals (0.333333 != 1/3); but it reads only boxed, ``####`` and "answer is"
  answers and no equations, inequalities or decimal commas, so it rejects most correct
  answers written any other way (agreement 51% against 92%; 92% against 98% on completions
  with a box). Use it where answers are boxed by construction and speed or zero false
  accepts matter more than recall. (Math-Verify hands sympy's ``parse_expr`` only strings
  of digits and operators; LaTeX goes through its ANTLR grammar.)

Deliberate differences from what TRL / verl users get with Math-Verify:

* TRL's ``accuracy_reward`` parses the gold as is (a bare LaTeX gold such as
  ``\\text{Evelyn}`` or ``(3,2)`` parses to nothing and the example is skipped) and the
  completion with LaTeX targets only (boxed tried first, nothing extracted without a box
  or an "answer" anchor, first match only), and keeps math_verify's SIGALRM timeouts on
  the main thread. Here the gold is boxed first (as verl does) and the completion is read
  with the library defaults, so "The answer is 42", "I think it is 5" or a final
  ``$x = 3$`` earns the reward without ``\\boxed{}``: more lenient than TRL.
* verl's ``math_verify.compute_score`` reads predictions with the same targets and boxes
  every gold (LaTeX target only), but runs through ``math_metric`` (SIGALRM timeouts) and
  scores an exception or a timeout 0.0, a wrong answer; here both are reward errors
  (excluded from the update, counted in ``reward_errors``).
* Numbers: Math-Verify compares floats rounded to 6 decimals, so 0.333333 == 1/3 and
  1.4142136 == sqrt(2) but 1.4142 != sqrt(2); the builtin backend instead needs two
  rationals to be exactly equal and irrationals within rel_tol=1e-6 (``rel_tol`` and
  ``abs_tol`` apply to the builtin backend only). Lists without brackets (``2, 3``) and
  sets are unordered in both backends (verl's hendrycks-style ``math`` reward compares
  strings, so order matters there); tuples and intervals are ordered. A percent sign:
  28% == 28 and 28% == 0.28 in both; 5000% == 50 in math_verify only.
* ``format_reward`` (the template check) uses the builtin extraction in both backends:
  "an answer is there" means a boxed / ``####`` / "answer is" answer, not any number.

The builtin backend, in detail.

Extraction (``extract_answer``), first rule that yields a non-empty answer wins:
  1. The last complete ``\\boxed{...}`` or ``\\fbox{...}`` (nested braces balanced), or
     ``\\boxed X`` without braces (X runs to the next space or ``$``).
  2. The last GSM8K ``#### X`` (X runs to the end of its line) where X looks like a
     number: it starts (after ``**``, ``$``, a sign) with a digit, ``.5``, ``\\frac``,
     ``\\sqrt`` or ``\\pi`` and has no ". " or ": ", so markdown headings such as
     "#### Step 2: Answer" or "#### 1. Setup" are skipped.
  3. The last line with "the (final) answer is X", "final answer: X" or "answer: X"
     (case-insensitive; the last such phrase on that line; markdown ``**``/``*``/``__``
     may wrap the phrase: "**Answer**: 42"). X runs to the first ". " (so "5. I hope it
     is correct." gives 5), markdown ``**`` and a final period around it are dropped;
     an empty X (answer on the next line) takes the next non-empty line.
  There is no "last number in the text" fallback: an unmarked answer is "no_answer".
  With ``answer_tag="answer"`` the text searched is the body of the last
  ``<answer>...</answer>`` block, and the whole body is the answer if no rule matches.

Normalisation (``normalize``) maps LaTeX and plain text to one calculator-style string:
``$``, ``\\[ \\]``, ``\\( \\)``, ``\\left``/``\\right``/``\\big``, ``\\!`` and
``\\displaystyle`` go; ``\\, \\; \\: \\ ~ \\quad`` are spaces (``\\\\`` stays a row break);
``\\text{}``, ``\\textbf{}``, ``\\mathrm{}``, ``\\mbox{}``, ``\\boxed{}`` ... are unwrapped,
except that units go: a trailing ``\\text{...}`` of letters, spaces, dots and slashes after
an answer with a digit (``5\\text{ cm}^2``, ``80\\text{ km/h}``, ``\\$40\\text{/hour}``),
trailing unit words from a fixed list (``3 square feet``), and the words (letters, a
slash inside) after an answer that is just a number or fraction (``5``, ``1,000``,
``3/4``, ``1 1/2``) when the first word has three or more characters and is not a
connective, function, scale or comparison word (``and or not sqrt sin ... hundred
thousand million ... squared cubed less more than times plus minus over``): ``5 apples``,
``18 eggs per day``, ``80 km/h`` -> the number, but ``2 x``, ``2 pi``, ``5 or 6``,
``5 thousand``, ``3 less than x`` keep their words; ``\\$``, degrees (``^\\circ``,
``degrees``) and ``%`` go.
``\\frac{a}{b}`` (``\\dfrac``, ``\\tfrac``, ``\\frac12``) -> ``((a)/(b))``, a mixed number
``2\\frac{1}{2}`` or ``2 1/2`` -> ``(2+1/2)``; ``\\binom{n}{k}`` (``\\dbinom``,
``{n \\choose k}``) -> ``((n)!/((k)!*((n)-(k))!))``; a repeating decimal
``0.1\\overline{6}`` (or ``\\bar``) -> its exact fraction ``(1/6)``; ``\\sqrt{x}``,
``\\sqrt2`` -> ``sqrt(x)``, ``\\sqrt[n]{x}`` -> ``((x)^(1/(n)))``; ``\\log_b x`` ->
``log_(b)x``; ``\\cdot``, ``\\times`` -> ``*``; ``\\div`` -> ``/``; ``**`` -> ``^``; ``\\pi``
-> ``pi``; ``\\infty`` -> ``oo``; ``\\emptyset``/``\\varnothing`` -> ``{}``;
``\\mathbb{R}`` -> ``(-oo,oo)``; " and ", " or " (``\\text{ or }``) -> ","; matrices
``\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}`` (``bmatrix``, ``Bmatrix``,
``matrix``, ``smallmatrix``) -> ``[[a,b],[c,d]]``; remaining grouping braces ->
parentheses. Whitespace goes, except between two digits: digit groups of three join
(``1\\,000``, ``12 345 678`` -> ``12345678``), any other spaced digits keep one space
(``2 3`` stays "2 3", which does not parse: it is not 23). Then a leading ``+`` and
trailing periods go, ``.5`` -> ``0.5``, ``x = 5`` -> ``5``, ``f(x) = 2x`` -> ``2x`` and
``x \\in S`` -> ``S`` (one ``=``; the left side one letter, subscripted or a function of
letters); then each comma-separated item with one ``\\pm`` (or ``\\mp``) becomes two
items, with ``+`` and with ``-`` (``\\pm 2`` -> ``2,-2``, ``1 \\pm \\sqrt2`` ->
``1+sqrt(2),1-sqrt(2)``), and ``(C)`` -> ``C``. Thousands separators: ``1{,}234``
always, ``1,234`` (or ``1,\\!234``) only when the whole answer is one number with comma
groups of exactly three digits (``-?d{1,3}(,ddd)+(.d+)?``) and no comma in the answer is
followed by a space, so the tuple ``(1,234)`` and the lists ``1,2`` and ``10, 100`` stay
lists (``10, 100`` is not 10100).

Equivalence (``is_equiv``), after normalising both sides:
  1. Equal strings (case-insensitive when both are words, e.g. ``Monday``).
  2. Structure: ``(a,b)``, ``[a,b)`` (tuples and intervals) need the same brackets and
     equivalent elements in order; matrices need the same shape and equivalent entries
     (``0.5`` == ``\\frac12``); sets ``{a,b}``, bare lists ``a, b`` (so "2, 3" for "find
     all solutions" matches "3, 2") and the parts of a union ``A \\cup B`` are unordered
     (each element matched once).
  3. Scalars: equations ``l1=r1`` vs ``l2=r2`` match when ``(l1-r1)/(l2-r2)`` simplifies
     to a nonzero constant. Expressions are parsed into sympy (below); with no free
     symbols, two exact rationals (integers, fractions, decimals: ``0.5`` is 1/2) must be
     equal exactly, otherwise (an irrational such as ``pi`` or ``sqrt(2)`` involved) the
     values must satisfy |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol) with
     rel_tol = 1e-6, abs_tol = 1e-9. So 0.333 vs 1/3 is wrong (a rational answer must be
     exact; 0.3333333333 is wrong too), 12 vs 1.2 and 1234567 vs 1234568 are wrong, and
     1.4142136 vs ``\\sqrt{2}`` is right (1.4142 is not); infinite or undefined values
     (``oo``, ``1/0``) match only if identical. With free symbols, equal iff ``a - b``
     expands or simplifies (``sympy.simplify``) to 0. A side that does not parse matches
     only by string, and a sympy error while comparing means "not shown equal".
  Percent: a percent sign (or the word) is a unit (``50\\%`` == ``50``). When exactly one
  side has one and the other side is not an integer, the percent side divided by 100 is
  also tried (``50\\%`` == ``0.5``, ``150\\%`` == ``1.5``): an integer next to a percent
  is read as a percent written without its sign, so ``5000\\%`` != ``50`` and
  ``100\\%`` != ``1``; ``0.5`` != ``50`` (no percent sign at all).

Safety. No text is ever passed to ``eval``, ``sympify`` or ``parse_expr`` (which eval).
A small recursive-descent parser (``parse``) accepts only numbers (``12``, ``0.5``,
``1e5``: exact rationals), the one-letter names a-z/A-Z (``i`` is the imaginary unit,
``e`` is Euler's number), the names ``pi``, ``oo``, ``sqrt``, ``sin``, ``cos``, ``tan``,
``cot``, ``sec``, ``csc``, ``log``, ``ln``, ``exp`` and ``log_`` (``log_(b)x``: base b),
the operators ``+ - * / ^ !`` and parentheses; ``sin^2 x`` is ``(sin x)^2`` (a positive
integer power only); any other character (``_`` outside ``log_``, ``.`` outside a
number, a space, quotes, brackets) is a
parse error, as are more than ``MAX_TOKENS`` tokens or nesting deeper than ``MAX_DEPTH``.
It builds sympy objects by calling the constructors for those tokens, so model output
cannot reach attribute access or code.

Timeouts. A parsed expression can still be arbitrarily expensive (``9^{9^{9^{9}}}``
evaluates eagerly; ``simplify`` can run for hours; Math-Verify calls sympy's ``simplify``
and ``solve`` too), and a thread cannot be stopped, so ``verify_batch`` scores items in
worker processes through ``reward_pool.RewardPool``: an item that runs past ``timeout_s`` has
its worker killed (SIGKILL) and replaced, the item is "unscorable" and the rest of the
batch is scored by the other workers. This works from any thread (no signals). ``verify``
and ``is_equiv`` called directly have no timeout.

Training. ``MathReward`` is the ``RewardPool`` task: ``reward(gold, completion)`` takes
the ground-truth answer where the ``Task`` protocol has the prompt, which is what the
trainer passes for a task whose ``reward_input(example)`` returns ``example.answer``
(``tasks.base.Task``): ``pool.score([ex.answer for ex in batch], completions)``. A dataset
task's ``reward``/``format_reward`` can delegate to a ``MathReward``. The pool pickles
the task once per worker, so the answer travels per item and no dataset is pickled.
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import importlib
import importlib.util
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Literal

import sympy

from grpo_jax.verifiers import reward_pool, verdicts

Verdict = Literal["correct", "wrong", "no_answer", "unscorable"]
VERDICTS: tuple[Verdict, ...] = ("correct", "wrong", "no_answer", "unscorable")
Backend = Literal["math_verify", "builtin"]
BACKENDS: tuple[Backend, ...] = ("math_verify", "builtin")
DEFAULT_BACKEND: Backend = "math_verify"

REL_TOL = 1e-6
ABS_TOL = 1e-9
# Parser limits: longer or deeper input is a parse error (recursion stays bounded).
MAX_TOKENS = 400
MAX_DEPTH = 60

# --------------------------------------------------------------------------- Extraction


def _group(s: str, i: int) -> tuple[str, int] | None:
  """(content, index after '}') of the brace group opening at s[i] == '{'; None if open."""
  depth = 0
  j = i
  while j < len(s):
    c = s[j]
    if c == "\\":
      j += 2  # An escaped brace (\{ or \}) does not nest.
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return s[i + 1 : j], j + 1
    j += 1
  return None


_BOX = re.compile(r"\\(?:boxed|fbox)(?![a-zA-Z])\s*")
_BARE_BOX_ARG = re.compile(r"[^\s${}]+")


def last_boxed(text: str) -> str | None:
  """Content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed X``, else None.

  Braces are matched and escaped braces (``\\{``, ``\\}``) do not count, so
  ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``; a box whose braces never close is
  skipped. (Hendrycks et al.'s ``last_boxed_only_string`` and ``remove_boxed``, skipping
  escaped braces.) `datasets` takes MATH's gold answers with it too.
  """
  found = None
  for m in _BOX.finditer(text):
    if text.startswith("{", m.end()):
      group = _group(text, m.end())
      if group is not None:
        found = group[0]
    elif arg := _BARE_BOX_ARG.match(text, m.end()):
      found = arg[0]
  return found


_HASHES = re.compile(r"####[ \t]*([^\n]*)")
# A GSM8K answer starts like a number (a markdown heading "#### Step 2: ..." does not):
# optional markup, sign and dollar, then a digit, ".5", \frac, \sqrt or \pi.
_NUMBER_START = re.compile(
  r"(?:\*\*|\$|\\\(|\s)*[-+−]?\s*(?:\\?\$)?\s*(?:\.?\d|\\[dt]?frac|\\sqrt|\\pi)"
)
_ANSWER_PHRASE = re.compile(
  r"(?:the\s+[*_]*(?:final\s+)?answer\s+is[*_]*\s*:?|(?:final\s+)?answer[*_]*\s*:)",
  re.IGNORECASE,
)


def _gsm8k_answer(x: str) -> bool:
  """True if a '#### X' line holds an answer: X starts like a number and has no ". " or
  ": " (so the headings "#### 1. Setup" and "#### Step 2: Answer" are not answers)."""
  return _NUMBER_START.match(x) is not None and re.search(r"[.:]\s", x) is None


def _answer_line(text: str) -> str | None:
  """X from the last line with 'the answer is X' / 'final answer: X' / 'answer: X'."""
  lines = text.splitlines()
  for k in range(len(lines) - 1, -1, -1):
    phrases = list(_ANSWER_PHRASE.finditer(lines[k]))
    if not phrases:
      continue
    rest = lines[k][phrases[-1].end() :].strip(" \t*")
    if not rest:
      rest = next((line.strip(" \t*") for line in lines[k + 1 :] if line.strip(" \t*")), "")
    return re.split(r"\.\s", rest, maxsplit=1)[0].rstrip(" \t*.").lstrip(" \t*") or None
  return None


def _tag_body(text: str, tag: str) -> str | None:
  """Body of the last <tag>...</tag> block, else None."""
  bodies = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
  return bodies[-1] if bodies else None


def extract_answer(text: str, *, answer_tag: str | None = None) -> str | None:
  """The final answer in ``text`` by the precedence in the module docstring, else None.

  Rules: last \\boxed{}/\\fbox{} > last number-like '#### X' > last 'the answer is X' line. With
  ``answer_tag``, only the last <answer_tag> block is searched and its whole stripped
  body is the answer when no rule matches.
  """
  if answer_tag is not None:
    body = _tag_body(text, answer_tag)
    if body is None:
      return None
    return extract_answer(body) or body.strip() or None
  boxed = last_boxed(text)
  if boxed is not None and boxed.strip():
    return boxed.strip()
  hashes = [m[1].strip() for m in _HASHES.finditer(text) if _gsm8k_answer(m[1].strip())]
  if hashes:
    return hashes[-1]
  return _answer_line(text)


# ------------------------------------------------------------------------ Normalisation

_SET_OPEN, _SET_CLOSE = "\x01", "\x02"  # Set braces, kept apart from grouping braces.
_WRAPPERS = (
  "text|textbf|textit|textrm|textsf|texttt|mathrm|mathbf|mathit|mathsf|mathnormal|mbox|"
  "hbox|operatorname|boxed|fbox|emph"
)
_UNITS = (
  "square|sq|cubic|units?|dollars?|cents?|euros?|pounds?|lbs?|ounces?|oz|grams?|kg|mg|"
  "kilograms?|liters?|litres?|ml|gallons?|cm|mm|km|meters?|metres?|inches|inch|feet|foot|"
  "ft|yards?|yd|miles?|mph|hours?|hrs?|minutes?|mins?|seconds?|secs?|days?|weeks?|months?|"
  "years?|degrees?|radians?|percent"
)
_TRAILING_UNIT = re.compile(rf"(?<![A-Za-z\\/])(?:{_UNITS})(?:\^?\{{?[23]\}}?)?\s*$")
_TEXT_UNIT = re.compile(
  r"\\(?:text|mbox|mathrm|textrm)\s*\{(?=[^{}]*[A-Za-z])\s*[A-Za-z/][A-Za-z ./]*\}"
  r"(?:\^\{?[23]\}?)?\s*$"
)
# A plain number or fraction (5, 1,000, 2.5, 3/4, 1 1/2), then words of letters (a slash
# inside: km/h). The first word has three or more characters and is not a connective, a
# function, a scale or a comparison, so "2 x", "2 pi", "5 or 6", "3 sin x", "5 thousand"
# and "3 less than x" keep their words.
_NUMBER_WORDS = re.compile(
  r"(?P<number>[-+−]?\s*(?:\d+(?:,\d{3})*(?:\.\d*)?(?:\s+\d+/\d+|/\d+)?|\.\d+))\s+"
  r"(?P<first>[A-Za-z][A-Za-z/]{2,})(?:[\s-]+[A-Za-z][A-Za-z/]*)*\s*"
)
_NOT_UNITS = {
  *("and", "or", "not", "sqrt", "sin", "cos", "tan", "cot", "sec", "csc", "log", "exp"),
  *("hundred", "thousand", "million", "billion", "trillion", "dozen", "squared", "cubed"),
  *("less", "more", "fewer", "greater", "than", "times", "plus", "minus", "over"),
}
_MATRIX = re.compile(
  r"\\begin\s*\{\s*(p|b|B|small|)matrix\s*\}(.*?)\\end\s*\{\s*\1matrix\s*\}", re.DOTALL
)
_REPEATING = re.compile(
  r"(?<![\d.])(\d*)\.(\d*)\s*\\(?:overline|bar)(?![a-zA-Z])\s*(?:\{\s*(\d+)\s*\}|(\d))"
)
_SIMPLE_SUBS = (
  (r"\\(?:left|right)\s*\.", ""),  # Null delimiters.
  (r"\\(?:left|right|[bB]igg?[lr]?)(?![a-zA-Z])", ""),
  (r"\\\{|\\lbrace(?![a-zA-Z])", _SET_OPEN),
  (r"\\\}|\\rbrace(?![a-zA-Z])", _SET_CLOSE),
  (r"\\(?:emptyset|varnothing)(?![a-zA-Z])|∅", _SET_OPEN + _SET_CLOSE),
  (r"\\mathbb\s*(?:\{\s*R\s*\}|R(?![a-zA-Z]))|ℝ", r"(-\\infty,\\infty)"),
  (r"\\\$|\$|\\\[|\\\]|\\\(|\\\)", ""),
  (r"\\!", ""),  # A negative thin space joins: 10,\!000 is 10,000.
  # \\ (a row break) stays whole; \, \; \: \  ~ \quad are spaces.
  (r"\\\\|\\[,;: ]|\\q?quad(?![a-zA-Z])|~", lambda m: m[0] if m[0] == "\\\\" else " "),
  (r"\\displaystyle(?![a-zA-Z])", ""),
  (r"\{,\}", ""),
  (r"\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z])|°", ""),
  (r"\\?%", ""),
  (r"\\(?:text|mbox|textrm|mathrm)\s*\{\s*(?:and|or)\s*\}", " and "),
  (r"\\[dtc]frac(?![a-zA-Z])", r"\\frac"),
  (r"\\[dt]binom(?![a-zA-Z])", r"\\binom"),
  (r"\{([^{}]*)\\choose(?![a-zA-Z])([^{}]*)\}", r"\\binom{\1}{\2}"),
  (r"^([^{}]*)\\choose(?![a-zA-Z])([^{}]*)$", r"\\binom{\1}{\2}"),
  (  # A mixed number: 2\frac{1}{2} or 2\frac12 is 2 + 1/2.
    r"(?<![\w.}^])(\d+)\s*\\frac\s*(?:\{(\d+)\}|(\d))\s*(?:\{(\d+)\}|(\d))",
    lambda m: f"({m[1]}+{m[2] or m[3]}/{m[4] or m[5]})",
  ),
)
_OPERATOR_SUBS = (
  (r"\\(?:cdot|times|ast)(?![a-zA-Z])|×|·", "*"),
  (r"\\div(?![a-zA-Z])|÷", "/"),
  (r"\*\*", "^"),
  (r"−", "-"),
  (r"\\(?:pm|mp)(?![a-zA-Z])|±|∓", "±"),
  (r"\\pi(?![a-zA-Z])|π", "pi"),
  (r"\\infty(?![a-zA-Z])|∞", "oo"),
  (r"\\(?:leq?|leqslant)(?![a-zA-Z])|≤", "<="),
  (r"\\(?:geq?|geqslant)(?![a-zA-Z])|≥", ">="),
  (r"\\(?:neq?)(?![a-zA-Z])|≠", "!="),
  # log_2 8, \log_{b}(x): the base in braces, read by the parser as log_(b).
  (r"(?<![A-Za-z])\\?log\s*_\s*(?:\{([^{}]*)\}|([0-9A-Za-z]))", r"log_{\1\2}"),
  (r"\\(sin|cos|tan|cot|sec|csc|log|ln|exp)(?![a-zA-Z])", r"\1"),
  (r"\s+(?:and|or)\s+", ","),
  (r"\\in(?![a-zA-Z])|∈", "="),  # x \in [0, 1] reads as x = [0, 1], then as [0, 1].
  # Spaced digits: a plain mixed number 2 1/2 is 2 + 1/2; SI groups 1 000 join.
  (r"(?<![\w.)/^])(\d+)\s+(\d+)\s*/\s*(\d+)(?![\w.(])", r"(\1+\2/\3)"),
  (r"(?<![\d.])\d{1,3}(?:\s+\d{3})+(?!\d)", lambda m: re.sub(r"\s+", "", m[0])),
)
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# x=, x_1=, f(x)=, f(x,y)=: a one-letter (subscripted) name or function definition.
_VARIABLE_LHS = re.compile(r"[A-Za-z](?:_\(?\w+\)?)?(?:\([A-Za-z](?:,[A-Za-z])*\))?=(?!=)")


def _unwrap(s: str, names: str) -> str:
  """Replaces \\name{X} by X for each wrapper name (nested wrappers too)."""
  pattern = re.compile(rf"\\(?:{names})(?![a-zA-Z])\s*(?=\{{)")
  while m := pattern.search(s):
    group = _group(s, m.end())
    if group is None:
      return s[: m.start()] + s[m.end() :]
    s = s[: m.start()] + group[0] + s[group[1] :]
  return s


def _arg(s: str, i: int) -> tuple[str, int]:
  """One LaTeX macro argument at s[i:]: a {group}, a \\command or one character."""
  while i < len(s) and s[i].isspace():
    i += 1
  if i >= len(s):
    return "", i
  if s[i] == "{":
    group = _group(s, i)
    return group if group is not None else (s[i + 1 :], len(s))
  if m := re.compile(r"\\[a-zA-Z]+").match(s, i):
    return m[0], m.end()
  return s[i], i + 1


_FRAC_SQRT = re.compile(r"\\(frac|sqrt|binom)(?![a-zA-Z])")


def _expand_frac_sqrt(s: str) -> str:
  """\\frac{a}{b} -> ((a)/(b)), \\sqrt{x} -> sqrt(x), \\sqrt[n]{x} -> ((x)^(1/(n))),
  \\binom{n}{k} -> ((n)!/((k)!*((n)-(k))!)), recursively.

  Each expansion is one parenthesised operand, like the LaTeX group it comes from, so a
  following exponent or factor applies to all of it: \\frac{3}{2}^2 is (3/2)^2 = 9/4 and
  \\sqrt[3]{x}^2 is x^(2/3) (not 3/4 and x^(1/9), as they were without the outer pair)."""
  out, i = [], 0
  while m := _FRAC_SQRT.search(s, i):
    out.append(s[i : m.start()])
    j = m.end()
    if m[1] in ("frac", "binom"):
      a, j = _arg(s, j)
      b, j = _arg(s, j)
      a, b = _expand_frac_sqrt(a), _expand_frac_sqrt(b)
      out.append(f"(({a})/({b}))" if m[1] == "frac" else f"(({a})!/(({b})!*(({a})-({b}))!))")
    else:
      root = re.compile(r"\s*\[([^\]]*)\]").match(s, j)
      if root:
        j = root.end()
      radicand, j = _arg(s, j)
      x = _expand_frac_sqrt(radicand)
      out.append(f"(({x})^(1/({_expand_frac_sqrt(root[1])})))" if root else f"sqrt({x})")
    i = j
  out.append(s[i:])
  return "".join(out)


def _matrices(s: str) -> str:
  """\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix} (also bmatrix, Bmatrix, matrix,
  smallmatrix) -> [[a,b],[c,d]]; a trailing empty row goes."""

  def rows(m: re.Match) -> str:
    lines = [line.strip() for line in re.split(r"\\\\", m[2])]
    while lines and not lines[-1]:
      lines.pop()
    return "[[" + "],[".join(",".join(e.strip() for e in line.split("&")) for line in lines) + "]]"

  return _MATRIX.sub(rows, s)


def _repeating_decimal(m: re.Match) -> str:
  """0.1\\overline{6} (or \\bar) -> the exact fraction (1/6), from the digits alone."""
  whole, fixed, repeat = m[1], m[2], m[3] or m[4]
  if len(whole) + len(fixed) + len(repeat) > 40:
    return m[0]
  value = (
    fractions.Fraction(int(whole or "0"))
    + fractions.Fraction(int(fixed or "0"), 10 ** len(fixed))
    + fractions.Fraction(int(repeat), (10 ** len(repeat) - 1) * 10 ** len(fixed))
  )
  return str(value.numerator) if value.denominator == 1 else f"({value})"


def _drop_units(s: str) -> str:
  """Drops a trailing \\text{unit} or listed unit words after an answer that has a digit,
  and the words after a lone number or fraction (5 apples, 80 km/h; see _NUMBER_WORDS)."""
  m = _TEXT_UNIT.search(s)
  if m and re.search(r"\d", s[: m.start()]):
    s = s[: m.start()]
  m = _NUMBER_WORDS.fullmatch(s.strip())
  if m and m["first"].casefold() not in _NOT_UNITS:
    return m["number"]
  while (m := _TRAILING_UNIT.search(s)) and re.search(r"\d", s[: m.start()]):
    s = s[: m.start()].rstrip()
  return s


def _strip_variable(s: str) -> str:
  """'x=5' -> '5' and 'f(x)=2x' -> '2x' when there is one '=' and its left side is one
  (subscripted) letter or a one-letter function of letters."""
  m = _VARIABLE_LHS.match(s)
  return s[m.end() :] if m and s.count("=") == 1 else s


def _remove_spaces(s: str) -> str:
  """All whitespace goes, except that a space between two digits stays one space (so
  '2 3' is not 23 but a parse error)."""
  return re.sub(
    r"\s+",
    lambda m: (
      " " if s[m.start() - 1 : m.start()].isdigit() and s[m.end() : m.end() + 1].isdigit() else ""
    ),
    s,
  )


def _expand_plus_minus(s: str) -> str:
  """Each comma-separated item with one ± becomes two items, with + and with -:
  '±2' -> '2,-2', '1±sqrt(2)' -> '1+sqrt(2),1-sqrt(2)'."""
  if "±" not in s:
    return s
  items = []
  for item in _split_top(s, ","):
    if item.count("±") == 1:
      items += [re.sub(r"^\++", "", item.replace("±", "+")), item.replace("±", "-")]
    else:
      items.append(item)
  return ",".join(items)


def normalize(answer: str) -> str:
  """The canonical plain-math string for an answer (rules in the module docstring)."""
  s = answer.strip().rstrip(".")
  s = _matrices(s)
  s = _REPEATING.sub(_repeating_decimal, s)
  for pattern, repl in _SIMPLE_SUBS:
    s = re.sub(pattern, repl, s)
  s = _drop_units(s.strip())
  s = _unwrap(s, _WRAPPERS)
  s = _drop_units(s.strip())
  s = _expand_frac_sqrt(s)
  for pattern, repl in _OPERATOR_SUBS:
    s = re.sub(pattern, repl, s)
  # A comma followed by a space separates items: 10, 100 is a list, not 10100.
  list_comma = re.search(r",\s", s) is not None
  s = _remove_spaces(s).replace("{", "(").replace("}", ")")
  s = s.replace(_SET_OPEN, "{").replace(_SET_CLOSE, "}")
  s = re.sub(r"^\++", "", s.rstrip("."))
  s = re.sub(r"(?<!\d)\.(\d)", r"0.\1", s)
  s = _expand_plus_minus(_strip_variable(s))
  if not list_comma and _THOUSANDS.fullmatch(s):
    s = s.replace(",", "")
  return re.sub(r"^\(([A-Za-z])\)$", r"\1", s)


# ------------------------------------------------------------------------------ Parsing


class ParseError(ValueError):
  """The string is not an expression of the safe grammar."""


_FUNCTIONS = {
  "sqrt": sympy.sqrt,
  "sin": sympy.sin,
  "cos": sympy.cos,
  "tan": sympy.tan,
  "cot": sympy.cot,
  "sec": sympy.sec,
  "csc": sympy.csc,
  "log": sympy.log,
  "ln": sympy.log,
  "exp": sympy.exp,
}
_CONSTANTS = {"pi": sympy.pi, "oo": sympy.oo, "i": sympy.I, "e": sympy.E}
_TOKEN = re.compile(
  r"(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)"
  rf"|(?P<name>log_|{'|'.join(sorted(_FUNCTIONS, key=len, reverse=True))}|pi|oo|[A-Za-z])"
  r"|(?P<op>[-+*/^()!])"
  r"|(?P<bad>.)",
  re.DOTALL,
)


def _tokenize(s: str) -> list[tuple[str, str]]:
  tokens = []
  for m in _TOKEN.finditer(s):
    if m.lastgroup == "bad":
      raise ParseError(f"unexpected character {m[0]!r} in {s!r:.80}")
    tokens.append((m.lastgroup, m[0]))
  if len(tokens) > MAX_TOKENS:
    raise ParseError(f"more than {MAX_TOKENS} tokens")
  return tokens


class _Parser:
  """expr := term (('+'|'-') term)* ;  term := unary (('*'|'/') unary | implicit power)* ;
  unary := ('+'|'-') unary | power ;  power := postfix ('^' unary)? ;  postfix := atom '!'* ;
  atom := NUMBER | CONSTANT | LETTER | FUNCTION ('^' atom)? argument
        | 'log_' '(' expr ')' argument | '(' expr ')' ;  argument := '(' expr ')' | atom.

  Implicit multiplication binds like '*' (left to right), so 1/2x = x/2, and unary minus
  binds looser than '^', so -2^2 = -4. ``sin^2 x`` is (sin x)^2 (the power must be a
  positive integer: sin^-1 is a parse error), ``log_(b) x`` is the log of x to base b.
  """

  def __init__(self, tokens: list[tuple[str, str]]):
    self.tokens, self.i, self.depth = tokens, 0, 0

  def peek(self) -> tuple[str, str] | None:
    return self.tokens[self.i] if self.i < len(self.tokens) else None

  def take(self, expected: str | None = None) -> tuple[str, str]:
    tok = self.peek()
    if tok is None or (expected is not None and tok[1] != expected):
      raise ParseError(f"expected {expected or 'a token'}, got {tok and tok[1]!r}")
    self.i += 1
    return tok

  def expr(self) -> sympy.Expr:
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise ParseError(f"nested deeper than {MAX_DEPTH}")
    value = self.term()
    while (tok := self.peek()) and tok[1] in "+-":
      self.take()
      value = value + self.term() if tok[1] == "+" else value - self.term()
    self.depth -= 1
    return value

  def term(self) -> sympy.Expr:
    value = self.unary()
    while tok := self.peek():
      if tok[1] in ("*", "/"):
        self.take()
        value = value * self.unary() if tok[1] == "*" else value / self.unary()
      elif tok[0] in ("num", "name") or tok[1] == "(":
        value = value * self.power()
      else:
        break
    return value

  def unary(self) -> sympy.Expr:
    tok = self.peek()
    if tok and tok[1] in "+-":
      self.take()
      self.depth += 1
      if self.depth > MAX_DEPTH:
        raise ParseError(f"nested deeper than {MAX_DEPTH}")
      value = self.unary()
      self.depth -= 1
      return value if tok[1] == "+" else -value
    return self.power()

  def power(self) -> sympy.Expr:
    base = self.atom()
    while (tok := self.peek()) and tok[1] == "!":
      self.take()
      base = sympy.factorial(base)
    if (tok := self.peek()) and tok[1] == "^":
      self.take()
      return base ** self.unary()
    return base

  def atom(self) -> sympy.Expr:
    kind, text = self.take()
    if kind == "num":
      return sympy.Rational(text)  # Exact: 0.5 is 1/2 (fractions.Fraction parsing, no eval).
    if kind == "name" and text == "log_":
      base = self.parenthesised()
      return sympy.log(self.argument(), base)
    if kind == "name" and text in _FUNCTIONS:
      power = None
      if (tok := self.peek()) and tok[1] == "^":
        self.take()
        power = self.atom()
        if not (power.is_Integer and power > 0):
          raise ParseError(f"{text}^{power}: only a positive integer power of a function")
      value = _FUNCTIONS[text](self.argument())
      return value if power is None else value**power
    if kind == "name":
      return _CONSTANTS[text] if text in _CONSTANTS else sympy.Symbol(text)
    if text == "(":
      self.i -= 1
      return self.parenthesised()
    raise ParseError(f"unexpected {text!r}")

  def argument(self) -> sympy.Expr:
    """A function's argument: parenthesised, else one atom (sin 2x is sin(2)*x)."""
    if (tok := self.peek()) and tok[1] == "(":
      return self.parenthesised()
    return self.atom()

  def parenthesised(self) -> sympy.Expr:
    self.take("(")
    value = self.expr()
    self.take(")")
    return value


def parse(s: str) -> sympy.Expr:
  """A normalised answer as a sympy expression, by the safe grammar of ``_Parser``.

  Raises ParseError for anything else (no eval; see the module docstring).
  """
  parser = _Parser(_tokenize(s))
  value = parser.expr()
  if parser.peek() is not None:
    raise ParseError(f"unexpected {parser.peek()[1]!r} after a complete expression")
  return value


# --------------------------------------------------------------------------- Equivalence


def _split_top(s: str, sep: str) -> list[str]:
  """s split at occurrences of sep outside all brackets."""
  parts, depth, start, i = [], 0, 0, 0
  while i < len(s):
    if s[i] in "([{":
      depth += 1
    elif s[i] in ")]}":
      depth -= 1
    elif depth == 0 and s.startswith(sep, i):
      parts.append(s[start:i])
      start = i + len(sep)
      i = start
      continue
    i += 1
  return parts + [s[start:]]


def _encloses(s: str) -> bool:
  """True if the bracket opening at s[0] closes at s[-1]."""
  depth = 0
  for k, c in enumerate(s):
    depth += c in "([{"
    depth -= c in ")]}"
    if depth == 0:
      return k == len(s) - 1
  return False


def _structure(s: str) -> tuple[str, str, list[str]]:
  """(kind, brackets, items): kind in union / matrix / ordered / unordered / scalar.

  A union's items are its parts, a matrix's its rows ("[a,b]"); unions, sets and bare
  lists are unordered, matrices and bracketed tuples ordered.
  """
  if len(parts := _split_top(s, "\\cup")) > 1:
    return "unordered", "cup", parts
  if s.startswith("[[") and _encloses(s):
    rows = _split_top(s[1:-1], ",")
    if all(row[:1] == "[" and row[-1:] == "]" and _encloses(row) for row in rows):
      return "matrix", "", rows
  if len(s) >= 2 and s[0] in "([{" and s[-1] in ")]}" and _encloses(s):
    items = _split_top(s[1:-1], ",")
    if s[0] == "{":
      return "unordered", "", items
    if len(items) > 1:
      return "ordered", s[0] + s[-1], items
  if len(items := _split_top(s, ",")) > 1:
    return "unordered", "", items
  return "scalar", "", [s]


def _values_close(a: sympy.Expr, b: sympy.Expr, *, rel_tol: float, abs_tol: float) -> bool:
  """Exact for two rationals, else |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol)."""
  if a == b:
    return True
  if a.is_Rational and b.is_Rational:
    return False
  va, vb = sympy.N(a, 30), sympy.N(b, 30)
  if not (va.is_finite and vb.is_finite):  # zoo, nan, oo: only equal if identical.
    return False
  scale = sympy.Max(abs(va), abs(vb))
  return bool(abs(va - vb) <= sympy.Max(rel_tol * scale, abs_tol))


def _expressions_equal(a: str, b: str, *, rel_tol: float, abs_tol: float) -> bool:
  try:
    ea, eb = parse(a), parse(b)
  except ParseError:
    return False
  try:
    if not (ea.free_symbols or eb.free_symbols):
      return _values_close(ea, eb, rel_tol=rel_tol, abs_tol=abs_tol)
    diff = ea - eb
    return diff == 0 or sympy.expand(diff) == 0 or sympy.simplify(diff) == 0
  except Exception:  # noqa: BLE001 -- sympy failing (NaN comparison, ...) shows no equality.
    return False


def _equations_equal(a: str, b: str) -> bool:
  """l1=r1 vs l2=r2: (l1 - r1) / (l2 - r2) simplifies to a nonzero constant."""
  try:
    (l1, r1), (l2, r2) = (map(parse, a.split("=")), map(parse, b.split("=")))
  except (ParseError, ValueError):
    return False
  try:
    ratio = sympy.simplify((l1 - r1) / (l2 - r2))
    return bool(ratio.is_number and ratio.is_finite and ratio != 0)
  except Exception:  # noqa: BLE001 -- as in _expressions_equal.
    return False


def _scalars_equal(a: str, b: str, *, rel_tol: float, abs_tol: float) -> bool:
  a, b = _strip_variable(a), _strip_variable(b)
  if a == b or (a.isalpha() and len(a) > 1 and a.casefold() == b.casefold()):
    return True
  if "=" in a or "=" in b:
    return a.count("=") == b.count("=") == 1 and _equations_equal(a, b)
  return _expressions_equal(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def _normalized_equal(a: str, b: str, *, rel_tol: float, abs_tol: float) -> bool:
  """Equivalence of two normalised answers, by structure then element by element."""
  if a == b:
    return True
  (kind_a, brackets_a, items_a), (kind_b, brackets_b, items_b) = _structure(a), _structure(b)
  if kind_a != kind_b or brackets_a != brackets_b or len(items_a) != len(items_b):
    return False
  same = lambda x, y: _normalized_equal(x, y, rel_tol=rel_tol, abs_tol=abs_tol)
  if kind_a == "scalar":
    return _scalars_equal(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
  if kind_a == "matrix":  # Row by row, entry by entry.
    rows_a = [_split_top(row[1:-1], ",") for row in items_a]
    rows_b = [_split_top(row[1:-1], ",") for row in items_b]
    return all(
      len(x) == len(y) and all(same(u, v) for u, v in zip(x, y)) for x, y in zip(rows_a, rows_b)
    )
  if kind_a != "unordered":
    return all(same(x, y) for x, y in zip(items_a, items_b))
  unused = list(items_b)
  for x in items_a:
    match = next((k for k, y in enumerate(unused) if same(x, y)), None)
    if match is None:
      return False
    unused.pop(match)
  return True


def _has_percent(answer: str) -> bool:
  return re.search(r"%|(?<![A-Za-z])percent", answer) is not None


def _is_integer(normalized: str) -> bool:
  """True if the normalised answer parses to an integer (50, 100/2), else False."""
  try:
    return bool(parse(normalized).is_Integer)
  except ParseError:
    return False


def is_equiv(pred: str, gold: str, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
  """True if the answers are equivalent: strings, structure, exact or within tolerance.

  Rules (module docstring): after ``normalize``, equal strings; else same structure and
  equivalent items; scalars: two rationals exactly equal, other constants within
  max(rel_tol * max(|a|, |b|), abs_tol), expressions with ``simplify(a - b) == 0``. A
  percent sign on exactly one side also tries that side divided by 100 when the other
  side is not an integer (50% == 0.5, but 5000% != 50). No timeout.
  """
  p, g = normalize(pred), normalize(gold)
  candidates = [(p, g)]
  if _has_percent(pred) != _has_percent(gold):
    if _has_percent(pred) and not _is_integer(g):
      candidates.append((f"({p})/100", g))
    elif _has_percent(gold) and not _is_integer(p):
      candidates.append((p, f"({g})/100"))
  return any(_normalized_equal(x, y, rel_tol=rel_tol, abs_tol=abs_tol) for x, y in candidates)


def _builtin_verify(
  completion: str, gold: str, *, answer_tag: str | None, rel_tol: float, abs_tol: float
) -> Verdict:
  pred = extract_answer(completion, answer_tag=answer_tag)
  if pred is None:
    return "no_answer"
  return "correct" if is_equiv(pred, gold, rel_tol=rel_tol, abs_tol=abs_tol) else "wrong"


def verify(
  completion: str,
  gold: str,
  *,
  answer_tag: str | None = None,
  rel_tol: float = REL_TOL,
  abs_tol: float = ABS_TOL,
  backend: Backend = DEFAULT_BACKEND,
) -> Verdict:
  """The verdict for one completion against its gold answer. No timeout (see Timeouts).

  "no_answer" if nothing is extracted, else "correct" / "wrong"; "unscorable" if the
  backend cannot decide: it raised, or (``math_verify``) the gold answer does not parse.
  ``rel_tol``/``abs_tol`` apply to ``backend="builtin"`` only. ``answer_tag``: only the
  body of the last ``<answer_tag>...</answer_tag>`` block is read, none is "no_answer".
  """
  check_backend(backend)
  if backend == "math_verify":
    _hf()  # An import failure is a configuration error, raised, not a verdict.
  try:
    if backend == "builtin":
      return _builtin_verify(
        completion, gold, answer_tag=answer_tag, rel_tol=rel_tol, abs_tol=abs_tol
      )
    return _hf_verify(completion, gold, answer_tag=answer_tag)
  except Exception:  # noqa: BLE001 -- a verifier that raises has not decided.
    return "unscorable"


def has_answer(completion: str, *, answer_tag: str | None = None, backend: Backend) -> bool:
  """True if ``backend`` extracts an answer from the completion (any answer, right or not)."""
  check_backend(backend)
  if backend == "builtin":
    return extract_answer(completion, answer_tag=answer_tag) is not None
  text = completion if answer_tag is None else _tag_body(completion, answer_tag)
  try:
    return text is not None and bool(_hf_parse(text))
  except Exception:  # noqa: BLE001 -- as in verify: nothing decided, nothing extracted.
    return False


# --------------------------------------------------------------- Hugging Face backend

_HF_NO_TIMEOUT_NOTICE = "Timeout is disabled"


class _DropNoTimeoutNotice(logging.Filter):
  """math_verify warns once per process that its timeout is off; ours is the pool's."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_HF_NO_TIMEOUT_NOTICE)


@functools.cache
def _hf():
  """The ``math_verify`` package from PyPI (``math-verify``), imported on first use.

  ``import math_verify`` inside this module finds the top-level package, not this file
  (``grpo_jax.verifiers.math_verify``), unless this file's own directory is on sys.path (running it
  as a script); that case is refused rather than silently importing ourselves.
  """
  module = importlib.import_module("math_verify")
  if getattr(module, "__file__", None) == __file__ or not hasattr(module, "LatexExtractionConfig"):
    raise ImportError(
      f"'import math_verify' found {getattr(module, '__file__', module)!r}, not Hugging Face's "
      "math-verify package; install it (pip install math-verify) and do not run "
      "grpo_jax/verifiers/math_verify.py as a script."
    )
  for name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(name).addFilter(_DropNoTimeoutNotice())
  return module


def check_backend(backend: str) -> None:
  """Raises ValueError for an unknown backend, ImportError if ``math_verify`` is missing."""
  if backend not in BACKENDS:
    raise ValueError(f"Unknown math verifier backend {backend!r}; valid: {list(BACKENDS)}.")
  if backend == "math_verify" and importlib.util.find_spec("math_verify") is None:
    raise ImportError(
      "backend='math_verify' needs Hugging Face's math-verify package: pip install "
      "'math-verify>=0.9,<0.10' (or choose backend='builtin')."
    )


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_LATEX_ENV = re.compile(r"\\boxed|\\fbox|\\\(|\\\[")


def hf_gold_text(gold: str) -> str:
  """The gold answer as ``math_verify`` parses it: ``\\boxed{gold}``, as verl does, unless
  it already holds a math environment (an unescaped ``$``, ``\\boxed``, ``\\(``, ``\\[``).

  A bare gold such as ``\\text{Evelyn}``, ``(3,2)`` or ``x \\in [-2,7]`` holds no
  delimiter its parser would find, so unwrapped it parses to nothing (TRL then skips the
  example) or to a stray number (``x \\leq 5`` -> 5).
  """
  if _UNESCAPED_DOLLAR.search(gold) or _LATEX_ENV.search(gold):
    return gold
  return f"\\boxed{{{gold}}}"


@functools.lru_cache(maxsize=1024)
def _hf_parse(text: str) -> tuple:
  """``math_verify.parse`` with its default targets (LaTeX and plain expressions), its
  signal-based timeout off and errors raised; cached (a group's G completions share one
  gold, and a completion is read twice by the verification pool)."""
  hf = _hf()
  parsed = hf.parse(
    text,
    extraction_config=[hf.LatexExtractionConfig(), hf.ExprExtractionConfig()],
    parsing_timeout=None,
    raise_on_error=True,
  )
  return tuple(parsed)


def _hf_verify(completion: str, gold: str, *, answer_tag: str | None) -> Verdict:
  """Verdict of ``math_verify``: every (gold, prediction) pair of the parses is compared
  (its ``verify`` with defaults: float_rounding=6, numeric_precision=15, strict=True) with
  its timeout off and errors raised; a pair that raises makes the item "unscorable" unless
  another pair matches."""
  hf = _hf()
  golds = _hf_parse(hf_gold_text(gold))
  if not golds:
    raise ValueError(f"math_verify cannot parse the gold answer {gold!r:.80}")
  text = completion if answer_tag is None else _tag_body(completion, answer_tag)
  preds = _hf_parse(text) if text is not None else ()
  if not preds:
    return "no_answer"
  error = None
  for g in golds:
    for p in preds:
      try:
        if hf.verify(g, p, timeout_seconds=None, raise_on_error=True):
          return "correct"
      except Exception as e:  # noqa: BLE001 -- undecided, unless another pair matches.
        error = e
  if error is not None:
    raise error
  return "wrong"


# ------------------------------------------------------------------------ Format reward


def format_reward(
  completion: str, *, tags: Sequence[str] = ("think",), answer_tag: str | None = None
) -> float:
  """1.0 if the completion follows the template, else 0.0; correctness is not checked.

  Rule: each of ``<t>`` and ``</t>`` for t in ``tags`` (and ``answer_tag``) occurs exactly
  once, and the completion is, up to whitespace between the pieces,
  ``<t1>...</t1><t2>...</t2>...<tk>...</tk>R``. Without ``answer_tag``, R must contain an
  extractable final answer (``extract_answer(R)`` is not None; "\\boxed{}" is not one).
  With it, R must be ``<answer_tag>B</answer_tag>`` with B not blank and nothing after it.
  With tags=() and no answer_tag: 1.0 iff an answer can be extracted.
  """
  all_tags = [*tags, *([answer_tag] if answer_tag is not None else [])]
  if any(completion.count(f"<{t}>") != 1 or completion.count(f"</{t}>") != 1 for t in all_tags):
    return 0.0
  blocks = "".join(rf"\s*<{re.escape(t)}>.*?</{re.escape(t)}>" for t in tags)
  m = re.fullmatch(rf"{blocks}(?P<rest>.*)", completion, re.DOTALL)
  if m is None:
    return 0.0
  rest = m["rest"]
  if answer_tag is None:
    return float(extract_answer(rest) is not None)
  t = re.escape(answer_tag)
  answer = re.fullmatch(rf"\s*<{t}>(?P<body>.*)</{t}>\s*", rest, re.DOTALL)
  return float(answer is not None and bool(answer["body"].strip()))


# ------------------------------------------------------------------- RewardPool adaptors


@dataclasses.dataclass(frozen=True)
class MathReward:
  """The ``RewardPool`` task for math: the first argument is the gold answer, not a prompt.

  ``reward(gold, completion)`` = 1.0 if ``verify(...) == "correct"`` else 0.0, and raises
  ``verdicts.Unscorable`` when the verdict is "unscorable" (the pool counts the item in
  ``reward_errors``, apart from wrong answers); ``format_reward(gold, completion)`` =
  ``format_reward(completion, tags=..., answer_tag=...)`` whatever the backend.
  Use: ``reward_pool.RewardPool(MathReward(), ...).score([ex.answer ...], completions)``.
  A timeout shows as ``Scores.timeout_N`` (reward 0, counted in ``reward_errors``).
  Construction fails early (ImportError) if the backend's package is missing.
  """

  tags: tuple[str, ...] = ("think",)
  answer_tag: str | None = None
  rel_tol: float = REL_TOL
  abs_tol: float = ABS_TOL
  backend: Backend = DEFAULT_BACKEND

  def __post_init__(self):
    check_backend(self.backend)

  def verdict(self, gold: str, completion: str) -> Verdict:
    return verify(
      completion,
      gold,
      answer_tag=self.answer_tag,
      rel_tol=self.rel_tol,
      abs_tol=self.abs_tol,
      backend=self.backend,
    )

  def reward(self, gold: str, completion: str) -> float:
    verdict = self.verdict(gold, completion)
    if verdict == "unscorable":
      raise verdicts.Unscorable(
        f"{self.backend} cannot decide gold {gold!r:.80} vs completion {completion[-200:]!r}"
      )
    return float(verdict == "correct")

  def format_reward(self, gold: str, completion: str) -> float:
    del gold  # The template does not depend on the answer.
    return format_reward(completion, tags=self.tags, answer_tag=self.answer_tag)


@dataclasses.dataclass(frozen=True)
class _Judge(MathReward):
  """Pool task for ``verify_batch``: reward = correct, format_reward = an answer exists."""

  def format_reward(self, gold: str, completion: str) -> float:
    del gold
    return float(has_answer(completion, answer_tag=self.answer_tag, backend=self.backend))


def verification_pool(
  *,
  workers: int = 2,
  timeout_s: float = 5.0,
  answer_tag: str | None = None,
  rel_tol: float = REL_TOL,
  abs_tol: float = ABS_TOL,
  backend: Backend = DEFAULT_BACKEND,
) -> reward_pool.RewardPool:
  """A pool for ``verify_batch(..., pool=...)``; reuse it across batches, then close it."""
  judge = _Judge(answer_tag=answer_tag, rel_tol=rel_tol, abs_tol=abs_tol, backend=backend)
  return reward_pool.RewardPool(judge, workers=workers, timeout_s=timeout_s)


def verdicts_from_scores(scores: verdicts.Scores) -> list[Verdict]:
  """Verdicts from a ``verification_pool``'s Scores: error -> "unscorable", then by value."""
  out: list[Verdict] = []
  for correct, answered, error in zip(scores.correct_N, scores.format_N, scores.error_N):
    if error:
      out.append("unscorable")
    elif correct == 1.0:
      out.append("correct")
    else:
      out.append("wrong" if answered == 1.0 else "no_answer")
  return out


def verify_batch(
  completions: Sequence[str],
  golds: Sequence[str],
  *,
  pool: reward_pool.RewardPool | None = None,
  workers: int = 2,
  timeout_s: float = 5.0,
  backend: Backend = DEFAULT_BACKEND,
) -> list[Verdict]:
  """verdicts[i] for (completions[i], golds[i]) with a hard per-item timeout.

  Items run in worker processes (``reward_pool.RewardPool``); one that takes longer than
  ``timeout_s``, raises (``verdicts.Unscorable`` included) or kills its worker is
  "unscorable" while the other workers score the rest, so a batch with k hanging items
  takes about k * timeout_s / workers extra. ``pool``: a ``verification_pool`` to reuse
  (then workers, timeout_s and backend are the pool's); without one, a pool is started
  (~0.5 s) and closed for this call. Safe off the main thread; workers=0 scores inline
  with no timeout.
  """
  if len(completions) != len(golds):
    raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers.")
  if pool is not None:
    if not isinstance(pool.task, _Judge):
      raise TypeError(f"verify_batch needs a pool from verification_pool(), got {pool.task!r}.")
    return verdicts_from_scores(pool.score(list(golds), list(completions)))
  with verification_pool(workers=workers, timeout_s=timeout_s, backend=backend) as own_pool:
    return verdicts_from_scores(own_pool.score(list(golds), list(completions)))


def count_verdicts(verdicts: Iterable[str]) -> dict[str, int]:
  """{"correct": n, "wrong": n, "no_answer": n, "unscorable": n}: every key, zeros too."""
  counts = dict.fromkeys(VERDICTS, 0)
  for v in verdicts:
    if v not in counts:
      raise ValueError(f"Unknown verdict {v!r}; verdicts are {VERDICTS}.")
    counts[v] += 1
  return counts
