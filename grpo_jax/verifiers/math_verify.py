"""Math answer verification: extract a final answer, compare it with the gold answer.

    verdict = math_verify.verify(completion, gold)       # "correct" | "wrong" | "no_answer" | ...
    verdicts = math_verify.verify_batch(completions, golds, workers=2, timeout_s=5.0)
    math_verify.count_verdicts(verdicts)                 # {"correct": 3, "wrong": 1, ...}
    math_verify.verify(completion, gold, backend="builtin")   # the hand-written verifier

Verdicts. "correct": an answer was extracted and is equivalent to the gold. "wrong": one
was extracted and was not shown equivalent. "no_answer": nothing could be extracted.
"unscorable": the verifier could not decide: it raised, the gold answer does not parse
(``math_verify`` backend), or (``verify_batch``) it timed out or died. It is counted apart
from "wrong", so a broken or hanging verifier never reads as a bad policy; in training,
``MathReward.reward`` raises ``verdicts.Unscorable`` for it and the item is a reward error.

Backends (``backend=``, on ``verify``, ``verify_batch``, ``verification_pool`` and
``MathReward``):

* ``"math_verify"`` (default): Hugging Face's Math-Verify (PyPI ``math-verify``, imported
  as the top-level package ``math_verify``; this module is ``grpo_jax.verifiers.math_verify``). The
  completion is read by ``math_verify.parse`` with its default targets (LaTeX, boxed
  answers and plain numbers/expressions, with or without an "answer" anchor), the gold by
  the same parser from ``\\boxed{gold}`` (``hf_gold_text``: a gold that already holds
  ``$``, ``\\boxed``, ``\\(`` or ``\\[`` is parsed as is), and each (gold, prediction)
  pair is compared by ``math_verify.verify`` with its defaults (float_rounding=6,
  numeric_precision=15, strict=True). Its own timeouts (SIGALRM, which fail off the main
  thread and would fight the pool's) are off (``parsing_timeout=None``,
  ``timeout_seconds=None``), so the reward pool's hard kill is the only timeout; its errors
  are raised (``raise_on_error=True``) and become "unscorable", as does a gold it cannot
  parse. The prediction parses to nothing: "no_answer".
* ``"builtin"``: the hand-written verifier (below: extraction, normalisation, exact
  rational / tolerance / sympy equivalence through its own safe parser). Measured on 348
  labelled pairs (``experiments/results/verifier/verifier.md``) it made no false accept
  (math_verify: 3 of 69) and is two orders of magnitude faster per item, and it is exact
  on rationals (0.333333 != 1/3); but it reads only boxed, ``####`` and "answer is"
  answers and no equations, inequalities or decimal commas, so it rejects most correct
  answers written any other way (agreement 51% against 92%; 92% against 98% on completions
  with a box). Use it where answers are boxed by construction and speed or zero false
  accepts matter more than recall. (Math-Verify hands sympy's ``parse_expr`` only strings
  of digits and operators; LaTeX goes through its ANTLR grammar.)

Deliberate differences from what TRL / verl users get with Math-Verify:

* TRL's ``accuracy_reward`` parses the gold as is (a bare LaTeX gold such as
  ``\\text{Evelyn}`` or ``(3,2)`` parses to nothing and the example is skipped) and the
  completion with LaTeX targets only (boxed tried first, nothing extracted without a box
  or an "answer" anchor, first match only), and keeps math_verify's SIGALRM timeouts on
  the main thread. Here the gold is boxed first (as verl does) and the completion is read
  with the library defaults, so "The answer is 42", "I think it is 5" or a final
  ``$x = 3$`` earns the reward without ``\\boxed{}``: more lenient than TRL.
* verl's ``math_verify.compute_score`` reads predictions with the same targets and boxes
  every gold (LaTeX target only), but runs through ``math_metric`` (SIGALRM timeouts) and
  scores an exception or a timeout 0.0, a wrong answer; here both are reward errors
  (excluded from the update, counted in ``reward_errors``).
* Numbers: Math-Verify compares floats rounded to 6 decimals, so 0.333333 == 1/3 and
  1.4142136 == sqrt(2) but 1.4142 != sqrt(2); the builtin backend instead needs two
  rationals to be exactly equal and irrationals within rel_tol=1e-6 (``rel_tol`` and
  ``abs_tol`` apply to the builtin backend only). Lists without brackets (``2, 3``) and
  sets are unordered in both backends (verl's hendrycks-style ``math`` reward compares
  strings, so order matters there); tuples and intervals are ordered. A percent sign:
  28% == 28 and 28% == 0.28 in both; 5000% == 50 in math_verify only.
* ``format_reward`` (the template check) uses the builtin extraction in both backends:
  "an answer is there" means a boxed / ``####`` / "answer is" answer, not any number.

The builtin backend is four modules, each with its rules in its docstring; this module
re-exports their entry points (``math_verify.extract_answer``, ``normalize``, ``parse``,
``is_equiv``, ...):

* ``math_extract``: the final answer in the text (``extract_answer``, ``last_boxed``):
  boxed, ``####`` or "answer is"; no "last number in the text" fallback.
* ``math_normalize``: LaTeX and plain text to one calculator-style string (``normalize``).
* ``math_parse``: that string to sympy through a small recursive-descent parser that never
  calls ``eval`` (``parse``, ``ParseError``, ``MAX_TOKENS``, ``MAX_DEPTH``).
* ``math_equiv``: equivalence by structure (tuples, intervals, sets, matrices), then exact
  rationals, a tolerance or ``simplify`` (``is_equiv``, ``REL_TOL``, ``ABS_TOL``).

Timeouts. A parsed expression can still be arbitrarily expensive (``9^{9^{9^{9}}}``
evaluates eagerly; ``simplify`` can run for hours; Math-Verify calls sympy's ``simplify``
and ``solve`` too), and a thread cannot be stopped, so ``verify_batch`` scores items in
worker processes through ``reward_pool.RewardPool``: an item that runs past ``timeout_s`` has
its worker killed (SIGKILL) and replaced, the item is "unscorable" and the rest of the
batch is scored by the other workers. This works from any thread (no signals). ``verify``
and ``is_equiv`` called directly have no timeout.

Training. ``MathReward`` is the ``RewardPool`` task: ``reward(gold, completion)`` takes
the ground-truth answer where the ``Task`` protocol has the prompt, which is what the
trainer passes for a task whose ``reward_input(example)`` returns ``example.answer``
(``tasks.base.Task``): ``pool.score([ex.answer for ex in batch], completions)``. A dataset
task's ``reward``/``format_reward`` can delegate to a ``MathReward``. The pool pickles
the task once per worker, so the answer travels per item and no dataset is pickled.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import logging
import re
from collections.abc import Iterable, Sequence
from typing import Literal

from grpo_jax.verifiers import (
  math_equiv,
  math_extract,
  math_normalize,
  math_parse,
  reward_pool,
  verdicts,
)

Verdict = Literal["correct", "wrong", "no_answer", "unscorable"]
VERDICTS: tuple[Verdict, ...] = ("correct", "wrong", "no_answer", "unscorable")
Backend = Literal["math_verify", "builtin"]
BACKENDS: tuple[Backend, ...] = ("math_verify", "builtin")
DEFAULT_BACKEND: Backend = "math_verify"


# The builtin backend's entry points, re-exported (module docstring).
extract_answer = math_extract.extract_answer
last_boxed = math_extract.last_boxed
normalize = math_normalize.normalize
ParseError = math_parse.ParseError
parse = math_parse.parse
MAX_TOKENS = math_parse.MAX_TOKENS
MAX_DEPTH = math_parse.MAX_DEPTH
is_equiv = math_equiv.is_equiv
REL_TOL = math_equiv.REL_TOL
ABS_TOL = math_equiv.ABS_TOL

# -------------------------------------------------------------------------- Verification


def _builtin_verify(
  completion: str, gold: str, *, answer_tag: str | None, rel_tol: float, abs_tol: float
) -> Verdict:
  pred = extract_answer(completion, answer_tag=answer_tag)
  if pred is None:
    return "no_answer"
  return "correct" if is_equiv(pred, gold, rel_tol=rel_tol, abs_tol=abs_tol) else "wrong"


def verify(
  completion: str,
  gold: str,
  *,
  answer_tag: str | None = None,
  rel_tol: float = REL_TOL,
  abs_tol: float = ABS_TOL,
  backend: Backend = DEFAULT_BACKEND,
) -> Verdict:
  """The verdict for one completion against its gold answer. No timeout (see Timeouts).

  "no_answer" if nothing is extracted, else "correct" / "wrong"; "unscorable" if the
  backend cannot decide: it raised, or (``math_verify``) the gold answer does not parse.
  ``rel_tol``/``abs_tol`` apply to ``backend="builtin"`` only. ``answer_tag``: only the
  body of the last ``<answer_tag>...</answer_tag>`` block is read, none is "no_answer".
  """
  check_backend(backend)
  if backend == "math_verify":
    _hf()  # An import failure is a configuration error, raised, not a verdict.
  try:
    if backend == "builtin":
      return _builtin_verify(
        completion, gold, answer_tag=answer_tag, rel_tol=rel_tol, abs_tol=abs_tol
      )
    return _hf_verify(completion, gold, answer_tag=answer_tag)
  except Exception:  # noqa: BLE001 -- a verifier that raises has not decided.
    return "unscorable"


def has_answer(completion: str, *, answer_tag: str | None = None, backend: Backend) -> bool:
  """True if ``backend`` extracts an answer from the completion (any answer, right or not)."""
  check_backend(backend)
  if backend == "builtin":
    return extract_answer(completion, answer_tag=answer_tag) is not None
  text = completion if answer_tag is None else math_extract.tag_body(completion, answer_tag)
  try:
    return text is not None and bool(_hf_parse(text))
  except Exception:  # noqa: BLE001 -- as in verify: nothing decided, nothing extracted.
    return False


# --------------------------------------------------------------- Hugging Face backend

_HF_NO_TIMEOUT_NOTICE = "Timeout is disabled"


class _DropNoTimeoutNotice(logging.Filter):
  """math_verify warns once per process that its timeout is off; ours is the pool's."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_HF_NO_TIMEOUT_NOTICE)


