"""Hugging Face tokenizers and chat templates, without transformers.

`load(directory)` reads a checkpoint directory with the `tokenizers` library and jinja2
only, and returns an `HFTokenizer`, which implements `grpo_jax.models.tokenizers.Tokenizer`:

    tok = hf_tokenizer.load("checkpoints/Qwen2.5-0.5B-Instruct")
    prompt_ids = tok.encode_chat([{"role": "user", "content": "What is 2 + 3?"}])
    text = tok.decode(completion_ids)  # Stops at the first EOS id.

A GGUF source (a `*.gguf` path or `pkg:<package>`) gives the same files, written from its
metadata by `gguf_import.tokenizer_files`.

Files read from the directory:
- `tokenizer.json` (required): the fast tokenizer.
- `tokenizer_config.json` (optional): `bos_token`, `eos_token`, `pad_token`, `unk_token`
  (strings, `{"content": ...}` dicts or null), `chat_template`,
  `clean_up_tokenization_spaces` (as in transformers 5: ignored when `tokenizer.json`'s model
  is BPE, as for Llama 3 and Qwen, unless
  `clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output` is also true).
- `generation_config.json` (optional): `eos_token_id` (an int or a list), `pad_token_id`.
- `chat_template.jinja` (optional): takes priority over the config's `chat_template`,
  as in transformers.

Special ids, by precedence:
- BOS: the config's `bos_token`, and nothing else. Without one (Qwen: null) `has_bos` is
  False, `encode(add_bos=True)` adds nothing, and `bos_id` equals `pad_id` (the protocol
  wants an int; decode drops it). generation_config's `bos_token_id` is ignored: Qwen2.5
  names `<|endoftext|>` there but never prepends it.
- EOS: `eos_ids` is the config's `eos_token` followed by generation_config's
  `eos_token_id`s, duplicates dropped, order kept (Llama 3.1 Instruct: `<|eot_id|>`, then
  `<|end_of_text|>`, `<|eom_id|>`); `eos_id = eos_ids[0]`. One of the two is required.
- pad: the config's `pad_token`, else generation_config's `pad_token_id`, else `eos_id`.
A special token string missing from the vocabulary, or a generation_config id outside it,
is an error that names the file.

Not supported (transformers features that RL prompts do not need): `special_tokens_map.json`
and `added_tokens_decoder` entries absent from `tokenizer.json`, `continue_final_message`,
`sanitize_control_tokens` (control-token text inside messages is parsed as the token, as
transformers does by default), aliasing `reasoning`/`thinking` message fields, and
assistant masks (`{% generation %}` blocks render their body but record nothing).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import itertools
import json
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.sandbox
import jinja2.utils
import numpy as np
import tokenizers

from grpo_jax.models import gguf_import

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
GENERATION_FILE = "generation_config.json"
TEMPLATE_FILE = "chat_template.jinja"
# transformers' opt-in to the clean-up for BPE models (tokenizer_config.json key).
FORCE_BPE_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
# The named special tokens transformers passes to chat templates (when set).
TEMPLATE_TOKENS = (
  "bos_token",
  "eos_token",
  "unk_token",
  "sep_token",
  "pad_token",
  "cls_token",
  "mask_token",
)
# transformers refuses older jinja2: chat templates from the Hub are untrusted code, and
# earlier versions have sandbox escapes.
MIN_JINJA = (3, 1, 6)


class ChatTemplateError(ValueError):
  """A chat template failed to render (its own `raise_exception`, or a jinja error)."""


@dataclasses.dataclass(frozen=True)
class Files:
  """The text of a checkpoint's tokenizer files: all an HFTokenizer needs (and pickles).

  `None` means the file is absent.
  """

  directory: str
  tokenizer_json: str
  config_json: str | None = None
  generation_json: str | None = None
  template_jinja: str | None = None


def load(path: str | os.PathLike) -> HFTokenizer:
  """Reads the tokenizer files of the checkpoint directory `path` (see the module docstring),
  or of a GGUF source."""
  if gguf_import.is_source(path):
    files = gguf_import.tokenizer_files(path)
    return HFTokenizer(
      Files(
        directory=str(gguf_import.resolve(path)),
        tokenizer_json=files[TOKENIZER_FILE],
        config_json=files[CONFIG_FILE],
        generation_json=files[GENERATION_FILE],
      )
    )
  directory = pathlib.Path(path)
  if not directory.is_dir():
    raise FileNotFoundError(
      f"Tokenizer directory {directory} does not exist (expected a directory holding {TOKENIZER_FILE})."
    )
  if not (directory / TOKENIZER_FILE).is_file():
    raise FileNotFoundError(
      f"{directory} has no {TOKENIZER_FILE}: expected a Hugging Face fast tokenizer file there "
      "(slow-only tokenizers such as a bare tokenizer.model are not supported)."
    )
  return HFTokenizer(
    Files(
      directory=str(directory),
      tokenizer_json=(directory / TOKENIZER_FILE).read_text(encoding="utf-8"),
      config_json=_read_optional(directory / CONFIG_FILE),
      generation_json=_read_optional(directory / GENERATION_FILE),
      template_jinja=_read_optional(directory / TEMPLATE_FILE),
    )
  )


def _read_optional(path: pathlib.Path) -> str | None:
  return path.read_text(encoding="utf-8") if path.is_file() else None


class HFTokenizer:
  """A `tokenizers.Tokenizer` with the special ids and chat template of its checkpoint.

  Rules:
  - `encode` never adds the tokenizer's own post-processor specials
    (`add_special_tokens=False`); `add_bos` prepends `bos_id` when the model has a BOS and
    the text does not already start with it (no double BOS); `add_eos` appends `eos_id`.
    Special-token text in `text` (`<|im_start|>`) becomes that token's id, as a prompt or
    a rendered chat needs; with `special=False` it is ordinary text (e.g. "<", "|", "im",
    ...), as an environment's observation needs: a tool that prints "<|im_end|>" must not
    put an end-of-turn (EOS) id in the model's context. `add_special_tokens=False` alone
    does not do that (it only stops the post-processor's additions); `special=False`
    encodes with a second `tokenizers.Tokenizer` whose `encode_special_tokens` is set once
    when it is made, since that flag belongs to the whole object: toggling it on the
    shared one would race with threads encoding prompts. Added tokens that are not
    special (Qwen3's "<think>") still match their text either way; none ends a turn.
  - `decode` drops leading pad/BOS ids (left padding, even when pad is an EOS id), stops at
    the first EOS id, drops pad/BOS ids and skips special tokens.
  - `decode` and `decode_all` drop ids at or past `vocab_size` (the padding rows of a model
    table larger than the tokenizer's, as in Qwen; transformers drops them too); a negative
    id is an error.
  - `vocab_size` is one past the largest id, added tokens included.
  Pickles as its `Files` and reloads from them (the reward pool pickles tasks).
  """

  def __init__(self, files: Files):
    self.files = files
    self.path = os.path.join(files.directory, TOKENIZER_FILE)
    self._tok = _parse_tokenizer(files.tokenizer_json, path=self.path)
    self.vocab_size = max(self._tok.get_vocab(with_added_tokens=True).values()) + 1
    config = _parse_json(files.config_json, path=self._file(CONFIG_FILE))
    generation = _parse_json(files.generation_json, path=self._file(GENERATION_FILE))
    tokens = {
      n: _content(config.get(n), name=n, path=self._file(CONFIG_FILE)) for n in TEMPLATE_TOKENS
    }
    self.special_tokens = {n: t for n, t in tokens.items() if t is not None}
    self.eos_ids = self._resolve_eos(generation)
    self.eos_id = self.eos_ids[0]
    self.pad_id = self._resolve_pad(generation)
    self.has_bos = "bos_token" in self.special_tokens
    self.bos_id = self._token_id("bos_token") if self.has_bos else self.pad_id
    # transformers 5 skips the clean-up for BPE models (it would eat real spaces before
    # punctuation) unless the config forces it with the long flag below.
    self.clean_up_spaces = bool(config.get("clean_up_tokenization_spaces", False)) and (
      type(self._tok.model).__name__ != "BPE" or bool(config.get(FORCE_BPE_CLEAN_UP, False))
    )
    self.chat_template = (
      files.template_jinja if files.template_jinja is not None else config.get("chat_template")
    )
    self._compiled: dict[str, jinja2.Template] = {}

  def __getstate__(self) -> dict:
    return dataclasses.asdict(self.files)

  def __setstate__(self, state: dict):
    self.__init__(Files(**state))

  def __repr__(self) -> str:
    return (
      f"HFTokenizer({self.files.directory!r}, vocab_size={self.vocab_size}, eos_ids={self.eos_ids})"
    )

  # ---------------------------------------------------------------- Special ids

  def _file(self, name: str) -> str:
    return os.path.join(self.files.directory, name)

  def _token_id(self, name: str) -> int:
    token = self.special_tokens[name]
    i = self._tok.token_to_id(token)
    if i is None:
      raise ValueError(
        f"{self._file(CONFIG_FILE)}: {name} {token!r} is not in the vocabulary of {self.path}."
      )
    return i

  def _generation_ids(self, generation: dict, key: str) -> list[int]:
    value = generation.get(key)
    ids = [] if value is None else value if isinstance(value, list) else [value]
    for i in ids:
      if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.vocab_size:
        raise ValueError(
          f"{self._file(GENERATION_FILE)}: {key} must be an int or a list of ints in "
          f"[0, {self.vocab_size}) (the vocabulary of {self.path}), got {value!r}."
        )
    return ids

  def _resolve_eos(self, generation: dict) -> tuple[int, ...]:
    ids = [self._token_id("eos_token")] if "eos_token" in self.special_tokens else []
    ids += self._generation_ids(generation, "eos_token_id")
    if not ids:
      raise ValueError(
        f"No EOS token: neither {self._file(CONFIG_FILE)} (eos_token) nor "
        f"{self._file(GENERATION_FILE)} (eos_token_id) names one."
      )
    return tuple(dict.fromkeys(ids))

  def _resolve_pad(self, generation: dict) -> int:
    if "pad_token" in self.special_tokens:
      return self._token_id("pad_token")
    return next(iter(self._generation_ids(generation, "pad_token_id")), self.eos_id)

  # ---------------------------------------------------------------- Text <-> ids

  def encode(
    self, text: str, *, add_bos: bool = False, add_eos: bool = False, special: bool = True
  ) -> list[int]:
    """`text`'s ids (class docstring); special=False: special-token text is plain text."""
    tok = self._tok if special else self._text_tok
    ids = tok.encode(text, add_special_tokens=False).ids
    if add_bos and self.has_bos and ids[:1] != [self.bos_id]:
      ids = [self.bos_id, *ids]
    return ids + [self.eos_id] * add_eos

  @functools.cached_property
  def _text_tok(self) -> tokenizers.Tokenizer:
    """The tokenizer of `encode(special=False)`: special-token text encodes as text. Made on
    first use (most processes never encode an observation), configured before anyone sees
    it, never toggled."""
    tok = _parse_tokenizer(self.files.tokenizer_json, path=self.path)
    tok.encode_special_tokens = True
    return tok

  def decode(self, ids: Sequence[int]) -> str:
    ids = self._known_ids(ids)
    skip = (self.pad_id, self.bos_id)
    kept = []
    for i in itertools.dropwhile(lambda i: i in skip, ids):
      if i in self.eos_ids:
        break
      if i not in skip:
        kept.append(i)
    return self._decode(kept, skip_special_tokens=True)

  def decode_all(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """Every id as text, EOS and padding included (for debugging)."""
    return self._decode(self._known_ids(ids), skip_special_tokens=skip_special_tokens)

  def token_str(self, i: int) -> str:
    """The vocabulary entry of one id, specials included (byte-level BPE shows 'Ġ' for a space)."""
    token = self._tok.id_to_token(int(i))
    if token is None:
      raise ValueError(
        f"Token id {i} is not in the vocabulary of {self.path} (size {self.vocab_size})."
      )
    return token

  def _known_ids(self, ids: Sequence[int]) -> list[int]:
    ids = [int(i) for i in ids]
    if any(i < 0 for i in ids):
      raise ValueError(f"Negative token id {min(ids)} given to the tokenizer of {self.path}.")
    return [i for i in ids if i < self.vocab_size]

  def _decode(self, ids: list[int], *, skip_special_tokens: bool) -> str:
    text = self._tok.decode(ids, skip_special_tokens=skip_special_tokens)
    return _clean_up_spaces(text) if self.clean_up_spaces else text

  # ---------------------------------------------------------------- Chat

  def apply_chat_template(
    self,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **kwargs: Any,
  ) -> str:
    """Renders the chat template as transformers' `apply_chat_template(tokenize=False)`.

    The template sees `messages` (keys whose value is None dropped), `tools` (JSON schemas),
    `documents=None`, `add_generation_prompt`, the special token strings (`bos_token`,
    `eos_token`, ...) and `kwargs`, which override them. Everything passed is copied to plain
    JSON types first. A list of named templates uses "tool_use" when tools are given and it
    exists, else "default".
    """
    for pos, m in enumerate(messages):
      if not isinstance(m, Mapping):
        raise TypeError(f"Chat message {pos} must be a dict with 'role' and 'content', got {m!r}.")
    chat = [{k: v for k, v in _plain(m).items() if v is not None} for m in messages]
    context = {**self.special_tokens, **_plain(kwargs)}
    template = self._template(tools)
    try:
      return template.render(
        messages=chat,
        tools=_plain(tools),
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **context,
      )
    except jinja2.TemplateError as e:
      raise ChatTemplateError(
        f"The chat template of {self._template_where()} failed to render: {e}"
      ) from e

  def encode_chat(
    self,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **kwargs: Any,
  ) -> list[int]:
    """The rendered chat's ids: special-token text becomes the token's id and no BOS is
    added (templates that want one write `bos_token` themselves)."""
    text = self.apply_chat_template(
      messages, add_generation_prompt=add_generation_prompt, tools=tools, **kwargs
    )
    return self.encode(text)

  def _template_where(self) -> str:
    return (
      self._file(TEMPLATE_FILE)
      if self.files.template_jinja is not None
      else self._file(CONFIG_FILE)
    )

  def _template_source(self, tools) -> str:
    where = self._template_where()
    source = self.chat_template
    if source is None:
      raise ValueError(
        f"No chat template: {self._file(CONFIG_FILE)} has no chat_template and {self._file(TEMPLATE_FILE)} does not exist."
      )
    if isinstance(source, str):
      return source
    if not isinstance(source, list) or not all(
      isinstance(t, dict) and {"name", "template"} <= t.keys() for t in source
    ):
      raise ValueError(
        f"{where}: chat_template must be a string or a list of {{'name', 'template'}} dicts."
      )
    named = {t["name"]: t["template"] for t in source}
    if tools is not None and "tool_use" in named:
      return named["tool_use"]
    if "default" not in named:
      raise ValueError(f"{where}: chat templates {sorted(named)} include none named 'default'.")
    return named["default"]

  def _template(self, tools) -> jinja2.Template:
    source = self._template_source(tools)
    if source not in self._compiled:
      where = self._template_where()
      try:
        self._compiled[source] = _environment(where).from_string(source)
      except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"The chat template of {where} does not parse: {e}") from e
    return self._compiled[source]


def check_model_vocab(
  tokenizer: HFTokenizer, model_vocab_size: int, *, path: str | os.PathLike
) -> None:
  """Errors when the tokenizer has ids the model's embedding table (read from `path`) lacks.

  A larger model table is fine (Qwen pads its table past the tokenizer's size), as is an
  equal one.
  """
  if tokenizer.vocab_size > model_vocab_size:
    raise ValueError(
      f"Tokenizer {tokenizer.path} has {tokenizer.vocab_size} tokens but the model at {path} has a "
      f"vocabulary of {model_vocab_size}: ids {model_vocab_size}..{tokenizer.vocab_size - 1} would "
      "index past its embedding table (does the tokenizer belong to this checkpoint?)."
    )


# ---------------------------------------------------------------- File parsing


def _parse_json(text: str | None, *, path: str) -> dict:
  if text is None:
    return {}
  try:
    data = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON: {e}.") from e
  if not isinstance(data, dict):
    raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}.")
  return data


def _parse_tokenizer(text: str, *, path: str) -> tokenizers.Tokenizer:
  _parse_json(text, path=path)  # A clear error for malformed JSON before the library's.
  try:
    return tokenizers.Tokenizer.from_str(text)
  except Exception as e:  # The library raises a bare Exception.
    raise ValueError(
      f"{path} is not a tokenizers file the `tokenizers` library can read: {e}"
    ) from e


def _content(value: Any, *, name: str, path: str) -> str | None:
  """A special token given as a string, an AddedToken dict `{"content": ...}` or null."""
  if value is None or isinstance(value, str):
    return value
  if isinstance(value, dict) and isinstance(value.get("content"), str):
    return value["content"]
  raise ValueError(
    f"{path}: {name} must be a string, a dict with a 'content' string, or null; got {value!r}."
  )


def _clean_up_spaces(text: str) -> str:
  """transformers' `clean_up_tokenization`, applied when the config asks for it."""
  for before, after in (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
  ):
    text = text.replace(before, after)
  for suffix in ("m", "s", "ve", "re"):
    text = text.replace(f" '{suffix}", f"'{suffix}")
  return text


# ---------------------------------------------------------------- Jinja, as transformers


def _plain(value: Any) -> Any:
  """A copy made of JSON types only, so the sandboxed template never sees a rich object."""
  if value is None or type(value) in (str, int, float, bool):
    return value
  if isinstance(value, Mapping):
    return {_plain(k): _plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_plain(v) for v in value]
  for kind in (bool, str, int, float):  # Subclasses (numpy scalars, enums) lose their methods.
    if isinstance(value, kind):
      return kind(value)
  if isinstance(value, np.generic):
    return _plain(value.item())
  raise TypeError(
    f"Chat template inputs must be JSON-like (dict, list, str, number, bool, None); got {type(value).__name__}: {value!r}."
  )


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
  # jinja's own tojson escapes HTML characters; transformers overrides it like this.
  return json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
  )


def _strftime_now(fmt: str) -> str:
  return datetime.datetime.now().strftime(fmt)


class _TemplateDict:
  """`dict` for templates, without access to the type itself (as transformers)."""

  def __call__(self, *args, **kwargs) -> dict:
    return dict(*args, **kwargs)

  def fromkeys(self, *args, **kwargs) -> dict:
    return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
  """jinja's `namespace` refusing underscore attributes (CPython internals), as transformers."""

  def __init__(*args, **kwargs):
    self, args = args[0], args[1:]
    attrs = dict(*args, **kwargs)
    for name in attrs:
      _Namespace._check(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _Namespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(
        f"Chat templates cannot set underscore attribute {name!r} on a namespace."
      )


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` renders its body unchanged.

  HF templates mark assistant turns with it for `return_assistant_tokens_mask`;
  transformers' `AssistantTracker` renders the body as a call block (so a `set` inside
  does not leak out), and records nothing unless a mask is asked for. We never ask.
  """

  tags = {"generation"}

  def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

  def _render(self, caller: jinja2.runtime.Macro) -> str:
    return caller()


def _version(text: str) -> tuple[int, ...]:
  return tuple(
    int("".join(itertools.takewhile(str.isdigit, part)) or 0) for part in text.split(".")[:3]
  )


def _environment(where: str) -> jinja2.sandbox.ImmutableSandboxedEnvironment:
  """transformers' chat template environment; `raise_exception` names the template's file.

  Extensions as transformers: loop controls (`break`, `continue`) and `generation` (a no-op).
  """
  if _version(jinja2.__version__) < MIN_JINJA:
    raise ImportError(
      f"Chat templates need jinja2>={'.'.join(map(str, MIN_JINJA))} (sandbox fixes); found {jinja2.__version__}."
    )

  def raise_exception(message):
    raise ChatTemplateError(f"The chat template of {where} raised an error: {message}")

  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _Generation]
  )
  env.filters["tojson"] = _tojson
  env.globals.update(
    raise_exception=raise_exception,
    strftime_now=_strftime_now,
    dict=_TemplateDict(),
    namespace=_Namespace,
  )
  return env
