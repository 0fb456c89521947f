"""Command line: `grpo-jax --config=configs/arithmetic.py:tiny --workdir=/tmp/run`.

Overrides use ml-collections syntax, e.g. `--config.rl.advantage=rloo`; the config is
locked, so a misspelt key fails. The same entry point is `train.run(config, workdir)` in
a notebook.
"""

from __future__ import annotations

import json

from absl import app, flags, logging
from ml_collections import config_flags

from grpo_jax import train

_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "Config file[:variant].", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where metrics.jsonl and summary.json go.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # Quiet JAX's backend probing.
  summary = train.run(_CONFIG.value, _WORKDIR.value)
  print(json.dumps(summary, indent=2))
  print(train.describe(summary))
  if summary["preempted"]:
    raise SystemExit(143)  # 128 + SIGTERM: a scheduler sees the job as interrupted.


def run():
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)


if __name__ == "__main__":
  run()
