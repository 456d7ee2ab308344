"""``airbench``: the 8-layer CIFAR-10 speed-run network of Keller Jordan's airbench (2024).

Written from the paper and the published ablation scripts (``airbench/ablations/main3_scalebias.py`` of
KellerJordan/cifar10-zoo: "94% in 13.5 epochs"), which this network and ``configs/airbench_cifar10.yaml``
follow:

* a 2x2 patch-**whitening** convolution (``2 * C * 4`` filters: the eigenvectors of the training patches'
  covariance, scaled by their inverse square roots, and their negatives), frozen; only its bias trains.
  It is set from training images by :meth:`AirbenchNet.init_from_data`, which ``accel_train.build``
  calls before the first step (the same images on every process);
* three conv groups (conv3x3 - maxpool2 - BN - GELU - conv3x3 - BN - GELU) of widths 64, 256, 256, each
  conv **identity (dirac)-initialised** on its first ``in_channels`` filters;
* BatchNorm with ``eps=1e-12`` and a frozen weight of 1 (only the bias trains; its LR is scaled by 64
  through :meth:`AirbenchNet.lr_scales`, which ``accel_train.optim`` reads);
* a global max-pool, a bias-free linear layer and logits scaled by 1/9.

A pure module: no data, device or process logic. The parts airbench adds *around* the network (alternating
flip, lookahead, multi-crop TTA, progressive freezing, torch.compile) are not reproduced: see
docs/accelerate-gaps.md (experiment configs).
"""

from __future__ import annotations

import torch
import torch.nn as nn

WIDTHS = (64, 256, 256)
WHITEN_KERNEL = 2
WHITEN_EPS = 5e-4  # added to the patch covariance's eigenvalues before the inverse square root
BN_EPS = 1e-12
LOGIT_SCALE = 1 / 9
NORM_BIAS_LR_SCALE = 64.0  # airbench's "bias_scaler": the LR (not the weight decay) of BatchNorm biases


def _conv(in_channels: int, out_channels: int) -> nn.Conv2d:
    conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding="same", bias=False)
    with torch.no_grad():
        nn.init.dirac_(conv.weight[:in_channels])  # an implicit residual: the first filters pass the input on
    return conv


def _norm(channels: int) -> nn.BatchNorm2d:
    norm = nn.BatchNorm2d(channels, eps=BN_EPS)
    norm.weight.requires_grad_(False)  # scale fixed at 1: the next layer's weights carry it
    return norm


class ConvGroup(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv1 = _conv(in_channels, out_channels)
        self.pool = nn.MaxPool2d(2)
        self.norm1 = _norm(out_channels)
        self.conv2 = _conv(out_channels, out_channels)
        self.norm2 = _norm(out_channels)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class AirbenchNet(nn.Module):
    """airbench's network; ``image_size`` >= 9 (three 2x poolings after the 2x2 whitening conv)."""

    min_image_size = 9
    init_samples = 5000  # training images the whitening layer is computed from (airbench: 5000)

    def __init__(self, num_classes: int = 10, in_channels: int = 3, image_size: int = 32):
        super().__init__()
        if image_size < self.min_image_size:
            raise ValueError(f"airbench needs image_size >= {self.min_image_size}, got {image_size}")
        whiten_width = 2 * in_channels * WHITEN_KERNEL**2
        self.whiten = nn.Conv2d(in_channels, whiten_width, kernel_size=WHITEN_KERNEL, padding=0, bias=True)
        self.whiten.weight.requires_grad_(False)
        nn.init.zeros_(self.whiten.bias)
        widths = (whiten_width, *WIDTHS)
        self.groups = nn.Sequential(*(ConvGroup(a, b) for a, b in zip(widths[:-1], widths[1:], strict=True)))
        self.head = nn.Linear(WIDTHS[-1], num_classes, bias=False)
        self.activ = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.groups(self.activ(self.whiten(x)))
        x = torch.amax(x, dim=(2, 3))  # global max-pool (airbench: MaxPool2d(3) over the last 3x3 map)
        return self.head(x) * LOGIT_SCALE

    @torch.no_grad()
    def init_from_data(self, images: torch.Tensor) -> None:
        """Set the whitening filters from normalised training images ``[N, C, H, W]`` (float)."""
        k = WHITEN_KERNEL
        c = images.shape[1]
        patches = images.float().unfold(2, k, 1).unfold(3, k, 1)  # [N, C, H', W', k, k]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, c * k * k).double()
        covariance = patches.T @ patches / len(patches)
        eigenvalues, eigenvectors = torch.linalg.eigh(covariance)  # ascending
        eigenvalues, eigenvectors = eigenvalues.flip(0), eigenvectors.flip(1)  # strongest direction first
        filters = (eigenvectors / torch.sqrt(eigenvalues.clamp_min(0) + WHITEN_EPS)).T.reshape(-1, c, k, k)
        self.whiten.weight.copy_(torch.cat([filters, -filters]).to(self.whiten.weight.dtype))

    def lr_scales(self) -> dict[str, float]:
        """Parameter name -> LR multiplier (its weight decay is divided by the same: the decay stays put)."""
        return {name: NORM_BIAS_LR_SCALE for name, p in self.named_parameters() if ".norm" in name and p.requires_grad}
