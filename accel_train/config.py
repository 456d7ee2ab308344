"""One typed training config: dataclass defaults < ``--config`` YAML < CLI flags.

The parser is generated from the dataclass, so a field, its default, its
help text and its YAML key are one thing. Launch topology (processes,
machines, mixed precision) is NOT here: it belongs to the accelerate config
file passed to ``accelerate launch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from accel_train.accelerate_env import PRECISIONS as MIXED_PRECISION  # --mixed-precision's choices
from accel_train.data.settings import DATA_FIELDS, DataConfig
from accel_train.defaults import model_for
from accel_train.errors import UserError
from accel_train.flags import ATTEMPT, LENGTH, PARSERS, SAFE, ArgumentParser, field_type, is_parsed_text, same_as
from accel_train.flags import setting as _f
from accel_train.fsio import write_text_atomic
from accel_train.json_checks import Checker, is_int, shown
from accel_train.limits import (
    MAX_DIST_TIMEOUT,
    MAX_INT,
    MAX_SYNTHETIC_BYTES,
    SEED_LIMIT,
)
from accel_train.schedule import parse_milestones

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "constant", "linear", "step")


TTA = ("none", "flip")


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a run, flat (flags and YAML keys); immutable: a resume makes a new one
    (``resume.reconcile``). Parts of the library get their slice (``data_config()``) or plain values."""

    # what to train
    model: str = _f(
        "lenet",
        "model: small_cnn_gn, small_cnn, mnist_cnn, lenet, resnet18, tv_resnet18, airbench; tv:NAME for any "
        "torchvision classifier (e.g. tv:mobilenet_v3_small, random weights unless --pretrained); package.module:"
        "callable for your own code, called as callable(num_classes=, in_channels=, image_size=) (default: lenet for "
        "the built-in datasets; for your own data small_cnn_gn, --augment, --channels-last, 500 steps or more; photos "
        "fine-tune tv:resnet18 from ImageNet weights when they are at hand: accel_train/defaults.py)",
    )
    pretrained: str | None = _f(
        None,
        "start a tv: model from pretrained weights: the flag alone (DEFAULT) for the architecture's default "
        "weights (torchvision's cache under TORCH_HOME, else downloaded), a weights name (IMAGENET1K_V1), or a "
        "local .pth/.safetensors file; the head is new for the data's classes (default: random weights)",
        nargs="?", const="DEFAULT", metavar="WEIGHTS",
    )  # fmt: skip
    freeze: str | None = _f(
        None,
        "keep parameters as loaded: backbone (all but the new head, with --pretrained), or comma-separated "
        "name patterns (e.g. 'conv1.*,layer1.*'); frozen BatchNorm layers keep their statistics (default: none)",
    )
    head_lr: float | None = _f(
        None, "learning rate of the new head with --pretrained; the schedule scales it like --lr (default: --lr)"
    )
    bn_stats: str = _f(
        "batch", "BatchNorm's statistics in training: batch (each micro-batch's) or loaded (the weights' running "
        "statistics, kept: the same on any number of processes, and --bitwise)", choices=("batch", "loaded"),
    )  # fmt: skip
    dataset: str = same_as(DataConfig, "dataset")
    data_dir: str = same_as(DataConfig, "data_dir")
    download: bool = same_as(DataConfig, "download")
    image_size: int | None = same_as(DataConfig, "image_size")
    val_split: float = same_as(DataConfig, "val_split")
    image_column: str | None = same_as(DataConfig, "image_column")
    label_column: str | None = same_as(DataConfig, "label_column")
    augment: bool | None = same_as(DataConfig, "augment")
    crop_padding: int | None = same_as(DataConfig, "crop_padding")
    crop_padding_mode: str = same_as(DataConfig, "crop_padding_mode")
    # optimisation
    epochs: int = _f(8, "number of epochs (ignored when --max-steps is set)", low=1, resume=LENGTH)
    max_steps: int | None = _f(None, "stop after this many optimizer steps (overrides --epochs)", low=1, resume=LENGTH)
    batch_size: int = _f(32, "micro-batch per process (the DDP convention)", low=1)
    global_batch_size: int | None = _f(
        None,
        "fix the optimizer batch across setups; micro-batch and accumulation are derived",
        low=1,
    )
    max_device_batch: int | str | None = _f(
        None,
        "largest micro-batch one device takes (with --global-batch-size), or auto: the largest that fits in "
        "device memory, probed at start and agreed by all processes; the global batch is kept, accumulation derived",
        parse="int_or_auto",
    )
    grad_accum_steps: int = _f(1, "gradient accumulation steps (derived when --global-batch-size is set)", low=1)
    scale_lr: bool = _f(False, "scale lr linearly: lr * global_batch / batch_size")
    lr: float = _f(2e-3, "peak learning rate")
    optimizer: str = _f("adam", "optimizer", choices=OPTIMIZERS)
    momentum: float = _f(0.9, "SGD momentum", low=0)
    nesterov: bool = _f(False, "SGD with Nesterov momentum")
    weight_decay: float = _f(0.0, "weight decay", low=0)
    lr_schedule: str = _f("cosine", "LR schedule over optimizer steps", choices=SCHEDULES)
    warmup_steps: int = _f(0, "linear LR warm-up steps", low=0)
    warmup_from: float = _f(0.0, "LR factor the warm-up starts from, in [0, 1) (airbench: 0.2)")
    lr_milestones: str = _f(
        "0.5,0.75", "--lr-schedule step: fractions of training where the LR is multiplied by --lr-gamma"
    )
    lr_gamma: float = _f(0.1, "--lr-schedule step: LR factor at each milestone")
    max_grad_norm: float = _f(1.0, "clip gradients to this norm (0 disables)", low=0)
    mixed_precision: str | None = _f(
        None, "override the accelerate config's mixed precision", choices=MIXED_PRECISION, resume=SAFE
    )
    seed: int = same_as(DataConfig, "seed")
    # training features
    label_smoothing: float = _f(0.0, "label smoothing of the cross-entropy loss, e.g. 0.1 (0: off)")
    mixup: float = _f(
        0.0, "mixup: blend each sample with its neighbour in the batch by lam ~ Beta(ALPHA, ALPHA), e.g. 0.2 (0: off)"
    )
    cutmix: float = _f(
        0.0,
        "cutmix: paste a box of the neighbour's image, its area from Beta(ALPHA, ALPHA), e.g. 1.0 (0: off); with "
        "--mixup each sample gets one of the two",
    )
    ema: float | None = _f(
        None, "keep an EMA of the weights with this decay, e.g. 0.999: evaluated (eval_ema_*), exported to model_ema/"
    )
    early_stop_patience: int | None = _f(
        None,
        "stop after this many evaluations in a row without a better eval_accuracy (unset: off)",
        low=1,
        resume=SAFE,
    )
    early_stop_min_delta: float = _f(
        0.0, "with --early-stop-patience: how much eval_accuracy must improve to count", resume=SAFE
    )
    # evaluation, logging, output
    eval_every: int = _f(0, "also evaluate every N optimizer steps (0: only at epoch ends)", low=0, resume=SAFE)
    eval_batch_size: int | None = _f(
        None, "evaluation batch per process (default: 2 x micro-batch)", low=1, resume=SAFE
    )
    tta: str = _f("none", "test-time augmentation: flip averages each image's and its mirror's logits", choices=TTA)
    log_every: int = _f(
        10,
        "log train metrics every N optimizer steps (the only host syncs in the loop); epochs shorter than N steps "
        "show one [eval] line per N steps on the console (metrics.jsonl: every evaluation)",
        low=1,
        resume=SAFE,
    )
    output_dir: str = _f("runs/default", "run directory", resume=ATTEMPT)
    overwrite: bool = _f(False, "replace an existing run in --output-dir", resume=ATTEMPT)
    report_to: str = _f(
        "tensorboard",
        "trackers besides metrics.jsonl: tensorboard, csv, all (tensorboard and csv), none, or any of accelerate's "
        "trackers (mlflow, wandb, aim, comet_ml, clearml, dvclive, swanlab, trackio, ...: their package installed); "
        "several comma-separated, e.g. csv,mlflow",
        metavar="TRACKERS",
        resume=SAFE,
    )
    progress: bool = _f(
        True, "a progress bar on a terminal (with --no-progress or off a terminal: a [train] line per log)", resume=SAFE
    )
    plots: bool = _f(True, "write curves.png at the end", resume=SAFE)
    # checkpoints
    checkpoint_every: int = _f(0, "save a resumable checkpoint every N optimizer steps (0: off)", low=0, resume=SAFE)
    checkpoint_epochs: bool = _f(True, "save a resumable checkpoint at the end of every epoch", resume=SAFE)
    keep_last: int = _f(2, "keep the newest K checkpoints", low=1, resume=SAFE)
    resume: str = _f("none", "auto (latest in --output-dir), a checkpoint PATH, or none", resume=ATTEMPT)
    branch: bool = _f(False, "with --resume of an older checkpoint: move the newer checkpoints to "
                      "OUTPUT_DIR/abandoned/ and go on", resume=ATTEMPT)  # fmt: skip
    extend: bool = _f(False, "with --resume: allow a larger --epochs/--max-steps (the LR schedule is re-planned "
                      "for the new length)", resume=ATTEMPT)  # fmt: skip
    resume_inexact: bool = _f(False, "resume even if a rank's random state is missing or unusable (that rank "
                              "starts from a fresh seed)", resume=ATTEMPT)  # fmt: skip
    resume_changed_data: bool = _f(False, "with --resume: go on although the data changed (named at the start; "
                                   "not exact: order, split, length follow the data now)", resume=ATTEMPT)  # fmt: skip
    stop_at_step: int | None = _f(
        None,
        "save a checkpoint and exit at this step, as if preempted (an epoch's last step: after the epoch's evaluation)",
        low=1,
        resume=ATTEMPT,
    )
    # performance
    num_workers: int = _f(0, "DataLoader workers for datasets that are not held in memory", low=0, resume=SAFE)
    threads: int | None = _f(None, "torch threads/process (default: free cores / local processes)", low=1, resume=SAFE)
    channels_last: bool | None = _f(
        None, "channels_last memory format (default: on for conv models under bf16/fp16 on CUDA)", resume=SAFE
    )
    tf32: bool = _f(True, "TF32 for fp32 matmuls and convolutions on Ampere+ GPUs (--no-tf32: full fp32)", resume=SAFE)
    data_on_device: float = _f(
        0.25,
        "hold in-memory datasets on the GPU when they fit in this fraction of its memory (0: keep on host)",
        low=0,
        resume=SAFE,
    )
    compile: bool = _f(False, "torch.compile the model (checkpoints stay unwrapped)", resume=SAFE)
    sync_bn: bool = _f(
        False,
        "synchronise BatchNorm statistics across DDP processes (same weights as one process for BatchNorm models; "
        "torch SyncBatchNorm on CUDA, an all-reduce batch norm on CPU/gloo)",
        resume=SAFE,
    )
    # faults
    dist_timeout: float = _f(600.0, "process-group timeout in seconds: a hung collective fails after this", resume=SAFE)
    stop_grace: float = _f(
        25.0,
        "seconds a rank waits for a step boundary after SIGTERM/SIGINT before it leaves without a new checkpoint "
        "(keep it below your launcher's or scheduler's kill delay; torchrun and Slurm wait about 30 s)",
        resume=SAFE,
    )
    skip_nonfinite: bool = _f(False, "skip optimizer steps whose loss is NaN/Inf instead of stopping")
    bitwise: bool = _f(
        False,
        "bit-identical weights on 1 process or N (docs/parity.md): needs --global-batch-size and --max-device-batch "
        "(the same micro-batch everywhere); one thread per process, fp32, no BatchNorm; slower",
    )
    # synthetic dataset shape
    synthetic_size: int = same_as(DataConfig, "synthetic_size")
    synthetic_test_size: int = same_as(DataConfig, "synthetic_test_size")
    synthetic_channels: int = same_as(DataConfig, "synthetic_channels")
    synthetic_image_size: int = same_as(DataConfig, "synthetic_image_size")
    synthetic_classes: int = same_as(DataConfig, "synthetic_classes")
    debug: bool = _f(False, "show tracebacks for errors", resume=ATTEMPT)

    def validate(self, given: Iterable[str] | None = None) -> TrainConfig:
        """Types were checked by the parser or the YAML reader; ranges and combinations are checked here.

        ``given``: the names the user set (flags, YAML keys, ``train()``'s options); a resume restores the others
        from the checkpoint (``resume.given_fields``). Kept beside the settings, not as one of them."""
        if given is not None:
            object.__setattr__(self, "given", frozenset(given))  # frozen: set once, here
        self._check_ranges()
        self._check_choices_and_combinations()
        return self

    def _check_ranges(self) -> None:
        for f in fields(self):  # the fields' own lower bounds (metadata ``low``)
            value, low = getattr(self, f.name), f.metadata.get("low")
            if low is not None and value is not None and value < low:
                unset = " (or unset)" if f.default is None else ""
                raise UserError(f"--{_flag(f.name)} must be >= {low}{unset}, got {value}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UserError(f"--lr must be a positive number, got {self.lr}")
        if not 0 < self.val_split < 1:
            raise UserError(f"--val-split must be between 0 and 1, got {self.val_split}")
        if self.synthetic_classes < 2:
            raise UserError(f"--synthetic-classes must be >= 2, got {self.synthetic_classes}")
        if not 0 < self.dist_timeout <= MAX_DIST_TIMEOUT:
            most = f"{MAX_DIST_TIMEOUT:.0f} (365 days)"
            raise UserError(f"--dist-timeout must be > 0 seconds and at most {most}, got {self.dist_timeout}")
        if not (self.stop_grace > 0 and math.isfinite(self.stop_grace)):
            raise UserError(f"--stop-grace must be a positive number of seconds, got {self.stop_grace}")
        self._check_schedule()
        self._check_limits()
        self._check_image_size()
        self._check_features()

    def _check_limits(self) -> None:
        """Every number finite and within what torch/numpy hold, every text non-empty and without NUL bytes."""
        for f in fields(self):
            value, flag = getattr(self, f.name), f"--{_flag(f.name)}"
            if isinstance(value, float) and not math.isfinite(value):
                raise UserError(f"{flag} must be a finite number, got {value}")
            high = f.metadata.get("high", MAX_INT)
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > high:
                shown = value if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
                raise UserError(f"{flag} must be at most {high:,}, got {shown}")
            if isinstance(value, str) and (not value or "\x00" in value):
                raise UserError(f"{flag} needs a non-empty value without NUL bytes, got {value!r:.80}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise UserError(f"--seed must be between 0 and 2**32 - 1 ({SEED_LIMIT - 1}), got {self.seed}")
        if self.dataset == "synthetic":
            side, n = self.image_size or self.synthetic_image_size, self.synthetic_size + self.synthetic_test_size
            if n * self.synthetic_channels * side * side > MAX_SYNTHETIC_BYTES:
                raise UserError(
                    f"the synthetic dataset ({n:,} images of {self.synthetic_channels}x{side}x{side}) would need "
                    f"more than {MAX_SYNTHETIC_BYTES >> 30} GiB of memory; lower --synthetic-size or the image size"
                )

    def _check_image_size(self) -> None:
        """The model must take the images: --image-size (or the synthetic side) at least the model's minimum."""
        from accel_train.models import min_image_size

        flag = "--image-size" if self.image_size is not None else "--synthetic-image-size"
        size = self.image_size if self.image_size is not None else self.synthetic_image_size
        if self.image_size is None and self.dataset != "synthetic":
            return  # the dataset's own size: create_model checks it
        model = model_for(self.dataset, getattr(self, "given", None), self.model)  # the defaults' choice, if any
        low = min_image_size(model)
        if size < low:
            raise UserError(
                f"{flag} {size} is too small for --model {model}, which needs images of at least {low}x{low}; "
                f"pass --image-size {low} or larger"
            )

    def _check_schedule(self) -> None:
        if not 0.0 <= self.warmup_from < 1.0:
            raise UserError(f"--warmup-from is the LR factor at the first step, in [0, 1), got {self.warmup_from}")
        if not (self.lr_gamma > 0 and math.isfinite(self.lr_gamma)):
            raise UserError(f"--lr-gamma must be a positive number, got {self.lr_gamma}")
        try:
            parse_milestones(self.lr_milestones)
        except ValueError as exc:
            raise UserError(
                f"--lr-milestones {self.lr_milestones!r}: {exc}; e.g. '0.5,0.75' (x --lr-gamma at 50% and 75%)"
            ) from None

    def _check_choices(self) -> None:
        """Every field declared with ``choices`` holds one of them (argparse checks flags; this, files)."""
        for f in fields(self):
            value, choices = getattr(self, f.name), f.metadata.get("choices")
            if choices is not None and value is not None and value not in choices:
                raise UserError(f"--{_flag(f.name)} {value!r} is not one of: {', '.join(choices)}")

    def _check_choices_and_combinations(self) -> None:
        _check_report_to(self.report_to)
        self._check_choices()
        if isinstance(self.max_device_batch, int) and self.global_batch_size is None:
            raise UserError(
                "--max-device-batch only applies with --global-batch-size G (auto works alone); set G or drop it"
            )
        if self.global_batch_size is not None and self.grad_accum_steps != 1:
            raise UserError("--grad-accum-steps is derived when --global-batch-size is set; drop one of the two")
        if self.extend and self.resume == "none":
            raise UserError("--extend makes a resumed run longer; pass it with --resume auto (or a checkpoint)")
        if self.resume not in ("auto", "none") and not _exists(self.resume):
            raise UserError(f"--resume {self.resume!r}: no such checkpoint; use 'auto', 'none' or an existing path")
        _check_names(self.model, self.dataset)
        if self.bitwise:
            _check_bitwise(self)

    def _check_features(self) -> None:
        """The training features' values (accel_train.features)."""
        device_batch = self.max_device_batch
        if device_batch not in (None, "auto") and (not isinstance(device_batch, int) or device_batch < 1):
            raise UserError(f"--max-device-batch must be >= 1 or auto (or unset), got {device_batch!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise UserError(f"--label-smoothing must be in [0, 1), e.g. 0.1, got {self.label_smoothing}")
        for name in ("mixup", "cutmix", "early_stop_min_delta"):
            if getattr(self, name) < 0:
                raise UserError(f"--{_flag(name)} must be >= 0 (0: off), got {getattr(self, name)}")
        if self.crop_padding is not None and self.crop_padding < 0:
            raise UserError(f"--crop-padding must be >= 0 pixels (or unset), got {self.crop_padding}")
        if self.nesterov and (self.optimizer != "sgd" or self.momentum == 0):
            raise UserError("--nesterov needs --optimizer sgd with --momentum > 0")
        if self.ema is not None and not 0.0 < self.ema < 1.0:
            raise UserError(f"--ema is the decay of the average, between 0 and 1 (e.g. 0.999), got {self.ema}")
        self._check_finetune()

    def _check_finetune(self) -> None:
        """--pretrained (a tv: model and weights it has), --freeze, --head-lr (features/finetune.py)."""
        if self.pretrained is not None:
            from accel_train.models.pretrained import check_spec  # torchvision: only when asked for

            # a resume reads the checkpoint's weights, never the file: it may have moved since (build.py notes it)
            check_spec(self.model, self.pretrained, file_needed=self.resume == "none")
        if self.freeze == "backbone" and self.pretrained is None:
            raise UserError("--freeze backbone needs --pretrained (the head is what the weights do not bring)")
        if self.head_lr is not None:
            if self.pretrained is None:
                raise UserError("--head-lr sets the LR of the new head: pass it with --pretrained")
            if not (self.head_lr > 0 and math.isfinite(self.head_lr)):
                raise UserError(f"--head-lr must be a positive number, got {self.head_lr}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def data_config(self) -> DataConfig:
        return DataConfig(**{name: getattr(self, name) for name in DATA_FIELDS})


def check_saved_config(saved: Any, where: str) -> None:
    """A checkpoint's saved config (``progress.json["config"]``, read by ``--resume``): each known field of its
    type, then the ranges and choices flags are held to; one :class:`CheckpointError` line naming ``where`` and
    the field. Unknown fields are ignored (a newer version's); absent ones keep this attempt's values."""
    check = Checker(where, "the checkpoint is damaged: resume from another checkpoint or start a new --output-dir")
    if not isinstance(saved, dict):
        check.fail("config", f"must be a JSON object, got {shown(saved)}")
    known = {}
    for f in fields(TrainConfig):
        if f.name not in saved:
            continue
        value, typ = saved[f.name], field_type(f)
        ok = (value is None and "None" in str(f.type)) or (
            isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
        )
        ok = ok or is_parsed_text(f, value) or (typ is float and is_int(value))  # max_device_batch: auto
        if not ok:
            check.fail(f"config.{f.name}", f"must be {typ.__name__}, got {shown(value)}")
        known[f.name] = value
    try:
        # checked as the config of a resume (what it is read for: the --pretrained file is no longer needed)
        resume = known.get("resume", "none")
        cfg = TrainConfig(**{**known, "resume": "auto" if resume == "none" else resume})
        cfg._check_ranges()
        from accel_train.tracking import tracker_names  # accelerate's tracker list: imported only for a resume

        tracker_names(cfg.report_to)  # known names; whether their packages are installed matters only to a run
        cfg._check_choices()
        _check_names(cfg.model, cfg.dataset)
    except UserError as exc:
        check.fail("config", f"is invalid ({exc})")


def _check_bitwise(cfg: TrainConfig) -> None:
    """--bitwise: what must be the same in every setup (the runtime's refusals: bitwise.refuse_unless_bitwise)."""
    if cfg.global_batch_size is None or not isinstance(cfg.max_device_batch, int):
        raise UserError(
            "--bitwise needs --global-batch-size G and --max-device-batch M: the same micro-batch M on every setup"
        )
    unsupported = {"compile": cfg.compile, "skip_nonfinite": cfg.skip_nonfinite}
    for name, on in unsupported.items():
        if on:
            raise UserError(f"--bitwise cannot be combined with --{_flag(name)} (it cannot be made bit-identical)")
    if cfg.threads not in (None, 1) or cfg.mixed_precision not in (None, "no"):
        raise UserError("--bitwise runs one thread per process in fp32: drop --threads and --mixed-precision")


def _check_names(model: str, dataset: str) -> None:
    """Unknown --model / --dataset names, refused before anything loads (the registries import torch)."""
    from accel_train.data import check_dataset_name
    from accel_train.models import check_model_name

    check_model_name(model)
    check_dataset_name(dataset)


def _check_report_to(report_to: str) -> None:
    """Known tracker names whose packages are installed (imports accelerate only for names beyond csv/none)."""
    if report_to not in ("none", "csv"):
        from accel_train.tracking import check_installed, tracker_names

        check_installed(tracker_names(report_to))


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte
        return False


def _flag(name: str) -> str:
    return name.replace("_", "-")


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    # No ArgumentDefaultsHelpFormatter: with argument_default=SUPPRESS it has no default to show; each help
    # names its default once (its own "(default: ...)" words, else the field's value), and flags with
    # choices list them ({cosine,constant,...}) instead of a metavar.
    parser = ArgumentParser(
        description=description or "Train a model with one Accelerate loop on any setup.",
        argument_default=argparse.SUPPRESS,  # only flags the user gave end up in the namespace
    )
    parser.add_argument("--config", help="YAML file of hyperparameters; flags override it")
    for f in fields(TrainConfig):
        typ = field_type(f)
        text = f.metadata["help"]
        kwargs: dict[str, Any] = {"help": text if "(default:" in text else f"{text} (default: {f.default})"}
        if typ is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = PARSERS.get(f.metadata.get("parse"), typ)
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        elif typ is not bool:
            kwargs["metavar"] = f.metadata.get("metavar", f.name.upper())
        if "nargs" in f.metadata:  # --pretrained alone means its const
            kwargs.update(nargs=f.metadata["nargs"], const=f.metadata["const"])
        parser.add_argument(f"--{_flag(f.name)}", dest=f.name, **kwargs)
    return parser


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """defaults < --config YAML < CLI flags, validated."""
    ns = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    config_file = ns.pop("config", None)
    if config_file:
        from accel_train.config_yaml import load_yaml_config  # PyYAML: only for a --config file

        values.update(load_yaml_config(config_file, TrainConfig))
    values.update(ns)
    return TrainConfig(**values).validate(given=values)  # what the user set: a resume restores the rest


def save_config(cfg: TrainConfig, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    import yaml

    data = cfg.to_dict()
    if extra:
        data = {**data, "resolved": extra}
    write_text_atomic(path, yaml.safe_dump(data, sort_keys=False), "the run config")  # never half a config.yaml