@functools.cache
def _hf():
  """The ``math_verify`` package from PyPI (``math-verify``), imported on first use.

  ``import math_verify`` inside this module finds the top-level package, not this file
  (``grpo_jax.verifiers.math_verify``), unless this file's own directory is on sys.path (running it
  as a script); that case is refused rather than silently importing ourselves.
  """
  module = importlib.import_module("math_verify")
  if getattr(module, "__file__", None) == __file__ or not hasattr(module, "LatexExtractionConfig"):
    raise ImportError(
      f"'import math_verify' found {getattr(module, '__file__', module)!r}, not Hugging Face's "
      "math-verify package; install it (pip install math-verify) and do not run "
      "grpo_jax/verifiers/math_verify.py as a script."
    )
  for name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(name).addFilter(_DropNoTimeoutNotice())
  return module


def check_backend(backend: str) -> None:
  """Raises ValueError for an unknown backend, ImportError if ``math_verify`` is missing."""
  if backend not in BACKENDS:
    raise ValueError(f"Unknown math verifier backend {backend!r}; valid: {list(BACKENDS)}.")
  if backend == "math_verify" and importlib.util.find_spec("math_verify") is None:
    raise ImportError(
      "backend='math_verify' needs Hugging Face's math-verify package: pip install "
      "'math-verify>=0.9,<0.10' (or choose backend='builtin')."
    )


