"""`diagnostics.hook`'s host side, without training or compiling: template ids, the probe
taken from a batch, the held-out reference batch, and the Hook's bookkeeping (probe
capture once, due iterations, snapshots, reward inputs, what a resumed run reads back).
The setup is a stand-in with the fields the hook reads; ref_params is given, so no
initial-policy checkpoint is written. tests/experiments/test_diagnostics_experiments.py runs the hook
inside the trainer."""

import json
import types

import jax.numpy as jnp
import numpy as np

from grpo_jax import schema, tasks
from grpo_jax.diagnostics import hook
from grpo_jax.models import sampling
from grpo_jax.rl import spec

# The arithmetic task's CharTokenizer: <pad>=0, <bos>=1, <eos>=2, then its alphabet
# "0123456789+-*/()=?:,.; \nANQST" from id 3: "0"=3, "2"=5, ":"=21, "."=23, "\n"=26,
# "A"=27, "Q"=29.
TASK = tasks.get("arithmetic")
TOK = TASK.tokenizer()


def test_template_ids_of_a_toy_task_are_its_template_chars_and_eos():
  """arithmetic's template chars 'A', ':', '.' (27, 21, 23) and EOS (2), sorted."""
  assert hook.template_ids(TASK, TOK) == (2, 21, 23, 27)
  assert hook.template_ids(types.SimpleNamespace(template_chars=frozenset()), TOK) == ()


def test_template_ids_of_a_real_tokenizer_come_from_the_patterns():
  """Decoded pieces: blank (1), a <|marker|> (2), \\boxed (3) and punctuation (5) are
  template; a word, a number and "x_" (a letter) are not."""
  pieces = ["a", " ", "<|im_end|>", "\\boxed", "12", ",", "x_"]
  tokenizer = types.SimpleNamespace(vocab_size=len(pieces), decode=lambda ids: pieces[ids[0]])
  assert hook.template_ids(TASK, tokenizer) == (1, 2, 3, 5)


def _batch(group_ids, *, T=3, P=4, prompts=None) -> spec.RolloutBatch:
  """N rows: row i's tokens are i+3, advantages i, the given group ids."""
  N = len(group_ids)
  tokens = jnp.arange(N)[:, None] + 3 + jnp.zeros((N, T), jnp.int32)
  adv = jnp.arange(N, dtype=jnp.float32)[:, None] + jnp.zeros((N, T))
  pt, pm = prompts if prompts is not None else (jnp.ones((N, P), jnp.int32), jnp.ones((N, P), bool))
  return spec.RolloutBatch(
    prompt_tokens_NP=pt, prompt_mask_NP=pm, tokens_NT=tokens, mask_NT=jnp.ones((N, T), bool),
    loss_mask_NT=jnp.ones((N, T), bool), adv_NT=adv,
    old_logp_NT=jnp.zeros((N, T)), ref_logp_NT=jnp.zeros((N, T)),
    group_ids_N=jnp.asarray(group_ids, jnp.int32),
  )  # fmt: skip


def test_probe_from_batch_keeps_the_first_rows_and_renumbers_their_groups():
  """Groups 7, 7, 3, 3 of the first 4 rows (of 6) become 1, 1, 0, 0 (sorted order)."""
  probe = hook.probe_from_batch(_batch([7, 7, 3, 3, 9, 9]), 4)
  np.testing.assert_array_equal(probe.group_ids_B, [1, 1, 0, 0])
  np.testing.assert_array_equal(probe.tokens_BT[:, 0], [3, 4, 5, 6])
  np.testing.assert_array_equal(probe.adv_BT[:, 0], [0, 1, 2, 3])
  assert isinstance(probe.tokens_BT, np.ndarray)  # On the host.


def _setup(**diagnostics):
  scfg = sampling.SamplerConfig(
    max_new_tokens=10, eos_ids=TOK.eos_ids, pad_id=TOK.pad_id, group_size=2, prompt_buckets=(8, 16)
  )
  return types.SimpleNamespace(
    task=TASK, tokenizer=TOK, sampler_cfg=scfg, loop=types.SimpleNamespace(seed=0),
    diagnostics=schema.DiagnosticsConfig(**{"every": 2, "probe_prompts": 2, **diagnostics}),
  )  # fmt: skip


def test_reference_batch_pads_held_out_solutions():
  """Test examples 0 and 1 (seed 0): "Q:21+8\\n" -> "A:29." and "Q:0-6\\n" -> "A:-6.".
  Prompts with BOS (8 and 7 tokens) left-padded to the 8 bucket; solutions with EOS (6
  tokens) right-padded to max_new_tokens = 10."""
  assert [TASK.example("test", i, seed=0).reference for i in (0, 1)] == ["A:29.", "A:-6."]
  pt, pm, ct, cm = hook.reference_batch(_setup(), 2)
  np.testing.assert_array_equal(pt, [[1, 29, 21, 5, 4, 13, 11, 26], [0, 1, 29, 21, 3, 14, 9, 26]])
  np.testing.assert_array_equal(pm.sum(1), [8, 7])
  np.testing.assert_array_equal(ct[:, :6], [[27, 21, 5, 12, 23, 2], [27, 21, 14, 9, 23, 2]])
  np.testing.assert_array_equal(cm.sum(1), [6, 6])
  assert (ct[:, 6:] == 0).all()
  assert hook.reference_batch(_setup(), 0) is None


PARAMS = {"w": jnp.arange(3.0)}


def _hook(tmp_path, *, resumed_from=None, **diagnostics):
  return hook.Hook(
    _setup(**diagnostics), tmp_path, params=PARAMS, ref_params=PARAMS,
    resumed_from=resumed_from, log=lambda *_: None,
  )  # fmt: skip


