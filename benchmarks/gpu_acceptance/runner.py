"""The machinery of ``scripts/gpu_acceptance.py``: children streamed to logs, timeouts, a report that survives a kill.

A check is a list of child processes (:class:`Step`) run in order, then a ``measure`` that reads what they
wrote and a ``judge`` that decides from those measurements alone (each in its check's module). Every
child's output goes straight to the check's log file as it is printed (the child writes to the file
itself), so a check killed half-way still leaves its output. The report (``acceptance.json`` and
``acceptance.md``) is rewritten before and after every check: killed at any moment, even with SIGKILL,
it names what passed or failed so far, the check that was running as "not run (interrupted)" and the
rest as "not run (not reached)".

Statuses: ``pass``; ``fail`` (a run failed or the judge said no); ``not run (budget)`` (the total budget
ran out before or during the check); ``not run (timeout)`` (the check's own timeout); ``not run`` (this
machine cannot run it: too few GPUs, or torch refused the setup, with its reason). A check that did not
finish is never a pass and never a fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
BUDGET, TIMEOUT = "not run (budget)", "not run (timeout)"
INTERRUPTED, NOT_REACHED = "not run (interrupted)", "not run (not reached)"
MIN_CHECK_S = 20  # a check is not started with less than this (or its own min_s) left in the budget


def is_not_run(status: str) -> bool:
    return status.startswith(NOT_RUN)


# ---- what a check is ------------------------------------------------------------------------------------------
@dataclass
class Step:
    """One child process of a check; ``env`` is added to ``accel_train.doctor.launching.child_env()``.

    ``must_succeed=False``: the judge reads the output whatever the exit code (pytest). ``refusals``: regular
    expressions; a failed step whose output matches one is torch refusing this setup on this machine, and the
    check is "not run" with that line, not "fail".
    """

    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    out_dir: Path | None = None
    must_succeed: bool = True
    refusals: tuple[str, ...] = ()

    def shell(self) -> str:
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        argv = [_short(a) for a in self.argv]
        return " ".join([*env, shlex.join(argv)])


def _short(arg: str) -> str:
    """Paths inside the repository as repository-relative, and this interpreter as python3, for readable plans."""
    if arg == sys.executable:
        return "python3"
    try:
        return str(Path(arg).relative_to(REPO)) if arg.startswith(str(REPO)) else arg
    except ValueError:
        return arg


@dataclass
class StepOutput:
    label: str
    returncode: int | None  # None: killed at the time limit
    output: str  # stdout and stderr together, as the log holds them
    seconds: float


Measure = Callable[["Context", dict[str, StepOutput], "Check"], dict[str, Any]]
Judge = Callable[[dict[str, Any]], tuple[str, str]]


@dataclass
class Check:
    name: str
    title: str
    passes_when: str
    timeout_s: int
    steps: list[Step]
    measure: Measure
    judge: Judge  # measurements -> (status, one-line detail); pure, so a unit test can show it failing
    min_gpus: int = 1
    exercises: str = ""  # what this covers on one GPU, and what it cannot
    min_s: int = MIN_CHECK_S
    expected_steps: int | None = None  # what the judge expects the runs to reach
    stop_at: int | None = None  # where a stop-and-resume check stops
    global_batch: int | None = None
    model: str | None = None  # the --model the judge compares exports with

    def step(self, label: str) -> Step:
        return next(s for s in self.steps if s.label == label)


@dataclass
class Context:
    work: Path  # run folders
    out: Path  # the report and the logs
    gpus: int | None  # None: unknown (a plan on a machine without torch)
    budget_s: float


@dataclass
class CheckResult:
    name: str
    status: str
    detail: str = ""
    duration_s: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    log: str | None = None
    timeout_s: int | None = None
    exercises: str = ""


# ---- running one child ----------------------------------------------------------------------------------------
class Interrupted(Exception):
    """SIGTERM or SIGINT reached the acceptance: stop the running child, write the report, leave."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_RUNNING: list[subprocess.Popen] = []  # the child in flight, for the signal handler and the report


def _kill_group(proc: subprocess.Popen) -> None:
    """The child and everything it started (launcher ranks, pytest's runs): it leads its own session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_step(step: Step, log_path: Path, limit_s: float) -> StepOutput:
    """Run ``step`` with its output appended to ``log_path`` as it is printed; kill it after ``limit_s``."""
    from accel_train.doctor.launching import child_env

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n$ {step.shell()}\n".encode())
        log.flush()
        start = os.fstat(log.fileno()).st_size
        t0 = time.monotonic()
        proc = subprocess.Popen(
            step.argv, cwd=REPO, env=child_env(step.env), stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        _RUNNING.append(proc)
        try:
            code: int | None = proc.wait(timeout=max(limit_s, 0.1))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code = None
        except BaseException:
            _kill_group(proc)  # Interrupted, KeyboardInterrupt: no orphaned ranks
            raise
        finally:
            _RUNNING.remove(proc)
        seconds = time.monotonic() - t0
        log.write(f"\n[{step.label}: {'killed at its time limit' if code is None else f'exit {code}'}, "
                  f"{seconds:.1f} s]\n".encode())  # fmt: skip
    with open(log_path, "rb") as f:
        f.seek(start)
        output = f.read().decode(errors="replace")
    return StepOutput(step.label, code, output, seconds)


# accel_train's one-line errors first, then the last exception line (not torchrun's ChildFailedError wrapper)
_WHY = (r"^(\[rank \d+\] )?error: (?!unexpected failure)", r"^[\w.]*(Error|Exception)\b")


def why(text: str) -> str:
    """The most telling line of a failed run's output."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and set(line.strip()) - set("=-*# ")]
    lines = [line for line in lines if not line.startswith("[") or line.startswith("[rank")]  # our exit footers
    for pattern in _WHY:
        hits = [line for line in lines if re.search(pattern, line) and "ChildFailedError" not in line]
        if hits:
            return hits[-1][:300]
    return lines[-1][:300] if lines else "(no output)"


