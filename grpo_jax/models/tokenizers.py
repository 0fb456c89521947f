"""Tokenizer protocol and the character-level tokenizer of the toy tasks.

Real Hugging Face tokenizers implement the same protocol (see the real-models issue).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
  """What the sampler, tasks and trainer need from a tokenizer."""

  @property
  def bos_id(self) -> int: ...

  @property
  def eos_id(self) -> int: ...

  @property
  def eos_ids(self) -> tuple[int, ...]: ...

  @property
  def pad_id(self) -> int: ...

  @property
  def vocab_size(self) -> int: ...

  def encode(
    self, text: str, *, add_bos: bool = False, add_eos: bool = False, special: bool = True
  ) -> list[int]:
    """`text`'s ids. special=True (prompts, chat templates): special-token text such as
    "<|im_end|>" may become that special token's id; special=False (an environment's
    observations, text a tool produced): it is ordinary text, never a special id."""
    ...

  def decode(self, ids: Sequence[int]) -> str: ...


class CharTokenizer:
  """One token per character of a fixed alphabet, after <pad>=0, <bos>=1, <eos>=2.

  decode() drops <pad>/<bos> and stops at the first <eos>. A character outside the
  alphabet is an error that names it. Text never becomes a special id (the text "<eos>"
  is five characters), so encode's `special` changes nothing here.
  """

  SPECIALS = ("<pad>", "<bos>", "<eos>")

  def __init__(self, alphabet: str):
    if len(set(alphabet)) != len(alphabet):
      dup = sorted({c for c in alphabet if alphabet.count(c) > 1})
      raise ValueError(f"CharTokenizer alphabet repeats characters {dup!r}.")
    self.alphabet = alphabet
    self._ids = {c: i + len(self.SPECIALS) for i, c in enumerate(alphabet)}

  pad_id = 0
  bos_id = 1
  eos_id = 2

  @property
  def eos_ids(self) -> tuple[int, ...]:
    return (self.eos_id,)

  @property
  def vocab_size(self) -> int:
    return len(self.SPECIALS) + len(self.alphabet)

  def encode(
    self, text: str, *, add_bos: bool = False, add_eos: bool = False, special: bool = True
  ) -> list[int]:
    del special  # Only the specials' ids are special (class docstring).
    ids = []
    for pos, c in enumerate(text):
      if c not in self._ids:
        raise ValueError(
          f"Character {c!r} at position {pos} of {text!r} is not in the tokenizer alphabet {self.alphabet!r}."
        )
      ids.append(self._ids[c])
    return [self.bos_id] * add_bos + ids + [self.eos_id] * add_eos

  def decode(self, ids: Sequence[int]) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i == self.eos_id:
        break
      if i in (self.pad_id, self.bos_id):
        continue
      if not 0 <= i < self.vocab_size:
        raise ValueError(f"Token id {i} is outside this tokenizer's vocab [0, {self.vocab_size}).")
      out.append(self.alphabet[i - len(self.SPECIALS)])
    return "".join(out)

  def token_str(self, i: int) -> str:
    """Readable name of one id (specials included)."""
    return self.SPECIALS[i] if i < len(self.SPECIALS) else self.alphabet[i - len(self.SPECIALS)]
