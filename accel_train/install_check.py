"""Does the installed torchvision work with the installed torch? A torchvision built for another torch imports
with ``RuntimeError: operator torchvision::nms does not exist`` (or an undefined symbol), minutes into a run or at
the first ``tv:`` model; pip installs such a pair when the CPU index of torch could not be reached and PyPI's
torchvision came instead. Loading torchvision's compiled operators (about a millisecond, without importing
torchvision itself, which costs a second) tells it before anything else runs."""

from __future__ import annotations

import glob
import importlib.util
import os

from accel_train.errors import UserError

RECOVER = (
    "install them as a pair: python3 -m pip install --force-reinstall torch torchvision --index-url "
    "https://download.pytorch.org/whl/cpu (on a GPU machine, without --index-url), then the README's command again"
)


def check_torchvision() -> None:
    """A one-line UserError when torchvision's operators do not load into this torch; nothing without torchvision."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.origin:
        return
    folder = os.path.dirname(spec.origin)
    libraries = sorted(glob.glob(os.path.join(folder, "_C*.so")) + glob.glob(os.path.join(folder, "_C*.pyd")))
    if not libraries:
        return  # a build without compiled operators: nothing to check
    import torch

    try:
        torch.ops.load_library(libraries[0])
        torch.ops.torchvision.nms  # noqa: B018  (registered by that library when it fits this torch)
    except (OSError, RuntimeError, AttributeError) as exc:
        from importlib.metadata import PackageNotFoundError, version

        try:
            tv_version = version("torchvision")
        except PackageNotFoundError:
            tv_version = "?"
        why = " ".join(str(exc).split())[:120]
        raise UserError(
            f"torchvision {tv_version} does not work with torch {torch.__version__} ({why}); {RECOVER}"
        ) from None
