"""``--mixup`` / ``--cutmix``: batched on the device, each sample's draw keyed on its global sample index.

**Pairing.** The sample at position ``p`` of a global batch is mixed with the one at ``p XOR 1`` (its
neighbour: 0 with 1, 2 with 3, ...). The sampler's order is a function of ``(seed, epoch)``, so the
neighbour is a random partner, and a global batch is cut into micro-batches of even size at even
offsets, so the partner is always in the same micro-batch, on the same rank: the rule needs no
communication and gives the same pairs on 1 process x 32, 2 processes x 16, or with accumulation.
That is why an odd micro-batch is refused.

**Draws.** Sample ``i`` of epoch ``e`` draws its own ``lam ~ Beta(alpha, alpha)`` (the inverse CDF of two
Gamma variables, by bisection, from :func:`accel_train.keyed.keyed_uniform`), its cutmix box, and with
both on, which of the two it gets (half each): a function of ``(seed, e, i)`` alone, so a mid-epoch
resume mixes exactly as an uninterrupted run. The loss is ``lam * CE(y_i) + (1 - lam) * CE(y_partner)``
(with ``--label-smoothing`` inside each term), where cutmix's ``lam`` is the kept area.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from accel_train.errors import UserError
from accel_train.keyed import keyed_uniform

_BISECTIONS = 48  # log-space interval of ~711 down to ~3e-12: far below float32 resolution


def _gamma_icdf(u: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Quantile ``u`` of Gamma(``alpha``, 1), elementwise: bisection on ``log x`` with the regularised
    incomplete gamma function (a fixed number of steps: deterministic, batched, on ``u``'s device)."""
    tiny = torch.finfo(u.dtype).tiny
    lo = torch.full_like(u, math.log(tiny))
    hi = torch.log(alpha + 30.0 + 12.0 * alpha.sqrt())  # beyond the 1 - 2**-24 quantile for any alpha
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        below = torch.special.gammainc(alpha, mid.exp()) < u
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return (0.5 * (lo + hi)).exp()


def _exact(device: torch.device) -> torch.dtype:
    """float64 for the draws, where the device has it (not MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def keyed_beta(seed: int, epoch: int, indices: torch.Tensor, alpha: torch.Tensor, stream: str) -> torch.Tensor:
    """``Beta(alpha, alpha)`` per sample (``alpha``: one value per sample), keyed on ``(seed, epoch, index)``."""
    dtype = _exact(indices.device)
    u = keyed_uniform(seed, epoch, indices, 2, stream, dtype) + 2.0**-25  # in (0, 1): both tails finite
    a = alpha.to(dtype)[:, None].expand_as(u)
    g = _gamma_icdf(u, a)
    return g[:, 0] / (g[:, 0] + g[:, 1])


@dataclass(frozen=True)
class Mixed:
    """A mixed batch's targets: sample ``k`` counts ``lam[k]`` for its label and ``1 - lam[k]`` for ``partner[k]``'s."""

    lam: torch.Tensor  # float32 [B]
    partner: torch.Tensor  # int64 [B]: position of the partner in the batch


@dataclass(frozen=True)
class Mixer:
    mixup: float  # Beta alpha; 0: off
    cutmix: float
    seed: int

    def check_micro_batch(self, micro_batch: int) -> None:
        if micro_batch % 2:
            raise UserError(
                f"--mixup/--cutmix mix each sample with its neighbour in the batch, which needs an even micro-batch, "
                f"got {micro_batch}; pick a --batch-size (or --global-batch-size per process) that is even"
            )

    def __call__(self, x: torch.Tensor, indices: torch.Tensor, epoch: int) -> tuple[torch.Tensor, Mixed]:
        """Mix float images ``x [B, C, H, W]`` of the samples ``indices``; returns the images and their targets."""
        batch, _, height, width = x.shape
        self.check_micro_batch(batch)
        dev, exact = x.device, _exact(x.device)
        partner = torch.arange(batch, device=dev) ^ 1
        u = keyed_uniform(self.seed, epoch, indices, 3, stream="mix", dtype=exact)  # switch, box y, box x
        if self.mixup and self.cutmix:
            cut = u[:, 0] < 0.5
        else:
            cut = torch.full((batch,), bool(self.cutmix), device=dev)
        alpha = torch.where(cut, self.cutmix or 1.0, self.mixup or 1.0).to(exact)
        lam = keyed_beta(self.seed, epoch, indices, alpha, stream="mix_lambda")
        other = x[partner]
        blend = lam.to(x.dtype).view(-1, 1, 1, 1)
        mixed = blend * x + (1 - blend) * other
        if self.cutmix:
            inside, kept = _boxes(lam, u[:, 1], u[:, 2], height, width)
            pasted = torch.where(inside[:, None], other, x)
            mixed = torch.where(cut.view(-1, 1, 1, 1), pasted, mixed)
            lam = torch.where(cut, kept, lam)
        if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():  # --channels-last
            mixed = mixed.contiguous(memory_format=torch.channels_last)
        return mixed, Mixed(lam.to(torch.float32), partner)


def _boxes(lam, uy, ux, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix boxes (timm's ``rand_bbox``): side ``sqrt(1 - lam)`` of the image's, centred at a keyed pixel.

    Returns the mask of pasted pixels ``bool [B, H, W]`` and the fraction of the image kept.
    """
    ratio = (1.0 - lam).sqrt()
    half_h, half_w = (height * ratio).floor() // 2, (width * ratio).floor() // 2
    cy, cx = (uy * height).floor(), (ux * width).floor()
    y0, y1 = (cy - half_h).clamp(0, height), (cy + half_h).clamp(0, height)
    x0, x1 = (cx - half_w).clamp(0, width), (cx + half_w).clamp(0, width)
    rows = torch.arange(height, device=lam.device, dtype=lam.dtype)[None, :]
    cols = torch.arange(width, device=lam.device, dtype=lam.dtype)[None, :]
    in_rows = (rows >= y0[:, None]) & (rows < y1[:, None])
    in_cols = (cols >= x0[:, None]) & (cols < x1[:, None])
    inside = in_rows[:, :, None] & in_cols[:, None, :]
    kept = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)
    return inside, kept
