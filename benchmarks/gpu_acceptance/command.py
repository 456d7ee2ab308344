"""The GPU acceptance's command line (``scripts/gpu_acceptance.py`` runs :func:`main`), and the machine it runs on
(packages, CUDA GPUs, versions). ``--plan --json`` prints the exact commands a session runs on the GPU machine (the
decisive verdicts first, each within one device command's limit, all within a session's device time), the four
wheels to carry and the line that installs them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.gpu_acceptance.plan import CHECK_NAMES, build_checks, device_plan, download_line, git_commit, print_plan
from benchmarks.gpu_acceptance.runner import (
    PASS,
    REPO,
    Check,
    Context,
    Interrupted,
    Step,
    counts_line,
    exit_code,
    run_all,
)

DEFAULT_WORK = REPO / "runs" / "gpu_acceptance"
DEFAULT_OUT = REPO / "runs" / "gpu_acceptance" / "report"


class SetupError(Exception):
    """This machine cannot run the checks; the message says what to do. Exit code 2."""


# ---- the machine --------------------------------------------------------------------------------------------------
# import name -> what pip installs (requirements.txt, plus pytest for the pytest check)
REQUIRED = {
    "torch": "torch", "torchvision": "torchvision", "accelerate": "accelerate", "datasets": "datasets",
    "evaluate": "evaluate", "safetensors": "safetensors", "sklearn": "scikit-learn", "tqdm": "tqdm",
    "tensorboard": "tensorboard", "matplotlib": "matplotlib", "yaml": "pyyaml", "PIL": "pillow", "pytest": "pytest",
}  # fmt: skip


def missing_packages() -> list[str]:
    return [pip for module, pip in REQUIRED.items() if importlib.util.find_spec(module) is None]


def cuda_gpus() -> int:
    import torch

    if not torch.cuda.is_available():
        raise SetupError(
            "no CUDA GPU visible (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}): run this on a GPU machine; --plan lists the checks "
            "without one"
        )
    return torch.cuda.device_count()  # no CUDA context here: the children get the whole GPU


def gpus_if_known() -> int | None:
    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _nvidia_smi() -> dict[str, str]:
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rows = [r.split(", ") for r in proc.stdout.strip().splitlines()] if proc.returncode == 0 else []
    if not rows or len(rows[0]) < 3:
        return {}
    return {"device": ", ".join(sorted({r[0] for r in rows})), "driver": rows[0][1], "gpu_memory": rows[0][2]}


def environment_info(gpus: int | None, commit: str | None) -> dict[str, Any]:
    import platform
    from importlib.metadata import PackageNotFoundError, version

    info: dict[str, Any] = {"started": datetime.now().astimezone().isoformat(timespec="seconds"), "gpus": gpus}
    info.update(_nvidia_smi())
    for package in ("torch", "accelerate", "datasets", "evaluate"):
        try:
            info[package] = version(package)
        except PackageNotFoundError:
            info[package] = None
    info.update(python=platform.python_version(), host=platform.node())
    info["git_commit"] = commit or (git_commit() or "unknown (no git here; pass --commit)")
    return info


# ---- the command --------------------------------------------------------------------------------------------------
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_acceptance.py",
        description="Run accel_train's GPU checks on this machine and write OUT/acceptance.{json,md}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--plan", action="store_true", help="print the device plan, run nothing")
    parser.add_argument("--json", action="store_true", help="with --plan: the plan as JSON")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(CHECK_NAMES)}")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting checks after this long")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="folder for acceptance.json/.md and the logs")
    parser.add_argument("--work", default=str(DEFAULT_WORK), help="run folders go to WORK/<time>/")
    parser.add_argument("--commit", help="the git commit to report when this tree has no .git")
    parser.add_argument("--wheels", metavar="DIR", help="first install DIR/*.whl (no dependencies) into DIR/site")
    parser.add_argument("--fake-checks", action="store_true", help=argparse.SUPPRESS)  # the unit tests' tiny checks
    return parser.parse_args(argv)


def selected(only: str | None) -> list[str]:
    """The checks to run, in plan order; without --only all but the two-GPU one on a one-GPU machine."""
    names = [n.strip() for n in (only or "").split(",") if n.strip()] or list(CHECK_NAMES)
    unknown = sorted(set(names) - set(CHECK_NAMES))
    if unknown:
        raise SetupError(f"--only: unknown check(s) {', '.join(unknown)}; choose from {', '.join(CHECK_NAMES)}")
    return [n for n in CHECK_NAMES if n in names]


def install_wheels(wheels: Path) -> None:
    """``pip install --no-index --no-deps --target DIR/site DIR/*.whl``: the missing packages only, never the
    image's own (the resolver could fail on datasets' pins against them)."""
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    if not files:
        raise SetupError(f"--wheels {wheels}: no .whl files there; make them with: {download_line()}")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade",
           "--target", str(wheels / "site"), *files]  # fmt: skip
    if subprocess.run(cmd, cwd=REPO).returncode != 0:
        raise SetupError(f"installing {len(files)} wheels from {wheels} failed (pip's message is above)")


def _reexec_with(site: Path, argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    sys.stdout.flush()
    script = REPO / "scripts" / "gpu_acceptance.py"
    os.execve(sys.executable, [sys.executable, str(script), *argv], env)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    ctx = Context(Path(args.work).resolve() / stamp, Path(args.out).resolve(), None, args.budget_s)
    try:
        if args.plan:
            ctx.gpus = gpus_if_known()
            plan = device_plan(ctx, args.commit)
            print(json.dumps(plan, indent=2)) if args.json else print_plan(plan, ctx.gpus)
            return 0
        if args.fake_checks:
            checks = fake_checks(ctx)
        else:
            if args.wheels and not os.environ.get("GPU_ACCEPTANCE_WHEELS"):
                install_wheels(Path(args.wheels).resolve())
                os.environ["GPU_ACCEPTANCE_WHEELS"] = "1"
                _reexec_with(Path(args.wheels).resolve() / "site", _without_wheels(argv))
            checks = build_checks(ctx, selected(args.only))
            missing = missing_packages()
            if missing:
                raise SetupError(
                    f"missing Python packages: {', '.join(missing)}; carry the wheels (docs/gpu/README.md)"
                )
            ctx.gpus = cuda_gpus()
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    info = environment_info(ctx.gpus, args.commit)
    print(f"{info.get('device', 'no GPU')} x {ctx.gpus}, torch {info['torch']}, accelerate {info['accelerate']}; "
          f"report: {ctx.out}", flush=True)  # fmt: skip
    try:
        results = run_all(checks, ctx, info, echo=lambda line: print(line, flush=True))
    except Interrupted as stop:
        print(f"interrupted ({stop}); the report in {ctx.out} holds the checks done so far", flush=True)
        return 128 + stop.signum
    print(counts_line(results))
    return exit_code(results)


def _without_wheels(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--wheels":
            skip = True
        elif not a.startswith("--wheels="):
            out.append(a)
    return out


def fake_checks(ctx: Context) -> list[Check]:
    """Tiny checks for the tests (``--fake-checks``): one passes, one sleeps until killed, one never starts."""

    def step(label: str, code: str) -> Step:
        return Step(label, [sys.executable, "-c", code])

    def judge(m: dict[str, Any]) -> tuple[str, str]:
        return PASS, "fine"

    sleeper = "import os, time; print('b', 'started', os.getpid(), flush=True); time.sleep(120)"
    spec = [("fake-a", "print('a done')", 30), ("fake-b", sleeper, 150), ("fake-c", "print('c done')", 30)]
    return [Check(n, n, "exits 0", t, [step(n, code)], lambda ctx, o, c: {}, judge, min_s=1) for n, code, t in spec]
