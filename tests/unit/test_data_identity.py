"""accel_train/data/identity.py and what the data builders record: a run's data as a record two launches compare,
what a change is called, and the bugs a red-team planted in the data code (each caught here: the shard cache key
without the label column, eval on shards scoring training rows, test shards labelled by the training map)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from checks import raises_user_error
from datafiles import age, write_image_folder
from helpers_shards import png, write_parquet

from accel_train.data import DataConfig, build_dataset, identity
from accel_train.data.shards import build_shards_eval


def _folder(tmp_path: Path, **kw) -> Path:
    root = write_image_folder(tmp_path / "imgs", per_class=6, size=8, **kw)
    age(root)
    return root


def _ident(root: Path):
    return identity.of_splits(build_dataset(DataConfig(dataset=f"imagefolder:{root}")))


def test_the_same_folder_gives_the_same_record_and_a_change_is_named(tmp_path):
    root = _folder(tmp_path)
    first = _ident(root)
    record = json.loads(json.dumps(first.record()))  # as config.yaml and a checkpoint hold it
    assert record["kind"] == "imagefolder" and record["parts"]["train"]["files"] == 18
    assert identity.changes(record, _ident(root)) is None
    files = {"train": first.parts["train"].files}
    (root / "a" / "new.png").write_bytes((root / "a" / "a_000.png").read_bytes())
    (root / "b" / "b_001.png").unlink()
    from PIL import Image

    Image.new("RGB", (12, 12), (9, 9, 9)).save(root / "c" / "c_002.png")  # other bytes, other size
    t = os.stat(root / "c" / "c_003.png").st_mtime_ns
    os.utime(root / "c" / "c_003.png", ns=(t, t + 10**9))  # only its time
    change = identity.changes(record, _ident(root), files)
    assert "1 file(s) added (a/new.png)" in change and "1 removed (b/b_001.png)" in change, change
    assert "1 changed (c/c_002.png)" in change and "1 with another modification time" in change, change
    no_list = identity.changes(record, _ident(root))  # the run folder's file list missing: the counts
    assert "18 files then, 18 now" in no_list, no_list


def test_a_modification_time_alone_is_a_change(tmp_path):
    root = _folder(tmp_path)
    first = _ident(root)
    t = os.stat(root / "b" / "b_003.png").st_mtime_ns
    os.utime(root / "b" / "b_003.png", ns=(t, t - 10**9))
    change = identity.changes(first.record(), _ident(root), {"train": first.parts["train"].files})
    assert change == "train: 1 with another modification time, same size (b/b_003.png)", change


def test_class_folders_beside_a_test_folder_are_the_training_split(tmp_path):
    """F/{a,b}/ beside F/test/{a,b}/: the classes are a and b, test/ is the test split, never a class 'test'."""
    root = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=4, size=8)
    write_image_folder(root / "test", classes=("a", "b"), per_class=2, size=8)
    splits = build_dataset(DataConfig(dataset=f"imagefolder:{root}"))
    assert splits.info.class_names == ["a", "b"] and (len(splits.train), len(splits.test)) == (8, 4)
    assert any("training split" in n for n in splits.extra["notes"])
    for before, name in (("test", "val"), ("val", "valid"), ("valid", "validation")):
        os.rename(root / before, root / name)
        assert build_dataset(DataConfig(dataset=f"imagefolder:{root}")).info.class_names == ["a", "b"], name


def test_a_class_folder_linked_into_another_is_refused(tmp_path):
    root = write_image_folder(tmp_path / "imgs", classes=("a", "b"), per_class=4, size=8)
    os.symlink(root / "b", root / "a" / "more")
    raises_user_error(
        lambda: build_dataset(DataConfig(dataset=f"imagefolder:{root}")),
        "'a/more' and 'b'",
        "one folder",
        "two classes",
    )


def test_a_split_folder_records_both_parts_and_names_a_new_class(tmp_path):
    root = write_image_folder(tmp_path / "imgs", per_class=6, size=8, with_splits=True)
    first = _ident(root)
    assert set(first.parts) == {"train", "test"} and first.parts["test"].summary["folder"] == "test/"
    record = first.record()
    (root / "test" / "d").mkdir()
    (root / "test" / "d" / "x.png").write_bytes((root / "test" / "a").iterdir().__next__().read_bytes())
    with pytest.raises(Exception, match="does not know"):  # a test class train lacks: refused by the builder
        _ident(root)
    (root / "train" / "d").mkdir()
    (root / "train" / "d" / "y.png").write_bytes((root / "test" / "d" / "x.png").read_bytes())
    (root / "train" / "d" / "z.png").write_bytes((root / "test" / "d" / "x.png").read_bytes())
    change = identity.changes(record, _ident(root), {n: p.files for n, p in first.parts.items()})
    assert "train: 2 file(s) added (train/d/y.png, train/d/z.png); new class(es) d" in change, change
    assert "test: 1 file(s) added (test/d/x.png)" in change, change


def test_in_memory_data_is_hashed(tmp_path):
    import torch

    from accel_train.data.base import DatasetInfo, DataSplits

    x, y = torch.zeros(10, 1, 4, 4, dtype=torch.uint8), torch.arange(10) % 2
    info = DatasetInfo("t", 2, 1, 4, ["0", "1"], (0.5,), (0.5,))
    one = identity.of_splits(DataSplits.of_tensors((x, y), (x, y), info))
    x2 = x.clone()
    x2[3, 0, 1, 1] = 1
    two = identity.of_splits(DataSplits.of_tensors((x2, y), (x, y), info))
    assert one.kind == "tensors" and identity.changes(one.record(), one) is None
    assert identity.changes(one.record(), two).startswith("train: 10 rows then, 10 now")
    assert identity.of_splits(DataSplits.of_tensors((x, y), (x, y), info)).digest == one.digest


# --------------------------------------------------------------------------- shards


def _shard(path: Path, labels: list, names: list[str] | None, extra: dict | None = None) -> Path:
    """A Parquet shard of ``labels`` (ClassLabel ``names`` when given), each image black or white by its class
    name (``names[label]`` ends with 'w': white), and ``extra`` columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def pixel(label):
        name = names[label] if names else str(label)
        return np.full((8, 8, 3), 255 if name.endswith("w") else 0, np.uint8)

    table = write_parquet(None, [png(pixel(v)) for v in labels], labels, class_label=False)
    for name, values in (extra or {}).items():
        table = table.append_column(name, pa.array(values))
    if names is not None:
        features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
        table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=8)
    return path


