"""Problem datasets through TFDS, written as array_record and read without TensorFlow.

Builders (``tfds.core.GeneratorBasedBuilder`` subclasses, all ``file_format="array_record"``):

  * ``Gsm8k`` ("gsm8k"): splits train, test. Official ``train.jsonl``/``test.jsonl``
    (``question``, ``answer``); the solution ends with ``#### N`` and the answer is N with
    thousands separators removed.
  * ``HendrycksMath`` ("math"): config "all" has splits train, test (the official
    ``MATH/{split}/{subject}/*.json`` tree, answer = the last ``\\boxed{...}`` of the
    solution) and math500 (PRM800K's ``math_splits/test.jsonl``, answer field given);
    config "math500" has only the math500 split, for when the MATH tarball is unreachable.
  * ``ProblemFiles``: your own JSONL or Parquet files, with the question/answer (and
    optional id/solution) fields named in a ``ProblemFilesConfig``. Built under the
    project cache (``default_cache_dir()``: ``$GRPO_JAX_CACHE/datasets``, else
    ``~/.cache/grpo_jax/datasets``) unless ``data_dir`` is given, in a directory keyed on
    the files' content (``content_key``): an edited or different file set builds a new
    dataset, the same bytes reuse the earlier build.

The official files are read from the manual directory when it holds them, else downloaded
from the official URLs; their data_dir defaults to TFDS's. Records that cannot be parsed
(bad JSON, invalid UTF-8, missing fields) are skipped, counted and reported:
``skipped(builder)`` (saved in the dataset's ``metadata.json``) and a warning log.
``prepare`` logs which directory it used and whether it built or reused the data.

TensorFlow is not needed: building uses ``download_and_prepare`` with the array_record
writer, downloads use ``dl_manager.download`` (requests), the MATH tarball is read with
``tarfile`` (TFDS's extractor and ``iter_archive`` go through ``tf.io.gfile``), and reading
uses ``builder.as_data_source(split)`` (array_record random access and numpy decoding),
never ``as_dataset``/``tfds.load`` (which build a ``tf.data`` pipeline).

Iteration (``iterate``) is a pure function of (seed, global index): global index i is
record ``permutation(n, seed, epoch=i // n)[i % n]``, and host h of P takes the global
indices h, h + P, h + 2P, ... so the hosts' streams interleave into the single-host stream
whatever P is, and resuming at a global index is exact.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import tarfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from grpo_jax.infra import registry
from grpo_jax.verifiers import math_verify

GSM8K_URLS = {
  "train": "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/train.jsonl",
  "test": "https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl",
}
MATH_URL = "https://people.eecs.berkeley.edu/~hendrycks/MATH.tar"
MATH500_URL = "https://raw.githubusercontent.com/openai/prm800k/main/prm800k/math_splits/test.jsonl"
MATH_SUBJECTS = (
  "algebra",
  "counting_and_probability",
  "geometry",
  "intermediate_algebra",
  "number_theory",
  "prealgebra",
  "precalculus",
)
# Keys of skipped records kept in the metadata and the log (the count is always exact).
MAX_REPORTED_SKIPS = 100
# The project cache root; user-file datasets are built under its datasets/ folder.
CACHE_ENV = "GRPO_JAX_CACHE"
_HASH_CHUNK = 1 << 20  # Files are hashed in 1 MiB reads, never loaded whole.


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
  skips: tuple[Skip, ...]  # The first MAX_REPORTED_SKIPS of them.


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _features() -> tfds.features.FeaturesDict:
  text = tfds.features.Text
  names = ("id", "question", "answer", "solution", "source", "subject")
  return tfds.features.FeaturesDict({**{k: text() for k in names}, "level": np.int32})


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

  Lines may be bytes (as ``_read_lines`` gives them): one that is not UTF-8 is a Skip.
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


# ----------------------------------------------------------------------------
# Builders
# ----------------------------------------------------------------------------


class _ProblemBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared features, array_record default, duplicate-id and malformed-record bookkeeping.

  Builders skip TFDS's global registry so their names cannot clash with TFDS's own
  datasets or with a module imported twice; construct them directly or with ``get``.
  """

  # 1.1.0: records are stored in file order (disable_shuffling); 1.0.0 stored them in
  # TFDS's key-hash order, so "the first N test problems" were not the file's first N.
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.1.0": "Records in file order.", "1.0.0": "Initial release."}
  HOMEPAGE = ""
  # TFDS 4.9.10 infers `code_path` through the `importlib_resources` backport, which it only
  # declares for Python < 3.9; this module's file is the same answer without it.
  code_path = epath.Path(__file__)

  def __init__(self, *, file_format: str = "array_record", **kwargs):
    super().__init__(file_format=file_format, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    # Not `dataset_info_from_configs`: it reads README/CITATIONS from the module's folder.
    return tfds.core.DatasetInfo(
      builder=self,
      description=self.__doc__,
      features=_features(),
      homepage=self.HOMEPAGE,
      metadata=tfds.core.MetadataDict(),
      disable_shuffling=True,  # File order: a split's first N records are the file's first N.
    )

  def _generate_examples(self, items: Iterable[Problem | Skip], split: str):
    """Yields (id, features); records skips once the split's stream is exhausted."""
    seen, skips = set(), []
    for item in items:
      if isinstance(item, Problem) and item.id in seen:
        item = Skip(item.id, "duplicate id")
      if isinstance(item, Skip):
        skips.append(item)
        continue
      seen.add(item.id)
      yield item.id, dataclasses.asdict(item)
    _record_skips(self, split, skips)


def _record_skips(builder: tfds.core.DatasetBuilder, split: str, skips: list[Skip]) -> None:
  kept = [dataclasses.asdict(s) for s in skips[:MAX_REPORTED_SKIPS]]
  builder.info.metadata.setdefault("skipped", {})[split] = {"count": len(skips), "skips": kept}
  if skips:
    logging.warning(
      "%s/%s: skipped %d malformed records: %s",
      builder.name,
      split,
      len(skips),
      "; ".join(f"{s.key} ({s.reason})" for s in skips[:MAX_REPORTED_SKIPS]),
    )


def skipped(builder: tfds.core.DatasetBuilder) -> dict[str, SkipReport]:
  """Per split, the malformed records skipped when the dataset was built."""
  report = builder.info.metadata.get("skipped", {})
  return {
    split: SkipReport(r["count"], tuple(Skip(**s) for s in r["skips"]))
    for split, r in report.items()
  }


def _manual_dir(dl_manager) -> epath.Path | None:
  """The manual directory, or None when it does not exist or is empty."""
  try:
    return dl_manager.manual_dir
  except AssertionError:  # TFDS's way of saying "missing or empty".
    return None


def _fetch(dl_manager, urls: Mapping[str, str], *, expected: Sequence[str]) -> dict:
  """Downloads urls; a failure says which files to put in the manual directory instead."""
  try:
    return dl_manager.download(dict(urls))
  except Exception as err:
    raise FileNotFoundError(
      f"Could not download {sorted(urls.values())} ({type(err).__name__}: {err}). Without "
      f"network, put the official files {list(expected)} in a manual directory and pass it "
      "(datasets.prepare(builder, manual_dir=...) or DownloadConfig(manual_dir=...))."
    ) from err


def _official_files(dl_manager, urls: Mapping[str, str], *, names: Mapping[str, str]) -> dict:
  """Per key, the manual file ``names[key]`` when the manual dir has all of them, else a download.

  A manual directory holding only some of the files is an error naming the missing ones.
  """
  manual = _manual_dir(dl_manager)
  present = {k: manual / n for k, n in names.items() if manual and (manual / n).exists()}
  if present and len(present) < len(names):
    missing = sorted(n for k, n in names.items() if k not in present)
    raise FileNotFoundError(
      f"Manual directory {manual} lacks {missing}; expected all of {sorted(names.values())}."
    )
  return present or _fetch(dl_manager, urls, expected=sorted(names.values()))


def _record_manual_files(builder: tfds.core.DatasetBuilder, dl_manager, paths) -> None:
  """Saves the sha256 of the paths that are in the manual directory (by their path there)
  in the metadata, so that ``prepare`` rebuilds when one of them changes."""
  if (manual := _manual_dir(dl_manager)) is None:
    return
  hashes = {}
  for path in map(epath.Path, paths):
    if path.is_relative_to(manual):
      hashes[str(path.relative_to(manual))] = file_sha256(path)
  if hashes:
    builder.info.metadata["manual_files"] = hashes


def _changed_manual_files(builder: tfds.core.DatasetBuilder, manual_dir) -> list[str]:
  """The manual files a prepared dataset was built from whose bytes differ now."""
  stored = builder.info.metadata.get("manual_files") or {}
  paths = {name: epath.Path(manual_dir) / name for name in stored}
  return sorted(
    name for name, sha in stored.items() if paths[name].exists() and file_sha256(paths[name]) != sha
  )


def _read_lines(path) -> Iterator[bytes]:
  """The file's lines as bytes, split at b"\\n" only (JSON Lines), streamed.

  Decoding is per line (``_json_objects``), so one bad byte skips one record, and a
  U+2028 inside a JSON string does not split its line as ``str.splitlines`` would.
  """
  with epath.Path(path).open("rb") as f:
    yield from f


class Gsm8k(_ProblemBuilder):
  """GSM8K (Cobbe et al. 2021): grade-school math word problems with numeric answers."""

  name = "gsm8k"
  HOMEPAGE = "https://github.com/openai/grade-school-math"
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Put the official train.jsonl and test.jsonl (grade_school_math/data/ of "
    "https://github.com/openai/grade-school-math) in the manual directory."
  )

  def _split_generators(self, dl_manager):
    names = {split: f"{split}.jsonl" for split in GSM8K_URLS}
    files = _official_files(dl_manager, GSM8K_URLS, names=names)
    _record_manual_files(self, dl_manager, files.values())
    return {
      split: self._generate_examples(
        parse_gsm8k(_read_lines(files[split]), file_name=names[split]), split
      )
      for split in GSM8K_URLS
    }


def _math_tree_files(root: epath.Path, split: str) -> Iterator[tuple[str, bytes]]:
  """(key ``split/subject/file.json``, bytes) for every problem file of one split, sorted."""
  split_dir = root / split
  if not split_dir.is_dir():
    raise FileNotFoundError(
      f"{split_dir} does not exist; expected the official layout "
      f"MATH/{{train,test}}/{{{','.join(MATH_SUBJECTS)}}}/*.json under {root.parent}."
    )
  for path in sorted(split_dir.glob("*/*.json")):
    yield f"{split}/{path.parent.name}/{path.name}", path.read_bytes()


def _math_tar_files(tar_path, split: str) -> Iterator[tuple[str, bytes]]:
  """Like ``_math_tree_files`` from the official MATH.tar, read with tarfile (no TF)."""
  pattern = re.compile(rf"(?:.*/)?MATH/({split}/[^/]+/[^/]+\.json)")
  with epath.Path(tar_path).open("rb") as f, tarfile.open(fileobj=f) as tar:
    members = [(m, pattern.fullmatch(m.name)) for m in tar.getmembers() if m.isfile()]
    for member, found in sorted((x for x in members if x[1]), key=lambda x: x[1].group(1)):
      yield found.group(1), tar.extractfile(member).read()


def _math_reader(dl_manager):
  """(split -> (key, bytes) iterator, the tarball's path or None): from manual MATH/, else
  manual MATH.tar, else a download."""
  manual = _manual_dir(dl_manager)
  if manual and (manual / "MATH").is_dir():
    return (lambda split: _math_tree_files(manual / "MATH", split)), None
  if manual and (manual / "MATH.tar").exists():
    tar = manual / "MATH.tar"
  else:
    tar = _fetch(dl_manager, {"tar": MATH_URL}, expected=["MATH/ (or MATH.tar)"])["tar"]
  return (lambda split: _math_tar_files(tar, split)), tar


class HendrycksMath(_ProblemBuilder):
  """MATH (Hendrycks et al. 2021) and MATH-500 (Lightman et al. 2023, PRM800K)."""

  name = "hendrycks_math"
  HOMEPAGE = "https://github.com/hendrycks/math"
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name="all", description="Splits train, test and math500."),
    tfds.core.BuilderConfig(name="math500", description="Only the math500 split."),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Put the official MATH tree (MATH/{train,test}/<subject>/*.json, or MATH.tar itself) "
    "and PRM800K's math_splits/test.jsonl (as math_splits/test.jsonl) in the manual directory."
  )

  def _split_generators(self, dl_manager):
    files = _official_files(
      dl_manager, {"math500": MATH500_URL}, names={"math500": "math_splits/test.jsonl"}
    )
    parsed = parse_math500(_read_lines(files["math500"]), file_name="math_splits/test.jsonl")
    generators = {"math500": self._generate_examples(parsed, "math500")}
    read = [files["math500"]]
    if self.builder_config.name == "all":
      reader, tar = _math_reader(dl_manager)
      read += [tar] if tar else []  # A MATH/ tree (12,500 files) is not hashed.
      for split in ("train", "test"):
        items = (parse_math_file(t, key=k) for k, t in reader(split))
        generators[split] = self._generate_examples(items, split)
    _record_manual_files(self, dl_manager, read)
    return generators


@dataclasses.dataclass(eq=False, kw_only=True)
class ProblemFilesConfig(tfds.core.BuilderConfig):
  """A user dataset: ``files`` maps split -> JSONL/Parquet path(s); ``fields`` names columns.

  ``name`` names the dataset (it is the records' ``source``). ``ProblemFiles`` stores it
  as ``<name>-<key>`` in its data_dir, ``key`` the first digits of ``content_key(config)``
  (a sha256 of the files' bytes, their names and order per split, the fields and the
  builder version): an edited file or another file set builds a new dataset, and the same
  bytes under the same file names reuse the earlier build, from any directory. Reading
  data built earlier needs only the name, ``ProblemFilesConfig(name="mine")``: the latest
  build of "mine" in the data_dir.
  """

  files: Mapping[str, str | Sequence[str]] = dataclasses.field(default_factory=dict)
  fields: Fields | None = None
  # Set by ProblemFiles (the name then ends with "-" + its first KEY_DIGITS digits).
  content_key: str = ""

  @property
  def source(self) -> str:
    """The dataset's name as the user gave it (``name`` without the key suffix)."""
    if not self.content_key:
      return self.name
    return self.name.removesuffix(f"-{self.content_key[:KEY_DIGITS]}")


KEY_DIGITS = 16  # Hex digits of the content key in a user dataset's directory name.


def default_cache_dir() -> epath.Path:
  """Where user-file datasets are built when no data_dir is given: ``$GRPO_JAX_CACHE/datasets``,
  else ``$XDG_CACHE_HOME/grpo_jax/datasets``, else ``~/.cache/grpo_jax/datasets``."""
  if root := os.environ.get(CACHE_ENV):
    return epath.Path(root).expanduser() / "datasets"
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return epath.Path(cache) / "grpo_jax" / "datasets"


def _paths(paths: str | Sequence[str]) -> list[str]:
  return [str(paths)] if isinstance(paths, (str, os.PathLike)) else [str(p) for p in paths]


def file_sha256(path: epath.PathLike) -> str:
  """The sha256 (hex) of a file's bytes, read in 1 MiB chunks."""
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"Dataset file {path} does not exist.")
  digest = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(_HASH_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def content_key(config: ProblemFilesConfig, *, version: str | None = None) -> str:
  """The sha256 (hex) of what a ``ProblemFiles`` build depends on.

  Per split, each file's name and sha256 in the given order (records are stored in file
  order, and ids default to ``file:line``); the fields; the builder version. Not the
  directories: identical files under the same names elsewhere give the same key.
  """
  spec = {
    "splits": {
      split: [[epath.Path(p).name, file_sha256(p)] for p in _paths(paths)]
      for split, paths in config.files.items()
    },
    "fields": dataclasses.asdict(config.fields) if config.fields else None,
    "version": str(version or ProblemFiles.VERSION),
  }
  return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def _builds(data_dir: epath.PathLike, name: str) -> list[epath.Path]:
  """The prepared ``ProblemFiles`` datasets named ``name`` in data_dir, oldest first."""
  root = epath.Path(data_dir) / ProblemFiles.name
  if not root.is_dir():
    return []
  pattern = re.compile(rf"{re.escape(name)}-[0-9a-f]{{{KEY_DIGITS}}}")
  found = [
    info.parent
    for d in root.iterdir()
    if pattern.fullmatch(d.name)
    and (info := d / str(ProblemFiles.VERSION) / "dataset_info.json").exists()
  ]
  return sorted(found, key=lambda d: ((d / "dataset_info.json").stat().mtime, str(d)))


def _keyed_config(config, data_dir: epath.PathLike):
  """The config under its content-keyed name; a name-only one under its latest build's."""
  if isinstance(config, str):
    config = ProblemFilesConfig(name=config)
  if not isinstance(config, ProblemFilesConfig) or config.content_key:
    return config  # None (an error when preparing), or keyed already (e.g. unpickled).
  if config.files:
    key = content_key(config)
    return dataclasses.replace(config, name=f"{config.name}-{key[:KEY_DIGITS]}", content_key=key)
  if not (builds := _builds(data_dir, config.name)):
    return config  # Data built by name only (before content keys), or nothing to read.
  latest = builds[-1].parent.name
  if len(builds) > 1:
    logging.info(
      "problem_files %r: reading the latest of %d builds, %s", config.name, len(builds), builds[-1]
    )
  return dataclasses.replace(config, name=latest, content_key=latest.rsplit("-", 1)[1])


def _parse_user_file(path: str, *, fields: Fields, source: str) -> Iterator[Problem | Skip]:
  if not epath.Path(path).exists():
    raise FileNotFoundError(f"Dataset file {path} does not exist.")
  if path.endswith(".parquet"):
    return parse_parquet(path, fields=fields, source=source)
  if path.endswith((".jsonl", ".json")):
    return parse_jsonl(_read_lines(path), path=path, fields=fields, source=source)
  raise ValueError(f"{path}: expected a .jsonl, .json (JSON lines) or .parquet file.")


class ProblemFiles(_ProblemBuilder):
  """A user's problems from JSONL or Parquet files, described by a ``ProblemFilesConfig``.

  ``data_dir`` defaults to ``default_cache_dir()``; the config is stored under its
  content-keyed name (``ProblemFilesConfig``), so changed files never reuse stale data.
  """

  name = "problem_files"

  def __init__(self, *, data_dir: epath.PathLike | None = None, config=None, **kwargs):
    data_dir = default_cache_dir() if data_dir is None else data_dir
    super().__init__(data_dir=data_dir, config=_keyed_config(config, data_dir), **kwargs)

  def _split_generators(self, dl_manager):
    config = self.builder_config
    if not isinstance(config, ProblemFilesConfig) or not config.files or config.fields is None:
      raise ValueError("ProblemFiles needs config=ProblemFilesConfig(name, files=..., fields=...).")
    files = {split: _paths(paths) for split, paths in config.files.items()}
    self.info.metadata.update(content_key=config.content_key, files=files)
    generators = {}
    for split, paths in files.items():
      items = (
        item
        for path in paths
        for item in _parse_user_file(path, fields=config.fields, source=config.source)
      )
      generators[split] = self._generate_examples(items, split)
    return generators


REGISTRY: registry.Registry[type[tfds.core.DatasetBuilder]] = registry.Registry("dataset")
REGISTRY.register("gsm8k")(Gsm8k)
REGISTRY.register("math")(HendrycksMath)
REGISTRY.register("problem_files")(ProblemFiles)


def get(
  name: str, *, data_dir: epath.PathLike | None = None, config=None
) -> tfds.core.DatasetBuilder:
  """The builder registered as ``name`` for ``data_dir``.

  ``data_dir`` None: TFDS's default directory for "gsm8k" and "math", ``default_cache_dir()``
  for "problem_files". ``config``: "all" or "math500" for "math"; a ``ProblemFilesConfig``
  (or a name, to read its latest build) for "problem_files".
  """
  return REGISTRY.get(name)(data_dir=data_dir, config=config)


def prepare(
  builder: tfds.core.DatasetBuilder, *, manual_dir: epath.PathLike | None = None
) -> tfds.core.DatasetBuilder:
  """Builds the array_record files once (a no-op when they exist); returns the builder.

  Logs the directory and whether the data was built or reused; a user dataset whose files
  changed since an earlier build of the same name is logged (WARNING) as rebuilt. An
  official dataset built from files in ``manual_dir`` (except a MATH/ tree) is rebuilt in
  place when one of them changed since (WARNING).
  """
  tfds.disable_progress_bar()  # Its bars would interleave with the trainer's progress line.
  reused = builder.is_prepared()
  config = builder.builder_config
  earlier, changed = [], []
  if not reused and isinstance(config, ProblemFilesConfig) and config.content_key:
    earlier = [d for d in _builds(builder.data_dir_root, config.source) if d != builder.data_path]
  if reused and manual_dir is not None:
    changed = _changed_manual_files(builder, manual_dir)
  mode = tfds.download.GenerateMode
  printed = io.StringIO()  # TFDS prints "Downloading and preparing..." even from manual files.
  with contextlib.redirect_stdout(printed):
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
        manual_dir=manual_dir,
        download_mode=mode.REUSE_CACHE_IF_EXISTS if changed else mode.REUSE_DATASET_IF_EXISTS,
      )
    )
  if printed.getvalue().strip():
    logging.info("TFDS: %s", " ".join(printed.getvalue().split()))
  name = builder.info.full_name
  if changed:
    note = (
      f"Dataset {name}: the manual files {changed} changed since it was built, so it was "
      f"rebuilt in {builder.data_dir}."
    )
    logging.warning(note)
  elif reused:
    note = f"Dataset {name}: reused the data built earlier in {builder.data_dir}"
    logging.info(note)
  elif earlier:
    note = (
      f"Dataset {name}: the files differ from those of the earlier build in {earlier[-1]}, so "
      f"it was rebuilt in {builder.data_dir} (earlier builds stay until you delete them)."
    )
    logging.warning(note)
  else:
    note = f"Dataset {name}: built in {builder.data_dir}"
    logging.info(note)
  builder.grpo_jax_note = note  # Which cache this run reads (the trainer logs it).
  return builder


# ----------------------------------------------------------------------------
# Reading and iteration
# ----------------------------------------------------------------------------


class ProblemSource(collections.abc.Sequence):
  """Random access to one split's Problems (array_record via ``as_data_source``, no TF)."""

  def __init__(self, data_source: Sequence[Mapping[str, Any]]):
    self._source = data_source

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> Problem:
    if not isinstance(index, (int, np.integer)):
      raise TypeError(f"ProblemSource takes an int index, got {type(index).__name__}.")
    n = len(self)
    if not -n <= index < n:
      raise IndexError(f"Index {index} out of range for {n} problems.")
    return Problem.from_example(self._source[int(index) % n])


def problems(builder: tfds.core.DatasetBuilder, split: str) -> ProblemSource:
  """One prepared split as a Sequence of Problems."""
  if split not in builder.info.splits:
    raise ValueError(
      f"{builder.name} has no split {split!r} in {builder.data_dir}; "
      f"splits: {sorted(builder.info.splits)} (was it prepared?)."
    )
  return ProblemSource(builder.as_data_source(split))


_GAMMA = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x) -> np.ndarray:
  """SplitMix64's output for state x, elementwise on uint64 (Steele et al. 2014).

  A fixed bijective mix written out here, so the data order cannot change with a numpy
  or jax version. ``splitmix64(0) == 0xE220A8397B1DCDAF`` (Vigna's splitmix64.c).
  """
  z = np.atleast_1d(np.asarray(x, dtype=np.uint64)) + _GAMMA
  z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return z ^ (z >> np.uint64(31))


def permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
  """The record order of one epoch: indices 0..n-1 sorted by splitmix64 keys of (seed, epoch).

  key_j = splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ j); splitmix64 is a bijection,
  so keys are distinct and the order is a pure function of (n, seed, epoch).
  """
  if not 0 <= seed < 2**64 or epoch < 0:
    raise ValueError(f"Expected 0 <= seed < 2**64 and epoch >= 0, got {seed=}, {epoch=}.")
  stream = splitmix64(splitmix64(seed) ^ np.uint64(epoch))
  keys = splitmix64(stream ^ np.arange(n, dtype=np.uint64))
  return np.argsort(keys, kind="stable")


def record_index(index: int, *, n: int, seed: int, shuffle: bool = True) -> int:
  """The record at global stream position ``index``: ``perm(seed, index // n)[index % n]``."""
  if n <= 0 or index < 0:
    raise ValueError(f"Expected n > 0 and index >= 0, got {n=}, {index=}.")
  epoch, position = divmod(index, n)
  return int(permutation(n, seed=seed, epoch=epoch)[position]) if shuffle else position


def positions(
  n: int,
  *,
  seed: int,
  process_index: int,
  process_count: int,
  start: int = 0,
  num_epochs: int | None = None,
  shuffle: bool = True,
) -> Iterator[tuple[int, int]]:
  """(global index, record index) for this host: global indices i >= start, i % P == h.

  Endless unless ``num_epochs`` is set (then it stops before global index num_epochs * n).
  Equal to ``record_index`` at every position, computing one permutation per epoch.
  """
  if n <= 0:
    raise ValueError(f"Cannot iterate over an empty source (n={n}).")
  if not 0 <= process_index < process_count or start < 0:
    raise ValueError(
      f"Expected 0 <= process_index < process_count and start >= 0, got "
      f"{process_index=}, {process_count=}, {start=}."
    )
  i = start + (process_index - start) % process_count
  perm, perm_epoch = np.arange(n), None
  while num_epochs is None or i < num_epochs * n:
    epoch, position = divmod(i, n)
    if shuffle and epoch != perm_epoch:
      perm, perm_epoch = permutation(n, seed=seed, epoch=epoch), epoch
    yield i, int(perm[position])
    i += process_count


def iterate(
  source: Sequence[Problem],
  *,
  seed: int,
  start: int = 0,
  process_index: int | None = None,
  process_count: int | None = None,
  num_epochs: int | None = None,
  shuffle: bool = True,
) -> Iterator[Problem]:
  """This host's share of the seeded, epoch-shuffled stream of ``source``, from ``start``.

  ``start`` is a global index (records consumed by all hosts together), so resuming a run
  that has drawn k records in total is ``iterate(..., start=k)``. Hosts default to
  ``jax.process_index()`` of ``jax.process_count()``.
  """
  process_index = jax.process_index() if process_index is None else process_index
  process_count = jax.process_count() if process_count is None else process_count
  for _, j in positions(
    len(source),
    seed=seed,
    process_index=process_index,
    process_count=process_count,
    start=start,
    num_epochs=num_epochs,
    shuffle=shuffle,
  ):
    yield source[j]
