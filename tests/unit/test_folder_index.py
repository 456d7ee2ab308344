"""accel_train/data/folder_index.py and index_cache.py: an image folder indexed like torchvision's ImageFolder,
once, then read from the cache until a folder in it changes; what needs a sample reads a sample, recorded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from checks import raises_user_error
from datafiles import age, undecodable_png, write_image_folder

from accel_train.data import DataConfig, build_dataset, folder, folder_index, images, index_cache
from accel_train.data.folder_index import index_folder

EXT = folder.IMAGE_EXTENSIONS


def _messy_folder(root: Path) -> Path:
    write_image_folder(root, classes=("b", "a", "c c"), per_class=3, size=8)
    (root / "a" / "nested" / "deeper").mkdir(parents=True)
    (root / "a" / "a_000.png").rename(root / "a" / "nested" / "deeper" / "x.PNG")
    (root / "b" / ".hidden.png").write_bytes((root / "b" / "b_000.png").read_bytes())
    (root / "b" / "notes.txt").write_text("not an image")
    (root / ".cache").mkdir()
    return root


def test_index_is_torchvisions_imagefolder(tmp_path):
    """Classes, files and labels as torchvision finds them (nested folders walked, non-image files skipped,
    extensions in any case), except hidden files and folders, which we skip as ``datasets`` did."""
    from torchvision.datasets import ImageFolder

    root = _messy_folder(tmp_path / "imgs")
    index = index_folder(root, EXT)
    theirs = ImageFolder(str(root), allow_empty=True)
    assert index.classes == [c for c in theirs.classes if not c.startswith(".")] == ["a", "b", "c c"]
    ours = [(str(index.path(i)), index.classes[index.labels[i]]) for i in range(len(index))]
    visible = [(p, theirs.classes[y]) for p, y in theirs.samples if "/." not in p.removeprefix(str(root))]
    assert sorted(ours) == sorted(visible) and len(visible) == len(theirs.samples) - 1
    assert index.labels.tolist() == sorted(index.labels.tolist())  # class by class
    assert "b/.hidden.png" not in {index.relpath(i) for i in range(len(index))}
    per_file = (index.blob.nbytes + index.offsets.nbytes + index.labels.nbytes) / len(index)
    assert per_file < 40, per_file  # relative paths back to back: ~12 bytes of name + 16 of offset and label


def test_the_file_list_is_listed_at_every_launch_and_the_facts_follow_it(tmp_path):
    """The index is what the folder holds now; its cache entry (the facts read from images) is keyed by the file
    list: a file added under a folder whose time is then restored (rsync -a, tar x, cp -p) is seen."""
    root = write_image_folder(tmp_path / "imgs", per_class=4, size=8)
    age(root)
    first = index_folder(root, EXT)
    assert first.cache is not None and first.cache.stored
    again = index_folder(root, EXT)
    assert again.cache.path == first.cache.path and again.digest() == first.digest()
    folder_time = os.stat(root / "b").st_mtime_ns
    (root / "b" / "new.png").write_bytes((root / "b" / "b_000.png").read_bytes())
    os.utime(root / "b", ns=(folder_time, folder_time))  # the folder's time restored
    age(root / "b" / "new.png")
    changed = index_folder(root, EXT)
    assert len(changed) == len(first) + 1 and changed.cache.path != first.cache.path


def test_a_file_overwritten_in_place_is_another_cache_key(tmp_path):
    """Same path, same size, the modification time set back: the change time still differs, so facts recorded
    for the old file are never read for the new one."""
    root = write_image_folder(tmp_path / "imgs", per_class=4, size=8)
    age(root)
    target = root / "a" / "a_000.png"
    before = os.stat(target)
    first = index_folder(root, EXT)
    data = target.read_bytes()
    target.write_bytes(data[::-1][::-1])  # same bytes, rewritten
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    again = index_folder(root, EXT)
    assert again.digest() == first.digest()  # what ranks compare: same paths and sizes
    assert again.cache.path != first.cache.path


def test_a_recent_change_is_not_cached(tmp_path):
    root = write_image_folder(tmp_path / "imgs", per_class=2, size=8)  # written just now
    index = index_folder(root, EXT)
    assert not index.cache.stored


def test_a_damaged_cache_file_is_rebuilt_with_one_line(tmp_path):
    root = write_image_folder(tmp_path / "imgs", per_class=4, size=8)
    age(root)
    cfg = DataConfig(dataset=f"imagefolder:{root}")
    first = build_dataset(cfg)
    path = index_folder(root, EXT).cache.path.with_suffix(".json")
    for damage in ("[1, 2]", '{"key": 3', ""):
        path.write_text(damage)
        again = build_dataset(cfg)
        assert again.info == first.info
        notes = [n for n in again.extra["notes"] if str(path) in n]
        assert len(notes) == 1 and "could not be read" in notes[0], again.extra["notes"]
    assert build_dataset(cfg).extra["notes"] == []  # rebuilt: read again


def test_a_cache_that_cannot_be_written_costs_only_the_scan(tmp_path, monkeypatch):
    monkeypatch.setenv(index_cache.CACHE_ENV, str(tmp_path / "file-not-folder"))
    (tmp_path / "file-not-folder").write_text("")
    root = write_image_folder(tmp_path / "imgs", per_class=2, size=8)
    age(root)
    index = index_folder(root, EXT)
    assert len(index) == 6 and not index.cache.stored


def test_a_cached_launch_opens_no_image_before_training(tmp_path, monkeypatch):
    """Sizes, modes and mean/std come from the first launch's record: a resume or another rank opens nothing."""
    root = write_image_folder(tmp_path / "imgs", per_class=6, size=12, with_splits=True)
    age(root)
    cfg = DataConfig(dataset=f"imagefolder:{root}")
    first = build_dataset(cfg)

    def refuse(*_a, **_k):
        raise AssertionError("an image was opened")

    monkeypatch.setattr(images, "open_image", refuse)
    monkeypatch.setattr(folder_index, "decode_file", refuse)
    again = build_dataset(cfg)
    assert again.info == first.info
    assert again.extra["index_digest"] == first.extra["index_digest"]


