"""The red-team round on the data layer (its reproductions r01..r20): each silent wrong answer it found, as a fast
test through ``build_dataset`` and ``identity.changes`` (a record compared with the data as it is now).

Every test fails on the code before the fix (``48001e1``'s parent) and passes on it; the script-level promises
(a resume refused, a run with plots on odd names) are in tests/integration/test_data_redteam_runs.py.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
from checks import raises_user_error
from datafiles import age, write_hf_disk, write_image_folder
from helpers_shards import move_arrow_labels, png, write_parquet, write_shards

from accel_train.data import DataConfig, build_dataset, identity


def _build(dataset: str, **kw):
    return build_dataset(DataConfig(dataset=dataset, **kw))


def _recorded(splits) -> tuple[dict, dict]:
    """The identity's record as config.yaml and a checkpoint hold it (JSON), and its file lists (run folder)."""
    ident = identity.of_splits(splits)
    return json.loads(json.dumps(ident.record())), {n: p.files for n, p in ident.parts.items() if p.files}


def _now(dataset: str, **kw):
    return identity.of_splits(_build(dataset, **kw))


def _ppm_folder(root: Path, classes=("cat", "dog"), per_class: int = 6) -> Path:
    """``root/<class>/<i>.ppm``: every file the same size (a PPM's header and pixels), a class colour each."""
    from PIL import Image

    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            value = 30 + 200 * c // max(1, len(classes) - 1)
            Image.new("RGB", (8, 8), (value, i * 10, 255 - value)).save(root / name / f"{i}.ppm")
    age(root)
    return root


def _keep_times(path: Path, write) -> None:
    """``write()`` a change to ``path``, then set its access and modification times back."""
    st = os.stat(path)
    write()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _later() -> None:
    """Past the file system's timestamp tick (a change time within it could look unchanged)."""
    time.sleep(0.05)


# --------------------------------------------------------------------------- r01, r02: swapped in place


def test_r01_a_same_size_content_swap_with_times_restored_is_named_as_rewritten_in_place(tmp_path):
    root = _ppm_folder(tmp_path / "f")
    record, files = _recorded(_build(f"imagefolder:{root}"))
    a, b = root / "cat" / "0.ppm", root / "dog" / "0.ppm"
    da, db = a.read_bytes(), b.read_bytes()
    assert len(da) == len(db) and da != db
    _later()
    _keep_times(a, lambda: a.write_bytes(db))
    _keep_times(b, lambda: b.write_bytes(da))
    now = _now(f"imagefolder:{root}")
    change = identity.changes(record, now, files)
    assert change is not None, "a content swap with sizes and times kept went unnoticed"
    assert "2 file(s) rewritten or replaced in place" in change, change
    assert "cat/0.ppm" in change and "dog/0.ppm" in change, change
    without_list = identity.changes(record, now)  # the run folder's file list missing: still named
    assert without_list is not None and "rewritten or replaced in place" in without_list, without_list


def test_r02_two_class_folders_swapped_are_named(tmp_path):
    root = _ppm_folder(tmp_path / "f")
    record, files = _recorded(_build(f"imagefolder:{root}"))
    os.rename(root / "cat", root / "tmp")
    os.rename(root / "dog", root / "cat")
    os.rename(root / "tmp", root / "dog")
    change = identity.changes(record, _now(f"imagefolder:{root}"), files)
    assert change is not None, "two class folders swapped (the labels inverted) went unnoticed"
    assert "12 file(s) rewritten or replaced in place" in change and "cat/0.ppm" in change, change


# --------------------------------------------------------------------------- r03, r04: labels rewritten in place


def _plain_parquet(path: Path, labels: list[int]) -> Path:
    """A shard whose size does not depend on its label values (no compression, dictionary or statistics)."""
    import pyarrow.parquet as pq

    images = [png(np.full((8, 8, 3), 40 * (i % 5), np.uint8)) for i in range(len(labels))]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(write_parquet(None, images, labels), path, compression="none", use_dictionary=False,
                   write_statistics=False)  # fmt: skip
    return path


