"""Your own model and data, trained by accel_train's loop: the same script on 1 CPU or under accelerate launch.

python examples/train_your_model.py
accelerate launch --config_file accelerate_configs/multi_cpu.yaml examples/train_your_model.py
"""

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import accel_train


class TinyNet(nn.Module):
    """Built by the loop as TinyNet(num_classes=, in_channels=, image_size=), from the data's sizes."""

    def __init__(self, num_classes: int, in_channels: int, image_size: int):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(), nn.Flatten())
        self.head = nn.Linear(32 * image_size * image_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


if __name__ == "__main__":
    digits = load_digits()  # 1,797 8x8 images, bundled with scikit-learn
    images = torch.tensor(digits.images[:, None] / 16.0, dtype=torch.float32)  # [N, 1, 8, 8] in [0, 1]
    labels = torch.tensor(digits.target)
    train_set, test_set = TensorDataset(images[:1400], labels[:1400]), TensorDataset(images[1400:], labels[1400:])
    accel_train.train(TinyNet, train_set, test_set, epochs=4, output_dir="runs/your_model", resume="auto")
