"""Hugging Face checkpoints: import into our param pytree, export back to safetensors.

    cfg = hf.model_config(hf.read_config(hf_dir), param_dtype="bfloat16")
    params = hf.load_params(hf_dir, cfg, shardings=shardings)   # streamed, already sharded
    hf.export(params, cfg, out_dir, arch=hf.arch_of(hf.read_config(hf_dir)))

Architectures (the `architectures[0]` / `model_type` of `config.json`): the families of
`families` (Llama 3.x with Llama 3.1 "llama3" rope scaling, Qwen2 / Qwen2.5, Qwen3, Mistral,
Gemma 2, Gemma 3 text); dense, tied or untied embeddings. What differs by family is read
from its record.

config.json <-> ModelConfig is `hf_config` (its names are re-exported here: read_config,
model_config, hf_config_dict, arch_of, arch_for, CheckpointError).

Streaming. Safetensors files are read tensor by tensor from their headers (our own
reader: numpy's safetensors backend has no bfloat16): each tensor's bytes are read into
one host buffer, transposed to our layout, cast to the param dtype and placed on its
sharding with `jax.make_array_from_callback`, which hands each device only its slice;
then the buffer is dropped. Peak host memory beyond the placed params is one tensor (one
stacked [L, ...] parameter with `scan_layers`). No full float32 host copy is made.

Layout (HF `nn.Linear` weights are [out, in]; ours are DenseGeneral kernels [in, out...]):
  embed_tokens [V, D]            -> embed/embedding [V, D]
  q_proj [H·E, D] (+bias [H·E])  -> attn/q/kernel [D, H, E] (+bias [H, E]); k, v with K heads
  o_proj [D, H·E]                -> attn/o/kernel [H, E, D]
  gate_proj, up_proj [F, D]      -> mlp/gate, mlp/up kernel [D, F];  down_proj [D, F] -> [F, D]
  input_layernorm / post_attention_layernorm / q_norm / k_norm / norm -> the RMSNorm scales
  (Gemma: input / post_attention / pre_feedforward / post_feedforward_layernorm -> attn_norm,
  attn_post_norm, mlp_norm, mlp_post_norm; its w is stored as is, the model adds the 1)
  lm_head [V, D] (untied)        -> lm_head/kernel [D, V]
RoPE needs no permutation: HF Llama/Qwen checkpoints use the same half-split layout.

GGUF files (llama.cpp) are accepted wherever a checkpoint directory is: a `*.gguf` path or
`pkg:<package>` (`gguf_import`, which gives this module the file's config.json and its
tensors under HF names and layout, dequantized as they are read).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import pathlib
import re
import shutil
from collections.abc import Callable, Iterator

import jax
import ml_dtypes
import numpy as np
from jax.experimental import multihost_utils

from grpo_jax.infra import distributed
from grpo_jax.models import families, gguf_import, hf_config, model

_DTYPES = {
  "F64": np.float64,
  "F32": np.float32,
  "F16": np.float16,
  "BF16": ml_dtypes.bfloat16,
  "I64": np.int64,
  "I32": np.int32,
}
_DTYPE_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}
EXPORT_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
# Tensors some checkpoints carry that the model does not use (recomputed buffers).
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


CheckpointError = hf_config.CheckpointError
read_config = hf_config.read_config
arch_of = hf_config.arch_of
model_config = hf_config.model_config
arch_for = hf_config.arch_for
hf_config_dict = hf_config.hf_config_dict


# ----------------------------------------------------------------------------
# Safetensors, read and written tensor by tensor.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorEntry:
  file: pathlib.Path
  dtype: str  # Safetensors dtype name, e.g. "BF16".
  shape: tuple[int, ...]
  start: int  # Absolute byte offsets in the file.
  stop: int


def _read_header(path: pathlib.Path) -> tuple[dict, int]:
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise CheckpointError(
        f"{path}: not a safetensors file (shorter than its 8-byte header size)."
      )
    (n,) = np.frombuffer(head, "<u8")
    try:
      return json.loads(f.read(int(n))), 8 + int(n)
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
      raise CheckpointError(f"{path}: not a safetensors file (unreadable JSON header).") from None


def tensor_index(hf_dir) -> dict[str, TensorEntry]:
  """Every tensor of the checkpoint's `*.safetensors` files (headers only, no data read).

  With `model.safetensors.index.json` the files are those its weight_map names. A GGUF
  source gives `gguf_import.Entry`s (HF names and shapes)."""
  if gguf_import.is_source(hf_dir):
    return gguf_import.tensor_index(hf_dir)
  hf_dir = pathlib.Path(hf_dir)
  index = hf_dir / "model.safetensors.index.json"
  if index.is_file():
    files = sorted({hf_dir / f for f in json.loads(index.read_text())["weight_map"].values()})
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
      raise CheckpointError(f"{index}: names shards that are missing: {missing}.")
  else:
    files = sorted(hf_dir.glob("*.safetensors"))
  if not files:
    raise CheckpointError(
      f"{hf_dir}: no *.safetensors files (expected model.safetensors or shards)."
    )
  out = {}
  for path in files:
    header, base = _read_header(path)
    for name, info in header.items():
      if name == "__metadata__":
        continue
      if info["dtype"] not in _DTYPES:
        raise CheckpointError(
          f"{path}: tensor {name} has dtype {info['dtype']}; supported: {sorted(_DTYPES)}."
        )
      b, e = info["data_offsets"]
      out[name] = TensorEntry(path, info["dtype"], tuple(info["shape"]), base + b, base + e)
  return out


def read_tensor(entry: TensorEntry) -> np.ndarray:
  """One tensor's data, read into a fresh host buffer (a GGUF entry's dequantized to float32)."""
  if isinstance(entry, gguf_import.Entry):
    return gguf_import.read_tensor(entry)
  buf = np.empty(entry.stop - entry.start, np.uint8)
  with open(entry.file, "rb") as f:
    f.seek(entry.start)
    if f.readinto(memoryview(buf)) != buf.size:
      raise CheckpointError(f"{entry.file}: truncated (a tensor runs past the end of the file).")
  return buf.view(_DTYPES[entry.dtype]).reshape(entry.shape)


def write_safetensors(
  path, tensors: Iterator[tuple[str, np.ndarray]] | list, *, shapes: dict
) -> int:
  """Writes (name, array) pairs to one safetensors file without holding them all.

  `shapes` maps each name to (shape, dtype) in order, so the header is written first and
  each tensor is produced only when its bytes go out. Returns the bytes written."""
  header, offset = {}, 0
  for name, (shape, dtype) in shapes.items():
    n = math.prod(shape) * np.dtype(dtype).itemsize
    header[name] = dict(
      dtype=_DTYPE_NAMES[np.dtype(dtype)], shape=list(shape), data_offsets=[offset, offset + n]
    )
    offset += n
  header["__metadata__"] = {"format": "pt"}
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(np.uint64(len(blob)).tobytes())
    f.write(blob)
    for name, arr in tensors:
      shape, dtype = shapes[name]
      if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
        raise ValueError(f"{name}: got {arr.dtype}{arr.shape}, header says {dtype}{tuple(shape)}.")
      f.write(np.ascontiguousarray(arr).tobytes())
  return 8 + len(blob) + offset


# ----------------------------------------------------------------------------
# The name and layout map.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Map:
  hf_names: tuple[str, ...]  # One per layer (and expert) when stacked, else one.
  hf_shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]
  # The leading axes the names stack into, row-major: (L,), (X,) experts, (L, X); () one.
  stack: tuple[int, ...] = ()


def _linear(out_shape):
  """HF [out, in] <-> ours [in, *out_shape] (o_proj, with two input axes, is `_o_proj`)."""

  def to_ours(w):
    return w.T.reshape(-1, *out_shape)

  def to_hf(k):
    return k.reshape(k.shape[0], -1).T

  return to_ours, to_hf


def _o_proj(cfg):
  H, E, D = cfg.n_heads, cfg.head_dim, cfg.d_model
  return (lambda w: w.T.reshape(H, E, D)), (lambda k: k.reshape(H * E, D).T)


def _block_map(
  cfg: model.ModelConfig,
) -> dict[tuple[str, ...], tuple[str, tuple, Callable, Callable]]:
  """Our path inside one block -> (HF name inside layer i, HF shape, to_ours, to_hf)."""
  H, K, E, D, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model, cfg.mlp_dim
  same = (lambda x: x), (lambda x: x)
  flat_bias = lambda n: ((lambda b: b.reshape(n, E)), (lambda b: b.reshape(-1)))
  m = {
    ("attn", "q", "kernel"): ("self_attn.q_proj.weight", (H * E, D), *_linear((H, E))),
    ("attn", "k", "kernel"): ("self_attn.k_proj.weight", (K * E, D), *_linear((K, E))),
    ("attn", "v", "kernel"): ("self_attn.v_proj.weight", (K * E, D), *_linear((K, E))),
    ("attn", "o", "kernel"): ("self_attn.o_proj.weight", (D, H * E), *_o_proj(cfg)),
    ("mlp", "gate", "kernel"): ("mlp.gate_proj.weight", (F, D), *_linear((F,))),
    ("mlp", "up", "kernel"): ("mlp.up_proj.weight", (F, D), *_linear((F,))),
    ("mlp", "down", "kernel"): ("mlp.down_proj.weight", (D, F), *_linear((D,))),
  }
  norms = families.SANDWICH_NORMS if cfg.post_norms else families.PRE_NORMS
  for ours, theirs in norms:
    m[(ours, "scale")] = (f"{theirs}.weight", (D,), *same)
  if cfg.attn_bias:
    m[("attn", "q", "bias")] = ("self_attn.q_proj.bias", (H * E,), *flat_bias(H))
    m[("attn", "k", "bias")] = ("self_attn.k_proj.bias", (K * E,), *flat_bias(K))
    m[("attn", "v", "bias")] = ("self_attn.v_proj.bias", (K * E,), *flat_bias(K))
  if cfg.qk_norm:
    m[("attn", "q_norm", "scale")] = ("self_attn.q_norm.weight", (E,), *same)
    m[("attn", "k_norm", "scale")] = ("self_attn.k_norm.weight", (E,), *same)
  if cfg.n_experts:  # Qwen3-MoE: a router and one gate/up/down per expert, stacked [X, ...].
    X, Fe = cfg.n_experts, cfg.expert_mlp_dim
    for ours in ("gate", "up", "down"):
      del m[("mlp", ours, "kernel")]
    experts = lambda proj: tuple(f"mlp.experts.{e}.{proj}.weight" for e in range(X))
    m[("mlp", "router", "kernel")] = ("mlp.gate.weight", (X, D), *_linear((X,)))
    m[("mlp", "gate")] = (experts("gate_proj"), (Fe, D), *_linear((Fe,)))
    m[("mlp", "up")] = (experts("up_proj"), (Fe, D), *_linear((Fe,)))
    m[("mlp", "down")] = (experts("down_proj"), (D, Fe), *_linear((D,)))
  return m


def param_map(cfg: model.ModelConfig) -> dict[tuple[str, ...], _Map]:
  """Our param path (a tuple of keys) -> where it lives in a HF checkpoint."""
  same = (lambda x: x), (lambda x: x)
  V, D = cfg.vocab_size, cfg.d_model
  out = {
    ("embed", "embedding"): _Map(("model.embed_tokens.weight",), (V, D), *same),
    ("final_norm", "scale"): _Map(("model.norm.weight",), (D,), *same),
  }
  if not cfg.tie_embeddings:
    out[("lm_head", "kernel")] = _Map(("lm_head.weight",), (V, D), *_linear((V,)))
  for path, (names, shape, to_ours, to_hf) in _block_map(cfg).items():
    names = (names,) if isinstance(names, str) else names  # Several: one per expert.
    inner = (len(names),) if len(names) > 1 else ()
    layer = lambda i: tuple(f"model.layers.{i}.{n}" for n in names)  # noqa: B023
    if cfg.scan_layers:
      every = tuple(n for i in range(cfg.n_layers) for n in layer(i))
      out[("layers", *path)] = _Map(every, shape, to_ours, to_hf, (cfg.n_layers, *inner))
    else:
      for i in range(cfg.n_layers):
        out[(f"layer_{i}", *path)] = _Map(layer(i), shape, to_ours, to_hf, inner)
  return out


def _path_keys(path) -> tuple[str, ...]:
  return tuple(getattr(k, "key", getattr(k, "name", k)) for k in path)


# ----------------------------------------------------------------------------
# Import.
# ----------------------------------------------------------------------------


def check_tensors(
  index: dict[str, TensorEntry], cfg: model.ModelConfig, *, hf_dir, ignore: tuple[str, ...] = ()
) -> None:
  """Every tensor the model needs is present with its shape, and nothing unknown is
  (`ignore`: tensors a caller reads itself, e.g. a reward model's score head)."""
  mapping = param_map(cfg)
  needed = {n: m.hf_shape for m in mapping.values() for n in m.hf_names}
  missing = sorted(set(needed) - set(index))
  if missing:
    more = f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
    raise CheckpointError(f"{hf_dir}: missing tensors {missing[:8]}{more}.")
  bad = [
    f"{n} in {index[n].file.name}: shape {list(index[n].shape)}, expected {list(s)}"
    for n, s in needed.items()
    if index[n].shape != tuple(s)
  ]
  if bad:
    raise CheckpointError(f"{hf_dir}: tensors with wrong shapes: " + "; ".join(bad) + ".")
  if cfg.tie_embeddings and "lm_head.weight" in index:
    head, embed = index["lm_head.weight"], index["model.embed_tokens.weight"]
    if head.shape != embed.shape or not np.array_equal(read_tensor(head), read_tensor(embed)):
      raise CheckpointError(
        f"{hf_dir}: config.json ties the embeddings but lm_head.weight (in {head.file.name}) "
        "differs from model.embed_tokens.weight; set tie_word_embeddings to false to use it."
      )
  extra = sorted(
    n
    for n in set(index) - set(needed)
    if not _IGNORED.match(n)
    and not (cfg.tie_embeddings and n == "lm_head.weight")
    and n not in ignore
  )
  if extra:
    raise CheckpointError(
      f"{hf_dir}: tensors the model has no place for: {extra[:8]}; is the architecture or "
      "config.json right?"
    )


def _host_value(entries: list[TensorEntry], m: _Map, dtype) -> np.ndarray:
  """Our layout of one parameter (stacked over layers and experts, `_Map.stack`, when it
  has several entries), filled one tensor at a time: the stack plus one tensor in memory."""
  first = m.to_ours(read_tensor(entries[0])).astype(dtype, copy=False)
  if len(entries) == 1:
    return first
  out = np.empty((len(entries), *first.shape), first.dtype)
  out[0] = first
  del first
  for i, e in enumerate(entries[1:], start=1):
    out[i] = m.to_ours(read_tensor(e))
  return out.reshape(*m.stack, *out.shape[1:])


def load_params(hf_dir, cfg: model.ModelConfig, *, shardings=None, ignore: tuple[str, ...] = ()):
  """Streams a checkpoint into our param pytree, each leaf placed on its sharding.

  `shardings`: a pytree like the params of `jax.sharding.Sharding`s (e.g.
  `sharding.Layout.params`), or None for the default device. Leaves are cfg.param_dtype.
  With model.lora, the base weights alone (`model.base_config`; adapters start fresh).
  `ignore`: tensors of the file the model has no place for that the caller reads itself.
  """
  cfg = model.base_config(cfg)
  hf_dir = pathlib.Path(hf_dir)
  index = tensor_index(hf_dir)
  check_tensors(index, cfg, hf_dir=hf_dir, ignore=ignore)
  mapping = param_map(cfg)
  abstract = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  if shardings is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)

  def load(path, leaf, sharding):
    m = mapping[_path_keys(path)]
    value = _host_value([index[n] for n in m.hf_names], m, leaf.dtype)
    if value.shape != leaf.shape:
      raise CheckpointError(
        f"{hf_dir}: {m.hf_names[0]} maps to shape {value.shape}, the model needs {leaf.shape}."
      )
    return jax.make_array_from_callback(leaf.shape, sharding, lambda idx: value[idx])

  return jax.tree_util.tree_map_with_path(load, abstract, shardings)


