"""python -m benchmarks: the machinery and the report schema (never the timings).

Whole runs and launches; the in-process tests are in ../unit/test_speed_benchmark.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, check

from accel_train.doctor.launching import child_env
from benchmarks.speed.devices import precision_flags, tf32_mode
from benchmarks.speed.machine import measure_gemm_peak
from benchmarks.speed.portable import (
    _display_command,
    portable_command,
    setup_mismatch,
    write_wrapper,
)
from benchmarks.speed.setups import CUDA_SETUPS, SETUPS


def _benchmark(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """``python -m benchmarks ARGS`` from the repository root, as the README runs it."""
    cmd = [sys.executable, "-m", "benchmarks", *args]
    return subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=timeout)


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


RESULT_KEYS = {
    "model",
    "setup",
    "samples_per_s",
    "plain_samples_per_s",
    "ratio_vs_plain",
    "data_wait_fraction",
    "mfu",
    "peak_rss_mb",
    "step_breakdown_ms",
    "achieved_gflops",
    "command",
}


@pytest.mark.slow  # the whole harness, ~60 s on 2 cores; its parts have fast tests below
def test_smoke_run_writes_json_markdown_and_chart(tmp_path):
    out = tmp_path / "bench"
    check(_benchmark("--smoke", "--speedrun", "--out", str(out), timeout=400))
    report = json.loads((out / "benchmark.json").read_text())

    machine = report["machine"]
    for key in ("cores", "torch", "accelerate", "peak_gflops_fp32", "peak_gflops_bf16"):
        assert key in machine, key
    assert machine["cores"] >= 1 and machine["peak_gflops_fp32"] > 0 and machine["peak_gflops_bf16"] > 0

    [entry] = report["results"]
    assert RESULT_KEYS <= entry.keys()
    assert (entry["model"], entry["setup"]) == ("lenet", "cpu_fp32")
    assert "errors" not in entry, entry.get("errors")
    assert entry["samples_per_s"] > 0 and entry["plain_samples_per_s"] > 0
    assert entry["ratio_vs_plain"] == entry["samples_per_s"] / entry["plain_samples_per_s"]
    assert 0 <= entry["data_wait_fraction"] <= 1
    assert 0 < entry["mfu"] and entry["peak_rss_mb"] > 0
    assert set(entry["step_breakdown_ms"]) == {"data_wait", "forward_backward", "optimizer", "sync", "total"}
    assert entry["command"].startswith("python scripts/train.py --dataset synthetic --model lenet")
    assert entry["workload"] == "mnist" and entry["input_shape"] == [1, 28, 28]  # the CPU default is unchanged
    assert entry["peak_memory_mb"] is None and entry["plain_peak_memory_mb"] is None  # CPU: no CUDA memory
    assert entry["plain_log_every"] == 10 and entry["cuda_visible_devices"] is None
    assert set(machine["precision_flags"]) == {"matmul_allow_tf32", "cudnn_allow_tf32", "float32_matmul_precision"}

    assert "time_to_accuracy" in report and "skipped" in report["time_to_accuracy"]
    assert report["train_help_s"]["median_s"] > 0
    assert any(g["goal"].startswith("portable >=") for g in report["goals"])

    speedrun = report["speedrun"]  # --speedrun --smoke: the airbench recipe, 6 steps on synthetic data
    assert "error" not in speedrun, speedrun.get("error")
    assert speedrun["data"].startswith("synthetic") and speedrun["steps"] == 6 and speedrun["device"] == "cpu"
    assert speedrun["command"].startswith("python scripts/train.py --config configs/airbench_cifar10.yaml")
    assert [e["step"] for e in speedrun["evals"]] == [6] and speedrun["train_time_s"] > 0
    assert speedrun["evals"][-1]["train_time_s"] == pytest.approx(speedrun["train_time_s"])
    [goal] = [g for g in report["goals"] if g["goal"].startswith("airbench recipe")]
    assert goal["met"] is None and goal["value"] == speedrun["final_accuracy"]  # synthetic: not comparable

    md = (out / "benchmark.md").read_text()
    assert "| lenet | cpu_fp32 | 32 |" in md and "## Goals" in md
    assert "## CIFAR-10 time to 94%" in md and "| airbench ablation main3_scalebias" in md
    assert (out / "benchmark.png").read_bytes()[:8] == PNG_SIGNATURE


def test_unknown_model_is_a_one_line_error(tmp_path):
    proc = _benchmark("--quick", "--models", "alexnet", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown model 'alexnet'" in proc.stderr


def test_readme_without_markers_is_refused_before_measuring(tmp_path):
    (tmp_path / "R.md").write_text("# nothing to rewrite\n")
    proc = _benchmark("--smoke", "--readme", str(tmp_path / "R.md"), "--out", str(tmp_path / "o"), timeout=60)
    assert proc.returncode == 2 and "no '<!-- benchmark:begin" in proc.stderr and not (tmp_path / "o").exists()


def test_display_command():
    wrapper = Path("/tmp/accel_bench_x/train_with_memory.py")
    cmd = portable_command(SETUPS[2], "lenet", 32, 10, Path("/tmp/accel_bench_x/run"), wrapper, "quick")
    shown = _display_command(cmd)
    assert shown.startswith("accelerate launch --config_file accelerate_configs/multi_cpu.yaml scripts/train.py ")
    assert "--global-batch-size 32" in shown and "--output-dir OUT" in shown


CUDA_FP32 = CUDA_SETUPS[0]


def test_unknown_workload_is_a_one_line_error(tmp_path):
    proc = _benchmark("--workload", "imagenet", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2 and "invalid choice: 'imagenet'" in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]


def test_tf32_is_set_alike_and_recorded(tmp_path):
    before = precision_flags()
    for enabled in (True, False):
        with tf32_mode(enabled):
            flags = precision_flags()
            assert (flags["matmul_allow_tf32"], flags["cudnn_allow_tf32"]) == (enabled, enabled)
        assert precision_flags() == before
    peak = measure_gemm_peak(1, n=32, reps=1, tf32=True)
    assert (peak["precision_flags"]["matmul_allow_tf32"], peak["precision_flags"]["cudnn_allow_tf32"]) == (True, True)
    assert precision_flags() == before

    # the portable loop: the wrapper applies ACCEL_BENCH_TF32 before train.py runs and records the flags it ended with
    train = tmp_path / "fake_train.py"
    train.write_text(
        "import json, sys, torch\n"
        "flags = [torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32]\n"
        "open(sys.argv[1], 'w').write(json.dumps(flags))\n"
    )
    wrapper = write_wrapper(tmp_path, train=train)
    for value in ("1", "0"):
        mem = tmp_path / f"mem{value}"
        mem.mkdir()
        seen = tmp_path / f"seen{value}.json"
        env = child_env({"ACCEL_BENCH_MEM_DIR": str(mem), "ACCEL_BENCH_TF32": value})
        check(
            subprocess.run([sys.executable, str(wrapper), str(seen)], cwd=REPO, env=env, capture_output=True, text=True)
        )
        assert json.loads(seen.read_text()) == [value == "1"] * 2
        rank0 = json.loads((mem / "rank0.json").read_text())
        flags = rank0["precision_flags"]
        assert (flags["matmul_allow_tf32"], flags["cudnn_allow_tf32"]) == (value == "1", value == "1")
        assert setup_mismatch(CUDA_FP32, {"mixed_precision": "no", "world_size": 1}, [rank0], value == "1") == ""
        assert "TF32" in setup_mismatch(CUDA_FP32, {"mixed_precision": "no", "world_size": 1}, [rank0], value == "0")


def test_mnist_rows_against_pytorch_examples_appear(tmp_path, monkeypatch):
    """Time to accuracy on MNIST-format data, ours vs pytorch/examples' recipe, from real launches of both on tiny
    synthetic IDX files (the target 0: the row's plumbing, not its figures), into the goals and the report."""
    from accel_train.data import DataConfig, build_dataset
    from benchmarks.speed import mnist_rival
    from benchmarks.speed.goals import evaluate_goals
    from benchmarks.speed.report import _mnist_md
    from benchmarks.speed.time_to_accuracy import time_to_accuracy_portable

    monkeypatch.setitem(mnist_rival.SIZES, "quick", (256, 128))
    monkeypatch.setitem(mnist_rival.TARGETS, "quick", 0.0)
    row = mnist_rival.compare_mnist("quick", None, False, tmp_path, 1, lambda msg: None, time_to_accuracy_portable)
    ours, recipe, rival = row["ours"], row["recipe"], row["rival"]
    assert not any("error" in side for side in (ours, recipe, rival)), (ours, recipe, rival)
    assert ours["reached"] and ours["command"].startswith("python scripts/train.py --output-dir OUT")
    assert recipe["reached"] and recipe["command"].startswith("python scripts/train.py --config configs/mnist_speedrun")
    assert (ours["step"], recipe["step"]) == (8, 4)  # the first epoch end: 256 samples in batches of 32, of 64
    assert rival["reached"] and [e["epoch"] for e in rival["evals"]] == [1] and rival["epoch"] == 1
    assert row["speedup"] == rival["time_to_target_s"] / ours["time_to_target_s"] and row["synthetic"]
    assert row["recipe_speedup"] == rival["time_to_target_s"] / recipe["time_to_target_s"]
    splits = build_dataset(DataConfig(dataset="mnist", data_dir=str(tmp_path / "synthetic_mnist")))
    assert (len(splits.train), len(splits.test)) == (256, 128)  # what torchvision gave the rival, ours reads too
    goals = [g for g in evaluate_goals([], {"mnist_vs_examples": row}, {}) if "pytorch/examples" in g["goal"]]
    assert [g["value"] for g in goals] == [row["recipe_speedup"], row["speedup"]]
    assert all(g["met"] is None for g in goals)  # synthetic data at the quick target: measured, not judged
    md = "\n".join(_mnist_md(row, "avx2"))
    assert "| rival | yes |" in md and "| ours, speed-run recipe | yes |" in md and "| ours, defaults | yes |" in md


def test_plain_default_run_reports_its_work_and_phases(tmp_path):
    """The start-up floor, launched as the benchmark launches it: 352 steps, 8 evaluations, phases that add up."""
    from benchmarks.speed.startup import _one_plain_run

    run = _one_plain_run(tmp_path / "stamps.json")
    assert "error" not in run, run.get("error")
    assert (run["steps"], run["evals"]) == (352, 8) and run["eval_accuracy"] > 0.9
    phases = run["imports_s"] + run["setup_s"] + run["train_s"] + run["finish_s"]
    assert min(run["imports_s"], run["setup_s"], run["train_s"], run["finish_s"]) > 0
    assert phases == pytest.approx(run["process_wall_s"], abs=0.01)
