"""``small_cnn_gn`` (the default model for the user's own data, ``accel_train/defaults.py``) and ``small_cnn``.

A few hundred images of objects that may be anywhere in the frame, in any colour: ``lenet``'s flattened layers
give every position its own weights and memorise such a folder (100% of its training images, a third of its test
images on three classes). This network sees the image as a bag of local features instead:

* each image minus its own mean colour (the background's colour says nothing about the class);
* normalised 3x3 convolutions (stride 2 first on images of 48 pixels or more: half the work, and the objects
  still span several pixels), doubling the width at each 2x2 max-pool until the map is 8 pixels or less;
* a global max-pool: a feature counts wherever it fires, so the class does not depend on the position;
* one linear layer.

``small_cnn_gn`` standardises its filters (weight standardisation) and normalises with GroupNorm over each image's
whole map (one group): no statistic of the batch, so 1 process x 32 and 2 x 16 compute the same thing (the
README's promise) and ``--bitwise`` takes it; on the shapes folders it is more accurate than BatchNorm was.
``small_cnn`` is the same network with BatchNorm and plain convolutions (the default before issue 50; its
checkpoints still load as they were). Their accuracies on the shapes folders of ``benchmarks/data/folders.py``:
docs/performance.md. A pure module: layer sizes
from the constructor's arguments, no device or config logic.
"""

from __future__ import annotations

import torch
import torch.nn as nn

WIDTH = 24  # channels of the first convolution, doubled at each pooling (16 left a folder at 83%; 32: 1.3x the time)
STRIDE_FROM = 48  # images this large or larger start with a stride-2 convolution
SMALLEST_MAP = 8  # pool while the feature map is larger than this
GROUPS = 1  # GroupNorm's groups (1: each image's whole map; 4 and 8 were less accurate on the shapes folders)


class StandardizedConv2d(nn.Conv2d):
    """A convolution whose filters are standardised (zero mean, unit deviation each) at every forward: weight
    standardisation (Qiao et al., 2019), which with GroupNorm trains as well as BatchNorm does without any
    statistic of the batch. Its parameters and ``state_dict`` keys are ``nn.Conv2d``'s."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        w = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True) + 1e-5)
        return self._conv_forward(x, w, self.bias)


def _norm(kind: str, channels: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    return nn.GroupNorm(min(GROUPS, channels), channels)


def _conv(in_channels: int, out_channels: int, stride: int = 1, norm: str = "group") -> nn.Sequential:
    conv = nn.Conv2d if norm == "batch" else StandardizedConv2d
    return nn.Sequential(
        conv(in_channels, out_channels, 3, stride=stride, padding=1, bias=False),
        _norm(norm, out_channels),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Centred input, conv-BN-ReLU stages with 2x2 max-pools, global max-pool, linear head."""

    def __init__(
        self, num_classes: int = 10, in_channels: int = 3, image_size: int = 64, width: int = WIDTH, norm: str = "batch"
    ):
        super().__init__()
        stride = 2 if image_size >= STRIDE_FROM else 1
        side, channels = -(-image_size // stride), width
        layers = [_conv(in_channels, width, stride, norm)]
        while side > SMALLEST_MAP:
            layers += [nn.MaxPool2d(2), _conv(channels, 2 * channels, norm=norm)]
            side, channels = side // 2, 2 * channels
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x - x.mean(dim=(2, 3), keepdim=True)  # each image's own mean colour: the background's, mostly
        return self.head(torch.amax(self.features(x), dim=(2, 3)))
