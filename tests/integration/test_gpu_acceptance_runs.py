"""Issue 25: the GPU acceptance, without a GPU.

The plan fits today's device time (the decisive verdicts first, each command within its limit, the documented
plan is today's plan);
a run killed with SIGKILL leaves a report of the checks done so far; a check cut by the budget or its
timeout is "not run", never "pass" or "fail"; and every judge fails on a deliberately wrong result (an
honest check is one seen failing). The resume judge is also shown failing on a real wrong run on the CPU:
a checkpoint whose RNG state was swapped for another one, which accelerate restores without complaint.


Whole runs and launches; the in-process tests are in ../unit/test_gpu_acceptance.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, fit_small

from benchmarks.gpu_acceptance import command as S
from benchmarks.gpu_acceptance import plan as P
from benchmarks.gpu_acceptance import resume as RS
from benchmarks.gpu_acceptance import runner as R
from benchmarks.gpu_acceptance import speed as SP

REQUIRED = {"setup", "bf16-resume", "ddp", "throughput-bf16", "compile", "pytest", "fsdp", "device-batch", "sync-bn"}


@pytest.fixture(scope="module")
def plan() -> dict:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert S.main(["--plan", "--json", "--commit", "abc1234"]) == 0
    return json.loads(out.getvalue())


def test_plan_commands_fit_one_device_session(plan):
    commands = plan["commands"]
    assert all(c["timeout_s"] <= 570 for c in commands), [(c["name"], c["timeout_s"]) for c in commands]
    assert sum(c["timeout_s"] for c in commands) == plan["total_timeout_s"] <= 780
    assert commands[0]["timeout_s"] <= 480 and commands[0]["budget_s"] <= 450 and commands[1]["timeout_s"] <= 300
    names = [n for c in commands for n in c["checks"]]
    assert REQUIRED == set(names) and len(names) == len(set(names))  # every check once
    assert [c["name"] for c in plan["checks"]] == names + plan["later"]["checks"]
    timeouts = {c["name"]: c["timeout_s"] for c in plan["checks"]}
    expected = {c["name"]: c["expected_s"] for c in plan["checks"]}
    readme = (REPO / "docs" / "gpu" / "README.md").read_text()  # the documented plan is today's plan
    assert f"**{plan['total_timeout_s']}**" in readme
    for i, c in enumerate([*commands, plan["later"]], 1):
        # the checks' own timeouts fit the command's budget, and the budget leaves room for start-up and the report
        assert sum(timeouts[n] for n in c["checks"]) == c["budget_s"] < c["timeout_s"]
        shell = c["shell"]
        assert len(shell) < 2000  # the device tool's limit on one command line
        assert shell.startswith(plan["install"] + " && ")
        assert f"--only {','.join(c['checks'])} " in shell and f"--budget-s {c['budget_s']} " in shell
        assert f"--out $OUT/{c['name']} " in shell and shell.endswith("--commit abc1234")
        assert "PYTHONPATH=$PWD/.whl/site:$PWD " in shell
        cells = ", ".join(f"{n} ({expected[n]:.0f} / {timeouts[n]})" for n in c["checks"])
        row = f"| {i if c is not plan['later'] else 'later'} | `$OUT/{c['name']}` | {cells} | {c['expected_s']:.0f} |"
        assert f"{row} {c['budget_s']} | {c['timeout_s']} |" in readme, row
    assert len({c["name"] for c in [*commands, plan["later"]]}) == len(commands) + 1  # each its own report folder


def test_plan_carries_four_wheels_installed_without_dependencies(plan):
    assert [w.split("==")[0] for w in plan["wheels"]] == ["datasets", "evaluate", "dill", "multiprocess"]
    assert plan["download"].startswith("python3 -m pip download --no-deps --python-version 3.12 --only-binary=:all:")
    assert plan["download"].split(" -d .whl ")[1].split() == plan["wheels"]
    assert "--no-index --no-deps" in plan["install"] and "--target .whl/site .whl/*.whl" in plan["install"]
    assert plan["carry"] == [".whl"]
    assert "/.whl/" in (REPO / ".gitignore").read_text().splitlines()  # they travel only when carried
    if (REPO / ".git").exists():
        paths = [".whl/datasets-5.2.0-py3-none-any.whl", ".whl/site/datasets/__init__.py"]
        ignored = subprocess.run(["git", "check-ignore", *paths], cwd=REPO, capture_output=True, text=True)
        assert ignored.stdout.split() == paths


def test_plan_text_names_every_check_and_command(capsys):
    assert S.main(["--plan"]) == 0
    text = capsys.readouterr().out
    for name in REQUIRED:
        assert f"    {name}: " in text
    for flag in ("--no-tf32", "--mixed-precision fp16", "fsdp.yaml --num_processes 1", "--compile", "--sync-bn"):
        assert flag in text, flag
    assert "shared-gpu-rank" in text and "data-parallel" in text and "--max-device-batch auto" in text


def test_without_cuda_the_run_is_one_line_and_exit_2(tmp_path, capsys):
    assert S.main(["--only", "resume", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no CUDA GPU") and "--plan" in err[0]
    assert S.main(["--only", "nonsense"]) == 2
    assert "unknown check(s) nonsense" in capsys.readouterr().err


def _report(out: Path) -> dict | None:
    try:
        return json.loads((out / "acceptance.json").read_text())
    except (OSError, ValueError):
        return None


def test_a_killed_acceptance_leaves_a_report_of_the_checks_done_so_far(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_acceptance.py"), "--fake-checks", "--out", str(out),
           "--work", str(tmp_path / "work"), "--budget-s", "300"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sleeper = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            data = _report(out)
            if data and data["checks"][1]["status"] == R.INTERRUPTED and _sleeper(out):
                break  # fake-a is done, fake-b is running and its output is already in its log
            time.sleep(0.05)
        else:
            pytest.fail(f"the acceptance never reached fake-b: {proc.poll()} {proc.stderr.read()[-2000:]!r}")
        sleeper = _sleeper(out)
        proc.send_signal(signal.SIGKILL)  # nothing can be written after this
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        if sleeper:
            _kill(sleeper)
    data = _report(out)
    statuses = {c["name"]: c["status"] for c in data["checks"]}
    assert statuses == {"fake-a": "pass", "fake-b": "not run (interrupted)", "fake-c": "not run (not reached)"}
    assert data["counts"] == {"pass": 1, "fail": 0, "not run": 2} and data["environment"]["state"] == "running"
    md = (out / "acceptance.md").read_text()
    assert "| fake-b | not run (interrupted) |" in md and "1 passed, 0 failed, 2 not run" in md
    assert "a done" in _text(out / "fake-a.log")


def _sleeper(out: Path) -> int | None:
    """The pid fake-b printed once it started (its output is in its log while it runs), or None."""
    hit = re.search(r"^b started (\d+)$", _text(out / "fake-b.log"), re.M)
    return int(hit.group(1)) if hit else None


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_sigterm_stops_the_child_and_writes_the_report(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO / "scripts" / "gpu_acceptance.py"), "--fake-checks", "--out", str(out),
           "--work", str(tmp_path / "work")]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not _sleeper(out) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    sleeper = _sleeper(out)
    proc.send_signal(signal.SIGTERM)
    stdout, _ = proc.communicate(timeout=30)
    try:
        assert proc.returncode == 128 + signal.SIGTERM and "interrupted (SIGTERM)" in stdout
        with pytest.raises(ProcessLookupError):
            os.kill(sleeper, 0)  # the running check's child was stopped with it
    finally:
        _kill(sleeper)
    data = _report(out)
    assert data["environment"]["state"] == "interrupted by SIGTERM"
    assert [c["status"] for c in data["checks"]] == ["pass", "not run (interrupted)", "not run (not reached)"]


def _stop_resume_runs(root: Path, args: list[str]) -> Path:
    """Straight to 20, stopped at 7 then resumed; and the same stop resumed from a checkpoint whose RNG state was
    swapped for a valid other one (accelerate restores it without complaint)."""
    import torch

    from accel_train.checkpoint.safe_load import RNG_FILE, safe_torch_load

    mp = pytest.MonkeyPatch()
    try:
        for label, extra, run in (("straight", [], "straight"), ("stopped", ["--stop-at-step", "7"], "resumed")):
            mp.setenv("GPU_PROBE_RECORD", str(root / f"{label}.jsonl"))
            fit_small(root / run, *args, *extra)
        shutil.copytree(root / "resumed", root / "wrong")
        shutil.copy(root / "stopped.jsonl", root / "wrong_stopped.jsonl")
        rng_file = root / "wrong" / "checkpoints" / "step_00000007" / RNG_FILE.format(0)
        state = safe_torch_load(rng_file)
        state["torch_manual_seed"] = torch.Generator().manual_seed(1234).get_state()  # valid, and wrong
        torch.save(state, rng_file)
        for label in ("resumed", "wrong"):
            mp.setenv("GPU_PROBE_RECORD", str(root / f"{label}.jsonl"))
            fit_small(root / label, *args, "--resume", "auto")
    finally:
        mp.undo()
    return root


@pytest.fixture(scope="module")
def cpu_resume_runs(tmp_path_factory):
    """The resume check's runs on the CPU, where F.dropout draws from the CPU RNG."""
    args = [
        "--model",
        "benchmarks.gpu_acceptance.models:dropout_net",
        "--optimizer",
        "sgd",
        "--lr",
        "0.05",
        "--max-steps",
        "20",
    ]
    return _stop_resume_runs(tmp_path_factory.mktemp("cpu_resume"), args)


