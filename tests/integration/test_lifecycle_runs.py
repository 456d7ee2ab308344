"""Issue 15: a run's life never lies. A resume restores the saved run, changes are explicit and recorded,
an extension re-plans the schedule, a finished run stays as it is. In-process (``loop.fit``), about a second each.


Whole runs and launches; the in-process tests are in ../unit/test_lifecycle.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import yaml
from conftest import copy_run, fit_small

from accel_train.errors import UserError
from accel_train.schedule import lr_factor

_fit = fit_small


def _events(out: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == kind]


def _lrs(out: Path) -> dict[int, float]:
    return {e["step"]: e["lr"] for e in _events(out, "train")}


def _tree(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run planned for 12 steps at lr 0.001, stopped at step 5."""
    out = tmp_path_factory.mktemp("life") / "run"
    summary = _fit(out, "--max-steps", "12", "--lr", "0.001", "--stop-at-step", "5")
    assert summary["stopped"] == "--stop-at-step 5" and summary["exit_code"] == 0
    return out


_copy = copy_run


def test_plain_resume_restores_how_the_run_was_started(stopped, tmp_path):
    """Finding 1: `--resume auto` alone continues the 12-step, lr 0.001 run (not the defaults: 8 epochs, lr 0.002)."""
    run, straight = _copy(stopped, tmp_path), tmp_path / "straight"
    _fit(straight, "--max-steps", "12", "--lr", "0.001")
    summary = _fit(run, "--resume", "auto")
    assert summary["global_step"] == 12
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["lr"] == 0.001 and saved["max_steps"] == 12 and saved["resolved"]["total_steps"] == 12
    assert _lrs(run) == pytest.approx(_lrs(straight), rel=1e-12)
    assert _events(run, "resume")[0]["changed"] == {}


def test_resume_refuses_a_changed_experiment_and_changes_nothing(stopped, tmp_path):
    run = _copy(stopped, tmp_path)
    before = _tree(run)
    with pytest.raises(UserError, match=r"--lr \(the run has 0\.001\).*same experiment"):
        _fit(run, "--resume", "auto", "--lr", "0.002")
    with pytest.raises(UserError, match=r"--optimizer \(the run has 'adam'\)"):
        _fit(run, "--resume", "auto", "--optimizer", "sgd")
    with pytest.raises(UserError, match=r"--max-steps \(the run has 12\).*--extend"):
        _fit(run, "--resume", "auto", "--max-steps", "20")
    assert _tree(run) == before
    _fit(run, "--resume", "auto", "--lr", "0.001", "--max-steps", "12")  # the same values, given again: fine


def test_safe_changes_take_effect_and_are_recorded(stopped, tmp_path):
    run = _copy(stopped, tmp_path)
    _fit(run, "--resume", "auto", "--log-every", "3")
    assert _events(run, "resume")[0]["changed"] == {"log_every": [1, 3]}
    assert [e["step"] for e in _events(run, "train") if e["step"] > 5] == [6, 9, 12]


def test_extend_replans_the_schedule_and_never_trains_at_lr_zero(tmp_path):
    """Finding 2: a finished cosine run ends at LR 0; --extend continues as if planned for the new length."""
    run, straight = tmp_path / "run", tmp_path / "straight"
    _fit(run, "--max-steps", "8")
    _fit(straight, "--max-steps", "12")
    summary = _fit(run, "--resume", "auto", "--extend", "--max-steps", "12")
    assert summary["global_step"] == 12
    lrs, planned = _lrs(run), _lrs(straight)
    assert all(lrs[s] > 0 for s in (9, 10, 11))  # the old run's schedule had reached 0 at step 8
    assert [lrs[s] for s in (9, 10, 11, 12)] == pytest.approx([planned[s] for s in (9, 10, 11, 12)], rel=1e-12)
    assert lrs[9] == pytest.approx(0.002 * lr_factor(9, 12), rel=1e-12)
    assert _events(run, "resume")[0]["changed"] == {"max_steps": [8, 12]}
    with pytest.raises(UserError, match="already trained 12"):
        _fit(run, "--resume", "auto", "--extend", "--max-steps", "10")


def test_resume_of_a_finished_run_changes_nothing(tmp_path, capsys):
    """Finding 3: summary.json keeps the original run's figures."""
    run = tmp_path / "run"
    _fit(run, "--max-steps", "4")
    before = _tree(run)
    capsys.readouterr()
    assert _fit(run, "--resume", "auto") == {"finished": True}
    assert "already finished (4 of 4 steps" in capsys.readouterr().out
    assert _tree(run) == before
