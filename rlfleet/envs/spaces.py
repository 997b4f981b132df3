"""Gymnasium spaces as strict JSON, structural comparison and one-line descriptions.

Checkpoints record the observation and action spaces an agent was built for, so that
loading it into a different env fails with a clear message instead of a shape error deep
inside a network. JSON here is strict (no ``NaN``/``Infinity`` literals): infinite Box
bounds are written as the strings ``"inf"`` and ``"-inf"``.

Supported spaces and their JSON form::

    Box            {"type": "Box", "shape": [4], "dtype": "float32",
                    "low": [...nested lists...], "high": [...]}
    Discrete       {"type": "Discrete", "n": 2, "start": 0, "dtype": "int64"}
    MultiDiscrete  {"type": "MultiDiscrete", "nvec": [...], "start": [...], "dtype": "int64"}
    MultiBinary    {"type": "MultiBinary", "n": 4}              (or a list such as [2, 3])
    Dict           {"type": "Dict", "spaces": {"key": {...}, ...}}   (key order kept)
    Tuple          {"type": "Tuple", "spaces": [{...}, ...]}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from rlfleet.errors import EnvSpecError

__all__ = [
    "describe_space",
    "space_from_json",
    "space_mismatch",
    "space_to_json",
    "spaces_equal",
]

_SUPPORTED_TEXT = "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"


def space_to_json(space: gymnasium.spaces.Space[Any]) -> dict[str, Any]:
    """Encode ``space`` as a strict-JSON dict; :func:`space_from_json` is the inverse.

    Raises:
        EnvSpecError: the space, or a space nested in it, is not one of the supported types.
    """
    return _to_json(space, "space")


def space_from_json(data: Mapping[str, Any]) -> gymnasium.spaces.Space[Any]:
    """Rebuild a space written by :func:`space_to_json`.

    Raises:
        EnvSpecError: ``data`` is not a valid encoding; the message says where and what was
            expected.
    """
    return _from_json(data, "space")


def spaces_equal(a: gymnasium.spaces.Space[Any], b: gymnasium.spaces.Space[Any]) -> bool:
    """Exact structural equality: type, shape, dtype, bounds, ``n``, ``nvec``, ``start``, keys.

    Unlike gymnasium's ``==`` (which compares Box bounds with a tolerance and Dict keys as a
    set), Box bounds must match exactly and Dict keys must come in the same order, because
    the order fixes how a Dict observation is flattened into a network input.
    """
    if type(a) is not type(b):
        return False
    # Both isinstance checks below only narrow the types: a and b are of one type here.
    if isinstance(a, spaces.Box) and isinstance(b, spaces.Box):
        return (
            a.shape == b.shape
            and a.dtype == b.dtype
            and np.array_equal(a.low, b.low)
            and np.array_equal(a.high, b.high)
        )
    if isinstance(a, spaces.Discrete) and isinstance(b, spaces.Discrete):
        return int(a.n) == int(b.n) and int(a.start) == int(b.start) and a.dtype == b.dtype
    if isinstance(a, spaces.MultiDiscrete) and isinstance(b, spaces.MultiDiscrete):
        return (
            a.dtype == b.dtype
            and np.array_equal(a.nvec, b.nvec)
            and np.array_equal(a.start, b.start)
        )
    if isinstance(a, spaces.MultiBinary):
        return a.shape == b.shape
    if isinstance(a, spaces.Dict) and isinstance(b, spaces.Dict):
        return list(a.spaces) == list(b.spaces) and all(
            spaces_equal(a.spaces[key], b.spaces[key]) for key in a.spaces
        )
    if isinstance(a, spaces.Tuple) and isinstance(b, spaces.Tuple):
        return len(a.spaces) == len(b.spaces) and all(
            spaces_equal(x, y) for x, y in zip(a.spaces, b.spaces, strict=True)
        )
    return bool(a == b)


def space_mismatch(
    expected: tuple[gymnasium.spaces.Space[Any], gymnasium.spaces.Space[Any]],
    found: tuple[gymnasium.spaces.Space[Any], gymnasium.spaces.Space[Any]],
) -> tuple[str, str, str] | None:
    """The first of the observation and action spaces (each pair in that order) where
    ``found`` differs from ``expected`` by :func:`spaces_equal`: its label (``observation``
    or ``action``) and both spaces described; None when both match. The caller raises its
    own error with them."""
    for label, mine, theirs in zip(("observation", "action"), expected, found, strict=True):
        if not spaces_equal(mine, theirs):
            return label, describe_space(mine), describe_space(theirs)
    return None


def describe_space(space: gymnasium.spaces.Space[Any]) -> str:
    """Short human text such as ``Box(shape=(4,), float32)`` or ``Dict(a: Discrete(5))``.

    Spaces other than the supported ones are described by their own ``repr``.
    """
    if isinstance(space, spaces.Box):
        return f"Box(shape={space.shape}, {space.dtype})"
    if isinstance(space, spaces.Discrete):
        start = f", start={int(space.start)}" if int(space.start) != 0 else ""
        return f"Discrete({int(space.n)}{start}{_dtype_suffix(space.dtype)})"
    if isinstance(space, spaces.MultiDiscrete):
        start = f", start={space.start.tolist()}" if np.any(space.start != 0) else ""
        return f"MultiDiscrete({space.nvec.tolist()}{start}{_dtype_suffix(space.dtype)})"
    if isinstance(space, spaces.MultiBinary):
        return f"MultiBinary({space.n})"
    if isinstance(space, spaces.Dict):
        items = ", ".join(f"{key}: {describe_space(sub)}" for key, sub in space.spaces.items())
        return f"Dict({items})"
    if isinstance(space, spaces.Tuple):
        return f"Tuple({', '.join(describe_space(sub) for sub in space.spaces)})"
    return repr(space)


def _dtype_suffix(dtype: np.dtype[Any] | None) -> str:
    """Discrete spaces are int64 unless asked otherwise; only mention the unusual case."""
    return "" if dtype == np.int64 else f", {dtype}"


def _to_json(space: Any, where: str) -> dict[str, Any]:
    if isinstance(space, spaces.Box):
        return {
            "type": "Box",
            "shape": list(space.shape),
            "dtype": str(space.dtype),
            "low": _bounds_to_json(space.low),
            "high": _bounds_to_json(space.high),
        }
    if isinstance(space, spaces.Discrete):
        return {
            "type": "Discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": space.nvec.tolist(),
            "start": space.start.tolist(),
            "dtype": str(space.dtype),
        }
    if isinstance(space, spaces.MultiBinary):
        n = space.n
        return {"type": "MultiBinary", "n": int(n) if isinstance(n, int) else list(n)}
    if isinstance(space, spaces.Dict):
        encoded: dict[str, Any] = {}
        for key, sub in space.spaces.items():
            if not isinstance(key, str):
                raise EnvSpecError(
                    f"{where}: Dict keys must be str to be stored as JSON, "
                    f"got {key!r} of type {type(key).__name__}"
                )
            encoded[key] = _to_json(sub, f"{where}[{key!r}]")
        return {"type": "Dict", "spaces": encoded}
    if isinstance(space, spaces.Tuple):
        return {
            "type": "Tuple",
            "spaces": [_to_json(sub, f"{where}[{i}]") for i, sub in enumerate(space.spaces)],
        }
    raise EnvSpecError(
        f"{where}: cannot encode a {type(space).__name__} space ({describe_space(space)}); "
        f"supported spaces are {_SUPPORTED_TEXT}"
    )


def _bounds_to_json(bounds: np.ndarray[Any, Any]) -> Any:
    """Nested lists of the bounds, with infinities as the strings "inf" and "-inf"."""
    if bounds.dtype.kind != "f":
        return bounds.tolist()
    return _replace_infinities(bounds.tolist())


def _replace_infinities(value: Any) -> Any:
    if isinstance(value, list):
        return [_replace_infinities(item) for item in value]
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _restore_infinities(value: Any, where: str) -> Any:
    if isinstance(value, list):
        return [_restore_infinities(item, where) for item in value]
    if value in ("inf", "-inf"):
        return float(value)
    if not isinstance(value, int | float):  # bool included: the bounds of a bool Box
        raise EnvSpecError(
            f'{where}: expected numbers (or "inf"/"-inf") in nested lists, got {_short(value)}'
        )
    return value


def _from_json(data: Any, where: str) -> gymnasium.spaces.Space[Any]:
    if not isinstance(data, Mapping):
        raise EnvSpecError(
            f"{where}: expected a JSON object describing a space, got {_short(data)}"
        )
    kind = data.get("type")
    build = _BUILDERS.get(kind) if isinstance(kind, str) else None
    if build is None:
        raise EnvSpecError(f"{where}.type: expected one of {_SUPPORTED_TEXT}, got {kind!r}")
    try:
        return build(data, where)
    except EnvSpecError:
        raise
    except (ValueError, TypeError, AssertionError, OverflowError) as error:
        # gymnasium's own checks, e.g. low > high or n <= 0
        raise EnvSpecError(f"{where}: invalid {kind} space: {error}") from error


def _box_from_json(data: Mapping[str, Any], where: str) -> spaces.Box:
    dtype = _field_dtype(data, where)
    shape = tuple(_field_int_list(data, "shape", where))
    low = _field_array(data, "low", dtype, shape, where)
    high = _field_array(data, "high", dtype, shape, where)
    return spaces.Box(low=low, high=high, shape=shape, dtype=dtype)


def _discrete_from_json(data: Mapping[str, Any], where: str) -> spaces.Discrete[Any]:
    n, start = _field_int(data, "n", where), _field_int(data, "start", where)
    dtype = _field_dtype(data, where)
    if dtype == np.int64:
        # gymnasium < 1.3 has no dtype argument and builds int64 Discrete spaces only.
        return spaces.Discrete(n, start=start)
    return spaces.Discrete(n, start=start, dtype=dtype)


def _multi_discrete_from_json(data: Mapping[str, Any], where: str) -> spaces.MultiDiscrete[Any]:
    nvec = _field_array(data, "nvec", np.dtype(np.int64), None, where)
    start = _field_array(data, "start", np.dtype(np.int64), nvec.shape, where)
    return spaces.MultiDiscrete(nvec, dtype=_field_dtype(data, where), start=start)


def _multi_binary_from_json(data: Mapping[str, Any], where: str) -> spaces.MultiBinary:
    if isinstance(data.get("n"), list):
        return spaces.MultiBinary(_field_int_list(data, "n", where))
    return spaces.MultiBinary(_field_int(data, "n", where))


def _dict_from_json(data: Mapping[str, Any], where: str) -> spaces.Dict:
    children = data.get("spaces")
    if not isinstance(children, Mapping):
        raise EnvSpecError(
            f"{where}.spaces: expected a JSON object of named spaces, got {_short(children)}"
        )
    # A list of pairs keeps the key order; gymnasium sorts the keys of a plain dict.
    return spaces.Dict(
        [(key, _from_json(sub, f"{where}[{key!r}]")) for key, sub in children.items()]
    )


def _tuple_from_json(data: Mapping[str, Any], where: str) -> spaces.Space[Any]:
    children = data.get("spaces")
    if not isinstance(children, list):
        raise EnvSpecError(f"{where}.spaces: expected a list of spaces, got {_short(children)}")
    return spaces.Tuple([_from_json(sub, f"{where}[{i}]") for i, sub in enumerate(children)])


_BUILDERS: dict[str, Callable[[Mapping[str, Any], str], gymnasium.spaces.Space[Any]]] = {
    "Box": _box_from_json,
    "Discrete": _discrete_from_json,
    "MultiDiscrete": _multi_discrete_from_json,
    "MultiBinary": _multi_binary_from_json,
    "Dict": _dict_from_json,
    "Tuple": _tuple_from_json,
}


def _short(value: Any) -> str:
    """repr of a value for an error message, cut short: bounds can hold thousands of numbers."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _field_int(data: Mapping[str, Any], name: str, where: str) -> int:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnvSpecError(f"{where}.{name}: expected an integer, got {_short(value)}")
    return value


