"""The rival of the data-at-scale benchmark: what a user writes with torchvision alone, timed from its launch.

python benchmarks/data/imagefolder_rival.py ROOT OUT.jsonl [--steps N] [--batch B] [--workers W] [--model resnet18]

torchvision's ``ImageFolder(ROOT/train)`` (PIL decode, ``PILToTensor``), a shuffled ``DataLoader``, the same model
as ``scripts/train.py --model NAME`` (accel_train's builder, so the compute is the same), Adam, the batch
normalised on the fly. After each optimizer step one JSON line (``{"step": n, "t": time.time()}``) is written to
OUT.jsonl and flushed: the benchmark reads the first one as this script's time to its first step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import PILToTensor

    from accel_train.models import create_model

    data = ImageFolder(f"{args.root}/train", transform=PILToTensor())
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, num_workers=args.workers, drop_last=True,
                        generator=torch.Generator().manual_seed(0))  # fmt: skip
    model = create_model(args.model, len(data.classes), 3, args.size)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    mean = torch.tensor([0.5, 0.5, 0.5]).view(1, 3, 1, 1)
    with open(args.out, "w") as out:
        for step, (images, labels) in enumerate(loader, 1):
            x = (images.float() / 255 - mean) / 0.25
            loss = torch.nn.functional.cross_entropy(model(x), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            out.write(json.dumps({"step": step, "t": time.time(), "loss": float(loss)}) + "\n")
            out.flush()
            if step >= args.steps:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
