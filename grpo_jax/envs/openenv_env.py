"""An OpenEnv server as a grpo_jax environment: each episode is one session on the server.

    config.env.name = "openenv"
    config.env.kwargs = dict(url="http://127.0.0.1:8000", stop_text=("=",))

OpenEnv (`openenv-core`, Meta's environment protocol: `pip install -e ".[openenv]"`) serves
an environment over a WebSocket at {url}/ws; each connection is its own environment
instance on the server, so an episode here is one connection, opened at `reset` and closed
when the episode ends (`close`). The messages, per episode:

  reset  {reset fields of the example}     -> observation, reward, done
  step   {action_field: the action's text} -> observation, reward, done

The observation's `observation_field` text is put in the context (encoded with special
tokens as plain text, `base.Environment.encode_observation`); a reward of None counts 0.
The reset sends `seed` (a stable hash of the example's prompt: the G episodes of a group
get the same one) and the example's `reset_fields` ("prompt", "answer", "reference"), so a
server may draw its problem from the seed or read it from the prompt.

Why our own session handling around openenv's client (`GenericEnvClient`) rather than its
`.sync()` wrapper: that wrapper starts an event-loop thread per client, one per episode
(hundreds per iteration); here every session of the process shares one loop thread (`aio`), and
the episode loop's step threads (`stepping`) wait on their own session's future. Its
client also leaves a timed-out connection out of step (the next call reads the late
reply), so a timeout here closes the session and ends the episode (env_error).

Failures and what they do:
  server unreachable at build  `check`: one error naming the URL (`health`, with retries)
  reset cannot connect         retried `retries` times (backoff 0.2 s, doubling), then the
                               episode ends with env_error (its message says why: at
                               capacity means the server's max_concurrent_envs is under
                               the episodes in flight, prompts_per_step × G)
  a step past timeout_s        the session is closed; env_error
  the server's step raised     env_error, with the server's message
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import urllib.error
import urllib.request

from grpo_jax.envs import aio, base

RESET_FIELDS = ("prompt", "answer", "reference")


def health(url: str, *, timeout_s: float = 5.0, retries: int = 2) -> None:
  """Raises ConnectionError (one line: the URL and why) unless GET {url}/health answers
  200 within timeout_s, after `retries` more tries (0.2 s backoff, doubling)."""
  why = ""
  for attempt in range(retries + 1):
    if attempt:
      time.sleep(0.2 * 2 ** (attempt - 1))
    try:
      with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as r:
        if r.status == 200:
          return
        why = f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
      why = f"HTTP {e.code}"
    except (OSError, ValueError) as e:  # URLError, refused, timed out, a malformed URL.
      why = str(getattr(e, "reason", e))
  raise ConnectionError(
    f"config.env.kwargs.url={url!r}: no OpenEnv server answered {url.rstrip('/')}/health "
    f"({why}; {retries + 1} tries, {timeout_s:g} s each). Start the server first (e.g. "
    "`python -m grpo_jax.envs.openenv_calculator --port 8000`) or fix the URL."
  )


def seed_of(example) -> int:
  """A stable 31-bit seed from the example's prompt: the same for a group's G episodes and
  across runs and processes (Python's hash() is salted per process)."""
  digest = hashlib.sha256(str(example.prompt).encode()).digest()
  return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


class OpenEnv(base.Environment):
  """One episode as one session on an OpenEnv server (the module docstring has the
  protocol). Options (config.env.kwargs):

    url                the server's base URL (http:// or ws://), required
    action_field       the action's field that carries the model's text ("text")
    observation_field  the observation's field put in the context ("text")
    reset_fields       the example's fields sent with reset (("prompt",)), besides seed
    stop_text          one-token texts that end a turn besides EOS (the server's grammar)
    timeout_s          the most seconds one reset or step waits for its reply (30)
    connect_timeout_s  the most seconds a connection takes to open (10)
    retries            further tries of a reset that could not connect, or of `check` (2)
  """

  outcomes = ()

  def __init__(
    self,
    *,
    tokenizer,
    url: str,
    action_field: str = "text",
    observation_field: str = "text",
    reset_fields: tuple[str, ...] | list[str] = ("prompt",),
    stop_text: tuple[str, ...] | list[str] = (),
    timeout_s: float = 30.0,
    connect_timeout_s: float = 10.0,
    retries: int = 2,
  ):
    super().__init__(tokenizer=tokenizer)
    if not isinstance(url, str) or not url.startswith(("http://", "https://", "ws://", "wss://")):
      raise ValueError(f"url={url!r}: an OpenEnv server's base URL (http://host:port).")
    unknown = sorted(set(reset_fields) - set(RESET_FIELDS))
    if unknown:
      raise ValueError(f"reset_fields {unknown}: allowed fields are {list(RESET_FIELDS)}.")
    if not (timeout_s > 0 and connect_timeout_s > 0 and retries >= 0):
      raise ValueError(
        f"timeout_s={timeout_s}, connect_timeout_s={connect_timeout_s}, retries={retries}: "
        "the timeouts must be > 0 and retries >= 0."
      )
    self.url, self.action_field, self.observation_field = url, action_field, observation_field
    self.reset_fields, self.stop_text = tuple(reset_fields), tuple(stop_text)
    self.timeout_s, self.connect_timeout_s, self.retries = timeout_s, connect_timeout_s, retries
    # The episode loop drops a step running past this (`episodes`: step_timeout); the
    # session's own timeout ends it first, as env_error.
    self.step_budget_s = timeout_s + 5.0
    self._client = None

  @classmethod
  def turn_end_text(cls, kwargs: dict) -> tuple[str, ...]:
    return tuple(kwargs.get("stop_text", ()))

  def check(self) -> None:
    health(self.url, timeout_s=self.connect_timeout_s, retries=self.retries)

  def reset(self, example) -> tuple[int, ...]:
    return self._send(self._reset(example), waits=self.retries + 1)

  @classmethod
  def reset_all(cls, envs, examples) -> list:
    """All the resets at once on the sessions' loop (one by one, 256 resets took 1.2 s on
    loopback, as long as a tiny model's whole iteration); results or exceptions, in order."""
    if not envs:
      return []
    longest = max(e.timeout_s + e.connect_timeout_s for e in envs) * (envs[0].retries + 1)

    async def gathered():
      resets = (env._reset(x) for env, x in zip(envs, examples, strict=True))
      return await asyncio.gather(*resets, return_exceptions=True)

    try:
      return list(aio.call(gathered(), longest + 1.0))
    except TimeoutError as e:
      return [e] * len(envs)

  async def _reset(self, example) -> tuple[int, ...]:
    """A new session and its first observation; a session that cannot open is retried."""
    fields = {"seed": seed_of(example), **{f: str(getattr(example, f)) for f in self.reset_fields}}
    for attempt in range(self.retries + 1):
      if attempt:
        await asyncio.sleep(0.2 * 2 ** (attempt - 1))
      await self._aclose()
      self._client = self._new_client()
      try:
        return self._observation(await self._client.reset(**fields))
      except (ConnectionError, OSError) as e:  # Refused, or the handshake timed out.
        error = e
      except Exception as e:  # noqa: BLE001 -- a full server closes new sessions at once.
        if "capacity" not in str(e).lower() and "ConnectionClosed" not in type(e).__name__:
          raise
        error = e
    await self._aclose()
    raise ConnectionError(
      f"OpenEnv server {self.url}: no session after {self.retries + 1} tries ({error}). "
      "A server at capacity needs max_concurrent_envs >= the episodes in flight "
      "(prompts_per_step x group_size)."
    )

  def step(self, action: str) -> base.Step:
    if self._client is None:
      raise RuntimeError("OpenEnv session closed (reset first).")
    result = self._send(self._client.step({self.action_field: action}))
    step = base.Step(
      observation=() if result.done else self._observation(result),
      reward=0.0 if result.reward is None else float(result.reward),
      done=bool(result.done),
    )
    if step.done:
      self.close()
    return step

  def close(self) -> None:
    """Ends the session (the server frees its instance); waits for nothing."""
    client, self._client = self._client, None
    if client is not None:
      aio.spawn(client.close())

  async def _aclose(self) -> None:
    client, self._client = self._client, None
    if client is not None:
      await client.close()

  def _new_client(self):
    from openenv.core import generic_client  # noqa: PLC0415 -- the optional extra.

    return generic_client.GenericEnvClient(
      base_url=self.url,
      connect_timeout_s=self.connect_timeout_s,
      message_timeout_s=self.timeout_s,
    )

  def _send(self, coro, *, waits: int = 1):
    """The reply to one message (`waits` tries of it); a timeout closes the session (a
    late reply would be read as the next message's) and raises."""
    try:
      return aio.call(coro, (self.timeout_s + self.connect_timeout_s) * waits + 1.0)
    except TimeoutError:
      self.close()
      raise TimeoutError(
        f"OpenEnv server {self.url} sent no reply within {self.timeout_s:g} s."
      ) from None

  def _observation(self, result) -> tuple[int, ...]:
    obs = result.observation if isinstance(result.observation, dict) else {}
    if self.observation_field not in obs:
      raise KeyError(
        f"OpenEnv observation has no field {self.observation_field!r} (it has "
        f"{sorted(obs)}): set config.env.kwargs.observation_field."
      )
    return self.encode_observation(str(obs[self.observation_field]))
