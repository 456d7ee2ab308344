"""Issue 49, "data you can trust": the real commands on data whose files change between two launches.

Each test runs ``scripts/train.py`` (and ``eval.py``) in a new process, as a user would, on tiny generated data:
a stop (``--stop-at-step``), a real change of files, then ``--resume auto`` or a fresh run; and asserts on what the
user sees: the exit code, the one line, the files the run wrote. The data's files are made older than the cache's
racy window (``index_cache.RACY_S``) first, so that the index cache is written and a later launch could be fooled by
it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from checks import assert_one_line_error, run_folder_snapshot
from conftest import FAST, REPO, check, run_here, run_script, summary
from datafiles import _colour_images, age, write_image_folder
from helpers_shards import png, shard_set, write_parquet, write_shards

LENET = ["--model", "lenet", "--batch-size", "4", *FAST]
OLD = 3600  # seconds the data's files are set back: well outside the cache's racy window
START = re.compile(r"\((\d+) train / (\d+) test\)")


def train(dataset: str, out: Path, *args: str, here: bool = False, env: dict | None = None,
          config: str | None = None, timeout: float = 120):  # fmt: skip
    """``scripts/train.py --dataset dataset ... --output-dir out`` (lenet, batch 4, no extras) in a new process,
    or with ``here`` through the script's ``main`` in this process (``run_here``: the same exit code and output,
    without the seconds of imports; for the runs that only prepare what a launched one is checked on)."""
    cmd = ("train.py", "--dataset", dataset, *LENET, "--output-dir", str(out), *args)
    if here:
        assert env is None and config is None
        return run_here(*cmd)
    return run_script(*cmd, env=env, config=config, timeout=timeout)


def evaluate(weights: Path, *args: str, env: dict | None = None):
    return run_script("eval.py", "--weights", str(weights), *args, env=env, timeout=120)


def scored(weights: Path, out: Path):
    """``eval.py --weights weights --out out`` in this process, checked."""
    return check(run_here("eval.py", "--weights", str(weights), "--out", str(out)))


def model_config(run: Path) -> dict:
    return json.loads((run / "model" / "config.json").read_text())


def counts(proc) -> tuple[int, int]:
    """(train, test) from the run's start line ``... (N train / M test) ...``."""
    found = START.search(proc.stdout)
    assert found, proc.stdout[-3000:]
    return int(found[1]), int(found[2])


def images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.png"))


def final_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "model" / "model.safetensors"))


def assert_same_weights(a: Path, b: Path) -> None:
    import torch

    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, f"weights differ in {different}"


def no_traceback(proc) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-5000:]


# --------------------------------------------------------------------------- 1. overwritten in place


def test_images_overwritten_in_place_with_another_size_and_mode_are_read_as_they_are_now(tmp_path):
    """16px grey images replaced by 32px RGB ones under the same names (modification times set back to the old
    ones): a fresh run must read 3 channels at 32px, not the cached 1 channel at 16px."""
    data = write_image_folder(tmp_path / "f", classes=("a", "b"), per_class=6, size=16, mode="L")
    age(data)
    first = check(train(f"imagefolder:{data}", tmp_path / "grey", "--max-steps", "2", here=True))
    assert (model_config(tmp_path / "grey")["in_channels"], model_config(tmp_path / "grey")["image_size"]) == (1, 16)
    stamps = {p: p.stat() for p in images(data)}
    fresh = write_image_folder(tmp_path / "rgb", classes=("a", "b"), per_class=6, size=32, mode="RGB")
    for old in stamps:
        (data / old.relative_to(data)).write_bytes((fresh / old.relative_to(data)).read_bytes())
        os.utime(old, ns=(stamps[old].st_atime_ns, stamps[old].st_mtime_ns))  # only ctime and size tell now
    rgb = check(train(f"imagefolder:{data}", tmp_path / "colour", "--max-steps", "2"))
    config = model_config(tmp_path / "colour")
    assert (config["in_channels"], config["image_size"]) == (3, 32), (config, rgb.stdout)
    assert counts(rgb) == counts(first)


# --------------------------------------------------------------------------- 2. added, folder time restored


