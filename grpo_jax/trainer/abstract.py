"""A run's inputs as shapes and dtypes (`jax.ShapeDtypeStruct`), nothing allocated: what the
memory plan traces (`memory.residual_bytes`) and what XLA lowers the update and the sampler
on (`memory.measure`, `aot`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from grpo_jax.models import model, moe, sampling
from grpo_jax.rl import spec


def minibatch(rows: int, P: int, T: int, *, replay=None) -> spec.RolloutBatch:
  """Shapes and dtypes of a mini-batch of `rows` rows of P prompt + T completion tokens;
  with replay = the model config, the routes it replays (rl.routing_replay)."""
  sd = jax.ShapeDtypeStruct
  routes = {}
  if replay is not None:
    L, k, dtype = replay.n_layers, replay.experts_per_token, moe.route_dtype(replay.n_experts)
    routes = dict(
      prompt_routes_NPLK=sd((rows, P, L, k), dtype), routes_NTLK=sd((rows, T, L, k), dtype)
    )
  token = lambda *shape: sd(shape, jnp.int32)
  flag = lambda *shape: sd(shape, jnp.bool_)
  real = lambda *shape: sd(shape, jnp.float32)
  return spec.RolloutBatch(
    prompt_tokens_NP=token(rows, P),
    prompt_mask_NP=flag(rows, P),
    tokens_NT=token(rows, T),
    mask_NT=flag(rows, T),
    loss_mask_NT=flag(rows, T),
    adv_NT=real(rows, T),
    old_logp_NT=real(rows, T),
    ref_logp_NT=real(rows, T),
    group_ids_N=token(rows),
    **routes,
  )


def inputs(setup, fns) -> tuple:
  """(train state, rollout batch, key, prompt batch) of a run as shapes and dtypes: what
  its update and sampler are lowered on (`measure`, `aot`), nothing allocated."""
  scfg = setup.sampler_cfg
  N, P, T = setup.update_rows, max(scfg.prompt_buckets), scfg.max_new_tokens
  sd = jax.ShapeDtypeStruct
  state = jax.eval_shape(
    lambda k: spec.init_state(
      model.cast_base(model.init(setup.model_cfg, k), setup.model_cfg), fns.optimizer
    ),
    jax.random.key(0),
  )
  key = jax.eval_shape(lambda: jax.random.key(0))
  B = setup.loop.prompts_per_step
  prompts = sampling.Prompts(tokens_BP=sd((B, P), jnp.int32), mask_BP=sd((B, P), jnp.bool_))
  replay = setup.model_cfg if setup.rl_cfg.routing_replay else None
  return state, minibatch(N, P, T, replay=replay), key, prompts
