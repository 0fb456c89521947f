"""LaTeX and plain-text normalisation for the builtin math verifier: one answer, however it
is written, becomes one calculator-style string that ``math_parse`` can read and
``math_equiv`` can compare (``math_verify``'s docstring compares the backends).
``math_equiv`` also uses ``split_top`` (a split outside brackets) and ``strip_variable``.

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
"""

from __future__ import annotations

import fractions
import re

from grpo_jax.verifiers import math_extract

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
    group = math_extract.brace_group(s, m.end())
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
    group = math_extract.brace_group(s, i)
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


def strip_variable(s: str) -> str:
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
  for item in split_top(s, ","):
    if item.count("±") == 1:
      items += [re.sub(r"^\++", "", item.replace("±", "+")), item.replace("±", "-")]
    else:
      items.append(item)
  return ",".join(items)


def normalize(answer: str, *, keep_variable: bool = False) -> str:
  """The canonical plain-math string for an answer (rules in the module docstring);
  `keep_variable`: a one-letter left side stays (`strip_variable` is not applied), so
  that two equations compare as equations."""
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
  s = _expand_plus_minus(s if keep_variable else strip_variable(s))
  if not list_comma and _THOUSANDS.fullmatch(s):
    s = s.replace(",", "")
  return re.sub(r"^\(([A-Za-z])\)$", r"\1", s)


def split_top(s: str, sep: str) -> list[str]:
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
