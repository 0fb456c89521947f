"""Experiment trackers beside metrics.jsonl and TensorBoard: Weights & Biases and MLflow.

    config.logging.trackers = ("jsonl", "tensorboard", "wandb", "mlflow")

One interface, the run logger's: `write(record)`, `write_samples(iteration, samples)`,
`close()`. `logs.RunLogger` writes jsonl and TensorBoard itself (metrics.jsonl is the
run's own record: resume, summary.json and the plots read it) and hands every record to
the trackers `open_trackers` returns. Only process 0 opens any (`train`).

- W&B (`wandb`, the `track` extra): one run per workdir, `wandb.init(project, entity,
  name, id, resume="allow", dir=workdir, config=<the validated config>, mode)`, every
  metric plotted against "iteration" (`define_metric`), names unchanged, held-out samples
  as a table, and the metric definitions (`grpo_jax.infra.metrics.DEFINITIONS`) as the run file
  metric_definitions.json. `logging.wandb_mode="offline"` (or WANDB_MODE) writes
  workdir/wandb/ for a later `wandb sync`.
- MLflow (`mlflow-skinny` suffices): a run in the experiment `logging.project` at
  `logging.mlflow_tracking_uri` (""/MLFLOW_TRACKING_URI: MLflow's own default); the
  config flattened into params once (dotted keys), each record's numbers as metrics at
  step = iteration, samples as markdown artifacts, and metric_definitions.json as an
  artifact. MLflow admits only letters, digits and `_-. :/` in names, so a metric is
  logged as `mlflow_name(name)`: "@" becomes "_at_" (eval/pass@8 -> eval/pass_at_8), any
  other character "_".
- The same runs on resume: the first session writes workdir/trackers.json with each
  tracker's run id, and a resumed session continues those runs, not new ones.
  Iterations a crashed session logged past its checkpoint are logged again (W&B and
  MLflow keep both points; metrics.jsonl and TensorBoard drop the old ones).
- Failures never stop the run: a tracker whose package is missing, whose start fails (an
  unreachable server, a bad URI) or whose write raises later is one warning line through
  `log`, and the run goes on with the others. So that an unreachable server costs
  seconds, not minutes: W&B's init timeout is `logging.timeout_s`, and MLflow's HTTP
  client retries twice with that timeout unless MLFLOW_HTTP_REQUEST_MAX_RETRIES /
  MLFLOW_HTTP_REQUEST_TIMEOUT are set (a closed port at timeout_s=2: 5 s, measured).

Hand-written only as adapters: the logging itself is the libraries'.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import time

import numpy as np

from grpo_jax.infra import logs, metrics

NAMES = ("jsonl", "tensorboard", "wandb", "mlflow")
IDS = "trackers.json"  # {tracker: run id}: a resumed session continues the same runs.
DEFINITIONS_FILE = "metric_definitions.json"
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow-skinny"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrackingConfig:
  """config.logging: where a run's metrics go (module docstring)."""

  trackers: tuple[str, ...] = ("jsonl", "tensorboard")
  project: str = "grpo_jax"  # W&B project; MLflow experiment name.
  run_name: str = ""  # "": the workdir's name.
  wandb_entity: str = ""  # "": W&B's default entity.
  wandb_mode: str = ""  # "": W&B's own (WANDB_MODE, or online when logged in); "offline"; "online".
  mlflow_tracking_uri: str = ""  # "": MLFLOW_TRACKING_URI, else MLflow's default.
  timeout_s: float = 30.0  # Start-up (W&B) and per-request (MLflow) timeout.
  # Training rollouts shown beside the held-out samples (samples.jsonl rows with "kind":
  # "train", TensorBoard's "rollouts" text, the trackers): the first rollouts_groups groups
  # of every rollouts_every-th iteration's batch, each row with its prompt, completion,
  # reward, format reward, advantage and verdict. 0: never.
  rollouts_every: int = 10
  rollouts_groups: int = 1

  def __post_init__(self):
    trackers = tuple(self.trackers)
    object.__setattr__(self, "trackers", trackers)
    unknown = sorted(set(trackers) - set(NAMES))
    if unknown or len(set(trackers)) != len(trackers):
      raise ValueError(
        f"config.logging.trackers={list(trackers)}: unknown {unknown} or repeated; allowed: "
        f"{', '.join(NAMES)}, each at most once."
      )
    if "jsonl" not in trackers:
      raise ValueError(
        f"config.logging.trackers={list(trackers)} leaves out 'jsonl': metrics.jsonl is the "
        "run's own record (resume, summary.json and the plots read it); keep it."
      )
    if self.wandb_mode not in ("", "offline", "online"):
      raise ValueError(
        f"config.logging.wandb_mode={self.wandb_mode!r}; allowed: '' (W&B's own), 'offline', "
        "'online'."
      )
    for name in ("rollouts_every", "rollouts_groups"):
      value, least = getattr(self, name), 0 if name == "rollouts_every" else 1
      if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"config.logging.{name}={value!r}: must be an int >= {least}.")
    if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
      raise ValueError(f"config.logging.timeout_s={self.timeout_s!r}: must be a number > 0.")


