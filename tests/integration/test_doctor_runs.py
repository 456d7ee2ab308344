"""accel_train.doctor: launch plans and traps of accelerate config files, on mocked machines; the plans of
the shipped and wizard-made configs against real launches (or, where they need GPUs or machines we lack,
against what accelerate's own ``launch_command`` starts); ``--smoke``.

Whole runs and launches; the in-process tests are in ../unit/test_doctor.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from checks import run_cli
from conftest import CONFIGS, REPO, check, run_script, summary
from helpers_doctor import MULTI_CPU_STYLE, finding, run_view, write

from accel_train.doctor import (
    Environment,
    diagnose_config,
)
from accel_train.doctor.smoke import TRAIN_ARGS, disagreements, observed


def test_script_exit_codes(tmp_path):
    script = REPO / "scripts" / "doctor.py"
    good = write(tmp_path, MULTI_CPU_STYLE, "good.yaml")
    bad = write(tmp_path, "distributed_type: NO\nnum_processes: 1\n", "bad.yaml")

    def run(*args):
        return subprocess.run(
            [sys.executable, str(script), *args], check=False, cwd=REPO, capture_output=True, text=True, timeout=120
        )

    ok = run("--config_file", str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "gloo DDP on CPU" in ok.stdout
    broken = run("--config_file", str(good), str(bad), "--json")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert json.loads(broken.stdout)["configs"][1]["findings"][0]["code"] == "unquoted-yaml-scalar"
    missing = run("--config_file", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ") and len(missing.stderr.strip().splitlines()) == 1
    assert "Traceback" not in missing.stderr


# what can launch on a CPU-only machine: config, `accelerate launch` flags, what the run must record
LAUNCHED = {
    "cpu": ("cpu.yaml", (), run_view(1, "NO", "cpu", "no")),
    "cpu_bf16": ("cpu_bf16.yaml", (), run_view(1, "NO", "cpu", "bf16")),
    "multi_cpu": ("multi_cpu.yaml", (), run_view(2, "MULTI_CPU", "cpu", "no")),
    "multi_cpu_bf16": ("multi_cpu_bf16.yaml", (), run_view(2, "MULTI_CPU", "cpu", "bf16")),
    "wizard_default": (None, (), run_view(1, "NO", "cpu", "no")),  # write_basic_config on this machine
    # MULTI_GPU without CUDA: torchrun ranks that train.py joins in a gloo group on CPU
    "multi_gpu_without_cuda": ("multi_gpu.yaml", ("--num_processes", "2"), run_view(2, "MULTI_CPU", "cpu", "no")),
}


@pytest.fixture(scope="module")
def smoke_multi_cpu(tmp_path_factory):
    """``scripts/doctor.py --config_file accelerate_configs/multi_cpu.yaml --smoke``: its output and run folder."""
    root = tmp_path_factory.mktemp("doctor_smoke")
    config = "accelerate_configs/multi_cpu.yaml"
    proc = run_script("doctor.py", "--config_file", config, "--smoke", "--smoke-dir", str(root))
    return proc, root / "multi_cpu"


@pytest.fixture(scope="module")
def wizard_default(tmp_path_factory) -> Path:
    """accelerate's own writer (what `accelerate config default` writes) on this machine."""
    from accelerate.utils import write_basic_config

    path = tmp_path_factory.mktemp("wizard") / "default_config.yaml"
    assert write_basic_config(mixed_precision="no", save_location=str(path))
    return path


@pytest.fixture(scope="module")
def launches(smoke_multi_cpu, wizard_default, launch_once):
    """``case -> (config, launch flags, what the run recorded, its stderr, its folder)``: one 2-step launch per
    case (``launch_once``: test_wizard_configs.py launches the same files with the same arguments)."""

    def launch(case: str) -> tuple:
        name, launch_args, _ = LAUNCHED[case]
        config = wizard_default if name is None else CONFIGS / name
        if case == "multi_cpu":  # the doctor's own smoke run
            out, stderr = smoke_multi_cpu[1], ""
        else:
            out, proc = launch_once(config, *TRAIN_ARGS, launch_args=launch_args)
            stderr = proc.stderr
        return config, launch_args, observed(out), stderr, out

    return launch


