"""Bradley–Terry reward models: our decoder with a scalar head on the last real token.

    r_θ(x, y) = w · h(x ⊕ y)[t*] + b,        t* the last non-pad position,
    ℓ(x, y_c, y_r) = −log σ(r_θ(x, y_c) − r_θ(x, y_r) − m)     (m: the margin, 0 by default),
    pair accuracy  = share of pairs with r_θ(x, y_c) > r_θ(x, y_r) (a tie counts as wrong),

with h the decoder's final-normed hidden states (`model.apply(hidden_only=True)`) and
x ⊕ y the token ids of BOS + prompt + completion, right-padded (causal attention: no real
token sees a pad). Source: Bradley & Terry (1952); the pairwise loss of Ouyang et al.
(InstructGPT, arXiv 2203.02155, eq. 1); the margin of Llama 2 (arXiv 2307.09288, eq. 2).
Pooling on the last non-pad token is what transformers' `*ForSequenceClassification`
heads do, so their weights load (`from_hf`); rows are BOS + prompt + completion text, with
no chat template (see `load`).

    params = reward_model.init(cfg, key)                       # {"model": ..., "head": ...}
    r_B = reward_model.score(params, tokens_BT, mask_BT, cfg=cfg)
    loss, metrics = reward_model.pair_loss(params, batch, cfg=cfg, margin=0.0)

Training is `grpo-jax rm-train --config=configs/reward_model.py:tiny --workdir=DIR`
(`grpo_jax.trainer.rm_train`): JSONL pairs {"prompt", "chosen", "rejected"} (`read_pairs`), held-out pair
accuracy every `eval_every` steps, checkpoints in DIR/checkpoints (resumed on rerun) and
metrics in DIR/metrics.jsonl. An RL run reads the model back with `load(DIR)`
(`reward_sources`, kind "reward_model"), which rebuilds it from DIR/reward_model.json (`record`).

Hand-written because no JAX library trains a reward model on a Flax decoder of ours
(TRL's RewardTrainer is torch); the loss is three lines.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax import tasks
from grpo_jax.infra import checkpoint, jsonl
from grpo_jax.models import families, hf, model, sampling
from grpo_jax.tasks import base as task_base

PAIR_KEYS = ("prompt", "chosen", "rejected")
INITS = ("random", "hf")
HEAD_TENSOR = "score.weight"  # transformers' [num_labels, hidden] head (no bias).
RECORD = "reward_model.json"  # What `load` rebuilds the model from (`record`).


class PairsError(ValueError):
  """A preference file that cannot be read: which file, which line, what is wrong."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardModelConfig:
  """config.reward_model: what `grpo-jax rm-train` trains on and how."""

  train_path: str = ""  # JSONL, one {"prompt", "chosen", "rejected"} per line.
  # Held-out pairs (JSONL); "": the pairs of train_path whose prompt hashes into the
  # eval_percent test split (`tasks.base.split_of`: a prompt is never on both sides).
  eval_path: str = ""
  eval_percent: int = 10
  steps: int = 300
  batch_size: int = 32  # Pairs per step (2 × batch_size rows through the model).
  learning_rate: float = 1e-3
  weight_decay: float = 0.0
  margin: float = 0.0  # m in −log σ(r_c − r_r − m).
  max_len: int = 128  # Tokens of BOS + prompt + completion; longer rows keep their last ones.
  init: str = "random"  # "random", or "hf": config.hf_dir's weights (a causal LM or a
  # *ForSequenceClassification checkpoint, whose score head is kept).
  eval_every: int = 50
  checkpoint_every: int = 100
  seed: int = 0

  def __post_init__(self):
    for name in ("steps", "batch_size", "max_len", "eval_every", "checkpoint_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"config.reward_model.{name}={getattr(self, name)}: must be >= 1.")
    if not 0 < self.eval_percent < 100:
      raise ValueError(f"config.reward_model.eval_percent={self.eval_percent}: must be in 1..99.")
    if self.init not in INITS:
      raise ValueError(f"config.reward_model.init={self.init!r}; allowed: {INITS}.")
    if self.learning_rate <= 0 or self.margin < 0 or self.weight_decay < 0:
      raise ValueError(
        "config.reward_model: learning_rate must be > 0, margin and weight_decay >= 0; got "
        f"{self.learning_rate}, {self.margin}, {self.weight_decay}."
      )


# ----------------------------------------------------------------------------
# Data: JSONL pairs -> right-padded token rows.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pair:
  prompt: str
  chosen: str
  rejected: str


def read_pairs(path) -> list[Pair]:
  """The pairs of a JSONL file; a bad line fails naming the file, the line and the fault."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise PairsError(f"{path}: no such preference file (JSONL of {list(PAIR_KEYS)}).")
  try:
    rows = jsonl.read(str(path))
  except ValueError as e:
    raise PairsError(str(e)) from None
  pairs = []
  for n, row in enumerate(rows, start=1):
    bad = [k for k in PAIR_KEYS if not isinstance(row.get(k), str)]
    if bad:
      raise PairsError(f"{path}: pair {n}: {bad} missing or not strings; each needs {PAIR_KEYS}.")
    pairs.append(Pair(row["prompt"], row["chosen"], row["rejected"]))
  if not pairs:
    raise PairsError(f"{path}: no pairs.")
  return pairs


def write_pairs(path, pairs: Sequence[Pair]) -> None:
  lines = [json.dumps(dataclasses.asdict(p)) for p in pairs]
  pathlib.Path(path).write_text("\n".join(lines) + "\n")


def split_pairs(pairs: Sequence[Pair], *, eval_percent: int) -> tuple[list[Pair], list[Pair]]:
  """(train, held-out) by a stable hash of the prompt."""
  test = [task_base.split_of(p.prompt, test_percent=eval_percent) == "test" for p in pairs]
  return [p for p, t in zip(pairs, test) if not t], [p for p, t in zip(pairs, test) if t]


def encode(tokenizer, prompt: str, completion: str, *, max_len: int) -> list[int]:
  """BOS + prompt + completion token ids, the last max_len of them."""
  ids = tokenizer.encode(prompt, add_bos=True) + tokenizer.encode(completion, add_bos=False)
  return ids[-max_len:]


def pad_rows(rows: Sequence[Sequence[int]], *, pad_id: int, max_len: int, n_rows: int = 0):
  """Right-padded (tokens_BT int32, mask_BT bool), at least n_rows rows (extra rows are
  one pad token, masked as real so their score is finite, and dropped by callers)."""
  n = max(len(rows), n_rows)
  # The sampler's prompt buckets below max_len, then max_len: one compile per bucket.
  buckets = (*(b for b in sampling.DEFAULT_BUCKETS if b < max_len), max_len)
  T = sampling.bucket_length(max(len(r) for r in rows), buckets)
  tokens = np.full((n, T), pad_id, np.int32)
  mask = np.zeros((n, T), bool)
  for i, r in enumerate(rows):
    tokens[i, : len(r)] = r
    mask[i, : len(r)] = True
  mask[len(rows) :, 0] = True
  return tokens, mask


def pair_rows(pairs: Sequence[Pair], tokenizer, *, max_len: int):
  """A pair batch as 2B rows: the B chosen rows, then the B rejected ones."""
  rows = [encode(tokenizer, p.prompt, p.chosen, max_len=max_len) for p in pairs]
  rows += [encode(tokenizer, p.prompt, p.rejected, max_len=max_len) for p in pairs]
  return pad_rows(rows, pad_id=tokenizer.pad_id, max_len=max_len)


# ----------------------------------------------------------------------------
# The model and its loss (pure; jitted by callers).
# ----------------------------------------------------------------------------


def init(cfg: model.ModelConfig, key) -> dict:
  """Decoder params and a zero head (every score starts at 0: the loss at log 2)."""
  return {"model": model.init(cfg, key), "head": zero_head(cfg)}


def zero_head(cfg: model.ModelConfig) -> dict:
  return {"kernel": jnp.zeros((cfg.d_model,), jnp.float32), "bias": jnp.zeros((), jnp.float32)}


def score(params: dict, tokens_BT, mask_BT, *, cfg: model.ModelConfig):
  """r_B = w · h[b, t*_b] + b, t*_b the last position with mask_BT true (float32)."""
  positions_BT = model.positions_from_mask(mask_BT)
  h_BTD, _ = model.apply(params["model"], tokens_BT, positions_BT, cfg=cfg, hidden_only=True)
  last_B = jnp.sum(mask_BT, axis=-1).astype(jnp.int32) - 1
  h_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0]
  return h_BD.astype(jnp.float32) @ params["head"]["kernel"] + params["head"]["bias"]


def pair_loss(params: dict, tokens_2BT, mask_2BT, *, cfg: model.ModelConfig, margin: float):
  """(mean −log σ(r_c − r_r − m), metrics) over the B pairs of a `pair_rows` batch."""
  r_2B = score(params, tokens_2BT, mask_2BT, cfg=cfg)
  chosen_B, rejected_B = jnp.split(r_2B, 2)
  diff_B = chosen_B - rejected_B
  loss = jnp.mean(jax.nn.softplus(-(diff_B - margin)))
  metrics = {
    "rm/loss": loss,
    "rm/pair_accuracy": jnp.mean(diff_B > 0),
    "rm/reward_gap": jnp.mean(diff_B),
  }
  return loss, metrics


# ----------------------------------------------------------------------------
# Checkpoint import: transformers' sequence-classification heads.
# ----------------------------------------------------------------------------


def hf_reward_config(hf_dir, **overrides) -> tuple[model.ModelConfig, bool]:
  """(ModelConfig, whether it is a sequence-classification checkpoint) of a HF checkpoint
  directory: a `*ForSequenceClassification` of a family `hf` imports (num_labels 1), or a
  causal LM. `overrides`: ModelConfig runtime keys (dtypes)."""
  hf_config = hf.read_config(hf_dir)
  archs = hf_config.get("architectures") or []
  seq_cls = [a for a in archs if a.endswith("ForSequenceClassification")]
  where = hf.config_where(hf_dir)
  if seq_cls and seq_cls[0] not in families.BY_SEQ_CLS_CLASS:
    raise hf.CheckpointError(
      f"{where}: {seq_cls[0]} is not supported; sequence-classification checkpoints of "
      f"{sorted(families.BY_SEQ_CLS_CLASS)} are."
    )
  if seq_cls:
    labels = hf_config.get("num_labels", len(hf_config.get("id2label") or {0: 0}))
    if labels != 1:
      raise hf.CheckpointError(
        f"{where}: num_labels={labels}; a reward model has one output (num_labels 1)."
      )
    hf_config = {**hf_config, "architectures": [families.BY_SEQ_CLS_CLASS[seq_cls[0]].hf_class]}
    hf_config["tie_word_embeddings"] = True  # No LM head in the file; the RM never uses one.
  return hf.model_config(hf_config, where=where, **overrides), bool(seq_cls)


def from_hf(hf_dir, *, layout=None, **overrides) -> tuple[model.ModelConfig, dict]:
  """(ModelConfig, params) of a HF checkpoint directory (`hf_reward_config`): a
  sequence-classification checkpoint's `score.weight` becomes the head; a causal LM's
  head starts at zero. With a `sharding.Layout` each decoder tensor is streamed straight
  into its shards (no device holds the whole model)."""
  cfg, seq_cls = hf_reward_config(hf_dir, **overrides)
  ignore = (HEAD_TENSOR,) if seq_cls else ()
  shardings = None
  if layout is not None:
    from grpo_jax.models import sharding  # noqa: PLC0415 -- sharding imports model, not this.

    shardings = sharding.param_shardings(layout, cfg)
  params = hf.load_params(hf_dir, cfg, ignore=ignore, shardings=shardings)
  head = zero_head(cfg)
  if seq_cls:
    entry = hf.tensor_index(hf_dir).get(HEAD_TENSOR)
    if entry is None or tuple(entry.shape) != (1, cfg.d_model):
      found = None if entry is None else list(entry.shape)
      raise hf.CheckpointError(
        f"{hf_dir}: {HEAD_TENSOR} must have shape [1, {cfg.d_model}]; found {found}."
      )
    head["kernel"] = jnp.asarray(hf.read_tensor(entry)[0], jnp.float32)
  return cfg, {"model": params, "head": head}


# ----------------------------------------------------------------------------
# Scoring texts on the host: batched, bucketed, one jitted function.
# ----------------------------------------------------------------------------


class Scorer:
  """Scores (prompt, completion) texts with a reward model: rows encoded with its own
  tokenizer, in batches of `batch_size` rows (the last one padded to full size, so a
  batch shape compiles once per length bucket), through one jitted `score`.

  With a `layout` (`sharding.Layout`: e.g. this process's devices under the run's rules
  table), the decoder's params are placed by their logical names (fsdp / tensor as the
  rules say), the head is replicated, the rows are split over the batch axes (batch_size
  is rounded up to a multiple of them), and the forward is traced in the layout's context,
  so its activation constraints apply: the policy's own sharding, applied to the RM."""

  def __init__(
    self,
    params,
    cfg: model.ModelConfig,
    tokenizer,
    *,
    max_len: int,
    batch_size: int = 64,
    layout=None,
  ):
    self.cfg, self.tokenizer, self.max_len, self.layout = cfg, tokenizer, max_len, layout
    self.batch_size = batch_size
    fn = functools.partial(score, cfg=cfg)
    if layout is None:
      self.params, self._score, self._rows = params, jax.jit(fn), None
    else:
      d = layout.batch_size_divisor
      self.batch_size = -(-batch_size // d) * d
      shardings = param_shardings(layout, cfg)
      self.params = jax.device_put(params, shardings)
      self._rows = layout.rows(self.batch_size)
      self._score = jax.jit(fn, in_shardings=(shardings, self._rows, self._rows))

  def __call__(self, prompts: Sequence[str], completions: Sequence[str]) -> np.ndarray:
    """r_N float32, in input order. Every batch is dispatched before any result is read
    back, so the host encodes and pads the next batch while the device scores this one."""
    rows = [
      encode(self.tokenizer, p, c, max_len=self.max_len) for p, c in zip(prompts, completions)
    ]
    out = []
    for start in range(0, len(rows), self.batch_size):
      chunk = rows[start : start + self.batch_size]
      tokens, mask = pad_rows(
        chunk, pad_id=self.tokenizer.pad_id, max_len=self.max_len, n_rows=self.batch_size
      )
      if self.layout is None:
        r = self._score(self.params, tokens, mask)
      else:
        with self.layout.context():
          r = self._score(self.params, *jax.device_put((tokens, mask), self._rows))
      out.append((r, len(chunk)))
    got = [np.asarray(r)[:k] for r, k in out]
    return np.concatenate(got).astype(np.float32) if got else np.zeros(0, np.float32)


# ----------------------------------------------------------------------------
# A trained reward model's directory.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A reward model read back from an rm-train workdir (or a HF checkpoint)."""

  cfg: model.ModelConfig
  params: dict
  tokenizer: Any
  max_len: int
  step: int  # The checkpoint's step (-1: a HF checkpoint).


HF_MAX_LEN = 1024  # A HF reward model's tokens kept when max_len is 0.


def param_shardings(layout, cfg: model.ModelConfig) -> dict:
  """Where `Scorer` puts a reward model's params on a `sharding.Layout`: the decoder's by
  their logical names under the layout's rules, the head (d_model + 1 floats) replicated."""
  from grpo_jax.models import sharding  # noqa: PLC0415 -- sharding imports model, not this.

  head = jax.eval_shape(functools.partial(zero_head, cfg))
  return {
    "model": sharding.param_shardings(layout, cfg),
    "head": jax.tree.map(lambda _: layout.replicated, head),
  }


def architecture(path, *, max_len: int = 0) -> tuple[model.ModelConfig, int]:
  """(ModelConfig, max_len) of the reward model `load` would read from `path`, from its
  record or config.json alone (no weights: what `aot` compiles the scorer from)."""
  path = pathlib.Path(path)
  if (path / "config.json").is_file() and not (path / RECORD).is_file():  # HF.
    return hf_reward_config(path)[0], max_len or HF_MAX_LEN
  if not (path / RECORD).is_file():
    raise FileNotFoundError(
      f"{path}: no {RECORD} or config.json; a reward model is an rm-train workdir (grpo-jax "
      "rm-train --workdir=DIR) or a Hugging Face sequence-classification checkpoint directory."
    )
  rec = json.loads((path / RECORD).read_text())
  return model.ModelConfig.from_dict(rec["model"]), max_len or rec["max_len"]


def load(path, *, step: int = -1, max_len: int = 0, layout=None) -> Loaded:
  """The reward model of an rm-train workdir (its newest checkpoint, or `step`), or of a
  HF checkpoint directory (a config.json with a sequence-classification architecture and
  a tokenizer; loaded into `layout`'s shards when given). max_len 0: the workdir's
  config.reward_model.max_len (HF: 1024).

  Rows are scored as BOS + prompt + completion text, the format rm-train trains on. A HF
  reward model trained on chat-formatted conversations expects its chat template: render
  the prompt with it before scoring (the source passes the task's prompt text as is)."""
  path = pathlib.Path(path)
  if (path / "config.json").is_file() and not (path / RECORD).is_file():  # HF.
    from grpo_jax.models import hf_tokenizer  # noqa: PLC0415 -- only HF reward models read one.

    cfg, params = from_hf(path, layout=layout)
    return Loaded(cfg, params, hf_tokenizer.load(path), max_len or HF_MAX_LEN, -1)
  cfg, max_len = architecture(path, max_len=max_len)
  rec = json.loads((path / RECORD).read_text())
  like = jax.eval_shape(lambda: initial_state(init(cfg, jax.random.key(0)), rec["optimizer"]))
  ckpt = checkpoint.Checkpointer(path / "checkpoints", keep_best=False, async_save=False)
  try:
    steps = ckpt.all_steps()
    if not steps:
      raise FileNotFoundError(f"{path}/checkpoints: no checkpoint; did rm-train finish a step?")
    chosen = steps[-1] if step < 0 else step
    if chosen not in steps:
      raise FileNotFoundError(f"{path}/checkpoints: no step {step}; steps: {steps}.")
    tree = ckpt.restore_step(chosen, like=like).tree
  finally:
    ckpt.close()
  tok = tokenizer_of(rec["tokenizer"])
  return Loaded(cfg, tree["params"], tok, max_len, chosen)


def record(
  model_cfg: model.ModelConfig, cfg: RewardModelConfig, *, task: dict, hf_dir: str
) -> dict:
  """What `load` reads back (workdir/RECORD): the architecture, the tokenizer's source, the
  optimizer's settings (its state's structure) and max_len."""
  return {
    "model": dataclasses.asdict(model_cfg),
    "tokenizer": {"task": task, "hf_dir": hf_dir},
    "optimizer": optimizer_settings(cfg),
    "max_len": cfg.max_len,
  }


def tokenizer_of(source: dict):
  """The tokenizer a record names: hf_dir's, or its task's."""
  if source.get("hf_dir"):
    from grpo_jax.models import hf_tokenizer  # noqa: PLC0415 -- only HF reward models read one.

    return hf_tokenizer.load(source["hf_dir"])
  task = source["task"]
  return tasks.get(task["name"], **dict(task.get("kwargs", {}))).tokenizer()


def optimizer_settings(cfg: RewardModelConfig) -> dict:
  """`make_optimizer`'s keywords from the config (recorded: they fix Adam's state)."""
  return {"learning_rate": cfg.learning_rate, "weight_decay": cfg.weight_decay}


def initial_state(params, optimizer: dict) -> dict:
  """What rm-train checkpoints: the params, Adam's state and the step."""
  return {
    "params": params,
    "opt": make_optimizer(**optimizer).init(params),
    "step": jnp.zeros((), jnp.int32),
  }


def make_optimizer(*, learning_rate: float, weight_decay: float):
  return optax.chain(
    optax.clip_by_global_norm(1.0), optax.adamw(learning_rate, weight_decay=weight_decay)
  )


def task_pairs(task, n: int, *, split: str, seed: int) -> list[Pair]:
  """n synthetic pairs from a task's problems: chosen = problem i's reference completion,
  rejected = a wrong completion of it (the reference of another problem whose answer
  differs). A model that ranks them has learnt to check an answer against its question."""
  pairs, i = [], 0
  rng = np.random.default_rng([seed, 7])
  while len(pairs) < n:
    ex = task.example(split, i, seed=seed)
    other = task.example(split, int(rng.integers(1 << 30)), seed=seed + 1)
    i += 1
    if other.answer != ex.answer:
      pairs.append(Pair(ex.prompt, ex.reference, other.reference))
  return pairs
