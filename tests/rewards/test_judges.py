"""LLM-judge client against a real local HTTP server (127.0.0.1, a free port) with a script
(`judge_server`: it answers <score>K</score>, K the completion's count of "1"s, and markers
in the completion such as SLOW, BAD, FLAKY or E400 inject faults)."""

import json
import math
import threading
import time

import numpy as np
import pytest

from grpo_jax.rewards import judges
from grpo_jax.verifiers import verdicts

RUBRIC = judges.Rubric("P: {prompt}\nC: {completion}", system="You are a judge.")
YES_NO = judges.Rubric("P: {prompt}\nC: {completion}\nGood? Answer yes or no.", mode="yes_no")


def _judge(server, **options):
  options = {"timeout_s": 2.0, "retries": 1, "backoff_s": 0.01, "max_concurrency": 4, **options}
  rubric = options.pop("rubric", RUBRIC)
  return judges.HttpJudge(base_url=server.base_url, model="judge-m", rubric=rubric, **options)


def _score(judge, completions):
  return judge.score(["q"] * len(completions), completions)


# -- Parsers.


def test_parse_score_takes_the_last_tag_over_max_score():
  assert judges.parse_score("<score>3</score> so: <score> 7.5 </score>", max_score=10) == 0.75
  assert judges.parse_score("<SCORE>4</SCORE>", max_score=5) == 0.8
  assert judges.parse_score("<score>0</score>", max_score=10) == 0.0
  assert judges.parse_score("<score>\n10.\n</score>", max_score=10) == 1.0


@pytest.mark.parametrize(
  "text, match",
  [
    ("a fine answer, 7/10", "no <score> tag"),
    ("<score>seven</score>", "not a number"),
    ("<score></score>", "not a number"),
    ("<score>nan</score>", "not a number"),
    ("<score>10.5</score>", "outside"),
    ("<score>-1</score>", "outside"),
    ("<score>5</score> ... <score>11</score>", "outside"),  # The last tag counts.
  ],
)
def test_parse_score_errors(text, match):
  with pytest.raises(verdicts.Unscorable, match=match):
    judges.parse_score(text, max_score=10)


def test_parse_yes_no_from_logprobs():
  top = [{"token": " Yes", "logprob": math.log(0.6)}, {"token": "no", "logprob": math.log(0.2)}]
  assert judges.parse_yes_no("Yes", top) == pytest.approx(0.75)  # 0.6 / (0.6 + 0.2)
  # Several spellings of an answer sum: (0.3 + 0.3) / (0.3 + 0.3 + 0.2); others are ignored.
  top = [
    {"token": "Yes", "logprob": math.log(0.3)},
    {"token": "yes ", "logprob": math.log(0.3)},
    {"token": "\nNO", "logprob": math.log(0.2)},
    {"token": "maybe", "logprob": math.log(0.2)},
  ]
  assert judges.parse_yes_no("Yes", top) == pytest.approx(0.75)
  assert judges.parse_yes_no("No", [{"token": "No", "logprob": -0.01}]) == 0.0


def test_parse_yes_no_falls_back_to_the_answer():
  assert judges.parse_yes_no(" Yes", None) == 1.0
  assert judges.parse_yes_no("no.", []) == 0.0
  # Neither answer among the logprobs: the content decides.
  assert judges.parse_yes_no("YES", [{"token": "Sure", "logprob": -0.1}]) == 1.0
  with pytest.raises(verdicts.Unscorable, match="neither yes nor no"):
    judges.parse_yes_no("maybe", None)


# -- Rubric and arguments.


def test_rubric_validation_names_what_is_missing():
  with pytest.raises(ValueError, match=r"\{completion\}$"):
    judges.Rubric("Rate {prompt}")
  with pytest.raises(ValueError, match=r"\{prompt\} and \{completion\}"):
    judges.Rubric("Rate this")
  with pytest.raises(ValueError, match=r"one of \('score', 'yes_no'\), got 'likert'"):
    judges.Rubric(judges.DEFAULT_TEMPLATE, mode="likert")
  with pytest.raises(ValueError, match="max_score"):
    judges.Rubric(judges.DEFAULT_TEMPLATE, max_score=0)


