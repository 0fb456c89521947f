"""DAPO dynamic sampling: which groups vary, which fill the B slots (hand-worked counts and a
property test), and assembling rollouts of different prompt lengths into one batch."""

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models import logprobs, model, sampling
from grpo_jax.rollouts import dynamic_sampling

PAD = 31  # Not 0, so that padding with the wrong value shows.


# ----------------------------------------------------------------------------
# varying_groups.
# ----------------------------------------------------------------------------


def test_varying_groups_hand_examples():
  correct = np.array([0, 0, 0, 1, 1, 1, 0, 1, 0, 1, 1, 0], np.float32)
  np.testing.assert_array_equal(
    dynamic_sampling.varying_groups(correct, group_size=3), [False, False, True, True]
  )
  # Same rows grouped in pairs: (0,0) (0,1) (1,1) (0,1) (0,1) (1,0).
  np.testing.assert_array_equal(
    dynamic_sampling.varying_groups(correct, group_size=2),
    [False, True, False, True, True, True],
  )


def test_varying_groups_edge_cases():
  # Booleans, partial credit, a group of one (never varies), all-equal groups.
  np.testing.assert_array_equal(
    dynamic_sampling.varying_groups(np.array([True, False, True, True]), group_size=2),
    [True, False],
  )
  np.testing.assert_array_equal(
    dynamic_sampling.varying_groups(np.array([0.5, 0.5, 0.5, 0.25]), group_size=2),
    [False, True],
  )
  np.testing.assert_array_equal(
    dynamic_sampling.varying_groups(np.array([0, 1, 1]), group_size=1), [False, False, False]
  )
  with pytest.raises(ValueError):
    dynamic_sampling.varying_groups(np.zeros(5), group_size=2)


# ----------------------------------------------------------------------------
# select: hand-worked examples.
# ----------------------------------------------------------------------------


def _pairs(sel):
  return list(zip(sel.part_B.tolist(), sel.group_B.tolist()))


def _v(s: str) -> np.ndarray:
  return np.array([c == "T" for c in s])


def test_select_varying_first_in_sampling_order_with_surplus():
  # Varying: (0,0) (0,2) (2,0) (2,1); zero-variance: (0,1) (1,0) (1,1) (1,2) (2,2).
  sel = dynamic_sampling.select([_v("TFT"), _v("FFF"), _v("TTF")], num_groups=3)
  assert _pairs(sel) == [(0, 0), (0, 2), (2, 0)]
  np.testing.assert_array_equal(sel.valid_B, [True, True, True])
  assert (sel.dropped, sel.fill, sel.surplus) == (5, 0, 1)
  assert sel.part_B.dtype == np.int32 and sel.group_B.dtype == np.int32


def test_select_fills_with_zero_variance_groups():
  # Varying: (0,1) (1,2); zero-variance: (0,0) (0,2) (1,0) (1,1). One slot is filled,
  # from the latest-sampled zero-variance group, (1,1).
  sel = dynamic_sampling.select([_v("FTF"), _v("FFT")], num_groups=3)
  assert _pairs(sel) == [(0, 1), (1, 2), (1, 1)]
  np.testing.assert_array_equal(sel.valid_B, [True, True, False])
  assert (sel.dropped, sel.fill, sel.surplus) == (4, 1, 0)


def test_select_all_zero_variance():
  sel = dynamic_sampling.select([_v("FF")], num_groups=2)
  assert _pairs(sel) == [(0, 0), (0, 1)]
  np.testing.assert_array_equal(sel.valid_B, [False, False])
  assert (sel.dropped, sel.fill, sel.surplus) == (2, 2, 0)


def test_select_exactly_enough_in_first_part():
  sel = dynamic_sampling.select([_v("TT")], num_groups=2)
  assert _pairs(sel) == [(0, 0), (0, 1)]
  np.testing.assert_array_equal(sel.valid_B, [True, True])
  assert (sel.dropped, sel.fill, sel.surplus) == (0, 0, 0)


