"""Reading run options: the located YAML a file was parsed into, built into typed settings.

Every error is one :class:`~rlfleet.errors.ConfigError` naming the file, the line and the
key, e.g.::

    cartpole.yaml line 7: behaviors.CartPole.hyperparameters.learnin_rate: unknown key;
    did you mean 'learning_rate'?

The lines come from :mod:`rlfleet.config.located`, which keeps, for every key and item it
reads, the line it stood on; plain ``yaml.safe_load`` forgets them, and an options file of
a hundred lines whose error says only "behaviors.CartPole.hyperparameters: unknown key" leaves
the user searching. An error about a value a ``--set`` override or a flag gave names that
instead. :class:`OptionsReader` is what the sections' readers share: the error wording, and
building a settings dataclass with pydantic after the checks pydantic lets through (unknown
keys in nested settings, booleans where numbers belong).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

import pydantic

from rlfleet.config.located import line_of
from rlfleet.errors import ConfigError

T = TypeVar("T")
KeyPath = tuple[Any, ...]

HINTS: dict[str, str] = {
    "lambd": "ML-Agents' lambd (GAE lambda) is gae_lambda here",
    "beta": "ML-Agents' beta (entropy bonus) is ent_coef here",
    "epsilon": "ML-Agents' epsilon (clip range) is clip_range here",
    "num_epoch": "ML-Agents' num_epoch is num_epochs here",
    "learning_rate_schedule": "ML-Agents' learning_rate_schedule is lr_schedule here",
    "torch_device": "use torch_settings.device",
}
"""ML-Agents keys that an algorithm other than ppo and sac spells differently -> what to write
(ppo and sac read them with ML-Agents' meaning, see :mod:`rlfleet.runs.options_mlagents`)."""


class OptionsReader:
    """Builds typed configs from located YAML data; errors name file, line and key."""

    def __init__(self, root: Any, source: str, overrides: Mapping[KeyPath, str]) -> None:
        self.root = root
        self.source = source
        self.overrides = dict(overrides)

    # -------------------------------------------------------------- errors
    def where(self, path: KeyPath) -> str:
        for i in range(len(path), 0, -1):
            if path[:i] in self.overrides:
                return self.overrides[path[:i]]
        candidates = [path]
        if len(path) >= 2 and path[0] == "behaviors":
            candidates.append(("default_settings", *path[2:]))
        best: tuple[int | None, int] = line_of(self.root, path)
        for candidate in candidates:
            line, found = line_of(self.root, candidate)
            if found == len(candidate) and line is not None:
                best = (line, found)
                break
        line = best[0]
        return f"{self.source} line {line}" if line is not None else self.source

    def error(self, path: KeyPath, message: str) -> ConfigError:
        key = dotted(path)
        return ConfigError(f"{self.where(path)}: {key + ': ' if key else ''}{message}")

    def unknown_key(self, path: KeyPath, key: Any, valid: Sequence[str]) -> ConfigError:
        if str(key) in HINTS:
            return self.error((*path, key), f"unknown key; {HINTS[str(key)]}")
        close = difflib.get_close_matches(str(key), list(valid), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
        return self.error((*path, key), f"unknown key; {hint}")

    # ------------------------------------------------------------ building
    def mapping(self, data: Any, path: KeyPath, what: str) -> Mapping[Any, Any]:
        if data is None:
            return {}
        if not isinstance(data, Mapping):
            raise self.error(path, f"expected a mapping of {what}, got {describe(data)}")
        return data

    def build(self, cls: type[T], data: Any, path: KeyPath, **built: Any) -> T:
        """A ``cls`` dataclass from a mapping; ``built`` fields are given already built."""
        data = self.mapping(data, path, f"{cls.__name__} settings")
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        for key in data:
            if key not in names:
                raise self.unknown_key(path, key, names)
        hints = get_type_hints(cls, include_extras=True)
        payload = {str(k): v for k, v in data.items()}
        for name, value in payload.items():
            if name not in built:
                self.precheck(hints[name], value, (*path, name))
        payload.update(built)
        try:
            return _adapter(cls).validate_python(payload)  # type: ignore[no-any-return]
        except pydantic.ValidationError as err:
            first = err.errors()[0]
            loc = tuple(p for p in first["loc"] if isinstance(p, int) or str(p).isidentifier())
            message = first["msg"]
            got = f" (got {first['input']!r})" if first["type"] != "missing" else ""
            text = (
                "required key missing"
                if first["type"] == "missing"
                else message[0].lower() + message[1:]
            )
            raise self.error((*path, *loc), text + got) from None

    def precheck(self, hint: Any, value: Any, path: KeyPath) -> None:
        """What pydantic would let through: unknown keys in nested settings, and booleans
        where numbers belong (pydantic reads ``true`` as 1)."""
        hint = _strip_annotated(hint)
        if value is None:
            return
        if _is_union(hint):
            members = [m for m in get_args(hint) if m is not type(None)]
            if len(members) == 1:
                self.precheck(members[0], value, path)
            return
        if dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
            names = [f.name for f in dataclasses.fields(hint)]
            hints = get_type_hints(hint, include_extras=True)
            for key, item in value.items():
                if key not in names:
                    raise self.unknown_key(path, key, names)
                self.precheck(hints[key], item, (*path, key))
            return
        if hint in (int, float) and isinstance(value, bool):
            raise self.error(path, f"expected a number, got {value!r}")
        if get_origin(hint) in (tuple, list) and isinstance(value, list):
            args = [a for a in get_args(hint) if a is not Ellipsis]
            for i, item in enumerate(value):
                if args:
                    self.precheck(args[min(i, len(args) - 1)], item, (*path, i))


def dotted(path: KeyPath) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(value: Any) -> str:
    """``a mapping``, ``a list``, ``null`` or ``int 3`` (for error messages)."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


_ADAPTERS: dict[type[Any], pydantic.TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> pydantic.TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[cls]


def _strip_annotated(hint: Any) -> Any:
    while get_origin(hint) is typing.Annotated:
        hint = get_args(hint)[0]
    return hint


def _is_union(hint: Any) -> bool:
    return get_origin(hint) in (typing.Union, types.UnionType)
