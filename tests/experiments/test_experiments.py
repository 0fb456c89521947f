"""Smoke runs of the benchmark scripts in experiments/ (their figures are printed, not tested)."""

import json
import pathlib

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
import bench_overlap  # noqa: E402
import bench_sampler  # noqa: E402
import bench_shared_prefix  # noqa: E402
import subproc  # noqa: E402

from grpo_jax.models import sampling  # noqa: E402


def test_bench_overlap_reports_every_figure(monkeypatch):
  monkeypatch.chdir(pathlib.Path(__file__).resolve().parents[2])
  r = bench_overlap.main(
    ["--prompts", "4", "--repeats", "1", "--workers", "0", "--verifier_ms", "1"]
  )
  assert r["rows"] == 4 * 8
  for k in ("forward_s", "score_s", "sequential_s", "overlapped_s"):
    assert r[k] > 0
  # The sleeping verifier alone takes rows × 1 ms.
  assert r["score_s"] >= r["rows"] * 1e-3
  assert np.isfinite(r["hidden_frac"])


def test_bench_sampler_reports_its_figures():
  # Figures only (speed is the script's business, not a test's).
  r = bench_sampler.main(["--quick", "--no-hf", "--groups", "2", "--repeats", "1"])
  g = r["G2"]
  assert g["prefill_rows"] == r["workload"]["prompts"]  # Once per prompt, not per row.
  assert 0 < g["fraction_of_peak"] < 1
  for k in ("tokens_per_s", "compile_s", "ms_per_step", "matmul_floor_ms"):
    assert g[k] > 0, k
  rows = r["workload"]["prompts"] * 2
  assert g["matmul_floor_tokens_per_s"] == pytest.approx(rows / g["matmul_floor_ms"] * 1e3)


def test_bench_shared_prefix_reports_both_samplers():
  r = bench_shared_prefix.main(["--quick", "--rounds", "1"])
  assert r["rows"] == 16 and r["same_tokens_last_round"]  # A 2-layer model: no divergence.
  for k in ("temp_MB", "first_call_s", "median_s"):
    assert r[k]["copied"] > 0 and r[k]["shared"] > 0, k
  assert r["temp_MB"]["shared"] < r["temp_MB"]["copied"]  # The prompt's slots held once.


def test_bench_sharding_reports_every_mesh():
  # A subprocess: the script forces 8 host devices before jax starts (and runs its
  # single-device reference in a subprocess of its own).
  r = subproc.run([ROOT / "experiments" / "bench_sharding.py", "--quick"], timeout=300)
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert set(result["meshes"]) == {"1x1x1", "2x2x2"}
  assert result["single_device"]["devices"] == 1
  assert result["meshes"]["2x2x2"]["devices"] == 8
  for figures in [*result["meshes"].values(), result["single_device"]]:
    for k in ("sample_compile_s", "update_compile_s", "sample_s", "update_s"):
      assert figures[k] > 0, k
    assert figures["update_vs_single"] > 0


def test_bench_import_reports_its_figures(tmp_path):
  r = subproc.run(
    [ROOT / "experiments" / "bench_import.py", "--size=tiny", f"--hf_dir={tmp_path / 'ckpt'}"],
    timeout=300,
  )
  result = json.loads(r.stdout.strip().splitlines()[-1])
  assert result["params"] == 139_584  # The tiny Llama: 2 layers, d 64, vocab 512, untied.
  assert result["checkpoint_bytes"] == 2 * result["params"]  # bfloat16.
  assert result["import_seconds"] > 0 and result["peak_rss_bytes"] >= result["baseline_rss_bytes"]


def test_reliability_quick_reports_its_cycles():
  r = subproc.run([ROOT / "experiments" / "reliability.py", "--quick"], timeout=600)
  result = json.loads(r.stdout.strip().splitlines()[-1])
  # One cycle (--quick): the script's smoke test; tests/test_faults.py kills runs at chosen
  # moments (warm start, after an iteration, mid-save, SIGTERM) and checks each rerun exactly.
  assert result["cycles"] == 1 and result["kills"] == 1
  assert result["matched"] == 1, result  # A resumed run always reproduces the reference.


