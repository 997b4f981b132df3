"""YAML that remembers where every key came from, so errors can name the file and line.

:func:`parse_yaml` reads YAML with PyYAML's safe constructors (no Python objects, no code),
but builds mappings as :class:`LocatedDict` and sequences as :class:`LocatedList`, which
record the line of each key and item. :func:`line_of` walks a key path through them.

Two departures from plain ``yaml.safe_load``, both to refuse mistakes early:

- a key repeated in one mapping is an error (PyYAML silently keeps the last one);
- ``3e-4`` is a float, as in YAML 1.2 (YAML 1.1, which PyYAML follows, needs ``3.0e-4``
  and reads ``3e-4`` as a string — a classic trap in ML-Agents files).

Two limits, so that no file can hang or exhaust the process that reads it:
:func:`read_config_text` reads regular files of at most :data:`MAX_FILE_BYTES` only (not
``/dev/zero``, not a FIFO), and every YAML document, once its aliases are expanded, may hold
at most :data:`MAX_NODES` nodes (a "billion laughs" document of nested aliases is refused
before anything is built from it). :class:`BoundedSafeLoader` is ``yaml.SafeLoader`` with
that limit.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from rlfleet.errors import ConfigError

MAX_DEPTH = 100
"""Deeper nesting than this is refused: no config needs it, and recursion would."""
MAX_NODES = 1_000_000
"""The most YAML nodes (values, keys, items) a document may expand to, aliases included."""
MAX_FILE_BYTES = 16 * 1024 * 1024
"""The largest config or options file read."""


def read_config_text(path: str | Path, what: str = "config file") -> str:
    """The text of a YAML file, read only if it is a regular file of at most
    :data:`MAX_FILE_BYTES` in UTF-8; every failure is a ConfigError naming ``path``."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError(f"{path}: cannot read {what} (not a regular file)")
            raw = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read {what} ({err.strerror or err})") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(
            f"{path}: cannot read {what} (larger than {MAX_FILE_BYTES // 1024**2} MiB)"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: cannot read {what} (not UTF-8 text: byte {raw[err.start]:#04x} at "
            f"offset {err.start})"
        ) from None


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many nodes ``node`` stands for once every alias in it is expanded (a node an
    alias refers to counts each time it is referred to)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_nodes:  # recursive alias: refused later, with its line
        return 1
    open_nodes.add(key)
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(item, sizes, open_nodes) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            size += _expanded_size(key_node, sizes, open_nodes)
            size += _expanded_size(value_node, sizes, open_nodes)
    open_nodes.discard(key)
    sizes[key] = size
    return size


class _BoundedComposer:
    """Refuses a document that expands to more than :data:`MAX_NODES` nodes, after PyYAML
    composed it (aliases are shared nodes there, so this costs one pass) and before any
    Python object is built from it."""

    source = "<string>"

    def get_single_node(self) -> yaml.Node | None:
        node: yaml.Node | None = super().get_single_node()  # type: ignore[misc]
        if node is not None:
            size = _expanded_size(node, {}, set())
            if size > MAX_NODES:
                raise ConfigError(
                    f"{self.source}: YAML aliases expand to {size:,} nodes, more than "
                    f"{MAX_NODES:,} (a document of nested aliases; write the values out)"
                )
        return node


class BoundedSafeLoader(_BoundedComposer, yaml.SafeLoader):
    """``yaml.SafeLoader`` with the :data:`MAX_NODES` limit on aliases."""


class LocatedDict(dict[Any, Any]):
    """A mapping read from YAML, with the line (1-based) of itself and of each key."""

    line: int = 0
    lines: dict[Any, int]


class LocatedList(list[Any]):
    """A sequence read from YAML, with the line (1-based) of itself and of each item."""

    line: int = 0
    lines: list[int]


class _Loader(_BoundedComposer, yaml.SafeLoader):
    source = "<string>"


EXPONENT_FLOAT = re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")
"""``3e-4``: a float in YAML 1.2, a string in YAML 1.1; :func:`parse_yaml` reads a float (and
:func:`rlfleet.config.loader.dump_yaml` quotes a string that looks like one)."""
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> Iterator[LocatedDict]:
    data = LocatedDict()
    data.line = node.start_mark.line + 1
    data.lines = {}
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable):
            raise ConfigError(
                f"{loader.source} line {line}: a key must be a plain value, not {key!r}"
            )
        if key in data:
            raise ConfigError(
                f"{loader.source} line {line}: key {key!r} appears twice in one mapping "
                f"(first at line {data.lines[key]})"
            )
        data[key] = loader.construct_object(value_node, deep=False)
        data.lines[key] = line


def _construct_seq(loader: _Loader, node: yaml.SequenceNode) -> Iterator[LocatedList]:
    data = LocatedList()
    data.line = node.start_mark.line + 1
    data.lines = []
    yield data
    for item in node.value:
        data.append(loader.construct_object(item, deep=False))
        data.lines.append(item.start_mark.line + 1)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def parse_yaml(text: str, source: str) -> Any:
    """Parse one YAML document; every failure is a ConfigError naming ``source`` and line.

    Refuses duplicate keys, recursive aliases (``&a [*a]``), aliases that expand to more than
    :data:`MAX_NODES` nodes, nesting deeper than :data:`MAX_DEPTH` and non-finite numbers
    (``.nan``, ``.inf``).
    """
    loader_cls = type("_SourceLoader", (_Loader,), {"source": source})
    try:
        data = yaml.load(text, Loader=loader_cls)
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}{line}: invalid YAML ({err.problem or err})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: invalid YAML ({err})") from None
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply") from None
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError) as err:
        # PyYAML's own constructors, e.g. a timestamp such as 2020-13-45.
        raise ConfigError(f"{source}: invalid YAML value ({err})") from None
    _check_tree(data, source, [], 0, getattr(data, "line", 1))
    return data


def _check_tree(value: Any, source: str, stack: list[int], depth: int, line: int) -> None:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{source} line {line}: YAML nested too deeply")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            f"{source} line {line}: {value} is not a finite number; configs take finite numbers"
        )
    if not isinstance(value, dict | list):
        return
    if id(value) in stack:
        raise ConfigError(
            f"{source} line {line}: a YAML alias refers to a node that contains it "
            "(recursive structure)"
        )
    stack.append(id(value))
    if isinstance(value, dict):
        lines = getattr(value, "lines", {})
        for key, item in value.items():
            _check_tree(item, source, stack, depth + 1, lines.get(key, line))
    else:
        lines_list = getattr(value, "lines", [])
        for i, item in enumerate(value):
            _check_tree(
                item, source, stack, depth + 1, lines_list[i] if i < len(lines_list) else line
            )
    stack.pop()


def line_of(data: Any, path: Sequence[Any]) -> tuple[int | None, int]:
    """The line of the deepest key of ``path`` found in ``data``, and how many keys of the
    path were found (``len(path)`` when the whole path exists)."""
    line: int | None = getattr(data, "line", None) or None
    found = 0
    node = data
    for key in path:
        if isinstance(node, LocatedDict) and key in node:
            line = node.lines.get(key, line)
            node = node[key]
        elif isinstance(node, LocatedList) and isinstance(key, int) and 0 <= key < len(node):
            line = node.lines[key]
            node = node[key]
        else:
            break
        found += 1
    return line, found