def test_r03_a_shard_rewritten_in_place_with_every_label_changed_is_named(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "d"
    shard = _plain_parquet(root / "train-00000-of-00001.parquet", [i % 3 for i in range(24)])
    _plain_parquet(root / "test-00000-of-00001.parquet", [i % 3 for i in range(9)])
    age(root)
    splits = _build(f"shards:{root}")
    assert splits.train.labels().tolist() == [i % 3 for i in range(24)]
    record, _ = _recorded(splits)
    size = shard.stat().st_size
    table = pq.read_table(shard)
    moved = pa.array([(v + 1) % 3 for v in table.column("label").to_pylist()], pa.int64())  # as many per class
    table = table.set_column(table.schema.get_field_index("label"), table.schema.field("label"), moved)
    _later()
    _keep_times(shard, lambda: pq.write_table(table, shard, compression="none", use_dictionary=False,
                                              write_statistics=False))  # fmt: skip
    assert shard.stat().st_size == size
    again = _build(f"shards:{root}")
    assert again.train.labels().tolist() == [(i + 1) % 3 for i in range(24)]  # read as they are now
    change = identity.changes(record, identity.of_splits(again))
    assert change is not None, "every label of a shard changed, its size and time kept: went unnoticed"
    assert change.startswith("train:") and "rows with other labels" in change, change


def test_r04_hf_arrow_files_edited_with_state_json_untouched_are_named(tmp_path):

    path = write_hf_disk(tmp_path / "hfdisk", n=12, splits=True, size=8)
    record, _ = _recorded(_build(f"hf:{path}"))
    (arrow,) = sorted((path / "train").glob("*.arrow"))
    move_arrow_labels(arrow)
    change = identity.changes(record, _now(f"hf:{path}"))
    assert change is not None, "an hf dataset's Arrow file rewritten (labels moved) went unnoticed"
    assert change.startswith("train:"), change
    assert "rows with other labels" in change or "Arrow files changed" in change, change


def test_r04_hf_labels_edited_with_size_and_time_kept_are_named_on_another_machine_too(tmp_path):
    """Where inodes and change times cannot be compared (a copy on another machine), the rows' labels still are:
    an Arrow file rewritten with other labels, its size and modification time kept, is named."""

    path = write_hf_disk(tmp_path / "hfdisk", n=12, splits=True, size=8)
    record, _ = _recorded(_build(f"hf:{path}"))
    for part in record["parts"].values():
        part["local"]["host"] = "another-machine"
    (arrow,) = sorted((path / "train").glob("*.arrow"))
    st = os.stat(arrow)
    move_arrow_labels(arrow)
    os.utime(arrow, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(arrow).st_size == st.st_size
    change = identity.changes(record, _now(f"hf:{path}"))
    assert change is not None and "rows with other labels" in change and "Arrow files changed" not in change, change


# --------------------------------------------------------------------------- r06: hf ClassLabel orders


def _hf_named(path: Path, train_names: list[str], test_names: list[str], test_kinds: list[str]) -> Path:
    """A DatasetDict: train [cat, dog] x 6 in ``train_names``' codes, test ``test_kinds`` in ``test_names``';
    cat images dark, the others bright."""
    import datasets
    from PIL import Image

    def make(kinds: list[str], names: list[str]) -> datasets.Dataset:
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
        pics = [Image.fromarray(np.full((8, 8, 3), 20 if k == "cat" else 235, np.uint8)) for k in kinds]
        return datasets.Dataset.from_dict({"image": pics, "label": [names.index(k) for k in kinds]}, features=features)

    data = {"train": make(["cat", "dog"] * 6, train_names), "test": make(test_kinds, test_names)}
    datasets.DatasetDict(data).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("held", ["in_memory", "lazy"])
def test_r06_an_hf_test_classlabel_in_another_order_is_read_by_name(tmp_path, monkeypatch, held):
    from accel_train.data import hf

    if held == "lazy":
        monkeypatch.setattr(hf, "MAX_IN_MEMORY_SAMPLES", 0)
    kinds = ["dog", "cat", "cat", "dog", "dog", "cat"]
    path = _hf_named(tmp_path / "hfdisk", ["cat", "dog"], ["dog", "cat"], kinds)
    splits = _build(f"hf:{path}")
    assert type(splits.test).__name__ == {"in_memory": "TensorImageDataset", "lazy": "LazyImageDataset"}[held]
    assert splits.info.class_names == ["cat", "dog"]
    pairs = [splits.test[i] for i in range(len(splits.test))]
    bright = ["dog" if float(image.float().mean()) > 127 else "cat" for image, _ in pairs]
    assert bright == kinds  # the rows are the ones written, in order
    assert [splits.info.class_names[label] for _, label in pairs] == kinds, "test labels read by position"


def test_r06_an_hf_test_class_train_lacks_is_refused(tmp_path):
    path = _hf_named(tmp_path / "hfdisk", ["cat", "dog"], ["dog", "horse"], ["dog", "horse", "dog"])
    raises_user_error(lambda: _build(f"hf:{path}"), "'horse'", "same ClassLabel names")


# --------------------------------------------------------------------------- r07: split folders in any case


def test_r07_an_uppercase_test_folder_is_the_test_split(tmp_path):
    root = tmp_path / "F"
    write_image_folder(root / "train", classes=("cat", "dog"), per_class=4, size=8)
    write_image_folder(root / "TEST", classes=("cat", "dog"), per_class=2, size=8)
    splits = _build(f"imagefolder:{root}")
    assert splits.info.class_names == ["cat", "dog"], "the split folders became the classes"
    assert (len(splits.train), len(splits.test)) == (8, 4)
    assert identity.of_splits(splits).parts["test"].summary["folder"] == "TEST/"


def test_r07_uppercase_test_shards_are_the_test_split(tmp_path):
    root = tmp_path / "S"
    write_shards(root / "train", shards=2, rows=12, size=8)
    (test_shard,) = write_shards(root / "TEST", shards=1, rows=9, size=8, seed=50)
    splits = _build(f"shards:{root}")
    assert splits.test.index.files == [test_shard], "TEST/ was not read: the test split held out of train/"
    assert (len(splits.train), len(splits.test)) == (24, 9)


# --------------------------------------------------------------------------- r08, r16, r17: one file, two places


def test_r08_a_test_folder_that_links_to_train_is_refused(tmp_path):
    root = tmp_path / "F"
    write_image_folder(root / "train", classes=("cat", "dog"), per_class=4, size=8)
    os.symlink(root / "train", root / "test", target_is_directory=True)
    raises_user_error(lambda: _build(f"imagefolder:{root}"), "in the training and the test split")


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_r16_a_file_linked_from_one_class_into_another_is_refused(tmp_path, link):
    root = write_image_folder(tmp_path / "F", classes=("cat", "dog"), per_class=4, size=8)
    source = root / "dog" / "dog_001.png"
    (os.symlink if link == "symlink" else os.link)(source, root / "cat" / "linked.png")
    message = raises_user_error(lambda: _build(f"imagefolder:{root}"), "two classes")
    assert "cat/linked.png" in message and "dog/dog_001.png" in message, message


def test_r17_a_class_named_like_a_split_inside_train_is_refused(tmp_path):
    root = tmp_path / "F"
    write_image_folder(root / "train", classes=("cat", "dog", "test"), per_class=4, size=8)
    write_image_folder(root / "test", classes=("cat", "dog"), per_class=2, size=8)
    raises_user_error(lambda: _build(f"imagefolder:{root}"), "'test'", "split folder")


# --------------------------------------------------------------------------- r09: training-* / test-* shards


def test_r09_training_and_test_shard_names_are_the_two_splits(tmp_path):
    root = tmp_path / "S"
    (train_shard,) = write_shards(root, shards=1, rows=24, size=8, prefix="training")
    (test_shard,) = write_shards(root, shards=1, rows=9, size=8, prefix="test", seed=50)
    splits = _build(f"shards:{root}")
    assert splits.train.index.files == [train_shard], "the test shards were pooled into training"
    assert splits.test.index.files == [test_shard]
    assert (len(splits.train), len(splits.test)) == (24, 9)


def test_r09_test_shards_without_training_shards_are_refused_not_pooled(tmp_path):
    root = tmp_path / "S"
    write_shards(root, shards=2, rows=12, size=8, prefix="test")
    raises_user_error(lambda: _build(f"shards:{root}"), "test-*", "train-*")


# --------------------------------------------------------------------------- r10, r11: tar .cls


def _tar(path: Path, samples: list[tuple[str, bytes]]) -> Path:
    """A WebDataset tar: ``KEY.png`` + ``KEY.cls`` (the bytes given) per sample."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, cls in samples:
            for name, payload in ((f"{key}.png", png(np.full((8, 8, 3), cls[0] % 256, np.uint8))), (f"{key}.cls", cls)):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return path


def test_r10_tar_labels_that_are_not_utf8_are_refused(tmp_path):
    labels = [b"caf\xe9", b"caf\xe8", b"dog"]  # Latin-1: decoded with replacement, the first two become one
    _tar(tmp_path / "d" / "shard-0.tar", [(f"k{k}_{i}", c) for k, c in enumerate(labels) for i in range(6)])
    raises_user_error(lambda: _build(f"shards:{tmp_path / 'd'}", val_split=0.25), "not UTF-8", "shard-0.tar")


def test_r11_tar_labels_numbers_in_one_shard_and_names_in_another_are_refused(tmp_path):
    for s, label in enumerate([lambda k: ("cat", "dog")[k].encode(), lambda k: str(k).encode()]):
        _tar(tmp_path / "d" / f"shard-{s}.tar", [(f"s{s}k{k}i{i}", label(k)) for k in (0, 1) for i in range(6)])
    raises_user_error(lambda: _build(f"shards:{tmp_path / 'd'}", val_split=0.25), "numbers in", "names in")


# --------------------------------------------------------------------------- r13: damaged shard facts


def test_r13_a_shard_cache_whose_header_facts_are_replaced_is_rebuilt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ACCEL_TRAIN_CACHE", str(cache))
    root = tmp_path / "d"
    write_shards(root, shards=2, rows=12, size=8)
    age(root)
    first = _build(f"shards:{root}", val_split=0.25)
    entries = sorted((cache / "shards").glob("*.json"))
    assert entries, f"nothing cached in {cache}"
    for p in entries:
        facts = json.loads(p.read_text())
        assert "headers" in facts, facts.keys()
        p.write_text(json.dumps(facts | {"headers": "garbage"}))
    again = _build(f"shards:{root}", val_split=0.25)  # the old code: TypeError from the facts
    assert again.info == first.info  # channels, size, classes, mean and std as the facts were
    assert all(json.loads(p.read_text())["headers"] != "garbage" for p in entries)  # made again


# --------------------------------------------------------------------------- r15, r19: notes


def test_r15_a_class_folder_beside_train_and_test_and_a_loose_image_are_named_in_one_line(tmp_path):
    root = write_image_folder(tmp_path / "F", classes=("cat", "dog"), per_class=4, size=8, with_splits=True)
    write_image_folder(root, classes=("horse",), per_class=4, size=8)
    shutil.copyfile(root / "train" / "cat" / "cat_000.png", root / "loose.png")
    splits = _build(f"imagefolder:{root}")
    assert splits.info.class_names == ["cat", "dog"] and (len(splits.train), len(splits.test)) == (8, 4)
    lines = [n for n in splits.extra["notes"] if "not read" in n]
    assert len(lines) == 1, splits.extra["notes"]
    assert "horse/" in lines[0] and "loose.png" in lines[0] and "\n" not in lines[0], lines[0]


def test_r15_shards_beside_a_train_folder_are_refused(tmp_path):
    root = tmp_path / "S"
    write_shards(root / "train", shards=2, rows=12, size=8)
    write_shards(root / "test", shards=1, rows=9, size=8, seed=50)
    (extra,) = write_shards(root, shards=1, rows=12, size=8, prefix="extra", seed=9)
    raises_user_error(lambda: _build(f"shards:{root}"), extra.name, "beside")


def test_r19_a_file_name_with_a_newline_keeps_the_note_on_one_line(tmp_path):
    root = write_image_folder(tmp_path / "F", classes=("cat", "dog"), per_class=4, size=8)
    (root / "cat" / "odd\nname.txt").write_text("x")
    notes = _build(f"imagefolder:{root}").extra["notes"]
    (line,) = [n for n in notes if "are not images" in n]
    assert "odd" in line and "name.txt" in line, line
    assert all("\n" not in n and "\r" not in n for n in notes), notes


# --------------------------------------------------------------------------- r20: a FIFO named as an image


def test_r20_a_fifo_named_like_an_image_is_refused_as_not_a_regular_file_without_opening_it(tmp_path):
    root = write_image_folder(tmp_path / "F", classes=("cat", "dog"), per_class=4, size=8)
    os.mkfifo(root / "cat" / "pipe.png")

    def hung(signum, frame):
        raise AssertionError("the build blocked on the FIFO: it was opened before it was checked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        raises_user_error(lambda: _build(f"imagefolder:{root}"), "pipe.png", "not a regular file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------- found by the tests' own check


def test_the_not_read_note_stays_one_line_whatever_the_names_hold(tmp_path):
    root = write_image_folder(tmp_path / "A", classes=("cat", "dog"), per_class=3, size=8, with_splits=True)
    write_image_folder(root, classes=("bad\nname",), per_class=2, size=8)
    (line,) = [n for n in _build(f"imagefolder:{root}").extra["notes"] if "not read" in n]
    assert "\n" not in line and "bad\\nname/" in line, line


def test_a_tar_without_samples_beside_named_labels_is_not_a_kind_of_label(tmp_path):
    def tar(path, samples, extra=()):
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w") as tf:
            for key, cls in samples:
                for name, data in ((f"{key}.png", png(np.zeros((8, 8, 3), np.uint8))), (f"{key}.cls", cls)):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
            for name in extra:
                info = tarfile.TarInfo(name)
                info.size = 2
                tf.addfile(info, io.BytesIO(b"{}"))

    tar(tmp_path / "B" / "a.tar", [(f"k{i}", b"cat" if i % 2 else b"dog") for i in range(12)])
    tar(tmp_path / "B" / "b.tar", [], extra=["x.json"])
    splits = _build(f"shards:{tmp_path / 'B'}", val_split=0.25)
    assert splits.info.class_names == ["cat", "dog"] and len(splits.train) + len(splits.test) == 12


def test_one_file_twice_in_a_class_of_a_folder_split_by_val_split_is_refused(tmp_path):
    """Held out and trained on at once: a file hard-linked twice in one class can land on both sides."""
    root = write_image_folder(tmp_path / "f", classes=("cat", "dog"), per_class=6, size=8)
    os.link(root / "cat" / "cat_000.png", root / "cat" / "zz_copy.png")
    raises_user_error(lambda: _build(f"imagefolder:{root}", val_split=0.5), "in two places", "cat/")


def test_hub_named_shards_of_other_splits_are_named_not_dropped(tmp_path):
    for prefix in ("train", "testing", "extra"):
        _plain_parquet(tmp_path / "d" / f"{prefix}-00000-of-00001.parquet", [i % 2 for i in range(8)])
    splits = _build(f"shards:{tmp_path / 'd'}")
    assert splits.extra["split"] == "files" and len(splits.test) == 8  # testing-* is the test split
    (line,) = [n for n in splits.extra["notes"] if "other splits" in n]
    assert "'extra-00000-of-00001.parquet'" in line, line


def test_r05_hf_on_a_folder_of_data_files_rewritten_in_place_reads_them_as_they_are(tmp_path):
    """datasets keys its Arrow copy of a folder of Parquet files by path and modification time: a file rewritten
    with its time set back was read as the old one (a fresh run trained on stale labels)."""
    path = _plain_parquet(tmp_path / "d" / "train-00000-of-00001.parquet", [0] * 6 + [1] * 6)
    age(tmp_path / "d")
    first = _build(f"hf:{tmp_path / 'd'}")
    st = os.stat(path)
    _plain_parquet(path, [1] * 6 + [0] * 6)  # every label flipped, the same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size
    again = _build(f"hf:{tmp_path / 'd'}")
    rows = [s.extra["identity"].parts["train"].summary["row_labels"] for s in (first, again)]  # every row's label
    assert rows[0] != rows[1], "the second build read the stale Arrow copy datasets had made"
