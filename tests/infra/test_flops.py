"""Model FLOPs (`infra.flops`): the LM head counts only where logits are used.

Hand-computed figures use a tiny decoder, D = 4, L = 1, H = 2, K = 1, E = 2, F = 3, V = 10:
  P_body = 2·4·2·2 + 2·4·1·2 + 3·4·3 = 32 + 16 + 36 = 84,  P_head = 4·10 = 40,
  attention 4·L·H·E = 16 FLOPs per attended position, so a causal forward over n tokens
  spends 16·n(n+1)/2 = 8·n(n+1) on it.
"""

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp

from grpo_jax.infra import flops, hlo
from grpo_jax.models import attention, logprobs, model, sampling

TINY = types.SimpleNamespace(
  d_model=4, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=2, mlp_dim=3, vocab_size=10
)


def test_matmul_params_split_into_body_and_head_by_hand():
  assert flops.body_matmul_params(TINY) == 84
  assert flops.head_matmul_params(TINY) == 40
  assert flops.matmul_params(TINY) == 124


def test_sequence_forward_counts_the_head_at_its_positions_only():
  # n = 5 tokens: body 2·84·5 = 840, attention 8·5·6 = 240, head 2·40 = 80 per position.
  assert flops.sequence_forward_flops(TINY, length=5, head_positions=2) == 840 + 160 + 240
  pretraining = flops.sequence_forward_flops(TINY, length=5, head_positions=5)
  assert pretraining == 840 + 400 + 240
  # The teacher-forced forward over P + T = 3 + 2 runs the head at T = 2: 2·D·V·P less.
  assert pretraining - flops.sequence_forward_flops(TINY, length=5, head_positions=2) == (
    2 * 4 * 10 * 3
  )


def test_sampling_counts_the_head_once_per_row_per_step_and_never_at_prefill():
  # B = 2 prompts of P = 4, G = 3 (6 rows), 3 steps. Prefill: P − 1 = 3 tokens a prompt,
  # no head: 2·(2·84·3 + 8·3·4) = 1200. Step k attends P + k = 4, 5, 6 positions:
  # f(c) = 2·124 + 16·c = 312, 328, 344 a row.
  got = flops.sampling_flops(TINY, prompts=2, group_size=3, prompt_len=4, new_tokens=3)
  assert got == 1200 + 6 * (312 + 328 + 344)
  # One more step adds the head once per row (and f(7) = 360 in all).
  more = flops.sampling_flops(TINY, prompts=2, group_size=3, prompt_len=4, new_tokens=4)
  assert more - got == 6 * 360


def test_phase_flops_by_hand():
  # s = forward over P + T = 4 + 3 = 7, head at T = 3: 2·84·7 + 2·40·3 + 8·7·8 = 1864.
  kw = dict(prompts=2, group_size=3, prompt_len=4, new_tokens=3, rollout_rows=6)
  got = flops.phase_flops(TINY, **kw, update_rows=6, forwards=2, epochs=2)
  assert got == {"sample": 7104.0, "logprobs": 2 * 6 * 1864.0, "update": 3 * 2 * 6 * 1864.0}
  fewer = flops.phase_flops(TINY, **kw, update_rows=6, forwards=0, epochs=1, decode_steps=2)
  assert fewer == {"sample": 1200 + 6 * (312 + 328.0), "logprobs": 0.0, "update": 3 * 6 * 1864.0}


def test_run_phase_flops_reads_the_setup():
  """A run's phases: 1 forward for a π_old recomputed by its own forward (none when the
  update's forward gives it), 1 for a reference, G, T, epochs and the update rows from its
  Setup; rollout rows and decode steps as the run had them."""
  ns = types.SimpleNamespace
  setup = ns(
    model_cfg=TINY,
    loop=ns(prompts_per_step=2),
    sampler_cfg=ns(group_size=3, max_new_tokens=3),
    rl_cfg=ns(forwards_old_logp=True, use_ref=True, ppo_epochs=2),
    rollout_rows=6,
    update_rows=6,
  )
  got = flops.run_phase_flops(setup, prompt_len=4)
  assert got == {"sample": 7104.0, "logprobs": 2 * 6 * 1864.0, "update": 3 * 2 * 6 * 1864.0}
  setup.rl_cfg = ns(forwards_old_logp=True, use_ref=False, ppo_epochs=1)
  got = flops.run_phase_flops(setup, prompt_len=4, rollout_rows=3, decode_steps=2)
  want = {"sample": 1200 + 6 * (312 + 328.0), "logprobs": 3 * 1864.0, "update": 3 * 6 * 1864.0}
  assert got == want
  setup.rl_cfg = ns(forwards_old_logp=False, use_ref=False, ppo_epochs=1)  # From the update.
  got = flops.run_phase_flops(setup, prompt_len=4, rollout_rows=3, decode_steps=2)
  assert got == {**want, "logprobs": 0.0}


