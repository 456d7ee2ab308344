"""A new user's first run on their own folder: the README's command on a generated shapes folder, timed.

python -m benchmarks shapes [--seeds 0,1,2] [--classes 3 --per-class 40 --test-per-class 10] [--out DIR] [-- FLAGS]

For each seed: a folder of ``benchmarks/shapes.py`` (by default 3 classes, 40 training and 10 test images a class,
64x64, PNG and JPEG; the seed keys the images), then ``python3 scripts/train.py --dataset imagefolder:DIR
--output-dir ...`` (the README's command; FLAGS appended, e.g. ``--model lenet --epochs 40``), in
its own process, one after the other. Reported per seed: test accuracy, steps, whether the
memorisation warning fired, the wall time from the process's start to its exit (imports included), the CPU time it
used and the load average while it ran (the machine is shared: the CPU time says what a quiet one would take);
then min and median. Writes OUT/shapes_bench.json and prints a Markdown table (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.shapes import write_shapes_folder

REPO = Path(__file__).resolve().parents[1]
README_FLAGS: tuple[str, ...] = ()  # the README's command names no more (its 64 pixels are the folder's own)
QUIET = ("--report-to", "none", "--no-plots", "--no-progress")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(out: Path, seed: int, extra: list[str], shape: tuple[int, int, int]) -> dict:
    """One folder (``shape``: classes, training and test images a class) and one run of the README's command on
    it, in a new process."""
    classes, per_class, test_per_class = shape
    folder = out / f"shapes_{classes}x{per_class}_{seed}"
    if not folder.is_dir():
        write_shapes_folder(folder, classes, per_class, test_per_class, seed=seed)
    run = out / f"run_{classes}x{per_class}_{seed}"
    argv = [sys.executable, str(REPO / "scripts" / "train.py"), "--dataset", f"imagefolder:{folder}", *README_FLAGS]
    argv += ["--output-dir", str(run), "--overwrite", *QUIET, *extra]
    cpu0, load0, t0 = _children_cpu(), os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall, cpu, load1 = time.perf_counter() - t0, _children_cpu() - cpu0, os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed}: train.py exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    return {
        "seed": seed,
        "eval_accuracy": summary["eval_accuracy"],
        "global_step": summary["global_step"],
        "warning": summary.get("warning"),
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "train_time_s": round(summary["train_time_s"], 1),
        "load_avg": round((load0 + load1) / 2, 1),
        "start_line": next((line for line in proc.stdout.splitlines() if "defaults for your data" in line), None),
    }


def table(rows: list[dict]) -> str:
    lines = ["| seed | test accuracy | steps | warning | wall s (from process start) | CPU s | load avg |"]
    lines.append("|---|---|---|---|---|---|---|")
    for r in rows:
        warned = "yes" if r["warning"] else "no"
        lines.append(
            f"| {r['seed']} | {r['eval_accuracy']:.3f} | {r['global_step']} | {warned} | {r['wall_s']} | "
            f"{r['cpu_s']} | {r['load_avg']} |"
        )
    accs, walls = [r["eval_accuracy"] for r in rows], [r["wall_s"] for r in rows]
    lines.append(
        f"| min / median | {min(accs):.3f} / {statistics.median(accs):.3f} | | | {min(walls)} / "
        f"{statistics.median(walls)} | | |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks shapes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated folder seeds (default: 0,1,2)")
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument("--per-class", type=int, default=40, help="training images a class (default: 40)")
    parser.add_argument("--test-per-class", type=int, default=10, help="test images a class (default: 10)")
    parser.add_argument("--out", type=Path, default=Path("runs/shapes_bench"))
    args = parser.parse_args(own)
    args.out.mkdir(parents=True, exist_ok=True)
    shape = (args.classes, args.per_class, args.test_per_class)
    rows = [run_one(args.out, int(s), extra, shape) for s in args.seeds.split(",")]
    result = {"command_extra": extra, "folder": shape, "cpus": os.cpu_count(), "rows": rows}
    (args.out / "shapes_bench.json").write_text(json.dumps(result, indent=2))
    print(rows[0]["start_line"] or "(no defaults line: --model given)")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
