"""Dropout masks keyed on ``(seed, epoch, global sample index, layer)``: the same on any number of processes.

``nn.Dropout`` draws its mask from the global RNG of the process that runs it, so "1 process x 32" and
"2 processes x 16" drop different units and train different models. :func:`use_keyed_dropout` swaps
every ``nn.Dropout`` of a model for a :class:`KeyedDropout` (at build time, like ``sync_bn`` swaps
BatchNorm; no parameters, so ``state_dict`` keys do not change). Its masks come from
:mod:`accel_train.keyed`, keyed on the indices of the samples in the batch, which the trainer sets
for each micro-batch through a shared :class:`DropoutKeys`: sample ``i`` of epoch ``e`` gets the same
mask wherever and with whichever samples it is batched, and after a mid-epoch resume.

Eval mode is the identity. Without keys for this batch (a forward outside the training loop, or one
slice of a batch under ``nn.DataParallel``) the layer falls back to ``nn.Dropout``'s global-RNG mask.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from accel_train.keyed import keyed_bits

# torch.compiler.disable imports torch._dynamo (about 1.3 s) where the class is defined, i.e. in every command
# that imports the models; torch's own lazy form (what torch.optim uses) imports it at the first forward.
_run_eagerly = getattr(torch, "_disable_dynamo", torch.compiler.disable)


class DropoutKeys:
    """What the masks of the current micro-batch are keyed on; one object shared by every layer of a model."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.epoch = 0
        self.indices: torch.Tensor | None = None

    @contextmanager
    def batch(self, epoch: int, indices: torch.Tensor):
        """Masks of forwards inside this block are keyed on ``(seed, epoch, indices)``."""
        self.epoch, self.indices = int(epoch), indices
        try:
            yield
        finally:
            self.indices = None


class KeyedDropout(nn.Module):
    """``nn.Dropout(p)`` whose mask for sample ``i`` is a function of ``(seed, epoch, i, name)`` only."""

    def __init__(self, p: float, keys: DropoutKeys, name: str, inplace: bool = False):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p, self.keys, self.name, self.inplace = p, keys, name, inplace

    def extra_repr(self) -> str:
        return f"p={self.p}, keyed on the sample index as {self.name!r}"

    @_run_eagerly  # the mask is a few integer ops on the indices: run eagerly, outside the graph
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        indices = self.keys.indices
        if not self.training or self.p == 0.0:
            return x
        if indices is None or indices.numel() != x.shape[0]:
            return F.dropout(x, self.p, True, self.inplace)
        if self.p == 1.0:
            return x * 0.0
        per_sample = x[0].numel() if x.shape[0] else 0
        bits = keyed_bits(self.keys.seed, self.keys.epoch, indices, per_sample, stream=f"dropout:{self.name}")
        keep = (bits >= round(self.p * 2**32)).view_as(x)
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))


def use_keyed_dropout(model: nn.Module, seed: int) -> tuple[nn.Module, DropoutKeys | None]:
    """Swap every ``nn.Dropout`` (elementwise; not Dropout1d/2d/3d) of ``model`` in place for a :class:`KeyedDropout`.

    Returns the model (a new object only when the model itself is a Dropout) and the keys its layers
    read, or None when it has no ``nn.Dropout``.
    """
    keys = DropoutKeys(seed)
    if type(model) is nn.Dropout:
        return KeyedDropout(model.p, keys, "", model.inplace).train(model.training), keys
    found = False
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                layer = KeyedDropout(child.p, keys, f"{name}.{child_name}".lstrip("."), child.inplace)
                parent.add_module(child_name, layer.train(child.training))
                found = True
    return model, keys if found else None
