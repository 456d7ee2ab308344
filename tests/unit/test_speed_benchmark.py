"""python -m benchmarks: the machinery and the report schema (never the timings).

The in-process tests; whole runs and launches are in ../integration/test_speed_benchmark_runs.py.
"""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.speed import plain_server
from benchmarks.speed.devices import one_gpu_env, precision_flags, visible_devices
from benchmarks.speed.goals import _speedrun_goals, evaluate_goals
from benchmarks.speed.plain import PlainTrainer, _plain_measure, plain_throughput
from benchmarks.speed.plain_server import PlainServer, plain_command
from benchmarks.speed.portable import (
    _display_command,
    portable_command,
    portable_env,
    portable_summary_fields,
    setup_mismatch,
)
from benchmarks.speed.report import README_BEGIN, README_END, render_markdown, update_readme, write_chart
from benchmarks.speed.results import aggregate
from benchmarks.speed.run import _cells
from benchmarks.speed.setups import CUDA_SETUPS, MODELS, SETUPS, WINDOW_STEPS, BenchOptions, select_workload
from benchmarks.speed.speedrun import markdown as speedrun_markdown

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_speedrun_goal_counts_only_on_cifar10():
    result = {"data": "CIFAR-10", "final_accuracy": 0.9405, "steps": 648}
    [goal] = _speedrun_goals(result)
    assert goal["met"] is True and goal["threshold"] == 0.94 and "648 steps" in goal["goal"]
    assert _speedrun_goals({**result, "final_accuracy": 0.931})[0]["met"] is False
    assert _speedrun_goals({"skipped": "no GPU visible"}) == []
    assert "Not run: no GPU visible" in "\n".join(speedrun_markdown({"skipped": "no GPU visible"}))


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
        "goals": evaluate_goals(results, t2a, help_timing),
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
    md = render_markdown(report)
    for text in (
        "## 2 gloo processes",
        "gradient all-reduce ~3.0",
        "## bf16 on this CPU",
        "fp32+fused_adam",
        "no bf16 variant beats fp32 for resnet18",
        "| digits | **speedup** | | >= 6.7x |",
    ):
        assert text in md, text
    write_chart(report, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:8] == PNG_SIGNATURE


def test_readme_block_is_rewritten_from_the_report(tmp_path):
    report = _fabricated_report()
    report["settings"]["command"] = "python scripts/benchmark.py --repeats 1 --readme README.md"
    readme = tmp_path / "README.md"
    readme.write_text(f"# intro\n\n{README_BEGIN} old -->\nold numbers\n{README_END}\n\nprose after\n")
    update_readme(readme, report)
    text = readme.read_text()
    assert text.startswith("# intro\n\n") and text.endswith("\n\nprose after\n") and "old numbers" not in text
    block = text[text.index(README_BEGIN) : text.index(README_END)]
    assert "`python scripts/benchmark.py --repeats 1 --readme README.md`" in block
    assert "CPU kind `" in block and "| model | setup | batch |" in block and "| goal | measured |" in block
    assert all(f"| {r['model']} | {r['setup']} |" in block for r in report["results"])
    update_readme(readme, report)  # idempotent: the markers survive
    assert readme.read_text() == text
    page = tmp_path / "docs" / "performance.md"  # the link to the whole report is relative to the page
    page.parent.mkdir()
    page.write_text(f"{README_BEGIN} -->\n{README_END}\n")
    update_readme(page, report, tmp_path / "docs" / "benchmark")
    assert "[`docs/benchmark/`](benchmark/benchmark.md)" in page.read_text()
    readme.write_text("no markers\n")
    with pytest.raises(Exception, match="no '<!-- benchmark:begin"):
        update_readme(readme, report)


def test_metrics_events_carry_seconds_since_the_run_started(tmp_path):
    from types import SimpleNamespace

    from accel_train.tracking import RunLogger

    logger = RunLogger(
        SimpleNamespace(is_main_process=True), tmp_path / "metrics.jsonl", 1, 0, progress=False, use_trackers=False
    )
    logger.event("eval", 5, 0, eval_accuracy=0.5)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert record["event"] == "eval" and record["eval_accuracy"] == 0.5
    assert 0 <= record["time_s"] < 60


