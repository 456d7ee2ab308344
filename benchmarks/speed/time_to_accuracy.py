"""Time to 97% test accuracy from launch: ``scripts/train.py`` with its defaults, stopped once an evaluation
reaches the target, against the seed-000 recipe (per-sample PIL images, ``ToTensor``, a DataLoader with workers,
a ``.to(device)`` per step) in a child process of its own; on digits, and on MNIST in a full run given
``--data-dir``; and time to 98% on MNIST-format data against pytorch/examples' recipe (``mnist_rival``)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from accel_train.doctor.launching import REPO
from benchmarks.common import _load_json, _new_lines, _tail
from benchmarks.speed.devices import one_gpu_env
from benchmarks.speed.mnist_rival import compare_mnist
from benchmarks.speed.setups import TRAIN_SCRIPT, BenchOptions

TARGET_ACCURACY = 0.97
SEED000_LR, SEED000_BATCH, SEED000_WORKERS = 1e-3, 64, 2


def mnist_available(data_dir: str | None) -> bool:
    if not data_dir:
        return False
    from accel_train.data.vision import MNIST_FILES

    raw = Path(data_dir).expanduser() / "MNIST" / "raw"
    names = [n for pair in MNIST_FILES.values() for n in pair]
    return all((raw / n).is_file() or (raw / f"{n}.gz").is_file() for n in names)


def _new_evals(metrics: Path, offset: int, now: float) -> tuple[list[dict[str, Any]], int]:
    """The eval records completed in ``metrics`` (a growing metrics.jsonl) past ``offset``, stamped ``now``;
    returns them and the new offset."""
    lines, offset = _new_lines(metrics, offset)
    records = [json.loads(line) for line in lines]
    return [
        {
            "step": r["step"],
            "epoch": r["epoch"],
            "accuracy": r["eval_accuracy"],
            "time_s": now,
            "logger_time_s": r.get("time_s"),
        }
        for r in records
        if r.get("event") == "eval"
    ], offset


def time_to_accuracy_portable(
    dataset: str,
    data_dir: str | None,
    work: Path,
    cap_s: float,
    target: float = TARGET_ACCURACY,
    config: str | None = None,
) -> dict[str, Any]:
    """``python scripts/train.py`` with its defaults, or with the hyperparameter file ``config`` (a path from the
    repository root, e.g. ``configs/mnist_speedrun.yaml``: its own evaluation cadence); seconds from launch to the
    first eval >= ``target``.

    metrics.jsonl is polled while the run trains; each eval line is timestamped when it
    appears (its ``time_s`` counts from the run's logger start, after imports and data).
    The run is stopped (SIGTERM: it checkpoints and exits) once the target is reached.
    """
    run_dir = work / f"t2a_{Path(config).stem if config else 'portable'}_{dataset}"
    args = ["--output-dir", str(run_dir), "--overwrite", "--no-plots"]
    if config:
        args = ["--config", config, *args]
    else:
        args += ["--eval-every", "5" if dataset == "digits" else "100"]
    if dataset != "digits":
        args += ["--dataset", dataset, "--data-dir", str(data_dir)]
    cmd = [sys.executable, str(TRAIN_SCRIPT), *args]
    metrics = run_dir / "metrics.jsonl"
    evals: list[dict[str, Any]] = []
    reached: dict[str, Any] | None = None
    t_launch = time.perf_counter()
    err_path = run_dir.with_suffix(".err")
    with open(err_path, "w") as err:  # a file, not a pipe: a chatty child can never block on it
        proc = subprocess.Popen(cmd, cwd=REPO, env=one_gpu_env(), stdout=subprocess.DEVNULL, stderr=err)
    offset = 0
    stopped_by = None
    while True:
        done = proc.poll() is not None
        now = time.perf_counter() - t_launch
        new, offset = _new_evals(metrics, offset, now)
        evals += new
        reached = reached or next((e for e in new if e["accuracy"] >= target), None)
        if done:
            break
        if reached is not None or now > cap_s:
            stopped_by = "target reached" if reached is not None else f"cap of {cap_s:.0f}s"
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            continue
        time.sleep(0.05)
    stderr = err_path.read_text(errors="replace")
    out: dict[str, Any] = {
        "recipe": config or "scripts/train.py defaults (lenet, batch 32, Adam 2e-3 cosine, in-memory uint8 batches)",
        "command": " ".join(["python", "scripts/train.py", *[("OUT" if a == str(run_dir) else a) for a in args]]),
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "train_time_to_target_s": reached["logger_time_s"] if reached else None,
        "step": reached["step"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in evals), default=None),
        "evals": len(evals),
        "stopped": stopped_by,
        "wall_s": time.perf_counter() - t_launch,
    }
    if proc.returncode not in (0, None) and stopped_by is None:
        out["error"] = f"exit {proc.returncode}: {_tail(stderr)}"
    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def time_to_accuracy_seed000(
    dataset: str, data_dir: str | None, work: Path, cap_s: float, max_epochs: int
) -> dict[str, Any]:
    out_path = work / f"t2a_seed000_{dataset}.json"
    spec_path = work / f"t2a_seed000_{dataset}_spec.json"
    t_launch = time.time()
    spec = {
        "dataset": dataset,
        "data_dir": data_dir,
        "t_launch": t_launch,
        "cap_s": cap_s,
        "max_epochs": max_epochs,
        "out": str(out_path),
    }
    spec_path.write_text(json.dumps(spec))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "benchmarks.speed.run", "--child", "seed000", str(spec_path)],
            cwd=REPO,
            env=one_gpu_env(),
            capture_output=True,
            text=True,
            timeout=cap_s + 300,
        )
    except subprocess.TimeoutExpired:
        return {"error": "timed out", "reached": False}
    if proc.returncode != 0 or not out_path.is_file():
        return {"error": f"exit {proc.returncode}: {_tail(proc.stderr)}", "reached": False}
    result = _load_json(out_path)
    result["wall_s"] = time.time() - t_launch
    return result


def _seed000_loaders(spec: dict[str, Any]):
    """The seed-000 recipe's data: torchvision-style per-sample PIL datasets with ToTensor in DataLoaders with
    workers (train shuffled, test in batches of 1000), after ``torch.manual_seed(0)``."""
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset
    from torchvision import transforms

    from accel_train.data.base import DataConfig

    if spec["dataset"] == "digits":
        from accel_train.data.digits import build_digits

        splits = build_digits(DataConfig())  # load_digits_dataset(), resized to 28x28 like the package
    else:
        from accel_train.data.vision import build_mnist

        splits = build_mnist(DataConfig(dataset="mnist", data_dir=spec["data_dir"]))

    class PILDataset(Dataset):
        """Like torchvision.datasets.MNIST: uint8 storage, one PIL image + transform per sample."""

        def __init__(self, split, transform):
            self.data = split.images[:, 0].numpy()
            self.targets = split.labels.tolist()
            self.transform = transform

        def __len__(self) -> int:
            return len(self.targets)

        def __getitem__(self, index: int):
            return self.transform(Image.fromarray(self.data[index])), self.targets[index]

    torch.manual_seed(0)
    to_tensor = transforms.ToTensor()
    train_dl = DataLoader(
        PILDataset(splits.train, to_tensor), batch_size=SEED000_BATCH, shuffle=True, num_workers=SEED000_WORKERS
    )
    test_dl = DataLoader(
        PILDataset(splits.test, to_tensor), batch_size=1000, shuffle=False, num_workers=SEED000_WORKERS
    )
    return train_dl, test_dl


def _child_seed000(spec: dict[str, Any]) -> None:
    """The seed-000 recipe: torchvision-style per-sample PIL dataset, ToTensor, DataLoader workers, .to(device)."""
    t_launch, cap_s = spec["t_launch"], spec["cap_s"]
    import torch
    import torch.nn.functional as F

    from accel_train.models import create_model

    train_dl, test_dl = _seed000_loaders(spec)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = create_model("mnist_cnn", 10, 1, 28).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=SEED000_LR)
    epochs: list[dict[str, Any]] = []
    reached, capped = None, False
    for epoch in range(1, spec["max_epochs"] + 1):
        model.train()
        for images, labels in train_dl:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            if time.time() - t_launch > cap_s:
                capped = True
                break
        if capped:
            break
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for images, labels in test_dl:
                images, labels = images.to(device), labels.to(device)
                correct += (model(images).argmax(1) == labels).sum().item()
                total += labels.numel()
        accuracy = correct / total
        epochs.append({"epoch": epoch, "time_s": time.time() - t_launch, "accuracy": accuracy})
        if accuracy >= TARGET_ACCURACY:
            reached = epochs[-1]
            break
    result = {
        "recipe": (
            f"per-sample PIL + ToTensor, DataLoader(num_workers={SEED000_WORKERS}, shuffle=True), .to(device) "
            f"per step, mnist_cnn, Adam {SEED000_LR:g}, batch {SEED000_BATCH}, eval after each epoch"
        ),
        "reached": reached is not None,
        "time_to_target_s": reached["time_s"] if reached else None,
        "epoch": reached["epoch"] if reached else None,
        "best_accuracy": max((e["accuracy"] for e in epochs), default=None),
        "epochs": epochs,
        "cap_s": cap_s,
        "max_epochs": spec["max_epochs"],
        "stopped": "target reached" if reached else (f"cap of {cap_s:.0f}s" if capped else "max epochs"),
        "elapsed_s": time.time() - t_launch,
    }
    Path(spec["out"]).write_text(json.dumps(result))


def time_to_accuracy(opts: BenchOptions, work: Path) -> dict[str, Any]:
    full = opts.mode == "full"
    caps = {"portable": 600.0 if full else 60.0, "seed000": 600.0 if full else 30.0, "epochs": 20 if full else 8}
    out: dict[str, Any] = {"target_accuracy": TARGET_ACCURACY, "caps": caps}
    datasets = ["digits"]
    if mnist_available(opts.data_dir):
        if full:
            datasets.append("mnist")
        else:
            out["mnist"] = {"skipped": "--quick: MNIST time to accuracy only in a full run"}
    else:
        out["mnist"] = {
            "skipped": (
                "no --data-dir given" if not opts.data_dir else f"no MNIST IDX files under {opts.data_dir}/MNIST/raw"
            )
        }
    out["mnist_vs_examples"] = compare_mnist(
        opts.mode,
        opts.data_dir,
        full and mnist_available(opts.data_dir),
        work,
        opts.n_repeats(),
        opts.log,
        time_to_accuracy_portable,
    )
    for ds in datasets:
        opts.log(f"bench: time to {TARGET_ACCURACY:.0%} on {ds}: portable loop")
        portable = time_to_accuracy_portable(ds, opts.data_dir, work, caps["portable"])
        opts.log(f"bench: time to {TARGET_ACCURACY:.0%} on {ds}: seed-000 recipe")
        seed = time_to_accuracy_seed000(ds, opts.data_dir, work, caps["seed000"], caps["epochs"])
        entry: dict[str, Any] = {"portable": portable, "seed000": seed}
        if portable.get("reached"):
            if seed.get("reached"):
                entry["speedup"] = seed["time_to_target_s"] / portable["time_to_target_s"]
                entry["speedup_is_lower_bound"] = False
            elif "elapsed_s" in seed:  # not reached in its budget: the speedup is at least this
                entry["speedup"] = seed["elapsed_s"] / portable["time_to_target_s"]
                entry["speedup_is_lower_bound"] = True
        out[ds] = entry
    return out
