"""Two processes on localhost, 2 CPU devices each, joined by `jax.distributed.initialize`
with gloo CPU collectives (`jax_cpu_collectives_implementation`), train the tiny config on
a (data 2, fsdp 2) mesh that spans both, from a warm-start checkpoint made on one device;
the run stops after 1 iteration and resumes from its orbax multi-host checkpoint for a
second. Both processes must end with the same params, equal to one process with 4 devices
running the 2 iterations straight."""

import json
import pathlib
import socket
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
import subproc

from grpo_jax.envs import episode_refill
from grpo_jax.infra import distributed

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "multihost_run.py")


def test_initialize_only_when_the_environment_announces_several_processes(monkeypatch):
  for var in (
    "JAX_COORDINATOR_ADDRESS",
    "TPU_WORKER_HOSTNAMES",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_SIZE",
  ):
    monkeypatch.delenv(var, raising=False)
  assert distributed._env_process_count() == 1
  assert distributed.initialize("auto") is False and distributed.initialize("off") is False
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-w-0,t1k-w-1,t1k-w-2,t1k-w-3")
  assert distributed._env_process_count() == 4
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")  # A single-host TPU VM.
  monkeypatch.setenv("SLURM_NTASKS", "2")
  assert distributed._env_process_count() == 2
  with pytest.raises(ValueError, match="allowed: .'auto', 'on', 'off'."):
    distributed.initialize("yes")


def test_gloo_is_bound_by_address_where_the_hostname_does_not_resolve():
  assert distributed._resolves("localhost") and not distributed._resolves("no-such-host.invalid")
  assert distributed._local_address("localhost:12355") == "127.0.0.1"
  assert distributed._local_address("127.0.0.1:80") == "127.0.0.1"


class _Device:
  def __init__(self, p):
    self.process_index = p


class _Sharding:
  def __init__(self, blocks):  # [(process, start, stop)] per device
    self.blocks = blocks

  def devices_indices_map(self, shape):
    return {_Device(p): (slice(a, b),) for p, a, b in self.blocks}


def test_row_ranges_per_process_and_non_contiguous_blocks_are_refused():
  s = _Sharding([(0, 0, 4), (0, 4, 8), (1, 8, 12), (1, 12, 16)])
  assert distributed.row_ranges(s, 16) == {0: (0, 8), 1: (8, 16)}
  replicated = _Sharding([(0, 0, 16), (1, 0, 16)])
  assert distributed.row_ranges(replicated, 16) == {0: (0, 16), 1: (0, 16)}
  with pytest.raises(ValueError, match="not one contiguous block"):
    distributed.row_ranges(_Sharding([(0, 0, 4), (1, 4, 8), (0, 8, 12), (1, 12, 16)]), 16)


def test_overlapped_episodes_need_one_process_per_row():
  """Overlapped, the processes that hold a row would each step their own environment of it
  (answers at different times): refused, naming the processes and rows."""
  episode_refill.one_owner_each(_Sharding([(0, 0, 8), (1, 8, 16)]), 16)
  with pytest.raises(ValueError, match=r"processes 0 and 1 rows \[0, 16\) both"):
    episode_refill.one_owner_each(_Sharding([(0, 0, 16), (1, 0, 16)]), 16)
  with pytest.raises(ValueError, match=r"processes 1 and 2 rows \[8, 12\) both"):
    episode_refill.one_owner_each(_Sharding([(0, 0, 8), (1, 8, 12), (2, 8, 16)]), 16)


