"""A run killed at any moment resumes whole (issue 42): what the kill campaign (``scripts/soak.py kills``,
``benchmarks/kills/campaign.py``) found, each at its exact moment, and the campaign itself (slow).

The default tests cut a run in its final phase in this process (a failure injected where the campaign's SIGKILL
landed leaves the same files on disk), then resume it with ``--resume auto``.
"""

from __future__ import annotations

import json

import pytest
from conftest import check, fit_small, metrics, run_script, summary

import accel_train.plots
import accel_train.trainer

LAST = ["--max-steps", "6", "--checkpoint-every", "3", "--plots"]  # 16 steps an epoch: the run ends mid-epoch


class Cut(BaseException):
    """Where the kill landed: nothing of the run's own handling runs for it but its ``finally`` blocks."""


def _cut_once(monkeypatch, module, name, when=lambda *a, **k: True):
    real = getattr(module, name)

    def cut(*args, **kwargs):
        if when(*args, **kwargs):
            monkeypatch.setattr(module, name, real)
            raise Cut(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, cut)


def test_a_run_cut_in_its_final_plots_is_not_finished_and_the_resume_finishes_it(tmp_path, monkeypatch):
    """summary.json marks a run finished (a resume then touches nothing): it is written last. It was written before
    the confusion matrix and the plots, so a kill in the plots left a 'finished' run without curves.png and
    confusion.png for good (the campaign's 'final: after summary' kills)."""
    out = tmp_path / "run"
    _cut_once(monkeypatch, accel_train.plots, "plot_curves")
    with pytest.raises(Cut):
        fit_small(out, *LAST)
    assert not (out / "summary.json").exists()
    fit_small(out, *LAST, "--resume", "auto")
    assert summary(out)["global_step"] == 6
    assert (out / "curves.png").is_file() and (out / "confusion.png").is_file() and (out / "confusion.json").is_file()


def test_a_run_resumed_at_its_last_step_keeps_that_checkpoint(tmp_path, monkeypatch):
    """A run cut in its final export resumes at its last step from the checkpoint saved there. It saved that very
    position again: the folder was deleted and replaced (a kill in between lost the run's last checkpoint) and
    its 'checkpoint' record was logged twice in the timeline (the campaign's ('checkpoint', 200) twice)."""
    out = tmp_path / "run"
    _cut_once(monkeypatch, accel_train.trainer, "export_weights", lambda sd, out_dir, cfg: out_dir.name == "model")
    with pytest.raises(Cut):
        fit_small(out, *LAST)
    last = out / "checkpoints" / "step_00000006"
    inode = last.stat().st_ino
    fit_small(out, *LAST, "--resume", "auto")
    assert last.stat().st_ino == inode
    records = metrics(out)
    resumed = max(i for i, r in enumerate(records) if r["event"] == "resume")
    assert records[resumed]["step"] == 6
    assert [r for r in records[resumed:] if r["event"] == "checkpoint"] == []
    assert summary(out)["global_step"] == 6


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_kill_campaign(tmp_path, processes):
    """10 SIGKILLs at random moments (steps, saves, evaluations, exports, the final phase; on 2 processes the
    launcher with both ranks, or one rank), each resumed with --resume auto: the finished runs equal a straight
    run bit for bit, log every step once, and leave nothing half-written (benchmarks/kills/campaign.py)."""
    out = tmp_path / "kills.json"
    args = ("kills", "--trials", "10", "--processes", str(processes), "--work", str(tmp_path / "work"))
    proc = run_script("soak.py", *args, "--out", str(out), timeout=1800)
    result = json.loads(out.read_text())
    detail = proc.stdout[-6000:]
    assert result["kills"] == 10, detail
    assert result["weight_differences"] == 0 and result["duplicated_steps"] == 0, detail
    assert result["missing_steps"] == 0 and result["leftovers"] == [], detail
    assert result["refused_in_use"] == 0 and result["failed_attempts"] == [], detail
    assert result["ok"], detail
    check(proc)
