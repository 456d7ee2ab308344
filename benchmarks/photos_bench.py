"""The README's folder command on photos: fine-tuned from ImageNet weights (the default where they are at hand)
against trained from scratch (the default without them), side by side in one run.

python -m benchmarks photos [--folder DIR] [--torch-home DIR] [--out DIR] [-- FLAGS]

``--folder``: your photos (``DIR/train/<class>/``, ``DIR/val/<class>/`` or ``DIR/test/<class>/``; e.g. the PyTorch
transfer-learning tutorial's hymenoptera_data). Without it, a folder of the tutorial's shape is generated (245
training and 153 validation JPEGs, two classes, 300-500 pixels a side, random textures told apart by their colour
balance): its times are real, its accuracies say nothing about photos. ``--torch-home``: where torchvision's cache
has resnet18's ImageNet weights (``hub/checkpoints/resnet18-f37072fd.pth``); without it, a file of random values is
written under OUT (again: real times, meaningless accuracy). Each run is ``python3 scripts/train.py --dataset
imagefolder:DIR --output-dir ...`` in its own process, the fine-tuning one with ``TORCH_HOME`` set, the
from-scratch one with ``ACCEL_TRAIN_OFFLINE=1`` and an empty cache. Reported: the start line's choice, test
accuracy, steps, wall seconds, CPU seconds, load average. Writes OUT/photos_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.shapes_bench import QUIET, REPO, _children_cpu


def write_photo_folder(root: Path, train: int = 245, val: int = 153, seed: int = 0) -> Path:
    """JPEGs of the tutorial's shape (two classes, sizes 300-500 pixels): textures, told apart by colour balance."""
    from PIL import Image

    for split, count in (("train", train), ("val", val)):
        for c, name in enumerate(("ants", "bees")):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count // 2 + (c == 0) * (count % 2)):
                rng = np.random.default_rng([seed, len(split), c, i])
                h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
                small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3)).astype(np.float32)
                small[..., c] *= 0.8
                image = Image.fromarray(small.astype(np.uint8)).resize((w, h), Image.BILINEAR)
                image.save(folder / f"{i}.jpg", quality=85)
    return root


def _random_weights(home: Path) -> None:
    import torch
    import torchvision.models as tvm

    os.environ["TORCH_HOME"] = str(home)
    from accel_train.models.pretrained import cache_path

    path = cache_path(tvm.ResNet18_Weights.DEFAULT)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(tvm.resnet18().state_dict(), path)


def run_one(folder: Path, out: Path, env: dict[str, str], extra: list[str]) -> dict:
    argv = [sys.executable, str(REPO / "scripts" / "train.py"), "--dataset", f"imagefolder:{folder}"]
    argv += ["--output-dir", str(out), "--overwrite", *QUIET, *extra]
    cpu0, load0, t0 = _children_cpu(), os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, env={**os.environ, **env})
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise SystemExit(f"train.py exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    said = [line for line in proc.stdout.splitlines() if "defaults for your data" in line or "look like photos" in line]
    return {"eval_accuracy": summary["eval_accuracy"], "global_step": summary["global_step"],
            "model": summary.get("model"), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "train_time_s": round(summary["train_time_s"], 1), "load_avg": round((load0 + os.getloadavg()[0]) / 2, 1),
            "said": said}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks photos", description=__doc__.split("\n\n")[0])
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
    rows = {
        "fine_tuned": run_one(folder, args.out / "fine_tuned", {"TORCH_HOME": str(home), "ACCEL_TRAIN_OFFLINE": "1"},
                              extra),
        "from_scratch": run_one(folder, args.out / "from_scratch",
                                {"TORCH_HOME": str(empty), "ACCEL_TRAIN_OFFLINE": "1"}, extra),
    }  # fmt: skip
    rows["ratio_wall"] = round(rows["fine_tuned"]["wall_s"] / rows["from_scratch"]["wall_s"], 2)
    result = {"folder": str(folder), "generated": args.folder is None, "real_weights": args.torch_home is not None,
              "cpus": os.cpu_count(), "extra": extra, **rows}  # fmt: skip
    (args.out / "photos_bench.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
