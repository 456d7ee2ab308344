"""Checks shared by test files in tests/unit/ and tests/integration/: one-line errors, watched trees unchanged.

``snapshot`` (a tree's files, modes and contents), ``assert_one_line_error`` / ``run_bad`` (a command that fails
with exactly one ``error:`` line and exit code 2, touching nothing), ``raises_user_error`` (the same in process);
``run_folder_snapshot`` and ``one_error`` for run folders (their lock file left out); ``run_cli`` (a command's
``main`` through ``run_main`` in this process: exit code, stdout, stderr).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest
from conftest import run_here, run_script

from accel_train.cli import run_main
from accel_train.errors import UserError
from accel_train.run_lock import LOCK


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every path under ``roots`` (roots included) -> (kind, size, mtime_ns, sha256); absent roots -> missing."""
    state: dict[str, tuple] = {}
    for root in map(Path, roots):
        if not os.path.lexists(root):
            state[str(root)] = ("missing",)
            continue
        for path in [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]:
            st = path.lstat()
            if path.is_dir():
                state[str(path)] = ("dir", st.st_mtime_ns)  # an entry created or removed inside changes it
            else:
                state[str(path)] = ("file", st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return state


def assert_one_line_error(proc, *needles: str, code: int = 2) -> str:
    """Exit ``code``; stderr is one ``error: ...`` line containing every needle; no traceback anywhere."""
    out = f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}"
    assert proc.returncode == code, out
    assert "Traceback" not in proc.stderr + proc.stdout, out
    assert proc.stderr.count("\n") == 1 and proc.stderr.endswith("\n"), f"stderr is not exactly one line\n{out}"
    line = proc.stderr.rstrip("\n")
    assert line.startswith("error: ") and len(line) > len("error: ") + 10, out
    for needle in needles:
        assert needle in line, f"{needle!r} missing from: {line}"
    return line


def run_bad(
    script: str, args: list[str], watch: list[Path], needles: list[str], code: int = 2, launch: bool = False
) -> str:
    """Run ``scripts/<script> args`` expecting a one-line error; the ``watch`` trees must not change.

    In this process (``run_here``) unless ``launch``: a real process also shows what its imports print, so each
    script keeps launched cases, including ones that fail after torch is imported.
    """
    before = snapshot(*watch)
    proc = run_script(script, *args, timeout=120) if launch else run_here(script, *args)
    line = assert_one_line_error(proc, *needles, code=code)
    assert snapshot(*watch) == before, f"files changed or appeared after: {line}"
    return line


def raises_user_error(fn, *needles: str) -> str:
    with pytest.raises(UserError) as info:
        fn()
    message = str(info.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, f"{needle!r} missing from: {message}"
    return message


def run_folder_snapshot(folder: Path) -> dict[str, str]:
    """Path -> content hash of every file below ``folder`` (the lock file's content is bookkeeping)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != LOCK
    }


def one_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def run_cli(capsys, main, argv: list[str]) -> tuple[int, str, str]:
    """``run_main(main, argv)`` in this process, as the scripts run it: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        run_main(main, argv)
    out, err = capsys.readouterr()
    return info.value.code, out, err


def free_port() -> int:
    """A TCP port nothing listens on, for a process that binds it seconds later: drawn (from the OS's randomness:
    two xdist workers must not draw alike) below the ephemeral range, which ``bind(0)`` and every outgoing
    connection draw from, so no other socket takes it in between (``bind(0)``'s port could be taken so)."""
    import random
    import socket

    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()
    for port in (draw.randrange(20000, max(low, 20001)) for _ in range(100)):
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


def running(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie has exited (nobody reaped it yet: a container's PID 1 may never)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
