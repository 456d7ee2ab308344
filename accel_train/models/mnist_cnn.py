"""The CNN of seed 000 (DataParallel on MNIST), sized from its arguments."""

from __future__ import annotations

import torch
import torch.nn as nn


class MnistCNN(nn.Module):
    """conv64-relu, conv128-relu, maxpool2, dense1024-relu, dropout0.5, dense.

    The seed hard-codes ``14*14*128`` for the dense input (28x28 inputs); here
    it follows ``image_size``.
    """

    min_image_size = 2  # the max-pool halves the side: 1 pixel would leave nothing

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 64, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 128, kernel_size=3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )
        pooled = image_size // 2
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(pooled * pooled * 128, 1024),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))