def test_images_added_under_a_folder_whose_time_is_restored_are_counted_and_refuse_a_resume(tmp_path):
    data = write_image_folder(tmp_path / "f", classes=("a", "b"), per_class=6, size=16)
    age(data)
    run = tmp_path / "run"
    first = check(train(f"imagefolder:{data}", run, "--max-steps", "4", "--stop-at-step", "2", here=True))
    assert sum(counts(first)) == 12
    folder = data / "a"
    was = folder.stat()
    extra = write_image_folder(tmp_path / "more", classes=("a",), per_class=3, size=16)
    for i, src in enumerate(images(extra)):
        shutil.copyfile(src, folder / f"new_{i}.png")
    age(*(folder / f"new_{i}.png" for i in range(3)))
    os.utime(folder, ns=(was.st_atime_ns, was.st_mtime_ns))  # the folder looks untouched
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns))
    fresh = check(train(f"imagefolder:{data}", tmp_path / "fresh", "--max-steps", "2"))
    assert sum(counts(fresh)) == 15, fresh.stdout
    resumed = train(f"imagefolder:{data}", run, "--max-steps", "4", "--resume", "auto", here=True)
    line = assert_one_line_error(resumed, "3 file(s) added", "a/new_0.png", "--resume-changed-data")
    assert "removed" not in line, line
    assert not (run / "model").exists()


# --------------------------------------------------------------------------- 3. removed, then restored exactly


def test_images_removed_refuse_a_resume_and_restored_ones_are_named_until_accepted(tmp_path):
    """An unchanged folder resumes silently; images removed are refused by name; put back (the same bytes and
    times, but rewritten: their change time differs on this machine) they are named as replaced in place, since
    nothing can tell an exact restore from a same-size swap; --resume-changed-data then goes on, says so, and
    ends on the uninterrupted run's weights (the data was the same)."""
    data = write_image_folder(tmp_path / "f", classes=("a", "b"), per_class=6, size=16)
    age(data)
    dataset = f"imagefolder:{data}"
    run, whole, aside = tmp_path / "run", tmp_path / "whole", tmp_path / "aside"
    check(train(dataset, run, "--max-steps", "6", "--stop-at-step", "2", here=True))
    same = check(train(dataset, run, "--max-steps", "6", "--stop-at-step", "3", "--resume", "auto", here=True))
    assert "not exact" not in same.stdout + same.stderr and "not the data" not in same.stdout + same.stderr
    gone = [data / "a" / "a_002.png", data / "b" / "b_004.png"]
    aside.mkdir()
    for i, p in enumerate(gone):
        os.rename(p, aside / f"{i}.png")
    before = run_folder_snapshot(run)
    refused = train(dataset, run, "--max-steps", "6", "--resume", "auto")
    line = assert_one_line_error(refused, "2 removed", "a/a_002.png", "b/b_004.png")
    assert "added" not in line, line
    assert run_folder_snapshot(run) == before  # the refusal wrote nothing
    report = scored(run / "checkpoints" / "step_00000003", tmp_path / "changed.json")
    assert "is not the data the weights recorded: train: 2 removed (a/a_002.png, b/b_004.png)" in report.stderr
    assert "2 removed" in json.loads((tmp_path / "changed.json").read_text())["data_changed"]
    for i, p in enumerate(gone):
        os.rename(aside / f"{i}.png", p)  # back where they were: the same bytes and modification times
    report = scored(run / "checkpoints" / "step_00000003", tmp_path / "back.json")
    assert "2 file(s) rewritten or replaced in place" in report.stderr, report.stderr
    refused = train(dataset, run, "--max-steps", "6", "--resume", "auto")
    assert_one_line_error(refused, "2 file(s) rewritten or replaced in place", "a/a_002.png", "--resume-changed-data")
    resumed = check(train(dataset, run, "--max-steps", "6", "--resume", "auto", "--resume-changed-data", here=True))
    assert "resume is not exact" in resumed.stdout + resumed.stderr
    check(train(dataset, whole, "--max-steps", "6", here=True))
    assert summary(run)["global_step"] == summary(whole)["global_step"] == 6
    assert_same_weights(run, whole)


# --------------------------------------------------------------------------- 4. shards: one added


