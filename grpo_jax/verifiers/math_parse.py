"""The safe expression parser of the builtin math verifier: a normalised answer (the
output of ``math_normalize``) to a sympy expression, without ever calling ``eval``.

Safety. No text is ever passed to ``eval``, ``sympify`` or ``parse_expr`` (which eval).
A small recursive-descent parser (``parse``) accepts only numbers (``12``, ``0.5``,
``1e5``: exact rationals), the one-letter names a-z/A-Z (``i`` is the imaginary unit,
``e`` is Euler's number), the names ``pi``, ``oo``, ``sqrt``, ``sin``, ``cos``, ``tan``,
``cot``, ``sec``, ``csc``, ``log``, ``ln``, ``exp`` and ``log_`` (``log_(b)x``: base b),
the operators ``+ - * / ^ !`` and parentheses; ``sin^2 x`` is ``(sin x)^2`` (a positive
integer power only); any other character (``_`` outside ``log_``, ``.`` outside a
number, a space, quotes, brackets) is a parse error, as are more than ``MAX_TOKENS``
tokens or nesting deeper than ``MAX_DEPTH``. It builds sympy objects by calling the
constructors for those tokens, so model output cannot reach attribute access or code.
A parsed expression can still be arbitrarily expensive to evaluate: ``math_verify``'s
Timeouts.

Import. sympy is imported at the first parse, not with this module: it takes about 0.4 s,
and every process that imports the trainer (each command-line run, each of the tests'
child runs) imports this module through the task registry, most never scoring math.
"""

from __future__ import annotations

import re
import typing

if typing.TYPE_CHECKING:
  import sympy

# Parser limits: longer or deeper input is a parse error (recursion stays bounded).
MAX_TOKENS = 400
MAX_DEPTH = 60


class ParseError(ValueError):
  """The string is not an expression of the safe grammar."""


# A token's sympy attribute (looked up at parse time: Import in the module docstring).
_FUNCTIONS = {
  "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan", "cot": "cot", "sec": "sec",
  "csc": "csc", "log": "log", "ln": "log", "exp": "exp",
}  # fmt: skip
_CONSTANTS = {"pi": "pi", "oo": "oo", "i": "I", "e": "E"}
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
    import sympy as sympy_module  # noqa: PLC0415 -- deferred (module docstring: Import).

    self.tokens, self.i, self.depth, self.sympy = tokens, 0, 0, sympy_module

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
      base = self.sympy.factorial(base)
    if (tok := self.peek()) and tok[1] == "^":
      self.take()
      return base ** self.unary()
    return base

  def atom(self) -> sympy.Expr:
    kind, text = self.take()
    if kind == "num":
      return self.sympy.Rational(text)  # Exact: 0.5 is 1/2 (fractions.Fraction parsing, no eval).
    if kind == "name" and text == "log_":
      base = self.parenthesised()
      return self.sympy.log(self.argument(), base)
    if kind == "name" and text in _FUNCTIONS:
      power = None
      if (tok := self.peek()) and tok[1] == "^":
        self.take()
        power = self.atom()
        if not (power.is_Integer and power > 0):
          raise ParseError(f"{text}^{power}: only a positive integer power of a function")
      value = getattr(self.sympy, _FUNCTIONS[text])(self.argument())
      return value if power is None else value**power
    if kind == "name":
      return (
        getattr(self.sympy, _CONSTANTS[text]) if text in _CONSTANTS else self.sympy.Symbol(text)
      )
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
