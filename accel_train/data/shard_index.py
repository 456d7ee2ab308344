"""The index of a set of shards (``shards:PATH``): the files, each one's rows, where a row's image lies and every
row's label, made in one pass and cached (``index_cache``) so that a resume, a requeue or another rank reads it in
milliseconds instead of passing over the shards again.

* **Parquet** (``*.parquet``, pyarrow): row counts and row-group boundaries come from each file's footer; the labels
  are one column read per shard; the image column is checked on the schema (Hugging Face's ``Image`` struct
  ``{bytes, path}``, or a binary column of encoded files). Class names come from the schema's ``huggingface``
  metadata when the label column is a ``ClassLabel``. Nothing else is read.
* **Arrow** (``*.arrow``: what ``datasets``' ``save_to_disk`` writes): the same columns, memory-mapped; its record
  batches play the row groups' part.
* **tar** (``*.tar``, WebDataset layout, the standard library's ``tarfile``): members ``KEY.png`` (or ``jpg``,
  ``jpeg``, ``webp``, ...) and ``KEY.cls`` (the class, as text) make one sample; each tar's headers are read once,
  the ``.cls`` members with them, and a sample's image is later read by seeking to its member's data offset.

The cache entry is keyed by the shards' absolute paths, sizes, modification and change times and inodes (and the
columns asked for): a shard rewritten (even with its time set back), added or removed is indexed again. Labels are
matched by name: a shard whose ``ClassLabel`` lists the names in another order than the first shard's is read by
its own names, never by position.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accel_train.data import index_cache
from accel_train.data.hf import IMAGE_COLUMNS, LABEL_COLUMNS, LABEL_FIX, _pick_column
from accel_train.errors import UserError

INDEX_KIND = "shards"
VERSION = 2  # 2: keyed by change time and inode too; ClassLabel names per shard
SUFFIXES = {".parquet": "parquet", ".arrow": "arrow", ".tar": "tar"}
TAR_IMAGES = frozenset("png jpg jpeg webp bmp gif tif tiff ppm pgm pbm pnm".split())
TAR_LABEL = "cls"
MAX_CLS_BYTES = 1024
_INT = re.compile(r"[+-]?\d+")


@dataclass
class ShardIndex:
    """Rows ``0 .. len - 1`` of ``files``, in file order: shard ``s`` holds rows ``starts[s] .. starts[s + 1] - 1``.

    ``groups``: the row boundaries of the units a reader fetches whole (Parquet row groups, Arrow record batches;
    one per tar), with ``group_shard``/``group_index`` saying which shard and which row group of it, and
    ``group_bytes`` how many bytes of encoded images each holds. ``labels``: codes into
    ``values`` (the sorted raw label values). Tar shards add each sample's member ``offsets``/``sizes`` and names.
    """

    kind: str
    files: list[Path]
    starts: np.ndarray
    labels: np.ndarray
    values: list
    groups: np.ndarray
    group_shard: np.ndarray
    group_index: np.ndarray
    group_bytes: np.ndarray
    facts: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    cache: index_cache.Entry | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def shard_of(self, row: int) -> int:
        return int(np.searchsorted(self.starts, row, side="right") - 1)

    def group_of(self, row: int) -> int:
        return int(np.searchsorted(self.groups, row, side="right") - 1)

    def member(self, row: int) -> str:
        a = self.arrays
        return os.fsdecode(a["names"][a["name_offsets"][row] : a["name_offsets"][row + 1]].tobytes())

    def where(self, row: int) -> str:
        """Shard and row (or tar member) of ``row``, for a message."""
        shard = self.shard_of(row)
        if self.kind == "tar":
            return f"shard {self.files[shard]} member {self.member(row)}"
        return f"shard {self.files[shard]} row {row - int(self.starts[shard])}"

    def blocks(self, most: int) -> tuple[np.ndarray, np.ndarray]:
        """Runs of at most ``most`` consecutive rows that never cross a group (nor a shard): their row boundaries
        ``[K + 1]`` and the bytes of encoded images each holds ``[K]`` (a tar's exactly; a row group's share)."""
        pieces = [np.arange(a, b, most, dtype=np.int64) for a, b in zip(self.groups[:-1], self.groups[1:], strict=True)]
        bounds = np.concatenate([*pieces, np.asarray([len(self)], dtype=np.int64)])
        if self.kind == "tar":
            total = np.concatenate([[0], np.cumsum(self.arrays["sizes"])])
        else:  # the bytes of each group spread evenly over its rows
            rows = np.diff(self.groups)
            per_row = np.repeat(self.group_bytes / np.maximum(rows, 1), rows)
            total = np.concatenate([[0.0], np.cumsum(per_row)])
        return bounds, np.diff(total[bounds]).astype(np.int64)

    @property
    def class_label(self) -> list[str] | None:
        return self.facts.get("class_label")


def shard_files(folder: Path) -> list[Path]:
    """The non-hidden ``*.parquet``/``*.arrow``/``*.tar`` files directly in ``folder``, sorted by name."""
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise UserError(f"cannot list {folder}: {exc.strerror or exc}; check its permissions") from None
    return [
        Path(e.path)
        for e in entries
        if not e.name.startswith(".") and os.path.splitext(e.name)[1].lower() in SUFFIXES and e.is_file()
    ]


def kind_of(files: list[Path], where: Path) -> str:
    """The shards' kind, ``parquet``, ``arrow`` or ``tar``: one kind per dataset."""
    kinds = {SUFFIXES[f.suffix.lower()] for f in files}
    if len(kinds) > 1:
        raise UserError(
            f"{where} holds shards of several kinds ({', '.join(sorted(kinds))}); keep one kind per dataset (move "
            "the others to another folder) and pass that folder as shards:PATH"
        )
    return kinds.pop()


