"""ResNet-18 variants: d2l's small-image version (seed 001) and torchvision's."""

from __future__ import annotations

import torch
import torch.nn as nn


class Residual(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut = None
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    """d2l's "slightly modified" ResNet-18: 3x3 stem, no max-pool, 64/128/256/512.

    Works for any ``in_channels``; global average pooling makes it
    independent of ``image_size``. Linear/conv weights are initialised
    normal(0, 0.01) as in the seed, BatchNorm to (1, 0).
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28):
        super().__init__()
        del image_size  # global pooling: any size works
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        stages, in_ch = [], 64
        for i, out_ch in enumerate((64, 128, 256, 512)):
            stride = 1 if i == 0 else 2
            stages += [Residual(in_ch, out_ch, stride), Residual(out_ch, out_ch)]
            in_ch = out_ch
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.normal_(m.weight, 0.0, 0.01)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def tv_resnet18(num_classes: int = 10, in_channels: int = 3, image_size: int = 224) -> nn.Module:
    """torchvision's resnet18 with random weights (``weights=None``: never downloads).

    The architecture stays torchvision's (7x7 stride-2 stem, max-pool); only the
    stem's input channels and the classifier's outputs follow the arguments.
    Inputs as small as 28x28 work (the last stage sees 1x1).
    """
    from torchvision.models import resnet18

    del image_size  # adaptive average pooling: any size >= 28 works
    model = resnet18(weights=None, num_classes=num_classes)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model