def test_a_shard_added_refuses_a_resume_and_resume_changed_data_goes_on_saying_so(tmp_path):
    data = shard_set(tmp_path / "shards", shards=2, rows=12, size=16)
    age(data)
    dataset = f"shards:{data}"
    run = tmp_path / "run"
    check(train(dataset, run, "--max-steps", "6", "--stop-at-step", "2", here=True))
    added = write_shards(data / "train", shards=1, rows=8, size=16, prefix="extra", seed=7)[0]
    age(added)
    before = run_folder_snapshot(run)
    refused = train(dataset, run, "--max-steps", "6", "--resume", "auto")
    assert_one_line_error(refused, "shard(s) added", added.name, "--resume-changed-data")
    assert run_folder_snapshot(run) == before
    going = check(train(dataset, run, "--max-steps", "6", "--resume", "auto", "--resume-changed-data", here=True))
    said = going.stdout + going.stderr
    assert said.count("resume is not exact") == 1 and added.name in said, said[-3000:]
    assert summary(run)["global_step"] == 6


# --------------------------------------------------------------------------- 5. hf: re-saved with other rows


def _save_hf(path: Path, seed: int, n: int = 24) -> None:
    """``save_to_disk`` a DatasetDict (image, ClassLabel label) whose rows depend on ``seed``."""
    import datasets
    from PIL import Image

    names = ["red", "green", "blue"]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})

    def make(rows: int, s: int) -> datasets.Dataset:
        labels = (np.arange(rows) * (s + 1)) % len(names)
        pics = [Image.fromarray(a) for a in _colour_images(labels, 16, seed=s)]
        return datasets.Dataset.from_dict({"image": pics, "label": labels.tolist()}, features=features)

    datasets.DatasetDict({"train": make(n, seed), "test": make(9, seed + 100)}).save_to_disk(str(path))


def test_an_hf_dataset_saved_again_with_other_rows_refuses_a_resume(tmp_path):
    path = tmp_path / "hfdisk"
    _save_hf(path, seed=1)
    run = tmp_path / "run"
    check(train(f"hf:{path}", run, "--max-steps", "4", "--stop-at-step", "2", here=True))
    shutil.rmtree(path)
    _save_hf(path, seed=2)  # as many rows, other ones
    refused = train(f"hf:{path}", run, "--max-steps", "4", "--resume", "auto")
    assert_one_line_error(refused, "is not the data the checkpoint at step 2 trained on", "train")
    assert not (run / "model").exists()


# --------------------------------------------------------------------------- 6. ClassLabel names in other orders


def _named_parquet(path: Path, pictures: list[np.ndarray], labels: list[int], names: list[str]) -> Path:
    import pyarrow.parquet as pq

    table = write_parquet(None, [png(a) for a in pictures], labels, class_label=False)
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=8)
    return path


