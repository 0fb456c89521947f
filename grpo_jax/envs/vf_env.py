"""A `verifiers` environment's rollouts as grpo_jax episodes: config.env.name = "verifiers".

    c.task.name = "vf:grpo_jax.envs.vf_calculator"   # the rows (tasks/vf_tasks.py)
    c.env.name = "verifiers"
    c.env.kwargs = dict(stop_text=("=",))             # one-token texts ending a turn

A verifiers environment (Prime Intellect's library, 0.1.3 to 0.1.7) drives its own rollout:
`env.rollout(client, model, prompt, answer, task, info)` asks an OpenAI client for each
model turn, adds its own messages between turns (`env_response`), decides when it is over
(`is_completed`, max_turns), and its rubric then scores the whole rollout. Here each
episode runs that rollout, unchanged, on the shared event loop (`aio`) with a real
`openai.AsyncOpenAI` client whose HTTP transport is the episode: a request for a model
turn waits until the episode loop has sampled this row's action, which comes back as the
completion. Its turns are ours:

  reset(example)  starts the rollout; its first request must be the row's prompt (already
                  in the context): observation ()
  step(action)    answers the pending request with the action's text; then either the
                  rollout asks again (observation: what the environment added since, as
                  the model reads it) or it ends (done; reward: the rubric's reward)

Observations: message_type "completion": the text the environment appended after the
action; "chat": the messages after the assistant's, through the chat template, from the
assistant's end of turn to the next generation prompt (`chat_observation`: the template's
special tokens as tokens, the messages' contents as plain text). The context holds the
model's turns as it sampled them, not as the template would re-render the history.
The environment's sampling arguments (max_tokens, temperature) are not applied: the run's
sampler config decides them, as for every task. Tools offered through `oai_tools`
(verifiers' ToolEnv) are refused when the task is built: their calls need the template's
tool format, which this adapter does not parse.

Why not a chat-completion server the environment calls over the network (how vLLM-based
trainers serve verifiers): the episode loop samples all rows' turns in lockstep inside
jitted code, so the model cannot answer one request at a time; the transport hands each
request to the loop instead, with no port and no copy of the weights.

Failures: the rollout raising (its env_response, a tool) ends the episode with env_error
and its message; a reward function that raises scores 0 (verifiers' Rubric catches it and
logs the error). A request or an end that does not come within timeout_s of the action
(timed on the loop, per episode) stops the episode (env_error); an episode the episode
loop ends early (turn or token limit) has its rollout cancelled, reward 0. Resets start
every rollout at once (`reset_all`). A synchronous env_response or reward function runs on
the shared loop and holds every episode while it runs: write them async.
"""

from __future__ import annotations

import asyncio
import json

from grpo_jax.envs import aio, base
from grpo_jax.tasks import vf_tasks

MODEL = "grpo-jax-policy"  # The model name the environment's requests carry.


def _completion_body(path: str, request: dict, text: str) -> dict:
  """The OpenAI response to `request` whose generated text is `text`."""
  head = {"id": "grpo-jax", "created": 0, "model": request.get("model", MODEL)}
  usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
  if path.endswith("/chat/completions"):
    message = {"role": "assistant", "content": text}
    choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
    return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
  choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
  return {**head, "object": "text_completion", "choices": [choice], "usage": usage}


class _Transport:
  """The HTTP transport of one episode's OpenAI client (httpx calls these two methods):
  each request is put on the episode's queue as ("ask", body, reply) and answered with
  the text set on `reply`."""

  def __init__(self, events: asyncio.Queue):
    self.events = events

  async def handle_async_request(self, request):
    import httpx  # noqa: PLC0415

    body = json.loads(await request.aread())
    reply = asyncio.get_running_loop().create_future()
    await self.events.put(("ask", body, reply))
    text = await reply
    return httpx.Response(200, json=_completion_body(request.url.path, body, text))

  async def aclose(self) -> None:
    return


def _client(events: asyncio.Queue):
  """A real OpenAI client whose requests are this episode's turns (`_Transport`)."""
  import httpx  # noqa: PLC0415 -- openai's HTTP library, installed with it.
  import openai  # noqa: PLC0415 -- verifiers' dependency.

  http = httpx.AsyncClient(transport=_Transport(events), timeout=None)
  return openai.AsyncOpenAI(
    api_key="none", base_url="http://episode.invalid/v1", http_client=http, max_retries=0
  )


