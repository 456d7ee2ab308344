"""``eval.py`` on ``shards:DIR`` and ``hf:`` data scores what it says, as on folders (test_eval_whole_folder.py).

It scored "the test split of shards:DIR" for shards without one: ``--val-split 0.2 --seed 42`` (the defaults) of the
rows, not the run's. For a run that trained with ``--val-split 0.5 --seed 3`` that part overlaps the rows it trained
on (an accuracy inflated, silently), and shards it never saw were scored a fifth at a time. Now: the test shards
where the folder has them; every row of other shards; the run's own held-out rows (its config.yaml) for the shards
it trained on, which then agree with the run's own last evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import FAST, check, run_here, summary
from datafiles import write_hf_disk
from helpers_shards import CLASSES, _samples, shard_set, write_tar

ARGS = ["--model", "lenet", "--optimizer", "sgd", "--lr", "0.05", "--batch-size", "16", "--max-steps", "12"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path]:
    """(the run, its shards): tar shards without a split of their own, trained with the half held out by seed 3."""
    root = tmp_path_factory.mktemp("eval_shards")
    data = shard_set(root / "flat", "tar", "flat", size=16, rows=24)  # 96 rows, 3 classes
    out = root / "run"
    check(run_here("train.py", "--dataset", f"shards:{data}", *ARGS, "--val-split", "0.5", "--seed", "3", *FAST,
                   "--output-dir", str(out)))  # fmt: skip
    return out, data


def _evaluate(weights: Path, *args: str) -> tuple[dict, str]:
    report = weights.parent.parent / f"eval-{weights.name}.json"  # beside the run: never inside its folders
    proc = check(run_here("eval.py", "--weights", str(weights), *args, "--out", str(report), "--overwrite"))
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("evaluated "), proc.stdout
    return json.loads(report.read_text()), lines[0]


def test_the_shards_the_weights_trained_on_score_the_runs_held_out_rows(run):
    out, data = run
    done = summary(out)
    for weights in (out / "model", *sorted((out / "checkpoints").iterdir())[-1:]):
        report, line = _evaluate(weights)  # no --dataset: the recorded one
        assert line.endswith(
            f"the 48 of 96 rows in {data} that --val-split 0.5 --seed 3 holds out; the weights trained on the rest "
            f"(values from {out / 'config.yaml'}; --val-split 0 scores every image)"
        )
        # the very rows the run evaluated, so the very numbers
        assert report["samples"] == done["eval_samples"] == 48
        assert report["accuracy"] == pytest.approx(done["eval_accuracy"], abs=1e-9)
    # another seed (or split) is a part as asked, and says that the weights trained on some of it
    _, line = _evaluate(out / "model", "--seed", "6")
    assert line.endswith(
        "that --val-split 0.5 --seed 6 holds out, as asked (the run held out --val-split 0.5 --seed 3: some of "
        "these images trained the weights)"
    )
    _, line = _evaluate(out / "model", "--seed", "3")  # the run's own values: no such note
    assert line.endswith("that --val-split 0.5 --seed 3 holds out, as asked")
    report, line = _evaluate(out / "model", "--dataset", f"shards:{data}", "--val-split", "0")
    assert report["samples"] == 96 and line.endswith(f"every row in {data} (96, no train/ and test/ split of its own)")


def test_other_shards_are_scored_whole_with_the_models_classes(run, tmp_path):
    out, _ = run
    images, labels = _samples(0, 30, 16, seed=9)
    kept = [(im, CLASSES[lb]) for im, lb in zip(images, labels, strict=True) if CLASSES[lb] != "blue"]
    other = tmp_path / "other"
    other.mkdir()
    write_tar(other / "part-0.tar", [im for im, _ in kept], [lb for _, lb in kept])  # green and red: not a prefix
    report, line = _evaluate(out / "model", "--dataset", f"shards:{other}")
    assert report["samples"] == len(kept) == 20
    assert line == f"evaluated every row in {other} (20, no train/ and test/ split of its own)"
    names = list(report["per_class_accuracy"])  # the model's classes, in its order: blue, green, red
    assert names == sorted(CLASSES)
    counts = dict(zip(names, map(sum, report["confusion_matrix"]), strict=True))  # rows: the true class
    assert counts == {name: sum(lb == name for _, lb in kept) for name in names} and counts["blue"] == 0
    assert report["per_class_accuracy"]["blue"] is None

    half, _ = _evaluate(out / "model", "--dataset", f"shards:{other}", "--val-split", "0.5", "--seed", "1")
    assert half["samples"] == len(kept) // 2


def test_shards_with_a_test_split_score_it_and_refuse_val_split(run, tmp_path):
    out, _ = run
    split = shard_set(tmp_path / "split", "tar", "folders", size=16, rows=24)  # test/: 12 rows
    report, line = _evaluate(out / "model", "--dataset", f"shards:{split}")
    assert report["samples"] == 12 and line.endswith(f"every row of the test shards in {split} (12, its test split)")
    proc = run_here("eval.py", "--weights", str(out / "model"), "--dataset", f"shards:{split}", "--val-split", "0.2")
    assert proc.returncode == 2 and "has its own test split" in proc.stderr and "drop --val-split" in proc.stderr


def test_hub_data_without_a_test_split_scores_the_runs_held_out_rows(tmp_path, monkeypatch):
    """The same for ``hf:`` data without a test split: it held out the defaults' part, not the run's; also when
    ``--dataset`` names the same data another way (a relative path)."""
    data = write_hf_disk(tmp_path / "hf", n=60, splits=False)
    out = tmp_path / "run"
    check(run_here("train.py", "--dataset", f"hf:{data}", *ARGS[:-2], "--batch-size", "8", "--max-steps", "6",
                   "--val-split", "0.5", "--seed", "3", *FAST, "--output-dir", str(out)))  # fmt: skip
    done = summary(out)
    monkeypatch.chdir(tmp_path)
    for args in ([], ["--dataset", "hf:hf"]):
        report, line = _evaluate(out / "model", *args)
        held = f"(where it has none: the part --val-split 0.5 --seed 3 holds out, from {out / 'config.yaml'})"
        assert line.endswith(held), line
        assert report["samples"] == done["eval_samples"] == 30
        assert report["accuracy"] == pytest.approx(done["eval_accuracy"], abs=1e-9)


def test_a_relative_recorded_path_from_elsewhere_is_one_line_naming_it(run, tmp_path, monkeypatch):
    """Weights record their data as typed: ``shards:flat`` is relative to where the run trained. From another
    folder the line says so (it said "check --dataset", a flag the user never gave)."""
    out, data = run
    monkeypatch.chdir(data.parent)
    relative = tmp_path / "relative"
    check(run_here("train.py", "--dataset", "shards:flat", *ARGS, *FAST, "--output-dir", str(relative)))
    monkeypatch.chdir(tmp_path)
    proc = run_here("eval.py", "--weights", str(relative / "model"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: {relative / 'model'} records its dataset as 'shards:flat', a path relative to the folder it "
        "trained in; run eval.py from there, or pass --dataset shards:<its path from here>"
    ]
