"""CIFAR-10 time to 94%: airbench's recipe (configs/airbench_cifar10.yaml) through the portable loop.

    python -m benchmarks.speed.speedrun --data-dir data --out runs/speedrun     # alone
    python scripts/benchmark.py --speedrun --data-dir data                # inside the full benchmark

``scripts/train.py --config configs/airbench_cifar10.yaml`` runs as users run it (one GPU where CUDA is
visible, in bf16; the CPU otherwise) and its metrics are read back: the test accuracy with flip TTA after
every epoch, and the **training time** to each (``train_time_s``: every optimizer step, without start-up,
evaluations or checkpoints; a GPU is synchronised before each reading). airbench reports its time the
same way (the training epochs and the whitening set-up, not the per-epoch evaluations), so the two can
stand side by side; its published figures are in ``PUBLISHED``.

Real CIFAR-10 (``<data-dir>/cifar-10-batches-py``) is needed for a comparable figure. Without it the recipe
runs on synthetic CIFAR-shaped data, which says the mode works and nothing about airbench.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accel_train.doctor.launching import REPO

RECIPE = REPO / "configs" / "airbench_cifar10.yaml"
TARGET = 0.94
# airbench's own figures, for the comparison (seconds of training on one GPU, mean accuracy over many runs)
PUBLISHED = (
    {
        "recipe": "airbench ablation main3_scalebias: the recipe of configs/airbench_cifar10.yaml",
        "epochs": 13.5,
        "train_s": 5.5,
        "gpu": "A100",
        "mean_accuracy": 0.9401,
        "source": "KellerJordan/cifar10-zoo, airbench/ablations/README.md",
    },
    {
        "recipe": "airbench94 (adds lookahead, multi-crop TTA, alternating flip, frozen whitening bias)",
        "epochs": 9.9,
        "train_s": 3.83,
        "gpu": "A100-SXM4-80GB",
        "mean_accuracy": 0.9401,
        "source": "airbench94.py header (uncompiled; torch.compile: 3.5 s)",
    },
)
SMOKE_ARGS = ("--max-steps", "6", "--warmup-steps", "2", "--batch-size", "64", "--global-batch-size", "64")
SYNTHETIC_ARGS = ("--dataset", "synthetic", "--synthetic-channels", "3", "--synthetic-image-size", "32")


def cifar10_available(data_dir: str | None) -> bool:
    """The files ``--dataset cifar10`` reads (accel_train.data.vision's names) are all in ``data_dir``."""
    from accel_train.data.vision import CIFAR10_DIR, CIFAR10_TEST_FILE, CIFAR10_TRAIN_FILES

    folder = Path(data_dir or "data").expanduser() / CIFAR10_DIR
    return all((folder / name).is_file() for name in (*CIFAR10_TRAIN_FILES, CIFAR10_TEST_FILE))


def _command(data_dir: str | None, run_dir: Path, cuda: bool, smoke: bool) -> tuple[list[str], str]:
    args = ["--config", str(RECIPE), "--output-dir", str(run_dir), "--overwrite", "--no-plots", "--no-progress"]
    args += ["--report-to", "none", "--mixed-precision", "bf16" if cuda else "no"]
    if cifar10_available(data_dir) and not smoke:
        data = "CIFAR-10"
        args += ["--data-dir", str(data_dir or "data")]
    else:
        data = "synthetic CIFAR-shaped 3x32x32 (not comparable with airbench)"
        sizes = ("512", "256") if smoke else ("50000", "10000")
        args += [*SYNTHETIC_ARGS, "--synthetic-size", sizes[0], "--synthetic-test-size", sizes[1]]
    if smoke:
        args += list(SMOKE_ARGS)
    return [sys.executable, str(REPO / "scripts" / "train.py"), *args], data


def run_speedrun(
    data_dir: str | None, work: Path, env: dict[str, str] | None = None, cuda: bool = False, smoke: bool = False
) -> dict[str, Any]:
    """Train the recipe once and report its accuracy and training time after every epoch, beside airbench's."""
    run_dir = work / "speedrun"
    cmd, data = _command(data_dir, run_dir, cuda, smoke)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    shown = " ".join(["python", "scripts/train.py", *[("OUT" if a == str(run_dir) else a) for a in cmd[2:]]])
    out: dict[str, Any] = {"data": data, "command": shown.replace(str(REPO) + "/", ""), "published": list(PUBLISHED)}
    if proc.returncode != 0:
        return {**out, "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = [
        {"step": r["step"], "epoch": r["epoch"], "accuracy": r["eval_accuracy"], "train_time_s": r["train_time_s"]}
        for r in records
        if r.get("event") == "eval"
    ]
    reached = next((e for e in evals if e["accuracy"] >= TARGET), None)
    return {
        **out,
        "target_accuracy": TARGET,
        "final_accuracy": summary["eval_accuracy"],
        "train_time_s": summary["train_time_s"],
        "reached": reached is not None,
        "train_time_to_target_s": reached["train_time_s"] if reached else None,
        "epochs_to_target": reached["epoch"] + 1 if reached else None,
        "process_wall_s": wall,
        "setup_s": summary["setup_s"],
        "device": summary["device"],
        "mixed_precision": summary["mixed_precision"],
        "steps": summary["global_step"],
        "train_samples_per_s": summary["train_samples_per_s"],
        "peak_memory_mb": summary["peak_memory_mb"],
        "evals": evals,
    }


def markdown(result: dict[str, Any]) -> list[str]:
    """The section of benchmark.md (also the whole of speedrun.md)."""
    lines = ["## CIFAR-10 time to 94%: airbench's recipe in the portable loop", ""]
    if "skipped" in result:
        return lines + [f"Not run: {result['skipped']}."]
    lines += [f"Data: {result['data']}. Command: `{result['command']}`.", ""]
    if "error" in result:
        return lines + [f"**Failed**: {result['error']}"]
    lines += [
        "| run | device | epochs | train s | accuracy (flip TTA) | 94% reached |",
        "|---|---|---:|---:|---:|---|",
        f"| portable loop (this run) | {result['device']} {result['mixed_precision']} | {result['steps']} steps | "
        f"{result['train_time_s']:.2f} | {result['final_accuracy']:.4f} | "
        + (
            f"yes, epoch {result['epochs_to_target']} at {result['train_time_to_target_s']:.2f} s"
            if result["reached"]
            else "no"
        )
        + " |",
    ]
    for p in result["published"]:
        lines.append(
            f"| {p['recipe']} (published) | {p['gpu']} | {p['epochs']} | {p['train_s']} | "
            f"{p['mean_accuracy']:.4f} (mean) | ({p['source']}) |"
        )
    lines += [
        "",
        f"Start-up before the first step: {result['setup_s']:.1f} s; "
        f"the whole process: {result['process_wall_s']:.1f} s; "
        f"{result['train_samples_per_s'] or 0:.0f} samples/s in the steady state.",
    ]
    return lines


def main(argv=None) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m benchmarks.speed.speedrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data", help="folder holding cifar-10-batches-py (default: data)")
    parser.add_argument("--out", default="runs/speedrun", help="writes speedrun.json and speedrun.md here")
    parser.add_argument("--smoke", action="store_true", help="6 steps on synthetic data: checks the mode, not speed")
    args = parser.parse_args(argv)
    import torch

    from benchmarks.speed.devices import one_gpu_env

    env, cuda = one_gpu_env(), torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="accel_speedrun_") as work:
        result = run_speedrun(args.data_dir, Path(work), env, cuda, args.smoke)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speedrun.json").write_text(json.dumps(result, indent=2))
    (out / "speedrun.md").write_text("\n".join(markdown(result)) + "\n")
    print("\n".join(markdown(result)))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
