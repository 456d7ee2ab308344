"""cpu_load.py and runtime.configure_threads: the cores other work keeps busy (fake /proc/stat, fake affinity, fake
load), and the threads a run takes from them (issue 50: 2 threads beside a busy process trained 10-30x slower)."""

from __future__ import annotations

import os

import pytest
import torch

from accel_train import cpu_load
from accel_train.cpu_load import CpuSample, busy_cores, choose_threads, others_busy, parse_proc_stat
from accel_train.errors import UserError

PROC_STAT = """cpu  900 0 300 1800 0 0 0 0 0 0
cpu0 400 0 100 480 20 0 0 0 0 0
cpu1 500 0 200 290 10 0 0 0 0 0
cpu2 7 7 7 7 7 7 7 7 0 0
intr 12345 0 0
ctxt 999
"""


def test_proc_stat_counts_the_allowed_cores_with_idle_and_iowait_as_not_busy():
    assert parse_proc_stat(PROC_STAT, frozenset({0, 1})) == (400 + 100 + 500 + 200, 1000 + 1000)
    assert parse_proc_stat(PROC_STAT, frozenset({2})) == (42, 56)  # nice, irq, softirq and steal are busy
    assert parse_proc_stat(PROC_STAT, frozenset({5})) == (0, 0)


def _sample(busy: int, total: int, own_s: float, at: float = 0.0, cpus=frozenset({0, 1})) -> CpuSample:
    return CpuSample(cpus, busy, total, own_s, at)


def test_others_busy_leaves_out_this_process_own_cpu_time():
    # 2 cores, 1 s at 100 ticks/s: 150 busy ticks, 0.5 s of them this process's: the rest is one core of others
    assert others_busy(_sample(0, 0, 0.0), _sample(150, 200, 0.5), ticks_per_s=100) == pytest.approx(1.0)
    assert others_busy(_sample(0, 0, 0.0), _sample(40, 200, 0.5), ticks_per_s=100) == 0.0  # tick rounding
    assert others_busy(_sample(5, 200, 0.0), _sample(5, 200, 0.0), ticks_per_s=100) is None  # no tick passed


@pytest.mark.parametrize(
    "requested,cores,local,busy,threads,why",
    [
        (None, 2, 1, 0.0, 2, "2 core(s) free"),
        (None, 2, 1, 0.3, 2, "2 core(s) free, other work 0.3"),
        (None, 2, 1, 0.6, 1, "0.6 of 2 cores busy with other work at start; --threads N chooses"),
        (None, 2, 1, 1.0, 1, "1.0 of 2 cores busy"),  # the laptop: one busy process beside the run
        (None, 2, 1, 3.5, 1, "3.5 of 2 cores busy"),  # at least one
        (None, 16, 1, 4.2, 12, "4.2 of 16 cores busy"),
        (None, 2, 1, None, 2, "2 core(s); load not measured"),  # macOS: as before
        (None, 4, 2, 3.0, 2, "4 cores / 2 local processes"),  # ranks split the cores, load or not
        (1, 2, 1, 0.0, 1, "--threads 1"),  # an explicit --threads always wins
        (2, 2, 1, 2.0, 2, "--threads 2"),
        (8, 2, 1, 0.0, 2, "--threads 8, capped at the 2 core(s)"),
    ],
)
def test_choose_threads(requested, cores, local, busy, threads, why):
    choice = choose_threads(requested, cores, local, busy)
    assert choice.threads == threads and choice.why.startswith(why), choice


@pytest.fixture
def two_cores(monkeypatch):
    """A process allowed on 2 cores, one local process, torch's thread count restored after."""
    monkeypatch.setattr(cpu_load.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _never() -> float:
    raise AssertionError("the load was measured although the choice did not need it")


def test_configure_threads_takes_one_thread_beside_a_busy_core(two_cores):
    from accel_train.runtime import configure_threads

    assert configure_threads(None, busy=lambda: 1.0) == (1, "1.0 of 2 cores busy with other work at start; "
                                                         "--threads N chooses")  # fmt: skip
    assert torch.get_num_threads() == 1
    assert configure_threads(None, busy=lambda: 0.1).threads == 2 == torch.get_num_threads()


def test_configure_threads_measures_nothing_for_an_explicit_count_or_several_processes(two_cores, monkeypatch):
    from accel_train.runtime import configure_threads

    assert configure_threads(2, busy=_never) == (2, "--threads 2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert configure_threads(None, busy=_never) == (1, "2 cores / 2 local processes")


def test_the_busy_cores_variable_replaces_the_measurement(monkeypatch):
    monkeypatch.setattr(cpu_load, "sample", lambda cpus=None: pytest.fail("measured despite the variable"))
    monkeypatch.setenv(cpu_load.BUSY_ENV, "1.5")
    assert busy_cores() == 1.5
    for bad in ("x", "-1", "nan", "inf", "1e400"):
        monkeypatch.setenv(cpu_load.BUSY_ENV, bad)
        with pytest.raises(UserError, match=f"{cpu_load.BUSY_ENV}="):
            busy_cores()


@pytest.fixture
def fake_clock(monkeypatch):
    """``sample`` returns a core of other work for every second of a fake clock; ``time.sleep`` advances it."""
    clock = {"now": 100.0, "slept": []}

    def fake_sample(cpus=None):
        t = clock["now"]
        return _sample(int(100 * t), int(200 * t), 0.0, at=t)  # 2 cores at 100 ticks/s, one busy

    def fake_sleep(seconds):
        clock["slept"].append(seconds)
        clock["now"] += seconds

    monkeypatch.delenv(cpu_load.BUSY_ENV, raising=False)
    monkeypatch.setattr(cpu_load, "sample", fake_sample)
    monkeypatch.setattr(cpu_load.time, "sleep", fake_sleep)
    monkeypatch.setattr(cpu_load.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(cpu_load, "_START", None)
    return clock


def test_a_start_up_window_is_used_without_a_probe(fake_clock):
    cpu_load.mark_start()
    fake_clock["now"] += 4.0  # the imports
    assert busy_cores() == pytest.approx(1.0) and fake_clock["slept"] == []


@pytest.mark.parametrize("since_start", [None, 0.01, 3600.0])  # no mark (the API), too short, stale
def test_without_a_usable_start_up_window_a_short_probe_measures(fake_clock, since_start):
    if since_start is not None:
        cpu_load.mark_start()
        fake_clock["now"] += since_start
    assert busy_cores() == pytest.approx(1.0) and fake_clock["slept"] == [cpu_load.PROBE_S]


@pytest.mark.skipif(not os.path.exists(cpu_load.PROC_STAT), reason="no /proc/stat: nothing is measured")
def test_a_command_marks_its_start_before_main_runs(monkeypatch):
    from accel_train.cli import run_main

    monkeypatch.setattr(cpu_load, "_START", None)
    seen = []
    with pytest.raises(SystemExit):
        run_main(lambda argv: seen.append(cpu_load._START) or 0, [])
    assert seen and seen[0] is not None and seen[0].total_ticks > 0
