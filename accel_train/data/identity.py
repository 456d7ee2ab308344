"""What a run trains and evaluates on, as a record that two launches can compare: the data's identity.

* an image folder: each part's (``train``; ``test`` where the folder has a split of its own) file list, every file's
  path, size and modification time, and its class names;
* shards: each shard's name, size, modification time, row count, the label names and every row's label;
* ``hf:`` data: each split's fingerprint (``datasets``' hash of what made it), rows, class names, Arrow files and
  every row's label;
* data held in memory (the built-in datasets, tensors given to ``accel_train.train``): a hash of the tensors.

Files and shards add a ``local`` part: each one's inode and change time, with the machine's name, compared only
on that machine (a copy elsewhere differs in them): there a file rewritten or swapped in place with its size and
modification time kept is named too.

:meth:`Identity.record` is small JSON (a digest per part and counts), recorded in config.yaml, in every checkpoint
and in an export's config.json. A folder's whole file list (:meth:`Identity.save_files`) is kept once in the run
folder, so that a resume on changed data can say what changed: N files added, removed, changed, in which classes.
:func:`changes` compares a record with the data as it is now, in words; None when they are the same.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from accel_train.data.base import DataSplits
from accel_train.errors import UserError
from accel_train.fsio import atomic_write

EXAMPLES = 3  # file or shard names given per kind of change


def _hasher():
    try:
        import xxhash  # a dependency of datasets: ~10x faster than sha256 on tensors

        return xxhash.xxh3_128()
    except ImportError:  # pragma: no cover - datasets always brings it
        return hashlib.sha256()


@dataclass
class Part:
    """One split's identity: its digest, a summary (JSON) and, for a folder, its file list."""

    digest: str
    summary: dict[str, Any]
    files: dict[str, np.ndarray] | None = None  # blob, offsets, sizes, mtimes


@dataclass
class Identity:
    kind: str
    parts: dict[str, Part] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        h = hashlib.sha256(self.kind.encode())
        for name in sorted(self.parts):
            h.update(f"\0{name}\0{self.parts[name].digest}".encode())
        return h.hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        parts = {name: {"digest": p.digest, **p.summary} for name, p in self.parts.items()}
        return {"kind": self.kind, "digest": self.digest, "parts": parts}

    def save_files(self, path: Path) -> None:
        """The folder parts' file lists into ``path`` (npz, written atomically); nothing for other kinds."""
        arrays = {f"{name}.{k}": v for name, p in self.parts.items() if p.files for k, v in p.files.items()}
        if not arrays or saved_digest(path) == self.digest:  # a resume on the same data: already there
            return
        arrays["digest"] = np.frombuffer(self.digest.encode(), dtype=np.uint8)

        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:  # a file object: np.savez would add .npz to a name
                np.savez(f, **arrays)

        atomic_write(path, write, "the data's file list")  # synced, renamed; a kill's temporary removed later


