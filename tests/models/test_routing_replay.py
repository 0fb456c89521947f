"""Routing replay for a mixture-of-experts policy: the sampler records each token's experts
and the trainer's forwards of π_old and π replay them (rl.routing_replay, `moe.route`)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import logprobs, model, moe, paged, sampling
from grpo_jax.rollouts import dynamic_sampling

MOE = dict(n_experts=4, experts_per_token=2, expert_mlp_dim=16, n_layers=2)
# Jitted (eager Flax is slow: each forward dispatches its ops one by one), as the sampler
# and the trainer run them.
_apply = jax.jit(model.apply, static_argnames=("cfg", "record_routes", "router_stats"))


def _logprobs(params, rows, cfg, routes=None):
  """The teacher-forced log-probs of `rows`' completions (jitted), replaying `routes`."""
  fn = jax.jit(functools.partial(logprobs.completion_logprobs, model_fn=model.make_model_fn(cfg)))
  args = (rows.prompt_tokens_NP, rows.prompt_mask_NP, rows.tokens_NT, rows.mask_NT)
  return fn(params, *args, routes=routes)[0]


def test_replayed_routes_pinned_by_hand():
  """p = softmax([0, ln 2, ln 3, ln 4]) = [0.1, 0.2, 0.3, 0.4]; top 2 = experts (3, 2) at
  (0.4, 0.3). Replaying experts (0, 1) weights them by this router: (0.1, 0.2), or
  (1/3, 2/3) normalised; a row of -1 routes itself."""
  logits_NX = jnp.log(jnp.asarray([[1.0, 2.0, 3.0, 4.0]] * 2))
  replay_NK = jnp.asarray([[0, 1], [-1, -1]], jnp.int8)
  _, w_NK, e_NK = moe.route(logits_NX, k=2, normalized=False, replay_NK=replay_NK)
  np.testing.assert_array_equal(e_NK, [[0, 1], [3, 2]])
  np.testing.assert_allclose(w_NK, [[0.1, 0.2], [0.4, 0.3]], rtol=1e-6)
  _, w_NK, _ = moe.route(logits_NX, k=2, normalized=True, replay_NK=replay_NK)
  np.testing.assert_allclose(w_NK, [[1 / 3, 2 / 3], [4 / 7, 3 / 7]], rtol=1e-6)
  assert moe.route_dtype(128) == jnp.int16 and moe.route_dtype(127) == jnp.int8


def test_route_flips_compare_sets_and_skip_tokens_that_route_themselves():
  """Own top-2 (0, 1), (2, 3), (1, 0), (3, 0) against recorded (1, 0), (2, 1), (-1, -1),
  (0, 2): the first is the same set in another order, the second and fourth differ, the
  third routes itself (not replayed)."""
  own_NK = jnp.asarray([[0, 1], [2, 3], [1, 0], [3, 0]], jnp.int32)
  replay_NK = jnp.asarray([[1, 0], [2, 1], [-1, -1], [0, 2]], jnp.int8)
  replayed_N, flipped_N = moe.route_flips(own_NK, replay_NK)
  np.testing.assert_array_equal(replayed_N, [True, True, False, True])
  np.testing.assert_array_equal(flipped_N, [False, True, False, True])


@functools.cache  # One (eager) init per config for the module; no test changes the params.
def _moe(scan: bool, **kw):
  cfg = model.tiny_config(vocab_size=64, **{**MOE, "scan_layers": scan, **kw})
  params = model.init(cfg, jax.random.key(0))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0  # Input-dependent routing.
  return cfg, params


@pytest.mark.parametrize("scan", [False, True])
def test_a_forward_replaying_its_own_routes_is_itself_and_other_routes_change_it(scan):
  """Recording changes nothing; replaying the recorded experts gives the same logits
  exactly; replaying other experts changes them, and the router still gets a gradient."""
  cfg, params = _moe(scan)
  tokens_BT = jax.random.randint(jax.random.key(1), (2, 7), 0, 64)
  pos_BT = model.positions_from_mask(jnp.ones((2, 7)).at[0, :2].set(0))
  plain, _ = _apply(params, tokens_BT, pos_BT, cfg=cfg)
  logits, _, routes_BTLK = _apply(params, tokens_BT, pos_BT, cfg=cfg, record_routes=True)
  assert routes_BTLK.shape == (2, 7, 2, 2) and routes_BTLK.dtype == jnp.int8
  np.testing.assert_array_equal(logits, plain)
  same, _ = _apply(params, tokens_BT, pos_BT, cfg=cfg, routes=routes_BTLK)
  np.testing.assert_array_equal(same, plain)
  other = (routes_BTLK + 1) % 4  # Still two distinct experts a token.
  moved, _ = _apply(params, tokens_BT, pos_BT, cfg=cfg, routes=other)
  assert float(jnp.max(jnp.abs(moved - plain))) > 1e-2

  # The counts a training forward logs (route_flip_frac), over real (token, layer) pairs:
  # its own routes replay and none flips; layer 0's shifted sets all differ from its own
  # ({a, b} + 1 mod 4 is never {a, b}; later layers see changed inputs, so they route
  # themselves, -1, here). Row 0's two left-padding tokens never count.
  def counts(routes):
    got = _apply(params, tokens_BT, pos_BT, cfg=cfg, routes=routes, router_stats=True)[1]
    return float(got["routes_replayed"]), float(got["routes_flipped"])

  real = 2 * 7 - 2
  assert counts(routes_BTLK) == (2 * real, 0)
  layer0 = other.at[:, :, 1].set(-1)
  assert counts(layer0) == (real, real)
  # Row 0 replays its own routes at tokens 2-3 only; row 1 is layer0's: 2·2 + 7 replayed.
  assert counts(routes_BTLK.at[0, 4:].set(-1).at[1].set(layer0[1])) == (2 * 2 + 7, 7)

  def loss(p):
    return jnp.sum(model.apply(p, tokens_BT, pos_BT, cfg=cfg, routes=other)[0][:, -1, 0])

  grads = jax.jit(jax.grad(loss))(params)
  router = [v for k, v in jax.tree_util.tree_leaves_with_path(grads) if "router" in str(k)]
  assert router and all(float(jnp.max(jnp.abs(g))) > 0 for g in router)


