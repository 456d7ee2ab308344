"""Issue 12 (4): keyed randomness, batched augmentation, data on the device.

The end-to-end checks train on CIFAR-10-format files (tests/datafiles.py), whose builder augments
with the batched crop + flip by default, and record what the model sees: ``record_lenet`` (this
file, also runnable as ``python tests/integration/test_device_data.py`` for ``accelerate launch``) writes every
training input to ``$RECORD_DIR/<rank>_<call>.safetensors``. One process at global batch 16, two
gloo processes at the same global batch, and a run stopped mid-epoch then resumed must show the
model the same global batches, bit for bit.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from accel_train.keyed import keyed_bernoulli, keyed_bits, keyed_randint, keyed_uniform, mix32
from accel_train.models import register_model
from accel_train.models.lenet import LeNet


class RecordingLeNet(LeNet):
    """LeNet that saves each training input (as the model receives it) when ``RECORD_DIR`` is set."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def forward(self, x):
        where = os.environ.get("RECORD_DIR")
        if self.training and where:
            from safetensors.torch import save_file

            self.calls += 1
            rank = os.environ.get("RANK", "0")
            save_file({"x": x.detach().cpu().contiguous()}, str(Path(where) / f"{rank}_{self.calls:04d}.safetensors"))
        return super().forward(x)


if __name__ == "__main__":  # the launched ranks: the real training command with the recording model
    from accel_train.commands.train import cli_main

    register_model("record_lenet", RecordingLeNet)

    cli_main()
    raise SystemExit(0)

from conftest import FAST, check, fit_small, run_script, summary  # test helpers: the ranks above need none
from datafiles import write_cifar10


@pytest.fixture(autouse=True, scope="module")
def _record_lenet():
    """The recording model, registered for this module's in-process runs only (the registry is global)."""
    from accel_train.models import _MODELS

    register_model("record_lenet", RecordingLeNet)
    yield
    _MODELS.pop("record_lenet", None)


# 50 training images -> 3 global batches of 16 per epoch; 7 steps run into a third epoch
RUN = ["--model", "record_lenet", "--dataset", "cifar10", "--global-batch-size", "16", "--max-steps", "7"]
STOP_AT = 4  # the second step of the second epoch: a mid-epoch resume with a new epoch's crops


# ---- keyed randomness ------------------------------------------------------------------------------------------
def test_keyed_values_are_a_pure_function_of_the_key():
    idx = torch.tensor([0, 5, 2**33 + 7, 123_456_789])
    bits = keyed_bits(3, 1, idx, 4, "crop")
    assert bits.shape == (4, 4) and bits.dtype == torch.int64 and 0 <= bits.min() and bits.max() < 2**32
    assert torch.equal(keyed_bits(3, 1, idx[2:3], 4, "crop"), bits[2:3])  # independent of the rest of the batch
    assert torch.equal(keyed_bits(3, 1, idx.tolist(), 4, "crop"), bits)
    for other in (keyed_bits(4, 1, idx, 4, "crop"), keyed_bits(3, 2, idx, 4, "crop"), keyed_bits(3, 1, idx, 4, 7)):
        assert (other != bits).all()
    # pinned values: a change to the hash would change every run's augmentation (and break resumes across versions)
    assert keyed_bits(0, 0, [0, 1], 2, 0).tolist() == KNOWN_BITS
    assert [mix32(x) for x in (0, 1, 2**32 - 1)] == mix32(torch.tensor([0, 1, 2**32 - 1])).tolist()


KNOWN_BITS = [[2079095532, 2833773684], [2422646619, 3396025983]]


def test_keyed_draws_have_the_right_ranges_and_rates():
    idx = torch.arange(20_000)
    u = keyed_uniform(7, 0, idx, 2, "u")
    assert u.dtype == torch.float32 and 0 <= u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01
    r = keyed_randint(7, 0, idx, 9, 1, "r")
    assert torch.bincount(r.flatten(), minlength=9).min() > 20_000 / 9 * 0.9
    assert abs(keyed_bernoulli(7, 0, idx, 0.25).float().mean().item() - 0.25) < 0.01
    assert not keyed_bernoulli(7, 0, idx, 0.0).any() and keyed_bernoulli(7, 0, idx, 1.0).all()


def test_keyed_draws_never_touch_the_global_rng():
    from accel_train.data.augment import CropFlip
    from accel_train.data.base import TensorImageDataset

    data = TensorImageDataset(torch.randint(0, 256, (32, 3, 8, 8), dtype=torch.uint8), torch.arange(32), CropFlip(8, 2))
    state = torch.random.get_rng_state()
    keyed_uniform(1, 2, torch.arange(100), 3)
    data.set_epoch(3)
    data.__getitems__(list(range(0, 32, 3)))
    assert torch.equal(torch.random.get_rng_state(), state)


