"""Reading ``--config FILE.yaml``: hyperparameters as flat ``key: value`` lines, checked before they are trusted.

The keys are the fields of the settings dataclass it is given (``TrainConfig``'s: the flags without ``--``).
Refused with one line: unknown and duplicate keys, YAML 1.1 traps (``no`` read as ``False``), wrong types,
files over 1 MiB, NUL bytes, deep nesting and alias bombs (counted on the parse events, before any object is built).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import difflib
import math
import re
import reprlib
from dataclasses import fields
from pathlib import Path
from typing import Any

from accel_train.errors import UserError
from accel_train.flags import PARSERS, field_type
from accel_train.limits import check_regular_file

YAML_MAX_BYTES = 1 << 20  # 1 MiB: a hyperparameter file is a few hundred bytes
YAML_MAX_NODES = 10_000  # values in the document once anchors/aliases are expanded
YAML_MAX_CHARS = 2 << 20  # characters of scalar text once anchors/aliases are expanded
YAML_MAX_DEPTH = 32  # nesting of lists/mappings (a hyperparameter file is one flat mapping)


def load_yaml_config(path: str | Path, settings: type) -> dict[str, Any]:
    """Read a hyperparameter YAML whose keys are ``settings``' fields, rejecting unknown keys, duplicate keys,
    YAML-1.1 traps and oversized documents.

    Safety order: the file size is checked before reading, NUL bytes before parsing, nesting depth and the
    size after alias expansion on the event stream (before any node or Python object exists), duplicate
    keys while constructing.
    """
    import yaml

    path = Path(path)
    try:
        check_regular_file(path, "YAML")  # a FIFO would block the read; a directory is not "not found"
    except UserError as exc:
        raise UserError(f"--config {exc}") from None
    if not path.is_file():
        raise UserError(f"--config {str(path)!r}: file not found")
    text = _read_yaml_text(path)
    loader_cls = _yaml_loader()
    _check_yaml_size(yaml, loader_cls, path, text)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        data = (loader.construct_document(node) if node is not None else None) or {}
    except _DuplicateKey as exc:
        raise UserError(f"--config {path}: {exc.describe()}; keep one") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [""])[0]
        raise UserError(
            f"--config {path}: not valid YAML{where} ({_clip(problem, 200)}); write one 'key: value' per line, "
            "quoting values that contain ':' or '#'"
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise UserError(f"--config {path}: expected a mapping of key: value, got {type(data).__name__}")
    lines = _top_level_key_lines(yaml, node)
    known = {f.name: f for f in fields(settings)}
    out: dict[str, Any] = {}
    spelled: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).replace("-", "_")
        if key not in known:
            # difflib on a huge key would be slow and its echo huge: only suggest for key-sized keys
            close = difflib.get_close_matches(key, list(known), n=1) if len(key) <= 64 else []
            hint = f"; did you mean {close[0]!r}?" if close else "; the keys are the --help flags without '--'"
            raise UserError(f"--config {path}: unknown key {_short_repr(raw_key)}{hint}")
        if key in spelled:  # batch-size and batch_size: one field written twice
            first, second = lines.get(str(spelled[key])), lines.get(str(raw_key))
            at = f" (lines {first} and {second})" if first and second else ""
            raise UserError(
                f"--config {path}: key {key!r} appears twice, as {spelled[key]!r} and {raw_key!r}{at}; keep one"
            )
        spelled[key] = raw_key
        out[key] = _read_value(path, key, value, known[key], _scalar_text(yaml, node, raw_key))
    return out


def _read_value(path: Path, key: str, value: Any, f: Any, written: str | None) -> Any:
    """One key's value, checked against its field ``f`` (``written``: the value's text as the file has it)."""
    if isinstance(value, (bytes, bytearray)):
        raise UserError(f"--config {path}: {key} is binary data (!!binary); write the value as plain text")
    const = f.metadata.get("const")
    if const is not None and isinstance(value, bool):  # pretrained: true is the flag alone (DEFAULT), false is off
        return const if value else None
    if field_type(f) is str and isinstance(value, (bool, int, float, datetime.date)):
        # YAML 1.1 turns no/NO/off/yes into booleans, 0 into an int and 2024-01-01 into a date: show the text
        # as written.
        shown = _clip(written or str(value), 80)
        raise UserError(
            f"--config {path}: {key}: {shown} was read as {_short_repr(value)}, not as text; quote it: {key}: '{shown}'"
        )
    value = _decimal(value, written)  # epochs: 010 is 10, not YAML 1.1's octal 8
    return _coerce_parsed(path, key, value, f)


def _read_yaml_text(path: Path) -> str:
    """The file's text: at most YAML_MAX_BYTES, UTF-8, a leading BOM dropped, no NUL bytes."""
    too_big = f"is too large for a hyperparameter file (limit {YAML_MAX_BYTES:,} bytes); pass a YAML file"
    try:
        size = path.stat().st_size
        if size > YAML_MAX_BYTES:
            raise UserError(f"--config {path}: {size:,} bytes {too_big}")
        with path.open("rb") as fh:
            raw = fh.read(YAML_MAX_BYTES + 1)  # the file may have grown since stat
        if len(raw) > YAML_MAX_BYTES:
            raise UserError(f"--config {path}: more than {YAML_MAX_BYTES:,} bytes {too_big}")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--config {path}: cannot read it as a UTF-8 text file ({exc}); pass a YAML file") from None
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark some editors write
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise UserError(f"--config {path}: NUL byte on line {line}, so it is not a text file; pass a YAML file")
    return text