def test_create_is_none_when_off(tmp_path):
  """every=0: no hook and no diagnostics directory."""
  setup = _setup(every=0)
  assert (
    hook.Hook.create(setup, tmp_path, params=PARAMS, ref_params=PARAMS, resumed_from=None) is None
  )
  assert not (tmp_path / "diagnostics").exists()


def test_the_probe_is_captured_once_and_snapshots_come_on_due_iterations(tmp_path):
  """every=2, 2 prompts x 2 rollouts = 4 probe rows. Iteration 0 captures the fixed probe
  (the first batch's first 4 rows, saved with its data range) and is due; iteration 1 is
  not; iteration 2 is, and its credit probe is its own batch ("current")."""
  h = _hook(tmp_path)
  assert h.init_params is PARAMS and h.lengths == []  # π_0 is the reference.
  first, second = _batch([5, 5, 6, 6, 8, 8]), _batch([0, 0, 1, 1, 2, 2], T=5)
  snap = h.before_update(0, PARAMS, first, data_range=range(0, 3))
  assert snap.iteration == 0 and snap.reward_inputs is None
  np.testing.assert_array_equal(snap.probe.group_ids_B, [0, 0, 1, 1])
  np.testing.assert_array_equal(snap.params["w"], [0.0, 1.0, 2.0])
  assert snap.params["w"] is not PARAMS["w"]  # A copy: the train step donates params.
  assert h.before_update(1, PARAMS, second, data_range=range(3, 6)) is None
  snap2 = h.before_update(2, PARAMS, second, data_range=range(3, 6))
  assert snap2.probe.tokens_BT.shape == (4, 5) and h.fixed.tokens_BT.shape == (4, 3)
  assert h.fixed_range == range(0, 3)
  with np.load(tmp_path / "diagnostics" / "probe.npz") as f:
    assert list(f["data_range"]) == [0, 3] and f["tokens_BT"].shape == (4, 3)
  assert [h.due(k) for k in range(5)] == [True, False, True, False, True]


def test_after_update_records_lengths_and_skips_iterations_not_due(tmp_path):
  """Without a snapshot there are no metrics; a record's response_length joins the history."""
  h = _hook(tmp_path)
  assert h.after_update(None, PARAMS, {"response_length": 5}) == {}
  assert h.after_update(None, PARAMS, {"reward": 1.0}) == {}
  assert h.lengths == [5.0]


def test_a_fixed_credit_probe_is_the_first_batchs(tmp_path):
  """credit_batch='fixed': a due iteration's probe is the one captured first (T=3), not its own
  batch (T=5)."""
  h = _hook(tmp_path, credit_batch="fixed")
  h.before_update(1, PARAMS, _batch([1, 1, 2, 2]), data_range=range(0, 2))  # Not due.
  snap = h.before_update(2, PARAMS, _batch([3, 3, 4, 4], T=5), data_range=range(2, 4))
  assert snap.probe is h.fixed and snap.probe.tokens_BT.shape == (4, 3)


def test_value_needs_each_probe_prompts_reward_input(tmp_path):
  """With value on, a snapshot maps each probe prompt (its unpadded ids, as JSON) to the
  task's reward input of the train example that has it, among the iteration's draws."""
  examples = [TASK.example("train", i, seed=0) for i in range(2)]
  ids = [TOK.encode(e.prompt, add_bos=True) for e in examples]
  P = max(map(len, ids))
  pt = np.zeros((4, P), np.int32)
  pm = np.zeros((4, P), bool)
  for row, i in enumerate([0, 0, 1, 1]):
    pt[row, P - len(ids[i]) :], pm[row, P - len(ids[i]) :] = ids[i], True
  batch = _batch([0, 0, 1, 1], prompts=(jnp.asarray(pt), jnp.asarray(pm)))
  snap = _hook(tmp_path, value=True).before_update(0, PARAMS, batch, data_range=range(0, 5))
  assert snap.reward_inputs == {json.dumps(ids[i]): TASK.reward_input(examples[i]) for i in (0, 1)}
  none = _hook(tmp_path, value=True).before_update(0, PARAMS, batch, data_range=range(2, 5))
  assert none.reward_inputs == {}  # Examples 2-4 hold neither prompt.


def test_a_resumed_hook_reads_back_its_probe_lengths_and_spectra(tmp_path):
  """Resumed from checkpoint 4: the saved probe and its range come back, the rl lines'
  response lengths are the trend's history, spectra past iteration 4 go."""
  first = _hook(tmp_path)
  first.before_update(0, PARAMS, _batch([2, 2, 1, 1]), data_range=range(0, 2))
  lines = [{"phase": "warm_start", "response_length": 99}] + [
    {"phase": "rl", "iteration": k, "response_length": 10 + k} for k in range(3)
  ]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
  spectra = tmp_path / "diagnostics" / "spectra.jsonl"
  spectra.write_text("".join(json.dumps({"iteration": k, "m": [1.0]}) + "\n" for k in (2, 4, 6)))
  h = _hook(tmp_path, resumed_from=4)
  np.testing.assert_array_equal(h.fixed.group_ids_B, first.fixed.group_ids_B)
  np.testing.assert_array_equal(h.fixed.tokens_BT, first.fixed.tokens_BT)
  assert h.fixed_range == range(0, 2) and h.lengths == [10.0, 11.0, 12.0]
  assert [json.loads(line)["iteration"] for line in spectra.read_text().splitlines()] == [2, 4]
  fresh = _hook(tmp_path)  # A fresh run keeps no spectra past iteration 0.
  assert fresh.fixed is None and spectra.read_text() == ""
