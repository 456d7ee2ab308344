"""Helpers shared by tests/unit/test_sync_bn.py and tests/integration/test_sync_bn_runs.py."""

from __future__ import annotations

import torch
import torch.nn as nn

RESNET18_BN_LAYERS = 20  # stem 1 + 8 blocks x 2 + 3 shortcuts


def assert_close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-6) -> None:
    """max |a - b| <= tol, relative to b's scale when that is above 1 (float32 sums of many terms)."""
    a, b = a.detach().double(), b.detach().double()
    scale = max(1.0, b.abs().max().item()) if b.numel() else 1.0
    diff = (a - b).abs().max().item() if b.numel() else 0.0
    assert diff <= tol * scale, f"max abs diff {diff:.3g} > {tol:g} x {scale:.3g}"


def randomise_affine(bn: nn.Module, seed: int = 0) -> None:
    """Give a BatchNorm layer (if it has them) a random weight in [0.5, 2) and bias in [-1, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if getattr(bn, "weight", None) is not None:
            bn.weight.copy_(torch.rand(bn.weight.shape, generator=g) * 1.5 + 0.5)
            bn.bias.copy_(torch.rand(bn.bias.shape, generator=g) * 2 - 1)