def test_select_too_few_groups_raises():
  with pytest.raises(ValueError, match="Only 3 groups were sampled; 4 are needed"):
    dynamic_sampling.select([_v("TFT")], num_groups=4)
  with pytest.raises(ValueError, match="Only 0 groups"):
    dynamic_sampling.select([], num_groups=1)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
  st.integers(1, 6).flatmap(
    lambda b: st.tuples(
      st.just(b), st.lists(st.lists(st.booleans(), min_size=b, max_size=b), min_size=1, max_size=4)
    )
  )
)
def test_select_properties(b_and_parts):
  B, parts = b_and_parts
  varying_parts = [np.array(p, bool) for p in parts]
  sel = dynamic_sampling.select(varying_parts, num_groups=B)
  n_varying = sum(int(v.sum()) for v in varying_parts)
  n_zero = len(parts) * B - n_varying

  assert len(parts) * B == (B - sel.fill) + sel.dropped + sel.surplus
  assert sel.dropped == n_zero
  assert sel.fill == max(0, B - n_varying)
  assert sel.surplus == max(0, n_varying - B)

  chosen = _pairs(sel)
  assert len(chosen) == B and len(set(chosen)) == B
  n_keep = B - sel.fill
  np.testing.assert_array_equal(sel.valid_B, np.arange(B) < n_keep)
  # Valid slots: the first varying groups in sampling order (part, then group).
  varying_in_order = [(k, g) for k, v in enumerate(varying_parts) for g in np.flatnonzero(v)]
  assert chosen[:n_keep] == varying_in_order[:n_keep]
  # Fill slots: zero-variance groups, in sampling order.
  fills = chosen[n_keep:]
  assert all(not varying_parts[k][g] for k, g in fills)
  assert fills == sorted(fills)


# ----------------------------------------------------------------------------
# assemble / select_rows on hand-made rollouts.
# ----------------------------------------------------------------------------

G, T = 2, 3


def _rollouts(*, base: int, num_groups: int, prompt_len: int, num_steps: int):
  """Rollouts whose every per-row value encodes its global row id `base + n`."""
  N = num_groups * G
  rows = base + np.arange(N)
  prompt_len_N = 2 + (np.arange(N) % 2)  # Real prompt tokens per row: 2 or 3.
  prompt_mask = np.arange(prompt_len)[None, :] >= prompt_len - prompt_len_N[:, None]
  prompt_tokens = np.where(prompt_mask, 100 * (rows[:, None] + 1) + np.arange(prompt_len), PAD)
  tokens = 1000 * (rows[:, None] + 1) + np.arange(T)
  mask = np.arange(T)[None, :] < (1 + rows % T)[:, None]
  return sampling.Rollouts(
    prompt_tokens_NP=jnp.asarray(prompt_tokens, jnp.int32),
    prompt_mask_NP=jnp.asarray(prompt_mask),
    tokens_NT=jnp.asarray(tokens, jnp.int32),
    mask_NT=jnp.asarray(mask),
    logp_NT=jnp.asarray(-0.5 * rows[:, None] - 0.01 * np.arange(T), jnp.float32),
    policy_logp_NT=jnp.asarray(-0.25 * rows[:, None] - 0.01 * np.arange(T), jnp.float32),
    eos_N=jnp.asarray(rows % 2 == 0),
    truncated_N=jnp.asarray(rows % 2 == 1),
    length_N=jnp.asarray(1 + rows % T, jnp.int32),
    group_ids_N=jnp.repeat(jnp.arange(num_groups, dtype=jnp.int32), G),
    num_steps=jnp.int32(num_steps),
  )


def _two_parts():
  # Part 0: rows 0..3 (groups 0, 1), P = 4. Part 1: rows 4..7 (groups 0, 1), P = 6.
  return [
    _rollouts(base=0, num_groups=2, prompt_len=4, num_steps=3),
    _rollouts(base=4, num_groups=2, prompt_len=6, num_steps=2),
  ]