def saved_digest(path: Path) -> str | None:
    """The digest of the data whose file lists ``path`` holds (None: none, unreadable)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return data["digest"].tobytes().decode()
    except Exception:  # noqa: BLE001 - absent or damaged: written again
        return None


def load_files(path: Path, digest: str) -> dict[str, dict[str, np.ndarray]] | None:
    """The file lists ``save_files`` wrote for the data of ``digest`` (None: none, another's, unreadable)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            if data["digest"].tobytes().decode() != digest:
                return None
            parts: dict[str, dict[str, np.ndarray]] = {}
            for key in data.files:
                if "." in key:
                    name, _, what = key.partition(".")
                    parts.setdefault(name, {})[what] = data[key]
            return parts
    except Exception:  # noqa: BLE001 - only for the message: without it the summary's counts are compared
        return None


# --------------------------------------------------------------------------- the kinds


def folder_part(prefix: str, index) -> Part:
    """A :class:`~accel_train.data.folder_index.FolderIndex` as a part: its paths (under ``prefix``, relative to
    the dataset's folder), sizes, modification times and class names."""
    h = _hasher()
    h.update(b"\0".join(os.fsencode(c) for c in index.classes) + b"\1" + os.fsencode(prefix))
    for array in (index.offsets, index.blob, index.labels, index.sizes, index.mtimes):
        h.update(np.ascontiguousarray(array).tobytes())
    summary = {"folder": _printable(prefix), "files": len(index), "bytes": int(index.sizes.sum())}
    summary["classes"] = _printable_counts(index.counts())
    summary["local"] = _local(index.inodes, index.ctimes, index.devices)
    files = {"blob": index.blob, "offsets": index.offsets, "sizes": index.sizes, "mtimes": index.mtimes}
    files |= {"inodes": index.inodes, "ctimes": index.ctimes}
    return Part(h.hexdigest()[:16], summary, files)


def _local(*arrays: np.ndarray) -> dict[str, str]:
    """What only this machine can compare: each file's inode and change time (no ``touch``, ``cp -p`` or
    ``rsync -a`` sets it back; a copy on another machine differs in it), with the machine's name."""
    h = _hasher()
    for array in arrays:
        h.update(np.ascontiguousarray(array).tobytes())
    return {"host": socket.gethostname(), "digest": h.hexdigest()[:16]}


def _printable_counts(counts: dict[str, int]) -> dict[str, int]:
    return {_printable(name): n for name, n in counts.items()}


def _printable(name: str) -> str:
    """A name as text JSON and YAML can hold (a folder name that is not UTF-8 keeps its bytes as \\x escapes)."""
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return os.fsencode(name).decode("utf-8", "backslashreplace")


def folder_identity(root: Path, train, test=None) -> Identity:
    """An image folder's identity: ``train`` (the whole folder when it has no split of its own) and ``test``."""
    parts = {}
    if train is not None:
        prefix = "" if train.root == root else os.path.relpath(train.root, root) + "/"
        parts["train"] = folder_part(prefix, train)
    if test is not None:
        parts["test"] = folder_part(os.path.relpath(test.root, root) + "/", test)
    return Identity("imagefolder", parts)


def shards_part(index, folder: Path) -> Part:
    """A :class:`~accel_train.data.shard_index.ShardIndex` as a part: each shard's name (relative to ``folder``),
    size, modification time and rows, and the label values (or ClassLabel names)."""
    shards, local = [], []
    for s, f in enumerate(index.files):
        st = f.stat()
        rows = int(index.starts[s + 1] - index.starts[s])
        shards.append([_printable(os.path.relpath(f, folder)), st.st_size, st.st_mtime_ns, rows])
        local.append((st.st_ino, st.st_ctime_ns, st.st_dev))
    labels = [_printable(str(v)) for v in (index.class_label or index.values)]
    counts = np.bincount(index.labels, minlength=len(index.values)).tolist()
    h = _hasher()  # every row's label, as the values they code
    h.update(repr([str(v) for v in index.values]).encode() + np.ascontiguousarray(index.labels).tobytes())
    summary = {"rows": len(index), "shards": shards, "labels": labels, "label_rows": counts}
    summary |= {"row_labels": h.hexdigest()[:16], "local": _local(np.asarray(local, dtype=np.int64))}
    return Part(
        hashlib.sha256(repr((shards, labels, counts, summary["row_labels"])).encode()).hexdigest()[:16], summary
    )


def tensors_part(dataset) -> Part | None:
    """A split held in memory as tensors (``images``/``labels``), hashed; None for anything else."""
    images, labels = getattr(dataset, "images", None), getattr(dataset, "labels", None)
    import torch

    if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
        return None
    h = _hasher()
    for t in (images, labels):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().reshape(-1).data if t.numel() else b"")
    return Part(h.hexdigest()[:16], {"rows": len(labels)})


def tensor_identity(splits) -> Identity | None:
    parts = {name: tensors_part(getattr(splits, name)) for name in ("train", "test")}
    if any(p is None for p in parts.values()):
        return None
    return Identity("tensors", parts)  # type: ignore[arg-type]


def hf_part(data, class_names: list[str], labels: np.ndarray | None = None) -> Part:
    """A ``datasets.Dataset`` split: its fingerprint, rows, class names, every row's label (``labels``) and the
    Arrow files it reads (name, size, modification time; inode and change time for this machine): ``datasets``'
    fingerprint comes from ``state.json``, which an edit of the files leaves as it was."""
    fingerprint = str(getattr(data, "_fingerprint", None))
    summary = {"rows": len(data), "fingerprint": fingerprint, "classes": [_printable(c) for c in class_names]}
    files, local = [], []
    for entry in getattr(data, "cache_files", None) or []:
        try:
            st = os.stat(entry["filename"])
        except (OSError, KeyError, TypeError):
            continue
        files.append([_printable(os.path.basename(entry["filename"])), st.st_size, st.st_mtime_ns])
        local.append((st.st_ino, st.st_ctime_ns, st.st_dev))
    summary["files"] = files
    if labels is not None:
        h = _hasher()
        h.update(labels.tobytes() if labels.dtype != object else repr(labels.tolist()).encode())
        summary["row_labels"] = h.hexdigest()[:16]
    summary["local"] = _local(np.asarray(local, dtype=np.int64).reshape(-1, 3))
    portable = {k: v for k, v in summary.items() if k != "local"}
    return Part(hashlib.sha256(repr(sorted(portable.items())).encode()).hexdigest()[:16], summary)


