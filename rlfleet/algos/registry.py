"""Name -> algorithm class, filled by the ``@register`` decorator in each algorithm file.

Importing this module runs ``rlfleet/algos/__init__.py`` first, which imports every shipped
algorithm file, so the registry is full before any lookup.
"""

from __future__ import annotations

import difflib
from typing import Any, TypeVar

from gymnasium import spaces

from rlfleet.errors import ConfigError

_REGISTRY: dict[str, type[Any]] = {}
T = TypeVar("T", bound=type[Any])


def register(cls: T) -> T:
    """Class decorator: make an algorithm available by its ``name``."""
    if cls.name in _REGISTRY:
        raise ValueError(f"algorithm {cls.name!r} is registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def get_algorithm(name: str) -> type[Any]:
    """The algorithm class registered as ``name`` (ConfigError with close matches if unknown)."""
    key = name.lower()
    if key not in _REGISTRY:
        close = difflib.get_close_matches(key, list(_REGISTRY), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"unknown algorithm {name!r}{hint} (available: {', '.join(sorted(_REGISTRY))})"
        )
    return _REGISTRY[key]


def algorithm_classes() -> dict[str, type[Any]]:
    """Every registered algorithm class by name, sorted by name."""
    return dict(sorted(_REGISTRY.items()))


def list_algorithms() -> list[str]:
    """Names of all registered algorithms, sorted."""
    return sorted(_REGISTRY)


def algorithms_supporting_images() -> list[str]:
    """Names of registered algorithms with a CNN encoder for image observations."""
    return sorted(name for name, cls in _REGISTRY.items() if getattr(cls, "supports_images", False))


def algorithms_supporting_custom_encoders() -> list[str]:
    """Names of registered algorithms that build their networks on a custom encoder."""
    return sorted(
        name for name, cls in _REGISTRY.items() if getattr(cls, "supports_custom_encoder", False)
    )


def algorithms_supporting_masks() -> list[str]:
    """Names of registered algorithms that honour action masks."""
    return sorted(name for name, cls in _REGISTRY.items() if getattr(cls, "supports_masks", False))


def algorithms_supporting(
    *,
    action_space: spaces.Space[Any] | None = None,
    observation_space: spaces.Space[Any] | None = None,
) -> list[str]:
    """Names of registered algorithms that accept the given space(s)."""
    return sorted(
        name
        for name, cls in _REGISTRY.items()
        if (action_space is None or isinstance(action_space, cls.action_spaces))
        and (observation_space is None or isinstance(observation_space, cls.observation_spaces))
    )
