"""Weights in every shape the seeds and other tools write them: read, load, export, inspect, scripts.

The in-process tests; whole runs and launches are in ../integration/test_weights_runs.py.
"""

from __future__ import annotations

import ast
import json
import pathlib
from pathlib import Path

import pytest
import torch
from helpers_weights import compiled_pt, dataparallel_pkl, seeded_model
from safetensors.torch import save_file
from torch import nn

from accel_train.checkpoint.weights import (
    export_weights,
    inspect_checkpoint,
    load_model,
    load_weights,
    read_state_dict,
    unwrap_state_dict,
)
from accel_train.errors import CheckpointError, UserError

REPO = Path(__file__).resolve().parents[2]


X = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))


def _assert_same_outputs(original: nn.Module, loaded: nn.Module) -> None:
    loaded.eval()
    with torch.no_grad():
        assert torch.equal(original(X), loaded(X))


def _prefixed(sd: dict, prefix: str) -> dict:
    return {prefix + k: v for k, v in sd.items()}


def _optimizer_state(model: nn.Module) -> dict:
    opt = torch.optim.Adam(model.parameters())
    model(X).sum().backward()
    opt.step()
    model.zero_grad()
    return opt.state_dict()


def _ddp_pth(model, d):  # seed 002: rank 0 saves the DDP model's state dict
    torch.save(_prefixed(model.state_dict(), "module."), d / "ddp.pth")
    return d / "ddp.pth"


def _dp_of_compiled(model, d):
    sd = nn.DataParallel(torch.compile(model)).state_dict()
    assert all(k.startswith("module._orig_mod.") for k in sd)
    torch.save(sd, d / "dp_compiled.pt")
    return d / "dp_compiled.pt"


def _compiled_of_dp(model, d):
    sd = torch.compile(nn.DataParallel(model)).state_dict()
    assert all(k.startswith("_orig_mod.module.") for k in sd)
    torch.save(sd, d / "compiled_dp.pt")
    return d / "compiled_dp.pt"


def _epoch_wrapper(model, d):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    torch.save({"epoch": 3, "best_acc": 0.9, "state_dict": sd, "optimizer": _optimizer_state(model)}, d / "ck.pth")
    model.load_state_dict(sd)  # undo the optimizer step on the reference model
    return d / "ck.pth"


def _model_state_dict_wrapper(model, d):
    torch.save({"model_state_dict": nn.DataParallel(model).state_dict(), "epoch": 1}, d / "ck.pt")
    return d / "ck.pt"


def _nested_wrapper(model, d):
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    opt = _optimizer_state(model)
    model.load_state_dict(sd)
    obj = {"meta": {"epoch": 2, "tag": "x"}, "train_state": {"net": _prefixed(sd, "module."), "optimizer": opt}}
    torch.save(obj, d / "nested.pt")
    return d / "nested.pt"


def _safetensors_export(model, d):
    export_weights(nn.DataParallel(model), d / "export", {"model": "lenet", "num_classes": 10})
    return d / "export"


def _accelerate_dir(model, d):
    out = d / "accel_state"
    out.mkdir()
    save_file(model.state_dict(), out / "model.safetensors", metadata={"format": "pt"})
    torch.save(_optimizer_state(seeded_model(seed=5)), out / "optimizer.bin")
    (out / "scheduler.bin").write_bytes(b"not read")
    return out


def _accelerate_bin_dir(model, d):  # save_state(safe_serialization=False)
    out = d / "accel_bin"
    out.mkdir()
    torch.save(model.state_dict(), out / "pytorch_model.bin")
    torch.save({"state": {}, "param_groups": []}, out / "optimizer.bin")
    return out


def _bin_file(model, d):
    torch.save(nn.DataParallel(model).state_dict(), d / "weights.bin")
    return d / "weights.bin"


def _legacy_format(model, d):  # torch < 1.6 (non-zip) serialization
    torch.save(model.state_dict(), d / "legacy.pt", _use_new_zipfile_serialization=False)
    return d / "legacy.pt"


def _saved_on_cuda(model, d):
    """A file whose storages are tagged ``cuda:1``: loading without map_location fails on CPU-only hosts."""
    from torch import serialization

    def tagger(storage):
        return "cuda:1"

    serialization.register_package(-1000, tagger, lambda obj, location: None)
    try:
        torch.save(_prefixed(model.state_dict(), "module."), d / "cuda.pt")
    finally:
        serialization._package_registry[:] = [e for e in serialization._package_registry if e[1] is not tagger]
    assert b"cuda:1" in (d / "cuda.pt").read_bytes()
    return d / "cuda.pt"


