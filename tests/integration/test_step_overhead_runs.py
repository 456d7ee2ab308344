"""benchmarks/step_overhead.py measures a real Trainer.step against the plain step in a child process."""

from __future__ import annotations

from benchmarks.step_overhead import run_step_overhead


def test_one_cell_measures_both_sides_in_a_child_process():
    (row,) = run_step_overhead(models=("tiny",), clips=(1.0,), rounds=2, block=3, threads=1)
    assert "error" not in row, row.get("error")
    assert row["threads"] == 1 and row["rounds"] == 2 and row["block_steps"] == 3
    assert row["portable_ms"] > 0 and row["plain_ms"] > 0
    assert abs(row["ratio"] - row["plain_ms"] / row["portable_ms"]) < 1e-9
    assert abs(row["overhead_us"] - (row["portable_ms"] - row["plain_ms"]) * 1e3) < 1e-6
