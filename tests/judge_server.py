"""A scripted OpenAI-compatible judge server on 127.0.0.1 (a free port), for the judge tests.

The scripted judge reads the completion out of the user message (the test rubric's "C: " line)
and answers ``<score>K</score>`` with K = the completion's number of "1"s (capped at 10), so
every expected reward is countable by eye. Markers in the completion trigger faults:

  SLOW     sleeps ``slow_s`` (past the client's timeout) before answering;
  BAD      200 with a body that is not JSON;       NOCHOICES  200 with JSON but no choices;
  NOTAG    200 with a reply without a score tag;   E400       HTTP 400 every time;
  FLAKY    HTTP 503 on the first request for that text, then an answer;
  BUSY     HTTP 429 on the first request, then an answer;
  PLAIN    (yes_no) answers "Yes" without logprobs.

The server counts requests per completion and the most requests in flight at once (counted
until the handler starts writing its reply, so a client's next request never overlaps it).
"""

import collections
import contextlib
import http.server
import json
import math
import threading


class Server(http.server.ThreadingHTTPServer):
  daemon_threads = True
  block_on_close = False  # Teardown must not wait for a SLOW handler.
  request_queue_size = 128  # listen() backlog: at 5, a burst of connects waits for SYN retries.

  def __init__(self):
    super().__init__(("127.0.0.1", 0), Handler)
    self.lock = threading.Lock()
    self.stop = threading.Event()  # Ends every sleep at teardown.
    self.delay_s, self.slow_s = 0.0, 5.0
    self.seen = collections.Counter()  # Requests per completion.
    self.bodies, self.auth = [], []
    self.in_flight = self.max_in_flight = 0

  @property
  def base_url(self):
    return f"http://127.0.0.1:{self.server_address[1]}/v1"

  @property
  def requests(self):
    return sum(self.seen.values())

  def stop_listening(self):
    """No new connections (refused); handlers already running finish."""
    self.shutdown()
    self.server_close()

  def handle_error(self, request, client_address):
    pass  # A client that gave up (timed out) before the reply.


class Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def do_POST(self):  # noqa: N802 -- http.server's name.
    server = self.server
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    completion = body["messages"][-1]["content"].split("\nC: ", 1)[1].split("\n")[0]
    with server.lock:
      server.seen[completion] += 1
      first = server.seen[completion] == 1
      server.bodies.append(body)
      server.auth.append(self.headers.get("Authorization"))
      server.in_flight += 1
      server.max_in_flight = max(server.max_in_flight, server.in_flight)
    try:
      status, payload = _script(server, body, completion, first=first)
    finally:
      with server.lock:
        server.in_flight -= 1
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)
    except OSError:
      pass  # The client timed out and closed the connection.


def _script(server, body, completion, *, first):
  if server.delay_s:
    server.stop.wait(server.delay_s)
  if "SLOW" in completion:
    server.stop.wait(server.slow_s)
  if "E400" in completion:
    return 400, b'{"error": {"message": "bad request"}}'
  if "FLAKY" in completion and first:
    return 503, b"overloaded"
  if "BUSY" in completion and first:
    return 429, b"slow down"
  if "BAD" in completion:
    return 200, b'{"choices": [{"mess'
  if "NOCHOICES" in completion:
    return 200, b'{"object": "error"}'
  if "NOTAG" in completion:
    return 200, _chat("I like it.")
  if "PLAIN" in completion:
    return 200, _chat("Yes")
  k = min(completion.count("1"), 10)
  if body.get("logprobs"):
    return 200, _chat("Yes", top_logprobs=_yes_no_logprobs(k))
  # An earlier tag in the reasoning: the verdict is the last one.
  return 200, _chat(f"The format is <score>0</score>.\nVerdict: <score> {k} </score>")


def _yes_no_logprobs(k):
  """P(yes) = 0.9·k/10 split over " Yes" and "yes", P(No) = 0.9·(10−k)/10, "maybe" 0.1: so
  the judge's reward P(yes) / (P(yes) + P(no)) is k/10."""
  probs = {" Yes": 0.45 * k / 10, "yes": 0.45 * k / 10, "No": 0.9 * (10 - k) / 10, "maybe": 0.1}
  return [{"token": t, "logprob": math.log(p)} for t, p in probs.items() if p > 0]


def _chat(content, top_logprobs=None):
  choice = {"index": 0, "message": {"role": "assistant", "content": content}}
  if top_logprobs is not None:
    first = {"token": content, "logprob": -0.1, "top_logprobs": top_logprobs}
    choice["logprobs"] = {"content": [first]}
  return json.dumps({"choices": [choice]}).encode()


@contextlib.contextmanager
def serving():
  """A running Server; stopped (every sleep ended) on exit."""
  srv = Server()
  thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
  thread.start()
  try:
    yield srv
  finally:
    srv.stop.set()
    srv.stop_listening()
    thread.join(5)


PROXY_VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy")
