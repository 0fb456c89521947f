"""TFDS problem datasets: official-format fixtures, skip reports, TF-free building/reading,
and the seeded, epoch-shuffled, host-sharded iteration."""

import importlib
import importlib.abc
import importlib.machinery
import json
import logging
import pathlib
import sys
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow_datasets as tfds

from grpo_jax.tasks import data_order, datasets, problem_records

FIXTURES = pathlib.Path(__file__).parents[1] / "fixtures" / "data"
USER_FIELDS = datasets.Fields(question="prompt", answer="target", id="uid", solution="rationale")


def _build(name, data_dir, *, manual_dir=None, config=None):
  return datasets.prepare(
    datasets.get(name, data_dir=data_dir, config=config), manual_dir=manual_dir
  )


def _by_id(builder, split):
  return {p.id: p for p in datasets.problems(builder, split)}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


@pytest.fixture(scope="module")
def gsm8k(data_dir):
  return _build("gsm8k", data_dir, manual_dir=FIXTURES / "gsm8k")


@pytest.fixture(scope="module")
def math(data_dir):
  return _build("math", data_dir, manual_dir=FIXTURES / "math")


def _user_config(name, files, fields=USER_FIELDS):
  return datasets.ProblemFilesConfig(name=name, files=files, fields=fields)


# ----------------------------------------------------------------------------
# Answer extraction
# ----------------------------------------------------------------------------


@pytest.mark.parametrize(
  "solution, answer",
  [
    ("48 + 24 = 72.\n#### 72", "72"),
    ("#### 1,200", "1200"),
    ("a #### 1 then\n#### -3.5 ", "-3.5"),
    ("no marker", None),
    ("####   ", None),
  ],
)
def test_gsm8k_answer(solution, answer):
  assert problem_records.gsm8k_answer(solution) == answer


def test_parse_gsm8k_skips_each_kind_of_malformed_line():
  lines = [
    '{"question": "q", "answer": "s\\n#### 4"}',
    "",  # Blank lines are neither records nor skips.
    "[1, 2]",
    '{"question": "q", "answer": 4}',
    "nope",
  ]
  assert list(problem_records.parse_gsm8k(lines, file_name="f.jsonl")) == [
    problem_records.Problem("f.jsonl:1", "q", "4", solution="s\n#### 4", source="gsm8k"),
    problem_records.Skip("f.jsonl:3", "not a JSON object"),
    problem_records.Skip("f.jsonl:4", "fields ['answer'] are not strings"),
    problem_records.Skip("f.jsonl:5", "not JSON (Expecting value)"),
  ]


def test_user_problem_skips_empty_values():
  fields = problem_records.Fields(question="q", answer="a")

  def problem(row):
    return problem_records.user_problem(row, key="k", fields=fields, source="s")

  empty = problem_records.Skip("k", "empty question or answer")
  assert problem({"q": "  ", "a": 3}) == empty
  assert problem({"q": "2 + 1?", "a": 3}) == problem_records.Problem("k", "2 + 1?", "3", source="s")


# ----------------------------------------------------------------------------
# Builders
# ----------------------------------------------------------------------------


def test_gsm8k_records_and_skips(gsm8k):
  train, test = _by_id(gsm8k, "train"), _by_id(gsm8k, "test")
  assert {k: p.answer for k, p in train.items()} == {
    "train.jsonl:1": "72",
    "train.jsonl:2": "10",
    "train.jsonl:4": "1200",  # "#### 1,200"
  }
  assert {k: p.answer for k, p in test.items()} == {"test.jsonl:1": "18", "test.jsonl:2": "3"}
  robe = test["test.jsonl:2"]
  assert robe.question.startswith("A robe takes 2 bolts")
  assert robe.solution.endswith("3 bolts of fabric\n#### 3")
  assert robe.source == "gsm8k"
  report = datasets.skipped(gsm8k)
  assert report["train"].count == 2
  assert [s.key for s in report["train"].skips] == ["train.jsonl:3", "train.jsonl:5"]
  assert report["train"].skips[0].reason.startswith("not JSON")
  assert report["train"].skips[1].reason == "no '#### <answer>' line"
  assert report["test"].skips == (datasets.Skip("test.jsonl:3", "missing fields ['answer']"),)


