"""The first outputs of an in-process env, checked against the Gymnasium API before use.

An env that returns a string reward, ``None`` or a wrongly shaped observation would
otherwise fail far from the cause: inside ``SyncVectorEnv``'s batching (``could not broadcast
input array``), in a torch conversion, or not at all until a loss turns NaN.
:class:`~rlfleet.envs.faults.EnvFaultWrapper` calls these on a sub-env's first ``reset`` and
first ``step``, so the error names the env, the call and the field.

The checks are structural (types, shapes, keys), not the bounds of a ``Box``: many envs
return values slightly outside the bounds they declare, and rlfleet does not depend on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from rlfleet.errors import EnvSpecError


def check_reset_output(where: str, space: spaces.Space[Any], result: Any) -> None:
    """``result`` of ``reset()`` is ``(obs, info)`` with ``obs`` fitting ``space``.

    Raises:
        EnvSpecError: naming ``where`` (the env and call) and the field that does not fit.
    """
    if not isinstance(result, tuple) or len(result) != 2:
        raise EnvSpecError(
            f"{where} returned {_kind(result)}; expected a tuple (observation, info)"
        )
    _check_obs(where, space, result[0])
    _check_info(where, result[1])


def check_step_output(where: str, space: spaces.Space[Any], result: Any) -> None:
    """``result`` of ``step()`` is ``(obs, reward, terminated, truncated, info)`` of the right
    types, with ``obs`` fitting ``space``.

    Raises:
        EnvSpecError: naming ``where`` (the env and call) and the field that does not fit.
    """
    if not isinstance(result, tuple) or len(result) != 5:
        raise EnvSpecError(
            f"{where} returned {_kind(result)}; expected a tuple (observation, reward, "
            "terminated, truncated, info)"
        )
    obs, reward, terminated, truncated, info = result
    _check_obs(where, space, obs)
    if not _is_number(reward):
        raise EnvSpecError(f"{where} returned reward {_show(reward)}; expected a number")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not _is_flag(flag):
            raise EnvSpecError(f"{where} returned {name} {_show(flag)}; expected a bool")
    _check_info(where, info)


def _check_obs(where: str, space: spaces.Space[Any], obs: Any) -> None:
    problem = observation_problem(space, obs)
    if problem is not None:
        raise EnvSpecError(
            f"{where} returned an observation that does not fit the observation_space: {problem}"
        )


def observation_problem(space: spaces.Space[Any], obs: Any, path: str = "") -> str | None:
    """Why ``obs`` does not have the structure of ``space`` (None when it does)."""
    label = f"observation{path}"
    if obs is None:
        return f"{label} is None"
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, Mapping):
            return f"{label} is {_kind(obs)}, expected a dict with keys {list(space.spaces)}"
        if set(obs) != set(space.spaces):
            return f"{label} has keys {sorted(map(str, obs))}, expected {sorted(space.spaces)}"
        for key, sub in space.spaces.items():
            problem = observation_problem(sub, obs[key], f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    if isinstance(space, spaces.Tuple):
        if not isinstance(obs, tuple) or len(obs) != len(space.spaces):
            return f"{label} is {_kind(obs)}, expected a tuple of {len(space.spaces)}"
        for i, sub in enumerate(space.spaces):
            problem = observation_problem(sub, obs[i], f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(space, spaces.Box | spaces.MultiDiscrete | spaces.MultiBinary):
        try:
            array = np.asarray(obs)
        except Exception:  # an object numpy cannot even wrap
            return f"{label} is {_kind(obs)}, expected an array of shape {space.shape}"
        if array.dtype.kind not in "biuf":
            return (
                f"{label} is {_kind(obs)} (dtype {array.dtype}), expected numbers of shape "
                f"{space.shape}"
            )
        if array.shape != space.shape:
            return f"{label} has shape {array.shape}, expected {space.shape}"
        return None
    if isinstance(space, spaces.Discrete) and not (
        _is_number(obs) and float(np.asarray(obs)) == int(np.asarray(obs))
    ):
        return f"{label} is {_show(obs)}, expected an integer"
    return None


def _check_info(where: str, info: Any) -> None:
    if not isinstance(info, dict):
        raise EnvSpecError(f"{where} returned info {_show(info)}; expected a dict")


def _is_number(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    if isinstance(value, int | float | np.integer | np.floating):
        return True
    return isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iuf"


def _is_flag(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return True
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind == "b":
        return True
    return isinstance(value, int | np.integer) and value in (0, 1)


def _kind(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({_kind(value)})"
