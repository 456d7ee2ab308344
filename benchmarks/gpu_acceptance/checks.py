"""The GPU acceptance's checks in plan order (``CHECK_NAMES``: ``plan.COMMANDS``, then ``plan.LATER``, then the
two-GPU one), and the tiny stand-in checks the unit tests run (``--fake-checks``).

Each check is defined, with its timeout, the children it runs and the ``measure``/``judge`` pair that decides it,
in the module of its kind: ``environment`` (setup, pytest), ``resume`` (bf16-resume, resume, fsdp, compile),
``parallel`` (ddp, sync-bn, dp, dp_ddp) and ``speed`` (throughput-bf16, throughput, speedrun, device-batch). Each
timeout is at least ``sizing.MARGIN`` (1.3x) the check's expected seconds on an H100 (``sizing.expected_s``, from
start-up costs measured on the CPU and the FLOPs), more where the estimate is least certain.
"""

from __future__ import annotations

import sys
from typing import Any

from benchmarks.gpu_acceptance import environment, parallel, resume, speed
from benchmarks.gpu_acceptance.runner import PASS, Check, Context, Step

BUILDERS = {
    # the first command: does a GPU user get what the CPU promised?
    "setup": environment.setup_check, "bf16-resume": resume.bf16_resume_check, "ddp": parallel.ddp_check,
    "throughput-bf16": speed.throughput_bf16_check, "compile": resume.compile_check,
    # the second command, when the session's time allows
    "pytest": environment.pytest_check, "fsdp": resume.fsdp_check, "device-batch": speed.device_batch_check,
    "sync-bn": parallel.sync_bn_check,
    # beyond today's device time: a later machine's command
    "throughput": speed.throughput_check, "resume": resume.resume_check, "speedrun": speed.speedrun_check,
    "dp": parallel.dp_check,
    # two GPUs
    "dp_ddp": parallel.dp_ddp_check,
}  # fmt: skip
CHECK_NAMES = tuple(BUILDERS)


def build_checks(ctx: Context, names: list[str] | tuple[str, ...] = CHECK_NAMES) -> list[Check]:
    checks = [BUILDERS[n](ctx) for n in names]
    assert [c.name for c in checks] == list(names)
    return checks


def fake_checks(ctx: Context) -> list[Check]:
    """Tiny checks for the unit tests (``--fake-checks``): one passes, one sleeps until killed, one never starts."""

    def step(label: str, code: str) -> Step:
        return Step(label, [sys.executable, "-c", code])

    def judge(m: dict[str, Any]) -> tuple[str, str]:
        return PASS, "fine"

    sleeper = "import os, time; print('b', 'started', os.getpid(), flush=True); time.sleep(120)"
    spec = [("fake-a", "print('a done')", 30), ("fake-b", sleeper, 150), ("fake-c", "print('c done')", 30)]
    return [Check(n, n, "exits 0", t, [step(n, code)], lambda ctx, o, c: {}, judge, min_s=1) for n, code, t in spec]