def _sharded_safetensors(model, d):
    out = d / "sharded"
    out.mkdir()
    sd = model.state_dict()
    names = list(sd)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: sd[k] for k in keys}, out / fname)
        weight_map.update({k: fname for k in keys})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


WRITERS = [
    dataparallel_pkl,
    _ddp_pth,
    compiled_pt,
    _dp_of_compiled,
    _compiled_of_dp,
    _epoch_wrapper,
    _model_state_dict_wrapper,
    _nested_wrapper,
    _safetensors_export,
    _accelerate_dir,
    _accelerate_bin_dir,
    _bin_file,
    _legacy_format,
    _saved_on_cuda,
    _sharded_safetensors,
]


@pytest.mark.parametrize("writer", WRITERS, ids=lambda w: w.__name__.strip("_"))
def test_foreign_weights_load_into_plain_model(tmp_path, writer):
    original = seeded_model(seed=0)
    source = writer(original, tmp_path)
    fresh = seeded_model(seed=1)
    meta = load_weights(fresh, source)
    _assert_same_outputs(original, fresh)
    assert meta["missing_keys"] == [] and meta["unexpected_keys"] == []
    sd, read_meta = read_state_dict(source)
    assert set(sd) == set(original.state_dict())
    assert all(v.device.type == "cpu" for v in sd.values())
    assert read_meta["prefixes"] == meta["prefixes"]


def test_mnist_cnn_dataparallel_pickle(tmp_path):
    original = seeded_model("mnist_cnn", seed=0)
    source = dataparallel_pkl(original, tmp_path)
    fresh = seeded_model("mnist_cnn", seed=1)
    meta = load_weights(fresh, source)
    assert meta["prefixes"] == ["module."]
    _assert_same_outputs(original, fresh)


def test_prefixes_reported_in_order(tmp_path):
    original = seeded_model()
    _, meta = read_state_dict(_dp_of_compiled(original, tmp_path))
    assert meta["prefixes"] == ["module.", "_orig_mod."]
    _, meta = read_state_dict(_compiled_of_dp(original, tmp_path))
    assert meta["prefixes"] == ["_orig_mod.", "module."]
    _, meta = read_state_dict(_epoch_wrapper(original, tmp_path))
    assert meta["entry"] == "state_dict" and meta["prefixes"] == []
    _, meta = read_state_dict(_nested_wrapper(original, tmp_path))
    assert meta["entry"] == "train_state.net"


def test_load_into_wrapped_models(tmp_path):
    original = seeded_model()
    source = _ddp_pth(original, tmp_path)
    fresh = seeded_model(seed=1)
    load_weights(nn.DataParallel(fresh), source)
    _assert_same_outputs(original, fresh)
    fresh = seeded_model(seed=2)
    load_weights(torch.compile(fresh), source)  # the compiled wrapper is never called
    _assert_same_outputs(original, fresh)


def test_model_with_a_child_named_module(tmp_path):
    """Keys that legitimately start with ``module.`` are not stripped when the model expects them."""

    class Holder(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, x):
            return self.module(x)

    original = Holder(seeded_model(seed=0)).eval()
    torch.save(original.state_dict(), tmp_path / "holder.pt")
    fresh = Holder(seeded_model(seed=1))
    meta = load_weights(fresh, tmp_path / "holder.pt")
    assert meta["prefixes"] == []
    _assert_same_outputs(original, fresh)
    plain = seeded_model(seed=3)  # ... while a plain model gets them stripped
    load_weights(plain, tmp_path / "holder.pt")
    _assert_same_outputs(original, plain)


def test_unwrap_state_dict_uniform_and_mixed():
    t = torch.zeros(1)
    sd, prefixes = unwrap_state_dict({"module._orig_mod.a": t, "module._orig_mod.b": t})
    assert set(sd) == {"a", "b"} and prefixes == ["module.", "_orig_mod."]
    mixed = {"module.a": t, "b": t}
    sd, prefixes = unwrap_state_dict(mixed)
    assert sd == mixed and prefixes == []


def test_mixed_prefixes_are_reported_and_still_load(tmp_path):
    original = seeded_model()
    sd = original.state_dict()
    keys = list(sd)
    mixed = {("module." + k if i % 2 else k): v for i, (k, v) in enumerate(sd.items())}
    assert any(k.startswith("module.") for k in mixed) and not all(k.startswith("module.") for k in mixed)
    torch.save(mixed, tmp_path / "mixed.pt")
    _, meta = read_state_dict(tmp_path / "mixed.pt")
    assert meta["mixed_prefixes"] == ["module."]
    fresh = seeded_model(seed=1)
    load_weights(fresh, tmp_path / "mixed.pt")
    _assert_same_outputs(original, fresh)
    assert len(keys) == len(mixed)