@pytest.mark.parametrize(
  ("scan", "shared", "segments", "chunk", "layout"),
  [(False, True, 2, 0, "dense"), (True, False, 1, 3, "dense"), (True, True, 1, 0, "paged")],
)
def test_the_sampler_records_the_routes_its_forward_took(scan, shared, segments, chunk, layout):
  """A float32 sampler's recorded experts are the teacher-forced forward's own on every
  real prompt and completion token that a later token reads (the last completion token
  and padding: -1), and the teacher-forced log-probs replaying them are the sampler's;
  also with the prompt prefilled 3 tokens a call (`prefill_chunk`), and on a paged cache
  (pages of 2 slots, rows compacted as they end)."""
  cfg, params = _moe(scan)
  scfg = sampling.SamplerConfig(
    max_new_tokens=6, eos_ids=(1,), pad_id=0, group_size=2, record_routes=True,
    prompt_buckets=(8,), shared_prefix=shared, decode_segments=segments, prefill_chunk=chunk,
    kv_layout=layout, page_size=2,
  )  # fmt: skip
  prompts = sampling.prepare_prompts([[5, 6, 7], [9, 10, 11, 12, 13]], cfg=scfg)
  make = paged.make_policy_sampler if layout == "paged" else sampling.make_policy_sampler
  fn = make(cfg, scfg)
  r = fn(params, prompts, jax.random.key(3), sampling.sampling_params(temperature=1.5))
  assert r.prompt_routes_NPLK.shape == (4, 8, 2, 2) and r.routes_NTLK.shape == (4, 6, 2, 2)
  tokens_NS = jnp.concatenate([r.prompt_tokens_NP, r.tokens_NT], 1)
  mask_NS = jnp.concatenate([r.prompt_mask_NP, r.mask_NT], 1)
  _, _, own = _apply(
    params, tokens_NS, model.positions_from_mask(mask_NS), cfg=cfg, record_routes=True
  )
  recorded = jnp.concatenate([r.prompt_routes_NPLK, r.routes_NTLK], 1)
  last_NS = jnp.zeros_like(mask_NS).at[jnp.arange(4), 8 + r.length_N - 1].set(True)
  read_NS = mask_NS & ~last_NS  # Real tokens a later token reads.
  np.testing.assert_array_equal(recorded[..., 0] >= 0, read_NS[:, :, None].repeat(2, 2))
  np.testing.assert_array_equal(jnp.where(read_NS[..., None, None], own, -1), recorded)
  replayed = _logprobs(params, r, cfg, routes=logprobs.replayed(r))
  assert float(jnp.max(jnp.abs(replayed - r.policy_logp_NT))) <= 2e-5


def test_routing_replay_makes_the_bfloat16_samplers_experts_the_trainers():
  """With a bfloat16 sampler some tokens' experts differ from a float32 forward's own;
  replaying them brings the float32 log-probs closer to the sampler's on every row
  (the property `experiments/moe_replay.py` measures at scale)."""
  cfg, params = _moe(False, n_experts=8, experts_per_token=2)
  scfg = sampling.SamplerConfig(
    max_new_tokens=12, eos_ids=(1,), pad_id=0, group_size=4, record_routes=True,
    prompt_buckets=(8,), dtype="bfloat16",
  )  # fmt: skip
  prompts = sampling.prepare_prompts([[5, 6, 7], [9, 10, 11, 12, 13]], cfg=scfg)
  fn = sampling.make_policy_sampler(dataclasses.replace(cfg, dtype="bfloat16"), scfg)
  r = fn(params, prompts, jax.random.key(3), sampling.sampling_params())
  err = lambda x_NT: float(jnp.sum(jnp.abs(x_NT - r.policy_logp_NT)))  # noqa: E731
  assert err(_logprobs(params, r, cfg, routes=logprobs.replayed(r))) < err(
    _logprobs(params, r, cfg)
  )
  # The trainer's count of flipped routes (route_flip_frac) at the first layer, whose
  # input replay cannot change, is the experiment's: the recorded sets that differ from a
  # float32 forward's own (later layers compare with their router on replayed inputs).
  tokens_NS = jnp.concatenate([r.prompt_tokens_NP, r.tokens_NT], 1)
  pos_NS = model.positions_from_mask(jnp.concatenate([r.prompt_mask_NP, r.mask_NT], 1))
  recorded = jnp.concatenate(logprobs.replayed(r), 1).at[:, :, 1:].set(-1)
  _, _, own = _apply(params, tokens_NS, pos_NS, cfg=cfg, record_routes=True)
  seen = recorded[..., 0] >= 0
  differ = jnp.any(jnp.sort(own, -1) != jnp.sort(recorded, -1), axis=-1) & seen
  got = _apply(params, tokens_NS, pos_NS, cfg=cfg, routes=recorded, router_stats=True)[1]
  assert (float(got["routes_replayed"]), float(got["routes_flipped"])) == (
    float(jnp.sum(seen)),
    float(jnp.sum(differ)),
  )
  assert float(jnp.sum(differ)) > 0  # bfloat16 moved some tokens' experts.