_LOADER: list[type] = []  # the loader class, made on first use (yaml is imported lazily)


def _yaml_loader() -> type:
    """A safe loader (libyaml's when available) that refuses duplicate keys and reports unreadable values."""
    if _LOADER:
        return _LOADER[0]
    import yaml

    base = getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader

    class ConfigLoader(base):  # type: ignore[misc, valid-type]
        # YAML 1.1 reads 1:30 as the sexagesimal number 90 (and 1:30.5 as 90.5): here it stays the text "1:30",
        # which a number field then refuses in one line and a text field keeps as written.
        yaml_implicit_resolvers = {
            first: [(tag, _NoColon(rx) if tag in _NUMBER_TAGS else rx) for tag, rx in resolvers]
            for first, resolvers in base.yaml_implicit_resolvers.items()
        }

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # '<<: *base' keys may be overridden: that is what merging is for
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:
                        continue  # unhashable: the base class reports it
                    if first is not key_node:
                        raise _DuplicateKey(key, first.start_mark, key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

        def construct_object(self, node, deep=False):
            try:
                return super().construct_object(node, deep=deep)
            except (ValueError, OverflowError) as exc:  # 2024-02-30, an int of 5,000 digits, ...
                problem = f"cannot read {_short_repr(node.value if isinstance(node.value, str) else '...', 40)}: "
                raise yaml.constructor.ConstructorError(
                    None, None, problem + _clip(str(exc).split(";")[0], 120), node.start_mark
                ) from None

    _LOADER.append(ConfigLoader)
    return ConfigLoader


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class _NoColon:
    """A resolver pattern that never matches text with a colon (no sexagesimal numbers)."""

    def __init__(self, pattern: Any):
        self.pattern = pattern

    def match(self, value: str) -> Any:
        return None if ":" in value else self.pattern.match(value)


_OCTAL_1_1 = re.compile(r"[-+]?0[0-7_]+")  # YAML 1.1's octal ints: 010 is 8


def _decimal(value: Any, written: str | None) -> Any:
    """A number field's YAML 1.1 octal int (``epochs: 010``, read as 8) as the decimal it reads as on the command
    line (``--epochs 010`` is 10) and in YAML 1.2; any other value as it is."""
    if isinstance(value, bool) or not isinstance(value, int) or written is None:
        return value
    return int(written.replace("_", ""), 10) if _OCTAL_1_1.fullmatch(written) else value


class _DuplicateKey(Exception):
    def __init__(self, key: Any, first: Any, second: Any):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second

    def describe(self) -> str:
        one, two = self.first.line + 1, self.second.line + 1
        where = f"lines {one} and {two}" if one != two else f"both on line {one}"
        return f"key {_short_repr(self.key)} appears twice ({where})"


class _ExpansionCounter:
    """Counts values and scalar characters as aliases would expand them, from YAML parse events.

    Each anchor's expanded size is memoised, so an alias costs O(1) however far it expands,
    and the count stops as soon as any collection passes the limit.
    """

    def __init__(self, yaml, path: Path):
        self.yaml, self.path = yaml, path
        self.anchors: dict[str, tuple[int, int]] = {}
        self.stack: list[list[Any]] = []  # per open collection: [anchor, values, chars]
        self.total: list[Any] = [None, 0, 0]

    def add(self, nodes: int, chars: int, mark: Any) -> None:
        frame = self.stack[-1] if self.stack else self.total
        frame[1] += nodes
        frame[2] += chars
        if frame[1] > YAML_MAX_NODES or frame[2] > YAML_MAX_CHARS:
            what = f"{YAML_MAX_NODES:,} values" if frame[1] > YAML_MAX_NODES else f"{YAML_MAX_CHARS:,} characters"
            raise UserError(
                f"--config {self.path}: anchors/aliases expand too far (more than {what} by line {mark.line + 1}); "
                "a hyperparameter file is flat 'key: value' lines, write the values out"
            )

    def open(self, event: Any) -> None:
        if len(self.stack) >= YAML_MAX_DEPTH:
            raise UserError(
                f"--config {self.path}: lists/mappings nest more than {YAML_MAX_DEPTH} levels deep "
                f"(line {event.start_mark.line + 1}); a hyperparameter file is flat 'key: value' lines"
            )
        self.stack.append([event.anchor, 1, 0])

    def close(self, event: Any) -> None:
        anchor, nodes, chars = self.stack.pop()
        if anchor is not None:
            self.anchors[anchor] = (nodes, chars)
        self.add(nodes, chars, event.start_mark)

    def scalar(self, event: Any) -> None:
        if event.anchor is not None:
            self.anchors[event.anchor] = (1, len(event.value))
        self.add(1, len(event.value), event.start_mark)

    def alias(self, event: Any) -> None:
        if event.anchor in self.anchors:
            self.add(*self.anchors[event.anchor], event.start_mark)
        elif any(frame[0] == event.anchor for frame in self.stack):
            raise UserError(
                f"--config {self.path}: alias *{_clip(event.anchor, 40)} on line {event.start_mark.line + 1} "
                "refers to the collection that contains it; write the values out"
            )
        else:
            self.add(1, 0, event.start_mark)  # undefined: composing reports it

    def feed(self, event: Any) -> None:
        yaml = self.yaml
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            self.open(event)
        elif isinstance(event, yaml.CollectionEndEvent):
            self.close(event)
        elif isinstance(event, yaml.ScalarEvent):
            self.scalar(event)
        elif isinstance(event, yaml.AliasEvent):
            self.alias(event)


def _check_yaml_size(yaml, loader_cls: type, path: Path, text: str) -> None:
    """Refuse deep nesting and alias bombs ("billion laughs") from the event stream, before any node is built."""
    counter = _ExpansionCounter(yaml, path)
    try:
        for event in yaml.parse(text, Loader=loader_cls):
            counter.feed(event)
    except yaml.YAMLError as exc:
        # PyYAML >= 6.0.4 refuses deep nesting itself, in its own words and before our events arrive (the parser
        # reads ahead): the nesting is measured here, so the refusal is ours whatever PyYAML says.
        mark = getattr(exc, "problem_mark", None)
        end = mark.index + 1 if mark is not None and isinstance(getattr(mark, "index", None), int) else len(text)
        if _flow_depth(text[:end]) > YAML_MAX_DEPTH:
            raise UserError(
                f"--config {path}: lists/mappings nest more than {YAML_MAX_DEPTH} levels deep (line "
                f"{text.count(chr(10), 0, end) + 1}); a hyperparameter file is flat 'key: value' lines"
            ) from None
        return  # a syntax error: load_yaml_config reports it with its line and column


def _flow_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in ``text``, outside quotes and comments (enough to name a refusal)."""
    depth = deepest = 0
    quote = None
    comment = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(0, depth - 1)
    return deepest


def _top_level_key_lines(yaml, node: Any) -> dict[str, int]:
    """Top-level key as written -> its (first) line number."""
    lines: dict[str, int] = {}
    for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else []:
        if isinstance(key_node, yaml.ScalarNode):
            lines.setdefault(key_node.value, key_node.start_mark.line + 1)
    return lines


def _scalar_text(yaml, node: Any, key: Any) -> str | None:
    """The value of top-level ``key`` exactly as written in the composed document (None if not a plain scalar)."""
    for key_node, value_node in node.value if isinstance(node, yaml.MappingNode) else []:
        if key_node.value == str(key) and isinstance(value_node, yaml.ScalarNode):
            return value_node.value
    return None


def _clip(text: str, limit: int = 80) -> str:
    """``text`` cut to about ``limit`` characters, saying how long it was."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def _short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) for an error message: a huge string, number or list cannot make a huge message."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value):,} characters)"

    short = reprlib.Repr()
    short.maxstring = short.maxlong = short.maxother = limit
    short.maxlist = short.maxdict = short.maxtuple = short.maxset = 6
    short.maxlevel = 3
    try:
        text = short.repr(value)
    except Exception:  # e.g. an int too long for str()
        text = f"<{type(value).__name__}>"
    return _clip(text, 2 * limit)