@pytest.fixture(scope="module")
def cpu_bf16_resume_runs(tmp_path_factory):
    """The bf16-resume check's runs on the CPU: bn_dropout_net in bf16 autocast with channels_last (on CUDA its
    default; asked for here), F.dropout on the CPU RNG."""
    args = [
        "--model",
        "benchmarks.gpu_acceptance.models:bn_dropout_net",
        "--synthetic-channels",
        "3",
        "--optimizer",
        "sgd",
    ]
    args += ["--lr", "0.05", "--max-steps", "20", "--mixed-precision", "bf16", "--channels-last"]
    return _stop_resume_runs(tmp_path_factory.mktemp("cpu_bf16_resume"), args)


def _cpu_measure(root: Path, run: str) -> dict:
    stopped = "wrong_stopped" if run == "wrong" else "stopped"
    records = [str(root / f"{label}.jsonl") for label in ("straight", stopped, run)]
    return RS.resume_measurements(root / "straight", root / run, "resumed from step 7", records, 7, 20)


def test_resume_measure_on_real_cpu_runs_passes_a_good_resume_and_fails_a_swapped_rng(cpu_resume_runs):
    good = _cpu_measure(cpu_resume_runs, "resumed")
    assert good["rng"]["cpu"] == {"advanced": True, "equal": True}  # F.dropout used the CPU RNG, and it came back
    assert good["data_order"]["batches"] == [20, 7, 13] and good["optimizer_tensors"] > 0
    assert RS.judge_resume(good)[0] == R.PASS, RS.judge_resume(good)
    wrong = _cpu_measure(cpu_resume_runs, "wrong")
    status, detail = RS.judge_resume(wrong)
    assert status == R.FAIL and "the cpu RNG state at the end differs" in detail and "weights differ" in detail
    assert wrong["data_order"]["max_rel_diff"] == 0.0  # the same batches: only the dropout masks changed


