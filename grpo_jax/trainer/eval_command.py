"""`grpo-jax eval`: a checkpoint scored on several benchmarks, with intervals, resumably.

  grpo-jax eval --config=configs/arithmetic.py:tiny --workdir=/tmp/run \\
    --config.eval.benchmarks=arithmetic,long_addition,jsonl:bench.jsonl:exact --config.eval.k=8

Source: the workdir's checkpoint (config.eval.step; -1: the newest), read without touching
the workdir (`run_state.read_checkpoint`); a workdir without checkpoints scores config.hf_dir's
weights (a Hugging Face directory or a GGUF file); neither is an error.

Benchmarks (config.eval.benchmarks, `benchmark_task`): the config's own task (with its
kwargs; the default when none is named), any other task of `grpo_jax.tasks` (its defaults),
a dataset ("gsm8k", "math500": the `math` task on its TFDS builder, with config.hf_dir's
tokenizer and chat template; `DATASETS`), or "jsonl:PATH[:VERIFIER]" (`tasks.jsonl`). Each scores the first config.eval.size problems
of its test split (0: config.eval_size), config.eval_size at a time through the trainer's
own evaluation samplers (`steps.functions`: the same sharding, batching and refill), with
the model's tokenizer. Per problem: the greedy completion and k = config.eval.k samples at
the config's sampling parameters, each decoded, scored (reward, format, scorable) and its
answer extracted (`Task.extract_answer`).

Figures (`eval_figures.figures`): greedy, avg@k, pass@k (unbiased), maj@k (tasks that
extract answers), format and unscorable rates, each with a 95% percentile-bootstrap
interval over problems. The first batch is sampled with the key the trainer's in-loop
evaluation of that checkpoint used (iteration i: fold_in(fold_in(run key, i), 2); the
warm start's, iteration 0: fold_in(run key, 2^31 − 1)), so with eval.size = eval_size and
eval.k = eval_samples the figures equal that evaluation's eval/greedy_accuracy,
eval/mean@k and eval/pass@k (tested); batch b > 0 uses fold_in(that key, b).

Output, under config.eval.out (default workdir/eval/step_<step>): eval.json (the source,
every figure and every problem's verdicts: prompt, answer, each completion with its
reward, format, scorable flag and extracted answer), eval.md (the table and how it was
computed), and the table on the terminal. Resumable: each benchmark's finished batches are
appended to <benchmark>.batches.jsonl, and a rerun of the same command (same source, k,
size, seed) continues after the last whole batch. One process only (several hosts:
refused).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import jax
import numpy as np

from grpo_jax import tasks
from grpo_jax.envs import episodes
from grpo_jax.infra import logs
from grpo_jax.models import sampling
from grpo_jax.tasks import base as tasks_base
from grpo_jax.tasks import jsonl as jsonl_task
from grpo_jax.trainer import build, eval_figures, heldout, rollout, run_state, steps
from grpo_jax.verifiers import reward_pool

# Dataset benchmarks: the `math` task on a TFDS builder (`grpo_jax.tasks.datasets`), with the
# model's chat template (config.hf_dir's tokenizer).
DATASETS = {"gsm8k": dict(dataset="gsm8k"), "math500": dict(dataset="math", test_split="math500")}
# What a dataset benchmark takes from the config's own `math` task: how it prompts and
# verifies, and where the data lives when it is the same dataset.
_PROMPTING = ("chat", "system_prompt", "prompt_template", "think_tags", "answer_tag")
_DATA = ("data_dir", "manual_dir", "config")
REPORT = "eval.json"
SUMMARY = "eval.md"
_WARM_START_EVAL = 2**31 - 1  # The fold of the warm start's evaluation key (`train`).


class EvalError(ValueError):
  """What `grpo-jax eval` was asked cannot be done (no source, a bad benchmark name)."""


# ----------------------------------------------------------------------------
# Config and source.
# ----------------------------------------------------------------------------


def eval_setup(config_dict) -> build.Setup:
  """The Setup an eval runs: the config with eval_samples = eval.k (the sampler it
  compiles for k samples per problem), without a distillation teacher (config.teacher: an
  eval neither loads it nor needs its files)."""
  c = config_dict.copy_and_resolve_references()
  c.eval_samples = int(c.eval.k)
  return build.build(c, teacher=False)  # A distillation teacher trains, it never evaluates.


def source(setup: build.Setup, fns, workdir) -> tuple[dict, jax.Array, dict]:
  """(params, the first batch's key, what was scored) from the workdir's checkpoint, else
  config.hf_dir's weights."""
  step = None if setup.eval.step < 0 else setup.eval.step
  st = run_state.read_checkpoint(setup, fns, workdir, step=step)
  if st is not None:
    setup.task.load_state(st.task_state)  # A curriculum's level at that checkpoint.
    it = st.iteration
    key = (
      jax.random.fold_in(st.key, _WARM_START_EVAL)
      if it == 0
      else jax.random.fold_in(jax.random.fold_in(st.key, it), 2)
    )
    return st.train.params, key, {"workdir": str(workdir), "step": it}
  if setup.eval.step >= 0:
    raise EvalError(f"config.eval.step={setup.eval.step}, but {workdir} has no checkpoints.")
  if not setup.loop.hf_dir:
    raise EvalError(
      f"Nothing to evaluate: {workdir} has no checkpoints and config.hf_dir is empty "
      "(train there first, or name a Hugging Face directory or GGUF file in config.hf_dir)."
    )
  run_key = jax.random.key(setup.loop.seed)
  params = run_state.initial_params(setup, fns, jax.random.fold_in(run_key, 0))
  key = jax.random.fold_in(run_key, _WARM_START_EVAL)
  return params, key, {"hf_dir": setup.loop.hf_dir, "step": "hf"}


def benchmark_task(name: str, setup: build.Setup) -> tasks_base.Task:
  """The task a benchmark name stands for (module docstring); a name or file that does not
  make one is an EvalError saying why."""
  try:
    return _benchmark_task(name, setup)
  except EvalError:
    raise
  except ValueError as e:
    raise EvalError(f"config.eval.benchmarks: {name!r}: {e}") from None


def _benchmark_task(name: str, setup: build.Setup) -> tasks_base.Task:
  if name.startswith("jsonl:"):
    path, _, verifier = name[len("jsonl:") :].partition(":")
    return jsonl_task.JsonlProblems.benchmark(path, verifier or "exact")
  own = setup.spec.get("task", {}).get("name")
  if name == own:
    return setup.task
  if name in DATASETS:
    return _dataset_task(name, setup)
  if setup.episodes is not None:
    raise EvalError(
      f"config.eval.benchmarks has {name!r}, but this config runs episodes (config.env) of "
      f"its own task {own!r}: only that one can be evaluated here."
    )
  if not tasks.known(name):
    raise EvalError(
      f"config.eval.benchmarks: unknown benchmark {name!r}; allowed: a task "
      f"({', '.join(tasks.REGISTRY.names())}, rg:<dataset>), a dataset ({', '.join(DATASETS)}) "
      "or jsonl:PATH[:exact|math]."
    )
  hf_dir = setup.loop.hf_dir
  if hf_dir and getattr(tasks.task_class(name), "uses_hf_tokenizer", False):
    return tasks.get(name, tokenizer_dir=hf_dir)  # The model's tokenizer and chat template.
  return tasks.get(name)


def _dataset_task(name: str, setup: build.Setup) -> tasks_base.Task:
  """`DATASETS[name]` as a `math` task: the model's tokenizer (config.hf_dir), the own math
  task's prompting and verifier options, and its data directories when the dataset is the
  same (else TFDS's defaults: downloaded on first use)."""
  if not setup.loop.hf_dir:
    raise EvalError(
      f"benchmark {name!r} prompts through a chat model's tokenizer and template: set "
      "config.hf_dir (a Hugging Face directory or GGUF file)."
    )
  kwargs = {**DATASETS[name], "tokenizer_dir": setup.loop.hf_dir}
  task_d = setup.spec.get("task", {})
  own = dict(task_d.get("kwargs", {})) if task_d.get("name") == "math" else {}
  kwargs.update({k: v for k, v in own.items() if k in _PROMPTING + ("verifier_backend",)})
  if own.get("dataset") == kwargs["dataset"]:
    kwargs.update({k: v for k, v in own.items() if k in _DATA})
  return tasks.get("math", **kwargs)


def _first_problem(name: str, task, setup: build.Setup):
  """`task`, once its first test problem could be read (a dataset is built, or found
  missing, here: before anything is sampled)."""
  try:
    task.example("test", 0, seed=setup.loop.seed)
  except (OSError, ValueError) as e:
    raise EvalError(f"benchmark {name!r}: {_one_line(e)}") from None
  return task


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split())


