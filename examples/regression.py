"""A regression (disease progression from scikit-learn's diabetes data) trained by accel_train's loop, on any setup.

    python examples/regression.py
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/regression.py

The samples are ``(features, target)`` pairs with float targets: accel_train trains a regression, passes each
batch's features to the model, and takes the mean squared error as the loss. MSE and MAE are computed on the whole
eval set on any number of processes; best/ and early stopping follow eval_mse (lower is better).
"""

import torch
from sklearn.datasets import load_diabetes
from torch import nn
from torch.utils.data import TensorDataset

import accel_train


class MLP(nn.Module):
    def __init__(self, features: int = 10):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


if __name__ == "__main__":
    data = load_diabetes()  # 442 patients, 10 features, bundled with scikit-learn
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.float32)
    y = (y - y[:350].mean()) / y[:350].std()  # targets in units of the training set's spread
    x = x * 20  # the bundled features are scaled to unit norm over the 442 rows: about unit variance now
    train, test = TensorDataset(x[:350], y[:350]), TensorDataset(x[350:], y[350:])
    accel_train.train(
        MLP,
        train,
        test,
        metrics=["mse", "mae", "r_squared"],
        optimizer="adamw",
        lr=3e-3,
        global_batch_size=32,
        epochs=40,
        early_stop_patience=10,
        output_dir="runs/regression",
        resume="auto",  # run again after a stop (SIGTERM, a requeue): it goes on from the last checkpoint
    )