class _TouchMarker:
    """Unpickling this object creates a file: the shape of a malicious checkpoint."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "MARKER"
    evil = tmp_path / "evil.pt"
    torch.save({"state_dict": seeded_model().state_dict(), "payload": _TouchMarker(marker)}, evil)
    with pytest.raises(CheckpointError, match="refused") as info:
        load_weights(seeded_model(), evil)
    assert "arbitrary code" in str(info.value) and "weights_only=False" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(CheckpointError, match="refused"):
        inspect_checkpoint(evil)
    assert not marker.exists()

    # control: the payload is live, so the refusal above is what kept it from running
    live_marker = tmp_path / "LIVE"
    torch.save(_TouchMarker(live_marker), tmp_path / "live.pt")
    torch.load(tmp_path / "live.pt", weights_only=False)
    assert live_marker.exists()


def test_malicious_pickle_in_accelerate_dir_is_never_touched(tmp_path):
    source = _accelerate_dir(seeded_model(), tmp_path)
    marker = tmp_path / "MARKER"
    torch.save({"rng": _TouchMarker(marker)}, source / "random_states_0.pkl")
    torch.save({"x": _TouchMarker(marker)}, source / "custom_checkpoint_0.pkl")
    load_weights(seeded_model(seed=1), source)
    inspect_checkpoint(source)
    assert not marker.exists()


def test_pickled_whole_module_is_refused(tmp_path):
    torch.save(seeded_model(), tmp_path / "whole.pt")
    with pytest.raises(CheckpointError, match="refused") as info:
        load_weights(seeded_model(), tmp_path / "whole.pt")
    message = str(info.value)
    assert "LeNet" in message and "state_dict()" in message and "clean.pt" in message


def test_truncated_file(tmp_path):
    torch.save(seeded_model().state_dict(), tmp_path / "full.pt")
    data = (tmp_path / "full.pt").read_bytes()
    (tmp_path / "half.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated") as info:
        load_weights(seeded_model(), tmp_path / "half.pt")
    assert "half.pt" in str(info.value)


def test_truncated_safetensors_and_empty_file(tmp_path):
    export = export_weights(seeded_model(), tmp_path / "export", None)
    data = export.read_bytes()
    export.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        read_state_dict(tmp_path / "export")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        read_state_dict(tmp_path / "empty.pt")


def test_empty_directory_and_missing_path(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no weights file") as info:
        read_state_dict(tmp_path / "empty")
    assert "model.safetensors" in str(info.value) and "pytorch_model.bin" in str(info.value)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_weights(seeded_model(), tmp_path / "nope.pt")


def test_directory_of_checkpoints_points_to_subdirectories(tmp_path):
    export_weights(seeded_model(), tmp_path / "runs" / "checkpoint_3", None)
    with pytest.raises(CheckpointError, match="checkpoint_3"):
        read_state_dict(tmp_path / "runs")


def test_file_without_state_dict(tmp_path):
    torch.save({"epoch": 3, "lr": 0.1}, tmp_path / "meta.pt")
    with pytest.raises(CheckpointError, match="no state dict"):
        read_state_dict(tmp_path / "meta.pt")


def test_another_architecture(tmp_path):
    torch.save(seeded_model("resnet18").state_dict(), tmp_path / "resnet.pt")
    with pytest.raises(CheckpointError) as info:
        load_weights(seeded_model("lenet"), tmp_path / "resnet.pt")
    message = str(info.value)
    assert "missing keys: net.0.weight" in message
    assert "unexpected keys: stem.0.weight" in message
    assert "another model architecture" in message


def test_other_num_classes_and_in_channels(tmp_path):
    torch.save(seeded_model(num_classes=5).state_dict(), tmp_path / "five.pt")
    with pytest.raises(CheckpointError, match="num_classes") as info:
        load_weights(seeded_model(), tmp_path / "five.pt")
    assert "net.9.weight" in str(info.value) and "in_channels" not in str(info.value)
    torch.save(seeded_model(in_channels=3).state_dict(), tmp_path / "rgb.pt")
    with pytest.raises(CheckpointError, match="in_channels"):
        load_weights(seeded_model(), tmp_path / "rgb.pt")


def test_non_strict_loads_what_fits(tmp_path):
    original = seeded_model(num_classes=5)
    torch.save(original.state_dict(), tmp_path / "five.pt")
    fresh = seeded_model(seed=1)
    meta = load_weights(fresh, tmp_path / "five.pt", strict=False)
    assert meta["mismatched_keys"] == ["net.9.weight", "net.9.bias"]
    assert torch.equal(fresh.net[0].weight, original.net[0].weight)


def test_export_and_load_model_round_trip(tmp_path):
    original = seeded_model()
    config = {
        "model": "lenet",
        "num_classes": 10,
        "in_channels": 1,
        "image_size": 28,
        "mean": [0.1307],
        "std": [0.3081],
        "class_names": [str(i) for i in range(10)],
        "dataset": "mnist",
    }
    weights = export_weights(torch.compile(nn.DataParallel(original)), tmp_path / "out", config)
    assert weights == tmp_path / "out" / "model.safetensors"
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == config
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]
    model, loaded_config = load_model(tmp_path / "out")
    assert type(model).__name__ == "LeNet" and not model.training
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert loaded_config == config
    _assert_same_outputs(original, model)
    _, meta = read_state_dict(tmp_path / "out" / "model.safetensors")  # the file alone finds its config
    assert meta["kind"] == "export" and meta["model_config"] == config


def test_load_model_from_checkpoint_dir_progress_json(tmp_path):
    original = seeded_model("mnist_cnn", num_classes=4)
    ckpt = _accelerate_dir(original, tmp_path)
    config = {"model": "mnist_cnn", "num_classes": 4, "in_channels": 1, "image_size": 28}
    (ckpt / "progress.json").write_text(json.dumps({"epoch": 2, "step": 10, "model_config": config}))
    model, loaded = load_model(ckpt)
    assert loaded == config and read_state_dict(ckpt)[1]["kind"] == "checkpoint"
    _assert_same_outputs(original, model)


def test_load_model_needs_a_name_without_config(tmp_path):
    original = seeded_model(num_classes=7)
    source = dataparallel_pkl(original, tmp_path)
    with pytest.raises(CheckpointError, match="model name"):
        load_model(source)
    model, config = load_model(source, "lenet")  # sizes guessed from the weights
    assert config["num_classes"] == 7 and config["in_channels"] == 1
    _assert_same_outputs(original, model)
    with pytest.raises(CheckpointError, match="num_classes"):
        load_model(source, "lenet", num_classes=10)


def test_load_weights_takes_the_model_first_as_torch_does(tmp_path):
    """load_weights(model, source): the order of load_state_dict and accelerate's load_checkpoint_in_model."""
    import warnings

    import accel_train

    original = seeded_model()
    path = export_weights(original, tmp_path / "out", {"model": "lenet"})
    for source in (tmp_path / "out", str(path), original.state_dict()):
        fresh = seeded_model(seed=1)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the new order warns about nothing
            meta = load_weights(fresh, source, strict=True)
        assert meta["missing_keys"] == [] and meta["unexpected_keys"] == []
        _assert_same_outputs(original, fresh)
    fresh = seeded_model(seed=1)
    accel_train.load_weights(model=fresh, source=path)  # the package's own name, by keyword
    _assert_same_outputs(original, fresh)


