"""Observations at the edge: any supported observation space becomes one tensor row per env.

:class:`ObsLayout` decides, once per observation space, how a batch of raw env
observations is stored and fed to networks (as PufferLib does, structured spaces are
flattened once, where they enter, and nothing past that point handles nesting):

``vector``
    A Box that is not an image: float32 in its own shape; the MLP flattens it, except for
    a rank-3 bool Box (a grid of on/off channels such as MinAtar's, see
    :func:`is_binary_grid_space`), which goes through a CNN.
``image``
    A uint8 Box of rank 3 with bounds 0..255 (``HWC`` or ``CHW``, the smallest dim is the
    channel dim): stored as uint8, turned into floats in [0, 1] by the CNN encoder once per
    batch.
``packed``
    Discrete, MultiBinary, MultiDiscrete and (nested) Dict observations, flattened into one
    row per env. Discrete parts become one-hot vectors, MultiDiscrete parts concatenated
    one-hots, Box and MultiBinary parts their flattened values. Without image parts the
    row is float32; with them it is uint8, the float features bit-cast into its first
    bytes and the images' bytes after them, so that images inside a Dict are still stored
    as uint8 (:class:`rlfleet.nn.encoders.MixedEncoder` unpacks it).

A Dict key ``action_mask`` is the env's action mask (see :mod:`rlfleet.nn.masks`), not
part of the observation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces

from rlfleet.envs.spaces import describe_space
from rlfleet.errors import EnvSpecError
from rlfleet.nn.masks import MASK_KEY

LayoutKind = Literal["vector", "image", "packed"]
_FLOAT_BYTES = 4


def is_image_space(space: spaces.Space[Any]) -> bool:
    """A uint8 Box of rank 3 with bounds 0..255 (Stable-Baselines3's definition)."""
    return (
        isinstance(space, spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and bool(np.all(space.low == 0))
        and bool(np.all(space.high == 255))
    )


def is_binary_grid_space(space: spaces.Space[Any]) -> bool:
    """A bool Box of rank 3: a grid of on/off channels (MinAtar's ``(10, 10, C)`` frames).

    Stored as a float32 vector observation (0.0 and 1.0), fed to a CNN by
    :class:`rlfleet.nn.encoders.GridEncoder`.
    """
    return isinstance(space, spaces.Box) and space.dtype == np.bool_ and len(space.shape) == 3


def grid_channels_first(shape: tuple[int, ...]) -> bool:
    """Whether a binary grid of this shape is ``CHW``: only when its first dim is strictly the
    smallest, so that MinAtar's ``(10, 10, 10)`` Seaquest grid counts as channels last."""
    return shape[0] < min(shape[1], shape[2])


def channels_first(shape: tuple[int, ...]) -> bool:
    """Whether an image of this shape is ``CHW``: its smallest dim comes first."""
    return int(np.argmin(shape)) == 0


@dataclass(frozen=True)
class Leaf:
    """One part of a packed observation."""

    path: tuple[str, ...]
    """Keys from the top-level observation down to this part (empty: the whole observation)."""
    space: spaces.Space[Any]
    image: bool
    size: int
    """Float features of a vector part, bytes of an image part."""
    offset: int
    """Index of the first float feature, or of the first byte of an image."""


class ObsLayout:
    """How observations of ``space`` are stored and fed to networks (see the module doc)."""

    def __init__(self, space: spaces.Space[Any]) -> None:
        self.space = space
        self.mask_in_obs = isinstance(space, spaces.Dict) and MASK_KEY in space.spaces
        """The action mask arrives as the ``action_mask`` key of the observation."""
        self.kind: LayoutKind
        self.leaves: list[Leaf] = []
        self.num_floats = 0
        """Float features of a packed row."""
        self.has_images = is_image_space(space)
        """Some part of the observation is an image (stored as uint8)."""
        if isinstance(space, spaces.Box) and not is_image_space(space):
            self.kind = "vector"
            self.shape: tuple[int, ...] = tuple(space.shape or ())
            self.dtype = torch.float32
            return
        if is_image_space(space):
            self.kind = "image"
            self.shape = tuple(space.shape or ())
            self.dtype = torch.uint8
            return
        self.kind = "packed"
        parts = list(_parts(space, (), "observation"))
        for path, part in parts:
            if not is_image_space(part):
                size = _float_size(part)
                self.leaves.append(Leaf(path, part, False, size, self.num_floats))
                self.num_floats += size
        self.has_images = any(is_image_space(part) for _, part in parts)
        if not self.has_images:
            self.shape = (self.num_floats,)
            self.dtype = torch.float32
            return
        offset = self.num_floats * _FLOAT_BYTES
        for path, part in parts:
            if is_image_space(part):
                size = math.prod(part.shape or ())
                self.leaves.append(Leaf(path, part, True, size, offset))
                offset += size
        # A row length divisible by 4 keeps every row's float part 4-byte aligned, so it can
        # be reinterpreted as float32 without a copy.
        self.shape = (-(-offset // _FLOAT_BYTES) * _FLOAT_BYTES,)
        self.dtype = torch.uint8

    @property
    def image_leaves(self) -> list[Leaf]:
        return [leaf for leaf in self.leaves if leaf.image]

    def to_tensor(self, obs: Any) -> torch.Tensor:
        """A batch of raw env observations (array or dict of arrays) as a stored tensor."""
        if isinstance(obs, torch.Tensor):
            # Vector observations are float32 whatever integer type the env declares.
            return obs.float() if self.kind == "vector" and obs.dtype != torch.float32 else obs
        if self.kind == "vector":
            tensor = torch.from_numpy(np.asarray(obs))
            return tensor if tensor.dtype == torch.float32 else tensor.float()
        if self.kind == "image":
            return torch.from_numpy(np.ascontiguousarray(obs, dtype=np.uint8))
        first = np.asarray(_get(obs, self.leaves[0].path))
        batch = first.shape[0]
        row = np.zeros((batch, self.shape[0]), np.uint8 if self.has_images else np.float32)
        floats = (
            row[:, : self.num_floats * _FLOAT_BYTES].view(np.float32) if self.has_images else row
        )
        rows = np.arange(batch)
        for leaf in self.leaves:
            value = np.asarray(_get(obs, leaf.path))
            if leaf.image:
                row[:, leaf.offset : leaf.offset + leaf.size] = value.reshape(batch, -1)
            elif isinstance(leaf.space, spaces.Discrete):
                floats[rows, leaf.offset + value.reshape(batch) - int(leaf.space.start)] = 1.0
            elif isinstance(leaf.space, spaces.MultiDiscrete):
                nvec = leaf.space.nvec.reshape(-1)
                starts = np.concatenate([[0], np.cumsum(nvec)[:-1]])
                index = value.reshape(batch, -1) - leaf.space.start.reshape(-1) + starts
                floats[rows[:, None], leaf.offset + index] = 1.0
            else:
                floats[:, leaf.offset : leaf.offset + leaf.size] = value.reshape(batch, -1)
        return torch.from_numpy(row)


def batch_of_one(obs: Any) -> Any:
    """One env's observation as a batch of one (dicts of arrays handled leaf by leaf)."""
    if isinstance(obs, Mapping):
        return {key: batch_of_one(value) for key, value in obs.items()}
    return np.asarray(obs)[None]


def is_batched(obs: Any, space: spaces.Space[Any], where: str = "observation") -> bool:
    """Whether ``obs`` is a batch of observations of ``space`` (True) or a single one (False),
    told apart by shape as Stable-Baselines3 does: a single one has the space's shape (``()``
    for Discrete), a batch one more leading dim. The parts of a Dict observation must agree.

    Raises:
        EnvSpecError: ``obs`` is neither (the message names the shapes and the part).
    """
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, Mapping) or set(obs) != set(space.spaces):
            keys = sorted(obs) if isinstance(obs, Mapping) else type(obs).__name__
            raise EnvSpecError(
                f"{where}: expected a dict with keys {sorted(space.spaces)} for "
                f"{describe_space(space)}, got {keys}"
            )
        answers = {
            key: is_batched(obs[key], sub, f"{where}[{key!r}]") for key, sub in space.spaces.items()
        }
        if len(set(answers.values())) > 1:
            raise EnvSpecError(
                f"{where}: parts {sorted(k for k, b in answers.items() if b)} are batches but "
                f"{sorted(k for k, b in answers.items() if not b)} single observations"
            )
        return next(iter(answers.values()))
    shape, expected = tuple(np.shape(obs)), tuple(space.shape or ())
    if shape == expected:
        return False
    if shape[1:] == expected and len(shape) == len(expected) + 1:
        return True
    batch_shape = ", ".join(["batch", *map(str, expected)])
    raise EnvSpecError(
        f"{where}: shape {shape} is neither one observation of {describe_space(space)} "
        f"(shape {expected}) nor a batch of them (shape ({batch_shape}))"
    )


def _get(obs: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obs = obs[key]
    return obs


def _parts(
    space: spaces.Space[Any], path: tuple[str, ...], where: str
) -> list[tuple[tuple[str, ...], spaces.Space[Any]]]:
    """The leaves of a (nested) Dict in key order, the action mask left out."""
    if isinstance(space, spaces.Dict):
        found: list[tuple[tuple[str, ...], spaces.Space[Any]]] = []
        for key, sub in space.spaces.items():
            if not path and key == MASK_KEY:
                continue
            found += _parts(sub, (*path, str(key)), f"{where}[{key!r}]")
        if not found:
            raise EnvSpecError(f"{where}: a Dict observation with no parts besides the mask")
        return found
    if isinstance(space, spaces.Box | spaces.Discrete | spaces.MultiBinary | spaces.MultiDiscrete):
        return [(path, space)]
    raise EnvSpecError(
        f"{where}: {describe_space(space)} observations are not supported; parts of an "
        "observation may be Box, Discrete, MultiBinary, MultiDiscrete or Dict"
    )


def _float_size(space: spaces.Space[Any]) -> int:
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return math.prod(space.shape or ())
