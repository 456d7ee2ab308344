"""A run beside a busy process (issue 50): samples/s with all cores, with fewer threads and with the default, on
an idle machine and beside a CPU hog, side by side in one run.

python -m benchmarks busy-threads [--rounds 3] [--steps 100] [--hogs 1] [--out DIR] [--json FILE]

The data is an MNIST-shaped image folder (``benchmarks/data/folders.py``: 28x28, 10 classes, 2,000 training
images), trained by the README's folder command with its defaults (``scripts/train.py --dataset imagefolder:DIR``,
``--max-steps STEPS``) in a new process per case. *Busy*: ``--hogs`` processes spinning a Python loop (one core
each) start before the run and are killed after it. Each round runs every case once, in the same order, so a
drift in the machine's speed hits them alike; each case's ratio is against the round's idle run on all cores,
then the median over rounds. Beside every case: the cores that work outside this benchmark used meanwhile
(``/proc/stat`` less the benchmark's own processes), since a shared machine is never quite idle.

Cases: ``--threads N`` (N: the cores this process may use; the default before issue 50) idle and busy, with
OpenMP's default wait policy (its threads spin for a while after each parallel region) and with
``OMP_WAIT_POLICY=PASSIVE`` (they sleep at once); ``--threads 1`` busy; and the default (no ``--threads``: the
thread count ``accel_train/cpu_load.py`` chooses), idle and busy. Writes ``OUT/busy_threads.json`` (and
``--json FILE``) and prints a Markdown table (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.common import children_cpu_s

REPO = Path(__file__).resolve().parents[2]
QUIET = ("--report-to", "none", "--no-plots", "--no-progress")
HOG = "while True: pass"
START_LINE = re.compile(r"(\d+) thread\(s\)/process \(([^)]*)\)")
# what a case's run must not inherit from the benchmark's own environment (the test suite pins both)
CLEARED = ("ACCEL_TRAIN_BUSY_CORES", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")


class Case(NamedTuple):
    name: str
    busy: bool
    threads: int | None  # None: the default
    env: tuple[tuple[str, str], ...] = ()


def cases(cores: int) -> list[Case]:
    passive = (("OMP_WAIT_POLICY", "PASSIVE"),)
    return [
        Case(f"--threads {cores}, idle", False, cores),
        Case(f"--threads {cores}, busy", True, cores),
        Case(f"--threads {cores}, OMP_WAIT_POLICY=PASSIVE, idle", False, cores, passive),
        Case(f"--threads {cores}, OMP_WAIT_POLICY=PASSIVE, busy", True, cores, passive),
        Case("--threads 1, idle", False, 1),
        Case("--threads 1, busy", True, 1),
        Case("default, idle", False, None),
        Case("default, busy", True, None),
    ]


def _start_hogs(n: int) -> list[subprocess.Popen]:
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]
    time.sleep(1.0)  # on the CPU before the run starts: its start-up is where the default counts other work
    return hogs


def _stop(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def _env(case: Case) -> dict[str, str]:
    from accel_train.doctor.launching import child_env

    env = {k: v for k, v in child_env().items() if k not in CLEARED}
    env.update(dict(case.env))
    return env


def run_case(case: Case, folder: Path, out: Path, steps: int, hogs: int) -> dict[str, Any]:
    """One run of ``case`` in a new process, with its hogs around it; what it trained at and what else ran."""
    from accel_train.cpu_load import others_busy, sample

    run = out / "run"
    argv = [sys.executable, str(REPO / "scripts" / "train.py"), "--dataset", f"imagefolder:{folder}"]
    argv += ["--max-steps", str(steps), "--output-dir", str(run), "--overwrite", *QUIET]
    argv += ["--threads", str(case.threads)] if case.threads else []
    before, cpu0 = sample(), children_cpu_s()
    started = _start_hogs(hogs if case.busy else 0)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=REPO, env=_env(case), capture_output=True, text=True, timeout=1200)
    finally:
        _stop(started)
    wall = time.perf_counter() - t0
    after, ours_s = sample(), children_cpu_s() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"{case.name}: train.py exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    line = START_LINE.search(proc.stdout)
    window = after.at - before.at
    others = others_busy(before, after) if before and after else None
    return {
        "case": case.name,
        "samples_per_s": summary["train_samples_per_s"],
        "train_time_s": round(summary["train_time_s"], 2),
        "threads": summary["threads_per_process"],
        "threads_why": line.group(2) if line else None,
        "wall_s": round(wall, 2),
        # cores used by work outside this benchmark while the case ran (its own run and hogs taken out)
        "background_cores": None if others is None else round(max(0.0, others - ours_s / window), 2),
    }


def _paired(runs: list[dict[str, Any]], base: list[float]) -> float:
    return round(statistics.median(r["samples_per_s"] / b for r, b in zip(runs, base, strict=True)), 3)


def summarise(rounds: list[list[dict[str, Any]]], baseline: str) -> list[dict[str, Any]]:
    """Per case: the median samples/s over rounds, and the median of each round's ratio to ``baseline`` and to the
    round's fastest run without hogs (on a machine that other work keeps busy, ``baseline`` is slowed too)."""
    rows = []
    base = [next(c for c in r if c["case"] == baseline)["samples_per_s"] for r in rounds]
    best = [max(c["samples_per_s"] for c in r if not c["case"].endswith(", busy")) for r in rounds]
    for i, first in enumerate(rounds[0]):
        runs = [r[i] for r in rounds]
        rows.append(
            {
                "case": first["case"],
                "samples_per_s": round(statistics.median(r["samples_per_s"] for r in runs), 1),
                "ratio_vs_idle": _paired(runs, base),
                "ratio_vs_best_idle": _paired(runs, best),
                "threads": sorted({r["threads"] for r in runs}),
                "threads_why": [r["threads_why"] for r in runs],
                "background_cores": [r["background_cores"] for r in runs],
                "runs_samples_per_s": [round(r["samples_per_s"], 1) for r in runs],
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| case | samples/s (median) | vs idle on all cores | vs the fastest idle | threads | background cores |"]
    lines.append("|---|---:|---:|---:|---|---|")
    for r in rows:
        background = ", ".join("-" if b is None else f"{b:.1f}" for b in r["background_cores"])
        threads = "/".join(str(t) for t in r["threads"])
        rate, ratios = f"{r['samples_per_s']:.0f}", f"{r['ratio_vs_idle']:.2f}x | {r['ratio_vs_best_idle']:.2f}x"
        lines.append(f"| {r['case']} | {rate} | {ratios} | {threads} | {background} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from accel_train.runtime import available_cores
    from benchmarks.common import cpu_description
    from benchmarks.data.folders import generate

    parser = argparse.ArgumentParser(prog="python -m benchmarks busy-threads", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of every case (default: 3)")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps a run (default: 100)")
    parser.add_argument("--hogs", type=int, default=1, help="busy processes beside a busy case (default: 1)")
    parser.add_argument("--only", default=None, help="comma-separated case numbers (1-8) to run (default: all)")
    parser.add_argument("--out", type=Path, default=Path("runs/busy_threads"))
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    cores = available_cores()
    chosen = cases(cores)
    if args.only:
        chosen = [chosen[int(i) - 1] for i in args.only.split(",")]
    folder = args.out / "mnist_shaped"
    if not (folder / "train").is_dir():
        generate(folder, train=2000, test=200, size=28, classes=10, workers=cores)
    rounds = []
    for k in range(args.rounds):
        rounds.append([run_case(c, folder, args.out, args.steps, args.hogs) for c in chosen])
        print(f"round {k + 1}: " + ", ".join(f"{r['case']} {r['samples_per_s']:.0f}" for r in rounds[-1]), flush=True)
    rows = summarise(rounds, chosen[0].name)
    result = {
        "command": "python -m benchmarks busy-threads " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {**cpu_description(), "cores": cores, "torch": _torch_version()},
        "workload": f"scripts/train.py --dataset imagefolder:<28x28, 10 classes, 2000 train> --max-steps {args.steps}",
        "hogs": args.hogs,
        "baseline": chosen[0].name,
        "rows": rows,
        "rounds": rounds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    for path in filter(None, (args.out / "busy_threads.json", args.json)):
        path.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    return 0


def _torch_version() -> str:
    import torch

    return torch.__version__
