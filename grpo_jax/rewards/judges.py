"""LLM-judge rewards: a rubric, parsers for the judge's verdict, and a fault-tolerant client
for an OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp's server, OpenAI).

    rubric = judges.Rubric(judges.DEFAULT_TEMPLATE)
    with judges.HttpJudge(base_url="http://127.0.0.1:8000/v1", model="judge",
                          rubric=rubric) as judge:
      scores = judge.score(prompts, completions)   # verdicts.SourceScores
      judge.stats()   # {"requests": ..., "retries": ..., "cache_hits": ..., ...}

Scores. Rubric mode "score": the judge reasons, then writes ``<score>X</score>``; the reward is

    reward = X / max_score ∈ [0, 1],   X from the *last* tag (a judge may quote the format
                                        while reasoning; its verdict comes last).

An X outside [0, max_score] is unscorable, not clipped: a judge off its own scale is broken,
not harsh. Mode "yes_no": the judge answers one token, requested with ``top_logprobs=20``;
with p(t) = exp(logprob t) over the first token's top list, Y the tokens that read "yes" and
N those that read "no" (compared lower-cased, whitespace stripped, so " Yes" and "yes" sum),

    reward = Σ_{t∈Y} p(t) / (Σ_{t∈Y} p(t) + Σ_{t∈N} p(t)),

a graded reward from a single greedy token (the judge's confidence, renormalised over the
two answers). Without logprobs (a server that does not return them, or neither answer in the
top list) the answer itself decides: "yes" → 1, "no" → 0, anything else is unscorable.

Faults. A row the judge cannot score is *unscorable*, exactly like a failing verifier: value
0, error True, message "row i: <reason>"; ``score`` never raises for a row. Per request:

  retried (up to ``retries`` times, after backoff_s · 2^attempt seconds, +0-10% jitter):
      connection errors (refused, reset), socket timeouts (``timeout_s`` per connect/read),
      HTTP 429 and 5xx — the server is busy or away, and may come back;
  unscorable at once (no retry): any other 4xx (the request itself is wrong: a retry gets
      the same answer) and a 200 whose body is malformed (not JSON, no ``choices``) or whose
      verdict does not parse (no tag, X not a number or off the scale) — the judge is
      deterministic (temperature 0), so asking again mostly repeats the fault at full cost.

Batching and the deadline. ``score`` sends a batch's requests together from a thread pool of
``max_concurrency`` threads, so at most that many are in flight (the bound a shared judge
server needs). A socket timeout bounds each read, not a whole request (a server that trickles
bytes can hold one for ever), so each call also has a deadline, ``batch_timeout_s``; by default

    waves · ((retries + 1) · timeout_s + 1.1 · backoff_s · (2^retries − 1)) + timeout_s + 1 s,

with waves = ⌈unique requests / max_concurrency⌉: a batch of well-behaved failures always
ends before it, and a batch can never stall. Rows not done at the deadline are unscorable
("batch deadline"); their threads stop retrying (a late success still fills the cache), and
since each call reads only its own futures, a late thread cannot write into a later batch's
result. A server that is gone costs one wave, not the whole batch: once max_concurrency rows
in a row have exhausted their retries on transient faults with no success between them, the
call's other rows are unscorable at once ("judge unreachable"). Several processes (hosts)
each run their own pool: a shared server sees up to processes × max_concurrency requests.

Cache. Key = sha256 of the JSON list [model, template, mode, max_score, system, max_tokens,
prompt, completion]: what determines a temperature-0 verdict (not base_url: the same model served
elsewhere gives the same answer). Successful scores only — an error may be transient, so it is
asked again next time. Rows of a batch with the same key are requested once. With
``cache_path``, each scored row is also appended to a JSONL file ({"key", "value"} per line)
that a new judge loads at construction; a last line cut short (a run killed mid-write) is
dropped. One process per file: concurrent writers are not locked against each other.

Why the standard library (urllib, json, concurrent.futures) and not ``openai``, ``requests``
or ``httpx``: no new dependency for one POST, and full control of what a fault costs — the
socket timeout, which errors are retried and how often (the openai client retries on its own,
with its own timeouts, and would hide both from the counters here).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import http.client
import json
import math
import os
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence

from absl import logging

from grpo_jax.verifiers import verdicts

MODES = ("score", "yes_no")
# The longest reason kept in a row's message: a server's error page should not flood logs.
_MAX_REASON = 160
# Seconds added to the default deadline for scheduling and parsing overhead.
_DEADLINE_SLACK_S = 1.0

DEFAULT_TEMPLATE = """\
You are grading an assistant's response to a user's request. Judge correctness first (a \
wrong or unsupported answer scores low however well it is written), then helpfulness: does \
it do what was asked, completely, clearly and without padding?