def test_skip_report_is_saved_with_the_data(gsm8k, data_dir):
  saved = json.loads((pathlib.Path(gsm8k.data_dir) / "metadata.json").read_text())
  assert saved["skipped"]["train"]["count"] == 2
  reopened = datasets.get("gsm8k", data_dir=data_dir)
  assert datasets.skipped(reopened) == datasets.skipped(gsm8k)


def test_skips_are_logged_with_their_keys(tmp_path, caplog):
  with caplog.at_level(logging.WARNING):
    _build("gsm8k", tmp_path, manual_dir=FIXTURES / "gsm8k")
  messages = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
  assert any("gsm8k/train: skipped 2 malformed records" in m for m in messages), messages
  assert any("train.jsonl:3" in m and "train.jsonl:5" in m for m in messages)


def test_math_records_and_skips(math):
  train = _by_id(math, "train")
  assert {k: p.answer for k, p in train.items()} == {
    "train/algebra/1.json": "12",
    "train/counting_and_probability/2.json": r"\dfrac{2}{3}",
    "train/intermediate_algebra/4.json": r"\left(\frac{1}{2}, \frac{3}{4}\right)",
  }
  algebra = train["train/algebra/1.json"]
  assert (algebra.subject, algebra.level, algebra.source) == ("Algebra", 1, "math")
  assert algebra.solution.endswith(r"= \boxed{12}.$$")
  test = _by_id(math, "test")
  assert {k: p.answer for k, p in test.items()} == {
    "test/number_theory/5.json": "10",
    "test/precalculus/6.json": r"\begin{pmatrix} 2 \\ -1 \end{pmatrix}",
  }
  math500 = _by_id(math, "math500")
  assert {k: (p.answer, p.subject, p.level) for k, p in math500.items()} == {
    "test/precalculus/807.json": (r"\left( 3, \frac{\pi}{2} \right)", "Precalculus", 2),
    "test/number_theory/515.json": ("27", "Number Theory", 3),
  }
  assert {p.source for p in math500.values()} == {"math500"}
  report = datasets.skipped(math)
  assert {split: [s.key for s in r.skips] for split, r in report.items()} == {
    "train": ["train/geometry/3.json"],
    "test": ["test/prealgebra/7.json"],
    "math500": ["math_splits/test.jsonl:3"],
  }
  assert report["train"].skips[0].reason == r"no \boxed{...} answer in the solution"


def test_math500_config_needs_only_its_file(tmp_path):
  manual = tmp_path / "manual" / "math_splits"
  manual.mkdir(parents=True)
  (manual / "test.jsonl").write_text((FIXTURES / "math" / "math_splits" / "test.jsonl").read_text())
  builder = _build("math", tmp_path, manual_dir=manual.parent, config="math500")
  assert sorted(builder.info.splits) == ["math500"]
  assert len(datasets.problems(builder, "math500")) == 2


def test_user_jsonl(data_dir):
  config = _user_config("mine", {"train": str(FIXTURES / "user" / "problems.jsonl")})
  builder = _build("problem_files", data_dir, config=config)
  assert _by_id(builder, "train") == {
    "u1": datasets.Problem("u1", "What is 2 + 3?", "5", solution="2 + 3 = 5.", source="mine"),
    "u2": datasets.Problem("u2", "What is 7 * 6?", "42", solution="7 * 6 = 42.", source="mine"),
    "u4": datasets.Problem("u4", "What is 10 - 4?", "6", solution="10 - 4 = 6.", source="mine"),
  }
  assert datasets.skipped(builder)["train"].skips == (
    datasets.Skip("problems.jsonl:3", "missing fields ['target', 'rationale']"),
    datasets.Skip("u1", "duplicate id"),
  )


