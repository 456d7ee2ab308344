"""``accel_train/plan_warnings.py``: settings a run is too short for are warnings, one line each."""

from __future__ import annotations

from accel_train.config import parse_config


class _Recorder:
    def __init__(self):
        self.lines: list[str] = []

    def warn(self, message: str) -> None:
        self.lines.append(message)


def test_run_length_warnings():
    from accel_train.data.base import DataSplits
    from accel_train.plan_warnings import run_length_warnings, warn_about_run

    cfg = parse_config(["--warmup-steps", "50", "--eval-every", "100", "--checkpoint-every", "200"])
    warnings = run_length_warnings(cfg, total_steps=40)
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    assert "--warmup-steps 50 is longer than the run (the run has 40 optimizer step(s))" in warnings[0]
    assert "--eval-every 100 is beyond the run" in warnings[1] and "never fires" in warnings[1]
    assert "--checkpoint-every 200 is beyond the run" in warnings[2]
    assert run_length_warnings(parse_config(["--warmup-steps", "40", "--eval-every", "40"]), 40) == []
    rt = _Recorder()
    splits = DataSplits(None, None, None, extra={"notes": ["a note"]})
    warn_about_run(cfg, rt, splits, 40)
    assert rt.lines == [*warnings, "a note"]