def of_splits(splits) -> Identity | None:
    """The identity a builder recorded in ``splits.extra["identity"]``, else that of in-memory tensors."""
    found = splits.extra.get("identity")
    return found if isinstance(found, Identity) else tensor_identity(splits)


# --------------------------------------------------------------------------- what changed


def changes(
    old: dict[str, Any], new: Identity, old_files: dict | None = None, parts: tuple[str, ...] = ()
) -> str | None:  # noqa: E501
    """What differs between the recorded ``old`` (:meth:`Identity.record`) and ``new``, in words (None: the same).

    ``old_files``: the folder's file lists as recorded (:func:`load_files`); ``parts``: compare only these."""
    if not isinstance(old, dict) or not isinstance(old.get("parts"), dict):
        return None
    if old.get("kind") != new.kind:
        return f"it was {old.get('kind')} data, it is {new.kind} data now"
    said = []
    names = parts or tuple(sorted(set(old["parts"]) | set(new.parts)))
    for name in names:
        was, now = old["parts"].get(name), new.parts.get(name)
        if was is None or now is None:
            if was is not None or now is not None:
                said.append(f"the {name} split {'is new' if was is None else 'is gone'}")
            continue
        if was.get("digest") == now.digest:
            said.append(_local_change(name, was, now, (old_files or {}).get(name)))
            continue
        if new.kind == "imagefolder":
            said.append(_folder_change(name, was, now, (old_files or {}).get(name)))
        elif new.kind == "shards":
            said.append(_shards_change(name, was, now))
        elif new.kind == "hf" or "fingerprint" in now.summary:  # a datasets.Dataset, on any task
            said.append(_hf_change(name, was, now))
        else:
            said.append(f"{name}: {was.get('rows')} rows then, {now.summary.get('rows')} now, other values")
    return "; ".join(filter(None, said)) or None


def _local_change(name: str, was: dict, now: Part, files: dict | None) -> str | None:
    """On the machine that recorded them: the files whose inode or change time differ (rewritten in place, or
    swapped, with their sizes and modification times kept), in words; None when they agree or cannot be compared."""
    then, here = was.get("local"), now.summary.get("local")
    if not isinstance(then, dict) or not here or then.get("host") != here["host"]:
        return None
    if then.get("digest") == here["digest"]:
        return None
    what = "rewritten or replaced in place, sizes and modification times kept (their inode or change time differs)"
    if files is not None and now.files is not None and "inodes" in files:
        old = _by_path(files, now.summary.get("folder", ""), ("inodes", "ctimes"))
        new = _by_path(now.files, now.summary.get("folder", ""), ("inodes", "ctimes"))
        moved = sorted(p for p in set(old) & set(new) if old[p] != new[p])
        if moved:
            return f"{name}: {len(moved)} file(s) {what}{_examples(moved)}"
    return f"{name}: files {what}"


def _examples(names: list[str]) -> str:
    shown = ", ".join(names[:EXAMPLES])
    return f" ({shown}{', ...' if len(names) > EXAMPLES else ''})" if names else ""


def _folder_change(name: str, was: dict, now: Part, files: dict | None) -> str:
    if files is None or now.files is None:  # no file list recorded: the counts
        then, classes = was.get("classes", {}), now.summary["classes"]
        moved = [c for c in sorted(set(then) | set(classes)) if then.get(c) != classes.get(c)]
        per = ", ".join(f"{c} {then.get(c, 0)} -> {classes.get(c, 0)}" for c in moved[:5])
        what = f"{was.get('files')} files then, {now.summary['files']} now" + (f" ({per})" if per else "")
        return f"{name}: {what}, or files changed in place"
    old = _by_path(files, now.summary["folder"])
    new = _by_path(now.files, now.summary["folder"])
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    both = set(new) & set(old)
    resized = sorted(p for p in both if new[p][0] != old[p][0])
    touched = sorted(p for p in both if new[p][0] == old[p][0] and new[p][1] != old[p][1])
    said = [f"{len(added)} file(s) added{_examples(added)}"] if added else []
    said += [f"{len(removed)} removed{_examples(removed)}"] if removed else []
    said += [f"{len(resized)} changed{_examples(resized)}"] if resized else []
    if touched:
        said.append(f"{len(touched)} with another modification time, same size{_examples(touched)}")
    classes = _class_changes(was.get("classes", {}), now.summary["classes"])
    return f"{name}: {', '.join(said) or 'the class names differ'}{classes}"