# ---- batched crop + flip ---------------------------------------------------------------------------------------
def _reference_crop_flip(images, idx, seed, epoch, size, padding, flip, mode="constant"):
    """Pad (torch's F.pad), slice and flip one sample at a time, with the parameters the batched version draws."""
    import torch.nn.functional as F

    _, _, h, w = images.shape
    dy = keyed_randint(seed, epoch, idx, h + 2 * padding - size + 1, stream="crop_y")[:, 0].tolist()
    dx = keyed_randint(seed, epoch, idx, w + 2 * padding - size + 1, stream="crop_x")[:, 0].tolist()
    flips = keyed_bernoulli(seed, epoch, idx, 0.5, stream="hflip")[:, 0].tolist()
    padded = F.pad(images.float(), (padding,) * 4, mode=mode).to(images.dtype)  # reflect pads floats only
    out = [p[:, y : y + size, x : x + size] for p, y, x in zip(padded, dy, dx, strict=True)]
    return torch.stack([o.flip(-1) if f and flip else o for o, f in zip(out, flips, strict=True)])


@pytest.mark.parametrize(
    "shape,size,padding,flip,mode",
    [
        ((32, 32), 32, 4, True, "constant"),
        ((28, 28), 28, 2, False, "constant"),
        ((9, 12), 8, 1, True, "constant"),
        ((32, 32), 32, 2, True, "reflect"),  # airbench's translate
        ((9, 12), 8, 3, False, "reflect"),
    ],
)
def test_crop_flip_matches_padding_slicing_and_flipping_per_sample(shape, size, padding, flip, mode):
    from accel_train.data.augment import CropFlip

    images = torch.randint(0, 256, (64, 3, *shape), dtype=torch.uint8)
    idx = torch.randint(0, 10**6, (64,))
    out = CropFlip(size, padding, flip, mode)(images, idx, 5, 2)
    assert out.shape == (64, 3, size, size) and out.dtype == torch.uint8 and out.is_contiguous()
    assert torch.equal(out, _reference_crop_flip(images, idx, 5, 2, size, padding, flip, mode))
    assert CropFlip(size, padding, flip, mode)(images[:0], idx[:0], 5, 2).shape == (0, 3, size, size)


def test_reflect_padding_wider_than_the_image_is_refused():
    from accel_train.data.augment import CropFlip

    with pytest.raises(ValueError, match="reflect padding 8"):
        CropFlip(8, 8, mode="reflect")(torch.zeros(2, 1, 8, 8, dtype=torch.uint8), torch.arange(2), 0, 0)


def test_in_memory_batches_depend_on_seed_epoch_and_index_only():
    from accel_train.data.augment import CropFlip
    from accel_train.data.base import TensorImageDataset

    images = torch.randint(0, 256, (16, 3, 12, 12), dtype=torch.uint8)
    data = TensorImageDataset(images, torch.arange(16), CropFlip(12, 2))
    data.augment_seed = 9
    batch, labels = data.__getitems__([3, 7, 1])
    assert labels.tolist() == [3, 7, 1] and not torch.equal(batch, images[[3, 7, 1]])
    assert torch.equal(data.__getitems__([1, 7])[0], batch[[2, 1]])  # any batch composition
    assert torch.equal(data[7][0], batch[1])  # per-sample and batched paths agree
    data.set_epoch(1)
    assert data.epoch == 1 and not torch.equal(data.__getitems__([3, 7, 1])[0], batch)  # a new epoch, new crops


def test_lazy_datasets_augment_whole_batches_and_persistent_workers_see_each_epoch():
    import numpy as np

    from accel_train.data.augment import CropFlip
    from accel_train.data.folder import LazyImageDataset
    from accel_train.data.pipeline import make_loader

    gen = np.random.default_rng(0)
    rows = [{"image": gen.integers(0, 256, (8, 8, 3), dtype=np.uint8), "label": i % 2} for i in range(12)]
    data = LazyImageDataset(rows, "image", "label", 3, 8, transform=CropFlip(8, 2))
    loader = make_loader(data, 4, shuffle=True, seed=1, num_workers=1)  # one persistent worker
    for epoch in (0, 1):
        loader.batch_sampler.sampler.set_epoch(epoch)  # as accelerate does: the sampler passes it on
        got = list(loader)
        assert data.epoch == epoch
        expected = [data.__getitems__(b) for b in loader.batch_sampler]  # the same, in this process
        assert all(torch.equal(g[0], e[0]) and torch.equal(g[1], e[1]) for g, e in zip(got, expected, strict=True))


# ---- data on the device ----------------------------------------------------------------------------------------
def _dataset(n: int = 10):
    from accel_train.data.augment import CropFlip
    from accel_train.data.base import TensorImageDataset

    return TensorImageDataset(torch.randint(0, 256, (n, 3, 8, 8), dtype=torch.uint8), torch.arange(n), CropFlip(8, 1))


def test_on_cpu_nothing_moves():
    from accel_train.data.pipeline import place_on_device

    data = _dataset()
    assert place_on_device([data], torch.device("cpu"), 0.25) == []
    assert place_on_device([data], torch.device("meta"), 0.0, memory=(10**9, 10**9)) == []  # 0 disables
    assert data.images.device.type == "cpu"