CUDA_FP32 = CUDA_SETUPS[0]


CPU_FP32, GLOO = SETUPS[0], SETUPS[2]


def test_cuda_selects_the_cifar_workload_and_cpu_keeps_mnist(tmp_path):
    from accel_train.errors import UserError

    assert select_workload("cuda").name == "cifar" and select_workload("cpu").name == "mnist"
    assert select_workload("cpu", "cifar").name == "cifar" and select_workload("cuda", "mnist").name == "mnist"
    with pytest.raises(UserError, match="unknown workload"):
        select_workload("cpu", "imagenet")

    opts = BenchOptions(out=tmp_path, quick=True)
    workload = opts.workload_for(CUDA_FP32)
    plan = opts.plan(CUDA_FP32, "resnet18")
    assert (workload.channels, workload.image_size, plan.batch) == (3, 32, 512)
    wrapper = tmp_path / "train_with_memory.py"
    cmd = portable_command(
        CUDA_FP32,
        "resnet18",
        plan.batch,
        opts.steps("resnet18", workload),
        tmp_path / "run",
        wrapper,
        "quick",
        workload,
    )
    shown = _display_command(cmd)
    assert shown.startswith(
        "python scripts/train.py --dataset synthetic --synthetic-channels 3 --synthetic-image-size 32 --model resnet18 "
    )
    assert "--global-batch-size 512" in shown
    plain = plain_command(CUDA_FP32, "resnet18", opts)
    assert (plain["channels"], plain["image_size"], plain["batch"], plain["device"]) == (3, 32, 512, "cuda")
    assert plain["tf32"] is True and plain["log_every"] == WINDOW_STEPS

    cells = _cells(opts, [CPU_FP32, CUDA_FP32])
    assert [m for s, m in cells if s is CUDA_FP32] == ["resnet18"]  # MNIST shapes at batch 16-32 say nothing on a GPU
    assert [m for s, m in cells if s is CPU_FP32] == list(MODELS)
    cpu_cmd = portable_command(CPU_FP32, "lenet", 32, 4, tmp_path / "run", wrapper, "quick")
    assert "--synthetic-channels" not in cpu_cmd
    cpu_plain = plain_command(CPU_FP32, "lenet", opts)
    assert (cpu_plain["channels"], cpu_plain["image_size"], cpu_plain["batch"], cpu_plain["tf32"]) == (1, 28, 32, None)

    forced = BenchOptions(out=tmp_path, quick=True, workload="cifar")  # --workload cifar: on CPU too
    assert plain_command(CPU_FP32, "resnet18", forced)["channels"] == 3
    assert [m for _, m in _cells(forced, [CPU_FP32])] == ["resnet18"]
    trainer = PlainTrainer("lenet", 4, 1, channels=3, image_size=32)
    assert tuple(trainer.images.shape[1:]) == (3, 32, 32)