def _stop_resume_check(root: Path, stopped: str, resumed: str) -> R.Check:
    """A bf16-resume check over ``_stop_resume_runs``' folders (20 steps, stopped at 7)."""
    runs = (("straight", "straight", "straight"), ("stopped", stopped, resumed), ("resumed", resumed, resumed))
    steps = [
        R.Step(label, [], {"GPU_PROBE_RECORD": str(root / f"{rec}.jsonl")}, root / run) for label, rec, run in runs
    ]
    return R.Check("bf16-resume", "", "", 1, steps, RS.measure_bf16_resume, RS.judge_bf16_resume, expected_steps=20,
                   stop_at=7)  # fmt: skip


def test_bf16_resume_on_real_cpu_runs_is_bitwise_and_a_swapped_rng_fails(cpu_bf16_resume_runs):
    """bf16 autocast with channels_last keeps fp32 master weights: a stop and resume is bitwise equal to the straight
    run (BF16_RESUME_TOL is room for a GPU kernel's round-off, not for mistakes); a swapped RNG state fails."""
    said = {"resumed": R.StepOutput("resumed", 0, "accel_train: ... resumed from x at step 7", 1.0)}
    check = _stop_resume_check(cpu_bf16_resume_runs, "stopped", "resumed")
    good = check.measure(None, said, check)
    assert good["runs"]["resumed"]["mixed_precision"] == "bf16" and good["runs"]["resumed"]["channels_last"] is True
    assert good["weights_max_abs_diff"] == good["optimizer_max_abs_diff"] == 0.0
    assert good["rng"]["cpu"] == {"advanced": True, "equal": True}
    status, detail = RS.judge_bf16_resume(good)
    assert status == R.PASS and "bitwise equal" in detail, detail
    check = _stop_resume_check(cpu_bf16_resume_runs, "wrong_stopped", "wrong")
    wrong = check.measure(None, said, check)
    status, detail = RS.judge_bf16_resume(wrong)
    assert status == R.FAIL and "the cpu RNG state at the end differs" in detail, detail
    assert "weights differ" in detail and wrong["weights_max_abs_diff"] > 10 * RS.BF16_RESUME_TOL  # 0.04 here


