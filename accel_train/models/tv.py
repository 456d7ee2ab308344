"""``tv:NAME``: any torchvision classification model, random weights (``weights=None``: never downloads).

``num_classes`` goes to torchvision's own constructor; ``in_channels`` other than 3 replaces the first
convolution. Whether an image size fits the architecture is found by a forward pass on the meta device
(shapes only, no memory, no arithmetic), so a size that is too small is a one-line error that names the
smallest one that works instead of a shape error from deep inside the first epoch.
"""

from __future__ import annotations

import functools
import re

import torch
import torch.nn as nn

from accel_train.errors import UserError

PREFIX = "tv:"
MAX_PROBE = 1024  # the largest side searched for a minimum
# Families whose constructor depends on the image size, and the sides they take (multiples of this step).
_STEP_PATTERNS = ((re.compile(r"^vit_\w_(\d+)$"), None), (re.compile(r"^maxvit_"), 224))


def classification_models() -> list[str]:
    """torchvision's classification models (not detection, segmentation or video)."""
    import torchvision.models as tvm

    return list(tvm.list_models(module=tvm))


def check_name(name: str) -> None:
    import difflib

    known = classification_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {', '.join(PREFIX + c for c in close)}?)" if close else ""
        raise UserError(
            f"unknown torchvision model {PREFIX}{name}{hint}; choose one of torchvision's {len(known)} "
            "classification models, e.g. tv:resnet50, tv:mobilenet_v3_small, tv:efficientnet_b0, tv:vit_b_16"
        )


def _step(name: str) -> int:
    """Sides a size-dependent family takes are multiples of this (ViT: the patch size; MaxViT: 224)."""
    for pattern, step in _STEP_PATTERNS:
        match = pattern.match(name)
        if match:
            return step or int(match.group(1))
    return 1


def _constructor_kwargs(name: str, image_size: int) -> dict:
    """What some families need besides ``num_classes``: the image size, and no auxiliary heads.

    The loop expects one tensor of logits: GoogLeNet and Inception v3 would return a tuple with their
    auxiliary classifiers in training mode.
    """
    if name.startswith("vit_"):
        return {"image_size": image_size}
    if name.startswith("maxvit_"):
        return {"input_size": (image_size, image_size)}
    if name in ("googlenet", "inception_v3"):
        return {"aux_logits": False, "init_weights": True}
    return {}


def adapt_in_channels(model: nn.Module, in_channels: int) -> nn.Module:
    """Replace the first 3-channel convolution by one taking ``in_channels``.

    The new kernel cycles through the original's input channels, so it keeps the distribution the
    architecture initialised it with (torchvision's fan-out inits do not depend on input channels).
    """
    if in_channels == 3:
        return model
    for parent in model.modules():
        for child_name, conv in parent.named_children():
            if isinstance(conv, nn.Conv2d) and conv.in_channels == 3 and conv.groups == 1:
                new = nn.Conv2d(
                    in_channels,
                    conv.out_channels,
                    conv.kernel_size,
                    conv.stride,
                    conv.padding,
                    conv.dilation,
                    bias=conv.bias is not None,
                    padding_mode=conv.padding_mode,
                )
                with torch.no_grad():
                    new.weight.copy_(conv.weight[:, [i % 3 for i in range(in_channels)]])
                    if conv.bias is not None:
                        new.bias.copy_(conv.bias)
                setattr(parent, child_name, new)
                return model
    raise UserError(f"cannot adapt {type(model).__name__} to {in_channels} input channels: no 3-channel first conv")


def build(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """The model, random weights, adapted to ``in_channels``."""
    import torchvision.models as tvm

    kwargs = _constructor_kwargs(name, image_size)
    model = tvm.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    return adapt_in_channels(model, in_channels)


def meta_build(name: str, num_classes: int, in_channels: int, image_size: int) -> nn.Module:
    """``build`` with every parameter and buffer on the meta device (nothing allocated, nothing initialised)."""
    from accelerate import init_empty_weights

    # Not ``with torch.device("meta")``: some constructors (RegNet) compute widths with tensors and read them back.
    with init_empty_weights(include_buffers=False):
        model = build(name, num_classes, in_channels, image_size)
    return model.to("meta").eval()


_PROBE_ERRORS = (RuntimeError, ValueError, AssertionError, IndexError, TypeError, ZeroDivisionError)


def _error(name: str, size: int, model: nn.Module | None = None) -> str | None:
    """Why ``name`` cannot take ``size``x``size`` images (None when it can): a forward pass on the meta device."""
    try:
        if model is None or _step(name) > 1:  # size-dependent constructors are rebuilt for each size
            model = meta_build(name, 10, 3, size)
        with torch.no_grad():
            model(torch.empty(2, model_in_channels(model), size, size, device="meta"))
    except _PROBE_ERRORS as exc:
        return " ".join(str(exc).split())[:160] or type(exc).__name__
    return None


def model_in_channels(model: nn.Module) -> int:
    first = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    return first.in_channels if first is not None else 3


@functools.lru_cache(maxsize=64)
def min_image_size(name: str) -> int:
    """The smallest side ``name`` takes, searched with meta-device forwards (cached per name)."""
    step = _step(name)
    model = None if step > 1 else meta_build(name, 10, 3, 224)
    lo, hi = 1, MAX_PROBE // step
    if _error(name, hi * step, model) is not None:
        return 224  # nothing sensible found: the size torchvision's models are made for
    while lo < hi:  # bisect on the multiples of step; the models here fit every size above their minimum
        mid = (lo + hi) // 2
        if _error(name, mid * step, model) is None:
            hi = mid
        else:
            lo = mid + 1
    return lo * step


def check_fits(name: str, num_classes: int, in_channels: int, image_size: int, max_params: int) -> None:
    """One-line UserErrors for an image size the architecture cannot take, or a model over ``max_params``."""
    spec, size = PREFIX + name, image_size
    try:
        model = meta_build(name, num_classes, in_channels, size)
    except _PROBE_ERRORS:
        model = None  # a constructor that refuses the size (ViT: not a multiple of the patch)
    if model is None or _error(name, size, model) is not None:
        low, step = min_image_size(name), _step(name)
        if size < low:
            raise UserError(
                f"model {spec} needs images of at least {low}x{low}, got {size}x{size}; "
                f"resize them with --image-size {low} or larger"
            )
        fits = next((s for s in range(size + 1, size + 8 * step + 1) if s % step == 0 and _error(name, s) is None), low)
        raise UserError(
            f"model {spec} cannot take {size}x{size} images ({_error(name, size)}); "
            f"resize them with --image-size {fits}"
        )
    count = sum(t.numel() for t in model.state_dict().values())
    if count > max_params:
        raise UserError(
            f"model {spec} at {size}x{size} with {num_classes} classes would have {count:,} parameters "
            f"(limit {max_params:,}); choose a smaller model or image size"
        )
