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

#: The pair the test suite last passed with (constraints.txt says the same; tests/unit/test_install_check.py holds
#: them together): both from PyPI, so the way out needs no other index.
TESTED_PAIR = ("2.14.1", "0.29.1")
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
RECOVER = (
    f"install a pair that works, from PyPI alone: python3 -m pip install --force-reinstall torch=={TESTED_PAIR[0]} "
    f"torchvision=={TESTED_PAIR[1]} (the pair the tests last passed with); or, where {CPU_INDEX} is reachable, the "
    f"smaller CPU builds: python3 -m pip install --force-reinstall torch torchvision --index-url {CPU_INDEX}; then "
    "the README's command again"
)


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built for ``torch_version`` (torch 2.N pairs with torchvision 0.(N+15)), or None."""
    try:
        major, minor = (int(part) for part in torch_version.split("+")[0].split(".")[:2])
    except ValueError:
        return None
    return f"0.{minor + 15}" if major == 2 else None


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
        wanted = matching_torchvision(torch.__version__)
        built = f" (torch {torch.__version__} needs torchvision {wanted}.x from the same index)" if wanted else ""
        raise UserError(
            f"torchvision {tv_version} does not work with torch {torch.__version__} ({why}){built}; {RECOVER}"
        ) from None