def test_rubric_messages():
  rubric = judges.Rubric('{"q": "{prompt}"} -> {completion}', system="Be strict.")
  assert rubric.messages("a {completion}", "b") == [
    {"role": "system", "content": "Be strict."},
    {"role": "user", "content": '{"q": "a {completion}"} -> b'},  # One pass; JSON braces kept.
  ]
  user = judges.Rubric(judges.DEFAULT_TEMPLATE).messages("2+2?", "4")
  assert [m["role"] for m in user] == ["user"] and "<score>N</score>" in user[0]["content"]


@pytest.mark.parametrize(
  "options, match",
  [
    ({"base_url": "ftp://x/v1"}, "http"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"retries": -1}, "retries"),
    ({"batch_timeout_s": 0}, "batch_timeout_s"),
    ({"rubric": YES_NO, "max_tokens": 5}, "one token"),
  ],
)
def test_judge_argument_errors(options, match):
  options = {"base_url": "http://127.0.0.1:1/v1", "model": "m", "rubric": RUBRIC, **options}
  with pytest.raises(ValueError, match=match):
    judges.HttpJudge(**options)


def test_default_batch_deadline_bounds_every_request():
  judge = judges.HttpJudge(
    base_url="http://127.0.0.1:1/v1", model="m", rubric=RUBRIC, timeout_s=1.0, retries=2
  )
  with judge:  # 20 requests / 8 = 3 waves of 3·1 s + 1.1·0.5·(1 + 2) s, + 1 s + 1 s slack.
    assert judge._deadline_s(20) == pytest.approx(3 * (3 + 1.65) + 2)


# -- End to end.


def test_scores_a_batch_in_input_order(server, monkeypatch):
  monkeypatch.setenv("JUDGE_TEST_KEY", "sekrit")
  with _judge(server, api_key_env="JUDGE_TEST_KEY", max_tokens=64) as judge:
    scores = _score(judge, ["111", "", "1" * 14, "1 x 1", "11111"])
    stats = judge.stats()
  np.testing.assert_allclose(scores.value_N, [0.3, 0.0, 1.0, 0.2, 0.5], rtol=1e-6)
  assert scores.value_N.dtype == np.float32 and not scores.error_N.any()
  assert scores.messages == []
  body = server.bodies[0]
  assert (body["model"], body["temperature"], body["max_tokens"]) == ("judge-m", 0, 64)
  assert body["messages"][0] == {"role": "system", "content": "You are a judge."}
  assert "logprobs" not in body and set(server.auth) == {"Bearer sekrit"}
  assert stats["rows"] == 5 and stats["requests"] == 5 and stats["errors"] == 0
  assert stats["seconds"] > 0


def test_at_most_max_concurrency_requests_in_flight(server):
  server.delay_s = 0.25
  with _judge(server, max_concurrency=2) as judge:
    scores = _score(judge, ["1", "11", "111", "1111", "11111"])
  np.testing.assert_allclose(scores.value_N, [0.1, 0.2, 0.3, 0.4, 0.5], rtol=1e-6)
  assert server.max_in_flight == 2  # Concurrent, and never more than 2.


def test_slow_row_times_out_and_the_rest_are_scored(server):
  start = time.monotonic()
  with _judge(server, timeout_s=0.3, retries=1) as judge:
    scores = _score(judge, ["1", "SLOW", "11"])
    stats = judge.stats()
  assert time.monotonic() - start < 2.5  # Two 0.3 s timeouts, not the 5 s sleep.
  np.testing.assert_allclose(scores.value_N, [0.1, 0.0, 0.2], rtol=1e-6)
  assert scores.error_N.tolist() == [False, True, False]
  assert scores.messages == ["row 1: timed out after 1 retries"]
  assert server.seen["SLOW"] == 2 and stats["retries"] == 1