def index_shards(files: list[Path], image_column: str | None = None, label_column: str | None = None) -> ShardIndex:
    """The index of ``files`` (one folder, one kind): from the cache when no shard changed, else made now."""
    kind = SUFFIXES[files[0].suffix.lower()]
    if kind == "tar":
        for flag, value in (("--image-column", image_column), ("--label-column", label_column)):
            if value is not None:
                raise UserError(
                    f"{flag} does not apply to tar shards (each sample is KEY.<image extension> + KEY.{TAR_LABEL}); "
                    "drop it"
                )
    stats, newest = [], 0
    for f in files:
        st = f.stat()
        stats.append([str(f.absolute()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino])
        newest = max(newest, st.st_mtime_ns)
    key = {"version": VERSION, "kind": kind, "files": stats}
    key |= {"image_column": image_column, "label_column": label_column}
    entry = index_cache.load(INDEX_KIND, key)
    if entry is None or not _complete(entry):
        arrays, facts = _index_tar(files) if kind == "tar" else _index_columns(files, kind, image_column, label_column)
        entry = index_cache.store(INDEX_KIND, key, arrays, trusted=index_cache.settled(newest), facts=facts)
    a = entry.arrays
    extra = {k: a[k] for k in ("offsets", "sizes", "names", "name_offsets") if k in a}
    return ShardIndex(kind, list(files), a["starts"], a["labels"], list(entry.facts["values"]), a["groups"],
                      a["group_shard"], a["group_index"], a["group_bytes"], entry.facts, extra, entry)  # fmt: skip


def _complete(entry: index_cache.Entry) -> bool:
    """Whether a cache entry holds what an index needs (else it is made again)."""
    needed = ("starts", "labels", "groups", "group_shard", "group_index", "group_bytes")
    return isinstance(entry.facts.get("values"), list) and all(k in entry.arrays for k in needed)


def _codes(raw: list[np.ndarray], kinds: set[str], files: list[Path]) -> tuple[np.ndarray, list, str]:
    """(codes into the sorted unique values, those values, their kind) of the shards' labels."""
    if len(kinds) > 1:
        raise UserError(
            f"the labels of {files[0].parent} are of several kinds ({', '.join(sorted(kinds))}) across its shards; "
            "give every shard the same label type"
        )
    values, codes = np.unique(np.concatenate(raw) if raw else np.zeros(0, dtype=np.int64), return_inverse=True)
    return codes.astype(np.int64).reshape(-1), values.tolist(), kinds.pop() if kinds else "int"


# --------------------------------------------------------------------------- Parquet and Arrow


def arrow_table(path: Path):
    """An Arrow IPC file (``save_to_disk`` writes the stream format) as a memory-mapped table: nothing is copied."""
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source).read_all()