def _field_int_list(data: Mapping[str, Any], name: str, where: str) -> list[int]:
    value = data.get(name)
    if not isinstance(value, list) or not all(
        isinstance(item, int) and not isinstance(item, bool) for item in value
    ):
        raise EnvSpecError(f"{where}.{name}: expected a list of integers, got {_short(value)}")
    return value


def _field_dtype(data: Mapping[str, Any], where: str) -> np.dtype[Any]:
    value = data.get("dtype")
    if not isinstance(value, str):
        raise EnvSpecError(f"{where}.dtype: expected a numpy dtype name, got {_short(value)}")
    try:
        return np.dtype(value)
    except TypeError as error:
        raise EnvSpecError(
            f"{where}.dtype: expected a numpy dtype name such as 'float32', got {value!r}"
        ) from error


def _field_array(
    data: Mapping[str, Any],
    name: str,
    dtype: np.dtype[Any],
    shape: Sequence[int] | None,
    where: str,
) -> np.ndarray[Any, Any]:
    value = _restore_infinities(data.get(name), f"{where}.{name}")
    try:
        array = np.array(value, dtype=dtype)
    except (ValueError, OverflowError) as error:
        raise EnvSpecError(
            f"{where}.{name}: expected nested lists of {dtype} values, "
            f"got {_short(value)} ({error})"
        ) from error
    if shape is not None and array.shape != tuple(shape):
        raise EnvSpecError(
            f"{where}.{name}: expected shape {tuple(shape)}, got nested lists of shape "
            f"{array.shape}"
        )
    return array
