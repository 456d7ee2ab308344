"""Models and weight files in the seeds' shapes, shared by tests/unit/test_weights.py and
tests/integration/test_weights_runs.py."""

from __future__ import annotations

import torch
from torch import nn

from accel_train.models import create_model


def seeded_model(name: str = "lenet", seed: int = 0, **sizes) -> nn.Module:
    torch.manual_seed(seed)
    sizes = {"num_classes": 10, "in_channels": 1, "image_size": 28, **sizes}
    return create_model(name, **sizes).eval()


def dataparallel_pkl(model, d):  # seed 000: torch.save(model.state_dict(), "model_parameter.pkl") under DP
    torch.save(nn.DataParallel(model).state_dict(), d / "model_parameter.pkl")
    return d / "model_parameter.pkl"


def compiled_pt(model, d):  # torch.compile wrapper (not called, so nothing compiles)
    sd = torch.compile(model).state_dict()
    assert all(k.startswith("_orig_mod.") for k in sd)
    torch.save(sd, d / "compiled.pt")
    return d / "compiled.pt"
