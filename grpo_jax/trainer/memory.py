"""Per-device memory plan of a training config, before anything compiles.

    plan = memory.plan_for(setup, n_devices=8)
    print(memory_advice.describe(plan, device_memory=memory.device_bytes("tpu-v5e")))
    grpo-jax plan --config=configs/arithmetic.py:full --devices=8 --device=tpu-v5e

Figures are bytes per device, for the mesh of `setup.mesh_cfg` on `n_devices` devices
(they need not exist: sizes come from the rules table, not from live arrays).

- params, ref_params, opt_state: every leaf's shard, from its logical axis names and
  the rules (exact: what `sharding.init_params` and the optimizer create).
- grads: the params-shaped gradient of a micro-batch, and the accumulator it is added to
  when there are several micro-batches.
- With adapters (model.lora): params are the base plus the adapters; grads and opt_state
  are the adapters' only (`model.split_trainable`), and ref_params is 0 (the reference is
  the base itself, `run_state.RunState.reference`).
- activations: what reverse-mode autodiff saves from the forward of one micro-batch for
  the backward (the residuals of `jax.vjp` of the train loss, traced with
  `jax.make_jaxpr`, never compiled), on per-device shapes: rows / (data × fsdp × expert),
  and heads, MLP width and vocabulary / tensor. Inputs that the backward reads in place
  (params, the batch) are not counted again. `activations_remat` is the same with
  `remat="full"` over scanned layers (only each layer's input is saved);
  `activations_no_remat` with no remat.
- backward working set: one float32 [rows, T, V] logits gradient; with remat or
  scan_layers also the recomputed activations of one layer and its float32 attention-score
  gradient [rows, heads, S, S] (the entries of its causal blocks, `attention.causal_blocks`:
  5/8 of S² from S = 256 on; blocks longer than 2 × model.context_query_block go in query
  steps, `attention.attend_causal`: one step's [step, b] entries, counted twice, its
  recomputed probabilities and their gradient); with scan_layers also the layer scan's
  stacked gradient (params-sized) before it is added to the accumulator.
- kv_cache: the sampler's temporary memory (`sampling.sample` compiled), the largest of
  its phases. The rollout cache: keys and values of every layer, [rows, kv heads /
  tensor, P - 1 + T slots, head_dim] (+ int32 positions [rows, slots]); with a shared
  prompt cache (`sampler.shared_prefix`, G > 1; `model.KVCache.share`), [rows, ..., T]
  each row's own slots and [prompts, ..., P - 1] the prompts' slots, held once per group
  (XLA's figure for the anchor sampler: 369.4 MB against 488.6 MB with copies). A
  sliding-window layer of an unrolled cache holds min(slots, window) of each
  (`model.KVCache.rings`), with its own int32 positions (a Gemma-3-shaped tiny sampler,
  2,048 new tokens: 13.37 MB planned against XLA's 13.35 MB,
  `experiments/window_rings.py`).
  - decode, unrolled layers: the loop-carried cache; with one kv head per device XLA
    writes each step's k/v twice (into the carried buffer and into a copy the attention
    reads with the unit head dimension bitcast away) and copies the buffers for that:
    2.5 buffers per layer buffer in its assignment (1 device with 1 kv head, (2,2,2)
    with 2; 2, 4 and 8 layers, T 32-256) -- for the keys only when p·V is a CPU
    multiply-reduce (`attention._pv_by_reduce`, decided by this host's backend: a plan for
    an accelerator made on a CPU host counts the values' copies out in that case, up to
    1.5 × layers × one layer's values too little). With fsdp > 1, the whole model gathered over
    fsdp, hoisted out of the loop (and the embedding table again for a tied LM head); with
    several decode segments (`sampling.segment_count`) each segment's loop hoists its
    own gather, and XLA keeps two live (fsdp 8 and (2, 2, 2) on a CPU: +3.4 and +1.5 MB
    over one segment, 1.06 and 1.09 of XLA's figure with the second counted). Growing
    the cache between segments (`KVCache.grow`) holds the full cache while the last
    layer buffer of the previous segment's size is copied: the grow phase. It shows where
    the rows' own slots are mostly new tokens (a shared prompt, T >> P: 40 rows, 64 + 512
    to 8,192 slots, 4 segments, XLA 1.30x the decode phase, the plan 0.91 of XLA with the
    grow counted, 0.77 without), and hardly in the anchor sampler (8 layers, 128 rows,
    63 + 128 slots: 485.1 MB with one segment, 488.6 MB with four).
    Plus the step's sampling: five float32 [rows, V / tensor] buffers (logits, scaled
    logits, their order keys, probabilities, filtered logits).
  - decode, scanned layers sharded over fsdp (without fsdp the samplers decode scanned
    layers unrolled, `model.sampler_view`: the unrolled case above, plus the layers'
    slices, a copy of the weights): the layer scan reads the stacked cache and writes a new
    one (2 caches), with one layer's k and v slices and the copy the step writes into
    (3 layer buffers, 6 with one kv head per device) and one layer's weights (sliced
    from the stacked params, or gathered over fsdp); the sampling buffers come after the
    scan, beside the new cache only.
  - prefill: the decode loop's hoisted weights, the prefill's own gathered weights
    (fsdp > 1: the whole model, or one layer when scanned), one layer's forward (float32
    attention scores and exponentials [B, heads, P - 1, P - 1], the MLP's gate, up and
    product [B·(P - 1), F]) and the prompt batch's k and v [L, B, P - 1, K, E].
  - cache write: the rollout cache, written from one of those k/v stacks.
  - with adapters merged for sampling (`model.sampler_view`), every phase also holds the
    merged weights (the base's shapes, sharded as the base; float32 for an int8 kernel).
- gathered weights (train step): with fsdp > 1 each device all-gathers the weights over
  fsdp to compute with them; XLA gathers the whole model at once, or one layer at a
  time when the layers are scanned.

- logprob_forward: the π_old and reference forwards (no backward; 0 when neither runs:
  π_old from the update's forward, rl.old_logp_from, and no reference) over one slice of the
  rollout rows (rl.logprob_batches slices, one after another): three float32 [rows,
  positions, V / tensor] buffers of the head (logits, their exponentials, the
  probabilities; positions min(T, rl.logit_chunk)) and two float32 [rows, S, D] hidden
  states, plus the weights gathered over fsdp as in the train step. XLA TPU refused a
  Qwen2.5-0.5B forward of 64 rows a device at once (one f32 [64, 1024, 151936] logits
  buffer of 39.8 GB), which this term, then missing from the plan, did not foresee.

- teacher_params, teacher_forward: on-policy distillation's teacher (config.teacher): its
  params under the run's rules (resident the whole run, like the reference), and its
  log-prob forward's working set, logprob_forward's terms with its own width,
  vocabulary and fsdp-gathered weights (`teacher_cfg`; 0 without a teacher).

Peak = resident (params + ref_params + teacher_params + opt_state) + max(train step: grads
+ activations + backward working set, sampling: kv_cache, log-prob forwards:
logprob_forward, teacher_forward).

Agreement with XLA's own buffer assignment on CPU (`compiled.memory_analysis()`, plan /
XLA; `tests/trainer/test_memory.py`, `grpo-jax plan --compile` prints both):
- params + optimizer state vs the train step's arguments: 1.00 on every mesh tried.
- train-step temporaries: 0.91-1.05 on 1 and 8 devices, (8,1,1), (2,2,2), (1,4,2),
  (1,8,1), scanned + remat or not; outliers: pure data parallelism with activations no
  bigger than the gradients (8,1,1) 1.23 (XLA frees residuals while it writes
  gradients), scanned layers without remat 1.08-1.16. Since every Dense contracts its
  rows flattened (`layers._dot_general_rows`), XLA keeps no transposed copies of the
  activation gradients and holds less than before: scale.py tiny unrolled without remat
  1.12 on 1 device and 1.11 on (2,2,2); scanned with remat 1.12 on (1,4,2), and within
  10% on 1 device. Over-estimates err on the safe side of the fit check. An int8 LoRA
  base (model.lora.base_dtype): resident bytes 1.00 on (1,4,2); with scanned layers its
  temporaries equal the float32 base's (+0.06%), with unrolled layers XLA:CPU keeps a
  float32 copy of every kernel (not modelled).
- sampler temporaries: 0.98-1.06 on 1 and 8 devices, unrolled or scanned layers, 1,
  2 or 4 kv heads per device, T 32-256, P up to 128, vocabularies up to 8192 (scale.py
  tiny: 1 device scanned 0.99, unrolled 1.00; (2,2,2) unrolled 1.00; (1,4,2) scanned
  1.02). Outliers: (4,2,1) unrolled 1.17 (XLA frees some of the prefill's gathered
  layers, and CSEs one with the loop's, before the whole model is gathered); prefill-
  dominated configs (G <= 2, P 128-256, T 8) 0.74-1.23 (XLA keeps 2 to 4 attention-score
  buffers, split per kv head or not); bfloat16 compute 0.58-0.73: XLA:CPU computes bf16
  dots in float32, with float32 copies of the cache and of the weights that a TPU or GPU
  does not make, and keeps a bfloat16 model's KV cache in float32 (`model.cache_dtype`)
  (neither modelled: a plan is for the accelerator it names, wherever it is made).
- context parallelism (mesh.sequence, `residual_bytes(sequence=)`), scale.py tiny:
  train-step temporaries 1.12 on (data, fsdp, sequence, tensor) = (1, 2, 4, 1) and 1.07
  on (1, 4, 2, 1), scanned with remat; 0.94 on (1, 2, 4, 1) unrolled without remat; 1.16
  on (2, 1, 4, 1). The sampler splits its rows over sequence too
  (`sharding.Layout.sampling`): 0.91 on (1, 2, 4, 1), one prompt a device (XLA 2.43 MB
  a device; 6.08 MB when the sequence devices repeated the rows).
XLA on CPU does not realise the saving of remat without scan_layers (measured: 6% less
temporary memory, not the 60% the residuals predict), so the plan counts remat as
effective only with `model.scan_layers`.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.extend as jex
import jax.numpy as jnp

from grpo_jax.models import attention, kernels, kv_cache, model, paged, sampling, sharding
from grpo_jax.rl import learner, spec
from grpo_jax.trainer import abstract

GIB = 2**30

# Memory of one device (one chip for TPUs) that jax can use, GiB (vendor specifications).
DEVICE_MEMORY_GIB = {
  "tpu-v4": 32,
  "tpu-v5e": 16,
  "tpu-v5p": 95,
  "tpu-v6e": 32,
  "a100-40gb": 40,
  "a100-80gb": 80,
  "h100": 80,
  "h200": 141,
}
# XLA and the runtime keep some memory for themselves; a plan must fit in this share.
USABLE_FRACTION = 0.9


def device_bytes(device: str | float) -> float:
  """Bytes of a named device (`DEVICE_MEMORY_GIB`) or of a number of GiB."""
  if isinstance(device, int | float):
    return float(device) * GIB
  if device in DEVICE_MEMORY_GIB:
    return DEVICE_MEMORY_GIB[device] * GIB
  try:
    return float(device) * GIB
  except ValueError:
    raise ValueError(
      f"device {device!r}: name one of {sorted(DEVICE_MEMORY_GIB)} or give GiB as a number."
    ) from None


@dataclasses.dataclass(frozen=True)
class Plan:
  """Bytes per device; see the module docstring for each term."""

  mesh: tuple[int, ...]  # `sharding.AXES` sizes: (data, fsdp, expert, sequence, tensor).
  params: int
  ref_params: int
  opt_state: int
  grads: int
  activations: int  # With the config's remat / scan_layers.
  activations_no_remat: int
  activations_remat: int
  backward_working: int
  kv_cache: int
  micro_batch_rows: int  # Rows of one micro-batch on one device.
  rollout_rows: int  # Rollout rows on one device.
  logprob_forward: int = 0  # The π_old / reference forwards' working set.
  sampler_rows: int = 0  # The sampler's rows on one device (0: rollout_rows).
  teacher_params: int = 0  # config.teacher's params (distillation; 0: none).
  teacher_forward: int = 0  # Its log-prob forward's working set.
  teacher_dtype: str = ""  # Its params' dtype.

  @property
  def resident(self) -> int:
    return self.params + self.ref_params + self.teacher_params + self.opt_state

  @property
  def train_step(self) -> int:
    """Temporary memory of one train step (beyond the resident state)."""
    return self.grads + self.activations + self.backward_working

  @property
  def peak(self) -> int:
    return self.resident + max(
      self.train_step, self.kv_cache, self.logprob_forward, self.teacher_forward
    )


def _leaf_bytes(shape, dtype, names, *, rules, mesh_sizes) -> int:
  """Bytes of one device's shard of an array whose dimensions carry logical names."""
  spec = sharding.spec(tuple(names), rules, shape=shape, mesh=_Sizes(mesh_sizes))
  shard = [
    d // math.prod(mesh_sizes[a] for a in ((ax,) if isinstance(ax, str) else ax))
    if ax is not None
    else d
    for d, ax in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=True)
  ]
  return math.prod(shard) * jnp.dtype(dtype).itemsize


