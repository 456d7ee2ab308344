"""Invalid values for every input layer's fields, shared by tests/unit/test_fuzz_inputs.py (flags, YAML keys, an
export's config.json) and tests/integration/test_fuzz_inputs_runs.py (a checkpoint's progress.json).

The generator is seeded (``random.Random(RNG_SEED)``): the cases are the same on every run.
"""

from __future__ import annotations

import random
from typing import Any

from accel_train.errors import UserError
from accel_train.flags import field_type

RNG_SEED = 0


# the lower bound of every int field (all have one), and the floats that must be > 0 rather than >= 0
_POSITIVE_FLOATS = {"lr", "lr_gamma", "dist_timeout", "val_split", "head_lr"}


_FREE_TEXT = {"data_dir", "output_dir", "image_column", "label_column"}  # any non-empty text without NUL is valid


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice("abcxyz_-!@ ") for _ in range(rng.randint(1, 12))).strip() or "junk"


def _int_values(name: str, rng: random.Random) -> list[Any]:
    """Invalid values for an int field: text, fractions, negatives, beyond int64 (and seeds beyond 2**32)."""
    values: list[Any] = [
        -rng.randint(1, 10**6),
        rng.randint(2**63, 2**80),
        rng.randint(1, 100) + 0.5,
        _junk(rng),
        "1e3",
        float("nan"),
    ]
    if name == "seed":
        values.append(2**32 + rng.randint(0, 10**6))
    return values


def _float_values(name: str, rng: random.Random) -> list[Any]:
    values: list[Any] = [float("nan"), float("inf"), -float("inf"), -rng.uniform(1e-6, 1e6), _junk(rng)]
    if name in _POSITIVE_FLOATS:
        values.append(0.0)
    if name == "val_split":
        values.append(1.0 + rng.uniform(0, 5))
    return values


def _str_values(f, rng: random.Random) -> list[Any]:
    values: list[Any] = ["", f"a\x00{_junk(rng)}"]
    if "choices" in f.metadata:
        values += [f"{_junk(rng)}{rng.randint(0, 99)}" for _ in range(3)]
    elif f.name == "model":
        values += [f"net_{_junk(rng)}", "LeNet"]
    elif f.name == "dataset":
        values += [f"{_junk(rng)}", "imagefolder:", f"zip:{_junk(rng)}"]
    elif f.name == "resume":
        values += [f"/no/such/{_junk(rng)}/step_1"]
    elif f.name == "lr_milestones":
        values += ["0.75,0.5", "1.5", f"{_junk(rng)}", "0.5,nan", ","]
    elif f.name == "pretrained":  # the default model is lenet: weights for a tv: model only, and ones that exist
        values += ["DEFAULT", f"/no/such/{_junk(rng)}.pth", f"{_junk(rng)}_V1"]
    elif f.name == "report_to":  # any of accelerate's trackers, comma-separated; 'none' alone
        values += [f"{_junk(rng)}{rng.randint(0, 99)}", "none,csv", "csv,,tensorboard"]
    elif f.name == "freeze":
        values += ["backbone"]  # without --pretrained (a pattern is checked against the built model)
    else:
        assert f.name in _FREE_TEXT, f"new text field {f.name}: say which of its values are invalid"
    return values


def invalid_values(f, rng: random.Random) -> list[Any]:
    """Values of field ``f`` that the config must refuse (each one, whatever the other fields hold)."""
    typ = field_type(f)
    if typ is bool:
        return ["maybe", 2, [True], {"a": 1}, 1.5]
    if typ is int:
        return _int_values(f.name, rng)
    if typ is float:
        return _float_values(f.name, rng)
    return _str_values(f, rng)


def _refused(action, case: str) -> str:
    try:
        action()
    except UserError as exc:
        message = str(exc)
        assert message and "\n" not in message, f"{case}: not one line: {message!r}"
        return message
    except Exception as exc:  # noqa: BLE001 - the point: any other type is a traceback for the user
        raise AssertionError(f"{case}: {type(exc).__name__} instead of a UserError: {exc}") from exc
    raise AssertionError(f"{case}: accepted")


def _export_values(rng: random.Random) -> dict[str, list[Any]]:
    n = rng.randint(2, 50)
    return {
        "model": [f"vit_{_junk(rng)}", 7, ["lenet"], None],
        "num_classes": ["ten", float("inf"), 0, -n, 10**9, 2.5, True, [10], None],
        "in_channels": ["1", 0, -1, 1000, float("nan"), False],
        "image_size": ["28", 0, 5, 10**12, 28.5, -28, None, {"side": 28}],
        "mean": [None, "0.5", [], ["0.1"], [0.1, 0.2, 0.3], float("nan"), {"r": 0.1}, True],
        "std": [None, "0.3", [0.0], [-0.3], [float("inf")], [0.1, 0.2], [], False],
        "class_names": ["0123456789", [str(i) for i in range(n % 9 + 1)], [{"name": "x"}] * 10, 10, {"0": "a"}],
        "dataset": [5, ["digits"], {"name": "digits"}],
    }
