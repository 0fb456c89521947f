"""Equivalence of two math answers for the builtin verifier: structure first (tuples,
intervals, sets, lists, matrices, unions), then scalars by exact rationals, a tolerance or
symbolic simplification (``math_verify``'s docstring compares the backends). Both sides
go through ``math_normalize`` and ``math_parse``.

Equivalence (``is_equiv``), after normalising both sides:
  1. Equal strings (case-insensitive when both are words, e.g. ``Monday``).
  2. Structure: ``(a,b)``, ``[a,b)`` (tuples and intervals) need the same brackets and
     equivalent elements in order; matrices need the same shape and equivalent entries
     (``0.5`` == ``\\frac12``); sets ``{a,b}``, bare lists ``a, b`` (so "2, 3" for "find
     all solutions" matches "3, 2") and the parts of a union ``A \\cup B`` are unordered
     (each element matched once).
  3. Scalars: equations ``l1=r1`` vs ``l2=r2`` match when ``(l1-r1)/(l2-r2)`` simplifies
     to a nonzero constant. Expressions are parsed into sympy (``math_parse``); with no free
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
"""

from __future__ import annotations

import functools
import re
import typing

from grpo_jax.verifiers import math_normalize, math_parse

if typing.TYPE_CHECKING:
  import sympy

REL_TOL = 1e-6
ABS_TOL = 1e-9


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
  if len(parts := math_normalize.split_top(s, "\\cup")) > 1:
    return "unordered", "cup", parts
  if s.startswith("[[") and _encloses(s):
    rows = math_normalize.split_top(s[1:-1], ",")
    if all(row[:1] == "[" and row[-1:] == "]" and _encloses(row) for row in rows):
      return "matrix", "", rows
  if len(s) >= 2 and s[0] in "([{" and s[-1] in ")]}" and _encloses(s):
    items = math_normalize.split_top(s[1:-1], ",")
    if s[0] == "{":
      return "unordered", "", items
    if len(items) > 1:
      return "ordered", s[0] + s[-1], items
  if len(items := math_normalize.split_top(s, ",")) > 1:
    return "unordered", "", items
  return "scalar", "", [s]


def _values_close(a: sympy.Expr, b: sympy.Expr, *, rel_tol: float, abs_tol: float) -> bool:
  """Exact for two rationals, else |a - b| <= max(rel_tol * max(|a|, |b|), abs_tol)."""
  import sympy  # noqa: PLC0415 -- imported at the first parse (math_parse: Import).

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
  import sympy  # noqa: PLC0415 -- imported at the first parse (math_parse: Import).

  try:
    ea, eb = math_parse.parse(a), math_parse.parse(b)
  except math_parse.ParseError:
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
  import sympy  # noqa: PLC0415 -- imported at the first parse (math_parse: Import).

  try:
    (l1, r1), (l2, r2) = (map(math_parse.parse, a.split("=")), map(math_parse.parse, b.split("=")))
  except (math_parse.ParseError, ValueError):
    return False
  try:
    ratio = sympy.simplify((l1 - r1) / (l2 - r2))
    return bool(ratio.is_number and ratio.is_finite and ratio != 0)
  except Exception:  # noqa: BLE001 -- as in _expressions_equal.
    return False


def _scalars_equal(a: str, b: str, *, rel_tol: float, abs_tol: float) -> bool:
  if a.count("=") == b.count("=") == 1 and _equations_equal(a, b):
    return True  # Equations as written ("y=2x+1", "2y=4x+2"), before a left side goes.
  a, b = math_normalize.strip_variable(a), math_normalize.strip_variable(b)
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
    rows_a = [math_normalize.split_top(row[1:-1], ",") for row in items_a]
    rows_b = [math_normalize.split_top(row[1:-1], ",") for row in items_b]
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
    return bool(math_parse.parse(normalized).is_Integer)
  except math_parse.ParseError:
    return False


def is_equiv(pred: str, gold: str, *, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
  """True if the answers are equivalent: strings, structure, exact or within tolerance.

  Rules (module docstring): after ``normalize``, equal strings; else same structure and
  equivalent items; scalars: two rationals exactly equal, other constants within
  max(rel_tol * max(|a|, |b|), abs_tol), expressions with ``simplify(a - b) == 0``. A
  percent sign on exactly one side also tries that side divided by 100 when the other
  side is not an integer (50% == 0.5, but 5000% != 50). Two answers that both hold an
  "=" are also compared with their one-letter left sides kept, so that equations with
  the same solutions match (y=2x+1 == 2y=4x+2; normalising alone drops "y="). No timeout.
  """
  p, g = math_normalize.normalize(pred), math_normalize.normalize(gold)
  candidates = [(p, g)]
  if "=" in pred and "=" in gold:  # Also as equations with their left sides: y=2x+1, 2y=4x+2.
    keep = functools.partial(math_normalize.normalize, keep_variable=True)
    candidates.append((keep(pred), keep(gold)))
  if _has_percent(pred) != _has_percent(gold):
    if _has_percent(pred) and not _is_integer(g):
      candidates.append((f"({p})/100", g))
    elif _has_percent(gold) and not _is_integer(p):
      candidates.append((p, f"({g})/100"))
  return any(_normalized_equal(x, y, rel_tol=rel_tol, abs_tol=abs_tol) for x, y in candidates)
