"""One typed training config: dataclass defaults < ``--config`` YAML < CLI flags.

The parser is generated from the dataclass, so a field, its default, its
help text and its YAML key are one thing. Launch topology (processes,
machines, mixed precision) is NOT here: it belongs to the accelerate config
file passed to ``accelerate launch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from accel_train.cli import ArgumentParser
from accel_train.errors import UserError

OPTIMIZERS = ("sgd", "adam", "adamw")
SCHEDULES = ("cosine", "constant", "linear", "step")
REPORT_TO = ("tensorboard", "csv", "none", "all")
MIXED_PRECISION = ("no", "fp16", "bf16")


def _f(default: Any, help: str, **meta: Any) -> Any:
    return field(default=default, metadata={"help": help, **meta})


@dataclass
class TrainConfig:
    # what to train
    model: str = _f("lenet", "model name: mnist_cnn, lenet, resnet18, tv_resnet18")
    dataset: str = _f("digits", "dataset: digits, synthetic, mnist, fashion_mnist, cifar10, imagefolder:DIR, hf:NAME")
    data_dir: str = _f("data", "root folder of on-disk datasets (torchvision layouts)")
    download: bool = _f(False, "download mnist/fashion_mnist/cifar10 with torchvision if missing (needs network)")
    image_size: int | None = _f(None, "resize images to this size (default: the dataset's own size)")
    val_split: float = _f(0.2, "test fraction for sources without a test split")
    image_column: str | None = _f(None, "image column of an hf: dataset (default: detected)")
    label_column: str | None = _f(None, "label column of an hf: dataset (default: detected)")
    augment: bool | None = _f(None, "data augmentation (default: the dataset's own: crop+flip for cifar10)")
    # optimisation
    epochs: int = _f(8, "number of epochs (ignored when --max-steps is set)")
    max_steps: int | None = _f(None, "stop after this many optimizer steps (overrides --epochs)")
    batch_size: int = _f(32, "micro-batch per process (the DDP convention)")
    global_batch_size: int | None = _f(
        None, "fix the optimizer batch across setups; micro-batch and accumulation are derived"
    )
    max_device_batch: int | None = _f(None, "with --global-batch-size: largest micro-batch one device takes")
    grad_accum_steps: int = _f(1, "gradient accumulation steps (derived when --global-batch-size is set)")
    scale_lr: bool = _f(False, "scale lr linearly: lr * global_batch / batch_size")
    lr: float = _f(2e-3, "peak learning rate")
    optimizer: str = _f("adam", "optimizer", choices=OPTIMIZERS)
    momentum: float = _f(0.9, "SGD momentum")
    weight_decay: float = _f(0.0, "weight decay")
    lr_schedule: str = _f("cosine", "LR schedule over optimizer steps", choices=SCHEDULES)
    warmup_steps: int = _f(0, "linear LR warm-up steps")
    max_grad_norm: float = _f(1.0, "clip gradients to this norm (0 disables)")
    mixed_precision: str | None = _f(None, "override the accelerate config's mixed precision", choices=MIXED_PRECISION)
    seed: int = _f(42, "random seed (data order, init, dropout)")
    # evaluation, logging, output
    eval_every: int = _f(0, "also evaluate every N optimizer steps (0: only at epoch ends)")
    eval_batch_size: int | None = _f(None, "evaluation batch per process (default: 2 x micro-batch)")
    log_every: int = _f(10, "log train metrics every N optimizer steps (the only host syncs in the loop)")
    output_dir: str = _f("runs/default", "run directory")
    overwrite: bool = _f(False, "replace an existing run in --output-dir")
    report_to: str = _f("tensorboard", "trackers besides metrics.jsonl", choices=REPORT_TO)
    progress: bool = _f(True, "progress bars (plain lines when stdout is not a TTY)")
    plots: bool = _f(True, "write curves.png at the end")
    # checkpoints
    checkpoint_every: int = _f(0, "save a resumable checkpoint every N optimizer steps (0: off)")
    checkpoint_epochs: bool = _f(True, "save a resumable checkpoint at the end of every epoch")
    keep_last: int = _f(2, "keep the newest K checkpoints")
    resume: str = _f("none", "auto (latest in --output-dir), a checkpoint PATH, or none")
    branch: bool = _f(
        False, "with --resume of an older checkpoint: move the newer checkpoints to OUTPUT_DIR/abandoned/ and go on"
    )
    resume_inexact: bool = _f(
        False, "resume even if a rank's random state is missing or unusable (that rank starts from a fresh seed)"
    )
    stop_at_step: int | None = _f(None, "save a checkpoint and exit at this step, as if preempted")
    # performance
    num_workers: int = _f(0, "DataLoader workers for datasets that are not held in memory")
    threads: int | None = _f(None, "torch threads per process (default: cores / local processes)")
    channels_last: bool = _f(False, "use channels_last memory format")
    compile: bool = _f(False, "torch.compile the model (checkpoints stay unwrapped)")
    # faults
    dist_timeout: float = _f(600.0, "process-group timeout in seconds: a hung collective fails after this")
    skip_nonfinite: bool = _f(False, "skip optimizer steps whose loss is NaN/Inf instead of stopping")
    # synthetic dataset shape
    synthetic_size: int = _f(2048, "synthetic: training samples")
    synthetic_test_size: int = _f(512, "synthetic: test samples")
    synthetic_channels: int = _f(1, "synthetic: channels")
    synthetic_image_size: int = _f(28, "synthetic: image side")
    synthetic_classes: int = _f(10, "synthetic: classes")
    debug: bool = _f(False, "show tracebacks for errors")

    def validate(self) -> TrainConfig:
        positive = [
            "epochs",
            "batch_size",
            "grad_accum_steps",
            "log_every",
            "keep_last",
            "synthetic_size",
            "synthetic_test_size",
            "synthetic_channels",
            "synthetic_image_size",
        ]
        optional_positive = [
            "max_steps",
            "global_batch_size",
            "max_device_batch",
            "eval_batch_size",
            "image_size",
            "stop_at_step",
            "threads",
        ]
        for name in positive:
            if getattr(self, name) < 1:
                raise UserError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in optional_positive:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UserError(f"--{_flag(name)} must be >= 1 (or unset), got {value}")
        for name in [
            "eval_every",
            "checkpoint_every",
            "num_workers",
            "warmup_steps",
            "weight_decay",
            "max_grad_norm",
            "momentum",
        ]:
            if getattr(self, name) < 0:
                raise UserError(f"--{_flag(name)} must be >= 0, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UserError(f"--lr must be a positive number, got {self.lr}")
        if not 0 < self.val_split < 1:
            raise UserError(f"--val-split must be between 0 and 1, got {self.val_split}")
        if self.synthetic_classes < 2:
            raise UserError(f"--synthetic-classes must be >= 2, got {self.synthetic_classes}")
        if self.dist_timeout <= 0:
            raise UserError(f"--dist-timeout must be > 0 seconds, got {self.dist_timeout}")
        for name in ("optimizer", "lr_schedule", "report_to", "mixed_precision"):
            choices = _choices(name)
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise UserError(f"--{_flag(name)} {value!r} is not one of: {', '.join(choices)}")
        if self.max_device_batch is not None and self.global_batch_size is None:
            raise UserError("--max-device-batch only applies with --global-batch-size G; set G or drop it")
        if self.global_batch_size is not None and self.grad_accum_steps != 1:
            raise UserError("--grad-accum-steps is derived when --global-batch-size is set; drop one of the two")
        if self.resume not in ("auto", "none") and not _exists(self.resume):
            raise UserError(f"--resume {self.resume!r}: no such checkpoint; use 'auto', 'none' or an existing path")
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def data_config(self):
        from accel_train.data.base import DataConfig

        names = {f.name for f in fields(DataConfig)}
        return DataConfig(**{k: v for k, v in self.to_dict().items() if k in names})


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (OSError, ValueError):  # a name too long for the filesystem, a NUL byte
        return False


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _choices(name: str) -> tuple[str, ...]:
    return next(f.metadata["choices"] for f in fields(TrainConfig) if f.name == name)


def _field_type(f: dataclasses.Field) -> type:
    text = str(f.type)
    for typ in (bool, int, float, str):
        if typ.__name__ in text.split(" | ")[0]:
            return typ
    raise AssertionError(f"unsupported field type {text}")


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        description=description or "Train a model with one Accelerate loop on any setup.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        argument_default=argparse.SUPPRESS,  # only flags the user gave end up in the namespace
    )
    parser.add_argument("--config", help="YAML file of hyperparameters; flags override it")
    for f in fields(TrainConfig):
        typ = _field_type(f)
        kwargs: dict[str, Any] = {"help": f"{f.metadata['help']} (default: {f.default})"}
        if typ is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = typ
            kwargs["metavar"] = f.name.upper()
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(f"--{_flag(f.name)}", dest=f.name, **kwargs)
    return parser


YAML_MAX_BYTES = 1 << 20  # 1 MiB: a hyperparameter file is a few hundred bytes
YAML_MAX_NODES = 10_000  # values in the document once anchors/aliases are expanded
YAML_MAX_CHARS = 2 << 20  # characters of scalar text once anchors/aliases are expanded
YAML_MAX_DEPTH = 32  # nesting of lists/mappings (a hyperparameter file is one flat mapping)


def load_yaml_config(path: str | Path) -> dict[str, Any]:
    """Read a hyperparameter YAML, rejecting unknown keys, duplicate keys, YAML-1.1 traps and oversized documents.

    Safety order: the file size is checked before reading, NUL bytes before parsing, nesting depth and the
    size after alias expansion on the event stream (before any node or Python object exists), duplicate
    keys while constructing.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--config {str(path)!r}: file not found")
    text = _read_yaml_text(path)
    loader_cls = _yaml_loader()
    _check_yaml_size(yaml, loader_cls, path, text)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        data = (loader.construct_document(node) if node is not None else None) or {}
    except _DuplicateKey as exc:
        raise UserError(f"--config {path}: {exc.describe()}; keep one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
        raise UserError(
            f"--config {path}: not valid YAML{where} ({_clip(problem, 200)}); write one 'key: value' per line, "
            "quoting values that contain ':' or '#'"
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of key: value, got {type(data).__name__}")
    lines = _top_level_key_lines(yaml, node)
    known = {f.name: f for f in fields(TrainConfig)}
    out: dict[str, Any] = {}
    spelled: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            # difflib on a huge key would be slow and its echo huge: only suggest for key-sized keys
            close = difflib.get_close_matches(key, list(known), n=1) if len(key) <= 64 else []
            hint = f"; did you mean {close[0]!r}?" if close else "; the keys are the --help flags without '--'"
            raise UserError(f"--config {path}: unknown key {_short_repr(raw_key)}{hint}")
        if key in spelled:  # batch-size and batch_size: one field written twice
            first, second = lines.get(str(spelled[key])), lines.get(str(raw_key))
            at = f" (lines {first} and {second})" if first and second else ""
            raise UserError(
                f"--config {path}: key {key!r} appears twice, as {spelled[key]!r} and {raw_key!r}{at}; keep one"
            )
        spelled[key] = raw_key
        if _field_type(known[key]) is str and isinstance(value, (bool, int, float)):
            # YAML 1.1 turns no/NO/off/yes into booleans and 0 into an int: show the text as written.
            written = _clip(_scalar_text(yaml, node, raw_key) or str(value), 80)
            raise UserError(
                f"--config {path}: {key}: {written} was read as {_short_repr(value)}, not as text; "
                f"quote it: {key}: '{written}'"
            )
        out[key] = _coerce(path, key, value, known[key])
    return out


def _read_yaml_text(path: Path) -> str:
    """The file's text: at most YAML_MAX_BYTES, UTF-8, a leading BOM dropped, no NUL bytes."""
    too_big = f"is too large for a hyperparameter file (limit {YAML_MAX_BYTES:,} bytes); pass a YAML file"
    try:
        size = path.stat().st_size
        if size > YAML_MAX_BYTES:
            raise UserError(f"--config {path}: {size:,} bytes {too_big}")
        with path.open("rb") as fh:
            raw = fh.read(YAML_MAX_BYTES + 1)  # the file may have grown since stat
        if len(raw) > YAML_MAX_BYTES:
            raise UserError(f"--config {path}: more than {YAML_MAX_BYTES:,} bytes {too_big}")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--config {path}: cannot read it as a UTF-8 text file ({exc}); pass a YAML file") from None
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark some editors write
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise UserError(f"--config {path}: NUL byte on line {line}, so it is not a text file; pass a YAML file")
    return text


_LOADER: list[type] = []  # the loader class, made on first use (yaml is imported lazily)


def _yaml_loader() -> type:
    """A safe loader (libyaml's when available) that refuses duplicate keys and reports unreadable values."""
    if _LOADER:
        return _LOADER[0]
    import yaml

    base = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader

    class ConfigLoader(base):  # type: ignore[misc, valid-type]
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # '<<: *base' keys may be overridden: that is what merging is for
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:
                        continue  # unhashable: the base class reports it
                    if first is not key_node:
                        raise _DuplicateKey(key, first.start_mark, key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, OverflowError) as exc:  # 2024-02-30, an int of 5,000 digits, ...
                problem = f"cannot read {_short_repr(node.value if isinstance(node.value, str) else '...', 40)}: "
                raise yaml.constructor.ConstructorError(
                    None, None, problem + _clip(str(exc).split(";")[0], 120), node.start_mark
                ) from None

    _LOADER.append(ConfigLoader)
    return ConfigLoader


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: Any, second: Any):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second

    def describe(self) -> str:
        one, two = self.first.line + 1, self.second.line + 1
        where = f"lines {one} and {two}" if one != two else f"both on line {one}"
        return f"key {_short_repr(self.key)} appears twice ({where})"


def _check_yaml_size(yaml, loader_cls: type, path: Path, text: str) -> None:
    """Refuse deep nesting and alias bombs ("billion laughs") from the event stream, before any node is built.

    Each anchor's expanded size (values and scalar characters) is memoised, so an alias costs O(1) however
    far it expands, and the count stops as soon as any collection passes the limit.
    """
    anchors: dict[str, tuple[int, int]] = {}
    stack: list[list[Any]] = []  # per open collection: [anchor, values, chars]
    total = [None, 0, 0]

    def add(nodes: int, chars: int, mark: Any) -> None:
        frame = stack[-1] if stack else total
        frame[1] += nodes
        frame[2] += chars
        if frame[1] > YAML_MAX_NODES or frame[2] > YAML_MAX_CHARS:
            what = f"{YAML_MAX_NODES:,} values" if frame[1] > YAML_MAX_NODES else f"{YAML_MAX_CHARS:,} characters"
            raise UserError(
                f"--config {path}: anchors/aliases expand too far (more than {what} by line {mark.line + 1}); "
                "a hyperparameter file is flat 'key: value' lines, write the values out"
            )

    try:
        for event in yaml.parse(text, Loader=loader_cls):
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                if len(stack) >= YAML_MAX_DEPTH:
                    raise UserError(
                        f"--config {path}: lists/mappings nest more than {YAML_MAX_DEPTH} levels deep "
                        f"(line {event.start_mark.line + 1}); a hyperparameter file is flat 'key: value' lines"
                    )
                stack.append([event.anchor, 1, 0])
            elif isinstance(event, yaml.CollectionEndEvent):
                anchor, nodes, chars = stack.pop()
                if anchor is not None:
                    anchors[anchor] = (nodes, chars)
                add(nodes, chars, event.start_mark)
            elif isinstance(event, yaml.ScalarEvent):
                if event.anchor is not None:
                    anchors[event.anchor] = (1, len(event.value))
                add(1, len(event.value), event.start_mark)
            elif isinstance(event, yaml.AliasEvent):
                if event.anchor in anchors:
                    add(*anchors[event.anchor], event.start_mark)
                elif any(frame[0] == event.anchor for frame in stack):
                    raise UserError(
                        f"--config {path}: alias *{_clip(event.anchor, 40)} on line {event.start_mark.line + 1} "
                        "refers to the collection that contains it; write the values out"
                    )
                else:
                    add(1, 0, event.start_mark)  # undefined: composing reports it
    except yaml.YAMLError:
        return  # a syntax error: load_yaml_config reports it with its line and column


def _top_level_key_lines(yaml, node: Any) -> dict[str, int]:
    """Top-level key as written -> its (first) line number."""
    lines: dict[str, int] = {}
    for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else []:
        if isinstance(key_node, yaml.ScalarNode):
            lines.setdefault(key_node.value, key_node.start_mark.line + 1)
    return lines


def _scalar_text(yaml, node: Any, key: Any) -> str | None:
    """The value of top-level ``key`` exactly as written in the composed document (None if not a plain scalar)."""
    for key_node, value_node in node.value if isinstance(node, yaml.MappingNode) else []:
        if key_node.value == str(key) and isinstance(value_node, yaml.ScalarNode):
            return value_node.value
    return None


def _clip(text: str, limit: int = 80) -> str:
    """``text`` cut to about ``limit`` characters, saying how long it was."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) for an error message: a huge string, number or list cannot make a huge message."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"
    import reprlib

    short = reprlib.Repr()
    short.maxstring = short.maxlong = short.maxother = limit
    short.maxlist = short.maxdict = short.maxtuple = short.maxset = 6
    short.maxlevel = 3
    try:
        text = short.repr(value)
    except Exception:  # e.g. an int too long for str()
        text = f"<{type(value).__name__}>"
    return _clip(text, 2 * limit)


def _coerce(path: Path, key: str, value: Any, f: dataclasses.Field) -> Any:
    typ = _field_type(f)
    optional = "None" in str(f.type)
    if value is None:
        if optional:
            return None
        raise UserError(f"--config {path}: {key} needs a value")
    if typ is bool and not isinstance(value, bool):
        raise UserError(f"--config {path}: {key} must be true or false, got {_short_repr(value)}")
    if typ is str and isinstance(value, (list, dict)):
        raise UserError(f"--config {path}: {key} takes one value, got {_short_repr(value)}")
    if typ is float and isinstance(value, str):
        # YAML 1.1 reads 1e-3 (no dot) as a string; --lr 1e-3 on the command line is a float, so is this.
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            value = number
    if typ in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UserError(f"--config {path}: {key} must be a number, got {_short_repr(value)}")
    if typ is int and isinstance(value, float):
        if not value.is_integer():
            raise UserError(f"--config {path}: {key} must be an integer, got {_short_repr(value)}")
        value = int(value)
    return typ(value)


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    """defaults < --config YAML < CLI flags, validated."""
    ns = vars(build_parser().parse_args(argv))
    values: dict[str, Any] = {}
    config_file = ns.pop("config", None)
    if config_file:
        values.update(load_yaml_config(config_file))
    values.update(ns)
    return TrainConfig(**values).validate()


def save_config(cfg: TrainConfig, path: str | Path, extra: dict[str, Any] | None = None) -> None:
    import yaml

    data = cfg.to_dict()
    if extra:
        data = {**data, "resolved": extra}
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