def test_the_shard_cache_is_keyed_by_the_label_column(tmp_path):
    """The same shards read by two label columns give each column's labels (a cache key without the column gave
    the first column's labels to the second)."""
    labels = [i % 2 for i in range(24)]
    _shard(tmp_path / "d" / "data.parquet", labels, None, {"other": [1 - v for v in labels]})
    age(tmp_path / "d")
    by_label = build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd'}", val_split=0.25))
    by_other = build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd'}", val_split=0.25, label_column="other"))
    assert by_label.train.index.cache.stored
    assert by_label.train.index.labels.tolist() == labels
    assert by_other.train.index.labels.tolist() == [1 - v for v in labels]


def test_eval_on_flat_shards_scores_the_rows_training_held_out(tmp_path):
    """--val-split 0.25 holds out a quarter: eval.py's held-out part is exactly those rows, not the others."""
    labels = [i % 3 for i in range(48)]
    _shard(tmp_path / "d" / "data.parquet", labels, None)
    cfg = DataConfig(dataset=f"shards:{tmp_path / 'd'}", val_split=0.25, seed=5)
    trained = build_dataset(cfg)
    scored = build_shards_eval(cfg, str(tmp_path / "d"), True, 3).test
    assert len(scored) == len(trained.test) == 12
    assert sorted(scored.rows.tolist()) == sorted(trained.test.rows.tolist())
    assert scored.labels().tolist() == trained.test.labels().tolist()