def _black_or_white(kinds: list[str], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    noise = rng.integers(0, 30, size=(len(kinds), 16, 16, 3))
    return [(n if k == "cat" else 255 - n).astype(np.uint8) for k, n in zip(kinds, noise, strict=True)]


def test_shards_listing_class_names_in_other_orders_are_labelled_by_name(tmp_path):
    """cat = black, dog = white; the train shard's ClassLabel says [cat, dog], the test shard's [dog, cat] (labels
    written by each shard's own names). Matched by position, the test labels would be swapped: accuracy ~0."""
    root = tmp_path / "shards"
    train_kinds = ["cat", "dog"] * 16
    test_kinds = ["dog", "cat", "cat", "dog"] * 3
    train_names, test_names = ["cat", "dog"], ["dog", "cat"]
    _named_parquet(root / "train" / "train-00000-of-00001.parquet", _black_or_white(train_kinds, 1),
                   [train_names.index(k) for k in train_kinds], train_names)  # fmt: skip
    _named_parquet(root / "test" / "test-00000-of-00001.parquet", _black_or_white(test_kinds, 2),
                   [test_names.index(k) for k in test_kinds], test_names)  # fmt: skip
    age(root)
    run = tmp_path / "run"
    check(train(f"shards:{root}", run, "--max-steps", "16", "--batch-size", "8", "--lr", "0.01", here=True))
    assert model_config(run)["class_names"] == ["cat", "dog"]
    assert summary(run)["eval_accuracy"] >= 0.9, summary(run)
    report_path = tmp_path / "report.json"
    check(evaluate(run / "model", "--out", str(report_path)))
    report = json.loads(report_path.read_text())
    assert report["samples"] == len(test_kinds) and report["accuracy"] >= 0.9, report
    assert report["data_changed"] is None, report


# --------------------------------------------------------------------------- 7. class folders beside test/


def test_class_folders_beside_a_test_folder_are_the_training_split(tmp_path):
    root = tmp_path / "F"
    write_image_folder(root, classes=("a", "b"), per_class=5, size=16)
    write_image_folder(root / "test", classes=("a", "b"), per_class=3, size=16)
    age(root)
    run = tmp_path / "run"
    proc = check(train(f"imagefolder:{root}", run, "--max-steps", "2"))
    assert model_config(run)["class_names"] == ["a", "b"]
    assert model_config(run)["num_classes"] == 2
    assert counts(proc) == (10, 6), proc.stdout
    assert summary(run)["eval_samples"] == 6


# --------------------------------------------------------------------------- 8. a class folder linked into another


def test_a_class_folder_linked_inside_another_class_is_refused_in_one_line(tmp_path):
    root = write_image_folder(tmp_path / "F", classes=("a", "b"), per_class=4, size=16)
    (root / "a" / "more").symlink_to(root / "b", target_is_directory=True)
    proc = train(f"imagefolder:{root}", tmp_path / "run", "--max-steps", "2")
    assert_one_line_error(proc, "a/more", "'b'")
    assert not (tmp_path / "run" / "model").exists()


# --------------------------------------------------------------------------- 9. damaged cache files


@pytest.mark.parametrize("kind", ["imagefolder", "shards"])
def test_damaged_cache_files_are_made_again_with_one_line_each_and_the_same_results(tmp_path, monkeypatch, kind):
    """Every cache file cut in half (an image folder's facts: JSON; a shard set's index: npz and JSON)."""
    cache = tmp_path / "cache"
    env = {"ACCEL_TRAIN_CACHE": str(cache)}
    if kind == "imagefolder":
        data = write_image_folder(tmp_path / "f", classes=("a", "b"), per_class=6, size=16)
    else:
        data = shard_set(tmp_path / "shards", shards=2, rows=12, size=16)
    age(data)
    dataset = f"{kind}:{data}"
    monkeypatch.setenv("ACCEL_TRAIN_CACHE", str(cache))
    first = check(train(dataset, tmp_path / "one", "--max-steps", "3", here=True))
    assert "could not be read" not in first.stdout + first.stderr
    damaged = sorted(p for p in cache.rglob("*") if p.suffix in (".npz", ".json"))
    assert damaged, f"nothing cached in {cache}"
    for p in damaged:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    second = check(train(dataset, tmp_path / "two", "--max-steps", "3", env=env))
    said = second.stdout + second.stderr
    notes = [line for line in said.splitlines() if "could not be read" in line]
    assert 1 <= len(notes) <= len(damaged), said[-3000:]
    for p in damaged:
        assert sum(str(p) in line for line in notes) <= 1, notes
    no_traceback(second)
    assert counts(second) == counts(first)
    assert model_config(tmp_path / "two") == model_config(tmp_path / "one")
    assert_same_weights(tmp_path / "one", tmp_path / "two")
    third = check(train(dataset, tmp_path / "three", "--max-steps", "3", here=True))
    assert "could not be read" not in third.stdout + third.stderr  # made again, readable now


# --------------------------------------------------------------------------- 10. two processes


def test_a_two_process_resume_after_a_file_was_removed_is_refused_on_every_rank(tmp_path):
    """Both ranks leave with exit 2 and their one line (no hang: the refusal is process 0's, shared with the
    others). The stop is a 1-process run of the same global batch (a resume may change the number of processes)."""
    data = write_image_folder(tmp_path / "f", classes=("a", "b"), per_class=8, size=16)
    age(data)
    dataset = f"imagefolder:{data}"
    run = tmp_path / "run"
    args = ["--max-steps", "4", "--global-batch-size", "8"]
    check(train(dataset, run, *args, "--stop-at-step", "2", here=True))
    (data / "b" / "b_005.png").unlink()
    refused = train(dataset, run, *args, "--resume", "auto", config="multi_cpu.yaml", timeout=120)
    err = refused.stderr
    shown = f"exit {refused.returncode}\nSTDOUT:\n{refused.stdout[-2000:]}\nSTDERR:\n{err[-6000:]}"
    assert refused.returncode != 0, shown
    lines = [line for line in err.splitlines() if line.startswith("[rank ")]
    assert sorted(line[: len("[rank 0]")] for line in lines) == ["[rank 0]", "[rank 1]"], shown  # one line each
    for line in lines:
        assert line[len("[rank 0] ") :].startswith("error: --resume: "), shown
        assert "1 removed (b/b_005.png)" in line and "--resume-changed-data" in line, shown
    # each rank's own exit code, in torchrun's table; no traceback from the ranks (the launcher prints its own
    # ChildFailedError: accel_train cannot prevent that)
    assert len(re.findall(r"exitcode\s*:\s*2 \(pid", err)) == 2, shown
    assert str(REPO / "accel_train") not in err and "unexpected failure" not in err, shown
    assert not (run / "model").exists()


# --------------------------------------------------------------------------- 11. tar shards and --label-column


def test_tar_shards_refuse_label_column_in_one_line(tmp_path):
    data = shard_set(tmp_path / "shards", kind="tar", shards=2, rows=8, size=16)
    proc = train(f"shards:{data}", tmp_path / "run", "--max-steps", "2", "--label-column", "label")
    assert_one_line_error(proc, "--label-column", "tar")
    assert not (tmp_path / "run" / "model").exists()


# --------------------------------------------------------------------------- 12. names that are not UTF-8


def test_a_file_name_that_is_not_utf8_trains(tmp_path):
    root = write_image_folder(tmp_path / "F", classes=("a", "b"), per_class=4, size=16)
    content = (root / "a" / "a_000.png").read_bytes()
    with open(os.path.join(os.fsencode(root / "a"), b"caf\xe9.png"), "wb") as f:
        f.write(content)
    age(root)
    run = tmp_path / "run"
    proc = check(train(f"imagefolder:{root}", run, "--max-steps", "2"))
    no_traceback(proc)
    assert sum(counts(proc)) == 9, proc.stdout
    assert model_config(run)["class_names"] == ["a", "b"]


def test_a_class_folder_name_that_is_not_utf8_trains_or_is_refused_in_one_line(tmp_path):
    root = write_image_folder(tmp_path / "F", classes=("a",), per_class=4, size=16)
    odd = os.path.join(os.fsencode(root), b"b\xe9")
    os.mkdir(odd)
    for i, src in enumerate(images(root / "a")):
        with open(os.path.join(odd, b"%d.png" % i), "wb") as f:
            f.write(src.read_bytes())
    age(root)
    run = tmp_path / "run"
    proc = train(f"imagefolder:{root}", run, "--max-steps", "2")
    no_traceback(proc)
    if proc.returncode == 0:
        config = json.loads((run / "model" / "config.json").read_bytes().decode("utf-8"))  # valid UTF-8 JSON
        assert len(config["class_names"]) == 2 and config["class_names"][0] == "a", config
        assert sum(counts(proc)) == 8, proc.stdout
        report = check(run_here("eval.py", "--weights", str(run / "model")))
        no_traceback(report)
    else:
        assert_one_line_error(proc)


# --------------------------------------------------------------------------- moved data


def test_a_folder_moved_elsewhere_resumes_from_its_new_path_and_is_still_compared(tmp_path):
    """The same folder under another path (moved, or written as an absolute path) is the run's data: the resume
    goes on exactly; a file added there afterwards is refused as before."""
    data = write_image_folder(tmp_path / "f", classes=("a", "b"), per_class=6, size=16)
    age(data)
    run, whole = tmp_path / "run", tmp_path / "whole"
    check(train(f"imagefolder:{data}", run, "--max-steps", "6", "--stop-at-step", "3", here=True))
    moved = tmp_path / "elsewhere"
    os.rename(data, moved)
    resumed = check(train(f"imagefolder:{moved}", run, "--max-steps", "6", "--resume", "auto", here=True))
    assert "not exact" not in resumed.stdout + resumed.stderr
    os.rename(moved, data)
    check(train(f"imagefolder:{data}", whole, "--max-steps", "6", here=True))
    assert_same_weights(run, whole)
    (data / "a" / "new.png").write_bytes((data / "a" / "a_000.png").read_bytes())
    refused = train(f"imagefolder:{data}", run, "--max-steps", "8", "--extend", "--resume", "auto")
    assert_one_line_error(refused, "1 file(s) added (a/new.png)")
