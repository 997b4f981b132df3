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