def test_cuda_runs_are_pinned_to_one_gpu(tmp_path, monkeypatch):
    assert visible_devices(CUDA_FP32, {}) == "0"
    assert visible_devices(CUDA_FP32, {"CUDA_VISIBLE_DEVICES": "3,1"}) == "3"
    assert visible_devices(CUDA_FP32, {"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}) == "GPU-aa"
    assert visible_devices(CPU_FP32, {"CUDA_VISIBLE_DEVICES": "3,1"}) == ""
    assert visible_devices(GLOO, {}) == ""
    assert one_gpu_env({"CUDA_VISIBLE_DEVICES": "4,7"})["CUDA_VISIBLE_DEVICES"] == "4"  # time to accuracy
    no_gpu = one_gpu_env({"CUDA_VISIBLE_DEVICES": ""})  # a host without GPUs: left as it is
    assert no_gpu.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")

    opts = BenchOptions(out=tmp_path)
    env = portable_env(CUDA_FP32, opts, tmp_path, parent_env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert env["CUDA_VISIBLE_DEVICES"] == "2" and env["ACCEL_BENCH_TF32"] == "1"
    env = portable_env(CPU_FP32, opts, tmp_path, parent_env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "ACCEL_BENCH_TF32" not in env
    strict = BenchOptions(out=tmp_path, tf32=False)
    assert portable_env(CUDA_FP32, strict, tmp_path, parent_env={})["ACCEL_BENCH_TF32"] == "0"

    started = []  # the plain loop's server: the same single GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    monkeypatch.setattr(plain_server.subprocess, "Popen", lambda cmd, **kw: started.append(kw["env"]))
    server = PlainServer(CUDA_FP32, tmp_path, "t")
    server._log.close()
    assert started[0]["CUDA_VISIBLE_DEVICES"] == "5" and server.cuda_visible_devices == "5"

    summary = {"mixed_precision": "no", "world_size": 1, "data_parallel": True}
    assert "DataParallel" in setup_mismatch(CUDA_FP32, summary, [], True)
    assert setup_mismatch(CUDA_FP32, {**summary, "data_parallel": False}, [], True) == ""


def test_plain_loop_syncs_only_at_log_points():
    import torch

    # fused Adam: the default CPU Adam reads its CPU step counters with .item() (no device sync); fused
    # keeps every .item() of the loop visible here
    trainer = PlainTrainer("lenet", 8, 40, fused=True)
    phase_syncs = []
    trainer._sync = lambda: phase_syncs.append(1)  # torch.cuda.synchronize on CUDA
    items = []
    item = torch.Tensor.item

    def counting_item(self):
        items.append(1)
        return item(self)

    torch.Tensor.item = counting_item
    try:
        result = plain_throughput(trainer, steps=27, log_every=10, warmup=5)
    finally:
        torch.Tensor.item = item
    # global steps 6..32: the end of the warm-up, the log points 10, 20, 30 and the tail: 5 reads for 32 steps
    assert len(items) == trainer.host_syncs == 5
    assert phase_syncs == []
    assert len(result["window_samples_per_s"]) == 2 and result["samples_per_s"] > 0  # windows 10-20, 20-30
    assert result["log_every"] == 10


def test_plain_measure_records_precision_and_memory_on_cpu():
    result = _plain_measure({"model": "lenet", "batch": 8, "steps": 12, "device": "cpu"})
    assert result["peak_memory_mb"] is None and result["cuda_visible_devices"] is None
    assert result["host_syncs"] == 3  # warm-up end, step 10, tail (step 17)
    assert result["precision_flags"] == precision_flags()
    assert set(result["step_breakdown_ms"]) == {"data_wait", "forward_backward", "optimizer", "sync", "total"}
    assert result["samples_per_s"] > 0 and "host time" in result["breakdown_source"]


def test_peak_memory_per_run_and_the_gpu_report(tmp_path):
    assert portable_summary_fields({})["peak_memory_mb"] is None  # a trainer without the key
    assert portable_summary_fields({"peak_memory_mb": 812.5})["peak_memory_mb"] == 812.5

    opts = BenchOptions(out=tmp_path, quick=True)
    breakdown = {"data_wait": 0.1, "forward_backward": 8.0, "optimizer": 1.0, "sync": 0.0, "total": 9.1}
    flags = {"matmul_allow_tf32": True, "cudnn_allow_tf32": True, "float32_matmul_precision": "high"}

    def run(sps, mem, **extra):
        return {
            "samples_per_s": sps,
            "data_wait_fraction": 0.01,
            "step_breakdown_ms": breakdown,
            "peak_memory_mb": mem,
            "precision_flags": flags,
            "log_every": 10,
            **extra,
        }

    portable_extra = {
        "peak_rss_mb": 900.0,
        "peak_rss_mb_per_rank": [900.0],
        "threads_per_process": 2,
        "loadavg_1min": [0.1, 0.2],
        "command": "python scripts/train.py",
    }
    raw = {
        ("cuda_fp32", "resnet18"): {
            "plain": [run(5000.0, 1500.0)],
            "portable": [run(4900.0, 1700.0, cuda_visible_devices="0", **portable_extra)],
        },
        ("cpu_fp32", "resnet18"): {"plain": [run(60.0, None)], "portable": [run(62.0, None, **portable_extra)]},
    }
    machine = {"peak_gflops_fp32": 200.0, "peak_gflops_fp32_cuda": 400000.0}
    results = aggregate(raw, [CPU_FP32, CUDA_FP32], machine, opts)
    gpu, cpu = (next(r for r in results if r["setup"] == name) for name in ("cuda_fp32", "cpu_fp32"))
    assert (gpu["workload"], gpu["global_batch"], gpu["input_shape"]) == ("cifar", 512, [3, 32, 32])
    assert (gpu["peak_memory_mb"], gpu["plain_peak_memory_mb"], gpu["cuda_visible_devices"]) == (1700.0, 1500.0, "0")
    assert gpu["precision_flags"] == {"portable": flags, "plain": flags}
    assert "speedup_vs_cpu_fp32" not in gpu  # CIFAR on a GPU vs MNIST on a CPU: no ratio
    assert (cpu["peak_memory_mb"], cpu["plain_peak_memory_mb"], cpu["workload"]) == (None, None, "mnist")
    goals = evaluate_goals(results, None, {})
    assert any("1 GPU, cifar" in g["goal"] for g in goals)

    report = _fabricated_report()
    report["results"] = [
        _row("resnet18", "cuda_fp32", 4900.0, 5000.0, peak_memory_mb=1700.0, plain_peak_memory_mb=1500.0)
    ]
    report["machine"].update(
        cuda="Test GPU",
        cuda_tf32=True,
        cuda_precision_flags=flags,
        cuda_device_count=4,
        cuda_pinned_device="0",
        peak_gflops_fp32_cuda=400000.0,
        peak_gflops_bf16_cuda=800000.0,
    )
    md = render_markdown(report)
    for text in ("`CUDA_VISIBLE_DEVICES=0`", "TF32 **on**", "torch.backends.cudnn.allow_tf32=True", "1700/1500 |"):
        assert text in md, text


def test_issue_12_goals_default_run_and_bf16_by_cpu_kind():
    """The default-run goal and breakdown are reported; the bf16 goals apply to AMX CPUs only."""
    report = _fabricated_report()
    index = {(r["setup"], r["model"]): r for r in report["results"]}
    default_run = {
        "process_wall_s": 6.0,
        "before_fit_s": 3.0,
        "setup_s": 0.5,
        "train_s": 2.0,
        "finish_s": 0.5,
        "eval_accuracy": 0.98,
        "runs_s": [6.0],
        "command": "python scripts/train.py",
    }
    goals = {g["goal"]: g for g in evaluate_goals(report["results"], None, {}, default_run, "avx512_bf16")}
    wall = next(g for name, g in goals.items() if name.startswith("python scripts/train.py (defaults)"))
    assert wall["value"] == 6.0 and wall["met"] is False
    assert next(g for name, g in goals.items() if name.startswith("... with eval_accuracy"))["met"] is True
    if ("cpu_bf16", "resnet18") in index and ("cpu_fp32", "resnet18") in index:
        bf16 = [g for name, g in goals.items() if name.startswith("bf16")]
        assert bf16 and all(g["met"] is None and "AMX" in g["goal"] for g in bf16)  # not applicable here
        amx = [g for g in evaluate_goals(report["results"], None, {}, None, "amx") if g["goal"].startswith("bf16")]
        assert amx and all(g["met"] in (True, False) for g in amx)
    md = render_markdown({**report, "default_run": default_run})
    assert "## The default run, from process start" in md and "| 3.00 s | 0.50 s | 2.00 s | 0.50 s |" in md


def _startup_run(ratio: float) -> dict:
    """A default run measured beside the plain script doing its work, ``ratio`` times slower (median/median)."""
    plain = {
        "process_wall_s": 4.0,
        "imports_s": 1.5,
        "setup_s": 0.2,
        "train_s": 2.2,
        "finish_s": 0.1,
        "steps": 352,
        "evals": 8,
        "eval_accuracy": 0.98,
        "runs_s": [4.0, 4.1],
        "command": "python benchmarks/speed/plain_default_run.py",
    }
    ours = {"process_wall_s": 4.0 * ratio, "before_fit_s": 3.0, "setup_s": 0.5, "train_s": 2.0, "finish_s": 0.5}
    return {
        **ours,
        "eval_accuracy": 0.98,
        "runs_s": [4.0 * ratio, 4.1 * ratio],
        "command": "python scripts/train.py",
        "plain": plain,
        "ratio_vs_plain": ratio,
        "ratio_vs_plain_min": ratio * 0.98,
        "pair_ratios": [ratio, ratio],
    }


@pytest.mark.parametrize("ratio, met", [(1.2, True), (1.25, True), (1.58, False)])
def test_startup_goal_is_the_default_run_against_the_plain_script(ratio, met):
    """Issue 29: the default run <= 1.25x the plain script doing the same work, from process start."""
    report = _fabricated_report()
    run = _startup_run(ratio)
    goals = evaluate_goals(report["results"], None, {}, run, "avx2")
    [goal] = [g for g in goals if "the plain script doing the same work" in g["goal"]]
    assert goal["value"] == ratio and goal["threshold"] == 1.25 and goal["met"] is met
    assert goal["value_best_window"] == ratio * 0.98  # fastest/fastest
    md = render_markdown({**report, "machine": {**report["machine"], "cpu_bf16_kind": "avx2"}, "default_run": run})
    assert "### Against the plain script doing the same work (CPU kind `avx2`)" in md
    assert f"**Ratio {ratio:.2f}x**" in md and "| plain | 4.00 s | 1.50 s | 0.20 s | 2.20 s | 0.10 s |" in md
    without = {k: v for k, v in run.items() if k not in ("plain", "ratio_vs_plain")}  # a run with no plain side
    assert not [g for g in evaluate_goals(report["results"], None, {}, without) if "plain script" in g["goal"]]


def _mnist_row(speedup: float | None, synthetic: bool = False, target: float = 0.98) -> dict:
    """A row where the speed-run recipe reaches the target in 5 s (``speedup`` x faster than the rival) and the
    defaults in 10 s (half that speedup)."""
    recipe = {"reached": True, "time_to_target_s": 5.0, "step": 100, "epoch": 0, "best_accuracy": 0.985}
    ours = {**recipe, "time_to_target_s": 10.0, "step": 750, "epoch": 2}
    rival = {
        "reached": speedup is not None,
        "time_to_target_s": 5.0 * speedup if speedup else None,
        "epoch": 2,
        "best_accuracy": 0.981,
        "evals": [{"epoch": 1, "accuracy": 0.97, "time_s": 12.0}, {"epoch": 2, "accuracy": 0.981, "time_s": 20.0}],
        "stopped": "target reached" if speedup else "max epochs",
        "recipe": "pytorch/examples",
        "command": "python benchmarks/speed/examples_mnist.py",
    }
    return {
        "data": "synthetic" if synthetic else "MNIST",
        "synthetic": synthetic,
        "target_accuracy": target,
        "repeats": 2,
        "ours": {**ours, "runs_s": [10.0, 10.4], "command": "python scripts/train.py"},
        "recipe": {**recipe, "runs_s": [5.0, 5.2], "command": "python scripts/train.py --config configs/x.yaml"},
        "rival": {**rival, "runs_s": [rival["time_to_target_s"]] * 2},
        "ours_median_s": 10.0,
        "recipe_median_s": 5.0,
        "rival_median_s": rival["time_to_target_s"],
        "speedup": speedup / 2 if speedup else None,
        "pair_speedups": [speedup / 2] * 2 if speedup else [],
        "recipe_speedup": speedup,
        "recipe_pair_speedups": [speedup] * 2 if speedup else [],
        "caps": {},
    }


@pytest.mark.parametrize(
    "row, met",
    [
        (_mnist_row(5.0), True),
        (_mnist_row(2.5), False),  # the issue's outside measurement: 2.5x
        (_mnist_row(5.0, synthetic=True), None),  # synthetic data: measured, not judged
        (_mnist_row(5.0, target=0.9), None),  # the --quick target
    ],
)
def test_mnist_goal_is_4x_pytorch_examples_at_98_percent_on_mnist(row, met):
    """Issue 29: time to 98% on MNIST-format data >= 4x faster than pytorch/examples' recipe, from process start;
    judged on our speed-run recipe (configs/mnist_speedrun.yaml), the defaults reported beside it, never judged."""
    report = _fabricated_report()
    t2a = {**report["time_to_accuracy"], "mnist_vs_examples": row}
    recipe, defaults = [g for g in evaluate_goals(report["results"], t2a, {}) if "pytorch/examples" in g["goal"]]
    assert "configs/mnist_speedrun.yaml" in recipe["goal"] and "defaults" in defaults["goal"]
    assert recipe["value"] == row["recipe_speedup"] and recipe["threshold"] == 4.0 and recipe["met"] is met
    assert defaults["value"] == row["speedup"] and defaults["met"] is None and "not judged" in defaults["goal"]
    md = render_markdown({**report, "machine": {**report["machine"], "cpu_bf16_kind": "avx2"}, "time_to_accuracy": t2a})
    assert f"## Time to {row['target_accuracy']:.0%} on MNIST-format data, from process start" in md
    assert "(CPU kind `avx2`)" in md and "Rival per epoch: 1: 0.970 @ 12s" in md
    assert f"with its speed-run recipe (rival median / ours median): **{row['recipe_speedup']:.1f}x**" in md
    assert f"with its defaults (rival median / ours median): **{row['speedup']:.1f}x**" in md


def test_mnist_row_of_an_older_report_judges_the_defaults():
    """A report from before the speed-run recipe (no ``recipe`` side) still renders, its defaults judged."""
    row = {k: v for k, v in _mnist_row(5.0).items() if not k.startswith("recipe")}
    report = _fabricated_report()
    t2a = {**report["time_to_accuracy"], "mnist_vs_examples": row}
    [goal] = [g for g in evaluate_goals(report["results"], t2a, {}) if "pytorch/examples" in g["goal"]]
    assert goal["value"] == 2.5 and goal["met"] is False
    assert "| ours, defaults | yes |" in render_markdown({**report, "time_to_accuracy": t2a})


def test_mnist_row_without_a_rival_reaching_the_target_is_not_judged():
    report = _fabricated_report()
    t2a = {**report["time_to_accuracy"], "mnist_vs_examples": _mnist_row(None)}
    goals = [g for g in evaluate_goals(report["results"], t2a, {}) if "pytorch/examples" in g["goal"]]
    assert [g["value"] for g in goals] == [None, None] and all(g["met"] is None for g in goals)
    assert "- (a side did not reach the target)" in render_markdown({**report, "time_to_accuracy": t2a})


def test_plain_default_run_does_the_default_configs_work():
    """The start-up floor trains what ``python scripts/train.py`` trains: same epochs, batch, optimizer, LR,
    clipping, logging, evaluation batch, seed, and a LeNet of the same shape."""
    from accel_train.config import TrainConfig
    from accel_train.models.lenet import LeNet
    from benchmarks.speed import plain_default_run as plain

    cfg = TrainConfig()
    assert (cfg.dataset, cfg.model, cfg.optimizer, cfg.lr_schedule, cfg.warmup_steps) == (
        "digits",
        "lenet",
        "adam",
        "cosine",
        0,
    )
    assert (plain.EPOCHS, plain.BATCH, plain.LR, plain.MAX_GRAD_NORM, plain.LOG_EVERY, plain.SEED) == (
        cfg.epochs,
        cfg.batch_size,
        cfg.lr,
        cfg.max_grad_norm,
        cfg.log_every,
        cfg.seed,
    )
    assert plain.EVAL_BATCH == 2 * cfg.batch_size and cfg.eval_batch_size is None and cfg.eval_every == 0
    ours, theirs = LeNet(10, 1, 28), plain.lenet()
    assert [p.shape for p in ours.parameters()] == [p.shape for p in theirs.parameters()]


@pytest.mark.parametrize("portable_bf16, met", [(160.0, True), (150.0, False)])
def test_the_portable_keeps_the_plain_loops_bf16_gain_on_every_cpu_kind(portable_bf16, met):
    """Issue 29: the portable's bf16/fp32 gain >= 0.95x the plain loop's on the same model, judged on every CPU kind
    (it measures the loop, not the CPU): the plain loop gains 1.6x, so a portable gain of 1.5x keeps 0.94 of it."""
    fp32 = _row("lenet", "cpu_fp32", 100.0, 100.0)
    bf16 = _row("lenet", "cpu_bf16", portable_bf16, 160.0, speedup_vs_cpu_fp32=portable_bf16 / 100.0)
    bf16["plain_speedup_vs_cpu_fp32"] = 1.6
    for kind in ("amx", "avx512_bf16", "none"):
        [goal] = [g for g in evaluate_goals([fp32, bf16], None, {}, None, kind) if "bf16 gain" in g["goal"]]
        assert goal["value"] == pytest.approx(portable_bf16 / 160.0) and goal["met"] is met, goal
        assert "lenet" in goal["goal"] and kind in goal["goal"]
    no_plain = {**bf16, "plain_speedup_vs_cpu_fp32": None}
    assert not [g for g in evaluate_goals([fp32, no_plain], None, {}, None, "amx") if "bf16 gain" in g["goal"]]


def test_busy_threads_pairs_each_case_with_its_round_idle_run_and_clears_the_pins(monkeypatch):
    from benchmarks.speed.busy_threads import Case, _env, cases, summarise, table

    def run(case, rate, threads=2):
        return {"case": case, "samples_per_s": rate, "threads": threads, "threads_why": "x", "background_cores": 0.1}

    rounds = [
        [run("a, idle", 1000.0), run("b, idle", 2000.0), run("a, busy", 100.0)],
        [run("a, idle", 500.0), run("b, idle", 400.0), run("a, busy", 100.0, threads=1)],
    ]
    rows = summarise(rounds, "a, idle")
    assert [r["ratio_vs_idle"] for r in rows] == [1.0, 1.4, 0.15]  # the median of each round's ratio, paired
    assert [r["ratio_vs_best_idle"] for r in rows] == [0.75, 0.9, 0.125]  # busy: 100/2000 and 100/500
    assert rows[2]["samples_per_s"] == 100.0 and rows[2]["threads"] == [1, 2]
    assert "| a, busy | 100 | 0.15x | 0.12x | 1/2 | 0.1, 0.1 |" in table(rows)
    names = [c.name for c in cases(2)]
    assert names[0] == "--threads 2, idle" and {"default, idle", "default, busy", "--threads 1, busy"} <= set(names)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the suite's pins (conftest)
    monkeypatch.setenv("ACCEL_TRAIN_BUSY_CORES", "0")
    env = _env(Case("x", True, None))
    assert "ACCEL_TRAIN_BUSY_CORES" not in env and "OMP_WAIT_POLICY" not in env  # the case measures the real load
    assert _env(Case("x", True, 2, (("OMP_WAIT_POLICY", "PASSIVE"),)))["OMP_WAIT_POLICY"] == "PASSIVE"


def test_portable_runs_take_the_plain_loops_threads_whatever_the_load(tmp_path):
    from accel_train.cpu_load import BUSY_ENV

    assert portable_env(CPU_FP32, BenchOptions(out=tmp_path), tmp_path, parent_env={})[BUSY_ENV] == "0"
