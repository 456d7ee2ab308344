#!/usr/bin/env python
"""Soak checks for the multi-process paths (maintainers; too slow for CI).

    python scripts/soak.py exits --trials 20      # N consecutive 2-process gloo runs must all exit 0
    python scripts/soak.py restarts --trials 20   # SIGKILL a worker at a random step under --max_restarts;
                                                  # the finished weights must equal an uninterrupted run
    python scripts/soak.py kills --trials 100 [--processes 2]
                                                  # SIGKILL one run N times at random moments (steps, saves,
                                                  # evaluations, exports, the summary), --resume auto each time:
                                                  # weights, metrics.jsonl and the folder must come out whole
                                                  # (benchmarks/kills/campaign.py)

Prints one line per trial and a final 'N passed, N failed' line (kills: one line per attempt, then where the
kills landed and the verdict); writes --out JSON.
"""

import os
import sys
from pathlib import Path

from accel_train.cli import ArgumentParser, run_main  # light: no torch

REPO = Path(__file__).resolve().parents[1]
COMMON = [
    "--model",
    "lenet",
    "--global-batch-size",
    "32",
    "--log-every",
    "1",
    "--report-to",
    "none",
    "--no-plots",
    "--no-progress",
]


def _launch(args, config="multi_cpu.yaml", launch_args=()):
    from accel_train.doctor.launching import script_cmd

    return script_cmd("train.py", *args, config=config, launch_args=launch_args)


def _max_diff(a_dir: Path, b_dir: Path) -> float:
    from safetensors.torch import load_file

    a, b = load_file(str(a_dir / "model" / "model.safetensors")), load_file(str(b_dir / "model" / "model.safetensors"))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def soak_exits(trials: int, work: Path, steps: int) -> list[dict]:
    import subprocess

    results = []
    for i in range(trials):
        out = work / f"exit_{i}"
        proc = subprocess.run(
            _launch([*COMMON, "--max-steps", str(steps), "--output-dir", str(out)]),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        aborted = "terminate called" in proc.stderr or "SIGABRT" in proc.stderr or "exitcode: -6" in proc.stderr
        results.append({"trial": i, "ok": proc.returncode == 0, "returncode": proc.returncode, "sigabrt": aborted})
        print(f"trial {i}: exit {proc.returncode}{' (SIGABRT seen)' if aborted else ''}", flush=True)
    return results


def soak_restarts(trials: int, work: Path, steps: int, seed: int) -> list[dict]:
    import os
    import random
    import signal
    import subprocess

    from accel_train.doctor.launching import child_pids, wait_for_step

    ref = work / "reference"
    subprocess.run(
        _launch([*COMMON, "--max-steps", str(steps), "--output-dir", str(ref)]),
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    rng = random.Random(seed)
    results = []
    for i in range(trials):
        out = work / f"restart_{i}"
        kill_step = rng.randint(2, steps - 2)
        args = [
            *COMMON,
            "--max-steps",
            str(steps),
            "--checkpoint-every",
            "4",
            "--resume",
            "auto",
            "--output-dir",
            str(out),
        ]
        proc = subprocess.Popen(
            _launch(args, launch_args=("--max_restarts", "3")),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        killed = None
        if wait_for_step(out, kill_step, proc):
            kids = child_pids(proc.pid)
            if kids:
                killed = int(rng.choice(kids))
                os.kill(killed, signal.SIGKILL)
        rc = proc.wait(timeout=600)
        diff = _max_diff(ref, out) if rc == 0 else None
        identical = diff == 0.0
        results.append(
            {
                "trial": i,
                "kill_step": kill_step,
                "killed_pid": killed,
                "returncode": rc,
                "max_abs_diff": diff,
                "identical": identical,
                "ok": rc == 0 and diff is not None and diff <= 1e-6,
            }
        )
        print(f"trial {i}: killed a worker at step >= {kill_step}: exit {rc}, max |dw| {diff}", flush=True)
    return results


def _kill_campaign(args) -> int:
    import importlib.util

    if importlib.util.find_spec("benchmarks") is None:  # the harness is not a package: the repository goes on
        if os.environ.get("SOAK_REEXEC"):  # PYTHONPATH, once (as scripts/benchmark.py does)
            raise SystemExit(f"error: benchmarks/ cannot be imported from {REPO}")
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, "SOAK_REEXEC": "1"}
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]], env)
    import json

    from benchmarks.kills.campaign import campaign
    from benchmarks.kills.verdict import summary_lines

    out = Path(args.out) if args.out else None
    result = campaign(
        args.trials, Path(args.work), args.steps or 200, args.processes, args.seed, args.kills_per_run, args.rank_kills
    )
    if out:
        out.write_text(json.dumps({"mode": "kills", **result}, indent=2))
    print("\n".join(summary_lines(result)))
    return 0 if result["ok"] and result["kills"] >= args.trials else 1


def main(argv=None):
    parser = ArgumentParser(description="Soak checks for multi-process runs.")
    parser.add_argument("mode", choices=("exits", "restarts", "kills"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default: 24; kills: 200)")
    parser.add_argument("--processes", type=int, choices=(1, 2), default=1, help="kills: 1, or 2 (multi_cpu.yaml)")
    parser.add_argument("--kills-per-run", type=int, default=10, help="kills: before a new run starts (default: 10)")
    parser.add_argument(
        "--rank-kills", type=float, default=0.25, help="kills on 2 processes: the fraction of one rank only"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for the kill steps (default: 0)")
    parser.add_argument("--work", default="runs/soak", help="scratch folder (default: runs/soak)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)

    import json
    import shutil

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.mode == "kills":
        return _kill_campaign(args)
    if args.mode == "exits":
        results = soak_exits(args.trials, work, args.steps or 24)
    else:
        results = soak_restarts(args.trials, work, args.steps or 24, args.seed)
    passed = sum(r["ok"] for r in results)
    if args.out:
        Path(args.out).write_text(json.dumps({"mode": args.mode, "results": results}, indent=2))
    if args.mode == "restarts":
        print(f"{sum(bool(r['identical']) for r in results)}/{len(results)} bitwise identical to the reference")
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    run_main(main)