def test_assembled_groups_left_pad_their_prompt_routes():
  """Groups from prompt buckets of different lengths are joined with their prompts
  left-padded: the prompt routes too, with -1 (the model routes padding itself)."""

  def part(P, value):
    n = 2
    return sampling.Rollouts(
      prompt_tokens_NP=jnp.ones((n, P), jnp.int32), prompt_mask_NP=jnp.ones((n, P), bool),
      tokens_NT=jnp.ones((n, 3), jnp.int32), mask_NT=jnp.ones((n, 3), bool),
      logp_NT=jnp.zeros((n, 3)), policy_logp_NT=jnp.zeros((n, 3)),
      eos_N=jnp.ones(n, bool), truncated_N=jnp.zeros(n, bool), length_N=jnp.full(n, 3),
      group_ids_N=jnp.zeros(n, jnp.int32), num_steps=jnp.asarray(3),
      prompt_routes_NPLK=jnp.full((n, P, 1, 2), value, jnp.int8),
      routes_NTLK=jnp.full((n, 3, 1, 2), value, jnp.int8),
    )  # fmt: skip

  sel = dynamic_sampling.Selection(
    part_B=np.asarray([0, 1]),
    group_B=np.asarray([0, 0]),
    valid_B=np.ones(2, bool),
    dropped=0,
    fill=0,
    surplus=0,
  )
  out = dynamic_sampling.assemble([part(2, 1), part(4, 2)], sel, group_size=2, pad_id=0)
  assert out.prompt_routes_NPLK.shape == (4, 4, 1, 2)
  np.testing.assert_array_equal(out.prompt_routes_NPLK[:2, :, 0, 0], [[-1, -1, 1, 1]] * 2)
  np.testing.assert_array_equal(out.routes_NTLK[:, 0, 0, 0], [1, 1, 2, 2])


@pytest.mark.parametrize(
  ("change", "message"),
  [
    (dict(dense=True), "routing_replay=True needs a mixture-of-experts model"),
    (dict(refill_slots=4), r"replace: config.sampler.refill_slots=4 \(0: off\)\."),
    (dict(env=True), r"replace: config.env \(episodes\)\. Turn them off"),
  ],
)
def test_routing_replay_where_it_cannot_record_is_a_clear_error(change, message):
  """Refused on a dense model, and where another sampler than the static one decodes."""
  import runs  # noqa: PLC0415

  from grpo_jax.infra import config_lib  # noqa: PLC0415
  from grpo_jax.trainer import build  # noqa: PLC0415

  c = (
    config_lib.load("configs/calculator.py:quick") if change.get("env") else runs.small_arithmetic()
  )
  if not change.get("dense"):
    c.model.update(n_experts=4, experts_per_token=2, expert_mlp_dim=32)
  c.sampler.refill_slots = change.get("refill_slots", 0)
  c.rl.routing_replay = True
  with pytest.raises(ValueError, match=message):
    build.build(c)


def test_the_committed_replay_record_carries_its_claim_and_a_verdict_from_its_rows():
  """experiments/results/moe/replay.json: the pre-registered claim, the 5 verdict seeds,
  and the verdict its own rows give under the script's rule."""
  import json  # noqa: PLC0415
  import pathlib  # noqa: PLC0415

  import moe_replay  # noqa: PLC0415

  root = pathlib.Path(__file__).resolve().parents[2]
  got = json.loads((root / "experiments/results/moe/replay.json").read_text())
  assert got["seeds"] == list(moe_replay.VERDICT_SEEDS) and got["verdict_seeds"]
  assert "pre-registered" in got["claim"] and got["shape"] == moe_replay.SHAPE
  assert {k: got[k] for k in ("ratios", "verdict")} == {
    k: v for k, v in moe_replay.verdict(got["rows"]).items() if k in ("ratios", "verdict")
  }
  assert got["verdict"] == "supports"
  for row in got["rows"]:  # The float32 sampler is the trainer: nothing to replay.
    assert row["float32"]["route_flip_frac"] == 0.0 and row["bfloat16"]["route_flip_frac"] > 0
