"""`model_config`, through its own module: LoraConfig's derived values, ModelConfig's
conversions and derived properties, and the checks tests/models/test_model.py,
tests/models/test_families.py and tests/models/test_lora.py do not reach (non-finite numbers, experts,
the query block, llama3's factors only under llama3)."""

import dataclasses

import jax.numpy as jnp
import pytest

from grpo_jax.models import model_config


def _cfg(**overrides) -> model_config.ModelConfig:
  return model_config.tiny_config(32, **overrides)


def test_tiny_config_is_a_small_qwen3_shape_and_overrides_win():
  """64-wide, 2 layers of 4 query and 2 KV heads of 16, MLP 192, q/k norm; the
  embedding is 32 x 64 = 2048 weights."""
  cfg = _cfg()
  got = (cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_dim)
  assert got == (64, 2, 4, 2, 16, 192) and cfg.qk_norm and cfg.vocab_size == 32
  assert _cfg(n_layers=3, qk_norm=False).n_layers == 3
  assert not _cfg(qk_norm=False).qk_norm


def test_lora_scale_enabled_and_targets():
  """scale = alpha / rank (16 / 8 = 2); rank 0 is off; targets become a tuple."""
  lora = model_config.LoraConfig(rank=8, alpha=16.0, targets=["q", "v"])
  assert (lora.scale, lora.enabled, lora.targets) == (2.0, True, ("q", "v"))
  assert not model_config.LoraConfig().enabled
  assert model_config.LoraConfig(rank=3, alpha=1.5).scale == 0.5
  with pytest.raises(ValueError, match=r"targets=\[\]: unknown \[\]; allowed: a non-empty"):
    model_config.LoraConfig(rank=4, targets=())


def test_lora_given_as_a_dict_is_validated_into_a_lora_config():
  """A ConfigDict section arrives as a dict: it becomes a LoraConfig, an unknown key an
  error naming model.lora."""
  cfg = _cfg(lora=dict(rank=2, alpha=4.0))
  assert isinstance(cfg.lora, model_config.LoraConfig) and cfg.lora.scale == 2.0
  with pytest.raises(ValueError, match="unknown LoraConfig keys"):
    _cfg(lora=dict(rnak=2))


@pytest.mark.parametrize(
  ("overrides", "sliding"),
  [
    (dict(), (False, False)),  # No window.
    (dict(sliding_window=4), (True, True)),  # A window and no types: every layer (Mistral).
    (dict(sliding_window=4, layer_types=["full_attention", "sliding_attention"]), (False, True)),
  ],
)
def test_sliding_layers(overrides, sliding):
  """Per layer: in a window or not."""
  cfg = _cfg(**overrides)
  assert cfg.sliding_layers == sliding
  assert isinstance(cfg.layer_types, tuple)  # A list is stored as a tuple (hashable).


def test_dtypes_map_to_jax_dtypes():
  """param_dtype gives the weights' dtype, dtype the compute dtype."""
  cfg = _cfg(param_dtype="bfloat16")
  assert (cfg.weight_dtype, cfg.compute_dtype) == (jnp.bfloat16, jnp.float32)
  assert _cfg(dtype="bfloat16").compute_dtype == jnp.bfloat16


@pytest.mark.parametrize(
  ("overrides", "match"),
  [
    (dict(rope_theta=float("inf")), "rope_theta=inf: must be a finite number"),
    (dict(norm_eps=float("nan")), "norm_eps=nan: must be a finite number"),
    (dict(norm_eps=0.0), "rope_theta, norm_eps and init_std must be positive"),
    (dict(context_query_block=-1), "context_query_block=-1; allowed: an int >= 0"),
    (dict(n_experts=4, experts_per_token=5, expert_mlp_dim=8), r"experts_per_token \(5\)"),
    (dict(n_experts=4, experts_per_token=2), r"expert_mlp_dim > 0 \(0\)"),
    (dict(n_experts=-1), "n_experts=-1 must be an int >= 0"),
    (dict(rope_factor=0.0), "rope_factor and rope_original_max_len must be positive"),
    (dict(remat="dot"), "ModelConfig.remat='dot'"),
    (
      dict(n_experts=4, experts_per_token=2, expert_mlp_dim=8, lora=dict(rank=2)),
      r"targets has \['down', 'gate', 'up'\].*mixture of experts",
    ),
  ],
)
def test_bad_values_are_refused(overrides, match):
  """Each check names the field and the value it refused."""
  with pytest.raises(ValueError, match=match):
    _cfg(**overrides)


def test_what_is_accepted_at_the_edges():
  """llama3's factor order applies under llama3 only; remat "auto" waits for the memory
  plan; an expert layer may take adapters on attention only; vocab_limit may equal the
  vocabulary."""
  assert _cfg(rope_low_freq_factor=4.0, rope_high_freq_factor=1.0).rope_scaling == "none"
  assert _cfg(remat="auto").remat == "auto"
  moe = dict(n_experts=4, experts_per_token=4, expert_mlp_dim=8)
  assert _cfg(**moe, lora=dict(rank=2, targets=("q", "o"))).lora.enabled
  assert _cfg(vocab_limit=32).vocab_limit == 32


def test_configs_are_frozen_and_hashable():
  """A config is a jit static argument: frozen, and equal configs hash alike."""
  cfg = _cfg()
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.d_model = 8
  assert hash(cfg) == hash(_cfg()) and cfg == model_config.ModelConfig.from_dict(
    dataclasses.asdict(cfg)
  )


def test_remat_policies_and_logical_names():
  """The remat choices; the cache's logical axis names agree on the cache axis."""
  assert model_config.REMAT_POLICIES["none"] is None
  assert set(model_config.REMAT_POLICIES) == {"none", "full", "dots"}
  assert model_config.CACHE_K[-1] == model_config.CACHE_V[2] == "activation_cache"
  assert model_config.FULL_WINDOW == 2**30