def test_load_weights_old_order_still_loads_with_a_deprecation_warning(tmp_path):
    original = seeded_model()
    path = export_weights(original, tmp_path / "out", None)
    fresh = seeded_model(seed=1)
    with pytest.warns(
        DeprecationWarning, match=r"load_weights\(source, model\) is deprecated: call load_weights\(model, source\)"
    ) as caught:
        meta = load_weights(path, fresh, strict=False)
    assert len(caught) == 1 and caught[0].filename == __file__  # points at the caller's line (stacklevel=2)
    assert "\n" not in str(caught[0].message) and meta["missing_keys"] == []
    _assert_same_outputs(original, fresh)


def test_load_weights_arguments_of_the_wrong_kind_say_what_to_do(tmp_path):
    path = export_weights(seeded_model(), tmp_path / "out", None)
    for bad in ((path, str(path)), ({"a": torch.zeros(1)}, path)):
        with pytest.raises(UserError, match=r"needs an nn\.Module first, got a \w+: load_weights\(model, path\)"):
            load_weights(*bad)
    for source in (42, None, seeded_model()):
        with pytest.raises(UserError, match=r"needs a weights path or a state dict as source, got a \w+"):
            load_weights(seeded_model(), source)


def test_load_model_returns_a_named_tuple(tmp_path):
    import accel_train
    from accel_train.checkpoint import LoadedModel

    original = seeded_model(num_classes=4)
    config = {"model": "lenet", "num_classes": 4, "in_channels": 1, "image_size": 28}
    export_weights(original, tmp_path / "out", config)
    loaded = accel_train.load_model(tmp_path / "out")
    assert isinstance(loaded, LoadedModel) and isinstance(loaded, tuple) and len(loaded) == 2
    model, loaded_config = loaded  # tuple unpacking, as before
    assert loaded.model is model and loaded.config is loaded_config and loaded_config == config
    _assert_same_outputs(original, loaded.model)


