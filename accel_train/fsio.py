"""Writing files that a run keeps: atomic replaces, and one clear line when the disk says no.

Every write a run makes (checkpoints, exports, metrics, summaries) goes through
:func:`writing`, which turns "no space left", "quota exceeded", "read-only file
system" and "permission denied" into a :class:`UserError` naming the path, the
free space and what is needed. torch and safetensors report a full disk as a
``RuntimeError``/``SafetensorError`` whose text carries the errno, so those are
recognised by their message.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from accel_train.errors import UserError
from accel_train.finite_json import finite

#: Held around short writes that must not be cut in half (a metrics line, a rename);
#: the orphan watch takes it before leaving the process (see ``accel_train.process``).
WRITE_GUARD = threading.RLock()

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_NO_ACCESS = (errno.EACCES, errno.EPERM, errno.EROFS)
# How torch's stream writer and safetensors phrase the same failures.
_FULL_TEXT = ("no space left", "storagefull", "code: 28", "file write failed", "quota exceeded")
_ACCESS_TEXT = ("permission denied", "read-only file system", "code: 13", "code: 30")
# torch's zip writer (torch.save: optimizer, RNG, scaler) loses the errno of a failed write and says only this,
# seen on a real full tmpfs: "[enforce fail at inline_container.cc:…] unexpected pos N vs M", "basic_ios::clear:
# iostream error", "PytorchStreamWriter failed writing file". Whether it means a full disk is read off the disk.
_WRITER_TEXT = ("unexpected pos", "iostream error", "pytorchstreamwriter failed", "inline_container")
_NEARLY_FULL = 1 << 20  # bytes: a disk with less free than this (or than the write needs) is full


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free space on the filesystem holding ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def tree_size(path: str | os.PathLike) -> int:
    """Bytes held by the regular files under ``path`` (0 if it does not exist)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0


def disk_problem(exc: BaseException) -> str | None:
    """'full' or 'access' when ``exc`` is the disk refusing a write, else None."""
    code = getattr(exc, "errno", None)
    if code in _DISK_FULL:
        return "full"
    if code in _NO_ACCESS:
        return "access"
    if isinstance(exc, OSError):
        return None
    text = str(exc).lower()
    if any(t in text for t in _FULL_TEXT):
        return "full"
    if any(t in text for t in _ACCESS_TEXT):
        return "access"
    return None


def disk_error(exc: BaseException, path: str | os.PathLike, what: str, needed: int | None = None) -> UserError:
    """The one line for a refused write of ``what`` at ``path``."""
    kind = disk_problem(exc)
    if kind == "access":
        return UserError(
            f"cannot write {what} {path}: {' '.join(str(exc).split())[:160]}; make the folder writable or choose "
            "another --output-dir"
        )
    free = free_bytes(path)
    have = f"{human_bytes(free)} free" if free is not None else "free space unknown"
    need = f", about {human_bytes(needed)} needed" if needed else ""
    return UserError(
        f"cannot write {what} {path}: no space left on the device ({have}{need}); free some space or choose an "
        "--output-dir on a disk with room"
    )


def _writer_failure(exc: BaseException, path: str | os.PathLike, needed: int | None) -> str | None:
    """'full' or 'io' when ``exc`` is torch's stream writer failing (its text carries no errno), else None."""
    if isinstance(exc, OSError) or not any(t in str(exc).lower() for t in _WRITER_TEXT):
        return None
    free = free_bytes(path)
    return "full" if free is not None and free < max(_NEARLY_FULL, needed or 0) else "io"