def test_batch_deadline_returns_and_the_next_batch_is_clean(server):
  server.slow_s = 1.5
  with _judge(server, timeout_s=5.0, batch_timeout_s=0.4) as judge:
    start = time.monotonic()
    first = _score(judge, ["1", "SLOW"])
    assert time.monotonic() - start < 1.4
    second = _score(judge, ["11", "111"])  # While the late SLOW request still runs.
  assert first.error_N.tolist() == [False, True]
  assert first.messages == ["row 1: batch deadline"]
  np.testing.assert_allclose(second.value_N, [0.2, 0.3], rtol=1e-6)
  assert not second.error_N.any()


def test_busy_server_statuses_are_retried(server):
  with _judge(server, retries=1) as judge:
    scores = _score(judge, ["1 FLAKY", "11 BUSY"])
    stats = judge.stats()
  np.testing.assert_allclose(scores.value_N, [0.1, 0.2], rtol=1e-6)
  assert not scores.error_N.any()
  assert server.seen["1 FLAKY"] == server.seen["11 BUSY"] == 2
  assert stats["retries"] == 2 and stats["requests"] == 4


def test_retries_exhausted_is_unscorable(server):
  with _judge(server, retries=0) as judge:
    scores = _score(judge, ["FLAKY"])
  assert scores.error_N.tolist() == [True]
  assert scores.messages == ["row 0: HTTP 503: overloaded"]


def test_client_errors_and_bad_replies_are_unscorable_without_retry(server):
  with _judge(server, retries=3) as judge:
    scores = _score(judge, ["E400", "BAD", "NOCHOICES", "NOTAG", "111"])
    stats = judge.stats()
  assert scores.error_N.tolist() == [True, True, True, True, False]
  np.testing.assert_allclose(scores.value_N, [0, 0, 0, 0, 0.3], rtol=1e-6)
  assert [m.split(":")[0] for m in scores.messages] == ["row 0", "row 1", "row 2", "row 3"]
  assert "HTTP 400" in scores.messages[0] and "bad request" in scores.messages[0]
  assert "malformed JSON" in scores.messages[1]
  assert "no choices" in scores.messages[2]
  assert "no <score> tag" in scores.messages[3]
  assert set(server.seen.values()) == {1} and stats["retries"] == 0 and stats["errors"] == 4


def test_repeated_batch_is_served_from_the_cache(server):
  with _judge(server) as judge:
    first = _score(judge, ["1", "11"])
    second = _score(judge, ["1", "11"])
    stats = judge.stats()
  np.testing.assert_array_equal(first.value_N, second.value_N)
  assert server.requests == 2 and stats["cache_hits"] == 2


def test_duplicate_rows_are_requested_once(server):
  with _judge(server) as judge:
    scores = _score(judge, ["11", "11", "1", "11"])
    stats = judge.stats()
  np.testing.assert_allclose(scores.value_N, [0.2, 0.2, 0.1, 0.2], rtol=1e-6)
  assert server.seen == {"11": 1, "1": 1} and stats["deduplicated"] == 2


def test_errors_are_not_cached(server, tmp_path):
  path = tmp_path / "judge.jsonl"
  with _judge(server, cache_path=path) as judge:
    _score(judge, ["BAD", "1"])
    scores = _score(judge, ["BAD", "1"])
  assert scores.error_N.tolist() == [True, False]
  assert server.seen == {"BAD": 2, "1": 1}
  assert len(path.read_text().splitlines()) == 1


def test_cache_file_serves_a_new_judge(server, tmp_path):
  path = tmp_path / "judge.jsonl"
  with _judge(server, cache_path=path) as judge:
    first = _score(judge, ["1", "11", "111"])
  assert len(path.read_text().splitlines()) == 3
  with _judge(server, cache_path=path) as judge:
    second = _score(judge, ["111", "1", "11"])
  np.testing.assert_allclose(second.value_N, first.value_N[[2, 0, 1]], rtol=1e-6)
  assert server.requests == 3  # None by the second judge.
  other = judges.Rubric("Other: {prompt}\nC: {completion}")  # Another rubric, other keys.
  with _judge(server, cache_path=path, rubric=other) as judge:
    _score(judge, ["1"])
  assert server.requests == 4


