"""Runs of accel_train.train on the generic task, for tests/integration/test_task_runs.py: one launch, several runs.

    python tests/task_train.py OUT CASE[,CASE...] [key=value ...]
    accelerate launch --config_file accelerate_configs/multi_cpu.yaml tests/task_train.py OUT CASE ...

A case is ``<task>-<variant>``: task ``text`` (a two-layer BERT built from a config, word-level tokenizer trained
on the sentences, nothing downloaded; dropout on, attention through scaled_dot_product_attention) or ``reg`` (an
MLP regression with dropout); variant ``sgd`` (global batch 16; no attention dropout), ``bitwise`` (--bitwise,
micro-batch 8, global batch 16: 1 x 2 on one process, 2 x 1 on two), ``stop`` (stop at step 5) and ``resume``
(resume it),
``straight`` (the same run without a stop), ``auto`` (--max-device-batch auto), ``tb`` (TensorBoard, plots, early
stopping), ``long``/``term``/``termresume`` (30 steps: straight, to be stopped by a signal, resumed; with
TASK_STEP_SLEEP_S the regressor's training forward sleeps that long). Each case writes OUT/<case>; ``key=value``
options go to every run.
"""

from __future__ import annotations

import inspect
import math
import os
import shutil
import statistics
import string
import sys
import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

import accel_train

TEXT_SOURCES = ((math, statistics, string), (os, os.path, shutil))  # label 0: numbers and text; 1: files


def sentences() -> list[tuple[str, int]]:
    """Real English: the first lines of the standard library's docstrings, labelled by the modules they come from."""
    rows = []
    for label, modules in enumerate(TEXT_SOURCES):
        for module in modules:
            for name in sorted(dir(module)):
                item = getattr(module, name, None)
                if not callable(item):  # values (a module's constants) have their type's docstring, or change
                    continue
                doc = inspect.getdoc(item) or ""
                line = doc.strip().splitlines()[0] if doc.strip() else ""
                if len(line.split()) >= 3 and not name.startswith("_"):
                    rows.append((line.lower(), label))
    return sorted(set(rows))


def text_data(attention_dropout: float = 0.1):
    """(train, eval, collate, model builder): a tokenized ``datasets.Dataset`` and a tiny BERT."""
    import datasets
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import BertConfig, BertForSequenceClassification, DataCollatorWithPadding, PreTrainedTokenizerFast

    rows = sentences()
    raw = datasets.Dataset.from_dict({"text": [t for t, _ in rows], "label": [y for _, y in rows]})
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(raw["text"], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]"], min_frequency=2))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]")
    data = raw.map(lambda b: tokenizer(b["text"], truncation=True, max_length=24), batched=True,
                   remove_columns=["text"])  # fmt: skip
    data.set_format("torch")
    split = data.train_test_split(test_size=81, seed=0)  # 81: two processes' blocks are 40 and 41
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=attention_dropout)  # fmt: skip

    def build():
        return BertForSequenceClassification(config)

    return split["train"], split["test"], DataCollatorWithPadding(tokenizer), build


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def forward(self, x):
        if os.environ.get("TASK_STEP_SLEEP_S") and self.training:  # slow enough for a signal to land mid-run
            time.sleep(float(os.environ["TASK_STEP_SLEEP_S"]))
        return self.net(x)


def reg_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(203, 6, generator=g)
    y = torch.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.05 * torch.randn(203, generator=g)
    return TensorDataset(x[:160], y[:160]), TensorDataset(x[160:], y[160:]), None, Regressor


VARIANTS = {
    "sgd": {},
    "bitwise": {"bitwise": True, "max_device_batch": 8},
    "stop": {"stop_at_step": 5, "checkpoint_every": 5},
    "resume": {"resume": "auto", "checkpoint_every": 5},
    "straight": {"checkpoint_every": 5},
    "auto": {"max_device_batch": "auto"},
    "tb": {"report_to": "tensorboard", "plots": True, "early_stop_patience": 1},
    "long": {"max_steps": 30, "checkpoint_every": 5},  # what a SIGTERM'd run and its resume must equal
    "term": {"max_steps": 30, "checkpoint_every": 5},
    "termresume": {"max_steps": 30, "checkpoint_every": 5, "resume": "auto"},
    "ranksdiffer": {},
}
SAME_FOLDER = {"resume": "stop", "termresume": "term"}  # a resume continues the run in that case's folder


def run(out: str, case: str, extra: dict) -> dict:
    task, variant = case.split("-")
    # sgd: attention dropout off (scaled_dot_product_attention draws it per micro-batch, which differs between
    # 16 on one process and 8 on two); nn.Dropout stays on, keyed on each sample
    train, test, collate, build = text_data(0.0 if variant == "sgd" else 0.1) if task == "text" else reg_data()
    if variant == "ranksdiffer":  # a user's split drawn from each process's own generator: other data per rank
        g = torch.Generator().manual_seed(int(os.environ.get("RANK", "0")))
        train, _ = torch.utils.data.random_split(train, [len(train) - 10, 10], generator=g)
    metrics = ["accuracy", "f1"] if task == "text" else ["mse", "mae"]
    options = dict(optimizer="sgd", lr=0.05, momentum=0.9, global_batch_size=16, max_steps=12, eval_every=6,
                   report_to="none", progress=False, plots=False, seed=3)  # fmt: skip
    options.update(VARIANTS[variant])
    options.update(extra)
    folder = os.path.join(out, f"{task}-{SAME_FOLDER.get(variant, variant)}")
    return accel_train.train(build, train, test, collate_fn=collate, metrics=metrics, output_dir=folder, **options)


def _value(text: str):
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


if __name__ == "__main__":
    out, cases = sys.argv[1], sys.argv[2].split(",")
    extra = {k: _value(v) for k, v in (a.split("=", 1) for a in sys.argv[3:])}
    for case in cases:
        run(out, case, extra)
