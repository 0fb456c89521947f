"""A safe arithmetic-expression parser (never ``eval``): integers, + - * / and parentheses.

Grammar:  expr := term (('+'|'-') term)* ;  term := factor (('*'|'/') factor)* ;
          factor := INT | '(' expr ')'
Values are exact Fractions. Errors (bad syntax, division by zero, too long or too
deep) raise ExprError.
"""

from __future__ import annotations

import fractions
import re

MAX_TOKENS = 64
MAX_DEPTH = 16
MAX_DIGITS = 6
_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


class ExprError(ValueError):
  pass


def tokenize(text: str) -> list[str]:
  tokens = []
  for m in _TOKEN.finditer(text):
    num, sym = m.groups()
    if num is not None:
      if len(num) > MAX_DIGITS:
        raise ExprError(f"number {num} has more than {MAX_DIGITS} digits")
      tokens.append(num)
    elif sym is not None and not sym.isspace():
      if sym not in "+-*/()":
        raise ExprError(f"unexpected character {sym!r}")
      tokens.append(sym)
  if len(tokens) > MAX_TOKENS:
    raise ExprError(f"expression has more than {MAX_TOKENS} tokens")
  return tokens


class _Parser:
  def __init__(self, tokens: list[str]):
    self.tokens, self.i, self.numbers = tokens, 0, []

  def peek(self):
    return self.tokens[self.i] if self.i < len(self.tokens) else None

  def take(self):
    tok = self.peek()
    self.i += 1
    return tok

  def expr(self, depth):
    value = self.term(depth)
    while self.peek() in ("+", "-"):
      value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
    return value

  def term(self, depth):
    value = self.factor(depth)
    while self.peek() in ("*", "/"):
      op, rhs = self.take(), self.factor(depth)
      if op == "*":
        value *= rhs
      elif rhs == 0:
        raise ExprError("division by zero")
      else:
        value /= rhs
    return value

  def factor(self, depth):
    if depth > MAX_DEPTH:
      raise ExprError(f"parentheses nested deeper than {MAX_DEPTH}")
    tok = self.take()
    if tok is None:
      raise ExprError("unexpected end of expression")
    if tok.isdigit():
      self.numbers.append(int(tok))
      return fractions.Fraction(int(tok))
    if tok == "(":
      value = self.expr(depth + 1)
      if self.take() != ")":
        raise ExprError("missing ')'")
      return value
    raise ExprError(f"unexpected token {tok!r}")


def evaluate(text: str) -> tuple[fractions.Fraction, list[int]]:
  """Returns (exact value, the integer literals used, in order)."""
  parser = _Parser(tokenize(text))
  if not parser.tokens:
    raise ExprError("empty expression")
  value = parser.expr(0)
  if parser.peek() is not None:
    raise ExprError(f"unexpected token {parser.peek()!r}")
  return value, parser.numbers
