"""The optimiser every rlfleet algorithm trains with."""

from __future__ import annotations

from collections.abc import Iterable

import torch


def adam(
    params: Iterable[torch.Tensor], lr: float, eps: float, device: torch.device
) -> torch.optim.Adam:
    """Adam with the fused kernel where ``device`` has one (CPU, CUDA): one kernel launch
    updates every parameter, instead of several per tensor."""
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=device.type in ("cpu", "cuda"))
