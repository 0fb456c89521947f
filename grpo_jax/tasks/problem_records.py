"""Problem records, and the parsers that turn source files into them (pure: no TFDS).

A ``Problem`` is what the dataset iterator yields; a ``Skip`` is a malformed record (its
key, ``file:line`` or a file path, and why), and a ``SkipReport`` one split's count of them.
The parsers read the official formats and a user's own files record by record, and never
raise on a bad record: it becomes a Skip, so one bad line costs one problem.

  * ``parse_gsm8k``: GSM8K JSONL (``question``, ``answer``); the answer is the text after
    the solution's last ``####`` with thousands separators removed (``gsm8k_answer``).
  * ``parse_math_file``: one MATH json file; the answer is the solution's last
    ``\\boxed{...}`` (``math_verify.last_boxed``).
  * ``parse_math500``: PRM800K's ``math_splits/test.jsonl`` (answer field given).
  * ``parse_jsonl``, ``parse_parquet`` (``parse_user_file`` picks one by extension): a
    user's records, with the question/answer (and optional id/solution) fields named by
    ``Fields``.

The TFDS builders that store these records (``tasks.datasets``) import this module.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from etils import epath

from grpo_jax.verifiers import math_verify

# ----------------------------------------------------------------------------
# Records
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Problem:
  """One problem, as the iterator yields it; ``answer`` is the reference final answer."""

  id: str
  question: str
  answer: str
  solution: str = ""
  source: str = ""  # Dataset name: "gsm8k", "math", "math500" or the user config's name.
  subject: str = ""  # MATH's "type" / MATH-500's "subject"; "" elsewhere.
  level: int = 0  # MATH difficulty 1-5; 0 when unknown.

  @classmethod
  def from_example(cls, example: Mapping[str, Any]) -> Problem:
    """Decodes a TFDS numpy example (text features come back as bytes)."""
    text = {k: _text(example[k]) for k in ("id", "question", "answer", "solution", "source")}
    return cls(**text, subject=_text(example["subject"]), level=int(example["level"]))


@dataclasses.dataclass(frozen=True)
class Skip:
  """A malformed record: its key (file and line, or file path) and why it was skipped."""

  key: str
  reason: str


@dataclasses.dataclass(frozen=True)
class SkipReport:
  """One split's skipped records: the exact count and the first keys with reasons."""

  count: int
  skips: tuple[Skip, ...]  # The first `datasets.MAX_REPORTED_SKIPS` of them.


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# ----------------------------------------------------------------------------
# Answer extraction and parsing (pure)
# ----------------------------------------------------------------------------


def gsm8k_answer(solution: str) -> str | None:
  """The text after the last ``####`` with commas removed ("#### 1,200" -> "1200"), or None."""
  if "####" not in solution:
    return None
  answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
  return answer or None


def _decode(data: str | bytes, *, key: str) -> str | Skip:
  """UTF-8 text, or a Skip saying where the first undecodable byte is."""
  if isinstance(data, str):
    return data
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError as err:
    return Skip(key, f"invalid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start})")


def _json_objects(
  lines: Iterable[str | bytes], *, file_name: str
) -> Iterator[tuple[str, dict | Skip]]:
  """(key, object or Skip) per non-blank line; the key is ``file:line`` (1-based).

  Lines may be bytes (as ``read_lines`` gives them): one that is not UTF-8 is a Skip.
  """
  for line_no, line in enumerate(lines, start=1):
    key = f"{file_name}:{line_no}"
    if isinstance(line := _decode(line, key=key), Skip):
      yield key, line
      continue
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as err:
      yield key, Skip(key, f"not JSON ({err.msg})")
      continue
    yield key, obj if isinstance(obj, dict) else Skip(key, "not a JSON object")


def _missing(obj: Mapping[str, Any], fields: Sequence[str]) -> list[str]:
  return [f for f in fields if f not in obj or obj[f] is None]


def _bad_text(obj: Mapping[str, Any], fields: Sequence[str]) -> str | None:
  """Why the official-format text fields of obj are unusable (missing or not strings), or None."""
  if missing := _missing(obj, fields):
    return f"missing fields {missing}"
  if not_text := [f for f in fields if not isinstance(obj[f], str)]:
    return f"fields {not_text} are not strings"
  return None


def parse_gsm8k(lines: Iterable[str | bytes], *, file_name: str) -> Iterator[Problem | Skip]:
  """Official GSM8K JSONL lines -> Problems (ids ``file:line``), or Skips."""
  for key, obj in _json_objects(lines, file_name=file_name):
    if isinstance(obj, Skip):
      yield obj
    elif bad := _bad_text(obj, ("question", "answer")):
      yield Skip(key, bad)
    elif (answer := gsm8k_answer(obj["answer"])) is None:
      yield Skip(key, "no '#### <answer>' line")
    else:
      yield Problem(key, obj["question"], answer, solution=obj["answer"], source="gsm8k")


def _math_level(level) -> int:
  """MATH's "Level 3" (or MATH-500's 3) -> 3; "Level ?" and the like -> 0."""
  found = re.fullmatch(r"(?:Level\s*)?(\d+)", str(level).strip())
  return int(found.group(1)) if found else 0