@pytest.mark.parametrize("case", LAUNCHED)
def test_plan_equals_what_a_real_launch_records(case, launches):
    """Also the test that every shipped CPU config trains under `accelerate launch` (2 steps, the recorded world
    size, device and precision), and that MULTI_GPU without CUDA trains as real gloo ranks, not rank-0 copies."""
    config, launch_args, seen, stderr, out = launches(case)
    diag = diagnose_config(config, Environment.detect(), launch_args=launch_args)
    assert diag.ok, diag.findings
    assert {**seen, "device": seen["device"].split(":")[0]} == LAUNCHED[case][2]  # the facts ("cpu:0" is rank 0's)
    assert not disagreements(diag.plan["run"], seen), (diag.plan["run"], seen)
    gloo = LAUNCHED[case][2]["world_size"] > 1
    assert (diag.plan["world_size"], diag.plan["backend"]) == (seen["world_size"], "gloo" if gloo else None)
    assert summary(out)["global_step"] == 2
    if case == "multi_gpu_without_cuda":
        assert finding(diag, "multi-gpu-without-gpu").level == "warning"
        assert "no CUDA device" in stderr  # the run says so too


def test_doctor_smoke_prints_plan_and_run_side_by_side(smoke_multi_cpu):
    proc, run_dir = smoke_multi_cpu
    check(proc)
    out = proc.stdout
    assert "smoke: accelerate launch --config_file accelerate_configs/multi_cpu.yaml scripts/train.py" in out
    assert "--max-steps 2" in out and f"run folder {run_dir}" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ") and line.split()}
    assert rows["world_size"] == ["2", "2"] and rows["distributed_type"] == ["MULTI_CPU", "MULTI_CPU"]
    assert rows["device"] == ["cpu", "cpu:0"] and rows["mixed_precision"] == ["no", "no"]
    assert "smoke verdict: matches the plan" in out and "verdict: OK" in out
    assert summary(run_dir)["global_step"] == 2


def test_smoke_reports_a_run_that_disagrees(tmp_path, monkeypatch, capsys):
    """A launch whose run records another world size: side by side, marked, and exit 1 (no process starts)."""
    from accel_train.cli import run_main
    from accel_train.commands.doctor import main
    from accel_train.doctor import smoke as smoke_module

    def fake_launch(cmd, **kw):
        out = Path(cmd[cmd.index("--output-dir") + 1])
        out.mkdir(parents=True)
        recorded = {**run_view(3, "MULTI_CPU", "cpu:0", "no"), "global_step": 2}
        (out / "summary.json").write_text(json.dumps(recorded))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(smoke_module.subprocess, "run", fake_launch)
    with pytest.raises(SystemExit) as info:
        run_main(main, ["--config_file", str(CONFIGS / "multi_cpu.yaml"), "--smoke", "--smoke-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert info.value.code == 1
    assert "world_size        2               3   <- differs" in out and "smoke verdict: DIFFERS" in out
    assert "[smoke-mismatch]" in out and "world_size 2 planned, 3 seen" in out


# ---- the doctor script's exit code -----------------------------------------------------------------------------------


def test_doctor_script_exit_code_for_fp8(tmp_path, capsys):
    from accel_train.commands.doctor import main

    path = tmp_path / "fp8.yaml"
    path.write_text("distributed_type: 'NO'\nmixed_precision: fp8\n")
    code, out, err = run_cli(capsys, main, ["--config_file", str(path)])
    assert code == 1 and "[fp8-unavailable]" in out and "Traceback" not in out + err  # 1: a broken config