[Request]
{prompt}

[Response]
{completion}

Think briefly about the response's strengths and flaws. Then, on the last line, give an \
integer grade N from 0 (wrong or useless) to 10 (correct, complete and clear) as \
<score>N</score>."""

_FIELD = re.compile(r"\{(prompt|completion)\}")
_SCORE_TAG = re.compile(r"<score>(.*?)</score>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")


@dataclasses.dataclass(frozen=True)
class Rubric:
  """What the judge is asked. ``template`` holds ``{prompt}`` and ``{completion}`` (other
  braces are left alone, so a template may show JSON); ``max_score`` is the top of the
  "score" scale; ``system``, when set, is sent as a system message."""

  template: str
  mode: str = "score"
  max_score: float = 10.0
  system: str = ""

  def __post_init__(self):
    missing = [f for f in ("{prompt}", "{completion}") if f not in self.template]
    if missing:
      raise ValueError(f"Rubric.template must contain {' and '.join(missing)}")
    if self.mode not in MODES:
      raise ValueError(f"Rubric.mode must be one of {MODES}, got {self.mode!r}")
    if not (math.isfinite(self.max_score) and self.max_score > 0):
      raise ValueError(f"Rubric.max_score must be finite and > 0, got {self.max_score}")

  def messages(self, prompt: str, completion: str) -> list[dict[str, str]]:
    # One pass, so a prompt that contains "{completion}" is not substituted into.
    fields = {"prompt": prompt, "completion": completion}
    user = _FIELD.sub(lambda m: fields[m.group(1)], self.template)
    system = [{"role": "system", "content": self.system}] if self.system else []
    return [*system, {"role": "user", "content": user}]

  def parse(self, content: str, top_logprobs: list | None) -> float:
    if self.mode == "yes_no":
      return parse_yes_no(content, top_logprobs)
    return parse_score(content, max_score=self.max_score)


def parse_score(text: str, *, max_score: float) -> float:
  """X / max_score for the last ``<score>X</score>`` in ``text``; raises ``Unscorable`` when
  there is no tag, X is not a number, or X is outside [0, max_score]."""
  tags = _SCORE_TAG.findall(text)
  if not tags:
    raise verdicts.Unscorable(f"no <score> tag in judge reply: {_short(text, 60)!r}")
  x = tags[-1].strip()
  if not _NUMBER.fullmatch(x):
    raise verdicts.Unscorable(f"judge score is not a number: {_short(x, 40)!r}")
  if not 0 <= float(x) <= max_score:
    raise verdicts.Unscorable(f"judge score {x} outside [0, {max_score:g}]")
  return float(x) / max_score


def parse_yes_no(content: str, top_logprobs: list | None) -> float:
  """P(yes) / (P(yes) + P(no)) over the first token's ``top_logprobs`` (OpenAI format: a list
  of {"token", "logprob"}); without logprobs, or neither answer among them, the content
  decides ("yes" → 1.0, "no" → 0.0); anything else raises ``Unscorable``."""
  mass = {"yes": 0.0, "no": 0.0}
  for entry in top_logprobs or ():
    answer = str(entry.get("token", "")).strip().lower()
    if answer in mass:
      mass[answer] += math.exp(float(entry["logprob"]))
  total = mass["yes"] + mass["no"]
  if total > 0:
    return mass["yes"] / total
  answer = (content or "").strip().lower().rstrip(".!")
  if answer in ("yes", "no"):
    return float(answer == "yes")
  raise verdicts.Unscorable(f"judge answered neither yes nor no: {_short(content, 40)!r}")


