"""Hidden tests and the literal values they compare, read in the caller's process.

A test is ``assert <call> == <expected>`` with a literal expected value: numbers,
strings, bytes, None, booleans, and tuples/lists/dicts/sets of them, or
set/frozenset/tuple/list/dict applied to one such literal. The expected value never
leaves the caller; the child only reports the repr of what each call returned, and
`parse_value` reads that repr back with the same restricted evaluator (never ``eval``).

`max_equal_repr` bounds what the caller ever parses: a reported value whose repr is
longer than it cannot equal the expected value, so it is judged wrong unread.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

# Constructors allowed around literals in expected values (and in the child's reprs).
_CONSTRUCTORS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict}
# The longest repr of a number equal to a number whose repr has 1+ characters, divided by
# that length, over the literal types: the float 1e+308 (6 characters) equals an int of
# 309 digits; 0 (1 character) equals (-0-0j) (7). `max_equal_repr` uses 64 (> 309 / 6).
_REPR_FACTOR = 64
_REPR_SLACK = 64  # frozenset(...) around a set (11 characters), and margin.


@dataclasses.dataclass(frozen=True)
class Test:
  """One hidden test: the child evaluates ``call``; the value must equal ``expected``."""

  call: str  # Source of an expression, e.g. "add(2, 3)".
  expected: Any  # A literal value; it never leaves the parent process.
  source: str = ""  # The assert it came from (for messages).


def literal_value(node: ast.expr) -> Any:
  """The value of a literal expression: what ``ast.literal_eval`` accepts, plus
  set/frozenset/tuple/list/dict applied to one literal (or to nothing), at any depth.
  ValueError for anything else."""
  try:
    return _literal(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as e:
    raise ValueError(f"{ast.unparse(node)[:200]!r} is not a literal ({e}).") from None


def _literal(node: ast.expr) -> Any:
  if isinstance(node, ast.Call):
    name = node.func.id if isinstance(node.func, ast.Name) else ""
    if name not in _CONSTRUCTORS or node.keywords or len(node.args) > 1:
      raise ValueError(f"calls other than {sorted(_CONSTRUCTORS)} of one literal")
    return _CONSTRUCTORS[name](*(_literal(arg) for arg in node.args))
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
    return kind(_literal(e) for e in node.elts)
  if isinstance(node, ast.Dict):
    if any(k is None for k in node.keys):
      raise ValueError("** in a dict")
    return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
  return ast.literal_eval(node)


def parse_value(text: str) -> Any:
  """``literal_value`` of an expression's source text (ValueError if it is not one)."""
  try:
    node = ast.parse(text, mode="eval").body
  except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
    raise ValueError(f"{text[:200]!r} is not an expression ({e}).") from None
  return literal_value(node)


def parse_test(source: str) -> Test:
  """``assert <call> == <expected>`` (either side may be the literal; a message after the
  comparison is ignored) as a Test. ValueError, naming the test, for anything else."""
  try:
    tree = ast.parse(source.strip())
  except SyntaxError as e:
    raise ValueError(f"Test {source!r} is not valid Python: {e}.") from None
  shape = "one statement `assert <call> == <literal>`"
  if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
    raise ValueError(f"Test {source!r} is not {shape}.")
  test = tree.body[0].test
  if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
    raise ValueError(f"Test {source!r} is not {shape}: it does not compare with a single ==.")
  left, right = test.left, test.comparators[0]
  for call, expected in ((left, right), (right, left)):
    try:
      return Test(call=ast.unparse(call), expected=literal_value(expected), source=source)
    except ValueError:
      continue
  raise ValueError(
    f"Test {source!r}: neither side of == is a literal (numbers, strings, bytes, None, "
    "booleans, and tuples/lists/dicts/sets of them, or set/frozenset/tuple/list/dict of "
    "one), so the expected value cannot be checked outside the sandbox."
  )


def max_equal_repr(expected: Any) -> int:
  """An upper bound on len(repr(v)) over every literal value v == expected.

  Equal literal values have the same structure (tuples, lists, dicts, strings and bytes
  compare only with their own kind; a set only with a set or frozenset) except that equal
  numbers may differ in type (bool, int, float, complex) and sign of zero, and a set may
  be a frozenset at the top (sets cannot hold sets). Per number the repr grows at most
  309/6-fold (1e+308 as a 309-digit int); separators and brackets are the same. So
  len(repr(v)) <= 64·len(repr(expected)) + 64. tests/test_sandbox.py checks the bound on
  random values and their equal variants."""
  return _REPR_FACTOR * len(repr(expected)) + _REPR_SLACK


class _Unparsable:
  """A reported value that does not parse (e.g. nan, inf): equal to nothing."""

  def __eq__(self, other):
    return False

  __hash__ = None


def reported_value(payload: str) -> Any:
  """The value of a reported repr; a value equal to nothing when it does not parse."""
  try:
    return parse_value(payload)
  except ValueError:
    return _Unparsable()


def equal(value: Any, expected: Any) -> bool:
  try:
    return bool(value == expected)
  except Exception:  # noqa: BLE001 -- e.g. comparing huge nested values.
    return False
