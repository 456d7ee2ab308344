"""accel_train/data/shards.py and shard_index.py: Parquet and WebDataset tar shards as a map-style dataset, indexed
once (cached), read where the samples lie, in an order that is a pure function of (seed, epoch) and keeps reads
local; the loader's global batches the same on 1 and 2 processes; one-line errors naming the shard."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from checks import raises_user_error
from datafiles import _colour_images, age, undecodable_png
from helpers_shards import CLASSES, png, shard_set, write_parquet, write_shards, write_tar

from accel_train.data import DataConfig, build_dataset, shard_index, shards
from accel_train.data.pipeline import make_loader


def _build(root: Path, **cfg):
    return build_dataset(DataConfig(dataset=f"shards:{root}", **cfg))


@pytest.mark.parametrize("kind", ["parquet", "arrow", "tar"])
@pytest.mark.parametrize("layout", ["folders", "hub", "flat"])
def test_layouts_splits_classes_and_pixels(tmp_path, kind, layout):
    """train/ + test/, Hub file names, or one set held out by --val-split; every sample is its PNG's pixels."""
    root = shard_set(tmp_path / "d", kind, layout)
    splits = _build(root, val_split=0.25, seed=3)
    info = splits.info
    expect_names = sorted(CLASSES) if kind == "tar" else list(CLASSES)  # ClassLabel names, else sorted values
    assert info.class_names == expect_names and (info.in_channels, info.image_size) == (3, 8)
    assert splits.extra["split"] == {"folders": "folders", "hub": "files", "flat": "stratified"}[layout]
    if layout == "flat":
        assert (len(splits.train), len(splits.test)) == (72, 24)
        assert not set(splits.train.rows) & set(splits.test.rows)
    else:
        assert (len(splits.train), len(splits.test)) == (96, 12)
    ds = splits.train
    bounds, sizes = ds.index.blocks(shards.BLOCK_ROWS)  # what the windows weigh: the encoded images' bytes
    encoded = sum(len(shards._Reader(ds.index).read(r)) for r in range(len(ds.index)))
    assert bounds[0] == 0 and bounds[-1] == len(ds.index) and (sizes > 0).all()
    assert encoded <= sizes.sum() + len(sizes) <= 1.5 * encoded + 2000
    for i in (0, 1, len(ds) - 1):
        row = int(ds.rows[i])
        shard, at = row // 24, row % 24
        labels = [(shard * 7 + j * 5 + j // 3) % 3 for j in range(24)]  # what helpers_shards wrote
        pixels = _colour_images(np.asarray(labels), 8, seed=shard)[at]
        image, label = ds[i]
        assert torch.equal(image, torch.from_numpy(pixels).permute(2, 0, 1))
        assert info.class_names[label] == CLASSES[labels[at]]


def test_hub_repository_layout_reads_its_data_folder(tmp_path):
    """A dataset repository as cloned from the Hub: README.md and data/train-*.parquet, data/test-*.parquet."""
    root = tmp_path / "repo"
    shard_set(root / "data", "parquet", "hub")
    (root / "README.md").write_text("a dataset card")
    splits = _build(root)
    assert (len(splits.train), len(splits.test), splits.extra["split"]) == (96, 12, "files")


def test_epoch_order_is_a_local_permutation_of_seed_and_epoch(tmp_path, monkeypatch):
    """A permutation from (seed, epoch) alone, in windows of blocks (here row groups of 8 rows) whose rows are
    shuffled together: a window closes at WINDOW_ROWS rows (here 32: 4 groups) or WINDOW_BYTES bytes."""
    root = shard_set(tmp_path / "d", "parquet", "folders", row_group=8)
    ds = _build(root).train
    monkeypatch.setattr(shards, "WINDOW_ROWS", 32)
    order = ds.epoch_order(7, 2)
    assert sorted(order.tolist()) == list(range(96))
    assert torch.equal(order, ds.epoch_order(7, 2))
    assert not torch.equal(order, ds.epoch_order(7, 3)) and not torch.equal(order, ds.epoch_order(8, 2))
    groups = [{ds.index.group_of(int(ds.rows[i])) for i in order[w : w + 32].tolist()} for w in range(0, 96, 32)]
    assert all(len(g) == 4 for g in groups), groups
    assert set().union(*groups) == set(range(12))
    starts = [ds.epoch_order(7, e)[0].item() for e in range(6)]
    assert len(set(starts)) > 1  # the windows are shuffled too, not only the rows in them
    monkeypatch.setattr(shards, "WINDOW_BYTES", 1)  # every block's images are more: one block a window
    order = ds.epoch_order(7, 2)
    groups = [{ds.index.group_of(int(ds.rows[i])) for i in order[w : w + 8].tolist()} for w in range(0, 96, 8)]
    assert all(len(g) == 1 for g in groups), groups


def test_loader_takes_the_order_and_two_ranks_share_each_global_batch(tmp_path):
    """The sampler yields epoch_order (cut to whole global batches); Accelerate's sharding of it over 2 ranks gives
    each global batch of 1 process split in two, without overlap, also after skipping batches (a resume)."""
    from accelerate.data_loader import BatchSamplerShard, SkipBatchSampler

    ds = _build(shard_set(tmp_path / "d", "tar", "flat"), val_split=0.25).train  # 72 rows: 4 global batches of 16
    one = make_loader(ds, 16, shuffle=True, seed=5, drop_to_multiple_of=16)
    one.batch_sampler.sampler.set_epoch(1)
    batches = list(one.batch_sampler)
    assert sum(batches, []) == ds.epoch_order(5, 1)[:64].tolist()
    two = make_loader(ds, 8, shuffle=True, seed=5, drop_to_multiple_of=16)
    two.batch_sampler.sampler.set_epoch(1)
    ranks = [list(BatchSamplerShard(two.batch_sampler, 2, r, split_batches=False)) for r in (0, 1)]
    assert [a + b for a, b in zip(*ranks, strict=True)] == batches
    assert not set(sum(ranks[0], [])) & set(sum(ranks[1], []))
    resumed = list(SkipBatchSampler(BatchSamplerShard(two.batch_sampler, 2, 1, split_batches=False), 2))
    assert resumed == ranks[1][2:]


def test_locality_reads_each_row_group_once_per_epoch(tmp_path, monkeypatch):
    """With room for a window's 4 row groups, an epoch in epoch_order reads each group once; randperm would read
    many more."""
    root = shard_set(tmp_path / "d", "parquet", "folders", row_group=8)
    ds = _build(root).train
    monkeypatch.setattr(shards, "WINDOW_ROWS", 32)  # windows of 4 groups
    reads = []
    real = shards._Reader._read_group
    monkeypatch.setattr(shards._Reader, "_read_group", lambda self, g: reads.append(g) or real(self, g))
    sizes = sorted(real(shards._Reader(ds.index), g).nbytes for g in range(12))
    monkeypatch.setattr(shards, "CACHE_BYTES", sum(sizes[-4:]))  # room for any 4 groups, not for 5
    ds._reader = None
    for start in range(0, 96, 16):
        ds.__getitems__(ds.epoch_order(1, 0)[start : start + 16].tolist())
    assert sorted(reads) == list(range(12))
    reads.clear()
    ds._reader = None
    shuffled = torch.randperm(96, generator=torch.Generator().manual_seed(0)).tolist()
    for start in range(0, 96, 16):
        ds.__getitems__(shuffled[start : start + 16])
    assert len(reads) > 24 and len(ds._reader.groups) <= 4


def test_index_is_cached_then_made_again_when_a_shard_changes(tmp_path, monkeypatch):
    """A second build (a resume, another rank) reads the index, sizes and statistics from the cache without
    reading a shard; a rewritten shard is indexed again."""
    root = shard_set(tmp_path / "d", "tar", "flat")
    age(root)
    first = _build(root)
    assert first.train.index.cache.stored

    def no_reading(*_a, **_k):
        raise AssertionError("read a shard")

    monkeypatch.setattr(shard_index, "_index_tar", no_reading)
    monkeypatch.setattr(shards._Reader, "read", no_reading)
    again = _build(root)
    assert (again.info.mean, again.info.std) == (first.info.mean, first.info.std)
    assert torch.equal(again.train.labels(), first.train.labels())
    write_shards(root, "tar", shards=1, rows=10, seed=9)  # part-00000-of-00001.tar: a new shard
    with pytest.raises(AssertionError, match="read a shard"):
        _build(root)


def test_parquet_binary_image_column_and_string_labels(tmp_path):
    """Plain pyarrow files: encoded bytes in a binary column, labels as strings (class names: the sorted values)."""
    images = [png(a) for a in _colour_images(np.arange(12) % 3, 8, seed=1)]
    names = ["cat", "dog", "ant"] * 4
    write_parquet(tmp_path / "d" / "a.parquet", images, names, struct=False, class_label=False, row_group=5)
    write_parquet(tmp_path / "d" / "b.parquet", images, names, struct=False, class_label=False, row_group=5)
    splits = _build(tmp_path / "d", val_split=0.25)
    assert splits.info.class_names == ["ant", "cat", "dog"]
    ds = splits.train
    assert [splits.info.class_names[int(v)] for v in ds.labels()] == [names[r % 12] for r in ds.rows]


def test_undecodable_image_names_shard_and_row(tmp_path):
    """Bytes that are no image, or pixels that do not decode: one line naming the shard and the row (or member),
    from the build (which reads a sample) or from the batch that first reads it."""
    import pyarrow.parquet as pq

    root = tmp_path / "d"
    files = write_shards(root, "parquet", shards=2, rows=6)
    splits = _build(root, val_split=0.25)
    ds = splits.train if 10 in splits.train.rows else splits.test
    at = int(np.flatnonzero(ds.rows == 10)[0])  # shard 1 row 4 is index row 6 + 4
    table = pq.read_table(files[1]).to_pylist()
    images = [r["image"]["bytes"] for r in table]
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(images[4])
    images[4] = undecodable_png(damaged).read_bytes()  # its header reads well, its pixels do not
    write_parquet(files[1], images, [r["label"] for r in table])
    ds._reader = None  # as in a DataLoader worker: nothing read yet (the build read this row group for its sample)
    raises_user_error(lambda: ds[at], "cannot decode the image of shard", f"{files[1]} row 4", "remove or replace")
    raises_user_error(lambda: _build(root), "cannot decode the image of shard", f"{files[1]} row 4")
    images[4] = b"not an image at all"
    write_parquet(files[1], images, [r["label"] for r in table])
    raises_user_error(lambda: _build(root), "cannot decode the image of shard", f"{files[1]} row 4")

    tar = write_tar(tmp_path / "t" / "x.tar", [images[0], b"\x89PNG broken", *images[:6]], ["a", "b"] * 4)
    raises_user_error(lambda: _build(tmp_path / "t", val_split=0.5), f"shard {tar} member x_00001.png")


def test_empty_mixed_and_malformed_folders_say_what_to_do(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    raises_user_error(lambda: _build(empty), "holds no shards", "*.parquet", "*.arrow", "*.tar")
    raises_user_error(lambda: _build(tmp_path / "nowhere"), "does not exist", "shards:<path>")
    mixed = tmp_path / "mixed"
    write_shards(mixed, "parquet", shards=1)
    write_shards(mixed, "tar", shards=1)
    raises_user_error(lambda: _build(mixed), "shards of several kinds (parquet, tar)", "one kind per dataset")
    no_test = shard_set(tmp_path / "split", "tar", "folders")
    for f in (no_test / "test").iterdir():
        f.unlink()
    raises_user_error(lambda: _build(no_test), f"{no_test / 'test'} holds no shards")
    unlabelled = tmp_path / "nocls" / "u.tar"
    unlabelled.parent.mkdir()
    with tarfile.open(unlabelled, "w") as tar:  # an image without its .cls
        info = tarfile.TarInfo("k1.png")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"abcd"))
    raises_user_error(lambda: _build(unlabelled.parent), f"tar shard {unlabelled}", "k1.cls")
    flat = shard_set(tmp_path / "p", "parquet", "flat")
    raises_user_error(lambda: _build(flat, label_column="klass"), "label column 'klass' not found", "--label-column")
