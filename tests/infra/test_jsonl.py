"""The one JSONL reader (grpo_jax.infra.jsonl): strict by default; a missing file and a
torn last line only where the caller says so."""

import pytest

from grpo_jax.infra import jsonl


def test_reads_objects_and_skips_blank_lines(tmp_path):
  path = tmp_path / "a.jsonl"
  path.write_text('{"a": 1}\n\n  \n{"a": 2, "b": [1, 2]}\n')
  assert jsonl.read(path) == [{"a": 1}, {"a": 2, "b": [1, 2]}]
  assert jsonl.read(str(path)) == jsonl.read(path)


def test_a_torn_last_line_is_dropped_only_with_torn_tail(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"iteration": 1}\n{"iteration": 2}\n{"iterat')
  assert jsonl.read(path, torn_tail=True) == [{"iteration": 1}, {"iteration": 2}]
  with pytest.raises(ValueError, match=r"metrics.jsonl:3: not valid JSON"):
    jsonl.read(path)


def test_a_bad_line_before_the_last_is_an_error_naming_it_even_with_torn_tail(tmp_path):
  path = tmp_path / "m.jsonl"
  path.write_text('{"a": 1}\n\n{oops\n{"a": 3}\n')
  with pytest.raises(ValueError, match=r"m.jsonl:3: not valid JSON"):
    jsonl.read(path, torn_tail=True)


def test_a_line_that_is_not_an_object_is_an_error(tmp_path):
  path = tmp_path / "l.jsonl"
  path.write_text('{"a": 1}\n[1, 2]\n')
  with pytest.raises(ValueError, match=r"l.jsonl:2: expected a JSON object, got list"):
    jsonl.read(path)


def test_a_missing_file_is_empty_only_with_missing_ok(tmp_path):
  assert jsonl.read(tmp_path / "absent.jsonl", missing_ok=True) == []
  with pytest.raises(FileNotFoundError):
    jsonl.read(tmp_path / "absent.jsonl")
