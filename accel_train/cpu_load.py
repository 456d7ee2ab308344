"""How many of this process's cores other work keeps busy: what ``runtime.configure_threads`` chooses threads by.

On a 2-core machine with another busy process, a run on 2 threads trained 10-30x slower than on 1 (issue 50;
``python -m benchmarks busy-threads`` measures it): each of torch's parallel regions waits for its slowest thread,
and the thread that shares a core with the other process gets that core a time slice at a time, while the other
spins. So a run counts the cores other processes use, and takes the free ones.

The measurement is the kernel's own CPU accounting (``/proc/stat``, one line per core, in clock ticks) over a
window, for the cores this process may run on, minus this process's own CPU time in that window. The window is
the process's start-up (:func:`mark_start`, called by ``cli.run_main`` before torch is imported: seconds of
imports, for free); where there is none (the Python API) or it is stale, a short probe (:data:`PROBE_S`).
``ACCEL_TRAIN_BUSY_CORES`` replaces the measurement (a run then chooses as if that many cores were busy: tests,
or to reproduce another machine's choice). Without ``/proc/stat`` (macOS) nothing is measured.
"""

from __future__ import annotations

import math
import os
import time
from typing import NamedTuple

from accel_train.errors import UserError

BUSY_ENV = "ACCEL_TRAIN_BUSY_CORES"
PROBE_S = 0.2  # a probe's window when start-up gave none (10 ms clock ticks: 20 a core)
MIN_WINDOW_S = 0.2  # a start-up window shorter than this is a probe's too few ticks
MAX_WINDOW_S = 60.0  # older than this (a second run in one Python session), it says little about now
PROC_STAT = "/proc/stat"


class CpuSample(NamedTuple):
    """The kernel's tick counters of some cores, and this process's CPU seconds, at one moment."""

    cpus: frozenset[int]
    busy_ticks: int  # ticks the cores ran anything (user, nice, system, irq, softirq, steal)
    total_ticks: int  # every tick of the cores, idle and iowait included
    own_s: float  # this process's user + system seconds, all its threads
    at: float  # time.monotonic()


def parse_proc_stat(text: str, cpus: frozenset[int]) -> tuple[int, int]:
    """``(busy ticks, total ticks)`` summed over the ``cpuN`` lines of ``/proc/stat`` whose N is in ``cpus``."""
    busy = total = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        ticks = [int(v) for v in rest.split()[:8]]  # user nice system idle iowait irq softirq steal (guest: in user)
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def sample(cpus: frozenset[int] | None = None) -> CpuSample | None:
    """The counters now (``cpus``: default, those this process may use); None where ``/proc/stat`` is unreadable."""
    cpus = cpus if cpus is not None else allowed_cpus()
    try:
        with open(PROC_STAT) as fh:
            text = fh.read()
    except OSError:
        return None
    times = os.times()
    return CpuSample(cpus, *parse_proc_stat(text, cpus), times.user + times.system, time.monotonic())


def allowed_cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return frozenset(range(os.cpu_count() or 1))


def others_busy(before: CpuSample, after: CpuSample, ticks_per_s: float | None = None) -> float | None:
    """Cores kept busy by other work between two samples: the cores' busy ticks less this process's own, over
    the window's ticks a core (None when the window holds no tick)."""
    ticks_per_s = ticks_per_s or os.sysconf("SC_CLK_TCK")
    per_core = (after.total_ticks - before.total_ticks) / max(1, len(after.cpus))
    if per_core <= 0:
        return None
    own = (after.own_s - before.own_s) * ticks_per_s
    return max(0.0, (after.busy_ticks - before.busy_ticks - own) / per_core)


_START: CpuSample | None = None  # mark_start's sample: the start-up of a process that runs one command


def mark_start() -> None:
    """Begin the window that :func:`busy_cores` reads: a command's process calls it before its imports."""
    global _START
    _START = sample()


def busy_cores(probe_s: float = PROBE_S) -> float | None:
    """Cores of this process's set kept busy by other work: ``ACCEL_TRAIN_BUSY_CORES`` if set, else measured since
    :func:`mark_start` (when that window is usable), else over a probe of ``probe_s``; None if unmeasurable."""
    given = os.environ.get(BUSY_ENV)
    if given is not None:
        try:
            value = float(given)
        except ValueError:
            value = -1.0
        if not (value >= 0.0 and math.isfinite(value)):
            raise UserError(f"{BUSY_ENV}={given!r}: give the number of busy cores (0 or more), or unset it")
        return value
    now = sample()
    start = _START
    if now is None:
        return None
    if start is None or start.cpus != now.cpus or not MIN_WINDOW_S <= now.at - start.at <= MAX_WINDOW_S:
        start = now
        time.sleep(probe_s)
        now = sample(start.cpus)
    return others_busy(start, now) if now is not None else None


class ThreadChoice(NamedTuple):
    """How many torch threads a process runs, and why, in the start line's words."""

    threads: int
    why: str


def choose_threads(requested: int | None, cores: int, local_processes: int, busy: float | None) -> ThreadChoice:
    """The rule, on plain values: ``--threads`` wins (capped at the cores: more only oversubscribe them); several
    processes on one machine split its cores; one process takes the cores other work leaves free (``busy``: cores
    busy with it, None when unmeasured), a core counting as free when at least half of it is, and at least one."""
    if requested:
        capped = f", capped at the {cores} core(s) this process may use" if requested > cores else ""
        return ThreadChoice(min(requested, cores), f"--threads {requested}{capped}")
    if local_processes > 1:
        return ThreadChoice(max(1, cores // local_processes), f"{cores} cores / {local_processes} local processes")
    if busy is None:
        return ThreadChoice(cores, f"{cores} core(s); load not measured")
    threads = max(1, min(cores, int(cores - busy + 0.5)))
    if threads < cores:
        return ThreadChoice(threads, f"{busy:.1f} of {cores} cores busy with other work at start; --threads N chooses")
    return ThreadChoice(cores, f"{cores} core(s) free" + (f", other work {busy:.1f}" if busy >= 0.1 else ""))
