"""The kill campaign's verdict (benchmarks/kills/verdict.py) on records and folders made up here: what it calls a
re-log a resume explains, and what a fault."""

from __future__ import annotations

from benchmarks.kills.verdict import leftovers, relogged


def _r(event: str, step: int) -> dict:
    return {"event": event, "step": step}


def test_repeats_after_a_resume_are_superseded_lines_and_repeats_within_an_attempt_are_faults():
    killed = [_r("train", 1), _r("train", 2), _r("checkpoint", 2), _r("train", 3), _r("eval", 4)]
    resumed = [_r("resume", 2), _r("train", 3), _r("train", 4), _r("eval", 4)]
    assert relogged(killed + resumed) == ([], 0, 2)  # train 3 and eval 4 again: the resume at 2 explains them
    # the final evaluation of the step resumed at may come again; its train record or checkpoint may not
    final = [_r("train", 1), _r("train", 2), _r("checkpoint", 2), _r("eval", 2)]
    assert relogged([*final, _r("resume", 2), _r("eval", 2)]) == ([], 0, 1)
    faults, train, _ = relogged([*final, _r("resume", 2), _r("checkpoint", 2), _r("eval", 2)])
    assert len(faults) == 1 and "('checkpoint', 2)" in faults[0] and train == 0
    faults, train, _ = relogged([_r("train", 1), _r("train", 2), _r("train", 2)])
    assert len(faults) == 1 and train == 1
    faults, train, _ = relogged([*killed, _r("resume", 2), _r("train", 2), _r("train", 3)])
    assert len(faults) == 1 and train == 1  # a step before the resume point


def test_leftovers_are_half_written_files_and_names_a_run_does_not_write(tmp_path):
    run = tmp_path / "run"
    for sub in ("checkpoints/step_00000010", "checkpoints/.tmp-step_00000020", "checkpoints/step_00000005", "best"):
        (run / sub).mkdir(parents=True)
    (run / "checkpoints/step_00000010/progress.json").write_text("{}")
    for name in ("metrics.jsonl", "summary.json", "best/.model.safetensors.abcd1234.tmp", "stray.txt", "abandoned"):
        (run / name).write_text("")
    assert leftovers(run) == [
        "best/.model.safetensors.abcd1234.tmp",
        "checkpoints/.tmp-step_00000020",
        "checkpoints/step_00000005",  # a checkpoint name without progress.json: half deleted
        "stray.txt",
    ]
