"""Mapping between a Box action space and the [-1, 1] range tanh policies act in."""

from __future__ import annotations

import torch
from gymnasium import spaces


def box_scale_bias(space: spaces.Box, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Half-range and midpoint of the bounds, flattened: ``unit * scale + bias`` maps
    ``[-1, 1]`` onto ``[low, high]``, and ``(action - bias) / scale`` back."""
    low = torch.as_tensor(space.low, dtype=torch.float32).reshape(-1)
    high = torch.as_tensor(space.high, dtype=torch.float32).reshape(-1)
    return ((high - low) / 2).to(device), ((high + low) / 2).to(device)


def to_box(
    unit: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, shape: tuple[int, ...]
) -> torch.Tensor:
    """Flat ``[batch, dim]`` actions in [-1, 1] as ``[batch, *shape]`` actions in the bounds."""
    return (unit * scale + bias).reshape(-1, *shape)


def to_unit(actions: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Stored ``[batch, *shape]`` Box actions as flat ``[batch, dim]`` actions in [-1, 1]."""
    return (actions.reshape(actions.shape[0], -1) - bias) / scale
