"""``--ema DECAY``: an exponential moving average of the weights, evaluated and exported beside them.

After every applied optimizer step (a step skipped for a non-finite loss or by the fp16 scaler
leaves the weights, and so the average, as they were) each tensor of the model's ``state_dict``
moves ``ema <- decay * ema + (1 - decay) * w`` (floating-point buffers such as BatchNorm's running
statistics too, as ``AveragedModel(use_buffers=True)`` with ``get_ema_multi_avg_fn`` does; integer
buffers are copied). The average starts from the initial weights.

The average is a copy of the model made before ``accelerator.prepare`` (so it is never wrapped), on
the training device. Every rank keeps its own, identical copy: the weights it averages are the
same on every rank. It travels in checkpoints as ``ema.safetensors``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
import torch.nn as nn

from accel_train.checkpoint.safe_load import EMA_WEIGHTS as EMA_FILE  # in a checkpoint folder, checked by verify
from accel_train.errors import CheckpointError


class WeightEMA:
    def __init__(self, model: nn.Module, decay: float, device: torch.device):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.source = model  # the very module accelerate prepares: its tensors are read after every step
        self.module = copy.deepcopy(model).to(device).eval().requires_grad_(False)
        self.updates = 0
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def _tensor_pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(average, live) tensor pairs, found once the live model has been moved and wrapped."""
        if self._pairs is None:
            live = self.source.state_dict(keep_vars=True)
            mine = self.module.state_dict(keep_vars=True)
            if live.keys() != mine.keys():
                raise RuntimeError("the EMA copy and the model no longer have the same tensors")
            self._pairs = [(mine[k], live[k]) for k in mine]
        return self._pairs

    @torch.no_grad()
    def update(self) -> None:
        floats = [(e, w) for e, w in self._tensor_pairs() if e.is_floating_point()]
        if floats:
            torch._foreach_lerp_([e for e, _ in floats], [w.detach() for _, w in floats], 1.0 - self.decay)
        for e, w in self._tensor_pairs():
            if not e.is_floating_point():
                e.copy_(w)
        self.updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach() for k, v in self.module.state_dict().items()}

    def load(self, checkpoint: Path, updates: int) -> None:
        """Restore the average from ``checkpoint/ema.safetensors`` (the folder has passed ``verify_checkpoint``)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(checkpoint) / EMA_FILE
        fix = f"resume from another checkpoint in {path.parent.parent}, or start a new --output-dir"
        if not path.is_file():
            raise CheckpointError(f"cannot resume {path.parent} with --ema: it holds no {EMA_FILE}; {fix}")
        try:
            self.module.load_state_dict(load_file(str(path), device="cpu"), strict=True)
        except (SafetensorError, RuntimeError, OSError) as exc:
            reason = " ".join(str(exc).split())[:160]
            raise CheckpointError(f"cannot resume from {path}: the EMA weights do not load ({reason}); {fix}") from None
        self.updates = updates