def _layout(path: Path, kind: str, label: str | None = None, image: str | None = None):
    """(schema, rows of each row group or record batch, the bytes of ``image`` in each, and the ``label`` column)
    of one shard (without ``label``: the schema alone)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if kind == "arrow":
            table = arrow_table(path)
            if label is None:
                return table.schema, [], [], None
            sizes = [chunk.nbytes for chunk in table.column(image).chunks]  # memory-mapped: nothing is read
            return table.schema, [b.num_rows for b in table.to_batches()], sizes, table.column(label)
        meta = pq.ParquetFile(path).metadata
        if label is None:
            return meta.schema.to_arrow_schema(), [], [], None
        groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
        sizes = [sum(c.total_uncompressed_size for c in map(group.column, range(group.num_columns))
                     if c.path_in_schema.split(".")[0] == image) for group in groups]  # fmt: skip
        labels = pq.read_table(path, columns=[label], use_threads=False).column(label)
        return meta.schema.to_arrow_schema(), [group.num_rows for group in groups], sizes, labels
    except (OSError, KeyError, pa.ArrowException) as exc:
        what = f"{'Arrow' if kind == 'arrow' else 'Parquet'} shard {path}"
        raise UserError(f"cannot read {what}: {' '.join(str(exc).split())[:200]}; replace it") from None


def image_kind(schema, column: str, path: Path) -> str:
    """How ``column`` holds images: ``struct`` (Hugging Face's Image, ``{bytes, path}``) or ``binary`` (encoded
    files); anything else is a one-line error."""
    import pyarrow as pa

    if column not in schema.names:
        raise UserError(f"shard {path} has no column {column!r} (its columns: {', '.join(schema.names)})")
    kind = schema.field(column).type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        return "struct"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return "binary"
    raise UserError(
        f"shard {path}: image column {column!r} holds {kind}, not encoded images (Hugging Face's Image "
        "struct or a binary column of PNG/JPEG/... bytes); pick the image column with --image-column"
    )


def _class_label(schema, column: str) -> list[str] | None:
    """The ``ClassLabel`` names ``datasets`` recorded for ``column`` in the schema's metadata, if any."""
    try:
        info = json.loads((schema.metadata or {})[b"huggingface"])
        feature = info["info"]["features"][column]
        return [str(n) for n in feature["names"]] if feature.get("_type") == "ClassLabel" else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _label_array(column, where: str, name: str, classes: list[str] | None) -> tuple[np.ndarray, str]:
    """One shard's labels as numpy, and their kind ("int", "bool", "str"); missing or odd ones refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    kind = values.type
    missing = pc.is_null(values, nan_is_null=True)
    if pc.any(missing).as_py():
        first = pc.index(missing, True).as_py()
        raise UserError(f"{where}: label column {name!r} has no value (None) at row {first}; drop it, or {LABEL_FIX}")
    if pa.types.is_floating(kind):
        fraction = pc.not_equal(values, pc.floor(values))
        if pc.any(fraction).as_py():
            example = values[pc.index(fraction, True).as_py()].as_py()
            raise UserError(f"{where}: label column {name!r} holds fractional numbers (e.g. {example}); {LABEL_FIX}")
        values, kind = pc.cast(values, pa.int64()), pa.int64()
    if pa.types.is_integer(kind):
        out = values.to_numpy().astype(np.int64)
        if classes is not None and len(out) and (out.min() < 0 or out.max() >= len(classes)):
            bad = int(out[(out < 0) | (out >= len(classes))][0])
            raise UserError(
                f"{where}: label {bad} is not one of the {len(classes)} ClassLabel classes (-1 = no label); "
                f"drop those rows, or {LABEL_FIX}"
            )
        return out, "int"
    if pa.types.is_boolean(kind):
        return values.to_numpy(zero_copy_only=False), "bool"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return values.to_numpy(zero_copy_only=False).astype(str), "str"
    raise UserError(f"{where}: label column {name!r} holds {kind}, not one class per row; {LABEL_FIX}")


def _index_columns(files: list[Path], kind: str, image_req: str | None, label_req: str | None):
    schema = _layout(files[0], kind)[0]
    columns = list(schema.names)
    image_col = _pick_column(columns, image_req, IMAGE_COLUMNS, "image", "--image-column")
    label_col = _pick_column(columns, label_req, LABEL_COLUMNS, "label", "--label-column")
    images = image_kind(schema, image_col, files[0])
    first_names = _class_label(schema, label_col)
    classes: list[str] | None = None if first_names is None else list(first_names)
    starts, groups, group_shard, group_index, group_bytes, raw, kinds = [0], [0], [], [], [], [], set()
    for s, path in enumerate(files):
        shard_schema, rows, sizes, column = _layout(path, kind, label_col, image_col)
        if image_kind(shard_schema, image_col, path) != images:
            raise UserError(f"shard {path}: image column {image_col!r} differs in type from {files[0].name}'s")
        names = _class_label(shard_schema, label_col)
        if (names is None) != (first_names is None):
            raise UserError(
                f"shard {path} {'has no' if names is None else 'has'} ClassLabel names for {label_col!r} where "
                f"{files[0].name} {'has' if names is None else 'has none'}: its labels cannot be matched by name; "
                "write every shard with the same features"
            )
        for g, (n, size) in enumerate(zip(rows, sizes, strict=True)):
            if n:
                groups.append(groups[-1] + n)
                group_shard.append(s)
                group_index.append(g)
                group_bytes.append(size)
        labels, label_kind = _label_array(column, f"shard {path}", label_col, names)
        if names is not None:  # by name, never by position: shards may list the names in other orders
            labels, label_kind = np.asarray(names, dtype=str)[labels] if len(labels) else labels.astype(str), "str"
            classes += [n for n in names if n not in classes]  # type: ignore[operator]
        raw.append(labels)
        kinds.add(label_kind)
        starts.append(starts[-1] + sum(rows))
    codes, values, label_kind = _codes(raw, kinds, files)
    arrays = {"starts": starts, "labels": codes, "groups": groups, "group_shard": group_shard}
    arrays |= {"group_index": group_index, "group_bytes": group_bytes}
    facts = {"values": values, "label_kind": label_kind, "class_label": classes, "image_column": image_col}
    facts |= {"label_column": label_col, "image_kind": images}
    return {k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()}, facts


# --------------------------------------------------------------------------- tar (WebDataset)


def _split_member(name: str) -> tuple[str, str]:
    """WebDataset's naming: the key is the path up to the first dot of the file name, the extension the rest; a
    key with dots of its own (``img.001.png`` + ``img.001.cls``) keeps them when the last part names an image or
    the class."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    ext = ext.lower()
    if dot and ext not in TAR_IMAGES and ext != TAR_LABEL:
        last = ext.rpartition(".")[2]
        if last in TAR_IMAGES or last == TAR_LABEL:
            stem, ext = base[: len(base) - len(last) - 1], last
    return (f"{folder}/{stem}" if folder else stem), ext if dot else ""


