"""Saving and restoring a vector env's state, so a resumed run continues exactly.

What can be saved:

- an env (or vector env) that defines ``get_state() -> dict`` and ``set_state(state)``:
  saved as it says (values must be numbers, strings, lists/dicts of them, or numpy arrays);
- Gymnasium's classic-control envs (CartPole, Pendulum, MountainCar, Acrobot, ...), alone
  inside a ``SyncVectorEnv`` (with their wrappers' counters, e.g. ``TimeLimit``) or as
  CartPole's native vector env: their whole state is numeric attributes plus the
  ``np_random`` generator.

Anything else — simulators whose state lives in C structures (MuJoCo, Box2D, ALE) or in
subprocess workers — returns ``None`` from :func:`get_env_state`. That is the boundary of
exact resume: such envs are reset when a run resumes, so the episodes in progress at the
checkpoint start over; weights, optimiser, schedules, RNG, normaliser statistics, replay
buffer and history still continue exactly.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv, VectorWrapper

_SAFE_MODULE_PREFIXES = ("gymnasium.envs.classic_control",)
_SCALARS = (bool, int, float, str, type(None), np.bool_, np.integer, np.floating)


def get_env_state(envs: Any) -> dict[str, Any] | None:
    """The state of a vector env, or None where it cannot be saved exactly."""
    if isinstance(envs, VectorWrapper):
        inner = get_env_state(envs.env)
        if inner is None:
            return None
        return {"kind": "wrapper", "wrapper": _numeric_attributes(envs), "env": inner}
    if callable(getattr(envs, "get_state", None)):
        return {"kind": "protocol", "state": envs.get_state()}
    if isinstance(envs, SyncVectorEnv):
        sub_states = [_wrapped_env_state(env) for env in envs.envs]
        if any(s is None for s in sub_states):
            return None
        return {
            "kind": "sync",
            "vector": _numeric_attributes(envs),
            "envs": sub_states,
        }
    if _is_safe(envs):
        return {"kind": "native", "env": _plain_env_state(envs)}
    return None


def set_env_state(envs: Any, state: dict[str, Any]) -> None:
    """Restore :func:`get_env_state` output into an env built from the same config."""
    kind = state["kind"]
    if kind == "wrapper":
        _set_attributes(envs, state["wrapper"])
        set_env_state(envs.env, state["env"])
    elif kind == "protocol":
        envs.set_state(state["state"])
    elif kind == "sync":
        _set_attributes(envs, state["vector"])
        for env, sub in zip(envs.envs, state["envs"], strict=True):
            _set_wrapped_env_state(env, sub)
    else:
        _set_plain_env_state(envs, state["env"])


def _is_safe(env: Any) -> bool:
    module = type(env).__module__
    return any(module.startswith(prefix) for prefix in _SAFE_MODULE_PREFIXES)


def _wrapped_env_state(env: gym.Env[Any, Any]) -> dict[str, Any] | None:
    if callable(getattr(env, "get_state", None)):
        return {"protocol": env.get_state()}  # type: ignore[attr-defined]
    chain: list[dict[str, Any]] = []
    layer: Any = env
    while isinstance(layer, gym.Wrapper):
        chain.append(_numeric_attributes(layer))
        layer = layer.env
    if not _is_safe(layer):
        return None
    return {"wrappers": chain, "env": _plain_env_state(layer)}


def _set_wrapped_env_state(env: gym.Env[Any, Any], state: dict[str, Any]) -> None:
    if "protocol" in state:
        env.set_state(state["protocol"])  # type: ignore[attr-defined]
        return
    layer: Any = env
    for attributes in state["wrappers"]:
        _set_attributes(layer, attributes)
        layer = layer.env
    _set_plain_env_state(layer, state["env"])


def _plain_env_state(env: Any) -> dict[str, Any]:
    return {
        "attributes": _numeric_attributes(env),
        "np_random": env.np_random.bit_generator.state,
    }


def _set_plain_env_state(env: Any, state: dict[str, Any]) -> None:
    _set_attributes(env, state["attributes"])
    env.np_random.bit_generator.state = state["np_random"]


def _numeric_attributes(obj: Any) -> dict[str, Any]:
    """Instance attributes that are numbers or numeric arrays (copied)."""
    found: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            found[name] = value.copy()
        elif isinstance(value, _SCALARS):
            found[name] = value.item() if isinstance(value, np.generic) else value
    return found


def _set_attributes(obj: Any, attributes: dict[str, Any]) -> None:
    for name, value in attributes.items():
        current = getattr(obj, name, None)
        if isinstance(value, np.ndarray) and isinstance(current, np.ndarray):
            setattr(obj, name, value.astype(current.dtype, copy=True))
        else:
            setattr(obj, name, value)
