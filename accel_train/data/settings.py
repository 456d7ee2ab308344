"""The data settings: what every dataset builder reads, declared here once (default, help, choices).

``DataConfig`` is all a builder needs (``build_dataset(DataConfig(dataset="digits"))``); ``TrainConfig`` repeats
these fields, flat, so that flags and YAML keys stay the same, and hands a run's slice down with
``TrainConfig.data_config()``. No torch here: the flag parser reads this class before anything heavy loads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from accel_train.errors import UserError
from accel_train.flags import SAFE
from accel_train.flags import setting as _f
from accel_train.limits import MAX_CHANNELS, MAX_CLASSES, MAX_IMAGE_SIZE


@dataclass
class DataConfig:
    """The slice of the training config that dataset builders read."""

    dataset: str = _f(
        "digits",
        "dataset: digits, synthetic, mnist, fashion_mnist, cifar10, imagefolder:DIR, hf:NAME, "
        "shards:DIR (*.parquet, save_to_disk *.arrow or WebDataset *.tar shards, read lazily)",
    )
    data_dir: str = _f("data", "root folder of on-disk datasets (torchvision layouts)", resume=SAFE)
    download: bool = _f(
        False, "download mnist/fashion_mnist/cifar10 with torchvision if missing (needs network)", resume=SAFE
    )
    image_size: int | None = _f(
        None, "resize images to this size (default: the dataset's own size)", low=1, high=MAX_IMAGE_SIZE
    )
    seed: int = _f(42, "random seed (data order, init, dropout)")
    val_split: float = _f(0.2, "test fraction for sources without a test split")
    image_column: str | None = _f(None, "image column of an hf: dataset (default: detected)")
    label_column: str | None = _f(None, "label column of an hf: dataset (default: detected)")
    augment: bool | None = _f(
        None,
        "data augmentation (default: the dataset's own: crop+flip for cifar10; for imagefolder:, hf: and shards: "
        "when --model is not given, crop, and flip for colour images, see --model)",
    )
    crop_padding: int | None = _f(
        None, "random-crop padding in pixels when augmenting (default: the dataset's: 4 for cifar10, 2 for mnist)"
    )
    crop_padding_mode: str = _f(
        "constant", "how the random crop pads: constant (zeros) or reflect", choices=("constant", "reflect")
    )
    synthetic_size: int = _f(2048, "synthetic: training samples", low=1)
    synthetic_test_size: int = _f(512, "synthetic: test samples", low=1)
    synthetic_channels: int = _f(1, "synthetic: channels", low=1, high=MAX_CHANNELS)
    synthetic_image_size: int = _f(28, "synthetic: image side", low=1, high=MAX_IMAGE_SIZE)
    synthetic_classes: int = _f(10, "synthetic: classes", high=MAX_CLASSES)


#: The options dataset builders read (``DataConfig``'s fields).
DATA_FIELDS = tuple(f.name for f in fields(DataConfig))


#: Flags that apply to some datasets only: the names (of ``DataConfig`` fields) and which datasets take them.
_ONLY_FOR = {
    "image_column": ("hf:", "shards:"),
    "label_column": ("hf:", "shards:"),
    "data_dir": ("mnist", "fashion_mnist", "cifar10"),
    "download": ("mnist", "fashion_mnist", "cifar10"),
}


def flags_that_do_not_apply(dataset: str, given: dict | None, own_split: bool) -> list[str]:
    """The flags in ``given`` (the values the user set, by name) that ``dataset`` would ignore, as ``--flag-name``
    texts with why: a flag that would change something elsewhere is refused here, never ignored (one set to its
    default changes nothing: a recipe's ``data_dir: data`` beside another dataset). ``own_split``: the data has a
    test split of its own (then ``--val-split`` holds nothing out)."""
    defaults = {f.name: f.default for f in fields(DataConfig)}
    given = {k: v for k, v in (given or {}).items() if k in defaults and v != defaults[k]}
    if not given:
        return []
    wrong = []
    for name, takers in _ONLY_FOR.items():
        if name in given and not any(dataset == t or (t.endswith(":") and dataset.startswith(t)) for t in takers):
            wrong.append(f"--{name.replace('_', '-')} (for {', '.join(takers)})")
    synthetic = sorted(n for n in given if n.startswith("synthetic_"))
    if synthetic and dataset != "synthetic":
        wrong.append(f"--{synthetic[0].replace('_', '-')} (for synthetic)")
    if own_split and "val_split" in given:
        wrong.append("--val-split (this data has a test split of its own)")
    return wrong


def refuse_flags_that_do_not_apply(dataset: str, given: dict | None, own_split: bool = False) -> None:
    """:func:`flags_that_do_not_apply` as a one-line error: the one rule training (``build``) and the data
    builders ``accel-evaluate`` also runs (an image folder's) refuse by."""
    wrong = flags_that_do_not_apply(dataset, given, own_split)
    if wrong:
        raise UserError(f"{', '.join(wrong)} do(es) not apply to --dataset {dataset}; drop it")
