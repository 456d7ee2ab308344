"""The device plan of the GPU acceptance (``--plan``): every check in plan order (``CHECK_NAMES``), each defined in
the module of its kind, grouped into device commands ordered by value and sized to today's device time (15 minutes
for a whole session: the machine's start, every command, idle time and the hand-back; at most 10 minutes a command),
each check with the seconds it should take on an H100 (``sizing``); the wheels the GPU machine lacks with the lines
that download and install them; what no command holds, and why; and the commit the report names."""

from __future__ import annotations

import math
import shlex
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance import environment, parallel, resume, sizing, speed
from benchmarks.gpu_acceptance.runner import REPO, Check, Context

# Every check in plan order: COMMANDS, then LATER, then the two-GPU one. Each timeout is at least sizing.MARGIN (1.3x)
# the check's expected seconds on an H100, more where the estimate is least certain.
BUILDERS = {
    "setup": environment.setup_check, "bf16-resume": resume.bf16_resume_check, "ddp": parallel.ddp_check,
    "throughput-bf16": speed.throughput_bf16_check, "compile": resume.compile_check,
    "pytest": environment.pytest_check, "fsdp": resume.fsdp_check, "device-batch": speed.device_batch_check,
    "sync-bn": parallel.sync_bn_check,
    "throughput": speed.throughput_check, "resume": resume.resume_check, "speedrun": speed.speedrun_check,
    "dp": parallel.dp_check,
    "dp_ddp": parallel.dp_ddp_check,
}  # fmt: skip
CHECK_NAMES = tuple(BUILDERS)


def build_checks(ctx: Context, names: list[str] | tuple[str, ...] = CHECK_NAMES) -> list[Check]:
    checks = [BUILDERS[n](ctx) for n in names]
    assert [c.name for c in checks] == list(names)
    return checks


# The device commands in the order a session runs them: (folder under $OUT, checks in order). The first holds the
# verdicts that decide whether a GPU user can trust the project: CUDA and the carried wheels; one GPU trains,
# checkpoints and resumes in the CUDA default for CNNs (bf16, channels_last); DDP over NCCL; bf16 speed and MFU;
# --compile stop+resume. The second runs only when the session's time allows.
COMMANDS = (
    ("core", ("setup", "bf16-resume", "ddp", "throughput-bf16", "compile")),
    ("extra", ("pytest", "fsdp", "device-batch", "sync-bn")),
)
# Beyond today's device time: the command a later machine runs (printed with the plan, never in its total).
LATER = ("later", ("throughput", "resume", "speedrun", "dp"))
NOT_IN_PLAN = {
    "throughput": "the fp32 (TF32 off), tf32 and fp16 rows and the speed-ups between them do not fit today's device "
    "time; core's throughput-bf16 has the bf16 row, the GEMM peak and MFU, and pytest the fp16 loss scale and its "
    "skipped steps. The later command runs it",
    "resume": "fp32 stop/resume at 1e-5 with the CUDA RNG does not fit today's device time; core's bf16-resume "
    "checks the same (weights, optimizer state, data order, the CUDA RNG) in bf16 with channels_last, and pytest "
    "resumes across CPU and GPU in fp32. The later command runs it",
    "speedrun": "airbench's recipe timed on the GPU (a figure, no correctness verdict) does not fit today's device "
    "time. The later command runs it",
    "dp": "DataParallel with two replicas on GPU 0 (torch may refuse the duplicate device) does not fit today's "
    "device time. The later command runs it",
    "dp_ddp": "needs two GPUs; run it with --only dp_ddp on a machine that has them",
}
DEVICE_SESSION_S = 900  # 15 minutes of device time in all: the machine's start, every command, idle, the hand-back
DEVICE_PLAN_MAX_S = 780  # the commands' timeouts together; at least 120 s stay for the start and the hand-back
DEVICE_COMMAND_MAX_S = 570  # one device command may run 600 s; 30 s stay for the transfers
FIRST_COMMAND_MAX_S, FIRST_BUDGET_MAX_S = 480, 450  # the decisive verdicts, whatever the machine's start costs
SECOND_COMMAND_MAX_S = 300
LIMITS = {
    "device_session_s": DEVICE_SESSION_S, "total_s": DEVICE_PLAN_MAX_S, "per_command_s": DEVICE_COMMAND_MAX_S,
    "first_command_s": FIRST_COMMAND_MAX_S, "first_budget_s": FIRST_BUDGET_MAX_S,
    "second_command_s": SECOND_COMMAND_MAX_S, "timeout_over_expected": sizing.MARGIN,
}  # fmt: skip
MIN_COMMAND_MARGIN_S = 25  # beyond the checks' own timeouts: the wheels' install, this script's start, the report
WHEEL_NAMES = ("datasets", "evaluate", "dill", "multiprocess")  # what the GPU machine's image lacks
WHEELS_DIR, WHEELS_SITE = ".whl", ".whl/site"