def _scan_tar(path: Path, skipped: Counter) -> dict[str, list]:
    """key -> [image member, data offset, size, label text], in the order the keys first appear; the members of
    other kinds are counted in ``skipped`` (by extension)."""
    samples: dict[str, list] = {}
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isreg() or member.issparse():
                    continue
                key, ext = _split_member(member.name)
                entry = samples.setdefault(key, [None, 0, 0, None])
                if ext in TAR_IMAGES:
                    if entry[0] is not None:
                        raise UserError(f"tar shard {path}: sample {key!r} has two images ({entry[0]}, {member.name})")
                    entry[:3] = member.name, member.offset_data, member.size
                elif ext == TAR_LABEL:
                    raw = tar.extractfile(member).read(MAX_CLS_BYTES)
                    try:
                        entry[3] = raw.decode("utf-8").strip()
                    except UnicodeDecodeError:
                        raise UserError(
                            f"tar shard {path}: {member.name} holds {raw[:40]!r}, not UTF-8 text; write the class "
                            "names in UTF-8 (two names must never become one)"
                        ) from None
                else:
                    skipped[f".{ext.rpartition('.')[2]}" if ext else "(no extension)"] += 1
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UserError(
            f"cannot read tar shard {path}: {' '.join(str(exc).split())[:200]}; shards must be uncompressed tar "
            "files (WebDataset layout: KEY.png + KEY.cls per sample)"
        ) from None
    return {k: v for k, v in samples.items() if v[0] is not None or v[3] is not None}


