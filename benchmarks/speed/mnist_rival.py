"""Time to accuracy on MNIST-format data from process start: ``scripts/train.py`` with its defaults, and with our
MNIST speed-run recipe (``configs/mnist_speedrun.yaml``), against pytorch/examples' MNIST recipe
(``benchmarks/speed/examples_mnist.py``), each launched as a user launches it, timed from the launch to the first
evaluation at or above the target, interleaved over repeats.

The data is ``--data-dir``'s ``MNIST/raw`` IDX files where they are there; otherwise MNIST-shaped handwriting
written to a temporary folder (``write_synthetic_mnist``): scikit-learn's 8x8 digits (real handwriting, 1,797
images), scaled to a 20x20 digit centred in 28x28 as MNIST's are, each copy under a small random rotation, scale
and shift, the train copies drawn from 1,437 of the images and the test copies from the other 360.
"""

from __future__ import annotations

import math
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accel_train.doctor.launching import REPO
from benchmarks.common import _new_lines, _tail
from benchmarks.speed.devices import one_gpu_env

RIVAL_SCRIPT = Path(__file__).resolve().with_name("examples_mnist.py")
SPEEDRUN_RECIPE = "configs/mnist_speedrun.yaml"  # ours, tuned for time to accuracy (the goal is judged on it)
MNIST_TARGET = 0.98
# --quick: a smaller synthetic set, and a target it reaches in the rival's first epochs on a 2-core CPU.
SIZES = {"full": (8000, 2000), "quick": (2000, 1000)}
TARGETS = {"full": MNIST_TARGET, "quick": 0.9}
RIVAL_RECIPE = (
    "pytorch/examples mnist/main.py defaults: Net (2 conv, dropout, 2 fc, log_softmax), Adadelta lr 1.0, "
    "StepLR gamma 0.7, batch 64, test batch 1000, ToTensor + Normalize((0.1307,), (0.3081,)), "
    "torchvision.datasets.MNIST; on CPU no shuffle and no workers, as the original; a test pass after each epoch"
)


def write_synthetic_mnist(root: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """MNIST-shaped handwriting as uncompressed IDX files in ``root/MNIST/raw`` (what torchvision reads without
    downloading); returns ``root``."""
    import numpy as np
    import torch

    from accel_train.data.digits import _read_digits_csv
    from accel_train.data.vision import MNIST_FILES

    pixels, labels = _read_digits_csv()
    sources = torch.from_numpy(pixels.reshape(-1, 1, 8, 8) * (255.0 / 16.0)).float()
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(labels)))
    split = {"test": order[:360], "train": order[360:]}
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    for name, n in (("train", n_train), ("test", n_test)):
        idx = split[name][torch.randperm(n, generator=gen) % len(split[name])]  # in random order, classes mixed
        images = _jittered(sources[idx], gen)
        images_name, labels_name = MNIST_FILES[name]
        _write_idx(raw / images_name, images.numpy())
        _write_idx(raw / labels_name, labels[idx.numpy()].astype(np.uint8))
    return root


def _jittered(digits8, gen):
    """8x8 digits -> uint8 [N, 28, 28]: a 20x20 digit centred in 28x28, rotated up to 6 degrees, scaled by
    0.95-1.05, shifted up to 1 pixel."""
    import torch
    import torch.nn.functional as F

    n = len(digits8)
    canvas = F.pad(F.interpolate(digits8, size=(20, 20), mode="bilinear", align_corners=False), (4, 4, 4, 4))

    def uniform(*shape):
        return torch.rand(*shape, generator=gen) * 2 - 1

    angle, scale, shift = uniform(n) * math.radians(6), 1 + 0.05 * uniform(n), uniform(n, 2) * (1 / 14)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
    grid = F.affine_grid(theta, list(canvas.shape), align_corners=False)
    out = F.grid_sample(canvas, grid, align_corners=False)
    return out[:, 0].round().clamp(0, 255).to(torch.uint8)


