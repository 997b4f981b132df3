"""YAML that remembers where every key came from, so errors can name the file and line.

:func:`parse_yaml` reads YAML with PyYAML's safe constructors (no Python objects, no code),
but builds mappings as :class:`LocatedDict` and sequences as :class:`LocatedList`, which
record the line of each key and item. :func:`line_of` walks a key path through them.

Two departures from plain ``yaml.safe_load``, both to refuse mistakes early:

- a key repeated in one mapping is an error (PyYAML silently keeps the last one);
- ``3e-4`` is a float, as in YAML 1.2 (YAML 1.1, which PyYAML follows, needs ``3.0e-4``
  and reads ``3e-4`` as a string — a classic trap in ML-Agents files).
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import yaml

from rlfleet.errors import ConfigError

MAX_DEPTH = 100
"""Deeper nesting than this is refused: no config needs it, and recursion would."""


class LocatedDict(dict[Any, Any]):
    """A mapping read from YAML, with the line (1-based) of itself and of each key."""

    line: int = 0
    lines: dict[Any, int]


class LocatedList(list[Any]):
    """A sequence read from YAML, with the line (1-based) of itself and of each item."""

    line: int = 0
    lines: list[int]


class _Loader(yaml.SafeLoader):
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

    Refuses duplicate keys, recursive aliases (``&a [*a]``), nesting deeper than
    :data:`MAX_DEPTH` and non-finite numbers (``.nan``, ``.inf``).
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