class _Transient(Exception):
  """A request failure worth retrying (the server is busy or away)."""


class HttpJudge:
  """Scores (prompt, completion) pairs with an LLM judge behind ``{base_url}/chat/completions``.

  ``max_tokens`` caps the judge's reply in "score" mode (default: the server's); "yes_no"
  always asks for one token. The API key is read from ``api_key_env`` once, at construction.
  """

  def __init__(
    self,
    *,
    base_url: str,
    model: str,
    rubric: Rubric,
    max_concurrency: int = 8,
    timeout_s: float = 30.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    batch_timeout_s: float | None = None,
    cache_path: str | os.PathLike | None = None,
    api_key_env: str = "OPENAI_API_KEY",
    max_tokens: int | None = None,
  ):
    _check_args(base_url, max_concurrency, timeout_s, retries, backoff_s, batch_timeout_s)
    if rubric.mode == "yes_no" and max_tokens not in (None, 1):
      raise ValueError(f"yes_no rubrics ask for exactly one token, got max_tokens={max_tokens}")
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model, self.rubric = model, rubric
    self.max_concurrency, self.timeout_s = max_concurrency, timeout_s
    self.retries, self.backoff_s, self.batch_timeout_s = retries, backoff_s, batch_timeout_s
    self.max_tokens = 1 if rubric.mode == "yes_no" else max_tokens
    self.cache_path = cache_path
    self._headers = {"Content-Type": "application/json"}
    if api_key := os.environ.get(api_key_env or "", ""):
      self._headers["Authorization"] = f"Bearer {api_key}"
    # Our own opener: proxies are read from the environment now, not at urllib's first use.
    self._opener = urllib.request.build_opener()
    self._pool = concurrent.futures.ThreadPoolExecutor(max_concurrency, thread_name_prefix="judge")
    self._lock = threading.Lock()  # Guards the cache, its file and the counters.
    self._cache = _load_cache(cache_path) if cache_path else {}
    self._closed = False
    self.n_rows = self.n_requests = self.n_retries = self.n_cache_hits = 0
    self.n_deduplicated = self.n_errors = 0
    self.seconds = 0.0

  # -- Public API.

  def score(self, prompts: Sequence[str], completions: Sequence[str]) -> verdicts.SourceScores:
    """Scores row i = (prompts[i], completions[i]); a ``verdicts.SourceScores`` in
    input order, unscorable rows marked (never raised)."""
    if len(prompts) != len(completions):
      raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if self._closed:
      raise RuntimeError("HttpJudge.score called after close()")
    start = time.monotonic()
    keys = [self.key(p, c) for p, c in zip(prompts, completions)]
    outcomes, todo = self._lookup(keys, prompts, completions)
    outcomes.update(self._request_all(todo))
    values, errors, messages = [], [], []
    for i, key in enumerate(keys):
      value, reason = outcomes[key]
      values.append(value)
      errors.append(reason is not None)
      if reason is not None:
        messages.append(f"row {i}: {reason}")
    with self._lock:
      self.n_rows += len(keys)
      self.n_errors += len(messages)
      self.seconds += time.monotonic() - start
    return verdicts.SourceScores.of(values, errors, messages)

  def key(self, prompt: str, completion: str) -> str:
    """The cache key of one row (see the module docstring)."""
    r = self.rubric
    fields = [self.model, r.template, r.mode, float(r.max_score), r.system, self.max_tokens]
    fields += [prompt, completion]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()

  def stats(self) -> dict[str, float]:
    """Counters since construction; e.g. requests / (rows − errors) is requests per scored
    row, and seconds / rows the judge's wall time per row."""
    with self._lock:
      return {
        "rows": self.n_rows,
        "requests": self.n_requests,
        "retries": self.n_retries,
        "cache_hits": self.n_cache_hits,
        "deduplicated": self.n_deduplicated,
        "errors": self.n_errors,
        "seconds": self.seconds,
      }

  def close(self):
    """Stops the pool; requests still in flight (past a deadline) end on their own timeout."""
    self._closed = True
    self._pool.shutdown(wait=False, cancel_futures=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # -- One batch.

  def _lookup(self, keys, prompts, completions):
    """(outcomes of cached rows, {key: (prompt, completion)} to request, once per key)."""
    outcomes, todo = {}, {}
    with self._lock:
      for key, prompt, completion in zip(keys, prompts, completions):
        if key in self._cache:
          outcomes[key] = (self._cache[key], None)
          self.n_cache_hits += 1
        elif key in todo:
          self.n_deduplicated += 1
        else:
          todo[key] = (prompt, completion)
    return outcomes, todo

  def _request_all(self, todo):
    """{key: (value, reason or None)} for each key of ``todo``, by the call's deadline."""
    if not todo:
      return {}
    # Set when this call returns (its late threads stop retrying), or when the breaker
    # opens: max_concurrency rows in a row failed on transient faults (the server is gone).
    cancel = _Breaker(limit=self.max_concurrency)
    futures = {
      self._pool.submit(self._score_one, key, prompt, completion, cancel): key
      for key, (prompt, completion) in todo.items()
    }
    done, late = concurrent.futures.wait(futures, timeout=self._deadline_s(len(todo)))
    cancel.set()
    outcomes = {futures[f]: f.result() for f in done}
    for future in late:
      future.cancel()
      outcomes[futures[future]] = (0.0, "batch deadline")
    return outcomes

  def _deadline_s(self, n_requests: int) -> float:
    if self.batch_timeout_s is not None:
      return self.batch_timeout_s
    waves = math.ceil(n_requests / self.max_concurrency)
    backoffs = 1.1 * self.backoff_s * (2**self.retries - 1)
    per_request = (self.retries + 1) * self.timeout_s + backoffs
    return waves * per_request + self.timeout_s + _DEADLINE_SLACK_S

  def _score_one(self, key, prompt, completion, cancel):
    try:
      if cancel.is_set():
        raise verdicts.Unscorable(cancel.reason or "batch deadline")
      reply = self._post_with_retries(self._body(prompt, completion), cancel)
      cancel.succeeded()
      value = self.rubric.parse(*_reply(reply))
    except verdicts.Unscorable as e:
      return 0.0, _short(str(e))
    except Exception as e:  # A bug here must cost one row, not the batch.
      return 0.0, _short(f"{type(e).__name__}: {e}")
    self._remember(key, value)
    return value, None

  # -- One request.

  def _body(self, prompt: str, completion: str) -> bytes:
    body = {
      "model": self.model,
      "messages": self.rubric.messages(prompt, completion),
      "temperature": 0,
    }
    if self.max_tokens is not None:
      body["max_tokens"] = self.max_tokens
    if self.rubric.mode == "yes_no":
      body.update(logprobs=True, top_logprobs=20)
    return json.dumps(body).encode()

  def _post_with_retries(self, body: bytes, cancel: threading.Event):
    for attempt in range(self.retries + 1):
      if attempt:
        delay = self.backoff_s * 2 ** (attempt - 1) * (1 + 0.1 * random.random())
        if cancel.wait(delay):
          raise verdicts.Unscorable(cancel.reason or "batch deadline")
        self._count("n_retries")
      try:
        return self._post(body)
      except _Transient as e:
        reason = str(e)
    suffix = f" after {self.retries} retries" if self.retries else ""
    cancel.failed(f"{reason}{suffix}")
    raise verdicts.Unscorable(f"{reason}{suffix}")

  def _post(self, body: bytes):
    """The reply's JSON; raises ``_Transient`` for what is worth retrying, else ``Unscorable``."""
    self._count("n_requests")
    request = urllib.request.Request(self.url, data=body, headers=self._headers, method="POST")
    try:
      with self._opener.open(request, timeout=self.timeout_s) as response:
        raw = response.read()
    except urllib.error.HTTPError as e:
      detail = _http_error_detail(e)
      if e.code == 429 or e.code >= 500:
        raise _Transient(f"HTTP {e.code}{detail}") from None
      raise verdicts.Unscorable(f"HTTP {e.code}{detail}") from None
    except urllib.error.URLError as e:  # Refused, unreachable, DNS; reason is the OSError.
      raise _Transient(_describe(e.reason)) from None
    except (OSError, http.client.HTTPException) as e:  # Timeouts, resets, cut-off replies.
      raise _Transient(_describe(e)) from None
    try:
      return json.loads(raw)
    except ValueError:
      raise verdicts.Unscorable(f"malformed JSON reply: {_short(repr(raw), 40)}") from None

  # -- Bookkeeping.

  def _count(self, name: str):
    with self._lock:
      setattr(self, name, getattr(self, name) + 1)

  def _remember(self, key: str, value: float):
    with self._lock:
      self._cache[key] = value
      if self.cache_path:
        with open(self.cache_path, "a") as f:  # One write per line: a kill cuts only the last.
          f.write(json.dumps({"key": key, "value": value}) + "\n")


class _Breaker(threading.Event):
  """A call's stop signal: set at its deadline, or opened once `limit` rows in a row
  exhausted their retries on transient faults (refused, timed out, 5xx) with no success
  between them: the server is gone, and the call's other rows fail at once instead of
  each spending its timeouts."""

  def __init__(self, *, limit: int):
    super().__init__()
    self.limit, self.run, self.reason = limit, 0, ""
    self._lock = threading.Lock()

  def failed(self, why: str):
    with self._lock:
      self.run += 1
      if self.run >= self.limit and not self.is_set():
        self.reason = f"judge unreachable ({self.run} rows in a row failed; last: {why})"
        self.set()

  def succeeded(self):
    with self._lock:
      self.run = 0


def _check_args(base_url, max_concurrency, timeout_s, retries, backoff_s, batch_timeout_s):
  if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
    raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
  if max_concurrency < 1:
    raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
  if not timeout_s > 0:
    raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
  if retries < 0:
    raise ValueError(f"retries must be >= 0, got {retries}")
  if backoff_s < 0:
    raise ValueError(f"backoff_s must be >= 0, got {backoff_s}")
  if batch_timeout_s is not None and not batch_timeout_s > 0:
    raise ValueError(f"batch_timeout_s must be > 0 or None, got {batch_timeout_s}")


def _reply(data) -> tuple[str, list | None]:
  """(content, the first token's top_logprobs or None) of an OpenAI chat completion."""
  try:
    choice = data["choices"][0]
    content = choice["message"]["content"] or ""
  except (KeyError, IndexError, TypeError):
    raise verdicts.Unscorable("malformed reply: no choices[0].message.content") from None
  try:
    top_logprobs = choice["logprobs"]["content"][0]["top_logprobs"]
  except (KeyError, IndexError, TypeError):
    top_logprobs = None
  return str(content), top_logprobs


def _load_cache(path) -> dict[str, float]:
  """The cache file's {key: value}; drops a last line cut short (and truncates it away, so
  that the next append starts a fresh line)."""
  if not os.path.exists(path):
    return {}
  with open(path, "rb") as f:
    raw = f.read()
  *lines, tail = raw.split(b"\n")  # tail is b"" when the file ends with a newline.
  cache = {}
  for number, line in enumerate(lines, 1):
    if line.strip():
      try:
        record = json.loads(line)
        cache[record["key"]] = float(record["value"])
      except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: line {number} is not a cache record: {line[:80]!r}") from e
  if tail:
    logging.warning("Judge cache %s: dropping a last line cut short (%d bytes).", path, len(tail))
    with open(path, "r+b") as f:
      f.truncate(len(raw) - len(tail))
  return cache


def _http_error_detail(error: urllib.error.HTTPError) -> str:
  try:
    body = error.read(200).decode("utf-8", "replace").strip()
  except Exception:  # The body of an error page is a courtesy: never fail on it.
    body = ""
  finally:
    error.close()
  return f": {body}" if body else ""


def _describe(error) -> str:
  if isinstance(error, str):
    return error
  if isinstance(error, TimeoutError):
    return "timed out"
  if isinstance(error, OSError) and error.strerror:
    return error.strerror.lower()
  return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _short(text: str, limit: int = _MAX_REASON) -> str:
  text = " ".join(str(text).split())
  return text if len(text) <= limit else text[: limit - 3] + "..."
