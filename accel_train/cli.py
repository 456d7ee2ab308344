"""Entry-point plumbing shared by every script: one-line errors, exit codes, clean exits."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable, Sequence

from accel_train.cpu_load import mark_start
from accel_train.errors import AccelTrainError
from accel_train.flags import ArgumentParser  # noqa: F401  (the commands' parser, with run_main)
from accel_train.heap import one_command_process


def _world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _rank_prefix() -> str:
    return f"[rank {os.environ.get('RANK', '0')}] " if _world_size() > 1 else ""


ERROR_LINE_LIMIT = 2000  # characters of the one-line error a script prints


def _say(line: str) -> None:
    """``line`` and its newline on stderr in one write: the ranks of a run share the stream, and a line written
    in two pieces (print's text, then its newline) can have another rank's line between them."""
    sys.stderr.flush()
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _error_line(line: str, limit: int = ERROR_LINE_LIMIT) -> str:
    """``line`` on one line of at most ``limit`` characters; the rest is named, and --debug shows it all."""
    line = " ".join(line.splitlines())
    if len(line) <= limit:
        return line
    keep = limit - 90  # room for the suffix
    return f"{line[:keep]} … ({len(line) - keep:,} more characters; rerun with --debug for the full text)"


def _unexpected(exc: Exception, debug: bool) -> int:
    """An exception no code turned into an ``AccelTrainError``: a bug, printed with its traceback (exit 1), unless
    it is a collective that failed because another process of the run is gone (one line, ``PeerLostError``)."""
    from accel_train.errors import peer_lost

    lost = peer_lost(exc, int(os.environ.get("RANK", "0") or 0), _world_size())
    if lost is None:
        _say(f"{_rank_prefix()}error: unexpected failure (traceback below)")
        traceback.print_exc()
        return 1
    from accel_train.runtime import ignore_stop_signals  # torch: only in a multi-process run's failure

    ignore_stop_signals()  # the launcher's SIGTERM for the same lost peer must not end this as -15
    if debug:
        traceback.print_exc()
    _say(_error_line(f"{_rank_prefix()}error: {lost}"))
    return lost.exit_code


ERROR_FILE = "ACCEL_TRAIN_ERROR_FILE"  # set by accel_train.commands.launch for the processes it starts


def _post_to_launcher(line: str) -> None:
    """Hand the one-line error to the launcher wrapper (``commands/launch.py``), which repeats it after torchrun's
    own report, as the last line of the launch."""
    path = os.environ.get(ERROR_FILE)
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError:
        pass  # the launcher's file is gone: its own report is all there is


def run_main(main: Callable[[Sequence[str] | None], int | None], argv: Sequence[str] | None = None) -> None:
    """Run ``main(argv)`` and exit: user errors print one line (exit 2), ``--debug`` shows tracebacks.

    After a multi-process run the process leaves through ``os._exit`` so gloo's
    threads cannot abort the interpreter's teardown (see ``runtime.finish_process``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    one_command_process()  # the collector's policy for a process that runs one command and exits (heap.py)
    mark_start()  # the start-up's window in which other work's cores are counted (cpu_load.py), before torch loads
    try:
        code = main(argv) or 0
    except AccelTrainError as exc:
        if debug:
            traceback.print_exc()
        line = _error_line(f"{_rank_prefix()}error: {exc}")
        _say(line)
        _post_to_launcher(line)
        code = exc.exit_code
    except KeyboardInterrupt:
        _say(f"{_rank_prefix()}interrupted")
        code = 130
    except Exception as exc:
        code = _unexpected(exc, debug)
    from accel_train.runtime import finish_process, launched_world_size  # torch: only after main ran

    if launched_world_size() > 1:
        finish_process(code)
    sys.exit(code)
