"""Models for the GPU acceptance's runs: ``--model benchmarks.gpu_acceptance.models:dropout_net`` (or ``:bn_net``,
``:bn_dropout_net``).

:class:`DropoutNet` calls ``F.dropout`` in ``forward``, so its masks come from the device's own global RNG
(the CUDA generator on a GPU): accel_train's keyed dropout replaces ``nn.Dropout`` modules, not this call,
and a resume that loses the RNG state shows in the weights. It also records a checksum of every training
input it sees to ``$GPU_PROBE_RECORD`` (one JSON line per forward): the data order, comparable across runs.
Nothing here is imported by a training run that does not name it.
"""

from __future__ import annotations

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

RECORD_VAR = "GPU_PROBE_RECORD"


class DropoutNet(nn.Module):
    """Two convolutions and two linear layers with ``F.dropout`` in ``forward``: masks from the global RNG."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, image_size: int = 28, p: float = 0.25):
        super().__init__()
        torch.backends.cudnn.deterministic = True  # the straight and resumed processes convolve alike (BNNet)
        self.p = p
        self.conv1 = nn.Conv2d(in_channels, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * (image_size // 4) ** 2, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            _record(x)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.dropout(x.flatten(1), self.p, self.training)
        x = F.dropout(F.relu(self.fc1(x)), self.p, self.training)
        return self.fc2(x)


def dropout_net(num_classes: int = 10, in_channels: int = 1, image_size: int = 28) -> DropoutNet:
    """``--model benchmarks.gpu_acceptance.models:dropout_net``."""
    return DropoutNet(num_classes, in_channels, image_size)


def _record(x: torch.Tensor) -> None:
    """One JSON line per training forward: the batch's size, sum and sum of squares (in float64)."""
    path = os.environ.get(RECORD_VAR)
    if not path:
        return
    x = x.detach().double()
    line = {"n": int(x.shape[0]), "sum": float(x.sum()), "sq": float((x * x).sum())}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


class BNNet(nn.Module):
    """Two convolutions with BatchNorm and a linear layer: BatchNorm (running statistics, --sync-bn, FSDP's
    buffers) in a model small enough for comparisons to stay at round-off. cuDNN is told to use deterministic
    algorithms, so two processes compute the same convolutions the same way (else the comparisons between
    processes measure cuDNN's algorithm choice)."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32):
        super().__init__()
        torch.backends.cudnn.deterministic = True
        self.conv1, self.bn1 = nn.Conv2d(in_channels, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32 * (image_size // 4) ** 2, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(x.flatten(1))


def bn_net(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> BNNet:
    """``--model benchmarks.gpu_acceptance.models:bn_net``."""
    return BNNet(num_classes, in_channels, image_size)


class BNDropoutNet(BNNet):
    """:class:`BNNet` with ``F.dropout`` before its linear layer and the inputs recorded (as :class:`DropoutNet`):
    the default CUDA path of a CNN (BatchNorm, channels_last under bf16) with state that uses the CUDA RNG, for
    the single-GPU bf16 stop-and-resume check."""

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32, p: float = 0.25):
        super().__init__(num_classes, in_channels, image_size)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            _record(x)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(F.dropout(x.flatten(1), self.p, self.training))


def bn_dropout_net(num_classes: int = 10, in_channels: int = 3, image_size: int = 32) -> BNDropoutNet:
    """``--model benchmarks.gpu_acceptance.models:bn_dropout_net``."""
    return BNDropoutNet(num_classes, in_channels, image_size)