_UNESCAPED_DOLLAR = re.compile(r"(?<!\\)\$")
_LATEX_ENV = re.compile(r"\\boxed|\\fbox|\\\(|\\\[")


def hf_gold_text(gold: str) -> str:
  """The gold answer as ``math_verify`` parses it: ``\\boxed{gold}``, as verl does, unless
  it already holds a math environment (an unescaped ``$``, ``\\boxed``, ``\\(``, ``\\[``).

  A bare gold such as ``\\text{Evelyn}``, ``(3,2)`` or ``x \\in [-2,7]`` holds no
  delimiter its parser would find, so unwrapped it parses to nothing (TRL then skips the
  example) or to a stray number (``x \\leq 5`` -> 5).
  """
  if _UNESCAPED_DOLLAR.search(gold) or _LATEX_ENV.search(gold):
    return gold
  return f"\\boxed{{{gold}}}"


@functools.lru_cache(maxsize=1024)
def _hf_parse(text: str) -> tuple:
  """``math_verify.parse`` with its default targets (LaTeX and plain expressions), its
  signal-based timeout off and errors raised; cached (a group's G completions share one
  gold, and a completion is read twice by the verification pool)."""
  hf = _hf()
  parsed = hf.parse(
    text,
    extraction_config=[hf.LatexExtractionConfig(), hf.ExprExtractionConfig()],
    parsing_timeout=None,
    raise_on_error=True,
  )
  return tuple(parsed)