def _coerce_parsed(path: Path, key: str, value: Any, f: dataclasses.Field) -> Any:
    """Text for a field with its own parser (``max_device_batch: auto``) goes through it; the rest to ``_coerce``."""
    parse = PARSERS.get(f.metadata.get("parse"))
    if parse is None or not isinstance(value, str):
        return _coerce(path, key, value, f)
    try:
        return parse(value)
    except argparse.ArgumentTypeError:
        raise UserError(f"--config {path}: {key} must be a number or auto, got {_short_repr(value)}") from None


def _coerce(path: Path, key: str, value: Any, f: dataclasses.Field) -> Any:
    typ = field_type(f)
    optional = "None" in str(f.type)
    if value is None:
        if optional:
            return None
        raise UserError(f"--config {path}: {key} needs a value")
    if typ is bool and not isinstance(value, bool):
        raise UserError(f"--config {path}: {key} must be true or false, got {_short_repr(value)}")
    if typ is str and not isinstance(value, str):  # a list, a !!set, ... (the loop names YAML 1.1's scalars)
        what = "takes one value" if isinstance(value, (list, dict, set, tuple)) else "must be text"
        raise UserError(f"--config {path}: {key} {what}, got {_short_repr(value)}")
    if typ is float and isinstance(value, str):
        # YAML 1.1 reads 1e-3 (no dot) as a string; --lr 1e-3 on the command line is a float, so is this.
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            value = number
    if typ in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise UserError(f"--config {path}: {key} must be a number, got {_short_repr(value)}")
    if typ is int and isinstance(value, float):
        if not value.is_integer():
            raise UserError(f"--config {path}: {key} must be an integer, got {_short_repr(value)}")
        value = int(value)
    return typ(value)