def parse_math_file(text: str | bytes, *, key: str) -> Problem | Skip:
  """One official MATH json file (``{problem, level, type, solution}``) -> Problem or Skip."""
  if isinstance(text := _decode(text, key=key), Skip):
    return text
  try:
    obj = json.loads(text)
  except json.JSONDecodeError as err:
    return Skip(key, f"not JSON ({err.msg})")
  if not isinstance(obj, dict):
    return Skip(key, "not a JSON object")
  if bad := _bad_text(obj, ("problem", "solution")):
    return Skip(key, bad)
  if (answer := math_verify.last_boxed(obj["solution"])) is None:
    return Skip(key, "no \\boxed{...} answer in the solution")
  return Problem(
    key,
    obj["problem"],
    answer.strip(),
    solution=obj["solution"],
    source="math",
    subject=str(obj.get("type", "")),
    level=_math_level(obj.get("level", "")),
  )


def parse_math500(lines: Iterable[str | bytes], *, file_name: str) -> Iterator[Problem | Skip]:
  """PRM800K ``math_splits/test.jsonl`` lines -> Problems (id = ``unique_id``), or Skips."""
  for key, obj in _json_objects(lines, file_name=file_name):
    if isinstance(obj, Skip):
      yield obj
    elif bad := _bad_text(obj, ("problem", "solution", "answer", "unique_id")):
      yield Skip(key, bad)
    elif not obj["answer"].strip():
      yield Skip(key, "empty answer")
    else:
      yield Problem(
        obj["unique_id"],
        obj["problem"],
        obj["answer"].strip(),
        solution=obj["solution"],
        source="math500",
        subject=str(obj.get("subject", "")),
        level=_math_level(obj.get("level", "")),
      )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fields:
  """Which fields of a user's records hold the question, answer, and optionally id/solution."""

  question: str
  answer: str
  id: str | None = None
  solution: str | None = None

  def required(self) -> list[str]:
    return [f for f in (self.question, self.answer, self.id, self.solution) if f is not None]


def user_problem(
  row: Mapping[str, Any], *, key: str, fields: Fields, source: str
) -> Problem | Skip:
  """One user record -> Problem; a null/empty question or answer, or a missing field -> Skip."""
  if missing := _missing(row, fields.required()):
    return Skip(key, f"missing fields {missing}")
  question, answer = str(row[fields.question]).strip(), str(row[fields.answer]).strip()
  if not question or not answer:
    return Skip(key, "empty question or answer")
  return Problem(
    str(row[fields.id]) if fields.id else key,
    question,
    answer,
    solution=str(row[fields.solution]) if fields.solution else "",
    source=source,
  )


def _check_fields(present: Sequence[str], *, fields: Fields, path: str, where: str) -> None:
  for name in fields.required():
    if name not in present:
      raise ValueError(
        f"{path}: field {name!r} not found in {where}; fields present: {sorted(present)}. "
        "Set the question/answer/id/solution fields of the ProblemFilesConfig to existing ones."
      )


def parse_jsonl(
  lines: Iterable[str | bytes], *, path: str, fields: Fields, source: str
) -> Iterator[Problem | Skip]:
  """A user's JSONL -> Problems; ids from ``fields.id`` or else ``file:line``.

  The first JSON object must have every configured field (else ValueError naming the file,
  the field and the fields present); later records without one are skipped.
  """
  checked = False
  for key, obj in _json_objects(lines, file_name=epath.Path(path).name):
    if isinstance(obj, Skip):
      yield obj
      continue
    if not checked:
      _check_fields(list(obj), fields=fields, path=path, where=f"its first record ({key})")
      checked = True
    yield user_problem(obj, key=key, fields=fields, source=source)


def parse_parquet(path: str, *, fields: Fields, source: str) -> Iterator[Problem | Skip]:
  """A user's Parquet file -> Problems; ids from ``fields.id`` or else ``file:row`` (0-based)."""
  import pyarrow.parquet as pq  # Only Parquet users pay for the import.

  with epath.Path(path).open("rb") as f:
    parquet = pq.ParquetFile(f)
    _check_fields(parquet.schema_arrow.names, fields=fields, path=path, where="its columns")
    row = 0
    for batch in parquet.iter_batches(columns=fields.required()):
      for record in _parquet_rows(batch):
        key = f"{epath.Path(path).name}:{row}"
        if record is None:
          yield Skip(key, "invalid UTF-8 in a string column")
        else:
          yield user_problem(record, key=key, fields=fields, source=source)
        row += 1


def _parquet_rows(batch) -> list[dict | None]:
  """The batch's rows as dicts; None for a row whose strings are not valid UTF-8."""
  try:
    return batch.to_pylist()
  except UnicodeDecodeError:  # Arrow does not validate strings it reads; one row at a time.
    rows = []
    for i in range(batch.num_rows):
      try:
        rows.append(batch.slice(i, 1).to_pylist()[0])
      except UnicodeDecodeError:
        rows.append(None)
    return rows


def parse_user_file(path: str, *, fields: Fields, source: str) -> Iterator[Problem | Skip]:
  """A user's file -> Problems: Parquet, or JSON lines (``.jsonl`` or ``.json``)."""
  if not epath.Path(path).exists():
    raise FileNotFoundError(f"Dataset file {path} does not exist.")
  if path.endswith(".parquet"):
    return parse_parquet(path, fields=fields, source=source)
  if path.endswith((".jsonl", ".json")):
    return parse_jsonl(read_lines(path), path=path, fields=fields, source=source)
  raise ValueError(f"{path}: expected a .jsonl, .json (JSON lines) or .parquet file.")


def read_lines(path) -> Iterator[bytes]:
  """The file's lines as bytes, split at b"\\n" only (JSON Lines), streamed.

  Decoding is per line (``_json_objects``), so one bad byte skips one record, and a
  U+2028 inside a JSON string does not split its line as ``str.splitlines`` would.
  """
  with epath.Path(path).open("rb") as f:
    yield from f