def _hf_verify(completion: str, gold: str, *, answer_tag: str | None) -> Verdict:
  """Verdict of ``math_verify``: every (gold, prediction) pair of the parses is compared
  (its ``verify`` with defaults: float_rounding=6, numeric_precision=15, strict=True) with
  its timeout off and errors raised; a pair that raises makes the item "unscorable" unless
  another pair matches."""
  hf = _hf()
  golds = _hf_parse(hf_gold_text(gold))
  if not golds:
    raise ValueError(f"math_verify cannot parse the gold answer {gold!r:.80}")
  text = completion if answer_tag is None else math_extract.tag_body(completion, answer_tag)
  preds = _hf_parse(text) if text is not None else ()
  if not preds:
    return "no_answer"
  error = None
  for g in golds:
    for p in preds:
      try:
        if hf.verify(g, p, timeout_seconds=None, raise_on_error=True):
          return "correct"
      except Exception as e:  # noqa: BLE001 -- undecided, unless another pair matches.
        error = e
  if error is not None:
    raise error
  return "wrong"


# ------------------------------------------------------------------------ Format reward


def format_reward(
  completion: str, *, tags: Sequence[str] = ("think",), answer_tag: str | None = None
) -> float:
  """1.0 if the completion follows the template, else 0.0; correctness is not checked.

  Rule: each of ``<t>`` and ``</t>`` for t in ``tags`` (and ``answer_tag``) occurs exactly
  once, and the completion is, up to whitespace between the pieces,
  ``<t1>...</t1><t2>...</t2>...<tk>...</tk>R``. Without ``answer_tag``, R must contain an
  extractable final answer (``extract_answer(R)`` is not None; "\\boxed{}" is not one).
  With it, R must be ``<answer_tag>B</answer_tag>`` with B not blank and nothing after it.
  With tags=() and no answer_tag: 1.0 iff an answer can be extracted.
  """
  all_tags = [*tags, *([answer_tag] if answer_tag is not None else [])]
  if any(completion.count(f"<{t}>") != 1 or completion.count(f"</{t}>") != 1 for t in all_tags):
    return 0.0
  blocks = "".join(rf"\s*<{re.escape(t)}>.*?</{re.escape(t)}>" for t in tags)
  m = re.fullmatch(rf"{blocks}(?P<rest>.*)", completion, re.DOTALL)
  if m is None:
    return 0.0
  rest = m["rest"]
  if answer_tag is None:
    return float(extract_answer(rest) is not None)
  t = re.escape(answer_tag)
  answer = re.fullmatch(rf"\s*<{t}>(?P<body>.*)</{t}>\s*", rest, re.DOTALL)
  return float(answer is not None and bool(answer["body"].strip()))


# ------------------------------------------------------------------- RewardPool adaptors


@dataclasses.dataclass(frozen=True)
class MathReward:
  """The ``RewardPool`` task for math: the first argument is the gold answer, not a prompt.

  ``reward(gold, completion)`` = 1.0 if ``verify(...) == "correct"`` else 0.0, and raises
  ``verdicts.Unscorable`` when the verdict is "unscorable" (the pool counts the item in
  ``reward_errors``, apart from wrong answers); ``format_reward(gold, completion)`` =
  ``format_reward(completion, tags=..., answer_tag=...)`` whatever the backend.
  Use: ``reward_pool.RewardPool(MathReward(), ...).score([ex.answer ...], completions)``.
  A timeout shows as ``Scores.timeout_N`` (reward 0, counted in ``reward_errors``).
  Construction fails early (ImportError) if the backend's package is missing.
  """

  tags: tuple[str, ...] = ("think",)
  answer_tag: str | None = None
  rel_tol: float = REL_TOL
  abs_tol: float = ABS_TOL
  backend: Backend = DEFAULT_BACKEND

  def __post_init__(self):
    check_backend(self.backend)

  def verdict(self, gold: str, completion: str) -> Verdict:
    return verify(
      completion,
      gold,
      answer_tag=self.answer_tag,
      rel_tol=self.rel_tol,
      abs_tol=self.abs_tol,
      backend=self.backend,
    )

  def reward(self, gold: str, completion: str) -> float:
    verdict = self.verdict(gold, completion)
    if verdict == "unscorable":
      raise verdicts.Unscorable(
        f"{self.backend} cannot decide gold {gold!r:.80} vs completion {completion[-200:]!r}"
      )
    return float(verdict == "correct")

  def format_reward(self, gold: str, completion: str) -> float:
    del gold  # The template does not depend on the answer.
    return format_reward(completion, tags=self.tags, answer_tag=self.answer_tag)


