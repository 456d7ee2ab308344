"""Issue 15: a run's life never lies. A resume restores the saved run, changes are explicit and recorded,
an extension re-plans the schedule, a finished run stays as it is. In-process (``loop.fit``), about a second each.


The in-process tests; whole runs and launches are in ../integration/test_lifecycle_runs.py.
"""

from __future__ import annotations

import pytest

from accel_train.config import parse_config
from accel_train.errors import UserError
from accel_train.resume import reconcile


def test_extend_needs_resume():
    with pytest.raises(UserError, match="--extend makes a resumed run longer"):
        parse_config(["--extend"])


def test_a_resume_without_batch_flags_keeps_the_global_batch_on_another_setup():
    """2 processes x 32 saved; resumed on any number of processes it stays 64 per optimizer step."""
    cfg = parse_config(["--resume", "auto"])
    saved = {**cfg.to_dict(), "batch_size": 32}
    cfg, _ = reconcile(cfg, saved, {"global_batch": 64, "micro_batch": 32})
    assert (cfg.global_batch_size, cfg.max_device_batch, cfg.grad_accum_steps) == (64, 32, 1)
    flags = parse_config(["--resume", "auto", "--batch-size", "16"])
    with pytest.raises(UserError, match="--batch-size"):
        reconcile(flags, saved, {"global_batch": 64, "micro_batch": 32})
