"""LeNet as in the d2l multi-GPU chapter (seed 001)."""

from __future__ import annotations

import torch
import torch.nn as nn


class LeNet(nn.Module):
    """conv20(3x3)-relu-avgpool, conv50(5x5)-relu-avgpool, dense128-relu, dense.

    For 28x28 inputs the flattened size is d2l's 800 (50*4*4); other sizes
    follow from ``image_size``.
    """

    min_image_size = 14  # the smallest side whose feature map survives both pools (see models.min_image_size)

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28):
        super().__init__()
        side = ((image_size - 2) // 2 - 4) // 2
        if side < 1:
            raise ValueError(f"lenet needs image_size >= 14, got {image_size}")
        self.net = nn.Sequential(
            nn.Conv2d(in_channels, 20, kernel_size=3),
            nn.ReLU(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Conv2d(20, 50, kernel_size=5),
            nn.ReLU(),
            nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Flatten(),
            nn.Linear(50 * side * side, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
