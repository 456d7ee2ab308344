"""Classification and regression scores as one `evaluate` metric with a config per score, computed by
scikit-learn (as the hub's ``f1``, ``precision``, ``recall``, ``matthews_correlation``, ``mse``, ``mae`` and
``r_squared`` modules compute them), built by ``accel_train.metrics.load_metric`` (no hub access, no module
cache). The file also loads with ``evaluate.load(path, config_name)``, whose dependency scanner reads its imports
line by line: keep ``import datasets`` and ``import evaluate`` on separate lines.

Averaging: two classes score the positive class (label 1, as the hub's modules do by default); more classes
take the macro average (the hub's modules would refuse them without ``average=``). ``num_classes`` (the run's)
fixes the classes averaged over: without it, the classes an evaluation happens to see.
"""

import datasets
import evaluate

_DESCRIPTION = "f1, precision, recall, matthews_correlation (class indices); mse, rmse, mae, r_squared (values)."
_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted class indices (classification) or values (regression).
    references: true class indices or values.
Returns:
    {config_name: float}
"""
_CITATION = ""
CLASSIFICATION = ("f1", "precision", "recall", "matthews_correlation")
REGRESSION = ("mse", "rmse", "mae", "r_squared")


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class Scores(evaluate.Metric):
    def _info(self):
        if self.config_name not in CLASSIFICATION + REGRESSION:
            raise KeyError(f"no score {self.config_name!r}; the scores are {', '.join(CLASSIFICATION + REGRESSION)}")
        kind = "int64" if self.config_name in CLASSIFICATION else "float64"
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({"predictions": datasets.Value(kind), "references": datasets.Value(kind)}),
        )

    def _compute(self, predictions, references, num_classes=None):
        from sklearn import metrics

        name = self.config_name
        if name in REGRESSION:
            if name == "r_squared":
                return {name: float(metrics.r2_score(references, predictions))}
            error = metrics.mean_absolute_error if name == "mae" else metrics.mean_squared_error
            value = float(error(references, predictions))
            return {name: value**0.5 if name == "rmse" else value}
        if name == "matthews_correlation":
            return {name: float(metrics.matthews_corrcoef(references, predictions))}
        if num_classes:  # the run's classes: the same averaging at every evaluation, whichever classes it sees
            labels = list(range(num_classes))
            average = "binary" if num_classes <= 2 else "macro"
        else:
            labels = sorted(set(references) | set(predictions))
            average = "binary" if set(labels) <= {0, 1} else "macro"
        score = {"f1": metrics.f1_score, "precision": metrics.precision_score, "recall": metrics.recall_score}[name]
        kept = {} if average == "binary" else {"labels": labels}
        return {name: float(score(references, predictions, average=average, zero_division=0, **kept))}