def _tar_problem(path: Path, samples: dict[str, list]) -> str | None:
    for key, (image, _, _, label) in samples.items():
        if image is None:
            return f"sample {key!r} has a .{TAR_LABEL} but no image member ({key}.png, .jpg, ...)"
        if not label:
            return f"sample {key!r} ({image}) has no class: add a {key}.{TAR_LABEL} member holding it as text"
    return None


def _index_tar(files: list[Path]):
    starts, offsets, sizes, names, texts, group_bytes, skipped = [0], [], [], [], [], [], Counter()
    kinds: dict[str, Path] = {}
    for path in files:
        samples = _scan_tar(path, skipped)
        problem = _tar_problem(path, samples)
        if problem:
            raise UserError(f"tar shard {path}: {problem}")
        if samples:  # a shard without samples has no kind of label
            kinds.setdefault("int" if all(_INT.fullmatch(v[3]) for v in samples.values()) else "str", path)
        if len(kinds) > 1:
            raise UserError(
                f"the .cls labels of {files[0].parent} are of several kinds across its shards (numbers in "
                f"{kinds['int'].name}, names in {kinds['str'].name}); give every shard the same kind of label"
            )
        for image, offset, size, label in samples.values():
            names.append(os.fsencode(image))
            offsets.append(offset)
            sizes.append(size)
            texts.append(label)
        starts.append(len(texts))
        group_bytes.append(sum(sizes[starts[-2] :]))
    kind = next(iter(kinds), "int")  # one kind across the shards (checked above)
    raw = np.asarray([int(t) for t in texts] if kind == "int" else texts, dtype=np.int64 if kind == "int" else str)
    codes, values, _ = _codes([raw], {kind}, files)
    blob, name_offsets = index_cache.join_blob(names)
    ints = {"starts": starts, "labels": codes, "offsets": offsets, "sizes": sizes, "groups": starts,
            "group_shard": range(len(files)), "group_index": [0] * len(files), "group_bytes": group_bytes}  # fmt: skip
    arrays = {k: np.asarray(v, dtype=np.int64) for k, v in ints.items()} | {"names": blob, "name_offsets": name_offsets}
    return arrays, {"values": values, "label_kind": kind, "class_label": None, "skipped_members": dict(skipped)}
