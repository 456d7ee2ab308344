"""``hf:<name or path>``: an image-classification dataset from the Hugging Face ``datasets`` library.

``<path>`` written by ``save_to_disk`` is read with ``load_from_disk``; anything
else goes to ``load_dataset`` (Hub, using the local cache when offline).
Splits: ``train`` plus ``test`` (or ``validation``); a single split or a plain
``Dataset`` is split by ``cfg.val_split``/``cfg.seed``, stratified by class.
Images may be ``datasets.Image`` (PIL) or arrays. Splits small enough are
decoded once into uint8 tensors; larger ones are decoded lazily per sample.
Before anything is decoded, each split's columns are checked on their Arrow
data: rows, one class per row (ClassLabel, ints, strings, booleans or
whole-number floats; no lists, fractions, None/NaN or ClassLabel's -1) and an
image in every row; what fails is one line naming the split, column and fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accel_train.data.base import (
    DataConfig,
    DatasetInfo,
    DataSplits,
    TensorImageDataset,
    stratified_split,
)
from accel_train.data.folder import (
    SIZE_SAMPLE,
    LazyImageDataset,
    augment_for,
    channel_stats,
    choose_image_size,
    image_size_of,
    image_to_chw,
    images_to_nchw,
    infer_channels,
    sample_indices,
    sample_stats,
)
from accel_train.data.identity import Identity, hf_part
from accel_train.errors import UserError

IMAGE_COLUMNS = ("image", "img", "pixel_values")
LABEL_COLUMNS = ("label", "labels", "fine_label")
TEST_SPLITS = ("test", "validation", "valid", "val")
MAX_IN_MEMORY_SAMPLES = 200_000  # per split
MAX_IN_MEMORY_BYTES = 2 * 1024**3  # decoded uint8 bytes per split
DECODE_CHUNK = 1024
STATS_SAMPLE_IN_MEMORY = 10_000


def _is_saved_to_disk(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json"))


def _load(name: str):
    """The ``Dataset``/``DatasetDict`` for ``name`` and a description of where it came from."""
    import datasets

    path = Path(name).expanduser()
    if _is_saved_to_disk(path):
        try:
            return datasets.load_from_disk(str(path)), str(path.absolute())
        except IndexError as exc:  # datasets cannot read back what save_to_disk writes for 0 rows (no data files)
            empty = _empty_splits(path)
            if empty is None:
                raise UserError(f"cannot read the save_to_disk directory {path.absolute()}: {exc}") from exc
            what = f"split {', '.join(map(repr, empty))} of " if empty else ""
            raise UserError(
                f"{what}hf dataset {path.absolute()} has no rows (save_to_disk wrote no data files); save it with "
                f"images and labels{', or remove that split' if empty else ''}, or pass another hf:<path>"
            ) from None
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"cannot read the save_to_disk directory {path.absolute()}: {exc}") from exc
    if name.startswith((".", "/", "~")) and not path.exists():
        raise UserError(f"hf dataset directory {path.absolute()} does not exist; pass a save_to_disk directory")
    target = str(path.absolute()) if path.is_dir() else name
    try:
        if not path.is_dir():
            return datasets.load_dataset(target), target
        fresh, remember = _prepared_before(path)
        loaded = datasets.load_dataset(target, download_mode=None if fresh else "force_redownload")
        remember()
        return loaded, target
    except (ConnectionError, OSError) as exc:  # includes DatasetNotFoundError and offline cache misses
        raise UserError(
            f"could not load Hugging Face dataset {name!r}: it is not in the local cache and the Hub cannot be "
            f"reached (no network?) or has no such dataset ({type(exc).__name__}: {exc}). Run once with network "
            "access to cache it, or pass a directory written by Dataset.save_to_disk as hf:<path>"
        ) from exc
    except ValueError as exc:  # e.g. a config name is required
        raise UserError(f"could not load Hugging Face dataset {name!r}: {exc}") from exc


def _prepared_before(folder: Path):
    """Whether ``datasets`` prepared its Arrow copy of a folder of data files as they are now (each file's path,
    size, modification and change time, inode), and how to record that it did. ``datasets`` itself keys that
    copy by paths and modification times: a file rewritten with its time set back would be read as the old one,
    so a folder whose files this launch has not seen is prepared again (``force_redownload``)."""
    import hashlib

    from accel_train.data import index_cache

    h, newest = hashlib.sha256(), 0
    for parent, dirs, names in sorted(os.walk(folder)):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(n for n in names if not n.startswith(".")):
            st = os.stat(os.path.join(parent, name))
            rel = os.path.relpath(os.path.join(parent, name), folder)
            h.update(f"{rel!r}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\n".encode())
            newest = max(newest, st.st_mtime_ns)
    key = {"root": repr(str(folder.absolute())), "files": h.hexdigest()}
    seen = index_cache.load("hf-folder", key, with_arrays=False) is not None
    return seen, lambda: index_cache.store("hf-folder", key, {}, trusted=index_cache.settled(newest))


def _empty_splits(path: Path) -> list[str] | None:
    """Which parts of a ``save_to_disk`` directory were saved with no data files (0 rows): ``[]`` for a plain
    ``Dataset``, the split names for a ``DatasetDict``, None when none was."""
    parts = [(path, None)] + [(sub, sub.name) for sub in sorted(path.iterdir()) if sub.is_dir()]
    empty = []
    for folder, split in parts:
        try:
            if json.loads((folder / "state.json").read_text()).get("_data_files") == []:
                empty.append(split)
        except (OSError, ValueError, AttributeError):
            continue  # no state.json here (a DatasetDict's top level), or not one save_to_disk wrote
    if not empty:
        return None
    return [split for split in empty if split is not None]


def _pick_splits(obj: Any, name: str):
    """(train, test or None, their split names) from a ``DatasetDict`` or a plain ``Dataset``."""
    import datasets

    if isinstance(obj, datasets.Dataset):
        return obj, None, (None, None)
    if not isinstance(obj, datasets.DatasetDict):
        raise UserError(f"{name!r} loaded as {type(obj).__name__}; expected a Dataset or DatasetDict (no streaming)")
    keys = list(obj)
    if "train" in obj:
        train_key = "train"
    elif len(keys) == 1:
        train_key = keys[0]
    else:
        raise UserError(f"{name!r} has no 'train' split; its splits are: {', '.join(keys)}")
    test_key = next((k for k in TEST_SPLITS if k in obj and k != train_key), None)
    return obj[train_key], (obj[test_key] if test_key else None), (train_key, test_key)


def _pick_column(columns: list[str], requested: str | None, candidates: tuple[str, ...], what: str, flag: str) -> str:
    if requested:
        if requested not in columns:
            raise UserError(
                f"{what} column {requested!r} not found; available columns: {', '.join(columns)}; "
                f"pass one of them with {flag}"
            )
        return requested
    found = next((c for c in candidates if c in columns), None)
    if found is None:
        raise UserError(
            f"no {what} column found (looked for {', '.join(candidates)}); available columns: {', '.join(columns)}; "
            f"name it with {flag}"
        )
    return found


LABEL_FIX = "pick a column with one class per row (integers, strings or a ClassLabel) with --label-column"
_LABEL_DTYPES = frozenset(
    {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", "string", "large_string"}
)
_FLOAT_DTYPES = frozenset({"float16", "float32", "float64"})


def _kind_of(feature: Any) -> str:
    """How a column that is not what it should be reads in a message: "a list per row (List(Value('int64')))"."""
    import datasets

    text = repr(feature) if len(repr(feature)) <= 80 else f"{repr(feature)[:80]}..."
    if type(feature).__name__ in ("List", "LargeList", "Sequence") or isinstance(feature, list):
        return f"a list per row ({text})"
    if isinstance(feature, dict):
        return f"a record of several fields per row ({text})"
    if isinstance(feature, datasets.Image):
        return "images"
    if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string"):
        return "text"
    return f"{text} values"


def _missing(data, col: str, what: str, fix: str, where: str, negative: bool = False) -> None:
    """Refuse rows of ``col`` with no value: None (NaN for floats; with ``negative``, ClassLabel's -1 too)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = data.select_columns([col]).with_format("arrow")[:][col]
    bad = pc.is_null(values, nan_is_null=True)
    if negative:
        bad = pc.or_kleene(bad, pc.less(values, 0))  # None or -1 (plain or_ would be null for None)
    count = pc.sum(pc.cast(bad, "int64")).as_py() or 0
    if count:
        first = pc.index(bad, True).as_py()
        none = "None or NaN" if pa.types.is_floating(values.type) else "None"
        none += ", or -1 = no label in a ClassLabel column" if negative else ""
        raise UserError(
            f"{where}: {what} column {col!r} has no value ({none}) in {count} of {len(values)} rows, first at row "
            f"{first}; drop those rows (Dataset.filter) and save_to_disk again, or {fix}"
        )


def _check_labels(data, col: str, where: str) -> None:
    """One class per row: a ClassLabel, integers, strings, booleans or whole-number floats, none missing."""
    import datasets
    import pyarrow.compute as pc

    feature = data.features[col]
    is_class = isinstance(feature, datasets.ClassLabel)
    dtype = feature.dtype if isinstance(feature, datasets.Value) else None
    if not is_class and dtype not in _LABEL_DTYPES | _FLOAT_DTYPES:
        kind = _kind_of(feature)
        multi = "; multi-label data is not supported" if kind.startswith("a list per row") else ""
        raise UserError(f"{where}: label column {col!r} holds {kind}, not one class per row{multi}; {LABEL_FIX}")
    _missing(data, col, "label", LABEL_FIX, where, negative=is_class)
    if dtype in _FLOAT_DTYPES:
        values = data.select_columns([col]).with_format("arrow")[:][col]
        fractional = pc.not_equal(values, pc.floor(values))
        if pc.any(fractional).as_py():
            example = values[pc.index(fractional, True).as_py()].as_py()
            raise UserError(
                f"{where}: label column {col!r} holds fractional numbers (e.g. {example}), which are not classes "
                f"(a regression target?); {LABEL_FIX}"
            )


def _check_images(data, col: str, where: str) -> None:
    """Images or image arrays in every row."""
    import datasets

    feature = data.features[col]
    fix = "pick the image column with --image-column"
    if isinstance(feature, (datasets.Value, datasets.ClassLabel)):
        encoded = getattr(feature, "dtype", None) in ("string", "large_string", "binary", "large_binary")
        path_hint = (
            "; if they are file paths or encoded image files, cast the column first: "
            f"dataset.cast_column({col!r}, datasets.Image())"
            if encoded
            else ""
        )
        raise UserError(f"{where}: image column {col!r} holds {_kind_of(feature)}, not images{path_hint}; {fix}")
    _missing(data, col, "image", fix, where)


def _check_split(data, split: str | None, name: str, image_col: str, label_col: str) -> None:
    where = f"{name!r}" + (f" split {split!r}" if split else "")
    if len(data) == 0:
        raise UserError(f"{where} has no rows; save a dataset with images and labels, or pass another hf:<path>")
    _check_images(data, image_col, where)
    _check_labels(data, label_col, where)


def _column(data, col: str) -> np.ndarray:
    return np.asarray(data.select_columns([col]).with_format("numpy")[:][col])


def _class_names(train, test, col: str) -> tuple[list[str], np.ndarray | None]:
    """Class names and, for non-ClassLabel labels, the sorted unique raw values (index = class)."""
    import datasets

    feature = train.features[col]
    if isinstance(feature, datasets.ClassLabel):
        return list(feature.names), None
    raw = [_column(train, col)] + ([_column(test, col)] if test is not None else [])
    uniques = np.unique(np.concatenate(raw))
    return [str(v) for v in uniques.tolist()], uniques


def _test_by_name(train, test, col: str, name: str) -> torch.Tensor | None:
    """Where the test split's ClassLabel lists the names in another order than train's: its codes -> train's, by
    name (None: the same order, or no ClassLabel); a name train lacks is refused."""
    import datasets

    if test is None or train is test:
        return None
    mine, theirs = test.features[col], train.features[col]
    if not isinstance(mine, datasets.ClassLabel) or not isinstance(theirs, datasets.ClassLabel):
        return None
    if list(mine.names) == list(theirs.names):
        return None
    unknown = [n for n in mine.names if n not in theirs.names]
    if unknown:
        raise UserError(
            f"{name!r}: the test split's class(es) {', '.join(map(repr, unknown[:5]))} are not among train's "
            f"({', '.join(theirs.names[:10])}); give both splits the same ClassLabel names"
        )
    return torch.as_tensor([theirs.names.index(n) for n in mine.names], dtype=torch.int64)


def _labels(data, col: str, uniques: np.ndarray | None) -> torch.Tensor:
    raw = _column(data, col)
    return torch.from_numpy(np.searchsorted(uniques, raw) if uniques is not None else raw.astype(np.int64)).long()


def _decode_all(data, col: str, is_pil: bool, channels: int, size: int) -> torch.Tensor:
    """Decode a whole split once into uint8 [N, channels, size, size]."""
    n = len(data)
    out = torch.empty((n, channels, size, size), dtype=torch.uint8)
    view = data.select_columns([col]) if is_pil else data.select_columns([col]).with_format("numpy")
    for start in range(0, n, DECODE_CHUNK):
        batch = view[start : start + DECODE_CHUNK][col]
        if not is_pil and isinstance(batch, np.ndarray) and batch.dtype != object:
            out[start : start + len(batch)] = images_to_nchw(batch, channels, size)  # one batched conversion
        else:  # PIL images (decoded here, one by one) or arrays of different shapes
            for j, image in enumerate(batch):
                out[start + j] = image_to_chw(image, channels, size)
    return out


def _sizes(data, col: str, is_pil: bool) -> set[tuple[int, int]]:
    import datasets

    view = data.cast_column(col, datasets.Image(decode=False)) if is_pil else data.with_format("numpy")
    view = view.select_columns([col])
    return {image_size_of(view[i][col]) for i in sample_indices(len(data), SIZE_SAMPLE)}


def build_hf(cfg: DataConfig, name: str) -> DataSplits:
    """An image-classification dataset from ``datasets`` (see the module docstring)."""
    import datasets

    obj, source = _load(name)
    train, test, (train_split, test_split) = _pick_splits(obj, name)
    columns = list(train.column_names)
    image_col = _pick_column(columns, cfg.image_column, IMAGE_COLUMNS, "image", "--image-column")
    label_col = _pick_column(columns, cfg.label_column, LABEL_COLUMNS, "label", "--label-column")
    _check_split(train, train_split, name, image_col, label_col)
    if test is not None:
        _check_split(test, test_split, name, image_col, label_col)
    class_names, uniques = _class_names(train, test, label_col)
    if len(class_names) < 2:
        raise UserError(f"{name!r}: column {label_col!r} has {len(class_names)} class(es); need at least 2 classes")
    parts = {"train": hf_part(train, class_names, _column(train, label_col))}
    if test is not None:
        parts["test"] = hf_part(test, class_names, _column(test, label_col))
    if test is None:
        train_idx, test_idx = stratified_split(_labels(train, label_col, uniques), cfg.val_split, cfg.seed)
        if len(train_idx) == 0 or len(test_idx) == 0:
            raise UserError(f"{name!r}: val_split={cfg.val_split} leaves an empty split; use a value between 0 and 1")
        train, test = train.select(train_idx.tolist()), train.select(test_idx.tolist())

    is_pil = isinstance(train.features[image_col], datasets.Image)
    view = train.select_columns([image_col])
    first = (view if is_pil else view.with_format("numpy"))[0][image_col]
    channels = infer_channels(first)
    size = choose_image_size(_sizes(train, image_col, is_pil), cfg.image_size)
    transform, augment = augment_for(cfg, size, channels)
    per_sample = channels * size * size
    in_memory = all(
        len(s) <= MAX_IN_MEMORY_SAMPLES and len(s) * per_sample <= MAX_IN_MEMORY_BYTES for s in (train, test)
    )

    by_name = _test_by_name(train, test, label_col, name)  # a test ClassLabel listing the names in another order
    if in_memory:
        x_train = _decode_all(train, image_col, is_pil, channels, size)
        x_test = _decode_all(test, image_col, is_pil, channels, size)
        train_ds: Any = TensorImageDataset(x_train, _labels(train, label_col, uniques), transform=transform)
        test_labels = _labels(test, label_col, uniques)
        test_ds: Any = TensorImageDataset(x_test, test_labels if by_name is None else by_name[test_labels])
        idx = torch.as_tensor(sample_indices(len(x_train), STATS_SAMPLE_IN_MEMORY))
        mean, std = channel_stats(x_train.index_select(0, idx))
    else:
        label_map = {v: i for i, v in enumerate(uniques.tolist())} if uniques is not None else None
        if not is_pil:
            train, test = train.with_format("numpy"), test.with_format("numpy")
        train_ds = LazyImageDataset(train, image_col, label_col, channels, size, label_map, transform=transform)
        test_map = label_map if by_name is None else dict(enumerate(by_name.tolist()))
        test_ds = LazyImageDataset(test, image_col, label_col, channels, size, test_map)
        mean, std = sample_stats(train_ds)
    info = DatasetInfo(f"hf:{name}", len(class_names), channels, size, class_names, mean, std)
    extra = {"source": source, "augment": augment, "image_column": image_col, "label_column": label_col}
    extra |= {"identity": Identity("hf", parts), "split": "splits" if "test" in parts else "stratified"}
    return DataSplits(train_ds, test_ds, info, in_memory=in_memory, extra=extra)
