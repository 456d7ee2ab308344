"""Flag plumbing that imports nothing of the package but its errors: the floor under every settings class.

``ArgumentParser`` (argparse with one-line errors), ``setting`` (a dataclass field that is also a flag: default,
help, metadata), and the readers the flag parser and the YAML reader share (``field_type``, ``PARSERS``,
``is_parsed_text``). Settings classes (``TrainConfig``, ``data.settings.DataConfig``) are built from these, and
``config_yaml`` reads a file against any of them.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field
from typing import Any


class ArgumentParser(argparse.ArgumentParser):
    """argparse that reports mistakes as one-line UserErrors (exit code 2) instead of usage + message, takes no
    abbreviated flags (``--epoch 3`` was silently ``--epochs 3``; a later flag could change what it means) and
    suggests the flag a misspelled one was probably meant to be."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        from accel_train.errors import UserError

        raise UserError(f"{message}{self._did_you_mean(message)} (see --help)")

    def _did_you_mean(self, message: str) -> str:
        """``; did you mean --epochs?`` for the first unknown ``--flag`` in argparse's message that is close to one."""
        import difflib
        import re

        if "unrecognized arguments" not in message:
            return ""
        flags = [o for o in self._option_string_actions if o.startswith("--")]
        for token in re.findall(r"--[\w-]+", message):
            close = difflib.get_close_matches(token, flags, n=1, cutoff=0.75)
            if close:
                return f"; did you mean {close[0]}?"
        return ""


#: What a ``--resume`` may do with a field (metadata ``resume``; ``resume.py`` applies it). Unmarked fields are
#: the experiment: a resume refuses a different value.
ATTEMPT = "attempt"  # how this attempt runs: never restored (--output-dir, --resume, --stop-at-step, ...)
SAFE = "safe"  # how a run is watched, saved or computed, not what it learns: a given value takes effect
LENGTH = "length"  # --epochs/--max-steps: only --extend may change them


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field that is a flag and a YAML key: ``default``, ``help`` text, metadata: ``choices``,
    ``parse`` (a text parser of :data:`PARSERS`), ``low``/``high`` (bounds a set value is held to; ``high``
    defaults to what an int64 holds), ``resume`` (:data:`ATTEMPT`, :data:`SAFE` or :data:`LENGTH`)."""
    return field(default=default, metadata={"help": help, **meta})


def same_as(owner: type, name: str) -> Any:
    """Field ``name`` of the settings class ``owner`` (its default, help and metadata), declared there once and
    repeated in a class that composes it (``TrainConfig`` keeps its flat fields: flags and YAML keys)."""
    f = {f.name: f for f in dataclasses.fields(owner)}[name]
    return field(default=f.default, metadata=f.metadata)


def int_or_auto(text: str) -> int | str:
    """``--max-device-batch``: a number, or ``auto`` (argparse and the YAML reader say what else was given)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number or auto, got {text!r}") from None


PARSERS = {"int_or_auto": int_or_auto}  # fields whose flags take more than their type (metadata "parse")


def is_parsed_text(f: dataclasses.Field, value: Any) -> bool:
    """Whether ``value`` is text that field ``f``'s own parser takes (``max_device_batch: auto``)."""
    parse = PARSERS.get(f.metadata.get("parse"))
    if parse is None or not isinstance(value, str):
        return False
    try:
        parse(value)
    except argparse.ArgumentTypeError:
        return False
    return True


def field_type(f: dataclasses.Field) -> type:
    """The scalar type a field's flag and YAML key take (``int | None`` -> int)."""
    text = str(f.type)
    for typ in (bool, int, float, str):
        if typ.__name__ in text.split(" | ")[0]:
            return typ
    raise AssertionError(f"unsupported field type {text}")
