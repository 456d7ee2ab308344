"""Runs of accel_train.train for tests/integration/test_task_redteam_runs.py (the red-team's findings on the generic
task), and the models and data those tests share.

    python tests/task_redteam_train.py OUT CASE[,CASE...]
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml tests/task_redteam_train.py OUT CASE ...

Cases: ``tagger`` (token classification: variable-length sentences padded per batch, -100 on the padding and on
each sentence's first token, metrics=["accuracy"]) and ``noisy`` (a dataset whose ``__getitem__`` adds
``torch.randn`` jitter: a run on two processes must not take it for other samples on each rank). Each case writes
OUT/<case>.
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset, TensorDataset

import accel_train

BASE = dict(optimizer="sgd", lr=0.05, global_batch_size=8, max_steps=6, eval_every=3, report_to="none",
            progress=False, plots=False, seed=3)  # fmt: skip
TRUE_W = torch.tensor([1.0, -2.0, 0.5, 3.0])


def features(n: int = 96, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.out = nn.Embedding(20, 8), nn.Linear(8, 3)

    def forward(self, input_ids, attention_mask=None, labels=None):
        return {"logits": self.out(self.emb(input_ids))}


def tagged(n: int, seed: int) -> list[dict]:
    """``n`` sentences of 2 to 11 tokens; the tag is the token id mod 3, the first token (a [CLS]) unlabelled."""
    g, rows = torch.Generator().manual_seed(seed), []
    for _ in range(n):
        ids = torch.randint(1, 20, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g)
        labels = ids % 3
        labels[0] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def pad(samples: list[dict]) -> dict:
    ids = pad_sequence([s["input_ids"] for s in samples], batch_first=True, padding_value=0)
    labels = pad_sequence([s["labels"] for s in samples], batch_first=True, padding_value=-100)
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}


class Noisy(Dataset):
    """Features with random jitter drawn in ``__getitem__``: an augmentation, the same data every run."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + 0.01 * torch.randn(4), self.y[i]


def run(out: str, case: str, **extra) -> dict:
    """One case into OUT/<case>; ``extra`` options win."""
    folder = os.path.join(out, case)
    if case == "tagger":
        options = {**BASE, "max_steps": 8, "eval_every": 100, "lr": 0.5, **extra}
        return accel_train.train(Tagger, tagged(64, 0), tagged(16, 1), collate_fn=pad, metrics=["accuracy"],
                                 output_dir=folder, **options)  # fmt: skip
    if case == "noisy":
        x = features(48)
        y = (x[:, 0] > 0).long()
        data, test = Noisy(x[:32], y[:32]), TensorDataset(x[32:], y[32:])
        return accel_train.train(
            lambda: nn.Linear(4, 2), data, test, output_dir=folder, **{**BASE, "max_steps": 4, **extra}
        )
    raise SystemExit(f"unknown case {case}")


if __name__ == "__main__":
    for name in sys.argv[2].split(","):
        run(sys.argv[1], name)
