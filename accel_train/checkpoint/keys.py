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
    """``key`` without any leading wrapper prefixes, in any order (``module._orig_mod.fc.weight`` -> ``fc.weight``).

    Own code: torch's ``consume_prefix_in_state_dict_if_present`` takes one given prefix off a whole dict,
    not every wrapper prefix, in any order, off one key."""
    while key.startswith(WRAPPER_PREFIXES):
        key = key[len(next(p for p in WRAPPER_PREFIXES if key.startswith(p))) :]
    return key


def unwrap_model(model: nn.Module) -> nn.Module:
    """Return the plain module inside DataParallel/DDP/FSDP/DeepSpeed and torch.compile wrappers (any nesting).

    accelerate's ``extract_model_from_parallel`` unwraps them; one call takes off only the outermost
    ``torch.compile``, so a compiled model inside DDP/DataParallel needs a second call: repeat until nothing
    changes (tests/unit/test_ecosystem.py shows the single call falling short).

    A model with neither ``module`` nor ``_orig_mod`` (what every one of those wrappers holds its model in)
    is returned as is: accelerate's check for ``torch.compile`` reads ``torch._dynamo``, and that import
    alone costs ``accel-evaluate``/``accel-predict``/``accel-convert`` about 1.5 s.
    """
    if not hasattr(model, "module") and not hasattr(model, "_orig_mod"):
        return model
    from accelerate.utils import extract_model_from_parallel

    while True:
        inner = extract_model_from_parallel(model, keep_torch_compile=False)
        if inner is model:
            return model
        model = inner


def _strip_uniform(sd: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    # Own code, not torch's consume_prefix_in_state_dict_if_present: that one renames in place, key by key, so
    # ``module.module.x`` (a child named ``module``, under DDP) overwrites ``module.x`` before that key is renamed
    # itself, and a tensor is lost; and it strips keys that have the prefix even when others do not, where mixed
    # prefixes must be left alone and reported. tests/unit/test_ecosystem.py shows both.
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
