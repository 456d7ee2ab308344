"""The device plan of the GPU acceptance (``--plan``): the checks grouped into device commands that each fit one
command's limit and together one session's device time, the wheels the GPU machine lacks with the lines that
download and install them, and the commit the report names."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.gpu_checks import TIMEOUTS, build_checks
from benchmarks.gpu_runner import REPO, Context

# One device command each: (folder under $OUT, checks). dp_ddp needs two GPUs; the lent machines have one.
COMMANDS = (
    ("tests", ("setup", "pytest")),
    ("speed", ("throughput", "speedrun")),
    ("state", ("resume", "fsdp", "compile")),
    ("parallel", ("ddp", "sync-bn", "dp", "device-batch")),
)
COMMAND_MARGIN_S = 25  # beyond the checks' own timeouts: the wheels' install, this script's start, the report
DEVICE_COMMAND_MAX_S = 570  # one device command may run 600 s; 30 s stay for the transfers
DEVICE_SESSION_MAX_S = 1650  # a session has 1800 s of device time, the machine's start included
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


def device_plan(ctx: Context, commit: str | None = None) -> dict[str, Any]:
    """The commands a session runs on the GPU machine, in order, each writing its own report under $OUT."""
    commit = commit or git_commit() or "unknown"
    checks = {c.name: c for c in build_checks(ctx)}
    commands, rows = [], []
    for folder, names in COMMANDS:
        budget = sum(TIMEOUTS[n] for n in names)
        run = f"PYTHONPATH=$PWD/{WHEELS_SITE}:$PWD PYTHONUNBUFFERED=1 python3 scripts/gpu_acceptance.py "
        run += f"--only {','.join(names)} --budget-s {budget} --out $OUT/{folder} --commit {shlex.quote(commit)}"
        commands.append({
            "name": folder, "checks": list(names), "shell": f"{install_line()} && {run}",
            "timeout_s": budget + COMMAND_MARGIN_S, "budget_s": budget, "out": f"$OUT/{folder}",
        })  # fmt: skip
        for n in names:
            c = checks[n]
            rows.append({"name": n, "command": folder, "timeout_s": c.timeout_s, "title": c.title,
                         "passes_when": c.passes_when, "exercises": c.exercises,
                         "steps": [s.shell() for s in c.steps]})  # fmt: skip
    return {
        "commit": commit,
        "checks": rows,
        "commands": commands,
        "total_timeout_s": sum(c["timeout_s"] for c in commands),
        "limits": {"per_command_s": DEVICE_COMMAND_MAX_S, "total_s": DEVICE_SESSION_MAX_S},
        "wheels": pinned_wheels(),
        "download": download_line(),
        "install": install_line(),
        "carry": [WHEELS_DIR],
        "not_in_plan": {"dp_ddp": "needs two GPUs; run it with --only dp_ddp on a machine that has them"},
    }


def print_plan(plan: dict[str, Any], gpus: int | None) -> None:
    here = "unknown (torch is not installed)" if gpus is None else str(gpus)
    print(f"GPU acceptance plan for commit {plan['commit']} (--plan runs nothing; CUDA GPUs here: {here}).")
    print(f"Carry the wheels: `{plan['download']}` here, then carry {plan['carry']}.")
    print(f"{len(plan['commands'])} device commands, {plan['total_timeout_s']} s of timeouts in all:")
    checks = {c["name"]: c for c in plan["checks"]}
    for i, cmd in enumerate(plan["commands"], 1):
        print(f"\n[{i}] {cmd['name']} (timeout_s {cmd['timeout_s']}): $ {cmd['shell']}")
        for name in cmd["checks"]:
            c = checks[name]
            print(f"    {name}: {c['title']} (timeout {c['timeout_s']} s)")
            print(f"      passes when: {c['passes_when']}")
            for s in c["steps"]:
                print(f"      $ {s}")