def test_answers_are_shared_with_their_lengths(monkeypatch):
  """On several processes an answer travels as its first env.observation_tokens tokens
  (here 3) and its length: one of 5 tokens comes back as its 3 and 2 pads (its episode
  then ends at the token limit without being appended), an ended episode's () as ()."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  runner = types.SimpleNamespace(
    cfg=types.SimpleNamespace(observation_tokens=3), sampler_cfg=types.SimpleNamespace(pad_id=0)
  )
  rows = types.SimpleNamespace(t_N=np.zeros(4), share=lambda: None, gather=lambda x: x)
  got = episode_refill._shared(runner, rows, {1: (7, 8), 2: (), 3: (4, 5, 6, 9, 9)})
  assert got == {1: (7, 8), 2: (), 3: (4, 5, 6, 0, 0)}


def test_one_process_helpers_are_identities():
  sh = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  x = np.arange(12.0).reshape(6, 2)
  assert distributed.local_rows(sh, 6) == slice(0, 6)
  g = distributed.to_global(x, sh, 6)
  np.testing.assert_array_equal(distributed.fetch_local(g), x)
  np.testing.assert_array_equal(distributed.host_value(g), x)
  a, b = distributed.host_values(g, jax.numpy.ones(3))
  np.testing.assert_array_equal(a, x)
  np.testing.assert_array_equal(b, np.ones(3))
  assert distributed.gather_rows(x, sh, 6) is x
  assert distributed.max_across(7) == 7 and distributed.sum_across(3) == 3
  assert distributed.from_primary(5) == 5
  assert distributed.is_primary()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _spawn(script: str, args: list[str], *, processes: int, **env_extra) -> None:
  """`processes` processes of `script` with `args` (and `env_extra` in their environment),
  joined on a free localhost port; each must exit 0.

  Several processes run on every core this test session could use (`subproc.CORES`), not
  on the one core of the xdist worker that starts them: their collectives wait on each
  other, and two processes on one core wait through the scheduler, a slice at a time.
  Quiet 2-core AMD EPYC, warm cache, one sitting (2026-12-07): the [16-1] run's two
  processes took 91.6 s (68 CPU-s, half of it in the kernel) on one core and 25.1 s
  (43 CPU-s) on two; the lockstep run's 38.2 s against 15.9 s. Beside a second worker
  (this module and test_episodes, `--dist loadfile`): 180 s and 336 CPU-s against
  207 s and 358 CPU-s."""
  env, port = subproc.child_env(**env_extra), _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, script, *args]
      + ["--processes", str(processes), "--process_id", str(i), "--port", str(port)]
      + (["--cores", ",".join(map(str, subproc.CORES))] if processes > 1 else []),
      env=env,
      cwd=ROOT,
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(processes)
  ]
  errors = [p.communicate(timeout=600)[1] for p in procs]
  for p, err in zip(procs, errors, strict=True):
    assert p.returncode == 0, err[-3000:]


def _launch(out, workdir, base, *, processes, devices, iterations):
  args = [str(out), str(workdir), "--base", str(base), "--devices", str(devices)]
  _spawn(SCRIPT, args + ["--iterations", str(iterations), "--mesh", "2,2,1"], processes=processes)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, mesh_warm_start):
  two, one = tmp_path_factory.mktemp("two"), tmp_path_factory.mktemp("one")
  _, base = mesh_warm_start  # Made once per session (conftest), shared with test_sharding.
  _launch(two, two / "work", base, processes=2, devices=2, iterations=1)
  _launch(two, two / "work", base, processes=2, devices=2, iterations=2)  # Resumes at 1.
  _launch(one, one / "work", base, processes=1, devices=4, iterations=2)
  load = lambda d, i: np.load(d / f"process{i}.npz")
  return {"p0": load(two, 0), "p1": load(two, 1), "single": load(one, 0), "two": two, "one": one}


def _params(npz):
  return {k: npz[k] for k in npz.files if k.startswith("param")}


def test_each_process_scored_its_own_rows(runs):
  assert int(runs["p0"]["processes"]) == 2 and int(runs["single"]["processes"]) == 1
  assert list(runs["p0"]["rows"]) == [0, 16] and list(runs["p1"]["rows"]) == [16, 32]
  assert list(runs["single"]["rows"]) == [0, 32]
  assert int(runs["p0"]["from_primary"]) == int(runs["p1"]["from_primary"]) == 10


def test_both_processes_end_with_identical_params(runs):
  p0, p1 = _params(runs["p0"]), _params(runs["p1"])
  assert len(p0) > 20
  for k in p0:
    np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)


def test_two_processes_match_one_process_with_resume_in_between(runs):
  """Tolerance: as test_sharding (cross-process all-reduces sum in another order)."""
  got, want = _params(runs["p0"]), _params(runs["single"])
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=0, atol=3e-4, err_msg=k)
    assert np.linalg.norm(got[k] - want[k]) <= 1e-2 * np.linalg.norm(want[k]), k
  m_got, m_want = (json.loads(str(runs[r]["metrics"])) for r in ("p0", "single"))
  assert [m["iteration"] for m in m_want] == [m["iteration"] for m in m_got] == [1, 2]
  assert max(m["grad_norm"] for m in m_want) > 0.1  # A real policy gradient.
  for got, want in zip(m_got, m_want, strict=True):
    for k, v in want.items():
      expect = pytest.approx(v, rel=1e-3, abs=1e-4) if isinstance(v, float) else v
      assert got[k] == expect, (want["iteration"], k)
  s_got, s_want = (json.loads(str(runs[r]["summary"])) for r in ("p0", "single"))
  for k in ("warmstart_accuracy", "final_accuracy", "iterations_done", "eval/pass@2"):
    assert s_got[k] == s_want[k], k


def test_only_the_primary_process_writes_the_logs(runs):
  lines = (runs["two"] / "work" / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(x)["iteration"] for x in lines] == [0, 1, 2]
  assert (runs["two"] / "work" / "summary.json").exists()


EPISODES = str(ROOT / "tests" / "multihost_episodes.py")
# What a CPU run with several devices, refill slots and a persistent cache needs (docs/episodes.md).
CPU_SCHEDULER_OFF = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def _launch_episodes(out, workdir, *, processes, devices, refill, iterations, overlap=0):
  args = [str(out), str(workdir), "--devices", str(devices), "--refill_slots", str(refill)]
  args += ["--iterations", str(iterations), "--overlap_steps", str(overlap)]
  args += ["--slow_ms", "200" if overlap else "0"]  # Process 1's answers come later.
  # Refill slots: without XLA:CPU's concurrency-optimized scheduler. With it, the refill
  # turn's program loaded from a warm persistent cache deadlocks on one CPU process with 4
  # devices (XLA:CPU's in-process all-gather: "Expected 4 threads to join the rendezvous,
  # but only 3 of them arrived") and aborts in gloo on two ("Received data size doesn't
  # match expected size"); compiled afresh it runs, and without the scheduler it runs
  # loaded too (2026-12-06, jax 0.10.2; CI's machine keeps its cache between runs).
  flags = f"{subproc.xla_flags()} {CPU_SCHEDULER_OFF}"
  env = {"XLA_FLAGS": flags} if refill else {}
  _spawn(EPISODES, args, processes=processes, **env)
  return [json.loads((out / f"process{i}.json").read_text()) for i in range(processes)]


@pytest.mark.parametrize("refill, iterations", [(0, 2), (16, 1)])
def test_episodes_on_two_processes_each_play_their_rows_and_match_one_process(
  tmp_path, refill, iterations
):
  """Calculator episodes (configs/calculator.py:tiny from its committed warm start, 8 × 8
  an iteration) on a (data 2, fsdp 2) mesh: two processes of 2 devices each make the
  environments of their own rows only, half of every batch, and the run's metrics are those
  of one process with 4 devices (floats to rel 1e-3: cross-process sums in another order;
  counts exactly). In lockstep turns for 2 iterations; and for 1 on pages through 16
  refill slots, the two processes with the tools overlapped (env.overlap_steps=4: they
  agree on the answers after every segment; the slots' table rows gathered across their
  devices; process 1's tool steps take 200 ms more, longer than a segment, so at times
  both processes poll while only its tools are stepping) against one process's refill turns: with draws keyed by episode and column the
  episodes are the same, and only the share of padded decode columns differs (another
  schedule of steps and appends)."""
  kw = dict(refill=refill, iterations=iterations)
  overlap = 4 if refill else 0
  two = _launch_episodes(
    tmp_path / "two", tmp_path / "two" / "work", processes=2, devices=2, overlap=overlap, **kw
  )
  (one,) = _launch_episodes(
    tmp_path / "one", tmp_path / "one" / "work", processes=1, devices=4, **kw
  )
  # The iterations' 64 episodes each and the held-out set's 16 greedy ones at the end (the
  # warm start's evaluation came with it), split between the processes, plus the one each
  # process's build makes to check config.env.kwargs.
  played = iterations * 64 + 16
  assert two[0]["envs"] == two[1]["envs"] == played // 2 + 1 and one["envs"] == played + 1
  got, want = two[0]["lines"], one["lines"]
  its = list(range(1, iterations + 1))
  assert [m["iteration"] for m in got] == [m["iteration"] for m in want] == its
  assert want[0]["episode/turns"] > 2 and want[0]["grad_norm"] > 0
  for g, w in zip(got, want, strict=True):
    assert g.keys() == w.keys()
    for k, v in w.items():
      if overlap and k == "pad/sample_frac":  # Overlap on: another schedule of steps.
        assert 0 < g[k] < 1 and g[k] != pytest.approx(v, rel=1e-3)
        continue
      expect = pytest.approx(v, rel=1e-3, abs=1e-4) if isinstance(v, float) else v
      assert g[k] == expect, (w["iteration"], k)
