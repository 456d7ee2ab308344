"""The GPU checks of the environment, each what it runs, what it must show and how that is judged: ``setup`` (the
carried wheels import and compute, torch sees a GPU, the import times every process pays) and ``pytest`` (the
GPU-marked tests)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.runner import FAIL, PASS, REPO, Check, Context, Step
from benchmarks.gpu_acceptance.runs import finite, probe_step, verdict


# ---- setup: the carried wheels import, CUDA is there --------------------------------------------------------------
def setup_check(ctx: Context) -> Check:
    return Check(
        "setup", "import times, the carried wheels (datasets, evaluate) and CUDA, in a fresh process",
        "datasets, evaluate, accel_train and its accuracy metric import and compute, and torch sees a GPU "
        "(the seconds each import takes are reported: every training process pays them)",
        30, [probe_step("imports", ctx, "setup", "imports")], measure_setup, judge_setup,
        exercises="the environment every other check relies on",
    )  # fmt: skip


def measure_setup(ctx, outputs, check) -> dict[str, Any]:
    return json.loads(Path(check.step("imports").argv[-1]).read_text())


def judge_setup(m: dict[str, Any]) -> tuple[str, str]:
    problems = [f"import {k} failed: {v}" for k, v in m.get("errors", {}).items()]
    if not m.get("cuda", {}).get("available"):
        problems.append("torch sees no CUDA GPU")
    if not (finite(m.get("metric_accuracy")) and abs(m["metric_accuracy"] - 2 / 3) < 1e-9):
        problems.append(f"the accuracy metric computed {m.get('metric_accuracy')!r} for 2 of 3 right")
    secs = m.get("seconds", {})
    times = ", ".join(f"{k} {v:.1f} s" for k, v in secs.items())
    extra = " (imports transformers)" if m.get("transformers_imported_by_evaluate") else ""
    return verdict(problems, f"imports: {times}{extra}; {m.get('cuda', {}).get('device')}")


# ---- pytest: the GPU-marked tests ---------------------------------------------------------------------------------
def gpu_test_files() -> list[str]:
    """The test modules with GPU-marked tests: only they are collected (a module that cannot even be imported
    on the GPU machine must not fail the GPU tests)."""
    marks = ("mark.gpu", "mark.multigpu")
    files = sorted(p for p in (REPO / "tests").rglob("test_*.py") if any(m in p.read_text() for m in marks))
    return [str(p.relative_to(REPO)) for p in files]


def pytest_check(ctx: Context) -> Check:
    argv = [sys.executable, "-m", "pytest", "-m", "gpu or multigpu", "-v", "-p", "no:cacheprovider"]
    if importlib.util.find_spec("xdist"):  # the GPU machine has 16 cores; runs that share a fixture stay together
        argv += ["-n", "4", "--dist", "loadgroup"]
    if importlib.util.find_spec("pytest_timeout"):
        argv += ["--timeout", "240"]
    argv += gpu_test_files()
    return Check(
        "pytest", "the GPU-marked tests (tests/integration/test_gpu.py)",
        "pytest exits 0, at least one test passed and none failed or errored (multigpu tests skip on one GPU)",
        105, [Step("pytest", argv, must_succeed=False)], measure_pytest, judge_pytest,
        exercises="single-GPU training, bf16/fp16, CPU<->GPU resume, FSDP bf16, data and augmentation on the GPU",
    )  # fmt: skip


def measure_pytest(ctx, outputs, check) -> dict[str, Any]:
    out = outputs["pytest"]
    return pytest_counts(out.output, out.returncode)


_OUTCOME = re.compile(r"\b(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def pytest_counts(output: str, returncode: int | None) -> dict[str, Any]:
    """Counts from pytest's last line; from its per-test lines (``-v``) when it was killed before that line."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors", "deselected")}
    final = [line for line in output.splitlines() if re.match(r"^=+ .*\bin [\d.]+s", line)]
    if final:
        for n, word in _SUMMARY.findall(final[-1]):
            key = "errors" if word.startswith("error") else word
            if key in counts:
                counts[key] = int(n)
    else:
        words = {"PASSED": "passed", "FAILED": "failed", "ERROR": "errors", "SKIPPED": "skipped"}
        for line in output.splitlines():
            hit = _OUTCOME.search(line) if "::" in line else None
            if hit and hit.group(1) in words:
                counts[words[hit.group(1)]] += 1
    failed = sorted({m for m in re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.M)})
    return {**counts, "returncode": returncode, "finished": bool(final), "failed_tests": failed[:20]}


def judge_pytest(m: dict[str, Any]) -> tuple[str, str]:
    line = f"{m['passed']} passed, {m['failed']} failed, {m['errors']} errors, {m['skipped']} skipped"
    ok = m.get("returncode") == 0 and m["passed"] > 0 and m["failed"] == m["errors"] == 0
    if ok:
        return PASS, line
    why = f" ({', '.join(m['failed_tests'][:5])})" if m.get("failed_tests") else ""
    if m["passed"] == 0 and not m["failed"]:
        why += " (nothing passed: were the GPU tests skipped?)"
    return FAIL, f"{line}, pytest exit {m.get('returncode')}{why}"