def _refusal(step: Step, output: str) -> str | None:
    for pattern in step.refusals:
        hit = re.search(pattern, output, re.M)
        if hit:
            line = output[output.rfind("\n", 0, hit.start()) + 1 :].split("\n", 1)[0].strip()
            return line[:300]
    return None


# ---- running one check ----------------------------------------------------------------------------------------
def run_check(check: Check, ctx: Context, deadline: float) -> CheckResult:
    """Run the steps in order (each may read the last one's folder), then measure and judge what they wrote."""
    result = CheckResult(
        check.name, FAIL, commands=[s.shell() for s in check.steps], timeout_s=check.timeout_s,
        exercises=check.exercises,
    )  # fmt: skip
    if ctx.gpus is not None and ctx.gpus < check.min_gpus:
        result.status, result.detail = NOT_RUN, f"needs {check.min_gpus} GPUs; this machine has {ctx.gpus}"
        return result
    left = deadline - time.monotonic()
    if left < min(check.min_s, check.timeout_s):
        result.status, result.detail = BUDGET, f"only {max(left, 0):.0f} s of the budget were left to start it"
        return result
    limit = min(check.timeout_s, left)
    cut = TIMEOUT if check.timeout_s <= left else BUDGET
    log = ctx.out / f"{check.name}.log"
    result.log = str(log)
    t0, outputs = time.monotonic(), {}
    for step in check.steps:
        out = run_step(step, log, limit - (time.monotonic() - t0))
        outputs[step.label] = out
        if out.returncode is None:
            result.duration_s = time.monotonic() - t0
            result.status = cut
            what = f"its {check.timeout_s} s timeout" if cut == TIMEOUT else "the total budget"
            result.detail = f"{step.label} was stopped after {limit:.0f} s by {what} (output so far: {log.name})"
            result.metrics = _partial(check, ctx, outputs)
            return result
        if step.must_succeed and out.returncode != 0:
            result.duration_s = time.monotonic() - t0
            refused = _refusal(step, out.output)
            if refused:
                result.status, result.detail = NOT_RUN, f"torch refused it here: {refused}"
            else:
                result.detail = f"{step.label} exited {out.returncode}: {why(out.output)}"
            return result
    try:
        result.metrics = check.measure(ctx, outputs, check)
        result.status, result.detail = check.judge(result.metrics)
    except Exception as exc:  # noqa: BLE001 - a check whose runs cannot be read is a failed check, not a crash
        result.status, result.detail = FAIL, f"could not judge the runs: {type(exc).__name__}: {exc}"
    result.duration_s = time.monotonic() - t0
    return result


def _partial(check: Check, ctx: Context, outputs: dict[str, StepOutput]) -> dict[str, Any]:
    """What a check that was cut short measured so far (pytest: the tests passed and failed before the cut)."""
    try:
        return check.measure(ctx, outputs, check)
    except Exception:  # noqa: BLE001 - it did not finish; whatever cannot be read is simply not reported
        return {}


# ---- running them all -----------------------------------------------------------------------------------------
def run_all(checks: list[Check], ctx: Context, info: dict[str, Any], echo=print) -> list[CheckResult]:
    """Every check in order within ``ctx.budget_s``; the report is rewritten before and after each one."""
    deadline = time.monotonic() + ctx.budget_s
    results = [
        CheckResult(c.name, NOT_REACHED, "the acceptance ended before it", commands=[s.shell() for s in c.steps],
                    timeout_s=c.timeout_s, exercises=c.exercises)
        for c in checks
    ]  # fmt: skip
    info = {**info, "budget_s": ctx.budget_s, "state": "running"}
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i, check in enumerate(checks):
            results[i].status = INTERRUPTED
            results[i].detail = f"started {_now()}; the acceptance was killed before it finished ({check.name}.log)"
            results[i].log = str(ctx.out / f"{check.name}.log")
            write_report(results, info, ctx.out)
            echo(f"[{check.name}] {check.title} ...")
            results[i] = run_check(check, ctx, deadline)
            write_report(results, info, ctx.out)
            r = results[i]
            took = f" ({r.duration_s:.0f} s)" if r.duration_s is not None else ""
            echo(f"[{check.name}] {r.status}{took}: {r.detail}")
    except Interrupted as stop:
        info["state"] = f"interrupted by {stop}"
        write_report(results, info, ctx.out)
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    info["state"] = "finished"
    write_report(results, info, ctx.out)
    return results


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signum)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---- the report -----------------------------------------------------------------------------------------------
def counts(results: list[CheckResult]) -> dict[str, int]:
    c = {PASS: 0, FAIL: 0, NOT_RUN: 0}
    for r in results:
        c[NOT_RUN if is_not_run(r.status) else r.status] += 1
    return c


