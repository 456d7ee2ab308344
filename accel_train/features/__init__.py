"""Training features (issue 14): EMA, label smoothing, mixup/cutmix, early stopping, keyed dropout, auto micro-batch.

Each keeps the parity promise (same global batch => same weights on any number of processes): its
randomness is keyed on ``(seed, epoch, global sample index)`` through :mod:`accel_train.keyed`, never on
the rank or the global RNG, and its state travels in checkpoints, so a resume is exact.
:class:`TrainFeatures` is all the trainer sees of them.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from accel_train.checkpoint.weights import export_weights
from accel_train.errors import UserError
from accel_train.features.dropout import DropoutKeys, KeyedDropout, use_keyed_dropout
from accel_train.features.early_stop import EarlyStopping
from accel_train.features.ema import EMA_FILE, WeightEMA
from accel_train.features.mix import Mixed, Mixer

__all__ = ["DropoutKeys", "EarlyStopping", "KeyedDropout", "Mixer", "TrainFeatures", "WeightEMA", "use_keyed_dropout"]


def check_outputs(logits: object, batch: int, num_classes: int) -> None:
    """A model's output must be one tensor of class scores, ``[batch, num_classes]``: a tuple, a dict or another
    shape would fail inside the loss with a traceback (or, with fewer outputs than classes, a device assert)."""
    want = f"[batch, num_classes] = [{batch}, {num_classes}]"
    if not isinstance(logits, torch.Tensor):
        raise UserError(
            f"the model returned a {type(logits).__name__}, not one tensor of class scores {want}; return the "
            "logits alone from forward (e.g. out[0] or out.logits)"
        )
    if logits.dim() != 2 or tuple(logits.shape) != (batch, num_classes):
        raise UserError(
            f"the model returned shape {tuple(logits.shape)} for a batch of {batch}; it must return {want} (the "
            "data has that many classes): size its last layer from num_classes and flatten with x.flatten(1)"
        )


@dataclass
class TrainFeatures:
    """The features one run uses; the defaults are a plain cross-entropy step."""

    label_smoothing: float = 0.0
    mixer: Mixer | None = None
    dropout: DropoutKeys | None = None
    ema: WeightEMA | None = None
    early: EarlyStopping | None = None
    num_classes: int = 0  # > 0: the first forward's output is checked against [batch, num_classes]

    @classmethod
    def for_run(
        cls, cfg, model: nn.Module, dropout: DropoutKeys | None, acc, num_classes: int = 0, monitor=("eval_accuracy", 1)
    ) -> TrainFeatures:
        """Call on the unwrapped model right before ``prepare`` (the EMA copies it then). ``monitor``: (the eval key
        early stopping follows, whether higher is better)."""
        from accelerate.utils import DistributedType

        mixing = cfg.mixup > 0 or cfg.cutmix > 0
        ema = None
        if cfg.ema is not None:
            if acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
                raise UserError(
                    f"--ema averages the full weights on every process, which {acc.distributed_type.value} shards; "
                    "drop --ema or train with DDP (accelerate_configs/multi_gpu.yaml)"
                )
            ema = WeightEMA(model, cfg.ema, acc.device)
        return cls(
            label_smoothing=cfg.label_smoothing,
            mixer=Mixer(cfg.mixup, cfg.cutmix, cfg.seed) if mixing else None,
            dropout=dropout,
            ema=ema,
            early=EarlyStopping(cfg.early_stop_patience, cfg.early_stop_min_delta, *monitor)
            if cfg.early_stop_patience
            else None,
            num_classes=num_classes,
        )

    # ---- the train step ------------------------------------------------------------------------------------
    def forward(
        self, model: nn.Module, x: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor, epoch: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, loss)`` of a normalised micro-batch whose samples have global indices ``indices``."""
        mixed = None
        if self.mixer is not None:
            x, mixed = self.mixer(x, indices, epoch)
        with self.dropout.batch(epoch, indices) if self.dropout is not None else nullcontext():
            logits = model(x)
        if self.num_classes:  # once: a model of the user's that returns something else fails here in one line
            check_outputs(logits, x.shape[0], self.num_classes)
            self.num_classes = 0
        return logits, self.loss(logits, labels, mixed)

    def loss(self, logits: torch.Tensor, labels: torch.Tensor, mixed: Mixed | None = None) -> torch.Tensor:
        logits = logits.float()
        if mixed is None:
            return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)
        own = F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing, reduction="none")
        other = F.cross_entropy(logits, labels[mixed.partner], label_smoothing=self.label_smoothing, reduction="none")
        return (mixed.lam * own + (1.0 - mixed.lam) * other).mean()

    def after_optimizer_step(self) -> None:
        """After an applied (not skipped) optimizer step."""
        if self.ema is not None:
            self.ema.update()

    def observe_eval(self, result: dict[str, Any], step: int) -> str | None:
        """An evaluation during training; returns the early-stopping reason when it ends the run."""
        return self.early.observe(result[self.early.key], step) if self.early is not None else None

    def stopped_early(self) -> str | None:
        """Why a resumed run had already stopped early (None: it goes on)."""
        return self.early.reason() if self.early is not None else None

    # ---- evaluation and export -----------------------------------------------------------------------------
    @staticmethod
    def ema_results(result: dict[str, Any]) -> dict[str, Any]:
        """The EMA weights' eval figures (``eval_accuracy``, ``eval_loss``, ...) as ``eval_ema_accuracy``, ..."""
        return {f"eval_ema_{k[5:]}": v for k, v in result.items() if k.startswith("eval_") and k != "eval_samples"}

    def ema_summary(self, final: dict[str, Any]) -> dict[str, Any]:
        """The EMA's final figures for summary.json (nothing without --ema)."""
        return {k: v for k, v in final.items() if k.startswith("eval_ema_")}

    def export_ema(self, out_dir: Path, model_config: dict[str, Any]) -> None:
        if self.ema is not None:
            export_weights(self.ema.state_dict(), out_dir, model_config)

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def checkpoint_extra(self) -> dict[str, Any]:
        """What goes into ``state.extra`` (progress.json)."""
        extra: dict[str, Any] = {}
        if self.ema is not None:
            extra["ema"] = {"decay": self.ema.decay, "updates": self.ema.updates}
        if self.early is not None:
            extra["early_stop"] = self.early.state()
        return extra

    def checkpoint_files(self) -> dict[str, dict[str, torch.Tensor]]:
        """Extra safetensors files of a checkpoint folder: name -> tensors."""
        return {EMA_FILE: self.ema.state_dict()} if self.ema is not None else {}

    def restore(self, extra: dict[str, Any], checkpoint: Path) -> None:
        """The features' state from a checkpoint that has passed ``verify_checkpoint``."""
        if self.ema is not None:
            saved = extra.get("ema")
            updates = saved.get("updates") if isinstance(saved, dict) else None
            self.ema.load(checkpoint, updates if isinstance(updates, int) else 0)
        if self.early is not None:
            self.early.restore(extra.get("early_stop"), str(checkpoint))
