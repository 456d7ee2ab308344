"""A run's thread count beside other work (accel_train/cpu_load.py), in a real run: the start line says how many
threads and why, and the summary records them. The load is faked (``ACCEL_TRAIN_BUSY_CORES``) and the cores too,
so nothing here depends on the machine's own load."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import fit_small

from accel_train.cpu_load import BUSY_ENV


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "busy,flags,line",
    [
        ("1.0", (), "1 thread(s)/process (1.0 of 2 cores busy with other work at start; --threads N chooses)"),
        ("0", (), "2 thread(s)/process (2 core(s) free)"),
        ("1.0", ("--threads", "2"), "2 thread(s)/process (--threads 2)"),  # an explicit count wins
    ],
)
def test_the_start_line_says_the_threads_and_why(tmp_path, monkeypatch, capsys, two_cores, busy, flags, line):
    monkeypatch.setenv(BUSY_ENV, busy)
    summary = fit_small(tmp_path / "run", "--max-steps", "1", *flags)
    assert line in capsys.readouterr().out
    assert summary["threads_per_process"] == int(line[0])