async def _rollout(env, row: dict, events: asyncio.Queue) -> None:
  """The environment's rollout and its rubric's score; its end goes on `events` (and a
  cancelled one says so, which wakes a step waiting on it)."""
  try:
    completion, state = await env.rollout(
      _client(events), MODEL, row["prompt"], answer=row["answer"], task=row["task"],
      info=row["info"],
    )  # fmt: skip
    score = await env.rubric.score_rollout(
      row["prompt"], completion, row["answer"], state, task=row["task"], info=row["info"]
    )
    await events.put(("end", float(score.reward), None))
  except asyncio.CancelledError:
    events.put_nowait(("closed", None, None))
    raise
  except Exception as e:  # noqa: BLE001 -- the episode loop reports it (env_error).
    await events.put(("error", e, None))


class VfEnv(base.Environment):
  """One episode as one rollout of a verifiers environment (the module docstring). The
  example is a `vf_tasks.VfExample` (task "vf:<env_id>"). Options (config.env.kwargs):

    stop_text  one-token texts that end a turn besides EOS (the environment's grammar)
    timeout_s  the most seconds the environment takes between an action and its next
               request or its end, and for a reset (30); timed on the event loop, so a
               slow episode does not time out the others
  """

  outcomes = ()

  def __init__(
    self, *, tokenizer, stop_text: tuple[str, ...] | list[str] = (), timeout_s: float = 30.0
  ):
    super().__init__(tokenizer=tokenizer)
    if not timeout_s > 0:
      raise ValueError(f"timeout_s={timeout_s}: must be > 0.")
    self.stop_text, self.timeout_s = tuple(stop_text), float(timeout_s)
    # The episode loop drops a step past this (step_timeout); the episode's own timeout,
    # on the loop, ends it first, and this margin catches a loop that a synchronous tool
    # blocks.
    self.step_budget_s = self.timeout_s + 10.0
    self._events: asyncio.Queue | None = None
    self._task: asyncio.Task | None = None
    self._reply: asyncio.Future | None = None
    self._said = None

  @classmethod
  def turn_end_text(cls, kwargs: dict) -> tuple[str, ...]:
    return tuple(kwargs.get("stop_text", ()))

  @classmethod
  def check_task(cls, task) -> None:
    if not isinstance(task, vf_tasks.VfTask):
      raise ValueError(
        f"config.env.name='verifiers' plays the rows of a verifiers environment's task, not "
        f"task {getattr(task, 'name', task)!r}: set config.task.name = 'vf:<env_id>'."
      )

  def reset(self, example) -> tuple[int, ...]:
    return self._call(self._areset(example), 5.0)

  @classmethod
  def reset_all(cls, envs, examples) -> list:
    """Every episode's rollout started at once on the loop, each reset under its own
    timeout_s; the first observations (()) or the exceptions, in order."""
    if not envs:
      return []

    async def gathered():
      resets = (env._areset(x) for env, x in zip(envs, examples, strict=True))
      return await asyncio.gather(*resets, return_exceptions=True)

    longest = max(env.timeout_s for env in envs) + 10.0
    try:
      return list(aio.call(gathered(), longest))
    except TimeoutError as e:
      return [e] * len(envs)

  async def _areset(self, example) -> tuple[int, ...]:
    """Starts the example's rollout and takes its first request (the row's prompt)."""
    if not isinstance(example, vf_tasks.VfExample):
      raise TypeError(
        f"environment 'verifiers' plays the rows of a 'vf:<env_id>' task, got a "
        f"{type(example).__name__}: set config.task.name = 'vf:<env_id>'."
      )
    self._stop()
    env = vf_tasks.load(example.env_id, example.env_args)
    row = vf_tasks.row(env, example.source, example.row)
    self._events = asyncio.Queue()
    self._task = asyncio.get_running_loop().create_task(_rollout(env, row, self._events))
    kind, body = await self._next()
    if kind != "ask":
      raise RuntimeError(f"vf:{example.env_id}'s rollout ended before asking the model ({body}).")
    self._said = _said(body)
    if _plain(self._said) != _plain(row["prompt"]):
      raise ValueError(f"vf:{example.env_id} asked the model {self._said!r}, not its row's prompt.")
    return ()

  async def _next(self):
    """The rollout's next event within timeout_s (TimeoutError after: the rollout is
    stopped); a request's reply is kept for the next action."""
    try:
      kind, value, reply = await asyncio.wait_for(self._events.get(), self.timeout_s)
    except TimeoutError:
      self._stop()
      raise TimeoutError(
        f"the verifiers environment did not answer within {self.timeout_s:g} s."
      ) from None
    if kind == "error":
      raise value
    if kind == "closed":
      raise RuntimeError("the verifiers episode was closed.")
    self._reply = reply
    return kind, value

  def _call(self, coro, margin_s: float):
    """`coro` on the loop; the loop times the environment (`_next`), and `margin_s` more
    catches a loop that something blocks."""
    try:
      return aio.call(coro, self.timeout_s + margin_s)
    except TimeoutError:
      self.close()
      raise TimeoutError(
        f"the verifiers environment did not answer within {self.timeout_s:g} s (the event "
        "loop was blocked: a synchronous tool or reward function holds it)."
      ) from None

  def step(self, action: str) -> base.Step:
    if self._reply is None:
      raise RuntimeError("verifiers episode: no pending model turn (reset first).")
    try:
      kind, value = self._call(self._answer(action), 5.0)
    except BaseException:
      self.close()
      raise
    if kind == "end":
      self.close()
      return base.Step(reward=value, done=True)
    said, before = _said(value), self._said
    self._said = said
    return base.Step(observation=self._observation(before, action, said))

  async def _answer(self, action: str):
    reply, self._reply = self._reply, None
    if reply is None:  # Closed since the step began.
      raise RuntimeError("the verifiers episode was closed.")
    reply.set_result(action)
    return await self._next()

  def _observation(self, before, action: str, said) -> tuple[int, ...]:
    """What the environment added after `action` (module docstring)."""
    if isinstance(said, str):
      head = before + action
      if not said.startswith(head):
        raise ValueError("the verifiers environment's prompt does not continue the episode's text.")
      return self.encode_observation(said[len(head) :])
    k = len(before) + 1  # The assistant's message, then the environment's.
    if (
      _plain(said[: len(before)]) != _plain(before) or said[len(before)].get("role") != "assistant"
    ):
      raise ValueError("the verifiers environment's messages do not continue the episode's.")
    return chat_observation(self.tokenizer, said[:k], said[k:], eos_in_context=self.action_eos)

  def close(self) -> None:
    """Stops a rollout still running (the episode loop ended the episode): on the loop, so
    a step waiting on it wakes ("closed")."""
    aio.loop().call_soon_threadsafe(self._stop)

  def _stop(self) -> None:
    """(On the loop.) Cancels the rollout and forgets its pending request."""
    task, self._task, self._reply = self._task, None, None
    if task is not None and not task.done():
      task.cancel()


