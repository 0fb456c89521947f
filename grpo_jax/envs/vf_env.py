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
action; "chat": the messages after the assistant's, through the chat template (from the
assistant's end-of-turn token, which ends the action in the context, to the next
generation prompt). The environment's sampling arguments (max_tokens, temperature) are
not applied: the run's sampler config decides them, as for every task.

Why not a chat-completion server the environment calls over the network (how vLLM-based
trainers serve verifiers): the episode loop samples all rows' turns in lockstep inside
jitted code, so the model cannot answer one request at a time; the transport hands each
request to the loop instead, with no port and no copy of the weights.

Failures: the rollout raising (its env_response, a reward function) ends the episode with
env_error and its message; a request or an end that does not come within timeout_s
(the environment's own tool calls included) closes the episode (env_error); an episode the
episode loop ends early (turn or token limit) has its rollout cancelled, reward 0.
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
  """The environment's rollout and its rubric's score; its end goes on `events`."""
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
    raise
  except Exception as e:  # noqa: BLE001 -- the episode loop reports it (env_error).
    await events.put(("error", e, None))


class VfEnv(base.Environment):
  """One episode as one rollout of a verifiers environment (the module docstring). The
  example is a `vf_tasks.VfExample` (task "vf:<env_id>"). Options (config.env.kwargs):

    stop_text  one-token texts that end a turn besides EOS (the environment's grammar)
    timeout_s  the most seconds the environment takes between an action and its next
               request or its end (30)
  """

  outcomes = ()

  def __init__(
    self, *, tokenizer, stop_text: tuple[str, ...] | list[str] = (), timeout_s: float = 30.0
  ):
    super().__init__(tokenizer=tokenizer)
    if not timeout_s > 0:
      raise ValueError(f"timeout_s={timeout_s}: must be > 0.")
    self.stop_text, self.timeout_s = tuple(stop_text), float(timeout_s)
    self.step_budget_s = self.timeout_s + 5.0  # The session's own timeout ends it first.
    self._events: asyncio.Queue | None = None
    self._task: asyncio.Task | None = None
    self._reply: asyncio.Future | None = None
    self._env, self._said = None, None

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
    if not isinstance(example, vf_tasks.VfExample):
      raise TypeError(
        f"environment 'verifiers' plays the rows of a 'vf:<env_id>' task, got a "
        f"{type(example).__name__}: set config.task.name = 'vf:<env_id>'."
      )
    self.close()
    self._env = vf_tasks.load(example.env_id, example.env_args)
    row = vf_tasks.row(self._env, example.source, example.row)
    kind, body = aio.call(self._start(row), self.timeout_s + 1.0)
    if kind != "ask":
      raise RuntimeError(f"vf:{example.env_id}'s rollout ended before asking the model ({body}).")
    self._said = _said(body)
    if _plain(self._said) != _plain(row["prompt"]):
      raise ValueError(f"vf:{example.env_id} asked the model {self._said!r}, not its row's prompt.")
    return ()

  async def _start(self, row: dict):
    self._events = asyncio.Queue()
    self._task = asyncio.get_running_loop().create_task(_rollout(self._env, row, self._events))
    return await self._next()

  async def _next(self):
    kind, value, reply = await self._events.get()
    if kind == "error":
      raise value
    self._reply = reply
    return kind, value

  def step(self, action: str) -> base.Step:
    if self._reply is None:
      raise RuntimeError("verifiers episode: no pending model turn (reset first).")
    try:
      kind, value = aio.call(self._answer(action), self.timeout_s)
    except TimeoutError:
      self.close()
      raise TimeoutError(
        f"the verifiers environment did not answer within {self.timeout_s:g} s."
      ) from None
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
    return self.encode_observation(chat_delta(self.tokenizer, said[:k], said[k:]))

  def close(self) -> None:
    """Cancels a rollout still running (the episode loop ended the episode)."""
    task, self._task, self._reply = self._task, None, None
    if task is not None and not task.done():
      aio.spawn(_cancel(task))


async def _cancel(task: asyncio.Task) -> None:
  task.cancel()


def _said(body: dict):
  """A request's prompt: the text (completions) or the messages (chat)."""
  return body["prompt"] if "prompt" in body else [dict(m) for m in body["messages"]]


def _plain(prompt):
  """A prompt to compare: the text, or each message's (role, content)."""
  if isinstance(prompt, str):
    return prompt
  return [(m.get("role"), m.get("content")) for m in prompt]


def chat_delta(tokenizer, before: list, added: list) -> str:
  """The chat-template text between the end of the last message of `before` (an assistant
  turn, whose end-of-turn token the context already holds) and the generation prompt
  after `added`: e.g. ChatML's "\\n<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n"."""
  done = tokenizer.apply_chat_template(before, add_generation_prompt=False)
  full = tokenizer.apply_chat_template(before + added, add_generation_prompt=True)
  if not full.startswith(done):
    raise ValueError("the chat template renders the conversation's head differently once it grows.")
  eos = [tokenizer.token_str(i) for i in tokenizer.eos_ids]
  end = max((done.rfind(t) + len(t) for t in eos if done.rfind(t) >= 0), default=len(done))
  return done[end:] + full[len(done) :]