def test_a_large_folder_reads_a_sample_and_names_a_bad_image_when_it_is_read(tmp_path, monkeypatch):
    root = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=20, size=8)
    bad = undecodable_png(root / "b" / "b_013.png")  # not among the evenly spaced sample of 4 headers
    monkeypatch.setattr(folder, "FULL_CHECK_MAX", 10)
    monkeypatch.setattr(folder, "SIZE_SAMPLE", 4)
    opened = []
    real_open = images.open_image
    monkeypatch.setattr(images, "open_image", lambda path: opened.append(path) or real_open(path))
    splits = build_dataset(DataConfig(dataset=f"imagefolder:{root}", val_split=0.25))
    assert len(opened) == 4  # headers of the sample only (decoding for mean/std goes through folder_index)
    data = splits.train if bad in {splits.train.path(i) for i in range(len(splits.train))} else splits.test
    at = next(i for i in range(len(data)) if data.path(i) == bad)
    raises_user_error(lambda: data[at], f"cannot decode image {bad}", "remove or replace it")


def test_a_small_folder_names_every_bad_image_before_training(tmp_path):
    root = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=5, size=8)
    (root / "a" / "a_001.png").write_bytes(b"")
    (root / "b" / "b_002.png").write_bytes(b"not a png")
    raises_user_error(
        lambda: build_dataset(DataConfig(dataset=f"imagefolder:{root}")),
        "2 of 10 image files cannot be read", "a/a_001.png", "b/b_002.png",
    )  # fmt: skip


def test_empty_class_folders_are_left_out(tmp_path):
    root = write_image_folder(tmp_path / "imgs", classes=("a", "c"), per_class=4, size=8)
    (root / "b").mkdir()
    splits = build_dataset(DataConfig(dataset=f"imagefolder:{root}"))
    assert splits.info.class_names == ["a", "c"]
    labels = torch.cat([splits.train.labels(), splits.test.labels()])
    assert sorted(labels.unique().tolist()) == [0, 1]


def test_a_directory_loop_is_refused(tmp_path):
    root = write_image_folder(tmp_path / "imgs", per_class=2, size=8)
    os.symlink(root, root / "a" / "loop")
    raises_user_error(lambda: index_folder(root, EXT), "directory loop", "remove the link")


@pytest.mark.parametrize("n", [30, 1000])
def test_every_index_of_the_same_folder_is_the_same(tmp_path, n):
    """What ranks compare (identity.check_same_data): the same files give the same digest; one file more does not."""
    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(n // 2):
            (root / c / f"{i}.png").write_bytes(b"")
    one, two = index_folder(root, EXT), index_folder(root, EXT)
    assert one.digest() == two.digest()
    assert np.array_equal(one.blob, two.blob)
    (root / "b" / "extra.png").write_bytes(b"")
    assert index_folder(root, EXT).digest() != one.digest()


def test_ranks_that_index_other_files_are_refused(tmp_path, monkeypatch):
    """identity.check_same_data: what the ranks gathered must agree, the file list (one folder copy per machine that
    differs would train each rank on other data) and what was read from it (channels, size, classes, mean/std:
    a file that differs in content, or a cache that did, would fail inside DDP); a lone process gathers nothing."""
    from types import SimpleNamespace

    import accelerate.utils

    from accel_train.build import check_same_data

    root = write_image_folder(tmp_path / "imgs", per_class=5, size=8)
    splits = build_dataset(DataConfig(dataset=f"imagefolder:{root}"))
    gathered = []
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda obj: gathered.append(obj) or [*obj, *others])
    others = []
    check_same_data(SimpleNamespace(num_processes=2), splits)  # (each rank's own, as gathered, below)
    (mine,) = gathered[0]
    assert mine[0] == splits.extra["index_digest"]
    others = [mine]
    check_same_data(SimpleNamespace(num_processes=2), splits)
    others = [mine, ("0000-1111", mine[1])]
    raises_user_error(
        lambda: check_same_data(SimpleNamespace(num_processes=3), splits),
        "process(es) 2 see other files than process 0", "same copy of the data",
    )  # fmt: skip
    others = [(mine[0], mine[1].replace("8,", "16,", 1))]
    raises_user_error(
        lambda: check_same_data(SimpleNamespace(num_processes=2), splits),
        "process(es) 1 read other images than process 0", "same copy of the data",
    )  # fmt: skip
    gathered.clear()
    check_same_data(SimpleNamespace(num_processes=1), splits)
    assert gathered == []
