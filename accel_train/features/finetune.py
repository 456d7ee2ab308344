"""Fine-tuning controls: ``--freeze``, ``--head-lr`` and ``--bn-stats``.

``--freeze backbone`` keeps every parameter but the new head (the tensors whose shape follows the number of
classes, ``models/pretrained.py``) exactly as loaded; ``--freeze PATTERNS`` (comma-separated ``fnmatch``
patterns on parameter names, e.g. ``conv1.*,layer1.*``) keeps those. Frozen parameters leave the optimizer
(``requires_grad=False``: no gradient, no update, no weight decay), and a BatchNorm layer whose parameters are all
frozen stays in eval mode, so its running statistics stay as loaded too (a frozen layer that still normalised
with batch statistics would not compute what it computed before). ``--head-lr`` trains the head at its own LR:
an LR multiplier for the head's parameters (``optim.param_groups``), which the schedule then follows.

The same on any number of processes and devices: nothing here depends on the setup.
"""

from __future__ import annotations

import fnmatch
import types

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from accel_train.errors import UserError

BACKBONE = "backbone"


def frozen_names(model: nn.Module, freeze: str, head: tuple[str, ...]) -> list[str]:
    """The parameter names ``--freeze`` selects (one-line UserError for a pattern that matches nothing)."""
    names = [n for n, _ in model.named_parameters()]
    if freeze == BACKBONE:
        if not head:
            raise UserError("--freeze backbone needs --pretrained (the head is what the weights do not bring)")
        return [n for n in names if n not in head]
    chosen: list[str] = []
    for pattern in (p.strip() for p in freeze.split(",")):
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(names[:4])
            raise UserError(f"--freeze {pattern!r} matches no parameter (they are named like {shown}, ...)")
        chosen += [n for n in hits if n not in chosen]
    if len(chosen) == len(names):
        raise UserError(
            f"--freeze {freeze!r} matches every parameter of the model: nothing would train; leave the head out "
            "(--freeze backbone keeps only the new head trainable)"
        )
    return chosen


def _stay_in_eval(self: nn.Module, mode: bool = True) -> nn.Module:
    return nn.Module.train(self, False)


def _keep_in_eval(module: nn.Module) -> None:
    module.train = types.MethodType(_stay_in_eval, module)  # model.train() leaves it in eval mode
    module.eval()


def freeze(model: nn.Module, names: list[str]) -> list[str]:
    """Freeze ``names`` in ``model`` (before it is wrapped); returns the BatchNorm layers kept in eval mode."""
    chosen = set(names)
    for name, p in model.named_parameters():
        if name in chosen:
            p.requires_grad_(False)
    kept = []
    for name, module in model.named_modules():
        params = list(module.parameters(recurse=False))
        if isinstance(module, _BatchNorm) and params and not any(p.requires_grad for p in params):
            _keep_in_eval(module)
            kept.append(name)
    return kept


def keep_statistics(model: nn.Module) -> list[str]:
    """``--bn-stats loaded``: every BatchNorm layer normalises with its running statistics (the loaded weights'),
    in training too, while its scale and shift still train. Each image is then normalised alone, as in
    evaluation: no statistic of the batch, so 1 and N processes (and ``--bitwise``) compute the same thing. The
    fine-tuning practice of torchvision's detection models (``FrozenBatchNorm2d``), keeping the module and its
    ``state_dict`` keys. Returns the layers' names."""
    kept = []
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) and module.running_mean is not None:
            _keep_in_eval(module)
            kept.append(name)
    return kept


def keep_statistics_said(model: nn.Module, name: str, untrained: bool) -> tuple[str, str | None]:
    """:func:`keep_statistics` on ``model`` (``name``); its line, and a warning where it changes nothing: no
    BatchNorm layer, or ``untrained`` (a fresh model, no weights loaded: its statistics are the initial mean 0 and
    variance 1, and its BatchNorm would normalise nothing)."""
    kept = len(keep_statistics(model))
    said = f"--bn-stats loaded: {kept} BatchNorm layers on their statistics"
    if not kept:
        return said, f"--bn-stats loaded: {name} has no BatchNorm layer; the flag changes nothing"
    if untrained:
        return said, (
            f"--bn-stats loaded without --pretrained: {name}'s BatchNorm keeps its initial statistics "
            "(mean 0, variance 1) and normalises nothing; pass --pretrained, or leave --bn-stats batch"
        )
    return said, None


def head_lr_scales(model: nn.Module, head: tuple[str, ...], lr: float, head_lr: float) -> dict[str, float]:
    """``{parameter name: head_lr / lr}`` for the head's parameters (``optim.param_groups`` reads it)."""
    params = {n for n, _ in model.named_parameters()}
    return {n: head_lr / lr for n in head if n in params}
