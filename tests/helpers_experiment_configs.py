"""The seed experiments' config files and the hyperparameters each must parse to: shared by
tests/unit/test_experiment_configs.py and tests/integration/test_experiment_configs_runs.py."""

from __future__ import annotations

from conftest import REPO

CONFIG_DIR = REPO / "configs"


EXPECTED = {
    "seed000_mnist_cnn.yaml": {
        "model": "mnist_cnn",
        "dataset": "mnist",
        "optimizer": "adam",
        "lr": 1e-3,
        "batch_size": 64,
    },
    "seed001_lenet_fashion.yaml": {
        "model": "lenet",
        "dataset": "fashion_mnist",
        "optimizer": "sgd",
        "lr": 0.2,
        "batch_size": 256,
        "epochs": 10,
        "momentum": 0.0,
        "lr_schedule": "constant",
    },
    "seed001_resnet18_fashion.yaml": {
        "model": "resnet18",
        "dataset": "fashion_mnist",
        "optimizer": "sgd",
        "lr": 0.1,
        "batch_size": 256,
        "momentum": 0.0,
        "lr_schedule": "constant",
    },
}
