"""Hidden tests and the literal values they compare, read in the caller's process.

A test is ``assert <call> == <expected>`` with a literal expected value: numbers,
strings, bytes, None, booleans, and tuples/lists/dicts/sets of them, or
set/frozenset/tuple/list/dict applied to one such literal. The expected value never
leaves the caller; the child only reports the repr of what each call returned, and
`parse_value` reads that repr back with the same restricted evaluator (never ``eval``).

`max_equal_repr` bounds what the caller ever parses: a reported value whose repr is
longer than it cannot equal the expected value, so it is judged wrong unread.

Reading a reported value never raises and never recurses deeply (`read_reported`). Python's
parser and ``ast`` walk an expression recursively, so a repr of a few hundred characters
such as ``-------...1`` or ``1+1+...+1`` made them raise RecursionError in the caller (a
row that should have been a 0 became unscorable). Before anything is parsed, one pass over
the payload's tokens (`scan`, the standard ``tokenize``: linear, not recursive) checks
that it is made of what a repr of the literal types holds: numbers, strings, bytes, True,
False, None, set and frozenset calls, brackets, ``,`` and ``:``, and at most two signs and
two operands between separators (a complex number ``(-0-0j)`` is the most a repr has).
Brackets may nest only as deep as a value equal to the expected one can (`max_equal_depth`),
so the parse that follows is bounded in depth as well as in length. A record that fails
any of this, or that the parser still refuses, was not written by the harness: "tampered".
"""

from __future__ import annotations

import ast
import dataclasses
import io
import tokenize
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
    raise ValueError(f"{_source(node)!r} is not a literal ({e}).") from None


def _source(node: ast.expr) -> str:
  """The first 200 characters of a node's source, for a message: unparsing is recursive,
  so a node too deep for it is named by its type (an error path must not raise)."""
  try:
    return ast.unparse(node)[:200]
  except (RecursionError, MemoryError, ValueError):
    return f"<a {type(node).__name__} too deep to show>"


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
  len(repr(v)) <= 64·len(repr(expected)) + 64. tests/verifiers/test_sandbox.py checks the bound on
  random values and their equal variants."""
  return _REPR_FACTOR * len(repr(expected)) + _REPR_SLACK


def max_equal_depth(expected: Any) -> int:
  """An upper bound on the bracket depth of repr(v) over every literal value v ==
  expected: v has expected's structure, so only two levels can be added, a number that is
  complex (``(1+0j)`` for 1) and a set that is a frozenset at the top (``frozenset({1})``)."""
  return _bracket_depth(repr(expected)) + 2


def _bracket_depth(text: str) -> int:
  """The deepest nesting of ([{ in a repr, outside its strings (tokens, so linear)."""
  depth = deepest = 0
  for token in _tokens(text):
    if token.type == tokenize.OP and token.string in _OPENERS:
      depth += 1
      deepest = max(deepest, depth)
    elif token.type == tokenize.OP and token.string in _CLOSERS:
      depth -= 1
  return deepest


# What a repr of the literal types is made of (`scan`).
_OPENERS, _CLOSERS, _SEPARATORS, _SIGNS = "([{", ")]}", (",", ":"), ("+", "-")
_CONSTANTS = frozenset({"True", "False", "None", "set", "frozenset"})
_NONFINITE = frozenset({"inf", "nan", "infj", "nanj"})  # repr(float("inf")), (nan+nanj)...
_OPERANDS = (tokenize.NUMBER, tokenize.STRING, tokenize.NAME)
_IGNORED = (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER)
_MAX_PER_ELEMENT = 2  # Signs, and operands, between two separators: (-0-0j).


class Unreadable(ValueError):
  """A reported record that the harness does not write: the result channel was tampered
  with."""


def _tokens(text: str):
  return tokenize.generate_tokens(io.StringIO(text).readline)


def scan(text: str, *, max_depth: int) -> str:
  """One linear pass over the tokens of a reported repr, before anything parses it:
  "ok" (it may be parsed: bounded in depth), "deep" (its brackets nest deeper than
  `max_depth`, so it equals no expected value: wrong, unread), "nonfinite" (it holds inf
  or nan, which have no literal: it equals nothing, wrong). Raises Unreadable for a token
  or a run of signs or operands that no repr of the literal types has."""
  depth, signs, operands, nonfinite = 0, 0, 0, False
  try:
    for token in _tokens(text):
      kind, word = token.type, token.string
      if kind == tokenize.OP and word in _OPENERS:
        depth, signs, operands = depth + 1, 0, 0
        if depth > max_depth:
          return "deep"
      elif kind == tokenize.OP and word in _CLOSERS:
        depth -= 1
        if depth < 0:
          raise Unreadable(f"an unopened {word!r}")
      elif kind == tokenize.OP and word in _SEPARATORS:
        signs, operands = 0, 0
      elif kind == tokenize.OP and word in _SIGNS:
        signs += 1
      elif kind in _OPERANDS and (kind != tokenize.NAME or word in _CONSTANTS | _NONFINITE):
        operands += 1
        nonfinite |= word in _NONFINITE
      elif kind not in _IGNORED:
        raise Unreadable(f"{tokenize.tok_name[kind]} {word[:40]!r}")
      if signs > _MAX_PER_ELEMENT or operands > _MAX_PER_ELEMENT:
        raise Unreadable(f"more than {_MAX_PER_ELEMENT} signs or operands in one element")
  except (tokenize.TokenError, SyntaxError, ValueError) as e:  # IndentationError too.
    if isinstance(e, Unreadable):
      raise
    raise Unreadable(f"{type(e).__name__} while tokenizing") from None
  return "nonfinite" if nonfinite else "ok"


def read_reported(payload: str, expected: Any) -> tuple[str, Any]:
  """How the caller reads the repr a run reported for a test whose value is `expected`,
  in time linear in its length and without deep recursion; it never raises:

    ("value", v)       the literal value v (compare it with `equal`);
    ("wrong", why)     a value that cannot equal `expected` (longer than `max_equal_repr`,
                       deeper than `max_equal_depth`, or holding inf/nan), left unparsed;
    ("tampered", why)  a record the harness does not write (a token no repr has, a
                       parse the parser refuses).
  """
  if len(payload) > max_equal_repr(expected):
    return "wrong", f"got a value of {len(payload)} characters"
  try:
    shape = scan(payload, max_depth=max_equal_depth(expected))
    if shape == "deep":
      return "wrong", "got a value nested deeper than any equal value"
    if shape == "nonfinite":
      return "wrong", f"got {payload[:200]}"
    return "value", parse_value(payload)
  except Exception as e:  # noqa: BLE001 -- whatever the record made the reader do.
    return "tampered", f"an unreadable value ({_message(e)})"


def _message(error: Exception) -> str:
  try:
    return f"{type(error).__name__}: {str(error)[:120]}"
  except Exception:  # noqa: BLE001 -- a message that cannot be formatted names its type.
    return type(error).__name__


def equal(value: Any, expected: Any) -> bool:
  try:
    return bool(value == expected)
  except Exception:  # noqa: BLE001 -- e.g. comparing huge nested values.
    return False