@dataclasses.dataclass(frozen=True)
class _Sizes:
  shape: dict


def _all_axes(sizes: dict) -> dict:
  """{mesh axis: size} for every `sharding.AXES` axis, 1 where `sizes` leaves it out."""
  return {a: sizes.get(a, 1) for a in sharding.AXES}


def _tree_bytes(boxed, *, rules, mesh_sizes) -> int:
  """Per-device bytes of an abstract tree whose param-derived leaves are boxed with
  logical names (others, e.g. step counters, are replicated)."""
  mesh_sizes = _all_axes(mesh_sizes)
  specs = nn.get_partition_spec(boxed)
  abstract = nn.unbox(boxed)
  total = 0
  for names, x in zip(
    jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, sharding.P)),
    jax.tree.leaves(abstract),
    strict=True,
  ):
    names = tuple(names) + (None,) * (x.ndim - len(tuple(names)))
    total += _leaf_bytes(x.shape, x.dtype, names, rules=rules, mesh_sizes=mesh_sizes)
  return total


def _local_model(cfg: model.ModelConfig, tensor: int) -> model.ModelConfig:
  """The shapes one device computes with under tensor parallelism of size `tensor`."""
  if tensor == 1:
    return cfg
  return dataclasses.replace(
    cfg,
    n_heads=max(cfg.n_heads // tensor, 1),
    n_kv_heads=max(cfg.n_kv_heads // tensor, 1),
    mlp_dim=max(cfg.mlp_dim // tensor, 1),
    vocab_size=max(cfg.vocab_size // tensor, 1),
  )


def residual_bytes(
  cfg: model.ModelConfig, rl_cfg: spec.RLConfig, *, rows: int, P: int, T: int, sequence: int = 1
):
  """Bytes autodiff saves in the forward of the train loss for the backward, for `rows`
  rows of P prompt + T completion tokens: the outputs of the vjp's forward that are not
  its inputs (traced with make_jaxpr; nothing runs or compiles). sequence > 1: per device
  of a context-parallel forward (`layers.length_shards`), traced as that forward runs
  (under an abstract mesh of `sequence` devices and the default rules: each query block's
  scores over all keys, the gathered keys and values) and divided by `sequence`."""
  if sequence > 1:
    mesh = jax.sharding.AbstractMesh((sequence,), ("sequence",))
    rules = (("activation_length", "sequence"),)
    names = {n for n, _ in sharding.DEFAULT_RULES} - {"activation_length"}
    rules += tuple((n, None) for n in sorted(names))
    with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(rules):
      return residual_bytes(cfg, rl_cfg, rows=rows, P=P, T=T) // sequence
  params = jax.eval_shape(functools.partial(model.init, cfg), jax.random.key(0))
  mb = abstract.minibatch(rows, P, T)
  hyper = jax.eval_shape(rl_cfg.step_hyper)
  model_fn = model.make_model_fn(cfg)

  def residuals(params, mb, hyper):
    loss = lambda p: jnp.sum(learner.token_terms(p, mb, hyper, cfg=rl_cfg, model_fn=model_fn)[0])
    return jax.vjp(loss, params)[1]

  closed = jax.make_jaxpr(residuals)(params, mb, hyper)
  produced = {out: eqn for eqn in closed.jaxpr.eqns for out in eqn.outvars}
  inputs, seen, total = set(closed.jaxpr.invars), set(), 0
  for v in closed.jaxpr.outvars:
    if isinstance(v, jex.core.Literal):
      continue
    v = _reshaped_from(v, produced)
    if v in inputs or v in seen:
      continue
    seen.add(v)
    total += v.aval.size * v.aval.dtype.itemsize
  return total


def _one_layer_bytes(cfg: model.ModelConfig, *, act) -> int:
  """The residual bytes of the largest layer: `act(cfg)` (`residual_bytes`) of a 2-layer
  stack less a 1-layer one, for each kind of layer the model has (its `layer_types`: a
  sliding and a full layer may keep different residuals), the largest."""
  kinds = sorted(set(cfg.layer_types)) or [None]

  def stack(n: int, kind: str | None) -> int:
    types = () if kind is None else (kind,) * n
    return act(dataclasses.replace(cfg, n_layers=n, layer_types=types))

  return max(stack(2, kind) - stack(1, kind) for kind in kinds)


# Primitives that only relabel their operand's elements: XLA makes them bitcasts.
_RESHAPES = ("reshape", "squeeze", "expand_dims")


def _reshaped_from(v, produced: dict):
  """The variable that `v` is a reshape of (through any chain of reshapes), else v: a
  residual saved both as [B, T, K] and as the [B·T, K] a Dense contracts
  (`layers._dot_general_rows`) is one buffer, the reshape a bitcast."""
  while (eqn := produced.get(v)) is not None and eqn.primitive.name in _RESHAPES:
    if isinstance(eqn.invars[0], jex.core.Literal):
      break
    v = eqn.invars[0]
  return v


def plan(
  model_cfg: model.ModelConfig,
  rl_cfg: spec.RLConfig,
  mesh_cfg: sharding.MeshConfig,
  *,
  n_devices: int,
  prompts: int,
  group_size: int,
  prompt_len: int,
  max_new_tokens: int,
  optimizer,
  decode_segments: int = 1,
  shared_prefix: bool = False,
  pages: tuple[int, int] | None = None,
  teacher_cfg: model.ModelConfig | None = None,
  platform: str | None = None,
) -> Plan:
  """The per-device memory plan (see the module docstring); decode_segments: the
  sampler's (`sampling.segment_count`); shared_prefix: whether its group rows share the
  prompt's cache slots (`model.KVCache.share`); pages: (pool pages, Z) of a paged
  sampler (`_pool_pages`), None: dense; teacher_cfg: distillation's teacher (None: none);
  platform: the devices' ("cpu", "gpu", "tpu"; None: `kernels.target_platform`), for the
  sampler's XLA:CPU-only copies."""
  sizes = mesh_cfg.sizes(n_devices)
  fsdp, seq, tensor = sizes["fsdp"], sizes["sequence"], sizes["tensor"]
  dp = mesh_cfg.batch_split(n_devices)  # data · fsdp · expert: the batch's parts.
  # Context parallelism splits the teacher-forced forwards' tokens over `sequence` when it
  # divides them (`layers.length_shards`); a sampler splits its rows over it instead, when
  # data · fsdp · expert · sequence divides the prompts (`sharding.Layout.sampling`).
  cp = seq if seq > 1 and (prompt_len + max_new_tokens) % seq == 0 else 1
  sampler_dp = dp * seq if prompts % (dp * seq) == 0 else dp
  rules = mesh_cfg.rules
  boxed = jax.eval_shape(functools.partial(model.init_boxed, model_cfg), jax.random.key(0))
  boxed = model.cast_base(boxed, model_cfg)  # model.lora.base_dtype.
  params = _tree_bytes(boxed, rules=rules, mesh_sizes=sizes)
  # With adapters (model.lora) only they are differentiated: gradients and the optimizer
  # state are theirs, and the reference is the base itself (no copy).
  trainable = _tree_bytes(model.split_trainable(boxed)[0], rules=rules, mesh_sizes=sizes)
  adapted = model.is_adapted(boxed)
  state = jax.eval_shape(lambda b: spec.init_state(b, optimizer), boxed)
  opt_state = _tree_bytes(state.opt_state, rules=rules, mesh_sizes=sizes)
  N = prompts * group_size
  P, T = prompt_len, max_new_tokens
  mb_rows = max(N // rl_cfg.num_minibatches // rl_cfg.micro_batches // dp, 1)
  if rl_cfg.micro_batch_tokens:  # The full-length bucket's rows: the most activations.
    _, budget_rows = learner.token_budget_rows(
      rl_cfg, P=P, T=T, N=N // rl_cfg.num_minibatches, row_multiple=dp
    )
    mb_rows = max(budget_rows[-1] // dp, 1)
  local = _local_model(model_cfg, tensor)
  act = functools.partial(residual_bytes, rl_cfg=rl_cfg, rows=mb_rows, P=P, T=T)
  no_remat = dataclasses.replace(local, remat="none", scan_layers=False)
  with_remat = dataclasses.replace(local, remat="full", scan_layers=True)
  one_layer = _one_layer_bytes(no_remat, act=functools.partial(act, sequence=cp))
  # With context parallelism each device keeps 1/cp of the residuals of the forward that
  # splits the tokens (its queries' scores over all S keys: S²/cp a head, not the causal
  # blocks' share), `residual_bytes(sequence=)`.
  a_none, a_remat = act(no_remat, sequence=cp), act(with_remat, sequence=cp)
  remat_on = model_cfg.remat != "none" and model_cfg.scan_layers
  T_local = T // cp
  logits_grad = mb_rows * min(T_local, rl_cfg.logit_chunk or T_local) * local.vocab_size * 4
  working = logits_grad
  if remat_on or model_cfg.scan_layers:  # The backward of one layer, its recomputed
    S = P + T  # activations and its attention-score gradient (the causal blocks' entries,
    # `attention.causal_blocks`; a query block's under context parallelism), at the
    # scan's pace.
    working += one_layer
    if model_cfg.attention_impl == "xla":  # A kernel keeps its score blocks in VMEM.
      qb = model_cfg.context_query_block
      if cp > 1:  # Each device's query blocks over all S keys (`attend_query_blocks`).
        entries = min(S // cp, qb or S) * S
      else:
        # Blocks attended whole: their entries once. Blocks attended in steps (long rows):
        # one step's, twice (its recomputed probabilities and their gradient; XLA:CPU
        # keeps the scores too when little else is live).
        entries = attention.causal_score_entries(S, qb, step_buffers=2)
      working += mb_rows * local.n_heads * entries * 4
  if model_cfg.scan_layers:  # The layer scan's stacked gradient, before it is accumulated.
    working += trainable
  # FSDP: weights are all-gathered over fsdp to compute; XLA gathers them all at once
  # (one layer at a time when the layers are scanned).
  gathered = params * (fsdp - 1) // (model_cfg.n_layers if model_cfg.scan_layers else 1)
  working += gathered
  rollout_rows = N // dp if N % dp == 0 else N
  lp_rows = -(-rollout_rows // rl_cfg.logprob_batches)
  positions = min(T_local, rl_cfg.logit_chunk or T_local)
  forward = lambda m, weights: (  # noqa: E731 -- logits, exp, probs; two hidden states.
    3 * lp_rows * positions * m.vocab_size * 4
    + 2 * lp_rows * (P + T) // cp * m.d_model * 4
    + weights
  )
  # No log-prob forward runs when π_old comes from the update's (rl.old_logp_from) and no
  # reference is read.
  logprob_forward = forward(local, gathered) if rl_cfg.forwards_old_logp or rl_cfg.use_ref else 0
  teacher_params = teacher_forward = 0
  if teacher_cfg is not None:
    t_boxed = jax.eval_shape(functools.partial(model.init_boxed, teacher_cfg), jax.random.key(0))
    teacher_params = _tree_bytes(t_boxed, rules=rules, mesh_sizes=sizes)
    t_gathered = (
      teacher_params * (fsdp - 1) // (teacher_cfg.n_layers if teacher_cfg.scan_layers else 1)
    )
    teacher_forward = forward(_local_model(teacher_cfg, tensor), t_gathered)
  sampler_rows = N // sampler_dp if N % sampler_dp == 0 else N
  sampler_cfg, view = model.sampler_view(model_cfg, fsdp=fsdp)
  sampled, merged = _sampled_tree(boxed, sampler_cfg, view), 0
  if sampled is not boxed:  # Merged adapters or unstacked layers: a copy of the weights.
    merged = _tree_bytes(sampled, rules=rules, mesh_sizes=sizes)
  kv = merged + _sampler_bytes(
    sampler_cfg,
    sampled,
    rules=rules,
    sizes=sizes,
    rows=sampler_rows,
    prompt_rows=prompts // sampler_dp if prompts % sampler_dp == 0 else prompts,
    row_devices=sampler_dp,
    P=P,
    T=T,
    segments=decode_segments,
    shared=shared_prefix,
    pages=pages,
    platform=platform,
  )
  return Plan(
    mesh=tuple(sizes.values()),
    params=params,
    ref_params=params if rl_cfg.use_ref and not adapted else 0,
    opt_state=opt_state,
    # The micro-batch gradient, plus the accumulator when there are several micro-batches.
    grads=trainable * (2 if rl_cfg.micro_batches > 1 or rl_cfg.micro_batch_tokens else 1),
    activations=a_remat if remat_on else a_none,
    activations_no_remat=a_none,
    activations_remat=a_remat,
    backward_working=working,
    kv_cache=kv,
    micro_batch_rows=mb_rows,
    rollout_rows=rollout_rows,
    logprob_forward=logprob_forward,
    sampler_rows=sampler_rows,
    teacher_params=teacher_params,
    teacher_forward=teacher_forward,
    teacher_dtype=teacher_cfg.param_dtype if teacher_cfg is not None else "",
  )


def _local_size(n: int, name: str, rules, sizes) -> int:
  """One device's part of a dimension of n named `name` (whole when not divisible)."""
  axes = dict(rules).get(name)
  size = math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes or ()))
  return n // size if n % size == 0 else n


def _sampled_tree(boxed, sampler_cfg: model.ModelConfig, view):
  """The boxed abstract params the samplers read (`model.sampler_view`'s config and view),
  which the sampler holds for the whole call: with adapters merged for sampling, the base
  with each adapter folded into its kernel (in the kernel's dtype; a quantized kernel
  dequantized to float32); with scanned layers decoded unrolled, every layer's slices;
  else `boxed` itself."""
  if view is None:
    return boxed
  names = jax.eval_shape(functools.partial(model.init_boxed, sampler_cfg), jax.random.key(0))
  merged = jax.eval_shape(view, nn.unbox(boxed))
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)  # noqa: E731
  return jax.tree.map(lambda box, x: box.replace_boxed(x), names, merged, is_leaf=is_box)


def _sampler_bytes(
  cfg: model.ModelConfig,
  boxed,
  *,
  rules,
  sizes,
  rows,
  prompt_rows,
  P,
  T,
  segments=1,
  shared=False,
  pages=None,
  row_devices=None,
  rings=True,
  platform=None,
) -> int:
  """Temporary memory of the compiled sampler (`sampling.sample`) on one device: the
  largest of its three phases (module docstring, "sampler"). `rows` rollout rows and
  `prompt_rows` prompts on a device; P prompt slots, T new tokens; `shared`: the rows
  share their prompt's P - 1 slots (`model.KVCache.share`) and own T slots each.
  pages: (pool pages, page size Z) of a paged cache (`paged`), or None: dense.
  row_devices: the devices the rows are split over (None: data × fsdp × expert). rings:
  whether the cache keeps its sliding layers in window rings (`model.init_cache`).
  platform: the devices' (None: `kernels.target_platform`): XLA:CPU's extra copies of a
  cache with one kv head per device are counted on "cpu" only. `sizes` may leave axes
  out (size 1)."""
  sizes = _all_axes(sizes)
  if pages is not None:
    split = row_devices or sizes["data"] * sizes["fsdp"] * sizes["expert"]
    return _paged_sampler_bytes(cfg, boxed, rules=rules, sizes=sizes, rows=rows, prompt_rows=prompt_rows,
                                P=P, T=T, pages=pages, rings=rings, global_rows=rows * split)  # fmt: skip
  fsdp, L, E = sizes["fsdp"], cfg.n_layers, cfg.head_dim
  item = jnp.dtype(cfg.compute_dtype).itemsize
  kv_heads = _local_size(cfg.n_kv_heads, "activation_kv_heads", rules, sizes)
  heads = _local_size(cfg.n_heads, "q_heads", rules, sizes)
  mlp = _local_size(cfg.mlp_dim, "mlp", rules, sizes)
  vocab = _local_size(cfg.vocab_size, "activation_vocab", rules, sizes)
  # Weights as a device computes with them: gathered over fsdp, split over tensor.
  whole = dict(sizes, fsdp=1)
  tables_of = boxed["base"] if model.is_adapted(boxed) else boxed  # Adapters unmerged.
  part = lambda k: _tree_bytes(tables_of[k], rules=rules, mesh_sizes=whole) if k in tables_of else 0
  w_model = _tree_bytes(boxed, rules=rules, mesh_sizes=whole)
  w_tables = part("embed") + part("lm_head")
  w_layer = (w_model - w_tables - part("final_norm")) // L
  S = T if shared else P - 1 + T  # Each row's own slots.
  buf = rows * kv_heads * S * E * item  # One layer's keys [rows, K, E, S] (or values).
  # A shared cache's prefix: one layer's keys [prompts, K, E, P - 1] (or values), read only.
  prefix_buf = prompt_rows * kv_heads * (P - 1) * E * item if shared else 0
  # The cache's int32 positions [rows, S] (and the prefix's [prompts, P - 1]).
  pos = rows * S * 4 + (prompt_rows * (P - 1) * 4 if shared else 0)
  # Sliding-window layers of an unstacked cache keep min(slots, window) (`KVCache.rings`),
  # own and prefix slots alike, with int32 positions of their own.
  rings = sum(model.cache_rings(cfg)) if rings else 0
  W = cfg.sliding_window
  ring_buf = buf * min(S, W) // S if rings else 0
  ring_prefix = prefix_buf * min(P - 1, W) // (P - 1) if rings and shared else 0
  if rings:
    pos += rows * min(S, W) * 4 + (prompt_rows * min(P - 1, W) * 4 if shared else 0)
  layer_bufs = (L - rings) * buf + rings * ring_buf  # Every layer's own keys (or values).
  cache = 2 * (layer_bufs + (L - rings) * prefix_buf + rings * ring_prefix) + pos
  # The prompt batch's keys (or values) of every layer [L, B, P - 1, K, E], from the
  # prefill forward, before they are transposed and written into the cache.
  prompt_kv = L * prompt_rows * (P - 1) * kv_heads * E * item
  # One kv head per device: the attention reads the step's cache with that unit
  # dimension bitcast away, and XLA writes the step's k/v twice, into the carried buffer
  # and into a copy the attention reads (each from a copy of the buffer).
  unit_heads = kv_heads == 1
  # The prefill forward of one layer: float32 attention scores and their exponentials
  # [B, heads, P - 1, P - 1] (the causal blocks' entries, `attention.causal_blocks`), and the
  # MLP's gate, up and their product [B·(P - 1), F]. A chunked prefill
  # (`SamplerConfig.prefill_chunk`) is priced as one call: its last call's [B, heads, C, P - 1]
  # scores (2 buffers, as here) are what it saves, but XLA keeps more than that live
  # (experiments/long_prefill.py: 0.4-0.6x of XLA's figure on CPU and on a TPU v5e), so
  # the plan does not credit it until that is explained: the fit check stays safe.
  scores = prompt_rows * heads * attention.causal_score_entries(P - 1) * 4
  prefill_layer = 2 * scores + 3 * prompt_rows * (P - 1) * mlp * item
  # One decode step's sampling (`choose_tokens` with top-k / top-p compiled in): five
  # float32 [rows, V / tensor] buffers live at once: the logits, the temperature-scaled
  # logits, their order keys, the probabilities, the filtered logits.
  step_sampling = 5 * rows * vocab * 4
  # Tables an fsdp device gathers for the decode loop, hoisted out of it by XLA: the
  # embedding for the lookup, and again for a tied LM head (or the untied lm_head).
  tables = (w_tables + (part("embed") if cfg.tie_embeddings else 0)) if fsdp > 1 else 0
  if cfg.scan_layers:
    # The layer scan reads the stacked cache and writes a new one [L, rows, ...]; inside
    # it, one layer's k and v sliced out of the stack and the copy the step's write
    # goes into (3 buffers; 6 with one kv head per device), and one layer's weights
    # (sliced out of the stacked params, or gathered over fsdp). After the scan the old
    # stack is dead while the step samples.
    stacked = 2 * L * buf
    scan_body = 2 * stacked + 2 * L * prefix_buf + 3 * (2 if unit_heads else 1) * buf + w_layer
    decode = pos + tables + max(scan_body, stacked + 2 * L * prefix_buf + step_sampling)
    prefill_weights = w_layer + (part("embed") if fsdp > 1 else 0)
    hoisted = tables
  else:
    # The carried cache, with one kv head per device 2.5 buffers per layer buffer in
    # XLA's assignment (the carried one, and the copies for the second write) -- keys
    # only when p·V is a multiply-reduce (`attention._pv_by_reduce`), which reads the values
    # where they are; with fsdp the whole model gathered once for the loop, hoisted.
    hoisted = w_model - w_tables + tables if fsdp > 1 else 0
    if segments > 1:  # Each segment's loop hoists its own gather; XLA keeps two live.
      hoisted *= 2
    # The model decides on the global shapes it sees under jit (all rows, all kv heads).
    R = cfg.n_heads // cfg.n_kv_heads
    # The own slots' p·V (`attention.attend_shared`).
    global_rows = rows * (row_devices or sizes["data"] * fsdp * sizes["expert"])
    copied = 1 if attention._pv_by_reduce(global_rows, cfg.n_kv_heads, R, S, E) else 2
    # XLA:CPU's copies; compiled for a TPU v5e chip, a 1-kv-head sampler keeps none
    # (Gemma 3 1B, 16 rows to 8,192 tokens: 3.63 GB against this plan's 3.61 GB without
    # them, `experiments/window_rings.py`).
    on_cpu = (platform or kernels.target_platform()) == "cpu"
    copies = 1.5 * copied * layer_bufs if unit_heads and on_cpu else 0
    decode = cache + copies + hoisted + step_sampling
    prefill_weights = w_model if fsdp > 1 else 0  # Gathered all at once, as in training.
  prefill = hoisted + prefill_weights + prefill_layer + 2 * prompt_kv
  # The prefill's end: the rollout cache written (prompt rows repeated G times) while
  # one of the prompt batch's k/v stacks is still being read.
  write = cache + prompt_kv + hoisted
  # The last grow between decode segments (`KVCache.grow`, unrolled layers): the cache at
  # its full size while the last layer buffer of the previous segment's size is copied.
  grow = 0
  if segments > 1 and not cfg.scan_layers:
    grow = cache + buf * (S - T + -(-(segments - 1) * T // segments)) // S + hoisted
  return int(max(decode, prefill, write, grow))


def _paged_sampler_bytes(cfg, boxed, *, rules, sizes, rows, prompt_rows, P, T, pages,
                         rings=True, global_rows=None) -> int:  # fmt: skip
  """`_sampler_bytes` of the paged sampler (`paged.sample`), the larger of two phases.
  - decode: the pools, 2·[pages + 1, K, E, Z] a layer and int32 positions [pages + 1, Z],
    written in place; a sliding layer's window rings instead where the pool would hold
    more (`rings`; `paged.keeps_rings` for the global_rows), 2·[rows, K, E, R], R =
    min(ceil((P − 1)/Z)·Z + T, window), int32 positions [rows, R], and the keys a
    compacted step gathers for ceil(rows/2) rows (XLA:CPU keeps every layer's; a refill
    sampler's prompt rings are not counted); the page table [rows, M] int32; one layer's
    attention block, keys and values [rows, K, E, b] and float32 scores and exponentials
    [rows, heads, b] (b = paged._BLOCK_SLOTS, or R: `attention.attend_ring` reads a ring
    whole); the step's sampling as the dense sampler's, and the full-row logits.
  - prefill: the dense prompt cache (`_sampler_bytes` with T = 1), then cut into pages
    (and rings) beside the pools it becomes.
  A pool is one array, not split over the batch axes (`paged`, module docstring)."""
  n_pages, Z = pages
  L, E = cfg.n_layers, cfg.head_dim
  item = jnp.dtype(kv_cache.cache_dtype(cfg)).itemsize
  kv_heads = _local_size(cfg.n_kv_heads, "activation_kv_heads", rules, sizes)
  heads = _local_size(cfg.n_heads, "q_heads", rules, sizes)
  vocab = _local_size(cfg.vocab_size, "activation_vocab", rules, sizes)
  S, W, all_rows = -(-(P - 1) // Z) * Z, cfg.sliding_window, global_rows or rows
  kept = rings and paged.keeps_rings(rows=all_rows, slots=S + T, pool_pages=n_pages, page_size=Z, window=W)  # fmt: skip
  n_rings, R = (sum(model.cache_rings(cfg)) if kept else 0), min(S + T, W)
  n_pages += all_rows * -(-T // Z) if n_rings == L else 0  # Positions only, a whole pool.
  ring_bytes = (2 * n_rings * kv_heads * E * item + 4) * rows * R if n_rings else 0
  ring_bytes += n_rings * -(-rows // 2) * kv_heads * E * R * item if rows > 1 else 0
  pools = 2 * (L - n_rings) * (n_pages + 1) * kv_heads * E * Z * item + (n_pages + 1) * Z * 4 + ring_bytes  # fmt: skip
  M = -(-(P - 1) // Z) + -(-T // Z)
  block = max(min(paged._BLOCK_SLOTS, M * Z), R if n_rings else 0)
  attend = 2 * rows * kv_heads * E * block * item + 2 * rows * heads * block * 4
  decode = pools + rows * M * 4 + attend + 6 * rows * vocab * 4
  prompt_cache = _sampler_bytes(
    cfg, boxed, rules=rules, sizes=sizes, rows=prompt_rows, prompt_rows=prompt_rows,
    P=-(-(P - 1) // Z) * Z + 1, T=1, rings=rings,
  )  # fmt: skip
  return int(max(decode, prompt_cache + pools))


def plan_for(
  setup, *, n_devices: int | None = None, optimizer=None, platform: str | None = None
) -> Plan:
  """The plan of a `build.Setup` on n_devices (default: this host's), with the run's
  optimizer (`spec.make_optimizer`) unless another is given, for devices of `platform`
  ("cpu", "gpu", "tpu"; None: `kernels.target_platform`, this host's outside a mesh)."""
  platform = platform or kernels.target_platform()
  scfg, loop = setup.sampler_cfg, setup.loop
  optimizer = optimizer or spec.make_optimizer(
    lr=loop.learning_rate,
    warmup_steps=loop.warmup_steps,
    weight_decay=loop.weight_decay,
    grad_clip=loop.grad_clip,
  )
  return plan(
    setup.model_cfg,
    setup.rl_cfg,
    setup.mesh_cfg,
    n_devices=n_devices or jax.device_count(),
    prompts=loop.prompts_per_step,
    group_size=setup.update_group,
    prompt_len=max(scfg.prompt_buckets),
    max_new_tokens=scfg.max_new_tokens,
    optimizer=optimizer,
    decode_segments=sampling.segment_count(scfg, platform=platform),
    # The static sampler's (the refill sampler copies each prompt's slots into its rows).
    shared_prefix=scfg.shared_prefix and scfg.group_size > 1 and not scfg.refill_slots,
    pages=_pool_pages(_pool_sampler(setup), prompts=loop.prompts_per_step),
    teacher_cfg=setup.teacher_source and setup.teacher_source.model_cfg,
    platform=platform,
  )


def device_platform(device: str) -> str | None:
  """The platform of a named device (`DEVICE_MEMORY_GIB`): "tpu" or "gpu"; None for a
  number of GiB."""
  if device in DEVICE_MEMORY_GIB:
    return "tpu" if device.startswith("tpu-") else "gpu"
  return None


def _pool_sampler(setup) -> sampling.SamplerConfig:
  """The sampler config whose pool the plan prices: with episodes, partial rollouts or
  trained counterfactual rows the training rows decode on a whole pool whatever
  sampler.kv_pool_fraction says (`episodes._paged_cache`, `rollouts.counterfactuals.sample_limited`),
  so the plan prices it whole; episodes through refill slots keep every episode's pages
  while it waits to act (`episode_refill`): a pool of all N rows, not of S slots."""
  scfg, op = setup.sampler_cfg, setup.offpolicy
  if setup.episodes is not None:
    return dataclasses.replace(scfg, kv_pool_fraction=1.0, refill_slots=0)
  whole = (op.enabled and op.partial != "off") or setup.counterfactual.train
  return dataclasses.replace(scfg, kv_pool_fraction=1.0) if whole else scfg


def _pool_pages(scfg: sampling.SamplerConfig, *, prompts: int) -> tuple[int, int] | None:
  """(pages, Z) of the train sampler's pool (sampler.kv_layout="paged"), else None: the
  prompts' pages (each row's own copy without sampler.shared_prefix) and the completion
  pages (`paged.completion_pages`) of all the step's rows, or of the refill sampler's
  slots (a pool is not split over devices)."""
  if scfg.kv_layout != "paged":
    return None
  rows, Z = scfg.refill_slots or prompts * scfg.group_size, scfg.page_size
  # The refill sampler's slots always read their prompt's pages (`refill._paged_slots`).
  shared = scfg.refill_slots or (scfg.shared_prefix and scfg.group_size > 1)
  owners = prompts if shared else rows
  prompt_pages = owners * -(-(max(scfg.prompt_buckets) - 1) // Z)
  return prompt_pages + paged.completion_pages(scfg, rows), Z


def limit_bytes(memory_limit_gib: float = 0.0) -> float | None:
  """Bytes per device a plan must fit: memory_limit_gib, else the device's own limit
  (jax's memory_stats: GPU, TPU), else None (CPU: no limit known)."""
  if memory_limit_gib:
    return memory_limit_gib * GIB
  stats = jax.local_devices()[0].memory_stats() or {}
  return stats.get("bytes_limit")


# What model.remat = "auto" tries, fastest first: (remat, scan_layers, logit chunk or None
# for the config's). The first whose plan fits is taken; the last when none does (the
# memory check then refuses the config with its advice).
AUTO_CANDIDATES = (("none", None, None), ("full", True, None), ("full", True, 256))


def resolve_auto(model_cfg, rl_cfg, *, limit: float | None, plan_fn):
  """(model_cfg, rl_cfg) with model.remat = "auto" resolved by the memory plan:
  `plan_fn(model_cfg, rl_cfg) -> Plan` for each of AUTO_CANDIDATES in turn (no limit: the
  first). Configs without "auto" come back unchanged."""
  if model_cfg.remat != "auto":
    return model_cfg, rl_cfg
  chosen = None
  for remat, scan, chunk in AUTO_CANDIDATES:
    m = dataclasses.replace(
      model_cfg, remat=remat, scan_layers=model_cfg.scan_layers if scan is None else scan
    )
    r = (
      rl_cfg
      if chunk is None or rl_cfg.logit_chunk
      else dataclasses.replace(rl_cfg, logit_chunk=chunk)
    )
    chosen = (m, r)
    if limit is None or fits(plan_fn(m, r), limit):
      break
  return chosen


def as_dict(p: Plan) -> dict:
  """Every figure, bytes per device (the terms, resident, train_step and peak)."""
  d = dataclasses.asdict(p)
  d.update(resident=p.resident, train_step=p.train_step, peak=p.peak)
  return d


def fits(p: Plan, device_memory: float) -> bool:
  return p.peak <= USABLE_FRACTION * device_memory


def measure(setup, fns) -> dict:
  """XLA's own figures for the trainer's compiled update (the scan of train steps over one
  rollout batch) and sampler on this host's devices (`compiled.memory_analysis()`, bytes per
  device): compiles, allocates nothing. "train_step_arguments" counts the update's
  arguments without the rollout batch (the plan's resident params and optimizer state)."""
  rl_cfg = setup.rl_cfg
  state, batch, key, prompts = abstract.inputs(setup, fns)
  # Each lowered in its own layout's context (a sampler's rules differ under context
  # parallelism, `sharding.Layout.sampling`), its arguments on its in_shardings.
  update = fns.rl.update.lower(state, batch, key, jax.eval_shape(rl_cfg.step_hyper))
  sample = fns.samplers.train.lower(state.params, prompts, key, setup.sampling_hyper)
  a, b = update.compile().memory_analysis(), sample.compile().memory_analysis()
  batch_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(batch))
  return {
    "train_step_arguments": a.argument_size_in_bytes - batch_bytes // fns.layout.batch_size_divisor,
    "train_step_temp": a.temp_size_in_bytes,
    "sample_temp": b.temp_size_in_bytes,
  }