@contextmanager
def writing(path: str | os.PathLike, what: str, needed: int | None = None) -> Iterator[None]:
    """Turn the disk's refusals inside the block into one :class:`UserError` line."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        writer = _writer_failure(exc, path, needed)
        if disk_problem(exc) is not None or writer == "full":
            raise disk_error(exc, path, what, needed) from None
        if isinstance(exc, OSError) or writer == "io":  # any other refusal of the filesystem: still one line
            raise UserError(f"cannot write {what} {path}: {' '.join(str(exc).split())[:160]}") from None
        raise


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where Linux shows it (``/proc/self/status``).

    Elsewhere it is set and restored under a lock (``os.umask`` can only be read by setting it).
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any], what: str = "file") -> None:
    """``write(tmp_path)`` next to ``path``, synced, then renamed into place; nothing half-written is ever visible,
    even after a machine's crash.

    The file gets the mode of a plain ``open(path, "w")``: 0666 less the umask (``mkstemp`` makes 0600).
    """
    path = Path(path)
    with writing(path, what):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            write(tmp)
            _sync(tmp)  # on disk before its name is: a crash never leaves an empty file under the final name
            os.chmod(tmp, 0o666 & ~current_umask())
            with WRITE_GUARD:
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_temporaries(folder: str | os.PathLike, names: Collection[str] | None = None) -> list[Path]:
    """Remove the hidden temporaries writers killed half-way left in ``folder``: ``.NAME.XXXX.tmp``, as
    :func:`atomic_write` (and the plots' writer, with its PID) names them, for NAME in ``names`` (None: any).
    Only for a folder no writer is using (the run's lock held). Returns what was removed."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    shape = re.compile(r"\.(.+)\.[a-z0-9_]+\.tmp")
    removed = []
    for entry in entries:
        match = shape.fullmatch(entry.name)
        if match and (names is None or match.group(1) in names) and entry.is_file(follow_symlinks=False):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    return removed


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "file") -> None:
    """``text`` into ``path``, synced, then renamed into place: a kill or a full disk leaves the old file whole."""

    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)

    atomic_write(path, dump, what)


def write_json_atomic(path: str | os.PathLike, data: Any, what: str = "file") -> None:
    data = finite(data, str(path))  # never a bare NaN in a JSON file
    write_text_atomic(path, json.dumps(data, indent=2, allow_nan=False), what)


def append_line(path: str | os.PathLike, line: str, what: str = "file") -> None:
    """Append one text line whole (the orphan watch never cuts it in half), only ever to a regular file: the
    open never blocks (a FIFO would block it forever), and anything else is one line."""
    with writing(path, what), WRITE_GUARD, _open_append(path, what) as fh:
        fh.write(line + "\n")


def drop_partial_line(path: str | os.PathLike, what: str = "file") -> int:
    """Cut a last line that has no newline (a writer killed mid-line: never a whole record) off a line-per-record
    file, so that the next appended line starts a line of its own; returns the bytes removed (0: none, or no
    such regular file)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return 0
    with writing(path, what), os.fdopen(fd, "r+b") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return 0
        size = fh.seek(0, os.SEEK_END)
        start = max(0, size - (1 << 20))  # a record is far shorter than 1 MiB
        fh.seek(start)
        tail = fh.read()
        if not tail or tail.endswith(b"\n"):
            return 0
        cut = tail.rfind(b"\n")
        keep = start + cut + 1 if cut >= 0 else (0 if start == 0 else size)
        fh.truncate(keep)
        return size - keep


def _open_append(path: str | os.PathLike, what: str) -> IO[str]:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"cannot write {what} {path}: it is not a regular file; remove it")
    return os.fdopen(fd, "a")


def real_path(path: str | os.PathLike, flag: str) -> Path:
    """Where ``path`` really leads (links followed, ``~`` expanded); a broken or looping link on the way is refused.

    A missing path resolves as far as its existing part goes (its file is created there)."""
    absolute = Path(path).expanduser().absolute()
    for part in (absolute, *absolute.parents):
        if not part.is_symlink():
            continue
        try:
            os.stat(part)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                why = "is a symbolic link loop (it leads back to itself)"
            else:
                why = f"is a broken symbolic link (to {os.readlink(part)}, which does not exist)"
            where = "" if part == absolute else f" (its folder {part})"
            raise UserError(f"{flag} {path}{where} {why}; remove or fix the link, or choose another path") from None
    try:
        return absolute.resolve()
    except (OSError, RuntimeError) as exc:  # Python < 3.13: RuntimeError for a loop the walk above did not see
        raise UserError(
            f"{flag} {path} cannot be resolved ({exc}); fix the links on it or choose another path"
        ) from None
