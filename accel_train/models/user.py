"""``package.module:callable``: a model from the user's own code.

The callable is called as ``callable(num_classes=, in_channels=, image_size=)`` and returns an
``nn.Module``. Naming it is harmless (:func:`is_import_spec` checks the spelling only); importing it
runs the module's code, so only :func:`resolve` imports, and only callers that were given the spec by
the user call it (``--model`` of a training run, or ``load_model`` with an explicit opt-in).
``__main__:Name``, a class of the script that trained it, cannot be imported by any other program
(:func:`is_main_script`): its weights are loaded into an instance the user builds (``load_weights``).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable

from accel_train.errors import UserError

_SPEC = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


INSTANCE = "instance:"  # ``instance:module.Class``: an nn.Module object given to ``accel_train.train``


def is_import_spec(name: str) -> bool:
    """``package.module:attribute`` spelled right (nothing is imported)."""
    return bool(_SPEC.match(name)) and not name.startswith(("tv:", INSTANCE))


def is_instance_label(name: str) -> bool:
    """``instance:module.Class``: the model was an object, which no config can rebuild."""
    return bool(_SPEC.match(name)) and name.startswith(INSTANCE)


def instance_label(model) -> str:
    cls = type(model)
    return f"{INSTANCE}{cls.__module__}.{cls.__name__ if '<' in cls.__qualname__ else cls.__qualname__}"


def rebuild_instance_error(name: str) -> UserError:
    return UserError(
        f"model {name} was an nn.Module object given to accel_train.train(), which a config cannot rebuild; "
        "build it in Python and load the weights with accel_train.checkpoint.load_weights(model, path)"
    )


def is_main_script(spec: str) -> bool:
    """``__main__:Name`` that this process's ``__main__`` does not hold: a class of the script that trained it."""
    return spec.partition(":")[0] == "__main__" and already_imported(spec) is None


def main_script_error(name: str) -> UserError:
    return UserError(
        f"model {name} was defined in the script that trained it (its __main__), which no other program can import; "
        "build it in your own script and load the weights with accel_train.checkpoint.load_weights(model, path), "
        "or move it into a module and name it package.module:callable"
    )


def _lookup(module, name: str, spec: str):
    target = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise UserError(f"--model {spec}: {module.__name__} has no {name!r}; check the name after the ':'")
        target = getattr(target, part)
    return target


def resolve(spec: str) -> Callable:
    """Import ``package.module`` and return its ``callable`` (one-line UserErrors when it cannot)."""
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:  # like ``python -m``: the folder you run from, after everything installed
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise  # the user's module itself failed to import something: keep the traceback
        raise UserError(
            f"--model {spec}: cannot import {module_name} ({exc}); run from the folder that holds it, add that "
            "folder to PYTHONPATH, or pip install your package"
        ) from None
    if module_name == "__main__" and already_imported(spec) is None:
        raise main_script_error(spec)
    target = _lookup(module, attr, spec)
    if not callable(target):
        raise UserError(f"--model {spec}: {attr} is a {type(target).__name__}, not a class or function")
    return target


def already_imported(spec: str) -> Callable | None:
    """The callable when its module is already imported (nothing is imported here), else None."""
    module_name, _, attr = spec.partition(":")
    module = sys.modules.get(module_name)
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
    return target if module is not None and callable(target) else None


def spec_of(obj) -> str | None:
    """``module:qualname`` of a class or function that can be imported back by that name, else None."""
    module_name = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module_name or not qualname or module_name == "__main__" or "<" in qualname:
        return None
    spec = f"{module_name}:{qualname}"
    return spec if is_import_spec(spec) and already_imported(spec) is obj else None
