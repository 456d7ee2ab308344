"""The time-to-accuracy rival: pytorch/examples' MNIST recipe (``mnist/main.py``), written out plainly.

The recipe as that script has it by default: its Net (conv 32 3x3, conv 64 3x3, max-pool, dropout 0.25, fc 128,
dropout 0.5, fc 10, log_softmax), NLL loss, Adadelta lr 1.0, StepLR gamma 0.7 each epoch, batch 64, test batch
1000, ``ToTensor()`` + ``Normalize((0.1307,), (0.3081,))``, ``torchvision.datasets.MNIST`` read from a folder
(``download=True``: it fetches nothing when the files are there), seed 1, the train loss printed every 10 batches
and one test pass after each epoch. Like the original, the loaders shuffle and use a worker only on an accelerator
(on CPU: no shuffle, no workers).

Two additions for the benchmark, neither of which changes what is trained: each test pass prints one line
``eval {"epoch": E, "accuracy": A}`` (flushed) that the harness timestamps as it arrives, and ``--stop-at``
ends the run after the first test pass at or above that accuracy instead of running all ``--epochs``.

``python benchmarks/speed/examples_mnist.py --data-dir DIR [--epochs 14] [--stop-at 0.98]``
"""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torchvision import datasets, transforms


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, device, loader, optimizer, epoch, log_interval=10):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item():.6f}")


def test(model, device, loader) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            correct += model(data).argmax(dim=1).eq(target).sum().item()
    return correct / len(loader.dataset)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", required=True, help="folder holding MNIST/raw (torchvision's layout)")
    parser.add_argument("--epochs", type=int, default=14, help="number of epochs (default: 14)")
    parser.add_argument("--stop-at", type=float, default=None, help="stop after the first test pass >= this")
    args = parser.parse_args()
    use_accel = torch.accelerator.is_available()
    torch.manual_seed(1)
    device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
    train_kwargs, test_kwargs = {"batch_size": 64}, {"batch_size": 1000}
    if use_accel:
        accel_kwargs = {"num_workers": 1, "persistent_workers": True, "pin_memory": True, "shuffle": True}
        train_kwargs.update(accel_kwargs)
        test_kwargs.update(accel_kwargs)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST(args.data_dir, train=True, download=True, transform=transform)
    test_set = datasets.MNIST(args.data_dir, train=False, transform=transform)
    train_loader = torch.utils.data.DataLoader(train_set, **train_kwargs)
    test_loader = torch.utils.data.DataLoader(test_set, **test_kwargs)
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train(model, device, train_loader, optimizer, epoch)
        accuracy = test(model, device, test_loader)
        print("eval " + json.dumps({"epoch": epoch, "accuracy": accuracy}), flush=True)
        scheduler.step()
        if args.stop_at is not None and accuracy >= args.stop_at:
            break


if __name__ == "__main__":
    main()