def test_measures_read_real_run_folders_and_the_judges_reject_cpu_stand_ins(cpu_resume_runs, tmp_path, capsys):
    """Every check's measure on real run folders laid out where the check puts them (CPU runs standing in for
    the GPU ones), so a wrong file name or field shows here; each judge then fails for the stand-in's reason."""
    import torch

    ctx = R.Context(tmp_path / "work", tmp_path / "out", 1, 600)
    checks = {c.name: c for c in P.build_checks(ctx)}
    runs = {"straight": cpu_resume_runs / "straight", "resumed": cpu_resume_runs / "resumed"}
    layout = {
        "throughput": {row: "straight" for row in SP.THROUGHPUT_ROWS},
        "throughput-bf16": {"bf16": "straight"},
        "fsdp": {"straight": "straight", "resumed": "resumed"},
        "compile": {"eager": "straight", "straight": "straight", "resumed": "resumed"},
        "ddp": {"plain": "straight", "ddp": "resumed"},
        "sync-bn": {"one": "straight", "synced": "resumed", "unsynced": "straight"},
    }  # fmt: skip
    for check, steps in layout.items():
        for label, run in steps.items():
            shutil.copytree(runs[run], checks[check].step(label).out_dir)
    for name in ("throughput", "throughput-bf16"):
        gemm = Path(checks[name].step("gemm").argv[-1])
        gemm.write_text(json.dumps({"train_flops_per_sample": 1e6, "peak_bf16_tflops": 1.0}))
    said = {"resumed": R.StepOutput("resumed", 0, "accel_train: ... resumed from x at step 7", 1.0)}
    said |= {"ddp": R.StepOutput("ddp", 0, "no nccl here", 1.0), "synced": R.StepOutput("synced", 0, "", 1.0)}
    capsys.readouterr()
    fit_small(checks["device-batch"].step("auto").out_dir, "--max-device-batch", "auto", "--global-batch-size", "32",
              "--max-steps", "2")  # fmt: skip
    said["auto"] = R.StepOutput("auto", 0, capsys.readouterr().out, 1.0)
    expected = {
        "throughput": "expected 200", "throughput-bf16": "mixed_precision 'no', expected 'bf16'",
        "fsdp": "not FSDP at 1", "compile": "nothing was compiled",
        "ddp": "NCCL was not initialised", "sync-bn": "did not convert", "device-batch": "ran on 'cpu'",
    }  # fmt: skip
    for name, why in expected.items():
        m = checks[name].measure(ctx, said, checks[name])
        status, detail = checks[name].judge(m)
        assert status == R.FAIL and why in detail, (name, detail)
    assert checks["fsdp"].measure(ctx, said, checks["fsdp"])["merge_error"]  # no sharded checkpoint to merge
    m = checks["device-batch"].measure(ctx, said, checks["device-batch"])
    assert m["probed_micro_batch"] == m["micro_batch"] == 32 and m["accum_steps"] == 1
    assert torch.isfinite(torch.tensor(checks["ddp"].measure(ctx, said, checks["ddp"])["ddp_vs_plain"]))
