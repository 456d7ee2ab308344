"""``accel_train/schedule.py``: the step schedule's milestones and gamma, their checks, and old checkpoints'
schedule state."""

from __future__ import annotations

import json

import pytest
import torch
from checks import raises_user_error

from accel_train.config import parse_config


def test_step_schedule_takes_milestones_and_gamma():
    from accel_train.schedule import ScheduleFn, lr_factor, parse_milestones

    assert [lr_factor(s, 100, "step") for s in (49, 50, 74, 75)] == pytest.approx([1, 0.1, 0.1, 0.01])
    assert [lr_factor(s, 100, "step", 0, [0.2], 0.5) for s in (19, 20, 99)] == pytest.approx([1, 0.5, 0.5])
    assert parse_milestones(" 0.3, 0.6 ,0.9") == (0.3, 0.6, 0.9)
    # old checkpoints' schedule state (no milestones/gamma/warmup_from) loads and keeps the defaults
    fn = ScheduleFn(100, "step", 0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), fn)
    state = json.loads(json.dumps(scheduler.state_dict()))
    assert state["lr_lambdas"][0] == {"total_steps": 100, "schedule": "step", "warmup_steps": 0, **_defaults()}
    for key in ("milestones", "gamma", "warmup_from"):
        del state["lr_lambdas"][0][key]
    scheduler.load_state_dict(state)
    assert fn(75) == pytest.approx(0.01)


def _defaults() -> dict:
    return {"milestones": [0.5, 0.75], "gamma": 0.1, "warmup_from": 0.0}


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--lr-milestones", "0.75,0.5"], "milestones must increase"),
        (["--lr-milestones", "0.5,1"], "between 0 and 1"),
        (["--lr-milestones", "half"], "comma-separated numbers"),
        (["--lr-milestones", ""], "at least one"),
        (["--lr-gamma", "0"], "--lr-gamma must be a positive number"),
        (["--lr-gamma", "nan"], "--lr-gamma must be a positive number"),
    ],
)
def test_bad_milestones_and_gamma_are_one_line_errors(flags, needle):
    raises_user_error(lambda: parse_config(flags), needle)
