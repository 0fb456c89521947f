"""The lines a run starts with: its devices (a warning when JAX runs on the CPU of a machine
with a visible accelerator) and the parameters it trains."""

import dataclasses

import jax
import pytest

from grpo_jax.infra import devices
from grpo_jax.models import adapters, model


@dataclasses.dataclass
class _Device:
  platform: str
  device_kind: str


CPU = [_Device("cpu", "cpu")]
TPU = [_Device("tpu", "TPU v5 lite")] * 8


def _dev(tmp_path, *names):
  """A fake /dev holding these (empty) device files."""
  for name in names:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).touch()
  return tmp_path


def test_the_device_line_counts_devices_by_kind():
  got = devices.describe(devices=TPU + [_Device("tpu", "TPU v4")], process_count=2, env={})
  assert got == [f"devices: 8 × TPU v5 lite (tpu), 1 × TPU v4 (tpu), 2 processes; jax {jax.__version__}"]  # fmt: skip
  assert devices.describe(process_count=1, env={})[0].startswith("devices: 1 × cpu (cpu); jax")


@pytest.mark.parametrize(
  "files, kind, path",
  [
    (["nvidia0", "nvidiactl"], "an NVIDIA GPU", "nvidia0"),
    (["kfd"], "an AMD GPU", "kfd"),
    (["accel0", "accel1"], "a TPU", "accel0"),
    (["vfio/0", "vfio/vfio"], "a TPU", "vfio/0"),
  ],
)
def test_a_visible_accelerator_on_a_cpu_run_is_a_warning(tmp_path, files, kind, path):
  root = _dev(tmp_path, *files)
  assert devices.visible_accelerator(root)[:2] == (kind, str(root / path))
  lines = devices.describe(devices=CPU, process_count=1, dev_root=root, env={})
  assert len(lines) == 2 and lines[1].startswith(f"warning: JAX runs on CPU, but this machine has {kind}")  # fmt: skip
  assert "JAX_PLATFORMS=cpu" in lines[1]


def test_no_warning_on_an_accelerator_on_purpose_or_without_one(tmp_path):
  root = _dev(tmp_path, "nvidia0")
  # JAX runs on the accelerator; the user chose the CPU; nothing visible (nvidiactl alone
  # is the driver's control file, not a GPU; vfio without a numbered group is not a TPU).
  assert len(devices.describe(devices=TPU, process_count=1, dev_root=root, env={})) == 1
  on_purpose = devices.describe(devices=CPU, process_count=1, dev_root=root, env={"JAX_PLATFORMS": "cpu"})  # fmt: skip
  assert len(on_purpose) == 1
  bare = _dev(tmp_path / "bare", "nvidiactl", "vfio/vfio", "null")
  assert devices.visible_accelerator(bare) is None
  assert devices.visible_accelerator(tmp_path / "missing") is None


def test_the_entry_points_choose_the_cpu_only_where_nothing_else_is_there(tmp_path):
  (tmp_path / "null").touch()
  env = {}
  assert devices.cpu_where_nothing_else(env, dev_root=tmp_path) and env == {"JAX_PLATFORMS": "cpu"}
  env = {"JAX_PLATFORMS": ""}  # The user's own choice, even JAX's default, stays.
  assert not devices.cpu_where_nothing_else(env, dev_root=tmp_path) and env["JAX_PLATFORMS"] == ""
  (tmp_path / "vfio").mkdir()
  (tmp_path / "vfio" / "0").touch()  # A v5e/v6e TPU VM's device file.
  env = {}
  assert not devices.cpu_where_nothing_else(env, dev_root=tmp_path) and env == {}


def test_a_command_on_a_cpu_machine_prints_no_tpu_probe_errors():
  """With libtpu installed (the test extra), JAX_PLATFORMS unset and no accelerator's
  device file here, `grpo-jax plan` runs on the CPU without libtpu's probe errors."""
  import os  # noqa: PLC0415
  import pathlib  # noqa: PLC0415
  import subprocess  # noqa: PLC0415
  import sys  # noqa: PLC0415

  root = pathlib.Path(__file__).resolve().parents[2]
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  args = ["plan", "--config=configs/arithmetic.py:quick", "--devices=1"]
  r = subprocess.run(
    [sys.executable, "-m", "grpo_jax.main", *args],
    cwd=root, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-2000:]
  if devices.visible_accelerator() is None:  # CI's machines: JAX_PLATFORMS=cpu was set.
    assert "TPU" not in r.stderr, r.stderr[-2000:]
  else:  # An accelerator's files: JAX's own choice, untouched.
    assert devices.cpu_where_nothing_else({}) is False


def test_the_parameter_line_counts_by_hand():
  """The tiny model (V = 58, tied embedding): per layer q 64·64, k and v 64·32, o 64·64,
  q/k norms 2·16, two norms 2·64, MLP 3·64·192 = 49,312; two layers, a final norm 64 and
  the embedding 58·64: 102,400. Rank-4 adapters on every projection: r·(in + out) each,
  4·(128 + 96 + 96 + 128 + 3·256) = 4,864 a layer, 9,728 in all."""
  shapes = lambda cfg: jax.eval_shape(lambda k: model.init(cfg, k), jax.random.key(0))
  cfg = model.tiny_config(58)
  assert adapters.parameter_line(shapes(cfg), cfg) == "parameters: 102,400 (float32), all trained"
  cfg = model.tiny_config(58, lora=dict(rank=4, alpha=8.0, targets=("q", "v"), base_dtype="int8"))
  # q and v only: 2 layers × 4·((64 + 64) + (64 + 32)) = 1,792.
  assert adapters.parameter_line(shapes(cfg), cfg) == (
    "parameters: 104,192 (int8 base); training 1,792 LoRA adapter parameters (1.72%: rank 4, "
    "alpha 8, on q, v)"
  )
  cfg = model.tiny_config(58, lora=dict(rank=4))
  assert "training 9,728 LoRA adapter parameters" in adapters.parameter_line(shapes(cfg), cfg)