def _said(body: dict):
  """A request's prompt: the text (completions) or the messages (chat)."""
  return body["prompt"] if "prompt" in body else [dict(m) for m in body["messages"]]


def _plain(prompt):
  """A prompt to compare: the text, or each message's (role, content)."""
  if isinstance(prompt, str):
    return prompt
  return [(m.get("role"), m.get("content")) for m in prompt]


def _marks(n: int) -> list[str]:
  """Texts no template or environment writes, standing in for message contents (no
  whitespace at their ends: templates strip contents)."""
  return [f"\u27e6grpo-jax-content-{k}\u27e7" for k in range(n)]


def chat_observation(
  tokenizer, before: list, added: list, *, eos_in_context: bool
) -> tuple[int, ...]:
  """The observation ids after an assistant turn (the last message of `before`): the chat
  template's text from the end of that turn to the generation prompt after the `added`
  messages, e.g. ChatML's "\\n<|im_start|>user\\n{content}<|im_end|>\\n<|im_start|>assistant\\n".

  Contents are rendered as stand-ins (`_marks`), so a template that renders an earlier
  turn differently once the conversation grows (Qwen3 drops a past turn's reasoning) does
  not matter: the text is read after the assistant's stand-in. The template's own text is
  encoded with its special tokens; each message's content with special-token text as
  plain text (a tool's output cannot end a turn). The assistant's end-of-turn token is
  already in the context when the action ended with EOS (`eos_in_context`), else it is
  the observation's first token."""
  marks = _marks(len(added) + 1)
  head = [*before[:-1], {**before[-1], "content": marks[0]}]
  body = [{**m, "content": marks[k + 1]} for k, m in enumerate(added)]
  text = tokenizer.apply_chat_template(head + body, add_generation_prompt=True)
  if text.count(marks[0]) != 1:
    raise ValueError("the chat template does not render the assistant's turn once.")
  text = text.split(marks[0], 1)[1]
  ends = [tokenizer.token_str(i) for i in tokenizer.eos_ids]
  end = next((t for t in ends if text.startswith(t)), None)
  if eos_in_context:
    if end is None:
      raise ValueError(
        f"the chat template ends an assistant turn with {text[:20]!r}, not an EOS token "
        f"{ends}: the action's EOS is not where the template puts its end of turn."
      )
    text = text[len(end) :]
  ids = []
  for k, m in enumerate(added):
    piece, sep, text = text.partition(marks[k + 1])
    if not sep:
      raise ValueError(
        f"the chat template leaves out message {k} ({m.get('role')}) of the environment."
      )
    ids += tokenizer.encode(piece) + tokenizer.encode(str(m.get("content") or ""), special=False)
  return tuple(ids + tokenizer.encode(text))
