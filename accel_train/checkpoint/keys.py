"""Wrapper prefixes (``module.`` from DataParallel/DDP, ``_orig_mod.`` from torch.compile): the one place that
knows how to take them off a model or a state dict, in any order and nesting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported only where a model is unwrapped: run folders and plots stay light
    from torch import Tensor, nn

#: Key prefixes added by wrappers: DataParallel/DDP (``module.``) and torch.compile (``_orig_mod.``).
WRAPPER_PREFIXES: tuple[str, ...] = ("module.", "_orig_mod.")


def strip_key(key: str) -> str:
    """``key`` without any leading wrapper prefixes, in any order (``module._orig_mod.fc.weight`` -> ``fc.weight``)."""
    while key.startswith(WRAPPER_PREFIXES):
        key = key[len(next(p for p in WRAPPER_PREFIXES if key.startswith(p))) :]
    return key


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the plain module inside DataParallel/DDP and torch.compile wrappers (any nesting)."""
    from torch import nn

    while True:
        if isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod  # torch._dynamo OptimizedModule
        else:
            return model


def _strip_uniform(sd: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    prefixes: list[str] = []
    while sd:
        for prefix in WRAPPER_PREFIXES:
            if all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix) :]: v for k, v in sd.items()}
                prefixes.append(prefix)
                break
        else:
            break
    return sd, prefixes


def _mixed_prefixes(sd: Mapping[str, Tensor]) -> list[str]:
    return [p for p in WRAPPER_PREFIXES if any(k.startswith(p) for k in sd)]


def unwrap_state_dict(sd: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """Strip ``module.``/``_orig_mod.`` prefixes shared by ALL keys, repeatedly and in any order.

    Returns the stripped dict and the prefixes removed, outermost first. Prefixes
    found on only some keys are left alone (:func:`read_state_dict` reports them
    as ``mixed_prefixes``).
    """
    return _strip_uniform(dict(sd))


def _strip_everywhere(sd: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    """Strip wrapper prefixes from every key that has them; None if names would collide."""
    out: dict[str, Tensor] = {}
    for key, value in sd.items():
        key = strip_key(key)
        if key in out:
            return None
        out[key] = value
    return out


def _variants(raw: dict[str, Tensor]) -> list[tuple[dict[str, Tensor], list[str]]]:
    """Candidate key spellings of a raw state dict, the canonical (uniformly stripped) one first."""
    stripped, prefixes = _strip_uniform(raw)
    out = [(stripped, prefixes)]
    partial = raw
    for i, prefix in enumerate(prefixes[:-1] if prefixes else []):  # less stripped: for models named `module`
        partial = {k[len(prefix) :]: v for k, v in partial.items()}
        out.append((partial, prefixes[: i + 1]))
    if prefixes:
        out.append((raw, []))
    mixed = _mixed_prefixes(stripped)
    if mixed:
        everywhere = _strip_everywhere(stripped)
        if everywhere is not None:
            out.append((everywhere, prefixes + [f"{p} (some keys)" for p in mixed]))
    return out