def _class_changes(then: dict, now: dict) -> str:
    added, gone = sorted(set(now) - set(then)), sorted(set(then) - set(now))
    said = [f"new class(es) {', '.join(added[:5])}"] if added else []
    said += [f"class(es) gone: {', '.join(gone[:5])}"] if gone else []
    return f"; {', '.join(said)}" if said else ""


def _by_path(files: dict[str, np.ndarray], prefix: str, fields=("sizes", "mtimes")) -> dict[str, tuple[int, int]]:
    """Each file's ``fields`` (size and mtime) by its path (printable, under ``prefix``)."""
    from accel_train.data.index_cache import split_blob

    paths = split_blob(files["blob"], files["offsets"])
    columns = [files[f].tolist() for f in fields]
    return {prefix + _printable(os.fsdecode(p)): tuple(v) for p, *v in zip(paths, *columns, strict=True)}


def _shards_change(name: str, was: dict, now: Part) -> str:
    old = {s[0]: s[1:] for s in was.get("shards", [])}
    new = {s[0]: s[1:] for s in now.summary["shards"]}
    added, removed = sorted(set(new) - set(old)), sorted(set(old) - set(new))
    changed = sorted(n for n in set(new) & set(old) if new[n] != old[n])
    said = [f"shard(s) added{_examples(added)}"] if added else []
    said += [f"shard(s) removed{_examples(removed)}"] if removed else []
    said += [f"shard(s) changed{_examples(changed)}"] if changed else []
    if was.get("labels") != now.summary["labels"]:
        said.append(f"labels {was.get('labels')} then, {now.summary['labels']} now"[:200])
    elif was.get("label_rows") != now.summary["label_rows"]:
        said.append("other rows per label")
    elif was.get("row_labels") != now.summary.get("row_labels"):
        said.append("rows with other labels")
    rows = f" ({was.get('rows')} rows then, {now.summary['rows']} now)"
    return f"{name}: {', '.join(said) or 'other rows'}{rows}"


def _hf_change(name: str, was: dict, now: Part) -> str:
    said = Counter()
    for key in ("rows", "fingerprint", "classes", "files", "row_labels"):
        if was.get(key) != now.summary.get(key):
            said[key] += 1
    what = ", ".join(f"{k} {was.get(k)} then, {now.summary.get(k)} now" for k in said if k in ("rows", "fingerprint"))
    for key, words in (
        ("classes", "other class names"),
        ("files", "its Arrow files changed"),
        ("row_labels", "rows with other labels"),
    ):
        if key in said:
            what = ", ".join(filter(None, [what, words]))
    return f"{name}: {what or 'other data'}"


def check_same_data(acc, splits: DataSplits) -> None:
    """Every process must index the same files (``extra["index_digest"]``) and read the same shape from them
    (channels, size, classes, mean/std): a folder that differs between two machines, or a cache that did, would
    otherwise train each rank on other data, or fail inside DDP with a parameter-shape traceback."""
    if acc.num_processes == 1:
        return
    from accelerate.utils import gather_object

    info = splits.info
    shape = (info.num_classes, info.in_channels, info.image_size, list(info.class_names), info.mean, info.std)
    mine = (splits.extra.get("index_digest"), repr(shape))
    seen = gather_object([mine])
    others = [rank for rank, d in enumerate(seen) if d != seen[0]]
    if not others:
        return
    if seen[others[0]][0] != seen[0][0]:
        what = splits.extra.get("data_kind", "files")  # accel_train.train's own datasets: "samples"
        fix = "build the same datasets on every process (a split seeded the same)" if what == "samples" else (
            "give every machine the same copy of the data")  # fmt: skip
        raise UserError(
            f"{info.name}: process(es) {', '.join(map(str, others))} see other {what} than process 0 "
            f"(digest {seen[others[0]][0]} vs {seen[0][0]}); {fix}"
        )
    raise UserError(
        f"{info.name}: process(es) {', '.join(map(str, others))} read other images than process 0 from the same "
        f"file list ((classes, channels, size, names, mean, std) {seen[others[0]][1][:120]} vs {seen[0][1][:120]}): "
        "a file differs in content between the machines; give every machine the same copy of the data"
    )
