"""What indexing a data source found, kept between launches: a resume, a requeue, another rank or ``accel-evaluate``
reads it in milliseconds instead of listing a million files again.

An entry is named by the hash of what identifies the source (its absolute path, what counts as an image, this
format's version) and holds numpy arrays, a ``facts`` dict that later readers may add to (image sizes and modes of
a sample, mean/std), and the modification times of every folder the index was made from. An entry whose folders'
times differ from now, or were too recent when it was written to be trusted (a folder changed within the same
clock tick would look unchanged), is not used. Entries are written atomically (a temporary file, then a rename);
a cache folder that cannot be written only costs the next launch the scan. Arrays are read with
``allow_pickle=False``: nothing in the cache can run code.

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
FORMAT = 1
RACY_S = 2.0  # a folder modified this close to the scan may change again within its timestamp's resolution


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accel_train"


def entry_path(kind: str, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps({**key, "format": FORMAT}, sort_keys=True).encode()).hexdigest()[:32]
    return cache_root() / kind / digest


def folder_times(folders: list[str], root: Path) -> np.ndarray | None:
    """The modification times (ns) of ``folders`` (paths relative to ``root``), None if one is gone."""
    times = np.empty(len(folders), dtype=np.int64)
    for i, rel in enumerate(folders):
        try:
            times[i] = os.stat(root / rel).st_mtime_ns
        except OSError:
            return None
    return times


class Entry:
    """One cache entry: ``arrays`` (the index), ``facts`` (JSON), and where it lives."""

    def __init__(self, path: Path, arrays: dict[str, np.ndarray], facts: dict[str, Any], stored: bool = True):
        self.path, self.arrays, self.facts, self.stored = path, arrays, facts, stored

    def add_facts(self, **facts: Any) -> None:
        """Record more facts (best effort: an entry that was not stored keeps them in memory only)."""
        self.facts.update(facts)
        if self.stored:
            _write_json(self.path.with_suffix(".json"), self.facts)


def load(kind: str, key: dict[str, Any], root: Path) -> Entry | None:
    """The entry for ``key`` if its folders (relative to ``root``) are unchanged since it was written."""
    path = entry_path(kind, key)
    try:
        with np.load(path.with_suffix(".npz"), allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
        facts = json.loads(path.with_suffix(".json").read_text())
    except (OSError, ValueError, KeyError, EOFError):
        return None
    if facts.get("key") != key or "folders" not in arrays or "folder_times" not in arrays:
        return None
    folders = [os.fsdecode(f) for f in _split_blob(arrays["folders"], arrays["folder_offsets"])]
    now = folder_times(folders, root)
    if now is None or not np.array_equal(now, arrays["folder_times"]):
        return None
    return Entry(path, arrays, facts)


def store(kind: str, key: dict[str, Any], root: Path, folders: list[str], arrays: dict[str, np.ndarray]) -> Entry:
    """Write an entry for ``key`` (unless a folder changed too recently to be trusted) and return it."""
    path = entry_path(kind, key)
    times = folder_times(folders, root)
    blob, offsets = join_blob([os.fsencode(f) for f in folders])
    all_arrays = {**arrays, "folders": blob, "folder_offsets": offsets}
    entry = Entry(path, all_arrays, {"key": key}, stored=False)
    if times is None or (len(times) and time.time_ns() - int(times.max()) < RACY_S * 1e9):
        return entry  # kept in memory: the next launch scans again
    all_arrays["folder_times"] = times
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic(path.with_suffix(".npz"), lambda f: np.savez(f, **all_arrays))
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


def _split_blob(blob: np.ndarray, offsets: np.ndarray) -> list[bytes]:
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
