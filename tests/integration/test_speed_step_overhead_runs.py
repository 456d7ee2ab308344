"""benchmarks/speed/step_overhead.py measures a real Trainer.step against the plain step in a child process."""

from __future__ import annotations

import statistics

from benchmarks.speed.step_overhead import run_step_overhead


def test_one_cell_measures_both_sides_in_a_child_process():
    (row,) = run_step_overhead(models=("tiny",), clips=(1.0,), rounds=2, block=3, threads=1)
    assert "error" not in row, row.get("error")
    assert row["threads"] == 1 and row["rounds"] == 2 and row["block_steps"] == 3
    assert row["portable_ms"] > 0 and row["plain_ms"] > 0
    assert abs(row["ratio"] - row["plain_ms"] / row["portable_ms"]) < 1e-9
    assert row["ratio_paired"] > 0
    rounds = list(zip(row["portable_rounds_ms"], row["plain_rounds_ms"], strict=True))
    assert len(rounds) == 2 and min(row["portable_rounds_ms"]) == row["portable_ms"]
    assert abs(row["overhead_us"] - statistics.median(p - q for p, q in rounds) * 1e3) < 1e-6  # paired, as the ratio
    assert abs(row["ratio_paired"] - statistics.median(q / p for p, q in rounds)) < 1e-9


def test_the_plain_step_uses_the_portables_optimizer_settings(tmp_path):
    """Like with like: the plain side's SGD has the run's momentum, dampening, nesterov and weight decay (a plain
    SGD without momentum once made the portable's momentum buffer read as loop overhead)."""
    from benchmarks.speed.step_overhead import _build, _Plain

    cfg, trainer = _build("lenet", 1.0, tmp_path / "run", 1)
    try:
        plain = _Plain(trainer, 1.0, cfg.log_every)
        keys = ("lr", "momentum", "dampening", "nesterov", "weight_decay")
        ours = trainer.optimizer.optimizer.param_groups
        assert ours[0]["momentum"] == 0.9  # the default the comparison must carry over
        assert [{k: g[k] for k in keys} for g in plain.opt.param_groups] == [{k: g[k] for k in keys} for g in ours]
    finally:
        trainer.rt.end()
