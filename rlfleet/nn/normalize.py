"""Running mean/std normalisation whose statistics live in the model's state dict."""

from __future__ import annotations

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    """Normalises inputs with running statistics (parallel Welford update, Chan et al. 1979).

    Statistics are buffers, so they are saved and restored with the algorithm and frozen
    whenever :meth:`update` is not called (evaluation and play).
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.clip = clip
        self.epsilon = epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    @torch.no_grad()
    def update(self, batch: torch.Tensor) -> None:
        """Fold a ``[batch, *shape]`` tensor into the statistics."""
        batch = batch.double()
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        n = batch.shape[0]
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean += delta * n / total
        self.var.copy_(
            (self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total
        )
        self.count.copy_(total)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(self.var + self.epsilon).to(x.dtype)
        return ((x - self.mean.to(x.dtype)) * scale).clamp(-self.clip, self.clip)
