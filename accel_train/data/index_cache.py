"""What indexing a data source found, kept between launches: a resume, a requeue, another rank or ``accel-evaluate``
reads it in milliseconds instead of reading a sample of images (or passing over every shard) again.

A cache may only save time, never change an answer. An entry is named by the hash of everything its content was
computed from, and nothing else decides whether it is used:

* an image folder's facts (image sizes and modes, mean/std) are keyed by the folder's file list as it is at this
  launch, listed again every time: each file's path, size, modification and change time (``st_ctime``, which no
  ``touch``, ``rsync -a`` or ``cp -p`` can set back). An image overwritten in place, images added under a folder
  whose time was restored, a renamed folder: each is another key;
* a set of shards' index (rows, row groups, labels) is keyed by each shard's absolute path, size, modification and
  change time and inode, and the columns asked for.

An entry holds numpy arrays and a ``facts`` dict that later readers may add to. Content whose files changed within
:data:`RACY_S` of now is not stored (a file rewritten within its timestamp's resolution would look unchanged). An
entry that cannot be read (cut short, not what this code writes) is rebuilt, with one line naming it
(:func:`take_notes`); entries are written atomically (a temporary file, then a rename); a cache folder that cannot
be written only costs the next launch the work. Arrays are read with ``allow_pickle=False``: nothing in the cache
can run code.

The folder: ``$ACCEL_TRAIN_CACHE``, else ``$XDG_CACHE_HOME/accel_train``, else ``~/.cache/accel_train``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CACHE_ENV = "ACCEL_TRAIN_CACHE"
FORMAT = 2
RACY_S = 2.0  # content changed this close to now may change again within its timestamp's resolution

_NOTES: list[str] = []


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accel_train"


def entry_path(kind: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps({**key, "format": FORMAT}, sort_keys=True).encode()).hexdigest()[:32]
    return cache_root() / kind / digest


def take_notes() -> list[str]:
    """The lines about cache entries that could not be read since the last call (each one rebuilt)."""
    notes = list(_NOTES)
    _NOTES.clear()
    return notes


def settled(newest_ns: int) -> bool:
    """Whether content whose newest change is at ``newest_ns`` (epoch ns) is old enough to be cached."""
    return time.time_ns() - int(newest_ns) >= RACY_S * 1e9


class Entry:
    """One cache entry: ``arrays`` (the index), ``facts`` (JSON), and where it lives."""

    def __init__(self, path: Path, arrays: dict[str, np.ndarray], facts: dict[str, Any], stored: bool = True):
        self.path, self.arrays, self.facts, self.stored = path, arrays, facts, stored

    def add_facts(self, **facts: Any) -> None:
        """Record more facts (best effort: an entry that was not stored keeps them in memory only)."""
        self.facts.update(facts)
        if self.stored:
            _write_json(self.path.with_suffix(".json"), self.facts)


def _damaged(path: Path, why: str) -> None:
    _NOTES.append(f"the cache file {path} could not be read ({why}); it is made again (no need to delete it)")
    for suffix in (".npz", ".json"):
        path.with_suffix(suffix).unlink(missing_ok=True)


def load(kind: str, key: dict[str, Any], with_arrays: bool = True) -> Entry | None:
    """The entry for ``key``, or None (never written, or damaged: then one note, and the files are removed)."""
    path = entry_path(kind, key)
    npz, meta = path.with_suffix(".npz"), path.with_suffix(".json")
    if not meta.exists() or (with_arrays and not npz.exists()):
        return None
    reading = meta
    try:
        facts = json.loads(meta.read_text())
        if not isinstance(facts, dict) or facts.get("key") != json.loads(json.dumps(key)):
            raise ValueError("not an entry of this data")
        arrays: dict[str, np.ndarray] = {}
        if with_arrays:
            reading = npz
            with np.load(npz, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:  # removed meanwhile by another launch that found it damaged
        return None
    except Exception as exc:  # noqa: BLE001 - any unreadable entry (a cut zip, a JSON list, ...) is rebuilt
        _damaged(reading, " ".join(f"{type(exc).__name__}: {exc}".split())[:120])
        return None
    return Entry(path, arrays, facts)


def store(kind: str, key: dict[str, Any], arrays: dict[str, np.ndarray], trusted: bool = True,
          facts: dict[str, Any] | None = None) -> Entry:  # fmt: skip
    """Write an entry for ``key`` (unless its content is not ``trusted`` yet: changed too recently) and return it."""
    path = entry_path(kind, key)
    entry = Entry(path, dict(arrays), {**(facts or {}), "key": key}, stored=False)
    if not trusted:
        return entry  # kept in memory: the next launch does the work again
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if arrays:
            _atomic(path.with_suffix(".npz"), lambda f: np.savez(f, **arrays))
        _atomic(path.with_suffix(".json"), lambda f: f.write(json.dumps(entry.facts, sort_keys=True).encode()))
        entry.stored = True
    except OSError:
        pass
    return entry


def join_blob(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Byte strings back to back (uint8) and their offsets (int64, one more than items)."""
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    if items:
        np.cumsum([len(b) for b in items], out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offsets


def split_blob(blob: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    raw = blob.tobytes()
    return [raw[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]


def _write_json(path: Path, data: dict[str, Any]) -> None:
    try:
        _atomic(path, lambda f: f.write(json.dumps(data, sort_keys=True).encode()))
    except OSError:
        pass


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
