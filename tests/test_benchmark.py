"""python -m benchmarks: the machinery and the report schema (never the timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, check

from accel_train.launch import child_env
from benchmarks import bench


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


def test_smoke_run_writes_json_markdown_and_chart(tmp_path):
    out = tmp_path / "bench"
    check(_benchmark("--smoke", "--out", str(out), timeout=300))
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

    assert "time_to_accuracy" in report and "skipped" in report["time_to_accuracy"]
    assert report["train_help_s"]["median_s"] > 0
    assert any(g["goal"].startswith("portable >=") for g in report["goals"])

    md = (out / "benchmark.md").read_text()
    assert "| lenet | cpu_fp32 | 32 |" in md and "## Goals" in md
    assert (out / "benchmark.png").read_bytes()[:8] == PNG_SIGNATURE


def test_unknown_model_is_a_one_line_error(tmp_path):
    proc = _benchmark("--quick", "--models", "alexnet", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown model 'alexnet'" in proc.stderr


def _row(model: str, setup: str, sps: float, plain: float, **extra) -> dict:
    row = {
        "model": model,
        "setup": setup,
        "global_batch": 32,
        "samples_per_s": sps,
        "plain_samples_per_s": plain,
        "ratio_vs_plain": sps / plain,
        "data_wait_fraction": 0.01,
        "achieved_gflops": 10.0,
        "mfu": 0.1,
        "peak_rss_mb": 900.0,
        "best_window_samples_per_s": sps * 1.1,
        "ratio_vs_plain_best_window": 0.99,
        "step_breakdown_ms": {"data_wait": 0.1, "forward_backward": 8.0, "optimizer": 1.0, "sync": 0.0, "total": 9.1},
        "command": "python scripts/train.py",
    }
    row.update(extra)
    return row


def _fabricated_report() -> dict:
    results = [
        _row("resnet18", "cpu_fp32", 100.0, 101.0),
        _row("resnet18", "cpu_bf16", 80.0, 82.0, speedup_vs_cpu_fp32=0.8),
        _row(
            "resnet18",
            "gloo_2proc",
            70.0,
            75.0,
            speedup_vs_cpu_fp32=0.7,
            scalar_allreduce_ms=0.2,
            step_breakdown_ms={"data_wait": 0.1, "forward_backward": 8.0, "optimizer": 1.0, "sync": 3.0, "total": 12.1},
        ),
    ]
    variants = [
        {
            "name": n,
            "bf16": n.startswith("bf16"),
            "channels_last": "channels_last" in n,
            "fused": "fused" in n,
            "step_ms": ms,
            "forward_backward_ms": ms - 5,
            "optimizer_ms": 5.0,
            "speedup_vs_fp32": 300.0 / ms,
        }
        for n, ms in (
            ("fp32", 300.0),
            ("bf16", 350.0),
            ("fp32+channels_last", 280.0),
            ("bf16+channels_last", 330.0),
            ("fp32+fused_adam", 200.0),
            ("bf16+channels_last+fused_adam", 210.0),  # beats fp32, not fp32+fused_adam: no bf16 win
        )
    ]
    profile = {
        "forward_backward_ms": 10.0,
        "categories_ms": {"convolution": 6.0, "cast/copy": 2.0},
        "top_ops_ms": [["aten::convolution_backward", 4.0]],
    }
    t2a = {
        "caps": {},
        "digits": {
            "portable": {
                "reached": True,
                "time_to_target_s": 6.0,
                "step": 115,
                "epoch": 2,
                "best_accuracy": 0.975,
                "recipe": "defaults",
                "command": "python",
            },
            "seed000": {
                "reached": False,
                "best_accuracy": 0.95,
                "stopped": "cap of 40s",
                "epochs": [{"epoch": 1, "accuracy": 0.9, "time_s": 20.0}],
                "recipe": "PIL",
                "elapsed_s": 40.0,
            },
            "speedup": 40.0 / 6.0,
            "speedup_is_lower_bound": True,
        },
        "mnist": {"skipped": "no --data-dir given"},
    }
    help_timing = {"median_s": 0.1, "runs_s": [0.1]}
    return {
        "machine": {
            "cpu": "test cpu",
            "cores": 2,
            "threads": 2,
            "torch": "x",
            "accelerate": "y",
            "python": "3",
            "peak_gflops_fp32": 200.0,
            "peak_gflops_bf16": 100.0,
            "gemm_bf16_over_fp32": 0.5,
            "gemm_size": 2048,
            "avx512_bf16": True,
            "amx_bf16": False,
        },
        "settings": {"mode": "full", "repeats": 2, "warmup_steps_excluded": 5, "data": "synthetic"},
        "results": results,
        "goals": bench.evaluate_goals(results, t2a, help_timing),
        "bf16_study": [
            {
                "model": "resnet18",
                "batch": 16,
                "rounds": 1,
                "variants": variants,
                "profiles": {"fp32": profile, "bf16": profile},
            }
        ],
        "time_to_accuracy": t2a,
        "train_help_s": help_timing,
        "total_wall_s": 1.0,
    }


def test_goals_and_report_from_fabricated_numbers(tmp_path):
    report = _fabricated_report()
    goals = {g["goal"]: g for g in report["goals"]}
    ddp = next(g for name, g in goals.items() if name.startswith("2-process gloo"))
    assert ddp["value"] == 0.7 and ddp["met"] is False
    t2a = next(g for name, g in goals.items() if name.startswith("time to 97%"))
    assert t2a["met"] is True  # 6.7x even as a lower bound
    md = bench.render_markdown(report)
    for text in (
        "## 2 gloo processes",
        "gradient all-reduce ~3.0",
        "## bf16 on this CPU",
        "fp32+fused_adam",
        "no bf16 variant beats fp32 for resnet18",
        "| digits | **speedup** | | >= 6.7x |",
    ):
        assert text in md, text
    bench.write_chart(report, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == PNG_SIGNATURE


def test_window_rates_and_display_command():
    assert bench._window_rates([0.1] * 25, batch=32) == pytest.approx([320.0, 320.0])
    wrapper = Path("/tmp/accel_bench_x/train_with_memory.py")
    cmd = bench.portable_command(bench.SETUPS[2], "lenet", 32, 10, Path("/tmp/accel_bench_x/run"), wrapper, "quick")
    shown = bench._display_command(cmd)
    assert shown.startswith("accelerate launch --config_file accelerate_configs/multi_cpu.yaml scripts/train.py ")
    assert "--global-batch-size 32" in shown and "--output-dir OUT" in shown


def test_metrics_events_carry_seconds_since_the_run_started(tmp_path):
    from types import SimpleNamespace

    from accel_train.tracking import RunLogger

    logger = RunLogger(SimpleNamespace(is_main_process=True), tmp_path, 1, 0, progress=False, use_trackers=False)
    logger.event("eval", 5, 0, eval_accuracy=0.5)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["event"] == "eval" and record["eval_accuracy"] == 0.5
    assert 0 <= record["time_s"] < 60