# ----------------------------------------------------------------------------
# Export.
# ----------------------------------------------------------------------------

TOKENIZER_FILES = (
  "tokenizer.json",
  "tokenizer_config.json",
  "generation_config.json",
  "special_tokens_map.json",
  "added_tokens.json",
  "chat_template.jinja",  # transformers 5 keeps the chat template only here.
)


def checkpoint_entries(cfg: model.ModelConfig) -> list[tuple[str, tuple, tuple, int | None]]:
  """(HF name, HF shape, our param path, layer index in a stacked param or None) of every
  tensor of the checkpoint, in the checkpoint's natural name order."""
  entries = []
  for path, m in param_map(cfg).items():
    for i, name in enumerate(m.hf_names):
      entries.append((name, m.hf_shape, path, i if len(m.hf_names) > 1 else None))
  return sorted(entries, key=lambda e: _natural_key(e[0]))


def shard_files(entries: list, *, itemsize: int, max_shard_bytes: int) -> list[tuple[str, list]]:
  """(file name, entries) per safetensors file: entries (name, shape, ...) in order, a new
  file when the next tensor would pass max_shard_bytes; "model.safetensors" when one
  file, else "model-0000k-of-0000n.safetensors" as transformers names them."""
  shards, size = [[]], 0
  for e in entries:
    n = math.prod(e[1]) * itemsize
    if shards[-1] and size + n > max_shard_bytes:
      shards.append([])
      size = 0
    shards[-1].append(e)
    size += n
  if len(shards) == 1:
    return [("model.safetensors", shards[0])]
  return [
    (f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors", sh) for k, sh in enumerate(shards)
  ]


def export(
  params,
  cfg: model.ModelConfig,
  out_dir,
  *,
  arch: str,
  dtype: str = "bfloat16",
  base_config: dict | None = None,
  tokenizer_dir=None,
  max_shard_bytes: int = 4 * 2**30,
) -> pathlib.Path:
  """Writes `config.json` and `model*.safetensors` (+ index when sharded) for transformers
  or vLLM, one tensor at a time; copies the tokenizer files of `tokenizer_dir` if given (a
  GGUF source's are written from its metadata, `gguf_import.tokenizer_files`).

  Every process must call it (a parameter split over hosts is all-gathered); only the
  primary process writes. `dtype`: "bfloat16", "float16" or "float32".
  """
  if dtype not in EXPORT_DTYPES:
    raise ValueError(f"export dtype {dtype!r}; allowed: {sorted(EXPORT_DTYPES)}.")
  # Adapters are folded into the base weights: the same policy as a plain checkpoint.
  params, cfg = model.merge_adapters(params, cfg), model.base_config(cfg)
  np_dtype = EXPORT_DTYPES[dtype]
  out_dir = pathlib.Path(out_dir)
  mapping = param_map(cfg)
  leaves = {_path_keys(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  if set(leaves) != set(mapping):
    raise ValueError(
      f"export: params do not match the config (unexpected {sorted(set(leaves) - set(mapping))[:4]},"
      f" missing {sorted(set(mapping) - set(leaves))[:4]})."
    )
  shards = shard_files(
    checkpoint_entries(cfg), itemsize=np.dtype(np_dtype).itemsize, max_shard_bytes=max_shard_bytes
  )

  primary = distributed.is_primary()
  if primary:
    out_dir.mkdir(parents=True, exist_ok=True)

  def value(path, layer):  # One HF tensor: a stacked parameter is sliced on device.
    x = (
      leaves[path] if layer is None else leaves[path][np.unravel_index(layer, mapping[path].stack)]
    )
    return mapping[path].to_hf(np.asarray(distributed.host_value(x), np.float32)).astype(np_dtype)

  weight_map, total = {}, 0
  for fname, shard in shards:
    shapes = {e[0]: (e[1], np_dtype) for e in shard}
    tensors = ((e[0], value(e[2], e[3])) for e in shard)
    if primary:
      write_safetensors(out_dir / fname, tensors, shapes=shapes)
      total += sum(math.prod(e[1]) for e in shard) * np.dtype(np_dtype).itemsize
    else:
      for _ in tensors:  # The all-gathers are collective: every process takes part.
        pass
    weight_map.update({e[0]: fname for e in shard})
  if primary:
    if len(shards) > 1:
      (out_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
      )
    config = hf_config_dict(cfg, arch=arch, dtype=dtype, base=base_config)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if tokenizer_dir is not None and gguf_import.is_source(tokenizer_dir):
      for f, text in gguf_import.tokenizer_files(tokenizer_dir).items():
        (out_dir / f).write_text(text, encoding="utf-8")
    for f in TOKENIZER_FILES if tokenizer_dir is not None else ():
      src = pathlib.Path(tokenizer_dir) / f
      if src.is_file():
        shutil.copyfile(src, out_dir / f)
  if jax.process_count() > 1:  # No process returns before the files are complete.
    multihost_utils.sync_global_devices("grpo_jax.models.hf.export")
  return out_dir


def _natural_key(name: str):
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# ----------------------------------------------------------------------------
# hf-check: does a checkpoint load and agree with transformers?
# ----------------------------------------------------------------------------


def check_batch(vocab_size: int, *, seed: int = 0, rows: int = 3, length: int = 16):
  """Token ids [rows, length] and a mask; row 1 is left-padded by length // 3 (pad id 0)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab_size, (rows, length), dtype=np.int64)
  mask = np.ones((rows, length), np.int64)
  mask[1, : length // 3] = 0
  ids[mask == 0] = 0
  return ids, mask


def transformers_logits(hf_dir, ids: np.ndarray, mask: np.ndarray) -> np.ndarray | None:
  """The same batch through transformers' float32 torch forward (position ids skip the
  padding), or None when torch / transformers are not installed. A GGUF source is loaded
  with `gguf_file=` (transformers dequantizes it too)."""
  try:
    import torch
    import transformers  # noqa: F401  (transformers_model imports it; None when absent)
  except ImportError:
    return None
  m = transformers_model(hf_dir, dtype=torch.float32)
  positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
  with torch.no_grad():
    out = m(
      input_ids=torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      position_ids=torch.tensor(positions),
    )
  return out.logits.float().numpy()


def transformers_model(hf_dir, *, dtype):
  """transformers' model of a checkpoint directory or a GGUF source, in eval mode."""
  import transformers

  kwargs = {}
  if gguf_import.is_source(hf_dir):
    path = gguf_import.resolve(hf_dir)
    hf_dir, kwargs = path.parent, dict(gguf_file=path.name)
  # Eager attention: transformers' SDPA path has no attention soft-capping (Gemma 2).
  m = transformers.AutoModelForCausalLM.from_pretrained(
    hf_dir, dtype=dtype, attn_implementation="eager", **kwargs
  )
  m.eval()
  return m


def config_where(hf_dir) -> str:
  """Where a checkpoint's config comes from, for messages: config.json, or the GGUF file."""
  if gguf_import.is_source(hf_dir):
    return str(hf_dir)
  return str(pathlib.Path(hf_dir) / "config.json")


def check(hf_dir, *, tolerance: float = 1e-4, dtype: str = "float32", compare: bool = True) -> dict:
  """Imports a checkpoint, runs a forward on a small batch (one row left-padded) and, when
  transformers is installed and `compare`, the same batch through transformers.

  Returns figures: arch, params, import seconds, a logits summary, max_abs_diff and
  greedy_mismatches (the real positions whose argmax, the greedy id, differs from
  transformers'; None without transformers) and ok = max_abs_diff <= tolerance with no
  greedy mismatch (True when not compared)."""
  import time

  import jax.numpy as jnp

  hf_dir = hf_dir if gguf_import.is_source(hf_dir) else pathlib.Path(hf_dir)
  base = read_config(hf_dir)
  cfg = model_config(base, where=config_where(hf_dir), param_dtype=dtype, dtype=dtype)
  t0 = time.perf_counter()
  params = load_params(hf_dir, cfg)
  jax.block_until_ready(params)
  load_s = time.perf_counter() - t0
  ids, mask = check_batch(cfg.vocab_size)
  logits, _ = model.apply(
    params, jnp.asarray(ids), model.positions_from_mask(jnp.asarray(mask)), cfg=cfg
  )
  keep = mask.astype(bool)
  ours = np.asarray(logits)[keep]
  out = dict(
    hf_dir=str(hf_dir),
    arch=arch_of(base),
    params=model.param_count(params),
    dtype=dtype,
    import_seconds=round(load_s, 3),
    logits_mean=float(ours.mean()),
    logits_std=float(ours.std()),
    logits_absmax=float(np.abs(ours).max()),
    argmax_last=[int(i) for i in np.asarray(logits)[:, -1].argmax(-1)],
    positions=int(keep.sum()),
    max_abs_diff=None,
    greedy_mismatches=None,
    tolerance=tolerance,
  )
  ref = transformers_logits(hf_dir, ids, mask) if compare else None
  if ref is not None:
    out["max_abs_diff"] = float(np.abs(ours - ref[keep]).max())
    out["greedy_mismatches"] = int((ours.argmax(-1) != ref[keep].argmax(-1)).sum())
  compared = out["max_abs_diff"] is not None
  out["ok"] = not compared or (out["max_abs_diff"] <= tolerance and not out["greedy_mismatches"])
  return out


# ----------------------------------------------------------------------------
# Adapters alone, in PEFT's layout.
# ----------------------------------------------------------------------------

PEFT_TARGETS = {
  "q": "q_proj",
  "k": "k_proj",
  "v": "v_proj",
  "o": "o_proj",
  "gate": "gate_proj",
  "up": "up_proj",
  "down": "down_proj",
  "lm_head": "lm_head",
}


def export_adapters(
  params, cfg: model.ModelConfig, out_dir, *, base_model: str = ""
) -> pathlib.Path:
  """Writes the adapters of a LoRA params tree as PEFT loads them: `adapter_config.json`
  and `adapter_model.safetensors` (float32), `base_model.model.<HF module>.lora_A.weight`
  [r, in] and `lora_B.weight` [out, r] per adapted projection, with r and lora_alpha
  from model.lora, so that PEFT's W + (lora_alpha/r)·B·A is our merged weight.
  `base_model`: the base checkpoint's name or path for `base_model_name_or_path`. Every
  process must call it; the primary writes."""
  if not (cfg.lora.enabled and isinstance(params, dict) and "lora" in params):
    raise ValueError(
      "export_adapters needs a LoRA params tree ({'base', 'lora'}, model.lora.rank > 0)."
    )
  mapping, r = param_map(model.base_config(cfg)), cfg.lora.rank
  tensors = {}
  for path, x in jax.tree_util.tree_flatten_with_path(params["lora"])[0]:
    keys = _path_keys(path)
    kernel = (*keys[:-2], keys[-2][: -len("_lora")], "kernel")
    value = np.asarray(distributed.host_value(x), np.float32)
    stacked = len(mapping[kernel].hf_names) > 1
    for layer, hf_name in enumerate(mapping[kernel].hf_names):
      v = value[layer] if stacked else value
      module = hf_name[: -len(".weight")]
      if keys[-1] == "a":  # [*in, r] -> lora_A.weight [r, in]
        tensors[f"base_model.model.{module}.lora_A.weight"] = v.reshape(-1, r).T
      else:  # [r, *out] -> lora_B.weight [out, r]
        tensors[f"base_model.model.{module}.lora_B.weight"] = v.reshape(r, -1).T
  out_dir = pathlib.Path(out_dir)
  if distributed.is_primary():
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors, key=_natural_key)
    shapes = {n: (tensors[n].shape, np.float32) for n in names}
    write_safetensors(
      out_dir / "adapter_model.safetensors",
      ((n, np.ascontiguousarray(tensors[n])) for n in names),
      shapes=shapes,
    )
    adapter_config = {
      "peft_type": "LORA",
      "task_type": "CAUSAL_LM",
      "base_model_name_or_path": base_model,
      "r": r,
      "lora_alpha": cfg.lora.alpha,
      "lora_dropout": cfg.lora.dropout,
      "target_modules": sorted(PEFT_TARGETS[t] for t in cfg.lora.targets),
      "bias": "none",
      "fan_in_fan_out": False,
      "inference_mode": True,
      "modules_to_save": None,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("grpo_jax.models.hf.export_adapters")
  return out_dir