def test_assemble_pads_prompts_and_orders_rows():
  parts = _two_parts()
  # Part 0: group 1 varies; part 1: nothing varies -> slot 1 is filled with (1, 1).
  sel = dynamic_sampling.select([_v("FT"), _v("FF")], num_groups=2)
  assert _pairs(sel) == [(0, 1), (1, 1)]
  out = dynamic_sampling.assemble(parts, sel, group_size=G, pad_id=PAD)
  rows = [2, 3, 6, 7]  # Global row ids of the selected groups, in slot order.

  assert out.prompt_tokens_NP.shape == (4, 6)
  # Part 0's prompts gain two left pad columns; part 1's are unchanged.
  p0, p1 = (np.asarray(parts[0].prompt_tokens_NP), np.asarray(parts[1].prompt_tokens_NP))
  m0, m1 = (np.asarray(parts[0].prompt_mask_NP), np.asarray(parts[1].prompt_mask_NP))
  np.testing.assert_array_equal(
    out.prompt_tokens_NP,
    np.concatenate([np.pad(p0[2:4], ((0, 0), (2, 0)), constant_values=PAD), p1[2:4]]),
  )
  np.testing.assert_array_equal(
    out.prompt_mask_NP,
    np.concatenate([np.pad(m0[2:4], ((0, 0), (2, 0)), constant_values=False), m1[2:4]]),
  )
  # Hand-written: row 2 has 2 real prompt tokens (P=4 -> cols 2, 3 -> values 302, 303).
  np.testing.assert_array_equal(out.prompt_tokens_NP[0], [PAD, PAD, PAD, PAD, 302, 303])
  np.testing.assert_array_equal(out.prompt_mask_NP[0], [False] * 4 + [True] * 2)
  # Row 3 has 3 real tokens (cols 1..3 of P=4); row 6 has 2 and row 7 has 3 (of P=6).
  np.testing.assert_array_equal(out.prompt_tokens_NP[1], [PAD, PAD, PAD, 401, 402, 403])
  np.testing.assert_array_equal(out.prompt_tokens_NP[2], [PAD, PAD, PAD, PAD, 704, 705])
  np.testing.assert_array_equal(out.prompt_tokens_NP[3], [PAD, PAD, PAD, 803, 804, 805])
  assert out.prompt_tokens_NP.dtype == jnp.int32 and out.prompt_mask_NP.dtype == jnp.bool_

  np.testing.assert_array_equal(out.tokens_NT[:, 0], [1000 * (r + 1) for r in rows])
  np.testing.assert_array_equal(out.length_N, [1 + r % T for r in rows])
  np.testing.assert_array_equal(out.eos_N, [r % 2 == 0 for r in rows])
  np.testing.assert_array_equal(out.truncated_N, [r % 2 == 1 for r in rows])
  np.testing.assert_allclose(out.logp_NT[:, 0], [-0.5 * r for r in rows])
  np.testing.assert_allclose(out.policy_logp_NT[:, 0], [-0.25 * r for r in rows])
  np.testing.assert_array_equal(out.mask_NT.sum(axis=1), [1 + r % T for r in rows])
  np.testing.assert_array_equal(out.group_ids_N, [0, 0, 1, 1])
  assert out.group_ids_N.dtype == jnp.int32
  assert int(out.num_steps) == 3 and out.num_steps.shape == ()


def test_assemble_three_groups_across_parts():
  parts = _two_parts()
  extra = _rollouts(base=8, num_groups=2, prompt_len=4, num_steps=5)
  # Varying: (0,1), (1,0), (2,1) -> B = 3 filled by varying groups only, no surplus.
  sel = dynamic_sampling.select([_v("FT"), _v("TF"), _v("FT")], num_groups=3)
  assert (sel.dropped, sel.fill, sel.surplus) == (3, 0, 0)
  out = dynamic_sampling.assemble([*parts, extra], sel, group_size=G, pad_id=PAD)
  rows = [2, 3, 4, 5, 10, 11]
  np.testing.assert_array_equal(out.tokens_NT[:, 0], [1000 * (r + 1) for r in rows])
  np.testing.assert_array_equal(out.group_ids_N, [0, 0, 1, 1, 2, 2])
  assert out.prompt_tokens_NP.shape == (6, 6)
  assert int(out.num_steps) == 5
  # Every real prompt token survives padding, right-aligned.
  np.testing.assert_array_equal(out.prompt_mask_NP.sum(axis=1), [2 + r % 2 for r in rows])
  np.testing.assert_array_equal(out.prompt_tokens_NP[:, -1] % 100 > 0, True)


