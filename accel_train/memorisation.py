"""Did the run learn the task or memorise its training images? Judged once, at the end, from ``metrics.jsonl``.

Two signs, either enough (thresholds chosen from runs on a 120-image folder: ``lenet`` without augmentation for 40
epochs ends at 100% training vs 37% test accuracy, its eval loss up from 1.2 to 5.4; a run that generalises ends
within a few points, its eval loss near its lowest):

* the training accuracy of the last window exceeds the final evaluation accuracy by :data:`GAP` or more,
  the evaluation error being :data:`ERROR_RATIO` times the training error or more (50% right in training and 23%
  in evaluation, on three classes, is a model that learnt little, not one that memorised). The last window is the
  last logged one, or the steps after it that no record holds (the trainer's open window) when they are at least
  as many: a run shorter than ``--log-every`` logs no train record and is judged on all its steps;
* the evaluation loss rose from its lowest to the end (by :data:`LOSS_RISE` times and :data:`LOSS_RISE_MIN`) while
  the training loss fell over the same steps.

One line (``warning: ...`` on stderr) says which, and what to try; ``summary.json["warning"]`` holds it; the run
ends as it would. The whole run's records are read, a resumed run's earlier attempts included.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accel_train.run_records import read_metrics

GAP = 0.25  # training accuracy minus evaluation accuracy
ERROR_RATIO = 2.0  # and the evaluation error at least this many times the training error
LOSS_RISE = 1.5  # final eval loss over the lowest
LOSS_RISE_MIN = 0.3  # and at least this much higher
MIN_EVALS = 3  # evaluations needed to speak of a trend


def _number(record: Mapping[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _with_open_window(train: Sequence[Mapping], open_window: Mapping[str, Any] | None) -> Sequence[Mapping]:
    """``train``, ending with ``open_window`` (``step``, ``loss``, ``accuracy`` of the steps after the last train
    record) when it holds at least as many steps as the last logged window."""
    step = _number(open_window or {}, "step")
    if step is None:
        return train
    steps = [s for r in train if (s := _number(r, "step")) is not None]
    last = steps[-1] if steps else 0.0
    previous = steps[-2] if len(steps) > 1 else 0.0
    if step <= last or step - last < last - previous:
        return train
    return [*train, open_window]


def _accuracy_gap(train: Sequence[Mapping], evals: Sequence[Mapping]) -> str | None:
    if not train or not evals:
        return None
    train_acc, eval_acc = _number(train[-1], "accuracy"), _number(evals[-1], "eval_accuracy")
    if train_acc is None or eval_acc is None or train_acc - eval_acc < GAP:
        return None
    if 1 - eval_acc < ERROR_RATIO * (1 - train_acc):  # both far from right: it did not learn, nor memorise
        return None
    return f"training accuracy {train_acc:.2f} vs evaluation accuracy {eval_acc:.2f}"


def _loss_rise(train: Sequence[Mapping], evals: Sequence[Mapping]) -> str | None:
    losses = [(r["step"], v) for r in evals if (v := _number(r, "eval_loss")) is not None]
    if len(losses) < MIN_EVALS:
        return None
    best_step, best = min(losses, key=lambda sv: sv[1])
    last_step, last = losses[-1]
    if last < best * LOSS_RISE or last - best < LOSS_RISE_MIN:
        return None
    train_losses = [(r["step"], v) for r in train if (v := _number(r, "loss")) is not None]
    # the training loss logged by the best evaluation (the first one logged when none was yet: a first evaluation
    # at the end of epoch 0 comes before the first train record of --log-every 10), and by the last
    then = [v for s, v in train_losses if s <= best_step] or [v for _, v in train_losses[:1]]
    now = [v for s, v in train_losses if s <= last_step]
    if not then or not now or now[-1] >= then[-1]:
        return None
    return f"evaluation loss rose from {best:.2f} (step {best_step}) to {last:.2f} while training loss fell"


def memorisation_warning(
    records: Mapping[str, Sequence[Mapping]],
    augmented: bool,
    pretrained: bool,
    open_window: Mapping[str, Any] | None = None,
) -> str | None:
    """The one-line warning for a run whose ``records`` (event -> records, by step) show memorisation, or None.
    ``open_window``: the train figures of the steps after the last train record (``step``: the run's last)."""
    train, evals = _with_open_window(records.get("train", []), open_window), records.get("eval", [])
    signs = [s for s in (_accuracy_gap(train, evals), _loss_rise(train, evals)) if s]
    if not signs:
        return None
    tries = ([] if augmented else ["--augment"]) + ["more training images"]
    tries += [] if pretrained else ["a pretrained model (--model tv:resnet18 --pretrained)"]
    tries.append("a smaller model (or fewer --epochs)")
    return (
        f"the model memorised its training images rather than learning the task: {'; '.join(signs)}; "
        f"try {', '.join(tries)}"
    )


def check_memorised(
    metrics: Path, resolved: Mapping[str, Any], pretrained: str | None, open_window: Mapping[str, Any] | None = None
) -> dict[str, str]:
    """``{"warning": line}`` for the summary of a run (its ``metrics.jsonl``; ``resolved``: what it resolved to,
    ``augment`` included; ``open_window``: as for :func:`memorisation_warning`) that memorised, the line printed;
    ``{}`` otherwise. Main process only."""
    augmented = bool(resolved.get("augment"))
    warning = memorisation_warning(read_metrics(metrics), augmented, pretrained is not None, open_window)
    if warning is None:
        return {}
    print(f"warning: {warning}", file=sys.stderr, flush=True)
    return {"warning": warning}