def test_export_handles_tied_and_non_contiguous_tensors(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.b.weight = self.a.weight

    original = Tied()
    path = export_weights(original, tmp_path / "tied", None)
    fresh = Tied()
    load_weights(fresh, path)
    assert torch.equal(fresh.a.weight, original.a.weight) and fresh.a.weight is fresh.b.weight

    t = torch.arange(12.0).reshape(3, 4)
    path = export_weights({"module.t": t.t(), "module.row": t[1]}, tmp_path / "views", None)
    sd, _ = read_state_dict(path)
    assert torch.equal(sd["t"], t.t()) and torch.equal(sd["row"], t[1])


def test_export_without_config_removes_stale_config(tmp_path):
    export_weights(seeded_model(), tmp_path / "out", {"model": "lenet"})
    export_weights(seeded_model("mnist_cnn"), tmp_path / "out", None)
    assert not (tmp_path / "out" / "config.json").exists()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_inspect_checkpoint_fields(tmp_path):
    original = seeded_model()
    source = dataparallel_pkl(original, tmp_path)
    info = inspect_checkpoint(source)
    assert info["format"] == "torch" and info["kind"] == "file"
    assert info["path"] == str(source.resolve()) and info["files"] == [str(source.resolve())]
    assert info["prefixes"] == ["module."] and info["mixed_prefixes"] == []
    assert info["num_tensors"] == len(original.state_dict())
    assert info["num_parameters"] == sum(p.numel() for p in original.parameters())
    assert info["size_bytes"] == source.stat().st_size
    assert info["tensors"][0] == {"name": "net.0.weight", "shape": [20, 1, 3, 3], "dtype": "float32"}
    assert info["model_config"] is None
    json.dumps(info)

    resnet = seeded_model("resnet18")
    export_weights(resnet, tmp_path / "res", {"model": "resnet18", "num_classes": 10})
    info = inspect_checkpoint(tmp_path / "res")
    assert info["format"] == "safetensors" and info["kind"] == "export"
    assert info["num_parameters"] == sum(p.numel() for p in resnet.parameters())
    assert info["num_elements"] > info["num_parameters"]  # BatchNorm running stats
    assert info["model_config"] == {"model": "resnet18", "num_classes": 10}
    assert info["size_bytes"] == (tmp_path / "res" / "model.safetensors").stat().st_size


def _unsafe_calls(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("pickle", "_pickle", "cPickle", "dill"):
            bad = [a.name for a in node.names if a.name in ("load", "loads", "Unpickler", "*")]
            if bad:
                problems.append(f"{path}:{node.lineno}: from {node.module} import {', '.join(bad)}")
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        if owner in ("pickle", "_pickle", "cPickle", "dill") and name in ("load", "loads", "Unpickler"):
            problems.append(f"{path}:{node.lineno}: {owner}.{name}(")
        if owner == "torch" and name == "load":
            safe = any(
                kw.arg == "weights_only" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                for kw in node.keywords
            )
            if not safe:
                problems.append(f"{path}:{node.lineno}: torch.load( without weights_only=True")
    return problems


def test_no_unsafe_unpickling_in_sources():
    files = sorted((REPO / "accel_train").rglob("*.py")) + sorted((REPO / "scripts").glob("*.py"))
    assert any(p.name == "weights.py" for p in files)
    problems = [problem for path in files for problem in _unsafe_calls(path)]
    assert problems == [], "load pickles only with torch.load(path, map_location='cpu', weights_only=True):\n" + (
        "\n".join(problems)
    )


def test_source_scan_catches_unsafe_calls(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import pickle, torch\n"
        "pickle.load(f)\npickle.loads(b)\ntorch.load(p)\ntorch.load(p, weights_only=False)\n"
        "torch.load(p, map_location='cpu', weights_only=True)\n"
    )
    assert len(_unsafe_calls(bad)) == 4