def test_data_on_a_device_is_indexed_and_augmented_there_and_never_copied_per_step():
    """The meta device stands in for a GPU: any read back to the host (a hidden sync) would raise."""
    from accelerate.utils import send_to_device

    from accel_train.data.pipeline import place_on_device

    meta = torch.device("meta")
    train, test, big = _dataset(10), _dataset(4), _dataset(1000)
    budget = train.nbytes + test.nbytes  # 1000 samples do not fit in what is left
    assert place_on_device([train, big, test], meta, 0.5, memory=(10**9, 2 * budget)) == [train, test]
    assert train.images.device == meta and train.labels.device == meta and big.images.device.type == "cpu"
    train.augment_seed = 3
    train.set_epoch(2)
    images, labels = train.__getitems__([4, 0, 9])
    assert images.device == meta and labels.device == meta and images.shape == (3, 3, 8, 8)
    moved = send_to_device((images, labels), meta, non_blocking=True)  # what accelerate does to each batch
    assert moved[0] is images and moved[1] is labels  # a no-op: no copy
    assert place_on_device([_dataset()], meta, 0.5, memory=(0, 10**9)) == []  # never more than is free


def test_backends_on_cpu_choose_channels_last_only_and_change_nothing_global():
    from accel_train.runtime import configure_backends

    before = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    cpu = torch.device("cpu")
    auto = configure_backends(cpu, "bf16", tf32=True, channels_last=None, conv_model=True)
    assert (auto.tf32, auto.cudnn_benchmark, auto.channels_last) == (False, False, False)
    assert configure_backends(cpu, "no", tf32=True, channels_last=True, conv_model=True).channels_last is True
    after = (torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    assert after == before


# ---- end to end: 1 process, 2 processes, a mid-epoch resume ----------------------------------------------------
def recorded(where: Path, rank: int = 0) -> list[torch.Tensor]:
    from safetensors.torch import load_file

    return [load_file(str(p))["x"] for p in sorted(Path(where).glob(f"{rank}_*.safetensors"))]


def _fit(out: Path, record: Path, *args: str) -> dict:
    record.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECORD_DIR", str(record))
        return fit_small(out, *RUN, *args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same 7 steps: one process straight, two gloo processes, one process stopped at step 4 and resumed."""
    root = tmp_path_factory.mktemp("device_data")
    write_cifar10(root / "data", n_per_batch=10, n_test=8)
    data = ["--data-dir", str(root / "data")]
    _fit(root / "one", root / "rec_one", *data)
    (root / "rec_two").mkdir()
    two = ["--output-dir", str(root / "two"), *RUN, *data, "--log-every", "1", *FAST]
    check(
        run_script(
            "tests/integration/test_device_data.py",
            *two,
            config="multi_cpu.yaml",
            env={"RECORD_DIR": str(root / "rec_two")},
        )
    )
    _fit(root / "resumed", root / "rec_stop", *data, "--stop-at-step", str(STOP_AT))
    _fit(root / "resumed", root / "rec_resume", *data, "--resume", "auto")
    return root


def test_the_run_shows_the_model_keyed_crops_of_the_sampled_images(runs):
    """The first batch is the keyed crop + flip of the sampler's first 16 samples, normalised (not the raw images)."""
    from accel_train.config import parse_config
    from accel_train.data import build_dataset
    from accel_train.data.pipeline import BatchNormalizer, EpochSampler

    cfg = parse_config([*RUN, "--data-dir", str(runs / "data")])
    splits = build_dataset(cfg.data_config())
    assert splits.extra["augment"] == "random_crop(32, padding=4)+hflip"
    order = list(EpochSampler(len(splits.train), seed=cfg.seed, multiple_of=16))[:16]
    idx = torch.tensor(order)
    normalize = BatchNormalizer(splits.info.mean, splits.info.std)
    raw = splits.train.images[idx]
    expected = normalize(splits.train.transform(raw, idx, cfg.seed, 0))
    first = recorded(runs / "rec_one")[0]
    assert torch.equal(first, expected) and not torch.equal(first, normalize(raw))


def test_one_and_two_processes_see_identical_global_batches(runs):
    one = recorded(runs / "rec_one")
    ranks = [recorded(runs / "rec_two", rank) for rank in (0, 1)]
    assert summary(runs / "two")["world_size"] == 2 and len(one) == 7
    assert [len(r) for r in ranks] == [7, 7] and all(r.shape[0] == 8 for r in ranks[0] + ranks[1])
    for step, (batch, first, second) in enumerate(zip(one, *ranks, strict=True)):
        assert torch.equal(batch, torch.cat([first, second])), f"global batch {step + 1} differs"


def test_a_mid_epoch_resume_sees_the_batches_of_a_straight_run(runs):
    one = recorded(runs / "rec_one")
    stopped, resumed = recorded(runs / "rec_stop"), recorded(runs / "rec_resume")
    assert (len(stopped), len(resumed)) == (STOP_AT, 7 - STOP_AT)
    assert summary(runs / "resumed")["global_step"] == 7
    for step, (a, b) in enumerate(zip(one, stopped + resumed, strict=True)):
        assert torch.equal(a, b), f"global batch {step + 1} differs after the resume"
    assert not torch.equal(one[0], one[3])  # epochs differ (other order and other crops)
