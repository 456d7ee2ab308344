#!/usr/bin/env python
"""GPU acceptance: run accel_train's GPU checks on this machine and write down what happened.

    python scripts/gpu_acceptance.py --plan --json     # the device plan: commands, timeouts, wheels (no GPU needed)
    python scripts/gpu_acceptance.py --only bf16-resume,ddp --budget-s 90 --out DIR [--commit SHA]

Each check runs its children with their output streamed to ``OUT/<check>.log`` and is judged from what they
wrote; ``OUT/acceptance.json`` and ``OUT/acceptance.md`` are rewritten before and after every check, so a run
killed at any moment leaves a report of the checks done so far. A check cut by its timeout or the budget is
"not run (timeout)" / "not run (budget)", never "pass" and never "fail". docs/gpu/README.md has the plan and
how to run it with the device tool; the machinery is benchmarks/gpu_acceptance/ (its ``__init__.py`` says which file
does what).

Exit codes: 0 no check failed, 1 a check failed, 2 this machine cannot run the checks (no CUDA GPU, missing
packages: the line says what to do), 128 + N when signal N stopped it (the report is written first).
"""

import importlib.util
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _importable() -> bool:
    try:
        return importlib.util.find_spec("benchmarks.gpu_acceptance.command") is not None and bool(
            importlib.util.find_spec("accel_train")
        )
    except ModuleNotFoundError:
        return False


if __name__ == "__main__":
    if not _importable():  # started as a script from anywhere: the repository goes on PYTHONPATH, once
        if os.environ.get("GPU_ACCEPTANCE_REEXEC"):
            print(f"error: benchmarks.gpu_acceptance and accel_train cannot be imported from {REPO}", file=sys.stderr)
            sys.exit(2)
        env = {**os.environ, "GPU_ACCEPTANCE_REEXEC": "1"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]], env)
    from benchmarks.gpu_acceptance.command import main

    sys.exit(main())
