"""Validation at the boundary: YAML files, CLI values and Python dicts become typed configs.

Configs are stdlib dataclasses; pydantic's ``TypeAdapter`` checks types and the
``annotated_types`` constraints on their fields, and every failure becomes one
:class:`~rlfleet.errors.ConfigError` naming the key, what was expected and what was given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import fnmatch
import math
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

from rlfleet.config.located import EXPONENT_FLOAT, BoundedSafeLoader, read_config_text
from rlfleet.errors import ConfigError, RunDirError, write_error

T = TypeVar("T")


_ADAPTERS: dict[type[Any], pydantic.TypeAdapter[Any]] = {}


def _adapter(cls: type[Any]) -> pydantic.TypeAdapter[Any]:
    if cls not in _ADAPTERS:
        _ADAPTERS[cls] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[cls]


def validate(cls: type[T], data: Mapping[str, Any] | T, where: str, *, flags: bool = False) -> T:
    """Build and check a ``cls`` dataclass from a mapping (or re-check an instance).

    Unknown keys are refused with the closest valid key suggested, and an instance of
    another dataclass by its name. An error names the key after ``where``
    (``config.yaml: trainer.max_steps``) or, with ``flags`` (the section's fields are
    command-line flags of their own name), as the flag (``--max-steps``).
    """
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        if not isinstance(data, cls):
            raise ConfigError(f"{where}: expected a {cls.__name__}, got a {type(data).__name__}")
        data = dataclasses.asdict(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = (
                f"; did you mean {close[0]!r}?" if close else f" (valid keys: {', '.join(fields)})"
            )
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
    try:
        config: T = _adapter(cls).validate_python(dict(data))
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        path = [p for p in first["loc"] if not isinstance(p, int) or len(first["loc"]) > 1]
        raise ConfigError(
            f"{_key_name(where, path, flags)}: {first['msg'].lower()} (got {first.get('input')!r})"
        ) from None
    _refuse_nan(config, where, [], flags)
    return config


def _key_name(where: str, path: list[Any], flags: bool) -> str:
    """How the user named the setting at ``path``: a key under ``where``, or its flag (with
    the place of a list's item among the flag's values, from 1)."""
    if not flags:
        return ".".join([where, *map(str, path)])
    flag = "--" + ".".join(str(p) for p in path if not isinstance(p, int)).replace("_", "-")
    places = [f"value {p + 1}" for p in path if isinstance(p, int)]
    return " ".join([flag, *places])


def _refuse_nan(value: Any, where: str, path: list[str], flags: bool) -> None:
    """No setting is NaN: a bound refuses it (every comparison with NaN is false), and so
    must a setting without one (``target_reward: .nan`` would be a target never reached,
    ``log_std_init: .nan`` a policy of NaNs). Free-form mappings (an env's kwargs) are the
    env's to read, not rlfleet's, and are passed on as they are."""
    if isinstance(value, float) and math.isnan(value):
        name = _key_name(where, path, flags) if path else where
        raise ConfigError(f"{name}: expected a number, got nan")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _refuse_nan(getattr(value, field.name), where, [*path, field.name], flags)
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_nan(item, where, path, flags)


def to_dict(config: Any) -> dict[str, Any]:
    """A dataclass as plain YAML-able data (tuples become lists)."""
    plain: dict[str, Any] = _plain(dataclasses.asdict(config))
    return plain


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def load_yaml(path: str | Path) -> Any:
    """Read a YAML file with the safe loader, within the limits of
    :func:`~rlfleet.config.located.read_config_text` and
    :class:`~rlfleet.config.located.BoundedSafeLoader`; errors name the file and line."""
    path = Path(path)
    text = read_config_text(path)
    loader = type("_FileLoader", (BoundedSafeLoader,), {"source": str(path)})
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: invalid YAML ({getattr(err, 'problem', err)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML nested too deeply") from None
    except ConfigError:
        raise
    except (ValueError, TypeError, OverflowError) as err:
        # PyYAML's own constructors, e.g. a timestamp such as 2020-13-45.
        raise ConfigError(f"{path}: invalid YAML value ({err})") from None


class _Dumper(yaml.SafeDumper):
    """Quotes a string such as ``"1e5"``, which :func:`rlfleet.config.located.parse_yaml`
    would read back as a float (as YAML 1.2 does)."""


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", EXPONENT_FLOAT, list("-+0123456789"))


def yaml_text(data: Any) -> str:
    """``data`` as the YAML :func:`dump_yaml` writes: keys in order, and text that both
    ``yaml.safe_load`` and :func:`~rlfleet.config.located.parse_yaml` read back unchanged."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def dump_yaml(data: Any, path: str | Path) -> None:
    """Write YAML atomically (temp file, then rename).

    Raises:
        RunDirError: the file cannot be written (named, with the free space); a file already
            at ``path`` is left as it was.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(yaml_text(data))
        tmp.replace(path)
    except OSError as error:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise write_error(RunDirError, path, error) from error


def preset(algo: str, env_id: str) -> dict[str, Any]:
    """The shipped preset for ``algo`` on ``env_id``: its ``default`` section, overlaid by
    every section whose key is a glob pattern matching the id (``ALE/*``), in file order,
    then by the env's own section. Sections: ``env``, ``trainer``, ``hyperparameters``."""
    data = _preset_file(algo)
    merged = dict(data.get("default", {}))
    for key in _named_sections(data, env_id):
        merged = merge(merged, data[key])
    return merged


def has_named_preset(algo: str, env_id: str) -> bool:
    """Whether ``algo``'s presets name ``env_id``: a section of its own, or a glob section
    that matches it (``ALE/*``); the ``default`` section alone does not count."""
    return bool(_named_sections(_preset_file(algo), env_id))


def _preset_file(algo: str) -> dict[str, Any]:
    """The parsed preset file of ``algo`` (empty when it has none)."""
    name = f"{algo}.yaml"
    files = resources.files("rlfleet.config") / "presets"
    if not (files / name).is_file():
        return {}
    return yaml.safe_load((files / name).read_text()) or {}


def _named_sections(data: Mapping[str, Any], env_id: str) -> list[str]:
    """The keys of the sections that apply to ``env_id`` besides ``default``, in the order
    they are laid over it: matching glob sections in file order, then the env's own."""
    keys = [
        key for key in data if any(c in key for c in "*?[") and fnmatch.fnmatchcase(env_id, key)
    ]
    if env_id in data and env_id != "default":
        keys.append(env_id)
    return keys


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge: ``override`` wins, nested mappings are merged key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
