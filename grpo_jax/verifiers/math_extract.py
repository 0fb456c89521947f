"""Answer extraction for the builtin math verifier: the final answer in a completion's text.

``math_verify`` (whose docstring compares its backends) reads answers by these rules when
``backend="builtin"``, and its ``format_reward`` uses them in both backends ("an answer is
there"). The brace matcher ``brace_group`` is shared with ``math_normalize``.

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
"""

from __future__ import annotations

import re


def brace_group(s: str, i: int) -> tuple[str, int] | None:
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
  escaped braces.) `problem_records` takes MATH's gold answers with it too.
  """
  found = None
  for m in _BOX.finditer(text):
    if text.startswith("{", m.end()):
      group = brace_group(text, m.end())
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


def tag_body(text: str, tag: str) -> str | None:
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
    body = tag_body(text, answer_tag)
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