def test_bench_reward_hangs_reports_its_figures():
  r = subproc.run(
    [ROOT / "experiments" / "bench_reward_hangs.py", "--items=8", "--hangs=2", "--repeats=1"],
    timeout=300,
  )
  rows = json.loads(r.stdout.strip().splitlines()[-1])["rows"]
  assert [row["workers"] for row in rows] == [2, 4]
  assert all(row["hangs"] == 2 and row["wall_s"] > 0 and row["vs_ideal"] > 0 for row in rows)


def test_bench_rl_iteration_reports_every_phase_per_dtype():
  import bench_rl_iteration  # noqa: PLC0415

  r = bench_rl_iteration.main(["--quick", "--iterations", "2", "--dtypes", "float32,bfloat16"])
  for dtype in ("float32", "bfloat16"):
    d = r[dtype]
    for k in ("sample_s", "prepare_s", "update_s", "iteration_s", "matmul_peak_flops"):
      assert d[k] > 0, (dtype, k)
    assert 0 < d["mfu_update"] < 1 and 0 < d["mfu_iteration"] < 1
    assert 0 <= d["sample_pad_frac"] < 1 and 0 <= d["update_pad_frac"] < 1
    assert len(d["iterations"]) == 2
    assert d["memory_bandwidth_bytes_per_s"] > 0 and d["decode_roofline_tokens_per_s"] > 0
    assert d["decode_of_roofline"] == pytest.approx(
      d["sample_tokens_per_s"] / d["decode_roofline_tokens_per_s"]
    )
    # Every MFU is of the model FLOPs (the head where logits are used); XLA's own counts
    # are beside them, each phase with its loops' trip counts (the decode loop's: null).
    fl, peak = d["model_flops"], d["matmul_peak_flops"]
    assert d["mfu_flops"] == "model_flops" and set(fl) == {"sample", "logprobs", "update"}
    assert d["mfu_update"] == pytest.approx(fl["update"] / d["update_s"] / peak)
    assert d["mfu_iteration"] == pytest.approx(sum(fl.values()) / d["iteration_s"] / peak)
    xla = d["xla_flops"]
    assert None in xla["sample"]["while_trips"]
    # The update's dots: the model's count plus the scores its causal block computes past
    # the diagonal; the sampler's raw count holds one decode step, far below the model's.
    assert fl["update"] < xla["update"]["dots"] < 1.1 * fl["update"]
    assert 0 < xla["sample"]["cost_analysis"] < fl["sample"]


def test_bench_gpu_writes_one_line_per_figure(tmp_path):
  # The GPU script's parts (peaks, the trainer's iteration) run as subprocesses of its own;
  # --quick shrinks the shapes to CPU size. A budget spent skips the parts after it.
  import bench_gpu  # noqa: PLC0415

  out = tmp_path / "gpu.jsonl"
  records = bench_gpu.main(["--quick", "--sizes", "0.5b", "--no-hf", "--out", str(out)])
  assert [json.loads(x) for x in out.read_text().splitlines()] == records
  by = {(r["part"], r["figure"]): r for r in records}
  assert not [r for r in records if r["figure"] in ("failed", "skipped")], records
  for figure in ("sample_s", "update_s", "sample_tokens_per_s", "decode_roofline_tokens_per_s"):
    assert by[("jax:0.5b", figure)]["value"] > 0, figure
  for figure in ("mfu_update", "decode_of_roofline"):
    assert 0 < by[("jax:0.5b", figure)]["value"] < 1, figure
    assert by[("jax:0.5b", figure)]["target"] == bench_gpu.TARGETS[figure]
  context = by[("jax:0.5b", "context")]["value"]
  assert context["workload"] == dict(B=4, P=16, T=16, G=8) and context["remat"] in ("none", "full")
  assert context["shared_prefix"] and context["decode_segments"] == 1  # T = 16 < 2 × 32.
  # Shared prompt cache, one segment: (15 / 8 + 16) slots read a row over 16 + 8 filled.
  assert by[("jax:0.5b", "decode_slots_read_ratio")]["value"] == pytest.approx((15 / 8 + 16) / 24)
  assert by[("peaks", "matmul_peak_bfloat16")]["unit"] == "FLOP/s"
  spent = bench_gpu.main(["--quick", "--sizes", "0.5b", "--no-hf", "--budget_s", "0"])
  assert [r["figure"] for r in spent] == ["skipped", "skipped"]


