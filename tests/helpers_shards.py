"""Tiny shard sets for ``shards:PATH`` (tests/unit/test_shards.py, tests/integration/test_shards_runs.py): Parquet
files as ``datasets`` writes them (an Image struct and a ClassLabel in the schema's metadata) or as plain pyarrow
does (a binary column, string labels), Arrow files as ``save_to_disk`` writes them, and tar files in WebDataset
layout (``KEY.png`` + ``KEY.cls``).

The images are learnable PNGs (a class colour plus noise, tests/datafiles.py) of ``size`` x ``size`` pixels.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
from datafiles import _colour_images

CLASSES = ("red", "green", "blue")


def png(arr: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _samples(shard: int, rows: int, size: int, seed: int) -> tuple[list[bytes], list[int]]:
    labels = [(shard * 7 + i * 5 + i // 3) % len(CLASSES) for i in range(rows)]
    images = _colour_images(np.asarray(labels), size, seed=seed + shard)
    return [png(a) for a in images], labels


def write_parquet(path: Path | None, images: list[bytes | None], labels: list, *, struct: bool = True,
                  class_label: bool = True, row_group: int = 8):  # fmt: skip
    """One Parquet shard: ``image`` (Image struct, or binary) and ``label`` (int64 ClassLabel, or as given); with
    ``path`` None, the table instead."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if struct:
        column = pa.array(
            [{"bytes": b, "path": None} for b in images], pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        )
    else:
        column = pa.array(images, pa.binary())
    table = pa.table({"image": column, "label": pa.array(labels)})
    if class_label:
        features = {"image": {"_type": "Image"}, "label": {"names": list(CLASSES), "_type": "ClassLabel"}}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    if path is None:
        return table
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group)
    return path


def write_arrow(path: Path, images: list[bytes], labels: list, batch: int = 8) -> Path:
    """One Arrow shard as ``save_to_disk`` writes it: the IPC stream format, record batches of ``batch`` rows."""
    import pyarrow as pa

    table = write_parquet(None, images, labels)
    path.parent.mkdir(parents=True, exist_ok=True)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch_ in table.to_batches(max_chunksize=batch):
            writer.write_batch(batch_)
    return path


def write_tar(path: Path, images: list[bytes], labels: list, keys: list[str] | None = None) -> Path:
    """One WebDataset tar shard: ``KEY.png`` then ``KEY.cls`` for each sample."""
    path.parent.mkdir(parents=True, exist_ok=True)
    keys = keys or [f"{path.stem}_{i:05d}" for i in range(len(images))]
    with tarfile.open(path, "w") as tar:
        for key, data, label in zip(keys, images, labels, strict=True):
            for name, payload in ((f"{key}.png", data), (f"{key}.cls", str(label).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


def write_shards(folder: Path, kind: str = "parquet", shards: int = 4, rows: int = 24, size: int = 8,
                 prefix: str = "part", seed: int = 0, **parquet) -> list[Path]:  # fmt: skip
    """``shards`` files of ``rows`` samples each in ``folder``: ``{prefix}-00000-of-0000N.parquet`` (or ``.arrow``,
    ``.tar``)."""
    written = []
    for s in range(shards):
        images, labels = _samples(s, rows, size, seed)
        name = folder / f"{prefix}-{s:05d}-of-{shards:05d}.{kind}"
        if kind == "tar":
            written.append(write_tar(name, images, [CLASSES[i] for i in labels]))
        elif kind == "arrow":
            written.append(write_arrow(name, images, labels))
        else:
            written.append(write_parquet(name, images, labels, **parquet))
    return written


def shard_set(root: Path, kind: str = "parquet", layout: str = "folders", **kwargs) -> Path:
    """``root`` with train and test shards: ``folders`` (train/ + test/), ``hub`` (train-*, test-* files) or
    ``flat`` (one set, held out by --val-split)."""
    test = {k: v for k, v in kwargs.items() if k not in ("shards", "rows", "seed")} | {"shards": 1, "rows": 12}
    if layout == "folders":
        write_shards(root / "train", kind, **kwargs)
        write_shards(root / "test", kind, seed=50, **test)
    elif layout == "hub":
        write_shards(root, kind, prefix="train", **kwargs)
        write_shards(root, kind, prefix="test", seed=50, **test)
    else:
        write_shards(root, kind, **kwargs)
    return root


def move_arrow_labels(arrow: Path, classes: int = 3) -> None:
    """Rewrite a ``save_to_disk`` Arrow file (IPC stream) with every label moved to the next class, as many per
    class, the same size (``state.json``, the fingerprint, left as it was)."""
    import pyarrow as pa

    with pa.memory_map(str(arrow)) as source:
        table = pa.ipc.open_stream(source).read_all()
    moved = pa.array([(v + 1) % classes for v in table.column("label").to_pylist()], pa.int64())
    table = table.set_column(table.schema.get_field_index("label"), table.schema.field("label"), moved)
    with pa.OSFile(str(arrow) + ".tmp", "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(str(arrow) + ".tmp", arrow)
