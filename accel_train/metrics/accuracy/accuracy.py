"""Accuracy as an `evaluate` metric, built by ``accel_train.metrics.load_metric`` (no hub access,
no module cache). The file also loads with ``evaluate.load(path)``, whose dependency scanner reads
its imports line by line: keep ``import datasets`` and ``import evaluate`` on separate lines.
"""

import datasets
import evaluate

_DESCRIPTION = "Fraction of predictions equal to the references."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
Returns:
    accuracy (float): correct / total.
"""
_CITATION = ""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}),
        )

    def _compute(self, predictions, references):
        total = len(references)
        correct = sum(int(p == r) for p, r in zip(predictions, references, strict=True))
        return {"accuracy": correct / total if total else 0.0}