def exit_code(results: list[CheckResult]) -> int:
    """1 when any check failed; a check that did not run is not a failure (and never a pass)."""
    return 1 if any(r.status == FAIL for r in results) else 0


def counts_line(results: list[CheckResult]) -> str:
    c = counts(results)
    return f"{c[PASS]} passed, {c[FAIL]} failed, {c[NOT_RUN]} not run"


def _cell(text: Any) -> str:
    """Text for one markdown table cell: a ``|`` would end the cell, a newline the row."""
    return str(text).replace("|", "\\|").replace("\n", " ")


ONE_GPU_LIMITS = (
    "On one GPU nothing crosses devices: DDP and FSDP run at world size 1 (NCCL initialised, no all-reduce "
    "between GPUs), the two --sync-bn ranks share GPU 0 over gloo, and DataParallel's two replicas are both on "
    "GPU 0. Multi-GPU all-reduce, sharding across ranks and DataParallel across GPUs are not exercised."
)


def markdown(results: list[CheckResult], info: dict[str, Any]) -> str:
    lines = [
        "# GPU acceptance report",
        "",
        f"Written by `python scripts/gpu_acceptance.py` ({info.get('state', '?')}, last updated "
        f'{info.get("updated", "?")}): **{counts_line(results)}**. A check that did not finish is "not run", '
        'never "pass" and never "fail".',
        "",
    ]
    if info.get("gpus") == 1:
        lines += [f"**One GPU.** {ONE_GPU_LIMITS}", ""]
    lines += ["| | |", "|---|---|"]
    for key in ("device", "gpus", "driver", "torch", "cuda", "accelerate", "python", "git_commit", "host",
                "budget_s", "started"):  # fmt: skip
        if key in info:
            lines.append(f"| {key.replace('_', ' ')} | {_cell(info[key])} |")
    lines += ["", "| check | status | time | result |", "|---|---|---:|---|"]
    for r in results:
        took = f"{r.duration_s:.0f} s" if r.duration_s is not None else "-"
        limit = f" / {r.timeout_s} s" if r.timeout_s else ""
        lines.append(f"| {r.name} | {r.status} | {took}{limit} | {_cell(r.detail)} |")
    for r in results:
        if r.name.startswith("throughput") and r.metrics.get("runs"):  # throughput-bf16, throughput
            lines += throughput_markdown(r.metrics, r.name)
    lines += ["", "What each check covers, its commands and its log:", ""]
    for r in results:
        lines += [f"* **{r.name}**" + (f" ({r.exercises})" if r.exercises else "")]
        lines += [f"  * log: `{Path(r.log).name}`"] if r.log else []
        lines += [f"  * `{c}`" for c in r.commands]
    return "\n".join(lines) + "\n"


def throughput_markdown(m: dict[str, Any], name: str = "throughput") -> list[str]:
    peak = m.get("peak_bf16_tflops")
    lines = [
        "",
        f"## Throughput ({name})",
        "",
        f"MFU = training FLOPs per sample ({(m.get('train_flops_per_sample') or 0) / 1e9:.3f} GFLOP: forward x3, "
        f"FlopCounterMode) x samples/s / this GPU's measured bf16 GEMM peak ({peak} TFLOP/s), for every row. "
        "fp32 is TF32 off; tf32 is fp32 with TF32 on (torch's default on this GPU).",
        "",
        "| row | samples/s | vs fp32 | MFU | TFLOP/s | peak MB | reserved MB | data wait | fp16 skipped | loss scale |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row, run in m["runs"].items():
        rate = run.get("samples_per_s")
        cells = [None if rate is None else f"{rate:,.0f}", m.get("speedup_vs_fp32", {}).get(row)]
        mfu = run.get("mfu")
        cells += [None if mfu is None else f"{mfu:.1%}", run.get("achieved_tflops"), run.get("peak_memory_mb")]
        wait = run.get("data_wait_fraction")
        cells += [run.get("reserved_memory_mb"), None if wait is None else f"{wait:.1%}"]
        cells += [run.get("fp16_skipped_steps"), run.get("loss_scale")]
        lines.append(f"| {row} | " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return lines


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_report(results: list[CheckResult], info: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """``out/acceptance.json`` (everything) and ``out/acceptance.md`` (the tables people read), each replaced
    whole (a reader never sees half a file)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    info = {**info, "updated": _now()}
    data = {"environment": info, "counts": counts(results), "checks": [asdict(r) for r in results]}
    json_path, md_path = out / "acceptance.json", out / "acceptance.md"
    _write_atomic(json_path, json.dumps(data, indent=2, default=str) + "\n")
    _write_atomic(md_path, markdown(results, info))
    return json_path, md_path
