"""`grpo-jax plan` several times in one process: `run(args)` is one plan's standard output
(`cli.parse_flags` then `main._main`, as `app.run` calls them, from the repo root, absl's
flags reset after it). `python tests/cheap_plans.py ARGS_JSON` (a JSON list of argument
lists) prints the JSON list of their outputs: plans that need the same forced device count
share one child process, its start and its imports, not one each."""

import contextlib
import io
import json
import pathlib
import sys

from absl import flags

from grpo_jax import cli, main

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(args) -> str:
  out = io.StringIO()
  try:
    with contextlib.chdir(ROOT), contextlib.redirect_stdout(out):
      main._main(cli.parse_flags(["grpo-jax", "plan", *args]))
  finally:
    flags.FLAGS.unparse_flags()
  return out.getvalue()


if __name__ == "__main__":
  print(json.dumps([run(args) for args in json.loads(sys.argv[1])]))