def test_assemble_single_part():
  (part, _) = _two_parts()
  # All varying, in order: the part itself.
  sel = dynamic_sampling.select([_v("TT")], num_groups=2)
  assert dynamic_sampling.assemble([part], sel, group_size=G, pad_id=PAD) is part
  # Group 1 varies, group 0 fills: the groups swap and group ids are renumbered.
  sel = dynamic_sampling.select([_v("FT")], num_groups=2)
  assert _pairs(sel) == [(0, 1), (0, 0)]
  out = dynamic_sampling.assemble([part], sel, group_size=G, pad_id=PAD)
  np.testing.assert_array_equal(out.tokens_NT[:, 0], [3000, 4000, 1000, 2000])
  np.testing.assert_array_equal(out.group_ids_N, [0, 0, 1, 1])
  assert out.prompt_tokens_NP.shape == (4, 4)


def test_select_rows_matches_assemble():
  parts = _two_parts()
  sel = dynamic_sampling.select([_v("FT"), _v("FF")], num_groups=2)
  out = dynamic_sampling.assemble(parts, sel, group_size=G, pad_id=PAD)
  row_ids = [np.arange(4), 4 + np.arange(4)]
  picked = dynamic_sampling.select_rows(row_ids, sel, group_size=G)
  np.testing.assert_array_equal(picked, [2, 3, 6, 7])
  np.testing.assert_array_equal(np.asarray(out.tokens_NT[:, 0]), 1000 * (picked + 1))
  # Trailing dimensions are kept.
  x2 = [np.stack([r, -r], axis=1) for r in row_ids]
  np.testing.assert_array_equal(
    dynamic_sampling.select_rows(x2, sel, group_size=G), [[2, -2], [3, -3], [6, -6], [7, -7]]
  )
  # Host flags in the trainer's layout.
  flags = [np.array([True, False, False, True]), np.array([False, True, True, False])]
  np.testing.assert_array_equal(
    dynamic_sampling.select_rows(flags, sel, group_size=G), [False, True, True, False]
  )


# ----------------------------------------------------------------------------
# Why assemble may left-pad: padding does not change teacher-forced log-probs.
# ----------------------------------------------------------------------------


def test_left_padding_leaves_logprobs_unchanged():
  cfg = model.tiny_config(32, n_layers=1)
  params = jax.jit(model.init, static_argnums=0)(cfg, jax.random.key(0))
  params["embed"]["embedding"] = params["embed"]["embedding"] * 8.0  # Input-dependent logits.
  logp_fn = jax.jit(
    lambda *xs: logprobs.completion_logprobs(params, *xs, model_fn=model.make_model_fn(cfg))[0]
  )
  completion = jnp.array([[7, 11, 3, 0]], jnp.int32)
  completion_mask = jnp.array([[True, True, True, False]])
  prompt = jnp.array([[1, 5, 9, 13]], jnp.int32)
  short = logp_fn(prompt, jnp.ones((1, 4), bool), completion, completion_mask)

  # Row 0: the prompt left-padded to 6 (as assemble pads it); row 1: the same tokens with
  # the pads marked as real tokens (the control: the comparison must be able to fail).
  padded = jnp.array([[PAD, PAD, 1, 5, 9, 13]] * 2, jnp.int32)
  padded_mask = jnp.array([[False, False, True, True, True, True], [True] * 6])
  long = logp_fn(
    padded, padded_mask, jnp.repeat(completion, 2, axis=0), jnp.repeat(completion_mask, 2, axis=0)
  )
  np.testing.assert_allclose(long[:1], short, rtol=1e-5, atol=1e-5)
  assert float(short[0, 3]) == 0.0 and np.all(np.asarray(short[0, :3]) < 0)
  assert np.max(np.abs(np.asarray(long[1:] - short))) > 1e-2


def test_unscorable_rows_do_not_make_a_group_vary():
  """[1, 1, 1, failed] has no variation among its scored rows: under rl.unscorable="mask"
  it would train nothing, so it must not take a slot from a group that would."""
  correct = np.array([1, 1, 1, 0, 1, 0, 1, 0, 1, 1, 0, 0], np.float32)
  scorable = np.array([1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0], bool)
  got = dynamic_sampling.varying_groups(correct, group_size=4, scorable_N=scorable)
  np.testing.assert_array_equal(got, [False, True, True])
  np.testing.assert_array_equal(
    dynamic_sampling.varying_groups(correct, group_size=4), [True, True, True]
  )
