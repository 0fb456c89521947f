"""The memory plan: hand-computed terms, XLA's own figures on CPU (within 10%), the CLI,
and the trainer's refusal of a config that cannot fit, before anything compiles."""

import json
import pathlib
import sys

import pytest

from grpo_jax import memory, model, rl, sharding, train

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "configs"))
sys.path.insert(0, str(ROOT / "tests"))
import scale  # noqa: E402
import subproc  # noqa: E402


def test_shard_bytes_by_hand():
  rules, sizes = sharding.DEFAULT_RULES, {"data": 2, "fsdp": 4, "tensor": 2}
  # Embedding [vocab 32, embed 64]: vocab over tensor 2, embed over fsdp 4 -> 16 × 16 f32.
  assert (
    memory._leaf_bytes((32, 64), "float32", ("vocab", "embed"), rules=rules, mesh_sizes=sizes)
    == 16 * 16 * 4
  )
  # q kernel [embed 64, heads 4, head_dim 16] in bf16: 16 × 2 × 16 × 2 bytes.
  assert (
    memory._leaf_bytes(
      (64, 4, 16), "bfloat16", ("embed", "q_heads", "head_dim"), rules=rules, mesh_sizes=sizes
    )
    == 1024
  )
  with pytest.raises(ValueError, match="not divisible"):
    memory._leaf_bytes((31, 64), "float32", ("vocab", "embed"), rules=rules, mesh_sizes=sizes)


def _plan(**model_kw):
  cfg = model.tiny_config(vocab_size=32, **model_kw)
  return memory.plan(
    cfg,
    rl.RLConfig(),
    sharding.MeshConfig(data=1, fsdp=1, tensor=1),
    n_devices=1,
    prompts=2,
    group_size=4,
    prompt_len=8,
    max_new_tokens=8,
    optimizer=train._optimizer(train.LoopConfig(), lr=1e-3),
  )


def test_params_optimizer_and_kv_cache_by_hand():
  cfg = model.tiny_config(vocab_size=32)  # d 64, 2 layers, 4 heads, 2 kv heads, head_dim 16.
  p = _plan()
  n_params = model.param_count(model.init(cfg, __import__("jax").random.key(0)))
  assert p.params == 4 * n_params and p.grads == p.params
  assert p.opt_state == 2 * p.params + 4  # Adam's mu and nu, and its int32 step count.
  # 8 rollout rows + 2 prompt rows; per row: 2 (k, v) × 2 layers × 2 kv heads × 15 slots
  # × 16 head_dim × 4 bytes, + 15 int32 positions; + the decode logits 8 × 32 × 4.
  assert p.kv_cache == 10 * (2 * 2 * 2 * 15 * 16 * 4 + 15 * 4) + 8 * 32 * 4


def test_remat_and_rows_move_activations_as_they_should():
  p = _plan()
  assert p.activations_remat < p.activations_no_remat / 3
  assert _plan(scan_layers=True, remat="full").activations == p.activations_remat
  assert _plan(remat="full").activations == p.activations_no_remat  # No scan: not realised.
  cfg, rl_cfg = model.tiny_config(vocab_size=32), rl.RLConfig()
  one, two = (memory.residual_bytes(cfg, rl_cfg, rows=r, P=8, T=8) for r in (1, 2))
  assert two == pytest.approx(2 * one, rel=0.01)  # Residuals are per row.


def test_device_names_and_numbers():
  assert memory.device_bytes("tpu-v5e") == 16 * 2**30
  assert memory.device_bytes("1.5") == 1.5 * 2**30
  with pytest.raises(ValueError, match="name one of"):
    memory.device_bytes("tpu-v9")


def _cli(*args, devices=1):
  r = subproc.run(["-m", "grpo_jax.main", "plan", *args], devices=devices)
  return r.stdout, json.loads(r.stdout.strip().splitlines()[-1])


_BASE = ["--config.model.scan_layers=False", "--config.model.remat=none"]


# Sampler temporaries: within 10% where the KV cache dominates them (one device, scanned
# layers). Elsewhere the plan misses terms it does not model yet (measured ratios plan/XLA,
# kept as bounds here and listed in the module docstring): prefill buffers XLA keeps
# (1 device, unscanned: 1.18), and caches XLA does not split over `tensor` inside the
# decode loop (2x2x2 unscanned: 0.50; 1x4x2 scanned: 0.83).
@pytest.mark.parametrize(
  "devices,flags,sample_bounds",
  [
    (1, [], (0.9, 1.1)),  # scale.py:tiny -- scanned layers, remat, 2 micro-batches.
    (1, _BASE, (1.0, 1.3)),
    (
      8,
      ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2", *_BASE],
      (0.4, 1.1),
    ),
    (8, ["--config.mesh.fsdp=4", "--config.mesh.tensor=2"], (0.7, 1.1)),
  ],
)
def test_plan_agrees_with_xla(devices, flags, sample_bounds):
  """Resident state to 1%, train-step temporaries to 10%, on 1 and 8 devices."""
  out, d = _cli("--config=configs/scale.py:tiny", "--compile", *flags, devices=devices)
  x = d["xla"]
  assert "XLA (compiled here)" in out
  # The train step's arguments: params + Adam state (+ a small mini-batch).
  assert d["params"] + d["opt_state"] == pytest.approx(x["train_step_arguments"], rel=0.01)
  assert d["train_step"] == pytest.approx(x["train_step_temp"], rel=0.10)
  lo, hi = sample_bounds
  assert lo <= d["kv_cache"] / x["sample_temp"] <= hi


def test_plan_cli_says_what_to_change_when_it_does_not_fit():
  out, d = _cli("--config=configs/scale.py:7b", "--devices=8", "--device=tpu-v5e")
  assert d["fits"] is False and d["mesh"] == [1, 2, 4]
  assert "does NOT fit tpu-v5e" in out and "Change:" in out
  _, d = _cli("--config=configs/scale.py:7b", "--devices=16", "--device=tpu-v5e")
  assert d["fits"] is True


def test_trainer_refuses_a_config_that_cannot_fit_before_compiling():
  c = scale.get_config("tiny")
  c.memory_limit_gib = 0.01  # 10 MiB: the tiny plan needs ~45.
  setup = train.build(c)
  with pytest.raises(memory.OutOfMemoryPlan, match=r"(?s)needs 0\.0\d GiB per device.*Change:"):
    train.functions(setup)
  c.memory_limit_gib = 1.0
  train.check_memory(train.build(c))  # Fits: no error.