# ----------------------------------------------------------------------------
# One batch of problems: sample, decode, score.
# ----------------------------------------------------------------------------


def _scored(setup, pool, examples, tokens_NT, *, group: int) -> list[dict]:
  """Per row: completion (as `rollout.score` decoded it), reward, format, scorable,
  extracted answer. One process: its rows are all of them (`run`)."""
  s = rollout.score(setup, pool, examples, tokens_NT, group=group)
  return [
    dict(
      completion=t,
      reward=float(s.correct_N[i]),
      format=float(s.format_N[i]),
      scorable=bool(s.scorable_N[i]),
      answer=setup.task.extract_answer(t),
    )
    for i, t in enumerate(s.completions)
  ]


def _episode_rows(setup, result) -> list[dict]:
  texts = [setup.tokenizer.decode(r) for r in np.asarray(result.rollouts.tokens_NT)]
  return [
    dict(
      completion=t,
      reward=float(result.reward_N[i]),
      format=float(result.end_N[i] == episodes.DONE),
      scorable=bool(result.scorable_N[i]),
      answer=setup.task.extract_answer(t),
    )
    for i, t in enumerate(texts)
  ]


def batch_rows(setup, fns, pool, params, examples: dict, key, *, k: int) -> list[dict]:
  """The eval_size problems `examples` (row -> Example): per problem its index, prompt,
  answer, greedy row and k sampled rows (`_scored`)."""
  B = setup.loop.eval_size
  prompts = rollout.host_prompts(setup, fns, examples, B)
  greedy_hyper = sampling.sampling_params(greedy=True)
  listed = [examples[i] for i in range(B)]
  if setup.episodes is not None:
    greedy = _episode_rows(
      setup, fns.episodes.greedy.run(params, prompts, listed, key, greedy_hyper)
    )
    sampled = (
      _episode_rows(
        setup, fns.episodes.eval.run(params, prompts, listed, key, setup.sampling_hyper)
      )
      if k
      else []
    )
  else:
    tokens = fns.samplers.greedy(params, prompts, key, greedy_hyper).tokens_NT
    more = fns.samplers.eval(params, prompts, key, setup.sampling_hyper).tokens_NT if k else None
    greedy = _scored(setup, pool, examples, tokens, group=1)
    sampled = _scored(setup, pool, examples, more, group=k) if k else []
  return [
    dict(
      prompt=listed[i].prompt,
      answer=listed[i].answer,
      greedy=greedy[i],
      samples=sampled[i * k : (i + 1) * k],
    )
    for i in range(B)
  ]