def test_bench_gpu_counts_the_kv_slots_its_sampler_reads():
  import bench_gpu  # noqa: PLC0415

  make = lambda n, shared: sampling.SamplerConfig(
    max_new_tokens=1024, eos_ids=(1,), pad_id=0, group_size=8, decode_segments=n,
    shared_prefix=shared,
  )  # fmt: skip
  # P = 512: 511 prompt slots, T = 1024; filled slots at the mean step: 512 + 512 = 1024.
  assert bench_gpu.slots_read_ratio(make(1, False), P=512) == 1535 / 1024
  assert bench_gpu.slots_read_ratio(make(1, True), P=512) == (511 / 8 + 1024) / 1024
  # Four segments of 256 steps over 511 + 256, 512, 768 and 1024 slots: a mean of 1151.
  assert bench_gpu.slots_read_ratio(make(4, False), P=512) == 1151 / 1024
  assert bench_gpu.slots_read_ratio(make(4, True), P=512) == (511 / 8 + 640) / 1024


def test_mismatch_reports_the_sampler_trainer_gap_per_sampler_dtype():
  import mismatch  # noqa: PLC0415

  r = mismatch.main(["--quick"])
  f32, bf16 = r["sampler_float32"], r["sampler_bfloat16"]
  assert f32["mismatch_k3"] < 1e-6 and f32["max_abs_log_ratio"] < 1e-4  # CPU: same numerics.
  assert bf16["mismatch_k3"] > f32["mismatch_k3"] and bf16["max_abs_log_ratio"] > 1e-3
  assert bf16["ratio_p01"] <= bf16["ratio_p50"] <= bf16["ratio_p99"]


def test_bench_offpolicy_reports_every_mode():
  """Two host devices, in a fresh process: sync, overlapped shared and split."""
  r = subproc.run(
    [
      ROOT / "experiments" / "bench_offpolicy.py",
      "--iterations",
      "3",
      "--prompts",
      "4",
      "--d_model",
      "32",
      "--warmstart_steps",
      "0",  # The modes' figures need no warm start (its SFT step: one more compile per mesh).
    ],
    devices=2,
  )
  out = json.loads(r.stdout.strip().splitlines()[-1])
  for mode in ("sync", "async_shared", "async_split"):
    assert out[mode]["iteration_s"] > 0, mode
  assert out["async_split"]["reward_overlap_s"] >= 0
  assert out["speedup_async_split"] == pytest.approx(
    out["sync"]["iteration_s"] / out["async_split"]["iteration_s"]
  )


def test_lora_smollm2_applies_its_rule_seed_by_seed():
  """LoRA's gain must reach half of full's on every seed: 0.14 >= 0.27/2 holds, 0.10 <
  0.43/2 does not -> inconclusive; all three holding -> supports."""
  import lora_smollm2  # noqa: PLC0415

  def seeds(gains):
    return {
      "command": "c",
      "machine": "m",
      "seeds": {
        str(s): dict(
          before=0.3, after=0.3 + g, gain=g, evals=[[0, 0.3]], seconds_per_iteration=60.0
        )
        for s, g in enumerate(gains)
      },
    }

  full = seeds([0.27, 0.43, 0.20])
  r = lora_smollm2.compare(seeds([0.14, 0.10, 0.10]), full)
  assert [row["holds"] for row in r["rows"]] == [True, False, True]
  assert r["verdict"] == "inconclusive"
  assert lora_smollm2.compare(seeds([0.2, 0.3, 0.1]), full)["verdict"] == "supports"
  assert lora_smollm2.compare(seeds([0.0, 0.0, 0.0]), full)["verdict"] == "contradicts"
  assert "| 1 | lora | 30.0% | 40.0% | +10.0 |" in lora_smollm2.markdown(r)


