"""The start-up floor: the default run's work (``python scripts/train.py``) as a plain PyTorch script.

Imports torch and numpy only (nothing of accel_train, nothing of scikit-learn): it reads the file that
``sklearn.datasets.load_digits`` reads (``digits.csv.gz``, found without importing scikit-learn, as accel_train
finds it), scales 0..16 to 0..255 uint8, splits 1,437 train / 360 test (a fixed permutation), resizes 8x8 to 28x28
(bilinear, as accel_train does), then trains the default config's LeNet (conv20 3x3, avgpool, conv50 5x5, avgpool,
fc128, fc10) for 8 epochs of 44 batches of 32 (the last partial batch dropped, as the default run drops it: 352
steps) with Adam lr 2e-3, a cosine schedule over the 352 steps, gradient-norm clipping at 1.0, the loss read every
10 steps, and an evaluation (batches of 64) after each epoch: 8 evaluations. Then it exits.

Run as a file: ``python benchmarks/speed/plain_default_run.py [--json PATH]``; ``--json`` writes wall-clock stamps
(``time.time()``) of its phases for the harness (``benchmarks/speed/startup.py``), which timed its launch.
"""

import argparse
import importlib.util
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

T_IMPORTED = time.time()
EPOCHS, BATCH, LR, MAX_GRAD_NORM, LOG_EVERY, EVAL_BATCH, SEED = 8, 32, 2e-3, 1.0, 10, 64, 42
TEST_SAMPLES, SIZE = 360, 28


def load_digits_28() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """sklearn's digits as uint8 [N, 1, 28, 28] train/test tensors and int64 labels."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)
    pixels = np.round(table[:, :-1].reshape(-1, 1, 8, 8) * (255.0 / 16.0))
    images = F.interpolate(torch.from_numpy(pixels).float(), size=(SIZE, SIZE), mode="bilinear", align_corners=False)
    images = images.round().clamp(0, 255).to(torch.uint8)
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    order = torch.from_numpy(np.random.default_rng(0).permutation(len(labels)))
    test, train = order[:TEST_SAMPLES], order[TEST_SAMPLES:]
    return images[train], labels[train], images[test], labels[test]


def lenet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Conv2d(20, 50, kernel_size=5),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Flatten(),
        nn.Linear(50 * 4 * 4, 128),
        nn.ReLU(),
        nn.Linear(128, 10),
    )


def evaluate(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(labels), EVAL_BATCH):
            x = (images[i : i + EVAL_BATCH].float() / 255.0 - mean) / std
            correct += (model(x).argmax(1) == labels[i : i + EVAL_BATCH]).sum().item()
    model.train()
    return correct / len(labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="write the phases' time.time() stamps here")
    args = parser.parse_args()
    torch.manual_seed(SEED)
    x_train, y_train, x_test, y_test = load_digits_28()
    scaled = x_train.float() / 255.0
    mean, std = scaled.mean().item(), scaled.std().item()
    model = lenet()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    steps_per_epoch = len(y_train) // BATCH
    total = EPOCHS * steps_per_epoch
    cosine = lambda s: 0.5 * (1.0 + math.cos(math.pi * min(1.0, s / total)))  # noqa: E731
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine)
    t_setup, step, accuracies = time.time(), 0, []
    for _ in range(EPOCHS):
        order = torch.randperm(len(y_train))
        for b in range(steps_per_epoch):
            idx = order[b * BATCH : (b + 1) * BATCH]
            loss = F.cross_entropy(model((x_train[idx].float() / 255.0 - mean) / std), y_train[idx])
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            step += 1
            if step % LOG_EVERY == 0:
                loss.item()
        accuracies.append(evaluate(model, x_test, y_test, mean, std))
    t_trained = time.time()
    print(f"plain: {step} steps, {len(accuracies)} evaluations, eval_accuracy {accuracies[-1]:.4f}")
    if args.json:
        stamps = {"imported": T_IMPORTED, "setup_done": t_setup, "trained": t_trained}
        counts = {"steps": step, "evals": len(accuracies), "accuracy": accuracies[-1]}
        args.json.write_text(json.dumps({**stamps, **counts}))


if __name__ == "__main__":
    main()
