"""A new user's first runs on their own folder: the README's command (``python3 scripts/train.py --dataset
imagefolder:DIR --output-dir ...``) timed on a folder of drawn shapes, and on photos.

python -m benchmarks shapes [--seeds 0,1,2] [--classes 3 --per-class 40 --test-per-class 10] [--out DIR] [-- FLAGS]

For each seed: a folder of drawn shapes (``folders.write_shapes_folder``: by default 3 classes, 40 training and 10
test images a class, 64x64, PNG and JPEG; the seed keys the images), then the README's command on it (FLAGS
appended, e.g. ``--model lenet --epochs 40``), in its own process, one after the other. Reported per seed: test
accuracy, steps, whether the memorisation warning fired, the wall time from the process's start to its exit
(imports included), the CPU time it used and the load average while it ran (the machine is shared: the CPU time
says what a quiet one would take); then min and median. Writes OUT/shapes_bench.json and prints a Markdown table
(docs/performance.md).

python -m benchmarks photos [--folder DIR] [--torch-home DIR] [--out DIR] [-- FLAGS]

Fine-tuned from ImageNet weights (the default where they are at hand) against trained from scratch (the default
without them), side by side in one run. ``--folder``: your photos (``DIR/train/<class>/``, ``DIR/val/<class>/`` or
``DIR/test/<class>/``; e.g. the PyTorch transfer-learning tutorial's hymenoptera_data). Without it, a folder of the
tutorial's shape is generated (``folders.write_photo_folder``: 245 training and 153 validation JPEGs, two classes,
300-500 pixels a side): its times are real, its accuracies say nothing about photos. ``--torch-home``: where
torchvision's cache has resnet18's ImageNet weights (``hub/checkpoints/resnet18-f37072fd.pth``); without it, a file
of random values is written under OUT (again: real times, meaningless accuracy). The fine-tuning run has
``TORCH_HOME`` set, the from-scratch one ``ACCEL_TRAIN_OFFLINE=1`` and an empty cache. Reported: the start line's
choice, test accuracy, steps, wall seconds, CPU seconds, load average. Writes OUT/photos_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import children_cpu_s
from benchmarks.data.folders import write_photo_folder, write_shapes_folder

REPO = Path(__file__).resolve().parents[2]
QUIET = ("--report-to", "none", "--no-plots", "--no-progress")
SHAPES_HELP = "A new user's first run on their own folder: the README's command on a generated shapes folder, timed."
PHOTOS_HELP = (
    "The README's folder command on photos: fine-tuned from ImageNet weights (the default where they are at hand) "
    "against trained from scratch (the default without them), side by side in one run."
)


def train_on(folder: Path, run: Path, extra: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The README's command on ``folder`` in a new process: its summary, wall and CPU seconds, the load average
    while it ran, and what it printed."""
    argv = [sys.executable, str(REPO / "scripts" / "train.py"), "--dataset", f"imagefolder:{folder}"]
    argv += ["--output-dir", str(run), "--overwrite", *QUIET, *extra]
    cpu0, load0, t0 = children_cpu_s(), os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})})
    wall, cpu, load1 = time.perf_counter() - t0, children_cpu_s() - cpu0, os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(f"{folder.name}: train.py exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    return {"summary": summary, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "load_avg": round((load0 + load1) / 2, 1), "stdout": proc.stdout.splitlines()}  # fmt: skip


def run_one(out: Path, seed: int, extra: list[str], shape: tuple[int, int, int]) -> dict:
    """One shapes folder (``shape``: classes, training and test images a class) and one run on it."""
    classes, per_class, test_per_class = shape
    folder = out / f"shapes_{classes}x{per_class}_{seed}"
    if not folder.is_dir():
        write_shapes_folder(folder, classes, per_class, test_per_class, seed=seed)
    ran = train_on(folder, out / f"run_{classes}x{per_class}_{seed}", extra)
    s = ran["summary"]
    return {
        "seed": seed,
        "eval_accuracy": s["eval_accuracy"],
        "global_step": s["global_step"],
        "warning": s.get("warning"),
        "wall_s": ran["wall_s"],
        "cpu_s": ran["cpu_s"],
        "train_time_s": round(s["train_time_s"], 1),
        "load_avg": ran["load_avg"],
        "start_line": next((line for line in ran["stdout"] if "defaults for your data" in line), None),
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


def _split(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """(the benchmark's own flags, the FLAGS after ``--`` for every run)."""
    argv = sys.argv[1:] if argv is None else argv
    return (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks shapes``."""
    own, extra = _split(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks shapes", description=SHAPES_HELP)
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


def _random_weights(home: Path) -> None:
    import torch
    import torchvision.models as tvm

    os.environ["TORCH_HOME"] = str(home)
    from accel_train.models.pretrained import cache_path

    path = cache_path(tvm.ResNet18_Weights.DEFAULT)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(tvm.resnet18().state_dict(), path)


def photo_run(folder: Path, out: Path, env: dict[str, str], extra: list[str]) -> dict:
    ran = train_on(folder, out, extra, env)
    s = ran["summary"]
    said = [line for line in ran["stdout"] if "defaults for your data" in line or "look like photos" in line]
    return {"eval_accuracy": s["eval_accuracy"], "global_step": s["global_step"], "model": s.get("model"),
            "wall_s": ran["wall_s"], "cpu_s": ran["cpu_s"], "train_time_s": round(s["train_time_s"], 1),
            "load_avg": ran["load_avg"], "said": said}  # fmt: skip


def photos_main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks photos``."""
    own, extra = _split(argv)
    parser = argparse.ArgumentParser(prog="python -m benchmarks photos", description=PHOTOS_HELP)
    parser.add_argument("--folder", type=Path, default=None, help="your photos (default: a generated folder)")
    parser.add_argument("--torch-home", type=Path, default=None, help="TORCH_HOME with resnet18's ImageNet weights")
    parser.add_argument("--out", type=Path, default=Path("runs/photos_bench"))
    args = parser.parse_args(own)
    args.out.mkdir(parents=True, exist_ok=True)
    folder = args.folder or write_photo_folder(args.out / "photos")
    home = args.torch_home or args.out / "random_weights_home"
    if args.torch_home is None:
        _random_weights(home)
    empty = args.out / "empty_home"
    empty.mkdir(exist_ok=True)
    offline = {"ACCEL_TRAIN_OFFLINE": "1"}
    rows = {
        "fine_tuned": photo_run(folder, args.out / "fine_tuned", {"TORCH_HOME": str(home), **offline}, extra),
        "from_scratch": photo_run(folder, args.out / "from_scratch", {"TORCH_HOME": str(empty), **offline}, extra),
    }
    rows["ratio_wall"] = round(rows["fine_tuned"]["wall_s"] / rows["from_scratch"]["wall_s"], 2)
    result = {"folder": str(folder), "generated": args.folder is None, "real_weights": args.torch_home is not None,
              "cpus": os.cpu_count(), "extra": extra, **rows}  # fmt: skip
    (args.out / "photos_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0
