"""Issue 25: the GPU acceptance, without a GPU.

The plan fits today's device time (15 minutes a session: the first command within 480 s holds the decisive
verdicts in order, the second within 300 s, each within 570 s, all within 780 s; every timeout at least 1.3x the
check's expected seconds on an H100);
a run killed with SIGKILL leaves a report of the checks done so far; a check cut by the budget or its
timeout is "not run", never "pass" or "fail"; and every judge fails on a deliberately wrong result (an
honest check is one seen failing). The resume judge is also shown failing on a real wrong run on the CPU:
a checkpoint whose RNG state was swapped for another one, which accelerate restores without complaint.


The in-process tests; whole runs and launches are in ../integration/test_gpu_acceptance_runs.py.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_acceptance import command as S
from benchmarks.gpu_acceptance import environment as E
from benchmarks.gpu_acceptance import parallel as PA
from benchmarks.gpu_acceptance import plan as P
from benchmarks.gpu_acceptance import resume as RS
from benchmarks.gpu_acceptance import runner as R
from benchmarks.gpu_acceptance import sizing as Z
from benchmarks.gpu_acceptance import speed as SP
from benchmarks.gpu_acceptance.runs import tensor_diff


def test_every_check_has_a_timeout_and_the_default_budget_fits_one_command():
    ctx = R.Context(Path("work"), Path("out"), 1, 0)
    checks = P.build_checks(ctx)
    assert [c.name for c in checks] == list(P.CHECK_NAMES)
    assert all(0 < c.timeout_s <= 570 for c in checks)
    assert S.parse_args([]).budget_s < 570


DECISIVE = ["setup", "bf16-resume", "ddp", "throughput-bf16", "compile"]


def _plan() -> dict:
    return P.device_plan(R.Context(Path("work"), Path("out"), 1, 0), "abc1234")


def test_the_first_command_holds_the_decisive_verdicts_in_order_within_todays_device_time():
    """15 minutes of device time a session (the machine's start and the hand-back included), 10 a command: the first
    command answers setup, single-GPU bf16 train+resume, NCCL DDP, the bf16 throughput row and compile, in that
    order, whatever the rest gets."""
    plan = _plan()
    first, second = plan["commands"]
    assert first["checks"] == DECISIVE and first["timeout_s"] <= 480 and first["budget_s"] <= 450
    assert second["timeout_s"] <= 300
    assert all(c["timeout_s"] <= 570 for c in plan["commands"])
    assert plan["total_timeout_s"] == sum(c["timeout_s"] for c in plan["commands"]) <= 780
    assert plan["limits"]["device_session_s"] == 900 and plan["limits"]["total_s"] == 780
    assert plan["total_expected_s"] < plan["total_timeout_s"]
    assert all(len(c["checks"]) + 2 <= 8 for c in [*plan["commands"], plan["later"]])  # the tool brings back 8 files


def test_the_decisive_checks_run_what_they_are_named_for():
    checks = {c.name: c for c in P.build_checks(R.Context(Path("work"), Path("out"), 1, 0), DECISIVE)}
    resume = [" ".join(s.argv) for s in checks["bf16-resume"].steps]
    assert len(resume) == 3 and all("--mixed-precision bf16" in a for a in resume)
    assert not any("channels-last" in a for a in resume)  # the CUDA default for a CNN is what is checked
    assert "--stop-at-step 17" in resume[1] and "--resume auto" in resume[2]
    ddp = checks["ddp"].step("ddp")
    assert ddp.shell().count("multi_gpu.yaml --num_processes 1") == 1 and ddp.env["NCCL_DEBUG"] == "INFO"
    assert [s.label for s in checks["throughput-bf16"].steps] == ["gemm", "bf16"]
    assert sum("--compile" in s.argv for s in checks["compile"].steps) == 3


def test_every_timeout_is_at_least_1_3_times_the_checks_expected_seconds():
    """Each check is sized from what it starts (processes whose start-up was measured on the CPU, what a GPU adds)
    and its FLOPs; the plan says the expected seconds and keeps 30% beyond them, also for each command's own
    start-up (the install, the driver, the first command's cold disk)."""
    assert set(Z.TERMS) == set(P.CHECK_NAMES)
    for check in P.build_checks(R.Context(Path("work"), Path("out"), 1, 0)):
        assert check.timeout_s >= Z.MARGIN * Z.expected_s(check.name) > 0, check.name
    plan = _plan()
    expected = {c["name"]: c["expected_s"] for c in plan["checks"]}
    for i, cmd in enumerate([*plan["commands"], plan["later"]]):
        assert cmd["expected_s"] == pytest.approx(sum(expected[n] for n in cmd["checks"]), abs=0.2)
        assert cmd["timeout_s"] - cmd["budget_s"] >= Z.MARGIN * Z.command_overhead_s(first=i == 0)
    assert all(sum(t["s"] for t in c["expected"]) == pytest.approx(c["expected_s"], abs=0.2) for c in plan["checks"])


def test_every_check_is_in_a_command_or_the_plan_says_why_not():
    plan = _plan()
    planned = [n for c in plan["commands"] for n in c["checks"]]
    assert len(planned) == len(set(planned)) and not set(planned) & set(plan["not_in_plan"])
    assert set(planned) | set(plan["not_in_plan"]) == set(P.CHECK_NAMES)
    assert set(plan["later"]["checks"]) <= set(plan["not_in_plan"]) and plan["later"]["timeout_s"] <= 300
    assert all(len(why) > 40 for why in plan["not_in_plan"].values())
    assert planned + plan["later"]["checks"] + ["dp_ddp"] == list(P.CHECK_NAMES)  # CHECK_NAMES is the plan's order


def test_the_sizing_flops_are_the_flop_counters():
    from accel_train.trainer import WARMUP_STEPS_EXCLUDED
    from benchmarks.gpu_acceptance.probe import model_train_flops_per_sample

    for model, flops in Z.TRAIN_FLOPS.items():
        assert flops == pytest.approx(model_train_flops_per_sample(model), rel=0.01), model
    assert SP.TIMED_AFTER_STEPS == WARMUP_STEPS_EXCLUDED


def test_every_training_command_of_the_plan_parses(tmp_path):
    """A flag the training command does not know would fail on the device, after a machine was started for it."""
    from accel_train.config import parse_config

    ctx = R.Context(tmp_path / "work", tmp_path / "out", 1, 0)
    parsed = 0
    for check in P.build_checks(ctx):
        for step in check.steps:
            argv = [str(a) for a in step.argv]
            at = next((i for i, a in enumerate(argv) if a.endswith("scripts/train.py") or a == "shared-gpu-rank"), None)
            if at is not None:
                cfg = parse_config(argv[at + 1 :])
                assert Path(cfg.output_dir) == step.out_dir, (check.name, step.label)
                parsed += 1
    assert parsed >= 20


def _check(name: str, code: str, timeout: int = 30, judge=None, **kw) -> R.Check:
    judge = judge or (lambda m: (R.PASS, "fine"))
    return R.Check(name, name, "never", timeout, [R.Step("s", [sys.executable, "-c", code], **kw)],
                   lambda ctx, outputs, check: {"out": outputs["s"].output}, judge, min_s=1)  # fmt: skip


def test_a_cut_by_the_budget_or_a_timeout_is_not_run_never_fail_or_pass(tmp_path):
    # seconds a loaded machine keeps: a Python start there can take over 1 s (it had 1 s to print and 3 s in all)
    ctx = R.Context(tmp_path / "work", tmp_path / "out", 1, budget_s=8)
    checks = [
        _check("quick", "print('ok')"),
        _check("own-timeout", "import time; print('slow', flush=True); time.sleep(30)", timeout=3),
        _check("budget", "import time; time.sleep(30)"),
        _check("late", "print('never')"),
    ]
    results = R.run_all(checks, ctx, {"gpus": 1}, echo=lambda line: None)
    assert [r.status for r in results] == [R.PASS, R.TIMEOUT, R.BUDGET, R.BUDGET]
    assert "its 3 s timeout" in results[1].detail and "the total budget" in results[2].detail
    assert "slow" in (ctx.out / "own-timeout.log").read_text()  # what it printed before the kill
    assert R.exit_code(results) == 0 and R.counts(results) == {"pass": 1, "fail": 0, "not run": 3}
    data = json.loads((ctx.out / "acceptance.json").read_text())
    assert [c["status"] for c in data["checks"]] == [
        "pass",
        "not run (timeout)",
        "not run (budget)",
        "not run (budget)",
    ]
    assert data["environment"]["state"] == "finished"


def test_exits_refusals_and_unreadable_runs_become_results(tmp_path):
    ctx = R.Context(tmp_path / "work", tmp_path / "out", gpus=1, budget_s=600)
    deadline = time.monotonic() + 600
    failed = R.run_check(_check("f", "import sys; sys.exit('error: the disk is full')"), ctx, deadline)
    assert (failed.status, failed.detail) == (R.FAIL, "s exited 1: error: the disk is full")
    refused = _check("r", "import sys; sys.exit('RuntimeError: Duplicate GPU detected')", refusals=(r"Duplicate GPU",))
    result = R.run_check(refused, ctx, deadline)
    assert result.status == R.NOT_RUN and "torch refused it here: RuntimeError: Duplicate GPU" in result.detail

    def broken(m):
        raise FileNotFoundError("summary.json")

    assert "could not judge" in R.run_check(_check("b", "print(1)", judge=broken), ctx, deadline).detail
    two = R.run_check(R.Check("two", "t", "", 30, [], None, None, min_gpus=2), ctx, deadline)
    assert (two.status, two.detail) == (R.NOT_RUN, "needs 2 GPUs; this machine has 1")


def test_the_report_never_counts_a_check_that_did_not_run_as_passed(tmp_path):
    runs = {"fp32": {"samples_per_s": 12345.6, "mfu": 0.123, "peak_memory_mb": 2048.0}}
    results = [
        R.CheckResult("pytest", R.PASS, duration_s=61.0),
        R.CheckResult("throughput", R.PASS, duration_s=90.0, metrics={"runs": runs}),
        R.CheckResult("fsdp", R.FAIL, detail="resumed exited 1: boom | pipe"),
        R.CheckResult("dp", R.NOT_RUN, detail="torch refused DataParallel(device_ids=[0, 0]): ValueError: x"),
        R.CheckResult("compile", R.BUDGET, detail="cut"),
    ]
    R.write_report(results, {"device": "NVIDIA H100 80GB HBM3", "gpus": 1, "state": "finished"}, tmp_path)
    data = json.loads((tmp_path / "acceptance.json").read_text())
    assert data["counts"] == {"pass": 2, "fail": 1, "not run": 2}
    md = (tmp_path / "acceptance.md").read_text()
    assert "**One GPU.**" in md and "not exercised" in md  # the headline says what one GPU cannot show
    assert "| dp | not run |" in md and "| compile | not run (budget) |" in md and "boom \\| pipe" in md
    assert "| fp32 | 12,346 |" in md and "2 passed, 1 failed, 2 not run" in md
    assert R.exit_code(results) == 1 and R.exit_code([results[0], results[3], results[4]]) == 0


def _wrong(good: dict, **changes) -> dict:
    """``good`` with nested changes: ``runs__fp16__loss_scale=None`` sets good["runs"]["fp16"]["loss_scale"]."""
    bad = copy.deepcopy(good)
    for path, value in changes.items():
        *parents, key = path.split("__")
        target = bad
        for p in parents:
            target = target[p]
        target[key] = value
    return bad


def _run(steps: int, **kw) -> dict:
    return {"global_step": steps, "eval_loss": 2.1, "device": "cuda:0", "mixed_precision": "no", **kw}


def _judged(judge, good: dict, wrongs: dict[str, dict]) -> None:
    status, detail = judge(good)
    assert status == R.PASS, detail
    for why, bad in wrongs.items():
        status, detail = judge(bad)
        assert status == R.FAIL, (why, detail)


def test_setup_judge_fails_when_a_wheel_does_not_import_or_no_gpu():
    good = {"seconds": {"torch": 3.0, "evaluate": 2.0}, "errors": {}, "metric_accuracy": 2 / 3,
            "transformers_imported_by_evaluate": True, "cuda": {"available": True, "device": "H100"}}  # fmt: skip
    _judged(E.judge_setup, good, {
        "datasets missing": _wrong(good, errors={"datasets": "ModuleNotFoundError: No module named 'datasets'"}),
        "no GPU": _wrong(good, cuda={"available": False}),
        "metric wrong": _wrong(good, metric_accuracy=1.0),
    })  # fmt: skip


def test_pytest_judge_fails_on_failures_and_on_nothing_passed_even_when_killed():
    done = "tests/test_gpu.py::a PASSED [ 50%]\ntests/test_gpu.py::b PASSED [100%]\n"
    done += "==== 2 passed, 600 deselected in 9.1s ===="
    good = E.pytest_counts(done, 0)
    assert (good["passed"], good["deselected"], good["finished"]) == (2, 600, True)
    failed = "FAILED tests/test_gpu.py::b - assert 0\n==== 1 failed, 1 passed in 9.1s ===="
    skipped = "==== 3 skipped, 600 deselected in 2.0s ===="
    killed = "[gw0] [ 50%] PASSED tests/test_gpu.py::a \n[gw1] [ 60%] FAILED tests/test_gpu.py::b \n"
    partial = E.pytest_counts(killed, None)
    assert (partial["passed"], partial["failed"], partial["finished"]) == (1, 1, False)
    _judged(E.judge_pytest, good, {
        "a test failed": E.pytest_counts(failed, 1),
        "everything skipped": E.pytest_counts(skipped, 0),
        "exit code": {**good, "returncode": 3},
        "killed half-way": partial,
    })  # fmt: skip


def _throughput_good() -> dict:
    rows = {
        "fp32": _run(200, tf32=False, samples_per_s=9000.0, loss_scale=None),
        "tf32": _run(200, tf32=True, samples_per_s=15000.0, loss_scale=None),
        "bf16": _run(200, mixed_precision="bf16", tf32=True, samples_per_s=30000.0, loss_scale=None),
        "fp16": _run(200, mixed_precision="fp16", tf32=True, samples_per_s=29000.0, loss_scale=32768.0,
                     fp16_skipped_steps=2),
    }  # fmt: skip
    return SP.throughput_metrics({"train_flops_per_sample": 1.7e9, "peak_bf16_tflops": 790.0}, rows, 200)


def test_throughput_judge_needs_true_fp32_separate_tf32_and_a_real_fp16_loss_scale():
    good = _throughput_good()
    assert good["speedup_vs_fp32"]["bf16"] == pytest.approx(3.333, abs=1e-3)
    assert good["speedup_vs_tf32"]["bf16"] == 2.0 and good["runs"]["bf16"]["mfu"] > 0
    wrongs = {
        "fp32 was TF32": _wrong(good, runs__fp32__tf32=True),
        "no tf32 row": {**good, "runs": {k: v for k, v in good["runs"].items() if k != "tf32"}},
        "fp16 without a scale": _wrong(good, runs__fp16__loss_scale=None),
        "fp16 scale not a GradScaler's": _wrong(good, runs__fp16__loss_scale=1000.0),
        "fp16 ran as bf16": _wrong(good, runs__fp16__mixed_precision="bf16"),
        "fp16 skipped most steps": _wrong(good, runs__fp16__fp16_skipped_steps=150),
        "skips not counted": _wrong(good, runs__fp16__fp16_skipped_steps=None),
        "bf16 on the CPU": _wrong(good, runs__bf16__device="cpu"),
        "NaN loss": _wrong(good, runs__tf32__eval_loss=math.nan),
        "short run": _wrong(good, runs__bf16__global_step=150),
    }
    _judged(SP.judge_throughput, good, wrongs)


def _throughput_bf16_good() -> dict:
    row = _run(200, mixed_precision="bf16", tf32=True, channels_last=True, samples_per_s=30000.0, loss_scale=None,
               peak_memory_mb=2048.0)  # fmt: skip
    return SP.throughput_metrics({"train_flops_per_sample": 3.33e9, "peak_bf16_tflops": 790.0}, {"bf16": row}, 200)


def test_throughput_bf16_judge_needs_a_whole_bf16_row_in_channels_last_and_the_gemm_peak():
    good = _throughput_bf16_good()
    assert good["runs"]["bf16"]["mfu"] == pytest.approx(3.33e9 * 30000 / 790e12, abs=1e-4)
    status, detail = SP.judge_throughput_bf16(good)
    assert status == R.PASS and "30,000 samples/s, MFU 12.7%" in detail and "2,048 MB" in detail
    _judged(SP.judge_throughput_bf16, good, {
        "ran as fp16": _wrong(good, runs__bf16__mixed_precision="fp16"),
        "NCHW": _wrong(good, runs__bf16__channels_last=False),
        "no row": {**good, "runs": {}},
        "no peak": _wrong(good, peak_bf16_tflops=None),
        "no samples/s": _wrong(good, runs__bf16__samples_per_s=None),
        "short": _wrong(good, runs__bf16__global_step=120),
        "on the CPU": _wrong(good, runs__bf16__device="cpu"),
    })  # fmt: skip


def _resume_good() -> dict:
    return {
        "device": "cuda:0", "global_steps": [40, 40], "expected_steps": 40, "stop_at": 17,
        "weights_max_abs_diff": 0.0, "optimizer_max_abs_diff": 0.0, "checkpoint_steps": [40, 40],
        "rng": {"cpu": {"advanced": False, "equal": True}, "cuda": {"advanced": True, "equal": True}},
        "data_order": {"batches": [40, 17, 23], "max_rel_diff": 0.0}, "resume_reported": True, "restore_errors": [],
    }  # fmt: skip


def test_resume_judge_fails_on_weights_optimizer_order_and_an_rng_nothing_used():
    good = _resume_good()
    _judged(RS.judge_resume, good, {
        "weights": _wrong(good, weights_max_abs_diff=3e-3),
        "optimizer": _wrong(good, optimizer_max_abs_diff=1e-3),
        "order": _wrong(good, data_order__max_rel_diff=0.02),
        "missing batches": _wrong(good, data_order={"batches": [40, 17, 20], "max_rel_diff": math.inf}),
        "CUDA RNG not restored": _wrong(good, rng__cuda__equal=False),
        "nothing used the CUDA RNG": _wrong(good, rng__cuda__advanced=False),
        "no CUDA RNG saved": _wrong(good, rng={"cpu": {"advanced": True, "equal": True}}),
        "restore error": _wrong(good, restore_errors=["rank 0's random state is not restored (x)"]),
        "silent fresh start": _wrong(good, resume_reported=False),
        "short": _wrong(good, global_steps=[40, 39]),
    })  # fmt: skip


def test_bf16_resume_judge_needs_bf16_in_channels_last_and_near_bitwise_weights():
    bf16 = _run(40, mixed_precision="bf16", channels_last=True)
    good = {**_resume_good(), "runs": {"straight": bf16, "resumed": dict(bf16)}}
    assert RS.judge_bf16_resume(good) == (R.PASS, RS.judge_bf16_resume(good)[1])
    assert "bitwise equal" in RS.judge_bf16_resume(good)[1]
    assert RS.judge_bf16_resume(_wrong(good, weights_max_abs_diff=5e-5))[0] == R.PASS  # round-off, far below a mistake
    _judged(RS.judge_bf16_resume, good, {
        "fp32": _wrong(good, runs__straight__mixed_precision="no"),
        "NCHW": _wrong(good, runs__resumed__channels_last=False),
        "weights (a wrong RNG state moved them 8.6e-4 on the CPU)": _wrong(good, weights_max_abs_diff=8.6e-4),
        "momentum lost": _wrong(good, optimizer_max_abs_diff=7e-2),
        "CUDA RNG not restored": _wrong(good, rng__cuda__equal=False),
        "order": _wrong(good, data_order__max_rel_diff=0.02),
        "silent fresh start": _wrong(good, resume_reported=False),
    })  # fmt: skip


def _fsdp_good() -> dict:
    run = _run(12, distributed_type="FSDP", world_size=1)
    return {"straight": run, "resumed": dict(run), "expected_steps": 12, "resume_reported": True,
            "resumed_vs_straight": 2e-6, "export_vs_checkpoint": 0.0, "checkpoint_step": 12,
            "keys_vs_model": []}  # fmt: skip


def test_fsdp_judge_fails_on_a_diverged_resume_a_stale_export_and_wrong_keys():
    good = _fsdp_good()
    _judged(RS.judge_fsdp, good, {
        "resume diverged": _wrong(good, resumed_vs_straight=4e-3),
        "export is not the checkpoint": _wrong(good, export_vs_checkpoint=1e-3),
        "checkpoint unreadable": _wrong(good, export_vs_checkpoint=math.inf, merge_error="ValueError: x"),
        "a shard exported": _wrong(good, keys_vs_model=["fc.weight: (5, 512) torch.float32"]),
        "not FSDP": _wrong(good, resumed__distributed_type="NO"),
        "no resume": _wrong(good, resume_reported=False),
    })  # fmt: skip


def test_fsdp_export_is_compared_with_the_sharded_checkpoint_read_on_the_cpu(tmp_path):
    """A torch distributed checkpoint as FSDP writes it ({"model": ...} in pytorch_model_fsdp_0/), merged without
    a process group; an export that is not the checkpoint (one tensor off by 1e-3) is caught."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    from benchmarks.gpu_acceptance.models import bn_net

    model = bn_net().state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": model}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "pytorch_model_fsdp_0")),
                 no_dist=True)  # fmt: skip
    merged = RS.merged_fsdp_weights(tmp_path)
    assert tensor_diff(merged, model) == 0.0 and not RS.keys_vs_model(
        merged, "benchmarks.gpu_acceptance.models:bn_net", 3, 32
    )
    stale = {k: v.clone() for k, v in model.items()}
    stale["fc.weight"] += 1e-3
    good = _fsdp_good()
    assert RS.judge_fsdp({**good, "export_vs_checkpoint": tensor_diff(stale, merged)})[0] == R.FAIL
    assert RS.keys_vs_model({"fc.weight": torch.zeros(5, 512)}, "benchmarks.gpu_acceptance.models:bn_net", 3, 32)


def test_compile_judge_fails_when_nothing_compiled_or_the_resume_diverged():
    good = {"eager": _run(20), "straight": _run(20), "compiled": _run(20), "compile_flag": True,
            "expected_steps": 20, "resume_reported": True, "resumed_vs_straight": 0.0, "compiled_vs_eager": 3e-5,
            "wrapped_keys": [], "inductor_files": 12}  # fmt: skip
    _judged(RS.judge_compile, good, {
        "nothing compiled": _wrong(good, inductor_files=0),
        "flag off": _wrong(good, compile_flag=False),
        "resume diverged": _wrong(good, resumed_vs_straight=2e-4),
        "wrong gradients": _wrong(good, compiled_vs_eager=0.3),
        "wrapped keys": _wrong(good, wrapped_keys=["_orig_mod.conv1.weight"]),
        "no resume": _wrong(good, resume_reported=False),
    })  # fmt: skip


def test_ddp_judge_fails_without_nccl_or_a_world_size_one_ddp():
    good = {"plain": _run(20, distributed_type="NO", world_size=1),
            "ddp": _run(20, distributed_type="MULTI_GPU", world_size=1),
            "expected_steps": 20, "nccl_initialised": True, "ddp_vs_plain": 0.0}  # fmt: skip
    _judged(PA.judge_ddp, good, {
        "no NCCL": _wrong(good, nccl_initialised=False),
        "not DDP": _wrong(good, ddp__distributed_type="NO"),
        "diverged": _wrong(good, ddp_vs_plain=1e-3),
    })  # fmt: skip


def test_sync_bn_judge_fails_when_the_control_does_not_differ():
    good = {"one": _run(12, world_size=1, global_batch=32), "synced": _run(12, world_size=2, global_batch=32),
            "unsynced": _run(12, world_size=2, global_batch=32), "expected_steps": 12, "converted": True,
            "synced_vs_one": 5e-7, "unsynced_vs_one": 2e-2}  # fmt: skip
    _judged(PA.judge_sync_bn, good, {
        "synced differs": _wrong(good, synced_vs_one=1e-2),
        "control proves nothing": _wrong(good, unsynced_vs_one=1e-5),
        "control barely farther": _wrong(good, synced_vs_one=2e-5, unsynced_vs_one=1.5e-4),
        "not converted": _wrong(good, converted=False),
        "one rank": _wrong(good, synced__world_size=1),
        "other batch": _wrong(good, synced__global_batch=64),
    })  # fmt: skip


def test_data_parallel_judge_fails_on_wrong_threads_dtype_or_gradients_and_reports_a_refusal():
    good = {"replica_calls": 2, "replica_threads": 2, "main_thread_ran_a_replica": False,
            "replica_devices": ["cuda:0"], "replica_dtypes": ["torch.bfloat16"], "grad_max_abs_diff": 0.0,
            "grad_max_abs": 0.3}  # fmt: skip
    _judged(PA.judge_data_parallel, good, {
        "fp16 replicas": _wrong(good, replica_dtypes=["torch.float16"]),
        "one thread": _wrong(good, replica_threads=1),
        "double-counted gradient": _wrong(good, grad_max_abs_diff=0.3),
        "on the host": _wrong(good, replica_devices=["cpu:None"]),
    })  # fmt: skip
    status, detail = PA.judge_data_parallel({"refused": "AssertionError: duplicate device ids"})
    assert status == R.NOT_RUN and "duplicate device ids" in detail


def test_device_batch_judge_fails_when_the_data_stays_on_the_host_or_the_split_is_wrong():
    good = {**_run(2, mixed_precision="bf16"), "expected_steps": 2, "expected_global_batch": 32768,
            "global_batch": 32768, "micro_batch": 8192, "accum_steps": 4, "probed_micro_batch": 8192,
            "data_on_device": True}  # fmt: skip
    _judged(SP.judge_device_batch, good, {
        "data on the host": _wrong(good, data_on_device=False),
        "no probe": _wrong(good, probed_micro_batch=None),
        "ignored the probe": _wrong(good, micro_batch=4096, accum_steps=8),
        "lost samples": _wrong(good, accum_steps=2),
    })  # fmt: skip


def test_speedrun_judge_needs_augmentation_on_the_device_and_a_warm_up():
    good = {**_run(648, mixed_precision="bf16"), "data_on_device": True, "augment": "random_crop(2)+hflip",
            "train_time_s": 9.5, "samples_per_s": 70000.0,
            "probe": {"same_process": True, "warmup_steps": 60, "cudnn_benchmark": True}}  # fmt: skip
    _judged(SP.judge_speedrun, good, {
        "synthetic (no augmentation)": _wrong(good, augment=None),
        "data on the host": _wrong(good, data_on_device=False),
        "no warm-up": _wrong(good, probe={"same_process": True, "warmup_steps": 0, "cudnn_benchmark": True}),
        "short": _wrong(good, global_step=600),
        "fp32": _wrong(good, mixed_precision="no"),
    })  # fmt: skip


def test_speedrun_probe_trains_on_cifar_format_files_with_augmentation_after_a_warm_up(tmp_path):
    """The speed run's data path on the CPU: real CIFAR-10-format files make the recipe augment (synthetic data
    did not), the warm-up runs first in the same process; here, on the CPU, the judge says the data was not on
    a GPU."""
    from benchmarks.gpu_acceptance.probe import probe_speedrun

    small = ("--batch-size", "8", "--global-batch-size", "8", "--max-steps", "4", "--warmup-steps", "1")
    small += ("--mixed-precision", "no", "--image-size", "16", "--eval-batch-size", "40")  # bf16 is slow on CPUs
    out = tmp_path / "speedrun.json"
    assert probe_speedrun(tmp_path / "work", out, 2, sizes=(80, 40), extra=small) == 0
    check = R.Check("speedrun", "", "", 1, [R.Step("speedrun", ["python3", "--out", str(out)])], None, None)
    m = SP.measure_speedrun(None, {}, check)
    assert m["augment"] and m["global_step"] == 4 and m["probe"]["warmup_steps"] == 2 and m["probe"]["same_process"]
    assert m["mixed_precision"] == "no"  # the test's flags come after the probe's bf16: they win
    status, detail = SP.judge_speedrun(m)
    assert status == R.FAIL and "ran on 'cpu'" in detail and "not on the GPU" in detail


def test_dp_ddp_judge_fails_on_diverged_weights():
    good = {"layout": [True, 1, 2], "dp_vs_ddp": 1e-7}
    _judged(
        PA.judge_dp_ddp, good, {"diverged": _wrong(good, dp_vs_ddp=1e-3), "layout": _wrong(good, layout=[False, 1, 2])}
    )


def test_tensor_diff_refuses_to_compare_different_keys_or_shapes():
    import torch

    a = {"module.w": torch.zeros(2), "b": torch.ones(1)}
    assert tensor_diff(a, {"w": torch.zeros(2), "_orig_mod.b": torch.ones(1) * 1.5}) == 0.5  # prefixes ignored
    assert tensor_diff(a, {"w": torch.zeros(2)}) == math.inf
    assert tensor_diff(a, {"w": torch.zeros(3), "b": torch.ones(1)}) == math.inf
