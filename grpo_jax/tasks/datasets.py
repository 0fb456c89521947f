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
(bad JSON, invalid UTF-8, missing fields; the parsers are ``problem_records``) are skipped,
counted and reported: ``skipped(builder)`` (saved in the dataset's ``metadata.json``) and a
warning log. ``prepare`` logs which directory it used and whether it built or reused the data.

TensorFlow is not needed: building uses ``download_and_prepare`` with the array_record
writer, downloads use ``dl_manager.download`` (requests), the MATH tarball is read with
``tarfile`` (TFDS's extractor and ``iter_archive`` go through ``tf.io.gfile``), and reading
uses ``builder.as_data_source(split)`` (array_record random access and numpy decoding),
never ``as_dataset``/``tfds.load`` (which build a ``tf.data`` pipeline).

Reading: ``problems(builder, split)`` is a split as a Sequence of ``Problem``; the order it
is drawn in (seeded, shuffled per epoch, split across hosts, resumable) is ``data_order``.
The record types (``Problem``, ``Skip``, ``SkipReport``, ``Fields``) live in
``problem_records`` and are importable from here too, as the types of this module's API.
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

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from etils import epath

from grpo_jax.infra import registry
from grpo_jax.tasks import problem_records
from grpo_jax.tasks.problem_records import Fields, Problem, Skip, SkipReport

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
# Builders
# ----------------------------------------------------------------------------


def _features() -> tfds.features.FeaturesDict:
  text = tfds.features.Text
  names = ("id", "question", "answer", "solution", "source", "subject")
  return tfds.features.FeaturesDict({**{k: text() for k in names}, "level": np.int32})


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
    generators = {}
    for split in GSM8K_URLS:
      lines = problem_records.read_lines(files[split])
      parsed = problem_records.parse_gsm8k(lines, file_name=names[split])
      generators[split] = self._generate_examples(parsed, split)
    return generators


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
    parsed = problem_records.parse_math500(
      problem_records.read_lines(files["math500"]), file_name="math_splits/test.jsonl"
    )
    generators = {"math500": self._generate_examples(parsed, "math500")}
    read = [files["math500"]]
    if self.builder_config.name == "all":
      reader, tar = _math_reader(dl_manager)
      read += [tar] if tar else []  # A MATH/ tree (12,500 files) is not hashed.
      for split in ("train", "test"):
        items = (problem_records.parse_math_file(t, key=k) for k, t in reader(split))
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
        for item in problem_records.parse_user_file(
          path, fields=config.fields, source=config.source
        )
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
# Reading (the order records are drawn in is `data_order`)
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