# ----------------------------------------------------------------------------
# One benchmark: its batches (resumed), its figures.
# ----------------------------------------------------------------------------


def _file_name(name: str) -> str:
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "benchmark"


def _resumed(path: pathlib.Path, header: dict, *, log) -> list[list[dict]]:
  """The finished batches of an earlier run of the same eval (its header equal), else []
  (the file is started over)."""
  records = logs.read_jsonl(path)  # A last line cut by a kill is dropped...
  batches = []
  if records and records[0] == header:
    batches = [r["rows"] for r in records[1:] if r.get("batch") is not None]
    if batches:
      log(f"{header['benchmark']}: {len(batches)} batch(es) already scored in {path}; continuing.")
  lines = [header, *({"batch": b, "rows": rows} for b, rows in enumerate(batches))]
  path.write_text("".join(json.dumps(r) + "\n" for r in lines))  # ...and from the file.
  return batches


def run_benchmark(
  name, task, setup, fns, params, key, *, out: pathlib.Path, source_info, log, progress
):
  """(figures, problems, distinct problems among them) of benchmark `name` (its `task`;
  module docstring)."""
  bench = setup if task is setup.task else _with_task(setup, task)
  B, k = setup.loop.eval_size, setup.eval.k
  size = _size(setup, task)
  header = dict(
    benchmark=name, source=source_info, k=k, size=size, batch=None, seed=setup.loop.seed
  )
  path = out / f"{_file_name(name)}.batches.jsonl"
  done = _resumed(path, header, log=log)
  with reward_pool.RewardPool(
    task, workers=setup.loop.reward_workers, timeout_s=setup.loop.reward_timeout_s
  ) as pool:
    for b in range(len(done), -(-size // B)):
      first = b * B  # Past `size` the last batch repeats problems; they are dropped.
      examples = {
        i: task.example("test", min(first + i, size - 1), seed=setup.loop.seed) for i in range(B)
      }
      batch_key = key if b == 0 else jax.random.fold_in(key, b)
      rows = batch_rows(bench, fns, pool, params, examples, batch_key, k=k)
      rows = [dict(index=first + i, **r) for i, r in enumerate(rows) if first + i < size]
      with path.open("a") as f:
        f.write(json.dumps({"batch": b, "rows": rows}) + "\n")
      done.append(rows)
      progress(name, [r["greedy"]["reward"] for batch in done for r in batch])
  problems = [r for rows in done for r in rows]
  keys_P = [task.problem_key("test", p["index"], seed=setup.loop.seed) for p in problems]
  return _figures(task, problems, k=k), problems, heldout.distinct(keys_P)


def _size(setup: build.Setup, task) -> int:
  """Problems to score: config.eval.size (0: config.eval_size), at most a finite test
  split's (`test_size`: a JSONL file's records)."""
  size = setup.eval.size or setup.loop.eval_size
  limit = getattr(task, "test_size", None)
  return min(size, limit) if limit else size


def _with_task(setup: build.Setup, task) -> build.Setup:
  return dataclasses.replace(setup, task=task)


def _figures(task, problems: list[dict], *, k: int) -> dict:
  g = [p["greedy"] for p in problems]
  kw = dict(
    greedy_P=[r["reward"] for r in g],
    format_P=[r["format"] for r in g],
    scorable_P=[r["scorable"] for r in g],
  )
  if k:
    kw["correct_PK"] = [[s["reward"] for s in p["samples"]] for p in problems]
    kw["scorable_PK"] = [[s["scorable"] for s in p["samples"]] for p in problems]
    if type(task).extract_answer is not tasks_base.Task.extract_answer:
      kw["answers_PK"] = [[s["answer"] for s in p["samples"]] for p in problems]
  return eval_figures.figures(**kw)


# ----------------------------------------------------------------------------
# The command.
# ----------------------------------------------------------------------------


def run(config_dict, workdir, *, log=print) -> dict:
  """Scores the source on every benchmark; writes eval.json and eval.md; returns
  {"source", "out", "figures": {benchmark: figures}}."""
  if jax.process_count() > 1:
    raise EvalError("grpo-jax eval runs on one process; several hosts are not supported yet.")
  setup = eval_setup(config_dict)
  names = setup.eval.names or (setup.spec["task"]["name"],)
  chosen = {n: _first_problem(n, benchmark_task(n, setup), setup) for n in names}
  fns = steps.functions(setup)
  workdir = pathlib.Path(workdir)
  params, key, source_info = source(setup, fns, workdir)
  out = (
    pathlib.Path(setup.eval.out)
    if setup.eval.out
    else workdir / "eval" / f"step_{source_info['step']}"
  )
  out.mkdir(parents=True, exist_ok=True)
  B = setup.loop.eval_size
  total = sum(-(-_size(setup, task) // B) for task in chosen.values())
  bar = logs.Progress(
    total=total, enabled=setup.loop.progress, desc="eval", unit="batch", log=log,
    fields=lambda record: record,
  )  # fmt: skip
  count = [0]

  def tick(name: str, greedy_rewards: list[float]):
    """The eval's own figures beside the bar: the benchmark and its greedy accuracy so far."""
    count[0] += 1
    n = len(greedy_rewards)
    bar.update(count[0], {name: f"greedy {sum(greedy_rewards) / n:.3f} on {n} problems"})

  report = {"source": source_info, "k": setup.eval.k, "benchmarks": {}}
  try:
    for name, task in chosen.items():
      figures, problems, distinct = run_benchmark(
        name,
        task,
        setup,
        fns,
        params,
        key,
        out=out,
        source_info=source_info,
        log=log,
        progress=tick,
      )
      report["benchmarks"][name] = {
        "problems_scored": len(problems),
        "distinct_problems": distinct,
        "figures": figures,
        "problems": problems,
      }
  finally:
    bar.close()
  figs = {n: b["figures"] for n, b in report["benchmarks"].items()}
  (out / REPORT).write_text(json.dumps(report, indent=1) + "\n")
  (out / SUMMARY).write_text(_markdown(report, figs))
  log(eval_figures.table(figs))
  log(f"wrote {out / REPORT} and {out / SUMMARY}")
  return {"source": source_info, "out": str(out), "figures": figs}


def _count(bench: dict) -> str:
  """'64', or '64 (41 distinct)' where a drawn test split repeats problems."""
  n, d = bench["problems_scored"], bench.get("distinct_problems", bench["problems_scored"])
  return f"{n} ({d} distinct)" if d < n else str(n)


def _markdown(report: dict, figs: dict) -> str:
  src = report["source"]
  where = f"{src['workdir']} checkpoint {src['step']}" if "workdir" in src else src["hf_dir"]
  return "\n".join(
    [
      f"# Evaluation of {where}",
      "",
      "Problems per benchmark (the first of each test split): "
      + ", ".join(f"{n} {_count(b)}" for n, b in report["benchmarks"].items())
      + f"; greedy and k = {report['k']} samples each. Percent, with 95% percentile-bootstrap intervals over "
      f"problems ({heldout.BOOTSTRAP_RESAMPLES} resamples, seed {heldout.BOOTSTRAP_SEED}); "
      "pass@k is the unbiased estimator (Chen et al. 2021); maj@k votes over extracted "
      "answers, ties to the answer seen first; unscorable rows count as wrong and are "
      "reported apart. Every problem's verdicts: eval.json.",
      "",
      eval_figures.table(figs),
      "",
    ]
  )