def _write_idx(path: Path, array) -> None:
    import struct

    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def time_rival(data_dir: str, work: Path, target: float, cap_s: float, max_epochs: int) -> dict[str, Any]:
    """``python benchmarks/speed/examples_mnist.py``: seconds from launch to the first test pass >= ``target``, each
    ``eval`` line timestamped as it appears in the child's output (a file, polled)."""
    import json

    cmd = [sys.executable, str(RIVAL_SCRIPT), "--data-dir", str(data_dir), "--epochs", str(max_epochs)]
    cmd += ["--stop-at", str(target)]
    out_path, err_path = work / "rival.out", work / "rival.err"
    evals: list[dict[str, Any]] = []
    t_launch = time.perf_counter()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO, env=one_gpu_env(), stdout=out, stderr=err)
    offset, stopped = 0, None
    while True:
        done = proc.poll() is not None
        now = time.perf_counter() - t_launch
        lines, offset = _new_lines(out_path, offset)
        for line in lines:
            if line.startswith("eval "):
                evals.append({**json.loads(line[5:]), "time_s": now})
        if done:
            break
        if now > cap_s:
            stopped = f"cap of {cap_s:.0f}s"
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            continue
        time.sleep(0.05)
    reached = next((e for e in evals if e["accuracy"] >= target), None)
    result: dict[str, Any] = {
        "recipe": RIVAL_RECIPE,
        "command": "python benchmarks/speed/examples_mnist.py --data-dir DATA "
        f"--epochs {max_epochs} --stop-at {target}",
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in evals), default=None),
        "evals": evals,
        "stopped": "target reached" if reached else (stopped or "max epochs"),
        "elapsed_s": time.perf_counter() - t_launch,
    }
    if proc.returncode not in (0, None) and stopped is None:
        result["error"] = f"exit {proc.returncode}: {_tail(err_path.read_text(errors='replace'))}"
    return result


def _median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if len(values) == len(runs) and values else None


def compare_mnist(
    mode: str, data_dir: str | None, real: bool, work: Path, repeats: int, log, run_ours
) -> dict[str, Any]:
    """Ours with its defaults and with the speed-run recipe (``run_ours``:
    ``time_to_accuracy.time_to_accuracy_portable``) and the rival, interleaved (defaults, recipe, rival, defaults,
    ...), ``repeats`` of each, on ``data_dir``'s MNIST (``real``) or on synthetic MNIST-shaped data written into
    ``work``."""
    target = MNIST_TARGET if real or mode == "full" else TARGETS["quick"]
    if real:
        data, description = str(data_dir), f"MNIST IDX files from --data-dir ({data_dir})"
    else:
        n_train, n_test = SIZES["full" if mode == "full" else "quick"]
        data = str(write_synthetic_mnist(work / "synthetic_mnist", n_train, n_test))
        description = (
            f"synthetic MNIST-shaped handwriting, {n_train} train / {n_test} test (scikit-learn's digits at 28x28 "
            "with a small random rotation, scale and shift; not MNIST: the ratio says how both recipes start and learn "
            "on MNIST-format data, not what they do on MNIST)"
        )
    cap_s, max_epochs = (900.0, 14) if mode == "full" else (120.0, 4)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "recipe": [], "rival": []}
    for rep in range(repeats):
        step = f"bench: [{rep + 1}/{repeats}] time to {target:.0%} on MNIST-format data:"
        log(f"{step} scripts/train.py defaults")
        runs["ours"].append(run_ours("mnist", data, work, cap_s, target=target))
        log(f"{step} scripts/train.py --config {SPEEDRUN_RECIPE}")
        runs["recipe"].append(run_ours("mnist", data, work, cap_s, target=target, config=SPEEDRUN_RECIPE))
        log(f"{step} pytorch/examples' recipe")
        runs["rival"].append(time_rival(data, work, target, cap_s, max_epochs))
    row: dict[str, Any] = {
        "data": description,
        "synthetic": not real,
        "target_accuracy": target,
        "repeats": repeats,
        "caps": {"seconds": cap_s, "rival_epochs": max_epochs},
    }
    for side, side_runs in runs.items():
        by_time = sorted(range(repeats), key=lambda i: side_runs[i].get("time_to_target_s") or math.inf)
        row[side] = {**side_runs[by_time[(repeats - 1) // 2]], "runs_s": [r.get("time_to_target_s") for r in side_runs]}
        row[f"{side}_median_s"] = _median_of(side_runs, "time_to_target_s")
    rival_s = row["rival_median_s"]
    for side, prefix in (("ours", ""), ("recipe", "recipe_")):
        ours_s = row[f"{side}_median_s"]
        row[f"{prefix}speedup"] = rival_s / ours_s if ours_s and rival_s else None
        row[f"{prefix}pair_speedups"] = [
            r["time_to_target_s"] / o["time_to_target_s"]
            for o, r in zip(runs[side], runs["rival"], strict=True)
            if o.get("reached") and r.get("reached")
        ]
    return row
