"""Command line: `grpo-jax --config=configs/arithmetic.py:tiny --workdir=/tmp/run`.

  grpo-jax --help                     the commands, the config syntax, the shipped configs
  grpo-jax config --config=configs/arithmetic.py:tiny --config.rl.preset=dapo

  grpo-jax plan --config=configs/arithmetic.py:full --devices=8 --device=tpu-v5e

  grpo-jax hf-check --hf_dir=/path/to/Qwen2.5-0.5B-Instruct

  grpo-jax eval --workdir=/tmp/run --benchmarks=arithmetic,long_addition,jsonl:b.jsonl --k=8

  grpo-jax rm-train --config=configs/reward_model.py:tiny --workdir=/tmp/grpo_rm

`plan` prints the per-device memory plan of a config (`memory`) for a device count and
says whether it fits a device (a name in `memory.DEVICE_MEMORY_GIB`, or GiB); with
`--compile` it also compiles the train step and sampler on this host's devices and prints
XLA's own figures next to the plan. Its last line is one JSON object.

`eval` scores the workdir's newest checkpoint (or config.hf_dir's weights) on
config.eval.benchmarks with greedy, avg@k, pass@k and maj@k and their intervals, and
writes workdir/eval/step_<step>/eval.json and eval.md (`eval_command`). Without --config it
runs on the config the run recorded (workdir/config.json); --benchmarks, --k, --size,
--step and --out set config.eval's keys.

`hf-check` imports a Hugging Face checkpoint directory, runs a forward on a few token
sequences (one left-padded) and prints the logits' summary; with torch and transformers
installed it runs the same batch through transformers and prints the max abs difference.
Its last line is one JSON object; it exits 1 when the difference exceeds `--tolerance`.

`rm-train` trains a Bradley–Terry reward model on config.reward_model.train_path's
preference pairs (`rm_train`); rerunning it resumes. Its last line is the
summary as one JSON object (held-out pair accuracy before and after). A run reads it back
with a config.rewards source of kind "reward_model" (`reward_sources`).

Overrides use ml-collections syntax, e.g. `--config.rl.advantage=rloo`; the config is
locked, so a misspelt key fails, in one line naming the closest keys (`cli`: argv, help,
presets by name). The same entry point is `train.run(config, workdir)` in a notebook.

Several hosts (a multi-host TPU VM slice, a Slurm or MPI job, or JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID set by hand): every host runs the same command;
`--distributed=auto` (the default) calls `jax.distributed.initialize` first when the
environment announces several processes (`distributed.initialize`).

This module is the command line's edge and imports no JAX: `--help`, a misspelt key or
flag and a bad config file are answered in a fraction of a second (`cli`, the config's
snapshot of defaults). The commands themselves (`commands`) are imported once the command
line has parsed.
"""

from __future__ import annotations

from absl import app, flags

from grpo_jax import cli
from grpo_jax.infra import devices

# The choices the flags' help names, written here so that `--help` imports no JAX;
# tests/test_cli.py checks each against its source (distributed.MODES,
# memory.DEVICE_MEMORY_GIB, shapes.CONFIGS).
DISTRIBUTED_MODES = ("auto", "on", "off")
DEVICE_NAMES = (
  "a100-40gb", "a100-80gb", "h100", "h200", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
)  # fmt: skip
MODEL_SHAPES = (
  "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen3-0.6b", "llama-3.2-1b",
  "llama-3.1-8b", "qwen3-30b-a3b", "mistral-7b", "gemma-2-2b", "gemma-2-9b", "gemma-3-1b",
  "gemma-3-4b",
)  # fmt: skip

_WORKDIR = flags.DEFINE_string("workdir", None, "Where metrics.jsonl and summary.json go.")
_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "auto",
  list(DISTRIBUTED_MODES),
  "jax.distributed.initialize: auto (when the environment announces several processes), on, off.",
)

_DEVICES = flags.DEFINE_integer("devices", None, "plan: device count (default: this host's).")
# eval: shorthands for config.eval.* (the flag wins over the config).
_EVAL_FLAGS = {
  "benchmarks": flags.DEFINE_string(
    "benchmarks", None, "eval: comma-separated benchmarks (config.eval.benchmarks)."
  ),
  "k": flags.DEFINE_integer("k", None, "eval: samples per problem (config.eval.k)."),
  "size": flags.DEFINE_integer("size", None, "eval: problems per benchmark (config.eval.size)."),
  "step": flags.DEFINE_integer(
    "step", None, "eval: the checkpoint, -1 the newest (config.eval.step)."
  ),
  "out": flags.DEFINE_string("out", None, "eval: the report's directory (config.eval.out)."),
}
_DEVICE = flags.DEFINE_string(
  "device", None, f"plan: device memory, one of {list(DEVICE_NAMES)} or GiB."
)
_COMPILE = flags.DEFINE_bool(
  "compile", False, "plan: also compile on this host's devices and print XLA's figures."
)
_TOPOLOGY = flags.DEFINE_string(
  "topology",
  None,
  "plan: compile the run's functions for a TPU topology from this host (e.g. v5e:2x4, "
  "v6e:2x4, v5p:2x2x1, v5e:4x8; needs libtpu: pip install -e '.[tpu]').",
)
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "plan --topology: TPU slices (multi-slice).")
_JSON = flags.DEFINE_string(
  "json", None, "plan --topology: also write the result to this JSON file."
)
_ADVICE = flags.DEFINE_bool(
  "advice",
  True,
  "plan --topology: when the config does not fit, find and compile the change that fits "
  "(--noadvice: report only).",
)
_MODEL = flags.DEFINE_string(
  "model",
  None,
  "plan: the model's shape from a config.json, a checkpoint directory, a GGUF file or a "
  f"built-in shape ({', '.join(MODEL_SHAPES)}); default: config.hf_dir's config.json.",
)
_HF_DIR = flags.DEFINE_string("hf_dir", None, "hf-check: a Hugging Face checkpoint directory.")
_TOLERANCE = flags.DEFINE_float(
  "tolerance", 1e-4, "hf-check: the largest max abs logit difference to transformers allowed."
)
_DTYPE = flags.DEFINE_enum(
  "dtype", "float32", ["float32", "bfloat16"], "hf-check: param and compute dtype."
)
_COMPARE = flags.DEFINE_bool(
  "compare", True, "hf-check: compare with transformers (--nocompare: the import alone)."
)


def _main(inv: cli.Invocation):
  """Runs the parsed command (`commands.main`); a user's mistake is one line and an exit
  status (`commands.USER_ERRORS`), no traceback."""
  from grpo_jax import commands  # noqa: PLC0415 -- JAX and the trainer, once argv parsed.

  try:
    commands.main(inv, process_ends_on_error=_PROCESS_ENDS_ON_ERROR)
  except tuple(commands.USER_ERRORS) as e:
    status = next(code for kind, code in commands.USER_ERRORS.items() if isinstance(e, kind))
    cli.fail(e, status=status)
  except BrokenPipeError:  # `grpo-jax config ... | head`: the reader stopped reading.
    cli.silence_stdout()
    raise SystemExit(1) from None


# Set by `run` (the grpo-jax command): an error ends the process.
_PROCESS_ENDS_ON_ERROR = False


def run():
  global _PROCESS_ENDS_ON_ERROR
  _PROCESS_ENDS_ON_ERROR = True
  devices.cpu_where_nothing_else()  # No TPU probe (libtpu's errors) on a CPU-only machine.
  app.run(_main, flags_parser=cli.parse_flags)


if __name__ == "__main__":
  run()