CFG = model.ModelConfig(
  vocab_size=256, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, mlp_dim=32
)


def test_the_teacher_forced_forward_has_the_dots_the_count_says():
  # XLA's dots of `completion_logprobs` (N = 2 rows, P = 3, T = 4): the body over P + T,
  # the head at T. Its attention computes every score of its one causal block
  # (`attention.causal_score_entries`: S² at S < 64) where the count takes the causal half.
  N, P, T = 2, 3, 4
  S = P + T
  params = model.init(CFG, jax.random.key(0))
  fn = functools.partial(logprobs.completion_logprobs, model_fn=model.make_model_fn(CFG))
  ones = lambda n: jnp.ones((N, n), jnp.int32)  # noqa: E731
  compiled = jax.jit(fn).lower(params, ones(P), ones(P) > 0, ones(T), ones(T) > 0).compile()
  per_entry = 4 * CFG.n_layers * CFG.n_heads * CFG.head_dim
  blocks = per_entry * (attention.causal_score_entries(S) - S * (S + 1) / 2)
  want = N * (flops.sequence_forward_flops(CFG, length=S, head_positions=T) + blocks)
  assert hlo.matmul_flops(compiled.as_text()) == want
  # The pre-training convention (the head at all S) is off by exactly the prompt's heads.
  pretraining = N * (flops.sequence_forward_flops(CFG, length=S, head_positions=S) + blocks)
  assert pretraining - want == N * 2 * CFG.d_model * CFG.vocab_size * P


def test_the_prefill_runs_no_head():
  # `sampling.prefill` drops the prompt's logits (the last prompt token is decode step 0),
  # so XLA drops the head: its dots are the same at two vocabulary sizes.
  B, P = 2, 5
  prompts = sampling.Prompts(
    tokens_BP=jnp.ones((B, P), jnp.int32), mask_BP=jnp.ones((B, P), jnp.bool_)
  )
  scfg = sampling.SamplerConfig(max_new_tokens=3, eos_ids=(1,), pad_id=0, group_size=2)

  def prefill_dots(cfg):
    fn = functools.partial(
      sampling.prefill,
      model_fn=model.make_model_fn(cfg),
      init_cache=functools.partial(model.init_cache, cfg),
      cfg=scfg,
    )
    params = model.init(cfg, jax.random.key(0))
    return hlo.matmul_flops(
      jax.jit(fn).lower(params, prompts, jax.random.key(1)).compile().as_text()
    )

  small, large = prefill_dots(CFG), prefill_dots(dataclasses.replace(CFG, vocab_size=512))
  assert small == large > 0


def test_experts_and_windows_count_the_work_a_token_needs_by_hand():
  """A mixture of experts counts the k experts a token goes through and the router (D 64,
  top 2 of 4 experts of width 32: 2·3·64·32 + 64·4 = 12,544 a layer, beside attention's
  2·64·4·16 + 2·64·2·16 = 12,288); a 3-token window attends Σ_{t<5} min(t+1, 3) = 12
  positions over 5 tokens where a full layer attends 15."""
  moe = model.tiny_config(32, n_experts=4, experts_per_token=2, expert_mlp_dim=32)
  assert flops.body_matmul_params(moe) == 2 * (12_288 + 12_544)
  window = model.tiny_config(
    32, sliding_window=3, layer_types=("sliding_attention", "full_attention")
  )
  attention = flops.sequence_forward_flops(window, length=5, head_positions=0) - 2.0 * 5 * (
    flops.body_matmul_params(window)
  )
  assert attention == 4.0 * 4 * 16 * (12 + 15)
  per_token = flops.forward_flops_per_token(window, context=10) - 2 * flops.matmul_params(window)
  assert per_token == 4.0 * 4 * 16 * (3 + 10)


def test_a_runs_peak_is_measured_once_per_process_and_backend(monkeypatch):
  """`run_peak` (a run's MFU denominator) runs matmul_peak's GEMMs on a process's first run
  only; matmul_peak itself measures at every call (the benchmarks time it)."""
  calls = []
  monkeypatch.setattr(flops, "matmul_peak", lambda: calls.append(1) or 1e11 * len(calls))
  monkeypatch.setattr(flops, "_backend_peak", functools.cache(flops._backend_peak.__wrapped__))
  assert flops.run_peak() == flops.run_peak() == 1e11
  assert len(calls) == 1
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert flops.run_peak() == 2e11 and len(calls) == 2  # Another backend: measured anew.