def test_test_shards_are_labelled_by_their_own_classlabel_names(tmp_path):
    """Train lists ClassLabel names [bw, aw, c_b], test the same names in another order: every test row keeps its
    name (white images of 'aw' are 'aw' in both), through the run's data and eval.py's."""
    train_names, test_names = ["bw", "aw", "c_b"], ["c_b", "aw", "bw"]
    _shard(tmp_path / "d" / "train" / "a.parquet", [i % 3 for i in range(24)], train_names)
    _shard(tmp_path / "d" / "test" / "a.parquet", [i % 2 for i in range(12)], test_names)  # c_b and aw only
    splits = build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd'}"))
    assert splits.info.class_names == train_names
    got = [splits.info.class_names[v] for v in splits.test.labels().tolist()]
    assert got == [test_names[i % 2] for i in range(12)]
    scored = build_shards_eval(DataConfig(dataset=f"shards:{tmp_path / 'd'}"), str(tmp_path / "d"), False, 3)
    assert [train_names[v] for v in scored.test.labels().tolist()] == got
    images, _ = splits.test.__getitems__([0, 1, 2])
    white = [bool(img.float().mean() > 127) for img in images]
    assert white == [n.endswith("w") for n in got[:3]]  # the pixels agree with the names


def test_train_shards_that_list_names_in_other_orders_are_matched_by_name(tmp_path):
    _shard(tmp_path / "d" / "train" / "a.parquet", [0, 1] * 8, ["xw", "y_b"])
    _shard(tmp_path / "d" / "train" / "b.parquet", [0, 1] * 8, ["y_b", "xw"])
    _shard(tmp_path / "d" / "test" / "a.parquet", [0, 1] * 4, ["xw", "y_b"])
    splits = build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd'}"))
    labels = splits.train.labels().tolist()
    assert labels == [0, 1] * 8 + [1, 0] * 8


def test_shards_with_and_without_classlabel_names_are_refused(tmp_path):
    _shard(tmp_path / "d" / "train" / "a.parquet", [0, 1] * 8, ["x", "y"])
    _shard(tmp_path / "d" / "train" / "b.parquet", [0, 1] * 8, None)
    raises_user_error(
        lambda: build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd' / 'train'}")),
        "has no ClassLabel names", "matched by name",
    )  # fmt: skip


def test_a_test_class_train_does_not_name_is_refused(tmp_path):
    _shard(tmp_path / "d" / "train" / "a.parquet", [0, 1] * 8, ["x", "y"])
    _shard(tmp_path / "d" / "test" / "a.parquet", [0, 1] * 4, ["x", "z"])
    raises_user_error(
        lambda: build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd'}")), "test label(s) 'z'", "same class names"
    )


def test_shards_record_each_shard_and_name_an_added_one(tmp_path):
    root = tmp_path / "d"
    _shard(root / "a.parquet", [i % 2 for i in range(16)], ["xw", "y_b"])
    first = identity.of_splits(build_dataset(DataConfig(dataset=f"shards:{root}")))
    record = json.loads(json.dumps(first.record()))
    assert [s[0] for s in record["parts"]["train"]["shards"]] == ["a.parquet"]
    _shard(root / "b.parquet", [i % 2 for i in range(16)], ["xw", "y_b"])
    change = identity.changes(record, identity.of_splits(build_dataset(DataConfig(dataset=f"shards:{root}"))))
    assert "shard(s) added (b.parquet)" in change and "16 rows then, 32 now" in change, change


def test_tar_keys_with_dots_of_their_own_are_samples_and_other_members_are_counted(tmp_path):
    """``img.001.png`` + ``img.001.cls`` is one sample (it was silently dropped: WebDataset's first-dot rule read
    the key ``img`` with the extensions ``001.png``/``001.cls``); a ``.json`` beside it is named in one line."""
    import io
    import tarfile

    from helpers_shards import write_tar

    images = [png(np.full((8, 8, 3), 255 * (i % 2), np.uint8)) for i in range(16)]
    path = write_tar(tmp_path / "d" / "a.tar", images, ["w" if i % 2 else "b" for i in range(16)],
                     keys=[f"img.{i:03d}" for i in range(16)])  # fmt: skip
    with tarfile.open(path, "a") as tar:
        info = tarfile.TarInfo("img.000.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    splits = build_dataset(DataConfig(dataset=f"shards:{tmp_path / 'd'}", val_split=0.25))
    assert len(splits.train) + len(splits.test) == 16 and splits.info.class_names == ["b", "w"]
    (line,) = [n for n in splits.extra["notes"] if "tar member" in n]
    assert "1 tar member(s)" in line and "1 .json" in line, line