def test_cache_file_with_a_cut_last_line(server, tmp_path):
  path = tmp_path / "judge.jsonl"
  with _judge(server, cache_path=path) as judge:
    _score(judge, ["1", "11"])
  with open(path, "a") as f:
    f.write('{"key": "3f2a')  # A run killed mid-write.
  with _judge(server, cache_path=path) as judge:
    scores = _score(judge, ["1", "11", "111"])
  assert server.requests == 3 and not scores.error_N.any()
  lines = path.read_text().splitlines()
  assert len(lines) == 3 and all(json.loads(line)["key"] for line in lines)
  with _judge(server, cache_path=path) as judge:
    _score(judge, ["1", "11", "111"])
  assert server.requests == 3


def test_server_gone_between_batches(server):
  with _judge(server, retries=2) as judge:
    assert not _score(judge, ["1"]).error_N.any()
    server.stop_listening()
    start = time.monotonic()
    scores = _score(judge, ["11", "111"])
  assert time.monotonic() - start < 2.0
  assert scores.error_N.tolist() == [True, True]
  assert scores.messages == [
    "row 0: connection refused after 2 retries",
    "row 1: connection refused after 2 retries",
  ]


def test_server_gone_mid_batch(server):
  server.delay_s = 0.3
  killer = threading.Timer(0.15, server.stop_listening)
  with _judge(server, max_concurrency=2, retries=1) as judge:
    start = time.monotonic()
    killer.start()
    scores = _score(judge, ["1" * k for k in range(1, 9)])
  killer.join()
  assert time.monotonic() - start < 3.0
  # Rows in flight when it stopped listening are answered; the rest are refused.
  assert scores.error_N[-1] and scores.error_N.sum() >= 2
  ok = ~scores.error_N
  np.testing.assert_allclose(scores.value_N[ok], (np.arange(1, 9) / 10)[ok], rtol=1e-6)
  # Two rows in a row refused (max_concurrency): the breaker fails the rest at once.
  assert all("after 1 retries" in m or "judge unreachable" in m for m in scores.messages)


def test_a_silent_server_costs_one_wave_not_the_batch(server):
  """16 rows the server never answers in time, 2 in flight: without the breaker 8 waves of
  0.4 s timeouts; with it, the first wave's two failures fail the other 14 at once."""
  start = time.monotonic()
  with _judge(server, timeout_s=0.4, retries=0, max_concurrency=2) as judge:
    scores = _score(judge, [f"SLOW{i}" for i in range(16)])
    stats = judge.stats()
  assert time.monotonic() - start < 2.0
  assert scores.error_N.all() and stats["requests"] <= 4
  assert sum("judge unreachable (2 rows in a row failed" in m for m in scores.messages) >= 12


def test_the_api_key_goes_in_the_authorization_header(server, monkeypatch):
  monkeypatch.setenv("MY_JUDGE_KEY", "sk-test")
  with _judge(server, api_key_env="MY_JUDGE_KEY") as judge:
    _score(judge, ["1"])
  monkeypatch.delenv("MY_JUDGE_KEY")
  with _judge(server, api_key_env="MY_JUDGE_KEY") as judge:
    _score(judge, ["11"])
  assert server.auth == ["Bearer sk-test", None]


def test_yes_no_end_to_end(server):
  with _judge(server, rubric=YES_NO) as judge:
    scores = _score(judge, ["", "111", "1" * 10, "PLAIN", "NOTAG"])
  np.testing.assert_allclose(scores.value_N, [0.0, 0.3, 1.0, 1.0, 0.0], rtol=1e-6)
  assert scores.error_N.tolist() == [False, False, False, False, True]
  assert "neither yes nor no" in scores.messages[0]
  body = server.bodies[0]
  assert (body["max_tokens"], body["logprobs"], body["top_logprobs"]) == (1, True, 20)


def test_score_after_close_raises(server):
  judge = _judge(server)
  judge.close()
  with pytest.raises(RuntimeError, match="after close"):
    _score(judge, ["1"])