def test_user_parquet_without_id_field(tmp_path):
  path = tmp_path / "mine.parquet"
  table = {"q": ["1 + 1?", "2 + 2?", "3 + 3?"], "a": [2, None, 6], "extra": [0, 0, 0]}
  pq.write_table(pa.table(table), path)
  fields = datasets.Fields(question="q", answer="a")
  config = _user_config("pq", {"test": str(path)}, fields)
  builder = _build("problem_files", tmp_path / "tfds", config=config)
  assert {k: (p.question, p.answer) for k, p in _by_id(builder, "test").items()} == {
    "mine.parquet:0": ("1 + 1?", "2"),
    "mine.parquet:2": ("3 + 3?", "6"),
  }
  assert datasets.skipped(builder)["test"].skips == (
    datasets.Skip("mine.parquet:1", "missing fields ['a']"),
  )


class _TensorFlowBlocker(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Makes `import tensorflow` fail (and records it) even where TF is installed.

  A finder rather than `sys.modules["tensorflow"] = None`: TFDS and etils take a
  `"tensorflow" in sys.modules` entry to mean that TF is loaded and use it.
  """

  def __init__(self):
    self.imports = []

  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] != "tensorflow":
      return None
    return importlib.machinery.ModuleSpec(name, self)

  def create_module(self, spec):
    self.imports.append(spec.name)
    raise ImportError(f"{spec.name} is blocked by test_datasets.py")

  def exec_module(self, module):
    raise AssertionError("unreachable")


def test_tensorflow_is_never_imported(tmp_path, monkeypatch):
  assert "tensorflow" not in sys.modules
  blocker = _TensorFlowBlocker()
  monkeypatch.setattr(sys, "meta_path", [blocker, *sys.meta_path])
  gsm8k = _build("gsm8k", tmp_path, manual_dir=FIXTURES / "gsm8k")
  math = _build("math", tmp_path, manual_dir=FIXTURES / "math")
  config = _user_config("mine", {"train": str(FIXTURES / "user" / "problems.jsonl")})
  user = _build("problem_files", tmp_path, config=config)
  counts = [len(list(datasets.problems(b, "train"))) for b in (gsm8k, math, user)]
  assert counts == [3, 3, 3]
  assert blocker.imports == []
  assert "tensorflow" not in sys.modules
  with pytest.raises(ImportError, match="blocked"):  # The blocker bites.
    importlib.import_module("tensorflow")
  assert blocker.imports == ["tensorflow"]


# ----------------------------------------------------------------------------
# Manual files, downloads and errors
# ----------------------------------------------------------------------------


def test_missing_manual_file_names_it_and_the_directory(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "train.jsonl").write_text((FIXTURES / "gsm8k" / "train.jsonl").read_text())
  with pytest.raises(FileNotFoundError, match=r"manual lacks \['test.jsonl'\]"):
    _build("gsm8k", tmp_path / "tfds", manual_dir=manual)


def _fake_download(monkeypatch, files):
  requested = []

  def download(self, urls):
    requested.extend(urls.values())
    return {k: files[url] for k, url in urls.items()}

  monkeypatch.setattr(tfds.download.DownloadManager, "download", download)
  return requested


def test_without_manual_files_it_downloads_the_official_urls(tmp_path, monkeypatch):
  tar_path = tmp_path / "MATH.tar"
  with tarfile.open(tar_path, "w") as tar:
    tar.add(FIXTURES / "math" / "MATH", arcname="MATH")
  files = {
    datasets.GSM8K_URLS["train"]: FIXTURES / "gsm8k" / "train.jsonl",
    datasets.GSM8K_URLS["test"]: FIXTURES / "gsm8k" / "test.jsonl",
    datasets.MATH_URL: tar_path,
    datasets.MATH500_URL: FIXTURES / "math" / "math_splits" / "test.jsonl",
  }
  requested = _fake_download(monkeypatch, files)
  gsm8k = _build("gsm8k", tmp_path / "tfds")
  math = _build("math", tmp_path / "tfds")
  assert sorted(requested) == sorted(files)
  assert datasets.GSM8K_URLS["test"].endswith(
    "grade-school-math/master/grade_school_math/data/test.jsonl"
  )
  assert len(datasets.problems(gsm8k, "train")) == 3
  # The tarball gives the same problems as the manual tree.
  assert sorted(_by_id(math, "train")) == [
    "train/algebra/1.json",
    "train/counting_and_probability/2.json",
    "train/intermediate_algebra/4.json",
  ]
  assert [s.key for s in datasets.skipped(math)["test"].skips] == ["test/prealgebra/7.json"]


def test_failed_download_says_which_files_to_provide(tmp_path, monkeypatch):
  def download(self, urls):
    raise ConnectionError("network is unreachable")

  monkeypatch.setattr(tfds.download.DownloadManager, "download", download)
  with pytest.raises(FileNotFoundError, match=r"\['test.jsonl', 'train.jsonl'\].*manual_dir"):
    _build("gsm8k", tmp_path)


def test_unknown_jsonl_field_names_file_field_and_fields_present(tmp_path):
  path = str(FIXTURES / "user" / "problems.jsonl")
  fields = datasets.Fields(question="question", answer="target")
  config = _user_config("bad", {"train": path}, fields)
  expected = (
    r"problems.jsonl: field 'question' not found in its first record \(problems.jsonl:1\); "
    r"fields present: \['prompt', 'rationale', 'target', 'uid'\]"
  )
  with pytest.raises(ValueError, match=expected):
    _build("problem_files", tmp_path, config=config)


def test_unknown_parquet_column_names_file_and_columns(tmp_path):
  path = tmp_path / "x.parquet"
  pq.write_table(pa.table({"q": ["1?"], "a": ["1"]}), path)
  config = _user_config("bad", {"train": str(path)}, datasets.Fields(question="q", answer="ans"))
  with pytest.raises(
    ValueError, match=r"x.parquet: field 'ans' not found in its columns; .*\['a', 'q'\]"
  ):
    _build("problem_files", tmp_path / "tfds", config=config)


def test_problem_source_indexing(gsm8k):
  source = datasets.problems(gsm8k, "test")
  assert source[-1] == source[1] and source[-2] == source[0]
  with pytest.raises(IndexError, match="Index 2 out of range for 2 problems"):
    source[2]


def test_unknown_dataset():
  with pytest.raises(ValueError, match="Unknown dataset 'gsm9k'; valid names"):
    datasets.get("gsm9k")


def test_unknown_split(gsm8k):
  with pytest.raises(ValueError, match=r"no split 'validation'.*\['test', 'train'\]"):
    datasets.problems(gsm8k, "validation")


# ----------------------------------------------------------------------------
# Iteration
# ----------------------------------------------------------------------------

M64 = 2**64 - 1


def _splitmix64_ref(x):
  """Vigna's splitmix64.c next() for state x, on Python ints."""
  z = (x + 0x9E3779B97F4A7C15) & M64
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
  return z ^ (z >> 31)


def test_splitmix64_matches_the_reference():
  assert int(data_order.splitmix64(0)[0]) == 0xE220A8397B1DCDAF
  xs = [0, 1, 12345, 2**63, M64]
  assert [int(v) for v in data_order.splitmix64(np.array(xs, np.uint64))] == [
    _splitmix64_ref(x) for x in xs
  ]


def test_permutation_matches_a_scalar_reference():
  seed, epoch, n = 7, 2, 6
  stream = _splitmix64_ref(_splitmix64_ref(seed) ^ epoch)
  keys = [_splitmix64_ref(stream ^ j) for j in range(n)]
  expected = sorted(range(n), key=keys.__getitem__)
  assert data_order.permutation(n, seed=seed, epoch=epoch).tolist() == expected


def _stream(n, *, seed, count, h=0, p=1, start=0):
  gen = data_order.positions(n, seed=seed, process_index=h, process_count=p, start=start)
  return [next(gen) for _ in range(count)]


def test_each_epoch_is_a_permutation_that_depends_on_seed_and_epoch():
  n = 10
  records = [j for _, j in _stream(n, seed=3, count=3 * n)]
  epochs = [records[e * n : (e + 1) * n] for e in range(3)]
  assert all(sorted(e) == list(range(n)) for e in epochs)
  assert epochs[0] != epochs[1] != epochs[2]
  assert records == [j for _, j in _stream(n, seed=3, count=3 * n)]
  assert records != [j for _, j in _stream(n, seed=4, count=3 * n)]


def test_unshuffled_stream_is_the_record_order():
  gen = data_order.positions(3, seed=0, process_index=0, process_count=1, shuffle=False)
  assert [next(gen)[1] for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


@pytest.mark.parametrize("p", [1, 2, 3])
def test_hosts_interleave_into_the_single_host_stream(p):
  n, total = 7, 35  # 5 epochs; 7 is not a multiple of 2 or 3.
  single = _stream(n, seed=11, count=total)
  per_host = [_stream(n, seed=11, count=-(-(total - h) // p), h=h, p=p) for h in range(p)]
  interleaved = [per_host[i % p][i // p] for i in range(total)]
  assert interleaved == single
  assert [i for i, _ in single] == list(range(total))


@pytest.mark.parametrize("start, h, p", [(0, 0, 1), (12, 0, 1), (12, 1, 3), (13, 2, 3), (5, 0, 2)])
def test_resume_from_a_global_index_is_exact(start, h, p):
  n = 7
  full = _stream(n, seed=5, count=60)
  mine = [x for x in full if x[0] >= start and x[0] % p == h]
  assert _stream(n, seed=5, count=len(mine) - 2, h=h, p=p, start=start) == mine[:-2]
  assert [data_order.record_index(i, n=n, seed=5) for i, _ in mine] == [j for _, j in mine]


def test_num_epochs_ends_the_stream():
  gen = data_order.positions(4, seed=0, process_index=1, process_count=3, num_epochs=2)
  assert [i for i, _ in gen] == [1, 4, 7]


def test_iterate_yields_problems_of_the_source(gsm8k):
  source = datasets.problems(gsm8k, "train")
  got = list(data_order.iterate(source, seed=1, process_index=0, process_count=1, num_epochs=2))
  assert all(isinstance(p, datasets.Problem) for p in got)
  assert (
    sorted(p.id for p in got[:3]) == sorted(p.id for p in got[3:]) == sorted(p.id for p in source)
  )
  order = [data_order.record_index(i, n=3, seed=1) for i in range(6)]
  assert got == [source[j] for j in order]


def test_iteration_rejects_bad_arguments():
  with pytest.raises(ValueError, match="empty source"):
    next(data_order.positions(0, seed=0, process_index=0, process_count=1))
  with pytest.raises(ValueError, match="process_index=2, process_count=2"):
    next(data_order.positions(3, seed=0, process_index=2, process_count=2))
  with pytest.raises(ValueError, match="seed=-1"):
    data_order.permutation(3, seed=-1, epoch=0)


def test_splits_keep_file_order(tmp_path):
  """source[i] is the file's i-th good record (TFDS would otherwise store records in a
  hash order of their keys), so "the first N test problems" means what it says."""
  manual = tmp_path / "manual"
  manual.mkdir()
  line = lambda i: json.dumps({"question": f"q{i}?", "answer": f"work\n#### {i}"})
  for split in ("train", "test"):
    (manual / f"{split}.jsonl").write_text("\n".join(line(i) for i in range(20)) + "\n")
  builder = _build("gsm8k", tmp_path / "data", manual_dir=manual)
  source = datasets.problems(builder, "test")
  assert [source[i].answer for i in range(20)] == [str(i) for i in range(20)]
  assert [source[i].id for i in range(3)] == ["test.jsonl:1", "test.jsonl:2", "test.jsonl:3"]


# ----------------------------------------------------------------------------
# User files: the cache is keyed on their content, under the project cache directory
# ----------------------------------------------------------------------------

SIMPLE_FIELDS = datasets.Fields(question="q", answer="a", id="id")


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """$GRPO_JAX_CACHE and TFDS's global data directory under tmp_path, never the home's."""
  monkeypatch.setenv("GRPO_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path / "tfds_global"))
  return tmp_path / "cache"


def _write_rows(path, rows):
  """A JSONL file of (id, question, answer) rows."""
  path.parent.mkdir(parents=True, exist_ok=True)
  lines = [json.dumps({"id": i, "q": q, "a": a}) for i, q, a in rows]
  path.write_text("".join(f"{line}\n" for line in lines))
  return path


def _simple(files, name="mine", fields=SIMPLE_FIELDS):
  files = {split: [str(p) for p in paths] for split, paths in files.items()}
  return _build("problem_files", None, config=_user_config(name, files, fields))


def _questions(builder, split="train"):
  return [p.question for p in datasets.problems(builder, split)]


def test_an_edited_file_is_rebuilt(cache, tmp_path, caplog):
  path = _write_rows(tmp_path / "p.jsonl", [("a", "1 + 1?", "2"), ("b", "2 + 2?", "4")])
  first = _simple({"train": [path]})
  assert _questions(first) == ["1 + 1?", "2 + 2?"]
  _write_rows(path, [("a", "1 + 1?", "2"), ("b", "3 + 3?", "6")])  # One row edited.
  with caplog.at_level(logging.INFO, logger="absl"):
    second = _simple({"train": [path]})
  assert _questions(second) == ["1 + 1?", "3 + 3?"]
  assert [p.answer for p in datasets.problems(second, "train")] == ["2", "6"]
  assert second.data_dir != first.data_dir
  messages = [r.getMessage() for r in caplog.records]
  assert any("rebuilt" in m and str(second.data_dir) in m for m in messages), messages
  # Loading the edited files again reuses the new build, and says so.
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="absl"):
    third = _simple({"train": [path]})
  assert third.data_dir == second.data_dir and _questions(third) == ["1 + 1?", "3 + 3?"]
  messages = [r.getMessage() for r in caplog.records]
  assert any("reused" in m and str(second.data_dir) in m for m in messages), messages


def test_the_cache_key_is_the_files_content_names_order_splits_and_fields(cache, tmp_path):
  a = _write_rows(tmp_path / "one" / "p.jsonl", [("a", "1 + 1?", "2")])
  b = _write_rows(tmp_path / "two" / "q.jsonl", [("b", "5 - 2?", "3")])
  first = _simple({"train": [a]})
  # The same bytes under the same file name in another directory: the same dataset.
  moved = _write_rows(tmp_path / "elsewhere" / "p.jsonl", [("a", "1 + 1?", "2")])
  assert _simple({"train": [moved]}).data_dir == first.data_dir
  # Anything that changes the records gives another dataset: another file set, another
  # file order (records are stored in file order), another split mapping or fields.
  variants = [
    {"train": [a, b]},
    {"train": [b, a]},
    {"train": [b]},
    {"train": [a], "test": [b]},
  ]
  dirs = {first.data_dir}
  for files in variants:
    dirs.add(_simple(files).data_dir)
  by_answer = datasets.Fields(question="q", answer="a", id=None)
  dirs.add(_simple({"train": [a]}, fields=by_answer).data_dir)
  assert len(dirs) == len(variants) + 2
  assert _questions(_simple({"train": [b, a]})) == ["5 - 2?", "1 + 1?"]
  assert _questions(_simple({"train": [a], "test": [b]}), "test") == ["5 - 2?"]
  # The dataset keeps its name as the records' source.
  assert {p.source for p in datasets.problems(first, "train")} == {"mine"}


def test_user_datasets_are_cached_under_the_project_cache_dir(cache, tmp_path):
  path = _write_rows(tmp_path / "p.jsonl", [("a", "1 + 1?", "2")])
  builder = _simple({"train": [path]})
  assert pathlib.Path(builder.data_dir).is_relative_to(cache / "datasets" / "problem_files")
  assert not (tmp_path / "tfds_global").exists()
  # An explicit data_dir wins.
  config = _user_config("mine", {"train": str(path)}, SIMPLE_FIELDS)
  explicit = _build("problem_files", tmp_path / "mine", config=config)
  assert pathlib.Path(explicit.data_dir).is_relative_to(tmp_path / "mine" / "problem_files")
  assert _questions(explicit) == ["1 + 1?"]


def test_default_cache_dir(monkeypatch, tmp_path):
  monkeypatch.setenv("GRPO_JAX_CACHE", str(tmp_path / "c"))
  assert datasets.default_cache_dir() == tmp_path / "c" / "datasets"
  monkeypatch.delenv("GRPO_JAX_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert datasets.default_cache_dir() == tmp_path / "xdg" / "grpo_jax" / "datasets"
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert datasets.default_cache_dir() == tmp_path / "home" / ".cache" / "grpo_jax" / "datasets"


def test_reading_by_name_only_finds_the_latest_build(cache, tmp_path):
  path = _write_rows(tmp_path / "p.jsonl", [("a", "1 + 1?", "2")])
  _simple({"train": [path]})
  _write_rows(path, [("a", "7 + 1?", "8")])
  built = _simple({"train": [path]})
  reopened = datasets.get("problem_files", config=datasets.ProblemFilesConfig(name="mine"))
  assert reopened.data_dir == built.data_dir and _questions(reopened) == ["7 + 1?"]


def test_a_row_with_invalid_utf8_is_skipped_and_counted(cache, tmp_path):
  path = tmp_path / "p.jsonl"
  good = [json.dumps({"id": i, "q": f"{i} + 1?", "a": "x"}).encode() for i in ("a", "c")]
  bad = b'{"id": "b", "q": "caf\xe9 + 1?", "a": "x"}'  # Latin-1, not UTF-8.
  path.write_bytes(b"\n".join([good[0], bad, good[1]]) + b"\n")
  builder = _simple({"train": [path]})
  assert [p.id for p in datasets.problems(builder, "train")] == ["a", "c"]
  report = datasets.skipped(builder)["train"]
  assert report.count == 1 and report.skips[0].key == "p.jsonl:2"
  assert report.skips[0].reason.startswith("invalid UTF-8")
  saved = json.loads((pathlib.Path(builder.data_dir) / "metadata.json").read_text())
  assert saved["skipped"]["train"]["skips"][0]["key"] == "p.jsonl:2"


def test_official_files_with_invalid_utf8_skip_the_record(tmp_path):
  manual = tmp_path / "manual"
  manual.mkdir()
  for split in ("train", "test"):
    text = (FIXTURES / "gsm8k" / f"{split}.jsonl").read_bytes()
    (manual / f"{split}.jsonl").write_bytes(text.replace(b"Natalia", b"Nat\xe1lia", 1))
  gsm8k = _build("gsm8k", tmp_path / "tfds", manual_dir=manual)
  assert sorted(_by_id(gsm8k, "train")) == ["train.jsonl:2", "train.jsonl:4"]
  skips = datasets.skipped(gsm8k)["train"].skips
  assert skips[0] == datasets.Skip("train.jsonl:1", skips[0].reason)
  assert skips[0].reason.startswith("invalid UTF-8")
  tree = tmp_path / "math"
  for f in (FIXTURES / "math").rglob("*"):
    if f.is_file():
      (tree / f.relative_to(FIXTURES / "math")).parent.mkdir(parents=True, exist_ok=True)
      (tree / f.relative_to(FIXTURES / "math")).write_bytes(f.read_bytes())
  algebra = tree / "MATH" / "train" / "algebra" / "1.json"
  algebra.write_bytes(algebra.read_bytes().replace(b"\\boxed", b"\xff\\boxed", 1))
  math = _build("math", tmp_path / "tfds", manual_dir=tree)
  assert "train/algebra/1.json" not in _by_id(math, "train")
  train_skips = {s.key: s.reason for s in datasets.skipped(math)["train"].skips}
  assert train_skips["train/algebra/1.json"].startswith("invalid UTF-8")


def test_a_parquet_row_with_invalid_utf8_is_skipped(cache, tmp_path):
  questions = [b"1 + 1?", b"caf\xe9?", b"3 + 3?"]  # Arrow writes the bytes unchecked.
  offsets = pa.array(np.cumsum([0] + [len(q) for q in questions]), pa.int32())
  column = pa.Array.from_buffers(
    pa.string(), len(questions), [None, offsets.buffers()[1], pa.py_buffer(b"".join(questions))]
  )
  path = tmp_path / "p.parquet"
  pq.write_table(pa.table({"q": column, "a": ["2", "x", "6"]}), path)
  builder = _simple({"test": [path]}, fields=datasets.Fields(question="q", answer="a"))
  assert _questions(builder, "test") == ["1 + 1?", "3 + 3?"]
  assert datasets.skipped(builder)["test"].skips == (
    datasets.Skip("p.parquet:1", "invalid UTF-8 in a string column"),
  )


def test_official_dataset_is_rebuilt_when_its_manual_files_change(tmp_path, caplog):
  manual = tmp_path / "manual"
  manual.mkdir()
  for split in ("train", "test"):
    (manual / f"{split}.jsonl").write_bytes((FIXTURES / "gsm8k" / f"{split}.jsonl").read_bytes())
  first = _build("gsm8k", tmp_path / "tfds", manual_dir=manual)
  assert datasets.problems(first, "test")[0].answer == "18"
  with caplog.at_level(logging.INFO, logger="absl"):
    again = _build("gsm8k", tmp_path / "tfds", manual_dir=manual)
  assert any("reused" in r.getMessage() for r in caplog.records)
  assert datasets.problems(again, "test")[0].answer == "18"
  test = (manual / "test.jsonl").read_text()
  (manual / "test.jsonl").write_text(test.replace("#### 18", "#### 19", 1))
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    edited = _build("gsm8k", tmp_path / "tfds", manual_dir=manual)
  assert edited.data_dir == first.data_dir  # Official datasets keep their directory.
  assert datasets.problems(edited, "test")[0].answer == "19"
  assert datasets.skipped(edited)["train"].count == 2  # The report is rebuilt too.
  messages = [r.getMessage() for r in caplog.records]
  assert any("['test.jsonl'] changed" in m and "rebuilt" in m for m in messages), messages
  # Without a manual dir (or data built before the check), the data is read as it is.
  assert (
    datasets.problems(datasets.get("gsm8k", data_dir=tmp_path / "tfds"), "test")[0].answer == "19"
  )


def test_math_tarball_in_the_manual_dir_is_checked(tmp_path):
  manual = tmp_path / "manual"
  (manual / "math_splits").mkdir(parents=True)
  (manual / "math_splits" / "test.jsonl").write_bytes(
    (FIXTURES / "math" / "math_splits" / "test.jsonl").read_bytes()
  )
  with tarfile.open(manual / "MATH.tar", "w") as tar:
    tar.add(FIXTURES / "math" / "MATH", arcname="MATH")
  math = _build("math", tmp_path / "tfds", manual_dir=manual)
  assert sorted(math.info.metadata["manual_files"]) == ["MATH.tar", "math_splits/test.jsonl"]
  with tarfile.open(manual / "MATH.tar", "w") as tar:  # Now without the train split.
    tar.add(FIXTURES / "math" / "MATH" / "test", arcname="MATH/test")
    tar.add(FIXTURES / "math" / "MATH" / "train" / "algebra", arcname="MATH/train/algebra")
  rebuilt = _build("math", tmp_path / "tfds", manual_dir=manual)
  assert sorted(_by_id(rebuilt, "train")) == ["train/algebra/1.json"]