def test_bench_reward_sources_writes_a_cost_per_part(tmp_path):
  import bench_reward_sources  # noqa: PLC0415

  out = tmp_path / "costs.jsonl"
  lines = bench_reward_sources.main(
    ["--quick", "--repeats", "1", "--skip_smollm2", "--out", str(out)]
  )
  assert [json.loads(x) for x in out.read_text().splitlines()] == lines
  by = {r["part"]: r for r in lines}
  assert 0 < by["rm_tiny"]["seconds_per_row"] < 1 and by["http_judge"]["unscorable"] == 0
  assert by["smollm2"]["skipped"] == "--skip_smollm2"


def test_calculator_seeds_judges_its_two_claims_by_their_rules():
  import calculator_seeds  # noqa: PLC0415

  # Gains 6..10: mean 8, sd 1.58, 95% CI 8 ± 2.776·1.58/√5 = [6.04, 9.96]: both hold.
  ok = calculator_seeds.judge([6.0, 8.0, 7.0, 9.0, 10.0])
  np.testing.assert_allclose(ok["gain_points"]["ci"], [6.0368, 9.9632], atol=1e-4)
  assert [c["verdict"] for c in ok["claims"].values()] == ["supports", "supports"]
  # Mean 6, CI [0.52, 11.48]: above 0, straddles 5, so B reports the seeds to decide.
  mixed = calculator_seeds.judge([1.0, 9.0, 4.0, 12.0, 4.0])
  assert mixed["claims"]["A"]["verdict"] == "supports"
  assert mixed["claims"]["B"] == dict(
    mixed["claims"]["B"], verdict="inconclusive", seeds_to_decide=155
  )
  assert mixed["seeds_reaching_5_points"] == 2
  lost = calculator_seeds.judge([-3.0, -1.0, -2.0, -4.0, -2.0])
  assert [c["verdict"] for c in lost["claims"].values()] == ["contradicts", "contradicts"]
  rows = [
    dict(seed=s, warmstart_accuracy=0.4, final_accuracy=0.4 + g / 100, gain_points=g, wall_s=1.0)
    for s, g in zip(range(5), [1.0, 9.0, 4.0, 12.0, 4.0], strict=True)
  ]
  md = calculator_seeds.markdown(rows, mixed)
  assert (
    "| 3 | 40.0% | 52.0% | +12.0 | 1 |" in md and "**inconclusive** (seeds to decide: 155)" in md
  )
  assert "second look" not in md
  assert "A sequential second look" in calculator_seeds.markdown(rows, mixed, sequential=True)


def test_bench_rl_iteration_recomputes_committed_sittings_from_their_own_seconds():
  import bench_rl_iteration  # noqa: PLC0415

  path = ROOT / "experiments" / "results" / "cpu" / "2026-11-28_xeon_iteration.jsonl"
  rows = bench_rl_iteration.main(["--recompute", str(path)])["recomputed"]
  assert [(r["sitting"], r["dtype"]) for r in rows][-2:] == [(5, "float32"), (5, "bfloat16")]
  # The anchor's update per row, P + T = 64 + 128 (×3 for the backward on both sides): the
  # recorded figures counted the head at all 192 positions, today's at the 128 that
  # predict completion tokens. P_body = 8·(2·512·512 + 2·512·256 + 3·512·1536), D·V =
  # 512·32768, attention 2·L·H·E·n(n+1) = 2·8·8·64·192·193.
  body, head, attention = 25_165_824, 16_777_216, 303_562_752
  ratio = (2 * body * 192 + 2 * head * 128 + attention) / (2 * (body + head) * 192 + attention)
  assert ratio == pytest.approx(0.8691, abs=1e-4)
  for r in rows:
    assert r["recomputed"]["mfu_update"] == pytest.approx(r["recorded"]["mfu_update"] * ratio)
    assert r["recomputed"]["mfu_iteration"] < r["recorded"]["mfu_iteration"]