@dataclasses.dataclass(frozen=True)
class _Judge(MathReward):
  """Pool task for ``verify_batch``: reward = correct, format_reward = an answer exists."""

  def format_reward(self, gold: str, completion: str) -> float:
    del gold
    return float(has_answer(completion, answer_tag=self.answer_tag, backend=self.backend))


def verification_pool(
  *,
  workers: int = 2,
  timeout_s: float = 5.0,
  answer_tag: str | None = None,
  rel_tol: float = REL_TOL,
  abs_tol: float = ABS_TOL,
  backend: Backend = DEFAULT_BACKEND,
) -> reward_pool.RewardPool:
  """A pool for ``verify_batch(..., pool=...)``; reuse it across batches, then close it."""
  judge = _Judge(answer_tag=answer_tag, rel_tol=rel_tol, abs_tol=abs_tol, backend=backend)
  return reward_pool.RewardPool(judge, workers=workers, timeout_s=timeout_s)


def verdicts_from_scores(scores: verdicts.Scores) -> list[Verdict]:
  """Verdicts from a ``verification_pool``'s Scores: error -> "unscorable", then by value."""
  out: list[Verdict] = []
  for correct, answered, error in zip(scores.correct_N, scores.format_N, scores.error_N):
    if error:
      out.append("unscorable")
    elif correct == 1.0:
      out.append("correct")
    else:
      out.append("wrong" if answered == 1.0 else "no_answer")
  return out


def verify_batch(
  completions: Sequence[str],
  golds: Sequence[str],
  *,
  pool: reward_pool.RewardPool | None = None,
  workers: int = 2,
  timeout_s: float = 5.0,
  backend: Backend = DEFAULT_BACKEND,
) -> list[Verdict]:
  """verdicts[i] for (completions[i], golds[i]) with a hard per-item timeout.

  Items run in worker processes (``reward_pool.RewardPool``); one that takes longer than
  ``timeout_s``, raises (``verdicts.Unscorable`` included) or kills its worker is
  "unscorable" while the other workers score the rest, so a batch with k hanging items
  takes about k * timeout_s / workers extra. ``pool``: a ``verification_pool`` to reuse
  (then workers, timeout_s and backend are the pool's); without one, a pool is started
  (~0.5 s) and closed for this call. Safe off the main thread; workers=0 scores inline
  with no timeout.
  """
  if len(completions) != len(golds):
    raise ValueError(f"{len(completions)} completions but {len(golds)} gold answers.")
  if pool is not None:
    if not isinstance(pool.task, _Judge):
      raise TypeError(f"verify_batch needs a pool from verification_pool(), got {pool.task!r}.")
    return verdicts_from_scores(pool.score(list(golds), list(completions)))
  with verification_pool(workers=workers, timeout_s=timeout_s, backend=backend) as own_pool:
    return verdicts_from_scores(own_pool.score(list(golds), list(completions)))


def count_verdicts(verdicts: Iterable[str]) -> dict[str, int]:
  """{"correct": n, "wrong": n, "no_answer": n, "unscorable": n}: every key, zeros too."""
  counts = dict.fromkeys(VERDICTS, 0)
  for v in verdicts:
    if v not in counts:
      raise ValueError(f"Unknown verdict {v!r}; verdicts are {VERDICTS}.")
    counts[v] += 1
  return counts