def numbers(record: dict) -> dict[str, float]:
  """The record's numeric entries as floats (strings, booleans and None left out)."""
  return {
    k: float(v)
    for k, v in record.items()
    if v is not None and not isinstance(v, (str, bool, np.bool_)) and np.ndim(v) == 0
  }


def mlflow_name(name: str) -> str:
  """A metric name MLflow accepts: "@" -> "_at_", other characters outside
  [A-Za-z0-9_\\-. :/] -> "_"."""
  return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("@", "_at_"))


def flatten(tree: dict, prefix: str = "") -> dict[str, str]:
  """{"rl.advantage": "grpo", ...}: a nested config as dotted keys and string values."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict) and v:
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = json.dumps(v, default=str) if not isinstance(v, str) else v
  return out


def _definitions() -> dict:
  return {"rule": "MLflow names: mlflow_name(name)", "definitions": dict(metrics.DEFINITIONS)}


class WandbTracker:
  """A W&B run (module docstring)."""

  name = "wandb"

  def __init__(self, cfg: TrackingConfig, workdir: pathlib.Path, *, config: dict, run_id=None):
    import wandb  # noqa: PLC0415 -- optional (the `track` extra).

    self._wandb = wandb
    self.run = wandb.init(
      project=cfg.project,
      entity=cfg.wandb_entity or None,
      name=cfg.run_name or workdir.name,
      id=run_id,  # None: W&B makes one (trackers.json keeps it for a resume).
      resume="allow",
      dir=str(workdir),
      config=config,
      mode=cfg.wandb_mode or None,
      # No stdout capture (the trainer owns its terminal); no end-of-run history table.
      settings=wandb.Settings(init_timeout=cfg.timeout_s, console="off", quiet=True),
    )
    self.run_id = self.run.id
    self.run.define_metric("iteration")
    self.run.define_metric("*", step_metric="iteration")
    (pathlib.Path(self.run.dir) / DEFINITIONS_FILE).write_text(json.dumps(_definitions()))

  def write(self, record: dict) -> None:
    self.run.log(numbers(record))

  def write_samples(self, iteration: int, samples: list[dict]) -> None:
    columns = sorted({k for s in samples for k in s})
    rows = [[_cell(s.get(c)) for c in columns] for s in samples]
    self.run.log({"iteration": iteration, "samples": self._wandb.Table(columns=columns, data=rows)})

  def close(self) -> None:
    self.run.finish()


def _cell(v):
  return v if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


class MlflowTracker:
  """An MLflow run (module docstring)."""

  name = "mlflow"
  _BATCH = 100  # MLflow's limit on params per log_batch call.

  def __init__(self, cfg: TrackingConfig, workdir: pathlib.Path, *, config: dict, run_id=None):
    uri = cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://")):  # Fail in seconds when the server is away.
      os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
      os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(cfg.timeout_s)))
    from mlflow import entities, tracking  # noqa: PLC0415 -- optional (the `track` extra).

    self._entities = entities
    self.client = tracking.MlflowClient(tracking_uri=uri or None)
    if run_id:  # A resumed session: the same run, running again.
      self.client.update_run(run_id, status="RUNNING")
      self.run_id = run_id
      return
    exp = self.client.get_experiment_by_name(cfg.project)
    exp_id = exp.experiment_id if exp else self.client.create_experiment(cfg.project)
    run = self.client.create_run(
      exp_id, run_name=cfg.run_name or workdir.name, tags={"grpo_jax.workdir": str(workdir)}
    )
    self.run_id = run.info.run_id
    params = [entities.Param(k[:250], v[:6000]) for k, v in flatten(config).items()]
    for i in range(0, len(params), self._BATCH):
      self.client.log_batch(self.run_id, params=params[i : i + self._BATCH])
    self.client.log_dict(self.run_id, _definitions(), DEFINITIONS_FILE)

  def write(self, record: dict) -> None:
    step, now = int(record.get("iteration", 0)), int(time.time() * 1000)
    batch = [
      self._entities.Metric(mlflow_name(k), v, now, step)
      for k, v in numbers(record).items()
      if k != "iteration"
    ]
    for i in range(0, len(batch), 1000):  # MLflow's limit on metrics per call.
      self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

  def write_samples(self, iteration: int, samples: list[dict]) -> None:
    self.client.log_text(
      self.run_id, logs.samples_markdown(samples), f"samples/iteration_{iteration:06d}.md"
    )

  def close(self) -> None:
    self.client.set_terminated(self.run_id)


_OPENERS = {"wandb": WandbTracker, "mlflow": MlflowTracker}


class Guarded:
  """A tracker whose first failing call is one warning through `log`, after which it is
  left alone: a tracker never stops the run."""

  def __init__(self, tracker, *, log):
    self.tracker, self._log, self.failed = tracker, log, False

  def _call(self, method: str, *args) -> None:
    if self.failed:
      return
    try:
      getattr(self.tracker, method)(*args)
    except Exception as e:  # noqa: BLE001 -- any failure of a tracker: warn, go on.
      self.failed = True
      self._log(
        f"warning: tracker {self.tracker.name!r} failed ({type(e).__name__}: {_first_line(e)}); "
        "the run continues without it (metrics.jsonl has every record)."
      )

  def write(self, record: dict) -> None:
    self._call("write", record)

  def write_samples(self, iteration: int, samples: list[dict]) -> None:
    self._call("write_samples", iteration, samples)

  def close(self) -> None:
    self._call("close")


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return text[0][:300] if text else ""


def open_trackers(
  cfg: TrackingConfig, workdir: pathlib.Path, *, config: dict, resumed: bool, log
) -> list[Guarded]:
  """The external trackers of `cfg.trackers` (jsonl and tensorboard are `logs.RunLogger`'s
  own), each `Guarded`. A resumed run continues the runs named in workdir/trackers.json;
  a fresh one starts new runs and writes their ids there. A tracker that cannot start is
  one warning and is left out."""
  workdir = pathlib.Path(workdir)
  path = workdir / IDS
  ids = json.loads(path.read_text()) if resumed and path.exists() else {}
  out = []
  for name in cfg.trackers:
    if name not in _OPENERS:
      continue
    try:
      tracker = _OPENERS[name](cfg, workdir, config=config, run_id=ids.get(name))
    except ImportError as e:
      log(
        f"warning: config.logging.trackers has {name!r}, but {e.name or name} is not "
        f"installed (pip install {_PACKAGES[name]}, or the `track` extra); the run continues "
        "without it."
      )
      continue
    except Exception as e:  # noqa: BLE001 -- an unreachable server, a bad URI, ...
      log(
        f"warning: tracker {name!r} did not start ({type(e).__name__}: {_first_line(e)}); "
        "the run continues without it."
      )
      continue
    ids[name] = tracker.run_id
    out.append(Guarded(tracker, log=log))
  if out:
    path.write_text(json.dumps(ids, indent=1) + "\n")
  return out
