"""Data at scale: an image folder of 100,000 or 1,000,000 files, ours beside torchvision's ``ImageFolder``.

python -m benchmarks data-scale --root /big/f100k --train 100000 --out runs/data_scale            # 100k
python -m benchmarks data-scale --root /big/f1m --train 990000 --test 10000 --no-rival --remove   # 1M

The folder is generated first if it is not complete (``folders.generate``: 32x32 PNGs, 10 classes,
``train/`` and ``test/``). Then, each a new process timed from its launch to its first optimizer step (the first
``train`` line of metrics.jsonl with ``--log-every 1``; the rival's own line), with its peak resident memory:

* ``first_launch``: ``scripts/train.py --dataset imagefolder:ROOT --model resnet18`` with an empty index cache;
* ``second_launch``: a new run on the same folder (the index read from the cache);
* ``resume``: ``--resume auto`` of the first run (stopped by ``--stop-at-step``), to its next step;
* ``rival``: ``benchmarks/data/imagefolder_rival.py``, the same model, batch and size with torchvision alone;
* ``small``: ours on a 1,000-image folder, for the memory each file costs (peak minus the small run's, per file).

And the data pipeline alone, in this process, images/s over the same files with ``--workers`` DataLoader workers:
ours (the dataset ``build_dataset`` returns, through ``make_loader``) and torchvision's ``ImageFolder`` +
``DataLoader``, interleaved ``--repeats`` times. The page cache is warm for every side (the generation wrote the
files). Writes OUT/data_scale.json and OUT/data_scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import _new_lines, _tail
from benchmarks.data.folders import generate

REPO = Path(__file__).resolve().parents[2]
TRAIN = [sys.executable, str(REPO / "scripts" / "train.py")]
RIVAL = [sys.executable, str(Path(__file__).resolve().with_name("imagefolder_rival.py"))]
QUIET = ["--report-to", "none", "--no-plots", "--no-progress", "--log-every", "1"]


def _count(root: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(root))


def ensure_folder(root: Path, train: int, test: int, workers: int) -> dict[str, Any]:
    if root.is_dir() and _count(root) == train + test:
        return {"root": str(root), "generated_s": None, "files": train + test}
    return {"root": str(root), "generated_s": generate(root, train, test, workers=workers), "files": train + test}


def _first_step(cmd: list[str], first_line: Path, env: dict[str, str], timeout: float, field: str) -> dict[str, Any]:
    """Launch ``cmd``; seconds from launch to the first line of ``first_line`` whose ``field`` is set, and the
    process's peak resident memory (its own, not its DataLoader workers')."""
    offset, first = (first_line.stat().st_size if first_line.is_file() else 0), None  # a resume appends
    t_launch = time.time()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while first is None and proc.poll() is None and time.time() - t_launch < timeout:
        lines, offset = _new_lines(first_line, offset)
        first = next((json.loads(line) for line in lines if field in json.loads(line)), None)
        if first is None:
            time.sleep(0.01)
    seen = time.time()
    _, status, usage = os.wait4(proc.pid, 0)
    output = proc.stdout.read() if proc.stdout else ""
    if first is None:
        lines, offset = _new_lines(first_line, offset)
        first = next((json.loads(line) for line in lines if field in json.loads(line)), None)
    if first is None:
        return {"error": _tail(output), "exit": os.waitstatus_to_exitcode(status)}
    # the rival stamps its own line; ours is seen by polling (at most 10 ms late)
    t_first = first.get("t", seen) - t_launch
    return {"first_step_s": round(t_first, 3), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "exit": os.waitstatus_to_exitcode(status)}  # fmt: skip


def ours(root: Path, out: Path, env: dict[str, str], *extra: str, workers: int = 0) -> dict[str, Any]:
    cmd = [*TRAIN, "--dataset", f"imagefolder:{root}", "--model", "resnet18", "--max-steps", "50", *QUIET]
    cmd += ["--output-dir", str(out), "--num-workers", str(workers), *extra]
    return _first_step(cmd, out / "metrics.jsonl", env, 900, "loss")


def rival(root: Path, work: Path, env: dict[str, str], workers: int = 0) -> dict[str, Any]:
    out = work / f"rival-{time.time_ns()}.jsonl"
    return _first_step([*RIVAL, str(root), str(out), "--workers", str(workers)], out, env, 900, "step")


def launches(root: Path, work: Path, with_rival: bool, small: Path | None) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(prefix="index-cache-", dir=work))
    env = {**os.environ, "ACCEL_TRAIN_CACHE": str(cache), "CUDA_VISIBLE_DEVICES": ""}
    rows: dict[str, Any] = {}
    rows["first_launch"] = ours(root, work / "first", env, "--stop-at-step", "2")
    rows["second_launch"] = ours(root, work / "second", env, "--stop-at-step", "1")
    rows["resume"] = ours(root, work / "first", env, "--resume", "auto", "--stop-at-step", "3")
    if with_rival:
        rows["rival"] = rival(root, work, env)
        rows["rival_again"] = rival(root, work, env)
    if small is not None:
        rows["small"] = ours(small, work / "small", env, "--stop-at-step", "1")
    return rows


def memory_probe(root: Path, side: str) -> dict[str, Any]:
    """In this process (a fresh one): the peak resident memory after the imports and after indexing ``root``
    (ours: ``build_dataset``, the index, the sample and the statistics; torchvision: ``ImageFolder``)."""
    import resource

    import torch  # noqa: F401
    from torchvision.datasets import ImageFolder

    from accel_train.data import DataConfig, build_dataset

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if side == "ours":
        splits = build_dataset(DataConfig(dataset=f"imagefolder:{root}"))
        files = len(splits.train) + len(splits.test)
    else:
        files = len(ImageFolder(str(root / "train"))) + len(ImageFolder(str(root / "test")))
    seconds = time.perf_counter() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    return {"side": side, "files": files, "index_s": round(seconds, 3), "peak_growth_mb": round(grown / 2**20, 1),
            "bytes_per_file": round(grown / files, 1)}  # fmt: skip


def memory(root: Path, env: dict[str, str]) -> dict[str, Any]:
    """:func:`memory_probe` of each side in a fresh process (ours twice: the first indexes, the second reads the
    cache)."""
    out = {}
    for label, side in (("ours_first", "ours"), ("ours_cached", "ours"), ("torchvision", "torchvision")):
        cmd = [sys.executable, "-m", "benchmarks.data.scale", "--root", str(root), "--memory-probe", side]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        out[label] = json.loads(proc.stdout.splitlines()[-1]) if proc.returncode == 0 else {"error": _tail(proc.stderr)}
    return out


def pipeline_rate(root: Path, workers: int, batches: int, repeats: int, batch: int = 256) -> dict[str, Any]:
    """Images/s of the data pipeline alone (decode, stack, collate; no model), ours and torchvision's,
    interleaved; the first batch (the workers' start) is not counted."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import PILToTensor

    from accel_train.data import DataConfig, build_dataset
    from accel_train.data.pipeline import make_loader

    ours_ds = build_dataset(DataConfig(dataset=f"imagefolder:{root}")).train
    theirs = ImageFolder(str(root / "train"), transform=PILToTensor())

    def loaders():
        yield "ours", make_loader(ours_ds, batch, shuffle=True, seed=0, num_workers=workers)
        yield "torchvision", DataLoader(theirs, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                                        generator=torch.Generator().manual_seed(0), persistent_workers=workers > 0,
                                        prefetch_factor=4 if workers else None)  # fmt: skip

    rates: dict[str, list[float]] = {"ours": [], "torchvision": []}
    for _ in range(repeats):
        for name, loader in loaders():
            it = iter(loader)
            next(it)
            t0 = time.perf_counter()
            for _ in range(batches):
                next(it)
            rates[name].append(batch * batches / (time.perf_counter() - t0))
            del it, loader
    medians = {name: statistics.median(v) for name, v in rates.items()}
    return {"workers": workers, "batch": batch, "batches": batches, "images_per_s": rates,
            "median_images_per_s": medians, "ratio": medians["ours"] / medians["torchvision"]}  # fmt: skip


def _report(result: dict[str, Any]) -> str:
    rows = result["launches"]
    lines = [f"# Data at scale: {result['folder']['files']:,} files ({result['folder']['root']})", "",
             f"CPU: {result['cpu']}", "", "| launch | first step s | peak RSS MiB |", "|---|---:|---:|"]  # fmt: skip
    for name, row in rows.items():
        lines.append(f"| {name} | {row.get('first_step_s', row.get('error'))} | {row.get('peak_rss_mb', '-')} |")
    for label, row in result.get("memory", {}).items():
        lines.append(f"\nindexing, {label}: {row}")
    for key, value in result.get("derived", {}).items():
        lines.append(f"\n{key}: {value}")
    if "pipeline" in result:
        p = result["pipeline"]
        rates = ", ".join(f"{k} {v:.0f}" for k, v in p["median_images_per_s"].items())
        lines.append(f"\npipeline, {p['workers']} workers, batch {p['batch']}: {rates} img/s, ratio {p['ratio']:.3f}")
    return "\n".join(lines) + "\n"


def _derived(rows: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rival_s = rows.get("rival", {}).get("first_step_s")
    for name in ("first_launch", "second_launch", "resume"):
        mine = rows.get(name, {}).get("first_step_s")
        if mine is not None and rival_s:
            out[f"{name} / rival"] = round(mine / rival_s, 3)
    big, small = rows.get("second_launch", {}).get("peak_rss_mb"), rows.get("small", {}).get("peak_rss_mb")
    if big is not None and small is not None:  # noisy: torch's own memory varies by tens of MiB between launches
        out["whole-run peak, this folder minus a 1,100-file one (MiB)"] = round(big - small, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks data-scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="the image folder (generated if incomplete)")
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--test", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=Path("runs/data_scale"))
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers of the pipeline comparison")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-rival", dest="with_rival", action="store_false")
    parser.add_argument("--no-pipeline", dest="pipeline", action="store_false")
    parser.add_argument("--remove", action="store_true", help="delete the generated folder at the end")
    parser.add_argument("--memory-probe", choices=("ours", "torchvision"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe:
        print(json.dumps(memory_probe(args.root, args.memory_probe)))
        return 0

    from benchmarks.common import cpu_description

    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="work-", dir=args.out))
    folder = ensure_folder(args.root, args.train, args.test, os.cpu_count() or 1)
    small_root = args.out / "small-folder"
    ensure_folder(small_root, 1000, 100, 1)
    result: dict[str, Any] = {"folder": folder, "cpu": cpu_description()}
    result["launches"] = launches(args.root, work, args.with_rival, small_root)
    result["derived"] = _derived(result["launches"])
    cache = Path(tempfile.mkdtemp(prefix="memory-cache-", dir=work))
    result["memory"] = memory(args.root, {**os.environ, "ACCEL_TRAIN_CACHE": str(cache)})
    if args.pipeline:
        result["pipeline"] = pipeline_rate(args.root, args.workers, 40, args.repeats)
    (args.out / "data_scale.json").write_text(json.dumps(result, indent=1))
    (args.out / "data_scale.md").write_text(_report(result))
    print(_report(result))
    shutil.rmtree(work, ignore_errors=True)
    if args.remove:
        shutil.rmtree(args.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
