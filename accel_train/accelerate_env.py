"""The environment variables accelerate reads, checked like flags before the Accelerator exists.

``accelerate launch`` passes an accelerate config to the processes it starts as ``ACCELERATE_*`` variables,
and users set them by hand too. accelerate reads some of them unchecked: ``ACCELERATE_MIXED_PRECISION=bogus``
(or ``BF16``, in capitals) trains in fp32 and is recorded as ``"bogus"``; others end in a traceback deep inside
accelerate (``fp8`` without Transformer Engine, a truth value it cannot parse, a step count that is not a
number, an unknown dynamo backend or torch device). Each is one line here, naming the variable, its value
and the values allowed, each judged by the parser accelerate itself uses. Called where the Accelerator is
built (accelerate and torch are loaded there anyway).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accel_train.errors import UserError

PRECISIONS = (
    "no",
    "fp16",
    "bf16",
)  # what accel_train trains in (accelerate's fp8 is not supported): --mixed-precision's choices
_FLAGS = ("ACCELERATE_USE_CPU", "ACCELERATE_DEBUG_MODE", "ACCELERATE_DYNAMO_USE_FULLGRAPH",
          "ACCELERATE_DYNAMO_USE_DYNAMIC", "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION")  # fmt: skip


def _refuse(name: str, value: str, allowed: str) -> UserError:
    return UserError(
        f"the environment variable {name}={value!r} (set by `accelerate launch` from your accelerate config, or "
        f"by hand) is not valid: {allowed}; fix the config (`accelerate config`) or unset {name}"
    )


def mixed_precision_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """``ACCELERATE_MIXED_PRECISION`` as accel_train will train with it (lower case), None when unset."""
    value = env.get("ACCELERATE_MIXED_PRECISION")
    if value is None:
        return None
    normal = value.strip().lower()
    if normal == "fp8":
        raise _refuse("ACCELERATE_MIXED_PRECISION", value, "accel_train trains in no, fp16 or bf16, not fp8 (use bf16)")
    if normal not in PRECISIONS:
        raise _refuse("ACCELERATE_MIXED_PRECISION", value, f"choose one of {', '.join(PRECISIONS)}")
    return normal


def check_accelerate_env(env: Mapping[str, str] = os.environ) -> str | None:
    """Refuse every ``ACCELERATE_*`` value accelerate would misread or fail on; returns the mixed precision the
    environment asks for (lower case; None when unset), to be passed to the Accelerator explicitly."""
    from accelerate.utils import str_to_bool  # what accelerate parses these flags with: the same verdict

    for name in _FLAGS:
        value = env.get(name)
        if value is None:
            continue
        try:
            str_to_bool(value)
        except ValueError:
            raise _refuse(name, value, "use true or false (or 1/0, yes/no)") from None
    steps = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    if steps is not None and not (steps.strip().isdigit() and int(steps) >= 1):
        raise _refuse("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", steps, "use a whole number >= 1")
    backend = env.get("ACCELERATE_DYNAMO_BACKEND")
    if backend is not None and backend.upper() not in _dynamo_backends():  # accelerate: DynamoBackend(upper())
        raise _refuse("ACCELERATE_DYNAMO_BACKEND", backend, "use no, inductor (what --compile uses) or another "
                      "torch.compile backend accelerate knows")  # fmt: skip
    device = env.get("ACCELERATE_TORCH_DEVICE")
    if device is not None and not _is_device(device):
        raise _refuse("ACCELERATE_TORCH_DEVICE", device, "use a torch device such as cpu, cuda or cuda:0")
    return mixed_precision_from_env(env)


def _dynamo_backends() -> set[str]:
    from accelerate.utils import DynamoBackend

    return {b.value.upper() for b in DynamoBackend}


def _is_device(text: str) -> bool:
    import torch  # accelerate reads the variable with torch.device(text): the same parser decides here

    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        return False
    return True
