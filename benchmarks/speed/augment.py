"""Per-sample vs batched augmentation (random crop, padding 4, + flip) on CIFAR-shaped uint8 data, on CPU.

python -m benchmarks.speed.augment                       # both parts, a few minutes on 2 busy cores
python -m benchmarks.speed.augment --train-steps 0       # augmentation throughput only
python -m benchmarks.speed.augment --out runs/augment.json

1. **Augmentation throughput**: 512-image 3x32x32 batches through
   * *per-sample* (before issue 12): torchvision v2 ``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip``
     on each image, the global CPU generator seeded per sample inside ``fork_rng`` (what
     ``TensorImageDataset`` did), and
   * *batched* (now): :class:`accel_train.data.augment.CropFlip`, one gather for the batch, keyed on
     ``(seed, epoch, index)``.
2. **Training throughput**: samples/s of a training loop over accel_train's own loader
   (``make_loader``, ``TensorImageDataset.__getitems__``, ``BatchNormalizer``), each model with
   each pipeline, in the same process, rounds interleaved so machine noise hits both alike. On a
   CPU the data stays where it is (``--data-on-device`` moves nothing), so "data on the device"
   and "from the host" are the same row here.

Medians are reported. Nothing asserts a goal: this measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from accel_train.data.augment import CropFlip, KeyedAugment
from accel_train.data.base import TensorImageDataset
from accel_train.data.pipeline import BatchNormalizer, make_loader
from accel_train.models import create_model

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class PerSampleTorchvision(KeyedAugment):
    """The augmentation before issue 12, as ``TensorImageDataset._augment`` ran it: one sample at a time."""

    def __init__(self, size: int = 32, padding: int = 4):
        from torchvision.transforms import v2

        self.transform = v2.Compose([v2.RandomCrop(size, padding=padding), v2.RandomHorizontalFlip()])

    def __call__(self, images, indices, seed, epoch):
        out = []
        for image, index in zip(images, indices.tolist(), strict=True):
            with torch.random.fork_rng(devices=[]):
                torch.default_generator.manual_seed(((seed * 1_000_003 + epoch) * 10_000_019 + index) % (2**63))
                out.append(self.transform(image))
        return torch.stack(out)


PIPELINES = {"per-sample": PerSampleTorchvision, "batched": lambda: CropFlip(32, 4, True)}


def cifar_shaped(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=gen), torch.randint(
        0, 10, (n,), generator=gen
    )


def augment_throughput(batch: int, reps: int) -> dict[str, dict[str, float]]:
    """ms per ``batch``-image batch for each pipeline (alternating, after one warm-up call each)."""
    images, _ = cifar_shaped(batch)
    idx = torch.arange(batch)
    augments = {name: make() for name, make in PIPELINES.items()}
    times: dict[str, list[float]] = {name: [] for name in augments}
    for rep in range(reps + 1):
        for name, augment in augments.items():
            start = time.perf_counter()
            augment(images, idx, 0, rep)
            if rep:  # the first round warms up
                times[name].append(time.perf_counter() - start)
    out = {}
    for name, values in times.items():
        ms = statistics.median(values) * 1e3
        out[name] = {"ms_per_batch": round(ms, 2), "images_per_s": round(batch / ms * 1e3)}
    return out


def _train_round(model, optimizer, loader, normalize, steps: int, epoch: int) -> tuple[float, float, int]:
    """(seconds, seconds waiting for data, samples) for ``steps`` optimizer steps."""
    loader.batch_sampler.sampler.set_epoch(epoch)
    batches = iter(loader)
    start, waited, seen = time.perf_counter(), 0.0, 0
    for _ in range(steps):
        t0 = time.perf_counter()
        images, labels = next(batches)
        waited += time.perf_counter() - t0
        loss = F.cross_entropy(model(normalize(images)), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen += len(labels)
    return time.perf_counter() - start, waited, seen


def train_throughput(model_name: str, batch: int, steps: int, rounds: int) -> dict[str, dict[str, float]]:
    """samples/s and data-wait fraction of each pipeline for ``model_name`` (rounds interleaved, one warm-up step)."""
    images, labels = cifar_shaped(batch * (steps + 1))
    normalize = BatchNormalizer(CIFAR_MEAN, CIFAR_STD)
    setups = {}
    for name, make in PIPELINES.items():
        torch.manual_seed(0)
        model = create_model(model_name, 10, 3, 32)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        loader = make_loader(TensorImageDataset(images, labels, make()), batch, shuffle=True, seed=0)
        _train_round(model, optimizer, loader, normalize, 1, 0)  # warm-up
        setups[name] = (model, optimizer, loader)
    results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in setups}
    for epoch in range(1, rounds + 1):
        for name, (model, optimizer, loader) in setups.items():
            results[name].append(_train_round(model, optimizer, loader, normalize, steps, epoch))
    out = {}
    for name, rows in results.items():
        rate = statistics.median(seen / seconds for seconds, _, seen in rows)
        wait = statistics.median(waited / seconds for seconds, waited, _ in rows)
        out[name] = {"samples_per_s": round(rate, 2), "data_wait_fraction": round(wait, 4)}
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=512, help="augmentation batch (default: 512)")
    parser.add_argument("--reps", type=int, default=9, help="augmentation repeats per pipeline (default: 9)")
    parser.add_argument("--models", default="resnet18,lenet", help="models to train (default: resnet18,lenet)")
    parser.add_argument("--train-batch", type=int, default=128, help="training batch (default: 128)")
    parser.add_argument("--train-steps", type=int, default=2, help="steps per round, 0 skips training (default: 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per pipeline (default: 3)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report: dict = {
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "load_average": list(os.getloadavg()),
        "augment": augment_throughput(args.batch, args.reps),
        "train": {},
    }
    aug = report["augment"]
    print(f"augmentation, {args.batch} x 3x32x32 uint8 on CPU ({report['threads']} threads):")
    for name, row in aug.items():
        print(f"  {name:>10}: {row['ms_per_batch']:8.2f} ms/batch  {row['images_per_s']:>9,} images/s")
    print(f"  batched is {aug['per-sample']['ms_per_batch'] / aug['batched']['ms_per_batch']:.1f}x per-sample")
    models = [m for m in args.models.split(",") if m] if args.train_steps else []
    for model in models:
        rows = report["train"][model] = train_throughput(model, args.train_batch, args.train_steps, args.rounds)
        print(f"training {model}, batch {args.train_batch}, CIFAR-shaped synthetic data, fp32 on CPU:")
        for name, row in rows.items():
            print(f"  {name:>10}: {row['samples_per_s']:9.2f} samples/s  data wait {row['data_wait_fraction']:.1%}")
        ratio = rows["batched"]["samples_per_s"] / rows["per-sample"]["samples_per_s"]
        print(f"  batched/per-sample: {ratio:.3f}x")
    report["load_average_after"] = list(os.getloadavg())
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
