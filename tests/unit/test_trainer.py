"""The Trainer in-process on small synthetic data: step accounting, accumulation, stops, log windows, cadence.

No subprocess: these run ``accel_train.loop.fit`` (config → build → Trainer) in the test process, so
each costs about a second.


The in-process tests; whole runs and launches are in ../integration/test_trainer_runs.py.
"""

from __future__ import annotations

import signal
from pathlib import Path

from conftest import SMALL_RUN

from accel_train.config import parse_config


def _checkpoint_steps(out: Path) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in (out / "checkpoints").iterdir())


def test_a_signal_stops_at_the_next_step_boundary(tmp_path):
    from accel_train.build import build_trainer
    from accel_train.run_dir import RunDir
    from accel_train.runtime import build_runtime

    cfg = parse_config([*SMALL_RUN, "--log-every", "2", "--output-dir", str(tmp_path / "run"), "--max-steps", "6"])
    trainer = build_trainer(cfg, build_runtime(cfg), RunDir(cfg.output_dir))
    assert trainer.stop_requested() is None
    trainer.stop_signal = signal.SIGTERM  # what the handler records
    assert trainer.stop_requested() == "received SIGTERM"
    summary = trainer.run(0.0)
    assert summary == {"stopped": "received SIGTERM", "global_step": 1, "exit_code": 143}
    assert _checkpoint_steps(tmp_path / "run") == [1]
