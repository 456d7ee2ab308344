"""Issue 14, item 3: EMA, label smoothing, mixup/cutmix, early stopping, keyed dropout, --max-device-batch auto.

Each feature keeps the parity promise (its randomness keyed on the sample, not the rank: the unit tests
below mix and drop out a global batch whole and in shards) and resumes exactly (the runs below stop and
resume with it on). The multi-process parity runs are in test_train_e2e.py.


The in-process tests; whole runs and launches are in ../integration/test_features_runs.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from accel_train.errors import CheckpointError, UserError
from accel_train.features import KeyedDropout, Mixer, TrainFeatures, WeightEMA, use_keyed_dropout
from accel_train.features.device_batch import candidates, choose_micro_batch
from accel_train.features.mix import Mixed, keyed_beta


def test_keyed_dropout_masks_follow_the_sample_not_the_batch():
    model = nn.Sequential(nn.Linear(6, 40), nn.Dropout(0.5), nn.ReLU(), nn.Sequential(nn.Dropout(0.25)))
    keys_before = set(model.state_dict())
    model, keys = use_keyed_dropout(model, seed=7)
    layers = [m for m in model.modules() if isinstance(m, KeyedDropout)]
    assert len(layers) == 2 and set(model.state_dict()) == keys_before  # no new state: checkpoints unchanged
    assert use_keyed_dropout(nn.Linear(2, 2), 0)[1] is None  # nothing to key

    x = torch.randn(32, 40)
    indices = torch.randperm(1000)[:32]
    drop = layers[0]
    rng = torch.get_rng_state()
    with keys.batch(3, indices):
        whole = drop(x)
    halves = []
    for part in (slice(0, 16), slice(16, 32)):  # two ranks' shards of the same global batch
        with keys.batch(3, indices[part]):
            halves.append(drop(x[part]))
    assert torch.equal(whole, torch.cat(halves))
    assert torch.equal(rng, torch.get_rng_state())  # the global RNG is never drawn from
    kept = (whole != 0).float().mean().item()
    assert 0.4 < kept < 0.6 and torch.allclose(whole[whole != 0], 2 * x[whole != 0])
    with keys.batch(4, indices):
        assert not torch.equal(drop(x), whole)  # another epoch, other masks
    with keys.batch(3, indices):
        assert not torch.equal(layers[1](x), whole)  # each layer its own stream
    assert torch.equal(drop.eval()(x), x)  # eval: identity


@pytest.mark.parametrize("mixup, cutmix", [(0.4, 0.0), (0.0, 1.0), (0.4, 1.0)])
def test_mixing_a_global_batch_equals_mixing_its_shards(mixup, cutmix):
    mixer = Mixer(mixup, cutmix, seed=5)
    x = torch.randn(32, 2, 8, 8)
    indices = torch.randperm(500)[:32]
    whole, mixed = mixer(x, indices, epoch=2)
    parts = [mixer(x[s], indices[s], epoch=2) for s in (slice(0, 16), slice(16, 24), slice(24, 32))]
    assert torch.equal(whole, torch.cat([p[0] for p in parts]))  # 1 x 32 = 2 x 16 = uneven shards of even size
    assert torch.equal(mixed.lam, torch.cat([p[1].lam for p in parts]))
    assert torch.equal(mixed.partner, torch.arange(32) ^ 1)
    assert ((mixed.lam >= 0) & (mixed.lam <= 1)).all()
    other, blended = x[mixed.partner], 0
    for k in range(32):
        if torch.allclose(whole[k], mixed.lam[k] * x[k] + (1 - mixed.lam[k]) * other[k]):
            blended += 1  # mixup (or a cutmix box too small to paste anything)
            continue
        from_self = whole[k] == x[k]  # cutmix: every pixel from one of the two, lam the fraction kept
        assert torch.equal(whole[k], torch.where(from_self, x[k], other[k]))
        assert from_self.float().mean().item() == pytest.approx(mixed.lam[k].item(), abs=1e-6)
    assert blended == 32 if not cutmix else blended < 32
    again, _ = mixer(x, indices, epoch=3)
    assert not torch.equal(again, whole)
    with pytest.raises(UserError, match="even micro-batch"):
        mixer(x[:15], indices[:15], epoch=2)


def test_keyed_beta_has_the_beta_distribution():
    indices = torch.arange(20000)
    for alpha in (0.4, 1.0):
        lam = keyed_beta(0, 0, indices, torch.full((20000,), alpha), "test")
        assert lam.mean().item() == pytest.approx(0.5, abs=0.01)
        assert lam.var().item() == pytest.approx(1 / (4 * (2 * alpha + 1)), abs=0.005)  # Beta(a, a)'s variance


def test_label_smoothing_and_mixed_targets_are_soft_target_cross_entropy():
    logits, labels = torch.randn(8, 5), torch.randint(0, 5, (8,))
    feats = TrainFeatures(label_smoothing=0.1)
    assert torch.equal(feats.loss(logits, labels), F.cross_entropy(logits, labels, label_smoothing=0.1))
    assert torch.equal(TrainFeatures().loss(logits, labels), F.cross_entropy(logits, labels))  # the plain step
    lam, partner = torch.rand(8), torch.arange(8) ^ 1
    soft = lam[:, None] * F.one_hot(labels, 5) + (1 - lam[:, None]) * F.one_hot(labels[partner], 5)
    expected = F.cross_entropy(logits, soft.float(), label_smoothing=0.1)
    assert feats.loss(logits, labels, Mixed(lam, partner)).item() == pytest.approx(expected.item(), rel=1e-6)


def test_ema_averages_weights_and_float_buffers_and_copies_counters():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ema = WeightEMA(model, 0.75, torch.device("cpu"))
    start = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model(torch.randn(6, 3))  # running statistics and num_batches_tracked move
    ema.update()
    now = model.state_dict()
    for key, value in ema.state_dict().items():
        if key.endswith("num_batches_tracked"):
            assert int(value) == 1
        else:
            assert torch.allclose(value, 0.75 * start[key] + 0.25 * now[key])
    assert ema.updates == 1 and not any(p.requires_grad for p in ema.module.parameters())


def _oom_above(limit: int, seen: list[int] | None = None):
    def probe(batch: int) -> None:
        if seen is not None:
            seen.append(batch)
        if batch > limit:
            raise torch.OutOfMemoryError(f"simulated: {batch} samples do not fit, {limit} do")

    return probe


def test_auto_micro_batch_is_the_largest_divisor_that_fits_on_every_rank():
    alone = int  # one process: the all-reduce's minimum is its own answer
    assert candidates(24) == [24, 12, 8, 6, 4, 3, 2, 1] and candidates(24, even=True) == [24, 12, 8, 6, 4, 2]
    seen: list[int] = []
    budgets = {0: 13, 1: 7}  # samples that fit on each simulated rank
    answers = {r: choose_micro_batch(24, _oom_above(b, seen if not r else None), alone) for r, b in budgets.items()}
    assert answers == {0: 12, 1: 6} and seen == [24, 12]
    agree = lambda fits: min(fits, answers[1])  # noqa: E731  (the all-reduce's minimum, as rank 0 sees it)
    assert choose_micro_batch(24, _oom_above(13), agree) == 6
    assert choose_micro_batch(24, _oom_above(7), alone, even=True) == 6
    with pytest.raises(UserError, match="not even a micro-batch of 1 fits"):
        choose_micro_batch(24, _oom_above(0), alone)

    def broken(batch: int) -> None:
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError):
        choose_micro_batch(24, broken, alone)


def test_feature_flags_parse_and_refuse_bad_values(tmp_path):
    from accel_train.config import parse_config

    cfg = parse_config(["--max-device-batch", "auto", "--ema", "0.99", "--mixup", "0.2", "--early-stop-patience", "3"])
    assert (cfg.max_device_batch, cfg.ema, cfg.mixup, cfg.early_stop_patience) == ("auto", 0.99, 0.2, 3)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("max_device_batch: auto\nlabel_smoothing: 0.1\n")
    assert parse_config(["--config", str(yaml_file)]).max_device_batch == "auto"
    yaml_file.write_text("max_device_batch: lots\n")
    with pytest.raises(UserError, match="max_device_batch must be a number or auto"):
        parse_config(["--config", str(yaml_file)])
    for bad, match in (
        (["--ema", "1"], "--ema is the decay"),
        (["--label-smoothing", "1"], "--label-smoothing must be in"),
        (["--mixup", "-0.1"], "--mixup must be >= 0"),
        (["--early-stop-patience", "0"], "--early-stop-patience must be >= 1"),
        (["--max-device-batch", "4"], "--max-device-batch only applies with --global-batch-size G"),
    ):
        with pytest.raises(UserError, match=match):
            parse_config(bad)
    with pytest.raises(UserError, match="--max-device-batch: takes a number or auto, got 'most'"):
        parse_config(["--max-device-batch", "most"])


def test_resume_refuses_new_mixing_but_takes_new_patience():
    from accel_train.config import TrainConfig
    from accel_train.resume import PER_ATTEMPT, SAFE, reconcile

    saved = TrainConfig(mixup=0.2, early_stop_patience=3).to_dict()
    cfg = TrainConfig(mixup=0.5).validate(given={"mixup"})
    with pytest.raises(UserError, match="--mixup"):
        reconcile(cfg, saved, {})
    cfg = TrainConfig(early_stop_patience=5).validate(given={"early_stop_patience"})
    cfg, changes = reconcile(cfg, saved, {})
    assert changes == {"early_stop_patience": [3, 5]} and cfg.mixup == 0.2
    new = {"ema", "label_smoothing", "mixup", "cutmix"}
    assert not new & (SAFE | PER_ATTEMPT)  # the experiment: refused when changed


def test_early_stopping_counts_each_step_once_and_refuses_a_corrupt_state():
    from accel_train.features import EarlyStopping

    early = EarlyStopping(3)
    early.restore({"best": 0.5, "best_step": 4, "bad_evals": 1, "last_step": 4}, "ckpt")
    assert early.observe(0.4, 5) is None and early.bad_evals == 2
    assert early.observe(0.4, 5) is None and early.bad_evals == 2  # --eval-every and the epoch end at one step
    assert early.observe(0.5, 6).startswith("early stopping") and early.bad_evals == 3  # not better: equal
    assert early.observe(0.51, 7) is None and (early.best, early.bad_evals) == (0.51, 0)
    with pytest.raises(CheckpointError, match="early-stopping state"):
        EarlyStopping(2).restore({"best": "high", "bad_evals": 1}, "ckpt")