def pinned_wheels() -> list[str]:
    """The four wheels at constraints.txt's versions (the versions the suite last ran with)."""
    pins = {}
    path = REPO / "constraints.txt"
    for line in path.read_text().splitlines() if path.is_file() else []:
        name, _, version = line.strip().partition("==")
        if name.lower() in WHEEL_NAMES and version:
            pins[name.lower()] = f"{name.lower()}=={version.strip()}"
    return [pins.get(n, n) for n in WHEEL_NAMES]


def download_line() -> str:
    return (f"python3 -m pip download --no-deps --python-version 3.12 --only-binary=:all: -d {WHEELS_DIR} "
            + " ".join(pinned_wheels()))  # fmt: skip


def install_line() -> str:
    return (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "
            f"{WHEELS_SITE} {WHEELS_DIR}/*.whl")  # fmt: skip


def git_commit(repo: Path = REPO) -> str | None:
    """HEAD, with ``-dirty`` when the tree differs from it; None without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def command_margin_s(first: bool) -> int:
    """A command's seconds beyond its checks' timeouts: at least 1.3x its own expected overhead (the first reads
    torch off a fresh machine's cold disk), rounded up to 5 s."""
    need = sizing.MARGIN * sizing.command_overhead_s(first)
    return max(MIN_COMMAND_MARGIN_S, 5 * math.ceil(need / 5))


def _command(folder: str, names: tuple[str, ...], checks: dict[str, Check], commit: str, first: bool) -> dict[str, Any]:
    budget = sum(checks[n].timeout_s for n in names)
    run = f"PYTHONPATH=$PWD/{WHEELS_SITE}:$PWD PYTHONUNBUFFERED=1 python3 scripts/gpu_acceptance.py "
    run += f"--only {','.join(names)} --budget-s {budget} --out $OUT/{folder} --commit {shlex.quote(commit)}"
    return {
        "name": folder, "checks": list(names), "shell": f"{install_line()} && {run}",
        "timeout_s": budget + command_margin_s(first), "budget_s": budget, "out": f"$OUT/{folder}",
        "expected_s": round(sum(sizing.expected_s(n) for n in names), 1),
        "overhead_s": round(sizing.command_overhead_s(first), 1),
    }  # fmt: skip


def device_plan(ctx: Context, commit: str | None = None) -> dict[str, Any]:
    """The commands a session runs on the GPU machine, in order, each writing its own report under $OUT; and the
    command a later machine runs."""
    commit = commit or git_commit() or "unknown"
    checks = {c.name: c for c in build_checks(ctx)}
    commands = [_command(folder, names, checks, commit, i == 0) for i, (folder, names) in enumerate(COMMANDS)]
    later = _command(*LATER, checks, commit, first=False)
    rows = []
    for cmd in [*commands, later]:
        for n in cmd["checks"]:
            c = checks[n]
            rows.append({"name": n, "command": cmd["name"], "timeout_s": c.timeout_s,
                         "expected_s": sizing.expected_s(n), "expected": sizing.breakdown(n),
                         "title": c.title, "passes_when": c.passes_when, "exercises": c.exercises,
                         "steps": [s.shell() for s in c.steps]})  # fmt: skip
    return {
        "commit": commit,
        "checks": rows,
        "commands": commands,
        "total_timeout_s": sum(c["timeout_s"] for c in commands),
        "total_expected_s": round(sum(c["expected_s"] + c["overhead_s"] for c in commands), 1),
        "limits": LIMITS,
        "later": later,
        "not_in_plan": NOT_IN_PLAN,
        "wheels": pinned_wheels(),
        "download": download_line(),
        "install": install_line(),
        "carry": [WHEELS_DIR],
    }


def print_plan(plan: dict[str, Any], gpus: int | None) -> None:
    here = "unknown (torch is not installed)" if gpus is None else str(gpus)
    print(f"GPU acceptance plan for commit {plan['commit']} (--plan runs nothing; CUDA GPUs here: {here}).")
    print(f"Carry the wheels: `{plan['download']}` here, then carry {plan['carry']}.")
    print(f"{len(plan['commands'])} device commands, {plan['total_timeout_s']} s of timeouts in all, about "
          f"{plan['total_expected_s']:.0f} s expected on an H100 (a session has {DEVICE_SESSION_S} s of device time, "
          "the machine's start included); give the machine back right after the last:")  # fmt: skip
    checks = {c["name"]: c for c in plan["checks"]}
    for i, cmd in enumerate([*plan["commands"], plan["later"]], 1):
        label = f"[{i}]" if cmd is not plan["later"] else "[a later machine]"
        print(f"\n{label} {cmd['name']} (timeout_s {cmd['timeout_s']}, about {cmd['expected_s']:.0f} s of checks "
              f"expected): $ {cmd['shell']}")  # fmt: skip
        for name in cmd["checks"]:
            c = checks[name]
            print(f"    {name}: {c['title']} (expected {c['expected_s']:.0f} s, timeout {c['timeout_s']} s)")
            print(f"      passes when: {c['passes_when']}")
            for s in c["steps"]:
                print(f"      $ {s}")
    print("\nNot in today's plan:")
    for name, why in plan["not_in_plan"].items():
        print(f"    {name}: {why}")