def test_demo_seeds_summarises_by_hand_and_the_readme_quotes_its_committed_range():
  """experiments/demo_seeds.py: the range over seeds, by hand on two made-up seeds; the
  committed sitting's summary is its seeds' and the README's quickstart states it."""
  import demo_seeds  # noqa: PLC0415

  rows = [
    dict(seed=0, warmstart_accuracy=0.5, final_accuracy=0.75, gain_points=25.0, wall_s=100.0),
    dict(seed=1, warmstart_accuracy=0.625, final_accuracy=0.6875, gain_points=6.3, wall_s=90.0),
  ]
  s = demo_seeds.summarise(rows)
  assert s == {
    "warmstart_range": [0.5, 0.625], "final_range": [0.6875, 0.75],
    "gain_range_points": [6.3, 25.0], "wall_range_s": [90.0, 100.0],
  }  # fmt: skip
  record = dict(config="c", date="d", cpu="x", seeds=rows, summary=s)
  assert "Range: 50.0-62.5% after the warm start, 68.8-75.0% after GRPO, +6.3 to +25.0 points" in demo_seeds.markdown(record)  # fmt: skip
  readme = " ".join((ROOT / "README.md").read_text().split())  # Line breaks as spaces.
  for name in ("2026-12-04_xeon_demo_seeds", "2026-12-06_epyc_demo_seeds"):
    committed = json.loads((ROOT / f"experiments/results/cpu/{name}.json").read_text())
    assert committed["summary"] == demo_seeds.summarise(committed["seeds"])
    assert committed["claim"] is None and committed["verdict"] == "not judged"  # No rule.
    assert [r["seed"] for r in committed["seeds"]] == list(demo_seeds.SEEDS)
    g = committed["summary"]["gain_range_points"]
    assert f"{g[0]:+.1f} to {g[1]:+.1f} points over seeds 0-4" in readme, name


def test_the_smollm2_cpu_configs_measured_peak_is_within_its_own_memory_limit():
  """The committed whole-run measurement (experiments/smollm2_seeds.py, peak resident
  memory of the trainer process) of configs/smollm2.py:cpu as it is now: under the
  config's memory_limit_gib, with the micro-batches and checkpoints it was measured at."""
  from grpo_jax.infra import config_lib  # noqa: PLC0415

  record = json.loads((ROOT / "experiments/results/smollm2/cpu_memory.json").read_text())
  (seed,) = record["seeds"].values()
  c = config_lib.load(str(ROOT / "configs" / "smollm2.py") + ":cpu")
  assert seed["peak_rss_gib"] <= c.memory_limit_gib == 8.0
  assert (c.rl.micro_batches, c.keep_checkpoints, c.prompts_per_step) == (8, 1, 8)
  assert seed["iterations"] == c.iterations and "Intel Xeon" in record["machine"]


def test_ibpo_states_writes_its_result_and_judges_by_its_rule(tmp_path):
  """experiments/ibpo_states.py on one smoke seed (not a verdict seed): every estimator's
  share, the oracle's 100% and the leave-one-out mean's 0% by construction; the rule read
  by hand on made-up shares."""
  import ibpo_states  # noqa: PLC0415

  got = ibpo_states.main(["--seeds", "9", "--groups", "200", "--out", str(tmp_path)])
  (seed,) = got["per_seed"]
  assert seed["share"]["oracle"] == pytest.approx(1.0) and seed["share"]["leave_one_out"] == 0.0
  assert set(seed["share"]) == {n for n, _ in ibpo_states.ESTIMATORS} | {"oracle"}
  assert json.loads((tmp_path / "states.json").read_text())["rule"] == ibpo_states.RULE
  assert "**Verdict: inconclusive.**" in (tmp_path / "states.md").read_text()  # One seed.

  def seeds(*wins):
    return [{"share": {"span 2": 0.5 if w else 0.1, "prefix": 0.3}} for w in wins]

  assert ibpo_states.verdict(seeds(1, 1, 1, 1, 1))[0] == "supports"
  assert ibpo_states.verdict(seeds(1, 1, 1, 1, 0))[0] == "inconclusive"
  assert ibpo_states.verdict(seeds(1, 1, 0, 0, 0))[0] == "contradicts"
  # The committed verdict follows from its own per-seed shares.
  result = json.loads((ibpo_states.OUT / "states.json").read_text())
  assert [s["seed"] for s in result["per_seed"]] == [0, 1, 2, 3, 4]
  assert ibpo_states.verdict(result["per_seed"])[0] == result["verdict"] == "supports"
