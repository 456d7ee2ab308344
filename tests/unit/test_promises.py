"""Promises that a plausible one-line bug would break silently (issue 32): each test here fails when its promise does.

Planted by hand before these tests existed, none of these bugs failed the default suite: clipping switched off,
the best checkpoint chosen in reverse, exports keeping ``_orig_mod.``/``module.`` prefixes, every rank writing the
run files, retention keeping one checkpoint too many between saves after a resume, and a mid-epoch resume under
gradient accumulation. ``scripts/mutation_check.py`` plants them (and more) again and checks that they fail here.


The in-process tests; whole runs and launches are in ../integration/test_promises_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from accel_train.trainer import Trainer

PREFIXES = ("module.", "_orig_mod.")


def test_a_compiled_models_export_has_no_wrapper_prefix(tmp_path):
    """Trainer.export through accelerate's real get_state_dict, which keeps torch.compile's wrapper."""
    from types import SimpleNamespace

    from accelerate import Accelerator
    from safetensors.torch import load_file

    from accel_train.models import create_model

    model = create_model("lenet", num_classes=10, in_channels=1, image_size=28)
    model_config = {"model": "lenet", "num_classes": 10, "in_channels": 1, "image_size": 28}
    compiled = torch.compile(model)  # nothing compiles until it is called: the wrapper is enough
    acc = Accelerator(cpu=True)
    assert any(k.startswith("_orig_mod.") for k in acc.get_state_dict(compiled))  # the prefix is really there
    fake = SimpleNamespace(
        acc=acc, model=compiled, rt=SimpleNamespace(is_main=True), meta={"model_config": model_config}
    )
    Trainer.export(fake, tmp_path / "model")
    exported = load_file(str(tmp_path / "model" / "model.safetensors"))  # not our reader: it strips prefixes too
    assert sorted(exported) == sorted(model.state_dict())
    assert not any(k.startswith(PREFIXES) for k in exported)


def test_eval_loss_is_the_mean_over_samples_with_uneven_batches():
    """``eval_loss`` is the cross-entropy averaged over samples, not over batches (10 samples in 4 + 4 + 2)."""
    import torch.nn.functional as F
    from accelerate import Accelerator

    from accel_train.evaluation import evaluate_model
    from accel_train.metrics import load_metric

    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(10, 6, generator=g), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    model = torch.nn.Linear(6, 3)
    loader = [(images[i : i + 4], labels[i : i + 4]) for i in range(0, 10, 4)]
    acc = Accelerator(cpu=True)
    result = evaluate_model(acc, model, loader, lambda x: x, load_metric("accuracy"), 3)
    with torch.no_grad():
        expected = F.cross_entropy(model(images), labels).item()
        batch_means = sum(F.cross_entropy(model(x), y).item() for x, y in loader) / len(loader)
    assert abs(expected - batch_means) > 1e-3  # the two readings really differ on these batches
    assert result["eval_loss"] == pytest.approx(expected, rel=1e-6)
    assert result["eval_samples"] == 10


def test_eval_accuracy_is_the_exact_count_and_the_evaluate_metric_agrees():
    """The loop counts accuracy itself (no ``evaluate`` import in a run); ``accel-evaluate``'s ``evaluate`` metric
    scores the same predictions to the same float, and a metric that disagrees is an error, never a number."""
    from accelerate import Accelerator

    from accel_train.evaluation import evaluate_model
    from accel_train.metrics import load_metric

    g = torch.Generator().manual_seed(1)
    images, labels = torch.randn(37, 6, generator=g), torch.randint(0, 3, (37,), generator=g)
    model = torch.nn.Linear(6, 3)
    loader = [(images[i : i + 8], labels[i : i + 8]) for i in range(0, 37, 8)]
    acc = Accelerator(cpu=True)
    counted = evaluate_model(acc, model, loader, lambda x: x, None, 3)
    with torch.no_grad():
        right = int((model(images).argmax(1) == labels).sum())
    assert 0 < right < 37  # neither all right nor all wrong: a constant could not pass
    assert counted["eval_accuracy"] == right / 37
    scored = evaluate_model(acc, model, loader, lambda x: x, load_metric("accuracy"), 3)
    assert scored["eval_accuracy"] == counted["eval_accuracy"]

    class OffByOne:
        def add_batch(self, predictions, references):
            self.n = len(references)

        def compute(self):
            return {"accuracy": (right + 1) / self.n}

    with pytest.raises(RuntimeError, match="scored accuracy"):
        evaluate_model(acc, model, loader, lambda x: x, OffByOne(), 3)


def test_bitwise_evaluation_pads_a_short_last_batch_to_the_full_size():
    """--bitwise: a CPU's kernels may round an image's logits by its batch's size (lenet on an AMX CPU: 2e-8 at 8
    and 16 images). Several processes evaluate full batches only (accelerate pads them), so one process pads its
    short last batch too and drops the padding's outputs: here a model whose outputs follow the batch's size."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from accel_train.evaluation import evaluate_model

    class BySize(torch.nn.Module):
        def forward(self, x):
            return x[:, :3] + 1e-3 * len(x)

    g = torch.Generator().manual_seed(0)
    images, labels = torch.randn(10, 6, generator=g), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    batches = [(images[i : i + 4], labels[i : i + 4]) for i in range(0, 10, 4)]
    sampler = SimpleNamespace(batch_size=4)  # where accelerate's loaders keep it
    loader = type("Loader", (), {"batch_sampler": sampler, "__iter__": lambda self: iter(batches)})()
    acc = Accelerator(cpu=True)
    padded = evaluate_model(acc, BySize(), loader, lambda x: x, None, 3, full_batches=True)
    plain = evaluate_model(acc, BySize(), loader, lambda x: x, None, 3)
    with torch.no_grad():
        full = torch.cat([images[:4] + 4e-3, images[4:8] + 4e-3, images[8:] + 4e-3])[:, :3]
        expected = torch.nn.functional.cross_entropy(full, labels, reduction="none").double().sum().item() / 10
    assert padded["eval_samples"] == plain["eval_samples"] == 10
    assert padded["eval_loss"] == pytest.approx(expected, rel=1e-9)
    assert plain["eval_loss"] != pytest.approx(expected, rel=1e-9)  # the short batch, unpadded, differs
