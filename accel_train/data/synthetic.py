"""``synthetic``: random images with learnable labels, for tests and benchmarks.

Each class has a fixed random prototype; a sample is its prototype plus
noise, so a model can learn it. Generated from ``cfg.seed`` with a private
generator: building it never touches the global RNG.
"""

from __future__ import annotations

import torch

from accel_train.data.augment import opt_in_crop
from accel_train.data.base import DataConfig, DatasetInfo, DataSplits


def make_synthetic(n: int, classes: int, channels: int, size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.rand(classes, channels, size, size, generator=torch.Generator().manual_seed(12345)) * 255
    labels = torch.randint(0, classes, (n,), generator=gen)
    noise = torch.randn(n, channels, size, size, generator=gen) * 40
    images = (prototypes[labels] + noise).clamp(0, 255).to(torch.uint8)
    return images, labels


def build_synthetic(cfg: DataConfig) -> DataSplits:
    size = cfg.image_size or cfg.synthetic_image_size
    c, k = cfg.synthetic_channels, cfg.synthetic_classes
    x_train, y_train = make_synthetic(cfg.synthetic_size, k, c, size, seed=cfg.seed)
    x_test, y_test = make_synthetic(cfg.synthetic_test_size, k, c, size, seed=cfg.seed + 1)
    info = DatasetInfo(
        name="synthetic",
        num_classes=k,
        in_channels=c,
        image_size=size,
        class_names=[str(i) for i in range(k)],
        mean=(0.5,) * c,
        std=(0.25,) * c,
    )
    transform, augment = opt_in_crop(cfg, size)
    return DataSplits.of_tensors((x_train, y_train), (x_test, y_test), info, transform, augment=augment)
